//! What the inventory keeps of a ResourceSlice ([`SliceView`]).

use std::hash::{Hash, Hasher};
use std::sync::Arc;

use k8s_openapi::api::resource::v1::ResourceSlice;

use super::consumable::ConsumableCapacity;
use super::counters::{CounterSetView, CounterValues, Draw};
use crate::dra_cel::{DeviceEnv, DeviceEnvs, DeviceReads};

/// What projecting slices shares between them: the devices' CEL input ([`DeviceEnvs`]), their
/// counters ([`CounterValues`]) and what few devices have. Keep one per watch cache.
#[derive(Debug, Default)]
pub struct SliceValues {
    pub envs: DeviceEnvs,
    pub counters: CounterValues,
    rares: crate::intern::Interner<Rare>,
    /// What the device at each place of the slice projected last had, compared first: nodes
    /// of one model list the same devices in the same order.
    placed_rares: Vec<Option<Arc<Rare>>>,
    /// The draws of the device being projected, kept to be reused.
    draws: Vec<Draw>,
}

impl SliceValues {
    /// Forgets what no slice holds any more.
    pub fn prune(&mut self) {
        self.envs.prune();
        // Before the counters: what a shared Rare holds keeps counter values alive.
        self.placed_rares.clear();
        self.rares.prune();
        self.counters.prune();
    }

    /// What few devices have of `device`, the device at `place` of its slice: the same as the
    /// device at that place of the slice projected before, most of the time.
    fn rare(
        &mut self,
        place: usize,
        device: &k8s_openapi::api::resource::v1::Device,
        driver: &str,
    ) -> Option<Arc<Rare>> {
        let taint = (device.taints.iter().flatten())
            .find(|t| t.effect == "NoSchedule" || t.effect == "NoExecute")
            .map(|t| Arc::from(t.key.as_str()));
        let mut draws = std::mem::take(&mut self.draws);
        draws.extend(
            (device.consumes_counters.iter().flatten())
                .map(|draw| Draw::project(draw, &mut self.counters)),
        );
        let shared = device.allow_multiple_allocations == Some(true);
        let consumable: Box<[ConsumableCapacity]> = match shared {
            true => (device.capacity.iter().flatten())
                .map(|(name, c)| ConsumableCapacity::project(name, c))
                .collect(),
            false => Box::default(),
        };
        let uuid = shared.then(|| uuid_of(device, driver)).flatten();
        let rare = if taint.is_none() && draws.is_empty() && consumable.is_empty() {
            None
        } else if let Some(Some(placed)) = self.placed_rares.get(place)
            && (
                &placed.taint,
                &*placed.draws,
                &placed.consumable,
                &placed.uuid,
            ) == (&taint, &draws[..], &consumable, &uuid)
        {
            Some(Arc::clone(placed))
        } else {
            let rare = self.rares.share(Rare {
                taint,
                draws: draws.as_slice().into(),
                consumable,
                uuid,
            });
            if self.placed_rares.len() <= place {
                self.placed_rares.resize(place + 1, None);
            }
            self.placed_rares[place] = Some(Arc::clone(&rare));
            Some(rare)
        };
        // Kept empty, so that it holds no counter value between devices.
        draws.clear();
        self.draws = draws;
        rare
    }
}

/// What the inventory keeps of a ResourceSlice: its pool, node and generation, and per device
/// its name, whether a taint keeps it from claims, and its CEL input reduced to what expressions
/// read ([`DeviceReads`]), shared between devices with equal input. A slice of 8 GPUs of one
/// model is a few hundred bytes instead of tens of KiB.
#[derive(Debug, Clone)]
pub struct SliceView {
    pub name: Arc<str>,
    /// The slice's identity (uid and resourceVersion, or its content) and the reads it was
    /// projected to: equal identities, equal views.
    pub(super) identity: u64,
    pub driver: Arc<str>,
    pub pool: Arc<str>,
    pub generation: i64,
    pub resource_slice_count: i64,
    pub node: Option<Arc<str>>,
    pub(super) devices: Box<[SliceDevice]>,
    /// `spec.sharedCounters`.
    pub(super) counter_sets: Box<[CounterSetView]>,
}

#[derive(Debug, Clone)]
pub(super) struct SliceDevice {
    pub(super) name: Arc<str>,
    pub(super) env: Arc<DeviceEnv>,
    /// What few devices have, behind a pointer so that the others pay 8 bytes for it (40,000
    /// devices); shared between equal ones (the same GPU of every node of a model draws alike).
    rare: Option<Arc<Rare>>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Rare {
    /// The key of the first taint that keeps the device from claims (NoSchedule, NoExecute).
    taint: Option<Arc<str>>,
    /// `consumesCounters`.
    draws: Box<[Draw]>,
    /// Every capacity, when the device allows multiple allocations (empty otherwise).
    consumable: Box<[ConsumableCapacity]>,
    /// Its driver's `uuid` attribute, when it allows multiple allocations: what a team's
    /// templates select it by when its slices go on GPUs of the team's own.
    uuid: Option<Arc<str>>,
}

impl SliceDevice {
    pub(super) fn taint(&self) -> Option<&Arc<str>> {
        self.rare.as_ref()?.taint.as_ref()
    }

