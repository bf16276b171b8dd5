//! The Kubernetes objects teamgpu generates: DeviceClasses, ResourceClaimTemplates and
//! ResourceQuotas, and the plan's compact forms of templates and quotas ([`NamespacedTemplate`],
//! [`NamespacedQuota`]). Pure builders; the admission policy lives in [`super::admission`].

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{ResourceQuota, ResourceQuotaSpec};
use k8s_openapi::api::resource::v1::{
    CELDeviceSelector, CapacityRequirements, DeviceClaim, DeviceClass, DeviceClassConfiguration,
    DeviceClassSpec, DeviceRequest, DeviceSelector, ExactDeviceRequest, OpaqueDeviceConfiguration,
    ResourceClaimSpec, ResourceClaimTemplate, ResourceClaimTemplateSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::runtime::RawExtension;
use serde_json::json;

use crate::api::{
    DEFAULT_DRIVER, DeviceType, GROUP, GpuSharingPolicy, SharingStrategy, TeamGpuPolicy,
    TimeSliceInterval,
};

/// The label every object teamgpu writes carries; pruning selects on it.
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
pub const MANAGED_BY: &str = "teamgpu";
/// `<Kind>.<name>` of the policy an object was generated from.
pub const OWNER_LABEL: &str = "teamgpu.io/owner";
/// A ResourceClaimTemplate's spec is immutable: a changed hash means delete and create.
pub const CONTENT_HASH_ANNOTATION: &str = "teamgpu.io/content-hash";
/// The name of the ResourceQuota in every team namespace.
pub const QUOTA_NAME: &str = "teamgpu";
/// The extended resource name every DeviceClass has under DRAExtendedResource (KEP-5004):
/// `deviceclass.resource.kubernetes.io/<class>`.
pub const IMPLICIT_EXTENDED_PREFIX: &str = "deviceclass.resource.kubernetes.io/";
/// The annotation of a team namespace's quota that names its team, for the team admission
/// policy's messages.
pub const QUOTA_TEAM_ANNOTATION: &str = "teamgpu.io/team";
/// The annotation of a team namespace's quota that lists the DeviceClasses of the team's quotas,
/// separated by spaces: what the team admission policy allows.
pub const QUOTA_CLASSES_ANNOTATION: &str = "teamgpu.io/device-classes";
/// The name of the single request in every generated template (`resources.claims[].request`).
pub const TEMPLATE_REQUEST: &str = "gpu";
/// The NVIDIA driver's opaque configuration API.
const NVIDIA_CONFIG_API_VERSION: &str = "resource.nvidia.com/v1beta1";

/// Whether teamgpu manages `object` (by its managed-by label).
pub fn is_managed<K: kube::Resource + ?Sized>(object: &K) -> bool {
    object
        .meta()
        .labels
        .as_ref()
        .and_then(|l| l.get(MANAGED_BY_LABEL))
        .map(String::as_str)
        == Some(MANAGED_BY)
}

/// The DeviceClass generated for a GpuSharingPolicy.
pub fn device_class_name(policy: &str) -> String {
    format!("{policy}.{GROUP}")
}

/// Whether a DeviceClass name is in teamgpu's namespace of names (ours, even if stale).
pub fn is_teamgpu_class(class: &str) -> bool {
    class.ends_with(&format!(".{GROUP}"))
}

/// The ResourceClaimTemplate offering `count` devices of a sharing policy.
pub fn template_name(policy: &str, count: u32) -> String {
    if count == 1 {
        policy.to_owned()
    } else {
        format!("{policy}-x{count}")
    }
}

/// Labels and owner of an object generated from `owner`.
pub(crate) fn owned_meta<K>(owner: &K, name: String, namespace: Option<String>) -> ObjectMeta
where
    K: kube::Resource<DynamicType = ()>,
{
    let kind = K::kind(&());
    let owner_name = owner.meta().name.clone().unwrap_or_default();
    ObjectMeta {
        name: Some(name),
        namespace,
        labels: Some(managed_labels(&format!("{kind}.{owner_name}"))),
        // An ownerReference needs the owner's uid, which only a live object has; `teamgpu plan`
        // on files leaves it out, and the operator (which reads live objects) always sets it.
        owner_references: owner.meta().uid.clone().map(|uid| {
            vec![OwnerReference {
                api_version: K::api_version(&()).into_owned(),
                kind: kind.into_owned(),
                name: owner_name,
                uid,
                controller: Some(true),
                block_owner_deletion: None,
            }]
        }),
        ..ObjectMeta::default()
    }
}

/// `managed-by` plus the owner label. Never Argo CD's tracking label: Argo CD would prune what
/// carries its parent's instance label.
pub(crate) fn managed_labels(owner: &str) -> BTreeMap<String, String> {
    [
        (MANAGED_BY_LABEL.to_owned(), MANAGED_BY.to_owned()),
        (OWNER_LABEL.to_owned(), owner.to_owned()),
    ]
    .into()
}

/// The DeviceClass of a sharing policy: its class expressions (one `spec.selectors` entry each,
/// Kubernetes' `DeviceSelector`, not the policy's) and the driver configuration of its sharing
/// strategy.
pub fn device_class(policy: &GpuSharingPolicy, expressions: &[String]) -> DeviceClass {
    let name = policy.metadata.name.clone().unwrap_or_default();
    let config = sharing_config(policy).map(|parameters| {
        vec![DeviceClassConfiguration {
            opaque: Some(OpaqueDeviceConfiguration {
                driver: policy.spec.driver.clone(),
                parameters: RawExtension(parameters),
            }),
        }]
    });
    DeviceClass {
        metadata: owned_meta(policy, device_class_name(&name), None),
        spec: DeviceClassSpec {
            selectors: Some(
                expressions
                    .iter()
                    .map(|expression| DeviceSelector {
                        cel: Some(CELDeviceSelector {
                            expression: expression.clone(),
                        }),
                    })
                    .collect(),
            ),
            config,
            ..DeviceClassSpec::default()
        },
    }
}

/// The NVIDIA driver's opaque config for a sharing strategy (api/nvidia.com/resource/v1beta1:
/// `GpuConfig` for whole GPUs, `MigDeviceConfig` for MIG devices). Exclusive needs none, and
/// other drivers get none: their parameters are unknown to us (reported by the status).
pub fn sharing_config(policy: &GpuSharingPolicy) -> Option<serde_json::Value> {
    let spec = &policy.spec;
    if spec.driver != DEFAULT_DRIVER {
        return None;
    }
    let kind = match spec.selector.device_type {
        DeviceType::Gpu => "GpuConfig",
        DeviceType::Mig => "MigDeviceConfig",
        DeviceType::Vfio => return None,
    };
    let sharing = match spec.sharing.strategy {
        // A memory slice is shared by allocation (the driver's consumable shares): no config.
        SharingStrategy::Exclusive | SharingStrategy::MemorySlices => return None,
        // MIG slices take no timeSlicingConfig (the driver rejects it on MigDeviceConfig).
        SharingStrategy::TimeSlicing if spec.selector.device_type == DeviceType::Mig => {
            json!({"strategy": "TimeSlicing"})
        }
        SharingStrategy::TimeSlicing => {
            let interval = spec
                .sharing
                .time_slicing
                .as_ref()
                .map(|t| t.interval)
                .unwrap_or_default();
            let interval = match interval {
                TimeSliceInterval::Default => "Default",
                TimeSliceInterval::Short => "Short",
                TimeSliceInterval::Medium => "Medium",
                TimeSliceInterval::Long => "Long",
            };
            json!({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": interval}})
        }
        SharingStrategy::Mps => {
            let mut mps = serde_json::Map::new();
            if let Some(mps_spec) = &spec.sharing.mps {
                if let Some(pct) = mps_spec.default_active_thread_percentage {
                    mps.insert("defaultActiveThreadPercentage".into(), json!(pct));
                }
                if let Some(limit) = &mps_spec.default_pinned_device_memory_limit {
                    mps.insert("defaultPinnedDeviceMemoryLimit".into(), json!(limit));
                }
            }
            json!({"strategy": "MPS", "mpsConfig": mps})
        }
    };
    Some(json!({"apiVersion": NVIDIA_CONFIG_API_VERSION, "kind": kind, "sharing": sharing}))
}

/// One ResourceClaimTemplate a sharing policy offers: its name, spec and the spec's hash. The
/// same in every namespace, so it is built once per policy.
#[derive(Clone, Debug, PartialEq)]
pub struct TemplateShape {
    pub name: String,
    pub spec: ResourceClaimTemplateSpec,
    pub hash: String,
}

/// The templates a sharing policy offers, one per device count.
pub fn template_shapes(policy: &GpuSharingPolicy) -> Vec<TemplateShape> {
    let policy_name = policy.metadata.name.clone().unwrap_or_default();
    let class = device_class_name(&policy_name);
    let mut counts = policy.spec.claim_templates.counts.clone();
    counts.sort_unstable();
    counts.dedup();
    counts
        .into_iter()
        .map(|count| {
            let spec = ResourceClaimTemplateSpec {
                metadata: None,
                spec: ResourceClaimSpec {
                    devices: Some(DeviceClaim {
                        requests: Some(vec![DeviceRequest {
                            name: TEMPLATE_REQUEST.to_owned(),
                            exactly: Some(ExactDeviceRequest {
                                device_class_name: class.clone(),
                                allocation_mode: Some("ExactCount".to_owned()),
                                count: Some(i64::from(count)),
                                capacity: slice_request(policy),
                                ..ExactDeviceRequest::default()
                            }),
                            first_available: None,
                        }]),
                        ..DeviceClaim::default()
                    }),
                },
            };
            let hash = content_hash(&spec);
            TemplateShape {
                name: template_name(&policy_name, count),
                spec,
                hash,
            }
        })
        .collect()
}

/// The capacity a device of a MemorySlices policy's templates requests: one slice of memory.
fn slice_request(policy: &GpuSharingPolicy) -> Option<CapacityRequirements> {
    let size = policy.spec.sharing.slice_size()?;
    Some(CapacityRequirements {
        requests: Some([(SLICE_CAPACITY.to_owned(), Quantity(size.to_owned()))].into()),
    })
}

/// The capacity that MemorySlices policies cut into slices: the NVIDIA driver's `memory`
/// (named as the claim's `capacity.requests` names it, without the driver's domain).
pub const SLICE_CAPACITY: &str = "memory";

/// The ResourceClaimTemplates a team gets in each of its namespaces for one sharing policy's
/// shapes (their namespace left unset: see [`NamespacedTemplate`]).
pub fn claim_templates(
    team: &TeamGpuPolicy,
    shapes: &[TemplateShape],
) -> Vec<ResourceClaimTemplate> {
    shapes
        .iter()
        .map(|shape| {
            let mut metadata = owned_meta(team, shape.name.clone(), None);
            metadata.annotations =
                Some([(CONTENT_HASH_ANNOTATION.to_owned(), shape.hash.clone())].into());
            ResourceClaimTemplate {
                metadata,
                spec: shape.spec.clone(),
            }
        })
        .collect()
}

/// The ResourceQuota of one team namespace: `hard` holds, per DeviceClass resource name, the
/// devices this namespace may request. `meta` is the team's [`quota_meta`].
pub fn resource_quota(
    meta: Arc<ObjectMeta>,
    namespace: &str,
    hard: &BTreeMap<Arc<str>, u32>,
) -> NamespacedQuota {
    NamespacedQuota::new(
        meta,
        namespace,
        hard.iter().map(|(name, n)| (name.clone(), *n)),
    )
}

/// The metadata of a team's quotas (the same in each of its namespaces). Its annotations name
/// the team and its DeviceClasses (`classes`) for the team admission policy, which takes the
/// quota as params; and, for whoever may read the namespace (`view` is enough), the team's
/// guarantee and limit of each of those classes' sharing policies ([`QUOTAS_ANNOTATION`]).
/// `rules` are what the team's requests of some classes must be, as annotations
/// ([`SLICE_ANNOTATION_PREFIX`], [`OWN_GPUS_ANNOTATION_PREFIX`]).
pub fn quota_meta(
    team: &TeamGpuPolicy,
    classes: &[String],
    rules: &[(String, String)],
) -> ObjectMeta {
    let mut meta = owned_meta(team, QUOTA_NAME.to_owned(), None);
    meta.annotations = Some(BTreeMap::from_iter(rules.iter().cloned().chain([
        (
            QUOTA_TEAM_ANNOTATION.to_owned(),
            team.metadata.name.clone().unwrap_or_default(),
        ),
        (QUOTA_CLASSES_ANNOTATION.to_owned(), classes.join(" ")),
        (QUOTAS_ANNOTATION.to_owned(), team_quotas(team, classes)),
    ])));
    meta
}

/// The annotation of a team namespace's quota, one per class whose devices are GPUs of the
/// team's own (`teamgpu.io/gpus-<class>`), holding the CEL expression the team's templates select
/// its GPUs with: the team admission policy requires exactly it in the team's requests of the
/// class.
pub const OWN_GPUS_ANNOTATION_PREFIX: &str = "teamgpu.io/gpus-";

/// The annotation of a team namespace's quota, one per MemorySlices class of the team
/// (`teamgpu.io/slice-<class>`), holding the memory of one slice: the team admission policy
/// requires exactly it per device in the team's requests of the class.
pub const SLICE_ANNOTATION_PREFIX: &str = "teamgpu.io/slice-";

/// `shapes` whose request selects devices with `expression` too (a team's GPUs).
pub fn selecting(shapes: &[TemplateShape], expression: &str) -> Vec<TemplateShape> {
    (shapes.iter())
        .map(|shape| {
            let mut spec = shape.spec.clone();
            for request in
                (spec.spec.devices.iter_mut()).flat_map(|d| d.requests.iter_mut().flatten())
            {
                if let Some(exactly) = request.exactly.as_mut() {
                    exactly.selectors = Some(vec![DeviceSelector {
                        cel: Some(CELDeviceSelector {
                            expression: expression.to_owned(),
                        }),
                    }]);
                }
            }
            let hash = content_hash(&spec);
            TemplateShape {
                name: shape.name.clone(),
                spec,
                hash,
            }
        })
        .collect()
}

/// The annotation of a team namespace's quota that says, per sharing policy, what the team is
/// guaranteed and may borrow up to: `a100-80gb: guaranteed 8, limit 16; ...`. Only the spec's
/// numbers: what changes with demand (the entitlement, borrowed and pending devices) would
/// rewrite every quota of a team whenever one namespace's demand moves, where today only the
/// quotas whose `hard` changes are written. Those are in the team's status and in the Events
/// recorded in each team namespace.
pub const QUOTAS_ANNOTATION: &str = "teamgpu.io/quotas";

fn team_quotas(team: &TeamGpuPolicy, classes: &[String]) -> String {
    let mut quotas: Vec<_> = team
        .spec
        .quotas
        .iter()
        .filter(|q| classes.contains(&device_class_name(&q.sharing_policy)))
        .collect();
    quotas.sort_by(|a, b| a.sharing_policy.cmp(&b.sharing_policy));
    quotas
        .iter()
        .map(|q| {
            format!(
                "{}: guaranteed {}, limit {}",
                q.sharing_policy,
                q.guaranteed,
                q.limit.as_ref().unwrap_or(&q.guaranteed)
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// A stable hash of an object's content (FNV-1a over its JSON), so that a toolchain upgrade
/// never changes it and recreates every template.
pub fn content_hash<T: serde::Serialize>(value: &T) -> String {
    let bytes = serde_json::to_vec(value).unwrap_or_default();
    let hash = bytes.iter().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    format!("{hash:016x}")
}

/// A ResourceClaimTemplate in one namespace. The template itself (whose metadata names no
/// namespace) is one object for every namespace of a team: 9,000 templates of 100 teams are
/// 900 objects.
#[derive(Clone, Debug, PartialEq)]
pub struct NamespacedTemplate {
    pub namespace: Arc<str>,
    pub template: Arc<ResourceClaimTemplate>,
}

impl NamespacedTemplate {
    pub fn name(&self) -> &str {
        self.template.metadata.name.as_deref().unwrap_or_default()
    }

    /// The template as it is applied, in its namespace.
    pub fn to_object(&self) -> ResourceClaimTemplate {
        let mut object = (*self.template).clone();
        object.metadata.namespace = Some(self.namespace.to_string());
        object
    }
}

impl serde::Serialize for NamespacedTemplate {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.to_object().serialize(serializer)
    }
}

/// The ResourceQuota of one team namespace, kept compact: the names of its resources are one
/// copy for every quota, and the metadata one copy for a team's quotas (1,000 quotas of 20
/// resources were 5 MiB as objects, and few are alike). [`NamespacedQuota::to_object`] is the
/// quota as it is applied.
#[derive(Clone, Debug, PartialEq)]
pub struct NamespacedQuota {
    pub namespace: Arc<str>,
    /// Name, labels and owner reference, without namespace and content hash.
    meta: Arc<ObjectMeta>,
    /// Devices per quota resource name, in name order.
    hard: Box<[(Arc<str>, u32)]>,
    /// The hash of the spec (see [`content_hash`]).
    content_hash: Box<str>,
}

impl NamespacedQuota {
    /// The quota with `meta` (name, labels, owner) in `namespace`, limiting each resource of
    /// `hard` to its devices.
    pub fn new(
        meta: Arc<ObjectMeta>,
        namespace: &str,
        hard: impl IntoIterator<Item = (Arc<str>, u32)>,
    ) -> Self {
        let mut hard: Vec<(Arc<str>, u32)> = hard.into_iter().collect();
        hard.sort();
        hard.dedup_by(|a, b| a.0 == b.0);
        let mut quota = NamespacedQuota {
            namespace: Arc::from(namespace),
            meta,
            hard: hard.into_boxed_slice(),
            content_hash: Box::default(),
        };
        // The annotations tell the team admission policy which classes the team has.
        quota.content_hash =
            content_hash(&(&quota.meta.annotations, quota.spec())).into_boxed_str();
        quota
    }

    pub fn name(&self) -> &str {
        self.meta.name.as_deref().unwrap_or_default()
    }

    /// The hash of the spec, as the quota's annotation carries it.
    pub fn content_hash(&self) -> &str {
        &self.content_hash
    }

    /// Devices per quota resource name.
    pub fn hard(&self) -> impl Iterator<Item = (&str, u32)> {
        self.hard.iter().map(|(name, n)| (&**name, *n))
    }

    /// Whether `self` and `other` are the same quota of the same namespace, told by their
    /// metadata and content hash.
    pub fn same_as(&self, other: &NamespacedQuota) -> bool {
        self.namespace == other.namespace
            && self.content_hash == other.content_hash
            && (Arc::ptr_eq(&self.meta, &other.meta) || self.meta == other.meta)
    }

    fn spec(&self) -> ResourceQuotaSpec {
        ResourceQuotaSpec {
            hard: Some(
                self.hard
                    .iter()
                    .map(|(name, n)| (name.to_string(), Quantity(n.to_string())))
                    .collect(),
            ),
            ..ResourceQuotaSpec::default()
        }
    }

    /// The quota as it is applied, in its namespace, with its content hash.
    pub fn to_object(&self) -> ResourceQuota {
        let mut metadata = (*self.meta).clone();
        metadata.namespace = Some(self.namespace.to_string());
        metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(
                CONTENT_HASH_ANNOTATION.to_owned(),
                self.content_hash.to_string(),
            );
        ResourceQuota {
            metadata,
            spec: Some(self.spec()),
            status: None,
        }
    }
}

impl serde::Serialize for NamespacedQuota {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.to_object().serialize(serializer)
    }
}

#[cfg(test)]
mod tests;
