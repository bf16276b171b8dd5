//! The in-process controllers: resourceclaim controller, DRA scheduler, garbage collection of
//! claims, quota rejections with retry, and Pod eviction with PodDisruptionBudgets.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::*;
use k8s_openapi::api::core::v1::{Event, Pod, ResourceQuota};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceClaimTemplate};
use kube::api::{Api, EvictParams, ListParams, Patch, PatchParams};
use serde_json::{Value, json};

fn template(name: &str, count: u32) -> Value {
    json!({"metadata": {"name": name}, "spec": {"metadata": {"labels": {"from": "template"}}, "spec": {"devices": {"requests": [
        {"name": "gpus", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": count}}]}}}})
}

fn pod(name: &str, template: &str) -> Value {
    json!({"metadata": {"name": name, "labels": {"app": "train"}}, "spec": {
        "containers": [{"name": "c", "image": "cuda", "resources": {"claims": [{"name": "gpus"}]}}],
        "resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": template}]}})
}

async fn running(pods: &Api<Pod>, name: &str) -> Pod {
    eventually(5, || async {
        let p = pods.get(name).await.ok()?;
        (p.status.as_ref()?.phase.as_deref() == Some("Running")).then_some(p)
    })
    .await
}

fn devices(c: &ResourceClaim) -> Vec<String> {
    c.status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.devices.as_ref())
        .map(|d| {
            d.results
                .iter()
                .flatten()
                .map(|r| r.device.clone())
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test]
async fn claims_from_templates_are_created_allocated_bound_and_collected() {
    let (c, ns) = cluster_ns().await;
    install_nvidia(&c).await;
    let templates: Api<ResourceClaimTemplate> = Api::namespaced(c.client(), &ns);
    create(&templates, template("two", 2)).await;
    create(&templates, template("seven", 7)).await;
    let pods: Api<Pod> = Api::namespaced(c.client(), &ns);
    let claims: Api<ResourceClaim> = Api::namespaced(c.client(), &ns);
    create(&pods, pod("a", "two")).await;
    let a = running(&pods, "a").await;
    assert_eq!(
        a.spec.as_ref().unwrap().node_name.as_deref(),
        Some("worker-gpu-01")
    );
    let st = &a
        .status
        .as_ref()
        .unwrap()
        .resource_claim_statuses
        .as_ref()
        .unwrap()[0];
    assert_eq!(st.name, "gpus");
    let claim_name = st.resource_claim_name.clone().unwrap();
    assert!(claim_name.starts_with("a-gpus-"), "{claim_name}");
    let ca = claims.get(&claim_name).await.unwrap();
    let owner = &ca.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str(), owner.controller),
        ("Pod", "a", Some(true))
    );
    assert_eq!(
        ca.metadata.annotations.as_ref().unwrap()["resource.kubernetes.io/pod-claim-name"],
        "gpus"
    );
    assert_eq!(ca.metadata.labels.as_ref().unwrap()["from"], "template");
    assert_eq!(devices(&ca).len(), 2);
    let reserved = ca.status.as_ref().unwrap().reserved_for.as_ref().unwrap();
    assert_eq!(reserved[0].name, "a");

    // 7 more GPUs do not fit on the 8-GPU node while "a" holds 2.
    create(&pods, pod("b", "seven")).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let b = pods.get("b").await.unwrap();
    assert!(b.spec.as_ref().unwrap().node_name.is_none());
    assert_eq!(b.status.as_ref().unwrap().phase.as_deref(), Some("Pending"));
    // Deleting "a" garbage-collects its claim, which frees the devices for "b".
    pods.delete("a", &Default::default()).await.unwrap();
    eventually(5, || async {
        claims.get(&claim_name).await.is_err().then_some(())
    })
    .await;
    running(&pods, "b").await;
    let all = claims.list(&ListParams::default()).await.unwrap();
    assert_eq!(all.items.len(), 1);
    let devs = devices(&all.items[0]);
    assert_eq!(devs.len(), 7);
    assert_eq!(devs.iter().collect::<BTreeSet<_>>().len(), 7);
    c.shutdown().await.unwrap();
}

#[tokio::test]
async fn no_device_is_given_to_two_claims() {
    let (c, ns) = cluster_ns().await;
    install_nvidia(&c).await;
    let templates: Api<ResourceClaimTemplate> = Api::namespaced(c.client(), &ns);
    create(&templates, template("three", 3)).await;
    let pods: Api<Pod> = Api::namespaced(c.client(), &ns);
    for p in ["p1", "p2", "p3"] {
        create(&pods, pod(p, "three")).await;
    }
    // Two fit (6 of 8 GPUs); the third stays pending.
    eventually(5, || async {
        let l = pods
            .list(&ListParams::default().fields("status.phase=Running"))
            .await
            .ok()?;
        (l.items.len() == 2).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        pods.list(&ListParams::default().fields("status.phase=Pending"))
            .await
            .unwrap()
            .items
            .len(),
        1
    );
    let claims: Api<ResourceClaim> = Api::namespaced(c.client(), &ns);
    let all: Vec<String> = claims
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .flat_map(devices)
        .collect();
    assert_eq!(all.len(), 6);
    assert_eq!(all.iter().collect::<BTreeSet<_>>().len(), 6);
    c.shutdown().await.unwrap();
}

#[tokio::test]
async fn quota_rejection_leaves_the_pod_pending_and_is_retried() {
    let (c, ns) = cluster_ns().await;
    install_nvidia(&c).await;
    let quotas: Api<ResourceQuota> = Api::namespaced(c.client(), &ns);
    create(&quotas, json!({"metadata": {"name": "q"}, "spec": {"hard": {"gpu.nvidia.com.deviceclass.resource.k8s.io/devices": "2"}}})).await;
    let templates: Api<ResourceClaimTemplate> = Api::namespaced(c.client(), &ns);
    create(&templates, template("two", 2)).await;
    let pods: Api<Pod> = Api::namespaced(c.client(), &ns);
    create(&pods, pod("a", "two")).await;
    running(&pods, "a").await;
    create(&pods, pod("b", "two")).await;
    let msg = eventually(5, || async {
        let p = pods.get("b").await.ok()?;
        let cond = p
            .status?
            .conditions?
            .into_iter()
            .find(|c| c.type_ == "PodScheduled")?;
        (cond.status == "False").then_some(cond.message?)
    })
    .await;
    assert!(
        msg.contains(
            "exceeded quota: q, requested: gpu.nvidia.com.deviceclass.resource.k8s.io/devices=2"
        ),
        "{msg}"
    );
    let events: Api<Event> = Api::namespaced(c.client(), &ns);
    let ev = eventually(5, || async {
        events
            .list(&ListParams::default())
            .await
            .ok()?
            .items
            .into_iter()
            .find(|e| e.reason.as_deref() == Some("FailedResourceClaimCreation"))
    })
    .await;
    assert_eq!(ev.involved_object.name.as_deref(), Some("b"));
    assert_eq!(ev.type_.as_deref(), Some("Warning"));
    // Raising the quota lets the retry (with backoff) succeed.
    quotas.patch("q", &PatchParams::default(), &Patch::Merge(json!({"spec": {"hard": {"gpu.nvidia.com.deviceclass.resource.k8s.io/devices": "4"}}}))).await.unwrap();
    running(&pods, "b").await;
    c.shutdown().await.unwrap();
}

/// https://kubernetes.io/docs/concepts/scheduling-eviction/api-eviction/: an eviction that would
/// violate a PodDisruptionBudget is refused with 429 Too Many Requests.
#[tokio::test]
async fn eviction_honours_pod_disruption_budgets() {
    let (c, ns) = cluster_ns().await;
    let pods: Api<Pod> = Api::namespaced(c.client(), &ns);
    for p in ["a", "b"] {
        create(&pods, json!({"metadata": {"name": p, "labels": {"app": "x"}}, "spec": {"containers": [{"name": "c", "image": "i"}]}})).await;
        running(&pods, p).await;
    }
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(c.client(), &ns);
    create(&pdbs, json!({"metadata": {"name": "pdb"}, "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "x"}}}})).await;
    eventually(5, || async {
        let p = pdbs.get("pdb").await.ok()?;
        (p.status?.disruptions_allowed == 1).then_some(())
    })
    .await;
    pods.evict("a", &EvictParams::default()).await.unwrap();
    // The evicted Pod terminates gracefully (deletionTimestamp = now + its grace period), then
    // the kubelet removes it.
    let a = pods.get("a").await;
    assert!(a.is_err() || a.unwrap().metadata.deletion_timestamp.is_some());
    eventually(5, || async { pods.get("a").await.is_err().then_some(()) }).await;
    // kube's default client retries 429 (up to 15 times, with backoff up to 1000 s): the
    // refused eviction is seen with a client that does not.
    let raw: Api<Pod> = Api::namespaced(c.client_without_retry(), &ns);
    let s = api_err(raw.evict("b", &EvictParams::default()).await);
    assert_eq!((s.code, s.reason.as_str()), (429, "TooManyRequests"));
    assert_eq!(
        s.message,
        "Cannot evict pod as it would violate the pod's disruption budget."
    );
    assert!(pods.get("b").await.is_ok());
    c.shutdown().await.unwrap();
}

fn claim_with(name: &str, requests: Value) -> Value {
    json!({"metadata": {"name": name}, "spec": {"devices": {"requests": requests}}})
}

fn pod_with_claim(name: &str, claim: &str) -> Value {
    json!({"metadata": {"name": name}, "spec": {
        "containers": [{"name": "c", "image": "cuda", "resources": {"claims": [{"name": "gpus"}]}}],
        "resourceClaims": [{"name": "gpus", "resourceClaimName": claim}]}})
}

#[tokio::test]
async fn scheduler_honours_request_selectors_all_first_available_and_shared_claims() {
    let (c, ns) = cluster_ns().await;
    install_nvidia(&c).await;
    let claims: Api<ResourceClaim> = Api::namespaced(c.client(), &ns);
    let pods: Api<Pod> = Api::namespaced(c.client(), &ns);
    // A request selector no device matches: the Pod stays pending.
    create(&claims, claim_with("h100", json!([{"name": "gpus", "exactly": {"deviceClassName": "gpu.nvidia.com",
        "selectors": [{"cel": {"expression": "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA H100'"}}]}}]))).await;
    create(&pods, pod_with_claim("h", "h100")).await;
    // firstAvailable: 16 GPUs cannot be had, 3 can; the result names the subrequest.
    create(
        &claims,
        claim_with(
            "fa",
            json!([{"name": "gpus", "firstAvailable": [
        {"name": "many", "deviceClassName": "gpu.nvidia.com", "count": 16},
        {"name": "some", "deviceClassName": "gpu.nvidia.com", "count": 3}]}]),
        ),
    )
    .await;
    create(&pods, pod_with_claim("f", "fa")).await;
    let f = running(&pods, "f").await;
    assert_eq!(f.spec.unwrap().node_name.as_deref(), Some("worker-gpu-01"));
    let fa = claims.get("fa").await.unwrap();
    let results = fa
        .status
        .unwrap()
        .allocation
        .unwrap()
        .devices
        .unwrap()
        .results
        .unwrap();
    assert_eq!(results.len(), 3);
    assert!(results.iter().all(|r| r.request == "gpus/some"
        && r.driver == "gpu.nvidia.com"
        && r.pool == "worker-gpu-01"));
    // All: every remaining matching device (8 - 3 = 5), shared by two Pods through one claim.
    create(&claims, claim_with("all", json!([{"name": "gpus", "exactly": {"deviceClassName": "gpu.nvidia.com", "allocationMode": "All"}}]))).await;
    create(&pods, pod_with_claim("s1", "all")).await;
    create(&pods, pod_with_claim("s2", "all")).await;
    running(&pods, "s1").await;
    running(&pods, "s2").await;
    let all = claims.get("all").await.unwrap();
    assert_eq!(devices(&all).len(), 5);
    let reserved: Vec<String> = all
        .status
        .unwrap()
        .reserved_for
        .unwrap()
        .into_iter()
        .map(|r| r.name)
        .collect();
    assert_eq!(reserved, vec!["s1", "s2"]);
    // The unmatched claim is still unallocated and its Pod unbound.
    assert!(
        claims
            .get("h100")
            .await
            .unwrap()
            .status
            .and_then(|s| s.allocation)
            .is_none()
    );
    assert!(
        pods.get("h")
            .await
            .unwrap()
            .spec
            .unwrap()
            .node_name
            .is_none()
    );
    // Deleting both users of the shared claim releases its reservation and allocation.
    pods.delete("s1", &Default::default()).await.unwrap();
    pods.delete("s2", &Default::default()).await.unwrap();
    eventually(5, || async {
        let c = claims.get("all").await.ok()?;
        c.status
            .as_ref()
            .is_none_or(|s| s.allocation.is_none() && s.reserved_for.is_none())
            .then_some(())
    })
    .await;
    c.shutdown().await.unwrap();
}

/// DRAAdminAccess: `adminAccess` needs the namespace label
/// `resource.kubernetes.io/admin-access: "true"` (422 otherwise); an admin-access claim gets
/// devices that other claims hold, marked `adminAccess: true`, without taking them.
#[tokio::test]
async fn admin_access_needs_the_namespace_label_and_shares_devices() {
    let (c, ns) = cluster_ns().await;
    install_nvidia(&c).await;
    let claims: Api<ResourceClaim> = Api::namespaced(c.client(), &ns);
    let admin_claim = claim_with(
        "admin",
        json!([{"name": "gpus", "exactly": {"deviceClassName": "gpu.nvidia.com",
        "allocationMode": "All", "adminAccess": true}}]),
    );
    let s = common::api_err(
        claims
            .create(
                &kube::api::PostParams::default(),
                &serde_json::from_value(admin_claim.clone()).unwrap(),
            )
            .await,
    );
    assert_eq!((s.code, s.reason.as_str()), (422, "Invalid"));
    assert!(
        s.message.contains("spec.devices.requests[0].exactly.adminAccess: Forbidden: admin access to devices requires the `resource.kubernetes.io/admin-access: true` label on the containing namespace"),
        "{}",
        s.message
    );
    let nss: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(c.client());
    nss.patch(
        &ns,
        &PatchParams::default(),
        &Patch::Merge(
            json!({"metadata": {"labels": {"resource.kubernetes.io/admin-access": "true"}}}),
        ),
    )
    .await
    .unwrap();
    // All 8 GPUs held by a normal claim ...
    create(&claims, claim_with("all", json!([{"name": "gpus", "exactly": {"deviceClassName": "gpu.nvidia.com", "allocationMode": "All"}}]))).await;
    let pods: Api<Pod> = Api::namespaced(c.client(), &ns);
    create(&pods, pod_with_claim("user", "all")).await;
    running(&pods, "user").await;
    // ... are still available to the admin.
    create(&claims, admin_claim).await;
    create(&pods, pod_with_claim("monitor", "admin")).await;
    running(&pods, "monitor").await;
    let admin = claims.get("admin").await.unwrap();
    let results = admin
        .status
        .unwrap()
        .allocation
        .unwrap()
        .devices
        .unwrap()
        .results
        .unwrap();
    assert_eq!(results.len(), 8);
    assert!(results.iter().all(|r| r.admin_access == Some(true)));
    c.shutdown().await.unwrap();
}
