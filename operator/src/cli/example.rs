//! The built-in example `teamgpu plan` plans when given no files: the config/samples policies,
//! a few team namespaces, the NVIDIA driver's DeviceClasses, six 8-GPU nodes built from the
//! driver's ResourceSlice shape, and some claims in use.

use std::path::Path;
use std::sync::Arc;

use k8s_openapi::api::resource::v1::{
    AllocationResult, DeviceAllocationResult, DeviceClaim, DeviceRequest,
    DeviceRequestAllocationResult, ExactDeviceRequest, ResourceClaim, ResourceClaimSpec,
    ResourceClaimStatus, ResourceSlice,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::cli::input::{self, InputError, Loaded};
use crate::core::state::{ClusterState, NamespaceInfo};

const SAMPLES: [(&str, &str); 5] = [
    (
        "gpusharingpolicy-a100-80gb.yaml",
        include_str!("../../../config/samples/gpusharingpolicy-a100-80gb.yaml"),
    ),
    (
        "gpusharingpolicy-a100-shared.yaml",
        include_str!("../../../config/samples/gpusharingpolicy-a100-shared.yaml"),
    ),
    (
        "teamgpupolicy-ml-research.yaml",
        include_str!("../../../config/samples/teamgpupolicy-ml-research.yaml"),
    ),
    (
        "teamgpupolicy-inference.yaml",
        include_str!("../../../config/samples/teamgpupolicy-inference.yaml"),
    ),
    (
        "teamgpupolicy-data-science.yaml",
        include_str!("../../../config/samples/teamgpupolicy-data-science.yaml"),
    ),
];
/// The NVIDIA DRA driver's DeviceClasses (rendered from its Helm chart; provenance in the file).
pub const NVIDIA_CLASSES_YAML: &str = include_str!("example/nvidia-deviceclasses.yaml");
/// One 8-GPU node's ResourceSlice shaped like the NVIDIA DRA driver's (provenance in the file).
pub const NODE_SLICE_YAML: &str = include_str!("example/resourceslice-8gpu-node.yaml");

/// Nodes of the example: (name, product, memory). The fixture's node has A100 PCIe 40GB GPUs;
/// the SXM4 80GB nodes are the same shape with those two values changed.
const NODES: [(&str, &str, &str); 6] = [
    ("gpu-a-01", "NVIDIA A100-SXM4-80GB", "80Gi"),
    ("gpu-a-02", "NVIDIA A100-SXM4-80GB", "80Gi"),
    ("gpu-a-03", "NVIDIA A100-SXM4-80GB", "80Gi"),
    ("gpu-a-04", "NVIDIA A100-SXM4-80GB", "80Gi"),
    ("gpu-b-01", "NVIDIA A100-PCIE-40GB", "40Gi"),
    ("gpu-b-02", "NVIDIA A100-PCIE-40GB", "40Gi"),
];

/// (namespace, team label, explicit) of the example's namespaces.
const NAMESPACES: [(&str, Option<&str>); 6] = [
    ("ml-research-train", Some("ml-research")),
    ("ml-research-dev", Some("ml-research")),
    ("inference-prod", None),
    ("inference-canary", Some("inference")),
    ("data-science", Some("data-science")),
    ("web", None),
];

/// (namespace, DeviceClass, devices per claim, claims, allocated) of the example's workloads.
const CLAIMS: [(&str, &str, u32, u32, bool); 6] = [
    ("inference-prod", "a100-80gb.teamgpu.io", 1, 8, true),
    ("inference-canary", "a100-80gb.teamgpu.io", 1, 1, true),
    ("ml-research-train", "a100-80gb.teamgpu.io", 4, 3, true),
    ("ml-research-dev", "a100-shared.teamgpu.io", 1, 2, true),
    ("data-science", "a100-shared.teamgpu.io", 1, 3, true),
    ("data-science", "a100-80gb.teamgpu.io", 2, 1, false),
];

/// The example's cluster state.
pub fn state() -> Result<ClusterState, InputError> {
    let mut loaded = Loaded::default();
    for (name, text) in SAMPLES {
        input::add_documents(&mut loaded, Path::new(name), text)?;
    }
    input::add_documents(
        &mut loaded,
        Path::new("nvidia-deviceclasses.yaml"),
        NVIDIA_CLASSES_YAML,
    )?;
    let mut state = loaded.state;
    if let Some(slice) = &node_template()? {
        state.slices.extend(
            NODES
                .iter()
                .map(|(node, product, memory)| node_slice(slice, node, product, memory)),
        );
    }
    state.namespaces = NAMESPACES
        .iter()
        .map(|(name, team)| {
            Arc::new(NamespaceInfo {
                name: (*name).to_owned(),
                labels: team
                    .iter()
                    .map(|t| ("teamgpu.io/team".to_owned(), (*t).to_owned()))
                    .collect(),
            })
        })
        .collect();
    state.claims = claims(&state.slices);
    Ok(state)
}

/// The NVIDIA driver's 8-GPU node slice every example node is cloned from (and every node of
/// the benchmarks' synthetic clusters, `operator/synthetic`).
pub fn node_template() -> Result<Option<ResourceSlice>, InputError> {
    let mut template = Loaded::default();
    input::add_documents(
        &mut template,
        Path::new("resourceslice-8gpu-node.yaml"),
        NODE_SLICE_YAML,
    )?;
    Ok(template.state.slices.into_iter().next())
}

/// `template` as node `node`'s slice, its devices of `product` with `memory`.
pub fn node_slice(
    template: &ResourceSlice,
    node: &str,
    product: &str,
    memory: &str,
) -> ResourceSlice {
    let mut slice = template.clone();
    slice.metadata.name = Some(format!("gpu.nvidia.com-{node}"));
    slice.metadata.generate_name = None;
    slice.metadata.owner_references = None;
    slice.spec.node_name = Some(node.to_owned());
    slice.spec.pool.name = node.to_owned();
    for device in slice.spec.devices.iter_mut().flatten() {
        if let Some(attr) = device
            .attributes
            .as_mut()
            .and_then(|a| a.get_mut("productName"))
        {
            attr.string = Some(product.to_owned());
        }
        if let Some(cap) = device.capacity.as_mut().and_then(|c| c.get_mut("memory")) {
            cap.value.0 = memory.to_owned();
        }
    }
    slice
}

/// Claims as the resourceclaim controller and scheduler would leave them: allocated ones take
/// devices in node order from nodes of the matching product.
fn claims(slices: &[ResourceSlice]) -> Vec<ResourceClaim> {
    let mut free: Vec<(String, String, String)> = slices
        .iter()
        .flat_map(|s| {
            let product = s
                .spec
                .devices
                .iter()
                .flatten()
                .next()
                .and_then(|d| d.attributes.as_ref()?.get("productName")?.string.clone());
            s.spec.devices.iter().flatten().map(move |d| {
                (
                    product.clone().unwrap_or_default(),
                    s.spec.pool.name.clone(),
                    d.name.clone(),
                )
            })
        })
        .collect();
    let mut out = Vec::new();
    for (namespace, class, count, claims, allocated) in CLAIMS {
        let product = if class.starts_with("a100-80gb") {
            "NVIDIA A100-SXM4-80GB"
        } else {
            "NVIDIA A100-PCIE-40GB"
        };
        for i in 0..claims {
            let results = if allocated {
                let mut taken = Vec::new();
                while taken.len() < count as usize {
                    let Some(pos) = free.iter().position(|(p, _, _)| p == product) else {
                        break;
                    };
                    let (_, pool, device) = free.remove(pos);
                    taken.push(DeviceRequestAllocationResult {
                        request: "gpu".into(),
                        driver: "gpu.nvidia.com".into(),
                        pool,
                        device,
                        ..Default::default()
                    });
                }
                Some(taken)
            } else {
                None
            };
            let name = format!("{}-{i}", class.trim_end_matches(".teamgpu.io"));
            out.push(claim(namespace, &name, class, count, results));
        }
    }
    out
}

/// A claim of `count` devices of `class`, allocated to `results` when given.
pub fn claim(
    namespace: &str,
    name: &str,
    class: &str,
    count: u32,
    results: Option<Vec<DeviceRequestAllocationResult>>,
) -> ResourceClaim {
    ResourceClaim {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(namespace.to_owned()),
            ..Default::default()
        },
        spec: ResourceClaimSpec {
            devices: Some(DeviceClaim {
                requests: Some(vec![DeviceRequest {
                    name: "gpu".into(),
                    exactly: Some(ExactDeviceRequest {
                        device_class_name: class.to_owned(),
                        allocation_mode: Some("ExactCount".into()),
                        count: Some(i64::from(count)),
                        ..Default::default()
                    }),
                    first_available: None,
                }]),
                ..Default::default()
            }),
        },
        status: results.map(|results| ResourceClaimStatus {
            allocation: Some(AllocationResult {
                devices: Some(DeviceAllocationResult {
                    results: Some(results),
                    config: None,
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
    }
}
