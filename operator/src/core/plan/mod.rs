//! The planning core: from the cluster's state as plain data to every object teamgpu must make
//! exist and the status of every policy. Pure and deterministic: the same state gives the same
//! plan, byte for byte. Needs no client.
//!
//! Steps, top to bottom in [`plan`]: selectors -> inventory -> governed classes -> membership ->
//! usage -> fair shares -> objects -> statuses.

pub mod admission;
pub mod conditions;
pub mod inventory;
pub mod membership;
pub mod namespace_admission;
pub mod objects;
pub mod pending;
pub mod selector;
pub mod usage;

use std::collections::{BTreeMap, BTreeSet};
use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::Arc;

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::core::v1::ResourceQuota;
use k8s_openapi::api::resource::v1::{
    DeviceClass, ResourceClaim, ResourceClaimTemplate, ResourceSlice,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::api::{
    DEFAULT_DRIVER, GpuSharingPolicy, GpuSharingPolicyStatus, QuotaStatus, SharingStrategy,
    TeamGpuPolicy, TeamGpuPolicyStatus,
};
use crate::core::fairshare::{self, NamespaceUsage, PoolInput, PoolShares, TeamInput};
use crate::core::state::ClusterState;
use crate::dra_cel::{self, CompiledSelectors};
use conditions::{DesiredCondition, types};
use inventory::Inventory;
use membership::Membership;
use objects::{MANAGED_BY, MANAGED_BY_LABEL, device_class_name, is_teamgpu_class};
use usage::quota_resource_name as quota_resource;

/// Every object teamgpu wants to exist. Objects with teamgpu's managed-by label that are not
/// here (and not in `retained_device_classes`) are to be deleted.
#[derive(Clone, Debug, Default, PartialEq)]
///
/// Objects are shared (`Arc`): the operator's planner hands out the same object, not a copy,
/// for as long as it does not change, and its differ tells unchanged objects by that.
pub struct DesiredObjects {
    pub device_classes: Vec<Arc<DeviceClass>>,
    pub claim_templates: Vec<NamespacedTemplate>,
    pub resource_quotas: Vec<Arc<ResourceQuota>>,
    pub admission_policies: Vec<Arc<ValidatingAdmissionPolicy>>,
    pub admission_bindings: Vec<Arc<ValidatingAdmissionPolicyBinding>>,
    /// DeviceClasses of policies whose spec is invalid now: kept as they are rather than applied
    /// or pruned, so a typo never takes a class away from running workloads.
    pub retained_device_classes: BTreeSet<String>,
    /// Owners (`teamgpu.io/owner` values) whose objects are kept as they are: the policy exists
    /// but cannot be read, so what it had is neither changed nor pruned.
    pub retained_owners: BTreeSet<String>,
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

/// What the planner concluded about one GpuSharingPolicy.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SharingPolicyReport {
    pub name: String,
    pub generation: Option<i64>,
    pub device_class: String,
    pub capacity: u32,
    /// Matching devices allocated through other DeviceClasses.
    pub used_outside_teams: u32,
    pub conditions: Vec<DesiredCondition>,
}

/// What the planner concluded about one TeamGpuPolicy.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TeamReport {
    pub name: String,
    pub generation: Option<i64>,
    pub weight: u32,
    pub namespaces: Vec<String>,
    pub quotas: Vec<QuotaStatus>,
    pub conditions: Vec<DesiredCondition>,
}

/// A borrower that must give devices back, in one sharing policy's pool.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReclaimOrder {
    pub sharing_policy: String,
    pub borrower: String,
    pub devices: u32,
    pub for_team: String,
}

/// The result of planning.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Plan {
    pub objects: DesiredObjects,
    pub sharing_policies: Vec<SharingPolicyReport>,
    pub teams: Vec<TeamReport>,
    pub reclaims: Vec<ReclaimOrder>,
    /// Cluster-wide findings a person should look at, sorted.
    pub warnings: Vec<String>,
}

impl Plan {
    /// The status to write for a sharing policy, given the live one.
    pub fn sharing_status(
        &self,
        name: &str,
        previous: Option<&GpuSharingPolicyStatus>,
        now: &Time,
    ) -> Option<GpuSharingPolicyStatus> {
        let report = self.sharing_policies.iter().find(|r| r.name == name)?;
        let previous_conditions = previous
            .map(|p| p.conditions.as_slice())
            .unwrap_or_default();
        Some(GpuSharingPolicyStatus {
            observed_generation: report.generation,
            device_class_name: Some(report.device_class.clone()),
            devices: report.capacity,
            used_outside_teams: report.used_outside_teams,
            conditions: conditions::merge(
                previous_conditions,
                &report.conditions,
                report.generation,
                now,
            ),
        })
    }

    /// The status to write for a team, given the live one.
    pub fn team_status(
        &self,
        name: &str,
        previous: Option<&TeamGpuPolicyStatus>,
        now: &Time,
    ) -> Option<TeamGpuPolicyStatus> {
        let report = self.teams.iter().find(|r| r.name == name)?;
        let previous_conditions = previous
            .map(|p| p.conditions.as_slice())
            .unwrap_or_default();
        Some(TeamGpuPolicyStatus {
            observed_generation: report.generation,
            namespaces: report.namespaces.clone(),
            quotas: report.quotas.clone(),
            conditions: conditions::merge(
                previous_conditions,
                &report.conditions,
                report.generation,
                now,
            ),
        })
    }
}

/// A sharing policy with its compiled selectors, once validated.
struct CompiledPolicy<'a> {
    policy: &'a GpuSharingPolicy,
    name: String,
    selectors: Vec<String>,
    /// `Ok` when every selector compiles (the compiled form lives in the match sets).
    compiled: Result<(), dra_cel::SelectorError>,
    /// A live DeviceClass of this name that teamgpu does not manage.
    foreign_class: bool,
}

