//! Phases 2b and 4a, shared counters: what each policy can hold of the devices that draw on
//! counter sets ([`inventory::counters`](super::inventory::CounterGroup)), and which policy gets
//! the counter groups that several policies' devices could use.
//!
//! Per counter group (with the NVIDIA driver, one GPU), a policy holds its allocated devices
//! there, plus the most of its free devices that fit the counters the allocated devices (of any
//! policy, or outside teams) leave. A GPU running 7 MIG slices leaves no whole GPU.
//!
//! A group whose free counters only one policy's devices fit counts for that policy. A group
//! that two or more could use (whole GPUs and MIG slices of the same GPUs) is *contested*: it
//! is given whole to one of them ([`allot`]), so that the policies' capacities together never
//! promise more than fits: first to cover the policies' guarantees, then their demand up to
//! their limits, then one by one in name order. A policy's teams are never promised a contested
//! GPU that another policy's capacity also counts.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::claims::Claims;
use super::conditions::{DesiredCondition, types};
use super::inventory::{GroupMatches, Inventory, PoolKey};
use super::placement::PoolRoom;
use super::shared_counters::{Contested, SharedCounters, share_micro};
use crate::core::fairshare::PoolInput;
use crate::dra_cel::CompiledExpressions;

/// What one pool's counter groups give the expression sets (by place among the sets), for the
/// pool, the expressions and the devices allocated in it: computed again only when one of
/// those changed, so a claim changes one pool's fits, not the cluster's.
#[derive(Debug, Clone, Default)]
pub struct PoolFits {
    /// Per set that matches a device of the pool: (set, matched, held, more in the groups only
    /// its devices fit).
    sets: Box<[(u16, u32, u32, u32)]>,
    /// Per set, the largest (draw, whole) share of a group one of its devices is.
    shares: Box<[(u16, i128, i128)]>,
    /// Groups two or more sets' devices fit: the group's sets, and per set what more fits.
    contested: Box<[ContestedFit]>,
    approximate: u32,
}

/// A group of [`PoolFits::contested`]: its counter sets, and per set what more fits.
type ContestedFit = (Box<[Arc<str>]>, Box<[(u16, u32)]>);

/// [`PoolFits`] per pool, for (fingerprint, expressions' identity, version of the pool's
/// allocations), in pool order: a pass walks the inventory's pools and this list side by side,
/// so that a pool's kept fits cost no lookup (5,000 pools are walked at every pass).
#[derive(Debug)]
pub struct Fits {
    kept: Vec<(PoolKey, (u64, u64, u64), PoolFits)>,
    keep: bool,
}

impl Default for Fits {
    fn default() -> Self {
        Self::new(true)
    }
}

impl Fits {
    /// Fits kept between passes (`keep`), or computed at every pass, for a planner that plans
    /// once.
    pub fn new(keep: bool) -> Self {
        Self {
            kept: Vec::new(),
            keep,
        }
    }
}

