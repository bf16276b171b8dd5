use std::sync::Arc;

use k8s_openapi::api::resource::v1::DeviceClass;
use kube::core::DynamicObject;
use serde_json::json;

use super::*;

fn key(kind: Kind, ns: Option<&str>, name: &str) -> ObjectKey {
    ObjectKey {
        kind,
        namespace: ns.map(str::to_owned),
        name: name.into(),
    }
}

fn quota(hash: &str, devices: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "ResourceQuota",
           "metadata": {"name": "teamgpu", "namespace": "a", "annotations": {CONTENT_HASH_ANNOTATION: hash}},
           "spec": {"hard": {"x.deviceclass.resource.k8s.io/devices": devices}}})
}

#[test]
fn holds_ignores_what_the_server_added_but_not_changed_values() {
    let desired = quota("h1", "4");
    let mut live = desired.clone();
    live["metadata"]["uid"] = json!("u");
    live["status"] = json!({"used": {}});
    assert!(holds(&live, &desired));
    live["spec"]["hard"]["x.deviceclass.resource.k8s.io/devices"] = json!("5");
    assert!(!holds(&live, &desired));
    assert!(!holds(&json!({"a": [1, 2]}), &json!({"a": [1]})));
}

#[test]
fn a_steady_state_writes_nothing() {
    let k = key(Kind::ResourceQuota, Some("a"), "teamgpu");
    let desired = BTreeMap::from([(k.clone(), quota("h1", "4"))]);
    let mut live_obj = quota("h1", "4");
    live_obj["metadata"]["resourceVersion"] = json!("7");
    let live = BTreeMap::from([(k, live_obj)]);
    assert!(writes(&desired, &BTreeSet::new(), &BTreeSet::new(), &live).is_empty());
}

#[test]
fn drift_and_removed_fields_are_written_back() {
    let k = key(Kind::ResourceQuota, Some("a"), "teamgpu");
    let desired = BTreeMap::from([(k.clone(), quota("h1", "4"))]);
    // Someone edited the value.
    let live = BTreeMap::from([(k.clone(), quota("h1", "9"))]);
    assert!(matches!(
        &writes(&desired, &BTreeSet::new(), &BTreeSet::new(), &live)[..],
        [Write::Apply { .. }]
    ));
    // The plan dropped a field: only the hash tells (the live object still holds the plan).
    let mut old = quota("h0", "4");
    old["spec"]["hard"]["y.deviceclass.resource.k8s.io/devices"] = json!("0");
    let live = BTreeMap::from([(k, old)]);
    assert!(matches!(
        &writes(&desired, &BTreeSet::new(), &BTreeSet::new(), &live)[..],
        [Write::Apply { .. }]
    ));
}

#[test]
fn changed_templates_are_recreated_and_stale_objects_deleted_last() {
    let t = key(Kind::ResourceClaimTemplate, Some("a"), "gpu");
    let template = |hash: &str| json!({"metadata": {"name": "gpu", "namespace": "a", "annotations": {CONTENT_HASH_ANNOTATION: hash}}, "spec": {}});
    let stale = key(Kind::ResourceQuota, Some("gone"), "teamgpu");
    let kept_class = key(Kind::DeviceClass, None, "broken.teamgpu.io");
    let desired = BTreeMap::from([(t.clone(), template("new"))]);
    let live = BTreeMap::from([
        (t.clone(), template("old")),
        (stale.clone(), quota("h", "1")),
        (kept_class, json!({})),
    ]);
    let retained = BTreeSet::from(["broken.teamgpu.io".to_owned()]);
    let out = writes(&desired, &retained, &BTreeSet::new(), &live);
    assert_eq!(out.len(), 2, "{out:?}");
    assert!(matches!(&out[0], Write::Recreate { key, .. } if key == &t));
    assert!(matches!(&out[1], Write::Delete { key } if key == &stale));
}

