//! `teamgpu run`: observe -> plan -> diff -> execute. Only this module touches the API.
//!
//! One reconciler, woken by watch events (debounced), takes in only the caches that changed,
//! plans with the kept [`Planner`] (which recomputes only what changed inputs feed) and hands
//! what the kept [`Differ`] finds different, with the statuses, Events and evictions of
//! [`crate::core::effects`], to the executor, the only code that writes, in a task of its own:
//! events are taken in while it writes, and planned after its report. A steady state makes no
//! write. Only the leader writes; every replica keeps warm caches. See
//! docs/operator.md.
//!
//! [`Planner`]: crate::core::plan::Planner
//! [`Differ`]: crate::core::diff::Differ

mod changes;
mod executor;
mod http;
pub mod metrics;
mod observe;
mod pods;
mod projected;
mod reconciler;
mod reflect;
pub mod taint_rules;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use kube::api::{ListParams, PostParams};
use kube::runtime::events::Reporter;
use kube::{Api, Client};
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::api::{GpuSharingPolicy, TeamGpuPolicy};
use executor::Executor;
pub use metrics::Metrics;
use reconciler::{AfterBatch, Reconciler};

/// The field manager of every write.
pub const FIELD_MANAGER: &str = "teamgpu";

/// How long work may wait for a pass before /healthz fails: ten times the longest pass
/// measured, the 29 s first converge of the benchmark cluster (docs/sizing.md), which writes
/// 10,000 objects in one pass.
pub const DEFAULT_HEALTHZ_STALL: Duration = Duration::from_secs(300);

/// How the operator runs.
#[derive(Clone, Debug)]
pub struct Config {
    /// Elect a leader on a Lease; without it this replica always writes.
    pub leader_elect: bool,
    pub lease_namespace: String,
    pub lease_name: String,
    /// This replica's identity in the Lease (the Pod name).
    pub identity: String,
    /// How long a Lease holds without renewal: the longest a crashed leader blocks a successor.
    pub lease_duration: Duration,
    /// Serves /metrics (and /healthz, /readyz).
    pub metrics_addr: SocketAddr,
    /// A second listener for the probes (/healthz, /readyz), kubebuilder-style; none by default.
    pub health_addr: Option<SocketAddr>,
    /// Whether teams reclaim borrowed devices by eviction unless their policy says otherwise.
    pub reclaim_default: bool,
    /// How long a team waits below its guarantee before borrowers' workloads are evicted.
    pub reclaim_grace: Duration,
    /// How long a borrower's workload runs before reclaim may evict it, unless the waiting
    /// team's policy says otherwise.
    pub reclaim_min_runtime: Duration,
    /// A resync at this interval as a safety net: every cache read again, the owned objects
    /// listed again and every object compared, so that a change a watch missed is repaired; it
    /// writes nothing when nothing differs.
    pub resync: Duration,
    /// Paces passes: planning may take half of one core over time, with up to this much
    /// planning banked for a burst, and no event waits longer than this for its pass. An event
    /// after a quiet spell, or a user's next claim right after the last one's status, is
    /// planned at once (after [`GATHER`]).
    pub debounce: Duration,
    /// Groups that may move any namespace into or out of any team and exempt namespaces
    /// (`None`: [`crate::core::plan::namespace_admission::DEFAULT_ADMIN_GROUPS`]).
    pub admin_groups: Option<Vec<String>>,
    /// What teamgpu's admission bindings do with a request that breaks a rule (`Warn` or
    /// `Audit` to see first what `Deny` would refuse).
    pub enforcement: crate::core::plan::admission::Enforcement,
    /// /healthz fails once work has waited this long without a pass finishing; zero: never.
    pub healthz_stall: Duration,
    /// Object writes one batch carries at most (see [`crate::core::engine::WRITES_PER_BATCH`]).
    pub writes_per_batch: usize,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            leader_elect: false,
            lease_namespace: "teamgpu-system".into(),
            lease_name: "teamgpu-leader".into(),
            identity: "teamgpu".into(),
            lease_duration: Duration::from_secs(10),
            metrics_addr: ([0, 0, 0, 0], 8080).into(),
            health_addr: None,
            reclaim_default: false,
            reclaim_grace: Duration::from_secs(120),
            reclaim_min_runtime: Duration::ZERO,
            resync: Duration::from_secs(3600),
            debounce: Duration::from_millis(100),
            admin_groups: None,
            enforcement: crate::core::plan::admission::Enforcement::Deny,
            healthz_stall: DEFAULT_HEALTHZ_STALL,
            writes_per_batch: crate::core::engine::WRITES_PER_BATCH,
        }
    }
}

