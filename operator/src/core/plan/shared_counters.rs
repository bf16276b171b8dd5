//! What the policies can hold of the devices that draw on counter sets or allow multiple
//! allocations ([`SharedCounters`]): filled by the counter groups (`counters`) and the shared
//! devices (`consumable`), read by capacity, placement and status.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use super::inventory::{DeviceId, PoolKey};
use super::usage::ClaimDevice;

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
    /// Per policy, what more fits in the groups (or devices) whose free counters only its
    /// devices fit, by pool (a pool may come more than once).
    pub free: BTreeMap<String, Vec<(PoolKey, u32)>>,
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
        if let Some(micro) = share_micro(part, whole) {
            self.note_micro_share(policy, micro);
        }
    }

    /// Notes that a device of `policy` is `micro` millionths of its GPU ([`share_micro`]).
    pub(super) fn note_micro_share(&mut self, policy: &str, micro: u64) {
        match self.shares.get_mut(policy) {
            Some(largest) => *largest = (*largest).max(micro),
            None => {
                self.shares.insert(policy.to_owned(), micro);
            }
        }
    }
}

/// `part` of `whole`, in millionths rounded up (a budget counted in these never lets more run
/// than it says); `None` when either is not positive.
pub(super) fn share_micro(part: i128, whole: i128) -> Option<u64> {
    if whole <= 0 || part <= 0 {
        return None;
    }
    let micro = (part.saturating_mul(1_000_000) + whole - 1) / whole;
    Some(u64::try_from(micro).unwrap_or(u64::MAX))
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
        let free: u32 = self
            .free
            .get(policy)
            .map_or(0, |f| f.iter().map(|(_, n)| n).sum());
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

/// A device that allows multiple allocations, held by claims of two namespaces or more.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedDevice {
    pub id: DeviceId,
    pub namespaces: BTreeSet<Arc<str>>,
    /// The policies whose expressions match the device.
    pub policies: Vec<String>,
}

/// A GPU of a policy whose teams get GPUs of their own ([`super::team_gpus`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SliceGpu {
    pub id: DeviceId,
    /// What the team's templates select it by (`None`: the driver publishes no `uuid`, so it
    /// can be no team's).
    pub uuid: Option<Arc<str>>,
    /// The policy's slices it holds and could hold besides what is on it.
    pub slices: u32,
    /// The policy's slices on it now, by namespace.
    pub held: BTreeMap<Arc<str>, u32>,
}

impl SliceGpu {
    pub(super) fn new(
        id: &DeviceId,
        uuid: Option<&Arc<str>>,
        slices: u32,
        on_device: &[(&Arc<str>, &ClaimDevice)],
        class: &str,
    ) -> Self {
        let mut held: BTreeMap<Arc<str>, u32> = BTreeMap::new();
        for (ns, result) in on_device {
            if result.class.as_deref() == Some(class) {
                *held.entry((*ns).clone()).or_default() += 1;
            }
        }
        SliceGpu {
            id: id.clone(),
            uuid: uuid.cloned(),
            slices,
            held,
        }
    }
}

/// What a policy's claims meet on the devices that allow multiple allocations.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Consumable {
    /// Matching devices that allow multiple allocations.
    pub devices: u32,
    /// Of those, devices none of whose claims fits: a slice larger than the device's policy
    /// allows.
    pub unfit: u32,
    /// Of those, devices a claim of the class consumes nothing of: any number of claims fit, so
    /// each counts once.
    pub unbounded: u32,
}

/// Helpers `SharedCounters` offers the counter groups and the shared devices alike.
impl SharedCounters {
    /// Adds what the policies' claims fit in one group or device (`more`, by policy): to the
    /// one policy whose claims fit it, or as contested when several do.
    pub(super) fn give_out(
        &mut self,
        pool: &PoolKey,
        sets: Box<[Arc<str>]>,
        more: BTreeMap<String, u32>,
    ) {
        if more.len() == 1 {
            for (name, n) in more {
                self.free.entry(name).or_default().push((pool.clone(), n));
            }
        } else if more.len() > 1 {
            self.contested.push(Contested {
                pool: pool.clone(),
                sets,
                more,
            });
        }
    }
}
