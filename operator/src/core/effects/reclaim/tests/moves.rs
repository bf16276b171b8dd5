//! Which workloads move so that a claim fits a node when nobody borrows: `moves::choose_moves`,
//! and the tracker's moves over passes.

use std::collections::BTreeMap;

use super::queued::{queued_pod, unallocated};
use super::tracker::{Waiting, team_report};
use super::*;
use crate::core::effects::reclaim::moves::{MOVED_AGAIN_AFTER, choose_moves};
use crate::core::effects::reclaim::nodes::Free;
use crate::core::plan::inventory::PoolKey;
use crate::core::plan::placement::Placement;

fn node(n: &str) -> Option<Arc<str>> {
    Some(Arc::from(n))
}

/// A workload of `devices` on `node`, with `priority`, started at `started`.
fn on(name: &str, node: &str, devices: u64, priority: i32, started: &str) -> Workload {
    workload(name, &[(Some(node), devices)], priority, started)
}

fn free(of: &[(&str, u64)]) -> Free {
    of.iter().map(|(n, f)| (node(n), *f)).collect()
}

fn team(name: &str, workloads: Vec<Workload>) -> Borrower {
    borrower(name, 0, 0, workloads)
}

fn names(choice: &Choice) -> Vec<&str> {
    let mut out: Vec<&str> = choice.evict.iter().map(|(_, w)| w.name.as_str()).collect();
    out.sort_unstable();
    out
}

/// The replay's case (seed 22, 92.8 s): speech waits for 8 devices, nobody is above its
/// guarantee, and three nodes have 6-7 free, each kept from 8 by 1-device Pods of serving and
/// vision; another node has 2 free.
fn spread_thin() -> (Vec<Borrower>, Free) {
    let serving = team(
        "serving",
        vec![
            on("Job serving/s-1", "node-15", 1, 0, "2026-06-01T11:00:00Z"),
            on("Job serving/s-2", "node-0", 1, 0, "2026-06-01T11:00:00Z"),
        ],
    );
    let vision = team(
        "vision",
        vec![on("Job vision/v-1", "node-0", 1, 0, "2026-06-01T11:00:00Z")],
    );
    let free = free(&[("node-15", 7), ("node-0", 6), ("node-3", 2), ("node-9", 0)]);
    (vec![serving, vision], free)
}

#[test]
fn a_claim_no_node_holds_gets_the_node_that_one_small_move_empties() {
    let (teams, free) = spread_thin();
    let choice = choose_moves(&teams, &free, &[8], 0, at(NOW));
    // node-15 needs 1 device moved, node-0 needs 2: node-15's workload moves (it fits node-3).
    assert_eq!(names(&choice), ["Job serving/s-1"]);
    assert_eq!(choice.placed, [(8, node("node-15"))]);
    assert_eq!((choice.freed, choice.uncovered), (1, 0));
}

#[test]
fn a_workload_that_fits_no_other_node_stays() {
    let (teams, _) = spread_thin();
    // node-15 could be emptied, but its workload fits no other node: node-0 and node-9 are full.
    let free = free(&[("node-15", 7), ("node-0", 0), ("node-9", 0)]);
    assert_nothing_moves_for_eight(&teams, &free);
}

/// An 8-device claim that moves cannot make room for: nothing is evicted, all 8 uncovered.
fn assert_nothing_moves_for_eight(teams: &[Borrower], free: &Free) {
    let choice = choose_moves(teams, free, &[8], 0, at(NOW));
    assert!(choice.evict.is_empty(), "{:?}", names(&choice));
    assert_eq!(choice.uncovered, 8);
}

#[test]
fn bare_pods_pinned_pods_and_workloads_on_two_nodes_stay() {
    let mut pinned = on("Pod serving/bare", "node-15", 1, 0, "2026-06-01T11:00:00Z");
    pinned.movable = false;
    let mut two_nodes = on("Job vision/wide", "node-0", 1, 0, "2026-06-01T11:00:00Z");
    two_nodes.nodes.push((node("node-3"), 1));
    two_nodes.devices = 2;
    let teams = vec![
        team("serving", vec![pinned]),
        team("vision", vec![two_nodes]),
    ];
    let free = free(&[("node-15", 7), ("node-0", 7), ("node-3", 5)]);
    assert_nothing_moves_for_eight(&teams, &free);
}

