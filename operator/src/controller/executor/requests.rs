//! The requests behind each effect: server-side apply, deletion, status patches, Events,
//! evictions (a workload's Pods, dry run first) and wake-ups of waiting Pods. Each is bounded by
//! a timeout; [`super::Executor`] decides when and backs off. Needs a client.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::Resource as _;
use kube::api::{
    Api, DeleteParams, DynamicObject, EvictParams, ListParams, Patch, PatchParams, PostParams,
};
use kube::runtime::events::{self, Recorder, Reporter};
use serde_json::json;

use super::{Outcome, WRITE_TIMEOUT, WriteError};
use crate::controller::FIELD_MANAGER;
use crate::controller::metrics::{Metrics, WriteLabels};
use crate::core::diff::{ObjectKey, OwnWrites, Payload, Write};
use crate::core::effects::reclaim::budgets::{BudgetView, BudgetedPod, Ledger};
use crate::core::effects::{
    Effect, Event, EventType, Eviction, PolicyKind, REQUEUE_ANNOTATION, Taken,
};
use crate::core::plan::outside_teams::GUARD_LABEL;

/// What an apply's answer is read for: the stored object's resourceVersion. The rest of it
/// (its spec, its managedFields) is skipped, not built into a JSON tree as a `DynamicObject`
/// would be: a first converge reads 10,000 to 100,000 of them.
#[derive(serde::Deserialize)]
struct Stored {
    metadata: StoredMeta,
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct StoredMeta {
    resource_version: Option<String>,
}

/// How long one eviction may take: the client retries a PodDisruptionBudget's 429 for minutes,
/// and the pass must not wait on it.
const EVICTION_TIMEOUT: Duration = Duration::from_secs(5);

/// Events one recorder publishes before it is replaced by a fresh one. A recorder keeps every
/// Event it published for six minutes, to fold a repeat into a series, in a table that keeps the
/// size of its largest burst: a first converge of 100 teams publishes 3,300 QuotaChanged Events
/// (each also in the team's namespaces), which would hold 4 MiB for good. Repeats come minutes
/// apart, and a quiet operator publishes a few Events an hour, so folding still works.
const EVENTS_PER_RECORDER: usize = 256;

/// A value replaced by a fresh one after it was handed out `every` times: the recorder Events
/// are published with (see [`EVENTS_PER_RECORDER`]).
pub(super) struct Rotating<T> {
    current: T,
    handed_out: usize,
    every: usize,
    make: Box<dyn Fn() -> T + Send + Sync>,
}

impl<T: Clone> Rotating<T> {
    pub(super) fn new(every: usize, make: impl Fn() -> T + Send + Sync + 'static) -> Self {
        Rotating {
            current: make(),
            handed_out: 0,
            every,
            make: Box::new(make),
        }
    }

    pub(super) fn next(&mut self) -> T {
        if self.handed_out == self.every {
            self.current = (self.make)();
            self.handed_out = 0;
        }
        self.handed_out += 1;
        self.current.clone()
    }
}

/// The requests of the effects; shared by the writes in flight.
pub(super) struct Requests {
    pub(super) client: kube::Client,
    metrics: Arc<Metrics>,
    recorder: std::sync::Mutex<Rotating<Recorder>>,
    /// Where an apply's resourceVersion is recorded, for the watch to recognise it.
    own_writes: Arc<OwnWrites>,
    /// Requests in flight across the lanes of a step ([`super::WRITE_CONCURRENCY`]).
    pub(super) in_flight: tokio::sync::Semaphore,
}

impl Requests {
    pub(super) fn new(
        client: kube::Client,
        metrics: Arc<Metrics>,
        reporter: Reporter,
        own_writes: Arc<OwnWrites>,
        concurrency: usize,
    ) -> Self {
        Requests {
            recorder: std::sync::Mutex::new(Rotating::new(EVENTS_PER_RECORDER, {
                let client = client.clone();
                move || Recorder::new(client.clone(), reporter.clone())
            })),
            client,
            metrics,
            own_writes,
            in_flight: tokio::sync::Semaphore::new(concurrency),
        }
    }

    pub(super) fn count_write(&self, kind: &'static str, verb: &'static str) {
        self.metrics
            .writes
            .get_or_create(&WriteLabels { kind, verb })
            .inc();
    }

