//! What the class expressions of the policies match in the inventory, pool by pool
//! ([`match_pool`]): counted devices per expression set, overlaps, evaluation errors, and the
//! matching devices a taint keeps from claims.

use std::borrow::Borrow;
use std::collections::{BTreeMap, BTreeSet};

use super::{DeviceId, Pool};
use crate::dra_cel::{CompiledExpressions, ExpressionError};

/// Errors of one expression set, in device order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EvaluationErrors {
    pub devices: u32,
    /// The first few failures.
    pub first: Vec<(DeviceId, ExpressionError)>,
}

const ERRORS_KEPT: usize = 5;

/// How many counted devices each named expression set matches.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MatchReport {
    /// Every name, with 0 when nothing matches.
    pub counts: BTreeMap<String, u32>,
    /// Devices matched by two or more names.
    pub overlaps: Vec<(DeviceId, Vec<String>)>,
    /// Number of shared devices per pair of names (first < second).
    pub overlap_pairs: BTreeMap<(String, String), u32>,
    pub errors: BTreeMap<String, EvaluationErrors>,
    /// Per name, the matching devices of usable pools that a taint keeps from claims.
    pub tainted: BTreeMap<String, Tainted>,
    /// Per name, the matching devices of usable pools that draw on a counter set (or counter)
    /// their pool does not publish, which the allocator cannot allocate; the "keys" are the
    /// first few devices with why.
    pub undeclared: BTreeMap<String, Tainted>,
}

/// Matching devices a taint keeps from claims (NoSchedule or NoExecute, as drivers mark
/// unhealthy devices: KEP-5055), and the first few taint keys.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Tainted {
    pub devices: u32,
    pub keys: BTreeSet<String>,
}

impl Tainted {
    fn add(&mut self, devices: u32, keys: impl IntoIterator<Item = String>) {
        self.devices += devices;
        for key in keys {
            if self.keys.len() < ERRORS_KEPT {
                self.keys.insert(key);
            }
        }
    }
}

impl MatchReport {
    /// Adds the report of the devices that follow this report's, as if matched in one pass.
    pub fn merge(&mut self, next: &MatchReport) {
        for (name, n) in &next.counts {
            match self.counts.get_mut(name) {
                Some(count) => *count += n,
                None => {
                    self.counts.insert(name.clone(), *n);
                }
            }
        }
        self.overlaps.extend(next.overlaps.iter().cloned());
        for (pair, n) in &next.overlap_pairs {
            *self.overlap_pairs.entry(pair.clone()).or_default() += n;
        }
        for (name, tainted) in &next.tainted {
            let mine = self.tainted.entry(name.clone()).or_default();
            mine.add(tainted.devices, tainted.keys.iter().cloned());
        }
        for (name, undeclared) in &next.undeclared {
            let mine = self.undeclared.entry(name.clone()).or_default();
            mine.add(undeclared.devices, undeclared.keys.iter().cloned());
        }
        for (name, errors) in &next.errors {
            let mine = self.errors.entry(name.clone()).or_default();
            mine.devices += errors.devices;
            let room = ERRORS_KEPT.saturating_sub(mine.first.len());
            mine.first.extend(errors.first.iter().take(room).cloned());
        }
    }
}

/// One pool's devices against every named expression set. Only the names that match a device are
/// counted: a pool's report is kept per pool, and 5,000 pools of 20 mostly-zero counts would be
/// megabytes ([`Inventory::match_sets`] and [`MatchReport::merge`] give every name).
pub fn match_pool<S: Borrow<CompiledExpressions>>(
    pool: &Pool,
    sets: &BTreeMap<String, S>,
) -> MatchReport {
    match_pool_and_groups(pool, sets).0
}

/// Per counter group of a pool, per device of the group (in the group's order), the places of
/// the expression sets that match it (counted devices only: a tainted device still draws on the
/// counters when allocated, but no claim gets it anew).
///
/// Devices with equal CEL input (a node's GPUs of one model) match alike: a list per input, held
/// once, and per device which. A pool is a handful of allocations, not one per group and device
/// (a plan from objects builds this for 5,000 pools).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GroupMatches {
    /// Lists of set places, one per CEL input; the first is empty.
    lists: Box<[Box<[u16]>]>,
    /// Per device of every group, groups one after the other: its place in `lists`.
    devices: Box<[u32]>,
    /// Where each group's devices end in `devices`.
    ends: Box<[u32]>,
}

/// One group of [`GroupMatches`]: per device, the places of the sets that match it.
#[derive(Debug, Clone, Copy)]
pub struct GroupDevices<'a> {
    lists: &'a [Box<[u16]>],
    devices: &'a [u32],
}

impl GroupMatches {
    pub fn groups(&self) -> impl Iterator<Item = GroupDevices<'_>> {
        let starts = std::iter::once(0).chain(self.ends.iter().copied());
        (starts.zip(self.ends.iter().copied())).map(|(start, end)| GroupDevices {
            lists: &self.lists,
            devices: &self.devices[start as usize..end as usize],
        })
    }
}

impl<'a> GroupDevices<'a> {
    pub fn len(&self) -> usize {
        self.devices.len()
    }

