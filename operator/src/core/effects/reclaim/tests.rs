use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaim;
use proptest::prelude::*;
use serde_json::{Value, json};

use super::victims::{Borrower, choose};
use super::workload::{PodView, Workload, WorkloadKey, workloads};
use super::*;
use crate::api::QuotaStatus;
use crate::core::plan::TeamReport;
use crate::core::plan::usage::Names;

const CLASS: &str = "a.teamgpu.io";

fn at(s: &str) -> Timestamp {
    s.parse().unwrap()
}

/// A Pod of namespace `ns` as the API server stores it: `owner` is its controller as
/// (kind, name), `labels` its labels.
fn pod(ns: &str, name: &str, owner: Option<(&str, &str)>, labels: Value, extra: Value) -> Pod {
    let owners: Vec<Value> = owner
        .map(|(kind, owner)| {
            json!({"apiVersion": "batch/v1", "kind": kind, "name": owner, "uid": "u", "controller": true})
        })
        .into_iter()
        .collect();
    let mut pod = json!({
        "metadata": {"name": name, "namespace": ns, "labels": labels, "ownerReferences": owners,
                     "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {"containers": []},
        "status": {"phase": "Running", "startTime": "2026-01-01T00:00:00Z"}
    });
    merge(&mut pod, extra);
    serde_json::from_value(pod).unwrap()
}

fn merge(into: &mut Value, from: Value) {
    match (into, from) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                merge(a.entry(k).or_insert(Value::Null), v);
            }
        }
        (a, b) => *a = b,
    }
}

/// An allocated claim of `devices` devices of [`CLASS`] reserved for `pods`.
fn claim(ns: &str, name: &str, devices: usize, pods: &[&str]) -> Arc<ClaimView> {
    let results: Vec<_> = (0..devices)
        .map(|i| json!({"request": "gpu", "driver": "gpu.nvidia.com", "pool": "n", "device": format!("{name}-{i}")}))
        .collect();
    let reserved: Vec<_> = (pods.iter())
        .map(|p| json!({"resource": "pods", "name": p, "uid": format!("u-{p}")}))
        .collect();
    let claim: ResourceClaim = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": ns},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": CLASS, "count": devices}}]}},
        "status": {"allocation": {"devices": {"results": results}}, "reservedFor": reserved}
    }))
    .unwrap();
    Arc::new(ClaimView::project(&claim, &mut Names::default()))
}

fn views(pods: &[Pod]) -> Vec<Arc<PodView>> {
    let mut names = Names::default();
    (pods.iter())
        .map(|p| Arc::new(PodView::project(p, &mut names)))
        .collect()
}

#[test]
fn a_pod_belongs_to_its_controller_its_label_or_itself() {
    let labels = |pairs: Value| pairs;
    let pods = [
        pod("b", "train-0", Some(("Job", "train")), json!({}), json!({})),
        pod("b", "train-1", Some(("Job", "train")), json!({}), json!({})),
        pod(
            "b",
            "web-x",
            Some(("ReplicaSet", "web")),
            json!({}),
            json!({}),
        ),
        pod(
            "b",
            "db-0",
            Some(("StatefulSet", "db")),
            json!({}),
            json!({}),
        ),
        pod("b", "solo", None, json!({}), json!({})),
        pod(
            "b",
            "sweep-a",
            None,
            labels(json!({"teamgpu.io/workload": "sweep"})),
            json!({}),
        ),
        pod(
            "b2",
            "sweep-b",
            Some(("Job", "other")),
            labels(json!({"teamgpu.io/workload": "sweep"})),
            json!({}),
        ),
        pod(
            "b",
            "js-0",
            Some(("Job", "js-workers-0")),
            labels(json!({"jobset.sigs.k8s.io/jobset-name": "js"})),
            json!({}),
        ),
        pod(
            "b",
            "lws-0-1",
            Some(("StatefulSet", "lws-0")),
            labels(json!({"leaderworkerset.sigs.k8s.io/name": "lws",
                          "leaderworkerset.sigs.k8s.io/group-index": "0"})),
            json!({}),
        ),
    ];
    let keys: Vec<String> = views(&pods)
        .iter()
        .map(|p| match &p.workload {
            WorkloadKey::Labelled(l) => format!("label {l}"),
            WorkloadKey::Owner { kind, name } => format!("{kind} {name}"),
            WorkloadKey::Alone => "alone".into(),
        })
        .collect();
    assert_eq!(
        keys,
        [
            "Job train",
            "Job train",
            "alone",
            "alone",
            "alone",
            "label sweep",
            "label sweep",
            "JobSet js",
            "LeaderWorkerSet lws/0"
        ]
    );
}

