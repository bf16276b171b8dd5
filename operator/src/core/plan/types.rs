//! What a plan is: the objects teamgpu wants ([`DesiredObjects`]), what it concluded about each
//! policy ([`SharingPolicyReport`], [`TeamReport`]), the reclaims it orders, and the statuses
//! they make. Plain data; the Planner (`super::Planner`) builds it.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use k8s_openapi::api::resource::v1::DeviceClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::conditions::{self, DesiredCondition};
use super::inventory::PoolKey;
use super::objects::{NamespacedQuota, NamespacedTemplate};
use super::outside_teams::OutsideTeams;
use crate::api::{
    BudgetStatus, ClassEquivalents, EquivalentTotals, GpuSharingPolicyStatus, QuotaStatus,
    QuotaTotals, SharedGpu, TeamGpuPolicyStatus,
};

/// Every object teamgpu wants to exist. Objects with teamgpu's managed-by label that are not
/// here (and not in `retained_device_classes`) are to be deleted.
#[derive(Clone, Debug, Default, PartialEq)]
///
/// Objects are shared (`Arc`): the operator's planner hands out the same object, not a copy,
/// for as long as it does not change, and its differ tells unchanged objects by that.
pub struct DesiredObjects {
    pub device_classes: Vec<Arc<DeviceClass>>,
    pub claim_templates: Vec<NamespacedTemplate>,
    pub resource_quotas: Vec<Arc<NamespacedQuota>>,
    pub admission_policies: Vec<Arc<ValidatingAdmissionPolicy>>,
    pub admission_bindings: Vec<Arc<ValidatingAdmissionPolicyBinding>>,
    /// What each team's members may read (see [`super::rbac`]).
    pub member_roles: Vec<Arc<ClusterRole>>,
    pub member_bindings: Vec<Arc<ClusterRoleBinding>>,
    /// DeviceClasses of policies whose spec is invalid now: kept as they are rather than applied
    /// or pruned, so a typo never takes a class away from running workloads.
    pub retained_device_classes: BTreeSet<String>,
    /// Owners (`teamgpu.io/owner` values) whose objects are kept as they are: the policy exists
    /// but cannot be read, so what it had is neither changed nor pruned.
    pub retained_owners: BTreeSet<String>,
    /// The namespaces outside every team that a quota of 0 guards, and their label (see
    /// [`super::outside_teams`]); `None` when the bindings do not deny.
    pub outside_teams: Option<Arc<OutsideTeams>>,
}

/// What the planner concluded about one GpuSharingPolicy.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SharingPolicyReport {
    pub name: String,
    pub generation: Option<i64>,
    pub device_class: String,
    pub capacity: u32,
    /// Matching devices allocated to the teams' claims.
    pub allocated: u32,
    /// Matching devices allocated through other DeviceClasses.
    pub used_outside_teams: u32,
    pub gpu_equivalents: Option<ClassEquivalents>,
    /// GPUs shared by many claims that hold claims of two teams or more.
    pub shared_gpus: Vec<SharedGpu>,
    pub conditions: Vec<DesiredCondition>,
}

/// What the planner concluded about one TeamGpuPolicy.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TeamReport {
    pub name: String,
    /// The department the team is planned in (its `spec.parent`, when that is usable).
    pub department: Option<String>,
    pub generation: Option<i64>,
    pub weight: u32,
    /// The team's namespaces, sorted (shared with the membership and the status).
    pub namespaces: Arc<[String]>,
    pub quotas: Vec<QuotaStatus>,
    pub gpu_equivalents: Option<EquivalentTotals>,
    pub budget: Option<BudgetStatus>,
    pub conditions: Vec<DesiredCondition>,
}

/// A borrower that must give devices back, in one sharing policy's pool.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReclaimOrder {
    pub sharing_policy: String,
    pub borrower: String,
    pub devices: u32,
    pub for_team: String,
}

/// The result of planning.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Plan {
    pub objects: DesiredObjects,
    pub sharing_policies: Vec<SharingPolicyReport>,
    pub teams: Vec<TeamReport>,
    pub reclaims: Vec<ReclaimOrder>,
    /// Where the devices are for the teams whose waiting claims fit no node (see
    /// [`super::placement`]), by sharing policy.
    pub placements: Vec<Placement>,
    /// Cluster-wide findings a person should look at, sorted.
    pub warnings: Vec<String>,
}

impl Plan {
    /// The status to write for a sharing policy, given the live one.
    pub fn sharing_status(
        &self,
        name: &str,
        previous: Option<&GpuSharingPolicyStatus>,
        now: &Time,
    ) -> Option<GpuSharingPolicyStatus> {
        self.applied_sharing_status(name, previous, None, now)
    }

