//! CRUD semantics of the stand-in through the plain kube client.

mod common;

use std::time::Instant;

use common::*;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod};
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceClaimTemplate};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use teamgpu_e2e::{ClusterOptions, TestCluster};

#[tokio::test]
async fn starts_fast_and_serves_version_and_discovery() {
    let t0 = Instant::now();
    let c = TestCluster::start_local(ClusterOptions::default())
        .await
        .unwrap();
    let elapsed = t0.elapsed();
    eprintln!("TestCluster::start took {elapsed:?}");
    assert!(
        elapsed.as_millis() < 100 || c.is_real(),
        "start-up took {elapsed:?}"
    );
    let v = c.client().apiserver_version().await.unwrap();
    assert_eq!(v.minor, "36");
    let discovery = kube::Discovery::new(c.client()).run().await.unwrap();
    let groups: Vec<String> = discovery.groups().map(|g| g.name().to_string()).collect();
    for g in [
        "",
        "resource.k8s.io",
        "policy",
        "coordination.k8s.io",
        "events.k8s.io",
        "admissionregistration.k8s.io",
        "teamgpu.io",
    ] {
        assert!(
            groups.contains(&g.to_string()),
            "{g} missing from {groups:?}"
        );
    }
    let (ar, caps) = discovery
        .resolve_gvk(&kube::api::GroupVersionKind::gvk(
            "resource.k8s.io",
            "v1",
            "ResourceClaim",
        ))
        .unwrap();
    assert_eq!(ar.plural, "resourceclaims");
    assert!(
        caps.subresources
            .iter()
            .any(|(s, _)| s.plural == "resourceclaims/status" || s.plural == "status"),
        "{:?}",
        caps.subresources
            .iter()
            .map(|s| s.0.plural.clone())
            .collect::<Vec<_>>()
    );
    // The kubeconfig file works for a second client (as the teamgpu binary would use it).
    let kc = kube::config::Kubeconfig::read_from(c.kubeconfig()).unwrap();
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    let client2 = kube::Client::try_from(cfg).unwrap();
    let nss: Api<Namespace> = Api::all(client2);
    assert!(nss.get("default").await.is_ok());
}

#[tokio::test]
async fn create_sets_system_metadata_and_rejects_duplicates() {
    let (c, ns) = cluster_ns().await;
    let api: Api<ResourceClaim> = Api::namespaced(c.client(), &ns);
    let created = create(&api, claim("a", "gpu.nvidia.com", 1)).await;
    let m = &created.metadata;
    assert!(m.uid.as_ref().is_some_and(|u| u.len() == 36));
    assert!(m.creation_timestamp.is_some());
    assert_eq!(m.generation, Some(1));
    assert!(m.resource_version.as_ref().unwrap().parse::<u64>().unwrap() > 0);
    assert_eq!(m.namespace.as_deref(), Some(ns.as_str()));
    // Defaulting: allocationMode ExactCount.
    let req = &created
        .spec
        .devices
        .as_ref()
        .unwrap()
        .requests
        .as_ref()
        .unwrap()[0];
    assert_eq!(
        req.exactly.as_ref().unwrap().allocation_mode.as_deref(),
        Some("ExactCount")
    );

    let s = api_err(
        api.create(
            &PostParams::default(),
            &serde_json::from_value(claim("a", "x", 1)).unwrap(),
        )
        .await,
    );
    assert_eq!((s.code, s.reason.as_str()), (409, "AlreadyExists"));
    assert_eq!(
        s.message,
        "resourceclaims.resource.k8s.io \"a\" already exists"
    );

    // generateName.
    let mut g = claim("", "gpu.nvidia.com", 1);
    g["metadata"] = json!({"generateName": "gen-"});
    let gen_ = create(&api, g).await;
    let name = gen_.metadata.name.unwrap();
    assert!(name.starts_with("gen-") && name.len() == 9, "{name}");

    // Namespaced objects need an existing namespace.
    let missing: Api<ResourceClaim> = Api::namespaced(c.client(), "does-not-exist");
    let s = api_err(
        missing
            .create(
                &PostParams::default(),
                &serde_json::from_value(claim("a", "x", 1)).unwrap(),
            )
            .await,
    );
    assert_eq!((s.code, s.reason.as_str()), (404, "NotFound"));
    assert_eq!(s.message, "namespaces \"does-not-exist\" not found");

    let s = api_err(api.get("nope").await);
    assert_eq!((s.code, s.reason.as_str()), (404, "NotFound"));
    c.shutdown().await.unwrap();
}