#[test]
fn a_workload_frees_the_claims_only_its_pods_hold() {
    let pods = views(&[
        pod("b", "train-0", Some(("Job", "train")), json!({}), json!({})),
        pod("b", "train-1", Some(("Job", "train")), json!({}), json!({})),
        // A launcher Pod without GPUs goes with its Job.
        pod(
            "b",
            "train-launcher",
            Some(("Job", "train")),
            json!({}),
            json!({}),
        ),
        pod("b", "solo", None, json!({}), json!({})),
        pod("b", "helper", None, json!({}), json!({})),
        pod(
            "b",
            "sweep-a",
            None,
            json!({"teamgpu.io/workload": "sweep"}),
            json!({}),
        ),
        pod(
            "b2",
            "sweep-b",
            None,
            json!({"teamgpu.io/workload": "sweep"}),
            json!({}),
        ),
        // Another team's Pod with the same label is not part of it.
        pod(
            "o",
            "sweep-c",
            None,
            json!({"teamgpu.io/workload": "sweep"}),
            json!({}),
        ),
    ]);
    let claims = [
        claim("b", "train-0-gpu", 4, &["train-0"]),
        claim("b", "train-1-gpu", 4, &["train-1"]),
        // Shared with a Pod of another workload: evicting one of them frees nothing.
        claim("b", "shared", 2, &["solo", "helper"]),
        claim("b", "solo-gpu", 1, &["solo"]),
        claim("b", "sweep-a-gpu", 2, &["sweep-a"]),
        claim("b2", "sweep-b-gpu", 2, &["sweep-b"]),
        claim("o", "sweep-c-gpu", 8, &["sweep-c"]),
    ];
    let team = ["b".to_owned(), "b2".to_owned()];
    let found: Vec<(String, u64, usize)> = workloads(&pods, &claims, &team, CLASS)
        .into_iter()
        .map(|w| (w.name, w.devices, w.pods.len()))
        .collect();
    assert_eq!(
        found,
        [
            ("workload sweep".to_owned(), 4, 2),
            ("Job b/train".to_owned(), 8, 3),
            ("Pod b/solo".to_owned(), 1, 1),
        ]
    );
    assert_eq!(label_elsewhere(&pods, &team, "sweep"), ["o"]);
    assert!(workloads(&pods, &claims, &team, "other.teamgpu.io").is_empty());
}

/// A workload of `devices` devices with `priority`, started at `started`.
fn w(name: &str, devices: u64, priority: i32, started: &str) -> Workload {
    Workload {
        name: name.into(),
        label: None,
        pods: vec![(Arc::from("b"), Arc::from(name))],
        devices,
        priority,
        priority_class: None,
        started: Some(at(started)),
        terminating: false,
    }
}

fn borrower(team: &str, owes: u64, above_guarantee: u64, workloads: Vec<Workload>) -> Borrower {
    Borrower {
        team: team.into(),
        owes,
        above_guarantee,
        workloads,
    }
}

const NOW: &str = "2026-06-01T12:00:00Z";