    /// [`Plan::sharing_status`] as applied: with `applied`, the `Applied` condition of its
    /// refused writes ([`conditions::with_applied`]).
    pub fn applied_sharing_status(
        &self,
        name: &str,
        previous: Option<&GpuSharingPolicyStatus>,
        applied: Option<DesiredCondition>,
        now: &Time,
    ) -> Option<GpuSharingPolicyStatus> {
        let report = self.sharing_policies.iter().find(|r| r.name == name)?;
        let previous_conditions = previous
            .map(|p| p.conditions.as_slice())
            .unwrap_or_default();
        Some(GpuSharingPolicyStatus {
            observed_generation: report.generation,
            device_class_name: Some(report.device_class.clone()),
            devices: report.capacity,
            allocated: report.allocated,
            used_outside_teams: report.used_outside_teams,
            gpu_equivalents: report.gpu_equivalents.clone(),
            gpus_shared_by_teams: report.shared_gpus.clone(),
            conditions: conditions::merge(
                previous_conditions,
                &conditions::with_applied(&report.conditions, applied),
                report.generation,
                now,
            ),
        })
    }

    /// The status to write for a team, given the live one.
    pub fn team_status(
        &self,
        name: &str,
        previous: Option<&TeamGpuPolicyStatus>,
        now: &Time,
    ) -> Option<TeamGpuPolicyStatus> {
        self.applied_team_status(name, previous, None, now)
    }

    /// [`Plan::team_status`] as applied: with `applied`, the `Applied` condition of its refused
    /// writes ([`conditions::with_applied`]).
    pub fn applied_team_status(
        &self,
        name: &str,
        previous: Option<&TeamGpuPolicyStatus>,
        applied: Option<DesiredCondition>,
        now: &Time,
    ) -> Option<TeamGpuPolicyStatus> {
        let report = self.teams.iter().find(|r| r.name == name)?;
        let previous_conditions = previous
            .map(|p| p.conditions.as_slice())
            .unwrap_or_default();
        Some(TeamGpuPolicyStatus {
            observed_generation: report.generation,
            namespaces: report.namespaces.clone(),
            namespace_count: clamp(report.namespaces.len() as u64),
            totals: totals(&report.quotas),
            quotas: report.quotas.clone(),
            gpu_equivalents: report.gpu_equivalents.clone(),
            budget: report.budget.clone(),
            conditions: conditions::merge(
                previous_conditions,
                &conditions::with_applied(&report.conditions, applied),
                report.generation,
                now,
            ),
        })
    }
}

/// Device counts are u32 everywhere in the plan; a count beyond that is not a real cluster.
pub(super) fn clamp(n: u64) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// Where one sharing policy's devices are, for its teams waiting below their guarantee whose
/// claims fit no node.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Placement {
    pub sharing_policy: String,
    /// The node of each pool of the policy that has one (the pool's slices' `nodeName`).
    pub nodes: BTreeMap<PoolKey, Arc<str>>,
    /// Free devices of the policy per node once the waiting claims that fit are placed; `None`:
    /// the devices of pools without a node, which any claim may use.
    pub free: BTreeMap<Option<Arc<str>>, u32>,
    /// Per waiting team, its claims within its guarantee that fit no node, largest first.
    pub unplaced: BTreeMap<String, Vec<u32>>,
}

/// A team's devices summed over its quota entries, for `kubectl get tgp`.
pub fn totals(quotas: &[QuotaStatus]) -> QuotaTotals {
    QuotaTotals {
        guaranteed: sum(quotas.iter().map(|q| q.guaranteed)),
        entitlement: sum(quotas.iter().map(|q| q.entitlement)),
        allocated: sum(quotas.iter().map(|q| q.allocated)),
        pending: sum(quotas.iter().map(|q| q.pending)),
    }
}

pub(super) fn sum(counts: impl Iterator<Item = u32>) -> u32 {
    counts.fold(0, u32::saturating_add)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quota(
        policy: &str,
        guaranteed: u32,
        entitlement: u32,
        allocated: u32,
        pending: u32,
    ) -> QuotaStatus {
        QuotaStatus {
            sharing_policy: policy.into(),
            guaranteed,
            effective_guarantee: guaranteed,
            entitlement,
            allocated,
            pending,
            requested: allocated + pending,
            ..QuotaStatus::default()
        }
    }

    #[test]
    fn a_teams_totals_add_up_its_quota_entries() {
        let quotas = [
            quota("a100-80gb", 8, 12, 10, 3),
            quota("a100-shared", 2, 2, 1, 0),
            quota("h100", 0, 0, 0, 4),
        ];
        assert_eq!(
            totals(&quotas),
            QuotaTotals {
                guaranteed: 10,
                entitlement: 14,
                allocated: 11,
                pending: 7,
            }
        );
        assert_eq!(totals(&[]), QuotaTotals::default());
    }

    #[test]
    fn totals_saturate_instead_of_wrapping() {
        let quotas = [quota("a", u32::MAX, 0, 0, 0), quota("b", 1, 0, 0, 0)];
        assert_eq!(totals(&quotas).guaranteed, u32::MAX);
    }
}