#[test]
fn the_objects_of_an_unreadable_policy_are_kept() {
    let q = key(Kind::ResourceQuota, Some("robotics"), "teamgpu");
    let mut owned = quota("h", "4");
    owned["metadata"]["labels"] = json!({"teamgpu.io/owner": "TeamGpuPolicy.robotics"});
    let live = BTreeMap::from([(q.clone(), owned)]);
    let unreadable = BTreeSet::from(["TeamGpuPolicy.robotics".to_owned()]);
    assert_eq!(
        writes(&BTreeMap::new(), &BTreeSet::new(), &unreadable, &live),
        []
    );
    // Once the policy is gone for good (or readable and wanting less), the quota goes.
    assert!(matches!(
        &writes(&BTreeMap::new(), &BTreeSet::new(), &BTreeSet::new(), &live)[..],
        [Write::Delete { key }] if key == &q
    ));
}

#[test]
fn classes_are_applied_before_the_templates_that_use_them() {
    let class = key(Kind::DeviceClass, None, "a.teamgpu.io");
    let tmpl = key(Kind::ResourceClaimTemplate, Some("ns"), "a");
    let desired = BTreeMap::from([(tmpl.clone(), json!({})), (class.clone(), json!({}))]);
    let out = writes(
        &desired,
        &BTreeSet::new(),
        &BTreeSet::new(),
        &BTreeMap::new(),
    );
    assert_eq!(
        out.iter().map(|w| w.key().clone()).collect::<Vec<_>>(),
        [class, tmpl]
    );
}

/// Random sequences of desired and live states: the kept differ asks for exactly the writes
/// the full comparison asks for, at every step.
mod differ {
    mod backlog;

    use super::*;
    use crate::core::plan::NamespacedQuota;
    use crate::core::state::Delta;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use proptest::prelude::*;

    /// A quota in `namespace` allowing `devices`, stamped with its content hash.
    fn desired_quota(namespace: &str, devices: u8) -> NamespacedQuota {
        let meta = ObjectMeta {
            name: Some("teamgpu".into()),
            ..ObjectMeta::default()
        };
        NamespacedQuota::new(
            Arc::new(meta),
            namespace,
            [(
                Arc::from("x.deviceclass.resource.k8s.io/devices"),
                u32::from(devices),
            )],
        )
    }

    /// The live side: absent, as desired with `devices`, or that edited by someone
    /// (`drift`); its resourceVersion names its content.
    fn live_quota(namespace: &str, devices: u8, drift: bool) -> DynamicObject {
        let mut v = serde_json::to_value(desired_quota(namespace, devices)).unwrap();
        if drift {
            v["spec"]["hard"]["x.deviceclass.resource.k8s.io/devices"] = json!("99");
        }
        v["apiVersion"] = json!("v1");
        v["kind"] = json!("ResourceQuota");
        v["metadata"]["resourceVersion"] = json!(format!("{devices}-{drift}"));
        serde_json::from_value(v).unwrap()
    }

    /// The watch cache's view of `live_quota("a", 3, drift)`, as `own` decides it.
    fn observed(own: &OwnWrites, drift: bool) -> Arc<LiveView> {
        Arc::new(LiveView::observed(
            Kind::ResourceQuota,
            &live_quota("a", 3, drift),
            own,
            &mut TemplateCharges::default(),
        ))
    }

    fn class(devices: u8) -> DeviceClass {
        serde_json::from_value(json!({
            "metadata": {"name": "x.teamgpu.io", "resourceVersion": devices.to_string(),
                         "annotations": {CONTENT_HASH_ANNOTATION: devices.to_string()}},
            "spec": {}
        }))
        .unwrap()
    }

    #[derive(Clone, Debug)]
    struct Step {
        desired: [Option<u8>; 2],
        live: [Option<(u8, bool)>; 2],
        class_live: Option<u8>,
        class_desired: Option<u8>,
        retained: bool,
    }

