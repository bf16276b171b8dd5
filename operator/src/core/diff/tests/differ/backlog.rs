//! The differ's backlog: a batch limit hands out the rest of a long converge in later calls.

use std::collections::VecDeque;

use super::*;

#[test]
fn a_batch_limit_hands_out_the_rest_in_later_calls_a_change_found_between_first() {
    let mut differ = Differ::with_batch_limit(2);
    let namespaces = ["a", "b", "c", "d", "e"];
    let objects = |devices: [u8; 5]| DesiredObjects {
        resource_quotas: (namespaces.iter().zip(devices))
            .map(|(ns, d)| Arc::new(desired_quota(ns, d)))
            .collect(),
        ..DesiredObjects::default()
    };
    let namespaces_of = |writes: &[Write]| -> Vec<String> {
        (writes.iter())
            .map(|w| w.key().namespace.clone().unwrap_or_default())
            .collect()
    };
    // What the server holds once the writes handed out so far are done.
    let stored = |done: &[(&str, u8)]| -> Vec<LiveObject> {
        (done.iter())
            .map(|(ns, d)| LiveObject::owned(Kind::ResourceQuota, &live_quota(ns, *d, false)))
            .collect()
    };
    let first = differ.writes(&objects([1; 5]));
    assert_eq!(namespaces_of(&first), ["a", "b"]);
    assert_eq!(differ.backlog(), 3);
    // a and b come back from the server; meanwhile e's quota changed (a claim moved its
    // team's share): e goes first, before the backlog's c.
    differ.update_live(Kind::ResourceQuota, stored(&[("a", 1), ("b", 1)]));
    let second = differ.writes(&objects([1, 1, 1, 1, 2]));
    assert_eq!(namespaces_of(&second), ["e", "c"]);
    let [Write::Apply { object, .. }, _] = &second[..] else {
        panic!("{second:?}")
    };
    assert_eq!(
        object.to_value()["spec"]["hard"]["x.deviceclass.resource.k8s.io/devices"],
        "2",
        "e as it is wanted now"
    );
    differ.update_live(
        Kind::ResourceQuota,
        stored(&[("a", 1), ("b", 1), ("c", 1), ("e", 2)]),
    );
    // d waited in the backlog: it is handed out without being asked for again.
    assert_eq!(
        namespaces_of(&differ.writes_again(&objects([1, 1, 1, 1, 2]))),
        ["d"]
    );
    assert_eq!(differ.backlog(), 0);
    differ.update_live(
        Kind::ResourceQuota,
        stored(&[("a", 1), ("b", 1), ("c", 1), ("d", 1), ("e", 2)]),
    );
    assert_eq!(differ.writes_again(&objects([1, 1, 1, 1, 2])), []);
}

#[test]
fn a_write_in_the_backlog_that_the_server_came_to_hold_is_dropped() {
    let mut differ = Differ::with_batch_limit(1);
    let objects = DesiredObjects {
        resource_quotas: vec![
            Arc::new(desired_quota("a", 1)),
            Arc::new(desired_quota("b", 1)),
        ],
        ..DesiredObjects::default()
    };
    assert_eq!(differ.writes(&objects).len(), 1);
    assert_eq!(differ.backlog(), 1);
    // Someone else (an operator before a restart) wrote b as wanted, and a is done.
    differ.update_live(
        Kind::ResourceQuota,
        [
            LiveObject::owned(Kind::ResourceQuota, &live_quota("a", 1, false)),
            LiveObject::owned(Kind::ResourceQuota, &live_quota("b", 1, false)),
        ],
    );
    assert_eq!(differ.writes(&objects), []);
    assert_eq!(differ.backlog(), 0);
}

