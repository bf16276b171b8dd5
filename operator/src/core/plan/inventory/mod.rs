//! The devices published in ResourceSlices, and which policies' class expressions match them.
//!
//! Pools follow the Kubernetes allocator (`GatherPools`/`addSlice`/`poolIsInvalid` in
//! `staging/src/k8s.io/dynamic-resource-allocation/structured/internal/*/pools_*.go`): a pool is
//! keyed by driver + pool name, only slices of its highest `spec.pool.generation` count, the pool
//! is incomplete when their number differs from `resourceSliceCount` (taken from the pool's
//! first slice), and invalid when a device name repeats.
//!
//! Devices of incomplete or invalid pools are **not counted** as capacity: the allocator used when
//! any DRA beta feature is on (`internal/incubating/allocator_incubating.go`, `allocateOne`:
//! "We don't allocate devices from invalid or incomplete pools") skips them, and
//! `AllocationMode: All` requests fail outright on them. (The stable allocator still allocates
//! from incomplete pools; counting them would over-promise while a driver republishes.) They are
//! reported in [`Inventory::pools`] so the caller can surface it.
//!
//! Devices with a taint of effect `NoSchedule` or `NoExecute` are not counted either: claims that
//! do not tolerate the taint cannot get them (`DeviceTaint.effect`; `None` and unknown effects are
//! informational).
//!
//! Devices that draw on shared counters ([`counters`]) count as many as fit the counters at once;
//! a device drawing on a counter set the pool does not publish is not counted.
//!
//! All slices count regardless of node selection (a cluster-wide view).

use std::borrow::Borrow;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use k8s_openapi::api::resource::v1::{DeviceClass, ResourceSlice};

pub mod consumable;
mod counter_values;
mod counters;
mod matches;
mod most_that_fit;
mod slice;

pub use crate::core::state::ExtraTaint;
pub use counters::{
    CounterGroup, CounterSetView, CounterValues, Draw, Drawing, GroupValues, PoolCounters,
};
pub use matches::{
    EvaluationErrors, GroupMatches, MatchReport, Tainted, match_pool, match_pool_and_groups,
};
pub use most_that_fit::{Fit, most_that_fit};
use slice::SliceDevice;
pub use slice::{SliceValues, SliceView};

use crate::core::state::Delta;
use crate::dra_cel::{CompiledExpressions, DeviceEnv, DeviceReads, ExpressionError};

/// A device's identity (`<driver>/<pool>/<device>` in allocation results).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DeviceId {
    pub driver: Arc<str>,
    pub pool: Arc<str>,
    pub device: Arc<str>,
}

impl std::fmt::Display for DeviceId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}/{}", self.driver, self.pool, self.device)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PoolKey {
    pub driver: Arc<str>,
    pub pool: Arc<str>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolStatus {
    pub generation: i64,
    /// `resourceSliceCount` of the pool's first slice at `generation`.
    pub resource_slice_count: i64,
    /// Slices seen at `generation`.
    pub slices: usize,
    pub incomplete: bool,
    /// Why the pool is invalid (a duplicate device name), if it is.
    pub invalid: Option<String>,
    /// Devices in the pool at `generation`.
    pub devices: usize,
}

impl PoolStatus {
    /// Whether the pool's devices are counted.
    pub fn usable(&self) -> bool {
        !self.incomplete && self.invalid.is_none()
    }
}

/// One device of a pool, read from the slice that publishes it (the pool keeps the slices, not a
/// copy of each device: 40,000 devices would be 4 MiB of copies).
#[derive(Debug, Clone, Copy)]
pub struct InventoryDevice<'a> {
    pool: &'a PoolKey,
    slice: &'a SliceView,
    device: &'a SliceDevice,
    /// A taint from outside the slice ([`ExtraTaint`]).
    extra: Option<&'a Arc<str>>,
}

impl<'a> InventoryDevice<'a> {
    pub fn id(&self) -> DeviceId {
        DeviceId {
            driver: self.pool.driver.clone(),
            pool: self.pool.pool.clone(),
            device: self.device.name.clone(),
        }
    }

