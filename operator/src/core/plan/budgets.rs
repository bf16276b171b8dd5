//! Budgets in GPU-equivalents (`spec.budget`), of a team or a department: what its claims are
//! charged across its sharing policies, and how that holds its quotas in each.

use std::collections::BTreeMap;

use super::demand::Demand;
use super::equivalents::{self, PerDevice};
use super::identity::name_of;
use super::membership::Membership;
use super::objects::device_class_name;
use super::policies::CompiledPolicy;
use super::types::clamp;
use crate::api::{Entitlement, TeamGpuPolicy};

/// Per team or department with `spec.budget`, what its claims are charged in GPU-equivalents
/// and what that leaves each of its sharing policies.
pub type Budgets = BTreeMap<String, Budget>;

/// A budget as the fair shares apply it: in each of the holder's policies, its limit (and
/// guarantee) held to what its claims are charged there plus the devices the budget's rest pays
/// for at the policy's rate (`used + floor(left ÷ GE per device)`); under a department, each
/// team and department below it held the same way, to what it is charged itself plus that rest.
/// Claims made in two policies, or by two members, within one pass may each fit alone and
/// together go over: [`Budget::over`] says by how much.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Budget {
    /// `spec.budget.gpuEquivalents`, in millionths.
    pub budget: u128,
    /// What the holder's claims are charged (a department's: those of the teams under it),
    /// every policy at its rate, in millionths.
    pub in_use: u128,
    /// Per policy the holder has a quota for: devices charged and GE per device.
    pub policies: BTreeMap<String, (u32, u64)>,
}

impl Budget {
    /// What is left for new claims, in millionths.
    pub fn left(&self) -> u128 {
        self.budget.saturating_sub(self.in_use)
    }

    /// How far use is over the budget, in millionths.
    pub fn over(&self) -> u128 {
        self.in_use.saturating_sub(self.budget)
    }

    /// The most devices of `policy` the budget lets one charged `used` there hold: the holder
    /// itself, or a team or department below it.
    fn cap(&self, policy: &str, used: u32) -> Option<u32> {
        let &(_, per_device) = self.policies.get(policy)?;
        let more = self.left() / u128::from(per_device.max(1));
        Some(clamp(
            u64::try_from(u128::from(used) + more).unwrap_or(u64::MAX),
        ))
    }
}

/// `entitlement` (of `node` in `policy`'s pool) held to what `node`'s own budget and those of
/// the departments above it let it hold.
pub fn held(
    node: &str,
    (policy, class): (&str, &str),
    (membership, demand): (&Membership, &Demand),
    budgets: &Budgets,
    mut entitlement: Entitlement,
) -> Entitlement {
    if budgets.is_empty() {
        return entitlement;
    }
    let mut used = None;
    let mut at = Some(node);
    while let Some(holder) = at {
        if let Some(budget) = budgets.get(holder) {
            let used = *used.get_or_insert_with(|| charged(node, class, membership, demand));
            if let Some(cap) = budget.cap(policy, used) {
                let e = &mut entitlement;
                e.limit = e.limit.min(cap);
                e.guaranteed = e.guaranteed.min(cap);
                e.lending_limit = e.lending_limit.map(|l| l.min(e.guaranteed));
            }
        }
        at = membership.tree.parent.get(holder).map(String::as_str);
    }
    entitlement
}

/// Devices the claims of `owner` (a team, or every team under a department) are charged in
/// `class`: what they request or hold, whichever is more, namespace by namespace.
fn charged(owner: &str, class: &str, membership: &Membership, demand: &Demand) -> u32 {
    let teams = match membership.tree.is_department(owner) {
        true => membership.tree.teams_under(owner),
        false => vec![owner],
    };
    let used: u64 = (teams.iter())
        .filter_map(|team| membership.namespaces.get(*team))
        .flat_map(|namespaces| namespaces.iter())
        .map(|ns| demand.usage(ns, class))
        .map(|u| u.requested.max(u.allocated))
        .sum();
    clamp(used)
}

/// The [`Budget`] of every team and department that sets one.
pub fn budgets(
    teams: &[&TeamGpuPolicy],
    policies: &[CompiledPolicy],
    membership: &Membership,
    demand: &Demand,
    per_device: &BTreeMap<String, PerDevice>,
) -> Budgets {
    let usable: BTreeMap<&str, &CompiledPolicy> = (policies.iter())
        .filter(|p| p.usable())
        .map(|p| (p.name.as_str(), p))
        .collect();
    (teams.iter())
        .filter_map(|team| {
            let budget = team.spec.budget.as_ref()?;
            let name = name_of(*team);
            let mut out = Budget {
                budget: u128::from(budget.gpu_equivalents) * u128::from(equivalents::MICRO),
                in_use: 0,
                policies: BTreeMap::new(),
            };
            for quota in &team.spec.quotas {
                let Some(policy) = usable.get(quota.sharing_policy.as_str()) else {
                    continue;
                };
                let used = charged(&name, &device_class_name(&policy.name), membership, demand);
                let rate = per_device
                    .get(&policy.name)
                    .map_or(equivalents::MICRO, |p| p.micro);
                out.in_use += equivalents::of(used, rate);
                out.policies.insert(policy.name.clone(), (used, rate));
            }
            Some((name, out))
        })
        .collect()
}
