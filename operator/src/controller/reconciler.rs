//! One pass, as I/O around the [`Engine`]: read the caches whose watch changed into
//! [`Input`]s, run the engine's pass and queue its effects for the executor, whose task does
//! the writes while passes go on; what it did is settled as it comes back. Nothing here
//! decides.

use std::sync::Arc;
use std::time::Instant;

use k8s_openapi::jiff::Timestamp;
use tokio::sync::{mpsc, watch};

use super::AbortOnDrop;
use super::executor::{Batch, Executor, Ran};
use super::metrics::{self, Metrics};
use super::observe::{self, Stores, Watch};
use super::{Config, resident_mib};
use crate::core::diff::LiveObject;
use crate::core::effects::ReclaimDefaults;
use crate::core::engine::{Engine, Input, Now, Pass, Planned, Role, Settings};

/// Runs the engine on what the watches changed, and has the executor do what it asks for.
pub(super) struct Reconciler {
    stores: Stores,
    metrics: Arc<Metrics>,
    /// Whether this replica holds the lease.
    leader: watch::Receiver<bool>,
    /// To the executor's task, which does every write.
    batches: mpsc::Sender<Batch>,
    /// What the executor did of each batch.
    pub(super) ran: mpsc::UnboundedReceiver<Ran>,
    _executor: AbortOnDrop<()>,
    /// The earliest retry of a failed write the executor named, until a pass runs after it.
    next_retry: Option<Instant>,
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
        });
        // The slices may be listing already (asked for early, see `Stores::list_slices_early`).
        if let Some(reads) = stores.slice_reads.borrow().as_deref() {
            engine.take_in(Input::SliceListAsked(reads.clone()));
        }
        let (batches, ran, task) = executor.spawn();
        Self {
            stores,
            metrics,
            leader,
            batches,
            ran,
            _executor: AbortOnDrop(task),
            next_retry: None,
            changes,
            engine,
        }
    }

    /// Takes in what the executor did of a batch. It wakes no pass: an own write's watch event
    /// does, and so does a failed write's retry or a refused eviction's, at [`Self::next_wake`].
    pub(super) fn settle(&mut self, ran: Ran) {
        self.next_retry = [self.next_retry, ran.next_retry]
            .into_iter()
            .flatten()
            .min();
        self.engine.settle(ran.done, Timestamp::now());
    }

    /// When a pass must run though nothing changes: a retry of a failed write (the batch that
    /// performs it is planned by that pass), or the engine's wake-ups.
    pub(super) fn next_wake(&self) -> Option<Instant> {
        [self.next_retry, self.engine.next_wake()]
            .into_iter()
            .flatten()
            .min()
    }

    /// Hands the engine every cache whose watch saw an event since the last pass.
    fn take_in_changes(&mut self) {
        let changed = self.changes.take();
        let stores = &self.stores;
        let mut inputs = Vec::new();
        if changed.contains(Watch::SharingPolicies) {
            inputs.push(Input::SharingPolicies(stores.sharing_policies.state()));
        }
        if changed.contains(Watch::Teams) {
            inputs.push(Input::Teams(stores.teams.state()));
        }
        if changed.contains(Watch::Namespaces) {
            inputs.push(Input::Namespaces(
                all(stores.namespaces.state()).unwrap_or_default(),
            ));
        }
        if changed.contains(Watch::DeviceClasses) {
            inputs.push(Input::DeviceClasses(stores.device_classes.state()));
        }
        // Slices and claims: what changed since the last take, or everything at the first
        // and after a resync.
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
        if changed.contains(Watch::PendingPods) {
            inputs.push(Input::PendingPods(stores.pending_pods.state()));
        }
        if changed.contains(Watch::Pods) {
            inputs.extend(all(stores.pods.state()).map(Input::Pods));
        }
        if changed.contains(Watch::Crds) {
            inputs.push(Input::CrdOwners(stores.crd_owners()));
        }
        for (kind, store) in &stores.owned {
            if changed.contains(Watch::Owned(*kind))
                && let Some(objects) = all(store.state())
            {
                let objects = objects.into_iter().map(LiveObject::Owned).collect();
                inputs.push(Input::Owned {
                    kind: *kind,
                    objects,
                });
            }
        }
        for input in inputs {
            self.engine.take_in(input);
        }
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

    pub(super) async fn reconcile(&mut self) {
        let labels = metrics::ControllerLabels {
            controller: "teamgpu",
        };
        // Room for this pass's batch first: the pass then plans on what the watches hold once
        // the executor has taken the batch before (none if its task stopped).
        let Ok(room) = self.batches.clone().reserve_owned().await else {
            return;
        };
        // The pass's own time: planning, not the wait for room nor the writes.
        let started = Instant::now();
        self.metrics.reconciles.get_or_create(&labels).inc();
        // What the executor finished meanwhile is no longer in flight.
        while let Ok(ran) = self.ran.try_recv() {
            self.settle(ran);
        }
        self.take_in_changes();
        let taken_in = started.elapsed();
        let now = Now {
            instant: Instant::now(),
            wall: Timestamp::now(),
        };
        // This pass hands out what is due by now.
        self.next_retry = self.next_retry.filter(|at| *at > now.instant);
        let role = if *self.leader.borrow() {
            Role::Leader
        } else {
            Role::Follower
        };
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
                    batch,
                } = *planned;
                self.metrics.observe(&plan, &statuses);
                drop((plan, statuses));
                tracing::debug!(
                    effects = effects.len(),
                    resident_mib = resident_mib(),
                    "planned"
                );
                if !effects.is_empty() {
                    room.send(Batch {
                        number: batch,
                        effects,
                    });
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
    }
}
