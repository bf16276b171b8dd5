//! Which workloads go: `victims::choose`.

use super::*;

/// A workload of `devices` devices with `priority`, started at `started`.
fn w(name: &str, devices: u64, priority: i32, started: &str) -> Workload {
    workload(name, &[(None, devices)], priority, started)
}

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
                nodes: vec![(None, *devices)],
                priority: *priority * 1000,
                priority_class: None,
                started: Timestamp::from_second(now.as_second() - age).ok(),
                terminating: *terminating,
                movable: true,
                evicted_before: 0,
                job: None,
            }).collect();
            borrower(&format!("t{t}"), *owes, *above, workloads)
        }).collect();
        let choice = choose(&borrowers, shortfall, min_runtime, now);
        let mut seen = BTreeSet::new();
        // Room above each borrower's guarantee once its workloads on their way out are counted.
        let mut room = room_left(&borrowers);
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

#[test]
fn of_equal_workloads_the_one_evicted_fewer_times_before_goes() {
    let newest_evicted_twice = Workload {
        evicted_before: 2,
        ..w("newest", 1, 0, "2026-06-01T11:00:00Z")
    };
    let b = borrower(
        "borrower",
        1,
        4,
        vec![
            w("older", 1, 0, "2026-06-01T09:00:00Z"),
            newest_evicted_twice,
            w("oldest", 1, 0, "2026-06-01T08:00:00Z"),
        ],
    );
    assert_eq!(chosen(std::slice::from_ref(&b), 1, 0), ["older"]);
    // Priority still comes first: a lower one goes though evicted before.
    let mut low = b;
    low.workloads[1].priority = -1;
    assert_eq!(chosen(&[low], 1, 0), ["newest"]);
}