impl CompiledPolicy<'_> {
    fn usable(&self) -> bool {
        self.compiled.is_ok() && !self.foreign_class
    }
}

/// Device counts are u32 everywhere in the plan; a count beyond that is not a real cluster.
fn clamp(n: u64) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

fn name_of<K: kube::Resource>(obj: &K) -> String {
    obj.meta().name.clone().unwrap_or_default()
}

fn is_managed(class: &DeviceClass) -> bool {
    class
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(MANAGED_BY_LABEL))
        .map(String::as_str)
        == Some(MANAGED_BY)
}

/// Compute the plan.
pub fn plan(state: &ClusterState) -> Plan {
    let mut planner = Planner {
        single: true,
        ..Planner::default()
    };
    planner.update_slices(&state.slices);
    planner.update_claims(&state.claims);
    planner.plan(state)
}

/// What the selectors of `state` read of a device: those of every sharing policy and of every
/// DeviceClass not teamgpu's (which decide what is governed). The slices the planner counts
/// must keep at least this ([`inventory::SliceView::project`]). Selectors that do not compile
/// read nothing.
pub fn device_reads(state: &ClusterState) -> dra_cel::DeviceReads {
    let mut reads = dra_cel::DeviceReads::default();
    for policy in &state.sharing_policies {
        let selectors = selector::device_class_selectors(&policy.spec);
        if let Ok(compiled) = CompiledSelectors::compile(&selectors) {
            reads.extend(&compiled.reads());
        }
    }
    for class in &state.device_classes {
        if !is_teamgpu_class(&name_of(class))
            && let Ok(compiled) = inventory::class_selectors(class)
        {
            reads.extend(&compiled.reads());
        }
    }
    reads
}

/// The planner the operator keeps between events. It gives the same plan as [`plan`], but
/// recomputes only what changed inputs feed: a changed ResourceSlice rebuilds and rematches its
/// pool's devices only, a changed claim recounts its namespace's usage, the fair shares of a
/// sharing policy are recomputed only when their input changed, and a namespace's claim
/// templates are rebuilt only when its team or the templates' shapes changed.
///
/// Objects are told apart by uid and resourceVersion (which the API server changes on every
/// write), or by content when they have no resourceVersion.
#[derive(Debug, Default)]
pub struct Planner {
    /// Made for one plan: objects are not told apart, as nothing is kept.
    single: bool,
    inventory: Inventory,
    /// Compiled selectors by policy name, with the expressions they were compiled from.
    selectors: BTreeMap<
        String,
        (
            Vec<String>,
            Result<CompiledSelectors, dra_cel::SelectorError>,
        ),
    >,
    /// What the slices of the inventory were projected to.
    slice_reads: Option<dra_cel::DeviceReads>,
    /// The last [`Planner::device_reads`], with the identity of its input.
    reads: Option<(u64, dra_cel::DeviceReads)>,
    /// Which devices each policy matches.
    matching: Matching,
    /// Per foreign DeviceClass: whether it selects devices a policy governs, with the identity
    /// of what that was computed from.
    governed: BTreeMap<String, (u64, bool)>,
    /// Usage per namespace, with the identity of the claims it was counted from.
    usage: BTreeMap<String, (u64, usage::Usage)>,
    /// Fair shares per sharing policy, with the input they were computed from.
    shares: BTreeMap<String, (PoolInput, PoolShares)>,
    /// Claim templates per team, and claim templates and quota per (team, namespace), with the
    /// identity of their input.
    templates: TemplateMemo,
    namespaces: NamespaceMemo,
}

/// Device matching kept between plans, per pool: a changed pool is matched again, the others
/// are not; a changed selector matches every pool again.
#[derive(Debug, Default)]
struct Matching {
    /// The (policy, selectors) the matching is for.
    selectors: BTreeMap<String, Vec<String>>,
    /// Per pool: the pool's fingerprint and its report.
    pools: BTreeMap<inventory::PoolKey, (u64, inventory::MatchReport)>,
    /// All pools together, and the inventory version it is for.
    total: inventory::MatchReport,
    version: Option<u64>,
}

impl Matching {
    fn update(
        &mut self,
        inventory: &Inventory,
        selectors: BTreeMap<String, Vec<String>>,
        sets: &BTreeMap<String, &CompiledSelectors>,
    ) -> &inventory::MatchReport {
        if selectors != self.selectors {
            *self = Matching {
                selectors,
                ..Matching::default()
            };
        }
        if self.version == Some(inventory.version()) {
            return &self.total;
        }
        let pools = inventory.pools();
        self.pools.retain(|key, _| pools.contains_key(key));
        for (key, pool) in pools {
            if self
                .pools
                .get(key)
                .is_none_or(|(f, _)| *f != pool.fingerprint())
            {
                let report = inventory::match_pool(pool, sets);
                self.pools.insert(key.clone(), (pool.fingerprint(), report));
            }
        }
        let mut total = inventory::MatchReport {
            counts: sets.keys().map(|k| (k.clone(), 0)).collect(),
            ..Default::default()
        };
        for (_, report) in self.pools.values() {
            total.merge(report);
        }
        self.total = total;
        self.version = Some(inventory.version());
        &self.total
    }
}

/// The identity of an object read from the API server: its uid and resourceVersion, which the
/// server changes on every write; an object without a resourceVersion (read from a file) is
/// identified by its content.
fn identity<K: kube::Resource + serde::Serialize>(obj: &K, hasher: &mut impl Hasher) {
    let meta = obj.meta();
    meta.name.hash(hasher);
    match &meta.resource_version {
        Some(rv) => (&meta.uid, rv).hash(hasher),
        None => serde_json::to_vec(obj).unwrap_or_default().hash(hasher),
    }
}

