//! `GpuSharingPolicy`: a class of GPUs and how its devices are shared.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The DRA driver teamgpu assumes when a policy names none.
pub const DEFAULT_DRIVER: &str = "gpu.nvidia.com";

/// A class of GPUs (a hardware selector) and how devices of that class are shared.
/// teamgpu generates one DeviceClass `<name>.teamgpu.io` per policy.
// `printcolumn(type_ = ...)` repeats by design.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "teamgpu.io",
    version = "v1alpha1",
    kind = "GpuSharingPolicy",
    shortname = "gsp",
    category = "teamgpu",
    status = "GpuSharingPolicyStatus",
    derive = "PartialEq",
    doc = "A class of GPUs and how its devices are shared. teamgpu generates one DeviceClass per policy.",
    printcolumn(
        name = "DeviceClass",
        type_ = "string",
        json_path = ".status.deviceClassName"
    ),
    printcolumn(
        name = "Strategy",
        type_ = "string",
        json_path = ".spec.sharing.strategy"
    ),
    printcolumn(name = "Devices", type_ = "integer", json_path = ".status.devices"),
    printcolumn(name = "Allocated", type_ = "integer", json_path = ".status.allocated"),
    printcolumn(
        name = "Outside-Teams",
        type_ = "integer",
        json_path = ".status.usedOutsideTeams"
    ),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "!has(self.selector.deviceType) || self.selector.deviceType != 'vfio' || self.sharing.strategy == 'Exclusive'",
     "message": "vfio devices are passed through whole: sharing.strategy must be Exclusive"},
    {"rule": "self.sharing.strategy != 'MemorySlices' || !has(self.selector.deviceType) || self.selector.deviceType == 'gpu'",
     "message": "memory slices are cut from whole GPUs: sharing.strategy MemorySlices needs selector.deviceType gpu"}
]))]
pub struct GpuSharingPolicySpec {
    /// The DRA driver that publishes the devices (`device.driver`).
    #[serde(default = "default_driver")]
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
    )]
    pub driver: String,
    /// Which devices belong to this class; every given criterion must hold.
    #[serde(default)]
    pub selector: DeviceSelector,
    /// How one device of this class is shared between the containers of a claim.
    #[serde(default)]
    pub sharing: Sharing,
    /// The ResourceClaimTemplates offered to teams.
    #[serde(default)]
    pub claim_templates: ClaimTemplates,
    /// How much of a reference GPU one device of this class is (a decimal such as `0.6` for an
    /// A100 beside H100s at 1). Unset: derived, 1 for a whole GPU, a MIG device's share of its
    /// GPU, a memory slice's share of its GPU's memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[0-9]{1,4}(\.[0-9]{1,6})?$"))]
    #[schemars(extend("x-kubernetes-validations" = [
        {"rule": "double(self) > 0.0", "message": "gpuEquivalent must be greater than 0"}
    ]))]
    pub gpu_equivalent: Option<String>,
}

fn default_driver() -> String {
    DEFAULT_DRIVER.to_owned()
}

/// Hardware criteria, ANDed together. Lists match when any entry matches.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "!has(self.migProfiles) || size(self.migProfiles) == 0 || (has(self.deviceType) && self.deviceType == 'mig')",
     "message": "migProfiles may only be set with deviceType mig"}
]))]
pub struct DeviceSelector {
    /// The driver's `type` attribute: a whole GPU, a MIG slice or a VFIO passthrough GPU.
    #[serde(default)]
    pub device_type: DeviceType,
    /// Any of these `productName`s, e.g. `NVIDIA A100-SXM4-80GB`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32), inner(length(min = 1, max = 128)))]
    pub product_names: Vec<String>,
    /// Any of these `architecture`s, e.g. `Ampere`, `Hopper`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16), inner(length(min = 1, max = 64)))]
    pub architectures: Vec<String>,
    /// The device's `memory` capacity must be at least this quantity, e.g. `80Gi`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32))]
    #[schemars(extend("x-kubernetes-validations" = [
        {"rule": "isQuantity(self) && quantity(self).isGreaterThan(quantity('0'))",
         "message": "minMemory must be a positive quantity such as 40Gi"}
    ]))]
    pub min_memory: Option<String>,
    /// Any of these MIG profiles (`profile` attribute), e.g. `1g.10gb`; only with deviceType mig.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16), inner(length(min = 1, max = 32)))]
    pub mig_profiles: Vec<String>,
    /// The `cudaComputeCapability` must be at least this version, e.g. `8.0`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[0-9]{1,3}\.[0-9]{1,3}(\.[0-9]{1,3})?$"))]
    pub min_compute_capability: Option<String>,
    /// Extra equality matches on driver attributes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub attributes: Vec<AttributeMatch>,
    /// Raw CEL selector expressions over `device`, ANDed with the rest: the escape hatch.
    /// Compiled by the operator; an invalid one is reported in status.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 8), inner(length(min = 1, max = 4096)))]
    pub cel: Vec<String>,
}