/// What stops the operator.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "the teamgpu CRDs are not installed ({0}); install them with `kubectl apply -k config/crd` \
         (or `kubectl apply -k config/default`) and start again"
    )]
    CrdsMissing(String),
    #[error("talking to the API server: {0}")]
    Api(#[from] kube::Error),
    #[error("serving metrics on {addr}: {source}")]
    Metrics {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("leader election: {0}")]
    Lease(#[from] kube_lease_manager::LeaseManagerError),
    #[error("the watch caches never synced")]
    NotSynced,
    #[error("the API server does not say who this operator is (anonymous access?)")]
    Anonymous,
    #[error("the executor's task stopped (a bug): nothing could be written")]
    ExecutorStopped,
}

/// The user name this operator writes as (a SelfSubjectReview, which every authenticated user
/// may create), so that its own admission policies leave its writes alone.
async fn own_user_name(client: &Client) -> Result<String, Error> {
    use k8s_openapi::api::authentication::v1::SelfSubjectReview;
    let review = Api::<SelfSubjectReview>::all(client.clone())
        .create(&PostParams::default(), &SelfSubjectReview::default())
        .await?;
    review
        .status
        .and_then(|s| s.user_info)
        .and_then(|u| u.username)
        .filter(|u| !u.is_empty())
        .ok_or(Error::Anonymous)
}

/// `step` again, with backoff (0.2 s doubling up to 5 s), while it fails in a way that may pass: a
/// server error, throttling, or no connection (an API server restarting). Anything else, such
/// as missing CRDs, is returned at once.
async fn retry_transient<T, F, Fut>(mut step: F) -> Result<T, Error>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, Error>>,
{
    let mut delay = Duration::from_millis(200);
    loop {
        match step().await {
            Err(Error::Api(error)) if is_transient(&error) => {
                tracing::warn!(%error, "start-up request failed; retrying in {delay:?}");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(5));
            }
            other => return other,
        }
    }
}

fn is_transient(error: &kube::Error) -> bool {
    match error {
        kube::Error::Api(status) => status.code >= 500 || status.code == 429,
        kube::Error::Service(_) | kube::Error::HyperError(_) => true,
        _ => false,
    }
}

/// `step`'s output, or None when `stop` comes first.
async fn stop_or<T>(
    stop: impl std::future::Future<Output = ()>,
    step: impl std::future::Future<Output = T>,
) -> Option<T> {
    tokio::select! {
        output = step => Some(output),
        () = stop => None,
    }
}

/// Check that both CRDs are served: a clear error beats a watch that retries forever.
async fn check_crds(client: &Client) -> Result<(), Error> {
    let lp = ListParams::default().limit(1);
    for result in [
        Api::<GpuSharingPolicy>::all(client.clone())
            .list_metadata(&lp)
            .await
            .map(drop),
        Api::<TeamGpuPolicy>::all(client.clone())
            .list_metadata(&lp)
            .await
            .map(drop),
    ] {
        match result {
            Err(kube::Error::Api(status)) if status.code == 404 => {
                return Err(Error::CrdsMissing(status.message));
            }
            other => other?,
        }
    }
    Ok(())
}

