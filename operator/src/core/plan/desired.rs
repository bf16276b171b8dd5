//! Phase 5, the desired objects: a DeviceClass per usable policy, claim templates and a quota in
//! every team namespace, and the admission policies and bindings. The builders of each object
//! are in [`super::objects`], [`super::admission`] and [`super::namespace_admission`].

use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaimTemplate};

use super::cache::{Cache, fingerprint, owners_key};
use super::identity::name_of;
use super::membership::Membership;
use super::objects::{
    self, OWN_GPUS_ANNOTATION_PREFIX, SLICE_ANNOTATION_PREFIX, TemplateShape, device_class_name,
    is_managed,
};
use super::objects::{NamespacedQuota, NamespacedTemplate};
use super::outside_teams::KeptGuard;
use super::policies::CompiledPolicy;
use super::team_gpus::{self, TeamGpus};
use super::types::DesiredObjects;
use super::usage::quota_resource_name as quota_resource;
use super::{admission, department_admission, namespace_admission, rbac};
use crate::api::TeamGpuPolicy;
use crate::core::fairshare::{PoolShares, TeamShare};
use crate::core::state::ClusterState;

/// What the objects are made of.
pub struct Inputs<'a> {
    pub state: &'a ClusterState,
    pub policies: &'a [CompiledPolicy<'a>],
    pub live_classes: &'a BTreeMap<String, &'a DeviceClass>,
    /// DeviceClasses not teamgpu's that select governed devices, with their extended resource.
    pub governed_foreign: &'a BTreeMap<String, Option<String>>,
    pub teams: &'a [&'a TeamGpuPolicy],
    pub membership: &'a Membership,
    pub shares: &'a BTreeMap<&'a str, &'a PoolShares>,
    /// Per policy of `placement: TeamGpus`, the GPUs of each team.
    pub team_gpus: &'a BTreeMap<String, TeamGpus>,
}

/// The objects of teams, kept until what they are made of changes: a team's claim templates
/// (without namespace), and the templates and quotas of all its namespaces.
#[derive(Debug, Default)]
pub struct Kept {
    templates: Cache<String, u64, Vec<Arc<ResourceClaimTemplate>>>,
    teams: Cache<String, TeamInput, TeamObjects>,
    /// The non-team admission policy, by a fingerprint of what it is made of.
    non_team: Cache<(), u64, Arc<ValidatingAdmissionPolicy>>,
    outside: KeptGuard,
}

/// What a team's namespace objects are made of: the team, its templates, its quota's
/// annotations, the classes every quota names and its namespaces ([`TeamInput::identity`]), and
/// the devices each namespace may hold of each class (`hards`, namespace by namespace). A claim
/// changes the hards of the teams in its pool only: every other team's objects are handed out
/// as they were, without a look at their namespaces.
#[derive(Debug, PartialEq)]
struct TeamInput {
    identity: u64,
    hards: Vec<u32>,
}

/// A team's templates and quotas in all its namespaces, in namespace order, and per namespace
/// the identity of what its objects were made of (kept when only other namespaces change).
/// The two lists repeat what `namespaces` holds: every pass hands them out for every team, and
/// a slice is cheaper to copy from than a walk over a map of 100 namespaces.
#[derive(Debug, Default)]
struct TeamObjects {
    templates: Vec<NamespacedTemplate>,
    quotas: Vec<Arc<NamespacedQuota>>,
    namespaces: BTreeMap<String, (u64, NamespaceObjects)>,
}

/// A team namespace's claim templates and quota.
type NamespaceObjects = (Vec<NamespacedTemplate>, Arc<NamespacedQuota>);

impl Kept {
    pub fn new(keep: bool) -> Self {
        Self {
            templates: Cache::new(keep),
            teams: Cache::new(keep),
            non_team: Cache::new(keep),
            outside: KeptGuard::new(keep),
        }
    }
}

