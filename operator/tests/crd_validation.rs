//! What the apiserver accepts and rejects: the CRDs' `x-kubernetes-validations` rules evaluated
//! client-side with kube-cel against the generated `openAPIV3Schema` (defaults applied first, as
//! the apiserver does), and the OpenAPI-level constraints users rely on.
//!
//! kube-cel evaluates only the CEL rules; `enum`, `minimum`, `pattern` and friends are enforced by
//! the apiserver's OpenAPI validation, so those are asserted on the generated schema instead.

use std::path::Path;
use std::sync::LazyLock;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube_cel::{ErrorKind, Validator};
use serde_json::{Value, json};

const GSP: &str = "GpuSharingPolicy";
const TGP: &str = "TeamGpuPolicy";

const GSP_NAME_TOO_LONG: &str = "metadata.name must be at most 46 characters: it is part of the teamgpu.io/owner label of generated objects";
const TGP_NAME_TOO_LONG: &str = "metadata.name must be at most 49 characters: it is part of the teamgpu.io/owner label of generated objects";
const VFIO_EXCLUSIVE: &str =
    "vfio devices are passed through whole: sharing.strategy must be Exclusive";
const MIG_PROFILES: &str = "migProfiles may only be set with deviceType mig";
const MIN_MEMORY: &str = "minMemory must be a positive quantity such as 40Gi";
const PINNED_MEMORY: &str =
    "defaultPinnedDeviceMemoryLimit must be a positive quantity such as 10Gi";
const COUNTS_REPEATED: &str = "claimTemplates.counts must not repeat a count";
const ONE_ATTRIBUTE_VALUE: &str = "exactly one of string, int, bool or version must be set";
const TIME_SLICING_ONLY: &str = "timeSlicing may only be set with strategy TimeSlicing";
const MPS_ONLY: &str = "mps may only be set with strategy MPS";
const NO_NAMESPACES: &str =
    "at least one of namespaceSelector or namespaces must be set (or department: true)";
const DEPARTMENT_NAMESPACES: &str =
    "a department owns no namespaces, its member teams do: remove namespaceSelector and namespaces";
const OVERCOMMIT_OF_A_TEAM: &str = "overcommit is a department's: it says what a write that overcommits the department's guarantees does";
const EMPTY_SELECTOR: &str =
    "namespaceSelector must not be empty: an empty selector would claim every namespace";
const SYSTEM_NAMESPACE: &str =
    "system namespaces (kube-system, kube-public, kube-node-lease) cannot belong to a team";
const LIMIT_BELOW_GUARANTEED: &str = "limit must be at least guaranteed";
const LENDING_ABOVE_GUARANTEED: &str =
    "lendingLimit must be at most guaranteed: it says how much of the guarantee may be lent";
const SLICES_FROM_GPUS: &str = "memory slices are cut from whole GPUs: sharing.strategy MemorySlices needs selector.deviceType gpu";
const SLICES_ONLY: &str =
    "memorySlices is required with strategy MemorySlices and not allowed otherwise";
const SLICE_SIZE: &str = "memorySlices.size must be a positive quantity such as 10Gi";
const GPU_EQUIVALENT: &str = "gpuEquivalent must be greater than 0";
const AMOUNT: &str =
    "must be a number of devices from 0 to 100000, or an amount of memory such as 80Gi";
const DUPLICATE_QUOTA: &str = "each sharingPolicy may appear only once in quotas";
const MEMBER_NAMESPACE: &str =
    "namespace is required for a ServiceAccount member and not allowed for a User or Group";

struct Crds {
    gsp: CustomResourceDefinition,
    tgp: CustomResourceDefinition,
}

static CRDS: LazyLock<Crds> = LazyLock::new(|| {
    let mut all = teamgpu::cli::crd::all().into_iter().map(|(_, crd)| crd);
    let gsp = all.next().expect("the GpuSharingPolicy CRD");
    let tgp = all.next().expect("the TeamGpuPolicy CRD");
    assert_eq!(gsp.spec.names.kind, GSP);
    assert_eq!(tgp.spec.names.kind, TGP);
    Crds { gsp, tgp }
});

fn crd(kind: &str) -> &'static CustomResourceDefinition {
    match kind {
        GSP => &CRDS.gsp,
        TGP => &CRDS.tgp,
        other => panic!("no CRD for {other}"),
    }
}

/// The `openAPIV3Schema` of the single served version, as JSON.
fn schema(kind: &str) -> Value {
    let versions = &crd(kind).spec.versions;
    assert_eq!(versions.len(), 1);
    let schema = versions[0]
        .schema
        .as_ref()
        .and_then(|s| s.open_api_v3_schema.as_ref())
        .expect("the version has a schema");
    serde_json::to_value(schema).expect("the schema serializes")
}

