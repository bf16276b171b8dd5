//! Fair-share engine: turns one sharing policy's capacity, team quotas and usage into per-team
//! entitlements, per-namespace ResourceQuota hards and reclaim decisions.
//!
//! Pure and deterministic: no Kubernetes types, no I/O, no panics on any input. The rules and a
//! worked example are in `docs/fair-sharing.md`; in short:
//!
//! 1. Every team may always create claims up to its *effective guarantee* (its guarantee, scaled
//!    down by D'Hondt when the guarantees add up to more than the capacity).
//! 2. Idle devices (capacity not charged to any claim) are lent, by weighted water-filling, to
//!    teams whose limit is above what they already hold, first up to what their waiting Pods
//!    need, then to everyone with room; no idle device is lent twice. A team's
//!    *lending limit* caps how many of its unused guaranteed devices enter that idle pool; the
//!    rest stay reserved for it.
//! 3. Entitlements never exceed the limit and never drop below current use; a team's namespace
//!    hards add up to exactly its entitlement.
//! 4. When an owner below its guarantee waits while borrowers hold its devices, the engine names
//!    who gives back how many; never more than the owner's lending limit allows it to have lent.

mod apportion;
mod explain;
mod lending;
mod reclaim;
mod tree;

use apportion::{dhondt, water_fill};
pub use explain::Explanation;
use lending::lend;
use reclaim::reclaims;
pub use tree::DepartmentInput;

/// Smallest accepted weight; lower values (0) are raised to it.
pub const MIN_WEIGHT: u32 = 1;
/// Largest accepted weight; higher values are lowered to it.
pub const MAX_WEIGHT: u32 = 1000;

/// One sharing policy (a pool of matching devices) and the teams with a quota for it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct PoolInput {
    /// Devices of the inventory that match the policy.
    pub capacity: u32,
    /// Teams with a quota for this policy, in any order. Entries with the same team name are
    /// merged: the largest guarantee, limit, weight and lending limit (`None` counting as the
    /// largest) win and the namespaces are combined.
    pub teams: Vec<TeamInput>,
    /// Departments the teams (and other departments) may belong to. Without any, the pool is
    /// flat and the teams' parents are not read.
    pub departments: Vec<DepartmentInput>,
}

/// One team's quota for a pool and its usage, per namespace.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct TeamInput {
    /// Team name; the tie-breaker wherever two teams are otherwise equal.
    pub team: String,
    /// Devices the team can always claim (before scaling for overcommit).
    pub guaranteed: u32,
    /// Devices the team may never exceed with new claims; a limit below the guarantee counts
    /// as the guarantee.
    pub limit: u32,
    /// Share of idle devices relative to other borrowers; clamped to 1..=1000.
    pub weight: u32,
    /// Usage of the team's namespaces, in any order; same-named entries are added up.
    pub namespaces: Vec<NamespaceUsage>,
    /// How many of the team's unused guaranteed devices may be lent to other teams (Kueue's
    /// `lendingLimit`). `None`: all of them. `Some(0)`: none, the whole guarantee stays
    /// reserved for the team. The unused devices beyond the limit count in the team's
    /// entitlement but are not lent.
    pub lending_limit: Option<u32>,
    /// The department the team belongs to ([`PoolInput::departments`]), if any.
    pub parent: Option<String>,
}

/// What one namespace of a team uses and waits for in a pool.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct NamespaceUsage {
    /// Namespace name.
    pub namespace: String,
    /// Devices requested by the namespace's claims, as the quota evaluator counts them.
    pub requested: u32,
    /// Devices allocated to the namespace's claims.
    pub allocated: u32,
    /// Devices the namespace's Pods wait for because their claims could not be created or
    /// allocated.
    pub pending: u32,
    /// Of `requested`, the devices of claims that wait for a node and fit none (an 8-device
    /// claim while no node has 8 free): quota charges them, yet their devices sit idle, and the
    /// team's other waiting Pods may use them meanwhile (`TeamShare::reused`).
    pub unplaceable: u32,
}

