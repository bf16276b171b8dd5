//! The devices published in ResourceSlices, and which policies' selectors match them.
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
//! All slices count regardless of node selection (a cluster-wide view).

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::resource::v1::{DeviceClass, ResourceSlice};

use super::device_cel::{CompiledSelectors, DeviceEnv, SelectorError};

/// A device's identity (`<driver>/<pool>/<device>` in allocation results).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DeviceId {
    pub driver: String,
    pub pool: String,
    pub device: String,
}

impl std::fmt::Display for DeviceId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}/{}", self.driver, self.pool, self.device)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PoolKey {
    pub driver: String,
    pub pool: String,
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

#[derive(Debug, Clone)]
pub struct InventoryDevice {
    pub id: DeviceId,
    pub slice: String,
    pub node: Option<String>,
    /// A taint with effect NoSchedule or NoExecute.
    pub tainted: bool,
    pub env: DeviceEnv,
}

impl InventoryDevice {
    /// Whether this device counts as capacity (usable pool, not tainted).
    pub fn counts(&self, pools: &BTreeMap<PoolKey, PoolStatus>) -> bool {
        let key = PoolKey {
            driver: self.id.driver.clone(),
            pool: self.id.pool.clone(),
        };
        !self.tainted && pools.get(&key).is_some_and(PoolStatus::usable)
    }
}

/// All devices of the newest generation of every pool, sorted by [`DeviceId`].
#[derive(Debug, Clone, Default)]
pub struct Inventory {
    /// Every device of every pool's newest generation, counted or not.
    pub devices: Vec<InventoryDevice>,
    pub pools: BTreeMap<PoolKey, PoolStatus>,
    /// Indexes into `devices` of the devices that count as capacity.
    counted: Vec<usize>,
}

/// Errors of one selector set, in device order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EvaluationErrors {
    pub devices: u32,
    /// The first few failures.
    pub first: Vec<(DeviceId, SelectorError)>,
}

const ERRORS_KEPT: usize = 5;

/// How many counted devices each named selector set matches.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MatchReport {
    /// Every name, with 0 when nothing matches.
    pub counts: BTreeMap<String, u32>,
    /// Devices matched by two or more names.
    pub overlaps: Vec<(DeviceId, Vec<String>)>,
    /// Number of shared devices per pair of names (first < second).
    pub overlap_pairs: BTreeMap<(String, String), u32>,
    pub errors: BTreeMap<String, EvaluationErrors>,
}

impl Inventory {
    pub fn from_slices(slices: &[ResourceSlice]) -> Self {
        // Newest generation per pool; slices sorted by name so "first slice" is deterministic.
        let mut by_pool: BTreeMap<PoolKey, (i64, Vec<&ResourceSlice>)> = BTreeMap::new();
        let mut sorted: Vec<&ResourceSlice> = slices.iter().collect();
        sorted.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        for s in sorted {
            let key = PoolKey {
                driver: s.spec.driver.clone(),
                pool: s.spec.pool.name.clone(),
            };
            let generation = s.spec.pool.generation;
            let entry = by_pool.entry(key).or_insert((generation, Vec::new()));
            if generation > entry.0 {
                *entry = (generation, Vec::new());
            }
            if generation == entry.0 {
                entry.1.push(s);
            }
        }
        let mut inv = Inventory::default();
        for (key, (generation, slices)) in by_pool {
            let resource_slice_count = slices
                .first()
                .map_or(0, |s| s.spec.pool.resource_slice_count);
            let mut names = BTreeSet::new();
            let mut invalid = None;
            let mut devices = 0;
            for s in &slices {
                for d in s.spec.devices.iter().flatten() {
                    devices += 1;
                    if !names.insert(d.name.as_str()) && invalid.is_none() {
                        invalid = Some(format!("duplicate device name {}", d.name));
                    }
                    let tainted = d
                        .taints
                        .iter()
                        .flatten()
                        .any(|t| t.effect == "NoSchedule" || t.effect == "NoExecute");
                    inv.devices.push(InventoryDevice {
                        id: DeviceId {
                            driver: key.driver.clone(),
                            pool: key.pool.clone(),
                            device: d.name.clone(),
                        },
                        slice: s.metadata.name.clone().unwrap_or_default(),
                        node: s.spec.node_name.clone(),
                        tainted,
                        env: DeviceEnv::new(&s.spec.driver, d),
                    });
                }
            }
            let status = PoolStatus {
                generation,
                resource_slice_count,
                slices: slices.len(),
                incomplete: i64::try_from(slices.len()) != Ok(resource_slice_count),
                invalid,
                devices,
            };
            inv.pools.insert(key, status);
        }
        inv.devices
            .sort_by(|a, b| a.id.cmp(&b.id).then_with(|| a.slice.cmp(&b.slice)));
        inv.counted = (0..inv.devices.len())
            .filter(|&i| inv.devices[i].counts(&inv.pools))
            .collect();
        inv
    }

