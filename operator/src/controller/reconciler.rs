//! One pass, as I/O around the [`Engine`]: read the caches whose watch changed into
//! [`Input`]s, run the engine's pass, hand its effects to the executor's task and settle what
//! it did when it reports. While a batch is in flight, what changes is taken in, and the pass
//! after the report plans it and hands out what differs then; the next writes of the backlog
//! are prefetched behind a pass's batch, so that the executor writes while that pass runs.
//! Nothing here decides.

use std::sync::Arc;
use std::time::Instant;

use k8s_openapi::jiff::Timestamp;

use super::executor::{Executor, Ran, Task};
use super::metrics::{self, Metrics};
use super::observe::{self, Stores, Watch};
use super::{Config, resident_mib};
use crate::core::effects::ReclaimDefaults;
use crate::core::engine::{Engine, Input, Now, Pass, Planned, Role, Settings};
use tokio::sync::watch;

/// What follows the executor's report on a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum AfterBatch {
    /// A pass at once: writes wait in the backlog (the next batch), or a wake-up is due.
    PassNow,
    /// A pass after the events that come with the batch's own (as for any event): what was
    /// taken in meanwhile needs one.
    PassSoon,
    /// No pass: the batch's own watch events, or a timer, will ask for one.
    Wait,
}

/// Runs the engine on what the watches changed, and has the executor do what it asks for.
pub(super) struct Reconciler {
    stores: Stores,
    metrics: Arc<Metrics>,
    /// The executor's task, which does every write.
    executor: Task,
    /// Whether this replica holds the lease.
    leader: watch::Receiver<bool>,
    /// When the executor's next retry of a failed write is due, as its last report said.
    next_retry: Option<Instant>,
    /// Something that needs a pass was taken in while a batch was in flight.
    taken_in_flight: bool,
    /// Which watches saw events since the last pass.
    changes: Arc<observe::Changes>,
    pub(super) engine: Engine,
}

/// Every object of a projected cache, once its first list is complete.
fn all<P, V>(state: Option<(P, Vec<V>)>) -> Option<Vec<V>> {
    state.map(|(_, all)| all)
}

impl Reconciler {
    pub(super) fn new(
        config: &Config,
        stores: Stores,
        metrics: Arc<Metrics>,
        (executor, leader): (Executor, watch::Receiver<bool>),
        changes: Arc<observe::Changes>,
        operator_user: String,
    ) -> Self {
        let mut engine = Engine::new(Settings {
            operator_user,
            admin_groups: config.admin_groups.clone(),
            enforcement: config.enforcement,
            reclaim: ReclaimDefaults {
                enabled: config.reclaim_default,
                grace: config.reclaim_grace,
                min_runtime: config.reclaim_min_runtime,
            },
            writes_per_batch: config.writes_per_batch,
        });
        // The slices may be listing already (asked for early, see `Stores::list_slices_early`).
        if let Some(reads) = stores.slice_reads.borrow().as_deref() {
            engine.take_in(Input::SliceListAsked(reads.clone()));
        }
        Self {
            stores,
            metrics,
            executor: executor.spawn(),
            leader,
            next_retry: None,
            taken_in_flight: false,
            changes,
            engine,
        }
    }

    /// Whether a batch is being performed.
    pub(super) fn in_flight(&self) -> bool {
        self.executor.in_flight()
    }

    /// The executor's report on the first batch in flight, and whether it was a prefetch;
    /// None if its task stopped.
    pub(super) async fn ran(&mut self) -> Option<(Ran, bool)> {
        self.executor.ran().await
    }

    /// Takes in what the executor did of a batch, and says what follows it: the next batch at
    /// once, a pass for what was taken in meanwhile, or nothing.
    pub(super) fn settle(&mut self, (ran, prefetched): (Ran, bool)) -> AfterBatch {
        self.next_retry = ran.next_retry;
        if prefetched {
            let now = Now {
                instant: Instant::now(),
                wall: Timestamp::now(),
            };
            self.engine.settle_prefetched(ran.done, now);
        } else {
            self.engine.settle(ran.done, Timestamp::now());
        }
        self.prefetch();
        if (self.engine.next_wake()).is_some_and(|at| at <= Instant::now()) {
            AfterBatch::PassNow
        } else if std::mem::take(&mut self.taken_in_flight) {
            AfterBatch::PassSoon
        } else {
            AfterBatch::Wait
        }
    }

    /// Hands the executor the next writes of the backlog to follow the batch in flight, so
    /// that it goes on writing while the pass after that batch runs (a converge of 100,000
    /// objects in batches of 1,024 otherwise pauses for a pass a hundred times).
    fn prefetch(&mut self) {
        if *self.leader.borrow() && self.executor.room_for_prefetch() {
            let effects = self.engine.prefetch();
            if !effects.is_empty() {
                tracing::debug!(writes = effects.len(), "prefetched");
                self.executor.send(effects, true);
            }
        }
    }

    /// When a pass must run though nothing changes: a retry of a failed write or one of the
    /// engine's wake-ups. None while a pass may not run: the report of what is in flight
    /// wakes the loop.
    pub(super) fn next_wake(&self) -> Option<Instant> {
        if !self.executor.may_pass() {
            return None;
        }
        [self.next_retry, self.engine.next_wake()]
            .into_iter()
            .flatten()
            .min()
    }