fn chosen(borrowers: &[Borrower], shortfall: u64, min_runtime: u64) -> Vec<String> {
    let choice = choose(borrowers, shortfall, min_runtime, at(NOW));
    choice.evict.into_iter().map(|(_, w)| w.name).collect()
}

#[test]
fn a_borrower_whose_workloads_are_all_larger_than_the_shortfall_still_gives_it_back() {
    // The owner is 2 short; the borrower holds 16 in 4-device claims, 8 above its guarantee.
    let four = |name, started| w(name, 4, 0, started);
    let b = borrower(
        "borrower",
        2,
        8,
        vec![
            four("j1", "2026-06-01T08:00:00Z"),
            four("j2", "2026-06-01T09:00:00Z"),
            four("j3", "2026-06-01T10:00:00Z"),
            four("j4", "2026-06-01T11:00:00Z"),
        ],
    );
    let choice = choose(&[b], 2, 0, at(NOW));
    let names: Vec<&str> = choice.evict.iter().map(|(_, w)| w.name.as_str()).collect();
    assert_eq!(names, ["j4"], "the most recently started of equals");
    assert_eq!((choice.freed, choice.uncovered), (4, 0));
}

#[test]
fn lower_priority_goes_first_then_the_smallest_overshoot_then_the_newest() {
    let b = |workloads| [borrower("b", 4, 16, workloads)];
    // Priority before everything: the low-priority 8-GPU job goes although a 4 would do.
    let mixed = b(vec![
        w("high-4", 4, 1000, "2026-06-01T11:00:00Z"),
        w("low-8", 8, 0, "2026-06-01T08:00:00Z"),
    ]);
    assert_eq!(chosen(&mixed, 4, 0), ["low-8"]);
    // Same priority: the one that frees the fewest devices beyond the shortfall, and of those
    // the one that covers the most of it.
    let sizes = b(vec![
        w("eight", 8, 0, "2026-06-01T11:00:00Z"),
        w("four", 4, 0, "2026-06-01T08:00:00Z"),
        w("two", 2, 0, "2026-06-01T10:00:00Z"),
    ]);
    assert_eq!(chosen(&sizes, 4, 0), ["four"]);
    assert_eq!(
        chosen(&sizes, 3, 0),
        ["four"],
        "4 frees 1 beyond 3, 8 frees 5"
    );
    assert_eq!(chosen(&sizes, 2, 0), ["two"]);
    assert_eq!(chosen(&sizes, 6, 0), ["four", "two"]);
}

#[test]
fn a_borrower_is_never_taken_below_its_guarantee() {
    // 3 above its guarantee: a 4-device workload would take it below.
    let b = [borrower(
        "b",
        2,
        3,
        vec![
            w("four", 4, 0, "2026-06-01T11:00:00Z"),
            w("one", 1, 0, "2026-06-01T08:00:00Z"),
        ],
    )];
    let choice = choose(&b, 2, 0, at(NOW));
    assert_eq!(chosen(&b, 2, 0), ["one"]);
    assert_eq!(
        (choice.freed, choice.uncovered, choice.eligible_at),
        (1, 1, None)
    );
}

#[test]
fn a_workload_younger_than_the_minimum_runtime_is_spared_until_then() {
    let b = [borrower(
        "b",
        4,
        8,
        vec![
            w("young", 4, 0, "2026-06-01T11:55:00Z"),
            w("old", 4, 1000, "2026-06-01T08:00:00Z"),
        ],
    )];
    // 10 minutes: the young one (5 minutes) is spared, the old one goes though it is important.
    assert_eq!(chosen(&b, 4, 600), ["old"]);
    // Both too young for 5 hours: nothing now, and when the first of them may go.
    let choice = choose(&b, 4, 5 * 3600, at(NOW));
    assert!(choice.evict.is_empty());
    assert_eq!(choice.eligible_at, Some(at("2026-06-01T13:00:00Z")));
}

