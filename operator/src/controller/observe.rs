//! Observe: watch caches of everything the planner reads and everything teamgpu owns. Needs a
//! client. Every change wakes the reconciler through one [`Wake`].

use std::sync::Arc;

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::CustomResourceExt;
use kube::api::{DynamicObject, PartialObjectMeta};
use kube::core::ApiResource;
use kube::runtime::reflector::{self, Store, store::Writer};
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use tokio::sync::watch;
use tokio::task::JoinSet;

pub use super::changes::{Changes, Wake, Watch};
use super::pods::{watch_budgets, watch_pods};
use super::projected::{self, Projected, Projector};
use super::reflect::spawn;
use crate::api::{GpuSharingPolicy, TeamGpuPolicy};
use crate::core::diff::{Kind, LiveView, OwnWrites, TemplateCharges};
use crate::core::effects::PodView;
use crate::core::effects::reclaim::budgets::BudgetView;
use crate::core::plan::inventory::{SliceValues, SliceView};
use crate::core::plan::objects::{MANAGED_BY, MANAGED_BY_LABEL};
use crate::core::plan::pending::PendingPodView;
use crate::core::plan::taints::TaintRuleView;
use crate::core::plan::usage::{ClaimView, Names};
use crate::core::state::{ClusterState, NamespaceInfo};
use crate::core::{engine, plan};
use crate::dra_cel::DeviceReads;

/// The watch caches.
#[derive(Clone)]
pub struct Stores {
    /// teamgpu's own kinds, kept dynamic so that one malformed object is reported, not fatal.
    pub sharing_policies: Store<DynamicObject>,
    pub teams: Store<DynamicObject>,
    /// Names and labels, shared with the planner's input.
    pub namespaces: Projected<NamespaceView, ()>,
    /// All DeviceClasses: foreign ones decide what is governed; teamgpu's are its own.
    pub device_classes: Store<DeviceClass>,
    /// Projected to what the class expressions read (see [`super::projected`]); empty until the
    /// reconciler says what that is through `slice_reads`.
    pub slices: Projected<SliceView, Arc<DeviceReads>>,
    /// What the slices are to be projected to; a new value lists them again.
    pub slice_reads: Arc<watch::Sender<Option<Arc<DeviceReads>>>>,
    pub claims: Projected<ClaimView, ()>,
    /// Pending Pods only (field selector), for pending demand and waking waiting Pods.
    pub pending_pods: Projected<PendingPodView, ()>,
    /// Pods not done yet, as reclaim weighs them (priority, workload, start).
    pub pods: Projected<PodView, ()>,
    /// Every PodDisruptionBudget, for reclaim.
    pub budgets: Projected<BudgetView, ()>,
    /// Each of teamgpu's CRDs, by name, as an owner reference (one watch per CRD, so that
    /// `config/rbac` grants them by name).
    pub crds: Vec<Projected<OwnerReference, ()>>,
    /// DeviceTaintRules, where the API server serves them (`None`: it serves none).
    pub taint_rules: Option<Projected<Option<TaintRuleView>, ()>>,
    /// Objects carrying teamgpu's managed-by label, per kind (DeviceClasses come from
    /// `device_classes`), as the differ needs them.
    pub owned: Vec<(Kind, Projected<LiveView, u64>)>,
    /// Counts the lists again of `owned` asked for (see [`Stores::relist_owned`]).
    pub owned_relist: Arc<watch::Sender<Option<u64>>>,
    /// What teamgpu's own applies stored (see [`OwnWrites`]): the writer records, the watches
    /// of `owned` recognise.
    pub own_writes: Arc<OwnWrites>,
}

impl std::fmt::Debug for Stores {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stores").finish_non_exhaustive()
    }
}

