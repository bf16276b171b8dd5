//! Admission: ResourceQuota for DRA claims and ValidatingAdmissionPolicies.

mod common;

use common::*;
use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::core::v1::{Namespace, ResourceQuota};
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceClaimTemplate};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

fn used(q: &ResourceQuota, k: &str) -> String {
    q.status
        .as_ref()
        .and_then(|s| s.used.as_ref())
        .and_then(|u| u.get(k))
        .map(|q| q.0.clone())
        .unwrap_or_default()
}

/// Kubernetes' DRA quota (the commit introducing it, kubernetes/kubernetes 299ecde5): "
/// <device-class-name>.deviceclass.resource.k8s.io/devices limits the number of ResourceClaim
/// objects in a namespace such that the number of devices requested through those objects with
/// that class does not exceed the limit. [...] For exact counts, the quota limit is based on the
/// sum of those exact counts. For requests asking for "all" matching devices, the maximum number
/// of allocated devices per claim is used as a worst-case upper bound."
///
/// Counting as the upstream evaluator does (pkg/quota/v1/evaluator/core/resource_claims.go,
/// `claimEvaluator.Usage`): `count/resourceclaims.resource.k8s.io` 1 per claim;
/// `<class>.deviceclass.resource.k8s.io/devices` = `count` for ExactCount, 32
/// (`AllocationResultsMaxSize`, "Worst case...") for All, and for `firstAvailable` "the worst
/// case per device class" (the largest subrequest). Exceeding `hard` is a 403 with
/// "exceeded quota: <name>, requested: ..., used: ..., limited: ...".
#[tokio::test]
async fn resource_quota_counts_dra_claims_like_kubernetes() {
    let (c, ns) = cluster_ns().await;
    let quotas: Api<ResourceQuota> = Api::namespaced(c.client(), &ns);
    create(
        &quotas,
        json!({"metadata": {"name": "gpus"}, "spec": {"hard": {
        "count/resourceclaims.resource.k8s.io": "10",
        "gpu.example.com.deviceclass.resource.k8s.io/devices": "40",
        "mig.example.com.deviceclass.resource.k8s.io/devices": "3"}}}),
    )
    .await;
    let claims: Api<ResourceClaim> = Api::namespaced(c.client(), &ns);
    create(&claims, claim("two", "gpu.example.com", 2)).await;
    let all = json!({"metadata": {"name": "all"}, "spec": {"devices": {"requests": [
        {"name": "r", "exactly": {"deviceClassName": "gpu.example.com", "allocationMode": "All"}}]}}});
    create(&claims, all).await;
    let fa = json!({"metadata": {"name": "fa"}, "spec": {"devices": {"requests": [{"name": "r", "firstAvailable": [
        {"name": "big", "deviceClassName": "mig.example.com", "count": 3},
        {"name": "small", "deviceClassName": "mig.example.com", "count": 1}]}]}}});
    create(&claims, fa).await;
    let q = quotas.get("gpus").await.unwrap();
    assert_eq!(used(&q, "count/resourceclaims.resource.k8s.io"), "3");
    assert_eq!(
        used(&q, "gpu.example.com.deviceclass.resource.k8s.io/devices"),
        "34"
    );
    assert_eq!(
        used(&q, "mig.example.com.deviceclass.resource.k8s.io/devices"),
        "3"
    );

    // 34 + 8 > 40: rejected with Kubernetes' message.
    let s = api_err(
        claims
            .create(
                &PostParams::default(),
                &serde_json::from_value(claim("eight", "gpu.example.com", 8)).unwrap(),
            )
            .await,
    );
    assert_eq!((s.code, s.reason.as_str()), (403, "Forbidden"));
    assert_eq!(
        s.message,
        "resourceclaims.resource.k8s.io \"eight\" is forbidden: exceeded quota: gpus, requested: gpu.example.com.deviceclass.resource.k8s.io/devices=8, used: gpu.example.com.deviceclass.resource.k8s.io/devices=34, limited: gpu.example.com.deviceclass.resource.k8s.io/devices=40"
    );
    // Deleting a claim releases its usage (the quota controller's replenishment).
    claims.delete("all", &Default::default()).await.unwrap();
    eventually(5, || async {
        let q = quotas.get("gpus").await.ok()?;
        (used(&q, "gpu.example.com.deviceclass.resource.k8s.io/devices") == "2").then_some(())
    })
    .await;
    create(&claims, claim("eight", "gpu.example.com", 8)).await;
    c.shutdown().await.unwrap();
}

