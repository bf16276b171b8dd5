//! `TeamGpuPolicy`: a team, the namespaces it owns, and its entitlement per sharing policy.

use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A team, the namespaces it owns and how many devices of each sharing policy it is entitled to.
// `printcolumn(type_ = ...)` repeats by design.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "teamgpu.io",
    version = "v1alpha1",
    kind = "TeamGpuPolicy",
    shortname = "tgp",
    category = "teamgpu",
    status = "TeamGpuPolicyStatus",
    derive = "PartialEq",
    doc = "A team, the namespaces it owns, and its GPU entitlement per GpuSharingPolicy.",
    printcolumn(name = "Weight", type_ = "integer", json_path = ".spec.weight"),
    printcolumn(
        name = "Namespaces",
        type_ = "integer",
        json_path = ".status.namespaceCount"
    ),
    printcolumn(
        name = "Guaranteed",
        type_ = "integer",
        json_path = ".status.totals.guaranteed"
    ),
    printcolumn(
        name = "Entitlement",
        type_ = "integer",
        json_path = ".status.totals.entitlement"
    ),
    printcolumn(
        name = "Allocated",
        type_ = "integer",
        json_path = ".status.totals.allocated"
    ),
    printcolumn(
        name = "GPU-Eq",
        type_ = "string",
        json_path = ".status.gpuEquivalents.entitlement"
    ),
    printcolumn(
        name = "Pending",
        type_ = "integer",
        json_path = ".status.totals.pending"
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
    {"rule": "(has(self.department) && self.department) || has(self.namespaceSelector) || (has(self.namespaces) && size(self.namespaces) > 0)",
     "message": "at least one of namespaceSelector or namespaces must be set (or department: true)"},
    {"rule": "!(has(self.department) && self.department) || (!has(self.namespaceSelector) && !has(self.namespaces))",
     "message": "a department owns no namespaces, its member teams do: remove namespaceSelector and namespaces"},
    {"rule": "!has(self.overcommit) || (has(self.department) && self.department)",
     "message": "overcommit is a department's: it says what a write that overcommits the department's guarantees does"}
]))]
pub struct TeamGpuPolicySpec {
    /// This TeamGpuPolicy is a department: it owns no namespaces; the teams (and departments)
    /// naming it as `parent` share its entitlement before anyone else may borrow it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub department: bool,
    /// The department this team belongs to: another TeamGpuPolicy, whose entitlement its
    /// members share first (see docs/fair-sharing.md, "Departments"): a TeamGpuPolicy with
    /// `department: true`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 253),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
    )]
    pub parent: Option<String>,
    /// On a department: what a write does that would make its members' guarantees add up to
    /// more than its own (or a member's limit exceed its limit), or lower its own below theirs.
    /// `Refuse` (the default): admission refuses it, with the numbers. `Warn`: it is admitted,
    /// and the members' guarantees are scaled down as an overcommitted pool's are.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overcommit: Option<Overcommit>,
    /// Namespaces carrying these labels belong to the team (self-service: label a namespace to join).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-validations" = [
        {"rule": "(has(self.matchLabels) && size(self.matchLabels) > 0) || (has(self.matchExpressions) && size(self.matchExpressions) > 0)",
         "message": "namespaceSelector must not be empty: an empty selector would claim every namespace"}
    ]))]
    pub namespace_selector: Option<LabelSelector>,
    /// Namespaces that belong to the team by name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(
        length(max = 256),
        inner(
            length(min = 1, max = 63),
            regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
        )
    )]
    #[schemars(extend(
        "x-kubernetes-list-type" = "set",
        "x-kubernetes-validations" = [
            {"rule": "!self.exists(n, n in ['kube-system', 'kube-public', 'kube-node-lease'])",
             "message": "system namespaces (kube-system, kube-public, kube-node-lease) cannot belong to a team"}
        ]
    ))]
    pub namespaces: Vec<String>,
    /// Fair-share weight: idle devices go to the teams holding the least for their weight, the
    /// weighted max-min share of the pool with guarantees as floors.
    #[serde(default = "default_weight")]
    #[schemars(range(min = 1, max = 1000))]
    pub weight: u32,
    /// The team's entitlement per sharing policy.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    #[schemars(extend("x-kubernetes-validations" = [
        {"rule": "self.all(q, self.exists_one(p, p.sharingPolicy == q.sharingPolicy))",
         "message": "each sharingPolicy may appear only once in quotas"}
    ]))]
    pub quotas: Vec<TeamQuota>,
    /// Taking borrowed devices back from other teams when this team needs its guarantee.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reclaim: Option<Reclaim>,
    /// A cap across the team's sharing policies, in GPU-equivalents: each policy's quota is
    /// also held to what it uses plus the budget left, counted at that policy's GPU-equivalents
    /// per device. On a department: across the claims of every team under it, in the policies
    /// it has a quota for; each of them is held to what it uses plus the department's budget
    /// left.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<Budget>,
    /// Who may add a namespace to the team (or take one out) by labelling it so that
    /// `namespaceSelector` matches (or stops matching). On a department: who may create, change
    /// and delete the TeamGpuPolicies under it (with RBAC to write TeamGpuPolicies, see
    /// docs/fair-sharing.md, "Delegating a department"). Subjects as in a RoleBinding. Unset
    /// or empty: only the operator's admin groups may.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub members: Vec<Member>,
}

