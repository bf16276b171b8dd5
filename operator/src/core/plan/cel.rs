//! The CEL that the plan writes: a GpuSharingPolicy's hardware selector (`spec.selector`) as the
//! expressions of its DeviceClass ([`class_expressions`], each one a `DeviceClass.spec.selectors`
//! entry), and CEL string literals ([`string_literal`], also for the admission policies).
//! `crate::dra_cel` evaluates such expressions.
//!
//! One expression per criterion; Kubernetes ANDs a DeviceClass's selectors and evaluates them in
//! order, stopping at the first false one (`selectorsMatch` in
//! `staging/src/k8s.io/dynamic-resource-allocation/structured/internal/*/allocator_*.go`). The
//! driver check comes first, so later expressions only ever see devices of that driver.
//!
//! Attribute lookups follow the DRA CEL environment
//! (`staging/src/k8s.io/dynamic-resource-allocation/cel/compile.go`): an attribute `name` of
//! driver `d` is `device.attributes['d'].name`, a qualified `dom/name` is
//! `device.attributes['dom'].name`; capacities likewise under `device.capacity`. An unknown
//! domain is an empty map, but a missing attribute is an evaluation error, which makes
//! Kubernetes abort the allocation of the whole claim. So every lookup is guarded (`has(...)`, or
//! `'name' in ...` for arbitrary attribute names), except the `type` check of the NVIDIA driver,
//! which is written exactly like the driver's own DeviceClasses
//! (`device.attributes['gpu.nvidia.com'].type == 'gpu'`): the driver publishes `type` on every
//! device (gpu, mig and vfio entries of `resourceslice-attributes.md`).

use crate::api::{AttributeMatch, DEFAULT_DRIVER, DeviceType, GpuSharingPolicySpec};

/// A CEL string literal denoting exactly `s`.
///
/// Single-quoted; `\` and `'` are escaped, and every character outside printable ASCII is
/// written as a `\u`/`\U` escape, so no input can end the literal or add code. `"` is left as is
/// (valid inside single quotes everywhere; cel-rust 0.13 would keep the backslash of `\"`).
pub fn string_literal(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('\'');
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\'' => out.push_str("\\'"),
            ' '..='~' => out.push(c),
            c if (c as u32) <= 0xFFFF => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push_str(&format!("\\U{:08x}", c as u32)),
        }
    }
    out.push('\'');
    out
}

/// The DeviceClass expressions of a policy's hardware selector, in evaluation order.
pub fn class_expressions(spec: &GpuSharingPolicySpec) -> Vec<String> {
    let driver = spec.driver.as_str();
    let hardware = &spec.selector;
    let dom = string_literal(driver);
    let attr = |name: &str| format!("device.attributes[{dom}].{name}");
    let guarded = |name: &str, test: String| format!("has({}) && {test}", attr(name));
    let mut out = vec![format!("device.driver == {dom}")];

    let type_test = format!(
        "{} == {}",
        attr("type"),
        string_literal(hardware.device_type.as_str())
    );
    out.push(if driver == DEFAULT_DRIVER {
        type_test
    } else {
        guarded("type", type_test)
    });

    if let Some(slice) = spec.sharing.slice_size() {
        // Only devices that many claims may share, with room for one slice at least (the
        // `memory` the slice is cut from; `allowMultipleAllocations` is in the CEL environment
        // where DRAConsumableCapacity is on, beta and on by default since 1.36).
        out.push("device.allowMultipleAllocations == true".to_owned());
        let cap = format!("device.capacity[{dom}].memory");
        out.push(format!(
            "has({cap}) && {cap}.compareTo(quantity({})) >= 0",
            string_literal(slice)
        ));
    }
    if !hardware.product_names.is_empty() {
        out.push(guarded(
            "productName",
            any_of(&attr("productName"), &hardware.product_names),
        ));
    }
    if !hardware.architectures.is_empty() {
        out.push(guarded(
            "architecture",
            any_of(&attr("architecture"), &hardware.architectures),
        ));
    }
    if let Some(min) = &hardware.min_memory {
        // VFIO devices publish their memory as `addressableMemory`
        // (device-entry-vfio.from-docs.yaml); gpu and mig devices as `memory`.
        let name = if hardware.device_type == DeviceType::Vfio {
            "addressableMemory"
        } else {
            "memory"
        };
        let cap = format!("device.capacity[{dom}].{name}");
        out.push(format!(
            "has({cap}) && {cap}.compareTo(quantity({})) >= 0",
            string_literal(min)
        ));
    }
    if !hardware.mig_profiles.is_empty() {
        out.push(guarded(
            "profile",
            any_of(&attr("profile"), &hardware.mig_profiles),
        ));
    }
    if let Some(min) = &hardware.min_compute_capability {
        // A `version` attribute (`cudaComputeCapability: {version: 8.0.0}`), compared as semver.
        let v = string_literal(&normalize_version(min));
        out.push(guarded(
            "cudaComputeCapability",
            format!(
                "{}.compareTo(semver({v})) >= 0",
                attr("cudaComputeCapability")
            ),
        ));
    }
    for m in &hardware.attributes {
        if let Some(e) = attribute_match(driver, m) {
            out.push(e);
        }
    }
    out.extend(hardware.cel.iter().cloned());
    out
}

