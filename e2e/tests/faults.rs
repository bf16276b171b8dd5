//! Fault injection and request counters.

mod common;

use std::time::{Duration, Instant};

use common::*;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::json;
use teamgpu_e2e::Faults;

#[tokio::test]
async fn injected_errors_carry_retry_after_and_conflicts_hit_writes_only() {
    let (c, ns) = cluster_ns().await;
    let raw: Api<ResourceClaim> = Api::namespaced(c.client_without_retry(), &ns);
    create(&raw, claim("a", "x", 1)).await;
    c.set_faults(Faults {
        rate_500: 1.0,
        retry_after_secs: 2,
        ..Faults::default()
    });
    let s = api_err(raw.get("a").await);
    assert_eq!((s.code, s.reason.as_str()), (500, "InternalError"));
    assert_eq!(s.details.unwrap().retry_after_seconds, 2);
    c.set_faults(Faults {
        rate_429: 1.0,
        retry_after_secs: 1,
        ..Faults::default()
    });
    let s = api_err(raw.list(&ListParams::default()).await);
    assert_eq!((s.code, s.reason.as_str()), (429, "TooManyRequests"));
    c.set_faults(Faults {
        rate_conflict: 1.0,
        ..Faults::default()
    });
    assert!(raw.get("a").await.is_ok());
    let s = api_err(
        raw.patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"a": "b"}}})),
        )
        .await,
    );
    assert_eq!((s.code, s.reason.as_str()), (409, "Conflict"));
    // Faults can be limited to some resources.
    c.set_faults(Faults {
        rate_500: 1.0,
        only_resources: vec!["pods".into()],
        ..Faults::default()
    });
    assert!(raw.get("a").await.is_ok());
    c.set_faults(Faults::default());
    c.shutdown().await.unwrap();
}

#[tokio::test]
async fn the_default_client_retries_429_and_counters_see_every_request() {
    let (c, ns) = cluster_ns().await;
    let api: Api<ResourceClaim> = Api::namespaced(c.client(), &ns);
    create(&api, claim("a", "x", 1)).await;
    let counters = c.counters().unwrap();
    counters.reset();
    c.set_faults(Faults {
        rate_429: 0.5,
        retry_after_secs: 0,
        ..Faults::default()
    });
    for _ in 0..10 {
        api.get("a").await.unwrap();
    }
    let gets = counters.get("get", "resourceclaims.resource.k8s.io");
    assert!(gets > 10, "expected retried requests, saw {gets}");
    c.set_faults(Faults::default());
    counters.reset();
    api.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"a": "b"}}})),
    )
    .await
    .unwrap();
    api.patch_status(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {}})),
    )
    .await
    .unwrap();
    api.delete("a", &Default::default()).await.unwrap();
    assert_eq!(counters.get("patch", "resourceclaims.resource.k8s.io"), 1);
    assert_eq!(
        counters.get("patch", "resourceclaims.resource.k8s.io/status"),
        1
    );
    assert_eq!(counters.writes(Some("resourceclaims.resource.k8s.io")), 3);
    assert_eq!(counters.writes(None), 3);
    c.shutdown().await.unwrap();
}

#[tokio::test]
async fn latency_is_added_to_every_request() {
    let (c, ns) = cluster_ns().await;
    let api: Api<ResourceClaim> = Api::namespaced(c.client(), &ns);
    c.set_faults(Faults {
        latency: Duration::from_millis(50),
        ..Faults::default()
    });
    let t = Instant::now();
    let _ = api.list(&ListParams::default()).await.unwrap();
    assert!(t.elapsed() >= Duration::from_millis(50));
    c.set_faults(Faults::default());
    c.shutdown().await.unwrap();
}
