//! One pass: take in what the watches changed, plan, and hand the effects of the plan to the
//! executor. Only the planner, the differ and `core::effects` decide; nothing here writes.

use std::sync::Arc;
use std::time::Instant;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;

use super::executor::{Done, Executor};
use super::metrics::{self, Metrics};
use super::observe::{self, Stores, Watch};
use super::parse::parse_all;
use super::{Config, resident_mib};
use crate::core::diff::{self, Kind};
use crate::core::effects::{
    self, Effect, Malformed, PolicyKind, Published, ReclaimDefaults, ReclaimInput, ReclaimTracker,
    Requeuer, WaitingPod,
};
use crate::core::plan::{self, objects};
use crate::core::state::ClusterState;

/// Plans with what the watches changed, and has the executor do what the plan asks for.
pub(super) struct Reconciler {
    config: Config,
    stores: Stores,
    metrics: Arc<Metrics>,
    /// Does every write.
    pub(super) executor: Executor,
    pub(super) reclaim: ReclaimTracker,
    /// Wakes Pods waiting for room that has appeared.
    pub(super) requeuer: Requeuer,
    /// Pods waiting because quota refused their claims, from the last refresh.
    waiting: Vec<WaitingPod>,
    /// Which watches saw events since the last pass.
    changes: Arc<observe::Changes>,
    /// Events published whose finding the live status does not show yet.
    published: Published,
    /// Recomputes only what changed inputs feed (a slice's pool, a namespace's usage, ...).
    planner: plan::Planner,
    /// Compares only the objects whose desired or live side changed.
    differ: diff::Differ,
    /// Who this operator is to the API server (see [`super::own_user_name`]).
    operator_user: String,
    /// The planner's input, kept between passes (see [`Reconciler::refresh_state`]).
    state: ClusterState,
    /// Custom resources that could not be read into their types.
    malformed: Vec<Malformed>,
}

impl Reconciler {
    pub(super) fn new(
        config: Config,
        stores: Stores,
        metrics: Arc<Metrics>,
        executor: Executor,
        changes: Arc<observe::Changes>,
        operator_user: String,
    ) -> Self {
        Self {
            config,
            stores,
            metrics,
            executor,
            reclaim: ReclaimTracker::default(),
            requeuer: Requeuer::default(),
            waiting: Vec::new(),
            changes,
            published: Published::default(),
            planner: plan::Planner::default(),
            differ: diff::Differ::default(),
            operator_user,
            state: ClusterState::default(),
            malformed: Vec::new(),
        }
    }

    /// Brings the planner's input up to date with the caches that `changed`: policies are read
    /// into their types, namespaces and classes copied, only when their watch saw an event.
    /// Slices and claims, the bulk of a cluster, are not copied: the planner takes them in from
    /// the caches ([`Reconciler::take_changes`]).
    fn refresh_state(&mut self, changed: observe::Changed) {
        let state = &mut self.state;
        if changed.contains(Watch::SharingPolicies) || changed.contains(Watch::Teams) {
            let mut malformed = Vec::new();
            state.sharing_policies = parse_all(&self.stores.sharing_policies, &mut malformed);
            state.teams = parse_all(&self.stores.teams, &mut malformed);
            let unreadable = |kind| -> Vec<String> {
                malformed
                    .iter()
                    .filter(|m| m.kind == kind)
                    .map(|m| m.object.name_any())
                    .collect()
            };
            state.unreadable_sharing_policies = unreadable(PolicyKind::GpuSharingPolicy);
            state.unreadable_teams = unreadable(PolicyKind::TeamGpuPolicy);
            for m in &malformed {
                tracing::warn!(object = %m.object.name_any(), error = %m.message, "custom resource skipped");
            }
            self.malformed = malformed;
        }
        if changed.contains(Watch::Namespaces) {
            let ((), namespaces) = self.stores.namespaces.state().unwrap_or_default();
            state.namespaces = namespaces
                .iter()
                .filter(|n| !n.terminating)
                .map(|n| n.info.clone())
                .collect();
        }
        if changed.contains(Watch::DeviceClasses) {
            state.device_classes = self
                .stores
                .device_classes
                .state()
                .iter()
                .map(|c| (**c).clone())
                .collect();
        }
        let pods: Vec<Arc<Pod>> = self.stores.pending_pods.state();
        // Most passes have no pending Pod: then there is no claim to look at.
        (state.pending, self.waiting) = if pods.is_empty() {
            (Vec::new(), Vec::new())
        } else {
            let claims = self
                .stores
                .claims
                .state()
                .map(|(_, c)| c)
                .unwrap_or_default();
            let (pods, claims) = (
                pods.iter().map(|p| &**p).collect::<Vec<_>>(),
                claims.iter().map(|c| &**c).collect::<Vec<_>>(),
            );
            let charge =
                |namespace: &str, name: &str| self.differ.template_charge(namespace, name).cloned();
            (
                plan::pending::pending_demand(&pods, &claims, charge),
                plan::pending::waiting_on_quota(&pods, &claims, charge),
            )
        };
        state.operator_user = Some(self.operator_user.clone());
        state.admin_groups.clone_from(&self.config.admin_groups);
        state.enforcement = self.config.enforcement;
        if changed.contains(Watch::Crds) {
            state.crd_owners = Some(self.stores.crd_owners());
        }
    }

