//! The objects of the tests, shaped as the API server returns them.

use k8s_openapi::api::core::v1::{Event, Pod, ResourceQuota};
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceClaimTemplate};
use k8s_openapi::jiff::Timestamp;
use serde_json::{Value, json};

use crate::api::{GpuSharingPolicy, TeamGpuPolicy};

const NOW: &str = "2026-12-01T10:00:00Z";

pub(super) fn now() -> Timestamp {
    NOW.parse().unwrap()
}

/// `seconds` before [`NOW`], as the API server writes timestamps.
pub(super) fn ago(seconds: i64) -> String {
    Timestamp::from_second(now().as_second() - seconds)
        .unwrap()
        .to_string()
}

pub(super) fn from<T: serde::de::DeserializeOwned>(value: Value) -> T {
    serde_json::from_value(value).unwrap()
}

pub(super) fn sharing(name: &str) -> GpuSharingPolicy {
    from(json!({
        "apiVersion": "teamgpu.io/v1alpha1", "kind": "GpuSharingPolicy",
        "metadata": {"name": name, "generation": 1}, "spec": {},
        "status": {"observedGeneration": 1, "deviceClassName": format!("{name}.teamgpu.io"),
                   "devices": 16}
    }))
}

/// A team with its status for sharing policy `a100`: (guaranteed = effective guarantee, limit,
/// entitlement, requested, allocated, pending, explanation).
pub(super) fn team(
    name: &str,
    namespaces: &[&str],
    numbers: (u32, u32, u32, u32, u32, u32),
    explanation: &str,
    reclaim: Value,
) -> TeamGpuPolicy {
    let (g, limit, entitlement, requested, allocated, pending) = numbers;
    from(json!({
        "apiVersion": "teamgpu.io/v1alpha1", "kind": "TeamGpuPolicy",
        "metadata": {"name": name, "generation": 1, "uid": format!("uid-{name}")},
        "spec": {"namespaces": namespaces, "reclaim": reclaim,
                 "quotas": [{"sharingPolicy": "a100", "guaranteed": g, "limit": limit}]},
        "status": {"observedGeneration": 1, "namespaces": namespaces,
            "quotas": [{"sharingPolicy": "a100", "guaranteed": g, "effectiveGuarantee": g,
                "limit": limit, "weight": 1, "capacity": 16, "entitlement": entitlement,
                "borrowed": entitlement.saturating_sub(g), "requested": requested,
                "allocated": allocated, "pending": pending, "explanation": explanation}]}
    }))
}

/// The template teamgpu makes for `count` devices of `a100`.
pub(super) fn template(namespace: &str, count: u32) -> ResourceClaimTemplate {
    let name = if count == 1 {
        "a100".to_owned()
    } else {
        format!("a100-x{count}")
    };
    from(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": namespace,
                     "labels": {"app.kubernetes.io/managed-by": "teamgpu"}},
        "spec": {"metadata": {}, "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": "a100.teamgpu.io", "allocationMode": "ExactCount",
            "count": count}}]}}}
    }))
}

/// A Pod using template `template` for its claim `gpu`; `claim` is the claim the resourceclaim
/// controller made for it (none: not made).
pub(super) fn pod(
    namespace: &str,
    name: &str,
    template: &str,
    claim: Option<&str>,
    created_ago: i64,
    priority: i32,
) -> Pod {
    let statuses: Vec<Value> = claim
        .map(|c| json!({"name": "gpu", "resourceClaimName": c}))
        .into_iter()
        .collect();
    from(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "uid": format!("uid-{name}"),
                     "creationTimestamp": ago(created_ago)},
        "spec": {"priority": priority,
                 "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10",
                                 "resources": {"claims": [{"name": "gpu"}]}}],
                 "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template}]},
        "status": {"phase": "Pending", "qosClass": "BestEffort",
                   "resourceClaimStatuses": statuses}
    }))
}

/// A claim made from template `a100-x<count>` for `pod`, allocated on `devices` of node `n1`
/// when given.
pub(super) fn claim(
    namespace: &str,
    name: &str,
    pod: &str,
    count: u32,
    allocated: bool,
) -> ResourceClaim {
    let mut claim: ResourceClaim = from(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace,
                     "annotations": {"resource.kubernetes.io/pod-claim-name": "gpu"},
                     "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": pod,
                                          "uid": format!("uid-{pod}"), "controller": true}]},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": "a100.teamgpu.io", "allocationMode": "ExactCount",
            "count": count}}]}}
    }));
    if allocated {
        let results: Vec<Value> = (0..count)
            .map(|i| {
                json!({"request": "gpu", "driver": "gpu.nvidia.com", "pool": "n1",
                       "device": format!("gpu-{i}")})
            })
            .collect();
        claim.status = Some(from(json!({
            "allocation": {"devices": {"results": results}},
            "reservedFor": [{"resource": "pods", "name": pod, "uid": format!("uid-{pod}")}]
        })));
    }
    claim
}

pub(super) fn quota(namespace: &str, hard: u32, used: u32) -> ResourceQuota {
    let key = "a100.teamgpu.io.deviceclass.resource.k8s.io/devices";
    from(json!({
        "apiVersion": "v1", "kind": "ResourceQuota",
        "metadata": {"name": "teamgpu", "namespace": namespace},
        "spec": {"hard": {key: hard.to_string()}},
        "status": {"hard": {key: hard.to_string()}, "used": {key: used.to_string()}}
    }))
}

/// An Event about `pod` as kube-controller-manager's resourceclaim controller or the scheduler
/// writes it.
pub(super) fn event(
    namespace: &str,
    pod: &str,
    reason: &str,
    component: &str,
    message: &str,
    count: i32,
) -> Event {
    from(json!({
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": format!("{pod}.1"), "namespace": namespace},
        "involvedObject": {"kind": "Pod", "namespace": namespace, "name": pod,
                           "uid": format!("uid-{pod}"), "apiVersion": "v1"},
        "reason": reason, "message": message, "type": "Warning", "count": count,
        "source": {"component": component},
        "firstTimestamp": ago(100), "lastTimestamp": ago(10)
    }))
}

/// As kube-controller-manager 1.34 words it (seen on the e2e control plane).
pub(super) const REFUSED: &str = "PodResourceClaim gpu: create ResourceClaim : \
    resourceclaims.resource.k8s.io \"train-3-gpu-4rj9x\" is forbidden: exceeded quota: teamgpu, \
    requested: a100.teamgpu.io.deviceclass.resource.k8s.io/devices=2, used: \
    a100.teamgpu.io.deviceclass.resource.k8s.io/devices=8, limited: \
    a100.teamgpu.io.deviceclass.resource.k8s.io/devices=8";
