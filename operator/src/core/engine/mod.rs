//! The engine: everything one pass decides, sans I/O. It owns the kept [`Planner`] and
//! [`Differ`], what was published, the reclaim and requeue trackers, the Pods waiting for
//! room, the planner's input and the policies that could not be read. The controller only
//! reads the caches into [`Input`]s, runs a [`Engine::pass`], hands its effects to the
//! executor and [`Engine::settle`]s what the executor did.
//!
//! ```text
//! take_in(Input)*  ->  pass(Now, Role) -> Pass  ->  (executor)  ->  settle(Done)
//!                                 prefetch() ->  (executor)  ->  settle_prefetched(Done, Now)
//! ```
//!
//! Choices, against the sketch of the issue:
//! - `pass` takes the [`Role`]: a follower plans (its caches and planner stay warm) but asks
//!   for no effect, and its differ, Events and trackers stay as if no pass had acted, so a
//!   replica that becomes leader writes exactly what differs. Dropping a follower's effects in
//!   the controller would instead let the requeuer believe it woke templates it did not.
//! - [`Pass::Planned`] hands the plan out, with each policy's status as written (its
//!   conditions are what the metrics report), for the metrics. The engine keeps the plan:
//!   a pass whose inputs the planner does not read (teamgpu's own writes coming back: owned
//!   objects, the policies' statuses) compares the live objects and statuses with it instead
//!   of planning again. At 10,000 namespaces planning is most of a pass, and every write's
//!   echo would cost one.
//! - [`Engine::prefetch`] hands out the next batch of the backlog while the last pass's batch
//!   is performed, and a pass may run while a prefetched batch is: the differ leaves its
//!   objects alone until [`Engine::settle_prefetched`], and a prefetch has nothing else
//!   (statuses, Events, evictions) that a pass could ask for a second time.
//! - A slice list asked for is remembered ([`Input::SliceListAsked`] for the one asked before
//!   the engine ran), so a pass during the list waits ([`Pass::AwaitSlices`]) instead of
//!   starting the list again.
//! - An input is taken in only when its watch changed: slices and claims as what changed since
//!   the last hand-over (the planner keeps them, claim by claim), the other caches whole. Pods
//!   are kept (shared, not copied) because reclaim and pending demand read them, and only the
//!   engine knows when; the claims they need come from the planner, when they are needed.
//!
//! [`Planner`]: crate::core::plan::Planner
//! [`Differ`]: crate::core::diff::Differ

mod effects;
mod input;
mod namespaces;
mod pods;
#[cfg(test)]
mod tests;

use std::sync::Arc;
use std::time::Instant;

use k8s_openapi::jiff::Timestamp;

use crate::core::diff::{self, ObjectKey};
use crate::core::effects::reclaim::budgets::BudgetView;
use crate::core::effects::{
    Effect, EventKey, FailedWrite, GuardLabels, Label, Malformed, PolicyKind, PolicyStatuses,
    Published, ReclaimDefaults, ReclaimTracker, Refusals, Requeuer, SuspendedJobs, WaitingPod,
    WrittenStatuses,
};
use crate::core::plan::{self, Plan, admission::Enforcement};
use crate::core::state::ClusterState;
use crate::dra_cel::DeviceReads;
pub use input::{Input, Policy, parse_policies};

/// What the engine is told once, from the operator's configuration.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Who the operator is to the API server: its own admission policies leave it alone.
    pub operator_user: String,
    /// See [`ClusterState::admin_groups`].
    pub admin_groups: Option<Vec<String>>,
    pub enforcement: Enforcement,
    /// What a team that says nothing of reclaim gets.
    pub reclaim: ReclaimDefaults,
    /// Object writes one pass hands out at most ([`WRITES_PER_BATCH`] in the operator); the
    /// rest come in the passes after it, so that what changes during a long converge is
    /// written between its batches, not after them all.
    pub writes_per_batch: usize,
}

/// Object writes per batch in the operator: at 16 in flight, 1.5-2 s of applies on this 2-core
/// machine's API server (550-670 applies a second). A first converge at 1,000 team namespaces
/// (10,000 objects) goes out in ten batches, each after a pass that takes in what changed
/// meanwhile.
pub const WRITES_PER_BATCH: usize = 1024;

/// The time of a pass: the monotonic instant (grace periods, retries) and the wall time
/// (conditions' transition times, Pods' start times, requeue annotations). The core never
/// reads a clock.
#[derive(Clone, Copy, Debug)]
pub struct Now {
    pub instant: Instant,
    pub wall: Timestamp,
}