    pub(super) fn draws(&self) -> &[Draw] {
        self.rare.as_ref().map_or(&[], |r| &r.draws)
    }

    /// The `uuid` attribute of a device that allows multiple allocations.
    pub(super) fn uuid(&self) -> Option<&Arc<str>> {
        self.rare.as_ref()?.uuid.as_ref()
    }

    /// The device's capacities, when it allows multiple allocations.
    pub(super) fn consumable(&self) -> Option<&[ConsumableCapacity]> {
        (self.rare.as_ref()).and_then(|r| (!r.consumable.is_empty()).then_some(&*r.consumable))
    }
}

/// The driver's `uuid` attribute of `device` (`uuid` or `<driver>/uuid`), if a string.
fn uuid_of(device: &k8s_openapi::api::resource::v1::Device, driver: &str) -> Option<Arc<str>> {
    let attributes = device.attributes.as_ref()?;
    let value = (attributes.get("uuid")).or_else(|| attributes.get(&format!("{driver}/uuid")))?;
    value.string.as_deref().map(Arc::from)
}

impl SliceView {
    /// `slice` reduced to what the inventory and expressions reading `reads` need.
    pub fn project(slice: &ResourceSlice, reads: &DeviceReads, values: &mut SliceValues) -> Self {
        let spec = &slice.spec;
        values.counters.begin_slice(spec);
        let published = spec.shared_counters.as_deref().unwrap_or_default();
        let counter_sets: Box<[CounterSetView]> = (published.iter())
            .map(|set| CounterSetView::project(set, &mut values.counters))
            .collect();
        let devices = spec
            .devices
            .iter()
            .flatten()
            .enumerate()
            .map(|(place, d)| SliceDevice {
                name: Arc::from(d.name.as_str()),
                env: values.envs.project(&spec.driver, d, reads),
                rare: values.rare(place, d, &spec.driver),
            })
            .collect();
        let mut view = SliceView {
            name: Arc::from(slice.metadata.name.as_deref().unwrap_or_default()),
            identity: 0,
            driver: Arc::from(spec.driver.as_str()),
            pool: Arc::from(spec.pool.name.as_str()),
            generation: spec.pool.generation,
            resource_slice_count: spec.pool.resource_slice_count,
            node: spec.node_name.as_deref().map(Arc::from),
            devices,
            counter_sets,
        };
        // uid and resourceVersion, as for any object of the API server; a slice read from a file
        // has none and is told by what it holds (its projection: hashing that is cheaper than
        // its whole text, twice as long with counter sets).
        let mut hasher = std::hash::DefaultHasher::new();
        let meta = &slice.metadata;
        match &meta.resource_version {
            Some(rv) => (&meta.name, &meta.uid, rv).hash(&mut hasher),
            None => view.hash_content(&mut hasher),
        }
        reads.hash(&mut hasher);
        view.identity = hasher.finish();
        view
    }

    /// Hashes what the view holds (its name and everything projected).
    fn hash_content(&self, hasher: &mut impl Hasher) {
        (&*self.name, &*self.driver, &*self.pool).hash(hasher);
        (
            self.generation,
            self.resource_slice_count,
            self.node.as_deref(),
        )
            .hash(hasher);
        for d in self.devices.iter() {
            (&*d.name, &*d.env, &d.rare).hash(hasher);
        }
        self.counter_sets.hash(hasher);
    }

    /// Whether `other` holds what this view holds, whatever its identity says (a new
    /// resourceVersion for a change of something not projected, a label say): a watch cache
    /// keeps the view it has then, and wakes no pass.
    pub fn same_content(&self, other: &SliceView) -> bool {
        let devices = self.devices.len() == other.devices.len()
            && (self.devices.iter().zip(other.devices.iter())).all(|(a, b)| {
                a.name == b.name
                    && a.rare == b.rare
                    && (Arc::ptr_eq(&a.env, &b.env) || a.env == b.env)
            });
        devices
            && self.name == other.name
            && self.driver == other.driver
            && self.pool == other.pool
            && self.generation == other.generation
            && self.resource_slice_count == other.resource_slice_count
            && self.node == other.node
            && self.counter_sets == other.counter_sets
    }

    /// How many devices the slice publishes.
    pub fn device_count(&self) -> usize {
        self.devices.len()
    }
}
