//! Which workloads go so that claims fit a node: `nodes::choose_on_nodes`.

use std::collections::BTreeMap;

use super::*;
use crate::core::effects::reclaim::nodes::{Free, choose_on_nodes};

fn node(n: &str) -> Option<Arc<str>> {
    Some(Arc::from(n))
}

/// A workload of `devices` on each node of `on`, with `priority`, started at `started`.
fn w(name: &str, on: &[(&str, u64)], priority: i32, started: &str) -> Workload {
    let on: Vec<(Option<&str>, u64)> = on.iter().map(|(n, d)| (Some(*n), *d)).collect();
    workload(name, &on, priority, started)
}

fn free(of: &[(&str, u64)]) -> Free {
    of.iter().map(|(n, f)| (node(n), *f)).collect()
}

fn names(choice: &Choice) -> Vec<&str> {
    let mut out: Vec<&str> = choice.evict.iter().map(|(_, w)| w.name.as_str()).collect();
    out.sort_unstable();
    out
}

/// 4 nodes of 8 with 7 one-device workloads each (`n0-0` .. `n3-6`), one device free on each;
/// those of `low` have priority -1, the others 0; node `i`'s started at hour 8 + i.
fn fragmented(low: &str) -> (Vec<Borrower>, Free) {
    let workloads = (0..4)
        .flat_map(|n| {
            (0..7).map(move |i| {
                let name = format!("n{n}-{i}");
                let priority = if format!("node-{n}") == low { -1 } else { 0 };
                let started = format!("2026-06-01T{:02}:00:0{i}Z", 8 + n);
                w(&name, &[(&format!("node-{n}"), 1)], priority, &started)
            })
        })
        .collect();
    let free = free(&[("node-0", 1), ("node-1", 1), ("node-2", 1), ("node-3", 1)]);
    (vec![borrower("borrower", 8, 28, workloads)], free)
}

#[test]
fn an_eight_device_claim_gets_a_whole_node_of_the_lowest_priority() {
    let (borrowers, free) = fragmented("node-1");
    let choice = choose_on_nodes(&borrowers, &free, &[8], 0, at(NOW));
    // 7 devices of one node, not 8 of 8 nodes: node-1's, the lowest priority.
    let expected: Vec<String> = (0..7).map(|i| format!("n1-{i}")).collect();
    assert_eq!(names(&choice), expected);
    assert_eq!((choice.freed, choice.uncovered), (7, 0));
    assert_eq!(choice.placed, [(8, node("node-1"))]);
}

#[test]
fn of_equal_priorities_the_most_recently_started_node_goes() {
    let (borrowers, free) = fragmented("none");
    let choice = choose_on_nodes(&borrowers, &free, &[8], 0, at(NOW));
    // node-3's workloads started last (hour 11).
    assert_eq!(choice.placed, [(8, node("node-3"))]);
    assert!(names(&choice).iter().all(|n| n.starts_with("n3-")));
    assert_eq!(choice.evict.len(), 7);
}

#[test]
fn nothing_is_evicted_when_the_claims_already_fit() {
    let (borrowers, _) = fragmented("node-1");
    let roomy = free(&[("node-0", 4), ("node-1", 8)]);
    let choice = choose_on_nodes(&borrowers, &roomy, &[8, 4], 0, at(NOW));
    assert!(choice.evict.is_empty());
    assert_eq!(choice.placed, [(8, node("node-1")), (4, node("node-0"))]);
}

#[test]
fn a_workload_on_several_nodes_frees_devices_on_each_for_the_next_claims() {
    // A 2-node job (4 + 4) and two single-node 4s; the owner waits for two claims of 4 on
    // nodes with nothing free. The 2-node job is the lowest priority: it makes room for both.
    let b = [borrower(
        "b",
        8,
        16,
        vec![
            w(
                "gang",
                &[("node-a", 4), ("node-b", 4)],
                -1,
                "2026-06-01T09:00:00Z",
            ),
            w("a4", &[("node-a", 4)], 0, "2026-06-01T11:00:00Z"),
            w("b4", &[("node-b", 4)], 0, "2026-06-01T11:00:00Z"),
        ],
    )];
    let choice = choose_on_nodes(&b, &free(&[]), &[4, 4], 0, at(NOW));
    assert_eq!(names(&choice), ["gang"]);
    assert_eq!(choice.placed, [(4, node("node-a")), (4, node("node-b"))]);
}