/// The NVIDIA driver's `type` attribute.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum DeviceType {
    #[default]
    Gpu,
    Mig,
    Vfio,
}

impl DeviceType {
    pub fn as_str(self) -> &'static str {
        match self {
            DeviceType::Gpu => "gpu",
            DeviceType::Mig => "mig",
            DeviceType::Vfio => "vfio",
        }
    }
}

/// One attribute equality: exactly one of the typed values is set.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "(has(self.string) ? 1 : 0) + (has(self.int) ? 1 : 0) + (has(self.bool) ? 1 : 0) + (has(self.version) ? 1 : 0) == 1",
     "message": "exactly one of string, int, bool or version must be set"}
]))]
pub struct AttributeMatch {
    /// The attribute name; a name without a domain (`brand`) is in the driver's domain,
    /// a qualified one (`resource.kubernetes.io/pcieRoot`) is taken as is.
    #[schemars(
        length(min = 1, max = 96),
        regex(
            pattern = r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z_][A-Za-z0-9_]{0,31}$"
        )
    )]
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256))]
    pub string: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub int: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bool: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub version: Option<String>,
}

/// How devices are shared.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "!has(self.timeSlicing) || self.strategy == 'TimeSlicing'",
     "message": "timeSlicing may only be set with strategy TimeSlicing"},
    {"rule": "!has(self.mps) || self.strategy == 'MPS'",
     "message": "mps may only be set with strategy MPS"},
    {"rule": "self.strategy == 'MemorySlices' ? has(self.memorySlices) : !has(self.memorySlices)",
     "message": "memorySlices is required with strategy MemorySlices and not allowed otherwise"}
]))]
pub struct Sharing {
    #[serde(default)]
    pub strategy: SharingStrategy,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_slicing: Option<TimeSlicing>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mps: Option<Mps>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_slices: Option<MemorySlices>,
}

impl Sharing {
    /// The slice size of a MemorySlices policy.
    pub fn slice_size(&self) -> Option<&str> {
        match self.strategy {
            SharingStrategy::MemorySlices => self.memory_slices.as_ref().map(|m| m.size.as_str()),
            _ => None,
        }
    }

    /// Whether each team's slices go on GPUs of its own.
    pub fn team_gpus(&self) -> bool {
        self.strategy == SharingStrategy::MemorySlices
            && (self.memory_slices.as_ref())
                .is_some_and(|m| m.placement == SlicePlacement::TeamGpus)
    }
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum SharingStrategy {
    /// One claim holds the whole device.
    #[default]
    Exclusive,
    /// The driver time-slices the device between the containers of a claim.
    TimeSlicing,
    /// CUDA Multi-Process Service.
    #[serde(rename = "MPS")]
    Mps,
    /// Many claims share a GPU that its driver publishes with `allowMultipleAllocations`
    /// (consumable capacity, KEP-5075), each taking one slice of its memory.
    MemorySlices,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TimeSlicing {
    #[serde(default)]
    pub interval: TimeSliceInterval,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum TimeSliceInterval {
    #[default]
    Default,
    Short,
    Medium,
    Long,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Mps {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100))]
    pub default_active_thread_percentage: Option<u8>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32))]
    #[schemars(extend("x-kubernetes-validations" = [
        {"rule": "isQuantity(self) && quantity(self).isGreaterThan(quantity('0'))",
         "message": "defaultPinnedDeviceMemoryLimit must be a positive quantity such as 10Gi"}
    ]))]
    pub default_pinned_device_memory_limit: Option<String>,
}