#[test]
fn workloads_on_their_way_out_count_first_and_the_next_borrower_gives_the_rest() {
    let mut leaving = w("leaving", 2, 0, "2026-06-01T11:00:00Z");
    leaving.terminating = true;
    let borrowers = [
        borrower(
            "far-above",
            3,
            6,
            vec![leaving, w("a", 4, 0, "2026-06-01T10:00:00Z")],
        ),
        borrower("near", 1, 2, vec![w("n", 1, 0, "2026-06-01T10:00:00Z")]),
    ];
    let choice = choose(&borrowers, 4, 0, at(NOW));
    // 2 are on their way; far-above has 4 left above its guarantee.
    assert_eq!(choice.in_flight, 2);
    let names: Vec<(usize, &str)> = (choice.evict.iter())
        .map(|(b, w)| (*b, w.name.as_str()))
        .collect();
    // far-above owes 3: 2 leaving + a 4-device workload frees 6; nothing more is needed.
    assert_eq!(names, [(0, "a")]);
    assert_eq!(choice.uncovered, 0);
    // When the far borrower's workloads are too large, the next one gives, then the first
    // again up to its guarantee.
    let borrowers = [
        borrower(
            "far-above",
            3,
            3,
            vec![w("big", 4, 0, "2026-06-01T10:00:00Z")],
        ),
        borrower(
            "near",
            1,
            2,
            vec![
                w("n1", 1, 0, "2026-06-01T10:00:00Z"),
                w("n2", 1, 0, "2026-06-01T11:00:00Z"),
            ],
        ),
    ];
    assert_eq!(chosen(&borrowers, 2, 0), ["n2", "n1"]);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Whatever the workloads: no borrower below its guarantee, no workload twice, every
    /// workload taken was still needed when it was taken, and what stays short could not be
    /// covered by any workload left that may be taken.
    #[test]
    fn reclaim_takes_what_is_needed_and_never_more(
        shortfall in 0u64..24,
        min_runtime in prop_oneof![Just(0u64), 0u64..7200],
        teams in prop::collection::vec(
            (0u64..12, 0u64..20, prop::collection::vec((1u64..=8, -1i32..=1, 0i64..10_000, any::<bool>()), 0..6)),
            1..4,
        ),
    ) {
        let now = at(NOW);
        let borrowers: Vec<Borrower> = teams.iter().enumerate().map(|(t, (owes, above, ws))| {
            let workloads = ws.iter().enumerate().map(|(i, (devices, priority, age, terminating))| Workload {
                name: format!("t{t}-w{i}"),
                label: None,
                pods: vec![(Arc::from("ns"), Arc::from(format!("t{t}-w{i}").as_str()))],
                devices: *devices,
                priority: *priority * 1000,
                priority_class: None,
                started: Timestamp::from_second(now.as_second() - age).ok(),
                terminating: *terminating,
            }).collect();
            borrower(&format!("t{t}"), *owes, *above, workloads)
        }).collect();
        let choice = choose(&borrowers, shortfall, min_runtime, now);
        let mut seen = BTreeSet::new();
        // Room above each borrower's guarantee once its workloads on their way out are counted.
        let mut room: Vec<u64> = (borrowers.iter())
            .map(|x| {
                let leaving: u64 = x.workloads.iter().filter(|w| w.terminating).map(|w| w.devices).sum();
                x.above_guarantee.saturating_sub(leaving)
            })
            .collect();
        let mut left = shortfall.saturating_sub(choice.in_flight);
        for (b, w) in &choice.evict {
            prop_assert!(left > 0, "{} taken when nothing was short", w.name);
            prop_assert!(!w.terminating);
            prop_assert!(seen.insert(w.name.clone()), "{} taken twice", w.name);
            prop_assert!(u64::try_from(now.as_second() - w.started.unwrap().as_second()).unwrap() >= min_runtime);
            prop_assert!(w.devices <= room[*b], "{} taken below its guarantee", borrowers[*b].team);
            room[*b] -= w.devices;
            left = left.saturating_sub(w.devices);
        }
        prop_assert_eq!(left, choice.uncovered);
        if choice.uncovered > 0 {
            for (b, x) in borrowers.iter().enumerate() {
                for w in &x.workloads {
                    let old = u64::try_from(now.as_second() - w.started.unwrap().as_second()).unwrap() >= min_runtime;
                    prop_assert!(w.terminating || seen.contains(&w.name) || !old || w.devices > room[b],
                        "{} could have covered more", w.name);
                }
            }
        }
    }
}