/// Every object teamgpu wants to exist, each stamped with the hash of its spec.
pub fn objects(inputs: &Inputs, kept: &mut Kept) -> DesiredObjects {
    let mut out = DesiredObjects::default();
    device_classes(inputs, &mut out);
    // Every class a team without a quota for it must get a hard of 0 for. A retained class
    // gets 0 in every team namespace: what runs keeps running, nothing new is admitted until
    // its policy is fixed (no quota entry would mean no limit at all).
    let governed: BTreeMap<String, Option<String>> = inputs
        .policies
        .iter()
        .filter(|p| p.usable())
        .map(|p| (device_class_name(&p.name), None))
        .chain(
            out.retained_device_classes
                .iter()
                .map(|c| (c.clone(), None)),
        )
        .chain(inputs.governed_foreign.clone())
        .collect();
    // One copy of each resource name, shared by every quota.
    let zero_hard: Vec<Arc<str>> = governed
        .iter()
        .flat_map(|(class, extended)| {
            std::iter::once(quota_resource(class))
                .chain(extended.iter().map(|e| format!("requests.{e}")))
        })
        .map(Arc::from)
        .collect();
    // Each policy's templates are the same in every namespace: built (and hashed) once.
    let shapes: BTreeMap<&str, Vec<TemplateShape>> = inputs
        .policies
        .iter()
        .filter(|p| p.usable())
        .map(|p| (p.name.as_str(), objects::template_shapes(p.policy)))
        .collect();
    for team in inputs.teams {
        team_objects(inputs, kept, (team, &zero_hard, &shapes), &mut out);
    }
    kept.templates.sweep();
    kept.teams.sweep();
    // No owner left (the CRDs are being deleted): teamgpu is being uninstalled, and nothing it
    // enforced is to stay behind.
    let api_gone = inputs.state.crd_owners.as_ref().is_some_and(Vec::is_empty);
    if (!inputs.state.sharing_policies.is_empty() || !inputs.state.teams.is_empty()) && !api_gone {
        // A quota of 0 refuses in every mode: only when the bindings deny.
        if inputs.state.enforcement == admission::Enforcement::Deny {
            let (outside, owners) = (&inputs.membership.outside, inputs.state.crd_owners.as_ref());
            let resources = (&zero_hard[..], governed.keys());
            if let Some(guard) = kept.outside.get(outside, resources, owners) {
                out.resource_quotas.extend(guard.quotas.iter().cloned());
                out.outside_teams = Some(Arc::clone(&guard.outside));
            }
        }
        admission_objects(inputs, &governed, kept, &mut out);
    }
    kept.non_team.sweep();
    kept.outside.sweep();
    member_access(inputs.state, &mut out);
    stamp_content_hashes(&mut out);
    out
}

/// The DeviceClasses of usable policies, and those kept as they are: of a policy whose hardware
/// selector is invalid or that cannot be read. A typo never takes a class away from running
/// workloads. Also the owners whose objects are kept: teams that cannot be read.
fn device_classes(inputs: &Inputs, out: &mut DesiredObjects) {
    for policy in inputs.policies {
        match (&policy.compiled, policy.foreign_class) {
            (Ok(_), false) => out.device_classes.push(Arc::new(objects::device_class(
                policy.policy,
                &policy.expressions,
            ))),
            (Err(_), false) => {
                out.retained_device_classes
                    .insert(device_class_name(&policy.name));
            }
            (_, true) => {}
        }
    }
    for name in &inputs.state.unreadable_sharing_policies {
        if inputs
            .live_classes
            .get(&device_class_name(name))
            .is_none_or(|c| is_managed(*c))
        {
            out.retained_device_classes.insert(device_class_name(name));
        }
    }
    out.retained_owners = inputs
        .state
        .unreadable_teams
        .iter()
        .map(|t| format!("TeamGpuPolicy.{t}"))
        .collect();
}