    /// One effect, as one or two requests, each bounded by its timeout.
    pub(super) async fn perform(&self, effect: &Effect) -> Result<Outcome, WriteError> {
        match effect {
            Effect::Object(Write::Apply { key, object }) => self.apply(key, object).await,
            Effect::Object(Write::Recreate { key, object }) => {
                self.delete(key).await?;
                self.apply(key, object).await?;
                // The differ settles only an apply it decided on a live version.
                Ok(Outcome::Applied(None))
            }
            Effect::Object(Write::Delete { key }) => self.delete(key).await,
            Effect::Status {
                kind, name, status, ..
            } => self.patch_status(*kind, name, status).await,
            Effect::Event(event) => self.publish(event).await,
            Effect::Evict(e) => self.evict(e).await,
            Effect::Resume(r) => self.resume_job(&r.namespace, &r.job).await,
            Effect::Requeue(r) => {
                self.count_write("pod", "requeue");
                let api: Api<Pod> = Api::namespaced(self.client.clone(), &r.namespace);
                let patch = json!({"metadata": {"annotations": {REQUEUE_ANNOTATION: r.value}}});
                merge_patch(&api, &r.pod, patch).await
            }
            Effect::Label(label) => {
                self.count_write("namespace", "label");
                let api: Api<Namespace> = Api::all(self.client.clone());
                // `null` takes the label off, whoever set it.
                let patch = json!({"metadata": {"labels": {GUARD_LABEL: label.value}}});
                merge_patch(&api, &label.namespace, patch).await
            }
        }
    }

    /// Evicts every Pod of a workload or none: each eviction is first tried as a dry run, so
    /// that a PodDisruptionBudget that refuses one Pod leaves the whole workload running, and
    /// the budgets of a workload of several Pods are counted (a dry run does not spend them).
    /// The Pods go at once, not one by one: an eviction takes up to 0.1 s on the API server,
    /// and the first Pod's devices could be bound elsewhere before the last Pod was evicted.
    /// A `batch/v1` Job's Pods go by suspending the Job instead (see [`super::jobs`]).
    async fn evict(&self, e: &Eviction) -> Result<Outcome, WriteError> {
        self.evict_all(e, true).await?;
        if e.pods.len() > 1 {
            self.check_budgets(e).await?;
        }
        if let (Some(job), Some((namespace, _))) = (&e.job, e.pods.first())
            && let Some(outcome) = self.suspend_job(namespace, job).await?
        {
            return Ok(outcome);
        }
        self.evict_all(e, false).await?;
        Ok(Outcome::Taken(Taken::Evicted))
    }

    async fn evict_all(&self, e: &Eviction, dry_run: bool) -> Result<(), WriteError> {
        let params = EvictParams {
            post_options: PostParams {
                dry_run,
                ..PostParams::default()
            },
            ..EvictParams::default()
        };
        let evictions = e.pods.iter().map(|(namespace, pod)| {
            if !dry_run {
                self.count_write("pod", "evict");
            }
            let api: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
            let params = &params;
            async move { bounded(EVICTION_TIMEOUT, api.evict(pod, params)).await }
        });
        for result in futures::future::join_all(evictions).await {
            match result {
                // Gone already: its devices are on their way back.
                Err(error) if error.code() == Some(404) => {}
                result => {
                    result?;
                }
            }
        }
        Ok(())
    }

    /// [`WriteError::Overdrawn`] when the PodDisruptionBudgets of the workload's namespaces
    /// would let only some of its Pods go. Reads the budgets (most namespaces have none), and
    /// the Pods only where there are some.
    async fn check_budgets(&self, e: &Eviction) -> Result<(), WriteError> {
        let mut by_namespace: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for (namespace, pod) in &e.pods {
            by_namespace.entry(namespace).or_default().push(pod);
        }
        for (namespace, names) in by_namespace {
            let api: Api<PodDisruptionBudget> = Api::namespaced(self.client.clone(), namespace);
            let budgets = bounded(WRITE_TIMEOUT, api.list(&ListParams::default())).await?;
            if budgets.items.is_empty() {
                continue;
            }
            let budgets: Vec<BudgetView> = budgets.iter().map(BudgetView::project).collect();
            let api: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
            let mut pods = Vec::with_capacity(names.len());
            for name in names {
                let by_name = ListParams::default().fields(&format!("metadata.name={name}"));
                let found = bounded(WRITE_TIMEOUT, api.list(&by_name)).await?;
                pods.extend(found.iter().map(BudgetedPod::project));
            }
            let pods: Vec<_> = pods.iter().map(|p| (namespace, p)).collect();
            Ledger::new(&budgets)
                .spend(&pods)
                .map_err(|o| WriteError::Overdrawn(o.to_string()))?;
        }
        Ok(())
    }

