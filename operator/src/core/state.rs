//! The cluster as the core reads it: the inputs of a plan, and the keys and kinds of the objects
//! teamgpu writes.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::core::{ApiResource, GroupVersionKind};

use crate::api::{GpuSharingPolicy, TeamGpuPolicy};

/// A namespace as the planner sees it: its name and labels.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NamespaceInfo {
    pub name: String,
    pub labels: BTreeMap<String, String>,
}

/// What the planner reads of a namespace, and whether it is being deleted (then it is no
/// team's: nothing is written into it).
#[derive(Debug)]
pub struct NamespaceView {
    pub info: Arc<NamespaceInfo>,
    pub terminating: bool,
}

/// Devices a namespace's Pods wait for, per DeviceClass (observed by the controller from pending
/// Pods whose claims could not be created or allocated).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PendingDemand {
    pub namespace: String,
    pub device_class: String,
    pub devices: u32,
    /// The devices of each waiting claim, largest first (they add up to `devices`); a claim's
    /// devices must all be on one node. Empty when not known: placement is not checked then.
    pub claims: Vec<u32>,
    /// Of `claims`, those that exist and are not allocated: quota charges them while they wait
    /// for a node.
    pub charged: Vec<u32>,
    /// When the longest-waiting of those Pods was created.
    pub oldest: Option<k8s_openapi::jiff::Timestamp>,
}

/// Everything the planner reads.
#[derive(Clone, Debug, Default)]
pub struct ClusterState {
    pub sharing_policies: Vec<GpuSharingPolicy>,
    pub teams: Vec<TeamGpuPolicy>,
    /// Shared with the operator's watch cache.
    pub namespaces: Vec<Arc<NamespaceInfo>>,
    /// All DeviceClasses in the cluster, not only teamgpu's.
    pub device_classes: Vec<DeviceClass>,
    pub slices: Vec<ResourceSlice>,
    pub claims: Vec<ResourceClaim>,
    pub pending: Vec<PendingDemand>,
    /// The user name the operator writes as, exempt from teamgpu's own admission policies
    /// (`None`: the ServiceAccount of `config/rbac`, [`crate::core::plan::admission::DEFAULT_OPERATOR_USER`]).
    pub operator_user: Option<String>,
    /// Groups that may move any namespace into or out of any team and exempt namespaces
    /// (`None`: [`crate::core::plan::namespace_admission::DEFAULT_ADMIN_GROUPS`]).
    pub admin_groups: Option<Vec<String>>,
    /// GpuSharingPolicies that exist but could not be read (they do not fit the type): their
    /// DeviceClasses are kept and closed to new claims, as for an invalid hardware selector.
    pub unreadable_sharing_policies: Vec<String>,
    /// TeamGpuPolicies that exist but could not be read: their quotas, templates and binding
    /// are kept as they are until the policy can be read again.
    pub unreadable_teams: Vec<String>,
    /// What the admission bindings do with a request that breaks a rule.
    pub enforcement: Enforcement,
    /// The teamgpu CustomResourceDefinitions, as owners of the cluster-wide admission objects,
    /// so that deleting the CRDs also deletes those (the garbage collector does it, with or
    /// without an operator). `None`: not known (`teamgpu plan` on files), no owner is set;
    /// empty: the CRDs are gone, and nothing is left to enforce.
    pub crd_owners: Option<Vec<OwnerReference>>,
    /// Taints on devices from outside their slices: DeviceTaintRules, and devices Pods report
    /// unhealthy.
    pub device_taints: Vec<ExtraTaint>,
}

/// What a projected cache hands over: every object (the first time, after a resync), or what
/// changed since the last hand-over. [`Taken::delta`] borrows it as a [`Delta`].
#[derive(Debug)]
pub enum Taken<V> {
    All(Vec<Arc<V>>),
    Changed {
        upserted: Vec<Arc<V>>,
        removed: Vec<Arc<V>>,
    },
}