/// Memory slices of GPUs shared by many claims (the NVIDIA driver's `--consumable-shares=memory`).
/// Every device a claim of the class gets is one slice: the templates request exactly `size` of
/// `memory`, admission refuses claims that request another amount or none, so the native devices
/// quota counts slices. Entitlements may be written in slices or in memory (`80Gi`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MemorySlices {
    /// The memory of one slice, e.g. `10Gi`. A GPU of 80Gi holds 8 such slices.
    #[schemars(length(min = 1, max = 32))]
    #[schemars(extend("x-kubernetes-validations" = [
        {"rule": "isQuantity(self) && quantity(self).isGreaterThan(quantity('0'))",
         "message": "memorySlices.size must be a positive quantity such as 10Gi"}
    ]))]
    pub size: String,
    /// `Shared` (the default): the scheduler puts slices of several teams on one GPU.
    /// `TeamGpus`: each team's slices go only on GPUs of its own, as many as its entitlement
    /// needs; the team's templates select them by the driver's `uuid` attribute.
    #[serde(default)]
    pub placement: SlicePlacement,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum SlicePlacement {
    #[default]
    Shared,
    TeamGpus,
}

/// Shapes offered to teams as ResourceClaimTemplates.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClaimTemplates {
    /// One template per device count: `<policy>` for 1, `<policy>-x<N>` for N > 1.
    #[serde(default = "default_counts")]
    #[schemars(length(min = 1, max = 8), inner(range(min = 1, max = 32)))]
    #[schemars(extend("x-kubernetes-validations" = [
        {"rule": "self.all(c, self.exists_one(d, d == c))", "message": "claimTemplates.counts must not repeat a count"}
    ]))]
    pub counts: Vec<u32>,
}

fn default_counts() -> Vec<u32> {
    vec![1]
}

impl Default for ClaimTemplates {
    fn default() -> Self {
        Self {
            counts: default_counts(),
        }
    }
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GpuSharingPolicyStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The DeviceClass generated for this policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_class_name: Option<String>,
    /// Matching devices published in ResourceSlices (complete pools, untainted). Devices that
    /// draw on shared counters (MIG placements of one GPU) count as many as fit at once, and a
    /// GPU whose counters also fit another policy's devices counts for one of the two only.
    #[serde(default)]
    pub devices: u32,
    /// Of those, devices allocated to the teams' claims.
    #[serde(default)]
    pub allocated: u32,
    /// Of those, devices allocated through other DeviceClasses (outside every team, or from
    /// before teamgpu governed them): not available to teams.
    #[serde(default)]
    pub used_outside_teams: u32,
    /// The devices in GPU-equivalents: how much of a reference GPU one device is, and the
    /// devices and those allocated to teams at that rate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_equivalents: Option<ClassEquivalents>,
    /// GPUs shared by many claims (MemorySlices) that hold slices of two teams or more: the
    /// first 16, by device.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpus_shared_by_teams: Vec<SharedGpu>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}

/// A sharing policy's devices in GPU-equivalents (decimals such as `0.14`, `12.5`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClassEquivalents {
    /// One device of the class.
    pub per_device: String,
    /// Where `perDevice` comes from.
    pub source: String,
    /// `devices` at that rate.
    pub devices: String,
    /// `allocated` at that rate.
    pub allocated: String,
}

/// A GPU holding memory slices of two teams or more.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SharedGpu {
    /// `<driver>/<pool>/<device>`.
    pub device: String,
    /// The teams whose claims hold slices of it, sorted (`-` for claims outside every team).
    pub teams: Vec<String>,
}
