//! Who may move a namespace into or out of a team: the generated namespace policy, evaluated
//! with kube-cel (match conditions included) for requests of members, non-members and admins,
//! once per team as the API server does (the policy takes every TeamGpuPolicy as params).
//! The e2e scenario `only_members_move_namespaces_into_and_out_of_their_team` shows the same on
//! a real API server, with the exemption label.
//!
//! Label keys here have no `.` or `/`: kube-cel escapes every map key (`teamgpu.io/team` would
//! become `teamgpu__dot__io__slash__team`), where Kubernetes escapes only schema property names.

use serde_json::{Value, json};
use teamgpu::api::TeamGpuPolicy;
use teamgpu::core::plan::admission::DEFAULT_OPERATOR_USER;
use vap::evaluate_change;

#[path = "support/vap.rs"]
#[allow(
    dead_code,
    reason = "this file judges changes only (`evaluate_change`)"
)]
mod vap;
use teamgpu::core::plan::namespace_admission::membership_policy;

fn team(name: &str, selector: Value, members: Value) -> TeamGpuPolicy {
    team_spec(
        name,
        json!({"namespaceSelector": selector, "members": members}),
    )
}

fn team_spec(name: &str, spec: Value) -> TeamGpuPolicy {
    serde_json::from_value(json!({
        "apiVersion": "teamgpu.io/v1alpha1", "kind": "TeamGpuPolicy",
        "metadata": {"name": name},
        "spec": spec
    }))
    .unwrap()
}

fn teams() -> Vec<TeamGpuPolicy> {
    vec![
        team(
            "ml-research",
            json!({"matchLabels": {"team": "ml-research"}}),
            json!([{"kind": "User", "name": "alice"},
                   {"kind": "Group", "name": "ml-leads"},
                   {"kind": "ServiceAccount", "name": "argocd", "namespace": "ml-gitops"}]),
        ),
        team(
            "inference",
            json!({"matchExpressions": [
                {"key": "team", "operator": "In", "values": ["inference"]},
                {"key": "tier", "operator": "NotIn", "values": ["sandbox"]}]}),
            json!([{"kind": "User", "name": "bob"}]),
        ),
        // No members: only admins may move namespaces in or out.
        team(
            "closed",
            json!({"matchLabels": {"team": "closed"}}),
            json!([]),
        ),
        // Namespaces named, not selected: no label moves one in or out.
        team_spec("named", json!({"namespaces": ["ns"], "members": []})),
        // Selectors Kubernetes rejects select nothing, as in the planner.
        team(
            "no-values",
            json!({"matchExpressions": [{"key": "team", "operator": "NotIn", "values": []}]}),
            json!([]),
        ),
        team(
            "exists-with-values",
            json!({"matchExpressions": [{"key": "team", "operator": "Exists", "values": ["x"]}]}),
            json!([]),
        ),
    ]
}

fn namespace(labels: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ns", "labels": labels}})
}

fn request(user: &str, groups: &[&str], operation: &str) -> kube_cel::AdmissionRequest {
    kube_cel::AdmissionRequest {
        operation: operation.into(),
        username: user.into(),
        groups: groups.iter().map(|g| (*g).to_owned()).collect(),
        name: "ns".into(),
        kind: kube_cel::GroupVersionKind {
            group: String::new(),
            version: "v1".into(),
            kind: "Namespace".into(),
        },
        ..Default::default()
    }
}

/// The denials of `user` (in `groups`) changing the namespace's labels from `old` (`None`:
/// creating it) to `new`, of every team's evaluation.
fn denials(user: &str, groups: &[&str], old: Option<Value>, new: Value) -> Vec<String> {
    let policy = membership_policy(&["platform-admins".to_owned()], DEFAULT_OPERATOR_USER);
    let operation = if old.is_some() { "UPDATE" } else { "CREATE" };
    let old = old.map(namespace);
    teams()
        .iter()
        .flat_map(|team| {
            evaluate_change(
                &policy,
                &namespace(new.clone()),
                old.as_ref(),
                request(user, groups, operation),
                Some(&serde_json::to_value(team).unwrap()),
            )
            .unwrap()
        })
        .collect()
}

const AUTHENTICATED: &[&str] = &["system:authenticated"];

