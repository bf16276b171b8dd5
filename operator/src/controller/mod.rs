//! `teamgpu run`: observe -> plan -> apply -> status. Only this module touches the API.
//!
//! One reconciler, woken by watch events (debounced), takes in only the caches that changed,
//! plans with the kept [`plan::Planner`] (which recomputes only what changed inputs feed) and
//! writes only what the kept [`diff::Differ`] finds different, so a steady state makes no write.
//! Only the leader writes; every replica keeps warm caches. See docs/operator.md.

mod http;
pub mod metrics;
mod observe;
mod projected;
mod reclaim;
mod writer;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{DynamicObject, ListParams, PostParams};
use kube::runtime::events::{Recorder, Reporter};
use kube::{Api, Client, ResourceExt};
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::api::{GpuSharingPolicy, TeamGpuPolicy};
use crate::core::diff::{self, Kind};
use crate::core::plan::{self, objects};
use crate::core::state::{ClusterState, NamespaceInfo};
pub use metrics::Metrics;
use observe::{Stores, Watch};

/// The field manager of every write.
pub const FIELD_MANAGER: &str = "teamgpu";

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
    /// How long a team waits below its guarantee before borrowers' Pods are evicted.
    pub reclaim_grace: Duration,
    /// A full pass at this interval as a safety net; it writes nothing when nothing differs.
    pub resync: Duration,
    /// Quiet time after an event before planning, so a burst of events makes one pass.
    pub debounce: Duration,
    /// Groups that may move any namespace into or out of any team and exempt namespaces
    /// (`None`: [`plan::namespace_admission::DEFAULT_ADMIN_GROUPS`]).
    pub admin_groups: Option<Vec<String>>,
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
            resync: Duration::from_secs(3600),
            debounce: Duration::from_millis(100),
            admin_groups: None,
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
    let Some(started) = stop_or(stopped(), retry_transient(|| check_crds(&client))).await else {
        return Ok(());
    };
    started?;
    let Some(operator_user) = stop_or(stopped(), retry_transient(|| own_user_name(&client))).await
    else {
        return Ok(());
    };
    let operator_user = operator_user?;
    tracing::info!(user = %operator_user, "exempt from teamgpu's own admission policies");
    let metrics = Arc::new(Metrics::default());
    let ready = Arc::new(AtomicBool::new(false));
    let (_, http_task) = http::serve(
        config.metrics_addr,
        http::Health {
            ready: ready.clone(),
            metrics: metrics.clone(),
        },
    )
    .await
    .map_err(|source| Error::Metrics {
        addr: config.metrics_addr,
        source,
    })?;
    let _http = AbortOnDrop(http_task);
    let _health = match config.health_addr {
        Some(addr) => {
            let health = http::Health {
                ready: ready.clone(),
                metrics: metrics.clone(),
            };
            let (_, task) = http::serve(addr, health)
                .await
                .map_err(|source| Error::Metrics { addr, source })?;
            Some(AbortOnDrop(task))
        }
        None => None,
    };

    let wake = observe::Wake::default();
    let notify = wake.notify.clone();
    let mut watches = JoinSet::new();
    let stores = observe::start(&client, &wake, &mut watches);

    let (leader_tx, leader) = watch::channel(!config.leader_elect);
    let lease = if config.leader_elect {
        let manager =
            kube_lease_manager::LeaseManagerBuilder::new(client.clone(), &config.lease_name)
                .with_namespace(&config.lease_namespace)
                .with_identity(&config.identity)
                .with_duration(config.lease_duration.as_secs().max(2))
                .with_grace((config.lease_duration.as_secs() / 3).max(1))
                .build();
        let Some(manager) = stop_or(stopped(), manager).await else {
            return Ok(());
        };
        let Some((mut state, task)) = stop_or(stopped(), manager?.watch()).await else {
            return Ok(());
        };
        let forward = tokio::spawn(async move {
            while state.changed().await.is_ok() {
                let is_leader = *state.borrow_and_update();
                if leader_tx.send(is_leader).is_err() {
                    break;
                }
            }
        });
        Some((AbortOnDrop(forward), AbortOnDrop(task)))
    } else {
        drop(leader_tx);
        None
    };

    tokio::select! {
        synced = stores.wait_until_ready() => if !synced { return Err(Error::NotSynced) },
        () = tokio::time::sleep(Duration::from_secs(300)) => return Err(Error::NotSynced),
        () = stopped() => return Ok(()),
    }
    ready.store(true, Ordering::Relaxed);
    tracing::info!(resident_mib = resident_mib(), "watch caches synced");

    let reporter = Reporter {
        controller: FIELD_MANAGER.into(),
        instance: Some(config.identity.clone()),
    };
    let mut reconciler = Reconciler {
        client: client.clone(),
        config: config.clone(),
        stores,
        metrics: metrics.clone(),
        leader: leader.clone(),
        recorder: Recorder::new(client.clone(), reporter),
        backoff: writer::Backoff::default(),
        reclaim: reclaim::Tracker::default(),
        changes: wake.changes.clone(),
        published: Default::default(),
        planner: plan::Planner::default(),
        differ: diff::Differ::default(),
        operator_user,
        state: ClusterState::default(),
        malformed: Vec::new(),
    };
    let loop_ = async {
        let mut leader = leader.clone();
        let mut leader_open = config.leader_elect;
        let mut next_resync = Instant::now() + config.resync;
        loop {
            let wake_at = [
                reconciler.backoff.next_retry(),
                reconciler.reclaim.next_attempt(),
            ]
            .into_iter()
            .flatten()
            .fold(next_resync, Instant::min);
            tokio::select! {
                () = notify.notified() => tokio::time::sleep(config.debounce).await,
                // Without leader election (or once the lease task is gone) nothing will change:
                // a closed channel answers at once, and would make this loop spin.
                changed = leader.changed(), if leader_open => leader_open = changed.is_ok(),
                () = tokio::time::sleep_until(wake_at.into()) => {}
            }
            if Instant::now() >= next_resync {
                next_resync = Instant::now() + config.resync;
            }
            metrics.leader.set(i64::from(*leader.borrow()));
            reconciler.reclaim.clear_due(Instant::now());
            reconciler.reconcile().await;
        }
    };
    tokio::select! {
        () = loop_ => {}
        () = shutdown => tracing::info!("shutting down"),
    }
    drop(reconciler);
    watches.shutdown().await;
    if let Some((mut forward, mut task)) = lease {
        // Dropping the last receiver of the lease state makes the lease task hand the Lease back,
        // so a successor need not wait for it to expire.
        forward.0.abort();
        let _ = (&mut forward.0).await;
        if let Ok(Ok(Err(error))) = tokio::time::timeout(Duration::from_secs(5), &mut task.0).await
        {
            tracing::warn!(%error, "releasing the lease");
        }
    }
    Ok(())
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