    /// The device's name in its pool.
    pub fn name(&self) -> &'a str {
        &self.device.name
    }

    /// The slice that publishes the device.
    pub fn slice(&self) -> &'a str {
        &self.slice.name
    }

    pub fn node(&self) -> Option<&'a str> {
        self.slice.node.as_deref()
    }

    /// A taint with effect NoSchedule or NoExecute, in its slice or from outside it.
    pub fn tainted(&self) -> bool {
        self.taint().is_some()
    }

    /// The key of the first taint that keeps the device from claims (a driver's health
    /// taint, `gpu.nvidia.com/gpu-lost` say, or a DeviceTaintRule's).
    pub fn taint(&self) -> Option<&'a str> {
        (self.device.taint()).or(self.extra).map(|t| &**t)
    }

    /// The driver's `uuid` attribute of a device that allows multiple allocations.
    pub fn uuid(&self) -> Option<&'a Arc<str>> {
        self.device.uuid()
    }

    /// The device's capacities, when it allows multiple allocations ([`consumable`]).
    pub fn consumable(&self) -> Option<&'a [consumable::ConsumableCapacity]> {
        self.device.consumable()
    }

    /// The device's CEL input, shared by the devices with equal input (see [`DeviceEnvs`]).
    pub fn env(&self) -> &'a DeviceEnv {
        &self.device.env
    }
}

/// One pool at its newest generation.
#[derive(Debug, Clone)]
pub struct Pool {
    pub status: PoolStatus,
    key: PoolKey,
    /// The slices of the newest generation, shared with the watch cache.
    slices: Vec<Arc<SliceView>>,
    /// Every device of the newest generation, counted or not, sorted by (name, slice): its
    /// slice's index in `slices` and its index in that slice.
    order: Box<[(u32, u32)]>,
    /// Identity of every slice of the pool, all generations (see [`slice_identity`]).
    fingerprint: u64,
    /// The shared counters, when a device draws on them.
    counters: Option<Arc<PoolCounters>>,
    /// Taints from outside the slices, by place in [`Pool::devices`]' order, sorted.
    extra: Box<[(u32, Arc<str>)]>,
    /// The identity of the slices alone, before `extra` joins `fingerprint`.
    slices_fingerprint: u64,
    /// Whether a device of the newest generation allows multiple allocations.
    consumable: bool,
}

impl Pool {
    /// Every device of the newest generation, counted or not, in [`DeviceId`] order.
    pub fn devices(&self) -> impl Iterator<Item = InventoryDevice<'_>> {
        (0..self.order.len()).filter_map(|place| self.device_at(clamp_index(place)))
    }

    /// The device at `place` in [`Pool::devices`]' order.
    pub fn device_at(&self, place: u32) -> Option<InventoryDevice<'_>> {
        let &(slice, device) = self.order.get(place as usize)?;
        let slice = &*self.slices[slice as usize];
        let extra = match self.extra.is_empty() {
            true => None,
            false => (self.extra.binary_search_by_key(&place, |(p, _)| *p).ok())
                .map(|i| &self.extra[i].1),
        };
        Some(InventoryDevice {
            pool: &self.key,
            slice,
            device: &slice.devices[device as usize],
            extra,
        })
    }

    /// The devices that count as capacity (those drawing on shared counters count as many as
    /// fit: see [`Pool::counters`]).
    pub fn counted(&self) -> impl Iterator<Item = InventoryDevice<'_>> {
        self.counted_places().map(|(_, d)| d)
    }

    /// [`Pool::counted`] with each device's place in [`Pool::devices`]' order.
    pub fn counted_places(&self) -> impl Iterator<Item = (u32, InventoryDevice<'_>)> {
        let usable = self.status.usable();
        let drawing = self.counters.as_ref().map(|c| &c.drawing);
        (self.devices().enumerate())
            .filter(move |(place, d)| {
                usable
                    && !d.tainted()
                    && !drawing.is_some_and(|how| matches!(how[*place], Drawing::Unknown(_)))
            })
            .map(|(place, d)| (clamp_index(place), d))
    }

    /// The pool's shared counters, when a device draws on them.
    pub fn counters(&self) -> Option<&PoolCounters> {
        self.counters.as_deref()
    }

    /// Whether a device of the pool allows multiple allocations ([`consumable`]).
    pub fn has_consumable(&self) -> bool {
        self.consumable
    }

    /// The node whose Pods can use the pool's devices: the `nodeName` of every slice of the
    /// newest generation, when they all name the same one (the NVIDIA driver publishes a pool
    /// per node). `None` for devices reached from many nodes (network-attached, `allNodes`,
    /// a node selector) or slices that disagree.
    pub fn node(&self) -> Option<&Arc<str>> {
        let first = self.slices.first()?.node.as_ref()?;
        (self.slices.iter())
            .all(|s| s.node.as_ref() == Some(first))
            .then_some(first)
    }

    /// Identity of the slices this pool was built from and of the taints from outside them:
    /// equal fingerprints, equal pools.
    pub fn fingerprint(&self) -> u64 {
        self.fingerprint
    }

    /// Takes the devices `taints` select as tainted; whether that changed the pool.
    fn taint_from(&mut self, taints: &[ExtraTaint]) -> bool {
        let mine: Vec<&ExtraTaint> = (taints.iter())
            .filter(|t| t.driver.as_deref().is_none_or(|d| d == &*self.key.driver))
            .filter(|t| t.pool.as_deref().is_none_or(|p| p == &*self.key.pool))
            .collect();
        let extra: Box<[(u32, Arc<str>)]> = if mine.is_empty() {
            Box::default()
        } else {
            (self.order.iter().enumerate())
                .filter_map(|(place, &(slice, device))| {
                    let name = &self.slices[slice as usize].devices[device as usize].name;
                    let taint = mine.iter().find(|t| t.selects(&self.key, name))?;
                    Some((clamp_index(place), Arc::from(taint.key.as_str())))
                })
                .collect()
        };
        if extra == self.extra {
            return false;
        }
        let mut hasher = std::hash::DefaultHasher::new();
        (self.slices_fingerprint, &extra).hash(&mut hasher);
        self.fingerprint = if extra.is_empty() {
            self.slices_fingerprint
        } else {
            hasher.finish()
        };
        self.extra = extra;
        true
    }
}