    fn step() -> impl Strategy<Value = Step> {
        let v = proptest::option::of(0..3u8);
        (
            [v.clone(), v.clone()],
            [
                proptest::option::of((0..3u8, any::<bool>())),
                proptest::option::of((0..3u8, any::<bool>())),
            ],
            v.clone(),
            v,
            any::<bool>(),
        )
            .prop_map(
                |(desired, live, class_live, class_desired, retained)| Step {
                    desired,
                    live,
                    class_live,
                    class_desired,
                    retained,
                },
            )
    }

    #[test]
    fn a_changed_desired_object_is_compared_again_though_nothing_live_changed() {
        let mut differ = Differ::default();
        let live = Arc::new(live_quota("a", 0, false));
        differ.update_live(
            Kind::ResourceQuota,
            [LiveObject::owned(Kind::ResourceQuota, &live)],
        );
        let mut objects = DesiredObjects::default();
        objects
            .resource_quotas
            .push(Arc::new(desired_quota("a", 0)));
        assert_eq!(differ.writes(&objects), []);
        objects.resource_quotas = vec![Arc::new(desired_quota("a", 1))];
        assert!(matches!(
            &differ.writes(&objects)[..],
            [Write::Apply { .. }]
        ));
    }

    fn quotas(devices: u8) -> DesiredObjects {
        DesiredObjects {
            resource_quotas: vec![Arc::new(desired_quota("a", devices))],
            ..DesiredObjects::default()
        }
    }

    #[test]
    fn a_compared_object_is_kept_without_its_content_and_still_decided_on() {
        let live = LiveObject::owned(Kind::ResourceQuota, &live_quota("a", 3, false));
        let LiveObject::Owned(view) = &live else {
            unreachable!()
        };
        let mut differ = Differ::default();
        differ.update_live(Kind::ResourceQuota, [live.clone()]);
        assert!(view.holds_text());
        assert!(differ.writes(&quotas(3)).is_empty());
        assert!(
            !view.holds_text(),
            "the content is dropped once it is found converged"
        );
        // The same version passed again (the next event of another quota) keeps that.
        differ.update_live(Kind::ResourceQuota, [live.clone()]);
        assert!(differ.writes(&quotas(3)).is_empty());
        // A new desired quota is applied; back to the old one, the live one holds it.
        assert!(matches!(
            &differ.writes(&quotas(4))[..],
            [Write::Apply { .. }]
        ));
        assert!(differ.writes(&quotas(3)).is_empty());
        // No longer wanted: deleted, decided without the content.
        assert!(matches!(
            &differ.writes(&DesiredObjects::default())[..],
            [Write::Delete { .. }]
        ));
    }

    #[test]
    fn the_watch_event_of_an_own_apply_is_known_without_its_content() {
        let mut differ = Differ::default();
        let writes = differ.writes(&quotas(3));
        let [Write::Apply { object, .. }] = &writes[..] else {
            panic!("{writes:?}")
        };
        let own = OwnWrites::default();
        // The server stored the apply as version "3-false" (see `live_quota`).
        own.record(
            "3-false",
            object.fingerprint().expect("the differ's payload"),
        );
        let view = observed(&own, false);
        assert!(!view.holds_text());
        differ.update_live(Kind::ResourceQuota, [LiveObject::Owned(view)]);
        assert!(differ.writes(&quotas(3)).is_empty());
        // Someone else's version is kept whole until compared.
        let edited = observed(&own, true);
        assert!(edited.holds_text());
        differ.update_live(Kind::ResourceQuota, [LiveObject::Owned(edited)]);
        assert!(matches!(
            &differ.writes(&quotas(3))[..],
            [Write::Apply { .. }]
        ));
    }