/// The CEL rule failures for `object` as (field path, message).
fn failures(object: &Value) -> Vec<(String, String)> {
    let kind = object["kind"].as_str().expect("the object has a kind");
    match Validator::new().validate_with_defaults(&schema(kind), object, None) {
        Ok(()) => Vec::new(),
        Err(errors) => errors
            .iter()
            .map(|e| {
                assert_eq!(
                    e.kind,
                    ErrorKind::ValidationFailure,
                    "rule `{}` did not evaluate to a boolean at {}: {}",
                    e.rule,
                    e.field_path,
                    e.message
                );
                (e.field_path.clone(), e.message.clone())
            })
            .collect(),
    }
}

#[track_caller]
fn accepts(object: Value) {
    assert_eq!(failures(&object), [], "must be accepted: {object}");
}

/// The object is rejected by exactly one rule: `message` at `path`.
#[track_caller]
fn rejects(object: Value, path: &str, message: &str) {
    assert_eq!(
        failures(&object),
        [(path.to_owned(), message.to_owned())],
        "must be rejected with exactly this error: {object}"
    );
}

fn gsp_named(name: &str, spec: Value) -> Value {
    json!({"apiVersion": "teamgpu.io/v1alpha1", "kind": GSP, "metadata": {"name": name}, "spec": spec})
}

fn gsp(spec: Value) -> Value {
    gsp_named("a100", spec)
}

fn tgp_named(name: &str, spec: Value) -> Value {
    json!({"apiVersion": "teamgpu.io/v1alpha1", "kind": TGP, "metadata": {"name": name}, "spec": spec})
}

fn tgp(spec: Value) -> Value {
    tgp_named("research", spec)
}

// ---------------------------------------------------------------------------------------------
// The samples

#[test]
fn every_sample_is_accepted() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/samples");
    let mut kinds = Vec::new();
    for entry in std::fs::read_dir(&dir).expect("config/samples exists") {
        let path = entry.expect("readable").path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if name == "kustomization.yaml" || path.extension().is_none_or(|e| e != "yaml") {
            continue;
        }
        let yaml = std::fs::read_to_string(&path).expect("readable sample");
        for object in serde_saphyr::from_multiple::<Value>(&yaml).expect("valid YAML") {
            assert_eq!(failures(&object), [], "config/samples/{name} is rejected");
            kinds.push(object["kind"].as_str().unwrap_or_default().to_owned());
        }
    }
    kinds.sort();
    assert_eq!(kinds, [GSP, GSP, TGP, TGP, TGP]);
}

// ---------------------------------------------------------------------------------------------
// GpuSharingPolicy: rejected

#[test]
fn gsp_name_longer_than_46_is_rejected() {
    rejects(gsp_named(&"a".repeat(47), json!({})), "", GSP_NAME_TOO_LONG);
}

#[test]
fn vfio_with_time_slicing_is_rejected() {
    rejects(
        gsp(json!({"selector": {"deviceType": "vfio"}, "sharing": {"strategy": "TimeSlicing"}})),
        "spec",
        VFIO_EXCLUSIVE,
    );
}

#[test]
fn vfio_with_mps_is_rejected() {
    rejects(
        gsp(json!({"selector": {"deviceType": "vfio"}, "sharing": {"strategy": "MPS"}})),
        "spec",
        VFIO_EXCLUSIVE,
    );
}

#[test]
fn mig_profiles_with_explicit_gpu_type_are_rejected() {
    rejects(
        gsp(json!({"selector": {"deviceType": "gpu", "migProfiles": ["1g.10gb"]}})),
        "spec.selector",
        MIG_PROFILES,
    );
}

#[test]
fn mig_profiles_with_defaulted_gpu_type_are_rejected() {
    rejects(
        gsp(json!({"selector": {"migProfiles": ["1g.10gb"]}})),
        "spec.selector",
        MIG_PROFILES,
    );
}

#[test]
fn min_memory_that_is_not_a_quantity_is_rejected() {
    rejects(
        gsp(json!({"selector": {"minMemory": "80 gigs"}})),
        "spec.selector.minMemory",
        MIN_MEMORY,
    );
}

#[test]
fn zero_min_memory_is_rejected() {
    rejects(
        gsp(json!({"selector": {"minMemory": "0Gi"}})),
        "spec.selector.minMemory",
        MIN_MEMORY,
    );
}

#[test]
fn negative_min_memory_is_rejected() {
    rejects(
        gsp(json!({"selector": {"minMemory": "-40Gi"}})),
        "spec.selector.minMemory",
        MIN_MEMORY,
    );
}