    /// Hands the engine every cache whose watch saw an event since the last pass; whether a
    /// pass has anything to do for them (always, when there were none: a timer, a retry, the
    /// leader's lease woke the loop).
    fn take_in_changes(&mut self) -> bool {
        let changed = self.changes.take();
        let stores = &self.stores;
        let mut inputs = Vec::new();
        if changed.contains(Watch::SharingPolicies) {
            inputs.push(Input::SharingPolicies(stores.sharing_policies.state()));
        }
        if changed.contains(Watch::Teams) {
            inputs.push(Input::Teams(stores.teams.state()));
        }
        if changed.contains(Watch::Namespaces)
            && let Some(((), namespaces)) = stores.namespaces.take()
        {
            inputs.push(Input::Namespaces(namespaces));
        }
        if changed.contains(Watch::DeviceClasses) {
            inputs.push(Input::DeviceClasses(stores.device_classes.state()));
        }
        // Slices, claims and owned objects: what changed since the last take, or everything at
        // the first (slices and claims also after a resync; owned objects are listed again
        // then, and what the list finds different is a change).
        if changed.contains(Watch::Slices)
            && let Some((reads, slices)) = stores.slices.take()
        {
            inputs.push(Input::Slices { reads, slices });
        }
        if changed.contains(Watch::Claims)
            && let Some(((), claims)) = stores.claims.take()
        {
            inputs.push(Input::Claims(claims));
        }
        if changed.contains(Watch::PendingPods)
            && let Some(((), pods)) = stores.pending_pods.take()
        {
            inputs.push(Input::PendingPods(pods));
        }
        if changed.contains(Watch::Pods)
            && let Some(((), pods)) = stores.pods.take()
        {
            inputs.push(Input::Pods(pods));
        }
        if changed.contains(Watch::Budgets)
            && let Some(budgets) = all(stores.budgets.state())
        {
            inputs.push(Input::Budgets(budgets));
        }
        if changed.contains(Watch::TaintRules)
            && let Some(rules) = stores.taint_rules.as_ref().and_then(|r| all(r.state()))
        {
            inputs.push(Input::TaintRules(rules));
        }
        if changed.contains(Watch::Crds) {
            inputs.push(Input::CrdOwners(stores.crd_owners()));
        }
        for (kind, store) in &stores.owned {
            if changed.contains(Watch::Owned(*kind))
                && let Some((_, objects)) = store.take()
            {
                inputs.push(Input::Owned {
                    kind: *kind,
                    objects,
                });
            }
        }
        let mut due = inputs.is_empty();
        let mut planned = false;
        for input in inputs {
            planned |= self.engine.take_in(input);
        }
        due |= planned;
        self.taken_in_flight |= planned && !self.executor.may_pass();
        due
    }

    /// Compares everything at the next pass, not only what the watches said changed, so that
    /// what they missed is repaired: every cache is read again, the owned objects are listed
    /// again (a version the cache did not have is compared when the list is complete), and
    /// the differ compares every object.
    pub(super) fn resync(&mut self) {
        self.stores.relist_owned();
        self.stores.take_all_next();
        self.changes.mark_all();
        self.engine.resync();
    }

    /// One pass; returns how long it spent reading the caches and planning, and false if the
    /// executor's task has stopped. While a batch is in flight (but a prefetch, see
    /// [`Task::may_pass`]), what changed is only taken in (each event into the planner's
    /// indexes): the pass after the batch's report plans it. Passes meanwhile would share
    /// the one thread with the writes and slow them.
    pub(super) fn reconcile(&mut self) -> (std::time::Duration, bool) {
        let started = Instant::now();
        if !self.executor.may_pass() {
            self.take_in_changes();
            return (started.elapsed(), true);
        }
        if !self.take_in_changes() {
            tracing::debug!("only namespace labels that nothing reads changed: no pass");
            return (started.elapsed(), true);
        }
        let taken_in = started.elapsed();
        let labels = metrics::ControllerLabels {
            controller: "teamgpu",
        };
        self.metrics.reconciles.get_or_create(&labels).inc();
        let now = Now {
            instant: Instant::now(),
            wall: Timestamp::now(),
        };
        // A pass hands out what is due by now, the retries of failed writes among it.
        self.next_retry = self.next_retry.filter(|at| *at > now.instant);
        let role = if *self.leader.borrow() {
            Role::Leader
        } else {
            Role::Follower
        };
        let mut running = true;
        let mut planned_in = None;
        match self.engine.pass(now, role) {
            Pass::ListSlices(reads) => {
                tracing::info!(keep = %reads.describe(), "listing ResourceSlices");
                self.stores.slice_reads.send_replace(Some(Arc::new(reads)));
            }
            Pass::AwaitSlices => {}
            Pass::Planned(planned) => {
                planned_in = Some(started.elapsed());
                let Planned {
                    plan,
                    statuses,
                    effects,
                } = *planned;
                self.metrics.observe(&plan, &statuses);
                drop((plan, statuses));
                tracing::debug!(
                    effects = effects.len(),
                    resident_mib = resident_mib(),
                    "planned"
                );
                if role == Role::Leader && !effects.is_empty() {
                    running = self.executor.send(effects, false);
                    self.prefetch();
                }
            }
        }
        self.metrics
            .reconcile_seconds
            .get_or_create(&labels)
            .observe(started.elapsed().as_secs_f64());
        // Where a pass's time goes: reading the caches, then planning (the writes are the
        // executor's task's).
        tracing::debug!(
            seconds = started.elapsed().as_secs_f64(),
            take_in_ms = taken_in.as_millis(),
            planned_ms = planned_in.map(|t| t.as_millis()),
            resident_mib = resident_mib(),
            "pass done"
        );
        (planned_in.unwrap_or_else(|| started.elapsed()), running)
    }
}
