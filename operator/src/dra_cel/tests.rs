//! The module's tests, on the NVIDIA driver's own device entries and slices.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use k8s_openapi::api::resource::v1::{Device, DeviceAttribute, ResourceSlice};

use super::device::AttrValue;
use super::{
    CompiledExpressions, DeviceEnv, DeviceEnvs, DeviceReads, ExpressionError, check_expression,
};

/// A test fixture of `operator/testdata/` (each file names its upstream source). The 8-GPU
/// node slice and the NVIDIA DeviceClasses are the built-in example's own copies.
pub(crate) fn fixture(rel: &str) -> String {
    match rel {
        "nvidia-dra-driver-gpu/resourceslice/resourceslice-8gpu-node.assembled.yaml" => {
            crate::cli::example::NODE_SLICE_YAML.to_owned()
        }
        "nvidia-dra-driver-gpu/deviceclasses.rendered-v1.yaml" => {
            crate::cli::example::NVIDIA_CLASSES_YAML.to_owned()
        }
        _ => {
            let path = format!("{}/testdata/{rel}", env!("CARGO_MANIFEST_DIR"));
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {path}: {e}"))
        }
    }
}

fn devices(rel: &str) -> Vec<Device> {
    serde_saphyr::from_str(&fixture(rel)).expect("device list")
}

fn node_slice() -> ResourceSlice {
    serde_saphyr::from_str(&fixture(
        "nvidia-dra-driver-gpu/resourceslice/resourceslice-8gpu-node.assembled.yaml",
    ))
    .expect("slice")
}

fn env(rel: &str) -> DeviceEnv {
    DeviceEnv::new("gpu.nvidia.com", &devices(rel)[0])
}

fn compiled(exprs: &[&str]) -> CompiledExpressions {
    CompiledExpressions::compile(&exprs.iter().map(|s| s.to_string()).collect::<Vec<_>>())
        .expect("compiles")
}

const GPU: &str = "nvidia-dra-driver-gpu/resourceslice/device-entry-gpu.from-docs.yaml";
const MIG: &str = "nvidia-dra-driver-gpu/resourceslice/device-entry-mig.from-docs.yaml";
const VFIO: &str = "nvidia-dra-driver-gpu/resourceslice/device-entry-vfio.from-docs.yaml";

#[test]
fn reads_name_exactly_what_an_expression_reads_of_a_device() {
    let reads = |e: &str| compiled(&[e]).reads();
    let leaves = reads(
        "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].productName == 'A100' \
         && device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('40Gi')) >= 0",
    );
    assert!(!leaves.everything);
    assert_eq!(
        leaves.attributes,
        BTreeSet::from([("gpu.nvidia.com".to_owned(), "productName".to_owned())])
    );
    assert_eq!(
        leaves.capacities,
        BTreeSet::from([("gpu.nvidia.com".to_owned(), "memory".to_owned())])
    );
    let domain = reads("device.attributes['gpu.nvidia.com'].exists(k, k == 'mig')");
    assert_eq!(
        domain.attribute_domains,
        BTreeSet::from(["gpu.nvidia.com".to_owned()])
    );
    assert!(!domain.everything);
    assert!(reads("device.attributes.exists(d, d == 'x')").everything);
    assert!(reads("cel.bind(d, device, d.driver == 'x')").everything);

    assert!(domain.covers(&reads("device.attributes['gpu.nvidia.com'].uuid == 'x'")));
    assert!(!leaves.covers(&reads("device.attributes['gpu.nvidia.com'].uuid == 'x'")));
    assert!(!leaves.covers(&domain));
    assert!(DeviceReads::everything().covers(&domain));
    assert!(!domain.covers(&DeviceReads::everything()));
    let mut both = leaves.clone();
    both.extend(&domain);
    assert!(both.covers(&leaves) && both.covers(&domain));
    assert!(DeviceReads::default().covers(&reads("device.driver == 'x'")));
}

#[test]
fn nvidia_classes_select_their_device_kind() {
    let gpu = compiled(&[
        "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'",
    ]);
    let mig = compiled(&[
        "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig'",
    ]);
    let vfio = compiled(&[
        "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'vfio'",
    ]);
    let (g, m, v) = (env(GPU), env(MIG), env(VFIO));
    assert_eq!(gpu.matches(&g), Ok(true));
    assert_eq!(gpu.matches(&m), Ok(false));
    assert_eq!(gpu.matches(&v), Ok(false));
    assert_eq!(mig.matches(&m), Ok(true));
    assert_eq!(vfio.matches(&v), Ok(true));
    assert_eq!(vfio.matches(&g), Ok(false));
}

