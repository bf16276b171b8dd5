//! The generated ValidatingAdmissionPolicies, evaluated with kube-cel against a matrix of claims
//! and templates a team might submit.

use std::collections::BTreeSet;

use serde_json::{Value, json};
use teamgpu::plan::admission::{DEFAULT_OPERATOR_USER, evaluate, non_team_policy, team_policy};

fn team_params() -> Value {
    json!({
        "apiVersion": "teamgpu.io/v1alpha1", "kind": "TeamGpuPolicy",
        "metadata": {"name": "ml-research"},
        "spec": {"namespaceSelector": {"matchLabels": {"teamgpu.io/team": "ml-research"}},
                 "quotas": [{"sharingPolicy": "a100-80gb", "guaranteed": 8, "limit": 16},
                            {"sharingPolicy": "a100-shared", "guaranteed": 2}]}
    })
}

fn request(kind: &str, namespace: &str) -> kube_cel::AdmissionRequest {
    kube_cel::AdmissionRequest {
        operation: "CREATE".into(),
        namespace: namespace.into(),
        name: "x".into(),
        kind: kube_cel::GroupVersionKind {
            group: "resource.k8s.io".into(),
            version: "v1".into(),
            kind: kind.into(),
        },
        ..Default::default()
    }
}

/// A ResourceClaim with these `devices`.
fn claim(devices: Value) -> Value {
    json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
           "metadata": {"name": "x", "namespace": "ml-dev"}, "spec": {"devices": devices}})
}

/// A ResourceClaimTemplate with these `devices`.
fn template(devices: Value) -> Value {
    json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
           "metadata": {"name": "x", "namespace": "ml-dev"}, "spec": {"spec": {"devices": devices}}})
}

fn exactly(class: &str) -> Value {
    json!({"requests": [{"name": "gpu", "exactly": {"deviceClassName": class}}]})
}

fn team_denials(object: &Value) -> Vec<String> {
    let governed: BTreeSet<String> =
        ["gpu.nvidia.com".to_owned(), "mig.nvidia.com".to_owned()].into();
    let kind = object["kind"].as_str().unwrap();
    evaluate(
        &team_policy(&governed, DEFAULT_OPERATOR_USER),
        object,
        request(kind, "ml-dev"),
        Some(&team_params()),
    )
    .unwrap()
}

fn assert_allowed(object: Value) {
    let denials = team_denials(&object);
    assert!(
        denials.is_empty(),
        "expected {object} to be allowed, got {denials:?}"
    );
}

fn assert_denied(object: Value, says: &str) {
    let denials = team_denials(&object);
    assert_eq!(
        denials.len(),
        1,
        "expected exactly one denial of {object}, got {denials:?}"
    );
    assert!(
        denials[0].contains(says),
        "denial {:?} should say {says:?}",
        denials[0]
    );
    assert!(
        denials[0].contains("namespace ml-dev belongs to TeamGpuPolicy ml-research"),
        "denial {:?} should name the governing team",
        denials[0]
    );
}

#[test]
fn own_classes_are_allowed_in_claims_and_templates() {
    assert_allowed(claim(exactly("a100-80gb.teamgpu.io")));
    assert_allowed(template(exactly("a100-shared.teamgpu.io")));
    assert_allowed(claim(json!({"requests": [{"name": "gpu", "exactly": {
        "deviceClassName": "a100-80gb.teamgpu.io", "allocationMode": "ExactCount", "count": 4}}]})));
}

#[test]
fn classes_for_other_kinds_of_devices_stay_usable() {
    assert_allowed(claim(exactly("compute-domain-default-channel.nvidia.com")));
    assert_allowed(template(exactly("fpga.example.com")));
    // Opaque config is fine where no teamgpu class is involved.
    assert_allowed(claim(json!({
        "requests": [{"name": "nic", "exactly": {"deviceClassName": "nic.example.com"}}],
        "config": [{"requests": ["nic"], "opaque": {"driver": "nic.example.com", "parameters": {"mtu": 9000}}}]
    })));
}

#[test]
fn a_claim_with_no_requests_is_allowed() {
    assert_allowed(claim(json!({})));
    assert_allowed(
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                          "metadata": {"name": "x", "namespace": "ml-dev"}, "spec": {}}),
    );
}

#[test]
fn classes_the_team_has_no_quota_for_are_denied() {
    // Another team's teamgpu class.
    assert_denied(
        claim(exactly("h100.teamgpu.io")),
        "outside the team's quotas",
    );
    // The NVIDIA driver's own class for the same devices: governed, so no back door.
    assert_denied(
        template(exactly("gpu.nvidia.com")),
        "outside the team's quotas",
    );
    assert_denied(
        claim(exactly("mig.nvidia.com")),
        "outside the team's quotas",
    );
}

#[test]
fn every_first_available_alternative_is_checked() {
    assert_denied(
        claim(json!({"requests": [{"name": "gpu", "firstAvailable": [
            {"name": "big", "deviceClassName": "a100-80gb.teamgpu.io"},
            {"name": "any", "deviceClassName": "gpu.nvidia.com"}]}]})),
        "allowed: [a100-80gb.teamgpu.io, a100-shared.teamgpu.io]",
    );
    assert_allowed(claim(
        json!({"requests": [{"name": "gpu", "firstAvailable": [
        {"name": "big", "deviceClassName": "a100-80gb.teamgpu.io", "count": 2},
        {"name": "small", "deviceClassName": "a100-shared.teamgpu.io"}]}]}),
    ));
}