#[test]
fn mps_pinned_memory_that_is_not_a_quantity_is_rejected() {
    rejects(
        gsp(
            json!({"sharing": {"strategy": "MPS", "mps": {"defaultPinnedDeviceMemoryLimit": "10 GB"}}}),
        ),
        "spec.sharing.mps.defaultPinnedDeviceMemoryLimit",
        PINNED_MEMORY,
    );
}

#[test]
fn zero_mps_pinned_memory_is_rejected() {
    rejects(
        gsp(
            json!({"sharing": {"strategy": "MPS", "mps": {"defaultPinnedDeviceMemoryLimit": "0"}}}),
        ),
        "spec.sharing.mps.defaultPinnedDeviceMemoryLimit",
        PINNED_MEMORY,
    );
}

#[test]
fn repeated_counts_are_rejected() {
    rejects(
        gsp(json!({"claimTemplates": {"counts": [1, 2, 1]}})),
        "spec.claimTemplates.counts",
        COUNTS_REPEATED,
    );
}

#[test]
fn attribute_without_a_value_is_rejected() {
    rejects(
        gsp(json!({"selector": {"attributes": [{"name": "brand"}]}})),
        "spec.selector.attributes[0]",
        ONE_ATTRIBUTE_VALUE,
    );
}

#[test]
fn attribute_with_two_values_is_rejected() {
    rejects(
        gsp(json!({"selector": {"attributes": [
            {"name": "brand", "string": "Nvidia"},
            {"name": "driverVersion", "string": "550.54.15", "version": "550.54.15"}
        ]}})),
        "spec.selector.attributes[1]",
        ONE_ATTRIBUTE_VALUE,
    );
}

#[test]
fn time_slicing_settings_with_exclusive_are_rejected() {
    rejects(
        gsp(json!({"sharing": {"strategy": "Exclusive", "timeSlicing": {"interval": "Long"}}})),
        "spec.sharing",
        TIME_SLICING_ONLY,
    );
}

#[test]
fn time_slicing_settings_with_defaulted_exclusive_are_rejected() {
    rejects(
        gsp(json!({"sharing": {"timeSlicing": {}}})),
        "spec.sharing",
        TIME_SLICING_ONLY,
    );
}

#[test]
fn time_slicing_settings_with_mps_are_rejected() {
    rejects(
        gsp(json!({"sharing": {"strategy": "MPS", "timeSlicing": {"interval": "Short"}}})),
        "spec.sharing",
        TIME_SLICING_ONLY,
    );
}

#[test]
fn mps_settings_with_time_slicing_are_rejected() {
    rejects(
        gsp(
            json!({"sharing": {"strategy": "TimeSlicing", "mps": {"defaultActiveThreadPercentage": 50}}}),
        ),
        "spec.sharing",
        MPS_ONLY,
    );
}

#[test]
fn every_broken_rule_is_reported_at_once() {
    let mut found = failures(&gsp_named(
        &"g".repeat(60),
        json!({
            "selector": {"deviceType": "vfio", "minMemory": "0", "migProfiles": ["1g.10gb"]},
            "sharing": {"strategy": "TimeSlicing", "mps": {}},
            "claimTemplates": {"counts": [2, 2]}
        }),
    ));
    found.sort();
    let mut expected = vec![
        ("", GSP_NAME_TOO_LONG),
        ("spec", VFIO_EXCLUSIVE),
        ("spec.selector", MIG_PROFILES),
        ("spec.selector.minMemory", MIN_MEMORY),
        ("spec.sharing", MPS_ONLY),
        ("spec.claimTemplates.counts", COUNTS_REPEATED),
    ]
    .into_iter()
    .map(|(p, m)| (p.to_owned(), m.to_owned()))
    .collect::<Vec<_>>();
    expected.sort();
    assert_eq!(found, expected);
}

// ---------------------------------------------------------------------------------------------
// GpuSharingPolicy: accepted edge cases

#[test]
fn empty_gsp_spec_is_accepted_with_defaults() {
    accepts(gsp(json!({})));
}

#[test]
fn gsp_name_of_exactly_46_is_accepted() {
    accepts(gsp_named(&"a".repeat(46), json!({})));
}

#[test]
fn vfio_exclusive_is_accepted() {
    accepts(gsp(
        json!({"selector": {"deviceType": "vfio"}, "sharing": {"strategy": "Exclusive"}}),
    ));
    accepts(gsp(json!({"selector": {"deviceType": "vfio"}})));
}

#[test]
fn mig_with_mig_profiles_is_accepted() {
    accepts(gsp(json!({
        "selector": {"deviceType": "mig", "migProfiles": ["1g.10gb", "3g.40gb"], "minMemory": "10Gi"},
        "sharing": {"strategy": "Exclusive"},
        "claimTemplates": {"counts": [1, 2, 7]}
    })));
}