/// Whether this replica acts on its plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Holds the lease: its effects are performed.
    Leader,
    /// Plans to keep warm, and asks for nothing.
    Follower,
}

/// What a pass asks for.
#[derive(Debug)]
pub enum Pass {
    /// List the ResourceSlices again, projected to these reads: an expression reads more of a
    /// device than the slices taken in keep. Nothing is planned until they come.
    ListSlices(DeviceReads),
    /// A list asked for is not in yet; nothing to do.
    AwaitSlices,
    /// Boxed: a plan is ten times the size of the other variants.
    Planned(Box<Planned>),
}

/// A plan and its effects, in the order they are to be performed.
#[derive(Debug)]
pub struct Planned {
    /// For the metrics.
    pub plan: Arc<Plan>,
    /// Each policy's status as it is written (a follower's with the `Applied` condition its
    /// live status shows), for the condition metrics.
    pub statuses: PolicyStatuses,
    /// Objects (in dependency order), statuses, requeues, resumes, Events, evictions; none for a
    /// [`Role::Follower`].
    pub effects: Vec<Effect>,
}

/// What the executor did of a pass's effects that the engine must know.
#[derive(Debug, Default)]
pub struct Done {
    /// Applies that succeeded, with the resourceVersion the server answered.
    pub applied: Vec<(ObjectKey, Option<String>)>,
    /// Events published.
    pub published: Vec<EventKey>,
    /// Workloads whose eviction was refused (their Pods), and when: each is passed over for a
    /// while, so that another may cover the shortfall, then tried again.
    pub evictions_refused: Vec<(Vec<(String, String)>, Instant)>,
    /// Pods evicted (namespace, name), and when.
    pub evicted: Vec<((String, String), Instant)>,
    /// The workloads those Pods were of, by team and name (as an
    /// [`Eviction`](crate::core::effects::Eviction) names them), and when.
    pub evicted_workloads: Vec<((String, String), Instant)>,
    /// Jobs suspended instead of their Pods evicted: (namespace, name), and the Pods.
    pub suspended: Vec<((String, String), Vec<String>)>,
    /// Jobs resumed (or found gone): (namespace, name).
    pub resumed: Vec<(String, String)>,
    /// Deletions that succeeded (or found the object gone).
    pub deleted: Vec<ObjectKey>,
    /// Writes of objects that failed, refused or not: status tells of the refused ones.
    pub failed: Vec<FailedWrite>,
    /// Statuses written.
    pub statuses: Vec<(PolicyKind, String)>,
    /// Guard labels written.
    pub labelled: Vec<Label>,
}

/// One pass's decisions, kept between passes (see the module doc).
#[derive(Debug)]
pub struct Engine {
    settings: Settings,
    /// Recomputes only what changed inputs feed (a slice's pool, a namespace's usage, ...).
    planner: plan::Planner,
    /// Compares only the objects whose desired or live side changed.
    differ: diff::Differ,
    /// Events published whose finding the live status does not show yet.
    published: Published,
    reclaim: ReclaimTracker,
    /// Jobs reclaim suspended, until they are resumed.
    suspended: SuspendedJobs,
    /// Wakes Pods waiting for room that has appeared.
    requeuer: Requeuer,
    /// Writes the API server refuses, for the owning policies' status and Events.
    refusals: Refusals,
    /// Statuses written whose watch event has not come back yet.
    written: WrittenStatuses,
    /// The guard labels of namespaces outside teams, live and written.
    guard_labels: GuardLabels,
    /// The planner's input, besides slices and claims (which the planner keeps).
    state: ClusterState,
    /// Custom resources that could not be read into their types.
    malformed: Vec<Malformed>,
    /// The namespaces, whose planned list is `state.namespaces`.
    namespaces: namespaces::KeptNamespaces,
    /// As the caches hold them, for pending demand and reclaim.
    pending_pods: pods::KeptPending,
    pods: pods::KeptPods,
    /// Every PodDisruptionBudget, for reclaim.
    budgets: Vec<Arc<BudgetView>>,
    /// DeviceTaintRules, as the watch keeps them.
    taint_rules: Vec<Arc<Option<crate::core::plan::taints::TaintRuleView>>>,
    /// Pods waiting because quota refused their claims, as of the last pass.
    waiting: Vec<WaitingPod>,
    /// What the slices were last asked to be listed with.
    slices_asked: Option<DeviceReads>,
    /// The last plan, while nothing the planner reads has changed since (`replan` false).
    plan: Option<Arc<Plan>>,
    replan: bool,
    /// The differ has compared the kept plan's objects (a follower's passes do not compare).
    differ_has_plan: bool,
    /// The next pass is due at once: a pass at this instant left writes in the differ's
    /// backlog (the next batch), or a prefetched batch was reported then (the passes during it
    /// left its objects alone).
    pass_due_at: Option<Instant>,
    /// Events found while writes wait (in the backlog or prefetched), published once none do.
    held_events: Vec<crate::core::effects::Event>,
}