    /// Brings the planner's slices and claims and the differ's live objects up to date with
    /// the caches that changed; returns which did.
    fn take_changes(&mut self) -> observe::Changed {
        let changed = self.changes.take();
        // What changed since the last take, or everything at the first and after a resync.
        if changed.contains(Watch::Slices)
            && let Some((reads, slices)) = self.stores.slices.take()
        {
            let pools = self.planner.update_slice_views(slices.delta(), &reads);
            tracing::debug!(
                slices = slices.len(),
                pools = pools.len(),
                "ResourceSlices changed"
            );
        }
        if changed.contains(Watch::Claims)
            && let Some(((), claims)) = self.stores.claims.take()
        {
            let namespaces = self.planner.update_claim_views(claims.delta());
            tracing::debug!(
                claims = claims.len(),
                namespaces = namespaces.len(),
                "ResourceClaims changed"
            );
        }
        if changed.contains(Watch::DeviceClasses) {
            let classes = self.stores.device_classes.state();
            let managed = classes.iter().filter(|c| objects::is_managed(&***c));
            self.differ.update_live(
                Kind::DeviceClass,
                managed.map(|c| diff::LiveObject::DeviceClass(c.clone())),
            );
        }
        for (kind, store) in &self.stores.owned {
            if changed.contains(Watch::Owned(*kind))
                && let Some((_, objects)) = store.state()
            {
                self.differ
                    .update_live(*kind, objects.into_iter().map(diff::LiveObject::Owned));
            }
        }
        changed
    }

    /// Compares everything at the next pass, not only what the watches said changed, so that
    /// what they missed is repaired: every cache is read again, the owned objects are listed
    /// again (a version the cache did not have is compared when the list is complete), and
    /// the differ compares every object.
    pub(super) fn resync(&mut self) {
        self.stores.relist_owned();
        self.stores.take_all_next();
        self.changes.mark_all();
        self.differ.compare_all();
    }

    pub(super) async fn reconcile(&mut self) {
        let started = Instant::now();
        let labels = metrics::ControllerLabels {
            controller: "teamgpu",
        };
        self.metrics.reconciles.get_or_create(&labels).inc();
        let changed = self.take_changes();
        self.refresh_state(changed);
        // Taken out for the pass, so that the writers may borrow the reconciler.
        let state = std::mem::take(&mut self.state);
        let malformed = std::mem::take(&mut self.malformed);
        self.pass(&state, &malformed).await;
        self.state = state;
        self.malformed = malformed;
        self.metrics
            .reconcile_seconds
            .get_or_create(&labels)
            .observe(started.elapsed().as_secs_f64());
        tracing::debug!(
            seconds = started.elapsed().as_secs_f64(),
            resident_mib = resident_mib(),
            "pass done"
        );
    }

