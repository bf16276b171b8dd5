//! The engine over a cluster shaped like a real one (the built-in example: config/samples,
//! three teams, six 8-GPU nodes, claims of 1 to 8 devices), its effects performed by a stand-in
//! for the API server (`engine/server.rs`) that stores what teamgpu applies with the server's
//! defaults, as the operator's watches would bring it back. Plain tests: no runtime, no clock.

#[path = "engine/server.rs"]
mod server;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim};
use k8s_openapi::jiff::Timestamp;
use serde_json::json;
use server::{Server, Watch, engine_with};
use teamgpu::core::diff::Kind;
use teamgpu::core::effects::{Effect, Label};
use teamgpu::core::engine::{Done, Engine, Input, Now, Pass, Role};
use teamgpu::core::plan::Plan;
use teamgpu::core::plan::outside_teams::GUARD_LABEL;

fn engine() -> Engine {
    engine_with(teamgpu::core::engine::WRITES_PER_BATCH)
}

/// `seconds` after a start both clocks agree on.
fn at(start: Instant, seconds: u64) -> Now {
    Now {
        instant: start + Duration::from_secs(seconds),
        wall: Timestamp::from_second(1_780_000_000 + seconds as i64).unwrap(),
    }
}

/// One pass of `engine` over what changed on `server`, listing the slices again when it asks.
/// Where the engine says that what it took in needs no pass (and no wake-up is due), the
/// operator runs none: the pass must then have no effect.
fn pass(engine: &mut Engine, server: &mut Server, now: Now) -> Vec<Effect> {
    let (mut taken, mut due) = (false, false);
    for _ in 0..3 {
        for input in server.changes() {
            taken = true;
            due |= engine.take_in(input);
        }
        due |= engine.next_wake().is_some_and(|at| at <= now.instant);
        match engine.pass(now, Role::Leader) {
            Pass::ListSlices(reads) => server.list_slices(reads),
            Pass::AwaitSlices => panic!("the list asked for was brought: nothing to wait for"),
            Pass::Planned(planned) => {
                assert!(
                    !taken || due || planned.effects.is_empty(),
                    "a pass the operator skips has effects: {:#?}",
                    planned.effects
                );
                return planned.effects;
            }
        }
    }
    panic!("the slices were listed with what the engine asked, and it asked again");
}

/// A pass whose effects the server performs and the engine settles.
fn pass_and_settle(engine: &mut Engine, server: &mut Server, now: Now) -> Vec<Effect> {
    let effects = pass(engine, server, now);
    let done = server.perform(&effects);
    engine.settle(done, now.wall);
    effects
}

/// The first passes over the example's cluster: its objects at second 0, then at second 1 the
/// guard label of "web", the one namespace outside every team, once its quota of 0 is in force
/// (the server's quota controller filled the quota's status); nothing to do at second 2.
/// Returns the first pass's effects.
fn converge(engine: &mut Engine, server: &mut Server, start: Instant) -> Vec<Effect> {
    let first = pass_and_settle(engine, server, at(start, 0));
    let labels = pass_and_settle(engine, server, at(start, 1));
    assert!(
        matches!(&labels[..], [Effect::Label(Label { namespace, value: Some(_) })] if namespace == "web"),
        "{labels:#?}"
    );
    assert_eq!(pass_and_settle(engine, server, at(start, 2)), []);
    first
}

/// A new engine (a restarted operator) that took in everything `server` holds.
fn restarted_over(server: &mut Server) -> Engine {
    let mut engine = engine();
    for input in server.everything() {
        engine.take_in(input);
    }
    engine
}

/// The example's cluster and an engine that converged it.
fn converged() -> (Instant, Server, Engine) {
    let start = Instant::now();
    let mut server = Server::example();
    let mut engine = engine();
    converge(&mut engine, &mut server, start);
    (start, server, engine)
}

fn count(effects: &[Effect], what: fn(&Effect) -> bool) -> usize {
    effects.iter().filter(|e| what(e)).count()
}

