//! What a team member sees on a Pod that waits because its team's quota is full: an Event on the
//! Pod naming the team, how much of its entitlement is in use, and the Pod's place in the team's
//! queue. Pure.

use k8s_openapi::api::core::v1::ObjectReference;

use super::{Event, EventType, WaitingPod};
use crate::core::plan::{Plan, objects};

/// Places in a team's queue told exactly; a Pod further back is told it is further back, so that
/// a long queue moving by one does not publish an Event for every Pod in it.
const PLACES_TOLD: usize = 10;

/// An Event on each waiting Pod (`WaitingForQuota`): which team, how many of its entitled
/// devices are in use, and its place among the team's waiting Pods of that class (highest
/// priority first, then the longest waiting).
pub fn waiting_events(plan: &Plan, waiting: &[WaitingPod]) -> Vec<Event> {
    let mut out = Vec::new();
    for pod in waiting {
        let Some(team) = (plan.teams.iter()).find(|t| t.namespaces.contains(&pod.namespace)) else {
            continue;
        };
        for (class, devices) in &pod.charge {
            let Some(quota) = (team.quotas.iter())
                .find(|q| objects::device_class_name(&q.sharing_policy) == *class)
            else {
                continue;
            };
            let queue: Vec<&WaitingPod> = (waiting.iter())
                .filter(|w| team.namespaces.contains(&w.namespace) && w.charge.contains_key(class))
                .collect();
            let ahead = (queue.iter())
                .filter(|w| {
                    (
                        w.priority,
                        std::cmp::Reverse(w.created),
                        &w.namespace,
                        &w.name,
                    ) > (
                        pod.priority,
                        std::cmp::Reverse(pod.created),
                        &pod.namespace,
                        &pod.name,
                    )
                })
                .count();
            let place = if ahead < PLACES_TOLD {
                format!("place {} of {} in the team's queue", ahead + 1, queue.len())
            } else {
                format!("behind {PLACES_TOLD} others in the team's queue")
            };
            out.push(Event {
                regarding: ObjectReference {
                    api_version: Some("v1".into()),
                    kind: Some("Pod".into()),
                    namespace: Some(pod.namespace.clone()),
                    name: Some(pod.name.clone()),
                    ..Default::default()
                },
                type_: EventType::Normal,
                reason: "WaitingForQuota",
                action: "Plan",
                note: format!(
                    "waits for {devices} devices of {}: team {} has {} of its {} in use ({}); \
                     {place} (priority, then age)",
                    quota.sharing_policy,
                    team.name,
                    quota.requested,
                    quota.entitlement,
                    quota.explanation
                ),
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::api::QuotaStatus;
    use crate::core::plan::TeamReport;

    fn pod(ns: &str, name: &str, priority: i32, created: &str, devices: u64) -> WaitingPod {
        WaitingPod {
            namespace: ns.into(),
            name: name.into(),
            priority,
            created: created.parse().ok(),
            charge: BTreeMap::from([("a100.teamgpu.io".to_owned(), devices)]),
        }
    }

    #[test]
    fn a_waiting_pod_is_told_its_team_what_is_in_use_and_its_place() {
        let plan = Plan {
            teams: vec![TeamReport {
                department: None,
                name: "ml".into(),
                namespaces: vec!["ml-dev".into(), "ml-train".into()].into(),
                quotas: vec![QuotaStatus {
                    sharing_policy: "a100".into(),
                    requested: 8,
                    entitlement: 8,
                    explanation: "8 guaranteed; no idle device to borrow".into(),
                    ..QuotaStatus::default()
                }],
                ..TeamReport::default()
            }],
            ..Plan::default()
        };
        let waiting = [
            pod("ml-dev", "notebook", 0, "2026-01-01T00:00:00Z", 1),
            pod("ml-train", "train", 1000, "2026-01-02T00:00:00Z", 4),
            pod("other", "stranger", 0, "2026-01-01T00:00:00Z", 1),
        ];
        let notes: Vec<(String, String)> = waiting_events(&plan, &waiting)
            .into_iter()
            .map(|e| (e.regarding.name.unwrap_or_default(), e.note))
            .collect();
        assert_eq!(
            notes,
            [
                (
                    "notebook".to_owned(),
                    "waits for 1 devices of a100: team ml has 8 of its 8 in use (8 guaranteed; \
                     no idle device to borrow); place 2 of 2 in the team's queue (priority, \
                     then age)"
                        .to_owned()
                ),
                (
                    "train".to_owned(),
                    "waits for 4 devices of a100: team ml has 8 of its 8 in use (8 guaranteed; \
                     no idle device to borrow); place 1 of 2 in the team's queue (priority, \
                     then age)"
                        .to_owned()
                ),
            ]
        );
    }
}
