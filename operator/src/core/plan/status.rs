//! Phase 6, status: what the planner concluded about each policy and team, with the conditions
//! a person reads, and the cluster-wide warnings.

use std::collections::{BTreeMap, BTreeSet};

use super::conditions::{DesiredCondition, types};
use super::counters::{self, SharedCounters};
use super::equivalents::{self, PerDevice};
use super::inventory::{DeviceId, Inventory, MatchReport};
use super::membership::Membership;
use super::objects::device_class_name;
use super::policies::CompiledPolicy;
use super::shares::{Budgets, Demand};
use super::{Plan, SharingPolicyReport, TeamReport, clamp, name_of};
use crate::api::{
    BudgetStatus, ClassEquivalents, DEFAULT_DRIVER, EquivalentTotals, QuotaEquivalents,
    QuotaStatus, QuotaTotals, SharedGpu, SharingStrategy, TeamGpuPolicy,
};
use crate::core::fairshare::PoolShares;

/// What the reports are made of.
pub struct Inputs<'a> {
    pub policies: &'a [CompiledPolicy<'a>],
    pub teams: &'a [&'a TeamGpuPolicy],
    pub membership: &'a Membership,
    pub shares: &'a BTreeMap<&'a str, &'a PoolShares>,
    pub demand: &'a Demand<'a>,
    pub matches: &'a MatchReport,
    /// Per policy, its devices allocated outside teams, with the claim holding each.
    pub outside: &'a BTreeMap<String, BTreeMap<&'a DeviceId, &'a str>>,
    pub inventory: &'a Inventory,
    pub shared: &'a SharedCounters,
    /// Per policy, the contested counter groups it was given.
    pub allotted: &'a counters::Allotted,
    /// Per policy, GPU-equivalents of one device.
    pub per_device: &'a BTreeMap<String, PerDevice>,
    pub budgets: &'a Budgets,
}

/// The reports of every policy and team, and the warnings, into `out`.
pub fn reports(inputs: &Inputs, out: &mut Plan) {
    let by_name: BTreeMap<&str, &CompiledPolicy> = inputs
        .policies
        .iter()
        .map(|p| (p.name.as_str(), p))
        .collect();
    for policy in inputs.policies {
        let outside = inputs.outside.get(policy.name.as_str());
        let matched = (inputs.matches.counts.get(&policy.name).copied()).unwrap_or(0);
        let pool = inputs.shares.get(policy.name.as_str());
        // What the teams' pool got (contested counter groups included), and what is allocated
        // outside teams, which the pool leaves out.
        let capacity = match pool {
            Some(pool) => pool.capacity + outside.map_or(0, |o| clamp(o.len() as u64)),
            None => inputs.shared.capacity(&policy.name, matched),
        };
        let allocated = pool.map_or(0, |pool| sum(pool.teams.iter().map(|t| t.allocated)));
        let mut report = sharing_report(
            policy,
            (capacity, allocated),
            outside,
            inputs.matches,
            inputs.inventory,
        );
        if policy.compiled.is_ok()
            && let Some(condition) =
                counters::condition(&policy.name, capacity, inputs.shared, inputs.allotted)
        {
            report.conditions.push(condition);
        }
        if policy.compiled.is_ok() {
            equivalents_of_policy(&mut report, policy, inputs);
        }
        out.sharing_policies.push(report);
    }
    for team in inputs.teams {
        let mut report = team_report(
            team,
            inputs.membership,
            &by_name,
            inputs.shares,
            inputs.demand,
        );
        equivalents_of_team(&mut report, inputs);
        out.teams.push(report);
    }
    warnings(inputs, &by_name, out);
    out.warnings.sort();
    out.warnings.dedup();
}

