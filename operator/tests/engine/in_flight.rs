//! Passes while the executor still performs earlier batches (it runs off the planning path):
//! what is in flight is not asked for again unless what it writes changed, what was not
//! performed comes back once its batch settles, and an eviction happens once, and again when
//! refused.

use super::*;
use teamgpu::core::diff::ObjectKey;

fn evictions(effects: &[Effect]) -> Vec<String> {
    (effects.iter())
        .filter_map(|e| match e {
            Effect::Evict(e) => Some(e.workload.clone()),
            _ => None,
        })
        .collect()
}

/// The devices of a100-80gb the quota of namespace data-science holds, as the server stores it.
fn data_science_a100_80gb(server: &Server) -> serde_json::Value {
    let key = ObjectKey {
        kind: Kind::ResourceQuota,
        namespace: Some("data-science".into()),
        name: "teamgpu".into(),
    };
    server.owned[&key].data["spec"]["hard"]["a100-80gb.teamgpu.io.deviceclass.resource.k8s.io/devices"]
        .clone()
}

#[test]
fn a_write_in_flight_is_not_asked_for_again_unless_what_it_writes_changed() {
    let start = Instant::now();
    let mut server = Server::example();
    let mut engine = engine();
    // The first converge, handed to the executor and not done yet.
    let first = planned(&mut engine, &mut server, at(start, 0));
    assert!(objects(&first.effects).len() > 10, "{first:?}");
    assert_eq!(statuses(&first.effects).len(), 5);

    // Passes go on meanwhile; events that change nothing teamgpu writes ask for nothing.
    for watch in [Watch::Claims, Watch::Teams, Watch::SharingPolicies] {
        server.touch(watch);
    }
    assert_eq!(pass(&mut engine, &mut server, at(start, 1)), []);

    // data-science's guarantee of a100-80gb raised from 0 to 8 meanwhile: the quotas it moves
    // and the statuses it changes are asked for again, with their new content; nothing else.
    server.edit_team("data-science", |spec| {
        assert_eq!(spec["quotas"][0]["sharingPolicy"], "a100-80gb");
        spec["quotas"][0]["guaranteed"] = json!(8);
    });
    let second = planned(&mut engine, &mut server, at(start, 2));
    let again = objects(&second.effects);
    assert!(
        again.contains(&"resourcequota data-science/teamgpu".to_owned()),
        "{again:?}"
    );
    assert!(
        again.iter().all(|o| o.starts_with("resourcequota ")),
        "{again:?}"
    );
    assert!(
        statuses(&second.effects).contains(&"data-science"),
        "{:?}",
        second.effects
    );

    // The executor performs both, in order: the cluster is converged, at the newer content.
    perform_and_settle(&mut engine, &mut server, first, at(start, 3));
    perform_and_settle(&mut engine, &mut server, second, at(start, 3));
    assert_eq!(pass_and_settle(&mut engine, &mut server, at(start, 4)), []);
    assert_eq!(data_science_a100_80gb(&server), "8");
    assert_eq!(engine.next_wake(), None);
}

#[test]
fn a_batch_settles_only_what_was_performed_and_the_rest_comes_back() {
    let start = Instant::now();
    let mut server = Server::example();
    let mut engine = engine();
    let first = planned(&mut engine, &mut server, at(start, 0));
    // The executor did all but the quotas (they failed, were backing off, or the lease was lost
    // before them).
    let is_quota =
        |e: &Effect| matches!(e, Effect::Object(w) if w.key().kind == Kind::ResourceQuota);
    let (quotas, rest): (Vec<Effect>, Vec<Effect>) =
        first.effects.iter().cloned().partition(is_quota);
    assert!(quotas.len() >= 3, "{quotas:?}");
    let done = server.perform(&rest);
    let wall = at(start, 0).wall;
    engine.settle(
        Done {
            batch: first.batch,
            ..done
        },
        wall,
    );
    // The next pass asks for the quotas again, and for nothing that was done.
    let again = pass(&mut engine, &mut server, at(start, 1));
    assert_eq!(objects(&again), objects(&quotas));
    assert_eq!(again.len(), quotas.len(), "{again:?}");
    // Settling a batch asks for no pass: nothing is due.
    assert_eq!(engine.next_wake(), None);
}

#[test]
fn a_pass_between_the_answers_and_their_watch_events_writes_no_object_again() {
    let start = Instant::now();
    let mut server = Server::example();
    let mut engine = engine();
    let first = planned(&mut engine, &mut server, at(start, 0));
    let written = objects(&first.effects).len();
    perform_and_settle(&mut engine, &mut server, first, at(start, 0));
    // The watches have not brought what the server stored yet (`server.changes()` not taken).
    let Pass::Planned(planned) = engine.pass(at(start, 1), Role::Leader) else {
        panic!("planned: the slices are in");
    };
    assert!(written > 10);
    assert_eq!(objects(&planned.effects), Vec::<String>::new());
    assert_eq!(engine.next_wake(), None);
}