impl Stores {
    /// Wait until every cache but the slices' holds a complete first list; false if a watch task
    /// ended. (The slices are listed once the reconciler knows what to keep of them.)
    pub async fn wait_until_ready(&self) -> bool {
        let rules = async {
            match &self.taint_rules {
                Some(rules) => rules.wait_until_ready().await,
                None => true,
            }
        };
        let (a, b, d, pending, namespaces, claims, pods, budgets, owned, crds, rules) = futures::join!(
            self.sharing_policies.wait_until_ready(),
            self.teams.wait_until_ready(),
            self.device_classes.wait_until_ready(),
            self.pending_pods.wait_until_ready(),
            self.namespaces.wait_until_ready(),
            self.claims.wait_until_ready(),
            self.pods.wait_until_ready(),
            self.budgets.wait_until_ready(),
            futures::future::join_all(self.owned.iter().map(|(_, s)| s.wait_until_ready())),
            futures::future::join_all(self.crds.iter().map(Projected::wait_until_ready)),
            rules,
        );
        [a, b, d].iter().all(Result::is_ok)
            && pending
            && namespaces
            && claims
            && pods
            && budgets
            && owned.iter().all(|ready| *ready)
            && crds.iter().all(|ready| *ready)
            && rules
    }

    /// Lists every object teamgpu owns again, so that a change the watches missed is seen:
    /// a view whose version differs from the kept one is taken in (and compared) as an event's
    /// would be; equal ones change nothing.
    pub fn relist_owned(&self) {
        self.owned_relist
            .send_modify(|count| *count = Some(count.unwrap_or(0) + 1));
    }

    /// Makes the next take of the slices, the claims, the Pods (pending or not) and the
    /// namespaces hand over every object (a resync compares everything, not only what the
    /// watches said changed).
    pub fn take_all_next(&self) {
        self.slices.take_all_next();
        self.claims.take_all_next();
        self.pods.take_all_next();
        self.pending_pods.take_all_next();
        self.namespaces.take_all_next();
    }

    /// The CRDs that exist, as owners (see [`ClusterState::crd_owners`]).
    pub fn crd_owners(&self) -> Vec<OwnerReference> {
        let mut owners: Vec<OwnerReference> = self
            .crds
            .iter()
            .filter_map(Projected::state)
            .flat_map(|((), crds)| crds.into_iter().map(|o| (*o).clone()))
            .collect();
        owners.sort_by(|a, b| a.name.cmp(&b.name));
        owners
    }

    /// Asks for the slices' list as soon as what the class expressions read is known from the
    /// policies and DeviceClasses (short lists), rather than once every cache is complete: the
    /// slices are the longest list, and the others complete meanwhile. The first pass asks again
    /// only if it finds that the expressions read more.
    pub async fn list_slices_early(&self) {
        let (policies, classes) = futures::join!(
            self.sharing_policies.wait_until_ready(),
            self.device_classes.wait_until_ready()
        );
        if policies.is_err() || classes.is_err() {
            return;
        }
        let state = ClusterState {
            // A policy that cannot be read is reported by the first pass.
            sharing_policies: engine::parse_policies(&self.sharing_policies.state()).0,
            device_classes: self
                .device_classes
                .state()
                .iter()
                .map(|c| (**c).clone())
                .collect(),
            ..ClusterState::default()
        };
        let reads = plan::device_reads(&state);
        self.slice_reads.send_if_modified(|wanted| {
            let first = wanted.is_none();
            if first {
                tracing::info!(keep = %reads.describe(), "listing ResourceSlices");
                *wanted = Some(Arc::new(reads));
            }
            first
        });
    }
}

