//! Phase 4b, placement: whether the claims of a team waiting below its guarantee fit a node.
//!
//! The fair-share engine counts devices per pool: a team 8 short with 8 free devices in the pool
//! needs nothing back. But a claim's devices must all be on the node its Pod runs on, and with
//! borrowers' 1-device claims spread so that every node has one free device, an 8-device claim
//! fits nowhere. This step places the waiting claims on the free devices per node (within the
//! guarantee, largest first, each on the node with the fewest free devices that still hold it;
//! and for a team still below its guarantee, the smallest claim larger than what it lacks,
//! within its limit) and names those that fit nowhere: reclaim must make room for them even
//! when the pool's count says there is room ([`Placement`], and the orders of [`orders`]).
//!
//! It sits beside the engine, not in it, on purpose: the engine's rules are about counts and
//! are proven by property tests against a slow oracle; where devices are is a fact of the
//! inventory and the claims, which the engine does not see.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::inventory::{DeviceId, Inventory, PoolKey};
use super::objects::device_class_name;
pub use super::types::Placement;
use super::types::{ReclaimOrder, clamp};
use super::usage::Usage;
use crate::core::fairshare::PoolShares;

/// One pool of the policy's devices: its node, and how many of its matching devices are free.
#[derive(Clone, Debug, PartialEq)]
pub struct PoolRoom {
    pub pool: PoolKey,
    pub node: Option<Arc<str>>,
    pub free: u32,
    /// Whether the pool's devices draw on shared counters or are shared by many claims: its
    /// free devices are then as [`super::counters::rooms`] counts them.
    pub shared: bool,
}

/// The placement of `policy`'s waiting claims on its free devices `pools`, `claims_of(team)`
/// giving each team's waiting claims (largest first). `None` when every claim fits, no team
/// waits below its guarantee, or no pool has a node (then counting is all there is).
pub fn place(
    policy: &str,
    shares: &PoolShares,
    pools: &[PoolRoom],
    claims_of: impl Fn(&str) -> Vec<u32>,
) -> Option<Placement> {
    if pools.iter().all(|p| p.node.is_none()) {
        return None;
    }
    // Claims within each waiting team's guarantee: largest first, those that still fit it.
    let mut waiting: Vec<(u32, &str)> = Vec::new();
    for t in shares.teams.iter().filter(|t| t.pending > 0) {
        let lacks = t.effective_guarantee.saturating_sub(t.allocated);
        let mut room = lacks;
        let claims = claims_of(&t.team);
        for &size in &claims {
            if size > 0 && size <= room {
                room -= size;
                waiting.push((size, &t.team));
            }
        }
        // A team still below its guarantee whose next claim is larger than what it lacks: that
        // claim needs devices beyond the guarantee, and without them the team waits below it
        // for as long as anyone borrows. Within its limit, the smallest such claim is placed too.
        let held = t.allocated + (lacks - room);
        let beyond = (claims.iter().copied())
            .filter(|&size| size > room && held.saturating_add(size) <= t.limit)
            .min();
        if let Some(size) = beyond.filter(|_| room > 0) {
            waiting.push((size, &t.team));
        }
    }
    if waiting.is_empty() {
        return None;
    }
    waiting.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(b.1)));
    let mut free = free_per_node(pools);
    let mut unplaced: BTreeMap<String, Vec<u32>> = BTreeMap::new();
    for (size, team) in waiting {
        if !fit(&mut free, size) {
            unplaced.entry(team.to_owned()).or_default().push(size);
        }
    }
    if unplaced.is_empty() {
        return None;
    }
    Some(Placement {
        sharing_policy: policy.to_owned(),
        nodes: (pools.iter())
            .filter_map(|p| Some((p.pool.clone(), p.node.clone()?)))
            .collect(),
        free,
        unplaced,
    })
}

/// The free devices of `pools` per node (`None`: the pools without one, which any claim may use).
pub fn free_per_node(pools: &[PoolRoom]) -> BTreeMap<Option<Arc<str>>, u32> {
    let mut free: BTreeMap<Option<Arc<str>>, u32> = BTreeMap::new();
    for p in pools {
        *free.entry(p.node.clone()).or_default() += p.free;
    }
    free
}