#[test]
fn a_converged_cluster_gets_no_effect_when_idle_and_after_a_no_op_event() {
    let start = Instant::now();
    let mut server = Server::example();
    let mut engine = engine();
    let first = converge(&mut engine, &mut server, start);
    // The example's objects: 2 DeviceClasses, 3 teams' quotas and templates, admission
    // objects, members' roles; a status for each of the 5 policies.
    assert!(
        count(&first, |e| matches!(e, Effect::Object(_))) > 10,
        "{first:#?}"
    );
    assert_eq!(count(&first, |e| matches!(e, Effect::Status { .. })), 5);
    assert!(
        server.owned.keys().any(|k| k.kind == Kind::ResourceQuota),
        "quotas were applied"
    );

    let second = pass_and_settle(&mut engine, &mut server, at(start, 3));
    assert_eq!(second, Vec::new(), "a converged cluster gets no effect");

    // Events that change nothing teamgpu reads: every watch again, a namespace relabelled
    // with the labels it has.
    for watch in [
        Watch::SharingPolicies,
        Watch::Teams,
        Watch::Slices,
        Watch::Claims,
    ] {
        server.touch(watch);
    }
    let labels = server.namespaces["web"].clone();
    server.label_namespace("web", labels);
    for kind in Kind::ALL.into_iter().filter(|k| *k != Kind::DeviceClass) {
        server.touch(Watch::Owned(kind));
    }
    let third = pass_and_settle(&mut engine, &mut server, at(start, 60));
    assert_eq!(third, Vec::new(), "a no-op event gets no effect");
    assert_eq!(engine.next_wake(), None, "nothing is due");
}

#[test]
fn a_guard_label_left_from_an_earlier_install_comes_off_before_anything_is_written() {
    let start = Instant::now();
    // The label an earlier install put on "web", the namespace outside every team.
    let mut earlier = Server::example();
    converge(&mut engine(), &mut earlier, start);
    let label = earlier.namespaces["web"][GUARD_LABEL].clone();
    // Installed again: its quotas went with the CRDs, the label stayed. The binding that leaves
    // labelled namespaces out is among the first pass's objects: the label comes off first.
    let mut server = Server::example();
    let mut labels = server.namespaces["web"].clone();
    labels.insert(GUARD_LABEL.to_owned(), label.clone());
    server.label_namespace("web", labels);
    let mut engine = engine();
    let first = pass_and_settle(&mut engine, &mut server, at(start, 0));
    assert_eq!(
        first.first(),
        Some(&Effect::Label(Label {
            namespace: "web".into(),
            value: None
        }))
    );
    assert!(count(&first, |e| matches!(e, Effect::Object(_))) > 10);
    assert_eq!(count(&first, |e| matches!(e, Effect::Label(_))), 1);
    // Once the new quota is in force, the label is set again, to the same value.
    let second = pass_and_settle(&mut engine, &mut server, at(start, 1));
    assert_eq!(
        second,
        [Effect::Label(Label {
            namespace: "web".into(),
            value: Some(label)
        })]
    );
}

#[test]
fn a_restart_over_a_converged_cluster_gets_no_effect() {
    let start = Instant::now();
    let mut server = Server::example();
    let mut first = engine();
    converge(&mut first, &mut server, start);

    // A new operator: nothing kept but what the server holds.
    let mut restarted = restarted_over(&mut server);
    let effects = pass(&mut restarted, &mut server, at(start, 600));
    assert_eq!(
        effects,
        Vec::new(),
        "a restart over an equal cluster writes nothing"
    );
}

#[test]
fn a_raised_guarantee_writes_quotas_and_statuses_and_nothing_else() {
    let (start, mut server, mut engine) = converged();

    // data-science is guaranteed none of a100-80gb and may borrow up to 8: a guarantee of 8
    // gives its namespace's quota all 8, and takes them from the others' shares.
    server.edit_team("data-science", |spec| {
        assert_eq!(spec["quotas"][0]["sharingPolicy"], "a100-80gb");
        spec["quotas"][0]["guaranteed"] = json!(8);
    });
    let effects = pass_and_settle(&mut engine, &mut server, at(start, 2));
    let objects = objects(&effects);
    assert!(
        objects.contains(&"resourcequota data-science/teamgpu".to_owned()),
        "{objects:?}"
    );
    assert!(
        objects.iter().all(|o| o.starts_with("resourcequota ")),
        "a guarantee moves quotas only: {objects:?}"
    );
    let quota = server.owned.iter().find(|(k, _)| {
        k.kind == Kind::ResourceQuota && k.namespace.as_deref() == Some("data-science")
    });
    let hard = &quota.expect("data-science has a quota").1.data["spec"]["hard"];
    assert_eq!(
        hard["a100-80gb.teamgpu.io.deviceclass.resource.k8s.io/devices"],
        "8"
    );
    let statuses: Vec<&str> = (effects.iter())
        .filter_map(|e| match e {
            Effect::Status { name, .. } => Some(name.as_str()),
            _ => None,
        })
        .collect();
    assert!(statuses.contains(&"data-science"), "{statuses:?}");
    assert_eq!(pass_and_settle(&mut engine, &mut server, at(start, 3)), []);
}