#[tokio::test]
async fn update_uses_optimistic_concurrency_and_generation() {
    // Without the scheduler, nothing else writes the Pod.
    let mut opts = ClusterOptions::default();
    opts.controllers.scheduler = false;
    let c = TestCluster::start_local(opts).await.unwrap();
    let ns = c.namespace("t-").await.unwrap();
    let api: Api<Pod> = Api::namespaced(c.client(), &ns);
    let pod = create(
        &api,
        json!({"metadata": {"name": "p", "labels": {"a": "1"}},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]}}),
    )
    .await;
    let mut stale = pod.clone();
    let mut fresh = pod.clone();
    fresh
        .metadata
        .labels
        .as_mut()
        .unwrap()
        .insert("b".into(), "2".into());
    let updated = api
        .replace("p", &PostParams::default(), &fresh)
        .await
        .unwrap();
    // Metadata-only change: generation unchanged.
    assert_eq!(updated.metadata.generation, Some(1));
    assert_ne!(
        updated.metadata.resource_version,
        pod.metadata.resource_version
    );
    stale
        .metadata
        .labels
        .as_mut()
        .unwrap()
        .insert("c".into(), "3".into());
    let s = api_err(api.replace("p", &PostParams::default(), &stale).await);
    assert_eq!((s.code, s.reason.as_str()), (409, "Conflict"));
    assert_eq!(
        s.message,
        "Operation cannot be fulfilled on pods \"p\": the object has been modified; please apply your changes to the latest version and try again"
    );
    // Spec change bumps the generation (pods' image is mutable).
    let mut img = updated.clone();
    img.spec.as_mut().unwrap().containers[0].image = Some("busybox:2".into());
    let img = api
        .replace("p", &PostParams::default(), &img)
        .await
        .unwrap();
    assert_eq!(img.metadata.generation, Some(2));
    // A no-op update writes nothing.
    let same = api
        .replace("p", &PostParams::default(), &img)
        .await
        .unwrap();
    assert_eq!(
        same.metadata.resource_version,
        img.metadata.resource_version
    );
    c.shutdown().await.unwrap();
}

#[tokio::test]
async fn status_subresource_and_main_resource_ignore_each_other() {
    let (c, ns) = cluster_ns().await;
    let api: Api<ResourceClaim> = Api::namespaced(c.client(), &ns);
    create(&api, claim("a", "gpu.nvidia.com", 1)).await;
    // Status on the main resource is ignored.
    let patched = api
        .patch("a", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"labels": {"x": "y"}}, "status": {"reservedFor": [{"resource": "pods", "name": "p", "uid": "u"}]}})))
        .await
        .unwrap();
    assert!(patched.status.is_none());
    assert_eq!(patched.metadata.labels.unwrap()["x"], "y");
    // The status subresource ignores everything else (and keeps generation).
    let st = api
        .patch_status("a", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"labels": {"x": "z"}}, "status": {"reservedFor": [{"resource": "pods", "name": "p", "uid": "u"}]}})))
        .await
        .unwrap();
    assert_eq!(st.status.unwrap().reserved_for.unwrap()[0].name, "p");
    assert_eq!(st.metadata.labels.unwrap()["x"], "y");
    assert_eq!(st.metadata.generation, Some(1));
    c.shutdown().await.unwrap();
}