/// Run until `shutdown` resolves (SIGTERM in the binary), then release the lease.
pub async fn run(
    client: Client,
    config: Config,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), Error> {
    use futures::FutureExt as _;
    // Observed during start-up too, where an API server that does not answer could hold us.
    let shutdown = shutdown.shared();
    let stopped = || {
        let shutdown = shutdown.clone();
        async move {
            shutdown.await;
            tracing::info!("shutting down during start-up");
        }
    };
    let Some(operator_user) = stop_or(stopped(), start_up(&client)).await else {
        return Ok(());
    };
    let operator_user = operator_user?;
    let metrics = Arc::new(Metrics::default());
    let ready = Arc::new(AtomicBool::new(false));
    let progress = Arc::new(http::LoopProgress::default());
    let _endpoints = serve_endpoints(&config, &ready, &metrics, &progress).await?;

    let wake = observe::Wake::default();
    let mut watches = JoinSet::new();
    let taint_rules = taint_rules::served(&client).await;
    if let Some(resource) = &taint_rules {
        tracing::info!(version = %resource.api_version, "watching DeviceTaintRules");
    }
    let stores = observe::start(&client, &wake, &mut watches, taint_rules);
    let Some(election) = stop_or(stopped(), elect_leader(&client, &config)).await else {
        return Ok(());
    };
    let (leader, lease) = election?;

    tokio::select! {
        (synced, ()) = async { futures::join!(stores.wait_until_ready(), stores.list_slices_early()) } => {
            if !synced { return Err(Error::NotSynced) }
        },
        () = tokio::time::sleep(Duration::from_secs(300)) => return Err(Error::NotSynced),
        () = stopped() => return Ok(()),
    }
    ready.store(true, Ordering::Relaxed);
    tracing::info!(resident_mib = resident_mib(), "watch caches synced");

    let reporter = Reporter {
        controller: FIELD_MANAGER.into(),
        instance: Some(config.identity.clone()),
    };
    let executor = Executor::new(
        client.clone(),
        metrics.clone(),
        leader.clone(),
        reporter,
        stores.own_writes.clone(),
    );
    let executor = (executor, leader.clone());
    let notify = wake.notify.clone();
    let reconciler = Reconciler::new(
        &config,
        stores,
        metrics.clone(),
        executor,
        wake.changes.clone(),
        operator_user,
    );
    let executor_stopped = tokio::select! {
        () = reconcile_loop(reconciler, &config, &notify, leader, &metrics, &progress) => true,
        () = shutdown => {
            tracing::info!("shutting down");
            false
        }
    };
    watches.shutdown().await;
    if let Some(lease) = lease {
        lease.release().await;
    }
    if executor_stopped {
        return Err(Error::ExecutorStopped);
    }
    Ok(())
}

/// Checks that the CRDs are served and learns who this operator is; retried while the API
/// server is not there yet.
async fn start_up(client: &Client) -> Result<String, Error> {
    retry_transient(|| check_crds(client)).await?;
    let operator_user = retry_transient(|| own_user_name(client)).await?;
    tracing::info!(user = %operator_user, "exempt from teamgpu's own admission policies");
    Ok(operator_user)
}

/// Serves /metrics and the probes, and the probes on their own listener if configured; the
/// servers stop when the returned handles are dropped.
async fn serve_endpoints(
    config: &Config,
    ready: &Arc<AtomicBool>,
    metrics: &Arc<Metrics>,
    progress: &Arc<http::LoopProgress>,
) -> Result<Vec<AbortOnDrop<()>>, Error> {
    let mut servers = Vec::new();
    for addr in std::iter::once(config.metrics_addr).chain(config.health_addr) {
        let health = http::Health {
            ready: ready.clone(),
            metrics: metrics.clone(),
            progress: progress.clone(),
            stall_bound: config.healthz_stall,
        };
        let (_, task) = http::serve(addr, health)
            .await
            .map_err(|source| Error::Metrics { addr, source })?;
        servers.push(AbortOnDrop(task));
    }
    Ok(servers)
}

/// The tasks that hold the Lease: the lease manager's, and the one that forwards its state.
struct Lease {
    forward: AbortOnDrop<()>,
    manager: AbortOnDrop<
        Result<kube_lease_manager::LeaseManager, kube_lease_manager::LeaseManagerError>,
    >,
}

