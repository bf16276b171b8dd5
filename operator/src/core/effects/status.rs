//! The status of each policy as teamgpu writes it ([`applied_statuses`]), and which of them to
//! write: only those that differ from the live ones, so a steady state writes none.

use std::collections::BTreeMap;

use std::time::{Duration, Instant};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::ResourceExt;
use kube::core::DynamicObject;
use serde_json::{Value, json};

use super::{Effect, PolicyKind, RefusedByOwner, WrittenStatuses};
use crate::api::{GpuSharingPolicy, GpuSharingPolicyStatus, TeamGpuPolicy, TeamGpuPolicyStatus};
use crate::core::plan::Plan;

/// The status of every policy as teamgpu writes it: the plan's, with the `Applied` condition
/// of its refused writes. One value for both the status writes and the condition metrics, so
/// a dashboard says what the status says. By policy name; a policy the plan does not know of
/// has none.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PolicyStatuses {
    pub sharing: BTreeMap<String, GpuSharingPolicyStatus>,
    pub teams: BTreeMap<String, TeamGpuPolicyStatus>,
}

/// The status of each live policy in `sharing` and `teams`: `plan`'s, with what the API server
/// `refused` of its objects.
pub fn applied_statuses(
    plan: &Plan,
    sharing: &[GpuSharingPolicy],
    teams: &[TeamGpuPolicy],
    refused: &RefusedByOwner,
    now: &Time,
) -> PolicyStatuses {
    let sharing = sharing.iter().filter_map(|p| {
        let (name, live) = (p.name_any(), p.status.as_ref());
        let conditions = live.map(|s| s.conditions.as_slice()).unwrap_or_default();
        let applied = refused.condition(PolicyKind::GpuSharingPolicy, &name, conditions);
        let status = plan.applied_sharing_status(&name, live, applied, now)?;
        Some((name, status))
    });
    let teams = teams.iter().filter_map(|t| {
        let (name, live) = (t.name_any(), t.status.as_ref());
        let conditions = live.map(|s| s.conditions.as_slice()).unwrap_or_default();
        let applied = refused.condition(PolicyKind::TeamGpuPolicy, &name, conditions);
        let status = plan.applied_team_status(&name, live, applied, now)?;
        Some((name, status))
    });
    PolicyStatuses {
        sharing: sharing.collect(),
        teams: teams.collect(),
    }
}

/// The write of each status of `statuses` that differs from its live one in `sharing` and
/// `teams`, unless it was `written` over the version the cache holds, or it is not urgent and
/// the policy's status was written less than [`STATUS_PACE`] before `now`.
///
/// A claim moves the fair shares, and so the statuses, of most teams of its pool: written at
/// once, that was 15 status writes per claim at 1,000 namespaces, and a pass held up while the
/// API server took them. A status a person waits for is urgent and written at once, first:
/// the team's own use changed (its claims, its waiting Pods), or its conditions, namespaces or
/// observed generation did. One whose numbers alone moved (another team's claim) is written
/// at most once per [`STATUS_PACE`]; the quotas that enforce those numbers are not paced.
pub fn status_changes(
    statuses: &PolicyStatuses,
    sharing: &[GpuSharingPolicy],
    teams: &[TeamGpuPolicy],
    written: &mut WrittenStatuses,
    now: Instant,
) -> Vec<Effect> {
    written.start_pass(now);
    let mut out = Vec::new();
    for p in sharing {
        let status = statuses.sharing.get(&p.name_any());
        let urgent = |live: &GpuSharingPolicyStatus, new: &GpuSharingPolicyStatus| {
            live.observed_generation != new.observed_generation
                || !same_conditions(&live.conditions, &new.conditions)
        };
        let kind = PolicyKind::GpuSharingPolicy;
        out.extend(changed(
            (kind, p),
            p.status.as_ref(),
            status,
            urgent,
            written,
        ));
    }
    for t in teams {
        let status = statuses.teams.get(&t.name_any());
        let urgent = |live: &TeamGpuPolicyStatus, new: &TeamGpuPolicyStatus| {
            live.observed_generation != new.observed_generation
                || live.namespaces != new.namespaces
                || !same_use(live, new)
                || !same_conditions(&live.conditions, &new.conditions)
        };
        let kind = PolicyKind::TeamGpuPolicy;
        out.extend(changed(
            (kind, t),
            t.status.as_ref(),
            status,
            urgent,
            written,
        ));
    }
    // The urgent ones first (a stable sort keeps the name order within each).
    out.sort_by_key(|e| !matches!(e, Effect::Status { urgent: true, .. }));
    out
}

