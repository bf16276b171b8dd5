//! Events for what a person should know: conflicts, overcommit, quota changes, invalid hardware
//! selectors.
//! An Event is published on a transition (a finding the live status does not show yet), so a
//! restart on a converged cluster publishes nothing.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{Resource, ResourceExt};

use super::{Event, EventType};
use crate::api::{GpuSharingPolicy, TeamGpuPolicy};
use crate::core::plan::conditions::{DesiredCondition, types};
use crate::core::plan::{self, Plan, SharingPolicyReport, TeamReport};

/// Which Event: its object (`kind/namespace/name`), reason and note.
pub type EventKey = (String, &'static str, String);

impl Event {
    pub fn key(&self) -> EventKey {
        let r = &self.regarding;
        let object = format!(
            "{}/{}/{}",
            r.kind.as_deref().unwrap_or_default(),
            r.namespace.as_deref().unwrap_or_default(),
            r.name.as_deref().unwrap_or_default()
        );
        (object, self.reason, self.note.clone())
    }
}

/// The Events `plan` calls for: each finding the live status of its policy (`sharing`, `teams`)
/// does not show yet, on the policy, and each team finding also in every namespace of the team.
pub fn event_transitions(
    plan: &Plan,
    sharing: &[GpuSharingPolicy],
    teams: &[TeamGpuPolicy],
) -> Vec<Event> {
    let mut events = Vec::new();
    for report in &plan.teams {
        if let Some(team) = teams.iter().find(|t| t.name_any() == report.name) {
            events.extend(team_events(report, team));
        }
    }
    for report in &plan.sharing_policies {
        if let Some(policy) = sharing.iter().find(|p| p.name_any() == report.name) {
            events.extend(sharing_events(report, policy));
        }
    }
    // Team members usually cannot read events of cluster-scoped objects (they land in
    // `default`): each team event is also recorded in every namespace of the team.
    let copies: Vec<Event> = events
        .iter()
        .flat_map(|event| {
            let namespaces = plan
                .teams
                .iter()
                .find(|t| {
                    event.regarding.kind.as_deref() == Some("TeamGpuPolicy")
                        && event.regarding.name.as_deref() == Some(t.name.as_str())
                })
                .map(|t| &t.namespaces[..])
                .unwrap_or_default();
            in_team_namespaces(&event.regarding, namespaces)
                .into_iter()
                .map(|(copy, prefix)| Event {
                    regarding: copy,
                    note: format!("{prefix}{}", event.note),
                    ..event.clone()
                })
        })
        .collect();
    events.extend(copies);
    events
}

/// Whether `live` (a policy's conditions) does not show `finding` yet.
fn is_new(live: Option<&[Condition]>, finding: &DesiredCondition) -> bool {
    let status = if finding.status { "True" } else { "False" };
    !live
        .unwrap_or_default()
        .iter()
        .any(|l| l.type_ == finding.type_ && l.status == status && l.message == finding.message)
}

/// A warning on `regarding` for each finding of `desired` that `is_finding` picks and the
/// `live` conditions do not show yet.
fn new_warnings(
    desired: &[DesiredCondition],
    live: Option<&[Condition]>,
    regarding: &ObjectReference,
    is_finding: impl Fn(&DesiredCondition) -> bool,
) -> impl Iterator<Item = Event> {
    desired
        .iter()
        .filter(move |c| is_finding(c) && is_new(live, c))
        .map(|c| Event {
            regarding: regarding.clone(),
            type_: EventType::Warning,
            reason: c.reason,
            action: "Plan",
            note: c.message.clone(),
        })
}

/// A new conflict or overcommit is a warning; a changed entitlement is a `QuotaChanged`.
fn team_events(report: &TeamReport, team: &TeamGpuPolicy) -> Vec<Event> {
    let regarding = team.object_ref(&());
    let live = team.status.as_ref();
    let is_finding = |c: &DesiredCondition| {
        c.status && [types::CONFLICT, types::OVERCOMMITTED].contains(&c.type_)
    };
    let conditions = live.map(|s| s.conditions.as_slice());
    let mut events: Vec<Event> =
        new_warnings(&report.conditions, conditions, &regarding, is_finding).collect();
    for q in &report.quotas {
        let live_quota = live.and_then(|s| {
            s.quotas
                .iter()
                .find(|l| l.sharing_policy == q.sharing_policy)
        });
        if live_quota.map(|l| l.entitlement) != Some(q.entitlement) {
            events.push(Event {
                regarding: regarding.clone(),
                type_: EventType::Normal,
                reason: "QuotaChanged",
                action: "Plan",
                note: format!(
                    "{}: entitlement {} devices ({})",
                    q.sharing_policy, q.entitlement, q.explanation
                ),
            });
        }
    }
    events
}

/// A hardware selector newly found invalid is a warning.
fn sharing_events(report: &SharingPolicyReport, policy: &GpuSharingPolicy) -> Vec<Event> {
    let conditions = policy.status.as_ref().map(|s| s.conditions.as_slice());
    let is_finding = |c: &DesiredCondition| c.type_ == types::SELECTOR_VALID && !c.status;
    new_warnings(
        &report.conditions,
        conditions,
        &policy.object_ref(&()),
        is_finding,
    )
    .collect()
}

/// Where an event about a team (`reference`, its TeamGpuPolicy) is also recorded: the team's
/// ResourceQuota in each of its `namespaces` (an event in a namespace must be about an object
/// there), with the prefix that names the team in the note.
pub fn in_team_namespaces(
    reference: &ObjectReference,
    namespaces: &[String],
) -> Vec<(ObjectReference, String)> {
    let team = reference.name.clone().unwrap_or_default();
    namespaces
        .iter()
        .map(|namespace| {
            let quota = ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("ResourceQuota".into()),
                name: Some(plan::objects::QUOTA_NAME.into()),
                namespace: Some(namespace.clone()),
                ..Default::default()
            };
            (quota, format!("TeamGpuPolicy {team}: "))
        })
        .collect()
}