    async fn pass(&mut self, state: &ClusterState, malformed: &[Malformed]) {
        // Devices are kept only as far as selectors read them: a selector that reads more
        // (a new policy, a changed class) needs the slices listed again before counting.
        let reads = self.planner.device_reads(state);
        if !self.planner.reads_cover(&reads) {
            let wanted = self.stores.slice_reads.borrow().clone();
            if wanted.as_deref().is_none_or(|w| !w.covers(&reads)) {
                tracing::info!(keep = %reads.describe(), "listing ResourceSlices");
                self.stores.slice_reads.send_replace(Some(Arc::new(reads)));
            }
            return;
        }
        let plan = self.planner.plan(state);
        self.metrics.observe_plan(&plan);
        tracing::debug!(resident_mib = resident_mib(), "planned");
        if self.executor.is_leader() {
            let effects = self.effects(&plan, state, malformed);
            let done = self.executor.run(effects).await;
            self.remember(done);
        }
    }

    /// What `plan` asks for, in the order it is done: objects, statuses, Events, evictions.
    fn effects(
        &mut self,
        plan: &plan::Plan,
        state: &ClusterState,
        malformed: &[Malformed],
    ) -> Vec<Effect> {
        let writes = self.differ.writes(&plan.objects);
        tracing::debug!(
            writes = writes.len(),
            resident_mib = resident_mib(),
            "compared"
        );
        let wall = k8s_openapi::jiff::Timestamp::now();
        let now = Time(wall);
        let (sharing, teams) = (&state.sharing_policies, &state.teams);
        let mut out: Vec<Effect> = writes.into_iter().map(Effect::Object).collect();
        out.extend(effects::malformed_statuses(malformed, &now));
        out.extend(effects::status_changes(plan, sharing, teams, &now));
        // Most passes order no reclaim and find no Pod waiting: then there is no claim to
        // look at.
        let claims = if plan.reclaims.is_empty() && self.waiting.is_empty() {
            Vec::new()
        } else {
            let claims = self.stores.claims.state();
            claims.map(|(_, c)| c).unwrap_or_default()
        };
        let pods = if plan.reclaims.is_empty() {
            Vec::new()
        } else {
            self.stores.pods.state().map(|(_, p)| p).unwrap_or_default()
        };
        let defaults = ReclaimDefaults {
            enabled: self.config.reclaim_default,
            grace: self.config.reclaim_grace,
            min_runtime: self.config.reclaim_min_runtime,
        };
        let input = ReclaimInput {
            plan,
            teams,
            claims: &claims,
            pods: &pods,
        };
        let reclaimed = (self.reclaim).evictions(input, defaults, Instant::now(), wall);
        let namespaces = self.waiting.iter().map(|w| w.namespace.as_str()).collect();
        let room = effects::room(plan, &claims, &namespaces);
        let requeues = (self.requeuer).requeues(&self.waiting, &room, Instant::now(), wall);
        out.extend(requeues.into_iter().map(Effect::Requeue));
        let mut events = effects::event_transitions(plan, sharing, teams);
        events.extend(reclaimed.events);
        events.extend(effects::waiting_events(plan, &self.waiting));
        out.extend(
            self.published
                .unpublished(events)
                .into_iter()
                .map(|e| Effect::Event(Box::new(e))),
        );
        out.extend((reclaimed.evictions.into_iter()).map(|e| Effect::Evict(Box::new(e))));
        out
    }

    /// Takes in what the executor did: an apply settles its object in the differ, a published
    /// Event is not published again, a refused eviction is tried again later.
    fn remember(&mut self, done: Done) {
        for (key, version) in done.applied {
            self.differ.applied(&key, version.as_deref());
        }
        for key in done.published {
            self.published.record(key);
        }
        if done.eviction_refused {
            self.reclaim.refused(Instant::now());
        }
    }
}