impl Planner {
    /// Brings the device inventory up to date with the cluster's ResourceSlices, kept whole;
    /// returns the pools that changed.
    pub fn update_slices<'a>(
        &mut self,
        slices: impl IntoIterator<Item = &'a ResourceSlice>,
    ) -> Vec<inventory::PoolKey> {
        let mut envs = dra_cel::DeviceEnvs::default();
        let everything = dra_cel::DeviceReads::everything();
        let views: Vec<inventory::SliceView> = slices
            .into_iter()
            .map(|s| inventory::SliceView::project(s, &everything, &mut envs))
            .collect();
        self.slice_reads = Some(everything);
        self.inventory.update(&views)
    }

    /// Brings the device inventory up to date with the cluster's ResourceSlices as projected to
    /// `reads` (see [`device_reads`]); returns the pools that changed. The plan is only right
    /// when `reads` covers what its selectors read: see [`Planner::reads_cover`].
    pub fn update_slice_views(
        &mut self,
        slices: &[Arc<inventory::SliceView>],
        reads: &dra_cel::DeviceReads,
    ) -> Vec<inventory::PoolKey> {
        self.slice_reads = Some(reads.clone());
        self.inventory.update(slices)
    }

    /// [`device_reads`] of `state`, computed again only when a policy's selectors or a
    /// DeviceClass changed.
    pub fn device_reads(&mut self, state: &ClusterState) -> dra_cel::DeviceReads {
        let mut parts: Vec<u64> = state
            .sharing_policies
            .iter()
            .map(|p| {
                let mut hasher = std::hash::DefaultHasher::new();
                (name_of(p), selector::device_class_selectors(&p.spec)).hash(&mut hasher);
                hasher.finish()
            })
            .chain(state.device_classes.iter().map(|c| {
                let mut hasher = std::hash::DefaultHasher::new();
                identity(c, &mut hasher);
                hasher.finish()
            }))
            .collect();
        // The caches list objects in no particular order.
        parts.sort_unstable();
        let mut hasher = std::hash::DefaultHasher::new();
        parts.hash(&mut hasher);
        let fingerprint = hasher.finish();
        match &self.reads {
            Some((known, reads)) if *known == fingerprint => reads.clone(),
            _ => {
                let reads = device_reads(state);
                self.reads = Some((fingerprint, reads.clone()));
                reads
            }
        }
    }

    /// Whether the slices of the last update hold every attribute `state`'s selectors read.
    pub fn reads_cover(&self, reads: &dra_cel::DeviceReads) -> bool {
        self.slice_reads.as_ref().is_some_and(|r| r.covers(reads))
    }

    /// Brings the usage up to date with the cluster's ResourceClaims; returns the namespaces
    /// whose usage was recounted.
    pub fn update_claims<'a>(
        &mut self,
        claims: impl IntoIterator<Item = &'a ResourceClaim>,
    ) -> Vec<String> {
        let mut names = usage::Names::default();
        let views: Vec<usage::ClaimView> = claims
            .into_iter()
            .map(|c| usage::ClaimView::project(c, &mut names))
            .collect();
        self.update_claim_views(&views)
    }

    /// [`Planner::update_claims`] from claims already projected.
    pub fn update_claim_views<C: std::borrow::Borrow<usage::ClaimView>>(
        &mut self,
        claims: &[C],
    ) -> Vec<String> {
        let mut by_namespace: BTreeMap<&str, Vec<&usage::ClaimView>> = BTreeMap::new();
        for c in claims {
            let c = c.borrow();
            by_namespace.entry(&c.namespace).or_default().push(c);
        }
        let mut changed: Vec<String> = self
            .usage
            .keys()
            .filter(|ns| !by_namespace.contains_key(ns.as_str()))
            .cloned()
            .collect();
        self.usage
            .retain(|ns, _| by_namespace.contains_key(ns.as_str()));
        for (namespace, mut claims) in by_namespace {
            claims.sort_by(|a, b| a.name.cmp(&b.name));
            let mut hasher = std::hash::DefaultHasher::new();
            if !self.single {
                for c in &claims {
                    (&*c.name, c.identity).hash(&mut hasher);
                }
            }
            let fingerprint = hasher.finish();
            if self
                .usage
                .get(namespace)
                .is_some_and(|(f, _)| *f == fingerprint)
            {
                continue;
            }
            self.usage.insert(
                namespace.to_owned(),
                (fingerprint, usage::Usage::from_views(claims)),
            );
            changed.push(namespace.to_owned());
        }
        changed
    }

    /// The inventory the plans count from.
    pub fn inventory(&self) -> &Inventory {
        &self.inventory
    }

    /// The plan for `state`, with the slices and claims of the last `update_slices` and
    /// `update_claims` (`state.slices` and `state.claims` are not read).
    pub fn plan(&mut self, state: &ClusterState) -> Plan {
        let mut out = Plan::default();

        // 1. Selectors, compiled once per change of a policy's expressions.
        let mut sharing: Vec<&GpuSharingPolicy> = state.sharing_policies.iter().collect();
        sharing.sort_by_key(|p| name_of(*p));
        let live_classes: BTreeMap<String, &DeviceClass> = state
            .device_classes
            .iter()
            .map(|c| (name_of(c), c))
            .collect();
        let present: BTreeSet<String> = sharing.iter().map(|p| name_of(*p)).collect();
        self.selectors.retain(|name, _| present.contains(name));
        for policy in &sharing {
            let selectors = selector::device_class_selectors(&policy.spec);
            let name = name_of(*policy);
            if self
                .selectors
                .get(&name)
                .is_none_or(|(s, _)| *s != selectors)
            {
                let compiled = CompiledSelectors::compile(&selectors);
                self.selectors.insert(name, (selectors, compiled));
            }
        }
        let sets: BTreeMap<String, &CompiledSelectors> = self
            .selectors
            .iter()
            .filter_map(|(name, (_, c))| Some((name.clone(), c.as_ref().ok()?)))
            .collect();
        let policies: Vec<CompiledPolicy> = sharing
            .into_iter()
            .map(|policy| {
                let name = name_of(policy);
                let (selectors, compiled) = &self.selectors[&name];
                let foreign_class = live_classes
                    .get(&device_class_name(&name))
                    .is_some_and(|c| !is_managed(c));
                CompiledPolicy {
                    policy,
                    name,
                    selectors: selectors.clone(),
                    compiled: compiled.as_ref().map(drop).map_err(Clone::clone),
                    foreign_class,
                }
            })
            .collect();
        let by_name: BTreeMap<&str, &CompiledPolicy> =
            policies.iter().map(|p| (p.name.as_str(), p)).collect();

        // 2. Inventory: capacity per policy, matching again only the pools that changed (all of
        // them when a selector changed).
        let matched_for: BTreeMap<String, Vec<String>> = policies
            .iter()
            .filter(|p| p.compiled.is_ok())
            .map(|p| (p.name.clone(), p.selectors.clone()))
            .collect();
        let selectors_id = std::hash::BuildHasherDefault::<std::hash::DefaultHasher>::default()
            .hash_one(&matched_for);
        let matches = self.matching.update(&self.inventory, matched_for, &sets);
        let inventory = &self.inventory;
        let capacity = |name: &str| matches.counts.get(name).copied().unwrap_or(0);
        for pool in inventory.incomplete_pools() {
            out.warnings.push(format!(
                "pool {} of driver {} is incomplete (not all of its ResourceSlices are published): its devices are not counted",
                pool.pool, pool.driver
            ));
        }

        // 2b. Devices a policy governs that are allocated through other classes: no team's
        // quota counts them, so the teams share what is left.
        let outside = used_outside_teams(&self.usage, inventory, &sets);
        let available = |name: &str| {
            capacity(name).saturating_sub(outside.get(name).map_or(0, |o| clamp(o.len() as u64)))
        };

        // 3. Governed classes: foreign DeviceClasses that can select devices teamgpu governs.
        let governed_drivers: BTreeSet<&str> = policies
            .iter()
            .map(|p| p.policy.spec.driver.as_str())
            .collect();
        let mut governed_foreign: BTreeMap<String, Option<String>> = BTreeMap::new();
        for class in &state.device_classes {
            let name = name_of(class);
            if is_teamgpu_class(&name) {
                continue;
            }
            let names_driver = class
                .spec
                .selectors
                .iter()
                .flatten()
                .filter_map(|s| s.cel.as_ref())
                .any(|cel| {
                    governed_drivers.iter().any(|d| {
                        cel.expression.contains(&format!("'{d}'"))
                            || cel.expression.contains(&format!("\"{d}\""))
                    })
                });
            // Evaluating a class against every device is costly: its answer is kept until the
            // class, the inventory or a policy's selectors change.
            let mut selects_governed = || {
                let mut hasher = std::hash::DefaultHasher::new();
                identity(class, &mut hasher);
                (inventory.version(), selectors_id).hash(&mut hasher);
                let fingerprint = hasher.finish();
                if let Some((f, answer)) = self.governed.get(&name)
                    && *f == fingerprint
                {
                    return *answer;
                }
                let answer = inventory::class_selectors(class).is_ok_and(|compiled| {
                    inventory.counted().any(|d| {
                        compiled.matches(&d.env).unwrap_or(false)
                            && sets.values().any(|p| p.matches(&d.env).unwrap_or(false))
                    })
                });
                self.governed.insert(name.clone(), (fingerprint, answer));
                answer
            };
            if names_driver || selects_governed() {
                governed_foreign.insert(name, class.spec.extended_resource_name.clone());
            }
        }
        self.governed
            .retain(|name, _| live_classes.contains_key(name));

        // 4. Membership.
        let mut teams: Vec<&TeamGpuPolicy> = state.teams.iter().collect();
        teams.sort_by_key(|t| name_of(*t));
        let membership: Membership = membership::resolve(&state.teams, &state.namespaces);

        // 5. Usage per (namespace, class).
        let usage = &self.usage;
        let usage_of = |namespace: &str, class: &str| {
            usage
                .get(namespace)
                .map(|(_, u)| u.get(namespace, class))
                .unwrap_or_default()
        };
        let mut pending: BTreeMap<(&str, &str), u32> = BTreeMap::new();
        for p in &state.pending {
            *pending
                .entry((p.namespace.as_str(), p.device_class.as_str()))
                .or_default() += p.devices;
        }
        let ns_usage = |namespace: &str, class: &str| NamespaceUsage {
            namespace: namespace.to_owned(),
            requested: clamp(usage_of(namespace, class).requested),
            allocated: clamp(usage_of(namespace, class).allocated),
            pending: pending.get(&(namespace, class)).copied().unwrap_or(0),
        };

        // 6. Fair shares, one pool per usable sharing policy, computed again only when the pool's
        // input changed.
        self.shares
            .retain(|name, _| by_name.get(name.as_str()).is_some_and(|p| p.usable()));
        for policy in policies.iter().filter(|p| p.usable()) {
            let class = device_class_name(&policy.name);
            let pool_teams = teams
                .iter()
                .filter_map(|team| {
                    let team_name = name_of(*team);
                    let quota = team
                        .spec
                        .quotas
                        .iter()
                        .find(|q| q.sharing_policy == policy.name)?;
                    let namespaces = membership.namespaces.get(&team_name)?;
                    Some(TeamInput {
                        team: team_name,
                        guaranteed: quota.guaranteed,
                        limit: quota.effective_limit(),
                        weight: quota.weight.unwrap_or(team.spec.weight),
                        lending_limit: quota.lending_limit,
                        namespaces: namespaces.iter().map(|ns| ns_usage(ns, &class)).collect(),
                    })
                })
                .collect();
            let input = PoolInput {
                capacity: available(&policy.name),
                teams: pool_teams,
            };
            let entry = self
                .shares
                .entry(policy.name.clone())
                .or_insert_with(|| (input.clone(), fairshare::compute_pool(&input)));
            if entry.0 != input {
                entry.1 = fairshare::compute_pool(&input);
                entry.0 = input;
            }
            let pool = &entry.1;
            for reclaim in &pool.reclaims {
                out.reclaims.push(ReclaimOrder {
                    sharing_policy: policy.name.clone(),
                    borrower: reclaim.borrower.clone(),
                    devices: reclaim.devices,
                    for_team: reclaim.for_team.clone(),
                });
            }
            if let Some(over) = &pool.overcommit {
                out.warnings
                    .push(format!("sharing policy {}: {}", policy.name, over.message));
            }
        }
        let shares: BTreeMap<&str, &PoolShares> = self
            .shares
            .iter()
            .map(|(name, (_, pool))| (name.as_str(), pool))
            .collect();

        // 7. Objects.
        for policy in &policies {
            match (&policy.compiled, policy.foreign_class) {
                (Ok(_), false) => out
                    .objects
                    .device_classes
                    .push(Arc::new(objects::device_class(
                        policy.policy,
                        &policy.selectors,
                    ))),
                (Err(_), false) => {
                    out.objects
                        .retained_device_classes
                        .insert(device_class_name(&policy.name));
                }
                (_, true) => {}
            }
        }
        out.objects.retained_owners = state
            .unreadable_teams
            .iter()
            .map(|t| format!("TeamGpuPolicy.{t}"))
            .collect();
        // A policy that cannot be read keeps its class as it is (as one whose selector is
        // invalid), so a typo never takes a class away from running workloads.
        for name in &state.unreadable_sharing_policies {
            if live_classes
                .get(&device_class_name(name))
                .is_none_or(|c| is_managed(c))
            {
                out.objects
                    .retained_device_classes
                    .insert(device_class_name(name));
            }
        }
        // Every class a team without a quota for it must get a hard of 0 for. A retained class
        // gets 0 in every team namespace: what runs keeps running, nothing new is admitted
        // until its policy is fixed (no quota entry would mean no limit at all).
        let governed_all: BTreeMap<String, Option<String>> = policies
            .iter()
            .filter(|p| p.usable())
            .map(|p| (device_class_name(&p.name), None))
            .chain(
                out.objects
                    .retained_device_classes
                    .iter()
                    .map(|c| (c.clone(), None)),
            )
            .chain(governed_foreign.clone())
            .collect();
        let zero_hard: Vec<String> = governed_all
            .iter()
            .flat_map(|(class, extended)| {
                std::iter::once(quota_resource(class))
                    .chain(extended.iter().map(|e| format!("requests.{e}")))
            })
            .collect();
        // Each policy's templates are the same in every namespace: built (and hashed) once.
        let shapes: BTreeMap<&str, Vec<objects::TemplateShape>> = policies
            .iter()
            .filter(|p| p.usable())
            .map(|p| (p.name.as_str(), objects::template_shapes(p.policy)))
            .collect();
        let mut planned = BTreeSet::new();
        for team in &teams {
            let team_name = name_of(*team);
            let namespaces = membership
                .namespaces
                .get(&team_name)
                .cloned()
                .unwrap_or_default();
            for namespace in &namespaces {
                let mut templates_of: Vec<(&str, &[objects::TemplateShape])> = Vec::new();
                let mut hard: BTreeMap<String, u32> = BTreeMap::new();
                for resource in &zero_hard {
                    hard.insert(resource.clone(), 0);
                }
                for quota in &team.spec.quotas {
                    let Some(policy) = by_name
                        .get(quota.sharing_policy.as_str())
                        .filter(|p| p.usable())
                    else {
                        continue;
                    };
                    let ns_hard = shares
                        .get(policy.name.as_str())
                        .and_then(|pool| pool.teams.iter().find(|t| t.team == team_name))
                        .and_then(|t| t.namespaces.iter().find(|n| &n.namespace == namespace))
                        .map_or(0, |n| n.hard);
                    hard.insert(quota_resource(&device_class_name(&policy.name)), ns_hard);
                    let shapes = shapes
                        .get(policy.name.as_str())
                        .map(Vec::as_slice)
                        .unwrap_or_default();
                    templates_of.push((policy.name.as_str(), shapes));
                }
                let templates = team_templates(&mut self.templates, team, &templates_of);
                let (templates, quota) =
                    namespace_objects(&mut self.namespaces, team, namespace, &hard, templates);
                planned.insert((team_name.clone(), namespace.clone()));
                out.objects
                    .claim_templates
                    .extend(templates.iter().cloned());
                out.objects.resource_quotas.push(quota.clone());
            }
            if let Some(binding) = admission::team_binding(team, &namespaces) {
                out.objects.admission_bindings.push(Arc::new(binding));
            }
        }
        self.namespaces.retain(|key, _| planned.contains(key));
        if !state.sharing_policies.is_empty() || !state.teams.is_empty() {
            let governed = admission::Governed {
                foreign: governed_foreign.keys().cloned().collect(),
                extended: governed_all
                    .iter()
                    .flat_map(|(class, extended)| {
                        std::iter::once(format!("{}{class}", admission::IMPLICIT_EXTENDED_PREFIX))
                            .chain(extended.iter().cloned())
                    })
                    .collect(),
            };
            let operator = state
                .operator_user
                .as_deref()
                .unwrap_or(admission::DEFAULT_OPERATOR_USER);
            out.objects
                .admission_policies
                .push(Arc::new(admission::team_policy(&governed, operator)));
            out.objects
                .admission_policies
                .push(Arc::new(admission::non_team_policy(&governed, operator)));
            let admin_groups = state.admin_groups.clone().unwrap_or_else(|| {
                namespace_admission::DEFAULT_ADMIN_GROUPS
                    .map(str::to_owned)
                    .to_vec()
            });
            out.objects
                .admission_policies
                .push(Arc::new(namespace_admission::membership_policy(
                    &teams,
                    &admin_groups,
                    operator,
                )));
            out.objects
                .admission_bindings
                .push(Arc::new(namespace_admission::membership_binding()));
            out.objects
                .admission_bindings
                .push(Arc::new(admission::non_team_binding(
                    &membership.all_team_namespaces(),
                )));
        }

        stamp_content_hashes(&mut out.objects);

        // 8. Reports.
        for policy in &policies {
            out.sharing_policies.push(sharing_report(
                policy,
                capacity(&policy.name),
                outside.get(policy.name.as_str()),
                matches,
                inventory,
            ));
        }
        for team in &teams {
            out.teams
                .push(team_report(team, &membership, &by_name, &shares, &usage_of));
        }
        for (team, conflicts) in &membership.conflicts {
            for (namespace, others) in conflicts {
                if team < others.iter().min().unwrap_or(team) {
                    continue; // report each conflict once, from its last team
                }
                out.warnings.push(format!(
                    "namespace {namespace} is claimed by TeamGpuPolicies {}: it belongs to none of them",
                    others.iter().chain(std::iter::once(team)).cloned().collect::<BTreeSet<_>>().into_iter().collect::<Vec<_>>().join(", ")
                ));
            }
        }
        for team in &out.teams {
            for quota in &team.quotas {
                if !by_name.contains_key(quota.sharing_policy.as_str()) {
                    out.warnings.push(format!(
                        "TeamGpuPolicy {} names GpuSharingPolicy {}, which does not exist",
                        team.name, quota.sharing_policy
                    ));
                }
            }
        }
        for report in &out.sharing_policies {
            if report.capacity == 0
                && by_name
                    .get(report.name.as_str())
                    .is_some_and(|p| p.compiled.is_ok())
            {
                out.warnings.push(format!(
                    "GpuSharingPolicy {} matches no device",
                    report.name
                ));
            }
        }
        for ((a, b), devices) in &matches.overlap_pairs {
            out.warnings.push(format!(
                "GpuSharingPolicies {a} and {b} both match {devices} devices"
            ));
        }
        out.warnings.sort();
        out.warnings.dedup();
        out
    }
}

