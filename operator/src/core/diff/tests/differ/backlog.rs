//! The differ's backlog: a batch limit hands out the rest of a long converge in later calls.

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

proptest! {
    /// With nothing changing but what the writes themselves do, a converge in batches of any
    /// size writes what one comparison of everything asks for, in the same order: classes,
    /// then quotas, deletions last, each kind in key order.
    #[test]
    fn batches_write_what_one_comparison_asks_for_in_its_order(
        wanted in proptest::collection::vec(proptest::option::of(0..3u8), 6),
        live in proptest::collection::vec(proptest::option::of((0..3u8, any::<bool>())), 6),
        class_desired in proptest::option::of(0..3u8),
        class_live in proptest::option::of(0..3u8),
        limit in 1..5usize,
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
        let mut written = Vec::new();
        let mut batch = differ.writes(&objects);
        while !batch.is_empty() {
            prop_assert!(batch.len() <= limit);
            prop_assert!(written.len() <= expected.len(), "{written:?}");
            // The server does the batch, and the watches bring it back.
            for write in &batch {
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
            batch = differ.writes_again(&objects);
        }
        prop_assert_eq!(written, expected);
        prop_assert_eq!(differ.backlog(), 0);
    }
}