    #[test]
    fn an_own_apply_whose_watch_event_came_before_its_answer_forgets_the_text_at_the_answer() {
        let mut differ = Differ::default();
        let writes = differ.writes(&quotas(3));
        let [Write::Apply { object, .. }] = &writes[..] else {
            panic!("{writes:?}")
        };
        let own = OwnWrites::default();
        // The event of version "3-false" (see `live_quota`) is taken in, then the apply's
        // answer names that version.
        let view = observed(&own, false);
        assert!(view.holds_text());
        differ.update_live(Kind::ResourceQuota, [LiveObject::Owned(view.clone())]);
        own.record(
            "3-false",
            object.fingerprint().expect("the differ's payload"),
        );
        assert!(!view.holds_text());
        assert!(differ.writes(&quotas(3)).is_empty());
        // A version no answer named stays whole until compared, and then a change is written.
        let edited = observed(&own, true);
        own.record("another", 1);
        assert!(edited.holds_text());
        differ.update_live(Kind::ResourceQuota, [LiveObject::Owned(edited)]);
        assert!(matches!(
            &differ.writes(&quotas(3))[..],
            [Write::Apply { .. }]
        ));
    }

    #[test]
    fn a_live_quota_is_kept_without_its_status_and_converged() {
        let mut live = live_quota("a", 3, false);
        live.data["status"] = json!({"hard": {"x.deviceclass.resource.k8s.io/devices": "3"},
                                     "used": {"x.deviceclass.resource.k8s.io/devices": "1"}});
        let view = Arc::new(LiveView::new(Kind::ResourceQuota, &live));
        assert_eq!(view.text_json().expect("text")["status"], Value::Null);
        let mut differ = Differ::default();
        differ.update_live(Kind::ResourceQuota, [LiveObject::Owned(view)]);
        assert!(differ.writes(&quotas(3)).is_empty());
    }

    #[test]
    fn a_view_replaced_before_it_was_compared_takes_its_text_with_it() {
        let own = OwnWrites::default();
        // Another writer's version (the quota controller's status, say): no answer claims it.
        let first = observed(&own, false);
        assert_eq!(own.texts_held(), 1);
        // The watch cache replaces it with a newer version before any pass compared it.
        let newer = observed(&own, true);
        drop(first);
        assert_eq!(own.texts_held(), 1, "only the newer view's text");
        drop(newer);
        assert_eq!(own.texts_held(), 0);
    }

    #[test]
    fn a_listed_object_without_api_version_and_kind_is_converged() {
        // A watch cache filled by a list holds items without apiVersion and kind (the API
        // server leaves them out of list items); only events carry them.
        let mut listed = live_quota("a", 0, false);
        listed.types = None;
        let mut differ = Differ::default();
        differ.update_live(
            Kind::ResourceQuota,
            [LiveObject::owned(Kind::ResourceQuota, &listed)],
        );
        assert_eq!(differ.writes(&quotas(0)), []);
    }

    #[test]
    fn a_no_op_apply_settles_the_object_until_a_side_changes() {
        // The server stores the value in another form than teamgpu sent ("4.0" for "4"):
        // the comparison sees a difference that an apply cannot remove.
        let stored = |version: &str| {
            let mut q = live_quota("a", 4, false);
            q.data["spec"]["hard"]["x.deviceclass.resource.k8s.io/devices"] = json!("4.0");
            q.metadata.resource_version = Some(version.into());
            LiveObject::owned(Kind::ResourceQuota, &q)
        };
        let key = key(Kind::ResourceQuota, Some("a"), "teamgpu");
        let mut differ = Differ::default();
        differ.update_live(Kind::ResourceQuota, [stored("7")]);
        assert!(matches!(
            &differ.writes(&quotas(4))[..],
            [Write::Apply { .. }]
        ));
        // The apply changed nothing: the server answered with the same resourceVersion.
        differ.written(&key, Some("7"));
        assert_eq!(differ.writes(&quotas(4)), []);
        assert_eq!(differ.writes(&quotas(4)), []);
        // Someone edits the object: it is compared, and applied, again.
        differ.update_live(Kind::ResourceQuota, [stored("8")]);
        assert!(matches!(
            &differ.writes(&quotas(4))[..],
            [Write::Apply { .. }]
        ));
        // An apply that did change the object is not applied again before its watch event
        // (the next pass may come first), and is compared when the watch brings it.
        differ.written(&key, Some("9"));
        assert_eq!(differ.writes(&quotas(4)), []);
        differ.update_live(Kind::ResourceQuota, [stored("9")]);
        assert!(matches!(
            &differ.writes(&quotas(4))[..],
            [Write::Apply { .. }]
        ));
    }

