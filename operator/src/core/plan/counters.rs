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

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use super::cache::Cache;
use super::conditions::{DesiredCondition, types};
use super::consumable::{Consumable, SharedDevice, SliceGpu};
use super::inventory::{Drawing, Inventory, PoolKey};
use super::placement::PoolRoom;
use super::usage::ClaimView;
use crate::core::fairshare::PoolInput;
use crate::dra_cel::CompiledExpressions;

/// Per counter group of a pool, per device of the group (in the group's order), the places of
/// the expression sets that match it.
type PoolGroupMatches = Box<[Box<[Box<[u16]>]>]>;

/// [`PoolGroupMatches`] per pool, for the pool's fingerprint and the expressions' identity.
pub type GroupMatches = Cache<PoolKey, (u64, u64), PoolGroupMatches>;

/// What the policies can hold of the devices that draw on counters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SharedCounters {
    /// Per policy, its matching devices that draw on counters: the device count of the match
    /// report, which these replace.
    pub matched: BTreeMap<String, u32>,
    /// Per policy, its allocated devices among them.
    pub held: BTreeMap<String, u32>,
    /// The groups two or more policies could use.
    pub contested: Vec<Contested>,
    /// Groups where the search settled for a count it could not prove the most.
    pub approximate: u32,
    /// Per policy and pool, what more fits in the groups whose free counters only its devices
    /// fit.
    pub free: BTreeMap<String, BTreeMap<PoolKey, u32>>,
    /// The pools with counters, or devices that allow multiple allocations.
    pub pools: BTreeSet<PoolKey>,
    /// Per policy, what its claims meet on devices that allow multiple allocations (their
    /// count is part of `matched`, their allocations of `held`).
    pub consumable: BTreeMap<String, Consumable>,
    /// Devices that allow multiple allocations held by claims of two namespaces or more.
    pub shared_devices: Vec<SharedDevice>,
    /// Per policy whose teams get GPUs of their own, every GPU it matches.
    pub slice_gpus: BTreeMap<String, Vec<SliceGpu>>,
    /// Per policy, the largest share of its GPU one of its devices is, in millionths: a MIG
    /// device's compute (or memory) of its counter set, a slice's memory of its GPU's.
    pub shares: BTreeMap<String, u64>,
}

impl SharedCounters {
    /// Notes that a device of `policy` is `part` of `whole` of its GPU.
    pub(super) fn note_share(&mut self, policy: &str, part: i128, whole: i128) {
        if whole <= 0 || part <= 0 {
            return;
        }
        // Rounded up: a budget counted in these never lets more run than it says.
        let micro = (part.saturating_mul(1_000_000) + whole - 1) / whole;
        let micro = u64::try_from(micro).unwrap_or(u64::MAX);
        match self.shares.get_mut(policy) {
            Some(largest) => *largest = (*largest).max(micro),
            None => {
                self.shares.insert(policy.to_owned(), micro);
            }
        }
    }
}

/// A counter group whose free counters two or more policies' devices fit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Contested {
    pub pool: PoolKey,
    /// The group's counter sets.
    pub sets: Box<[Arc<str>]>,
    /// Per policy, the most of its free devices that fit.
    pub more: BTreeMap<String, u32>,
}

impl SharedCounters {
    /// A policy's capacity from its `matched` device count (which counts devices drawing on
    /// counters one by one), before contested groups are given out.
    pub fn capacity(&self, policy: &str, matched: u32) -> u32 {
        let get = |m: &BTreeMap<String, u32>| m.get(policy).copied().unwrap_or(0);
        let free: u32 = self.free.get(policy).map_or(0, |f| f.values().sum());
        matched.saturating_sub(get(&self.matched)) + get(&self.held) + free
    }

    /// The other policies whose devices fit the free counters of a group `policy`'s devices fit
    /// too, joined by ", ".
    pub fn contested_with(&self, policy: &str) -> String {
        let others: BTreeSet<&str> = (self.contested.iter())
            .filter(|c| c.more.contains_key(policy))
            .flat_map(|c| c.more.keys().map(String::as_str))
            .filter(|other| *other != policy)
            .collect();
        others.into_iter().collect::<Vec<_>>().join(", ")
    }
}

