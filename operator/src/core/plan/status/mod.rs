//! Phase 6, status: what the planner concluded about each policy and team, with the conditions
//! a person reads, and the cluster-wide warnings.

use std::collections::{BTreeMap, BTreeSet};

use super::budgets::Budgets;
use super::conditions::{DesiredCondition, types};
use super::counters;
use super::demand::Demand;
use super::equivalents::PerDevice;
use super::inventory::{DeviceId, Inventory, MatchReport};
use super::membership::Membership;
use super::objects::device_class_name;
use super::policies::CompiledPolicy;
use super::shared_counters::SharedCounters;
use super::team_gpus::TeamGpus;
use super::{Plan, SharingPolicyReport, clamp};
use crate::api::{DEFAULT_DRIVER, SharingStrategy, TeamGpuPolicy};
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
    /// Per policy of `placement: TeamGpus`, the GPUs of each team.
    pub team_gpus: &'a BTreeMap<String, TeamGpus>,
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
        own_gpus_of_team(&mut report, inputs.team_gpus);
        out.teams.push(report);
    }
    warnings(inputs, &by_name, out);
    out.warnings.sort();
    out.warnings.dedup();
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
            let claimants = (others.iter().chain(std::iter::once(team)))
                .map(String::as_str)
                .collect::<BTreeSet<_>>();
            let whose = membership.whose(namespace, "it belongs to none of them");
            out.warnings.push(format!(
                "namespace {namespace} is claimed by TeamGpuPolicies {}: {whose}",
                claimants.into_iter().collect::<Vec<_>>().join(", ")
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
    let message = devices_found_message(policy, capacity, matches, inventory.device_count());
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

/// What `DevicesFound` says: how many devices match, and which matching devices do not count.
fn devices_found_message(
    policy: &CompiledPolicy,
    capacity: u32,
    matches: &MatchReport,
    slices: usize,
) -> String {
    let message = match matches.errors.get(&policy.name) {
        Some(errors) => format!(
            "{capacity} devices match; the selectors failed to evaluate on {} devices",
            errors.devices
        ),
        None if capacity > 0 => format!("{capacity} devices match"),
        None => match policy.slice() {
            Some(size) => format!(
                "the selectors match none of the {slices} published devices (slices of {size} are cut only from GPUs that allow multiple allocations, allowMultipleAllocations, and have at least {size} of memory)"
            ),
            None => format!("the selectors match none of the {slices} published devices"),
        },
    };
    let keys = |keys: &BTreeSet<String>, by: &str| {
        keys.iter().map(String::as_str).collect::<Vec<_>>().join(by)
    };
    let message = match matches.tainted.get(&policy.name) {
        Some(t) => format!(
            "{message}; {} more are tainted NoSchedule or NoExecute ({}) and not counted",
            t.devices,
            keys(&t.keys, ", ")
        ),
        None => message,
    };
    match matches.undeclared.get(&policy.name) {
        Some(u) => format!(
            "{message}; {} more draw on counters their pool does not publish, which no claim can get, and are not counted ({})",
            u.devices,
            keys(&u.keys, "; ")
        ),
        None => message,
    }
}

/// Says, in the explanation of a team's quota of a policy whose teams get GPUs of their own,
/// which GPUs are the team's.
fn own_gpus_of_team(report: &mut super::TeamReport, team_gpus: &BTreeMap<String, TeamGpus>) {
    for quota in &mut report.quotas {
        let Some(gpus) = team_gpus.get(&quota.sharing_policy) else {
            continue;
        };
        let own = gpus.teams.get(&report.name);
        let (n, slices) = own.map_or((0, 0), |o| (o.uuids.len(), o.slices));
        let listed: Vec<&str> = (own.into_iter().flat_map(|o| o.uuids.iter()))
            .take(4)
            .map(|u| &**u)
            .collect();
        let more = if n > listed.len() { ", ..." } else { "" };
        quota.explanation.push_str(&format!(
            "; its slices go on {n} GPUs of its own, which hold {slices} ({}{more})",
            listed.join(", ")
        ));
        if gpus.without_uuid > 0 {
            quota.explanation.push_str(&format!(
                "; {} GPUs publish no uuid attribute and are nobody's",
                gpus.without_uuid
            ));
        }
    }
}

mod gpu_equivalents;
mod team;

use super::types::sum;
use gpu_equivalents::{equivalents_of_policy, equivalents_of_team};
pub use team::team_report;