fn any_of(lhs: &str, values: &[String]) -> String {
    match values {
        [one] => format!("{lhs} == {}", string_literal(one)),
        many => {
            let list: Vec<String> = many.iter().map(|v| string_literal(v)).collect();
            format!("{lhs} in [{}]", list.join(", "))
        }
    }
}

/// `8.0` -> `8.0.0`, `08.1` -> `8.1.0`: the strict semver `semver()` needs. Anything else is
/// passed on unchanged (and then fails evaluation, which status reports).
fn normalize_version(v: &str) -> String {
    let parts: Vec<&str> = v.split('.').collect();
    let nums: Option<Vec<u64>> = parts
        .iter()
        .map(|p| p.parse::<u64>().ok().filter(|_| !p.is_empty()))
        .collect();
    match nums.as_deref() {
        Some([a, b]) => format!("{a}.{b}.0"),
        Some([a, b, c]) => format!("{a}.{b}.{c}"),
        Some([a]) => format!("{a}.0.0"),
        _ => v.to_owned(),
    }
}

/// `name == value` for one extra attribute; `None` when no value is set (the CRD requires one).
fn attribute_match(driver: &str, m: &AttributeMatch) -> Option<String> {
    let (domain, id) = crate::dra_cel::parse_qualified_name(&m.name, driver);
    let map = format!("device.attributes[{}]", string_literal(domain));
    let value = format!("{map}[{}]", string_literal(id));
    let test = if let Some(s) = &m.string {
        format!("{value} == {}", string_literal(s))
    } else if let Some(i) = m.int {
        format!("{value} == {}", int_literal(i))
    } else if let Some(b) = m.bool {
        format!("{value} == {b}")
    } else if let Some(v) = &m.version {
        format!(
            "{value}.compareTo(semver({})) == 0",
            string_literal(&normalize_version(v))
        )
    } else {
        return None;
    };
    Some(format!("{} in {map} && {test}", string_literal(id)))
}