#[test]
fn the_lowest_priority_moves_first_then_the_fewest_devices_then_the_newest() {
    let free = free(&[("node-1", 6), ("node-2", 6), ("node-3", 7), ("node-4", 8)]);
    // node-1 lacks 2, held by a high-priority Job; node-2 lacks 2, held by two low-priority
    // Jobs; node-3 lacks 1, held by an old Job of priority 0.
    let claims = [8, 8];
    let teams = vec![team(
        "research",
        vec![
            on(
                "Job research/high",
                "node-1",
                2,
                1000,
                "2026-06-01T11:00:00Z",
            ),
            on(
                "Job research/low-a",
                "node-2",
                1,
                -1,
                "2026-06-01T10:00:00Z",
            ),
            on(
                "Job research/low-b",
                "node-2",
                1,
                -1,
                "2026-06-01T11:30:00Z",
            ),
            on("Job research/old", "node-3", 1, 0, "2026-06-01T08:00:00Z"),
        ],
    )];
    let choice = choose_moves(&teams, &free, &claims, 0, at(NOW));
    // The first claim takes node-4 as it is. The second: node-2's two low-priority Jobs go
    // before node-3's single Job of priority 0 and node-1's high one.
    assert_eq!(names(&choice), ["Job research/low-a", "Job research/low-b"]);
    assert_eq!(choice.placed, [(8, node("node-4")), (8, node("node-2"))]);
    // Of equal priority, the fewest devices: node-3's one Job, not node-2's two.
    let mut equal = teams.clone();
    for w in &mut equal[0].workloads {
        w.priority = 0;
    }
    let choice = choose_moves(&equal, &free, &[8, 8], 0, at(NOW));
    assert_eq!(names(&choice), ["Job research/old"]);
}

#[test]
fn a_workload_younger_than_the_minimum_runtime_stays_until_then() {
    let (teams, free) = spread_thin();
    // Every workload started at 11:00; NOW is 12:00: 3,600 s of runtime.
    let choice = choose_moves(&teams, &free, &[8], 7200, at(NOW));
    assert!(choice.evict.is_empty());
    assert_eq!(choice.eligible_at, Some(at("2026-06-01T13:00:00Z")));
}

#[test]
fn a_workload_on_its_way_out_leaves_room_without_another_move() {
    let (mut teams, free) = spread_thin();
    teams[0].workloads[0].terminating = true;
    let choice = choose_moves(&teams, &free, &[8], 0, at(NOW));
    assert!(choice.evict.is_empty());
    assert_eq!(choice.placed, [(8, node("node-15"))]);
    assert_eq!(choice.in_flight, 1);
}

/// vision waits for 8 devices; node-4 holds research's 6 (research is 9 above its guarantee,
/// in a bare Pod) and one device each of serving and recsys (both within their guarantees);
/// node-3 and node-5 have 1 free each. (The replay, seed 22, 41.3 s: reclaim alone clears no
/// node, and nobody is moved while a reclaim is ordered.)
fn borrower_and_two_small() -> (Vec<Borrower>, Free) {
    let mut bare = on("Pod research/r6", "node-4", 6, 0, "2026-06-01T11:00:00Z");
    bare.movable = false;
    let teams = vec![
        borrower("research", 0, 9, vec![bare]),
        team(
            "serving",
            vec![on("Job serving/s1", "node-4", 1, 0, "2026-06-01T11:00:00Z")],
        ),
        team(
            "recsys",
            vec![on("Job recsys/c1", "node-4", 1, 0, "2026-06-01T11:00:00Z")],
        ),
    ];
    let free = free(&[("node-4", 0), ("node-3", 1), ("node-5", 1), ("node-6", 0)]);
    (teams, free)
}