    /// The devices that count as capacity.
    pub fn counted(&self) -> impl Iterator<Item = &InventoryDevice> {
        self.counted.iter().filter_map(|&i| self.devices.get(i))
    }

    pub fn incomplete_pools(&self) -> impl Iterator<Item = &PoolKey> {
        self.pools
            .iter()
            .filter(|(_, s)| s.incomplete)
            .map(|(k, _)| k)
    }

    /// Matches every counted device against every named selector set.
    pub fn match_sets(&self, sets: &BTreeMap<String, CompiledSelectors>) -> MatchReport {
        let mut report = MatchReport {
            counts: sets.keys().map(|k| (k.clone(), 0)).collect(),
            ..Default::default()
        };
        for device in self.counted() {
            let mut names: Vec<&String> = Vec::new();
            for (name, set) in sets {
                match set.matches(&device.env) {
                    Ok(true) => {
                        names.push(name);
                        if let Some(c) = report.counts.get_mut(name) {
                            *c += 1;
                        }
                    }
                    Ok(false) => {}
                    Err(e) => {
                        let errs = report.errors.entry(name.clone()).or_default();
                        errs.devices += 1;
                        if errs.first.len() < ERRORS_KEPT {
                            errs.first.push((device.id.clone(), e));
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
                    .push((device.id.clone(), names.into_iter().cloned().collect()));
            }
        }
        report
    }

    /// Whether `selectors` matches any device of the inventory, counted or not (a class describes
    /// hardware; a tainted device or a pool being republished does not change that). Devices on
    /// which evaluation fails do not match.
    pub fn any_device_matches(&self, selectors: &CompiledSelectors) -> bool {
        self.devices
            .iter()
            .any(|d| selectors.matches(&d.env) == Ok(true))
    }

    /// [`Self::any_device_matches`] for a DeviceClass, e.g. to decide whether a foreign class
    /// hands out devices a policy governs.
    pub fn any_device_matches_class(&self, class: &DeviceClass) -> Result<bool, SelectorError> {
        Ok(self.any_device_matches(&class_selectors(class)?))
    }
}

/// The compiled selectors of a DeviceClass. A selector without `cel` is of a type this version
/// does not know; the allocator cannot evaluate it either, so it is reported as invalid.
pub fn class_selectors(class: &DeviceClass) -> Result<CompiledSelectors, SelectorError> {
    let mut exprs = Vec::new();
    for (index, s) in class.spec.selectors.iter().flatten().enumerate() {
        match &s.cel {
            Some(cel) => exprs.push(cel.expression.clone()),
            None => {
                return Err(SelectorError::Invalid {
                    index,
                    expression: String::new(),
                    message: "unsupported selector type (no cel)".to_owned(),
                });
            }
        }
    }
    CompiledSelectors::compile(&exprs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{DeviceSelector, DeviceType};
    use crate::plan::selector::device_class_selectors;
    use crate::plan::selector::tests::spec;
    use k8s_openapi::api::resource::v1::{Device, DeviceTaint};

    fn fixture(rel: &str) -> String {
        crate::plan::device_cel::tests::fixture(rel)
    }

    fn node_slice() -> ResourceSlice {
        serde_saphyr::from_str(&fixture(
            "nvidia-dra-driver-gpu/resourceslice/resourceslice-8gpu-node.assembled.yaml",
        ))
        .expect("slice")
    }

    fn classes() -> Vec<DeviceClass> {
        fixture("nvidia-dra-driver-gpu/deviceclasses.rendered-v1.yaml")
            .split("\n---\n")
            .filter(|d| d.contains("kind: DeviceClass"))
            .map(|d| serde_saphyr::from_str(d).expect("class"))
            .collect()
    }

    fn sets(policies: &[(&str, DeviceSelector)]) -> BTreeMap<String, CompiledSelectors> {
        policies
            .iter()
            .map(|(n, s)| {
                (
                    n.to_string(),
                    CompiledSelectors::compile(&device_class_selectors(&spec(s.clone())))
                        .expect("compiles"),
                )
            })
            .collect()
    }

    /// A second node: the MIG and VFIO doc entries in their own slices/pools.
    fn entry_slice(rel: &str, pool: &str) -> ResourceSlice {
        let mut s = node_slice();
        s.metadata.name = Some(format!("slice-{pool}"));
        s.spec.pool.name = pool.to_owned();
        s.spec.node_name = Some(pool.to_owned());
        s.spec.devices =
            Some(serde_saphyr::from_str::<Vec<Device>>(&fixture(rel)).expect("devices"));
        s
    }

    #[test]
    fn counts_per_policy_on_real_slices() {
        let slices = vec![
            node_slice(),
            entry_slice(
                "nvidia-dra-driver-gpu/resourceslice/device-entry-mig.from-docs.yaml",
                "mig-node",
            ),
            entry_slice(
                "nvidia-dra-driver-gpu/resourceslice/device-entry-vfio.from-docs.yaml",
                "vfio-node",
            ),
        ];
        let inv = Inventory::from_slices(&slices);
        assert_eq!(inv.counted().count(), 10);
        assert!(inv.pools.values().all(PoolStatus::usable));
        let report = inv.match_sets(&sets(&[
            (
                "a100",
                DeviceSelector {
                    product_names: vec!["NVIDIA A100-PCIE-40GB".into()],
                    ..Default::default()
                },
            ),
            (
                "a100-80g",
                DeviceSelector {
                    min_memory: Some("80Gi".into()),
                    ..Default::default()
                },
            ),
            ("any-gpu", DeviceSelector::default()),
            (
                "mig-1g",
                DeviceSelector {
                    device_type: DeviceType::Mig,
                    mig_profiles: vec!["1g.5gb".into()],
                    ..Default::default()
                },
            ),
            (
                "vfio",
                DeviceSelector {
                    device_type: DeviceType::Vfio,
                    ..Default::default()
                },
            ),
        ]));
        let counts: Vec<(&str, u32)> = report
            .counts
            .iter()
            .map(|(k, v)| (k.as_str(), *v))
            .collect();
        assert_eq!(
            counts,
            [
                ("a100", 8),
                ("a100-80g", 0),
                ("any-gpu", 8),
                ("mig-1g", 1),
                ("vfio", 1)
            ]
        );
        assert_eq!(report.overlaps.len(), 8);
        assert_eq!(report.overlaps[0].1, ["a100", "any-gpu"]);
        assert_eq!(
            report.overlap_pairs,
            BTreeMap::from([(("a100".into(), "any-gpu".into()), 8)])
        );
        assert!(report.errors.is_empty());
    }

    #[test]
    fn evaluation_errors_are_reported_per_name() {
        let inv = Inventory::from_slices(&[node_slice()]);
        let mut s = sets(&[("ok", DeviceSelector::default())]);
        // quickstart gpu-test6: `index` is no longer published, so this errors on every GPU.
        s.insert(
            "index".into(),
            CompiledSelectors::compile(&[
                "device.attributes['gpu.nvidia.com'].index == 0".to_owned()
            ])
            .expect("compiles"),
        );
        let r = inv.match_sets(&s);
        assert_eq!(r.counts["ok"], 8);
        assert_eq!(r.counts["index"], 0);
        assert_eq!(r.errors["index"].devices, 8);
        assert_eq!(r.errors["index"].first.len(), 5);
        assert_eq!(
            r.errors["index"].first[0].0.to_string(),
            "gpu.nvidia.com/worker-gpu-01/gpu-0"
        );
    }

    #[test]
    fn generations_incomplete_and_invalid_pools() {
        let mut old = node_slice();
        old.metadata.name = Some("old".into());
        old.spec.pool.generation = 0;
        old.spec
            .devices
            .iter_mut()
            .flatten()
            .for_each(|d| d.name = format!("old-{}", d.name));
        let inv = Inventory::from_slices(&[old.clone(), node_slice()]);
        assert_eq!(inv.devices.len(), 8);
        assert!(inv.devices.iter().all(|d| !d.id.device.starts_with("old-")));

        // Pool says 2 slices, only 1 present: incomplete, devices not counted.
        let mut half = node_slice();
        half.spec.pool.resource_slice_count = 2;
        let inv = Inventory::from_slices(&[half.clone()]);
        assert_eq!(inv.incomplete_pools().count(), 1);
        assert_eq!(inv.counted().count(), 0);
        assert_eq!(inv.devices.len(), 8);
        // ... until the second slice arrives.
        let mut second = entry_slice(
            "nvidia-dra-driver-gpu/resourceslice/device-entry-mig.from-docs.yaml",
            "worker-gpu-01",
        );
        second.spec.pool.resource_slice_count = 2;
        let inv = Inventory::from_slices(&[half.clone(), second]);
        assert_eq!(inv.counted().count(), 9);

        // Duplicate device name in a pool: invalid, not counted.
        let mut dup = half;
        dup.metadata.name = Some("dup".into());
        let inv = Inventory::from_slices(&[node_slice(), {
            let mut d = dup;
            d.spec.pool.resource_slice_count = 2;
            d
        }]);
        let pool = inv.pools.values().next().expect("pool");
        assert!(
            pool.invalid
                .as_deref()
                .is_some_and(|r| r.starts_with("duplicate device name"))
        );
        assert_eq!(inv.counted().count(), 0);
    }

    #[test]
    fn tainted_devices_do_not_count() {
        let mut s = node_slice();
        let effects = ["NoSchedule", "NoExecute", "None", "SomethingNew"];
        for (d, effect) in s.spec.devices.iter_mut().flatten().zip(effects) {
            d.taints = Some(vec![DeviceTaint {
                key: "k".into(),
                effect: effect.into(),
                value: None,
                time_added: None,
            }]);
        }
        let inv = Inventory::from_slices(&[s]);
        assert_eq!(inv.counted().count(), 6);
        let r = inv.match_sets(&sets(&[("gpu", DeviceSelector::default())]));
        assert_eq!(r.counts["gpu"], 6);
        // Still hardware the gpu class describes.
        let gpu_class = classes()
            .into_iter()
            .find(|c| c.metadata.name.as_deref() == Some("gpu.nvidia.com"))
            .expect("class");
        assert_eq!(inv.any_device_matches_class(&gpu_class), Ok(true));
    }

    #[test]
    fn which_nvidia_classes_are_governed() {
        let inv = Inventory::from_slices(&[
            node_slice(),
            entry_slice(
                "nvidia-dra-driver-gpu/resourceslice/device-entry-mig.from-docs.yaml",
                "mig-node",
            ),
        ]);
        let governed: Vec<(String, bool)> = classes()
            .iter()
            .map(|c| {
                (
                    c.metadata.name.clone().unwrap_or_default(),
                    inv.any_device_matches_class(c).expect("valid class"),
                )
            })
            .collect();
        let expect = [
            ("gpu.nvidia.com", true),
            ("mig.nvidia.com", true),
            ("vfio.gpu.nvidia.com", false),
            ("compute-domain-daemon.nvidia.com", false),
            ("compute-domain-default-channel.nvidia.com", false),
        ];
        assert_eq!(governed, expect.map(|(n, b)| (n.to_owned(), b)));
    }
}