#[test]
fn empty_mig_profiles_are_accepted_with_any_type() {
    accepts(gsp(
        json!({"selector": {"deviceType": "gpu", "migProfiles": []}}),
    ));
}

#[test]
fn mps_with_settings_is_accepted() {
    accepts(gsp(json!({"sharing": {"strategy": "MPS", "mps": {
        "defaultActiveThreadPercentage": 50,
        "defaultPinnedDeviceMemoryLimit": "10Gi"
    }}})));
    accepts(gsp(
        json!({"sharing": {"strategy": "MPS", "mps": {"defaultPinnedDeviceMemoryLimit": "512M"}}}),
    ));
}

#[test]
fn time_slicing_with_settings_is_accepted() {
    accepts(gsp(
        json!({"sharing": {"strategy": "TimeSlicing", "timeSlicing": {"interval": "Short"}}}),
    ));
}

#[test]
fn attributes_with_one_value_of_each_type_are_accepted() {
    accepts(gsp(json!({"selector": {"attributes": [
        {"name": "brand", "string": "Nvidia"},
        {"name": "index", "int": 0},
        {"name": "uuidStable", "bool": false},
        {"name": "driverVersion", "version": "550.54.15"}
    ]}})));
}

#[test]
fn fractional_and_decimal_min_memory_are_accepted() {
    accepts(gsp(json!({"selector": {"minMemory": "0.5Gi"}})));
    accepts(gsp(json!({"selector": {"minMemory": "80G"}})));
}

// ---------------------------------------------------------------------------------------------
// TeamGpuPolicy: rejected

#[test]
fn tgp_name_longer_than_49_is_rejected() {
    rejects(
        tgp_named(&"t".repeat(50), json!({"namespaces": ["research"]})),
        "",
        TGP_NAME_TOO_LONG,
    );
}

#[test]
fn team_without_namespaces_is_rejected() {
    rejects(
        tgp(json!({"quotas": [{"sharingPolicy": "a100", "guaranteed": 1}]})),
        "spec",
        NO_NAMESPACES,
    );
}

#[test]
fn a_department_owns_no_namespaces() {
    rejects(
        tgp(json!({"department": true, "namespaces": ["research"]})),
        "spec",
        DEPARTMENT_NAMESPACES,
    );
    accepts(tgp(
        json!({"department": true, "quotas": [{"sharingPolicy": "a100", "guaranteed": 16}]}),
    ));
    accepts(tgp(json!({"parent": "research", "namespaces": ["vision"]})));
}

#[test]
fn overcommit_is_a_departments() {
    rejects(
        tgp(json!({"namespaces": ["vision"], "overcommit": "Warn"})),
        "spec",
        OVERCOMMIT_OF_A_TEAM,
    );
    accepts(tgp(json!({"department": true, "overcommit": "Warn"})));
}

#[test]
fn team_with_an_empty_namespace_list_is_rejected() {
    rejects(tgp(json!({"namespaces": []})), "spec", NO_NAMESPACES);
}

#[test]
fn empty_namespace_selector_is_rejected() {
    rejects(
        tgp(json!({"namespaceSelector": {}})),
        "spec.namespaceSelector",
        EMPTY_SELECTOR,
    );
}

#[test]
fn selector_with_empty_match_labels_is_rejected() {
    rejects(
        tgp(json!({"namespaceSelector": {"matchLabels": {}}})),
        "spec.namespaceSelector",
        EMPTY_SELECTOR,
    );
}

#[test]
fn selector_with_empty_match_expressions_is_rejected() {
    rejects(
        tgp(
            json!({"namespaceSelector": {"matchLabels": {}, "matchExpressions": []}, "namespaces": ["research"]}),
        ),
        "spec.namespaceSelector",
        EMPTY_SELECTOR,
    );
}

#[test]
fn kube_system_is_rejected() {
    rejects(
        tgp(json!({"namespaces": ["research", "kube-system"]})),
        "spec.namespaces",
        SYSTEM_NAMESPACE,
    );
}

#[test]
fn kube_public_and_kube_node_lease_are_rejected() {
    for namespace in ["kube-public", "kube-node-lease"] {
        rejects(
            tgp(json!({"namespaces": [namespace]})),
            "spec.namespaces",
            SYSTEM_NAMESPACE,
        );
    }
}

#[test]
fn limit_below_guaranteed_is_rejected() {
    rejects(
        tgp(json!({"namespaces": ["research"], "quotas": [
            {"sharingPolicy": "a100-shared", "guaranteed": 2},
            {"sharingPolicy": "a100", "guaranteed": 8, "limit": 4}
        ]})),
        "spec.quotas[1]",
        LIMIT_BELOW_GUARANTEED,
    );
}

