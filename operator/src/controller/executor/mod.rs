//! The only code that writes: performs a pass's [`Effect`]s, the same way for every kind. Only
//! the leader writes; each request has a timeout; each failure is logged with its object,
//! counted, and backed off per object (exponential, with jitter), so one object the API server
//! refuses never holds up the others or hammers the server. It runs as a task of its own
//! ([`Executor::spawn`]), one batch at a time, off the planning path. Needs a client.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use kube::runtime::events::Reporter;
use tokio::sync::{mpsc, watch};

mod backoff;
mod error;
mod jobs;
mod requests;

use super::metrics::{ErrorLabels, EvictionLabels, Metrics};
use crate::core::diff::{Kind, OwnWrites, Write};
use crate::core::effects::{Effect, Eviction, FailedWrite, Taken, eviction_events};
use crate::core::engine::Done;
use backoff::Backoff;
pub use error::WriteError;
use requests::Requests;

/// Writes in flight at once within one phase. The API server handles concurrent writes well; one
/// at a time, a first converge of thousands of templates would hold up every later event.
/// Kept full (a new write starts as soon as one ends), as a plain client would.
const WRITE_CONCURRENCY: usize = 16;

/// How long one write may take before it counts as failed (and is retried with backoff).
const WRITE_TIMEOUT: Duration = Duration::from_secs(30);

/// What one effect did.
enum Outcome {
    Applied(Option<String>),
    Done,
    /// How a workload was taken back.
    Taken(Taken),
}

/// What the executor's task did of one batch.
#[derive(Debug)]
pub struct Ran {
    pub done: Done,
    /// When the next failed write is due for a retry (see [`Executor::next_retry`]).
    pub next_retry: Option<Instant>,
}

/// The executor's task ([`Executor::spawn`]): batches go in through a channel, at most
/// [`BATCHES_OUT`] at once, and what it did of each comes back, in order. Stopped when
/// dropped.
#[derive(Debug)]
pub struct Task {
    batches: mpsc::Sender<Vec<Effect>>,
    ran: mpsc::Receiver<Ran>,
    /// The batches sent whose reports have not been taken, first the one performed: whether
    /// each is a prefetch (object writes from the backlog, see `Engine::prefetch`).
    sent: VecDeque<bool>,
    task: tokio::task::JoinHandle<()>,
}

/// Batches handed to the task at once: the one performed, and the one that follows it
/// without a pause.
const BATCHES_OUT: usize = 2;

impl Task {
    /// Whether a batch is being performed.
    pub fn in_flight(&self) -> bool {
        !self.sent.is_empty()
    }

    /// Whether a pass may run now: nothing is in flight, or only a prefetch (whose objects a
    /// pass leaves alone) with room behind it for the pass's batch. Any other batch may have
    /// statuses, Events or evictions in flight, which a pass would ask for again.
    pub fn may_pass(&self) -> bool {
        self.sent.iter().all(|prefetch| *prefetch) && self.sent.len() < BATCHES_OUT
    }

    /// Whether a prefetch may follow what is in flight: one batch of a pass is, and none
    /// waits. (Behind a prefetch comes the batch of the pass that runs during it.)
    pub fn room_for_prefetch(&self) -> bool {
        self.sent.len() == 1 && !self.sent[0]
    }

    /// Hands `effects` to the task (a `prefetch`, or a pass's); false if it has stopped (a
    /// bug: it never returns while batches can come).
    pub fn send(&mut self, effects: Vec<Effect>, prefetch: bool) -> bool {
        debug_assert!(self.sent.len() < BATCHES_OUT, "batches out already");
        let sent = self.batches.try_send(effects).is_ok();
        if sent {
            self.sent.push_back(prefetch);
        }
        sent
    }

    /// What the task did of the first batch in flight once it is done, and whether it was a
    /// prefetch; None if the task stopped. Cancel-safe: a report not taken stays for the next
    /// call.
    pub async fn ran(&mut self) -> Option<(Ran, bool)> {
        let ran = self.ran.recv().await?;
        Some((ran, self.sent.pop_front().unwrap_or_default()))
    }
}

impl Drop for Task {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Effects of one phase may run concurrently; phases run one after another, in the order the
/// pass gives: guard labels taken off, objects (applies in dependency order, then deletions in
/// reverse), guard labels set (after the quotas they say are in force), statuses (of
/// the teams whose own use changed, then the others),
/// wake-ups of waiting Pods (after the quotas that make their room), Jobs resumed, Events, evictions. The applies of admission objects run beside those of quotas and
/// templates ([`Phase::lane`]).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Phase {
    Object { delete: bool, kind: Kind },
    Label,
    Status { urgent: bool },
    Requeue,
    Event,
    Evict,
    Resume,
}