struct Reconciler {
    client: Client,
    config: Config,
    stores: Stores,
    metrics: Arc<Metrics>,
    leader: watch::Receiver<bool>,
    recorder: Recorder,
    backoff: writer::Backoff,
    reclaim: reclaim::Tracker,
    /// Which watches saw events since the last pass.
    changes: Arc<observe::Changes>,
    /// Events published whose finding the live status does not show yet: (object, reason, note).
    published: std::collections::BTreeSet<(String, String, String)>,
    /// Recomputes only what changed inputs feed (a slice's pool, a namespace's usage, ...).
    planner: plan::Planner,
    /// Compares only the objects whose desired or live side changed.
    differ: diff::Differ,
    /// Who this operator is to the API server (see [`own_user_name`]).
    operator_user: String,
    /// The planner's input, kept between passes (see [`Reconciler::refresh_state`]).
    state: ClusterState,
    /// Custom resources that could not be read into their types.
    malformed: Vec<Malformed>,
}

/// A custom resource teamgpu could not read into its type (say, written by a newer version).
#[derive(Debug, Clone)]
pub(crate) struct Malformed {
    pub object: DynamicObject,
    pub resource: kube::core::ApiResource,
    pub message: String,
}

/// A policy being deleted (waiting for finalizers or foreground deletion of its dependents) is
/// treated as gone: its objects are no longer wanted, and its status is no longer written.
fn is_terminating(obj: &DynamicObject) -> bool {
    obj.metadata.deletion_timestamp.is_some()
}