    fn api_for(&self, key: &ObjectKey) -> Api<DynamicObject> {
        let ar = key.kind.api_resource();
        match &key.namespace {
            Some(ns) => Api::namespaced_with(self.client.clone(), ns, &ar),
            None => Api::all_with(self.client.clone(), &ar),
        }
    }

    async fn apply(&self, key: &ObjectKey, payload: &Payload) -> Result<Outcome, WriteError> {
        self.count_write(key.kind.label(), "apply");
        let url = DynamicObject::url_path(&key.kind.api_resource(), key.namespace.as_deref());
        let request = kube::core::Request::new(url)
            .patch(&key.name, &apply_params(), &Patch::Apply(payload))
            .map_err(kube::Error::BuildRequest)?;
        let stored: Stored = bounded(WRITE_TIMEOUT, self.client.request(request)).await?;
        let version = stored.metadata.resource_version;
        // The watch event of this apply is then known without its content.
        if let (Some(version), Some(fingerprint)) = (&version, payload.fingerprint()) {
            self.own_writes.record(version, fingerprint);
        }
        Ok(Outcome::Applied(version))
    }

    async fn delete(&self, key: &ObjectKey) -> Result<Outcome, WriteError> {
        self.count_write(key.kind.label(), "delete");
        let api = self.api_for(key);
        match bounded(
            WRITE_TIMEOUT,
            api.delete(&key.name, &DeleteParams::default()),
        )
        .await
        {
            Ok(_) => Ok(Outcome::Done),
            // Gone already: what a deletion wants.
            Err(error) if error.code() == Some(404) => Ok(Outcome::Done),
            Err(e) => Err(e),
        }
    }

    async fn patch_status(
        &self,
        kind: PolicyKind,
        name: &str,
        status: &serde_json::Value,
    ) -> Result<Outcome, WriteError> {
        self.count_write(kind.label(), "status");
        let resource = kind.api_resource();
        let api: Api<DynamicObject> = Api::all_with(self.client.clone(), &resource);
        let patch =
            json!({"apiVersion": resource.api_version, "kind": resource.kind, "status": status});
        bounded(
            WRITE_TIMEOUT,
            api.patch_status(name, &apply_params(), &Patch::Apply(patch)),
        )
        .await?;
        Ok(Outcome::Done)
    }

    async fn publish(&self, event: &Event) -> Result<Outcome, WriteError> {
        self.count_write("event", "publish");
        let published = events::Event {
            type_: match event.type_ {
                EventType::Normal => events::EventType::Normal,
                EventType::Warning => events::EventType::Warning,
            },
            reason: event.reason.into(),
            // The API server refuses a longer note.
            note: Some(event.note.chars().take(1000).collect()),
            action: event.action.into(),
            secondary: None,
        };
        let recorder = self
            .recorder
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .next();
        bounded(
            WRITE_TIMEOUT,
            recorder.publish(&published, &event.regarding),
        )
        .await?;
        Ok(Outcome::Done)
    }
}

/// A JSON merge patch of object `name`, as [`FIELD_MANAGER`].
pub(super) async fn merge_patch<K>(
    api: &Api<K>,
    name: &str,
    patch: serde_json::Value,
) -> Result<Outcome, WriteError>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..PatchParams::default()
    };
    bounded(
        WRITE_TIMEOUT,
        api.patch(name, &params, &Patch::Merge(patch)),
    )
    .await?;
    Ok(Outcome::Done)
}

fn apply_params() -> PatchParams {
    PatchParams::apply(FIELD_MANAGER).force()
}

/// `request`'s answer, or [`WriteError::TimedOut`] after `limit`.
pub(super) async fn bounded<T>(
    limit: Duration,
    request: impl Future<Output = Result<T, kube::Error>>,
) -> Result<T, WriteError> {
    match tokio::time::timeout(limit, request).await {
        Ok(answer) => Ok(answer?),
        Err(_) => Err(WriteError::TimedOut(limit)),
    }
}