/// The objects of one namespace of a team, built again only when the team's identity, the
/// quota's `hard` or a template shape changed; the templates are the team's (see
/// [`team_templates`]).
type NamespaceMemo = BTreeMap<(String, String), (u64, Vec<NamespacedTemplate>, Arc<ResourceQuota>)>;

/// A team's claim templates (without namespace), built again only when its identity or a
/// template shape changed.
type TemplateMemo = BTreeMap<String, (u64, Vec<Arc<ResourceClaimTemplate>>)>;

/// Identity of what a team's templates are made of.
fn templates_fingerprint(
    team: &TeamGpuPolicy,
    shapes: &[(&str, &[objects::TemplateShape])],
) -> u64 {
    let mut hasher = std::hash::DefaultHasher::new();
    (&team.metadata.name, &team.metadata.uid).hash(&mut hasher);
    for (policy, shapes) in shapes {
        policy.hash(&mut hasher);
        for shape in *shapes {
            (&shape.name, &shape.hash).hash(&mut hasher);
        }
    }
    hasher.finish()
}

/// A team's claim templates (`shapes` per sharing policy), without namespace, from `memo`
/// unless their input changed.
fn team_templates<'m>(
    memo: &'m mut TemplateMemo,
    team: &TeamGpuPolicy,
    shapes: &[(&str, &[objects::TemplateShape])],
) -> (u64, &'m [Arc<ResourceClaimTemplate>]) {
    let fingerprint = templates_fingerprint(team, shapes);
    let entry = memo
        .entry(name_of(team))
        .or_insert_with(|| (!fingerprint, Vec::new()));
    if entry.0 != fingerprint {
        entry.1 = shapes
            .iter()
            .flat_map(|(_, shapes)| objects::claim_templates(team, shapes))
            .map(Arc::new)
            .collect();
        entry.0 = fingerprint;
    }
    (fingerprint, &entry.1)
}

