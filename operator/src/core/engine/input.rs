//! What the engine takes in from the caches: plain data, given only when a cache's watch
//! changed: the whole cache, or for slices, claims, namespaces, Pods (pending or not) and owned
//! objects what changed since the last hand-over. Policies arrive as read (dynamic objects) and are read into their types
//! here: one that does not fit is reported on its status, never fatal.

use std::collections::HashMap;
use std::sync::Arc;

use k8s_openapi::api::resource::v1::DeviceClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::ResourceExt;
use kube::api::DynamicObject;

use super::{Engine, namespaces};
use crate::api::{GpuSharingPolicy, TeamGpuPolicy};
use crate::core::diff::{Kind, LiveObject, LiveView};
use crate::core::effects::reclaim::budgets::BudgetView;
use crate::core::effects::{Malformed, PodView, PolicyKind};
use crate::core::plan::inventory::SliceView;
use crate::core::plan::objects;
use crate::core::plan::pending::PendingPodView;
use crate::core::plan::taints::{self, TaintRuleView};
use crate::core::plan::usage::ClaimView;
use crate::core::state::{NamespaceView, Taken};
use crate::dra_cel::DeviceReads;

/// One cache as the watches keep it: whole, or (where it says so) what changed since the last
/// hand-over.
#[derive(Debug)]
pub enum Input {
    SharingPolicies(Vec<Arc<DynamicObject>>),
    Teams(Vec<Arc<DynamicObject>>),
    /// The namespaces: every one, or what changed.
    Namespaces(Taken<NamespaceView>),
    /// All DeviceClasses: foreign ones decide what is governed, teamgpu's are its own.
    DeviceClasses(Vec<Arc<DeviceClass>>),
    /// The ResourceSlices, projected to `reads`: every one, or what changed.
    Slices {
        reads: Arc<DeviceReads>,
        slices: Taken<SliceView>,
    },
    /// The ResourceClaims: every one, or what changed.
    Claims(Taken<ClaimView>),
    /// Pods in phase Pending, as pending demand reads them: every one, or what changed.
    PendingPods(Taken<PendingPodView>),
    /// Pods not done yet, as reclaim weighs them: every one, or what changed.
    Pods(Taken<PodView>),
    /// Every PodDisruptionBudget, for reclaim.
    Budgets(Vec<Arc<BudgetView>>),
    /// DeviceTaintRules (`None` for those whose taint keeps no claim off).
    TaintRules(Vec<Arc<Option<TaintRuleView>>>),
    /// The objects of `kind` that carry teamgpu's managed-by label (DeviceClasses come with
    /// [`Input::DeviceClasses`]): every one, or what changed.
    Owned {
        kind: Kind,
        objects: Taken<LiveView>,
    },
    /// teamgpu's CRDs that exist, as owners of the cluster-wide admission objects.
    CrdOwners(Vec<OwnerReference>),
    /// The slices are already being listed with these reads (asked before the engine ran).
    SliceListAsked(DeviceReads),
}

/// The custom resources teamgpu reads, each with its [`PolicyKind`].
pub trait Policy:
    kube::Resource<DynamicType = ()> + serde::de::DeserializeOwned + Clone + PartialEq
{
    const KIND: PolicyKind;

    /// Whether the planner reads the same of `self` and `other`: their specs and metadata, but
    /// not their statuses nor the metadata every write changes, so that teamgpu's own status
    /// writes coming back plan nothing again. Nothing is copied but the metadata (a status at
    /// 10,000 namespaces lists a hundred of them, and this runs at every status write).
    fn planned_eq(&self, other: &Self) -> bool;
}

/// The metadata as the planner reads it: without what every write changes.
fn planned_meta(meta: &kube::api::ObjectMeta) -> kube::api::ObjectMeta {
    kube::api::ObjectMeta {
        resource_version: None,
        managed_fields: None,
        ..meta.clone()
    }
}

impl Policy for GpuSharingPolicy {
    const KIND: PolicyKind = PolicyKind::GpuSharingPolicy;

