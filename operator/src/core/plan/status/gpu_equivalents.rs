//! Status in GPU-equivalents: a policy's devices and a team's, and what a team's budget leaves.

use std::collections::BTreeSet;

use super::super::conditions::{DesiredCondition, types};
use super::super::equivalents;
use super::super::policies::CompiledPolicy;
use super::super::{SharingPolicyReport, TeamReport};
use super::Inputs;
use crate::api::{BudgetStatus, ClassEquivalents, EquivalentTotals, QuotaEquivalents, SharedGpu};

/// A policy's devices in GPU-equivalents, and for devices that many claims share, those that
/// hold claims of two teams or more.
pub(super) fn equivalents_of_policy(
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
pub(super) fn equivalents_of_team(report: &mut TeamReport, inputs: &Inputs) {
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