/// A policy's devices in GPU-equivalents, and for devices that many claims share, those that
/// hold claims of two teams or more.
fn equivalents_of_policy(
    report: &mut SharingPolicyReport,
    policy: &CompiledPolicy,
    inputs: &Inputs,
) {
    let Some(per) = inputs.per_device.get(&policy.name) else {
        return;
    };
    report.gpu_equivalents = Some(ClassEquivalents {
        per_device: equivalents::format(u128::from(per.micro)),
        source: per.source.describe().to_owned(),
        devices: equivalents::format(equivalents::of(report.capacity, per.micro)),
        allocated: equivalents::format(equivalents::of(report.allocated, per.micro)),
    });
    let Some(consumable) = inputs.shared.consumable.get(&policy.name) else {
        return;
    };
    let shared: Vec<SharedGpu> = (inputs.shared.shared_devices.iter())
        .filter(|d| d.policies.contains(&policy.name))
        .filter_map(|d| {
            let teams: BTreeSet<String> = (d.namespaces.iter())
                .map(|ns| inputs.membership.team_of(ns).unwrap_or("-").to_owned())
                .collect();
            (teams.len() > 1).then(|| SharedGpu {
                device: d.id.to_string(),
                teams: teams.into_iter().collect(),
            })
        })
        .collect();
    let listed: Vec<String> = (shared.iter().take(3))
        .map(|g| format!("{} ({})", g.device, g.teams.join(", ")))
        .collect();
    report.conditions.push(if shared.is_empty() {
        DesiredCondition::new(
            types::GPUS_SHARED_BY_TEAMS,
            false,
            "NoGpuShared",
            format!(
                "{} matching GPUs are shared by many claims; none holds claims of two teams",
                consumable.devices
            ),
        )
    } else {
        DesiredCondition::new(
            types::GPUS_SHARED_BY_TEAMS,
            true,
            "GpusShared",
            format!(
                "{} of {} matching GPUs hold claims of two teams or more: {}{}",
                shared.len(),
                consumable.devices,
                listed.join(", "),
                if shared.len() > listed.len() {
                    ", ..."
                } else {
                    ""
                }
            ),
        )
    });
    report.shared_gpus = shared.into_iter().take(16).collect();
}

