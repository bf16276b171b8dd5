//! Phase 2b for devices that many claims share (`allowMultipleAllocations`,
//! [`inventory::consumable`](super::inventory::consumable)): what each policy can hold of them,
//! added to the [`SharedCounters`] beside the counter groups, so that capacity, contested
//! devices and room on a node read both alike.
//!
//! Per device, a policy holds its allocations there (each one device of its class: for a
//! MemorySlices policy, one slice), plus as many more as fit in what every allocation on the
//! device, of any class, leaves of its capacities, each more consuming what one claim of the
//! policy's templates consumes (a slice of memory; for other policies, what a claim that names
//! no capacity consumes). A device whose free capacity two policies' claims fit (slices of 10Gi
//! and of 20Gi of the same GPUs) is contested and given whole to one of them, as a counter group
//! is ([`super::counters::allot`]).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use super::cache::Cache;
use super::inventory::consumable::{consumption, how_many_fit};
use super::inventory::{DeviceId, Drawing, Inventory, Pool, PoolKey};
use super::objects::{SLICE_CAPACITY, device_class_name};
use super::policies::Slicing;
use super::shared_counters::{SharedCounters, SharedDevice, SliceGpu};
use super::usage::{ClaimDevice, ClaimView};
use crate::dra_cel::CompiledExpressions;

/// Per device of a pool that allows multiple allocations and counts as capacity (in the pool's
/// device order), its place and the places of the expression sets that match it.
type PoolDeviceMatches = Box<[(u32, Box<[u16]>)]>;

/// [`PoolDeviceMatches`] per pool, for the pool's fingerprint and the expressions' identity.
pub type ConsumableMatches = Cache<PoolKey, (u64, u64), PoolDeviceMatches>;

/// Adds to `out` what each of `sets` can hold of the devices of `inventory` that allow multiple
/// allocations, given the allocations of `claims` (admin access left out: it takes nothing).
/// `slices` says the MemorySlices policies' slice sizes and which give teams GPUs of their own
/// (for those, every device they match is noted in [`SharedCounters::slice_gpus`]).
pub fn add_consumable<'c>(
    out: &mut SharedCounters,
    matches: &mut ConsumableMatches,
    inventory: &Inventory,
    (sets, expressions): (&BTreeMap<String, &CompiledExpressions>, u64),
    slices: &Slicing,
    claims: impl IntoIterator<Item = &'c ClaimView>,
) {
    let pools: Vec<(&PoolKey, &Pool)> = (inventory.pools().iter())
        .filter(|(_, p)| p.has_consumable())
        .collect();
    if pools.is_empty() {
        matches.sweep();
        return;
    }
    let keys: BTreeSet<&PoolKey> = pools.iter().map(|(k, _)| *k).collect();
    let results = allocations_by_device(claims, &keys);
    let names: Vec<&String> = sets.keys().collect();
    let draws_of: Vec<BTreeMap<&str, i128>> = (names.iter())
        .map(|name| match slices.sizes.get(*name) {
            Some(size) => [(SLICE_CAPACITY, *size)].into(),
            None => BTreeMap::new(),
        })
        .collect();
    let classes: Vec<String> = names.iter().map(|n| device_class_name(n)).collect();
    for (key, pool) in pools {
        let found = matches.get(key.clone(), (pool.fingerprint(), expressions), |_| {
            match_devices(pool, sets)
        });
        for (place, matching) in found.iter() {
            let Some(device) = pool.device_at(*place) else {
                continue;
            };
            let Some(capacities) = device.consumable() else {
                continue;
            };
            let id = device.id();
            let on_device = results.get(&id).map_or(&[][..], Vec::as_slice);
            let left = left_of(capacities, on_device);
            let mut more = BTreeMap::new();
            for &set in matching.iter() {
                let set = usize::from(set);
                let (name, class) = (names[set], &classes[set]);
                let held = (on_device.iter())
                    .filter(|(_, r)| r.class.as_deref() == Some(class.as_str()))
                    .count();
                let held = u32::try_from(held).unwrap_or(u32::MAX);
                if let (Some(slice), Some(memory)) = (
                    slices.sizes.get(name.as_str()),
                    capacities.iter().find(|c| &*c.name == SLICE_CAPACITY),
                ) {
                    out.note_share(name, *slice, memory.value);
                }
                let mine = out.consumable.entry(name.clone()).or_default();
                mine.devices += 1;
                let fits = match consumption(capacities, &draws_of[set]) {
                    None => {
                        mine.unfit += 1;
                        0
                    }
                    Some(draw) => how_many_fit(&left, &draw).unwrap_or_else(|| {
                        mine.unbounded += 1;
                        u32::from(held == 0)
                    }),
                };
                *out.matched.entry(name.clone()).or_default() += 1;
                *out.held.entry(name.clone()).or_default() += held;
                if slices.team_gpus.contains(name.as_str()) {
                    let gpus = out.slice_gpus.entry(name.clone()).or_default();
                    gpus.push(SliceGpu::new(
                        &id,
                        device.uuid(),
                        held + fits,
                        on_device,
                        class,
                    ));
                }
                if fits > 0 {
                    more.insert(name.clone(), fits);
                }
            }
            let namespaces: BTreeSet<Arc<str>> =
                on_device.iter().map(|(ns, _)| (*ns).clone()).collect();
            if namespaces.len() > 1 {
                out.shared_devices.push(SharedDevice {
                    id: id.clone(),
                    namespaces,
                    policies: matching
                        .iter()
                        .map(|&s| names[usize::from(s)].clone())
                        .collect(),
                });
            }
            out.give_out(key, Box::from([id.device.clone()]), more);
        }
    }
    matches.sweep();
}