/// Start every watch, DeviceTaintRules' too where the API server serves them
/// (`taint_rules`). The tasks run until dropped.
pub fn start(
    client: &Client,
    wake: &Wake,
    tasks: &mut JoinSet<()>,
    taint_rules: Option<ApiResource>,
) -> Stores {
    let cfg = watcher::Config::default;
    let mut own_kind = |resource: ApiResource, watch: Watch, what: &'static str| {
        let api = Api::<DynamicObject>::all_with(client.clone(), &resource);
        let writer = Writer::new(resource);
        let store = writer.as_reader();
        spawn(
            tasks,
            writer,
            watcher(api, cfg()),
            wake.clone(),
            watch,
            what,
        );
        store
    };
    // teamgpu's own kinds, kept dynamic so that one malformed object is reported, not fatal.
    let sharing_policies = own_kind(
        ApiResource::erase::<GpuSharingPolicy>(&()),
        Watch::SharingPolicies,
        "gpusharingpolicies",
    );
    let teams = own_kind(
        ApiResource::erase::<TeamGpuPolicy>(&()),
        Watch::Teams,
        "teamgpupolicies",
    );

    let namespaces = projected::spawn(
        tasks,
        Api::<PartialObjectMeta<Namespace>>::all(client.clone()),
        cfg(),
        watch::channel(Some(())).1,
        NamespaceProjector,
        wake.clone(),
        Watch::Namespaces,
    );
    let (device_classes, writer) = reflector::store();
    spawn(
        tasks,
        writer,
        watcher(Api::<DeviceClass>::all(client.clone()), cfg()),
        wake.clone(),
        Watch::DeviceClasses,
        "deviceclasses",
    );
    let (slice_reads, reads) = watch::channel(None);
    // A page of 100 slices (800 GPUs with every attribute) is a few MiB while it is projected.
    let slices = projected::spawn(
        tasks,
        Api::<ResourceSlice>::all(client.clone()),
        cfg().page_size(100),
        reads,
        SliceProjector::default(),
        wake.clone(),
        Watch::Slices,
    );
    // Never changed: the sender is dropped, and the claims are listed once.
    let claims = projected::spawn(
        tasks,
        Api::<ResourceClaim>::all(client.clone()),
        cfg(),
        watch::channel(Some(())).1,
        ClaimProjector::default(),
        wake.clone(),
        Watch::Claims,
    );
    let (pending_pods, pods) = watch_pods(client, wake, tasks);

    let crds = watch_crds(client, wake, tasks);
    let taint_rules =
        taint_rules.map(|resource| super::taint_rules::watch(client, wake, tasks, &resource));

    let own_writes = Arc::new(OwnWrites::default());
    let (owned_relist, relists) = watch::channel(Some(0));
    let owned = watch_owned(client, wake, tasks, &own_writes, &relists);

    Stores {
        sharing_policies,
        teams,
        namespaces,
        device_classes,
        slices,
        slice_reads: Arc::new(slice_reads),
        claims,
        pending_pods,
        pods,
        budgets: watch_budgets(client, wake, tasks),
        crds,
        taint_rules,
        owned,
        owned_relist: Arc::new(owned_relist),
        own_writes,
    }
}

/// One watch per kind teamgpu owns (but DeviceClasses, read with all the others), of the
/// objects with its managed-by label; each lists again when `relists` counts one more.
fn watch_owned(
    client: &Client,
    wake: &Wake,
    tasks: &mut JoinSet<()>,
    own_writes: &Arc<OwnWrites>,
    relists: &watch::Receiver<Option<u64>>,
) -> Vec<(Kind, Projected<LiveView, u64>)> {
    let config = watcher::Config::default().labels(&format!("{MANAGED_BY_LABEL}={MANAGED_BY}"));
    let kinds = Kind::ALL.into_iter().filter(|k| *k != Kind::DeviceClass);
    kinds
        .map(|kind| {
            let projector = OwnedProjector {
                kind,
                own_writes: own_writes.clone(),
                charges: TemplateCharges::default(),
            };
            let api = Api::<DynamicObject>::all_with(client.clone(), &kind.api_resource());
            let watch = Watch::Owned(kind);
            let store = projected::spawn(
                tasks,
                api,
                config.clone(),
                relists.clone(),
                projector,
                wake.clone(),
                watch,
            );
            (kind, store)
        })
        .collect()
}

/// One watch per teamgpu CRD, by name (so that `config/rbac` grants them by `resourceNames`).
fn watch_crds(
    client: &Client,
    wake: &Wake,
    tasks: &mut JoinSet<()>,
) -> Vec<Projected<OwnerReference, ()>> {
    [GpuSharingPolicy::crd_name(), TeamGpuPolicy::crd_name()]
        .into_iter()
        .map(|name| {
            projected::spawn(
                tasks,
                Api::<PartialObjectMeta<CustomResourceDefinition>>::all(client.clone()),
                watcher::Config::default().fields(&format!("metadata.name={name}")),
                watch::channel(Some(())).1,
                CrdProjector,
                wake.clone(),
                Watch::Crds,
            )
        })
        .collect()
}

/// A CRD as an owner of the admission objects. Not a controller: the garbage collector deletes
/// the dependents once every owner is gone.
#[derive(Debug)]
struct CrdProjector;

