//! A team's status: its quotas, their totals and its conditions.

use std::collections::BTreeMap;

use super::super::conditions::{DesiredCondition, types};
use super::super::demand::Demand;
use super::super::membership::Membership;
use super::super::objects::device_class_name;
use super::super::policies::CompiledPolicy;
use super::super::{TeamReport, clamp, name_of};
use crate::api::{QuotaStatus, TeamGpuPolicy};
use crate::core::fairshare::{PoolShares, TeamShare};

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

    let mut conds = team_findings((&name, membership), &scaled, &unknown);
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
        None if team.spec.department => match membership.tree.children.get(&name) {
            Some(members) => (
                true,
                "Planned",
                format!("department of {}: {}", members.len(), members.join(", ")),
            ),
            None => (
                false,
                "NoMembers",
                "no team names the department as its parent".to_owned(),
            ),
        },
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
    conds.extend(parent_condition(team, &name, membership));
    TeamReport {
        department: membership.tree.parent.get(&name).cloned(),
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

/// Whether a team or department with `spec.parent` is planned under it, and if not, why.
fn parent_condition(
    team: &TeamGpuPolicy,
    name: &str,
    membership: &Membership,
) -> Option<DesiredCondition> {
    let parent = team.spec.parent.as_ref()?;
    Some(match membership.tree.problems.get(name) {
        Some(why) => DesiredCondition::new(types::PARENT, false, "ParentIgnored", why.clone()),
        None => DesiredCondition::new(
            types::PARENT,
            true,
            "InDepartment",
            format!("shares department {parent}'s entitlement with its other members first"),
        ),
    })
}

/// A team's conditions besides Ready: namespaces claimed twice, guarantees scaled down, quotas
/// naming sharing policies that are missing or not ready.
fn team_findings(
    (name, membership): (&str, &Membership),
    scaled: &[String],
    unknown: &[String],
) -> Vec<DesiredCondition> {
    let mut conds = Vec::new();
    conds.push(match membership.conflicts.get(name) {
        Some(c) if !c.is_empty() => DesiredCondition::new(
            types::CONFLICT,
            true,
            "NamespaceClaimedTwice",
            c.iter()
                .map(|(ns, others)| {
                    let whose =
                        membership.whose(ns, "it belongs to no team until the overlap is resolved");
                    format!(
                        "namespace {ns} is also claimed by {} ({whose})",
                        others.join(", ")
                    )
                })
                .collect::<Vec<_>>()
                .join("; "),
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
        let pool = shares.get(quota.sharing_policy.as_str());
        let share = pool.and_then(|pool| {
            let mut all = pool.teams.iter().chain(&pool.departments);
            Some((pool.capacity, all.find(|t| t.team == name)?))
        });
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
                    explanation: explain_in_tree(s, pool.map_or(&[][..], |p| &p.departments)),
                    gpu_equivalents: None,
                    members_guaranteed: team.spec.department.then(|| {
                        (pool
                            .into_iter()
                            .flat_map(|p| p.teams.iter().chain(&p.departments)))
                        .filter(|m| m.parent.as_deref() == Some(&*name))
                        .map(|m| m.guaranteed)
                        .sum()
                    }),
                    slice_size: slice.map(str::to_owned),
                }
            }
            None => QuotaStatus {
                guaranteed: entitlement.guaranteed,
                limit: entitlement.limit,
                weight,
                slice_size: slice.map(str::to_owned),
                ..outside_every_pool(&quota.sharing_policy, namespaces, demand)
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

/// A share's explanation, and for a member of a department what each department above it holds
/// for its members (the capacity its level divides).
fn explain_in_tree(share: &TeamShare, departments: &[TeamShare]) -> String {
    let mut out = share.explanation.to_string();
    let mut parent = share.parent.as_deref();
    while let Some(name) = parent {
        let Some(department) = departments.iter().find(|d| d.team == name) else {
            break;
        };
        out.push_str(&format!(
            "; within department {name}: {} ({})",
            department.entitlement, department.explanation
        ));
        parent = department.parent.as_deref();
    }
    out
}

/// A quota entry no pool holds: its policy is missing or not ready, or the team owns no
/// namespace. What the team's claims hold is still told.
fn outside_every_pool(policy: &str, namespaces: &[String], demand: &Demand) -> QuotaStatus {
    let class = device_class_name(policy);
    let used = |of: fn(crate::core::plan::usage::ClassUsage) -> u64| -> u32 {
        (namespaces.iter())
            .map(|ns| clamp(of(demand.usage(ns, &class))))
            .sum()
    };
    QuotaStatus {
        sharing_policy: policy.to_owned(),
        requested: used(|u| u.requested),
        allocated: used(|u| u.allocated),
        explanation: if namespaces.is_empty() {
            "the team owns no namespace".into()
        } else {
            format!("GpuSharingPolicy {policy} is missing or not ready: no devices")
        },
        ..QuotaStatus::default()
    }
}