    #[test]
    fn a_resync_over_an_equal_cluster_asks_for_nothing_and_over_a_drifted_one_for_the_repair() {
        let desired = DesiredObjects {
            resource_quotas: ["a", "b", "c"]
                .map(|ns| Arc::new(desired_quota(ns, 3)))
                .to_vec(),
            ..DesiredObjects::default()
        };
        let listed = |drifted: bool| {
            let b = live_quota("b", 3, drifted);
            [live_quota("a", 3, false), b, live_quota("c", 3, false)]
                .map(|q| LiveObject::owned(Kind::ResourceQuota, &q))
        };
        let mut differ = Differ::default();
        let converged = listed(false);
        differ.update_live(Kind::ResourceQuota, converged.clone());
        assert_eq!(differ.writes(&desired), []);
        // A resync over the same cluster: the list again brings the same versions (the watch
        // cache keeps its views of them), and every object is compared.
        differ.update_live(Kind::ResourceQuota, converged.clone());
        differ.compare_all();
        assert_eq!(differ.writes(&desired), []);
        // Someone edited `b` and deleted `c`, and the watch missed both: the list again brings
        // the new version of `b` and no `c`.
        let [a, b, _] = listed(true);
        differ.update_live(Kind::ResourceQuota, [converged[0].clone(), b]);
        drop(a);
        differ.compare_all();
        let repairs: Vec<(&str, Option<String>)> = (differ.writes(&desired).iter())
            .map(|w| (w.verb(), w.key().namespace.clone()))
            .collect();
        assert_eq!(
            repairs,
            [("apply", Some("b".into())), ("apply", Some("c".into()))]
        );
    }

    /// The live quotas of `namespaces` that are new or changed, and those gone, from `handed`
    /// to `now`, as the owned watches hand them over.
    fn changed_since(
        namespaces: [&str; 2],
        handed: [Option<(u8, bool)>; 2],
        now: [Option<(u8, bool)>; 2],
    ) -> (Vec<Arc<LiveView>>, Vec<Arc<LiveView>>) {
        let view = |ns: &str, (d, drift): (u8, bool)| {
            Arc::new(LiveView::new(
                Kind::ResourceQuota,
                &live_quota(ns, d, drift),
            ))
        };
        let (mut upserted, mut removed) = (Vec::new(), Vec::new());
        for (ns, (was, now)) in namespaces.iter().zip(handed.into_iter().zip(now)) {
            match (was, now) {
                (Some(was), None) => removed.push(view(ns, was)),
                (was, Some(now)) if was != Some(now) => upserted.push(view(ns, now)),
                _ => {}
            }
        }
        (upserted, removed)
    }