impl Phase {
    fn of(effect: &Effect) -> Phase {
        match effect {
            Effect::Object(Write::Apply { key, .. } | Write::Recreate { key, .. }) => {
                Phase::Object {
                    delete: false,
                    kind: key.kind,
                }
            }
            Effect::Object(Write::Delete { key }) => Phase::Object {
                delete: true,
                kind: key.kind,
            },
            Effect::Status { urgent, .. } => Phase::Status { urgent: *urgent },
            Effect::Label(_) => Phase::Label,
            Effect::Requeue(_) => Phase::Requeue,
            Effect::Event(_) => Phase::Event,
            Effect::Evict(_) => Phase::Evict,
            Effect::Resume(_) => Phase::Resume,
        }
    }

    /// The lane of an apply that runs beside the other lane's. The admission policies and
    /// their bindings need nothing of the quotas and templates, nor these of them (teamgpu's
    /// own writes are exempt from its policies): a policy the API server takes seconds to
    /// admit does not hold up the quotas. Each lane keeps its order: policies before their
    /// bindings, the quotas that enforce an entitlement before the templates that invite
    /// claims.
    fn lane(self) -> Option<usize> {
        match self {
            Phase::Object {
                delete: false,
                kind: Kind::ValidatingAdmissionPolicy | Kind::ValidatingAdmissionPolicyBinding,
            } => Some(0),
            Phase::Object {
                delete: false,
                kind: Kind::ResourceQuota | Kind::ResourceClaimTemplate,
            } => Some(1),
            _ => None,
        }
    }
}

/// Lanes that run side by side; a lane is phases that run one after another.
type Lanes = Vec<Vec<Vec<Effect>>>;

/// `effects`, in the pass's order, as steps that run one after another: a phase alone, or the
/// phases that have a [`Phase::lane`] in their lanes.
fn steps(effects: Vec<Effect>) -> Vec<Lanes> {
    let mut phases: Vec<(Phase, Vec<Effect>)> = Vec::new();
    for effect in effects {
        let phase = Phase::of(&effect);
        match phases.last_mut() {
            Some((last, batch)) if *last == phase => batch.push(effect),
            _ => phases.push((phase, vec![effect])),
        }
    }
    let mut steps: Vec<Lanes> = Vec::new();
    let mut in_lanes = false;
    for (phase, batch) in phases {
        match phase.lane() {
            Some(lane) => {
                if !in_lanes {
                    steps.push(vec![Vec::new(), Vec::new()]);
                    in_lanes = true;
                }
                if let Some(lanes) = steps.last_mut() {
                    lanes[lane].push(batch);
                }
            }
            None if phase == Phase::Event => {
                steps.extend(
                    series_rounds(batch)
                        .into_iter()
                        .map(|round| vec![vec![round]]),
                );
                in_lanes = false;
            }
            None => {
                steps.push(vec![vec![batch]]);
                in_lanes = false;
            }
        }
    }
    steps
}

/// Events in rounds that run one after another, each with at most one Event of a series (the
/// object, reason, action and type the recorder folds a repeat by): the recorder makes a
/// repeat part of its series only when it knows of the first. A first converge at 1,000 team
/// namespaces publishes over a thousand Events, each in its own series; one at a time they
/// held up the next batch for seconds.
fn series_rounds(events: Vec<Effect>) -> Vec<Vec<Effect>> {
    let mut rounds: Vec<Vec<Effect>> = Vec::new();
    let mut seen = std::collections::HashMap::new();
    for effect in events {
        let series = match &effect {
            Effect::Event(e) => {
                format!("{:?}/{}/{}/{:?}", e.regarding, e.reason, e.action, e.type_)
            }
            other => other.id(),
        };
        let round: &mut usize = seen.entry(series).or_default();
        if rounds.len() <= *round {
            rounds.push(Vec::new());
        }
        rounds[*round].push(effect);
        *round += 1;
    }
    rounds
}

/// Performs effects: server-side apply as [`super::FIELD_MANAGER`], status patches, Events,
/// evictions.
pub struct Executor {
    requests: Arc<Requests>,
    metrics: Arc<Metrics>,
    leader: watch::Receiver<bool>,
    backoff: Backoff,
}

impl std::fmt::Debug for Executor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Executor")
            .field("backoff", &self.backoff)
            .finish_non_exhaustive()
    }
}