/// The engine's answer for one pool.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PoolShares {
    /// Capacity the answer was computed for.
    pub capacity: u32,
    /// Devices not charged to any claim (`capacity - sum of requested`, at least 0).
    pub idle: u32,
    /// Idle devices other teams may borrow: `idle` minus the devices the teams' lending limits
    /// keep unlent (the sum of `TeamShare::reserved`), at least 0. Equals `idle` when no team
    /// has a lending limit below its unused guarantee.
    pub lendable: u32,
    /// One entry per team, sorted by team name.
    pub teams: Vec<TeamShare>,
    /// One entry per department, sorted by name, its share at its level (no namespaces).
    pub departments: Vec<TeamShare>,
    /// Devices borrowers must give back so that waiting owners reach their guarantee, sorted by
    /// owner then borrower. Empty when nobody waits below its guarantee.
    pub reclaims: Vec<Reclaim>,
    /// Set when the guarantees add up to more than the capacity.
    pub overcommit: Option<Overcommit>,
}

/// One team's share of a pool.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TeamShare {
    /// Team name.
    pub team: String,
    /// The department it belongs to: its entitlement is what the team's level divides.
    pub parent: Option<String>,
    /// Configured guarantee.
    pub guaranteed: u32,
    /// Guarantee after scaling for overcommit: the team can always claim this many devices.
    pub effective_guarantee: u32,
    /// Configured limit, raised to the guarantee if it was lower.
    pub limit: u32,
    /// Weight after clamping to 1..=1000.
    pub weight: u32,
    /// Configured lending limit (`None`: all unused guaranteed devices may be lent).
    pub lending_limit: Option<u32>,
    /// Unused guaranteed devices (effective guarantee minus requested, at least 0) that the
    /// lending limit keeps unlent: `unused - min(unused, lending_limit)`. They are part of the
    /// entitlement but not lent: when the team waits for them, reclaim serves them from the free
    /// devices before asking any borrower.
    pub reserved: u32,
    /// The team's hard quota for this pool: effective guarantee plus what it borrows, never
    /// above the limit and never below what it already requests.
    pub entitlement: u32,
    /// Part of the entitlement above the effective guarantee (`entitlement - effective_guarantee`).
    pub borrowed: u32,
    /// Of the entitlement, devices charged to the team's claims that fit no node that its other
    /// waiting Pods may use while those claims wait (rule 3a), within its guarantee and limit:
    /// part of `borrowed` when the team is charged beyond its guarantee, but lent by nobody.
    pub reused: u32,
    /// Devices requested by the team's claims (sum over namespaces).
    pub requested: u32,
    /// Devices allocated to the team's claims (sum over namespaces).
    pub allocated: u32,
    /// Devices the team's Pods wait for (sum over namespaces).
    pub pending: u32,
    /// True when the guarantee was scaled down because the pool is overcommitted.
    pub scaled_down: bool,
    /// How the entitlement came about; `explanation.to_string()` is one line, e.g.
    /// `8 guaranteed + 3 borrowed of 6 idle at weight 2/5`.
    pub explanation: Explanation,
    /// ResourceQuota hard per namespace, sorted by namespace name.
    pub namespaces: Vec<NamespaceShare>,
}

/// The ResourceQuota hard of one namespace for a pool.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NamespaceShare {
    /// Namespace name.
    pub namespace: String,
    /// Devices the namespace may request in this pool.
    pub hard: u32,
}

/// A borrower that must give devices back to an owner below its guarantee.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Reclaim {
    /// Team that holds more than its fair entitlement.
    pub borrower: String,
    /// Allocated devices the borrower must release.
    pub devices: u32,
    /// Owner that waits for them.
    pub for_team: String,
}

/// The guarantees of a pool add up to more than its capacity.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Overcommit {
    /// Sum of the configured guarantees.
    pub guaranteed: u64,
    /// Capacity of the pool.
    pub capacity: u32,
    /// What is wrong and what the engine did about it.
    pub message: String,
}

/// A team after normalisation: unique name, limit >= guarantee, weight clamped, namespaces
/// sorted and unique.
struct Team<'a> {
    name: &'a str,
    guaranteed: u32,
    limit: u32,
    weight: u32,
    lending_limit: Option<u32>,
    namespaces: Namespaces<'a>,
    requested: u64,
    allocated: u64,
    pending: u64,
    /// Of `requested`, charged to claims that fit no node (at most `requested`).
    unplaceable: u64,
}

/// The input's namespace list when it is already sorted and unique (the common case), a merged
/// copy otherwise.
enum Namespaces<'a> {
    Input(&'a [NamespaceUsage]),
    Merged(Vec<NamespaceUsage>),
}

impl Namespaces<'_> {
    fn as_slice(&self) -> &[NamespaceUsage] {
        match self {
            Namespaces::Input(list) => list,
            Namespaces::Merged(list) => list,
        }
    }
}

