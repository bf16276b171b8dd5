//! The evidence: what the Events about the Pod, or its `PodScheduled` condition, say.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Event, Pod};
use k8s_openapi::jiff::Timestamp;

use super::Evidence;

/// The Event reasons that say why a Pod waits for a claim.
pub(super) const CLAIM_CREATION_REASON: &str = "FailedResourceClaimCreation";
const SCHEDULING_REASON: &str = "FailedScheduling";

/// The Events about the Pod that say why it waits (the latest of each reason), else its
/// `PodScheduled` condition.
pub(super) fn evidence(pod: &Pod, events: &[Event]) -> Vec<Evidence> {
    let uid = pod.metadata.uid.as_deref();
    let mut latest: BTreeMap<&str, (&Event, Option<Timestamp>)> = BTreeMap::new();
    for e in events {
        let reason = e.reason.as_deref().unwrap_or_default();
        if ![CLAIM_CREATION_REASON, SCHEDULING_REASON].contains(&reason) {
            continue;
        }
        // An Event of an earlier Pod of the same name.
        if uid.is_some()
            && e.involved_object.uid.is_some()
            && e.involved_object.uid.as_deref() != uid
        {
            continue;
        }
        let at = e
            .last_timestamp
            .as_ref()
            .map(|t| t.0)
            .or(e.event_time.as_ref().map(|t| t.0))
            .or(e.metadata.creation_timestamp.as_ref().map(|t| t.0));
        if latest.get(reason).is_none_or(|(_, seen)| at >= *seen) {
            latest.insert(reason, (e, at));
        }
    }
    let mut out: Vec<Evidence> = latest.into_values().map(|(e, _)| of_event(e)).collect();
    if !out.iter().any(|e| e.reason == SCHEDULING_REASON) {
        out.extend(unschedulable(pod));
    }
    out
}

fn of_event(e: &Event) -> Evidence {
    Evidence {
        reason: e.reason.clone().unwrap_or_default(),
        source: e
            .reporting_component
            .clone()
            .filter(|c| !c.is_empty())
            .or_else(|| e.source.as_ref().and_then(|s| s.component.clone())),
        count: e
            .series
            .as_ref()
            .and_then(|s| s.count)
            .or(e.count)
            .and_then(|n| u32::try_from(n).ok())
            .unwrap_or(1)
            .max(1),
        message: e.message.clone().unwrap_or_default().trim().to_owned(),
    }
}

/// The Pod's `PodScheduled=False` condition, when it has a message.
fn unschedulable(pod: &Pod) -> Option<Evidence> {
    let c = pod
        .status
        .iter()
        .flat_map(|s| s.conditions.iter().flatten())
        .find(|c| c.type_ == "PodScheduled" && c.status == "False")?;
    let message = c.message.as_ref().filter(|m| !m.is_empty())?;
    Some(Evidence {
        reason: format!("PodScheduled={}", c.reason.as_deref().unwrap_or("False")),
        source: None,
        count: 1,
        message: message.clone(),
    })
}