/// The allocations of `claims` in `pools`, by device, each with its claim's namespace.
fn allocations_by_device<'c>(
    claims: impl IntoIterator<Item = &'c ClaimView>,
    pools: &BTreeSet<&PoolKey>,
) -> HashMap<&'c DeviceId, Vec<(&'c Arc<str>, &'c ClaimDevice)>> {
    let mut results: HashMap<&DeviceId, Vec<(&Arc<str>, &ClaimDevice)>> = HashMap::new();
    for claim in claims {
        for d in claim.devices.iter().filter(|d| !d.admin_access) {
            let key = PoolKey {
                driver: d.id.driver.clone(),
                pool: d.id.pool.clone(),
            };
            if pools.contains(&key) {
                let on = results.entry(&d.id).or_default();
                on.push((&claim.namespace, d));
            }
        }
    }
    results
}

/// What the allocations `on_device` leave of each of the device's `capacities`.
fn left_of(
    capacities: &[super::inventory::consumable::ConsumableCapacity],
    on_device: &[(&Arc<str>, &ClaimDevice)],
) -> Vec<i128> {
    let mut left: Vec<i128> = capacities.iter().map(|c| c.value).collect();
    for (_, result) in on_device {
        for (capacity, amount) in capacities.iter().zip(left.iter_mut()) {
            let consumed = (result.consumed.iter())
                .find(|(name, _)| **name == *capacity.name)
                .map_or(0, |(_, n)| *n);
            *amount = amount.saturating_sub(consumed);
        }
    }
    left
}

/// The devices of `pool` that allow multiple allocations and count as capacity, with the sets
/// that match each. Devices that also draw on counters are the counter groups' (an allocation
/// draws their counters once, whatever it consumes).
fn match_devices(pool: &Pool, sets: &BTreeMap<String, &CompiledExpressions>) -> PoolDeviceMatches {
    let drawing = pool.counters().map(|c| &c.drawing);
    (pool.counted_places())
        .filter(|(place, d)| {
            d.consumable().is_some()
                && !drawing.is_some_and(|how| !matches!(how[*place as usize], Drawing::Nothing))
        })
        .map(|(place, device)| {
            let matching = (sets.values().enumerate())
                .filter(|(_, set)| set.matches(device.env()).unwrap_or(false))
                .map(|(i, _)| u16::try_from(i).unwrap_or(u16::MAX))
                .collect();
            (place, matching)
        })
        .collect()
}