impl Lease {
    /// Hands the Lease back, so a successor need not wait for it to expire: dropping the last
    /// receiver of the lease state makes the lease task release it.
    async fn release(mut self) {
        self.forward.0.abort();
        let _ = (&mut self.forward.0).await;
        let released = tokio::time::timeout(Duration::from_secs(5), &mut self.manager.0).await;
        if let Ok(Ok(Err(error))) = released {
            tracing::warn!(%error, "releasing the lease");
        }
    }
}

/// Whether this replica may write, as it changes; with leader election, the Lease that decides.
async fn elect_leader(
    client: &Client,
    config: &Config,
) -> Result<(watch::Receiver<bool>, Option<Lease>), Error> {
    let (leader_tx, leader) = watch::channel(!config.leader_elect);
    if !config.leader_elect {
        return Ok((leader, None));
    }
    let manager = kube_lease_manager::LeaseManagerBuilder::new(client.clone(), &config.lease_name)
        .with_namespace(&config.lease_namespace)
        .with_identity(&config.identity)
        .with_duration(config.lease_duration.as_secs().max(2))
        .with_grace((config.lease_duration.as_secs() / 3).max(1))
        .build()
        .await?;
    let (mut state, task) = manager.watch().await;
    let forward = tokio::spawn(async move {
        while state.changed().await.is_ok() {
            let is_leader = *state.borrow_and_update();
            if leader_tx.send(is_leader).is_err() {
                break;
            }
        }
    });
    let lease = Lease {
        forward: AbortOnDrop(forward),
        manager: AbortOnDrop(task),
    };
    Ok((leader, Some(lease)))
}

/// Passes, each after a debounced watch event, a change of leadership, a retry or reclaim
/// that is due, the resync interval, or the executor's report on a batch (settled first).
/// Returns only if the executor's task stopped.
async fn reconcile_loop(
    mut reconciler: Reconciler,
    config: &Config,
    notify: &tokio::sync::Notify,
    mut leader: watch::Receiver<bool>,
    metrics: &Metrics,
    progress: &http::LoopProgress,
) {
    let mut leader_open = config.leader_elect;
    let mut next_resync = Instant::now() + config.resync;
    let mut budget = PassBudget::new(Instant::now(), config.debounce);
    loop {
        let wake_at = (reconciler.next_wake()).map_or(next_resync, |at| at.min(next_resync));
        let in_flight = reconciler.in_flight();
        tokio::select! {
            // What the executor did is settled; the next batch follows at once, what changed
            // meanwhile after the events that come with the batch's own.
            ran = reconciler.ran(), if in_flight => {
                let Some(ran) = ran else { return };
                match reconciler.settle(ran) {
                    AfterBatch::PassNow => {}
                    AfterBatch::PassSoon => {
                        tokio::time::sleep_until(budget.due(Instant::now()).into()).await;
                    }
                    AfterBatch::Wait => continue,
                }
            }
            () = notify.notified() => {
                tokio::time::sleep_until(budget.due(Instant::now()).into()).await;
            }
            // Without leader election (or once the lease task is gone) nothing will change:
            // a closed channel answers at once, and would make this loop spin.
            changed = leader.changed(), if leader_open => leader_open = changed.is_ok(),
            () = tokio::time::sleep_until(wake_at.into()) => {}
        }
        progress.work_arrived(Instant::now());
        if Instant::now() >= next_resync {
            next_resync = Instant::now() + config.resync;
            reconciler.resync();
        }
        metrics.leader.set(i64::from(*leader.borrow()));
        let (planning, running) = reconciler.reconcile();
        if !running {
            return;
        }
        budget.spend(Instant::now(), planning);
        progress.pass_finished();
    }
}

/// How long an event waits for the ones that come with it (a claim and its Pod, a namespace
/// and its labels) before the pass that follows a quiet spell.
pub const GATHER: Duration = Duration::from_millis(5);