    fn planned_eq(&self, other: &Self) -> bool {
        self.spec == other.spec && planned_meta(&self.metadata) == planned_meta(&other.metadata)
    }
}

impl Policy for TeamGpuPolicy {
    const KIND: PolicyKind = PolicyKind::TeamGpuPolicy;

    fn planned_eq(&self, other: &Self) -> bool {
        self.spec == other.spec && planned_meta(&self.metadata) == planned_meta(&other.metadata)
    }
}

/// Every policy of `objects` not being deleted, read into its type, and the ones that do not
/// fit. A policy being deleted (waiting for finalizers or foreground deletion of its
/// dependents) is treated as gone: its objects are no longer wanted, its status not written.
pub fn parse_policies<K: Policy>(objects: &[Arc<DynamicObject>]) -> (Vec<K>, Vec<Malformed>) {
    let (parsed, malformed, _) = parse_policies_reusing(objects, Vec::new());
    (parsed, malformed)
}

/// [`parse_policies`], taking from `before` (the last policies read) each one whose
/// resourceVersion is the same, instead of copying and reading its object again: at 10,000
/// namespaces a team's status lists a hundred, and every status write of one team came back as
/// a read of all of them. Also whether the planner reads the same in the result as in `before`
/// ([`Policy::planned_eq`], place by place).
pub(super) fn parse_policies_reusing<K: Policy>(
    objects: &[Arc<DynamicObject>],
    before: Vec<K>,
) -> (Vec<K>, Vec<Malformed>, bool) {
    let before_len = before.len();
    let mut before: Vec<Option<K>> = before.into_iter().map(Some).collect();
    let places: HashMap<String, usize> = (before.iter().enumerate())
        .filter_map(|(i, k)| Some((k.as_ref()?.meta().name.clone()?, i)))
        .collect();
    let mut malformed = Vec::new();
    let mut parsed = Vec::with_capacity(objects.len());
    let mut same = true;
    for o in objects
        .iter()
        .filter(|o| o.metadata.deletion_timestamp.is_none())
    {
        let place = o
            .metadata
            .name
            .as_ref()
            .and_then(|n| places.get(n))
            .copied();
        let version = o.metadata.resource_version.as_ref();
        let kept = place.and_then(|i| {
            before[i]
                .take_if(|k| version.is_some() && k.meta().resource_version.as_ref() == version)
        });
        let policy = match kept {
            Some(kept) => kept,
            None => match (**o).clone().try_parse::<K>() {
                Ok(k) => {
                    let old = place.and_then(|i| before[i].as_ref());
                    same &= old.is_some_and(|old| old.planned_eq(&k));
                    k
                }
                Err(error) => {
                    malformed.push(Malformed {
                        object: (**o).clone(),
                        kind: K::KIND,
                        message: format!(
                            "the object cannot be read as a {}: {error}",
                            K::kind(&())
                        ),
                    });
                    continue;
                }
            },
        };
        same &= place == Some(parsed.len());
        parsed.push(policy);
    }
    same &= parsed.len() == before_len;
    (parsed, malformed, same)
}