#[test]
fn a_borrowers_workload_is_taken_back_and_the_others_on_its_node_move() {
    let (teams, free) = borrower_and_two_small();
    let choice = choose_moves(&teams, &free, &[8], 0, at(NOW));
    assert_eq!(
        names(&choice),
        ["Job recsys/c1", "Job serving/s1", "Pod research/r6"]
    );
    let moved: Vec<&str> = (choice.moved.iter())
        .map(|&k| choice.evict[k].1.name.as_str())
        .collect();
    // The borrower's bare Pod is not made again elsewhere: it is taken back, not moved.
    assert!(!moved.contains(&"Pod research/r6"), "{moved:?}");
    assert_eq!(moved.len(), 2);
    assert_eq!(choice.placed, [(8, node("node-4"))]);
    assert_eq!((choice.freed, choice.uncovered), (8, 0));
}

#[test]
fn a_borrower_gives_back_no_more_than_it_holds_above_its_guarantee() {
    let (mut teams, free) = borrower_and_two_small();
    // 5 above its guarantee: its 6-device Pod would take it below, and it cannot move.
    teams[0].above_guarantee = 5;
    assert_nothing_moves_for_eight(&teams, &free);
    // A movable one beyond its room moves, if another node has room for it.
    teams[0].workloads[0].movable = true;
    let roomy = free_with(&free, "node-6", 6);
    let choice = choose_moves(&teams, &roomy, &[8], 0, at(NOW));
    assert_eq!(choice.evict.len(), 3);
    assert_eq!(choice.moved.len(), 3, "all three move");
}

fn free_with(free: &Free, node_name: &str, n: u64) -> Free {
    let mut free = free.clone();
    free.insert(node(node_name), n);
    free
}

/// `owner` (namespace `o`) waits for an 8-device claim within its guarantee that fits no node,
/// and nobody borrows: no reclaim order. `borrower` (namespace `b`, within its guarantee too)
/// has a 1-device Job alone on node `n1`; `n2` has 2 free.
fn fragmented_plan() -> Plan {
    let pool = |name: &str| PoolKey {
        driver: "gpu.nvidia.com".into(),
        pool: name.into(),
    };
    Plan {
        reclaims: Vec::new(),
        placements: vec![Placement {
            sharing_policy: "a".into(),
            nodes: BTreeMap::from([(pool("n1"), Arc::from("n1")), (pool("n2"), Arc::from("n2"))]),
            free: BTreeMap::from([(node("n1"), 7), (node("n2"), 2)]),
            unplaced: BTreeMap::from([("owner".to_owned(), vec![8])]),
        }],
        teams: vec![
            team_report("owner", "o", 0, 8),
            team_report("borrower", "b", 1, 4),
        ],
        ..super::tracker::plan()
    }
}

