//! `teamgpu why pod/NAME`: why a Pod waits for GPUs, in one word (the [`Verdict`]) and the
//! findings behind it: the Pod's team, its claims, the namespace's quota, the team's entitlement,
//! the pool's capacity, who borrows, when reclaim acts and the Pod's place in its team's queue.
//!
//! Pure: [`diagnose()`] reads the [`Facts`] that [`crate::cli::cluster::why_facts`] reads (the Pod, its
//! claims and their templates, the namespace's `teamgpu` ResourceQuota, the policies with their
//! status, the Events about the Pod, the team's pending Pods and the claims of the teams'
//! namespaces); [`text`] renders the [`Why`] for people, and `-o json|yaml` serializes it as it is.
//!
//! The diagnosis reads what the cluster says now, and the numbers the operator last wrote in the
//! TeamGpuPolicies' status; it computes no fair share of its own.

use serde::Serialize;

mod claims;
mod diagnose;
mod evidence;
mod facts;
mod render;

pub use diagnose::{DEFAULT_RECLAIM_GRACE_SECONDS, diagnose};
pub use facts::{Facts, WhyError, pod_name};
pub use render::text;

/// The answer in one word.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Verdict {
    /// Bound to a node, running or done.
    NotWaiting,
    /// Pending, but its devices are allocated: it waits for the scheduler or kubelet.
    Allocated,
    /// It asks for no teamgpu DeviceClass.
    NoTeamgpuClass,
    /// Its namespace belongs to no team.
    NoTeam,
    /// Its team has no quota for the sharing policy it asks for.
    NoEntitlement,
    /// A claim could not be created: the namespace's ResourceQuota has no room.
    Quota,
    /// A claim could not be created for another reason (an Event says which), or not yet.
    ClaimNotCreated,
    /// A claim or template it names does not exist.
    ClaimMissing,
    /// A claim exists but the scheduler could not allocate it.
    Capacity,
}

impl Verdict {
    /// Whether the Pod waits for devices.
    pub fn waiting(self) -> bool {
        !matches!(
            self,
            Verdict::NotWaiting | Verdict::Allocated | Verdict::NoTeamgpuClass
        )
    }
}

/// Where one of the Pod's claims stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ClaimState {
    Allocated,
    /// The claim exists, without allocation.
    Unallocated,
    /// From a template, and the resourceclaim controller has not created it.
    NotCreated,
    /// The claim, or the template to make it from, does not exist.
    Missing,
    /// The resourceclaim controller decided the Pod needs no claim for this entry.
    NotNeeded,
}

/// One entry of the Pod's `spec.resourceClaims`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PodClaim {
    /// The entry's name in the Pod.
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub claim: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub template: Option<String>,
    pub state: ClaimState,
    /// The DeviceClass it asks for (a teamgpu class first, when it asks for several).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device_class: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sharing_policy: Option<String>,
    pub devices: u64,
}

/// The namespace's ResourceQuota for the class the Pod waits for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct QuotaFacts {
    pub namespace: String,
    pub name: String,
    pub device_class: String,
    /// `None`: the namespace has no `teamgpu` ResourceQuota, or it does not count the class.
    pub used: Option<u64>,
    pub hard: Option<u64>,
    /// Devices the Pod's claims not yet created need.
    pub needs: u64,
    /// Whether they fit now (the resourceclaim controller retries).
    pub room: bool,
}

/// The team's numbers for the sharing policy, from its status.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EntitlementFacts {
    pub sharing_policy: String,
    pub guaranteed: u32,
    pub effective_guarantee: u32,
    pub limit: u32,
    pub entitlement: u32,
    pub requested: u32,
    pub allocated: u32,
    pub pending: u32,
    pub borrowed: u32,
    /// Whether the team's requests leave no room for what the Pod needs.
    pub at_entitlement: bool,
    pub explanation: String,
}

/// The pool of the sharing policy.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CapacityFacts {
    pub sharing_policy: String,
    /// Devices available to teams (the status' `capacity`).
    pub capacity: u32,
    /// Devices allocated to the teams' claims.
    pub allocated: u32,
    pub free: u32,
}

/// A team holding more than its effective guarantee.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Borrower {
    pub team: String,
    pub allocated: u32,
    pub effective_guarantee: u32,
    pub above: u32,
}

/// Whether, and when, reclaim acts for the team.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReclaimFacts {
    /// Devices the team holds (allocated).
    pub holds: u32,
    /// min(effective guarantee, requested + pending): below it, reclaim is owed to the team.
    pub owed_up_to: u32,
    pub below: bool,
    /// `spec.reclaim.enabled`; `None`: the operator's `--reclaim` decides.
    pub enabled: Option<bool>,
    pub grace_period_seconds: u64,
    /// Whether the grace period is the team's own (else the operator's default).
    pub grace_from_team: bool,
    /// How long the team's oldest waiting Pod has waited.
    pub waited_seconds: Option<i64>,
    /// When borrowers may be evicted, from now (0: now); `None` when reclaim does not act.
    pub acts_in_seconds: Option<i64>,
}

/// The Pod's place among its team's waiting Pods.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct QueuePlace {
    pub device_class: String,
    pub position: usize,
    pub of: usize,
}

/// An Event about the Pod, or its `PodScheduled` condition.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Evidence {
    pub reason: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    pub count: u32,
    pub message: String,
}

/// The diagnosis.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Why {
    pub namespace: String,
    pub pod: String,
    pub verdict: Verdict,
    pub waiting: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub team: Option<String>,
    pub claims: Vec<PodClaim>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub quota: Option<QuotaFacts>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub entitlement: Option<EntitlementFacts>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub capacity: Option<CapacityFacts>,
    pub borrowers: Vec<Borrower>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reclaim: Option<ReclaimFacts>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queue: Option<QueuePlace>,
    pub evidence: Vec<Evidence>,
}

#[cfg(test)]
mod tests;