impl ExtraTaint {
    fn selects(&self, pool: &PoolKey, device: &str) -> bool {
        self.driver.as_deref().is_none_or(|d| d == &*pool.driver)
            && self.pool.as_deref().is_none_or(|p| p == &*pool.pool)
            && self.device.as_deref().is_none_or(|d| d == device)
    }
}

/// Every pool's devices. Built pool by pool and kept up to date by [`Inventory::update`], which
/// rebuilds only the pools whose slices changed: a node's driver republishing its slice costs
/// that node's devices, not the cluster's.
#[derive(Debug, Clone, Default)]
pub struct Inventory {
    pools: BTreeMap<PoolKey, Pool>,
    /// Every slice, all generations, by pool and name: what a pool is rebuilt from.
    slices: HashMap<PoolKey, BTreeMap<Arc<str>, Arc<SliceView>>>,
    /// The pool of each slice, by name.
    pool_of: HashMap<Arc<str>, PoolKey>,
    /// Counts the updates that changed a pool.
    version: u64,
    /// The taints from outside the slices, sorted.
    extra_taints: Vec<ExtraTaint>,
    /// Budgets and draws of counter groups, shared between pools.
    group_values: GroupValues,
}

impl Inventory {
    /// The inventory of whole slices (every attribute kept), e.g. for a plan made once.
    pub fn from_slices(slices: &[ResourceSlice]) -> Self {
        let mut envs = SliceValues::default();
        let views: Vec<Arc<SliceView>> = slices
            .iter()
            .map(|s| Arc::new(SliceView::project(s, &DeviceReads::everything(), &mut envs)))
            .collect();
        let mut inventory = Inventory::default();
        inventory.update(Delta::All(&views));
        inventory
    }