    proptest! {
        #[test]
        fn the_kept_differ_agrees_with_the_full_comparison(
            mut steps in proptest::collection::vec(step(), 1..16),
            quiet in proptest::collection::vec(any::<bool>(), 16),
            as_delta in proptest::collection::vec(any::<bool>(), 16),
        ) {
            // Most passes see no live change: a quiet step keeps the live side as it was.
            for i in 1..steps.len() {
                if quiet[i] {
                    steps[i].live = steps[i - 1].live;
                    steps[i].class_live = steps[i - 1].class_live;
                }
            }
            let mut differ = Differ::default();
            let mut previous: Option<Step> = None;
            let mut shared = std::collections::HashMap::new();
            // The live quotas the differ was last handed, per namespace.
            let mut handed: [Option<(u8, bool)>; 2] = [None; 2];
            for (i, step) in steps.iter().enumerate() {
                let namespaces = ["a", "b"];
                let mut objects = DesiredObjects::default();
                // Quotas are shared while unchanged, as the planner does; classes are new
                // objects every time, as for the planner's few cluster-wide objects.
                for (ns, d) in namespaces.iter().zip(step.desired) {
                    objects.resource_quotas.extend(d.map(|d| {
                        shared
                            .entry((*ns, d))
                            .or_insert_with(|| Arc::new(desired_quota(ns, d)))
                            .clone()
                    }));
                }
                objects
                    .device_classes
                    .extend(step.class_desired.map(|d| Arc::new(class(d))));
                if step.retained {
                    objects.retained_device_classes.insert("x.teamgpu.io".into());
                }
                let live_quotas: Vec<DynamicObject> = namespaces
                    .iter()
                    .zip(step.live)
                    .filter_map(|(ns, l)| l.map(|(d, drift)| live_quota(ns, d, drift)))
                    .collect();
                let live_class = step.class_live.map(class);
                let live_quotas: Vec<Arc<DynamicObject>> =
                    live_quotas.into_iter().map(Arc::new).collect();
                let live_class = live_class.map(Arc::new);
                let full_live: BTreeMap<ObjectKey, Value> = live_quotas
                    .iter()
                    .map(|q| LiveObject::owned(Kind::ResourceQuota, q))
                    .chain(live_class.iter().cloned().map(LiveObject::DeviceClass))
                    .map(|o| (o.key(), o.to_json().unwrap()))
                    .collect();
                let expected = writes(
                    &desired(&objects),
                    &objects.retained_device_classes,
                    &objects.retained_owners,
                    &full_live,
                );
                // As the operator does: a kind is passed again only when its watch saw an
                // event (here: when it changed, or at random), whole or (as the owned watches
                // hand them) what changed since the last time.
                if previous.as_ref().is_none_or(|p: &Step| p.live != step.live || step.retained) {
                    if as_delta[i] {
                        let (upserted, removed) = changed_since(namespaces, handed, step.live);
                        let delta = Delta::Changed {
                            upserted: &upserted,
                            removed: &removed,
                        };
                        differ.update_owned(Kind::ResourceQuota, delta);
                    } else {
                        differ.update_live(
                            Kind::ResourceQuota,
                            live_quotas
                                .iter()
                                .map(|q| LiveObject::owned(Kind::ResourceQuota, q)),
                        );
                    }
                    handed = step.live;
                }
                if previous.as_ref().is_none_or(|p| p.class_live != step.class_live) {
                    differ.update_live(
                        Kind::DeviceClass,
                        live_class.iter().cloned().map(LiveObject::DeviceClass),
                    );
                }
                previous = Some(step.clone());
                prop_assert_eq!(differ.writes(&objects), expected, "at {:?}", step);
            }
        }
    }
}

#[test]
fn templates_that_charge_the_same_share_one_charge() {
    let template = |namespace: &str, count: u32| -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": "a100", "namespace": namespace, "resourceVersion": namespace},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": "a100.teamgpu.io", "count": count}}]}}}
        }))
        .unwrap()
    };
    let (own, mut charges) = (OwnWrites::default(), TemplateCharges::default());
    let mut view = |namespace: &str, count: u32| {
        LiveView::observed(
            Kind::ResourceClaimTemplate,
            &template(namespace, count),
            &own,
            &mut charges,
        )
        .template_charge
        .expect("a template's charge")
    };
    let (a, b, two) = (view("a", 1), view("b", 1), view("c", 2));
    assert_eq!(*a, [("a100.teamgpu.io".to_owned(), 1)].into());
    assert!(Arc::ptr_eq(&a, &b));
    assert_eq!(*two, [("a100.teamgpu.io".to_owned(), 2)].into());
}