#[test]
fn never_below_a_guarantee_and_never_too_young() {
    // 7 above its guarantee: node-0's 8 workloads cannot all go; node-1's 4, of which 3 are
    // too young for 10 minutes, leave it 3 short.
    let mut workloads: Vec<Workload> = (0..8)
        .map(|i| {
            w(
                &format!("a{i}"),
                &[("node-0", 1)],
                0,
                "2026-06-01T08:00:00Z",
            )
        })
        .collect();
    workloads.push(w("b-old", &[("node-1", 1)], 0, "2026-06-01T08:00:00Z"));
    for i in 0..3 {
        workloads.push(w(
            &format!("b{i}"),
            &[("node-1", 1)],
            0,
            "2026-06-01T11:55:00Z",
        ));
    }
    let b = [borrower("b", 8, 7, workloads)];
    let choice = choose_on_nodes(&b, &free(&[("node-1", 4)]), &[8], 600, at(NOW));
    assert!(choice.evict.is_empty(), "{:?}", names(&choice));
    assert_eq!(choice.uncovered, 8);
    assert_eq!(choice.eligible_at, Some(at("2026-06-01T12:05:00Z")));
    // Once they are old enough, node-1 is emptied: 4 free + 4 evicted.
    let choice = choose_on_nodes(&b, &free(&[("node-1", 4)]), &[8], 0, at(NOW));
    assert_eq!(names(&choice), ["b-old", "b0", "b1", "b2"]);
}

