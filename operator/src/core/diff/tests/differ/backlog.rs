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
