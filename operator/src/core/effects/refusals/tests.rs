use std::time::Instant;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::json;

use super::*;
use crate::core::effects::{Effect, Published, WrittenStatuses, applied_statuses, status_changes};
use crate::core::plan::{SharingPolicyReport, TeamReport};

fn at(secs: i64) -> Timestamp {
    Timestamp::from_second(secs).unwrap()
}

fn key(kind: Kind, namespace: Option<&str>, name: &str) -> ObjectKey {
    ObjectKey {
        kind,
        namespace: namespace.map(str::to_owned),
        name: name.into(),
    }
}

fn quota(namespace: &str) -> ObjectKey {
    key(Kind::ResourceQuota, Some(namespace), "teamgpu")
}

fn failed(key: &ObjectKey, failure: Failure, message: &str) -> FailedWrite {
    FailedWrite {
        key: key.clone(),
        verb: "apply",
        message: message.into(),
        failure,
    }
}

fn refused(key: &ObjectKey, message: &str) -> FailedWrite {
    failed(key, Failure::Refused, message)
}

/// The status writes of `teams` (no sharing policy) as applied at `now`.
fn status_writes(
    plan: &Plan,
    teams: &[TeamGpuPolicy],
    refused: &RefusedByOwner,
    now: &Time,
) -> Vec<Effect> {
    let statuses = applied_statuses(plan, &[], teams, refused, now);
    status_changes(
        &statuses,
        &[],
        teams,
        &mut WrittenStatuses::default(),
        Instant::now(),
    )
}

/// Teams `ml` (namespace `ml-dev`, Ready) and `cv` (`cv-dev`), and the sharing policy `a100`
/// of DeviceClass `a100.teamgpu.io`.
fn plan() -> Plan {
    let team = |name: &str, namespace: &str| TeamReport {
        department: None,
        name: name.into(),
        generation: Some(1),
        namespaces: vec![namespace.into()].into(),
        conditions: vec![DesiredCondition::new(
            "Ready",
            true,
            "Planned",
            "quotas and templates planned in 1 namespaces",
        )],
        ..TeamReport::default()
    };
    Plan {
        teams: vec![team("cv", "cv-dev"), team("ml", "ml-dev")],
        sharing_policies: vec![SharingPolicyReport {
            name: "a100".into(),
            device_class: "a100.teamgpu.io".into(),
            ..SharingPolicyReport::default()
        }],
        ..Plan::default()
    }
}

/// What the API server holds of team `name`: `conditions` as its status, if any.
fn team(name: &str, conditions: Option<serde_json::Value>) -> TeamGpuPolicy {
    let status = conditions.map(|c| {
        json!({"observedGeneration": 1, "namespaces": [format!("{name}-dev")],
               "namespaceCount": 1,
               "totals": {"guaranteed": 0, "entitlement": 0, "allocated": 0, "pending": 0},
               "quotas": [], "conditions": c})
    });
    serde_json::from_value(json!({
        "apiVersion": "teamgpu.io/v1alpha1", "kind": "TeamGpuPolicy",
        "metadata": {"name": name, "uid": format!("u-{name}"), "generation": 1},
        "spec": {}, "status": status
    }))
    .unwrap()
}

fn condition(
    type_: &str,
    status: &str,
    reason: &str,
    message: &str,
    at: &str,
) -> serde_json::Value {
    json!({"type": type_, "status": status, "reason": reason, "message": message,
           "observedGeneration": 1, "lastTransitionTime": at})
}

const DENIED: &str = "resourcequotas \"teamgpu\" is forbidden: denied request: hands off";

#[test]
fn refusals_in_a_row_count_until_a_write_succeeds_and_transient_failures_do_not_count() {
    let mut refusals = Refusals::default();
    let q = quota("ml-dev");
    refusals.record(&[refused(&q, "first words")], [], at(100));
    refusals.record(&[failed(&q, Failure::Transient, "timeout")], [], at(101));
    refusals.record(&[refused(&q, DENIED)], [], at(102));
    let message = |r: &mut Refusals| {
        r.of_policies(&plan())
            .condition(PolicyKind::TeamGpuPolicy, "ml", &[])
            .map(|c| c.message)
    };
    assert_eq!(
        message(&mut refusals).as_deref(),
        Some(&*format!(
            "ResourceQuota ml-dev/teamgpu (apply) refused 2 times since 1970-01-01T00:01:40Z: {DENIED}"
        ))
    );
    // Another object written, then this one: its row ends.
    refusals.record(&[], [&quota("cv-dev")], at(103));
    assert!(message(&mut refusals).is_some());
    refusals.record(&[], [&q], at(104));
    assert_eq!(message(&mut refusals), None);
    // A new row starts afresh.
    refusals.record(&[refused(&q, DENIED)], [], at(200));
    assert_eq!(
        message(&mut refusals).as_deref(),
        Some(&*format!(
            "ResourceQuota ml-dev/teamgpu (apply) refused once since 1970-01-01T00:03:20Z: {DENIED}"
        ))
    );
}