#[test]
fn typed_attributes_capacity_and_qualified_names() {
    let g = env(GPU);
    assert!(
        matches!(g.attribute("gpu.nvidia.com", "cudaComputeCapability"), Some(AttrValue::Version(v, _)) if &**v == "8.0.0")
    );
    assert_eq!(
        g.attribute("resource.kubernetes.io", "pciBusID")
            .map(AttrValue::display)
            .as_deref(),
        Some("0000:65:00.0")
    );
    assert_eq!(g.capacity("gpu.nvidia.com", "memory"), Some("40Gi"));
    let s = compiled(&[
        "device.attributes['gpu.nvidia.com'].cudaComputeCapability.compareTo(semver('8.0.0')) >= 0",
        "device.attributes['gpu.nvidia.com'].cudaComputeCapability.isLessThan(semver('9.0.0'))",
        "device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('40Gi')) >= 0",
        "device.capacity['gpu.nvidia.com'].memory.isLessThan(quantity('80Gi'))",
        "device.attributes['resource.kubernetes.io'].pcieRoot == 'pci0000:64'",
        "device.attributes['gpu.nvidia.com'].productName.lowerAscii().matches('^.*a100.*$')",
    ]);
    assert_eq!(s.matches(&g), Ok(true));
    let v = env(VFIO);
    let s = compiled(&[
        "device.attributes['gpu.nvidia.com'].numa == 0 && device.attributes['gpu.nvidia.com'].iommuFDEnabled",
    ]);
    assert_eq!(s.matches(&v), Ok(true));
}

#[test]
fn unknown_domain_is_empty_map_but_unknown_attribute_errors() {
    let g = env(GPU);
    // Upstream: unknown domain -> empty map, so has() is false and no error.
    assert_eq!(
        compiled(&["!has(device.attributes['other.example.com'].x)"]).matches(&g),
        Ok(true)
    );
    assert_eq!(
        compiled(&["size(device.attributes['other.example.com']) == 0"]).matches(&g),
        Ok(true)
    );
    // Missing attribute in a known domain errors (quickstart gpu-test6 `index`, see README).
    let err = compiled(&["device.attributes['gpu.nvidia.com'].index == 0"]).matches(&g);
    assert!(
        matches!(err, Err(ExpressionError::Evaluation { index: 0, .. })),
        "{err:?}"
    );
    // In order: a false expression stops before the failing one, like the allocator.
    assert_eq!(
        compiled(&[
            "device.attributes['gpu.nvidia.com'].type == 'mig'",
            "device.attributes['gpu.nvidia.com'].index == 0"
        ])
        .matches(&g),
        Ok(false)
    );
}

#[test]
fn full_device_expressions_work() {
    let g = env(GPU);
    let s = compiled(&[
        "device.attributes['gpu.nvidia.com'].exists(k, k == 'uuid')",
        "'brand' in device.attributes['gpu.nvidia.com']",
        "cel.bind(dra, device.attributes['gpu.nvidia.com'], dra.brand == 'Nvidia' && dra.type == 'gpu')",
        "device.allowMultipleAllocations == false",
    ]);
    assert!(s.footprint.full);
    assert_eq!(s.matches(&g), Ok(true));
}

#[test]
fn compile_errors_are_reported_with_index() {
    let bad = [
        "device.driver == 'x'".to_owned(),
        "device.attributes[".to_owned(),
    ];
    let e = CompiledExpressions::compile(&bad).unwrap_err();
    assert!(
        matches!(&e, ExpressionError::Invalid { index: 1, expression, .. } if expression == "device.attributes[")
    );
    assert!(e.to_string().contains("#1"));
    for not_bool in [
        "1 + 2",
        "'gpu'",
        "device.driver",
        "device.attributes['gpu.nvidia.com']",
        "size(device.attributes)",
    ] {
        assert!(check_expression(not_bool).is_err(), "{not_bool}");
    }
    assert!(check_expression("request.name == 'x'").is_err());
    assert!(check_expression(&"true && ".repeat(2000)).is_err());
    for ok in [
        "true",
        "device.driver == 'gpu.nvidia.com'",
        "[1, 2].exists(x, x == 2)",
        "cel.bind(d, device.attributes['a.b'], has(d.x))",
    ] {
        assert_eq!(check_expression(ok), Ok(()), "{ok}");
    }
}