/// Read a custom resource into its type; one that does not fit is reported, never fatal.
fn parse<K>(obj: &DynamicObject, malformed: &mut Vec<Malformed>) -> Option<K>
where
    K: kube::Resource<DynamicType = ()> + serde::de::DeserializeOwned,
{
    match obj.clone().try_parse::<K>() {
        Ok(k) => Some(k),
        Err(error) => {
            malformed.push(Malformed {
                object: obj.clone(),
                resource: kube::core::ApiResource::erase::<K>(&()),
                message: format!("the object cannot be read as a {}: {error}", K::kind(&())),
            });
            None
        }
    }
}

/// Every policy of `store` not being deleted, read into its type; the ones that do not fit are
/// added to `malformed`.
fn parse_all<K>(
    store: &kube::runtime::reflector::Store<DynamicObject>,
    malformed: &mut Vec<Malformed>,
) -> Vec<K>
where
    K: kube::Resource<DynamicType = ()> + serde::de::DeserializeOwned,
{
    store
        .state()
        .iter()
        .filter(|o| !is_terminating(o))
        .filter_map(|o| parse(o, malformed))
        .collect()
}

impl Reconciler {
    fn is_leader(&self) -> bool {
        *self.leader.borrow()
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
            let unreadable = |kind: &str| -> Vec<String> {
                malformed
                    .iter()
                    .filter(|m| m.resource.kind == kind)
                    .map(|m| m.object.name_any())
                    .collect()
            };
            state.unreadable_sharing_policies = unreadable("GpuSharingPolicy");
            state.unreadable_teams = unreadable("TeamGpuPolicy");
            for m in &malformed {
                tracing::warn!(object = %m.object.name_any(), error = %m.message, "custom resource skipped");
            }
            self.malformed = malformed;
        }
        if changed.contains(Watch::Namespaces) {
            state.namespaces = self
                .stores
                .namespaces
                .state()
                .iter()
                .filter(|n| n.metadata.deletion_timestamp.is_none())
                .map(|n| NamespaceInfo {
                    name: n.name_any(),
                    labels: n.labels().clone(),
                })
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
        state.pending = if pods.is_empty() {
            Vec::new()
        } else {
            let claims = self
                .stores
                .claims
                .state()
                .map(|(_, c)| c)
                .unwrap_or_default();
            plan::pending::pending_demand(
                &pods.iter().map(|p| &**p).collect::<Vec<_>>(),
                &claims.iter().map(|c| &**c).collect::<Vec<_>>(),
                |namespace, name| self.differ.template_charge(namespace, name).cloned(),
            )
        };
        state.operator_user = Some(self.operator_user.clone());
        state.admin_groups.clone_from(&self.config.admin_groups);
    }

    /// Brings the planner's slices and claims and the differ's live objects up to date with
    /// the caches that changed; returns which did.
    fn take_changes(&mut self) -> observe::Changed {
        let changed = self.changes.take();
        if changed.contains(Watch::Slices)
            && let Some((reads, slices)) = self.stores.slices.state()
        {
            let pools = self.planner.update_slice_views(&slices, &reads);
            tracing::debug!(pools = pools.len(), "ResourceSlices changed");
        }
        if changed.contains(Watch::Claims)
            && let Some(((), claims)) = self.stores.claims.state()
        {
            let namespaces = self.planner.update_claim_views(&claims);
            tracing::debug!(namespaces = namespaces.len(), "ResourceClaims changed");
        }
        if changed.contains(Watch::DeviceClasses) {
            let classes = self.stores.device_classes.state();
            let managed = classes.iter().filter(|c| {
                c.labels()
                    .get(objects::MANAGED_BY_LABEL)
                    .map(String::as_str)
                    == Some(objects::MANAGED_BY)
            });
            self.differ.update_live(
                Kind::DeviceClass,
                managed.map(|c| diff::LiveObject::DeviceClass(c.clone())),
            );
        }
        for (kind, store) in &self.stores.owned {
            if changed.contains(Watch::Owned(*kind))
                && let Some(((), objects)) = store.state()
            {
                self.differ
                    .update_live(*kind, objects.into_iter().map(diff::LiveObject::Owned));
            }
        }
        changed
    }

