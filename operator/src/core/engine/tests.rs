use std::sync::Arc;

use kube::api::DynamicObject;
use serde_json::json;

use super::*;
use crate::api::TeamGpuPolicy;

fn team_object(name: &str, spec: serde_json::Value) -> Arc<DynamicObject> {
    Arc::new(
        serde_json::from_value(
            json!({"apiVersion": "teamgpu.io/v1alpha1", "kind": "TeamGpuPolicy",
                                      "metadata": {"name": name}, "spec": spec}),
        )
        .unwrap(),
    )
}

#[test]
fn a_policy_that_does_not_fit_its_type_is_skipped_and_reported() {
    let objects = [
        team_object("bad", json!({"weight": "many"})),
        team_object("good", json!({"namespaces": ["a"]})),
    ];
    let (good, malformed) = parse_policies::<TeamGpuPolicy>(&objects);
    assert_eq!(malformed.len(), 1);
    assert!(
        malformed[0]
            .message
            .contains("cannot be read as a TeamGpuPolicy"),
        "{}",
        malformed[0].message
    );
    assert_eq!(malformed[0].kind.api_resource().plural, "teamgpupolicies");
    let namespaces: Vec<Vec<String>> = good.into_iter().map(|t| t.spec.namespaces).collect();
    assert_eq!(namespaces, vec![vec!["a".to_owned()]]);
}

#[test]
fn a_malformed_policy_gets_a_status_that_says_so_once_the_slices_are_in() {
    let mut engine = Engine::new(Settings {
        operator_user: "system:serviceaccount:teamgpu-system:teamgpu".into(),
        admin_groups: None,
        enforcement: Enforcement::Deny,
        reclaim: ReclaimDefaults {
            enabled: false,
            grace: std::time::Duration::from_secs(120),
            min_runtime: std::time::Duration::ZERO,
        },
    });
    engine.take_in(Input::Teams(vec![team_object(
        "bad",
        json!({"weight": "many"}),
    )]));
    let now = Now {
        instant: Instant::now(),
        wall: Timestamp::UNIX_EPOCH,
    };
    // No slices taken in yet: they must be listed first, and only once.
    assert!(matches!(
        engine.pass(now, Role::Leader),
        Pass::ListSlices(_)
    ));
    assert!(matches!(engine.pass(now, Role::Leader), Pass::AwaitSlices));
    engine.take_in(Input::Slices {
        reads: Arc::new(DeviceReads::default()),
        slices: crate::core::state::Taken::All(Vec::new()),
    });
    let Pass::Planned(planned) = engine.pass(now, Role::Leader) else {
        panic!("planned once the slices are in");
    };
    let statuses: Vec<(String, serde_json::Value)> = planned
        .effects
        .iter()
        .filter_map(|e| match e {
            Effect::Status { name, status, .. } => Some((name.clone(), status.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(statuses.len(), 1, "{statuses:?}");
    assert_eq!(statuses[0].0, "bad");
    assert_eq!(statuses[0].1["conditions"][0]["reason"], "Malformed");
    // A follower plans the same, and asks for nothing.
    let Pass::Planned(follower) = engine.pass(now, Role::Follower) else {
        panic!("planned");
    };
    assert!(follower.effects.is_empty(), "{:?}", follower.effects);
}