/// What each of `sets` can hold of the counter groups of `inventory`, given the devices the
/// `claims` have allocated (admin access left out: it takes no device from anyone).
pub fn shared_counters(
    (matching, fits): (&super::capacity::Matching, &mut Fits),
    inventory: &Inventory,
    (sets, expressions): (&BTreeMap<String, &CompiledExpressions>, u64),
    claims: &Claims,
) -> SharedCounters {
    let mut out = SharedCounters::default();
    let pools: Vec<(&PoolKey, &super::inventory::Pool)> = (inventory.pools().iter())
        .filter(|(_, p)| p.counters().is_some())
        .collect();
    if pools.is_empty() {
        fits.kept.clear();
        return out;
    }
    let names: Vec<&String> = sets.keys().collect();
    // Per set: matched, held; and what more fits alone, per pool.
    let mut totals: Vec<(u32, u32)> = vec![(0, 0); names.len()];
    let mut free: Vec<Vec<(PoolKey, u32)>> = vec![Vec::new(); names.len()];
    let mut touched = vec![false; names.len()];
    // Per set, the largest share of a GPU one of its devices is (noted once, not per pool).
    let mut shares: Vec<Option<u64>> = vec![None; names.len()];
    // The kept fits and the allocations, in pool order like `pools`: walked side by side.
    let mut kept = std::mem::take(&mut fits.kept).into_iter().peekable();
    let mut allocations = claims.allocations().iter().peekable();
    let mut next = Vec::with_capacity(pools.len());
    let mut scratch = Scratch::default();
    for (key, pool) in pools {
        while allocations.next_if(|(k, _)| *k < key).is_some() {}
        let taken = allocations.next_if(|(k, _)| *k == key).map(|(_, a)| a);
        let input = (
            pool.fingerprint(),
            expressions,
            taken.map_or(0, |t| t.version),
        );
        while kept.next_if(|(k, _, _)| k < key).is_some() {}
        let (key, reused) = match kept.next_if(|(k, _, _)| k == key) {
            Some((k, i, found)) if i == input && fits.keep => (k, Some(found)),
            Some((k, _, _)) => (k, None),
            None => (key.clone(), None),
        };
        let found = reused.unwrap_or_else(|| {
            // Kept by the matching of the same pool and expressions, which ran this pass.
            let no_groups = GroupMatches::default();
            let by_group = matching.group_matches(&key).unwrap_or(&no_groups);
            fit_pool(
                pool,
                by_group,
                taken.map(|t| &t.devices),
                names.len(),
                &mut scratch,
            )
        });
        next.push((key, input, found));
        let (key, _, found) = next.last().expect("just pushed");
        for &(set, matched, held, more) in found.sets.iter() {
            let set = usize::from(set);
            touched[set] = true;
            totals[set].0 += matched;
            totals[set].1 += held;
            if more > 0 {
                free[set].push((key.clone(), more));
            }
        }
        for &(set, part, whole) in found.shares.iter() {
            let largest = &mut shares[usize::from(set)];
            *largest = (*largest).max(share_micro(part, whole));
        }
        for (group_sets, more) in found.contested.iter() {
            out.contested.push(Contested {
                pool: key.clone(),
                sets: group_sets.clone(),
                more: (more.iter())
                    .map(|&(set, n)| (names[usize::from(set)].clone(), n))
                    .collect(),
            });
        }
        out.approximate += found.approximate;
    }
    for (set, micro) in shares.into_iter().enumerate() {
        if let Some(micro) = micro {
            out.note_micro_share(names[set], micro);
        }
    }
    for (set, ((matched, held), free)) in totals.into_iter().zip(free).enumerate() {
        if !touched[set] {
            continue;
        }
        let name = names[set];
        out.matched.insert(name.clone(), matched);
        out.held.insert(name.clone(), held);
        if !free.is_empty() {
            out.free.insert(name.clone(), free);
        }
    }
    fits.kept = next;
    out
}

/// What fitting a pool works in, kept from pool to pool (a plan from objects fits 5,000).
#[derive(Debug, Default)]
struct Scratch {
    /// Per set: matched, held, more alone.
    per_set: Vec<Option<(u32, u32, u32)>>,
    /// Per set, its largest share.
    shares: Vec<Option<(i128, i128)>>,
    /// Per device of the group being fitted, whether it is allocated.
    allocated: Vec<bool>,
    /// The sets that match a device of the group.
    matching: Vec<u16>,
    /// Per set, what more fits in the group.
    more: Vec<(u16, u32)>,
}