fn policy(name: &str, expression: &str, message: &str, param_kind: Option<Value>) -> Value {
    let mut p = json!({"metadata": {"name": name}, "spec": {
        "failurePolicy": "Fail",
        "matchConstraints": {"resourceRules": [{"apiGroups": ["resource.k8s.io"], "apiVersions": ["v1"],
            "operations": ["CREATE", "UPDATE"], "resources": ["resourceclaims", "resourceclaimtemplates"]}]},
        "validations": [{"expression": expression, "message": message}]}});
    if let Some(pk) = param_kind {
        p["spec"]["paramKind"] = pk;
    }
    p
}

/// https://kubernetes.io/docs/reference/access-authn-authz/validating-admission-policy/: a
/// binding applies its policy to the requests its namespaceSelector matches; a false validation
/// with the Deny action rejects the request with the validation's message; params are read from
/// the object the binding's paramRef names.
#[tokio::test]
async fn validating_admission_policies_with_params_and_namespace_selectors() {
    let (c, ns) = cluster_ns().await;
    let other = c.namespace("other-").await.unwrap();
    let nss: Api<Namespace> = Api::all(c.client());
    nss.patch(
        &ns,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"teamgpu.io/team": "a"}}})),
    )
    .await
    .unwrap();
    // Params can be any served kind: a Lease in the namespace carries the limit in its labels.
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> = Api::namespaced(c.client(), &ns);
    create(
        &leases,
        json!({"metadata": {"name": "limits", "labels": {"max": "2"}}}),
    )
    .await;

    let vaps: Api<ValidatingAdmissionPolicy> = Api::all(c.client());
    create(&vaps, policy(
        "max-devices",
        "object.kind != 'ResourceClaim' || object.spec.devices.requests.all(r, !has(r.exactly) || r.exactly.count <= int(params.metadata.labels['max']))",
        "too many devices per request",
        Some(json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease"})),
    )).await;
    let bindings: Api<ValidatingAdmissionPolicyBinding> = Api::all(c.client());
    create(
        &bindings,
        json!({"metadata": {"name": "max-devices-team-a"}, "spec": {
        "policyName": "max-devices", "validationActions": ["Deny"],
        "paramRef": {"name": "limits", "parameterNotFoundAction": "Deny"},
        "matchResources": {"namespaceSelector": {"matchLabels": {"teamgpu.io/team": "a"}}}}}),
    )
    .await;

    let claims: Api<ResourceClaim> = Api::namespaced(c.client(), &ns);
    create(&claims, claim("ok", "gpu.example.com", 2)).await;
    let s = api_err(
        claims
            .create(
                &PostParams::default(),
                &serde_json::from_value(claim("big", "gpu.example.com", 3)).unwrap(),
            )
            .await,
    );
    assert_eq!((s.code, s.reason.as_str()), (403, "Forbidden"));
    assert_eq!(
        s.message,
        "resourceclaims.resource.k8s.io \"big\" is forbidden: ValidatingAdmissionPolicy 'max-devices' with binding 'max-devices-team-a' denied request: too many devices per request"
    );
    // Another namespace is not selected by the binding.
    let other_claims: Api<ResourceClaim> = Api::namespaced(c.client(), &other);
    create(&other_claims, claim("big", "gpu.example.com", 3)).await;

    // A second policy without params on templates, with a CEL message expression.
    create(&vaps, json!({"metadata": {"name": "named"}, "spec": {
        "matchConstraints": {"resourceRules": [{"apiGroups": ["resource.k8s.io"], "apiVersions": ["v1"],
            "operations": ["CREATE"], "resources": ["resourceclaimtemplates"]}]},
        "validations": [{"expression": "object.metadata.name.startsWith('tgp-')",
            "messageExpression": "'template ' + object.metadata.name + ' must start with tgp-'", "reason": "Invalid"}]}})).await;
    create(&bindings, json!({"metadata": {"name": "named"}, "spec": {"policyName": "named", "validationActions": ["Deny"]}})).await;
    let templates: Api<ResourceClaimTemplate> = Api::namespaced(c.client(), &other);
    let t = json!({"metadata": {"name": "x"}, "spec": {"spec": {"devices": {"requests": [{"name": "r", "exactly": {"deviceClassName": "c"}}]}}}});
    let s = api_err(
        templates
            .create(&PostParams::default(), &serde_json::from_value(t).unwrap())
            .await,
    );
    assert_eq!((s.code, s.reason.as_str()), (422, "Invalid"));
    assert!(
        s.message
            .ends_with("denied request: template x must start with tgp-"),
        "{}",
        s.message
    );
    c.shutdown().await.unwrap();
}