#[test]
fn non_bool_result_is_an_evaluation_error() {
    let g = env(GPU);
    let s = compiled(&["device.attributes['gpu.nvidia.com'].brand"]);
    assert!(matches!(
        s.matches(&g),
        Err(ExpressionError::Evaluation { .. })
    ));
}

#[test]
fn invalid_version_fails_every_evaluation() {
    let mut d = devices(GPU).remove(0);
    if let Some(a) = d.attributes.as_mut() {
        a.insert(
            "driverVersion".into(),
            DeviceAttribute {
                version: Some("580.1".into()),
                ..Default::default()
            },
        );
    }
    let e = DeviceEnv::new("gpu.nvidia.com", &d);
    assert!(e.invalid().is_some());
    assert!(matches!(
        compiled(&["device.driver == 'gpu.nvidia.com'"]).matches(&e),
        Err(ExpressionError::Device { .. })
    ));
    assert_eq!(compiled(&[]).matches(&e), Ok(true));
}

#[test]
fn memo_distinguishes_devices() {
    let slice = node_slice();
    let envs: Vec<_> = slice
        .spec
        .devices
        .iter()
        .flatten()
        .map(|d| DeviceEnv::new(&slice.spec.driver, d))
        .collect();
    assert_eq!(envs.len(), 8);
    let s = compiled(&[
        "device.attributes['gpu.nvidia.com'].uuid == 'GPU-00000000-0000-0000-0000-000000000003'",
    ]);
    let hits = envs.iter().filter(|e| s.matches(e) == Ok(true)).count();
    assert_eq!(hits, 1);
    // Same again, now from the memo.
    assert_eq!(envs.iter().filter(|e| s.matches(e) == Ok(true)).count(), 1);
}

#[test]
fn equal_projections_are_shared_until_no_device_holds_them() {
    let slice = node_slice();
    let devices = slice.spec.devices.as_deref().unwrap_or_default();
    let reads = compiled(&["device.attributes['gpu.nvidia.com'].productName == 'x'"]).reads();
    let mut envs = DeviceEnvs::default();
    let projected: Vec<_> = devices
        .iter()
        .map(|d| envs.project(&slice.spec.driver, d, &reads))
        .collect();
    // The 8 GPUs of the node are one model: one input, held by all of them.
    assert_eq!(projected.len(), 8);
    assert_eq!(envs.len(), 1);
    assert!(projected.iter().all(|e| Arc::ptr_eq(e, &projected[0])));
    let whole = envs.project(&slice.spec.driver, &devices[0], &DeviceReads::everything());
    assert_eq!(envs.len(), 2);
    drop(whole);
    envs.prune();
    assert_eq!(envs.len(), 1);
    drop(projected);
    envs.prune();
    assert!(envs.is_empty());
}

#[test]
fn projection_agrees_with_full_device() {
    let exprs = [
        "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA A100-PCIE-40GB'",
        "has(device.attributes['gpu.nvidia.com'].profile)",
        "'profile' in device.attributes['gpu.nvidia.com']",
        "device.attributes['gpu.nvidia.com']['type'] in ['mig', 'vfio']",
        "has(device.attributes['x.example.com'].y) || device.driver == 'gpu.nvidia.com'",
        "device.capacity['gpu.nvidia.com'].memory.isGreaterThan(quantity('20Gi'))",
        "has(device.capacity['gpu.nvidia.com'].multiprocessors) && device.capacity['gpu.nvidia.com'].multiprocessors.asInteger() > 10",
        "device.attributes['resource.kubernetes.io'].pciBusID.startsWith('0000:65')",
        "device.attributes['gpu.nvidia.com'].?profile.orValue('none') == '1g.5gb'",
        "device.attributes['gpu.nvidia.com'].architecture == 'Ampere'",
        "device.attributes['gpu.nvidia.com'].numa == 0",
        "device.allowMultipleAllocations",
    ];
    let envs = [env(GPU), env(MIG), env(VFIO)];
    for e in exprs {
        let projected = compiled(&[e]);
        assert!(!projected.footprint.full, "{e} should be projectable");
        let mut full = compiled(&[e]);
        full.footprint.full = true;
        for d in &envs {
            let a = projected.matches(d);
            let b = full.matches(d);
            assert_eq!(a.is_ok(), b.is_ok(), "{e}: {a:?} vs {b:?}");
            if let (Ok(a), Ok(b)) = (a, b) {
                assert_eq!(a, b, "{e}");
            }
            // Second time from the memo.
            assert_eq!(projected.matches(d).ok(), full.matches(d).ok(), "{e}");
        }
    }
}