/// The Events published whose finding the live status may not show yet: the status that
/// records a finding may not be in the cache at the next pass, so what was published stays
/// remembered until the live status stops calling it new.
#[derive(Debug, Default)]
pub struct Published(BTreeSet<EventKey>);

impl Published {
    /// The events of `found` (this pass's transitions) not published yet, each once. Forgets
    /// the published ones no longer found: their finding shows in the live status, or is gone.
    pub fn unpublished(&mut self, found: Vec<Event>) -> Vec<Event> {
        let keys: BTreeSet<EventKey> = found.iter().map(Event::key).collect();
        self.0.retain(|k| keys.contains(k));
        let mut seen = BTreeSet::new();
        found
            .into_iter()
            .filter(|e| {
                let key = e.key();
                !self.0.contains(&key) && seen.insert(key)
            })
            .collect()
    }

    /// `key` was published.
    pub fn record(&mut self, key: EventKey) {
        self.0.insert(key);
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::api::QuotaStatus;

    fn team(status: serde_json::Value) -> TeamGpuPolicy {
        serde_json::from_value(json!({
            "apiVersion": "teamgpu.io/v1alpha1", "kind": "TeamGpuPolicy",
            "metadata": {"name": "ml", "uid": "u-ml"}, "spec": {}, "status": status
        }))
        .unwrap()
    }

    fn sharing_policy(status: serde_json::Value) -> GpuSharingPolicy {
        serde_json::from_value(json!({
            "apiVersion": "teamgpu.io/v1alpha1", "kind": "GpuSharingPolicy",
            "metadata": {"name": "a100", "uid": "u-a100"}, "spec": {}, "status": status
        }))
        .unwrap()
    }

    fn quota(entitlement: u32) -> QuotaStatus {
        QuotaStatus {
            sharing_policy: "a100".into(),
            entitlement,
            explanation: "its guarantee".into(),
            ..QuotaStatus::default()
        }
    }

    /// A plan in which team `ml` (namespaces `ml-dev`, `ml-train`) conflicts and is entitled
    /// to 4 devices of `a100`, whose hardware selector is invalid.
    fn plan() -> Plan {
        Plan {
            teams: vec![TeamReport {
                department: None,
                name: "ml".into(),
                namespaces: vec!["ml-dev".into(), "ml-train".into()].into(),
                quotas: vec![quota(4)],
                conditions: vec![
                    DesiredCondition::new("Ready", true, "Planned", "ok"),
                    DesiredCondition::new(
                        "Conflict",
                        true,
                        "NamespaceClaimed",
                        "ml-dev is also robotics'",
                    ),
                ],
                ..TeamReport::default()
            }],
            sharing_policies: vec![SharingPolicyReport {
                name: "a100".into(),
                conditions: vec![DesiredCondition::new(
                    "SelectorValid",
                    false,
                    "InvalidSelector",
                    "no such attribute",
                )],
                ..SharingPolicyReport::default()
            }],
            ..Plan::default()
        }
    }

    /// The reference to a teamgpu policy with uid `u-<name>`.
    fn policy_ref(kind: &str, name: &str) -> ObjectReference {
        ObjectReference {
            api_version: Some("teamgpu.io/v1alpha1".into()),
            kind: Some(kind.into()),
            name: Some(name.into()),
            uid: Some(format!("u-{name}")),
            ..Default::default()
        }
    }

    fn team_ref() -> ObjectReference {
        policy_ref("TeamGpuPolicy", "ml")
    }

    fn quota_ref(namespace: &str) -> ObjectReference {
        ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("ResourceQuota".into()),
            name: Some("teamgpu".into()),
            namespace: Some(namespace.into()),
            ..Default::default()
        }
    }