/// How often a policy's status is written at most when nothing urgent changed in it.
pub const STATUS_PACE: Duration = Duration::from_secs(1);

/// Whether two statuses of a team count the same use: per sharing policy, the devices its
/// claims request and hold and its Pods wait for.
fn same_use(a: &TeamGpuPolicyStatus, b: &TeamGpuPolicyStatus) -> bool {
    a.quotas.len() == b.quotas.len()
        && (a.quotas.iter().zip(&b.quotas)).all(|(a, b)| {
            (&a.sharing_policy, a.requested, a.allocated, a.pending)
                == (&b.sharing_policy, b.requested, b.allocated, b.pending)
        })
}

/// Whether two lists of conditions say the same (their times aside).
fn same_conditions(a: &[Condition], b: &[Condition]) -> bool {
    fn said(c: &Condition) -> (&str, &str, &str, &str) {
        (&c.type_, &c.status, &c.reason, &c.message)
    }
    a.len() == b.len() && a.iter().zip(b).all(|(a, b)| said(a) == said(b))
}

/// The write of `status` to `policy`, unless it is none, the `live` one already, `written`
/// over the version of `policy` the cache holds, or not `urgent` and paced.
fn changed<S: PartialEq + serde::Serialize>(
    (kind, policy): (PolicyKind, &impl ResourceExt),
    live: Option<&S>,
    status: Option<&S>,
    urgent: impl Fn(&S, &S) -> bool,
    written: &mut WrittenStatuses,
) -> Option<Effect> {
    let new = status.filter(|s| live != Some(*s))?;
    let urgent = live.is_none_or(|live| urgent(live, new));
    let name = policy.name_any();
    if !urgent && written.paced(kind, &name) {
        return None;
    }
    let status = json!(new);
    let version = policy.meta().resource_version.as_deref();
    written
        .to_write(kind, &name, version, &status)
        .then_some(Effect::Status {
            kind,
            name,
            status,
            urgent,
        })
}

/// A custom resource teamgpu could not read into its type (say, written by a newer version).
#[derive(Debug, Clone)]
pub struct Malformed {
    pub object: DynamicObject,
    pub kind: PolicyKind,
    pub message: String,
}

/// The status that tells a person why teamgpu skips a malformed policy: `Ready=False`, reason
/// `Malformed`; `None` when the live status says so already.
pub fn malformed_status(
    live: &Value,
    message: &str,
    generation: Option<i64>,
    now: &Time,
) -> Option<Value> {
    let conditions = live["status"]["conditions"].as_array();
    let current = conditions.and_then(|c| c.iter().find(|c| c["type"] == "Ready"));
    if current.is_some_and(|c| c["reason"] == "Malformed" && c["message"] == message) {
        return None;
    }
    Some(json!({"conditions": [{
        "type": "Ready", "status": "False", "reason": "Malformed", "message": message,
        "observedGeneration": generation, "lastTransitionTime": now,
    }]}))
}