#[test]
fn each_refused_object_shows_on_the_policies_that_own_it() {
    let mut refusals = Refusals::default();
    let objects = [
        quota("ml-dev"),
        key(Kind::ResourceClaimTemplate, Some("cv-dev"), "a100-1"),
        key(Kind::DeviceClass, None, "a100.teamgpu.io"),
        key(Kind::ClusterRole, None, "teamgpu-member-ml"),
        key(
            Kind::ValidatingAdmissionPolicy,
            None,
            "teamgpu-team-requests",
        ),
        // In no team's namespace: nobody's, and forgotten.
        quota("elsewhere"),
    ];
    let failures: Vec<FailedWrite> = objects.iter().map(|k| refused(k, "no")).collect();
    refusals.record(&failures, [], at(0));
    let by_owner = refusals.of_policies(&plan());
    // In the order of kinds (as they are written), then of names.
    let shown = |kind, name| {
        by_owner
            .condition(kind, name, &[])
            .map(|c| (c.type_, c.status, c.reason, c.message))
    };
    let since = "since 1970-01-01T00:00:00Z: no";
    assert_eq!(
        shown(PolicyKind::TeamGpuPolicy, "ml"),
        Some((
            "Applied",
            false,
            "WriteRefused",
            format!(
                "ValidatingAdmissionPolicy teamgpu-team-requests (apply) refused once {since}; \
                 ResourceQuota ml-dev/teamgpu (apply) refused once {since}; \
                 ClusterRole teamgpu-member-ml (apply) refused once {since}"
            )
        ))
    );
    assert_eq!(
        shown(PolicyKind::TeamGpuPolicy, "cv").map(|c| c.3),
        Some(format!(
            "ValidatingAdmissionPolicy teamgpu-team-requests (apply) refused once {since}; \
             ResourceClaimTemplate cv-dev/a100-1 (apply) refused once {since}"
        ))
    );
    assert_eq!(
        shown(PolicyKind::GpuSharingPolicy, "a100").map(|c| c.3),
        Some(format!(
            "DeviceClass a100.teamgpu.io (apply) refused once {since}"
        ))
    );
    // The quota of no team is forgotten: a team that takes the namespace later starts afresh.
    let mut later = plan();
    let mut namespaces = later.teams[0].namespaces.to_vec();
    namespaces.push("elsewhere".into());
    later.teams[0].namespaces = namespaces.into();
    let again = refusals.of_policies(&later);
    let cv = again
        .condition(PolicyKind::TeamGpuPolicy, "cv", &[])
        .unwrap();
    assert!(!cv.message.contains("elsewhere"), "{}", cv.message);
}

#[test]
fn more_refused_objects_than_shown_are_counted() {
    let mut refusals = Refusals::default();
    let templates: Vec<FailedWrite> = (1..=5)
        .map(|n| {
            let k = key(
                Kind::ResourceClaimTemplate,
                Some("ml-dev"),
                &format!("t{n}"),
            );
            refused(&k, "no")
        })
        .collect();
    refusals.record(&templates, [], at(0));
    let message = (refusals.of_policies(&plan()))
        .condition(PolicyKind::TeamGpuPolicy, "ml", &[])
        .unwrap()
        .message;
    assert!(message.ends_with("; and 2 more objects"), "{message}");
    assert_eq!(message.matches("refused once").count(), 3, "{message}");
}