impl Projector<PartialObjectMeta<CustomResourceDefinition>> for CrdProjector {
    type View = OwnerReference;
    type Params = ();

    fn project(
        &mut self,
        crd: &PartialObjectMeta<CustomResourceDefinition>,
        (): &(),
    ) -> OwnerReference {
        OwnerReference {
            api_version: "apiextensions.k8s.io/v1".into(),
            kind: "CustomResourceDefinition".into(),
            name: crd.name_any(),
            uid: crd.metadata.uid.clone().unwrap_or_default(),
            controller: None,
            block_owner_deletion: None,
        }
    }

    fn same(kept: &OwnerReference, new: &OwnerReference) -> bool {
        kept == new
    }
}

pub use crate::core::state::NamespaceView;

/// Namespaces as [`NamespaceView`]s: a few hundred bytes less each than their metadata, and
/// the planner's input shares them instead of copying.
#[derive(Debug)]
struct NamespaceProjector;

impl Projector<PartialObjectMeta<Namespace>> for NamespaceProjector {
    type View = NamespaceView;
    type Params = ();
    const TRACKED: bool = true;

    fn project(&mut self, namespace: &PartialObjectMeta<Namespace>, (): &()) -> NamespaceView {
        NamespaceView {
            info: Arc::new(NamespaceInfo {
                name: namespace.name_any(),
                labels: namespace.labels().clone(),
            }),
            terminating: namespace.metadata.deletion_timestamp.is_some(),
        }
    }

    /// An annotation, a finalizer, a status: nothing the planner reads.
    fn same(kept: &NamespaceView, new: &NamespaceView) -> bool {
        kept.info == new.info && kept.terminating == new.terminating
    }
}

/// ResourceSlices as [`SliceView`]s, their devices' CEL input shared.
#[derive(Debug, Default)]
struct SliceProjector {
    values: SliceValues,
}

impl Projector<ResourceSlice> for SliceProjector {
    type View = SliceView;
    type Params = Arc<DeviceReads>;
    const TRACKED: bool = true;

    fn project(&mut self, slice: &ResourceSlice, reads: &Arc<DeviceReads>) -> SliceView {
        SliceView::project(slice, reads, &mut self.values)
    }

    fn same(kept: &SliceView, new: &SliceView) -> bool {
        kept.same_content(new)
    }

    fn relisted(&mut self) {
        self.values.prune();
        tracing::debug!(
            distinct = self.values.envs.len(),
            "device environments after a list"
        );
    }
}

/// ResourceClaims as [`ClaimView`]s, their names shared.
#[derive(Debug, Default)]
struct ClaimProjector {
    names: Names,
}

impl Projector<ResourceClaim> for ClaimProjector {
    type View = ClaimView;
    type Params = ();
    const TRACKED: bool = true;

    fn project(&mut self, claim: &ResourceClaim, (): &()) -> ClaimView {
        ClaimView::project(claim, &mut self.names)
    }

    fn same(kept: &ClaimView, new: &ClaimView) -> bool {
        kept.same_content(new)
    }

    fn relisted(&mut self) {
        self.names.prune();
    }
}

/// Objects teamgpu owns, as the differ needs them; the templates' charges shared (a team's
/// templates are the same in each of its namespaces).
#[derive(Debug)]
struct OwnedProjector {
    kind: Kind,
    own_writes: Arc<OwnWrites>,
    charges: TemplateCharges,
}

impl Projector<DynamicObject> for OwnedProjector {
    type View = LiveView;
    /// Counts the resyncs: each lists the objects again (see [`Stores::relist_owned`]).
    type Params = u64;
    const TRACKED: bool = true;

    fn project(&mut self, object: &DynamicObject, _: &u64) -> LiveView {
        LiveView::observed(self.kind, object, &self.own_writes, &mut self.charges)
    }

    /// The same version is the same object (a list again, an own apply's event after a
    /// relist): the differ's verdict on it stands.
    fn same(kept: &LiveView, new: &LiveView) -> bool {
        kept.key == new.key
            && kept.resource_version.is_some()
            && kept.resource_version == new.resource_version
    }

    fn relisted(&mut self) {
        self.charges.prune();
    }
}