#[test]
fn memory_slices_need_their_size_whole_gpus_and_their_strategy() {
    let slices = json!({"strategy": "MemorySlices", "memorySlices": {"size": "10Gi"}});
    accepts(gsp(json!({"sharing": slices})));
    rejects(
        gsp(json!({"selector": {"deviceType": "mig"}, "sharing": slices})),
        "spec",
        SLICES_FROM_GPUS,
    );
    rejects(
        gsp(json!({"sharing": {"strategy": "MemorySlices"}})),
        "spec.sharing",
        SLICES_ONLY,
    );
    rejects(
        gsp(json!({"sharing": {"strategy": "Exclusive", "memorySlices": {"size": "10Gi"}}})),
        "spec.sharing",
        SLICES_ONLY,
    );
    for size in ["0", "-10Gi", "ten"] {
        rejects(
            gsp(json!({"sharing": {"strategy": "MemorySlices", "memorySlices": {"size": size}}})),
            "spec.sharing.memorySlices.size",
            SLICE_SIZE,
        );
    }
}

#[test]
fn a_gpu_equivalent_must_be_positive() {
    accepts(gsp(json!({"gpuEquivalent": "0.6"})));
    rejects(
        gsp(json!({"gpuEquivalent": "0.000"})),
        "spec.gpuEquivalent",
        GPU_EQUIVALENT,
    );
}

#[test]
fn amounts_are_counts_or_memory_and_limits_compare_like_with_like() {
    accepts(tgp(json!({"namespaces": ["research"], "quotas": [
        {"sharingPolicy": "h100-10g", "guaranteed": "40Gi", "limit": "80Gi", "lendingLimit": "20Gi"},
        {"sharingPolicy": "a100", "guaranteed": 4, "limit": "8"},
        // Slices against memory: the operator, which knows the slice, judges it.
        {"sharingPolicy": "h100-20g", "guaranteed": 2, "limit": "80Gi"}
    ]})));
    for bad in [json!("lots"), json!("-1Gi"), json!(100001)] {
        rejects(
            tgp(json!({"namespaces": ["research"], "quotas": [
                {"sharingPolicy": "a100", "guaranteed": bad}
            ]})),
            "spec.quotas[0].guaranteed",
            AMOUNT,
        );
    }
    rejects(
        tgp(json!({"namespaces": ["research"], "quotas": [
            {"sharingPolicy": "h100-10g", "guaranteed": "40Gi", "limit": "20Gi"}
        ]})),
        "spec.quotas[0]",
        LIMIT_BELOW_GUARANTEED,
    );
    rejects(
        tgp(json!({"namespaces": ["research"], "quotas": [
            {"sharingPolicy": "h100-10g", "guaranteed": "40Gi", "lendingLimit": "50Gi"}
        ]})),
        "spec.quotas[0]",
        LENDING_ABOVE_GUARANTEED,
    );
}

#[test]
fn lending_more_than_the_guarantee_is_rejected() {
    rejects(
        tgp(json!({"namespaces": ["research"], "quotas": [
            {"sharingPolicy": "a100", "guaranteed": 4, "lendingLimit": 5}
        ]})),
        "spec.quotas[0]",
        LENDING_ABOVE_GUARANTEED,
    );
}

#[test]
fn a_service_account_member_without_namespace_is_rejected() {
    rejects(
        tgp(json!({"namespaces": ["research"], "members": [
            {"kind": "User", "name": "alice"},
            {"kind": "ServiceAccount", "name": "argocd"}
        ]})),
        "spec.members[1]",
        MEMBER_NAMESPACE,
    );
}

#[test]
fn a_user_member_with_a_namespace_is_rejected() {
    rejects(
        tgp(json!({"namespaces": ["research"], "members": [
            {"kind": "Group", "name": "ml", "namespace": "research"}
        ]})),
        "spec.members[0]",
        MEMBER_NAMESPACE,
    );
}

#[test]
fn members_of_every_kind_are_accepted() {
    accepts(tgp(json!({"namespaces": ["research"], "members": [
        {"kind": "User", "name": "alice@example.com"},
        {"kind": "Group", "name": "ml-research"},
        {"kind": "ServiceAccount", "name": "argocd", "namespace": "gitops"}
    ]})));
}

#[test]
fn a_lending_limit_up_to_the_guarantee_is_accepted() {
    for lending in [0, 2, 4] {
        accepts(tgp(json!({"namespaces": ["research"], "quotas": [
            {"sharingPolicy": "a100", "guaranteed": 4, "limit": 8, "lendingLimit": lending}
        ]})));
    }
}