/// How much planning the loop may do at once: it grows by half the wall time (planning takes
/// at most half of one core over time), up to `cap`, and each pass spends what it planned
/// (reading the caches and planning; its writes only wait on the API server). While it is
/// short, an event waits until it is earned again, never longer than `cap`.
#[derive(Debug, Clone, Copy)]
struct PassBudget {
    /// Seconds of planning available at `at` (negative: owed).
    credit: f64,
    at: Instant,
    cap: Duration,
}

impl PassBudget {
    fn new(now: Instant, cap: Duration) -> Self {
        Self {
            credit: cap.as_secs_f64(),
            at: now,
            cap,
        }
    }

    fn credit_at(&self, now: Instant) -> f64 {
        let earned = now.saturating_duration_since(self.at).as_secs_f64() / 2.0;
        (self.credit + earned).min(self.cap.as_secs_f64())
    }

    /// A pass that ended at `now` planned for `planning`.
    fn spend(&mut self, now: Instant, planning: Duration) {
        // Owed at most `cap`: one long pass (a first plan) does not slow the next ten seconds.
        self.credit = (self.credit_at(now) - planning.as_secs_f64()).max(-self.cap.as_secs_f64());
        self.at = now;
    }

    /// When the pass for an event that arrives `now` may start: after [`GATHER`], and once
    /// the credit is back to zero, at most `cap` from now.
    fn due(&self, now: Instant) -> Instant {
        let gathered = now + GATHER.min(self.cap);
        let owed = -self.credit_at(now);
        if owed <= 0.0 {
            return gathered;
        }
        let wait = Duration::from_secs_f64(2.0 * owed).min(self.cap);
        gathered.max(now + wait)
    }
}

/// This process's resident memory in MiB (Linux; 0 elsewhere), for the logs.
fn resident_mib() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |pages| pages * 4096 / (1024 * 1024))
}

/// A spawned task that ends with its owner: when `run` is dropped (or its task aborted), nothing
/// it started goes on renewing the lease or serving.
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEBOUNCE: Duration = Duration::from_millis(100);

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn an_event_after_a_quiet_spell_is_planned_at_once() {
        let start = Instant::now();
        let mut budget = PassBudget::new(start, DEBOUNCE);
        assert_eq!(budget.due(start), start + GATHER);
        budget.spend(start + 80 * MS, 80 * MS);
        let later = start + 5_000 * MS;
        assert_eq!(budget.due(later), later + GATHER);
    }

    #[test]
    fn a_users_next_claim_right_after_a_pass_is_planned_at_once() {
        // Passes of 30 ms planning and 50 ms writes, each event 20 ms after the last pass
        // ended: a third of a core, so no event waits.
        let mut now = Instant::now();
        let mut budget = PassBudget::new(now, DEBOUNCE);
        for _ in 0..50 {
            let due = budget.due(now);
            assert_eq!(due, now + GATHER);
            now = due + 80 * MS;
            budget.spend(now, 30 * MS);
            now += 20 * MS;
        }
    }

    #[test]
    fn a_burst_gets_passes_that_plan_at_most_half_the_time() {
        // Events all the time, passes of 40 ms planning and no writes: once the banked 100 ms
        // are spent, a pass waits as long as the one before planned.
        let start = Instant::now();
        let mut now = start;
        let mut budget = PassBudget::new(now, DEBOUNCE);
        let mut planning = Duration::ZERO;
        for _ in 0..100 {
            now = budget.due(now) + 40 * MS;
            budget.spend(now, 40 * MS);
            planning += 40 * MS;
        }
        let share = planning.as_secs_f64() / (now - start).as_secs_f64();
        assert!(
            (0.48..=0.55).contains(&share),
            "planning {share:.2} of the time"
        );
    }

    #[test]
    fn no_event_waits_longer_than_the_debounce() {
        let now = Instant::now();
        let mut budget = PassBudget::new(now, DEBOUNCE);
        budget.spend(now, 2_000 * MS);
        assert_eq!(budget.due(now), now + DEBOUNCE);
    }

    #[test]
    fn a_debounce_shorter_than_the_gathering_wins() {
        let now = Instant::now();
        let short = Duration::from_millis(2);
        assert_eq!(PassBudget::new(now, short).due(now), now + short);
    }
}