    fn event(
        regarding: ObjectReference,
        type_: EventType,
        reason: &'static str,
        note: &str,
    ) -> Event {
        Event {
            regarding,
            type_,
            reason,
            action: "Plan",
            note: note.into(),
        }
    }

    #[test]
    fn a_team_event_is_copied_to_the_quota_of_each_team_namespace() {
        let team = ObjectReference {
            api_version: Some("teamgpu.io/v1alpha1".into()),
            kind: Some("TeamGpuPolicy".into()),
            name: Some("ml-research".into()),
            ..Default::default()
        };
        let copies = in_team_namespaces(&team, &["ml-dev".into(), "ml-train".into()]);
        let shown: Vec<(String, String, String, String)> = copies
            .into_iter()
            .map(|(r, prefix)| {
                (
                    r.kind.unwrap(),
                    r.namespace.unwrap(),
                    r.name.unwrap(),
                    prefix,
                )
            })
            .collect();
        assert_eq!(
            shown,
            [
                (
                    "ResourceQuota".into(),
                    "ml-dev".into(),
                    "teamgpu".into(),
                    "TeamGpuPolicy ml-research: ".into()
                ),
                (
                    "ResourceQuota".into(),
                    "ml-train".into(),
                    "teamgpu".into(),
                    "TeamGpuPolicy ml-research: ".into()
                ),
            ]
        );
    }

    #[test]
    fn new_findings_are_events_on_the_policy_and_in_the_teams_namespaces() {
        let events = event_transitions(&plan(), &[sharing_policy(json!({}))], &[team(json!({}))]);
        let conflict = "ml-dev is also robotics'";
        let quota_changed = "a100: entitlement 4 devices (its guarantee)";
        assert_eq!(
            events,
            [
                event(team_ref(), EventType::Warning, "NamespaceClaimed", conflict),
                event(team_ref(), EventType::Normal, "QuotaChanged", quota_changed),
                event(
                    policy_ref("GpuSharingPolicy", "a100"),
                    EventType::Warning,
                    "InvalidSelector",
                    "no such attribute"
                ),
                event(
                    quota_ref("ml-dev"),
                    EventType::Warning,
                    "NamespaceClaimed",
                    "TeamGpuPolicy ml: ml-dev is also robotics'"
                ),
                event(
                    quota_ref("ml-train"),
                    EventType::Warning,
                    "NamespaceClaimed",
                    "TeamGpuPolicy ml: ml-dev is also robotics'"
                ),
                event(
                    quota_ref("ml-dev"),
                    EventType::Normal,
                    "QuotaChanged",
                    "TeamGpuPolicy ml: a100: entitlement 4 devices (its guarantee)"
                ),
                event(
                    quota_ref("ml-train"),
                    EventType::Normal,
                    "QuotaChanged",
                    "TeamGpuPolicy ml: a100: entitlement 4 devices (its guarantee)"
                ),
            ]
        );
    }