    /// Brings the inventory up to date with `slices`, all of the cluster's or what changed,
    /// rebuilding only the pools whose slices changed. Returns the pools rebuilt or removed.
    /// Slices are told apart by name, as the API server does.
    pub fn update(&mut self, slices: Delta<'_, SliceView>) -> Vec<PoolKey> {
        let mut touched = BTreeSet::new();
        let relisted = matches!(slices, Delta::All(_));
        match slices {
            Delta::All(all) => {
                touched.extend(self.slices.keys().cloned());
                self.slices.clear();
                self.pool_of.clear();
                for s in all {
                    self.insert(s, &mut touched);
                }
            }
            Delta::Changed { upserted, removed } => {
                for s in removed {
                    self.remove(&s.name, &mut touched);
                }
                for s in upserted {
                    self.insert(s, &mut touched);
                }
            }
        }
        let mut changed = Vec::new();
        for key in touched {
            let Some(members) = self.slices.get(&key) else {
                if self.pools.remove(&key).is_some() {
                    changed.push(key);
                }
                continue;
            };
            // By name, so that "the pool's first slice" is deterministic.
            let members: Vec<&Arc<SliceView>> = members.values().collect();
            let mut hasher = std::hash::DefaultHasher::new();
            for s in &members {
                s.identity.hash(&mut hasher);
            }
            let fingerprint = hasher.finish();
            if (self.pools.get(&key)).is_some_and(|p| p.slices_fingerprint == fingerprint) {
                continue;
            }
            let mut pool = build_pool(&key, &members, fingerprint, &mut self.group_values);
            pool.taint_from(&self.extra_taints);
            self.pools.insert(key.clone(), pool);
            changed.push(key);
        }
        if !changed.is_empty() {
            self.version += 1;
        }
        if relisted {
            self.group_values.prune();
        }
        changed
    }

    /// Puts `slice` in its pool (taking it out of the one it was in, if it moved).
    fn insert(&mut self, slice: &Arc<SliceView>, touched: &mut BTreeSet<PoolKey>) {
        self.remove(&slice.name, touched);
        let key = PoolKey {
            driver: slice.driver.clone(),
            pool: slice.pool.clone(),
        };
        let members = self.slices.entry(key.clone()).or_default();
        members.insert(slice.name.clone(), slice.clone());
        self.pool_of.insert(slice.name.clone(), key.clone());
        touched.insert(key);
    }

    fn remove(&mut self, name: &str, touched: &mut BTreeSet<PoolKey>) {
        let Some(key) = self.pool_of.remove(name) else {
            return;
        };
        if let Some(members) = self.slices.get_mut(&key) {
            members.remove(name);
            if members.is_empty() {
                self.slices.remove(&key);
            }
        }
        touched.insert(key);
    }

    /// Taints the devices that `taints` select (in no particular order), from now on; returns
    /// the pools whose devices it changed, whose fingerprints change with it.
    pub fn set_extra_taints(&mut self, taints: &[ExtraTaint]) -> Vec<PoolKey> {
        let mut sorted = taints.to_vec();
        sorted.sort();
        sorted.dedup();
        if sorted == self.extra_taints {
            return Vec::new();
        }
        self.extra_taints = sorted;
        let mut changed = Vec::new();
        for (key, pool) in &mut self.pools {
            if pool.taint_from(&self.extra_taints) {
                changed.push(key.clone());
            }
        }
        if !changed.is_empty() {
            self.version += 1;
        }
        changed
    }

    /// Changes whenever a pool changed, so that what was computed from the pools can be reused
    /// while it stays the same.
    pub fn version(&self) -> u64 {
        self.version
    }

    pub fn pools(&self) -> &BTreeMap<PoolKey, Pool> {
        &self.pools
    }

    /// Every device of every pool's newest generation, counted or not, in [`DeviceId`] order.
    pub fn devices(&self) -> impl Iterator<Item = InventoryDevice<'_>> {
        self.pools.values().flat_map(Pool::devices)
    }

    /// The devices that count as capacity.
    pub fn counted(&self) -> impl Iterator<Item = InventoryDevice<'_>> {
        self.pools.values().flat_map(Pool::counted)
    }

    /// How many devices the pools' newest generations publish, counted or not.
    pub fn device_count(&self) -> usize {
        self.pools.values().map(|p| p.order.len()).sum()
    }

    pub fn incomplete_pools(&self) -> impl Iterator<Item = &PoolKey> {
        self.pools
            .iter()
            .filter(|(_, p)| p.status.incomplete)
            .map(|(k, _)| k)
    }

    /// Matches every counted device against every named expression set.
    pub fn match_sets<S: Borrow<CompiledExpressions>>(
        &self,
        sets: &BTreeMap<String, S>,
    ) -> MatchReport {
        let mut report = MatchReport {
            counts: sets.keys().map(|k| (k.clone(), 0)).collect(),
            ..Default::default()
        };
        for pool in self.pools.values() {
            report.merge(&match_pool(pool, sets));
        }
        report
    }
    /// Whether `expressions` match any device of the inventory, counted or not (a class describes
    /// hardware; a tainted device or a pool being republished does not change that). Devices on
    /// which evaluation fails do not match.
    pub fn any_device_matches(&self, expressions: &CompiledExpressions) -> bool {
        self.devices()
            .any(|d| expressions.matches(d.env()) == Ok(true))
    }

    /// [`Self::any_device_matches`] for a DeviceClass, e.g. to decide whether a foreign class
    /// hands out devices a policy governs.
    pub fn any_device_matches_class(&self, class: &DeviceClass) -> Result<bool, ExpressionError> {
        Ok(self.any_device_matches(&compile_class(class)?))
    }
}