#[test]
fn a_refused_quota_makes_its_team_not_ready_until_it_is_written_and_the_status_settles() {
    let ready = condition(
        "Ready",
        "True",
        "Planned",
        "quotas and templates planned in 1 namespaces",
        "1970-01-01T00:00:10Z",
    );
    let live = team("ml", Some(json!([ready])));
    let now = Time(at(500));
    let mut refusals = Refusals::default();
    refusals.record(&[refused(&quota("ml-dev"), DENIED)], [], at(400));
    let written = status_writes(
        &plan(),
        std::slice::from_ref(&live),
        &refusals.of_policies(&plan()),
        &now,
    );
    let applied = format!(
        "ResourceQuota ml-dev/teamgpu (apply) refused once since 1970-01-01T00:06:40Z: {DENIED}"
    );
    let not_ready = "the API server refuses writes of this policy's objects: see condition Applied";
    let refused_conditions = json!([
        condition(
            "Applied",
            "False",
            "WriteRefused",
            &applied,
            "1970-01-01T00:08:20Z"
        ),
        condition(
            "Ready",
            "False",
            "WriteRefused",
            not_ready,
            "1970-01-01T00:08:20Z"
        ),
    ]);
    let [Effect::Status { name, status, .. }] = written.as_slice() else {
        panic!("{written:?}")
    };
    assert_eq!(name, "ml");
    assert_eq!(status["conditions"], refused_conditions);
    // Written: the next pass, later, writes nothing while nothing new is refused.
    let shown = team("ml", Some(refused_conditions));
    let again = status_writes(
        &plan(),
        std::slice::from_ref(&shown),
        &refusals.of_policies(&plan()),
        &Time(at(600)),
    );
    assert_eq!(again, []);
    // The quota is written: Ready again, and the Applied condition is gone.
    refusals.record(&[], [&quota("ml-dev")], at(700));
    let cleared = status_writes(
        &plan(),
        &[shown],
        &refusals.of_policies(&plan()),
        &Time(at(800)),
    );
    let [Effect::Status { status, .. }] = cleared.as_slice() else {
        panic!("{cleared:?}")
    };
    assert_eq!(
        status["conditions"],
        json!([condition(
            "Ready",
            "True",
            "Planned",
            "quotas and templates planned in 1 namespaces",
            "1970-01-01T00:13:20Z"
        )])
    );
}

#[test]
fn a_restarted_operator_keeps_the_live_applied_condition_until_it_has_written() {
    let applied = condition(
        "Applied",
        "False",
        "WriteRefused",
        "quota refused",
        "1970-01-01T00:00:10Z",
    );
    let not_ready = condition(
        "Ready",
        "False",
        "WriteRefused",
        "the API server refuses writes of this policy's objects: see condition Applied",
        "1970-01-01T00:00:10Z",
    );
    let live = team("ml", Some(json!([applied, not_ready])));
    let mut refusals = Refusals::default();
    let changes = |refusals: &mut Refusals| {
        let by_owner = refusals.of_policies(&plan());
        status_writes(
            &plan(),
            std::slice::from_ref(&live),
            &by_owner,
            &Time(at(50)),
        )
    };
    assert_eq!(changes(&mut refusals), []);
    // The writes of a first run were all accepted: the status says so.
    refusals.record(&[], [&quota("ml-dev")], at(60));
    let written = changes(&mut refusals);
    let [Effect::Status { status, .. }] = written.as_slice() else {
        panic!("the status is written")
    };
    assert_eq!(status["conditions"][0]["reason"], "Planned");
}

#[test]
fn a_warning_is_published_once_per_row_after_enough_refusals() {
    let teams = [team("ml", None)];
    let q = quota("ml-dev");
    let mut refusals = Refusals::default();
    let mut published = Published::default();
    let mut pass = |refusals: &mut Refusals| {
        let events = refusals.of_policies(&plan()).events(&[], &teams);
        let new = published.unpublished(events);
        for e in &new {
            published.record(e.key());
        }
        new
    };
    for second in 1..EVENT_AFTER {
        refusals.record(&[refused(&q, DENIED)], [], at(i64::from(second)));
        assert_eq!(pass(&mut refusals), [], "after {second} refusals");
    }
    // The API's words change at the third refusal; the Event tells those.
    refusals.record(&[refused(&q, "hands off!")], [], at(3));
    let note = "ResourceQuota ml-dev/teamgpu (apply) refused 3 times in a row since \
                1970-01-01T00:00:01Z: hands off!";
    let team_ref = ObjectReference {
        api_version: Some("teamgpu.io/v1alpha1".into()),
        kind: Some("TeamGpuPolicy".into()),
        name: Some("ml".into()),
        uid: Some("u-ml".into()),
        ..Default::default()
    };
    let quota_ref = ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("ResourceQuota".into()),
        namespace: Some("ml-dev".into()),
        name: Some("teamgpu".into()),
        ..Default::default()
    };
    assert_eq!(
        pass(&mut refusals),
        [
            warning(quota_ref, format!("TeamGpuPolicy ml: {note}")),
            warning(team_ref, note.to_owned()),
        ]
    );
    // Further refusals of the row, whatever their words: no new Event.
    for second in 4..10 {
        refusals.record(&[refused(&q, &format!("try {second}"))], [], at(second));
        assert_eq!(pass(&mut refusals), []);
    }
    // Written, then refused again: a new row, a new Event once it is long enough.
    refusals.record(&[], [&q], at(20));
    assert_eq!(pass(&mut refusals), []);
    for second in 21..21 + i64::from(EVENT_AFTER) {
        refusals.record(&[refused(&q, DENIED)], [], at(second));
    }
    let again = pass(&mut refusals);
    assert_eq!(again.len(), 2, "{again:?}");
    assert!(
        again[1].note.contains("since 1970-01-01T00:00:21Z"),
        "{again:?}"
    );
}