#[test]
fn workloads_on_their_way_out_make_room_first() {
    let mut leaving = w("leaving", &[("node-0", 4)], 0, "2026-06-01T08:00:00Z");
    leaving.terminating = true;
    let b = [borrower(
        "b",
        4,
        8,
        vec![
            leaving,
            w("stay", &[("node-0", 4)], 0, "2026-06-01T08:00:00Z"),
            w("other", &[("node-1", 4)], 0, "2026-06-01T09:00:00Z"),
        ],
    )];
    let choice = choose_on_nodes(&b, &free(&[("node-1", 4)]), &[4, 4], 0, at(NOW));
    assert!(choice.evict.is_empty());
    assert_eq!(choice.in_flight, 4);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Whatever the workloads and nodes: no borrower below its guarantee, no workload twice, none
    /// too young or already leaving; every claim not left uncovered fits the node it is placed
    /// on once the chosen workloads are gone; nothing is evicted when every claim has a node of
    /// its own; and a single claim left uncovered could not have been placed by evicting any
    /// one workload that may be taken.
    #[test]
    fn after_the_evictions_every_placed_claim_fits_its_node(
        min_runtime in prop_oneof![Just(0u64), 0u64..7200],
        node_free in prop::collection::vec(0u64..6, 1..5),
        claims in prop::collection::vec(1u32..=8, 1..4),
        teams in prop::collection::vec(
            (0u64..12, 0u64..20, prop::collection::vec(
                (1u64..=4, 0usize..4, prop::option::of((1u64..=4, 0usize..4)), -1i32..=1, 0i64..10_000, any::<bool>()),
                0..4)),
            1..4,
        ),
    ) {
        let now = at(NOW);
        let nodes = node_free.len();
        let name_of = |n: usize| format!("node-{}", n % nodes);
        let free: Free = node_free.iter().enumerate().map(|(n, f)| (node(&name_of(n)), *f)).collect();
        let borrowers: Vec<Borrower> = teams.iter().enumerate().map(|(t, (owes, above, ws))| {
            let workloads = ws.iter().enumerate().map(|(i, (d, n, also, priority, age, terminating))| {
                let mut on: BTreeMap<String, u64> = BTreeMap::from([(name_of(*n), *d)]);
                if let Some((d2, n2)) = also {
                    *on.entry(name_of(*n2)).or_default() += d2;
                }
                let on: Vec<(&str, u64)> = on.iter().map(|(n, d)| (n.as_str(), *d)).collect();
                let started = Timestamp::from_second(now.as_second() - age).unwrap().to_string();
                let mut w = w(&format!("t{t}-w{i}"), &on, *priority, &started);
                w.terminating = *terminating;
                w
            }).collect();
            borrower(&format!("t{t}"), *owes, *above, workloads)
        }).collect();
        let mut claims = claims;
        claims.sort_unstable_by(|a, b| b.cmp(a));
        let choice = choose_on_nodes(&borrowers, &free, &claims, min_runtime, now);

        let mut seen = BTreeSet::new();
        let mut room = room_left(&borrowers);
        let mut after = free.clone();
        for x in &borrowers {
            for w in x.workloads.iter().filter(|w| w.terminating) {
                for (n, d) in &w.nodes { *after.entry(n.clone()).or_default() += d; }
            }
        }
        for (b, w) in &choice.evict {
            prop_assert!(!w.terminating);
            prop_assert!(seen.insert(w.name.clone()), "{} taken twice", w.name);
            prop_assert!(u64::try_from(now.as_second() - w.started.unwrap().as_second()).unwrap() >= min_runtime);
            prop_assert!(w.devices <= room[*b], "{} taken below its guarantee", borrowers[*b].team);
            room[*b] -= w.devices;
            for (n, d) in &w.nodes { *after.entry(n.clone()).or_default() += d; }
        }
        let placed: u64 = choice.placed.iter().map(|(s, _)| s).sum();
        let wanted: u64 = claims.iter().map(|c| u64::from(*c)).sum();
        prop_assert_eq!(placed + choice.uncovered, wanted);
        let mut used: BTreeMap<Option<Arc<str>>, u64> = BTreeMap::new();
        for (size, n) in &choice.placed {
            *used.entry(n.clone()).or_default() += size;
        }
        for (n, u) in &used {
            prop_assert!(*u <= after.get(n).copied().unwrap_or(0), "{:?} holds {} of {:?}", n, u, after);
        }
        // Claims with a node each, with room on it, need nothing.
        let own: Vec<u32> = node_free.iter().filter(|f| **f > 0).map(|f| u32::try_from(*f).unwrap()).collect();
        let calm = choose_on_nodes(&borrowers, &free, &own, min_runtime, now);
        prop_assert!(calm.evict.is_empty() && calm.uncovered == 0);
        if claims.len() == 1 && choice.uncovered > 0 {
            let size = u64::from(claims[0]);
            for (b, x) in borrowers.iter().enumerate() {
                for w in x.workloads.iter().filter(|w| !w.terminating && w.devices <= room[b]) {
                    let old = u64::try_from(now.as_second() - w.started.unwrap().as_second()).unwrap() >= min_runtime;
                    for (n, d) in &w.nodes {
                        prop_assert!(!old || after.get(n).copied().unwrap_or(0) + d < size,
                            "{} on {:?} could have made room", w.name, n);
                    }
                }
            }
        }
    }
}

#[test]
fn of_pods_started_in_the_same_second_the_last_name_goes_whatever_its_node() {
    // Start times are whole seconds: job-07 on node-a and job-08 on node-b started together.
    let started = "2026-06-01T08:00:00Z";
    let workloads = vec![
        w("job-07", &[("node-a", 1)], 0, started),
        w("job-08", &[("node-b", 1)], 0, started),
    ];
    let borrowers = vec![borrower("borrower", 1, 2, workloads)];
    let free = free(&[("node-a", 0), ("node-b", 0)]);
    let choice = choose_on_nodes(&borrowers, &free, &[1], 0, at(NOW));
    assert_eq!(names(&choice), ["job-08"]);
}

#[test]
fn of_equal_nodes_the_one_whose_workloads_were_evicted_fewer_times_goes() {
    let (mut borrowers, free) = fragmented("none");
    // node-3's would go (started last), but one of them was evicted twice lately.
    let twice = (borrowers[0].workloads.iter_mut()).find(|w| w.name == "n3-4");
    twice.unwrap().evicted_before = 2;
    let choice = choose_on_nodes(&borrowers, &free, &[8], 0, at(NOW));
    let expected: Vec<String> = (0..7).map(|i| format!("n2-{i}")).collect();
    assert_eq!(names(&choice), expected);
}