/// A team namespace's claim templates and its quota, from `memo` unless their input changed.
fn namespace_objects<'m>(
    memo: &'m mut NamespaceMemo,
    team: &TeamGpuPolicy,
    namespace: &str,
    hard: &BTreeMap<String, u32>,
    templates: (u64, &[Arc<ResourceClaimTemplate>]),
) -> (&'m [NamespacedTemplate], &'m Arc<ResourceQuota>) {
    let mut hasher = std::hash::DefaultHasher::new();
    (&team.metadata.name, &team.metadata.uid, hard, templates.0).hash(&mut hasher);
    let fingerprint = hasher.finish();
    let entry = memo
        .entry((name_of(team), namespace.to_owned()))
        .or_insert_with(|| (!fingerprint, Vec::new(), Arc::default()));
    if entry.0 != fingerprint {
        let shared_namespace: Arc<str> = Arc::from(namespace);
        entry.1 = templates
            .1
            .iter()
            .map(|template| NamespacedTemplate {
                namespace: shared_namespace.clone(),
                template: template.clone(),
            })
            .collect();
        let mut quota = objects::resource_quota(team, namespace, hard);
        stamp(&mut quota.metadata, &quota.spec);
        entry.2 = Arc::new(quota);
        entry.0 = fingerprint;
    }
    (&entry.1, &entry.2)
}