/// The templates and quota of every namespace of `team` (the quota names the team's classes for
/// the team admission policy, which takes it as params).
fn team_objects(
    inputs: &Inputs,
    kept: &mut Kept,
    (team, zero_hard, shapes): (
        &TeamGpuPolicy,
        &[Arc<str>],
        &BTreeMap<&str, Vec<TemplateShape>>,
    ),
    out: &mut DesiredObjects,
) {
    let team_name = name_of(team);
    let namespaces: &[String] =
        (inputs.membership.namespaces.get(&team_name)).map_or(&[], |n| &n[..]);
    let usable: Vec<&CompiledPolicy> = team
        .spec
        .quotas
        .iter()
        .filter_map(|quota| {
            inputs
                .policies
                .iter()
                .find(|p| p.name == quota.sharing_policy && p.usable())
        })
        .collect();
    let (own_gpus, selected) = own_gpus(inputs, &team_name, &usable, shapes);
    let templates_of: Vec<(&str, &[TemplateShape])> = usable
        .iter()
        .map(|p| {
            let name = p.name.as_str();
            let shapes = (selected.get(name)).or_else(|| shapes.get(name));
            (name, shapes.map_or(&[][..], Vec::as_slice))
        })
        .collect();
    let templates_id = templates_identity(team, &templates_of);
    let templates = kept.templates.get(team_name.clone(), templates_id, |_| {
        templates_of
            .iter()
            .flat_map(|(_, shapes)| objects::claim_templates(team, shapes))
            .map(Arc::new)
            .collect()
    });
    let meta = Arc::new(team_quota_meta(team, &usable, own_gpus));
    // What every namespace's objects are made of, besides its hards.
    // The quota's annotations say the team's classes and its spec's quotas.
    let names = (&team.metadata.name, &team.metadata.uid);
    let made_of = fingerprint(&(names, &meta.annotations, templates_id));
    // Each class's resource and the team's shares in its pool, found once for all namespaces.
    let pools: Vec<(String, Option<&TeamShare>)> = (usable.iter())
        .map(|policy| {
            let pool = inputs.shares.get(policy.name.as_str());
            let share = pool.and_then(|pool| pool.teams.iter().find(|t| t.team == team_name));
            (quota_resource(&device_class_name(&policy.name)), share)
        })
        .collect();
    let hards: Vec<u32> = (namespaces.iter().enumerate())
        .flat_map(|(i, namespace)| {
            pools
                .iter()
                .map(move |(_, share)| hard_of(*share, i, namespace))
        })
        .collect();
    let input = TeamInput {
        identity: fingerprint(&(made_of, zero_hard, &namespaces)),
        hards,
    };
    let parts = TeamParts {
        meta,
        made_of,
        zero_hard,
        resources: pools.into_iter().map(|(resource, _)| resource).collect(),
        templates,
    };
    let team_objects = kept.teams.get_reusing(team_name, input, |input, before| {
        parts.objects(namespaces, &input.hards, before)
    });
    out.claim_templates
        .extend(team_objects.templates.iter().cloned());
    out.resource_quotas
        .extend(team_objects.quotas.iter().cloned());
}

/// The metadata of `team`'s quotas: its `usable` classes, and what its requests of some must be
/// (a memory slice, its own GPUs).
fn team_quota_meta(
    team: &TeamGpuPolicy,
    usable: &[&CompiledPolicy],
    own_gpus: BTreeMap<&str, String>,
) -> k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
    let classes: Vec<String> = usable.iter().map(|p| device_class_name(&p.name)).collect();
    // What the team's requests of a class must be, beside the grant of the class.
    let slices = (usable.iter()).filter_map(|p| {
        let key = format!("{SLICE_ANNOTATION_PREFIX}{}", device_class_name(&p.name));
        Some((key, p.slice()?.to_owned()))
    });
    let own_gpus = (own_gpus.into_iter()).map(|(policy, expression)| {
        let key = format!("{OWN_GPUS_ANNOTATION_PREFIX}{}", device_class_name(policy));
        (key, expression)
    });
    let rules: Vec<(String, String)> = slices.chain(own_gpus).collect();
    objects::quota_meta(team, &classes, &rules)
}

/// What all of a team's namespace objects are made of, besides each namespace's hards.
struct TeamParts<'a> {
    meta: Arc<k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta>,
    /// A hash of the team, its quota's annotations and its templates.
    made_of: u64,
    /// Every governed resource, each a hard of 0 unless the team has a quota for it.
    zero_hard: &'a [Arc<str>],
    /// The quota resource of each of the team's usable classes.
    resources: Vec<String>,
    templates: &'a [Arc<ResourceClaimTemplate>],
}

impl TeamParts<'_> {
    /// The objects of `namespaces`, the hards of the i-th at `hards[i * resources..]`; a
    /// namespace whose objects are made of what they were `before` keeps them.
    fn objects(
        &self,
        namespaces: &[String],
        hards: &[u32],
        before: Option<TeamObjects>,
    ) -> TeamObjects {
        let mut before = before.map(|b| b.namespaces).unwrap_or_default();
        let mut made = TeamObjects::default();
        let per_namespace = self.resources.len();
        for (i, namespace) in namespaces.iter().enumerate() {
            let ns_hards = &hards[i * per_namespace..][..per_namespace];
            let mut hard: BTreeMap<Arc<str>, u32> =
                self.zero_hard.iter().map(|r| (r.clone(), 0)).collect();
            for (resource, ns_hard) in self.resources.iter().zip(ns_hards) {
                match hard.get_mut(resource.as_str()) {
                    Some(devices) => *devices = *ns_hard,
                    None => {
                        hard.insert(Arc::from(resource.as_str()), *ns_hard);
                    }
                }
            }
            let identity = fingerprint(&(self.made_of, &hard));
            let objects = match before.remove(namespace) {
                Some((kept, objects)) if kept == identity => objects,
                _ => namespace_objects(&self.meta, namespace, &hard, self.templates),
            };
            made.templates.extend(objects.0.iter().cloned());
            made.quotas.push(objects.1.clone());
            made.namespaces
                .insert(namespace.clone(), (identity, objects));
        }
        made
    }
}