impl Executor {
    pub fn new(
        client: kube::Client,
        metrics: Arc<Metrics>,
        leader: watch::Receiver<bool>,
        reporter: Reporter,
        own_writes: Arc<OwnWrites>,
    ) -> Self {
        let requests = Requests::new(
            client,
            metrics.clone(),
            reporter,
            own_writes,
            WRITE_CONCURRENCY,
        );
        Self {
            requests: Arc::new(requests),
            metrics,
            leader,
            backoff: Backoff::default(),
        }
    }

    pub fn is_leader(&self) -> bool {
        *self.leader.borrow()
    }

    /// When the next failed write is due for a retry (never for a replica that is not the
    /// leader: it writes nothing).
    pub fn next_retry(&self) -> Option<Instant> {
        if !self.is_leader() {
            return None;
        }
        self.backoff.next_retry(Instant::now())
    }

    /// Runs as a task of its own, off the planning path: it performs each batch sent to
    /// [`Task::send`] and reports what it did, while the reconciler goes on taking in events.
    pub fn spawn(mut self) -> Task {
        // Once this replica leads: the Jobs reclaim suspended before a restart are resumed.
        let (requests, mut leader) = (self.requests.clone(), self.leader.clone());
        tokio::spawn(async move {
            if leader.wait_for(|leads| *leads).await.is_ok() {
                requests.resume_left_suspended().await;
            }
        });
        // Batches are performed one after another; the next one may wait in the channel.
        let (batches, mut to_run) = mpsc::channel::<Vec<Effect>>(BATCHES_OUT);
        let (report, ran) = mpsc::channel(1);
        let task = tokio::spawn(async move {
            while let Some(effects) = to_run.recv().await {
                let done = self.run(effects).await;
                let next_retry = self.next_retry();
                if report.send(Ran { done, next_retry }).await.is_err() {
                    return;
                }
            }
        });
        Task {
            batches,
            ran,
            sent: VecDeque::new(),
            task,
        }
    }

    /// Performs `effects` in their order, skipping those still backing off, and stops starting
    /// them at once when this replica loses the lease. An eviction's outcome is then told by
    /// the Events [`eviction_events`] gives.
    pub async fn run(&mut self, effects: Vec<Effect>) -> Done {
        let started = Instant::now();
        let mut done = Done::default();
        let follow_ups = self.run_phases(effects, &mut done).await;
        self.run_phases(follow_ups, &mut done).await;
        self.backoff.forget_due(started);
        done
    }

    /// Performs `effects` phase by phase; returns the Events that tell of the evictions.
    async fn run_phases(&mut self, effects: Vec<Effect>, done: &mut Done) -> Vec<Effect> {
        let now = Instant::now();
        let ready: Vec<Effect> = effects
            .into_iter()
            .filter(|e| self.backoff.ready(&e.id(), now))
            .collect();
        let mut follow_ups = Vec::new();
        // Each effect is moved, never copied, and settled as soon as its request ends: a first
        // converge's 10,000 applies are held once.
        for lanes in steps(ready) {
            if !self.is_leader() {
                break;
            }
            let lanes = lanes
                .into_iter()
                .filter(|lane| !lane.is_empty())
                .map(|lane| self.lane(lane));
            let mut results = futures::stream::select_all(lanes);
            while let Some((effect, result)) = results.next().await {
                follow_ups.extend(self.settle(&effect, result, done));
            }
        }
        follow_ups
    }

    /// The results of a lane's phases, one phase after another; all lanes together have at
    /// most [`WRITE_CONCURRENCY`] requests in flight.
    fn lane(
        &self,
        phases: Vec<Vec<Effect>>,
    ) -> impl futures::Stream<Item = (Effect, Result<Outcome, WriteError>)> + Unpin + use<> {
        // Owned futures: a future that borrows the executor would not be `Send` for every
        // lifetime, which `tokio::spawn` of the operator needs.
        let leader = self.leader.clone();
        let requests = self.requests.clone();
        Box::pin(futures::stream::iter(phases).flat_map(move |phase| {
            let (leader, requests) = (leader.clone(), requests.clone());
            futures::stream::iter(phase)
                // Checked before every write: a replica that lost the lease starts no more.
                .take_while(move |_| std::future::ready(*leader.borrow()))
                .map(move |effect| {
                    let requests = requests.clone();
                    async move {
                        let _turn = requests.in_flight.acquire().await;
                        let result = requests.perform(&effect).await;
                        (effect, result)
                    }
                })
                .buffer_unordered(WRITE_CONCURRENCY)
        }))
    }