/// [`PoolFits`] of `pool`, its groups' devices matching the sets of `by_group`, the devices
/// `taken` allocated.
fn fit_pool(
    pool: &super::inventory::Pool,
    by_group: &GroupMatches,
    taken: Option<&BTreeMap<Arc<str>, u32>>,
    sets: usize,
    scratch: &mut Scratch,
) -> PoolFits {
    let Some(counters) = pool.counters() else {
        return PoolFits::default();
    };
    let Scratch {
        per_set,
        shares,
        allocated,
        matching,
        more,
    } = scratch;
    per_set.clear();
    per_set.resize(sets, None);
    shares.clear();
    shares.resize(sets, None);
    let mut contested = Vec::new();
    let mut approximate = 0;
    for (group, by_device) in counters.groups.iter().zip(by_group.groups()) {
        allocated.clear();
        // A pool nothing is allocated in looks up no device.
        allocated.extend(group.device_places().map(|place| {
            taken.is_some_and(|t| (pool.device_at(place)).is_some_and(|d| t.contains_key(d.name())))
        }));
        // The sets that match a device of the group (most groups: one).
        matching.clear();
        matching.extend(by_device.iter().flatten().copied());
        matching.sort_unstable();
        matching.dedup();
        more.clear();
        for &set in matching.iter() {
            let candidate = |i: usize| by_device.sets(i).contains(&set);
            let matched = (0..by_device.len()).filter(|i| candidate(*i)).count();
            if matched == 0 {
                continue;
            }
            if let Some(share) = (0..by_device.len())
                .filter(|i| candidate(*i))
                .filter_map(|i| group.share(i))
                .max()
            {
                let largest = shares[usize::from(set)].get_or_insert(share);
                *largest = (*largest).max(share);
            }
            let fit = group.fit(allocated, candidate);
            approximate += u32::from(!fit.exact);
            let entry = per_set[usize::from(set)].get_or_insert_default();
            entry.0 += u32::try_from(matched).unwrap_or(u32::MAX);
            entry.1 += fit.held;
            if fit.more > 0 {
                more.push((set, fit.more));
            }
        }
        match more.as_slice() {
            [] => {}
            [(set, n)] => per_set[usize::from(*set)].get_or_insert_default().2 += n,
            _ => contested.push((group.sets.clone(), more.as_slice().into())),
        }
    }
    let index = |i: usize| u16::try_from(i).unwrap_or(u16::MAX);
    PoolFits {
        sets: (per_set.iter().enumerate())
            .filter_map(|(set, found)| {
                let (matched, held, more) = (*found)?;
                Some((index(set), matched, held, more))
            })
            .collect(),
        shares: (shares.iter().enumerate())
            .filter_map(|(set, share)| Some((index(set), share.as_ref()?.0, share.as_ref()?.1)))
            .collect(),
        contested: contested.into_boxed_slice(),
        approximate,
    }
}

/// Gives each contested group to one policy, adding what that policy's devices fit there to
/// its capacity in `pools` (by policy name): first to cover the policies' guarantees, then
/// their demand up to their limits, each time to the policy with the least of its target
/// covered (ties by name), in the group where its devices fit the most; then what is left one
/// group at a time in name order of the policies that fit it. Returns per policy the groups it
/// got (their places in `contested`).
pub fn allot(contested: &[Contested], pools: &mut BTreeMap<String, PoolInput>) -> Allotted {
    let mut given = Allotted::new();
    let mut left: Vec<(usize, &Contested)> = contested.iter().enumerate().collect();
    for target in [guaranteed as fn(&PoolInput) -> u64, wanted] {
        loop {
            // (capacity, target) of the policy least covered, its name, and its best group.
            let pick = (pools.iter())
                .filter_map(|(name, pool)| {
                    let (target, capacity) = (target(pool), u64::from(pool.capacity));
                    let (at, _) = (left.iter().enumerate())
                        .filter_map(|(i, (_, c))| Some((i, *c.more.get(name)?)))
                        .max_by(|a, b| a.1.cmp(&b.1).then_with(|| b.0.cmp(&a.0)))?;
                    (capacity < target).then_some(((capacity, target), name.clone(), at))
                })
                .min_by(|((ca, ta), na, _), ((cb, tb), nb, _)| {
                    (u128::from(*ca) * u128::from(*tb))
                        .cmp(&(u128::from(*cb) * u128::from(*ta)))
                        .then_with(|| na.cmp(nb))
                });
            let Some((_, name, at)) = pick else { break };
            give(left.remove(at), &name, pools, &mut given);
        }
    }
    for (turn, group) in left.into_iter().enumerate() {
        let (_, contested) = group;
        let candidates: Vec<String> = (pools.keys())
            .filter(|n| contested.more.contains_key(*n))
            .cloned()
            .collect();
        if let Some(name) = candidates.get(turn % candidates.len().max(1)) {
            give(group, &name.clone(), pools, &mut given);
        }
    }
    given
}