#[test]
fn members_may_label_a_namespace_into_their_team_and_others_may_not() {
    let ml = json!({"team": "ml-research"});
    assert!(denials("alice", AUTHENTICATED, Some(json!({})), ml.clone()).is_empty());
    assert!(denials("carol", &["ml-leads"], None, ml.clone()).is_empty());
    assert!(
        denials(
            "system:serviceaccount:ml-gitops:argocd",
            AUTHENTICATED,
            None,
            ml.clone()
        )
        .is_empty()
    );
    assert_eq!(
        denials(
            "bob",
            AUTHENTICATED,
            Some(json!({"env": "dev"})),
            ml.clone()
        ),
        [
            "only members of TeamGpuPolicy ml-research (spec.members) or cluster admins may add a namespace to the team"
        ]
    );
    // A ServiceAccount of the same name in another namespace is someone else.
    assert_eq!(
        denials(
            "system:serviceaccount:default:argocd",
            AUTHENTICATED,
            None,
            ml
        )
        .len(),
        1
    );
}

#[test]
fn moving_a_namespace_between_teams_needs_membership_of_both() {
    let ml = json!({"team": "ml-research"});
    let inference = json!({"team": "inference"});
    let denied = denials("alice", AUTHENTICATED, Some(ml.clone()), inference.clone());
    assert_eq!(
        denied,
        [
            "only members of TeamGpuPolicy inference (spec.members) or cluster admins may add a namespace to the team"
        ]
    );
    let denied = denials("bob", AUTHENTICATED, Some(ml), inference);
    assert_eq!(
        denied,
        [
            "only members of TeamGpuPolicy ml-research (spec.members) or cluster admins may take a namespace out of the team"
        ]
    );
}

#[test]
fn only_members_may_take_a_namespace_out_of_their_team() {
    let ml = json!({"team": "ml-research", "env": "dev"});
    assert!(
        denials(
            "alice",
            AUTHENTICATED,
            Some(ml.clone()),
            json!({"env": "dev"})
        )
        .is_empty()
    );
    assert_eq!(
        denials("bob", AUTHENTICATED, Some(ml), json!({"env": "dev"})).len(),
        1
    );
}

#[test]
fn changes_that_join_or_leave_no_team_are_left_alone() {
    // A namespace that already carries the label keeps working for anyone allowed to edit it.
    let ml = json!({"team": "ml-research"});
    let relabelled = json!({"team": "ml-research", "cost-center": "42"});
    assert!(denials("dave", AUTHENTICATED, Some(ml), relabelled).is_empty());
    assert!(denials("dave", AUTHENTICATED, None, json!({"env": "dev"})).is_empty());
    // Labels the invalid selectors would select if they were read leniently.
    assert!(denials("dave", AUTHENTICATED, None, json!({"team": "other"})).is_empty());
    // A label value no selector matches, and a NotIn that keeps a namespace out of inference.
    assert!(denials("dave", AUTHENTICATED, None, json!({"team": "nobody"})).is_empty());
    assert!(
        denials(
            "dave",
            AUTHENTICATED,
            None,
            json!({"team": "inference", "tier": "sandbox"})
        )
        .is_empty()
    );
    // ... and taking that NotIn label away joins inference.
    assert_eq!(
        denials(
            "dave",
            AUTHENTICATED,
            Some(json!({"team": "inference", "tier": "sandbox"})),
            json!({"team": "inference"})
        )
        .len(),
        1
    );
}

#[test]
fn a_team_without_members_is_moved_only_by_admins() {
    let closed = json!({"team": "closed"});
    assert_eq!(
        denials("alice", AUTHENTICATED, None, closed.clone()).len(),
        1
    );
    assert!(denials("root", &["platform-admins"], None, closed).is_empty());
}

#[test]
fn the_operator_is_not_checked() {
    let ml = json!({"team": "ml-research"});
    assert!(denials(DEFAULT_OPERATOR_USER, AUTHENTICATED, None, ml).is_empty());
}

#[test]
fn every_team_is_a_param_and_no_team_means_nothing_to_check() {
    use teamgpu::core::plan::namespace_admission::{exemption_binding, membership_binding};
    let binding = serde_json::to_value(
        membership_binding(teamgpu::core::plan::admission::Enforcement::Deny)
            .spec
            .unwrap(),
    )
    .unwrap();
    assert_eq!(
        binding,
        json!({"policyName": "teamgpu-namespace-membership",
               "paramRef": {"selector": {}, "parameterNotFoundAction": "Allow"},
               "validationActions": ["Deny"]})
    );
    // The exemption label is guarded without params: with no team at all too.
    let binding = serde_json::to_value(
        exemption_binding(teamgpu::core::plan::admission::Enforcement::Deny)
            .spec
            .unwrap(),
    )
    .unwrap();
    assert_eq!(
        binding,
        json!({"policyName": "teamgpu-namespace-exemption", "validationActions": ["Deny"]})
    );
}