    #[test]
    fn findings_the_live_status_shows_are_no_event_so_a_converged_restart_publishes_nothing() {
        let condition = |type_: &str, status: &str, message: &str| {
            json!({"type": type_, "status": status, "reason": "R", "message": message,
                   "lastTransitionTime": "2026-01-01T00:00:00Z"})
        };
        let team = team(json!({
            "conditions": [condition("Conflict", "True", "ml-dev is also robotics'")],
            "quotas": [{"sharingPolicy": "a100", "guaranteed": 0, "effectiveGuarantee": 0,
                        "limit": 0, "weight": 1, "capacity": 0, "entitlement": 4, "borrowed": 0,
                        "requested": 0, "allocated": 0, "pending": 0}]
        }));
        let policy = sharing_policy(json!({
            "conditions": [condition("SelectorValid", "False", "no such attribute")]
        }));
        assert_eq!(event_transitions(&plan(), &[policy], &[team]), []);
    }

    #[test]
    fn a_finding_with_another_message_or_a_new_entitlement_is_an_event_again() {
        let team = team(json!({
            "conditions": [{"type": "Conflict", "status": "True", "reason": "R",
                            "message": "ml-train is also robotics'",
                            "lastTransitionTime": "2026-01-01T00:00:00Z"}],
            "quotas": [{"sharingPolicy": "a100", "guaranteed": 0, "effectiveGuarantee": 0,
                        "limit": 0, "weight": 1, "capacity": 0, "entitlement": 3, "borrowed": 0,
                        "requested": 0, "allocated": 0, "pending": 0}]
        }));
        let reasons: Vec<(String, &str)> = event_transitions(&plan(), &[], &[team])
            .into_iter()
            .map(|e| (e.regarding.kind.unwrap(), e.reason))
            .collect();
        assert_eq!(
            reasons,
            [
                ("TeamGpuPolicy".to_owned(), "NamespaceClaimed"),
                ("TeamGpuPolicy".to_owned(), "QuotaChanged"),
                ("ResourceQuota".to_owned(), "NamespaceClaimed"),
                ("ResourceQuota".to_owned(), "NamespaceClaimed"),
                ("ResourceQuota".to_owned(), "QuotaChanged"),
                ("ResourceQuota".to_owned(), "QuotaChanged"),
            ]
        );
    }

    #[test]
    fn an_event_is_published_once_while_its_finding_stays_new() {
        let warning = event(team_ref(), EventType::Warning, "NamespaceClaimed", "ml-dev");
        let changed = event(team_ref(), EventType::Normal, "QuotaChanged", "4 devices");
        let mut published = Published::default();
        // Found twice in one pass: published once.
        let first = published.unpublished(vec![warning.clone(), changed.clone(), warning.clone()]);
        assert_eq!(first, [warning.clone(), changed.clone()]);
        // The warning was published; the quota change failed and is tried again.
        published.record((
            "TeamGpuPolicy//ml".into(),
            "NamespaceClaimed",
            "ml-dev".into(),
        ));
        assert_eq!(
            published.unpublished(vec![warning.clone(), changed.clone()]),
            [changed]
        );
        // The status shows the finding (it is no longer found), then the finding comes back.
        assert_eq!(published.unpublished(vec![]), []);
        assert_eq!(published.unpublished(vec![warning.clone()]), [warning]);
    }
}