/// The status of each malformed policy that does not report it yet (its status is the only
/// place a person looks).
pub fn malformed_statuses(malformed: &[Malformed], now: &Time) -> Vec<Effect> {
    malformed
        .iter()
        .filter_map(|m| {
            let live = serde_json::to_value(&m.object).unwrap_or_default();
            let status = malformed_status(&live, &m.message, m.object.metadata.generation, now)?;
            Some(Effect::Status {
                kind: m.kind,
                name: m.object.name_any(),
                status,
                urgent: false,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use crate::api::QuotaStatus;
    use crate::core::plan::conditions::DesiredCondition;
    use crate::core::plan::{SharingPolicyReport, TeamReport};

    use super::*;

    fn at(secs: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(secs).unwrap())
    }

    /// Team `ml`, generation 2, in `ml-dev`, entitled to 4 devices of `a100`, Ready; and the
    /// sharing policy `a100` with 8 devices.
    fn plan() -> Plan {
        Plan {
            teams: vec![TeamReport {
                department: None,
                name: "ml".into(),
                generation: Some(2),
                namespaces: vec!["ml-dev".into()].into(),
                quotas: vec![QuotaStatus {
                    sharing_policy: "a100".into(),
                    entitlement: 4,
                    ..QuotaStatus::default()
                }],
                conditions: vec![DesiredCondition::new("Ready", true, "Planned", "ok")],
                ..TeamReport::default()
            }],
            sharing_policies: vec![SharingPolicyReport {
                name: "a100".into(),
                device_class: "a100.teamgpu.io".into(),
                capacity: 8,
                ..SharingPolicyReport::default()
            }],
            ..Plan::default()
        }
    }

    /// What the API server holds of team `ml` after teamgpu wrote its status at second 100 for
    /// `entitlement` devices.
    fn team(name: &str, entitlement: u32) -> TeamGpuPolicy {
        serde_json::from_value(json!({
            "apiVersion": "teamgpu.io/v1alpha1", "kind": "TeamGpuPolicy",
            "metadata": {"name": name, "generation": 2}, "spec": {},
            "status": {
                "observedGeneration": 2,
                "namespaces": ["ml-dev"],
                "namespaceCount": 1,
                "totals": {"guaranteed": 0, "entitlement": entitlement, "allocated": 0,
                           "pending": 0},
                "quotas": [{"sharingPolicy": "a100", "guaranteed": 0, "effectiveGuarantee": 0,
                            "limit": 0, "weight": 0, "capacity": 0, "entitlement": entitlement,
                            "borrowed": 0, "requested": 0, "allocated": 0, "pending": 0,
                            "reserved": 0}],
                "conditions": [{"type": "Ready", "status": "True", "reason": "Planned",
                                "message": "ok", "observedGeneration": 2,
                                "lastTransitionTime": "1970-01-01T00:01:40Z"}]
            }
        }))
        .unwrap()
    }

    /// The statuses of [`plan`] at second 200, nothing refused.
    fn planned(sharing: &[GpuSharingPolicy], teams: &[TeamGpuPolicy]) -> PolicyStatuses {
        applied_statuses(
            &plan(),
            sharing,
            teams,
            &RefusedByOwner::default(),
            &at(200),
        )
    }

    #[test]
    fn only_statuses_that_differ_from_the_live_ones_are_written() {
        let policy: GpuSharingPolicy = serde_json::from_value(json!({
            "apiVersion": "teamgpu.io/v1alpha1", "kind": "GpuSharingPolicy",
            "metadata": {"name": "a100"}, "spec": {}
        }))
        .unwrap();
        // The team's status is as planned; a team the plan does not know of gets none.
        let (sharing, teams) = ([policy], [team("ml", 4), team("gone", 1)]);
        let written = status_changes(
            &planned(&sharing, &teams),
            &sharing,
            &teams,
            &mut WrittenStatuses::default(),
            Instant::now(),
        );
        assert_eq!(
            written,
            [Effect::Status {
                kind: PolicyKind::GpuSharingPolicy,
                name: "a100".into(),
                status: json!({"deviceClassName": "a100.teamgpu.io", "devices": 8,
                               "allocated": 0, "usedOutsideTeams": 0}),
                // Its first status.
                urgent: true,
            }]
        );
    }

    #[test]
    fn a_changed_entitlement_rewrites_the_status_and_keeps_the_transition_time() {
        let teams = [team("ml", 3)];
        let written = status_changes(
            &planned(&[], &teams),
            &[],
            &teams,
            &mut WrittenStatuses::default(),
            Instant::now(),
        );
        let expected = json!({
            "observedGeneration": 2,
            "namespaces": ["ml-dev"],
            "namespaceCount": 1,
            "totals": {"guaranteed": 0, "entitlement": 4, "allocated": 0, "pending": 0},
            "quotas": [{"sharingPolicy": "a100", "guaranteed": 0, "effectiveGuarantee": 0,
                        "limit": 0, "weight": 0, "capacity": 0, "entitlement": 4,
                        "borrowed": 0, "requested": 0, "allocated": 0, "pending": 0,
                        "reserved": 0}],
            "conditions": [{"type": "Ready", "status": "True", "reason": "Planned",
                            "message": "ok", "observedGeneration": 2,
                            "lastTransitionTime": "1970-01-01T00:01:40Z"}]
        });
        assert_eq!(
            written,
            [Effect::Status {
                kind: PolicyKind::TeamGpuPolicy,
                name: "ml".into(),
                status: expected,
                urgent: false,
            }]
        );
    }

    /// Names and urgency of `effects`, all statuses.
    fn statuses_written(effects: &[Effect]) -> Vec<(&str, bool)> {
        (effects.iter())
            .map(|e| match e {
                Effect::Status { name, urgent, .. } => (name.as_str(), *urgent),
                other => panic!("not a status: {other:?}"),
            })
            .collect()
    }

    #[test]
    fn the_team_whose_claims_changed_is_written_first_and_the_others_at_most_once_a_second() {
        // `ml` now requests a device (its own claim); `cv` only lost a device of its
        // entitlement to it, and the pool now has one more device allocated.
        let report = |name: &str, entitlement, requested| TeamReport {
            name: name.into(),
            generation: Some(2),
            namespaces: vec!["ml-dev".into()].into(),
            quotas: vec![QuotaStatus {
                sharing_policy: "a100".into(),
                entitlement,
                requested,
                ..QuotaStatus::default()
            }],
            conditions: vec![DesiredCondition::new("Ready", true, "Planned", "ok")],
            ..TeamReport::default()
        };
        let plan_of = |cv, ml_requested| Plan {
            teams: vec![report("cv", cv, 0), report("ml", 4, ml_requested)],
            ..plan()
        };
        let sharing: [GpuSharingPolicy; 1] = [serde_json::from_value(json!({
            "apiVersion": "teamgpu.io/v1alpha1", "kind": "GpuSharingPolicy",
            "metadata": {"name": "a100"}, "spec": {},
            "status": {"deviceClassName": "a100.teamgpu.io", "devices": 7, "allocated": 0,
                       "usedOutsideTeams": 0}
        }))
        .unwrap()];
        let teams = [team("cv", 4), team("ml", 4)];
        let mut written = WrittenStatuses::default();
        let pass = |plan: &Plan, now: Instant, written: &mut WrittenStatuses| {
            let refused = RefusedByOwner::default();
            let statuses = applied_statuses(plan, &sharing, &teams, &refused, &at(200));
            let effects = status_changes(&statuses, &sharing, &teams, written, now);
            let keys: Vec<(PolicyKind, String)> = (effects.iter())
                .map(|e| match e {
                    Effect::Status { kind, name, .. } => (*kind, name.clone()),
                    other => panic!("not a status: {other:?}"),
                })
                .collect();
            written.settle(&keys);
            effects
        };
        let t0 = Instant::now();
        let first = pass(&plan_of(3, 1), t0, &mut written);
        assert_eq!(
            statuses_written(&first),
            [("ml", true), ("a100", false), ("cv", false)]
        );
        assert_eq!(written.next_wake(), None);
        // 0.2 s later `ml` claims another device and `cv` loses another (the watch has not
        // brought the writes back: the live statuses are still the old ones). `ml`'s is
        // written at once; `cv`'s waits until a second after it was written; the pool's is
        // the one written already.
        let after = |ms| t0 + Duration::from_millis(ms);
        let second = pass(&plan_of(2, 2), after(200), &mut written);
        assert_eq!(statuses_written(&second), [("ml", true)]);
        assert_eq!(written.next_wake(), Some(t0 + STATUS_PACE));
        let early = pass(&plan_of(2, 2), after(900), &mut written);
        assert_eq!(statuses_written(&early), []);
        let due = pass(&plan_of(2, 2), t0 + STATUS_PACE, &mut written);
        assert_eq!(statuses_written(&due), [("cv", false)]);
        assert_eq!(written.next_wake(), None);
    }

    #[test]
    fn a_malformed_policy_is_reported_once() {
        let now = Time(k8s_openapi::jiff::Timestamp::from_second(1).unwrap());
        let status = malformed_status(&json!({}), "bad weight", Some(3), &now).unwrap();
        assert_eq!(status["conditions"][0]["reason"], "Malformed");
        assert_eq!(status["conditions"][0]["observedGeneration"], 3);
        let live = json!({"status": status});
        assert_eq!(malformed_status(&live, "bad weight", Some(3), &now), None);
        assert!(malformed_status(&live, "another problem", Some(4), &now).is_some());
    }

    #[test]
    fn a_malformed_policy_gets_a_status_of_its_kind_until_it_shows_the_problem() {
        let object = |status: Value| -> DynamicObject {
            serde_json::from_value(json!({
                "apiVersion": "teamgpu.io/v1alpha1", "kind": "TeamGpuPolicy",
                "metadata": {"name": "t", "generation": 5}, "spec": {"weight": "many"},
                "status": status
            }))
            .unwrap()
        };
        let malformed = |status| Malformed {
            object: object(status),
            kind: PolicyKind::TeamGpuPolicy,
            message: "bad weight".into(),
        };
        let reported = json!({"conditions": [{
            "type": "Ready", "status": "False", "reason": "Malformed", "message": "bad weight",
            "observedGeneration": 5, "lastTransitionTime": "1970-01-01T00:00:07Z",
        }]});
        assert_eq!(
            malformed_statuses(&[malformed(json!({}))], &at(7)),
            [Effect::Status {
                kind: PolicyKind::TeamGpuPolicy,
                name: "t".into(),
                status: reported.clone(),
                urgent: false,
            }]
        );
        assert_eq!(malformed_statuses(&[malformed(reported)], &at(9)), []);
    }
}