/// Team `owner` (namespace `o`, guaranteed 8) waits for 2 devices of sharing policy `a`;
/// `borrower` (namespace `b`, guaranteed 4) holds 12 in 4-device Jobs.
fn plan() -> Plan {
    let team = |name: &str, namespace: &str, allocated, effective_guarantee| TeamReport {
        name: name.into(),
        namespaces: vec![namespace.into()],
        quotas: vec![QuotaStatus {
            sharing_policy: "a".into(),
            allocated,
            effective_guarantee,
            weight: 1,
            ..QuotaStatus::default()
        }],
        ..TeamReport::default()
    };
    Plan {
        teams: vec![team("owner", "o", 6, 8), team("borrower", "b", 12, 4)],
        reclaims: vec![order()],
        ..Plan::default()
    }
}

fn order() -> ReclaimOrder {
    ReclaimOrder {
        sharing_policy: "a".into(),
        borrower: "borrower".into(),
        devices: 2,
        for_team: "owner".into(),
    }
}

fn team(name: &str, reclaim: Value) -> TeamGpuPolicy {
    serde_json::from_value(json!({
        "apiVersion": "teamgpu.io/v1alpha1", "kind": "TeamGpuPolicy",
        "metadata": {"name": name, "uid": format!("u-{name}")},
        "spec": {"reclaim": reclaim}
    }))
    .unwrap()
}

/// Three 4-device Jobs of one Pod each, started an hour apart (j3 newest, 10:00).
fn cluster() -> (Vec<Arc<PodView>>, Vec<Arc<ClaimView>>) {
    let started = |h: u32| json!({"status": {"startTime": format!("2026-06-01T{h:02}:00:00Z")}});
    let pods = views(&[
        pod("b", "j1-0", Some(("Job", "j1")), json!({}), started(8)),
        pod("b", "j2-0", Some(("Job", "j2")), json!({}), started(9)),
        pod("b", "j3-0", Some(("Job", "j3")), json!({}), started(10)),
    ]);
    let claims = vec![
        claim("b", "j1-0-gpu", 4, &["j1-0"]),
        claim("b", "j2-0-gpu", 4, &["j2-0"]),
        claim("b", "j3-0-gpu", 4, &["j3-0"]),
    ];
    (pods, claims)
}

const OFF: ReclaimDefaults = ReclaimDefaults {
    enabled: false,
    grace: Duration::from_secs(120),
    min_runtime: Duration::ZERO,
};

/// A tracker for the waiting team, from `t0`.
struct Waiting {
    teams: Vec<TeamGpuPolicy>,
    defaults: ReclaimDefaults,
    tracker: ReclaimTracker,
    t0: Instant,
}

impl Waiting {
    /// The team opted in with a grace period of 30 s.
    fn new() -> Self {
        Self::with(json!({"enabled": true, "gracePeriodSeconds": 30}), OFF)
    }

    /// The team's `spec.reclaim` is `reclaim`; the operator's defaults are `defaults`.
    fn with(reclaim: Value, defaults: ReclaimDefaults) -> Self {
        Waiting {
            teams: vec![team("owner", reclaim), team("borrower", json!({}))],
            defaults,
            tracker: ReclaimTracker::default(),
            t0: Instant::now(),
        }
    }