/// Records the hash of `spec` in `meta`.
fn stamp<S: serde::Serialize>(
    meta: &mut k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    spec: &S,
) {
    meta.annotations.get_or_insert_with(BTreeMap::new).insert(
        objects::CONTENT_HASH_ANNOTATION.to_owned(),
        objects::content_hash(spec),
    );
}

/// Every object carries the hash of its spec, so the writer can tell a changed object from one
/// whose spec the server merely defaulted (and a ResourceClaimTemplate, whose spec is immutable,
/// must be recreated).
fn stamp_content_hashes(objects: &mut DesiredObjects) {
    // Not shared yet: `make_mut` does not copy.
    for o in &mut objects.device_classes {
        let o = Arc::make_mut(o);
        stamp(&mut o.metadata, &o.spec);
    }
    // ResourceClaimTemplates and ResourceQuotas carry theirs from `namespace_objects` already.
    for o in &mut objects.admission_policies {
        let o = Arc::make_mut(o);
        stamp(&mut o.metadata, &o.spec);
    }
    for o in &mut objects.admission_bindings {
        let o = Arc::make_mut(o);
        stamp(&mut o.metadata, &o.spec);
    }
}

/// Per sharing policy, the devices it matches that are allocated outside teams, each with the
/// claim holding it.
fn used_outside_teams<'u>(
    usage: &'u BTreeMap<String, (u64, usage::Usage)>,
    inventory: &Inventory,
    sets: &BTreeMap<String, &CompiledSelectors>,
) -> BTreeMap<String, BTreeMap<&'u inventory::DeviceId, &'u str>> {
    let mut outside: BTreeMap<String, BTreeMap<&inventory::DeviceId, &str>> = BTreeMap::new();
    for allocation in usage.values().flat_map(|(_, u)| &u.outside) {
        let key = inventory::PoolKey {
            driver: allocation.device.driver.clone(),
            pool: allocation.device.pool.clone(),
        };
        let Some(device) = inventory
            .pools()
            .get(&key)
            .and_then(|pool| pool.counted().find(|d| d.id == allocation.device))
        else {
            continue;
        };
        for (name, set) in sets {
            if set.matches(&device.env).unwrap_or(false) {
                outside
                    .entry(name.clone())
                    .or_default()
                    .insert(&allocation.device, &allocation.claim);
            }
        }
    }
    outside
}