/// What each of `sets` can hold of the counter groups of `inventory`, given the devices the
/// `claims` have allocated (admin access left out: it takes no device from anyone).
pub fn shared_counters<'c>(
    matches: &mut GroupMatches,
    inventory: &Inventory,
    (sets, expressions): (&BTreeMap<String, &CompiledExpressions>, u64),
    claims: impl IntoIterator<Item = &'c ClaimView>,
) -> SharedCounters {
    let mut out = SharedCounters::default();
    let pools: Vec<(&PoolKey, &super::inventory::Pool)> = (inventory.pools().iter())
        .filter(|(_, p)| p.counters().is_some())
        .collect();
    if pools.is_empty() {
        matches.sweep();
        return out;
    }
    let counted: BTreeSet<&PoolKey> = pools.iter().map(|(k, _)| *k).collect();
    let mut allocated: HashMap<&PoolKey, BTreeSet<&str>> = HashMap::new();
    for claim in claims {
        for d in claim.devices.iter().filter(|d| !d.admin_access) {
            let key = PoolKey {
                driver: d.id.driver.clone(),
                pool: d.id.pool.clone(),
            };
            if let Some(key) = counted.get(&key) {
                allocated.entry(*key).or_default().insert(&d.id.device);
            }
        }
    }
    let names: Vec<&String> = sets.keys().collect();
    out.pools = counted.iter().map(|k| (*k).clone()).collect();
    for (key, pool) in pools {
        let Some(counters) = pool.counters() else {
            continue;
        };
        let found = matches.get(key.clone(), (pool.fingerprint(), expressions), |_| {
            match_groups(pool, sets)
        });
        let taken = allocated.get(key);
        for (group, by_device) in counters.groups.iter().zip(found.iter()) {
            let allocated: Vec<bool> = (group.device_places())
                .map(|place| {
                    (pool.device_at(place))
                        .is_some_and(|d| taken.is_some_and(|t| t.contains(d.name())))
                })
                .collect();
            let mut more = BTreeMap::new();
            for (set, name) in names.iter().enumerate() {
                let set = u16::try_from(set).unwrap_or(u16::MAX);
                let candidate = |i: usize| by_device[i].contains(&set);
                let matched = (0..by_device.len()).filter(|i| candidate(*i)).count();
                if matched == 0 {
                    continue;
                }
                *out.matched.entry((*name).clone()).or_default() +=
                    u32::try_from(matched).unwrap_or(u32::MAX);
                if let Some((part, whole)) = (0..by_device.len())
                    .filter(|i| candidate(*i))
                    .filter_map(|i| group.share(i))
                    .max()
                {
                    out.note_share(name, part, whole);
                }
                let fit = group.fit(&allocated, candidate);
                out.approximate += u32::from(!fit.exact);
                *out.held.entry((*name).clone()).or_default() += fit.held;
                if fit.more > 0 {
                    more.insert((*name).clone(), fit.more);
                }
            }
            out.give_out(key, group.sets.clone(), more);
        }
    }
    matches.sweep();
    out
}

/// Per group of `pool`, per device of the group, the places of the sets that match it (counted
/// devices only: a tainted device still draws on the counters when allocated, but no claim gets
/// it anew).
fn match_groups(
    pool: &super::inventory::Pool,
    sets: &BTreeMap<String, &CompiledExpressions>,
) -> PoolGroupMatches {
    let Some(counters) = pool.counters() else {
        return Box::default();
    };
    let usable = pool.status.usable();
    (counters.groups.iter())
        .map(|group| {
            group
                .device_places()
                .map(|place| {
                    let Some(device) = pool.device_at(place) else {
                        return Box::default();
                    };
                    // As [`Pool::counted`](super::inventory::Pool::counted) counts.
                    if !usable
                        || device.tainted()
                        || !matches!(counters.drawing[place as usize], Drawing::Group(_))
                    {
                        return Box::default();
                    }
                    (sets.values().enumerate())
                        .filter(|(_, set)| set.matches(device.env()).unwrap_or(false))
                        .map(|(i, _)| u16::try_from(i).unwrap_or(u16::MAX))
                        .collect()
                })
                .collect()
        })
        .collect()
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
    if let Some(own) = shared.free.get(name) {
        free.extend(own.iter().map(|(pool, n)| (pool, *n)));
    }
    for &place in allotted.get(name).into_iter().flatten() {
        let group = &shared.contested[place];
        *free.entry(&group.pool).or_default() += group.more.get(name).copied().unwrap_or(0);
    }
    for room in rooms.iter_mut().filter(|r| shared.pools.contains(&r.pool)) {
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