/// Places a claim of `size` devices on the node with the fewest free devices that hold it (of
/// equals, the first by name), taking them from `free`; `false` when no node holds it.
pub fn fit(free: &mut BTreeMap<Option<Arc<str>>, u32>, size: u32) -> bool {
    let best = (free.iter_mut())
        .filter(|(_, f)| **f >= size)
        .min_by_key(|(_, f)| **f);
    match best {
        Some((_, f)) => {
            *f -= size;
            true
        }
        None => false,
    }
}

/// `engine`'s reclaims of `policy`, and for every team of `placement` whose claims fit no node,
/// the devices of those claims the engine did not order already, asked of the teams holding
/// devices above their effective guarantee (furthest above it per weight first, ties by name),
/// never more than that. Sorted as the engine sorts (owner, then borrower).
pub fn orders(
    policy: &str,
    shares: &PoolShares,
    placement: Option<&Placement>,
) -> Vec<ReclaimOrder> {
    let mut out: BTreeMap<(&str, &str), u32> = BTreeMap::new();
    let mut above: BTreeMap<&str, u32> = (shares.teams.iter())
        .map(|t| {
            (
                t.team.as_str(),
                t.allocated.saturating_sub(t.effective_guarantee),
            )
        })
        .collect();
    for r in &shares.reclaims {
        *out.entry((&r.for_team, &r.borrower)).or_default() += r.devices;
        if let Some(a) = above.get_mut(r.borrower.as_str()) {
            *a = a.saturating_sub(r.devices);
        }
    }
    let mut borrowers: Vec<(&str, u32, u32)> = (shares.teams.iter())
        .map(|t| {
            let over = t.allocated.saturating_sub(t.effective_guarantee);
            (t.team.as_str(), over, t.weight.max(1))
        })
        .filter(|b| b.1 > 0)
        .collect();
    borrowers.sort_by(|a, b| {
        (u64::from(b.1) * u64::from(a.2))
            .cmp(&(u64::from(a.1) * u64::from(b.2)))
            .then_with(|| a.0.cmp(b.0))
    });
    for (team, claims) in placement.iter().flat_map(|p| &p.unplaced) {
        let ordered: u32 = (shares.reclaims.iter())
            .filter(|r| r.for_team == *team)
            .map(|r| r.devices)
            .sum();
        let mut left = claims.iter().sum::<u32>().saturating_sub(ordered);
        for (borrower, _, _) in borrowers.iter().filter(|b| b.0 != team) {
            let Some(room) = above.get_mut(borrower) else {
                continue;
            };
            let take = left.min(*room);
            if take > 0 {
                *room -= take;
                left -= take;
                *out.entry((team, borrower)).or_default() += take;
            }
        }
    }
    out.into_iter()
        .map(|((for_team, borrower), devices)| ReclaimOrder {
            sharing_policy: policy.to_owned(),
            borrower: borrower.to_owned(),
            devices,
            for_team: for_team.to_owned(),
        })
        .collect()
}

/// The pools of `policy`'s devices with their node and free devices: the devices it matches
/// (`counts`), less those allocated outside teams (`outside`) and to its class's claims. One
/// walk over the allocations, not one per pool: a pass while a team waits reads 5,000 pools.
pub fn rooms<'u>(
    policy: &str,
    counts: Vec<(&PoolKey, u32)>,
    usage: impl Iterator<Item = &'u Usage>,
    outside: Option<&BTreeMap<&DeviceId, &str>>,
    inventory: &Inventory,
) -> Vec<PoolRoom> {
    let class = device_class_name(policy);
    let mut used: BTreeMap<(&str, &str), u64> = BTreeMap::new();
    for u in usage {
        for ((_, pool), n) in u.by_pool.iter().filter(|((c, _), _)| **c == *class) {
            *used.entry((&pool.driver, &pool.pool)).or_default() += n;
        }
    }
    for device in outside.into_iter().flat_map(BTreeMap::keys) {
        *used.entry((&device.driver, &device.pool)).or_default() += 1;
    }
    counts
        .iter()
        .map(|(pool, matched)| {
            let used = used.get(&(&*pool.driver, &*pool.pool)).copied();
            let found = inventory.pools().get(*pool);
            PoolRoom {
                pool: (*pool).clone(),
                node: found.and_then(|p| p.node()).cloned(),
                free: matched.saturating_sub(clamp(used.unwrap_or(0))),
                shared: found.is_some_and(|p| p.counters().is_some() || p.has_consumable()),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests;