fn sharing_report(
    policy: &CompiledPolicy,
    capacity: u32,
    outside: Option<&BTreeMap<&inventory::DeviceId, &str>>,
    matches: &inventory::MatchReport,
    inventory: &Inventory,
) -> SharingPolicyReport {
    let mut conds = Vec::new();
    match &policy.compiled {
        Ok(_) => conds.push(DesiredCondition::new(
            types::SELECTOR_VALID,
            true,
            "Compiled",
            "all selector expressions compile",
        )),
        Err(e) => conds.push(DesiredCondition::new(
            types::SELECTOR_VALID,
            false,
            "InvalidSelector",
            e.to_string(),
        )),
    }
    if policy.compiled.is_ok() {
        let found = capacity > 0;
        let slices = inventory.device_count();
        let message = match matches.errors.get(&policy.name) {
            Some(errors) => format!(
                "{capacity} devices match; the selectors failed to evaluate on {} devices",
                errors.devices
            ),
            None if found => format!("{capacity} devices match"),
            None => format!("the selectors match none of the {slices} published devices"),
        };
        conds.push(DesiredCondition::new(
            types::DEVICES_FOUND,
            found,
            if found {
                "DevicesMatched"
            } else {
                "NoMatchingDevices"
            },
            message,
        ));
        let overlapping: Vec<String> = matches
            .overlap_pairs
            .iter()
            .filter_map(|((a, b), n)| {
                if a == &policy.name {
                    Some(format!("{b} ({n} devices)"))
                } else if b == &policy.name {
                    Some(format!("{a} ({n} devices)"))
                } else {
                    None
                }
            })
            .collect();
        let used_outside = outside.map_or(0, |o| clamp(o.len() as u64));
        conds.push(match outside.filter(|o| !o.is_empty()) {
            Some(o) => {
                let claims: BTreeSet<&str> = o.values().copied().collect();
                let shown: Vec<&str> = claims.iter().copied().take(5).collect();
                let more = claims.len() - shown.len();
                DesiredCondition::new(
                    types::USED_OUTSIDE_TEAMS,
                    true,
                    "AllocatedOutsideTeams",
                    format!(
                        "{used_outside} of {capacity} matching devices are allocated through other DeviceClasses, to {}{}: teams share the other {}",
                        shown.join(", "),
                        if more > 0 { format!(" and {more} more claims") } else { String::new() },
                        capacity.saturating_sub(used_outside)
                    ),
                )
            }
            None => DesiredCondition::new(
                types::USED_OUTSIDE_TEAMS,
                false,
                "NoneOutsideTeams",
                "no matching device is allocated outside teams",
            ),
        });
        conds.push(if overlapping.is_empty() {
            DesiredCondition::new(
                types::OVERLAPPING,
                false,
                "NoOverlap",
                "no other GpuSharingPolicy matches the same devices",
            )
        } else {
            DesiredCondition::new(
                types::OVERLAPPING,
                true,
                "DevicesShared",
                format!("devices also match {}", overlapping.join(", ")),
            )
        });
    }
    let class = device_class_name(&policy.name);
    conds.push(if policy.foreign_class {
        DesiredCondition::new(
            types::DEVICE_CLASS_CONFLICT,
            true,
            "NotManaged",
            format!("DeviceClass {class} exists and is not managed by teamgpu; it is left alone"),
        )
    } else {
        DesiredCondition::new(
            types::DEVICE_CLASS_CONFLICT,
            false,
            "Managed",
            format!("DeviceClass {class} is managed by teamgpu"),
        )
    });
    let spec = &policy.policy.spec;
    let unsupported =
        spec.driver != DEFAULT_DRIVER && spec.sharing.strategy != SharingStrategy::Exclusive;
    let ready = policy.usable() && !unsupported;
    let (reason, message) = if !ready {
        match (&policy.compiled, policy.foreign_class) {
            (Err(_), _) => (
                "InvalidSelector",
                "the selector is invalid; the last applied DeviceClass is kept".to_owned(),
            ),
            (_, true) => (
                "DeviceClassConflict",
                format!("DeviceClass {class} belongs to someone else"),
            ),
            _ => (
                "SharingUnsupported",
                format!(
                    "sharing strategy {:?} is only configured for driver {DEFAULT_DRIVER}",
                    spec.sharing.strategy
                ),
            ),
        }
    } else {
        (
            "Planned",
            format!("DeviceClass {class} selects {capacity} devices"),
        )
    };
    conds.push(DesiredCondition::new(types::READY, ready, reason, message));
    SharingPolicyReport {
        name: policy.name.clone(),
        generation: policy.policy.metadata.generation,
        device_class: class,
        capacity,
        used_outside_teams: outside.map_or(0, |o| clamp(o.len() as u64)),
        conditions: conds,
    }
}