/// Computes the shares of one pool. See the module docs and `docs/fair-sharing.md`.
pub fn compute_pool(input: &PoolInput) -> PoolShares {
    let mut out = PoolShares::default();
    compute_pool_into(input, &mut out);
    out
}

/// Like [`compute_pool`], but overwrites `out`, reusing its allocations (team and namespace
/// names, vectors). Recomputing into the previous answer of the same pool allocates almost
/// nothing.
pub fn compute_pool_into(input: &PoolInput, out: &mut PoolShares) {
    if !input.departments.is_empty() {
        tree::compute(input, out);
        return;
    }
    out.departments.clear();
    compute_level(input, &LevelRules::default(), out);
}

/// What a level of a tree of departments changes in a flat pool (nothing, by default).
#[derive(Debug, Default)]
struct LevelRules<'a> {
    /// Idle devices not lent: what the department whose members these are lent outside it.
    withheld: u64,
    /// The teams that are departments: of their unused guarantee they keep as much as their
    /// members wait for, unlent.
    departments: std::collections::BTreeSet<&'a str>,
}

/// [`compute_pool_into`] for a flat pool, or one level of a tree.
fn compute_level(input: &PoolInput, level: &LevelRules<'_>, out: &mut PoolShares) {
    let teams = normalize(&input.teams);
    let n = teams.len();
    let capacity = u64::from(input.capacity);

    // Rule 1: effective guarantees, scaled by D'Hondt when the guarantees exceed the capacity.
    let guaranteed: Vec<u64> = teams.iter().map(|t| u64::from(t.guaranteed)).collect();
    let guaranteed_sum: u64 = guaranteed.iter().sum();
    let effective = dhondt(capacity, &guaranteed);

    let lending = lend(&teams, capacity, &effective, level);
    let entitlement: Vec<u64> = (0..n).map(|i| lending.entitlement(i)).collect();
    let reclaims = reclaims(&teams, capacity, &effective);

    let overcommit = (guaranteed_sum > capacity).then(|| Overcommit {
        guaranteed: guaranteed_sum,
        capacity: input.capacity,
        message: format!(
            "guarantees add up to {guaranteed_sum} devices but the pool has {capacity} \
             ({} too many): effective guarantees scaled down in proportion",
            guaranteed_sum - capacity
        ),
    });

    out.capacity = input.capacity;
    out.idle = to_u32(lending.idle);
    out.lendable = to_u32(lending.lendable);
    out.reclaims = reclaims;
    out.overcommit = overcommit;
    out.teams.truncate(n);
    out.teams.resize_with(n, TeamShare::default);
    for (i, (team, share)) in teams.iter().zip(&mut out.teams).enumerate() {
        let over_by = guaranteed_sum.saturating_sub(capacity);
        share.explanation = lending.explanation(i, team, effective[i], over_by);
        set_str(&mut share.team, team.name);
        share.parent = None;
        share.guaranteed = team.guaranteed;
        share.effective_guarantee = to_u32(effective[i]);
        share.limit = team.limit;
        share.weight = team.weight;
        share.lending_limit = team.lending_limit;
        share.reserved = to_u32(lending.reserved[i]);
        share.entitlement = to_u32(entitlement[i]);
        share.borrowed = to_u32(entitlement[i] - effective[i]);
        share.reused = to_u32(lending.reused[i]);
        share.requested = to_u32(team.requested);
        share.allocated = to_u32(team.allocated);
        share.pending = to_u32(team.pending);
        share.scaled_down = effective[i] < u64::from(team.guaranteed);
        split_namespaces(
            team.namespaces.as_slice(),
            entitlement[i],
            &mut share.namespaces,
        );
    }
}

/// Overwrites `target` with `value`, keeping its buffer when it is large enough.
fn set_str(target: &mut String, value: &str) {
    if target != value {
        target.clear();
        target.push_str(value);
    }
}

fn to_u32(value: u64) -> u32 {
    u32::try_from(value).unwrap_or(u32::MAX)
}

