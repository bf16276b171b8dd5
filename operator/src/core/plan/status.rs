//! Phase 6, status: what the planner concluded about each policy and team, with the conditions
//! a person reads, and the cluster-wide warnings.

use std::collections::{BTreeMap, BTreeSet};

use super::conditions::{DesiredCondition, types};
use super::counters::{self, SharedCounters};
use super::inventory::{DeviceId, Inventory, MatchReport};
use super::membership::Membership;
use super::objects::device_class_name;
use super::policies::CompiledPolicy;
use super::shares::Demand;
use super::{Plan, SharingPolicyReport, TeamReport, clamp, name_of};
use crate::api::{DEFAULT_DRIVER, QuotaStatus, QuotaTotals, SharingStrategy, TeamGpuPolicy};
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
        out.sharing_policies.push(report);
    }
    for team in inputs.teams {
        out.teams.push(team_report(
            team,
            inputs.membership,
            &by_name,
            inputs.shares,
            inputs.demand,
        ));
    }
    warnings(inputs, &by_name, out);
    out.warnings.sort();
    out.warnings.dedup();
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
    let unsupported =
        spec.driver != DEFAULT_DRIVER && spec.sharing.strategy != SharingStrategy::Exclusive;
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
    let (mut quotas, unknown, scaled) =
        quota_statuses(team, &name, &namespaces, by_name, shares, demand);
    quotas.sort_by(|a, b| a.sharing_policy.cmp(&b.sharing_policy));

    let mut conds = team_findings(membership.conflicts.get(&name), &scaled, &unknown);
    let label_selector_error = membership.label_selector_errors.get(&name);
    let (ready, reason, message) = match label_selector_error {
        Some(e) => (
            false,
            "InvalidNamespaceSelector",
            format!("namespaceSelector: {e}"),
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
        None => format!("the selectors match none of the {slices} published devices"),
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

/// A team's status per quota, with the sharing policies that are missing or not ready and the
/// guarantees scaled down to fit.
fn quota_statuses(
    team: &TeamGpuPolicy,
    name: &str,
    namespaces: &[String],
    by_name: &BTreeMap<&str, &CompiledPolicy>,
    shares: &BTreeMap<&str, &PoolShares>,
    demand: &Demand,
) -> (Vec<QuotaStatus>, Vec<String>, Vec<String>) {
    let mut quotas = Vec::new();
    let mut unknown = Vec::new();
    let mut scaled = Vec::new();
    for quota in &team.spec.quotas {
        let weight = quota.weight.unwrap_or(team.spec.weight);
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
                    guaranteed: quota.guaranteed,
                    effective_guarantee: s.effective_guarantee,
                    limit: quota.effective_limit(),
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
                }
            }
            None => QuotaStatus {
                sharing_policy: quota.sharing_policy.clone(),
                guaranteed: quota.guaranteed,
                limit: quota.effective_limit(),
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
    (quotas, unknown, scaled)
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
