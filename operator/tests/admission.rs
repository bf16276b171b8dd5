//! The generated ValidatingAdmissionPolicies, evaluated with kube-cel against a matrix of claims
//! and templates a team might submit.

use serde_json::{Value, json};
use teamgpu::core::plan::admission::{
    DEFAULT_OPERATOR_USER, GovernedClasses, non_team_policy, team_policy,
};
use vap::evaluate;

#[path = "support/vap.rs"]
mod vap;

/// The NVIDIA driver's classes select governed devices; `gpu.nvidia.com` also serves the
/// extended resource `nvidia.com/gpu`.
fn governed() -> GovernedClasses {
    GovernedClasses {
        foreign: ["gpu.nvidia.com".to_owned(), "mig.nvidia.com".to_owned()].into(),
        extended: [
            "nvidia.com/gpu",
            "deviceclass.resource.kubernetes.io/gpu.nvidia.com",
            "deviceclass.resource.kubernetes.io/mig.nvidia.com",
            "deviceclass.resource.kubernetes.io/a100-80gb.teamgpu.io",
            "deviceclass.resource.kubernetes.io/a100-shared.teamgpu.io",
            "deviceclass.resource.kubernetes.io/h100.teamgpu.io",
        ]
        .map(str::to_owned)
        .into(),
    }
}

/// The params of the team policy: the namespace's teamgpu quota, shaped as the operator writes
/// it for a team with quotas of a100-80gb and a100-shared, and in force: kube-controller-manager
/// has copied its hard to the status and counted the namespace's claims.
fn quota_params(team: &str, classes: &str) -> Value {
    let hard = json!({"a100-80gb.teamgpu.io.deviceclass.resource.k8s.io/devices": "8",
                      "a100-shared.teamgpu.io.deviceclass.resource.k8s.io/devices": "2",
                      "h100.teamgpu.io.deviceclass.resource.k8s.io/devices": "0"});
    json!({
        "apiVersion": "v1", "kind": "ResourceQuota",
        "metadata": {"name": "teamgpu", "namespace": "ml-dev",
                     "annotations": {"teamgpu.io/team": team, "teamgpu.io/device-classes": classes}},
        "spec": {"hard": hard},
        "status": {"hard": hard,
                   "used": {"a100-80gb.teamgpu.io.deviceclass.resource.k8s.io/devices": "3",
                            "a100-shared.teamgpu.io.deviceclass.resource.k8s.io/devices": "0",
                            "h100.teamgpu.io.deviceclass.resource.k8s.io/devices": "0"}}
    })
}

fn team_params() -> Value {
    quota_params("ml-research", "a100-80gb.teamgpu.io a100-shared.teamgpu.io")
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
    denials_with(object, &team_params())
}