/// One pool from its slices (all generations, sorted by name): only the newest generation counts.
fn build_pool(
    key: &PoolKey,
    slices: &[&Arc<SliceView>],
    fingerprint: u64,
    shared: &mut GroupValues,
) -> Pool {
    let generation = slices
        .iter()
        .map(|s| s.generation)
        .max()
        .unwrap_or_default();
    let newest: Vec<Arc<SliceView>> = slices
        .iter()
        .filter(|s| s.generation == generation)
        .map(|s| Arc::clone(s))
        .collect();
    let resource_slice_count = newest.first().map_or(0, |s| s.resource_slice_count);
    let mut names = BTreeSet::new();
    let mut invalid = None;
    let mut set_names = BTreeSet::new();
    for set in newest.iter().flat_map(|s| s.counter_sets.iter()) {
        if !set_names.insert(&*set.name) && invalid.is_none() {
            invalid = Some(format!("duplicate counter set name {}", set.name));
        }
    }
    let mut order = Vec::with_capacity(newest.iter().map(|s| s.devices.len()).sum());
    for (i, s) in newest.iter().enumerate() {
        for (j, d) in s.devices.iter().enumerate() {
            if !names.insert(&*d.name) && invalid.is_none() {
                invalid = Some(format!("duplicate device name {}", d.name));
            }
            // A slice holds at most 128 devices, and a pool not four billion slices.
            order.push((clamp_index(i), clamp_index(j)));
        }
    }
    let place = |&(i, j): &(u32, u32)| {
        let slice = &newest[i as usize];
        (&*slice.devices[j as usize].name, &*slice.name)
    };
    order.sort_by(|a, b| place(a).cmp(&place(b)));
    let sets: Vec<&CounterSetView> = newest.iter().flat_map(|s| s.counter_sets.iter()).collect();
    let draws: Vec<&[Draw]> = order
        .iter()
        .map(|&(i, j)| newest[i as usize].devices[j as usize].draws())
        .collect();
    let counters = PoolCounters::shared(&sets, &draws, shared);
    let consumable = (newest.iter()).any(|s| s.devices.iter().any(|d| d.consumable().is_some()));
    let status = PoolStatus {
        generation,
        resource_slice_count,
        slices: newest.len(),
        incomplete: i64::try_from(newest.len()) != Ok(resource_slice_count),
        invalid,
        devices: order.len(),
    };
    Pool {
        status,
        key: key.clone(),
        slices: newest,
        order: order.into_boxed_slice(),
        fingerprint,
        counters,
        consumable,
        extra: Box::default(),
        slices_fingerprint: fingerprint,
    }
}

fn clamp_index(i: usize) -> u32 {
    u32::try_from(i).unwrap_or(u32::MAX)
}

/// The compiled expressions of a DeviceClass's `selectors`. A selector without `cel` is of a
/// type this version does not know; the allocator cannot evaluate it either, so it is reported
/// as invalid.
pub fn compile_class(class: &DeviceClass) -> Result<CompiledExpressions, ExpressionError> {
    let mut exprs = Vec::new();
    for (index, s) in class.spec.selectors.iter().flatten().enumerate() {
        match &s.cel {
            Some(cel) => exprs.push(cel.expression.clone()),
            None => {
                return Err(ExpressionError::Invalid {
                    index,
                    expression: String::new(),
                    message: "unsupported selector type (no cel)".to_owned(),
                });
            }
        }
    }
    CompiledExpressions::compile(&exprs)
}

#[cfg(test)]
mod tests;