/// The objects written among `effects`, as `kind namespace/name`.
fn objects(effects: &[Effect]) -> Vec<String> {
    (effects.iter())
        .filter_map(|e| match e {
            Effect::Object(w) => Some(w.key().to_string()),
            _ => None,
        })
        .collect()
}

/// The statuses among `effects`, by policy name.
fn statuses(effects: &[Effect]) -> Vec<&str> {
    (effects.iter())
        .filter_map(|e| match e {
            Effect::Status { name, .. } => Some(name.as_str()),
            _ => None,
        })
        .collect()
}

/// What the server changed, less the policies' watches: their events of the statuses just
/// written have not come back yet (on a busy API server they come tens of milliseconds after
/// the write's answer, and the write's other events wake the next pass before them).
fn changes_but_the_policies(server: &mut Server) -> Vec<teamgpu::core::engine::Input> {
    use teamgpu::core::engine::Input;
    (server.changes().into_iter())
        .filter(|i| !matches!(i, Input::Teams(_) | Input::SharingPolicies(_)))
        .collect()
}

#[test]
fn a_status_is_written_once_though_the_next_pass_comes_before_its_watch_event() {
    let (start, mut server, mut engine) = converged();

    server.edit_team("data-science", |spec| {
        spec["quotas"][0]["guaranteed"] = json!(8)
    });
    let raised = pass_and_settle(&mut engine, &mut server, at(start, 2));
    assert!(statuses(&raised).contains(&"data-science"), "{raised:?}");
    // The quotas' events come back, the statuses' not yet.
    for input in changes_but_the_policies(&mut server) {
        engine.take_in(input);
    }
    let Pass::Planned(planned) = engine.pass(at(start, 3), Role::Leader) else {
        panic!("the slices are listed")
    };
    assert_eq!(
        statuses(&planned.effects),
        Vec::<&str>::new(),
        "the statuses written are not written again"
    );
    engine.settle(server.perform(&planned.effects), at(start, 3).wall);
    // They come back: nothing to write either.
    assert_eq!(pass_and_settle(&mut engine, &mut server, at(start, 4)), []);
}

#[test]
fn a_status_whose_write_failed_is_written_again() {
    let (start, mut server, mut engine) = converged();

    server.edit_team("data-science", |spec| {
        spec["quotas"][0]["guaranteed"] = json!(8)
    });
    let raised = pass(&mut engine, &mut server, at(start, 2));
    assert!(statuses(&raised).contains(&"data-science"), "{raised:?}");
    // The executor got no answer for the statuses: the objects were written, they were not.
    let objects: Vec<Effect> = (raised.into_iter())
        .filter(|e| matches!(e, Effect::Object(_)))
        .collect();
    engine.settle(server.perform(&objects), at(start, 2).wall);
    for input in changes_but_the_policies(&mut server) {
        engine.take_in(input);
    }
    let again = pass(&mut engine, &mut server, at(start, 3));
    assert!(statuses(&again).contains(&"data-science"), "{again:?}");
}

/// The plan of one pass over what changed on `server`, its effects performed and settled.
fn planned(engine: &mut Engine, server: &mut Server, now: Now) -> std::sync::Arc<Plan> {
    for input in server.changes() {
        engine.take_in(input);
    }
    let Pass::Planned(planned) = engine.pass(now, Role::Leader) else {
        panic!("the slices are listed")
    };
    engine.settle(server.perform(&planned.effects), now.wall);
    planned.plan
}

#[test]
fn teamgpus_own_writes_coming_back_are_compared_with_the_kept_plan_not_planned_again() {
    let (start, mut server, mut engine) = converged();
    let converged = planned(&mut engine, &mut server, at(start, 1));
    // The statuses and objects written come back: the same plan, no effect.
    server.touch(Watch::Teams);
    server.touch(Watch::SharingPolicies);
    server.touch(Watch::Owned(Kind::ResourceQuota));
    let echo = planned(&mut engine, &mut server, at(start, 2));
    assert!(std::sync::Arc::ptr_eq(&converged, &echo), "planned again");
    // A quota edited by hand is still repaired from the kept plan.
    server.edit_owned_quota("data-science", |hard| hard.clear());
    let repair = pass_and_settle(&mut engine, &mut server, at(start, 3));
    assert_eq!(objects(&repair), ["resourcequota data-science/teamgpu"]);
    // A team's spec is the planner's: planned again.
    server.edit_team("data-science", |spec| {
        spec["quotas"][0]["guaranteed"] = json!(8)
    });
    let raised = planned(&mut engine, &mut server, at(start, 4));
    assert!(!std::sync::Arc::ptr_eq(&converged, &raised), "not planned");
}