#[tokio::test]
async fn claim_and_template_specs_are_immutable() {
    let (c, ns) = cluster_ns().await;
    let api: Api<ResourceClaim> = Api::namespaced(c.client(), &ns);
    create(&api, claim("a", "gpu.nvidia.com", 1)).await;
    let s = api_err(
        api.patch("a", &PatchParams::default(), &Patch::Merge(json!({"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 2}}]}}})))
            .await,
    );
    assert_eq!((s.code, s.reason.as_str()), (422, "Invalid"));
    assert!(
        s.message
            .starts_with("ResourceClaim.resource.k8s.io \"a\" is invalid: spec: Invalid value:"),
        "{}",
        s.message
    );
    assert!(s.message.ends_with("field is immutable"), "{}", s.message);

    let tapi: Api<ResourceClaimTemplate> = Api::namespaced(c.client(), &ns);
    create(&tapi, json!({"metadata": {"name": "t"}, "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}}}})).await;
    let s = api_err(tapi.patch("t", &PatchParams::default(), &Patch::Merge(json!({"spec": {"spec": {"devices": {"requests": [{"name": "gpu2", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}}}}))).await);
    assert_eq!(s.code, 422);
    // Labels stay mutable.
    tapi.patch(
        "t",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"a": "b"}}})),
    )
    .await
    .unwrap();
    c.shutdown().await.unwrap();
}

#[tokio::test]
async fn builtin_objects_are_validated_against_the_upstream_schema() {
    let (c, ns) = cluster_ns().await;
    let api: Api<ResourceClaim> = Api::namespaced(c.client(), &ns);
    // Wrong type -> 422 Invalid with the field path.
    let raw = kube::api::Api::<kube::api::DynamicObject>::namespaced_with(
        c.client(),
        &ns,
        &kube::api::ApiResource::erase::<ResourceClaim>(&()),
    );
    let bad: kube::api::DynamicObject = serde_json::from_value(json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "bad"}, "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "c", "count": "two"}}]}}})).unwrap();
    let s = api_err(raw.create(&PostParams::default(), &bad).await);
    assert_eq!((s.code, s.reason.as_str()), (422, "Invalid"));
    assert!(
        s.message
            .contains("spec.devices.requests[0].exactly.count: Invalid value"),
        "{}",
        s.message
    );
    // Unknown fields: dropped by default (fieldValidation=Warn), 400 with Strict.
    let unknown: kube::api::DynamicObject = serde_json::from_value(json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "u"}, "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "c", "bogus": 1}}]}}})).unwrap();
    // (PostParams has no fieldValidation in kube 5; server-side apply carries it.)
    let strict = PatchParams::apply("t").validation(kube::api::ValidationDirective::Strict);
    let s = api_err(raw.patch("u", &strict, &Patch::Apply(&unknown)).await);
    assert_eq!((s.code, s.reason.as_str()), (400, "BadRequest"));
    assert_eq!(
        s.message,
        "strict decoding error: unknown field \"spec.devices.requests[0].exactly.bogus\""
    );
    raw.create(&PostParams::default(), &unknown).await.unwrap();
    let got = api.get("u").await.unwrap();
    let v = serde_json::to_value(&got).unwrap();
    assert!(
        v.pointer("/spec/devices/requests/0/exactly/bogus")
            .is_none()
    );
    // Invalid name.
    let s = api_err(
        api.create(
            &PostParams::default(),
            &serde_json::from_value(claim("Bad_Name", "c", 1)).unwrap(),
        )
        .await,
    );
    assert_eq!(s.code, 422);
    assert!(
        s.message
            .contains("metadata.name: Invalid value: \"Bad_Name\""),
        "{}",
        s.message
    );
    // Unserved kinds are 404.
    let cms: Api<ConfigMap> = Api::namespaced(c.client(), &ns);
    assert_eq!(api_err(cms.list(&ListParams::default()).await).code, 404);
    c.shutdown().await.unwrap();
}

#[tokio::test]
async fn delete_returns_object_and_not_found_after() {
    let (c, ns) = cluster_ns().await;
    let api: Api<ResourceClaim> = Api::namespaced(c.client(), &ns);
    create(&api, claim("a", "gpu.nvidia.com", 1)).await;
    let r = api.delete("a", &DeleteParams::default()).await.unwrap();
    assert!(r.is_left());
    assert_eq!(api_err(api.get("a").await).code, 404);
    assert_eq!(
        api_err(api.delete("a", &DeleteParams::default()).await).code,
        404
    );
    c.shutdown().await.unwrap();
}

#[tokio::test]
async fn metadata_api_lists_gets_and_watches_partial_object_metadata() {
    let (c, ns) = cluster_ns().await;
    let api: Api<ResourceClaim> = Api::namespaced(c.client(), &ns);
    create(&api, claim("a", "gpu.nvidia.com", 1)).await;
    let l = api.list_metadata(&ListParams::default()).await.unwrap();
    assert_eq!(l.items.len(), 1);
    assert_eq!(
        l.items[0].types.as_ref().unwrap().kind,
        "PartialObjectMetadata"
    );
    let m = api.get_metadata("a").await.unwrap();
    assert_eq!(m.metadata.name.as_deref(), Some("a"));
    // kube-runtime's metadata watcher (as the operator watches Namespaces).
    use futures::StreamExt;
    let nss: Api<kube::api::PartialObjectMeta<Namespace>> = Api::all(c.client());
    let mut w = kube::runtime::watcher(nss, kube::runtime::watcher::Config::default()).boxed();
    let mut names = Vec::new();
    while let Some(ev) = w.next().await {
        match ev.unwrap() {
            kube::runtime::watcher::Event::InitApply(o) => names.push(o.metadata.name.unwrap()),
            kube::runtime::watcher::Event::InitDone => break,
            _ => {}
        }
    }
    assert!(
        names.contains(&ns) && names.contains(&"default".to_string()),
        "{names:?}"
    );
    c.shutdown().await.unwrap();
}

#[tokio::test]
async fn events_in_both_groups_and_delete_collection() {
    let (c, ns) = cluster_ns().await;
    let core_events: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(c.client(), &ns);
    create(&core_events, json!({"metadata": {"name": "e1"}, "involvedObject": {"kind": "Pod", "name": "p", "namespace": ns},
        "reason": "Test", "message": "m", "type": "Normal"})).await;
    let new_events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(c.client(), &ns);
    create(&new_events, json!({"metadata": {"name": "e2"}, "eventTime": "2026-01-01T00:00:00.000000Z",
        "reportingController": "teamgpu.io/operator", "reportingInstance": "x", "action": "Reclaim", "reason": "Test",
        "regarding": {"kind": "Pod", "name": "p", "namespace": ns}, "type": "Normal"})).await;
    let api: Api<ResourceClaim> = Api::namespaced(c.client(), &ns);
    for n in ["a", "b", "c"] {
        let mut cl = claim(n, "x", 1);
        cl["metadata"]["labels"] = json!({"del": if n == "c" { "no" } else { "yes" }});
        create(&api, cl).await;
    }
    api.delete_collection(
        &DeleteParams::default(),
        &ListParams::default().labels("del=yes"),
    )
    .await
    .unwrap();
    let left: Vec<String> = api
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|o| o.metadata.name.unwrap())
        .collect();
    assert_eq!(left, vec!["c"]);
    c.shutdown().await.unwrap();
}
