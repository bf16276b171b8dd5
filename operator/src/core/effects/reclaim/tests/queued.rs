//! Workloads queued for room (their claims charged, not allocated): removed with reclaim's
//! evictions when their team borrows every device they are charged.

use super::tracker::{Waiting, cluster, order, plan, team, team_report};
use super::*;

/// A Pod the scheduler has not placed yet, whose claim `gpu` (from template `t`) the
/// resourceclaim controller made as `claim`, or not yet (quota refused it).
pub(super) fn queued_pod(ns: &str, name: &str, job: &str, claim: Option<&str>) -> Pod {
    let statuses: Vec<Value> = (claim.iter())
        .map(|c| json!({"name": "gpu", "resourceClaimName": c}))
        .collect();
    pod(
        ns,
        name,
        Some(("Job", job)),
        json!({}),
        json!({"spec": {"resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "t"}]},
               "status": {"phase": "Pending", "startTime": null,
                          "resourceClaimStatuses": statuses}}),
    )
}

/// A claim of `devices` devices of [`CLASS`] that quota charged and nothing allocated yet.
pub(super) fn unallocated(ns: &str, name: &str, devices: usize) -> Arc<ClaimView> {
    let claim: ResourceClaim = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": ns},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": CLASS, "count": devices}}]}}
    }))
    .unwrap();
    Arc::new(ClaimView::project(&claim, &mut Names::default()))
}

#[test]
fn a_borrowers_workloads_queued_for_room_go_with_the_evictions_and_lose_no_work() {
    let (mut pods, mut claims) = cluster();
    let bound = |ns: &str, name: &str, job: &str| {
        let mut p = queued_pod(ns, name, job, Some(&format!("{name}-gpu")));
        p.spec.as_mut().unwrap().node_name = Some("n1".into());
        p
    };
    pods.extend(views(&[
        // The borrower's 8-device Job, charged while it could borrow, waiting for a node.
        queued_pod("b", "q-0", "q", Some("q-0-gpu")),
        // A 2-Pod Job: one Pod charged, the other's claim refused by quota.
        queued_pod("b", "g-0", "g", Some("g-0-gpu")),
        queued_pod("b", "g-1", "g", None),
        // A Job with a Pod running (its claim allocated) and one waiting: not queued whole.
        bound("b", "h-0", "h"),
        queued_pod("b", "h-1", "h", Some("h-1-gpu")),
        // A Job whose claim quota has not charged: nothing to give back.
        queued_pod("b", "r-0", "r", None),
        // The waiting team's own Pod, and another team's: not borrowers.
        queued_pod("o", "mine-0", "mine", Some("mine-0-gpu")),
        queued_pod("x", "x-0", "x", Some("x-0-gpu")),
    ]));
    claims.extend([
        unallocated("b", "q-0-gpu", 8),
        unallocated("b", "g-0-gpu", 4),
        claim("b", "h-0-gpu", 4, &["h-0"]),
        unallocated("b", "h-1-gpu", 4),
        unallocated("o", "mine-0-gpu", 8),
        unallocated("x", "x-0-gpu", 8),
    ]);
    let mut waiting = Waiting::new();
    let cluster = || (pods.clone(), claims.clone());
    assert!(
        (waiting.reclaimed_in(&plan(), 0, cluster()).evictions).is_empty(),
        "nothing goes within the grace period"
    );
    let reclaimed = waiting.reclaimed_in(&plan(), 30, cluster());
    let what: Vec<(&str, bool, u64)> = (reclaimed.evictions.iter())
        .map(|e| (e.workload.as_str(), e.why == EvictionWhy::Queued, e.devices))
        .collect();
    // The queued workloads first, each whole (before the evictions make room). h (a Pod
    // running, one waiting) is a running workload, started first: j3, the newest, covers the
    // 2 short.
    assert_eq!(
        what,
        [
            ("Job b/g", true, 4),
            ("Job b/q", true, 8),
            ("Job b/j3", false, 4)
        ]
    );
    let dequeued = &reclaimed.evictions[1];
    assert_eq!(dequeued.pods, [("b".to_owned(), "q-0".to_owned())]);
    let note = &eviction_events(dequeued, Ok(Taken::Evicted))[0];
    assert_eq!(note.reason, "Dequeued");
    assert!(
        note.note.starts_with(
            "removing Job b/q (1 Pod, waiting for 8 devices of a, priority 0) before it \
             starts: borrower is charged for it beyond its guarantee while owner needs devices \
             back (2 short; it holds 12 of a,"
        ),
        "{}",
        note.note
    );
    // Once evicted, and until the Pod cache shows it gone, it is not asked for again.
    (waiting.tracker).evicted(
        ("b".into(), "q-0".into()),
        waiting.t0 + Duration::from_secs(30),
    );
    (waiting.tracker).evicted(
        ("b".into(), "j3-0".into()),
        waiting.t0 + Duration::from_secs(30),
    );
    let again = waiting.reclaimed_in(&plan(), 31, cluster());
    let what: Vec<&str> = again
        .evictions
        .iter()
        .map(|e| e.workload.as_str())
        .collect();
    assert_eq!(what, ["Job b/g"], "g's eviction did not land: asked again");
}