/// A team's devices in GPU-equivalents, and what its budget leaves.
fn equivalents_of_team(report: &mut TeamReport, inputs: &Inputs) {
    let mut totals = (0u128, 0u128, 0u128);
    for quota in &mut report.quotas {
        let Some(per) = inputs.per_device.get(&quota.sharing_policy) else {
            continue;
        };
        let at_rate = |n: u32| equivalents::of(n, per.micro);
        totals.0 += at_rate(quota.guaranteed);
        totals.1 += at_rate(quota.entitlement);
        totals.2 += at_rate(quota.allocated);
        quota.gpu_equivalents = Some(QuotaEquivalents {
            per_device: equivalents::format(u128::from(per.micro)),
            entitlement: equivalents::format(at_rate(quota.entitlement)),
            allocated: equivalents::format(at_rate(quota.allocated)),
        });
    }
    if !report.quotas.is_empty() {
        report.gpu_equivalents = Some(EquivalentTotals {
            guaranteed: equivalents::format(totals.0),
            entitlement: equivalents::format(totals.1),
            allocated: equivalents::format(totals.2),
        });
    }
    let Some(budget) = inputs.budgets.get(&report.name) else {
        return;
    };
    let whole = budget.budget / u128::from(equivalents::MICRO);
    report.budget = Some(BudgetStatus {
        gpu_equivalents: u32::try_from(whole).unwrap_or(u32::MAX),
        in_use: equivalents::format(budget.in_use),
        left: equivalents::format(budget.left()),
    });
    let (in_use, whole) = (equivalents::format(budget.in_use), whole.to_string());
    report.conditions.push(if budget.over() == 0 {
        DesiredCondition::new(
            types::BUDGET,
            true,
            "WithinBudget",
            format!(
                "{in_use} of {whole} GPU-equivalents in use; each quota holds at most what it uses plus what the {} left pays for",
                equivalents::format(budget.left())
            ),
        )
    } else {
        DesiredCondition::new(
            types::BUDGET,
            false,
            "OverBudget",
            format!(
                "{in_use} of {whole} GPU-equivalents in use, {} over (claims made in several sharing policies at once, or a budget lowered below what runs): nothing is evicted for it; new claims wait until use is below the budget",
                equivalents::format(budget.over())
            ),
        )
    });
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

fn sum(counts: impl Iterator<Item = u32>) -> u32 {
    counts.fold(0, u32::saturating_add)
}

/// Findings a person should look at: namespaces claimed twice, quotas naming missing policies,
/// policies that match nothing, devices two policies match.
fn warnings(inputs: &Inputs, by_name: &BTreeMap<&str, &CompiledPolicy>, out: &mut Plan) {
    let (membership, matches) = (inputs.membership, inputs.matches);
    for (team, conflicts) in &membership.conflicts {
        for (namespace, others) in conflicts {
            if team < others.iter().min().unwrap_or(team) {
                continue; // report each conflict once, from its last team
            }
            out.warnings.push(format!(
                "namespace {namespace} is claimed by TeamGpuPolicies {}: it belongs to none of them",
                others.iter().chain(std::iter::once(team)).cloned().collect::<BTreeSet<_>>().into_iter().collect::<Vec<_>>().join(", ")
            ));
        }
    }
    for team in &out.teams {
        for quota in &team.quotas {
            if !by_name.contains_key(quota.sharing_policy.as_str()) {
                out.warnings.push(format!(
                    "TeamGpuPolicy {} names GpuSharingPolicy {}, which does not exist",
                    team.name, quota.sharing_policy
                ));
            }
        }
    }
    for (name, found) in &inputs.shared.consumable {
        if found.unbounded > 0 {
            out.warnings.push(format!(
                "sharing policy {name}: {} matching devices allow multiple allocations and a claim of its class takes none of their capacity, so any number of claims share each (counted once): use sharing.strategy MemorySlices",
                found.unbounded
            ));
        }
        if found.unfit > 0 {
            out.warnings.push(format!(
                "sharing policy {name}: {} matching devices cannot hold one of its claims: their capacity's requestPolicy refuses the amount (above its max, or off its steps)",
                found.unfit
            ));
        }
    }
    for report in &out.sharing_policies {
        if report.capacity == 0
            && by_name
                .get(report.name.as_str())
                .is_some_and(|p| p.compiled.is_ok())
        {
            out.warnings.push(format!(
                "GpuSharingPolicy {} matches no device",
                report.name
            ));
        }
    }
    for ((a, b), devices) in &matches.overlap_pairs {
        out.warnings.push(format!(
            "GpuSharingPolicies {a} and {b} both match {devices} devices"
        ));
    }
}

/// A policy's report; `(capacity, allocated)`: its devices available to teams, and of those
/// allocated to the teams' claims.
pub fn sharing_report(
    policy: &CompiledPolicy,
    (capacity, allocated): (u32, u32),
    outside: Option<&BTreeMap<&DeviceId, &str>>,
    matches: &MatchReport,
    inventory: &Inventory,
) -> SharingPolicyReport {
    let mut conds = Vec::new();
    match &policy.compiled {
        Ok(_) => conds.push(DesiredCondition::new(
            types::SELECTOR_VALID,
            true,
            "Compiled",
            "all selector expressions compile",
        )),
        Err(e) => conds.push(DesiredCondition::new(
            types::SELECTOR_VALID,
            false,
            "InvalidSelector",
            e.to_string(),
        )),
    }
    if policy.compiled.is_ok() {
        conds.extend(device_conditions(
            policy, capacity, outside, matches, inventory,
        ));
    }
    let class = device_class_name(&policy.name);
    conds.push(if policy.foreign_class {
        DesiredCondition::new(
            types::DEVICE_CLASS_CONFLICT,
            true,
            "NotManaged",
            format!("DeviceClass {class} exists and is not managed by teamgpu; it is left alone"),
        )
    } else {
        DesiredCondition::new(
            types::DEVICE_CLASS_CONFLICT,
            false,
            "Managed",
            format!("DeviceClass {class} is managed by teamgpu"),
        )
    });
    let spec = &policy.policy.spec;
    // A memory slice is shared by allocation, whatever the driver: it takes no configuration.
    let unsupported = spec.driver != DEFAULT_DRIVER
        && !matches!(
            spec.sharing.strategy,
            SharingStrategy::Exclusive | SharingStrategy::MemorySlices
        );
    let ready = policy.usable() && !unsupported;
    let (reason, message) = if !ready {
        match (&policy.compiled, policy.foreign_class) {
            (Err(_), _) => (
                "InvalidSelector",
                "the selector is invalid; the last applied DeviceClass is kept".to_owned(),
            ),
            (_, true) => (
                "DeviceClassConflict",
                format!("DeviceClass {class} belongs to someone else"),
            ),
            _ => (
                "SharingUnsupported",
                format!(
                    "sharing strategy {:?} is only configured for driver {DEFAULT_DRIVER}",
                    spec.sharing.strategy
                ),
            ),
        }
    } else {
        (
            "Planned",
            format!("DeviceClass {class} selects {capacity} devices"),
        )
    };
    conds.push(DesiredCondition::new(types::READY, ready, reason, message));
    SharingPolicyReport {
        name: policy.name.clone(),
        generation: policy.policy.metadata.generation,
        device_class: class,
        capacity,
        allocated,
        used_outside_teams: outside.map_or(0, |o| clamp(o.len() as u64)),
        gpu_equivalents: None,
        shared_gpus: Vec::new(),
        conditions: conds,
    }
}

pub fn team_report(
    team: &TeamGpuPolicy,
    membership: &Membership,
    by_name: &BTreeMap<&str, &CompiledPolicy>,
    shares: &BTreeMap<&str, &PoolShares>,
    demand: &Demand,
) -> TeamReport {
    let name = name_of(team);
    let namespaces = membership
        .namespaces
        .get(&name)
        .cloned()
        .unwrap_or_default();
    let QuotaStatuses {
        mut quotas,
        unknown,
        scaled,
        invalid,
    } = quota_statuses(team, &name, &namespaces, by_name, shares, demand);
    quotas.sort_by(|a, b| a.sharing_policy.cmp(&b.sharing_policy));

    let mut conds = team_findings(membership.conflicts.get(&name), &scaled, &unknown);
    let label_selector_error = membership.label_selector_errors.get(&name);
    let (ready, reason, message) = match label_selector_error {
        Some(e) => (
            false,
            "InvalidNamespaceSelector",
            format!("namespaceSelector: {e}"),
        ),
        None if !invalid.is_empty() => (
            false,
            "InvalidQuota",
            format!(
                "{}: these entries get no devices (a hard of 0; what runs keeps running)",
                invalid.join("; ")
            ),
        ),
        None if !unknown.is_empty() => (
            false,
            "SharingPolicyNotReady",
            format!(
                "no devices for {}: the GpuSharingPolicies are missing or not ready",
                unknown.join(", ")
            ),
        ),
        None if namespaces.is_empty() => (
            false,
            "NoNamespaces",
            "no namespace belongs to the team".to_owned(),
        ),
        None => (
            true,
            "Planned",
            format!(
                "quotas and templates planned in {} namespaces",
                namespaces.len()
            ),
        ),
    };
    let mut message = message;
    if let Some(missing) = membership.missing.get(&name) {
        message.push_str(&format!(
            "; listed namespaces not found: {}",
            missing.join(", ")
        ));
    }
    conds.push(DesiredCondition::new(types::READY, ready, reason, message));
    TeamReport {
        name,
        generation: team.metadata.generation,
        weight: team.spec.weight,
        namespaces,
        quotas,
        gpu_equivalents: None,
        budget: None,
        conditions: conds,
    }
}

/// A team's conditions besides Ready: namespaces claimed twice, guarantees scaled down, quotas
/// naming sharing policies that are missing or not ready.
fn team_findings(
    conflicts: Option<&BTreeMap<String, Vec<String>>>,
    scaled: &[String],
    unknown: &[String],
) -> Vec<DesiredCondition> {
    let mut conds = Vec::new();
    conds.push(match conflicts {
        Some(c) if !c.is_empty() => DesiredCondition::new(
            types::CONFLICT,
            true,
            "NamespaceClaimedTwice",
            c.iter()
                .map(|(ns, others)| {
                    format!("namespace {ns} is also claimed by {}", others.join(", "))
                })
                .collect::<Vec<_>>()
                .join("; ")
                + ": such namespaces belong to no team until the overlap is resolved",
        ),
        _ => DesiredCondition::new(
            types::CONFLICT,
            false,
            "NoConflict",
            "no namespace is claimed by another team",
        ),
    });
    conds.push(if scaled.is_empty() {
        DesiredCondition::new(
            types::OVERCOMMITTED,
            false,
            "GuaranteesFit",
            "every guarantee fits its pool's capacity",
        )
    } else {
        DesiredCondition::new(
            types::OVERCOMMITTED,
            true,
            "GuaranteesScaledDown",
            format!(
                "guarantees exceed capacity, scaled in proportion: {}",
                scaled.join("; ")
            ),
        )
    });
    conds.push(if unknown.is_empty() {
        DesiredCondition::new(
            types::SHARING_POLICIES_RESOLVED,
            true,
            "AllFound",
            "every quota names a ready GpuSharingPolicy",
        )
    } else {
        DesiredCondition::new(
            types::SHARING_POLICIES_RESOLVED,
            false,
            "SharingPolicyNotReady",
            format!(
                "quotas name GpuSharingPolicies that are missing or not ready: {}",
                unknown.join(", ")
            ),
        )
    });
    conds
}

/// What a policy whose class expressions compile matches: devices found, devices used outside
/// teams, overlap with other policies.
fn device_conditions(
    policy: &CompiledPolicy,
    capacity: u32,
    outside: Option<&BTreeMap<&DeviceId, &str>>,
    matches: &MatchReport,
    inventory: &Inventory,
) -> Vec<DesiredCondition> {
    let mut conds = Vec::new();
    let found = capacity > 0;
    let slices = inventory.device_count();
    let message = match matches.errors.get(&policy.name) {
        Some(errors) => format!(
            "{capacity} devices match; the selectors failed to evaluate on {} devices",
            errors.devices
        ),
        None if found => format!("{capacity} devices match"),
        None => match policy.slice() {
            Some(size) => format!(
                "the selectors match none of the {slices} published devices (slices of {size} are cut only from GPUs that allow multiple allocations, allowMultipleAllocations, and have at least {size} of memory)"
            ),
            None => format!("the selectors match none of the {slices} published devices"),
        },
    };
    let message = match matches.tainted.get(&policy.name) {
        Some(t) => format!(
            "{message}; {} more are tainted NoSchedule or NoExecute ({}) and not counted",
            t.devices,
            t.keys
                .iter()
                .map(String::as_str)
                .collect::<Vec<_>>()
                .join(", ")
        ),
        None => message,
    };
    conds.push(DesiredCondition::new(
        types::DEVICES_FOUND,
        found,
        if found {
            "DevicesMatched"
        } else {
            "NoMatchingDevices"
        },
        message,
    ));
    let overlapping: Vec<String> = matches
        .overlap_pairs
        .iter()
        .filter_map(|((a, b), n)| {
            if a == &policy.name {
                Some(format!("{b} ({n} devices)"))
            } else if b == &policy.name {
                Some(format!("{a} ({n} devices)"))
            } else {
                None
            }
        })
        .collect();
    let used_outside = outside.map_or(0, |o| clamp(o.len() as u64));
    conds.push(match outside.filter(|o| !o.is_empty()) {
        Some(o) => {
            let claims: BTreeSet<&str> = o.values().copied().collect();
            let shown: Vec<&str> = claims.iter().copied().take(5).collect();
            let more = claims.len() - shown.len();
            DesiredCondition::new(
                types::USED_OUTSIDE_TEAMS,
                true,
                "AllocatedOutsideTeams",
                format!(
                    "{used_outside} of {capacity} matching devices are allocated through other DeviceClasses, to {}{}: teams share the other {}",
                    shown.join(", "),
                    if more > 0 { format!(" and {more} more claims") } else { String::new() },
                    capacity.saturating_sub(used_outside)
                ),
            )
        }
        None => DesiredCondition::new(
            types::USED_OUTSIDE_TEAMS,
            false,
            "NoneOutsideTeams",
            "no matching device is allocated outside teams",
        ),
    });
    conds.push(if overlapping.is_empty() {
        DesiredCondition::new(
            types::OVERLAPPING,
            false,
            "NoOverlap",
            "no other GpuSharingPolicy matches the same devices",
        )
    } else {
        DesiredCondition::new(
            types::OVERLAPPING,
            true,
            "DevicesShared",
            format!("devices also match {}", overlapping.join(", ")),
        )
    });
    conds
}

/// A team's status per quota, with the sharing policies that are missing or not ready, the
/// guarantees scaled down to fit and the entries whose amounts do not count in their policy's
/// devices.
struct QuotaStatuses {
    quotas: Vec<QuotaStatus>,
    unknown: Vec<String>,
    scaled: Vec<String>,
    invalid: Vec<String>,
}

fn quota_statuses(
    team: &TeamGpuPolicy,
    name: &str,
    namespaces: &[String],
    by_name: &BTreeMap<&str, &CompiledPolicy>,
    shares: &BTreeMap<&str, &PoolShares>,
    demand: &Demand,
) -> QuotaStatuses {
    let mut quotas = Vec::new();
    let mut unknown = Vec::new();
    let mut scaled = Vec::new();
    let mut invalid = Vec::new();
    for quota in &team.spec.quotas {
        let weight = quota.weight.unwrap_or(team.spec.weight);
        let slice = by_name
            .get(quota.sharing_policy.as_str())
            .and_then(|p| p.slice());
        let entitlement = match quota.entitlement(slice) {
            Ok(e) => e,
            Err(e) => {
                invalid.push(format!("quota for {}: {e}", quota.sharing_policy));
                quotas.push(QuotaStatus {
                    sharing_policy: quota.sharing_policy.clone(),
                    weight,
                    explanation: format!("no devices: {e}"),
                    ..QuotaStatus::default()
                });
                continue;
            }
        };
        let share = shares
            .get(quota.sharing_policy.as_str())
            .and_then(|pool| Some((pool.capacity, pool.teams.iter().find(|t| t.team == name)?)));
        if !by_name
            .get(quota.sharing_policy.as_str())
            .is_some_and(|p| p.usable())
        {
            unknown.push(quota.sharing_policy.clone());
        }
        let class = device_class_name(&quota.sharing_policy);
        let status = match share {
            Some((capacity, s)) => {
                if s.scaled_down {
                    scaled.push(format!(
                        "{}: {} of {} guaranteed",
                        quota.sharing_policy, s.effective_guarantee, s.guaranteed
                    ));
                }
                QuotaStatus {
                    sharing_policy: quota.sharing_policy.clone(),
                    guaranteed: entitlement.guaranteed,
                    effective_guarantee: s.effective_guarantee,
                    limit: entitlement.limit,
                    weight,
                    capacity,
                    entitlement: s.entitlement,
                    borrowed: s.borrowed,
                    requested: s.requested,
                    allocated: s.allocated,
                    pending: s.pending,
                    reserved: s.reserved,
                    oldest_pending_since: (s.pending > 0)
                        .then(|| demand.oldest_pending(namespaces, &class))
                        .flatten()
                        .map(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time),
                    explanation: s.explanation.to_string(),
                    gpu_equivalents: None,
                }
            }
            None => QuotaStatus {
                sharing_policy: quota.sharing_policy.clone(),
                guaranteed: entitlement.guaranteed,
                limit: entitlement.limit,
                weight,
                requested: namespaces
                    .iter()
                    .map(|ns| clamp(demand.usage(ns, &class).requested))
                    .sum(),
                allocated: namespaces
                    .iter()
                    .map(|ns| clamp(demand.usage(ns, &class).allocated))
                    .sum(),
                explanation: if namespaces.is_empty() {
                    "the team owns no namespace".into()
                } else {
                    format!(
                        "GpuSharingPolicy {} is missing or not ready: no devices",
                        quota.sharing_policy
                    )
                },
                ..QuotaStatus::default()
            },
        };
        quotas.push(status);
    }
    QuotaStatuses {
        quotas,
        unknown,
        scaled,
        invalid,
    }
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