/// Per-match cost on a realistic policy. Run with
/// `cargo test --release -- --ignored --nocapture bench_match`.
#[test]
#[ignore]
fn bench_match() {
    let slice = node_slice();
    let base = slice.spec.devices.clone().unwrap_or_default();
    let mut envs = Vec::new();
    for i in 0..40_000 {
        let mut d = base[i % base.len()].clone();
        if let Some(a) = d.attributes.as_mut() {
            a.insert(
                "uuid".into(),
                DeviceAttribute {
                    string: Some(format!("GPU-{i}")),
                    ..Default::default()
                },
            );
        }
        envs.push(DeviceEnv::new("gpu.nvidia.com", &d));
    }
    let policy = crate::core::plan::cel::tests::sample_class_expressions();
    let sets: Vec<_> = (0..20)
        .map(|_| CompiledExpressions::compile(&policy).expect("compiles"))
        .collect();
    let start = std::time::Instant::now();
    let mut n = 0usize;
    for s in &sets {
        for e in &envs {
            n += usize::from(s.matches(e) == Ok(true));
        }
    }
    let el = start.elapsed();
    println!(
        "memoised, policy-outer: {} matches ({} true) in {:?} = {:.3} µs/match",
        20 * envs.len(),
        n,
        el,
        el.as_secs_f64() * 1e6 / (20.0 * envs.len() as f64)
    );
    let named: BTreeMap<String, CompiledExpressions> = (0..20)
        .map(|i| {
            (
                format!("p{i:02}"),
                CompiledExpressions::compile(&policy).expect("compiles"),
            )
        })
        .collect();
    let start = std::time::Instant::now();
    let mut n = 0usize;
    for e in &envs {
        for s in named.values() {
            n += usize::from(s.matches(e) == Ok(true));
        }
    }
    let el = start.elapsed();
    println!(
        "memoised, device-outer (as Inventory::match_sets): {n} true in {el:?} = {:.3} µs/match",
        el.as_secs_f64() * 1e6 / (20.0 * envs.len() as f64)
    );
    let full = compiled(&[
        "device.attributes['gpu.nvidia.com'].exists(k, k == 'productName') && device.attributes['gpu.nvidia.com'].type == 'gpu'",
    ]);
    let start = std::time::Instant::now();
    for e in envs.iter().take(2000) {
        let _ = full.matches(e);
    }
    let el = start.elapsed();
    println!(
        "full-device fallback: {:.3} µs/match",
        el.as_secs_f64() * 1e6 / 2000.0
    );
    let start = std::time::Instant::now();
    for e in envs.iter().take(2000) {
        let _ = sets[0].evaluate(e);
    }
    let el = start.elapsed();
    println!(
        "uncached projected evaluation: {:.3} µs/match",
        el.as_secs_f64() * 1e6 / 2000.0
    );
    let start = std::time::Instant::now();
    let built: Vec<_> = base
        .iter()
        .cycle()
        .take(40_000)
        .map(|d| DeviceEnv::new("gpu.nvidia.com", d))
        .collect();
    println!(
        "DeviceEnv::new: {:.3} µs/device ({})",
        start.elapsed().as_secs_f64() * 1e6 / 40_000.0,
        built.len()
    );
}

#[test]
fn attribute_names_are_one_shared_copy_for_devices_and_expressions() {
    let a = super::reads::shared_name("gpu.nvidia.com");
    let b = super::reads::shared_name(&String::from("gpu.nvidia.com"));
    assert!(Arc::ptr_eq(&a, &b));
    assert!(!Arc::ptr_eq(&a, &super::reads::shared_name("productName")));
}