#[test]
fn a_team_at_its_guarantee_loses_its_queued_workloads_with_the_evictions_and_one_below_keeps_them()
{
    // Besides the borrower, team x holds exactly its guarantee (4) and team y is 1 below it
    // (3 of 4); each has an 8-device Job charged and waiting for a node. All 8 of x's are
    // borrowed, and the scheduler would give it the room the evictions make; y is owed room.
    let (mut pods, mut claims) = cluster();
    pods.extend(views(&[
        queued_pod("x", "x-0", "x", Some("x-0-gpu")),
        queued_pod("y", "y-0", "y", Some("y-0-gpu")),
    ]));
    claims.extend([
        unallocated("x", "x-0-gpu", 8),
        unallocated("y", "y-0-gpu", 8),
    ]);
    let mut plan = plan();
    plan.teams.push(team_report("x", "x", 4, 4));
    plan.teams.push(team_report("y", "y", 3, 4));
    let mut waiting = Waiting::new();
    let cluster = || (pods.clone(), claims.clone());
    assert!((waiting.reclaimed_in(&plan, 0, cluster()).evictions).is_empty());
    let reclaimed = waiting.reclaimed_in(&plan, 30, cluster());
    let what: Vec<(&str, bool)> = (reclaimed.evictions.iter())
        .map(|e| (e.workload.as_str(), e.why == EvictionWhy::Queued))
        .collect();
    assert_eq!(what, [("Job x/x", true), ("Job b/j3", false)]);
    let note = &eviction_events(&reclaimed.evictions[0], Ok(Taken::Evicted))[0];
    assert!(
        note.note.contains(
            "x is charged for it beyond its guarantee while owner needs devices back (2 short; \
             it holds 4 of a, guaranteed 4)"
        ),
        "{}",
        note.note
    );
}

#[test]
fn a_queued_workload_is_asked_for_once_when_two_teams_wait_on_its_borrower() {
    let (mut pods, mut claims) = cluster();
    pods.extend(views(&[queued_pod("b", "q-0", "q", Some("q-0-gpu"))]));
    claims.push(unallocated("b", "q-0-gpu", 8));
    let second = ReclaimOrder {
        for_team: "owner2".into(),
        ..order()
    };
    let mut plan = plan();
    plan.reclaims.push(second);
    plan.teams.push(TeamReport {
        name: "owner2".into(),
        namespaces: vec!["o2".into()].into(),
        ..TeamReport::default()
    });
    let mut waiting = Waiting::new();
    let reclaim = json!({"enabled": true, "gracePeriodSeconds": 30});
    waiting.teams.push(team("owner2", reclaim));
    waiting.reclaimed_in(&plan, 0, (pods.clone(), claims.clone()));
    let reclaimed = waiting.reclaimed_in(&plan, 30, (pods, claims));
    let queued: Vec<&str> = (reclaimed.evictions.iter())
        .filter(|e| e.why == EvictionWhy::Queued)
        .map(|e| e.workload.as_str())
        .collect();
    assert_eq!(queued, ["Job b/q"]);
}