#[test]
fn a_namespace_label_no_team_selects_by_plans_nothing_again() {
    let (start, mut server, mut engine) = converged();
    let converged = planned(&mut engine, &mut server, at(start, 1));
    let mut labels = server.namespaces["web"].clone();
    labels.insert("cost-center".into(), "4711".into());
    server.label_namespace("web", labels.clone());
    // No pass is needed for it: the operator runs none.
    let mut changes = server.changes();
    assert!(
        matches!(&changes[..], [Input::Namespaces(_)]),
        "{changes:?}"
    );
    assert!(!engine.take_in(changes.remove(0)));
    let relabelled = planned(&mut engine, &mut server, at(start, 2));
    assert!(
        std::sync::Arc::ptr_eq(&converged, &relabelled),
        "planned again"
    );
    let quotas_in_web = |plan: &Plan| {
        (plan.objects.outside_teams.as_ref())
            .is_some_and(|o| o.namespaces.iter().any(|n| n == "web"))
    };
    assert!(quotas_in_web(&converged));
    // Exempted by an admin: web, outside every team, no longer gets the quota of 0.
    labels.insert("teamgpu.io/exempt".into(), "true".into());
    server.label_namespace("web", labels.clone());
    let exempt = planned(&mut engine, &mut server, at(start, 3));
    assert!(!quotas_in_web(&exempt));
    // The label the sample teams select by: web joins ml-research, and gets its quota.
    labels.insert("teamgpu.io/team".into(), "ml-research".into());
    server.label_namespace("web", labels);
    let joined = planned(&mut engine, &mut server, at(start, 4));
    let quotas = (joined.objects.resource_quotas.iter()).filter(|q| &*q.namespace == "web");
    assert_eq!(quotas.count(), 1);
}

#[test]
fn a_pending_pods_event_that_changes_no_demand_plans_nothing_again() {
    let (start, mut server, mut engine) = converged();
    let converged = planned(&mut engine, &mut server, at(start, 1));
    let pod = |conditions: serde_json::Value, claims: serde_json::Value| -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "train-0", "namespace": "ml-research-dev",
                         "creationTimestamp": "2026-06-01T00:00:00Z"},
            "spec": {"containers": [], "resourceClaims": claims},
            "status": {"phase": "Pending", "conditions": conditions}
        }))
        .unwrap()
    };
    let demand = |plan: &Plan| -> Vec<(String, String, u32)> {
        (plan.teams.iter())
            .flat_map(|t| {
                t.quotas
                    .iter()
                    .map(move |q| (t.name.clone(), q.sharing_policy.clone(), q.pending))
            })
            .filter(|(_, _, pending)| *pending > 0)
            .collect()
    };
    // A Pod without device claims waits for a node: no demand, the same plan.
    let unschedulable =
        json!([{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]);
    server.put_pending_pod(pod(json!([]), json!([])));
    let waiting = planned(&mut engine, &mut server, at(start, 2));
    assert!(
        std::sync::Arc::ptr_eq(&converged, &waiting),
        "planned again"
    );
    server.put_pending_pod(pod(unschedulable.clone(), json!([])));
    let condition = planned(&mut engine, &mut server, at(start, 3));
    assert!(
        std::sync::Arc::ptr_eq(&converged, &condition),
        "planned again"
    );
    // Its claim from a template quota refused: the team waits for 4 devices.
    let template = json!([{"name": "gpus", "resourceClaimTemplateName": "a100-80gb-x4"}]);
    server.put_pending_pod(pod(json!([]), template.clone()));
    let wants = planned(&mut engine, &mut server, at(start, 4));
    assert_eq!(
        demand(&wants),
        [("ml-research".to_owned(), "a100-80gb".to_owned(), 4)]
    );
    // The scheduler says why it waits: the same demand, the same plan.
    server.put_pending_pod(pod(unschedulable, template));
    let told = planned(&mut engine, &mut server, at(start, 5));
    assert!(std::sync::Arc::ptr_eq(&wants, &told), "planned again");
}