#[test]
fn opaque_config_on_a_teamgpu_class_is_denied() {
    let mps = json!({"driver": "gpu.nvidia.com", "parameters": {"apiVersion": "resource.nvidia.com/v1beta1",
        "kind": "GpuConfig", "sharing": {"strategy": "MPS"}}});
    // Config naming the request.
    assert_denied(
        claim(
            json!({"requests": [{"name": "gpu", "exactly": {"deviceClassName": "a100-shared.teamgpu.io"}}],
                     "config": [{"requests": ["gpu"], "opaque": mps}]}),
        ),
        "opaque device config is not allowed",
    );
    // Config for all requests (no `requests` list), in a template.
    assert_denied(
        template(
            json!({"requests": [{"name": "gpu", "exactly": {"deviceClassName": "a100-80gb.teamgpu.io"}}],
                        "config": [{"opaque": mps}]}),
        ),
        "opaque device config is not allowed",
    );
    // Config naming a firstAvailable subrequest.
    assert_denied(
        claim(json!({"requests": [{"name": "gpu", "firstAvailable": [
                        {"name": "big", "deviceClassName": "a100-80gb.teamgpu.io"}]}],
                     "config": [{"requests": ["gpu/big"], "opaque": mps}]})),
        "opaque device config is not allowed",
    );
    // Config that only names a request of another kind of device is fine.
    assert_allowed(claim(json!({
        "requests": [{"name": "gpu", "exactly": {"deviceClassName": "a100-80gb.teamgpu.io"}},
                     {"name": "nic", "exactly": {"deviceClassName": "nic.example.com"}}],
        "config": [{"requests": ["nic"], "opaque": {"driver": "nic.example.com", "parameters": {}}}]
    })));
}

#[test]
fn admin_access_is_denied() {
    assert_denied(
        claim(json!({"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": "a100-80gb.teamgpu.io", "adminAccess": true}}]})),
        "adminAccess is not allowed",
    );
    assert_allowed(claim(json!({"requests": [{"name": "gpu", "exactly": {
        "deviceClassName": "a100-80gb.teamgpu.io", "adminAccess": false}}]})));
}

#[test]
fn allocation_mode_all_on_a_teamgpu_class_is_denied() {
    assert_denied(
        template(json!({"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": "a100-80gb.teamgpu.io", "allocationMode": "All"}}]})),
        "allocationMode All is not allowed",
    );
    assert_denied(
        claim(json!({"requests": [{"name": "gpu", "firstAvailable": [
            {"name": "all", "deviceClassName": "a100-shared.teamgpu.io", "allocationMode": "All"}]}]})),
        "allocationMode All is not allowed",
    );
    assert_allowed(claim(json!({"requests": [{"name": "nic", "exactly": {
        "deviceClassName": "nic.example.com", "allocationMode": "All"}}]})));
}

#[test]
fn a_team_without_quotas_may_request_no_governed_class() {
    let governed: BTreeSet<String> = ["gpu.nvidia.com".to_owned()].into();
    let params = json!({"metadata": {"name": "empty"}, "spec": {"namespaces": ["ml-dev"]}});
    let object = claim(exactly("a100-80gb.teamgpu.io"));
    let denials = evaluate(
        &team_policy(&governed, DEFAULT_OPERATOR_USER),
        &object,
        request("ResourceClaim", "ml-dev"),
        Some(&params),
    )
    .unwrap();
    assert_eq!(denials.len(), 1, "{denials:?}");
    assert!(denials[0].contains("allowed: []"), "{denials:?}");
}

#[test]
fn namespaces_outside_every_team_get_no_teamgpu_class() {
    let deny = |object: &Value| {
        evaluate(
            &non_team_policy(DEFAULT_OPERATOR_USER),
            object,
            request(object["kind"].as_str().unwrap(), "web"),
            None,
        )
        .unwrap()
    };
    let denials = deny(&claim(exactly("a100-80gb.teamgpu.io")));
    assert_eq!(
        denials,
        ["namespace web belongs to no TeamGpuPolicy, so it may not request teamgpu DeviceClasses"]
    );
    assert_eq!(
        deny(&template(
            json!({"requests": [{"name": "g", "firstAvailable": [
        {"name": "a", "deviceClassName": "a100-shared.teamgpu.io"}]}]})
        ))
        .len(),
        1
    );
    // Outside the teams, teamgpu does not govern other classes.
    assert!(deny(&claim(exactly("gpu.nvidia.com"))).is_empty());
}

#[test]
fn both_policies_leave_the_operator_and_only_the_operator_alone() {
    // The real API server evaluates matchConditions (kube-cel's `request` has no `userInfo`);
    // the e2e scenario `joining_a_team_and_deleting_a_team_meet_no_denied_write` shows the
    // effect. Here: the condition names exactly the given user, quoted as a CEL string.
    let user = "system:serviceaccount:gpu-ops:team'gpu";
    for policy in [team_policy(&BTreeSet::new(), user), non_team_policy(user)] {
        let conditions = policy.spec.unwrap().match_conditions.unwrap();
        assert_eq!(conditions.len(), 1);
        assert_eq!(
            conditions[0].expression,
            r"request.userInfo.username != 'system:serviceaccount:gpu-ops:team\'gpu'"
        );
    }
}