fn team_report(
    team: &TeamGpuPolicy,
    membership: &Membership,
    by_name: &BTreeMap<&str, &CompiledPolicy>,
    shares: &BTreeMap<&str, &PoolShares>,
    usage: &dyn Fn(&str, &str) -> usage::ClassUsage,
) -> TeamReport {
    let name = name_of(team);
    let namespaces = membership
        .namespaces
        .get(&name)
        .cloned()
        .unwrap_or_default();
    let mut quotas = Vec::new();
    let mut unknown = Vec::new();
    let mut scaled = Vec::new();
    for quota in &team.spec.quotas {
        let weight = quota.weight.unwrap_or(team.spec.weight);
        let share = shares
            .get(quota.sharing_policy.as_str())
            .and_then(|pool| Some((pool.capacity, pool.teams.iter().find(|t| t.team == name)?)));
        if !by_name
            .get(quota.sharing_policy.as_str())
            .is_some_and(|p| p.usable())
        {
            unknown.push(quota.sharing_policy.clone());
        }
        let class = device_class_name(&quota.sharing_policy);
        let status = match share {
            Some((capacity, s)) => {
                if s.scaled_down {
                    scaled.push(format!(
                        "{}: {} of {} guaranteed",
                        quota.sharing_policy, s.effective_guarantee, s.guaranteed
                    ));
                }
                QuotaStatus {
                    sharing_policy: quota.sharing_policy.clone(),
                    guaranteed: quota.guaranteed,
                    effective_guarantee: s.effective_guarantee,
                    limit: quota.effective_limit(),
                    weight,
                    capacity,
                    entitlement: s.entitlement,
                    borrowed: s.borrowed,
                    requested: s.requested,
                    allocated: s.allocated,
                    pending: s.pending,
                    reserved: s.reserved,
                    explanation: s.explanation.to_string(),
                }
            }
            None => QuotaStatus {
                sharing_policy: quota.sharing_policy.clone(),
                guaranteed: quota.guaranteed,
                limit: quota.effective_limit(),
                weight,
                requested: namespaces
                    .iter()
                    .map(|ns| clamp(usage(ns, &class).requested))
                    .sum(),
                allocated: namespaces
                    .iter()
                    .map(|ns| clamp(usage(ns, &class).allocated))
                    .sum(),
                explanation: if namespaces.is_empty() {
                    "the team owns no namespace".into()
                } else {
                    format!(
                        "GpuSharingPolicy {} is missing or not ready: no devices",
                        quota.sharing_policy
                    )
                },
                ..QuotaStatus::default()
            },
        };
        quotas.push(status);
    }
    quotas.sort_by(|a, b| a.sharing_policy.cmp(&b.sharing_policy));

    let mut conds = Vec::new();
    let conflicts = membership.conflicts.get(&name);
    conds.push(match conflicts {
        Some(c) if !c.is_empty() => DesiredCondition::new(
            types::CONFLICT,
            true,
            "NamespaceClaimedTwice",
            c.iter()
                .map(|(ns, others)| {
                    format!("namespace {ns} is also claimed by {}", others.join(", "))
                })
                .collect::<Vec<_>>()
                .join("; ")
                + ": such namespaces belong to no team until the overlap is resolved",
        ),
        _ => DesiredCondition::new(
            types::CONFLICT,
            false,
            "NoConflict",
            "no namespace is claimed by another team",
        ),
    });
    conds.push(if scaled.is_empty() {
        DesiredCondition::new(
            types::OVERCOMMITTED,
            false,
            "GuaranteesFit",
            "every guarantee fits its pool's capacity",
        )
    } else {
        DesiredCondition::new(
            types::OVERCOMMITTED,
            true,
            "GuaranteesScaledDown",
            format!(
                "guarantees exceed capacity, scaled in proportion: {}",
                scaled.join("; ")
            ),
        )
    });
    conds.push(if unknown.is_empty() {
        DesiredCondition::new(
            types::SHARING_POLICIES_RESOLVED,
            true,
            "AllFound",
            "every quota names a ready GpuSharingPolicy",
        )
    } else {
        DesiredCondition::new(
            types::SHARING_POLICIES_RESOLVED,
            false,
            "SharingPolicyNotReady",
            format!(
                "quotas name GpuSharingPolicies that are missing or not ready: {}",
                unknown.join(", ")
            ),
        )
    });
    let selector_error = membership.selector_errors.get(&name);
    let (ready, reason, message) = match selector_error {
        Some(e) => (
            false,
            "InvalidNamespaceSelector",
            format!("namespaceSelector: {e}"),
        ),
        None if !unknown.is_empty() => (
            false,
            "SharingPolicyNotReady",
            format!("no devices for {}", unknown.join(", ")),
        ),
        None if namespaces.is_empty() => (
            false,
            "NoNamespaces",
            "no namespace belongs to the team".to_owned(),
        ),
        None => (
            true,
            "Planned",
            format!(
                "quotas and templates planned in {} namespaces",
                namespaces.len()
            ),
        ),
    };
    let mut message = message;
    if let Some(missing) = membership.missing.get(&name) {
        message.push_str(&format!(
            "; listed namespaces not found: {}",
            missing.join(", ")
        ));
    }
    conds.push(DesiredCondition::new(types::READY, ready, reason, message));
    TeamReport {
        name,
        generation: team.metadata.generation,
        weight: team.spec.weight,
        namespaces,
        quotas,
        conditions: conds,
    }
}