    async fn reconcile(&mut self) {
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
        if self.is_leader() {
            let writes = self.differ.writes(&plan.objects);
            tracing::debug!(
                writes = writes.len(),
                resident_mib = resident_mib(),
                "compared"
            );
            writer::execute(self, writes).await;
            writer::report_malformed(self, malformed, &Time(k8s_openapi::jiff::Timestamp::now()))
                .await;
            let (sharing, teams) = (&state.sharing_policies, &state.teams);
            writer::write_statuses(
                self,
                &plan,
                sharing,
                teams,
                &Time(k8s_openapi::jiff::Timestamp::now()),
            )
            .await;
            self.publish_events(&plan, sharing, teams).await;
            reclaim::act(self, &plan, teams).await;
        }
    }

    /// Events for what a person should know: conflicts, overcommit, quota changes, invalid
    /// selectors. An event is published when the finding differs from the live status (a
    /// transition), so a restart on a converged cluster publishes nothing.
    async fn publish_events(
        &mut self,
        plan: &plan::Plan,
        sharing: &[GpuSharingPolicy],
        teams: &[TeamGpuPolicy],
    ) {
        use kube::Resource;
        use kube::runtime::events::{Event, EventType};
        let is_new =
            |live: Option<&[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition]>,
             c: &plan::conditions::DesiredCondition| {
                let status = if c.status { "True" } else { "False" };
                !live
                    .unwrap_or_default()
                    .iter()
                    .any(|l| l.type_ == c.type_ && l.status == status && l.message == c.message)
            };
        let mut events = Vec::new();
        for report in &plan.teams {
            let Some(team) = teams.iter().find(|t| t.name_any() == report.name) else {
                continue;
            };
            let live = team.status.as_ref();
            let live_conditions = live.map(|s| s.conditions.as_slice());
            for c in report
                .conditions
                .iter()
                .filter(|c| c.status && (c.type_ == "Conflict" || c.type_ == "Overcommitted"))
            {
                if is_new(live_conditions, c) {
                    events.push((
                        team.object_ref(&()),
                        EventType::Warning,
                        c.reason,
                        c.message.clone(),
                    ));
                }
            }
            for q in &report.quotas {
                let before = live
                    .and_then(|s| {
                        s.quotas
                            .iter()
                            .find(|l| l.sharing_policy == q.sharing_policy)
                    })
                    .map(|l| l.entitlement);
                if before != Some(q.entitlement) {
                    let note = format!(
                        "{}: entitlement {} devices ({})",
                        q.sharing_policy, q.entitlement, q.explanation
                    );
                    events.push((
                        team.object_ref(&()),
                        EventType::Normal,
                        "QuotaChanged",
                        note,
                    ));
                }
            }
        }
        for report in &plan.sharing_policies {
            let Some(policy) = sharing.iter().find(|p| p.name_any() == report.name) else {
                continue;
            };
            let live_conditions = policy.status.as_ref().map(|s| s.conditions.as_slice());
            for c in report
                .conditions
                .iter()
                .filter(|c| c.type_ == "SelectorValid" && !c.status)
            {
                if is_new(live_conditions, c) {
                    events.push((
                        policy.object_ref(&()),
                        EventType::Warning,
                        c.reason,
                        c.message.clone(),
                    ));
                }
            }
        }
        // Team members usually cannot read events of cluster-scoped objects (they land in
        // `default`): each team event is also recorded in every namespace of the team.
        let copies: Vec<_> = events
            .iter()
            .flat_map(|(reference, type_, reason, note)| {
                let namespaces = plan
                    .teams
                    .iter()
                    .find(|t| {
                        reference.kind.as_deref() == Some("TeamGpuPolicy")
                            && reference.name.as_deref() == Some(t.name.as_str())
                    })
                    .map(|t| t.namespaces.as_slice())
                    .unwrap_or_default();
                in_team_namespaces(reference, namespaces)
                    .into_iter()
                    .map(move |(copy, prefix)| (copy, *type_, *reason, format!("{prefix}{note}")))
            })
            .collect();
        events.extend(copies);
        // The status that records a finding may not be in the cache yet at the next pass: what
        // was published stays remembered until the live status stops calling it new.
        let keys: Vec<(String, &str, String)> = events
            .iter()
            .map(|(r, _, reason, note)| {
                let object = format!(
                    "{}/{}/{}",
                    r.kind.as_deref().unwrap_or_default(),
                    r.namespace.as_deref().unwrap_or_default(),
                    r.name.as_deref().unwrap_or_default()
                );
                (object, *reason, note.clone())
            })
            .collect();
        self.published.retain(|(o, r, n)| {
            keys.iter()
                .any(|(ko, kr, kn)| ko == o && kr == r && kn == n)
        });
        for ((reference, type_, reason, note), (object, _, _)) in events.into_iter().zip(keys) {
            let key = (object, reason.to_owned(), note.clone());
            if self.published.contains(&key) {
                continue;
            }
            let event = Event {
                type_,
                reason: reason.into(),
                note: Some(note.chars().take(1000).collect()),
                action: "Plan".into(),
                secondary: None,
            };
            match self.recorder.publish(&event, &reference).await {
                Ok(()) => {
                    self.published.insert(key);
                }
                Err(error) => tracing::debug!(%error, "event not recorded"),
            }
        }
    }
}