#[test]
fn a_prefetched_write_is_left_alone_until_reported_then_what_changed_meanwhile_is_written() {
    let mut differ = Differ::with_batch_limit(1);
    let objects = |b: u8| DesiredObjects {
        resource_quotas: vec![
            Arc::new(desired_quota("a", 1)),
            Arc::new(desired_quota("b", b)),
            Arc::new(desired_quota("c", 1)),
        ],
        ..DesiredObjects::default()
    };
    let stored = |done: &[(&str, u8)]| -> Vec<LiveObject> {
        (done.iter())
            .map(|(ns, d)| LiveObject::owned(Kind::ResourceQuota, &live_quota(ns, *d, false)))
            .collect()
    };
    let namespaces_of = |writes: &[Write]| -> Vec<String> {
        (writes.iter())
            .map(|w| w.key().namespace.clone().unwrap_or_default())
            .collect()
    };
    assert_eq!(namespaces_of(&differ.writes(&objects(1))), ["a"]);
    // b follows a without a pass between them.
    assert_eq!(namespaces_of(&differ.prefetch(1)), ["b"]);
    assert!(differ.writes_wait());
    // a is done and b in flight, its apply already stored; meanwhile b is wanted with 2. The
    // pass leaves b alone (a write now would race the one in flight) and hands out c.
    differ.update_live(Kind::ResourceQuota, stored(&[("a", 1), ("b", 1)]));
    assert_eq!(namespaces_of(&differ.writes(&objects(2))), ["c"]);
    // Wake-ups and Events still wait: the backlog is empty, but b is in flight.
    assert_eq!(differ.backlog(), 0);
    assert!(differ.writes_wait());
    // b's batch is reported: b is compared, and written as it is wanted now.
    differ.prefetch_done();
    differ.update_live(Kind::ResourceQuota, stored(&[("a", 1), ("b", 1), ("c", 1)]));
    let last = differ.writes_again(&objects(2));
    let [Write::Apply { key, object }] = &last[..] else {
        panic!("{last:?}")
    };
    assert_eq!(key.namespace.as_deref(), Some("b"));
    assert_eq!(
        object.to_value()["spec"]["hard"]["x.deviceclass.resource.k8s.io/devices"],
        "2"
    );
    assert!(!differ.writes_wait());
}

/// Batches handed out and not reported, first the one performed: (writes, prefetched,
/// performed already).
type Sent = VecDeque<(Vec<Write>, bool, bool)>;

/// Hands out batches as the operator does until none is left, and gives what was written: a
/// pass's batch, with `prefetch` the backlog's next writes (that many) behind it, a pass only
/// while nothing but a prefetch is in flight. `perform` is the server doing a batch (what it wrote); with
/// `echo_early` a prefetch's watch events come before the pass that runs during it.
fn converge(
    differ: &mut Differ,
    objects: &DesiredObjects,
    limit: usize,
    (prefetch, echo_early): (Option<usize>, bool),
    perform: &mut impl FnMut(&[Write], &mut Differ) -> Vec<(ObjectKey, bool)>,
) -> Result<Vec<(ObjectKey, bool)>, TestCaseError> {
    let top_up = |differ: &mut Differ, sent: &mut Sent| {
        if let Some(size) = prefetch
            && sent.len() == 1
            && !sent[0].1
        {
            let batch = differ.prefetch(size);
            if !batch.is_empty() {
                sent.push_back((batch, true, false));
            }
        }
    };
    let mut written = Vec::new();
    let mut sent = Sent::new();
    let mut next = differ.writes(objects);
    for _ in 0..1000 {
        prop_assert!(next.len() <= limit);
        if !next.is_empty() {
            sent.push_back((next, false, false));
        }
        top_up(differ, &mut sent);
        let Some((batch, prefetched, performed)) = sent.pop_front() else {
            return Ok(written);
        };
        let most = if prefetched {
            prefetch.unwrap_or(0)
        } else {
            limit
        };
        prop_assert!(batch.len() <= most);
        if !performed {
            written.extend(perform(&batch, differ));
        }
        if prefetched {
            differ.prefetch_done();
        }
        top_up(differ, &mut sent);
        // A pass runs when nothing is in flight but a prefetch.
        next = Vec::new();
        if sent.iter().all(|(_, prefetched, _)| *prefetched) && sent.len() < 2 {
            if echo_early && let Some((batch, _, performed)) = sent.front_mut() {
                written.extend(perform(batch, differ));
                *performed = true;
            }
            next = differ.writes_again(objects);
            let in_flight: BTreeSet<&ObjectKey> = sent
                .iter()
                .flat_map(|(b, _, _)| b.iter().map(Write::key))
                .collect();
            prop_assert!(
                next.iter().all(|w| !in_flight.contains(w.key())),
                "{next:?}"
            );
        }
    }
    Err(TestCaseError::fail(format!(
        "no end after 1000 batches: {written:?}"
    )))
}

