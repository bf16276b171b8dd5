use super::requests::Rotating;
use super::*;
use crate::core::diff::ObjectKey;
use crate::core::effects::PolicyKind;

#[test]
fn events_run_together_but_a_series_one_after_another() {
    let event = |team: &str, note: &str| {
        Effect::Event(Box::new(crate::core::effects::Event {
            regarding: k8s_openapi::api::core::v1::ObjectReference {
                kind: Some("TeamGpuPolicy".into()),
                name: Some(team.into()),
                ..Default::default()
            },
            type_: crate::core::effects::EventType::Normal,
            reason: "Planned",
            action: "Plan",
            note: note.into(),
        }))
    };
    let status = Effect::Status {
        kind: PolicyKind::TeamGpuPolicy,
        name: "a".into(),
        status: serde_json::Value::Null,
        urgent: true,
    };
    let effects = vec![
        status,
        event("a", "first"),
        event("b", "first"),
        event("a", "second"),
        event("c", "first"),
    ];
    let notes: Vec<Vec<String>> = steps(effects)
        .into_iter()
        .skip(1)
        .map(|lanes| {
            let [lane] = &lanes[..] else {
                panic!("{lanes:?}")
            };
            let [round] = &lane[..] else {
                panic!("{lane:?}")
            };
            (round.iter())
                .map(|e| match e {
                    Effect::Event(e) => {
                        format!("{} {}", e.regarding.name.as_deref().unwrap(), e.note)
                    }
                    other => panic!("{other:?}"),
                })
                .collect()
        })
        .collect();
    // a's second Event waits for its first; the others go together with it.
    assert_eq!(
        notes,
        [vec!["a first", "b first", "c first"], vec!["a second"]]
    );
}

#[test]
fn the_event_recorder_is_replaced_after_its_share_of_events() {
    let made = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut recorders = Rotating::new(3, {
        let made = made.clone();
        move || made.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    });
    let handed: Vec<usize> = (0..7).map(|_| recorders.next()).collect();
    assert_eq!(handed, [0, 0, 0, 1, 1, 1, 2]);
    assert_eq!(made.load(std::sync::atomic::Ordering::Relaxed), 3);
}

#[test]
fn admission_objects_are_written_beside_quotas_and_templates_each_in_its_order() {
    let apply = |kind, name: &str| {
        Effect::Object(Write::Apply {
            key: ObjectKey {
                kind,
                namespace: None,
                name: name.into(),
            },
            object: serde_json::Value::Null.into(),
        })
    };
    let effects = vec![
        apply(Kind::DeviceClass, "class"),
        apply(Kind::ValidatingAdmissionPolicy, "policy"),
        apply(Kind::ValidatingAdmissionPolicyBinding, "binding"),
        apply(Kind::ResourceQuota, "quota-1"),
        apply(Kind::ResourceQuota, "quota-2"),
        apply(Kind::ResourceClaimTemplate, "template"),
        Effect::Object(Write::Delete {
            key: ObjectKey {
                kind: Kind::ResourceClaimTemplate,
                namespace: None,
                name: "old".into(),
            },
        }),
        Effect::Status {
            kind: PolicyKind::TeamGpuPolicy,
            name: "claimant".into(),
            status: serde_json::Value::Null,
            urgent: true,
        },
        Effect::Status {
            kind: PolicyKind::TeamGpuPolicy,
            name: "team".into(),
            status: serde_json::Value::Null,
            urgent: false,
        },
    ];
    let names: Vec<Vec<Vec<Vec<String>>>> = steps(effects)
        .into_iter()
        .map(|lanes| {
            lanes
                .into_iter()
                .map(|lane| {
                    lane.into_iter()
                        .map(|phase| phase.iter().map(Effect::id).collect())
                        .collect()
                })
                .collect()
        })
        .collect();
    let id = |kind: Kind, name: &str| {
        ObjectKey {
            kind,
            namespace: None,
            name: name.into(),
        }
        .to_string()
    };
    assert_eq!(
        names,
        vec![
            vec![vec![vec![id(Kind::DeviceClass, "class")]]],
            vec![
                vec![
                    vec![id(Kind::ValidatingAdmissionPolicy, "policy")],
                    vec![id(Kind::ValidatingAdmissionPolicyBinding, "binding")],
                ],
                vec![
                    vec![
                        id(Kind::ResourceQuota, "quota-1"),
                        id(Kind::ResourceQuota, "quota-2")
                    ],
                    vec![id(Kind::ResourceClaimTemplate, "template")],
                ],
            ],
            vec![vec![vec![id(Kind::ResourceClaimTemplate, "old")]]],
            vec![vec![vec![
                Effect::Status {
                    kind: PolicyKind::TeamGpuPolicy,
                    name: "claimant".into(),
                    status: serde_json::Value::Null,
                    urgent: true,
                }
                .id()
            ]]],
            vec![vec![vec![
                Effect::Status {
                    kind: PolicyKind::TeamGpuPolicy,
                    name: "team".into(),
                    status: serde_json::Value::Null,
                    urgent: false,
                }
                .id()
            ]]],
        ]
    );
}
