//! Writes the API server refuses, so that status tells what was applied rather than only what
//! was planned. The executor reports every failed object write; [`Refusals`] keeps, per object,
//! the refusals in a row, the last message and since when, until a write of it succeeds. From
//! that, per owning policy ([`Refusals::of_policies`]): the `Applied` condition (False, reason
//! `WriteRefused`), which keeps `Ready` from being True, and a Warning Event once an object was
//! refused [`EVENT_AFTER`] times in a row. Pure.
//!
//! Owners are as the plan knows them: a quota or template belongs to the team of its namespace,
//! a DeviceClass to its GpuSharingPolicy, a member ClusterRole or binding to its team. The
//! cluster-wide admission policies and bindings belong to every TeamGpuPolicy: they are what
//! keeps each team's devices to its entitlement, so while one is refused no team is fully
//! enforced, and a team's status is where a person looks.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::jiff::Timestamp;
use kube::{Resource, ResourceExt};

use super::{Event, EventType, PolicyKind};
use crate::api::{GpuSharingPolicy, TeamGpuPolicy};
use crate::core::diff::{Kind, ObjectKey};
use crate::core::plan::Plan;
use crate::core::plan::conditions::{DesiredCondition, types};
use crate::core::plan::rbac::member_role_name;

/// Refusals in a row after which the owning policy gets a Warning Event. One refusal may be the
/// admission rules of a moment (a policy just written, a webhook restarting); three in a row,
/// over the backoff's first second or so, are a rule that stands.
pub const EVENT_AFTER: u32 = 3;

/// The reason of the `Applied` condition, of `Ready` while it lasts, and of the Event.
pub const WRITE_REFUSED: &str = "WriteRefused";

/// Objects named in one condition; the rest are counted.
const OBJECTS_SHOWN: usize = 3;

/// How a write failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Failure {
    /// The API server refused it (4xx: forbidden, invalid, denied by admission): the same
    /// write will be refused again until someone changes a rule.
    Refused,
    /// No verdict on the write itself (timeout, 5xx, 429, conflict, transport): tried again.
    Transient,
}

/// A write of an object that failed, as the executor reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FailedWrite {
    pub key: ObjectKey,
    /// `apply`, `recreate` or `delete`.
    pub verb: &'static str,
    /// The API's message (the `Status.message` of its answer), else the error.
    pub message: String,
    pub failure: Failure,
}

/// One object's refusals in a row.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    pub verb: &'static str,
    pub count: u32,
    pub message: String,
    /// The first refusal of the row.
    pub since: Timestamp,
    /// The message of the refusal that reached [`EVENT_AFTER`]: the Event's note, which stays
    /// the same for the row even if the API's words change (one Event per row).
    pub told: Option<String>,
}

/// Refusals in a row, per object, until a write of it succeeds.
#[derive(Debug, Default)]
pub struct Refusals {
    refused: BTreeMap<ObjectKey, Refusal>,
    /// Whether a run of writes was recorded since this process started. Before that nothing is
    /// known, and the `Applied` condition a live status shows is kept (see
    /// [`RefusedByOwner::condition`]): a restart does not flap `Ready`.
    recorded: bool,
}

impl Refusals {
    /// Takes in a run of writes: `failed` and `written` (objects written successfully, which
    /// ends their row). A transient failure neither counts nor ends a row.
    pub fn record<'a>(
        &mut self,
        failed: &[FailedWrite],
        written: impl IntoIterator<Item = &'a ObjectKey>,
        now: Timestamp,
    ) {
        self.recorded = true;
        for key in written {
            self.refused.remove(key);
        }
        for f in failed.iter().filter(|f| f.failure == Failure::Refused) {
            let refusal = self.refused.entry(f.key.clone()).or_insert(Refusal {
                verb: f.verb,
                count: 0,
                message: String::new(),
                since: Timestamp::from_second(now.as_second()).unwrap_or(now),
                told: None,
            });
            refusal.count = refusal.count.saturating_add(1);
            refusal.verb = f.verb;
            refusal.message.clone_from(&f.message);
            if refusal.count >= EVENT_AFTER && refusal.told.is_none() {
                refusal.told = Some(f.message.clone());
            }
        }
    }

    /// The refused objects of each policy of `plan`. Forgets the objects no policy owns any
    /// more (a deleted team's quota, say): an owner that comes back starts afresh.
    pub fn of_policies(&mut self, plan: &Plan) -> RefusedByOwner {
        let mut by_owner: BTreeMap<(PolicyKind, String), Vec<(ObjectKey, Refusal)>> =
            BTreeMap::new();
        self.refused.retain(|key, refusal| {
            let owners = owners(key, plan);
            for owner in &owners {
                let entry = by_owner.entry(owner.clone()).or_default();
                entry.push((key.clone(), refusal.clone()));
            }
            !owners.is_empty()
        });
        RefusedByOwner {
            by_owner,
            known: self.recorded,
        }
    }
}