#[test]
fn duplicate_sharing_policy_is_rejected() {
    rejects(
        tgp(json!({"namespaces": ["research"], "quotas": [
            {"sharingPolicy": "a100", "guaranteed": 1},
            {"sharingPolicy": "a100-shared", "guaranteed": 1},
            {"sharingPolicy": "a100", "guaranteed": 2}
        ]})),
        "spec.quotas",
        DUPLICATE_QUOTA,
    );
}

// ---------------------------------------------------------------------------------------------
// TeamGpuPolicy: accepted edge cases

#[test]
fn tgp_name_of_exactly_49_is_accepted() {
    accepts(tgp_named(
        &"t".repeat(49),
        json!({"namespaces": ["research"]}),
    ));
}

#[test]
fn limit_equal_to_guaranteed_is_accepted() {
    accepts(tgp(json!({"namespaces": ["research"], "quotas": [
        {"sharingPolicy": "a100", "guaranteed": 4, "limit": 4}
    ]})));
}

#[test]
fn no_guarantee_with_a_limit_is_accepted() {
    accepts(tgp(json!({"namespaces": ["research"], "quotas": [
        {"sharingPolicy": "a100", "guaranteed": 0, "limit": 8},
        {"sharingPolicy": "a100-shared", "limit": 2}
    ]})));
}

#[test]
fn only_explicit_namespaces_are_accepted() {
    accepts(tgp(json!({"namespaces": ["research", "research-batch"]})));
}

#[test]
fn selector_with_only_match_expressions_is_accepted() {
    accepts(tgp(json!({"namespaceSelector": {"matchExpressions": [
        {"key": "teamgpu.io/team", "operator": "Exists"}
    ]}})));
}

#[test]
fn selector_with_only_match_labels_is_accepted() {
    accepts(tgp(
        json!({"namespaceSelector": {"matchLabels": {"teamgpu.io/team": "research"}}}),
    ));
}

#[test]
fn namespaces_like_system_ones_are_accepted() {
    accepts(tgp(
        json!({"namespaces": ["kube-systems", "my-kube-system", "default"]}),
    ));
}

// ---------------------------------------------------------------------------------------------
// OpenAPI-level constraints (enforced by the apiserver, not by CEL)

#[track_caller]
fn at<'a>(schema: &'a Value, pointer: &str) -> &'a Value {
    schema
        .pointer(pointer)
        .unwrap_or_else(|| panic!("the schema has no {pointer}"))
}

#[test]
fn enums_are_closed() {
    let gsp = schema(GSP);
    let spec = "/properties/spec/properties";
    assert_eq!(
        at(&gsp, &format!("{spec}/selector/properties/deviceType/enum")),
        &json!(["gpu", "mig", "vfio"])
    );
    assert_eq!(
        at(
            &gsp,
            &format!("{spec}/selector/properties/deviceType/default")
        ),
        "gpu"
    );
    assert_eq!(
        at(&gsp, &format!("{spec}/sharing/properties/strategy/enum")),
        &json!(["Exclusive", "TimeSlicing", "MPS", "MemorySlices"])
    );
    assert_eq!(
        at(&gsp, &format!("{spec}/sharing/properties/strategy/default")),
        "Exclusive"
    );
    assert_eq!(
        at(
            &gsp,
            &format!("{spec}/sharing/properties/timeSlicing/properties/interval/enum")
        ),
        &json!(["Default", "Short", "Medium", "Long"])
    );
}

#[test]
fn weights_are_between_1_and_1000() {
    let tgp = schema(TGP);
    for pointer in [
        "/properties/spec/properties/weight",
        "/properties/spec/properties/quotas/items/properties/weight",
    ] {
        let weight = at(&tgp, pointer);
        assert_eq!(weight["minimum"].as_f64(), Some(1.0), "{pointer}");
        assert_eq!(weight["maximum"].as_f64(), Some(1000.0), "{pointer}");
    }
    assert_eq!(at(&tgp, "/properties/spec/properties/weight/default"), 1);
}

#[test]
fn counts_are_between_1_and_32_with_at_most_8_templates() {
    let gsp = schema(GSP);
    let counts = at(
        &gsp,
        "/properties/spec/properties/claimTemplates/properties/counts",
    );
    assert_eq!(counts["items"]["minimum"].as_f64(), Some(1.0));
    assert_eq!(counts["items"]["maximum"].as_f64(), Some(32.0));
    assert_eq!(counts["minItems"], 1);
    assert_eq!(counts["maxItems"], 8);
    assert_eq!(counts["default"], json!([1]));
}