/// The devices a pool's teams are guaranteed.
pub fn guaranteed(pool: &PoolInput) -> u64 {
    pool.teams.iter().map(|t| u64::from(t.guaranteed)).sum()
}

/// The devices a pool's teams want (allocated or requested, and waited for), each up to its
/// limit.
fn wanted(pool: &PoolInput) -> u64 {
    (pool.teams.iter())
        .map(|t| {
            let demand: u64 = (t.namespaces.iter())
                .map(|n| u64::from(n.requested.max(n.allocated)) + u64::from(n.pending))
                .sum();
            demand.min(u64::from(t.limit.max(t.guaranteed)))
        })
        .sum()
}

/// Per policy, the places in the contested groups of those it was given.
pub type Allotted = BTreeMap<String, Vec<usize>>;

fn give(
    (place, group): (usize, &Contested),
    name: &str,
    pools: &mut BTreeMap<String, PoolInput>,
    given: &mut Allotted,
) {
    if let Some(pool) = pools.get_mut(name) {
        pool.capacity = pool.capacity.saturating_add(group.more[name]);
        given.entry(name.to_owned()).or_default().push(place);
    }
}

/// `rooms` of policy `name` with the free devices of pools with counters as the counters have
/// them: what fits in the groups that are the policy's alone, and in the contested groups it
/// was given (placement reads free devices per node; counting device entries would see a
/// whole GPU free on a GPU running slices).
pub fn rooms(
    mut rooms: Vec<PoolRoom>,
    name: &str,
    shared: &SharedCounters,
    allotted: &Allotted,
) -> Vec<PoolRoom> {
    let mut free: BTreeMap<&PoolKey, u32> = BTreeMap::new();
    for (pool, n) in shared.free.get(name).into_iter().flatten() {
        *free.entry(pool).or_default() += n;
    }
    for &place in allotted.get(name).into_iter().flatten() {
        let group = &shared.contested[place];
        *free.entry(&group.pool).or_default() += group.more.get(name).copied().unwrap_or(0);
    }
    for room in rooms.iter_mut().filter(|r| r.shared) {
        room.free = free.get(&room.pool).copied().unwrap_or(0);
    }
    rooms
}

/// Whether the policy's devices draw on counters that another policy's devices also fit, and what
/// it was given of them (`allotted`: per policy, the contested groups it got); `None` when none of its devices draws on counters.
pub fn condition(
    name: &str,
    capacity: u32,
    shared: &SharedCounters,
    allotted: &Allotted,
) -> Option<DesiredCondition> {
    let consumable = shared.consumable.get(name).map_or(0, |c| c.devices);
    let entries = shared.matched.get(name)?.saturating_sub(consumable);
    if entries == 0 {
        return None;
    }
    let contested: Vec<_> = (shared.contested.iter())
        .filter(|c| c.more.contains_key(name))
        .collect();
    let given = allotted.get(name).map_or(0, Vec::len);
    let approximate = if shared.approximate > 0 {
        format!(
            "; in {} counter groups the search stopped at a count that fits, which may be low",
            shared.approximate
        )
    } else {
        String::new()
    };
    Some(if contested.is_empty() {
        DesiredCondition::new(
            types::SHARED_COUNTERS,
            false,
            "CountersOwn",
            format!(
                "{entries} matching devices draw on shared counters; {capacity} devices count, as many as fit at once beside what is allocated, and no other policy's devices fit the same free counters{approximate}"
            ),
        )
    } else {
        DesiredCondition::new(
            types::SHARED_COUNTERS,
            true,
            "CountersShared",
            format!(
                "{entries} matching devices draw on shared counters; the free counters of {} groups ({}) also fit devices of {}: {given} of those groups were given to this policy, so that together the policies never count more than fits; {capacity} devices count{approximate}",
                contested.len(),
                contested
                    .iter()
                    .flat_map(|c| c.sets.iter())
                    .take(3)
                    .map(|s| &**s)
                    .collect::<Vec<_>>()
                    .join(", ")
                    + if contested.len() > 3 { ", ..." } else { "" },
                shared.contested_with(name),
            ),
        )
    })
}