/// Where an event about a team (`reference`, its TeamGpuPolicy) is also recorded: the team's
/// ResourceQuota in each of its `namespaces` (an event in a namespace must be about an object
/// there), with the prefix that names the team in the note. Pure.
pub fn in_team_namespaces(
    reference: &k8s_openapi::api::core::v1::ObjectReference,
    namespaces: &[String],
) -> Vec<(k8s_openapi::api::core::v1::ObjectReference, String)> {
    let team = reference.name.clone().unwrap_or_default();
    namespaces
        .iter()
        .map(|namespace| {
            let quota = k8s_openapi::api::core::v1::ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("ResourceQuota".into()),
                name: Some(plan::objects::QUOTA_NAME.into()),
                namespace: Some(namespace.clone()),
                ..Default::default()
            };
            (quota, format!("TeamGpuPolicy {team}: "))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_team_event_is_copied_to_the_quota_of_each_team_namespace() {
        let team = k8s_openapi::api::core::v1::ObjectReference {
            api_version: Some("teamgpu.io/v1alpha1".into()),
            kind: Some("TeamGpuPolicy".into()),
            name: Some("ml-research".into()),
            ..Default::default()
        };
        let copies = in_team_namespaces(&team, &["ml-dev".into(), "ml-train".into()]);
        let shown: Vec<(String, String, String, String)> = copies
            .into_iter()
            .map(|(r, prefix)| {
                (
                    r.kind.unwrap(),
                    r.namespace.unwrap(),
                    r.name.unwrap(),
                    prefix,
                )
            })
            .collect();
        assert_eq!(
            shown,
            [
                (
                    "ResourceQuota".into(),
                    "ml-dev".into(),
                    "teamgpu".into(),
                    "TeamGpuPolicy ml-research: ".into()
                ),
                (
                    "ResourceQuota".into(),
                    "ml-train".into(),
                    "teamgpu".into(),
                    "TeamGpuPolicy ml-research: ".into()
                ),
            ]
        );
    }

    #[test]
    fn a_policy_that_does_not_fit_its_type_is_skipped_and_reported() {
        let object = |spec: serde_json::Value| -> DynamicObject {
            serde_json::from_value(
                json!({"apiVersion": "teamgpu.io/v1alpha1", "kind": "TeamGpuPolicy",
                                          "metadata": {"name": "t"}, "spec": spec}),
            )
            .unwrap()
        };
        let mut malformed = Vec::new();
        assert!(
            parse::<TeamGpuPolicy>(&object(json!({"weight": "many"})), &mut malformed).is_none()
        );
        assert_eq!(malformed.len(), 1);
        assert!(
            malformed[0]
                .message
                .contains("cannot be read as a TeamGpuPolicy"),
            "{}",
            malformed[0].message
        );
        assert_eq!(malformed[0].resource.plural, "teamgpupolicies");
        let good = parse::<TeamGpuPolicy>(&object(json!({"namespaces": ["a"]})), &mut malformed);
        assert_eq!(good.map(|t| t.spec.namespaces), Some(vec!["a".to_owned()]));
        assert_eq!(malformed.len(), 1);
    }
}