fn one_small_job() -> (Vec<Arc<PodView>>, Vec<Arc<ClaimView>>) {
    let pods = views(&[pod(
        "b",
        "small-0",
        Some(("Job", "small")),
        json!({}),
        json!({}),
    )]);
    let claim: ResourceClaim = serde_json::from_value(json!({
        "metadata": {"name": "small-0-gpu", "namespace": "b"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": CLASS, "count": 1}}]}},
        "status": {"allocation": {"devices": {"results": [
            {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "n1", "device": "gpu-0"}]}},
                   "reservedFor": [{"resource": "pods", "name": "small-0", "uid": "u-small-0"}]}
    }))
    .unwrap();
    let claims = vec![Arc::new(ClaimView::project(&claim, &mut Names::default()))];
    (pods, claims)
}

/// What a pass of `plan` at `secs` evicts, with [`one_small_job`] in the cluster.
fn moved(waiting: &mut Waiting, plan: &Plan, secs: u64) -> Vec<Eviction> {
    waiting.reclaimed_in(plan, secs, one_small_job()).evictions
}

#[test]
fn a_team_within_its_guarantee_gets_a_node_by_a_move_once_its_grace_has_passed() {
    let mut waiting = Waiting::new();
    let plan = fragmented_plan();
    assert!(moved(&mut waiting, &plan, 0).is_empty());
    assert_eq!(waiting.wakes_at(), Some(30), "woken when the grace ends");
    let first = moved(&mut waiting, &plan, 30);
    assert_eq!(first.len(), 1);
    let e = &first[0];
    assert_eq!(
        (e.workload.as_str(), e.why == EvictionWhy::Move, e.devices),
        ("Job b/small", true, 1)
    );
    let events = eviction_events(e, Ok(Taken::Evicted));
    let on_pod = events
        .iter()
        .find(|ev| ev.regarding.kind.as_deref() == Some("Pod"));
    let on_pod = on_pod.expect("an Event on the moved Pod");
    assert_eq!(on_pod.reason, "Moved");
    assert!(
        on_pod
            .note
            .contains("owner waits, within its guarantee, for 8 devices in claims"),
        "{}",
        on_pod.note
    );
    // The same workload is not moved again for ten minutes, even if the room is lost again.
    let again = moved(&mut waiting, &plan, 31);
    assert!(again.is_empty(), "{again:?}");
    let later = 30 + MOVED_AGAIN_AFTER.as_secs();
    assert_eq!(moved(&mut waiting, &plan, later).len(), 1);
}

#[test]
fn a_team_that_does_not_reclaim_moves_nothing() {
    let mut waiting = Waiting::off();
    let plan = fragmented_plan();
    assert!(moved(&mut waiting, &plan, 0).is_empty());
    assert!(moved(&mut waiting, &plan, 600).is_empty());
}

/// A one-Pod Job `job` of namespace `ns` holding `devices` devices of pool (and node) `node`.
fn job_on(ns: &str, job: &str, devices: usize, node: &str) -> (Pod, Arc<ClaimView>) {
    let pod_name = format!("{job}-0");
    let pod = pod(ns, &pod_name, Some(("Job", job)), json!({}), json!({}));
    let results: Vec<_> = (0..devices)
        .map(|i| json!({"request": "gpu", "driver": "gpu.nvidia.com", "pool": node, "device": format!("{job}-{i}")}))
        .collect();
    let claim: ResourceClaim = serde_json::from_value(json!({
        "metadata": {"name": format!("{pod_name}-gpu"), "namespace": ns},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": CLASS, "count": devices}}]}},
        "status": {"allocation": {"devices": {"results": results}},
                   "reservedFor": [{"resource": "pods", "name": pod_name, "uid": format!("u-{pod_name}")}]}
    }))
    .unwrap();
    (
        pod,
        Arc::new(ClaimView::project(&claim, &mut Names::default())),
    )
}

/// A pass of `plan` over `cluster` when the owner's grace (30 s) has passed, the one at its
/// start having evicted nothing.
fn after_grace(
    plan: &Plan,
    cluster: impl Fn() -> (Vec<Arc<PodView>>, Vec<Arc<ClaimView>>),
) -> Reclaimed {
    let mut waiting = Waiting::new();
    let first = waiting.reclaimed_in(plan, 0, cluster());
    assert!(first.evictions.is_empty(), "{:?}", first.evictions);
    waiting.reclaimed_in(plan, 30, cluster())
}

/// Each eviction's workload and why it goes.
fn what_and_why(pass: &Reclaimed) -> Vec<(&str, EvictionWhy)> {
    (pass.evictions.iter())
        .map(|e| (e.workload.as_str(), e.why))
        .collect()
}

#[test]
fn a_reclaim_that_clears_no_node_alone_moves_the_rest_instead_of_waiting() {
    let pool = |name: &str| PoolKey {
        driver: "gpu.nvidia.com".into(),
        pool: name.into(),
    };
    // The owner waits for 8 within its guarantee. The borrower is 2 above its guarantee, with a
    // 2-device Job on n1 (and 4 on n2); team c, within its guarantee, has a 2-device Job on n1.
    // n1 has 4 free, n2 has 2: reclaim alone frees 6 on n1.
    let plan = Plan {
        teams: vec![
            team_report("owner", "o", 0, 8),
            team_report("borrower", "b", 6, 4),
            team_report("c", "c", 2, 4),
        ],
        reclaims: vec![ReclaimOrder {
            sharing_policy: "a".into(),
            borrower: "borrower".into(),
            devices: 2,
            for_team: "owner".into(),
        }],
        placements: vec![Placement {
            sharing_policy: "a".into(),
            nodes: BTreeMap::from([(pool("n1"), Arc::from("n1")), (pool("n2"), Arc::from("n2"))]),
            free: BTreeMap::from([(node("n1"), 4), (node("n2"), 2)]),
            unplaced: BTreeMap::from([("owner".to_owned(), vec![8])]),
        }],
        ..super::tracker::plan()
    };
    let jobs = [
        job_on("b", "b-small", 2, "n1"),
        job_on("b", "b-wide", 4, "n2"),
        job_on("c", "c-small", 2, "n1"),
    ];
    let pods: Vec<Pod> = jobs.iter().map(|(p, _)| p.clone()).collect();
    let cluster = || (views(&pods), jobs.iter().map(|(_, c)| c.clone()).collect());
    let pass = after_grace(&plan, cluster);
    let mut evicted = what_and_why(&pass);
    evicted.sort_by_key(|e| e.0);
    assert_eq!(
        evicted,
        [
            ("Job b/b-small", EvictionWhy::Reclaim),
            ("Job c/c-small", EvictionWhy::Move)
        ]
    );
    let blocked = pass.events.iter().find(|e| e.reason == "ReclaimBlocked");
    assert!(blocked.is_none(), "{blocked:?}");
    // Without team c's Job to move, the owner is told that reclaim cannot make room.
    let alone = || {
        let (pods, claims): (Vec<_>, Vec<_>) = cluster();
        let keep = |ns: &str| ns != "c";
        (
            pods.into_iter().filter(|p| keep(&p.namespace)).collect(),
            claims.into_iter().filter(|c| keep(&c.namespace)).collect(),
        )
    };
    let mut waiting = Waiting::new();
    waiting.reclaimed_in(&plan, 0, alone());
    let pass = waiting.reclaimed_in(&plan, 30, alone());
    assert!(pass.evictions.is_empty(), "{:?}", pass.evictions);
    assert!(pass.events.iter().any(|e| e.reason == "ReclaimBlocked"));
}

#[test]
fn a_borrowers_pod_queued_for_a_node_goes_with_a_move_so_that_it_does_not_take_the_room() {
    // As `fragmented_plan`, and team d, 2 above its guarantee, has an 8-device Job charged and
    // waiting for a node: the scheduler would give it the room the move makes for the owner.
    let mut plan = fragmented_plan();
    plan.teams.push(team_report("d", "d", 6, 4));
    let (mut pods, mut claims) = one_small_job();
    pods.extend(views(&[queued_pod("d", "big-0", "big", Some("big-0-gpu"))]));
    claims.push(unallocated("d", "big-0-gpu", 8));
    let cluster = || (pods.clone(), claims.clone());
    let pass = after_grace(&plan, cluster);
    let what = what_and_why(&pass);
    assert_eq!(
        what,
        [
            ("Job d/big", EvictionWhy::Queued),
            ("Job b/small", EvictionWhy::Move)
        ]
    );
    // A team that holds exactly its guarantee borrows all 8 its queued Job is charged: it goes
    // too (in the replay, such a team's 8-GPU Pod took the node a move had emptied).
    let mut at = fragmented_plan();
    at.teams.push(team_report("d", "d", 4, 4));
    assert_eq!(what_and_why(&after_grace(&at, cluster)), what);
    // Nothing is removed from a team below its guarantee (it is owed room too), nor when
    // nothing moves.
    let mut within = fragmented_plan();
    within.teams.push(team_report("d", "d", 3, 4));
    let pass = after_grace(&within, cluster);
    assert_eq!(pass.evictions.len(), 1, "{:?}", pass.evictions);
}
