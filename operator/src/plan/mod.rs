//! The planning core: from the cluster's state as plain data to every object teamgpu must make
//! exist and the status of every policy. Pure and deterministic: the same state gives the same
//! plan, byte for byte. Needs no client.
//!
//! Steps, top to bottom in [`plan`]: selectors -> inventory -> governed classes -> membership ->
//! usage -> fair shares -> objects -> statuses.

pub mod admission;
pub mod conditions;
pub mod device_cel;
pub mod inventory;
pub mod membership;
pub mod objects;
pub mod pending;
pub mod selector;
pub mod usage;

use std::collections::{BTreeMap, BTreeSet};

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
use crate::fairshare::{self, NamespaceUsage, PoolInput, PoolShares, TeamInput};
use conditions::{DesiredCondition, types};
use device_cel::CompiledSelectors;
use inventory::Inventory;
use membership::Membership;
pub use membership::NamespaceInfo;
use objects::{MANAGED_BY, MANAGED_BY_LABEL, device_class_name, is_teamgpu_class};
use usage::quota_resource_name as quota_resource;

/// Devices a namespace's Pods wait for, per DeviceClass (observed by the controller from pending
/// Pods whose claims could not be created or allocated).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PendingDemand {
    pub namespace: String,
    pub device_class: String,
    pub devices: u32,
}

/// Everything the planner reads.
#[derive(Clone, Debug, Default)]
pub struct ClusterState {
    pub sharing_policies: Vec<GpuSharingPolicy>,
    pub teams: Vec<TeamGpuPolicy>,
    pub namespaces: Vec<NamespaceInfo>,
    /// All DeviceClasses in the cluster, not only teamgpu's.
    pub device_classes: Vec<DeviceClass>,
    pub slices: Vec<ResourceSlice>,
    pub claims: Vec<ResourceClaim>,
    pub pending: Vec<PendingDemand>,
}

/// Every object teamgpu wants to exist. Objects with teamgpu's managed-by label that are not
/// here (and not in `retained_device_classes`) are to be deleted.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DesiredObjects {
    pub device_classes: Vec<DeviceClass>,
    pub claim_templates: Vec<ResourceClaimTemplate>,
    pub resource_quotas: Vec<ResourceQuota>,
    pub admission_policies: Vec<ValidatingAdmissionPolicy>,
    pub admission_bindings: Vec<ValidatingAdmissionPolicyBinding>,
    /// DeviceClasses of policies whose spec is invalid now: kept as they are rather than applied
    /// or pruned, so a typo never takes a class away from running workloads.
    pub retained_device_classes: BTreeSet<String>,
}

/// What the planner concluded about one GpuSharingPolicy.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SharingPolicyReport {
    pub name: String,
    pub generation: Option<i64>,
    pub device_class: String,
    pub capacity: u32,
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
    compiled: Result<(), device_cel::SelectorError>,
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
    let inventory = Inventory::from_slices(&state.slices);
    plan_with_inventory(state, &inventory)
}

/// Compute the plan with an inventory built before (the controller keeps one up to date).
pub fn plan_with_inventory(state: &ClusterState, inventory: &Inventory) -> Plan {
    plan_cached(state, inventory, &mut MatchCache::default())
}

/// The devices each sharing policy matched, kept between plans: matching every device against
/// every selector is the costliest step, and only a change of the inventory or of a policy's
/// selectors changes its result (a claim or namespace change does not).
#[derive(Debug, Default)]
pub struct MatchCache {
    /// The inventory's identity (the controller's fingerprint of its ResourceSlices) and the
    /// selectors the report was computed for.
    key: Option<(u64, BTreeMap<String, Vec<String>>)>,
    report: inventory::MatchReport,
    /// Which inventory the cache is for; set by the caller.
    pub inventory_id: u64,
}

