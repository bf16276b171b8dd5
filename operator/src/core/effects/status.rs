//! The status of each policy as teamgpu writes it ([`applied_statuses`]), and which of them to
//! write: only those that differ from the live ones, so a steady state writes none.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
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
/// `teams`, unless it was `written` over the version the cache holds.
pub fn status_changes(
    statuses: &PolicyStatuses,
    sharing: &[GpuSharingPolicy],
    teams: &[TeamGpuPolicy],
    written: &mut WrittenStatuses,
) -> Vec<Effect> {
    let mut out = Vec::new();
    for p in sharing {
        let status = statuses.sharing.get(&p.name_any());
        let kind = PolicyKind::GpuSharingPolicy;
        out.extend(changed(kind, p, p.status.as_ref(), status, written));
    }
    for t in teams {
        let status = statuses.teams.get(&t.name_any());
        let kind = PolicyKind::TeamGpuPolicy;
        out.extend(changed(kind, t, t.status.as_ref(), status, written));
    }
    out
}

/// The write of `status` to `policy`, unless it is none, the `live` one already, or `written`
/// over the version of `policy` the cache holds.
fn changed<S: PartialEq + serde::Serialize>(
    kind: PolicyKind,
    policy: &impl ResourceExt,
    live: Option<&S>,
    status: Option<&S>,
    written: &mut WrittenStatuses,
) -> Option<Effect> {
    let status = json!(status.filter(|s| live != Some(*s))?);
    let name = policy.name_any();
    let version = policy.meta().resource_version.as_deref();
    written
        .to_write(kind, &name, version, &status)
        .then_some(Effect::Status { kind, name, status })
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
                namespaces: vec!["ml-dev".into()],
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
        );
        assert_eq!(
            written,
            [Effect::Status {
                kind: PolicyKind::GpuSharingPolicy,
                name: "a100".into(),
                status: json!({"deviceClassName": "a100.teamgpu.io", "devices": 8,
                               "allocated": 0, "usedOutsideTeams": 0}),
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
            }]
        );
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
            }]
        );
        assert_eq!(malformed_statuses(&[malformed(reported)], &at(9)), []);
    }
}