proptest! {
    /// With nothing changing but what the writes themselves do, a converge in batches of any
    /// size writes what one comparison of everything asks for, in the same order: classes,
    /// then quotas, deletions last, each kind in key order. So does one whose next batch is
    /// prefetched behind each pass's (as the operator hands them out), whether the server's
    /// watch events of a prefetched batch come before the pass that runs during it or after;
    /// that pass never writes what is in flight.
    #[test]
    fn batches_write_what_one_comparison_asks_for_in_its_order(
        wanted in proptest::collection::vec(proptest::option::of(0..3u8), 6),
        live in proptest::collection::vec(proptest::option::of((0..3u8, any::<bool>())), 6),
        class_desired in proptest::option::of(0..3u8),
        class_live in proptest::option::of(0..3u8),
        limit in 1..5usize,
        prefetch in proptest::option::of(1..5usize),
        echo_early in any::<bool>(),
    ) {
        let namespaces = ["a", "b", "c", "d", "e", "f"];
        let objects = DesiredObjects {
            resource_quotas: (namespaces.iter().zip(&wanted))
                .filter_map(|(ns, d)| d.map(|d| Arc::new(desired_quota(ns, d))))
                .collect(),
            device_classes: class_desired.map(|d| Arc::new(class(d))).into_iter().collect(),
            ..DesiredObjects::default()
        };
        // The server: quotas by namespace, and the class.
        let mut quotas: BTreeMap<&str, (u8, bool)> = (namespaces.iter().zip(&live))
            .filter_map(|(ns, l)| l.map(|l| (*ns, l)))
            .collect();
        let mut stored_class = class_live;
        let live_of = |quotas: &BTreeMap<&str, (u8, bool)>| -> Vec<LiveObject> {
            (quotas.iter())
                .map(|(ns, (d, drift))| {
                    LiveObject::owned(Kind::ResourceQuota, &live_quota(ns, *d, *drift))
                })
                .collect()
        };
        let full_live: BTreeMap<ObjectKey, Value> = (live_of(&quotas).into_iter())
            .chain(class_live.map(|d| LiveObject::DeviceClass(Arc::new(class(d)))))
            .map(|o| (o.key(), o.to_json().unwrap()))
            .collect();
        let expected: Vec<(ObjectKey, bool)> = writes(
            &desired(&objects),
            &objects.retained_device_classes,
            &objects.retained_owners,
            &full_live,
        )
        .iter()
        .map(|w| (w.key().clone(), matches!(w, Write::Delete { .. })))
        .collect();

        let mut differ = Differ::with_batch_limit(limit);
        differ.update_live(Kind::ResourceQuota, live_of(&quotas));
        differ.update_live(
            Kind::DeviceClass,
            stored_class.map(|d| LiveObject::DeviceClass(Arc::new(class(d)))),
        );
        // The server does a batch, and the watches bring it back.
        let mut perform = |batch: &[Write], differ: &mut Differ| {
            let mut written = Vec::new();
            for write in batch {
                let key = write.key();
                let delete = matches!(write, Write::Delete { .. });
                match (key.kind, key.namespace.as_deref()) {
                    (Kind::DeviceClass, _) => stored_class = class_desired.filter(|_| !delete),
                    (_, Some(ns)) => {
                        let at = namespaces.iter().position(|n| *n == ns).unwrap();
                        match wanted[at].filter(|_| !delete) {
                            Some(d) => quotas.insert(namespaces[at], (d, false)),
                            None => quotas.remove(ns),
                        };
                    }
                    (_, None) => unreachable!("{key}"),
                }
                written.push((key.clone(), delete));
            }
            differ.update_live(Kind::ResourceQuota, live_of(&quotas));
            differ.update_live(
                Kind::DeviceClass,
                stored_class.map(|d| LiveObject::DeviceClass(Arc::new(class(d)))),
            );
            written
        };
        let modes = (prefetch, echo_early);
        let written = converge(&mut differ, &objects, limit, modes, &mut perform)?;
        prop_assert_eq!(written, expected);
        prop_assert_eq!(differ.backlog(), 0);
    }
}