impl Engine {
    pub fn new(settings: Settings) -> Self {
        let writes_per_batch = settings.writes_per_batch;
        let state = ClusterState {
            operator_user: Some(settings.operator_user.clone()),
            admin_groups: settings.admin_groups.clone(),
            enforcement: settings.enforcement,
            ..ClusterState::default()
        };
        Self {
            settings,
            planner: plan::Planner::default(),
            differ: diff::Differ::with_batch_limit(writes_per_batch),
            published: Published::default(),
            reclaim: ReclaimTracker::default(),
            suspended: SuspendedJobs::default(),
            requeuer: Requeuer::default(),
            refusals: Refusals::default(),
            written: WrittenStatuses::default(),
            guard_labels: GuardLabels::default(),
            state,
            malformed: Vec::new(),
            namespaces: namespaces::KeptNamespaces::default(),
            pending_pods: pods::KeptPending::default(),
            pods: pods::KeptPods::default(),
            budgets: Vec::new(),
            taint_rules: Vec::new(),
            waiting: Vec::new(),
            slices_asked: None,
            plan: None,
            replan: true,
            differ_has_plan: false,
            pass_due_at: None,
            held_events: Vec::new(),
        }
    }

    /// One pass at `now`: the plan, and what a [`Role::Leader`] must do about it.
    pub fn pass(&mut self, now: Now, role: Role) -> Pass {
        // The pass sets the next wake-ups; one that is due would otherwise wake the loop
        // again and again if the pass does not reach reclaim or requeue.
        self.reclaim.clear_due(now.instant);
        self.requeuer.clear_due(now.instant);
        self.pass_due_at = None;
        let pending_changed = self.refresh_pending();
        // Devices are kept only as far as expressions read them: one that reads more
        // (a new policy, a changed class) needs the slices listed again before counting.
        let reads = self.planner.device_reads(&self.state);
        if !self.planner.reads_cover(&reads) {
            if self.slices_asked.as_ref().is_some_and(|a| a.covers(&reads)) {
                return Pass::AwaitSlices;
            }
            self.slices_asked = Some(reads.clone());
            return Pass::ListSlices(reads);
        }
        // Pending demand is the planner's input, read from the Pods and claims just now: a
        // Pod's event that changes no demand (a condition the scheduler sets, any Pod but
        // those waiting for devices) plans nothing again.
        let replan = self.replan || pending_changed;
        let plan = match self.plan.take() {
            Some(kept) if !replan => kept,
            _ => {
                self.differ_has_plan = false;
                if let Some(namespaces) = self.namespaces.planned() {
                    self.state.namespaces = namespaces;
                }
                Arc::new(self.planner.plan(&self.state))
            }
        };
        self.replan = false;
        self.plan = Some(plan.clone());
        let (statuses, refused) = self.statuses(&plan, now);
        let effects = match role {
            Role::Leader => {
                let seen = std::mem::replace(&mut self.differ_has_plan, true);
                let effects = self.effects(&plan, seen, (&statuses, &refused), now);
                self.pass_due_at = (self.differ.backlog() > 0).then_some(now.instant);
                effects
            }
            Role::Follower => Vec::new(),
        };
        Pass::Planned(Box::new(Planned {
            plan,
            statuses,
            effects,
        }))
    }

