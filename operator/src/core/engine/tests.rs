use std::sync::Arc;

use kube::api::DynamicObject;
use serde_json::json;

use super::*;
use crate::api::TeamGpuPolicy;
use crate::core::plan::admission::DEFAULT_OPERATOR_USER;

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
        operator_user: DEFAULT_OPERATOR_USER.into(),
        admin_groups: None,
        enforcement: Enforcement::Deny,
        reclaim: ReclaimDefaults {
            enabled: false,
            grace: std::time::Duration::from_secs(120),
            min_runtime: std::time::Duration::ZERO,
        },
        writes_per_batch: WRITES_PER_BATCH,
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

#[test]
fn policies_are_read_again_only_when_their_resource_version_changed() {
    let team = |name: &str, version: &str, weight: u32| {
        let mut object =
            (*team_object(name, json!({"weight": weight, "namespaces": ["a"]}))).clone();
        object.metadata.resource_version = Some(version.into());
        Arc::new(object)
    };
    let first = [team("a", "1", 1), team("b", "1", 1)];
    let (read, _, _) = input::parse_policies_reusing::<TeamGpuPolicy>(&first, Vec::new());
    // Only a status written (a new version, the same spec): read again, the plan the same.
    let second = [team("a", "2", 1), team("b", "1", 1)];
    let (read, malformed, same) = input::parse_policies_reusing(&second, read);
    assert!(malformed.is_empty() && same);
    assert_eq!(read[0].metadata.resource_version.as_deref(), Some("2"));
    // The same version stands for the same object: what was read is kept, not read again.
    let stale_cache = [team("a", "2", 7), team("b", "1", 1)];
    let (read, _, same) = input::parse_policies_reusing(&stale_cache, read);
    assert!(same);
    assert_eq!(read[0].spec.weight, 1);
    // A changed spec, a deleted policy: the planner reads something else.
    let (read, _, same) =
        input::parse_policies_reusing(&[team("a", "3", 2), team("b", "1", 1)], read);
    assert!(!same);
    assert_eq!(read[0].spec.weight, 2);
    let (read, _, same) = input::parse_policies_reusing(&[team("a", "3", 2)], read);
    assert!(!same);
    assert_eq!(read.len(), 1);
}