    /// What a pass of `plan` at `secs` after `t0` (and after 12:00 on the wall) asks for.
    fn reclaimed(&mut self, plan: &Plan, secs: u64) -> Reclaimed {
        let now = self.t0 + Duration::from_secs(secs);
        let wall = Timestamp::from_second(at(NOW).as_second() + secs as i64).unwrap();
        let (pods, claims) = cluster();
        let input = ReclaimInput {
            plan,
            teams: &self.teams,
            claims: &claims,
            pods: &pods,
        };
        self.tracker.evictions(input, self.defaults, now, wall)
    }

    /// The workloads evicted in a pass of `plan` at `secs` after `t0`.
    fn pass(&mut self, plan: &Plan, secs: u64) -> Vec<String> {
        let reclaimed = self.reclaimed(plan, secs);
        reclaimed
            .evictions
            .iter()
            .map(|e| e.workload.clone())
            .collect()
    }

    fn wakes_at(&self) -> Option<u64> {
        let at = self.tracker.next_attempt()?;
        Some(at.duration_since(self.t0).as_secs())
    }
}

#[test]
fn an_opted_in_team_evicts_once_its_grace_period_has_passed() {
    let mut waiting = Waiting::new();
    assert!(waiting.pass(&plan(), 0).is_empty());
    assert_eq!(waiting.wakes_at(), Some(30), "woken when the grace ends");
    assert!(waiting.pass(&plan(), 29).is_empty());
    // 2 short, every Job holds 4: the newest Job goes whole.
    assert_eq!(waiting.pass(&plan(), 30), ["Job b/j3"]);
    assert_eq!(waiting.wakes_at(), None);
    // A refused eviction wakes the loop 10 s later.
    waiting
        .tracker
        .refused(waiting.t0 + Duration::from_secs(31));
    assert_eq!(waiting.wakes_at(), Some(41));
    waiting
        .tracker
        .clear_due(waiting.t0 + Duration::from_secs(41));
    assert_eq!(waiting.wakes_at(), None);
}

#[test]
fn a_reclaim_no_longer_ordered_starts_its_grace_period_again() {
    let mut waiting = Waiting::new();
    waiting.pass(&plan(), 0);
    let settled = Plan {
        reclaims: Vec::new(),
        ..plan()
    };
    assert!(waiting.pass(&settled, 10).is_empty());
    assert_eq!(waiting.wakes_at(), None);
    assert!(
        waiting.pass(&plan(), 30).is_empty(),
        "the grace period starts again at 30 s"
    );
    assert_eq!(waiting.wakes_at(), Some(60));
}

#[test]
fn a_team_reclaims_only_when_it_or_the_operators_default_opts_in() {
    let evicted = |reclaim, defaults, secs| {
        let mut waiting = Waiting::with(reclaim, defaults);
        waiting.pass(&plan(), 0);
        waiting.pass(&plan(), secs)
    };
    let on = ReclaimDefaults {
        enabled: true,
        ..OFF
    };
    let none = Vec::<String>::new();
    assert_eq!(evicted(json!({}), OFF, 120), none);
    assert_eq!(evicted(json!({}), on, 120), ["Job b/j3"]);
    assert_eq!(evicted(json!({"enabled": false}), on, 120), none);
    assert_eq!(evicted(json!({"enabled": true}), OFF, 120), ["Job b/j3"]);
    // The operator's grace period (120 s) applies to a team that sets none.
    assert_eq!(evicted(json!({}), on, 119), none);
}