    /// Takes in what the executor did at `wall`: an apply settles its object in the differ, a
    /// published Event is not published again, a refused eviction is tried again later, a
    /// refused write shows on its policy.
    pub fn settle(&mut self, done: Done, wall: Timestamp) {
        // Refusals: a failed write counts, a written object ends its row.
        let written = done.applied.iter().map(|(key, _)| key).chain(&done.deleted);
        self.refusals.record(&done.failed, written, wall);
        for (key, version) in done.applied {
            self.differ.written(&key, version.as_deref());
        }
        for key in &done.deleted {
            self.differ.written(key, None);
        }
        self.written.settle(&done.statuses);
        for label in done.labelled {
            self.guard_labels.settle(label);
        }
        for key in done.published {
            self.published.record(key);
        }
        for (pods, at) in done.evictions_refused {
            self.reclaim.refused(pods, at);
        }
        for (workload, at) in done.evicted_workloads {
            self.reclaim.workload_evicted(workload, at);
        }
        for (pod, at) in done.evicted {
            self.reclaim.evicted(pod, at);
        }
        for ((namespace, job), pods) in done.suspended {
            let claims = self.claims_of(&namespace, &pods);
            self.suspended.suspended((namespace, job), pods, claims);
        }
        for (namespace, job) in done.resumed {
            self.suspended.resumed(&namespace, &job);
        }
    }

    /// The next object writes of the backlog, handed out while a batch is performed so that
    /// they follow it at once (see [`Differ::prefetch`]); none for a follower, whose passes
    /// compare nothing. Nothing else: a pass may run while these are performed, and it leaves
    /// their objects alone until [`Engine::settle_prefetched`].
    ///
    /// [`Differ::prefetch`]: crate::core::diff::Differ::prefetch
    pub fn prefetch(&mut self) -> Vec<Effect> {
        // A whole batch: a quarter (256) measured worse at 10,000 namespaces (converge 1.40x
        // the apply floor, CPU 35.5 s, against 1.22x and 31.8 s), as a pass then comes every
        // 1,280 writes instead of every 2,048.
        let writes = self.differ.prefetch(self.settings.writes_per_batch);
        writes.into_iter().map(Effect::Object).collect()
    }

    /// [`Engine::settle`] for a batch [`Engine::prefetch`] handed out, at `now`: the next
    /// pass compares its objects, which the passes during it left alone.
    pub fn settle_prefetched(&mut self, done: Done, now: Now) {
        self.settle(done, now.wall);
        self.differ.prefetch_done();
        self.pass_due_at = Some(now.instant);
    }

    /// The claims Pods `pods` of `namespace` hold or wait for: those reserved for them, and
    /// those made for them while they wait for a node.
    fn claims_of(&self, namespace: &str, pods: &[String]) -> Vec<String> {
        let of_pods = |p: &str| pods.iter().any(|q| q == p);
        let reserved = (self.planner.claims_in(namespace))
            .filter(|c| c.reserved_for_pods.iter().any(|p| of_pods(p)))
            .map(|c| c.name.to_string());
        let queued = (pods.iter())
            .filter_map(|p| self.pods.get(namespace, p))
            .flat_map(|p| p.queued_claims.iter().map(|c| c.to_string()));
        reserved.chain(queued).collect()
    }

    /// The next pass compares every object, not only those whose side changed (a resync:
    /// what a watch missed is repaired).
    pub fn resync(&mut self) {
        self.differ.compare_all();
        self.replan = true;
    }

    /// When a pass must run though nothing changes: a reclaim's grace period ends or a
    /// refused eviction is due again, a wake-up of waiting Pods is due to be retried, a status
    /// held back by its pace may be written, writes are left in the backlog or a prefetched
    /// batch was reported (at once). (The executor's retries of failed writes are the
    /// executor's.)
    pub fn next_wake(&self) -> Option<Instant> {
        let statuses = self.written.next_wake();
        [
            self.reclaim.next_attempt(),
            self.requeuer.next_attempt(),
            statuses,
            self.pass_due_at,
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Pending demand and the Pods waiting on quota, from the pending Pods, their claims (each
    /// found in the planner's, not a copy of all) and the live templates' charges; whether the
    /// demand changed. Most passes have no pending Pod: then nothing is read.
    fn refresh_pending(&mut self) -> bool {
        if self.pending_pods.is_empty() {
            self.waiting.clear();
            let changed = !self.state.pending.is_empty();
            self.state.pending.clear();
            return changed;
        }
        let pods = self.pending_pods.views();
        let (differ, planner) = (&self.differ, &self.planner);
        let charge = |namespace: &str, name: &str| differ.template_charge(namespace, name).cloned();
        let claim = |namespace: &str, name: &str| planner.claim(namespace, name);
        let pending = plan::pending::pending_demand(&pods, claim, charge);
        self.waiting = plan::pending::waiting_on_quota(&pods, claim, charge);
        let changed = pending != self.state.pending;
        self.state.pending = pending;
        changed
    }
}