    /// Takes in the result of `effect`: logged, counted, and backed off when it failed.
    fn settle(
        &mut self,
        effect: &Effect,
        result: Result<Outcome, WriteError>,
        done: &mut Done,
    ) -> Vec<Effect> {
        let id = effect.id();
        match &result {
            Ok(_) => self.backoff.succeeded(&id),
            Err(_) => self.backoff.failed(&id, Instant::now()),
        }
        if let Effect::Evict(eviction) = effect {
            return self.evicted(eviction, result, done);
        }
        match (effect, result) {
            (Effect::Object(write), Ok(outcome)) => {
                tracing::info!(object = %write.key(), action = effect.verb(), "wrote");
                match outcome {
                    Outcome::Applied(version) => done.applied.push((write.key().clone(), version)),
                    Outcome::Done | Outcome::Taken(_) => done.deleted.push(write.key().clone()),
                }
            }
            (Effect::Object(write), Err(error)) => {
                self.count_error(&error);
                tracing::warn!(object = %id, action = effect.verb(), %error, "write failed; retrying with backoff");
                done.failed.push(FailedWrite {
                    key: write.key().clone(),
                    verb: effect.verb(),
                    message: error.message(),
                    failure: error.failure(),
                });
            }
            (Effect::Event(event), Ok(_)) => done.published.push(event.key()),
            (Effect::Label(label), Ok(_)) => {
                tracing::info!(object = %id, value = ?label.value, "wrote");
                done.labelled.push(label.clone());
            }
            (Effect::Resume(r), Ok(_)) => {
                tracing::info!(object = %id, "resumed the Job reclaim suspended");
                done.resumed.push((r.namespace.clone(), r.job.clone()));
            }
            (Effect::Status { kind, name, .. }, Ok(_)) => {
                tracing::debug!(object = %id, action = effect.verb(), "wrote");
                done.statuses.push((*kind, name.clone()));
            }
            (_, Ok(_)) => tracing::debug!(object = %id, action = effect.verb(), "wrote"),
            (_, Err(error)) => {
                self.count_error(&error);
                tracing::warn!(object = %id, action = effect.verb(), %error, "write failed; retrying with backoff");
            }
        }
        Vec::new()
    }

    /// Counts an eviction's outcome; returns the Events that tell of it.
    fn evicted(
        &self,
        e: &Eviction,
        result: Result<Outcome, WriteError>,
        done: &mut Done,
    ) -> Vec<Effect> {
        if let (Ok(Outcome::Taken(Taken::Suspended)), Some(job), Some((namespace, _))) =
            (&result, &e.job, e.pods.first())
        {
            let pods = e.pods.iter().map(|(_, pod)| pod.clone()).collect();
            done.suspended
                .push(((namespace.clone(), job.clone()), pods));
        }
        let (taken, error) = match result {
            Ok(Outcome::Taken(taken)) => (taken, None),
            Ok(_) => (Taken::Evicted, None),
            Err(error) => (Taken::Evicted, Some(error)),
        };
        let labels = EvictionLabels {
            team: e.order.borrower.clone(),
            reason: e.why.label(),
            sharing_policy: e.order.sharing_policy.clone(),
            for_team: e.order.for_team.clone(),
        };
        let refusal = error.map(|error| error.refusal());
        let events = eviction_events(e, refusal.as_deref().map_or(Ok(taken), Err));
        let note = events.first().map(|e| e.note.as_str()).unwrap_or_default();
        let pods = e.pods.len() as u64;
        if refusal.is_some() {
            self.metrics.evictions_refused.get_or_create(&labels).inc();
            done.evictions_refused
                .push((e.pods.clone(), Instant::now()));
            tracing::info!(%note, "eviction refused");
        } else {
            let at = Instant::now();
            done.evicted
                .extend(e.pods.iter().map(|pod| (pod.clone(), at)));
            let workload = (e.order.borrower.clone(), e.workload.clone());
            done.evicted_workloads.push((workload, at));
            self.metrics.evictions.get_or_create(&labels).inc_by(pods);
            tracing::info!(%note, "reclaim");
        }
        events
            .into_iter()
            .map(|e| Effect::Event(Box::new(e)))
            .collect()
    }

    fn count_error(&self, error: &WriteError) {
        self.metrics
            .errors
            .get_or_create(&ErrorLabels {
                controller: "teamgpu",
                error: error.metric_label(),
            })
            .inc();
    }
}

#[cfg(test)]
mod tests;