/// What a write that overcommits a department does.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum Overcommit {
    /// Admission refuses it.
    #[default]
    Refuse,
    /// It is admitted and reported in status; the members' guarantees are scaled down.
    Warn,
}

/// A team's budget across its sharing policies.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Budget {
    /// The most GPU-equivalents the team's claims may hold at once, whichever sharing policies
    /// they use (a whole reference GPU is 1, a memory slice of a fifth of a GPU 0.2).
    #[schemars(range(max = 1000000))]
    pub gpu_equivalents: u32,
}

/// A user, group or ServiceAccount, as a RoleBinding's subject names it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "self.kind == 'ServiceAccount' ? has(self.__namespace__) : !has(self.__namespace__)",
     "message": "namespace is required for a ServiceAccount member and not allowed for a User or Group"}
]))]
pub struct Member {
    pub kind: MemberKind,
    /// The user or group name as the API server authenticates it, or the ServiceAccount's name.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// The ServiceAccount's namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63))]
    pub namespace: Option<String>,
}

#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, JsonSchema,
)]
pub enum MemberKind {
    User,
    Group,
    ServiceAccount,
}

impl Member {
    /// The user name a request of this member carries (`None` for a group).
    pub fn user_name(&self) -> Option<String> {
        match self.kind {
            MemberKind::User => Some(self.name.clone()),
            MemberKind::Group => None,
            MemberKind::ServiceAccount => Some(format!(
                "system:serviceaccount:{}:{}",
                self.namespace.as_deref().unwrap_or_default(),
                self.name
            )),
        }
    }
}

fn default_weight() -> u32 {
    1
}

/// A team's entitlement for one sharing policy, in devices (for a MemorySlices policy, in
/// slices, or in memory such as `80Gi`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "!has(self.limit) || string(self.limit).matches('^[0-9]+$') != string(self.guaranteed).matches('^[0-9]+$') || quantity(string(self.limit)).compareTo(quantity(string(self.guaranteed))) >= 0",
     "message": "limit must be at least guaranteed"},
    {"rule": "!has(self.lendingLimit) || string(self.lendingLimit).matches('^[0-9]+$') != string(self.guaranteed).matches('^[0-9]+$') || quantity(string(self.lendingLimit)).compareTo(quantity(string(self.guaranteed))) <= 0",
     "message": "lendingLimit must be at most guaranteed: it says how much of the guarantee may be lent"}
]))]
pub struct TeamQuota {
    /// The GpuSharingPolicy this entry is for.
    #[schemars(
        length(min = 1, max = 46),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
    )]
    pub sharing_policy: String,
    /// Devices always available to the team.
    #[serde(default)]
    pub guaranteed: Amount,
    /// The most the team may hold by borrowing idle devices; defaults to guaranteed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<Amount>,
    /// Overrides the team's weight for this sharing policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1000))]
    pub weight: Option<u32>,
    /// How many of the team's unused guaranteed devices other teams may borrow; unset: all of
    /// them. With 0 the guarantee is never lent, so it never has to be reclaimed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lending_limit: Option<Amount>,
}