/// Fills the a100-80gb pool with `n` Pods of ml-research, one device each, started a minute
/// apart; inference (guaranteed 12, reclaim after 300 s) then waits for 2 more devices.
fn borrowed_pool(server: &mut Server, n: usize) {
    let taken = server.allocated_devices();
    let free: Vec<(String, String)> = (server.slices.values())
        .filter(|s| s.spec.pool.name.starts_with("gpu-a-"))
        .flat_map(|s| {
            let pool = s.spec.pool.name.clone();
            (s.spec.devices.iter().flatten()).map(move |d| (pool.clone(), d.name.clone()))
        })
        .filter(|d| !taken.contains(d))
        .collect();
    assert_eq!(free.len(), n, "the pool's free devices");
    for (i, (pool, device)) in free.into_iter().enumerate() {
        let pod = format!("train-{i:02}");
        server.put_claim(
            serde_json::from_value(json!({
                "metadata": {"name": format!("{pod}-gpu"), "namespace": "ml-research-train"},
                "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                    "deviceClassName": "a100-80gb.teamgpu.io", "allocationMode": "ExactCount", "count": 1}}]}},
                "status": {
                    "allocation": {"devices": {"results": [
                        {"request": "gpu", "driver": "gpu.nvidia.com", "pool": pool, "device": device}]}},
                    "reservedFor": [{"resource": "pods", "name": pod, "uid": format!("uid-{pod}")}]
                }
            }))
            .unwrap(),
        );
        server.put_pod(
            serde_json::from_value(json!({
                "metadata": {"name": pod, "namespace": "ml-research-train", "uid": format!("uid-{pod}")},
                "spec": {"containers": []},
                "status": {"phase": "Running", "startTime": format!("2026-06-01T10:{i:02}:00Z")}
            }))
            .unwrap(),
        );
    }
    server.put_claim(
        serde_json::from_value(json!({
            "metadata": {"name": "serve-gpu", "namespace": "inference-prod"},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": "a100-80gb.teamgpu.io", "allocationMode": "ExactCount", "count": 2}}]}}
        }))
        .unwrap(),
    );
    server.put_pending_pod(
        serde_json::from_value(json!({
            "metadata": {"name": "serve", "namespace": "inference-prod",
                         "creationTimestamp": "2026-06-01T11:00:00Z"},
            "spec": {"containers": [], "resourceClaims": [{"name": "gpu", "resourceClaimName": "serve-gpu"}]},
            "status": {"phase": "Pending"}
        }))
        .unwrap(),
    );
}

#[test]
fn an_eviction_happens_once_and_again_when_refused() {
    let start = Instant::now();
    let mut server = Server::example();
    let mut engine = engine();
    borrowed_pool(&mut server, 11);
    // inference waits for 2 devices; its grace period starts.
    let waiting = pass_and_settle(&mut engine, &mut server, at(start, 0));
    assert_eq!(evictions(&waiting), Vec::<String>::new());
    // Past it: the two newest Pods of the borrower make the room.
    let evicting = planned(&mut engine, &mut server, at(start, 301));
    let expected = [
        "Pod ml-research-train/train-10",
        "Pod ml-research-train/train-09",
    ];
    let mut workloads = evictions(&evicting.effects);
    workloads.sort();
    assert_eq!(workloads, [expected[1], expected[0]]);
    // A pass while they are on their way does not evict again.
    server.touch(Watch::Claims);
    assert_eq!(
        evictions(&pass(&mut engine, &mut server, at(start, 302))),
        Vec::<String>::new()
    );
    // A PodDisruptionBudget refused them: nothing happened, and they are tried again 10 s later.
    let refused_at = at(start, 303);
    engine.settle(
        Done {
            batch: evicting.batch,
            eviction_refused: Some(refused_at.instant),
            ..Done::default()
        },
        refused_at.wall,
    );
    assert_eq!(
        engine.next_wake(),
        Some(refused_at.instant + Duration::from_secs(10))
    );
    let again = planned(&mut engine, &mut server, at(start, 313));
    let mut workloads = evictions(&again.effects);
    workloads.sort();
    assert_eq!(workloads, [expected[1], expected[0]]);
    // Accepted this time: the room is made, and nothing more is evicted.
    perform_and_settle(&mut engine, &mut server, again, at(start, 313));
    let after = pass_and_settle(&mut engine, &mut server, at(start, 314));
    assert_eq!(evictions(&after), Vec::<String>::new());
}