#[test]
fn quotas_and_names_are_bounded() {
    let tgp = schema(TGP);
    let quota = at(&tgp, "/properties/spec/properties/quotas/items/properties");
    assert_eq!(quota["sharingPolicy"]["maxLength"], 46);
    for amount in ["guaranteed", "limit", "lendingLimit"] {
        // A count or a memory amount: bounded by its rule (amounts_are_counts_or_memory...).
        assert_eq!(
            quota[amount]["x-kubernetes-int-or-string"], true,
            "{amount}"
        );
        assert_eq!(
            quota[amount]["x-kubernetes-validations"][0]["message"], AMOUNT,
            "{amount}"
        );
    }
    let namespaces = at(&tgp, "/properties/spec/properties/namespaces");
    assert_eq!(namespaces["x-kubernetes-list-type"], "set");
    assert_eq!(namespaces["items"]["maxLength"], 63);
    assert_eq!(
        at(
            &tgp,
            "/properties/spec/properties/reclaim/properties/gracePeriodSeconds/maximum"
        )
        .as_f64(),
        Some(86400.0)
    );
}

#[test]
fn conditions_are_list_maps_keyed_by_type() {
    for (kind, list_maps) in [
        (GSP, vec![("conditions", "type")]),
        (
            TGP,
            vec![("conditions", "type"), ("quotas", "sharingPolicy")],
        ),
    ] {
        let schema = schema(kind);
        for (field, key) in list_maps {
            let list = at(&schema, &format!("/properties/status/properties/{field}"));
            assert_eq!(list["x-kubernetes-list-type"], "map", "{kind} {field}");
            assert_eq!(
                list["x-kubernetes-list-map-keys"],
                json!([key]),
                "{kind} {field}"
            );
            // A list-map key must be required (or defaulted) in every item.
            assert!(
                list["items"]["required"]
                    .as_array()
                    .is_some_and(|r| r.contains(&json!(key))),
                "{kind} {field}: {key} must be required"
            );
        }
    }
}

#[test]
fn both_kinds_are_cluster_scoped_with_a_status_subresource() {
    for kind in [GSP, TGP] {
        let crd = crd(kind);
        assert_eq!(crd.spec.scope, "Cluster", "{kind}");
        assert_eq!(crd.spec.group, "teamgpu.io");
        let version = &crd.spec.versions[0];
        assert_eq!(version.name, "v1alpha1");
        assert!(version.served && version.storage);
        assert!(
            version
                .subresources
                .as_ref()
                .is_some_and(|s| s.status.is_some() && s.scale.is_none()),
            "{kind} must have the status subresource"
        );
    }
}

#[test]
fn short_names_and_category() {
    for (kind, short, plural) in [
        (GSP, "gsp", "gpusharingpolicies"),
        (TGP, "tgp", "teamgpupolicies"),
    ] {
        let names = &crd(kind).spec.names;
        assert_eq!(names.plural, plural);
        assert_eq!(names.short_names.as_deref(), Some(&[short.to_owned()][..]));
        assert_eq!(
            names.categories.as_deref(),
            Some(&["teamgpu".to_owned()][..])
        );
    }
}

#[test]
fn printer_columns() {
    let columns = |kind| -> Vec<(String, String, String)> {
        crd(kind).spec.versions[0]
            .additional_printer_columns
            .iter()
            .flatten()
            .map(|c| (c.name.clone(), c.type_.clone(), c.json_path.clone()))
            .collect()
    };
    let expect = |cols: &[(&str, &str, &str)]| -> Vec<(String, String, String)> {
        cols.iter()
            .map(|(n, t, p)| (n.to_string(), t.to_string(), p.to_string()))
            .collect()
    };
    assert_eq!(
        columns(GSP),
        expect(&[
            ("DeviceClass", "string", ".status.deviceClassName"),
            ("Strategy", "string", ".spec.sharing.strategy"),
            ("Devices", "integer", ".status.devices"),
            ("Allocated", "integer", ".status.allocated"),
            ("Outside-Teams", "integer", ".status.usedOutsideTeams"),
            (
                "Ready",
                "string",
                ".status.conditions[?(@.type==\"Ready\")].status"
            ),
            ("Age", "date", ".metadata.creationTimestamp"),
        ])
    );
    assert_eq!(
        columns(TGP),
        expect(&[
            ("Weight", "integer", ".spec.weight"),
            ("Namespaces", "integer", ".status.namespaceCount"),
            ("Guaranteed", "integer", ".status.totals.guaranteed"),
            ("Entitlement", "integer", ".status.totals.entitlement"),
            ("Allocated", "integer", ".status.totals.allocated"),
            ("GPU-Eq", "string", ".status.gpuEquivalents.entitlement"),
            ("Pending", "integer", ".status.totals.pending"),
            (
                "Ready",
                "string",
                ".status.conditions[?(@.type==\"Ready\")].status"
            ),
            ("Age", "date", ".metadata.creationTimestamp"),
        ])
    );
}