/// Devices of a sharing policy: a count, or for a MemorySlices policy an amount of memory
/// (`80Gi`) that stands for the whole slices it holds.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(untagged)]
pub enum Amount {
    Devices(u32),
    Memory(String),
}

impl Default for Amount {
    fn default() -> Self {
        Amount::Devices(0)
    }
}

impl From<u32> for Amount {
    fn from(n: u32) -> Self {
        Amount::Devices(n)
    }
}

impl std::fmt::Display for Amount {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Amount::Devices(n) => write!(f, "{n}"),
            Amount::Memory(m) => f.write_str(m),
        }
    }
}

impl JsonSchema for Amount {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Amount".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "x-kubernetes-int-or-string": true,
            // Bounds what the rules below cost the API server.
            "maxLength": 16,
            "description": "A number of devices (0 to 100000), or for a MemorySlices sharing policy an amount of memory such as 80Gi, counted in whole slices.",
            "x-kubernetes-validations": [
                {"rule": "string(self).matches('^[0-9]+$') ? int(string(self)) <= 100000 : (isQuantity(string(self)) && quantity(string(self)).compareTo(quantity('0')) >= 0)",
                 "message": "must be a number of devices from 0 to 100000, or an amount of memory such as 80Gi"}
            ]
        })
    }

    fn inline_schema() -> bool {
        true
    }
}

/// An [`Amount`] that cannot be counted in the devices of its sharing policy.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AmountError {
    #[error(
        "{amount} is an amount of memory, but sharing policy {policy} does not cut memory slices: give a number of devices"
    )]
    MemoryWithoutSlices { amount: String, policy: String },
    #[error("{amount} is not an amount of memory such as 80Gi")]
    NotMemory { amount: String },
    #[error("{amount} is more than 100000 slices of {slice}")]
    TooMany { amount: String, slice: String },
}

impl Amount {
    /// The devices this amount stands for in a policy whose devices are memory slices of
    /// `slice` (`None`: whole devices): a memory amount counts the whole slices it holds.
    pub fn devices(&self, policy: &str, slice: Option<&str>) -> Result<u32, AmountError> {
        let memory = match self {
            Amount::Devices(n) => return Ok(*n),
            Amount::Memory(m) => m,
        };
        if let Ok(n) = memory.trim().parse::<u32>() {
            return Ok(n);
        }
        let Some(slice) = slice else {
            return Err(AmountError::MemoryWithoutSlices {
                amount: memory.clone(),
                policy: policy.to_owned(),
            });
        };
        let not_memory = || AmountError::NotMemory {
            amount: memory.clone(),
        };
        let amount = crate::quantity::parse_nanos(memory).map_err(|_| not_memory())?;
        let size = crate::quantity::parse_nanos(slice).map_err(|_| not_memory())?;
        if amount < 0 || size <= 0 {
            return Err(not_memory());
        }
        u32::try_from(amount / size)
            .ok()
            .filter(|n| *n <= 100_000)
            .ok_or_else(|| AmountError::TooMany {
                amount: memory.clone(),
                slice: slice.to_owned(),
            })
    }
}

/// A [`TeamQuota`] counted in the devices of its sharing policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entitlement {
    pub guaranteed: u32,
    /// `limit`, or `guaranteed` when unset; never below `guaranteed`.
    pub limit: u32,
    pub lending_limit: Option<u32>,
}

impl TeamQuota {
    /// The entry in devices of its policy, whose devices are memory slices of `slice`
    /// (`None`: whole devices).
    pub fn entitlement(&self, slice: Option<&str>) -> Result<Entitlement, AmountError> {
        let policy = &self.sharing_policy;
        let guaranteed = self.guaranteed.devices(policy, slice)?;
        let limit = match &self.limit {
            Some(l) => l.devices(policy, slice)?,
            None => guaranteed,
        };
        let lending_limit = match &self.lending_limit {
            Some(l) => Some(l.devices(policy, slice)?),
            None => None,
        };
        Ok(Entitlement {
            guaranteed,
            limit: limit.max(guaranteed),
            lending_limit,
        })
    }
}