#[test]
fn a_minimum_runtime_spares_young_workloads_and_says_until_when() {
    // The Jobs started at 08:00, 09:00 and 10:00; it is 12:00. With 3.5 hours, only j1 may go.
    let mut waiting = Waiting::with(
        json!({"enabled": true, "gracePeriodSeconds": 0, "minRuntimeSeconds": 12600}),
        OFF,
    );
    assert_eq!(waiting.pass(&plan(), 0), ["Job b/j1"]);
    // With 5 hours, none may: the team is told when the first may go, and the loop wakes then.
    let mut waiting = Waiting::with(
        json!({"enabled": true, "gracePeriodSeconds": 0, "minRuntimeSeconds": 18000}),
        OFF,
    );
    let reclaimed = waiting.reclaimed(&plan(), 0);
    assert!(reclaimed.evictions.is_empty());
    assert_eq!(
        waiting.wakes_at(),
        Some(3600),
        "j1 reaches 5 hours at 13:00"
    );
    let notes: Vec<(&str, Option<&str>, &str)> = (reclaimed.events.iter())
        .map(|e| (e.reason, e.regarding.namespace.as_deref(), e.note.as_str()))
        .collect();
    let note = "2 devices of a are still short: the borrowers' workloads that could free them \
                have run less than the minimum runtime (18000 s); reclaim takes them from \
                2026-06-01T13:00:00Z";
    let copy = format!("TeamGpuPolicy owner: {note}");
    assert_eq!(
        notes,
        [
            ("ReclaimWaiting", Some("o"), copy.as_str()),
            ("ReclaimWaiting", None, note)
        ]
    );
    // The operator's default applies to a team that sets none.
    let mut waiting = Waiting::with(
        json!({"enabled": true, "gracePeriodSeconds": 0}),
        ReclaimDefaults {
            min_runtime: Duration::from_secs(12600),
            ..OFF
        },
    );
    assert_eq!(waiting.pass(&plan(), 0), ["Job b/j1"]);
}

#[test]
fn an_eviction_is_told_on_the_pods_the_borrower_and_in_both_teams_namespaces() {
    let mut waiting = Waiting::with(json!({"enabled": true, "gracePeriodSeconds": 0}), OFF);
    let reclaimed = waiting.reclaimed(&plan(), 0);
    let [eviction] = &reclaimed.evictions[..] else {
        panic!("one eviction: {reclaimed:?}")
    };
    assert_eq!(eviction.pods, [("b".to_owned(), "j3-0".to_owned())]);
    let reference =
        |api_version: &str, kind: &str, namespace: Option<&str>, name: &str| ObjectReference {
            api_version: Some(api_version.into()),
            kind: Some(kind.into()),
            namespace: namespace.map(Into::into),
            name: Some(name.into()),
            ..Default::default()
        };
    let borrower = ObjectReference {
        uid: Some("u-borrower".into()),
        ..reference("teamgpu.io/v1alpha1", "TeamGpuPolicy", None, "borrower")
    };
    let told = |reason: &'static str, note: &str| -> Vec<Event> {
        [
            (reference("v1", "Pod", Some("b"), "j3-0"), String::new()),
            (borrower.clone(), String::new()),
            (
                reference("v1", "ResourceQuota", Some("b"), "teamgpu"),
                "TeamGpuPolicy borrower: ".to_owned(),
            ),
            (
                reference("v1", "ResourceQuota", Some("o"), "teamgpu"),
                "TeamGpuPolicy owner: ".to_owned(),
            ),
        ]
        .into_iter()
        .map(|(regarding, prefix)| Event {
            regarding,
            type_: EventType::Warning,
            reason,
            action: "Evict",
            note: format!("{prefix}{note}"),
        })
        .collect()
    };
    assert_eq!(
        eviction_events(eviction, Ok(())),
        told(
            "Reclaimed",
            "evicting Job b/j3 (1 Pod, 4 devices of a, priority 0): borrower holds devices above \
             its guarantee that owner needs back (2 short)"
        )
    );
    assert_eq!(
        eviction_events(eviction, Err("a PodDisruptionBudget")),
        told(
            "EvictionRefused",
            "could not evict Job b/j3 (1 Pod, 4 devices of a, priority 0) to give devices back \
             to owner: a PodDisruptionBudget; no Pod of it was evicted; retrying"
        )
    );
}