/// [`plan_with_inventory`], reusing the device matching of the previous plan when neither the
/// inventory (`cache.inventory_id`) nor any selector changed.
pub fn plan_cached(state: &ClusterState, inventory: &Inventory, cache: &mut MatchCache) -> Plan {
    let mut out = Plan::default();

    // 1. Selectors.
    let mut sharing: Vec<&GpuSharingPolicy> = state.sharing_policies.iter().collect();
    sharing.sort_by_key(|p| name_of(*p));
    let live_classes: BTreeMap<String, &DeviceClass> = state
        .device_classes
        .iter()
        .map(|c| (name_of(c), c))
        .collect();
    // Compiled selectors by policy name, for the policies whose selectors compile.
    let mut sets: BTreeMap<String, CompiledSelectors> = BTreeMap::new();
    let policies: Vec<CompiledPolicy> = sharing
        .into_iter()
        .map(|policy| {
            let name = name_of(policy);
            let selectors = selector::device_class_selectors(&policy.spec);
            let compiled = CompiledSelectors::compile(&selectors).map(|c| {
                sets.insert(name.clone(), c);
            });
            let foreign_class = live_classes
                .get(&device_class_name(&name))
                .is_some_and(|c| !is_managed(c));
            CompiledPolicy {
                policy,
                name,
                selectors,
                compiled,
                foreign_class,
            }
        })
        .collect();
    let by_name: BTreeMap<&str, &CompiledPolicy> =
        policies.iter().map(|p| (p.name.as_str(), p)).collect();

    // 2. Inventory: capacity per policy.
    let key = (
        cache.inventory_id,
        policies
            .iter()
            .filter(|p| p.compiled.is_ok())
            .map(|p| (p.name.clone(), p.selectors.clone()))
            .collect(),
    );
    if cache.key.as_ref() != Some(&key) {
        cache.report = inventory.match_sets(&sets);
        cache.key = Some(key);
    }
    let matches = &cache.report;
    let capacity = |name: &str| matches.counts.get(name).copied().unwrap_or(0);
    for pool in inventory.incomplete_pools() {
        out.warnings.push(format!(
            "pool {} of driver {} is incomplete (not all of its ResourceSlices are published): its devices are not counted",
            pool.pool, pool.driver
        ));
    }

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
        let selects_governed = inventory::class_selectors(class).is_ok_and(|compiled| {
            inventory.counted().any(|d| {
                compiled.matches(&d.env).unwrap_or(false)
                    && sets.values().any(|p| p.matches(&d.env).unwrap_or(false))
            })
        });
        if names_driver || selects_governed {
            governed_foreign.insert(name, class.spec.extended_resource_name.clone());
        }
    }

    // 4. Membership.
    let mut teams: Vec<&TeamGpuPolicy> = state.teams.iter().collect();
    teams.sort_by_key(|t| name_of(*t));
    let membership: Membership = membership::resolve(&state.teams, &state.namespaces);

    // 5. Usage per (namespace, class).
    let usage = usage::Usage::from_claims(&state.claims);
    let mut pending: BTreeMap<(&str, &str), u32> = BTreeMap::new();
    for p in &state.pending {
        *pending
            .entry((p.namespace.as_str(), p.device_class.as_str()))
            .or_default() += p.devices;
    }
    let ns_usage = |namespace: &str, class: &str| NamespaceUsage {
        namespace: namespace.to_owned(),
        requested: clamp(usage.get(namespace, class).requested),
        allocated: clamp(usage.get(namespace, class).allocated),
        pending: pending.get(&(namespace, class)).copied().unwrap_or(0),
    };

    // 6. Fair shares, one pool per usable sharing policy.
    let mut shares: BTreeMap<&str, PoolShares> = BTreeMap::new();
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
                    namespaces: namespaces.iter().map(|ns| ns_usage(ns, &class)).collect(),
                })
            })
            .collect();
        let pool = fairshare::compute_pool(&PoolInput {
            capacity: capacity(&policy.name),
            teams: pool_teams,
        });
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
        shares.insert(policy.name.as_str(), pool);
    }

    // 7. Objects.
    for policy in &policies {
        match (&policy.compiled, policy.foreign_class) {
            (Ok(_), false) => out
                .objects
                .device_classes
                .push(objects::device_class(policy.policy, &policy.selectors)),
            (Err(_), false) => {
                out.objects
                    .retained_device_classes
                    .insert(device_class_name(&policy.name));
            }
            (_, true) => {}
        }
    }
    // Every class a team without a quota for it must get a hard of 0 for.
    let governed_all: BTreeMap<String, Option<String>> = policies
        .iter()
        .filter(|p| p.usable())
        .map(|p| (device_class_name(&p.name), None))
        .chain(governed_foreign.clone())
        .collect();
    // Each policy's templates are the same in every namespace: built (and hashed) once.
    let shapes: BTreeMap<&str, Vec<objects::TemplateShape>> = policies
        .iter()
        .filter(|p| p.usable())
        .map(|p| (p.name.as_str(), objects::template_shapes(p.policy)))
        .collect();
    for team in &teams {
        let team_name = name_of(*team);
        let namespaces = membership
            .namespaces
            .get(&team_name)
            .cloned()
            .unwrap_or_default();
        for namespace in &namespaces {
            let mut hard: BTreeMap<String, u32> = BTreeMap::new();
            for (class, extended) in &governed_all {
                hard.insert(quota_resource(class), 0);
                if let Some(extended) = extended {
                    hard.insert(format!("requests.{extended}"), 0);
                }
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
                out.objects
                    .claim_templates
                    .extend(objects::claim_templates(team, shapes, namespace));
            }
            out.objects
                .resource_quotas
                .push(objects::resource_quota(team, namespace, &hard));
        }
        if let Some(binding) = admission::team_binding(team, &namespaces) {
            out.objects.admission_bindings.push(binding);
        }
    }
    if !state.sharing_policies.is_empty() || !state.teams.is_empty() {
        let foreign: BTreeSet<String> = governed_foreign.keys().cloned().collect();
        out.objects
            .admission_policies
            .push(admission::team_policy(&foreign));
        out.objects
            .admission_policies
            .push(admission::non_team_policy());
        out.objects
            .admission_bindings
            .push(admission::non_team_binding(
                &membership.all_team_namespaces(),
            ));
    }

    stamp_content_hashes(&mut out.objects);

    // 8. Reports.
    for policy in &policies {
        out.sharing_policies.push(sharing_report(
            policy,
            capacity(&policy.name),
            matches,
            inventory,
        ));
    }
    for team in &teams {
        out.teams
            .push(team_report(team, &membership, &by_name, &shares, &usage));
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

/// Every object carries the hash of its spec, so the writer can tell a changed object from one
/// whose spec the server merely defaulted (and a ResourceClaimTemplate, whose spec is immutable,
/// must be recreated).
fn stamp_content_hashes(objects: &mut DesiredObjects) {
    fn stamp<S: serde::Serialize>(
        meta: &mut k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
        spec: &S,
    ) {
        meta.annotations.get_or_insert_with(BTreeMap::new).insert(
            objects::CONTENT_HASH_ANNOTATION.to_owned(),
            objects::content_hash(spec),
        );
    }
    for o in &mut objects.device_classes {
        stamp(&mut o.metadata, &o.spec);
    }
    // ResourceClaimTemplates carry theirs from `objects::claim_templates` already.
    for o in &mut objects.resource_quotas {
        stamp(&mut o.metadata, &o.spec);
    }
    for o in &mut objects.admission_policies {
        stamp(&mut o.metadata, &o.spec);
    }
    for o in &mut objects.admission_bindings {
        stamp(&mut o.metadata, &o.spec);
    }
}

fn sharing_report(
    policy: &CompiledPolicy,
    capacity: u32,
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
        let slices = inventory.devices.len();
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
        conditions: conds,
    }
}

fn team_report(
    team: &TeamGpuPolicy,
    membership: &Membership,
    by_name: &BTreeMap<&str, &CompiledPolicy>,
    shares: &BTreeMap<&str, PoolShares>,
    usage: &usage::Usage,
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
                    .map(|ns| clamp(usage.get(ns, &class).requested))
                    .sum(),
                allocated: namespaces
                    .iter()
                    .map(|ns| clamp(usage.get(ns, &class).allocated))
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