impl Engine {
    /// Takes in one cache. Slices and claims go to the planner (one call each), owned objects
    /// to the differ; the rest is the planner's input. Whatever the planner reads that
    /// changed has the next pass plan again; the rest (owned objects, running Pods, policies
    /// whose status alone changed, pending Pods whose demand is the same: see [`Engine::pass`])
    /// is compared with the kept plan.
    ///
    /// Returns whether a pass has anything to do for it: `false` only for namespace changes
    /// that neither the planner nor the guard labels read (a label nothing selects by, such as
    /// a cost centre or Argo CD's tracking label), which the caller need not run a pass for.
    pub fn take_in(&mut self, input: Input) -> bool {
        let replan = !matches!(
            input,
            Input::Owned { .. }
                | Input::Pods(_)
                | Input::PendingPods(_)
                | Input::SliceListAsked(_)
                | Input::SharingPolicies(_)
                | Input::Teams(_)
                | Input::Namespaces(_)
        );
        self.replan |= replan;
        match input {
            Input::SharingPolicies(objects) => {
                let before = std::mem::take(&mut self.state.sharing_policies);
                let (policies, unreadable, same) = self.policies(&objects, before);
                self.replan |= !same || self.state.unreadable_sharing_policies != unreadable;
                self.state.sharing_policies = policies;
                self.state.unreadable_sharing_policies = unreadable;
            }
            Input::Teams(objects) => {
                let before = std::mem::take(&mut self.state.teams);
                let (teams, unreadable, same) = self.policies(&objects, before);
                self.replan |= !same || self.state.unreadable_teams != unreadable;
                self.state.teams = teams;
                self.state.unreadable_teams = unreadable;
            }
            Input::Namespaces(namespaces) => {
                let guarded = self.guard_labels.observe(namespaces.delta());
                let read = namespaces::planned_labels(&self.state.teams);
                let replan = self.namespaces.take_in(namespaces.delta(), &read);
                self.replan |= replan;
                return replan || guarded;
            }
            Input::DeviceClasses(classes) => {
                self.state.device_classes = classes.iter().map(|c| (**c).clone()).collect();
                let managed = classes.into_iter().filter(|c| objects::is_managed(&**c));
                self.differ
                    .update_live(Kind::DeviceClass, managed.map(LiveObject::DeviceClass));
            }
            Input::Slices { reads, slices } => {
                let pools = self.planner.update_slice_views(slices.delta(), &reads);
                tracing::debug!(
                    slices = slices.len(),
                    pools = pools.len(),
                    "ResourceSlices changed"
                );
            }
            Input::Claims(claims) => {
                let namespaces = self.planner.update_claim_views(claims.delta());
                tracing::debug!(
                    claims = claims.len(),
                    namespaces = namespaces.len(),
                    "ResourceClaims changed"
                );
            }
            Input::PendingPods(pods) => self.pending_pods.take_in(pods.delta()),
            Input::Pods(pods) => {
                if self.pods.take_in(pods.delta()) {
                    self.device_taints_changed();
                }
            }
            // Read by reclaim in a pass that runs anyway: no pass of its own.
            Input::Budgets(budgets) => {
                self.budgets = budgets;
                return false;
            }
            Input::TaintRules(rules) => {
                self.taint_rules = rules;
                self.device_taints_changed();
            }
            Input::Owned { kind, objects } => self.differ.update_owned(kind, objects.delta()),
            Input::CrdOwners(owners) => self.state.crd_owners = Some(owners),
            Input::SliceListAsked(reads) => self.slices_asked = Some(reads),
        }
        true
    }

    /// Takes the taints on devices from outside their slices (rules, devices Pods report
    /// unhealthy) into the planner's input; plans again when they changed.
    fn device_taints_changed(&mut self) {
        let rules = self.taint_rules.iter().filter_map(|r| r.as_ref().as_ref());
        let unhealthy = self.pods.unhealthy();
        let taints = taints::device_taints(rules, unhealthy);
        if taints != self.state.device_taints {
            self.state.device_taints = taints;
            self.replan = true;
        }
    }

    /// The policies of `objects` that can be read, and the names of those that cannot (which
    /// replace the malformed ones of their kind).
    fn policies<K: Policy>(
        &mut self,
        objects: &[Arc<DynamicObject>],
        before: Vec<K>,
    ) -> (Vec<K>, Vec<String>, bool) {
        let (policies, malformed, same) = parse_policies_reusing::<K>(objects, before);
        for m in &malformed {
            tracing::warn!(object = %m.object.name_any(), error = %m.message, "custom resource skipped");
        }
        let names = malformed.iter().map(|m| m.object.name_any()).collect();
        self.malformed.retain(|m| m.kind != K::KIND);
        self.malformed.extend(malformed);
        // In one order whatever kind was read last: their statuses are effects.
        (self.malformed).sort_by_cached_key(|m| (m.kind.label(), m.object.name_any()));
        (policies, names, same)
    }
}