fn int_literal(i: i64) -> String {
    if i == i64::MIN {
        format!("({} - 1)", i + 1)
    } else {
        i.to_string()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::api::{ClaimTemplates, DeviceSelector, Sharing};
    use crate::dra_cel::{CompiledExpressions, DeviceEnv, check_expression};
    use k8s_openapi::api::resource::v1::{Device, DeviceAttribute, DeviceClass, ResourceSlice};
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    fn fixture(rel: &str) -> String {
        crate::dra_cel::tests::fixture(rel)
    }

    pub(crate) fn spec(hardware: DeviceSelector) -> GpuSharingPolicySpec {
        GpuSharingPolicySpec {
            driver: DEFAULT_DRIVER.to_owned(),
            selector: hardware,
            sharing: Sharing::default(),
            claim_templates: ClaimTemplates::default(),
            gpu_equivalent: None,
        }
    }

    /// A realistic policy: A100s with >= 40Gi, Ampere, compute capability >= 8.0.
    pub(crate) fn sample_class_expressions() -> Vec<String> {
        class_expressions(&spec(DeviceSelector {
            product_names: vec![
                "NVIDIA A100-PCIE-40GB".into(),
                "NVIDIA A100-SXM4-80GB".into(),
            ],
            architectures: vec!["Ampere".into()],
            min_memory: Some("40Gi".into()),
            min_compute_capability: Some("8.0".into()),
            attributes: vec![AttributeMatch {
                name: "brand".into(),
                string: Some("Nvidia".into()),
                int: None,
                bool: None,
                version: None,
            }],
            ..Default::default()
        }))
    }

    fn node_devices() -> Vec<DeviceEnv> {
        let slice: ResourceSlice = serde_saphyr::from_str(&fixture(
            "nvidia-dra-driver-gpu/resourceslice/resourceslice-8gpu-node.assembled.yaml",
        ))
        .expect("slice");
        slice
            .spec
            .devices
            .iter()
            .flatten()
            .map(|d| DeviceEnv::new(&slice.spec.driver, d))
            .collect()
    }

    fn entry(rel: &str) -> DeviceEnv {
        let d: Vec<Device> = serde_saphyr::from_str(&fixture(rel)).expect("devices");
        DeviceEnv::new(DEFAULT_DRIVER, &d[0])
    }

    fn count(exprs: &[String], devices: &[DeviceEnv]) -> usize {
        let s = CompiledExpressions::compile(exprs).expect("compiles");
        devices
            .iter()
            .filter(|d| s.matches(d).expect("no evaluation error"))
            .count()
    }

    #[test]
    fn default_policy_is_the_nvidia_gpu_class() {
        let exprs = class_expressions(&spec(DeviceSelector::default()));
        assert_eq!(
            exprs,
            [
                "device.driver == 'gpu.nvidia.com'",
                "device.attributes['gpu.nvidia.com'].type == 'gpu'"
            ]
        );
        // Same devices as the driver's own class (deviceclasses.rendered-v1.yaml).
        let classes: Vec<DeviceClass> =
            fixture("nvidia-dra-driver-gpu/deviceclasses.rendered-v1.yaml")
                .split("\n---\n")
                .filter(|d| d.contains("kind: DeviceClass"))
                .map(|d| serde_saphyr::from_str(d).expect("class"))
                .collect();
        let gpu_class = classes
            .iter()
            .find(|c| c.metadata.name.as_deref() == Some("gpu.nvidia.com"))
            .expect("gpu class");
        let theirs: Vec<String> = gpu_class
            .spec
            .selectors
            .iter()
            .flatten()
            .filter_map(|s| s.cel.as_ref().map(|c| c.expression.clone()))
            .collect();
        let mut all = node_devices();
        all.push(entry(
            "nvidia-dra-driver-gpu/resourceslice/device-entry-mig.from-docs.yaml",
        ));
        all.push(entry(
            "nvidia-dra-driver-gpu/resourceslice/device-entry-vfio.from-docs.yaml",
        ));
        assert_eq!(count(&exprs, &all), 8);
        assert_eq!(count(&theirs, &all), 8);
    }

    #[test]
    fn the_8gpu_node_has_eight_a100_40gb_and_no_80gb() {
        let devices = node_devices();
        assert_eq!(count(&sample_class_expressions(), &devices), 8);
        let matching = |s: DeviceSelector| count(&class_expressions(&spec(s)), &devices);
        assert_eq!(
            matching(DeviceSelector {
                min_memory: Some("80Gi".into()),
                ..Default::default()
            }),
            0
        );
        assert_eq!(
            matching(DeviceSelector {
                product_names: vec!["NVIDIA A100-SXM4-80GB".into()],
                ..Default::default()
            }),
            0
        );
        assert_eq!(
            matching(DeviceSelector {
                architectures: vec!["Hopper".into(), "Ampere".into()],
                ..Default::default()
            }),
            8
        );
        assert_eq!(
            matching(DeviceSelector {
                min_compute_capability: Some("9.0".into()),
                ..Default::default()
            }),
            0
        );
        assert_eq!(
            matching(DeviceSelector {
                min_compute_capability: Some("8.0".into()),
                ..Default::default()
            }),
            8
        );
        assert_eq!(
            matching(DeviceSelector {
                device_type: DeviceType::Mig,
                ..Default::default()
            }),
            0
        );
        let pci = |v: &str| AttributeMatch {
            name: "resource.kubernetes.io/pciBusID".into(),
            string: Some(v.into()),
            int: None,
            bool: None,
            version: None,
        };
        assert_eq!(
            matching(DeviceSelector {
                attributes: vec![pci("0000:65:00.0")],
                ..Default::default()
            }),
            1
        );
        assert_eq!(
            matching(DeviceSelector {
                cel: vec!["device.attributes['gpu.nvidia.com'].uuid.endsWith('7')".into()],
                ..Default::default()
            }),
            1
        );
    }

    #[test]
    fn mig_entries() {
        let mig = [entry(
            "nvidia-dra-driver-gpu/resourceslice/device-entry-mig.from-docs.yaml",
        )];
        let c = |s: DeviceSelector, d: &[DeviceEnv]| count(&class_expressions(&spec(s)), d);
        let m = |p: &[&str]| DeviceSelector {
            device_type: DeviceType::Mig,
            mig_profiles: p.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        };
        assert_eq!(c(m(&["1g.5gb"]), &mig), 1);
        assert_eq!(c(m(&["2g.10gb", "1g.5gb"]), &mig), 1);
        assert_eq!(c(m(&["3g.20gb"]), &mig), 0);
        // The slice has 4864Mi: below the "5gb" of its name.
        assert_eq!(
            c(
                DeviceSelector {
                    min_memory: Some("5Gi".into()),
                    ..m(&[])
                },
                &mig
            ),
            0
        );
        assert_eq!(
            c(
                DeviceSelector {
                    min_memory: Some("4Gi".into()),
                    ..m(&[])
                },
                &mig
            ),
            1
        );
    }

    #[test]
    fn vfio_entries() {
        let mig = [entry(
            "nvidia-dra-driver-gpu/resourceslice/device-entry-mig.from-docs.yaml",
        )];
        let vfio = [entry(
            "nvidia-dra-driver-gpu/resourceslice/device-entry-vfio.from-docs.yaml",
        )];
        let c = |s: DeviceSelector, d: &[DeviceEnv]| count(&class_expressions(&spec(s)), d);
        let v = DeviceSelector {
            device_type: DeviceType::Vfio,
            ..Default::default()
        };
        assert_eq!(c(v.clone(), &vfio), 1);
        assert_eq!(c(v.clone(), &mig), 0);
        // No architecture / compute capability on vfio entries: guarded, so false, not an error.
        assert_eq!(
            c(
                DeviceSelector {
                    architectures: vec!["Ampere".into()],
                    ..v.clone()
                },
                &vfio
            ),
            0
        );
        assert_eq!(
            c(
                DeviceSelector {
                    min_compute_capability: Some("7.0".into()),
                    ..v.clone()
                },
                &vfio
            ),
            0
        );
        assert_eq!(
            c(
                DeviceSelector {
                    min_memory: Some("40Gi".into()),
                    ..v.clone()
                },
                &vfio
            ),
            1
        );
        let numa = |i: i64| AttributeMatch {
            name: "numa".into(),
            int: Some(i),
            string: None,
            bool: None,
            version: None,
        };
        let iommu = AttributeMatch {
            name: "iommuFDEnabled".into(),
            bool: Some(true),
            string: None,
            int: None,
            version: None,
        };
        assert_eq!(
            c(
                DeviceSelector {
                    attributes: vec![numa(0), iommu],
                    ..v.clone()
                },
                &vfio
            ),
            1
        );
        assert_eq!(
            c(
                DeviceSelector {
                    attributes: vec![numa(1)],
                    ..v.clone()
                },
                &vfio
            ),
            0
        );
        assert_eq!(
            c(
                DeviceSelector {
                    attributes: vec![numa(i64::MIN)],
                    ..v
                },
                &vfio
            ),
            0
        );
    }

    #[test]
    fn version_and_missing_attribute_matches() {
        let gpu = [entry(
            "nvidia-dra-driver-gpu/resourceslice/device-entry-gpu.from-docs.yaml",
        )];
        let ver = |name: &str, v: &str| AttributeMatch {
            name: name.into(),
            version: Some(v.into()),
            string: None,
            int: None,
            bool: None,
        };
        let c = |a: Vec<AttributeMatch>| {
            count(
                &class_expressions(&spec(DeviceSelector {
                    attributes: a,
                    ..Default::default()
                })),
                &gpu,
            )
        };
        assert_eq!(c(vec![ver("driverVersion", "580.126.20")]), 1);
        assert_eq!(c(vec![ver("gpu.nvidia.com/cudaDriverVersion", "13.0")]), 1);
        assert_eq!(c(vec![ver("driverVersion", "580.126.21")]), 0);
        // Attributes the device lacks: false, never an error.
        assert_eq!(c(vec![ver("index", "1.0.0")]), 0);
        assert_eq!(
            c(vec![AttributeMatch {
                name: "other.example.com/x".into(),
                bool: Some(true),
                string: None,
                int: None,
                version: None
            }]),
            0
        );
    }

    #[test]
    fn every_generated_expression_compiles() {
        for e in sample_class_expressions() {
            assert_eq!(check_expression(&e), Ok(()), "{e}");
        }
    }

    #[test]
    fn custom_driver_guards_type() {
        let mut s = spec(DeviceSelector::default());
        s.driver = "dra.example.com".into();
        let exprs = class_expressions(&s);
        assert_eq!(
            exprs[1],
            "has(device.attributes['dra.example.com'].type) && device.attributes['dra.example.com'].type == 'gpu'"
        );
        let d = Device {
            name: "d".into(),
            attributes: Some(BTreeMap::new()),
            ..Default::default()
        };
        let env = DeviceEnv::new("dra.example.com", &d);
        assert_eq!(
            CompiledExpressions::compile(&exprs)
                .expect("compiles")
                .matches(&env),
            Ok(false)
        );
    }

    fn string_device(s: &str) -> DeviceEnv {
        let attrs = BTreeMap::from([(
            "productName".to_owned(),
            DeviceAttribute {
                string: Some(s.to_owned()),
                ..Default::default()
            },
        )]);
        DeviceEnv::new(
            DEFAULT_DRIVER,
            &Device {
                name: "d".into(),
                attributes: Some(attrs),
                ..Default::default()
            },
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]
        #[test]
        fn string_literals_round_trip(s in any::<String>(), other in any::<String>(), specials in "['\"\\\\\n\r\t\u{0}\u{7f}\u{2028}é😀]{0,8}") {
            for s in [s.clone(), specials.clone(), format!("{specials}{s}")] {
                let expr = format!("device.attributes['gpu.nvidia.com'].productName == {}", string_literal(&s));
                let compiled = CompiledExpressions::compile(&[expr]).expect("a literal always compiles");
                prop_assert_eq!(compiled.matches(&string_device(&s)), Ok(true));
                if other != s {
                    prop_assert_eq!(compiled.matches(&string_device(&other)), Ok(false));
                }
                let longer = format!("{s}x");
                prop_assert_eq!(compiled.matches(&string_device(&longer)), Ok(false));
            }
        }
    }
}