/// Every rule: where it sits and its message, for both kinds.
fn rules() -> Vec<(String, String, Value)> {
    fn walk(schema: &Value, path: &str, found: &mut Vec<(String, String, Value)>) {
        for rule in schema["x-kubernetes-validations"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let message = rule["message"].as_str().unwrap_or_default();
            found.push((path.to_owned(), message.to_owned(), schema.clone()));
        }
        for (name, child) in schema["properties"].as_object().into_iter().flatten() {
            walk(child, &format!("{path}.{name}"), found);
        }
        if schema["items"].is_object() {
            walk(&schema["items"], &format!("{path}[]"), found);
        }
    }
    let mut found = Vec::new();
    for kind in [GSP, TGP] {
        walk(&schema(kind), kind, &mut found);
    }
    found
}

#[test]
fn every_rule_is_known_and_covered_above() {
    let found: Vec<(String, String)> = rules().into_iter().map(|(p, m, _)| (p, m)).collect();
    let expected: Vec<(String, String)> = [
        ("GpuSharingPolicy", GSP_NAME_TOO_LONG),
        ("GpuSharingPolicy.spec", VFIO_EXCLUSIVE),
        ("GpuSharingPolicy.spec", SLICES_FROM_GPUS),
        (
            "GpuSharingPolicy.spec.claimTemplates.counts",
            COUNTS_REPEATED,
        ),
        ("GpuSharingPolicy.spec.gpuEquivalent", GPU_EQUIVALENT),
        ("GpuSharingPolicy.spec.selector", MIG_PROFILES),
        (
            "GpuSharingPolicy.spec.selector.attributes[]",
            ONE_ATTRIBUTE_VALUE,
        ),
        ("GpuSharingPolicy.spec.selector.minMemory", MIN_MEMORY),
        ("GpuSharingPolicy.spec.sharing", TIME_SLICING_ONLY),
        ("GpuSharingPolicy.spec.sharing", MPS_ONLY),
        ("GpuSharingPolicy.spec.sharing", SLICES_ONLY),
        (
            "GpuSharingPolicy.spec.sharing.memorySlices.size",
            SLICE_SIZE,
        ),
        (
            "GpuSharingPolicy.spec.sharing.mps.defaultPinnedDeviceMemoryLimit",
            PINNED_MEMORY,
        ),
        ("TeamGpuPolicy", TGP_NAME_TOO_LONG),
        ("TeamGpuPolicy.spec", NO_NAMESPACES),
        ("TeamGpuPolicy.spec", DEPARTMENT_NAMESPACES),
        ("TeamGpuPolicy.spec", OVERCOMMIT_OF_A_TEAM),
        ("TeamGpuPolicy.spec.members[]", MEMBER_NAMESPACE),
        ("TeamGpuPolicy.spec.namespaceSelector", EMPTY_SELECTOR),
        ("TeamGpuPolicy.spec.namespaces", SYSTEM_NAMESPACE),
        ("TeamGpuPolicy.spec.quotas", DUPLICATE_QUOTA),
        ("TeamGpuPolicy.spec.quotas[]", LIMIT_BELOW_GUARANTEED),
        ("TeamGpuPolicy.spec.quotas[]", LENDING_ABOVE_GUARANTEED),
        ("TeamGpuPolicy.spec.quotas[].guaranteed", AMOUNT),
        ("TeamGpuPolicy.spec.quotas[].lendingLimit", AMOUNT),
        ("TeamGpuPolicy.spec.quotas[].limit", AMOUNT),
    ]
    .into_iter()
    .map(|(p, m)| (p.to_owned(), m.to_owned()))
    .collect();
    assert_eq!(
        found, expected,
        "the CEL rules changed: cover a new rule with a rejecting test and list it here"
    );
}

#[test]
fn every_rule_compiles_within_the_cost_budget() {
    for kind in [GSP, TGP] {
        let compiled = kube_cel::compile_schema(&schema(kind));
        assert!(
            !compiled.has_errors(),
            "{kind}: {:?}",
            compiled.compilation_errors()
        );
    }
    // kube-cel's estimate is coarse, but it flags what the apiserver rejects at CRD creation:
    // a list or string rule without maxItems/maxLength on what it iterates.
    for (path, _, node) in rules() {
        let compiled = kube_cel::compile_schema(&node);
        for rule in node["x-kubernetes-validations"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let rule = rule["rule"].as_str().expect("a rule");
            assert_eq!(
                kube_cel::estimate_rule_cost(rule, &compiled),
                [],
                "{path}: `{rule}`"
            );
        }
    }
}
