//! Status conditions: what the planner wants them to say, and merging that into the live list
//! without reconcile storms. Pure.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

/// A condition as the planner decides it; timestamps are the writer's business.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DesiredCondition {
    pub type_: &'static str,
    pub status: bool,
    pub reason: &'static str,
    pub message: String,
}

impl DesiredCondition {
    pub fn new(
        type_: &'static str,
        status: bool,
        reason: &'static str,
        message: impl Into<String>,
    ) -> Self {
        Self {
            type_,
            status,
            reason,
            message: message.into(),
        }
    }
}

/// Condition types teamgpu sets.
pub mod types {
    pub const READY: &str = "Ready";
    pub const SELECTOR_VALID: &str = "SelectorValid";
    pub const DEVICES_FOUND: &str = "DevicesFound";
    pub const OVERLAPPING: &str = "Overlapping";
    pub const DEVICE_CLASS_CONFLICT: &str = "DeviceClassConflict";
    pub const CONFLICT: &str = "Conflict";
    pub const OVERCOMMITTED: &str = "Overcommitted";
    pub const SHARING_POLICIES_RESOLVED: &str = "SharingPoliciesResolved";
    pub const USED_OUTSIDE_TEAMS: &str = "UsedOutsideTeams";
    /// Only on a policy whose devices draw on shared counters (partitionable devices).
    pub const SHARED_COUNTERS: &str = "SharedCounters";
    /// Only on a policy whose devices many claims share (allowMultipleAllocations).
    pub const GPUS_SHARED_BY_TEAMS: &str = "GpusSharedByTeams";
    /// Only on a team with `spec.budget`.
    pub const BUDGET: &str = "Budget";
    /// Only on a team or department with `spec.parent`.
    pub const PARENT: &str = "Parent";
    /// Only while the API server refuses a write of the policy's objects (set by
    /// `core::effects::refusals`, not by the planner): status then tells what was applied.
    pub const APPLIED: &str = "Applied";
}

fn status_str(status: bool) -> &'static str {
    if status { "True" } else { "False" }
}

/// `desired` as applied: with `applied` (the `Applied` condition, when a write of the policy's
/// objects is refused) added, and `Ready` False while it is False, for its reason; a `Ready`
/// the plan already made False keeps the plan's reason, the more basic one.
pub fn with_applied(
    desired: &[DesiredCondition],
    applied: Option<DesiredCondition>,
) -> std::borrow::Cow<'_, [DesiredCondition]> {
    let Some(applied) = applied else {
        return std::borrow::Cow::Borrowed(desired);
    };
    let mut out: Vec<DesiredCondition> = desired
        .iter()
        .map(|c| match c {
            c if c.type_ == types::READY && c.status && !applied.status => DesiredCondition::new(
                types::READY,
                false,
                applied.reason,
                "the API server refuses writes of this policy's objects: see condition Applied",
            ),
            c => c.clone(),
        })
        .collect();
    out.push(applied);
    std::borrow::Cow::Owned(out)
}

/// The condition list to write: `desired`, sorted by type, keeping `lastTransitionTime` from
/// `previous` unless the status really changed, so that a recompute with the same outcome
/// writes nothing.
pub fn merge(
    previous: &[Condition],
    desired: &[DesiredCondition],
    generation: Option<i64>,
    now: &Time,
) -> Vec<Condition> {
    let mut merged: Vec<Condition> = desired
        .iter()
        .map(|d| {
            let status = status_str(d.status);
            let last_transition_time = previous
                .iter()
                .find(|p| p.type_ == d.type_ && p.status == status)
                .map_or_else(|| now.clone(), |p| p.last_transition_time.clone());
            Condition {
                type_: d.type_.to_owned(),
                status: status.to_owned(),
                reason: d.reason.to_owned(),
                message: d.message.clone(),
                observed_generation: generation,
                last_transition_time,
            }
        })
        .collect();
    merged.sort_by(|a, b| a.type_.cmp(&b.type_));
    merged
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(secs).unwrap())
    }

    #[test]
    fn transition_time_moves_only_when_the_status_changes() {
        let ready = |s| DesiredCondition::new(types::READY, s, "Planned", "ok");
        let first = merge(&[], &[ready(true)], Some(1), &at(100));
        assert_eq!(first[0].last_transition_time, at(100));

        let same = merge(
            &first,
            &[DesiredCondition {
                message: "new words".into(),
                ..ready(true)
            }],
            Some(2),
            &at(200),
        );
        assert_eq!(same[0].last_transition_time, at(100));
        assert_eq!(same[0].message, "new words");
        assert_eq!(same[0].observed_generation, Some(2));

        let flipped = merge(&same, &[ready(false)], Some(2), &at(300));
        assert_eq!(flipped[0].last_transition_time, at(300));
        assert_eq!(flipped[0].status, "False");
    }

    #[test]
    fn a_refused_write_makes_a_ready_policy_not_ready_and_leaves_other_reasons_alone() {
        let ready = DesiredCondition::new(types::READY, true, "Planned", "ok");
        let refused =
            DesiredCondition::new(types::APPLIED, false, "WriteRefused", "ResourceQuota a/b");
        let alone = std::slice::from_ref(&ready);
        assert_eq!(*with_applied(alone, None), *alone);
        let desired = [ready];
        let shown = with_applied(&desired, Some(refused.clone()));
        let summary: Vec<(&str, bool, &str)> = shown
            .iter()
            .map(|c| (c.type_, c.status, c.reason))
            .collect();
        assert_eq!(
            summary,
            [
                ("Ready", false, "WriteRefused"),
                ("Applied", false, "WriteRefused")
            ]
        );
        // A team that is not ready for a reason of the plan keeps that reason.
        let no_namespaces = DesiredCondition::new(types::READY, false, "NoNamespaces", "none");
        let desired = [no_namespaces.clone()];
        let shown = with_applied(&desired, Some(refused.clone()));
        assert_eq!(*shown, [no_namespaces, refused]);
    }

    #[test]
    fn conditions_are_sorted_so_output_is_deterministic() {
        let out = merge(
            &[],
            &[
                DesiredCondition::new(types::READY, true, "A", ""),
                DesiredCondition::new(types::CONFLICT, false, "B", ""),
            ],
            None,
            &at(0),
        );
        assert_eq!(
            out.iter().map(|c| c.type_.as_str()).collect::<Vec<_>>(),
            ["Conflict", "Ready"]
        );
    }
}
