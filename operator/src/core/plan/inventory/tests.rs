use super::*;
use crate::api::{DeviceSelector, DeviceType};
use crate::core::plan::cel::class_expressions;
use crate::core::plan::cel::tests::spec;
use k8s_openapi::api::resource::v1::{Device, DeviceTaint};

fn fixture(rel: &str) -> String {
    crate::dra_cel::tests::fixture(rel)
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

fn sets(policies: &[(&str, DeviceSelector)]) -> BTreeMap<String, CompiledExpressions> {
    policies
        .iter()
        .map(|(n, s)| {
            (
                n.to_string(),
                CompiledExpressions::compile(&class_expressions(&spec(s.clone())))
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
    s.spec.devices = Some(serde_saphyr::from_str::<Vec<Device>>(&fixture(rel)).expect("devices"));
    s
}

#[test]
fn a_projected_slice_keeps_what_expressions_read_and_shares_one_env_per_model() {
    let slice = node_slice();
    let product = CompiledExpressions::compile(&[
        "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA A100-PCIE-40GB'".into(),
    ])
    .unwrap();
    let mut envs = SliceValues::default();
    let view = SliceView::project(&slice, &product.reads(), &mut envs);
    assert_eq!(view.device_count(), 8);
    // The 8 GPUs differ only in attributes no expression reads (uuid, index, ...).
    assert_eq!(envs.envs.len(), 1);
    let env = &view.devices[0].env;
    assert!(env.attribute("gpu.nvidia.com", "productName").is_some());
    assert!(env.attribute("gpu.nvidia.com", "uuid").is_none());
    assert!(env.capacity("gpu.nvidia.com", "memory").is_none());

    let mut whole = SliceValues::default();
    let full = SliceView::project(&slice, &DeviceReads::everything(), &mut whole);
    assert_eq!(whole.envs.len(), 8);
    assert!(
        full.devices[0]
            .env
            .attribute("gpu.nvidia.com", "uuid")
            .is_some()
    );
    // Counted alike either way.
    let sets = BTreeMap::from([("a100".to_owned(), product)]);
    let mut projected = Inventory::default();
    projected.update(Delta::All(&[view.into()]));
    let mut unprojected = Inventory::default();
    unprojected.update(Delta::All(&[full.into()]));
    assert_eq!(projected.match_sets(&sets), unprojected.match_sets(&sets));
    assert_eq!(projected.match_sets(&sets).counts["a100"], 8);
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
    assert!(inv.pools().values().all(|p| p.status.usable()));
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
        CompiledExpressions::compile(
            &["device.attributes['gpu.nvidia.com'].index == 0".to_owned()],
        )
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
    assert_eq!(inv.devices().count(), 8);
    assert!(inv.devices().all(|d| !d.name().starts_with("old-")));

    // Pool says 2 slices, only 1 present: incomplete, devices not counted.
    let mut half = node_slice();
    half.spec.pool.resource_slice_count = 2;
    let inv = Inventory::from_slices(&[half.clone()]);
    assert_eq!(inv.incomplete_pools().count(), 1);
    assert_eq!(inv.counted().count(), 0);
    assert_eq!(inv.devices().count(), 8);
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
    let pool = &inv.pools().values().next().expect("pool").status;
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
    let keys = BTreeSet::from(["k".to_owned()]);
    assert_eq!(r.tainted["gpu"], Tainted { devices: 2, keys });
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

#[test]
fn each_device_keeps_its_own_taint_and_draws_whatever_the_slice_before_held_at_its_place() {
    use k8s_openapi::api::resource::v1::{Counter, CounterSet, DeviceCounterConsumption};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    let counters = |memory: &str| {
        BTreeMap::from([(
            "memory".to_owned(),
            Counter {
                value: Quantity(memory.to_owned()),
            },
        )])
    };
    // Device 0 draws `memory` of its GPU's set; `tainted` adds a NoExecute taint to it.
    let slice = |memory: &str, tainted: bool| {
        let mut s = node_slice();
        s.spec.shared_counters = Some(vec![CounterSet {
            name: "gpu-0".into(),
            counters: counters("80Gi"),
        }]);
        let device = &mut s.spec.devices.as_mut().expect("devices")[0];
        device.consumes_counters = Some(vec![DeviceCounterConsumption {
            counter_set: "gpu-0".into(),
            counters: counters(memory),
        }]);
        device.taints = tainted.then(|| {
            vec![DeviceTaint {
                key: "gpu.nvidia.com/xid".into(),
                effect: "NoExecute".into(),
                ..Default::default()
            }]
        });
        s
    };
    let mut values = SliceValues::default();
    let reads = DeviceReads::everything();
    let first = SliceView::project(&slice("80Gi", true), &reads, &mut values);
    let second = SliceView::project(&slice("10Gi", false), &reads, &mut values);
    let third = SliceView::project(&slice("80Gi", true), &reads, &mut values);
    let drawn = |view: &SliceView| view.devices[0].draws()[0].counters[0].1;
    let gi_nanos = (1i128 << 30) * 1_000_000_000;
    assert_eq!(drawn(&first), 80 * gi_nanos);
    assert_eq!(drawn(&second), 10 * gi_nanos);
    assert!(first.devices[0].taint().is_some());
    assert!(second.devices[0].taint().is_none());
    // Equal devices share what they hold; the other devices draw nothing.
    assert!(std::ptr::eq(
        first.devices[0].draws(),
        third.devices[0].draws()
    ));
    assert!(third.devices[1..].iter().all(|d| d.draws().is_empty()));
}