/// What the team policy says of `object` in namespace ml-dev, whose quota is `params`.
fn denials_with(object: &Value, params: &Value) -> Vec<String> {
    let kind = object["kind"].as_str().unwrap();
    evaluate(
        &team_policy(&governed(), DEFAULT_OPERATOR_USER),
        object,
        request(kind, "ml-dev"),
        Some(params),
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

/// Quota admission judges by the quota's `status.hard`: until kube-controller-manager has
/// counted a quota just written (a new team namespace) or changed, it limits nothing, or still
/// the old hard. Claims of a class whose hard is not counted yet wait for it; templates, other
/// classes and a raised hard (whose old one refuses what it refuses) do not.
#[test]
fn claims_of_a_class_wait_until_the_quota_is_in_force_for_it() {
    let says = "ResourceQuota teamgpu is not in force yet";
    let a100 = "a100-80gb.teamgpu.io";
    let shared = "a100-shared.teamgpu.io";
    let key = |class: &str| format!("{class}.deviceclass.resource.k8s.io/devices");
    let with = |edit: &dyn Fn(&mut Value)| {
        let mut params = team_params();
        edit(&mut params);
        params
    };
    let new = with(&|p| {
        p.as_object_mut().unwrap().remove("status");
    });
    let lowered = with(&|p| p["spec"]["hard"][key(a100)] = json!("4"));
    let raised = with(&|p| p["spec"]["hard"][key(a100)] = json!("12"));
    let added = with(&|p| {
        p["status"]["hard"]
            .as_object_mut()
            .unwrap()
            .remove(&key(shared));
    });
    let first_available = |class: &str| {
        claim(json!({"requests": [{"name": "gpu", "firstAvailable": [
            {"name": "big", "deviceClassName": class}]}]}))
    };
    let cases = [
        ("new", &new, vec![a100, shared], vec![]),
        ("lowered", &lowered, vec![a100], vec![shared]),
        ("raised", &raised, vec![], vec![a100, shared]),
        ("added", &added, vec![shared], vec![a100]),
    ];
    for (case, params, waits, taken) in cases {
        for class in waits {
            for object in [claim(exactly(class)), first_available(class)] {
                let denials = denials_with(&object, params);
                assert!(
                    denials.len() == 1 && denials[0].contains(says),
                    "{case}, {class}: {denials:?}"
                );
            }
            let template = template(exactly(class));
            assert_eq!(
                denials_with(&template, params),
                Vec::<String>::new(),
                "{case}"
            );
        }
        for class in taken {
            let denials = denials_with(&claim(exactly(class)), params);
            assert_eq!(denials, Vec::<String>::new(), "{case}, {class}");
        }
        let nic = claim(exactly("nic.example.com"));
        assert_eq!(denials_with(&nic, params), Vec::<String>::new(), "{case}");
    }
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
    let params = quota_params("empty", "");
    let object = claim(exactly("a100-80gb.teamgpu.io"));
    let denials = evaluate(
        &team_policy(&governed(), DEFAULT_OPERATOR_USER),
        &object,
        request("ResourceClaim", "ml-dev"),
        Some(&params),
    )
    .unwrap();
    assert_eq!(denials.len(), 1, "{denials:?}");
    assert!(denials[0].contains("allowed: []"), "{denials:?}");
    assert!(
        denials[0].ends_with("(namespace ml-dev belongs to TeamGpuPolicy empty)"),
        "{denials:?}"
    );
}

#[test]
fn namespaces_outside_every_team_get_no_governed_class() {
    let team_namespaces = ["ml-dev", "ml-train"].into();
    let policy = non_team_policy(&governed(), DEFAULT_OPERATOR_USER, &team_namespaces);
    let deny_in = |namespace: &str, object: &Value| {
        evaluate(
            &policy,
            object,
            request(object["kind"].as_str().unwrap(), namespace),
            None,
        )
        .unwrap()
    };
    let deny = |object: &Value| deny_in("web", object);
    // A team namespace is left to the team policy.
    assert!(deny_in("ml-dev", &claim(exactly("a100-80gb.teamgpu.io"))).is_empty());
    assert!(deny_in("ml-train", &claim(exactly("gpu.nvidia.com"))).is_empty());
    let outside = "namespace web belongs to no TeamGpuPolicy, so it may not use GPUs that teamgpu \
                   governs (teamgpu DeviceClasses and classes selecting the same devices): label \
                   it for a team, or ask a cluster admin to exempt it with teamgpu.io/exempt=true";
    assert_eq!(deny(&claim(exactly("a100-80gb.teamgpu.io"))), [outside]);
    // The driver's own class selects the governed devices too.
    assert_eq!(deny(&claim(exactly("gpu.nvidia.com"))), [outside]);
    assert_eq!(
        deny(&template(
            json!({"requests": [{"name": "g", "firstAvailable": [
            {"name": "nic", "deviceClassName": "nic.example.com"},
            {"name": "mig", "deviceClassName": "mig.nvidia.com"}]}]})
        )),
        [outside]
    );
    assert_eq!(
        deny(&template(
            json!({"requests": [{"name": "g", "firstAvailable": [
        {"name": "a", "deviceClassName": "a100-shared.teamgpu.io"}]}]})
        ))
        .len(),
        1
    );
    // Classes of other devices are not teamgpu's business.
    assert!(deny(&claim(exactly("nic.example.com"))).is_empty());
    // Pods asking for extended resources: see the e2e scenario
    // `a_team_member_with_edit_cannot_escape_the_entitlement`. kube-cel escapes every map key
    // (`nvidia.com/gpu` becomes `nvidia__dot__com__slash__gpu`), where Kubernetes escapes only
    // schema property names, so resource maps cannot be evaluated faithfully here.
}

#[test]
fn one_binding_per_policy_without_a_list_of_namespaces() {
    use teamgpu::core::plan::admission::{Enforcement, non_team_binding, team_binding};
    // The team policy: the namespace's teamgpu quota as params; none, no team, no check.
    let team = serde_json::to_value(team_binding(Enforcement::Deny).spec.unwrap()).unwrap();
    assert_eq!(
        team,
        json!({"policyName": "teamgpu-team-requests",
               "paramRef": {"name": "teamgpu", "parameterNotFoundAction": "Allow"},
               "validationActions": ["Deny"]})
    );
    // The non-team policy: every namespace but the exempt ones (the policy's match condition
    // leaves the team namespaces out).
    let non_team =
        serde_json::to_value(non_team_binding(Enforcement::Deny, None).spec.unwrap()).unwrap();
    assert_eq!(
        non_team,
        json!({"policyName": "teamgpu-non-team-requests",
               "matchResources": {"namespaceSelector": {"matchExpressions": [
                   {"key": "teamgpu.io/exempt", "operator": "NotIn", "values": ["true"]}]}},
               "validationActions": ["Deny"]})
    );
}

#[test]
fn warn_and_audit_admit_what_deny_refuses_and_say_so() {
    use teamgpu::core::plan::admission::{Enforcement, non_team_binding, team_binding};
    use teamgpu::core::plan::namespace_admission::{exemption_binding, membership_binding};
    for (flag, actions) in [
        ("Deny", json!(["Deny"])),
        // Warn: a warning to the client and an audit annotation, nothing refused.
        ("warn", json!(["Warn", "Audit"])),
        ("AUDIT", json!(["Audit"])),
    ] {
        let mode: Enforcement = flag.parse().unwrap();
        for binding in [
            team_binding(mode),
            non_team_binding(mode, None),
            membership_binding(mode),
            exemption_binding(mode),
        ] {
            let spec = serde_json::to_value(binding.spec.unwrap()).unwrap();
            assert_eq!(spec["validationActions"], actions, "{flag}");
        }
    }
    let error = "Dryrun".parse::<Enforcement>().unwrap_err().to_string();
    assert_eq!(error, "enforcement \"Dryrun\" is none of Deny, Warn, Audit");
}

#[test]
fn both_policies_leave_the_operator_and_only_the_operator_alone() {
    // The real API server evaluates matchConditions (kube-cel's `request` has no `userInfo`);
    // the e2e scenario `joining_a_team_and_deleting_a_team_meet_no_denied_write` shows the
    // effect. Here: the condition names exactly the given user, quoted as a CEL string.
    let user = "system:serviceaccount:gpu-ops:team'gpu";
    for policy in [
        team_policy(&GovernedClasses::default(), user),
        non_team_policy(&GovernedClasses::default(), user, &["ml-dev"].into()),
    ] {
        let conditions = policy.spec.unwrap().match_conditions.unwrap();
        assert_eq!(
            conditions[0].expression,
            r"request.userInfo.username != 'system:serviceaccount:gpu-ops:team\'gpu'"
        );
    }
}

#[test]
fn ten_thousand_team_namespaces_fit_the_api_servers_expression_limit() {
    // Names of the longest length Kubernetes allows (63): the API server refuses a CEL
    // expression over 100,000 code points, which one list of 10,000 names would be.
    let names: Vec<String> = (0..10_000)
        .map(|i| format!("team-{i:05}-{}", "x".repeat(52)))
        .collect();
    assert!(names.iter().all(|n| n.len() == 63));
    let team_namespaces = names.iter().map(String::as_str).collect();
    let policy = non_team_policy(&governed(), DEFAULT_OPERATOR_USER, &team_namespaces);
    let conditions = policy
        .spec
        .as_ref()
        .unwrap()
        .match_conditions
        .clone()
        .unwrap();
    assert!(conditions.len() <= 64, "{}", conditions.len());
    assert!(
        conditions.len() > 2,
        "the list is cut: {}",
        conditions.len()
    );
    for c in &conditions {
        assert!(
            c.expression.chars().count() <= 100_000,
            "{}: {}",
            c.name,
            c.expression.len()
        );
    }
    let gpu = claim(exactly("a100-80gb.teamgpu.io"));
    let deny_in = |namespace: &str| {
        evaluate(&policy, &gpu, request("ResourceClaim", namespace), None).unwrap()
    };
    for team_namespace in [&names[0], &names[4_999], &names[9_999]] {
        assert!(deny_in(team_namespace).is_empty(), "{team_namespace}");
    }
    assert_eq!(deny_in("web").len(), 1);
}

/// What a team with a quota for the memory-slice class `h100-10g.teamgpu.io` (slices of 10Gi)
/// may submit.
fn slice_denials(object: &Value) -> Vec<String> {
    let mut params = quota_params("notebooks", "a100-80gb.teamgpu.io h100-10g.teamgpu.io");
    params["metadata"]["annotations"]["teamgpu.io/slice-h100-10g.teamgpu.io"] = json!("10Gi");
    denials_with(object, &params)
}

fn slice_request(capacity: Value) -> Value {
    json!({"requests": [{"name": "gpu", "exactly": {
        "deviceClassName": "h100-10g.teamgpu.io", "count": 2, "capacity": capacity}}]})
}

#[test]
fn a_memory_slice_class_takes_exactly_one_slice_per_device() {
    for ok in [
        claim(slice_request(json!({"requests": {"memory": "10Gi"}}))),
        template(slice_request(json!({"requests": {"memory": "10240Mi"}}))),
        // Other classes are not held to a slice.
        claim(exactly("a100-80gb.teamgpu.io")),
    ] {
        let denials = slice_denials(&ok);
        assert!(denials.is_empty(), "{ok}: {denials:?}");
    }
    let without = json!({"requests": [{"name": "gpu", "exactly": {
        "deviceClassName": "h100-10g.teamgpu.io"}}]});
    let in_subrequest = json!({"requests": [{"name": "gpu", "firstAvailable": [
        {"name": "slice", "deviceClassName": "h100-10g.teamgpu.io", "capacity": {"requests": {"memory": "10Gi"}}},
        {"name": "bigger", "deviceClassName": "h100-10g.teamgpu.io", "capacity": {"requests": {"memory": "20Gi"}}}]}]});
    for refused in [
        claim(without),
        claim(slice_request(json!({"requests": {"memory": "20Gi"}}))),
        claim(slice_request(json!({"requests": {"memory": "0"}}))),
        template(slice_request(
            json!({"requests": {"memory": "10Gi", "shares": "1"}}),
        )),
        claim(slice_request(json!({}))),
        claim(in_subrequest),
    ] {
        let denials = slice_denials(&refused);
        assert_eq!(
            denials,
            [
                "a request of a memory-slice class must ask for exactly one slice per device, as its ResourceClaimTemplates do: capacity.requests: {memory: <the slice in annotation teamgpu.io/slice-<class> of the namespace's ResourceQuota teamgpu>} (namespace ml-dev belongs to TeamGpuPolicy notebooks)"
            ],
            "{refused}"
        );
    }
}

#[test]
fn a_class_of_team_gpus_takes_the_teams_gpus_and_no_others() {
    let own = "has(device.attributes['gpu.nvidia.com'].uuid) && device.attributes['gpu.nvidia.com'].uuid in ['GPU-1']";
    let mut params = quota_params("notebooks", "h100-own.teamgpu.io");
    params["metadata"]["annotations"]["teamgpu.io/gpus-h100-own.teamgpu.io"] = json!(own);
    params["metadata"]["annotations"]["teamgpu.io/slice-h100-own.teamgpu.io"] = json!("10Gi");
    let denials = |object: &Value| denials_with(object, &params);
    let request = |selectors: Value| {
        json!({"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": "h100-own.teamgpu.io", "selectors": selectors,
            "capacity": {"requests": {"memory": "10Gi"}}}}]})
    };
    let ok = claim(request(json!([{"cel": {"expression": own}}])));
    assert_eq!(denials(&ok), Vec::<String>::new());
    let says = "a request of a class whose teams get GPUs of their own must select the team's GPUs exactly as its ResourceClaimTemplates do";
    for refused in [
        claim(request(json!([]))),
        template(request(json!([{"cel": {"expression": "true"}}]))),
        claim(json!({"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": "h100-own.teamgpu.io",
            "capacity": {"requests": {"memory": "10Gi"}}}}]})),
    ] {
        let denials = denials(&refused);
        assert_eq!(denials.len(), 1, "{refused}: {denials:?}");
        assert!(denials[0].starts_with(says), "{}", denials[0]);
    }
}