/// The policies of `plan` that own `key` (see the module documentation).
fn owners(key: &ObjectKey, plan: &Plan) -> Vec<(PolicyKind, String)> {
    let team = |name: &str| (PolicyKind::TeamGpuPolicy, name.to_owned());
    match key.kind {
        Kind::ResourceQuota | Kind::ResourceClaimTemplate => (plan.teams.iter())
            .filter(|t| {
                key.namespace
                    .as_ref()
                    .is_some_and(|n| t.namespaces.contains(n))
            })
            .map(|t| team(&t.name))
            .collect(),
        Kind::DeviceClass => (plan.sharing_policies.iter())
            .filter(|p| p.device_class == key.name)
            .map(|p| (PolicyKind::GpuSharingPolicy, p.name.clone()))
            .collect(),
        Kind::ClusterRole | Kind::ClusterRoleBinding => (plan.teams.iter())
            .filter(|t| member_role_name(&t.name) == key.name)
            .map(|t| team(&t.name))
            .collect(),
        Kind::ValidatingAdmissionPolicy | Kind::ValidatingAdmissionPolicyBinding => {
            plan.teams.iter().map(|t| team(&t.name)).collect()
        }
    }
}

/// The refused objects of each policy, in key order.
#[derive(Debug, Default)]
pub struct RefusedByOwner {
    by_owner: BTreeMap<(PolicyKind, String), Vec<(ObjectKey, Refusal)>>,
    known: bool,
}

/// How a person names an object: `ResourceQuota ml-dev/teamgpu`.
fn shown(key: &ObjectKey) -> String {
    let kind = key.kind.api_resource().kind;
    match &key.namespace {
        Some(ns) => format!("{kind} {ns}/{}", key.name),
        None => format!("{kind} {}", key.name),
    }
}

fn times(n: u32) -> String {
    if n == 1 {
        "once".to_owned()
    } else {
        format!("{n} times")
    }
}

impl RefusedByOwner {
    /// The `Applied` condition of policy `name`: False, naming each refused object, how often
    /// and since when it was refused and the API's message; `None` when nothing is refused.
    /// Before the first run of writes, the condition of the `live` status is kept as it is.
    /// Deterministic: it changes only with a new refusal, so a status settles.
    pub fn condition(
        &self,
        kind: PolicyKind,
        name: &str,
        live: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition],
    ) -> Option<DesiredCondition> {
        let Some(refused) = self.by_owner.get(&(kind, name.to_owned())) else {
            let kept = live
                .iter()
                .find(|c| c.type_ == types::APPLIED && c.status == "False");
            return kept
                .filter(|_| !self.known)
                .map(|c| DesiredCondition::new(types::APPLIED, false, WRITE_REFUSED, &c.message));
        };
        let mut parts: Vec<String> = (refused.iter().take(OBJECTS_SHOWN))
            .map(|(key, r)| {
                format!(
                    "{} ({}) refused {} since {}: {}",
                    shown(key),
                    r.verb,
                    times(r.count),
                    r.since,
                    r.message
                )
            })
            .collect();
        if refused.len() > OBJECTS_SHOWN {
            parts.push(format!(
                "and {} more objects",
                refused.len() - OBJECTS_SHOWN
            ));
        }
        Some(DesiredCondition::new(
            types::APPLIED,
            false,
            WRITE_REFUSED,
            parts.join("; "),
        ))
    }

    /// A Warning Event `WriteRefused` on each policy with an object refused [`EVENT_AFTER`]
    /// times in a row, and on that object too when it is in a namespace (where team members can
    /// read it). The same Event for as long as the row lasts, so [`super::Published`] publishes
    /// it once per row.
    pub fn events(&self, sharing: &[GpuSharingPolicy], teams: &[TeamGpuPolicy]) -> Vec<Event> {
        let mut out = Vec::new();
        for ((kind, name), refused) in &self.by_owner {
            let policy = match kind {
                PolicyKind::TeamGpuPolicy => (teams.iter())
                    .find(|t| t.name_any() == *name)
                    .map(|t| t.object_ref(&())),
                PolicyKind::GpuSharingPolicy => (sharing.iter())
                    .find(|p| p.name_any() == *name)
                    .map(|p| p.object_ref(&())),
            };
            let Some(policy) = policy else { continue };
            for (key, refusal) in refused {
                let Some(message) = &refusal.told else {
                    continue;
                };
                let note = format!(
                    "{} ({}) refused {EVENT_AFTER} times in a row since {}: {message}",
                    shown(key),
                    refusal.verb,
                    refusal.since
                );
                if let Some(namespace) = &key.namespace {
                    out.push(warning(
                        object_ref(key, namespace),
                        format!("{} {name}: {note}", kind.kind()),
                    ));
                }
                out.push(warning(policy.clone(), note));
            }
        }
        out
    }
}

fn warning(regarding: ObjectReference, note: String) -> Event {
    Event {
        regarding,
        type_: EventType::Warning,
        reason: WRITE_REFUSED,
        action: "Apply",
        note,
    }
}

/// The reference to `key` in `namespace`, for an Event about it (the object may not exist).
fn object_ref(key: &ObjectKey, namespace: &str) -> ObjectReference {
    let resource = key.kind.api_resource();
    ObjectReference {
        api_version: Some(resource.api_version),
        kind: Some(resource.kind),
        namespace: Some(namespace.to_owned()),
        name: Some(key.name.clone()),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests;
