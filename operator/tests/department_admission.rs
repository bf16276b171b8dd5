//! A department's guarantees as admission holds its members to them, evaluated with kube-cel
//! once per TeamGpuPolicy as the API server does (the policy takes every TeamGpuPolicy as
//! params): amounts written as device counts and as memory (`40Gi` of a MemorySlices policy,
//! counted in whole slices at the size the department's status gives). The e2e scenario
//! `department_members_manage_its_teams_within_its_guarantee` shows the counts on a real API
//! server.

use serde_json::{Value, json};
use teamgpu::core::plan::admission::DEFAULT_OPERATOR_USER;
use teamgpu::core::plan::department_admission::department_policy;
use vap::evaluate_change;

#[path = "support/vap.rs"]
#[allow(
    dead_code,
    reason = "this file judges changes only (`evaluate_change`)"
)]
mod vap;

/// Department research, as the API server stores it: `shares` (MemorySlices, 10Gi slices)
/// guaranteed `guaranteed` with limit `limit`, its members guaranteeing 5 slices (as the
/// operator last counted them). `slice_known`: whether the operator has written the slice size.
fn research(guaranteed: Value, limit: Value, slice_known: bool) -> Value {
    let mut quota = json!({"sharingPolicy": "shares", "guaranteed": 8, "limit": 12,
        "membersGuaranteed": 5});
    if slice_known {
        quota["sliceSize"] = json!("10Gi");
    }
    json!({
        "apiVersion": "teamgpu.io/v1alpha1", "kind": "TeamGpuPolicy",
        "metadata": {"name": "research"},
        "spec": {"department": true, "members": [{"kind": "User", "name": "alice"}],
                 "quotas": [{"sharingPolicy": "shares", "guaranteed": guaranteed, "limit": limit}]},
        "status": {"quotas": [quota]}
    })
}

fn member(guaranteed: Value, limit: Value) -> Value {
    json!({
        "apiVersion": "teamgpu.io/v1alpha1", "kind": "TeamGpuPolicy",
        "metadata": {"name": "speech"},
        "spec": {"parent": "research", "namespaces": ["speech"],
                 "quotas": [{"sharingPolicy": "shares", "guaranteed": guaranteed, "limit": limit}]}
    })
}

fn request(operation: &str, name: &str) -> kube_cel::AdmissionRequest {
    kube_cel::AdmissionRequest {
        operation: operation.into(),
        username: "alice".into(),
        groups: vec!["system:authenticated".into()],
        name: name.into(),
        kind: kube_cel::GroupVersionKind {
            group: "teamgpu.io".into(),
            version: "v1alpha1".into(),
            kind: "TeamGpuPolicy".into(),
        },
        ..Default::default()
    }
}

/// The denials of alice (a member of research) creating `object`, with `department` as params.
fn creating(object: &Value, department: &Value) -> Vec<String> {
    let policy = department_policy(&["platform-admins".to_owned()], DEFAULT_OPERATOR_USER);
    evaluate_change(
        &policy,
        object,
        None,
        request("CREATE", "speech"),
        Some(department),
    )
    .unwrap()
}

#[test]
fn a_members_memory_counts_the_whole_slices_it_holds() {
    let department = research(json!("80Gi"), json!("120Gi"), true);
    // 3 slices fit beside the members' 5 of 8; 39Gi is 3 whole slices.
    assert_eq!(
        creating(&member(json!("30Gi"), json!("120Gi")), &department),
        [] as [String; 0]
    );
    assert_eq!(
        creating(&member(json!("39Gi"), json!("40Gi")), &department),
        [] as [String; 0]
    );
    assert_eq!(
        creating(&member(json!(3), json!(12)), &department),
        [] as [String; 0]
    );
    assert_eq!(
        creating(&member(json!("40Gi"), json!("40Gi")), &department),
        [
            "TeamGpuPolicy speech would guarantee more than the department has left (department \
          research has overcommit: Refuse): shares: 4 asked, 3 left of 8"
        ]
    );
    assert_eq!(
        creating(&member(json!("10Gi"), json!("130Gi")), &department),
        [
            "TeamGpuPolicy speech would have a limit above the department's (department research \
          has overcommit: Refuse): shares: limit 130Gi"
        ]
    );
    // A department written in devices, a member in memory: counted alike.
    let in_devices = research(json!(8), json!(12), true);
    assert_eq!(
        creating(&member(json!("40Gi"), json!("40Gi")), &in_devices).len(),
        1
    );
}

#[test]
fn memory_is_not_counted_before_the_operator_says_the_slice_size() {
    let department = research(json!("80Gi"), json!("120Gi"), false);
    assert_eq!(
        creating(&member(json!("400Gi"), json!("400Gi")), &department),
        [] as [String; 0]
    );
    // Counts are still held to the department's counts.
    let in_devices = research(json!(8), json!(12), false);
    assert_eq!(creating(&member(json!(4), json!(4)), &in_devices).len(), 1);
}

#[test]
fn a_department_may_not_lower_its_memory_below_its_members() {
    let policy = department_policy(&["platform-admins".to_owned()], DEFAULT_OPERATOR_USER);
    let stored = research(json!("80Gi"), json!("120Gi"), true);
    let lowered = research(json!("40Gi"), json!("120Gi"), true);
    let admin = kube_cel::AdmissionRequest {
        groups: vec!["platform-admins".into()],
        username: "root".into(),
        ..request("UPDATE", "research")
    };
    let denials = evaluate_change(
        &policy,
        &lowered,
        Some(&stored),
        admin.clone(),
        Some(&stored),
    );
    assert_eq!(
        denials.unwrap(),
        [
            "TeamGpuPolicy research would guarantee less than its members do (department research \
          has overcommit: Refuse): shares: 40Gi, its members guarantee 5"
        ]
    );
    let enough = research(json!("50Gi"), json!("120Gi"), true);
    let denials = evaluate_change(&policy, &enough, Some(&stored), admin, Some(&stored));
    assert_eq!(denials.unwrap(), [] as [String; 0]);
}