/// The devices the `i`th of a team's namespaces, `namespace`, may hold by the team's `share`
/// of a pool (0 without one). The shares list the team's namespaces in the same order.
fn hard_of(share: Option<&TeamShare>, i: usize, namespace: &str) -> u32 {
    let Some(share) = share else { return 0 };
    let at = share.namespaces.get(i).filter(|n| n.namespace == namespace);
    (at.or_else(|| share.namespaces.iter().find(|n| n.namespace == namespace)))
        .map_or(0, |n| n.hard)
}

/// A policy whose teams get GPUs of their own: the CEL that selects `team`'s GPUs (which its
/// quota names for the admission policy), and the team's templates that select them.
type OwnGpus<'a> = (
    BTreeMap<&'a str, String>,
    BTreeMap<&'a str, Vec<TemplateShape>>,
);

fn own_gpus<'a>(
    inputs: &Inputs,
    team: &str,
    usable: &[&'a CompiledPolicy],
    shapes: &BTreeMap<&str, Vec<TemplateShape>>,
) -> OwnGpus<'a> {
    let expressions: BTreeMap<&str, String> = (usable.iter())
        .filter_map(|p| {
            let gpus = inputs.team_gpus.get(&p.name)?;
            let uuids = gpus.teams.get(team).map_or(&[][..], |o| &o.uuids);
            let expression = team_gpus::expression(&p.policy.spec.driver, uuids);
            Some((p.name.as_str(), expression))
        })
        .collect();
    let selected = (expressions.iter())
        .filter_map(|(policy, expression)| {
            let shapes = shapes.get(policy)?;
            Some((*policy, objects::selecting(shapes, expression)))
        })
        .collect();
    (expressions, selected)
}