/// One change to the cluster, or a pass of the kept engine (effects performed and settled).
#[derive(Clone, Debug)]
enum Change {
    Pass,
    AddClaim {
        namespace: usize,
        node: usize,
        devices: u32,
        allocated: bool,
    },
    DropClaim(usize),
    Deallocate(usize),
    DropSlice(usize),
    AddNode(usize),
    Relabel(usize, Option<&'static str>),
    /// A label no team selects by, or the exemption, set or taken off.
    OtherLabel(usize, &'static str, Option<&'static str>),
    NewNamespace(Option<&'static str>),
    Guarantee(usize, u32),
    PendingPod(usize, usize),
    DropSharingPolicy(usize),
    /// A DeviceClass of someone else's whose selector reads what no policy reads: the slices
    /// are listed again.
    ForeignClass(&'static str),
}

const TEAMS: [Option<&str>; 4] = [
    Some("ml-research"),
    Some("inference"),
    Some("data-science"),
    None,
];

fn change() -> impl proptest::strategy::Strategy<Value = Change> {
    use proptest::prelude::*;
    let i = 0..64usize;
    let team = || proptest::sample::select(&TEAMS[..]);
    prop_oneof![
        3 => Just(Change::Pass),
        3 => (i.clone(), i.clone(), 1..=8u32, any::<bool>()).prop_map(|(namespace, node, devices, allocated)| {
            Change::AddClaim { namespace, node, devices, allocated }
        }),
        1 => i.clone().prop_map(Change::DropClaim),
        1 => i.clone().prop_map(Change::Deallocate),
        1 => i.clone().prop_map(Change::DropSlice),
        1 => i.clone().prop_map(Change::AddNode),
        1 => (i.clone(), team()).prop_map(|(n, t)| Change::Relabel(n, t)),
        1 => (
            i.clone(),
            proptest::sample::select(&["cost-center", "teamgpu.io/exempt"][..]),
            proptest::sample::select(&[Some("true"), Some("a"), None][..]),
        )
            .prop_map(|(n, key, value)| Change::OtherLabel(n, key, value)),
        1 => team().prop_map(Change::NewNamespace),
        1 => (i.clone(), 0..20u32).prop_map(|(t, g)| Change::Guarantee(t, g)),
        1 => (i.clone(), i.clone()).prop_map(|(n, t)| Change::PendingPod(n, t)),
        1 => i.prop_map(Change::DropSharingPolicy),
        1 => proptest::sample::select(&[
            "device.attributes['gpu.nvidia.com'].driverVersion.major >= 550",
            "device.capacity['gpu.nvidia.com'].memory.isGreaterThan(quantity('10Gi'))",
            "true",
        ][..])
        .prop_map(Change::ForeignClass),
    ]
}

fn nth<K: Clone, V>(map: &BTreeMap<K, V>, n: usize) -> Option<K> {
    (!map.is_empty()).then(|| map.keys().nth(n % map.len()).cloned())?
}

/// A claim of `devices` on `node` in `namespace`, allocated from the node's free devices if
/// `allocated` and they suffice, pending otherwise.
fn add_claim(server: &mut Server, namespace: usize, node: usize, devices: u32, allocated: bool) {
    let (Some(namespace), Some(node)) = (
        nth(&server.namespaces, namespace),
        nth(&server.slices, node),
    ) else {
        return;
    };
    let slice = &server.slices[&node];
    // (pool, device) of every allocated device.
    let taken: Vec<(String, String)> = (server.claims.values())
        .flat_map(|c| {
            json!(c)["status"]["allocation"]["devices"]["results"]
                .clone()
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .map(|r| {
            (
                r["pool"].as_str().unwrap_or_default().to_owned(),
                r["device"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    let pool = slice.spec.pool.name.clone();
    let free: Vec<String> = (slice.spec.devices.iter().flatten())
        .map(|d| d.name.clone())
        .filter(|d| !taken.contains(&(pool.clone(), d.clone())))
        .take(devices as usize)
        .collect();
    let product = json!(slice.spec.devices)[0]["attributes"]["productName"]["string"].clone();
    let class = if product == "NVIDIA A100-SXM4-80GB" {
        "a100-80gb.teamgpu.io"
    } else {
        "a100-shared.teamgpu.io"
    };
    let results: Vec<_> = (free.iter())
        .map(|d| json!({"request": "gpu", "driver": "gpu.nvidia.com", "pool": pool, "device": d}))
        .collect();
    let allocated = allocated && free.len() == devices as usize;
    let claim: ResourceClaim = serde_json::from_value(json!({
        "metadata": {"name": format!("claim-{}", server.claims.len()), "namespace": namespace},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": class, "allocationMode": "ExactCount", "count": devices}}]}},
        "status": allocated.then(|| json!({"allocation": {"devices": {"results": results}}})),
    }))
    .unwrap();
    server.put_claim(claim);
}

/// A Pod waiting for a claim from the `template`-th template teamgpu wrote in `namespace`:
/// quota refused it, so the claim does not exist.
fn add_pending_pod(server: &mut Server, namespace: usize, template: usize) {
    let Some(namespace) = nth(&server.namespaces, namespace) else {
        return;
    };
    let templates: Vec<String> = (server.owned.keys())
        .filter(|k| {
            k.kind == Kind::ResourceClaimTemplate && k.namespace.as_ref() == Some(&namespace)
        })
        .map(|k| k.name.clone())
        .collect();
    let Some(template) = templates.get(template % templates.len().max(1)) else {
        return;
    };
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": format!("pod-{}", server.pending_pods.len()), "namespace": namespace,
                     "creationTimestamp": "2026-06-01T00:00:00Z"},
        "spec": {"containers": [], "resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": template}]},
        "status": {"phase": "Pending"}
    }))
    .unwrap();
    server.put_pending_pod(pod);
}

fn apply(server: &mut Server, change: &Change) {
    match change {
        Change::Pass => unreachable!("a pass is the engine's"),
        Change::AddClaim {
            namespace,
            node,
            devices,
            allocated,
        } => {
            add_claim(server, *namespace, *node, *devices, *allocated);
        }
        Change::DropClaim(n) => {
            if let Some(key) = nth(&server.claims, *n) {
                server.remove_claim(&key);
            }
        }
        Change::Deallocate(n) => {
            if let Some(key) = nth(&server.claims, *n) {
                let mut claim = server.claims[&key].clone();
                claim.status = None;
                server.put_claim(claim);
            }
        }
        Change::DropSlice(n) => {
            if let Some(name) = nth(&server.slices, *n) {
                server.remove_slice(&name);
            }
        }
        Change::AddNode(n) => {
            if let Some(name) = nth(&server.slices, *n) {
                let mut slice = server.slices[&name].clone();
                let node = format!("gpu-n-{:02}", server.slices.len());
                slice.metadata.name = Some(format!("gpu.nvidia.com-{node}"));
                (slice.metadata.uid, slice.spec.node_name) = (None, Some(node.clone()));
                slice.spec.pool.name = node;
                server.put_slice(slice);
            }
        }
        Change::Relabel(n, team) => {
            if let Some(name) = nth(&server.namespaces, *n) {
                let mut labels = server.namespaces[&name].clone();
                labels.remove("teamgpu.io/team");
                labels.extend(team.map(|t| ("teamgpu.io/team".to_owned(), t.to_owned())));
                server.label_namespace(&name, labels);
            }
        }
        Change::OtherLabel(n, key, value) => {
            if let Some(name) = nth(&server.namespaces, *n) {
                let mut labels = server.namespaces[&name].clone();
                labels.remove(*key);
                labels.extend(value.map(|v| ((*key).to_owned(), v.to_owned())));
                server.label_namespace(&name, labels);
            }
        }
        Change::NewNamespace(team) => {
            let labels = team.map(|t| ("teamgpu.io/team".to_owned(), t.to_owned()));
            let name = format!("ns-{}", server.namespaces.len());
            server.label_namespace(&name, labels.into_iter().collect());
        }
        Change::Guarantee(n, g) => {
            if let Some(name) = nth(&server.teams, *n) {
                server.edit_team(&name, |spec| spec["quotas"][0]["guaranteed"] = json!(g));
            }
        }
        Change::PendingPod(n, t) => add_pending_pod(server, *n, *t),
        Change::DropSharingPolicy(n) => {
            if let Some(name) = nth(&server.sharing, *n) {
                server.sharing.remove(&name);
                server.touch(Watch::SharingPolicies);
            }
        }
        Change::ForeignClass(expression) => {
            let class: DeviceClass = serde_json::from_value(json!({
                "metadata": {"name": format!("foreign-{}", server.classes.len())},
                "spec": {"selectors": [{"cel": {"expression": expression}}]}
            }))
            .unwrap();
            server.put_class(class);
        }
    }
}

/// The devices `team`'s status written among `effects` says its claims request of `policy`.
fn requested_in(effects: &[Effect], team: &str, policy: &str) -> Option<u64> {
    effects.iter().find_map(|e| match e {
        Effect::Status { name, status, .. } if name == team => (status["quotas"].as_array()?)
            .iter()
            .find(|q| q["sharingPolicy"] == policy)?["requested"]
            .as_u64(),
        _ => None,
    })
}

#[test]
fn a_long_converge_goes_out_in_batches_and_what_changes_meanwhile_is_written_in_the_next() {
    let start = Instant::now();
    // The whole converge of the example, as one engine without a limit hands it out.
    let whole = {
        let (mut server, mut engine) = (Server::example(), engine());
        let mut all = objects(&pass_and_settle(&mut engine, &mut server, at(start, 0)));
        all.sort();
        all
    };
    assert!(whole.len() > 12, "{whole:?}");

    let (mut server, mut engine) = (Server::example(), engine_with(4));
    let first = pass_and_settle(&mut engine, &mut server, at(start, 0));
    assert_eq!(objects(&first).len(), 4, "{first:#?}");
    let before = requested_in(&first, "inference", "a100-80gb").expect("inference's status");
    // While the converge goes on, inference's service takes 2 more devices.
    let claim: ResourceClaim = serde_json::from_value(json!({
        "metadata": {"name": "burst", "namespace": "inference-prod"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": "a100-80gb.teamgpu.io", "allocationMode": "ExactCount", "count": 2}}]}}
    }))
    .unwrap();
    server.put_claim(claim);
    // The next batch says so, though the converge has objects left (`pass` also checks that
    // the engine asks for this pass: writes are left).
    let second = pass_and_settle(&mut engine, &mut server, at(start, 1));
    assert_eq!(objects(&second).len(), 4, "{second:#?}");
    assert_eq!(
        requested_in(&second, "inference", "a100-80gb"),
        Some(before + 2),
        "{second:#?}"
    );
    // The rest, four at a time, until nothing is left: every object once. Events wait while
    // writes are left (a first converge's thousand would hold up the batches), then go out.
    let events = |effects: &[Effect]| count(effects, |e| matches!(e, Effect::Event(_)));
    assert_eq!(events(&first) + events(&second), 0, "{first:#?}");
    let mut written = [objects(&first), objects(&second)].concat();
    let mut published = 0;
    for second in 2.. {
        let effects = pass_and_settle(&mut engine, &mut server, at(start, second));
        let batch = objects(&effects);
        assert!(batch.len() <= 4, "{batch:?}");
        if batch.len() == 4 {
            assert_eq!(events(&effects), 0, "{effects:#?}");
        }
        published += events(&effects);
        if batch.is_empty() {
            break;
        }
        written.extend(batch);
    }
    written.sort();
    assert_eq!(written, whole);
    assert!(
        published > 0,
        "the converge's Events are published at its end"
    );
}

/// What must agree between a kept and a fresh engine: the writes of objects and statuses.
/// Left out on purpose: Events (the kept engine does not publish again what it published),
/// wake-ups of waiting Pods (it does not wake again a template it woke for the same room) and
/// evictions (its grace periods started earlier): they depend on what it did before.
fn writes(effects: Vec<Effect>) -> Vec<Effect> {
    effects
        .into_iter()
        .filter(|e| matches!(e, Effect::Object(_) | Effect::Status { .. }))
        .collect()
}

/// A first pass of `engine` at second 0, then `changes` on `server`, with a pass for each
/// [`Change::Pass`] (at its second); each pass's effects performed and settled, and returned.
fn passes_over(
    engine: &mut Engine,
    server: &mut Server,
    start: Instant,
    changes: &[Change],
) -> Vec<Vec<Effect>> {
    let mut passes = vec![pass_and_settle(engine, server, at(start, 0))];
    for (second, change) in (1..).zip(changes) {
        match change {
            Change::Pass => passes.push(pass_and_settle(engine, server, at(start, second))),
            change => apply(server, change),
        }
    }
    passes
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(48))]

    /// After any sequence of changes, some of them followed by a pass whose effects the server
    /// performed, the kept engine asks for the same writes as a fresh engine (a restarted
    /// operator) over the same cluster.
    #[test]
    fn the_kept_engine_writes_what_a_fresh_engine_writes_after_any_changes(
        changes in proptest::collection::vec(change(), 1..16),
    ) {
        let start = Instant::now();
        let mut server = Server::example();
        let mut kept = engine();
        passes_over(&mut kept, &mut server, start, &changes);
        let now = at(start, 1_000);
        let from_kept = writes(pass(&mut kept, &mut server, now));
        let mut fresh = restarted_over(&mut server);
        let from_fresh = writes(pass(&mut fresh, &mut server, now));
        proptest::prop_assert_eq!(from_kept, from_fresh);
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(24))]

    /// The same with at most 3 object writes a pass: no pass hands out more, and once the kept
    /// engine has handed out everything, a fresh engine finds no object to write.
    #[test]
    fn an_engine_that_writes_in_small_batches_converges_as_well(
        changes in proptest::collection::vec(change(), 1..16),
    ) {
        let start = Instant::now();
        let mut server = Server::example();
        let mut kept = engine_with(3);
        let mut batches = passes_over(&mut kept, &mut server, start, &changes);
        for second in 100..200 {
            let batch = pass_and_settle(&mut kept, &mut server, at(start, second));
            let done = objects(&batch).is_empty();
            batches.push(batch);
            if done {
                break;
            }
        }
        for batch in &batches {
            proptest::prop_assert!(objects(batch).len() <= 3, "{:?}", objects(batch));
        }
        proptest::prop_assert!(objects(batches.last().unwrap()).is_empty(), "never done");
        let mut fresh = restarted_over(&mut server);
        let from_fresh = objects(&pass(&mut fresh, &mut server, at(start, 1_000)));
        proptest::prop_assert_eq!(from_fresh, Vec::<String>::new());
    }
}

#[test]
fn a_guard_label_someone_took_off_needs_a_pass_that_sets_it_again() {
    let (start, mut server, mut engine) = converged();
    let mut labels = server.namespaces["web"].clone();
    assert!(labels.remove(GUARD_LABEL).is_some(), "{labels:?}");
    server.label_namespace("web", labels);
    // `pass` also checks that the engine asks for this pass (it has an effect).
    let effects = pass_and_settle(&mut engine, &mut server, at(start, 3));
    assert!(
        matches!(&effects[..], [Effect::Label(Label { namespace, value: Some(_) })] if namespace == "web"),
        "{effects:#?}"
    );
}

/// A Job reclaim suspended is resumed by the pass that sees the claims its Pods held go, and
/// after that pass's writes of objects: the quota lowered by the claims' going is in force
/// before the Job makes its Pods again.
#[test]
fn a_suspended_job_is_resumed_after_its_claims_are_gone_and_after_the_quotas_of_that_pass() {
    let (start, mut server, mut engine) = converged();
    // The largest allocated claim of the example, held by a Pod of Job "train".
    let key = (server.claims.iter())
        .max_by_key(|(_, c)| {
            json!(c)["status"]["allocation"]["devices"]["results"]
                .as_array()
                .map_or(0, Vec::len)
        })
        .map(|(k, _)| k.clone())
        .unwrap();
    let mut claim = server.claims[&key].clone();
    let status = claim.status.get_or_insert_default();
    status.reserved_for = Some(vec![
        serde_json::from_value(json!({"resource": "pods", "name": "train-0", "uid": "u-train-0"}))
            .unwrap(),
    ]);
    server.put_claim(claim);
    pass_and_settle(&mut engine, &mut server, at(start, 3));
    let job = (key.0.clone(), "train".to_owned());
    engine.settle(
        Done {
            suspended: vec![(job.clone(), vec!["train-0".to_owned()])],
            ..Done::default()
        },
        at(start, 3).wall,
    );
    let resumes = |effects: &[Effect]| -> Vec<usize> {
        (effects.iter().enumerate())
            .filter(|(_, e)| matches!(e, Effect::Resume(r) if (r.namespace.clone(), r.job.clone()) == job))
            .map(|(i, _)| i)
            .collect()
    };
    // Its Pod is gone, but the claim is still counted by quota.
    server.touch(Watch::Claims);
    let effects = pass_and_settle(&mut engine, &mut server, at(start, 4));
    assert_eq!(resumes(&effects), Vec::<usize>::new(), "{effects:#?}");
    server.remove_claim(&key);
    let effects = pass(&mut engine, &mut server, at(start, 5));
    let quotas = (effects.iter().enumerate())
        .filter(|(_, e)| matches!(e, Effect::Object(w) if w.key().kind == Kind::ResourceQuota))
        .map(|(i, _)| i)
        .collect::<Vec<_>>();
    assert!(
        !quotas.is_empty(),
        "the claim's going changes a quota: {effects:#?}"
    );
    let resumed = resumes(&effects);
    assert_eq!(resumed.len(), 1, "{effects:#?}");
    assert!(quotas.iter().all(|q| *q < resumed[0]), "{effects:#?}");
    // Asked for until it was done; then never again.
    let done = server.perform(&effects);
    assert_eq!(done.resumed, [job]);
    engine.settle(done, at(start, 5).wall);
    assert_eq!(pass_and_settle(&mut engine, &mut server, at(start, 6)), []);
}