/// Sorts teams by name, merges duplicates and normalises limits, weights and namespaces.
/// Skips the sort when the input is already sorted, as the planning core keeps it.
fn normalize(input: &[TeamInput]) -> Vec<Team<'_>> {
    let mut order: Vec<&TeamInput> = input.iter().collect();
    // Strictly sorted input has no duplicates to merge either.
    let unique = order.is_sorted_by(|a, b| a.team < b.team);
    if !unique {
        order.sort_by(|a, b| a.team.cmp(&b.team));
    }
    let mut teams: Vec<Team<'_>> = Vec::with_capacity(order.len());
    let mut start = 0;
    while start < order.len() {
        let name = order[start].team.as_str();
        let same = if unique {
            0
        } else {
            order[start + 1..]
                .iter()
                .take_while(|t| t.team == name)
                .count()
        };
        let end = start + 1 + same;
        let group = &order[start..end];
        let guaranteed = group.iter().map(|t| t.guaranteed).max().unwrap_or(0);
        let limit = group
            .iter()
            .map(|t| t.limit)
            .max()
            .unwrap_or(0)
            .max(guaranteed);
        let weight = group
            .iter()
            .map(|t| t.weight)
            .max()
            .unwrap_or(0)
            .clamp(MIN_WEIGHT, MAX_WEIGHT);
        // None (no limit) is the largest lending limit.
        let lending_limit = group
            .iter()
            .map(|t| t.lending_limit)
            .reduce(|a, b| a.zip(b).map(|(a, b)| a.max(b)))
            .flatten();
        let namespaces = match group {
            [single]
                if single
                    .namespaces
                    .is_sorted_by(|a, b| a.namespace < b.namespace) =>
            {
                Namespaces::Input(&single.namespaces)
            }
            _ => Namespaces::Merged(merge_namespaces(group)),
        };
        let (mut requested, mut allocated, mut pending, mut unplaceable) = (0u64, 0, 0, 0);
        for ns in namespaces.as_slice() {
            requested += u64::from(ns.requested);
            allocated += u64::from(ns.allocated);
            pending += u64::from(ns.pending);
            unplaceable += u64::from(ns.unplaceable.min(ns.requested));
        }
        teams.push(Team {
            name,
            guaranteed,
            limit,
            weight,
            lending_limit,
            namespaces,
            requested,
            allocated,
            pending,
            unplaceable,
        });
        start = end;
    }
    teams
}

fn merge_namespaces(group: &[&TeamInput]) -> Vec<NamespaceUsage> {
    let mut all: Vec<&NamespaceUsage> = group.iter().flat_map(|t| t.namespaces.iter()).collect();
    all.sort_by(|a, b| a.namespace.cmp(&b.namespace));
    let mut merged: Vec<NamespaceUsage> = Vec::with_capacity(all.len());
    for ns in all {
        match merged.last_mut() {
            Some(last) if last.namespace == ns.namespace => {
                last.requested = last.requested.saturating_add(ns.requested);
                last.allocated = last.allocated.saturating_add(ns.allocated);
                last.pending = last.pending.saturating_add(ns.pending);
                last.unplaceable = last.unplaceable.saturating_add(ns.unplaceable);
            }
            _ => merged.push(ns.clone()),
        }
    }
    merged
}

/// Rule 5: splits a team's entitlement over its namespaces into `out`. Each keeps what it
/// requests; the rest goes first to pending demand (water-filled when it does not all fit), then
/// evenly, the remainder by name.
fn split_namespaces(
    namespaces: &[NamespaceUsage],
    entitlement: u64,
    out: &mut Vec<NamespaceShare>,
) {
    out.truncate(namespaces.len());
    out.resize_with(namespaces.len(), NamespaceShare::default);
    for (share, ns) in out.iter_mut().zip(namespaces) {
        set_str(&mut share.namespace, &ns.namespace);
    }
    let requested: u64 = namespaces.iter().map(|ns| u64::from(ns.requested)).sum();
    let mut rest = entitlement.saturating_sub(requested);
    let pending: u64 = namespaces.iter().map(|ns| u64::from(ns.pending)).sum();
    // Pending demand first: all of it when it fits, water-filled otherwise.
    let water_filled = (pending > rest && namespaces.len() > 1).then(|| {
        let wants: Vec<(u64, u32)> = namespaces
            .iter()
            .map(|ns| (u64::from(ns.pending), 1))
            .collect();
        water_fill(rest, &wants)
    });
    rest -= pending.min(rest);
    let count = namespaces.len().max(1) as u64;
    let (each, remainder) = (rest / count, rest % count);
    for (i, (share, ns)) in out.iter_mut().zip(namespaces).enumerate() {
        let for_pending = match &water_filled {
            Some(extra) => extra[i],
            None => u64::from(ns.pending).min(entitlement.saturating_sub(requested)),
        };
        let even = each + u64::from((i as u64) < remainder);
        share.hard = to_u32(u64::from(ns.requested) + for_pending + even);
    }
}