/// Identity of what a team's templates are made of.
fn templates_identity(team: &TeamGpuPolicy, shapes: &[(&str, &[TemplateShape])]) -> u64 {
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

/// A team namespace's claim templates (the team's, in this namespace) and its quota.
fn namespace_objects(
    quota_meta: &Arc<k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta>,
    namespace: &str,
    hard: &BTreeMap<Arc<str>, u32>,
    templates: &[Arc<ResourceClaimTemplate>],
) -> NamespaceObjects {
    let shared_namespace: Arc<str> = Arc::from(namespace);
    let templates = templates
        .iter()
        .map(|template| NamespacedTemplate {
            namespace: shared_namespace.clone(),
            template: template.clone(),
        })
        .collect();
    let quota = objects::resource_quota(quota_meta.clone(), namespace, hard);
    (templates, Arc::new(quota))
}

/// The admission policies (team, non-team, namespace membership) and their cluster-wide
/// bindings.
fn admission_objects(
    inputs: &Inputs,
    governed: &BTreeMap<String, Option<String>>,
    kept: &mut Kept,
    out: &mut DesiredObjects,
) {
    let state = inputs.state;
    let classes = admission::GovernedClasses {
        foreign: inputs.governed_foreign.keys().cloned().collect(),
        extended: governed
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
    let admin_groups = state.admin_groups.clone().unwrap_or_else(|| {
        namespace_admission::DEFAULT_ADMIN_GROUPS
            .map(str::to_owned)
            .to_vec()
    });
    // Owned by the CRDs: the garbage collector deletes them with the CRDs, also when no
    // operator runs any more to prune them. Each stamped with the hash of its spec.
    let owners = state.crd_owners.as_ref();
    let policy = |mut p: ValidatingAdmissionPolicy| {
        p.metadata.owner_references = owners.cloned();
        stamp(&mut p.metadata, &p.spec);
        Arc::new(p)
    };
    let binding = |mut b: ValidatingAdmissionPolicyBinding| {
        b.metadata.owner_references = owners.cloned();
        stamp(&mut b.metadata, &b.spec);
        Arc::new(b)
    };
    // The non-team policy lists every team namespace (10,000 at the Kubernetes limit): built,
    // serialized and hashed again only when what it is made of changes, not at every claim.
    let owned_by = owners_key(owners);
    let made_of = fingerprint(&(&classes, operator, &inputs.membership.namespaces, owned_by));
    let non_team = kept.non_team.get((), made_of, |_| {
        let namespaces = inputs.membership.all_team_namespaces();
        policy(admission::non_team_policy(&classes, operator, &namespaces))
    });
    out.admission_policies.extend([
        policy(admission::team_policy(&classes, operator)),
        Arc::clone(non_team),
        policy(namespace_admission::membership_policy(
            &admin_groups,
            operator,
        )),
        policy(namespace_admission::exemption_policy(
            &admin_groups,
            operator,
        )),
    ]);
    let mode = state.enforcement;
    let guarded = out.outside_teams.as_ref().map(|o| o.label.clone());
    let guarded = guarded.as_deref();
    out.admission_bindings.extend([
        binding(admission::team_binding(mode)),
        binding(namespace_admission::membership_binding(mode)),
        binding(namespace_admission::exemption_binding(mode)),
        binding(admission::non_team_binding(mode, guarded)),
    ]);
    // Delegation and overcommit of departments: nothing to check in a flat cluster.
    if state.teams.iter().any(|t| t.spec.department) {
        out.admission_policies.extend([
            policy(department_admission::department_policy(
                &admin_groups,
                operator,
            )),
            policy(department_admission::top_level_policy(
                &admin_groups,
                operator,
            )),
        ]);
        out.admission_bindings.extend([
            binding(department_admission::department_binding(mode)),
            binding(department_admission::top_level_binding(mode)),
        ]);
    }
}

/// The ClusterRole and ClusterRoleBinding of every team with members: they read their team.
/// Teams that cannot be read keep theirs (`retained_owners`).
fn member_access(state: &ClusterState, out: &mut DesiredObjects) {
    let mut teams: Vec<&TeamGpuPolicy> = state.teams.iter().collect();
    // In name order: the plan is the same whatever order the teams came in.
    teams.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    for team in teams {
        if let Some((role, binding)) = rbac::member_access(team) {
            out.member_roles.push(Arc::new(role));
            out.member_bindings.push(Arc::new(binding));
        }
    }
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

/// Every object carries the hash of its spec, so the differ can tell a changed object from one
/// whose spec the server merely defaulted (and a ResourceClaimTemplate, whose spec is immutable,
/// must be recreated).
fn stamp_content_hashes(objects: &mut DesiredObjects) {
    // Not shared yet: `make_mut` does not copy.
    for o in &mut objects.device_classes {
        let o = Arc::make_mut(o);
        stamp(&mut o.metadata, &o.spec);
    }
    // ResourceClaimTemplates and ResourceQuotas carry theirs from `namespace_objects` already,
    // admission objects from `admission_objects`.
    for o in &mut objects.member_roles {
        let o = Arc::make_mut(o);
        stamp(&mut o.metadata, &o.rules);
    }
    for o in &mut objects.member_bindings {
        let o = Arc::make_mut(o);
        stamp(&mut o.metadata, &(&o.role_ref, &o.subjects));
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

    fn crd(name: &str, uid: &str) -> OwnerReference {
        OwnerReference {
            api_version: "apiextensions.k8s.io/v1".into(),
            kind: "CustomResourceDefinition".into(),
            name: name.into(),
            uid: uid.into(),
            ..OwnerReference::default()
        }
    }

    #[test]
    fn admission_objects_belong_to_the_crds_and_go_with_them() {
        let mut state = crate::cli::example::state().unwrap();
        let owners = vec![
            crd("gpusharingpolicies.teamgpu.io", "uid-1"),
            crd("teamgpupolicies.teamgpu.io", "uid-2"),
        ];
        state.crd_owners = Some(owners.clone());
        let objects = super::super::plan(&state).objects;
        assert_eq!(objects.admission_policies.len(), 4);
        assert_eq!(objects.admission_bindings.len(), 4);
        let metas = objects
            .admission_policies
            .iter()
            .map(|p| &p.metadata)
            .chain(objects.admission_bindings.iter().map(|b| &b.metadata));
        for meta in metas {
            assert_eq!(meta.owner_references.as_ref(), Some(&owners), "{meta:?}");
        }
        // The CRDs are gone: nothing teamgpu enforced stays, what runs keeps its classes until
        // the garbage collector takes them with their policies.
        state.crd_owners = Some(Vec::new());
        let objects = super::super::plan(&state).objects;
        assert!(objects.admission_policies.is_empty());
        assert!(objects.admission_bindings.is_empty());
        assert!(!objects.device_classes.is_empty());
        // Planned from files: no owner, rather than one with a made-up uid.
        state.crd_owners = None;
        let objects = super::super::plan(&state).objects;
        assert!(
            objects
                .admission_bindings
                .iter()
                .all(|b| b.metadata.owner_references.is_none())
        );
    }
}