    /// The places of the sets that match device `i` of the group.
    pub fn sets(&self, i: usize) -> &'a [u16] {
        (self.devices.get(i)).map_or(&[], |&list| &self.lists[list as usize])
    }

    pub fn iter(&self) -> impl Iterator<Item = &'a [u16]> + use<'a> {
        let lists = self.lists;
        (self.devices.iter()).map(move |&list| &*lists[list as usize])
    }
}

/// [`match_pool`], and for a pool with counters, what its groups' devices match.
pub fn match_pool_and_groups<S: Borrow<CompiledExpressions>>(
    pool: &Pool,
    sets: &BTreeMap<String, S>,
) -> (MatchReport, Option<GroupMatches>) {
    let mut report = MatchReport::default();
    report_uncounted(pool, sets, &mut report);
    let counters = pool.counters();
    // Devices of one model share their CEL input (a node's 8 GPUs): evaluated once per input,
    // and with counters, the places of the sets it matches listed once (see [`GroupMatches`]).
    let mut by_env: rustc_hash::FxHashMap<*const crate::dra_cel::DeviceEnv, (Vec<_>, u32)> =
        Default::default();
    let mut lists: Vec<Box<[u16]>> = vec![Box::default()];
    // Per place in the pool, the list of the device there (the empty one: not counted).
    let mut list_at = vec![0; counters.map_or(0, |_| pool.order.len())];
    for (place, device) in pool.counted_places() {
        let env = device.env();
        let (results, list) = by_env.entry(std::ptr::from_ref(env)).or_insert_with(|| {
            let results: Vec<_> = (sets.values())
                .map(|set| set.borrow().matches(env))
                .collect();
            if counters.is_none() {
                return (results, 0);
            }
            lists.push(
                (results.iter().enumerate())
                    .filter(|(_, r)| matches!(r, Ok(true)))
                    .map(|(i, _)| u16::try_from(i).unwrap_or(u16::MAX))
                    .collect(),
            );
            (results, u32::try_from(lists.len() - 1).unwrap_or(u32::MAX))
        });
        if let Some(at) = list_at.get_mut(place as usize) {
            *at = *list;
        }
        let mut names: Vec<&String> = Vec::new();
        for ((name, _), result) in sets.iter().zip(results.iter().cloned()) {
            match result {
                Ok(true) => {
                    names.push(name);
                    match report.counts.get_mut(name) {
                        Some(c) => *c += 1,
                        None => {
                            report.counts.insert(name.clone(), 1);
                        }
                    }
                }
                Ok(false) => {}
                Err(e) => {
                    let errs = report.errors.entry(name.clone()).or_default();
                    errs.devices += 1;
                    if errs.first.len() < ERRORS_KEPT {
                        errs.first.push((device.id(), e));
                    }
                }
            }
        }
        if names.len() > 1 {
            for (i, a) in names.iter().enumerate() {
                for b in &names[i + 1..] {
                    *report
                        .overlap_pairs
                        .entry(((*a).clone(), (*b).clone()))
                        .or_default() += 1;
                }
            }
            report
                .overlaps
                .push((device.id(), names.into_iter().cloned().collect()));
        }
    }
    let groups = counters.map(|counters| group_matches(counters, lists, &list_at));
    (report, groups)
}

/// What of a usable pool the sets match but no claim can get: tainted devices, and devices that
/// draw on counters the pool does not publish.
fn report_uncounted<S: Borrow<CompiledExpressions>>(
    pool: &Pool,
    sets: &BTreeMap<String, S>,
    report: &mut MatchReport,
) {
    if !pool.status.usable() {
        return;
    }
    for device in pool.devices().filter(|d| d.tainted()) {
        for (name, set) in sets {
            if set.borrow().matches(device.env()) == Ok(true) {
                let key = device.taint().unwrap_or_default().to_owned();
                report
                    .tainted
                    .entry(name.clone())
                    .or_default()
                    .add(1, [key]);
            }
        }
    }
    if let Some(drawing) = pool.counters().map(|c| &c.drawing) {
        for (place, device) in pool.devices().enumerate() {
            let Some(super::Drawing::Unknown(why)) = drawing.get(place) else {
                continue;
            };
            if device.tainted() {
                continue;
            }
            for (name, set) in sets {
                if set.borrow().matches(device.env()) == Ok(true) {
                    let entry = report.undeclared.entry(name.clone()).or_default();
                    entry.add(1, [format!("{}: {why}", device.name())]);
                }
            }
        }
    }
}

/// Per group of `counters`, per device, the places of the sets that match it (see
/// [`GroupMatches`]), from the `lists` of the devices at each place of the pool (`list_at`).
fn group_matches(
    counters: &super::PoolCounters,
    lists: Vec<Box<[u16]>>,
    list_at: &[u32],
) -> GroupMatches {
    let mut devices = Vec::with_capacity(list_at.len());
    let mut ends = Vec::with_capacity(counters.groups.len());
    for group in counters.groups.iter() {
        devices.extend(
            (group.device_places()).map(|place| list_at.get(place as usize).copied().unwrap_or(0)),
        );
        ends.push(u32::try_from(devices.len()).unwrap_or(u32::MAX));
    }
    GroupMatches {
        lists: lists.into(),
        devices: devices.into(),
        ends: ends.into(),
    }
}