/// Reclaim: evicting borrowers' workloads when this team waits below its guarantee.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Reclaim {
    /// Whether this team takes borrowed devices back by eviction; unset uses the operator's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// How long the team must have waited before borrowers' Pods are evicted; unset uses the
    /// operator's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(max = 86400))]
    pub grace_period_seconds: Option<u32>,
    /// A borrower's workload that has run for less than this is not evicted for this team
    /// (its Pods keep their devices until then); unset uses the operator's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(max = 604800))]
    pub min_runtime_seconds: Option<u32>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TeamGpuPolicyStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The namespaces that belong to the team now, sorted.
    // Shared with the plan: at 10,000 namespaces every pass builds every team's status, and
    // a copy of each list was a third of a claim's pass.
    #[serde(default, skip_serializing_if = "<[String]>::is_empty")]
    pub namespaces: Arc<[String]>,
    /// How many namespaces belong to the team now.
    #[serde(default)]
    pub namespace_count: u32,
    /// The team's devices summed over its quota entries (what `kubectl get tgp` shows).
    #[serde(default)]
    pub totals: QuotaTotals,
    /// The team's devices of every sharing policy in GPU-equivalents, added up.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_equivalents: Option<EquivalentTotals>,
    /// What `spec.budget` leaves, when it is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<BudgetStatus>,
    /// What the team gets per sharing policy, and why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["sharingPolicy"]))]
    pub quotas: Vec<QuotaStatus>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}

/// A team's devices summed over its quota entries (of every sharing policy).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct QuotaTotals {
    /// Devices the quotas guarantee (as configured, before any scaling down).
    pub guaranteed: u32,
    /// The team's hard quota now: effective guarantees plus what it may borrow.
    pub entitlement: u32,
    /// Devices allocated to the team's claims.
    pub allocated: u32,
    /// Devices the team's Pods wait for.
    pub pending: u32,
}

/// One quota entry in GPU-equivalents.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct QuotaEquivalents {
    pub per_device: String,
    pub entitlement: String,
    pub allocated: String,
}

/// A team's devices of every sharing policy in GPU-equivalents (decimals such as `12.5`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EquivalentTotals {
    pub guaranteed: String,
    pub entitlement: String,
    pub allocated: String,
}

/// What a team's budget leaves, in GPU-equivalents.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BudgetStatus {
    /// `spec.budget.gpuEquivalents`.
    pub gpu_equivalents: u32,
    /// What the team's claims are charged, every sharing policy at its rate.
    pub in_use: String,
    /// What is left for new claims (0 when in use reaches the budget).
    pub left: String,
}

/// The numbers behind one quota entry, all in devices.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct QuotaStatus {
    pub sharing_policy: String,
    pub guaranteed: u32,
    /// The guarantee after scaling, when the pool's guarantees exceed its capacity.
    pub effective_guarantee: u32,
    pub limit: u32,
    pub weight: u32,
    /// Devices in the pool available to teams: matching devices less those used outside teams.
    pub capacity: u32,
    /// The team's hard quota now: effective guarantee plus what it may borrow.
    pub entitlement: u32,
    /// How much of the entitlement is above the effective guarantee.
    pub borrowed: u32,
    /// Devices requested by the team's claims, as the quota evaluator counts them.
    pub requested: u32,
    /// Devices allocated to the team's claims.
    pub allocated: u32,
    /// Devices the team's Pods wait for.
    pub pending: u32,
    /// When the longest-waiting of those Pods was created: how long the team has waited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oldest_pending_since: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>,
    /// Unused guaranteed devices kept back from lending by `lendingLimit`.
    #[serde(default)]
    pub reserved: u32,
    /// On a department: what the quotas of its members guarantee together (as configured).
    /// Admission holds a new or changed member to what is left (see `spec.overcommit`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub members_guaranteed: Option<u32>,
    /// For a MemorySlices sharing policy: the memory of one of its devices (`10Gi`); an amount
    /// written in memory counts the whole slices it holds. Admission reads it on a department
    /// to count its members' amounts in devices.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slice_size: Option<String>,
    /// GPU-equivalents of one device of the sharing policy, and of the entitlement and the
    /// allocated devices at that rate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_equivalents: Option<QuotaEquivalents>,
    /// One line a person can read: how the entitlement came about.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub explanation: String,
}