impl<V> Taken<V> {
    pub fn delta(&self) -> Delta<'_, V> {
        match self {
            Taken::All(all) => Delta::All(all),
            Taken::Changed { upserted, removed } => Delta::Changed { upserted, removed },
        }
    }

    /// How many objects are handed over.
    pub fn len(&self) -> usize {
        match self {
            Taken::All(all) => all.len(),
            Taken::Changed { upserted, removed } => upserted.len() + removed.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// What a watch cache hands the kept planner of its objects (slices, claims): everything it
/// holds, or only what changed since the last hand-over, so that one event costs the pool or
/// namespace it touched and not the cluster.
#[derive(Debug)]
pub enum Delta<'a, V> {
    /// Every object; one the planner holds that is not among them is gone.
    All(&'a [Arc<V>]),
    /// Since the last hand-over: objects new or changed (as projected now), and objects
    /// removed (as last projected).
    Changed {
        upserted: &'a [Arc<V>],
        removed: &'a [Arc<V>],
    },
}

impl<'a, V> Delta<'a, V> {
    /// The objects new or changed, and those removed. For [`Delta::All`] every object counts
    /// as new or changed: what the taker holds and is not among them is gone, for it to drop
    /// first.
    pub fn parts(self) -> (&'a [Arc<V>], &'a [Arc<V>]) {
        match self {
            Delta::All(all) => (all, &[]),
            Delta::Changed { upserted, removed } => (upserted, removed),
        }
    }
}

impl<V> Clone for Delta<'_, V> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<V> Copy for Delta<'_, V> {}

/// The kinds of object teamgpu writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    DeviceClass,
    ValidatingAdmissionPolicy,
    ValidatingAdmissionPolicyBinding,
    ResourceQuota,
    ResourceClaimTemplate,
    /// What a team's members may read (their TeamGpuPolicy and its GpuSharingPolicies).
    ClusterRole,
    ClusterRoleBinding,
}

impl Kind {
    pub const ALL: [Kind; 7] = [
        Kind::DeviceClass,
        Kind::ValidatingAdmissionPolicy,
        Kind::ValidatingAdmissionPolicyBinding,
        Kind::ResourceQuota,
        Kind::ResourceClaimTemplate,
        Kind::ClusterRole,
        Kind::ClusterRoleBinding,
    ];

    pub fn api_resource(self) -> ApiResource {
        let (group, version, kind, plural) = match self {
            Kind::DeviceClass => ("resource.k8s.io", "v1", "DeviceClass", "deviceclasses"),
            Kind::ValidatingAdmissionPolicy => (
                "admissionregistration.k8s.io",
                "v1",
                "ValidatingAdmissionPolicy",
                "validatingadmissionpolicies",
            ),
            Kind::ValidatingAdmissionPolicyBinding => (
                "admissionregistration.k8s.io",
                "v1",
                "ValidatingAdmissionPolicyBinding",
                "validatingadmissionpolicybindings",
            ),
            Kind::ResourceQuota => ("", "v1", "ResourceQuota", "resourcequotas"),
            Kind::ResourceClaimTemplate => (
                "resource.k8s.io",
                "v1",
                "ResourceClaimTemplate",
                "resourceclaimtemplates",
            ),
            Kind::ClusterRole => (
                "rbac.authorization.k8s.io",
                "v1",
                "ClusterRole",
                "clusterroles",
            ),
            Kind::ClusterRoleBinding => (
                "rbac.authorization.k8s.io",
                "v1",
                "ClusterRoleBinding",
                "clusterrolebindings",
            ),
        };
        ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural)
    }

    pub fn namespaced(self) -> bool {
        matches!(self, Kind::ResourceQuota | Kind::ResourceClaimTemplate)
    }

    /// Lower-case name for logs and metric labels.
    pub fn label(self) -> &'static str {
        match self {
            Kind::DeviceClass => "deviceclass",
            Kind::ValidatingAdmissionPolicy => "validatingadmissionpolicy",
            Kind::ValidatingAdmissionPolicyBinding => "validatingadmissionpolicybinding",
            Kind::ResourceQuota => "resourcequota",
            Kind::ResourceClaimTemplate => "resourceclaimtemplate",
            Kind::ClusterRole => "clusterrole",
            Kind::ClusterRoleBinding => "clusterrolebinding",
        }
    }
}

/// Which object.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectKey {
    pub kind: Kind,
    pub namespace: Option<String>,
    pub name: String,
}

impl fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.namespace {
            Some(ns) => write!(f, "{} {ns}/{}", self.kind.label(), self.name),
            None => write!(f, "{} {}", self.kind.label(), self.name),
        }
    }
}

/// What every teamgpu admission binding does with a request that breaks its policy: the
/// bindings' `validationActions`. `Warn` and `Audit` let a platform team install teamgpu, see
/// what would be refused (a warning to the client, an audit annotation), and then switch to
/// `Deny`. ResourceQuotas are not admission policies: in a team namespace they limit in every
/// mode.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Enforcement {
    /// Refuse the request (and say why).
    #[default]
    Deny,
    /// Admit it, with a warning to the client and an audit annotation.
    Warn,
    /// Admit it, with an audit annotation only.
    Audit,
}

impl Enforcement {
    /// The bindings' `validationActions` (Kubernetes allows `Deny` with `Audit` but not with
    /// `Warn`).
    pub fn validation_actions(self) -> Vec<String> {
        let actions: &[&str] = match self {
            Enforcement::Deny => &["Deny"],
            Enforcement::Warn => &["Warn", "Audit"],
            Enforcement::Audit => &["Audit"],
        };
        actions.iter().map(|a| (*a).to_owned()).collect()
    }
}

/// An [`Enforcement`] not among `Deny`, `Warn`, `Audit`.
#[derive(Debug, thiserror::Error)]
#[error("enforcement {0:?} is none of Deny, Warn, Audit")]
pub struct UnknownEnforcement(String);

impl std::str::FromStr for Enforcement {
    type Err = UnknownEnforcement;

    /// Case-insensitive, as flags and environment variables are typed.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "deny" => Ok(Enforcement::Deny),
            "warn" => Ok(Enforcement::Warn),
            "audit" => Ok(Enforcement::Audit),
            _ => Err(UnknownEnforcement(s.to_owned())),
        }
    }
}

/// A taint on devices from outside their slices, which keeps them out of capacity as a slice's
/// NoSchedule or NoExecute taint does: a DeviceTaintRule's (`resource.k8s.io/v1beta2`, served
/// where the DRADeviceTaintRules feature is on; its selector names a driver, a pool and a
/// device, each optional), or a Pod's report that a device it holds is unhealthy
/// (`allocatedResourcesStatus`, KEP-4680).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ExtraTaint {
    pub driver: Option<String>,
    pub pool: Option<String>,
    pub device: Option<String>,
    /// What status names it by: the rule's taint key, or `unhealthy`.
    pub key: String,
}
