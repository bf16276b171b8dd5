//! What the cluster did, seen from outside: watches of Pods, ResourceClaims, ResourceQuotas and
//! Jobs (never the operator's own state), each change stamped with the benchmark's clock as it
//! arrives, into a [`Timeline`] the metrics are computed from afterwards.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use futures::{Stream, StreamExt as _};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Pod, ResourceQuota};
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, Resource, ResourceExt as _};
use serde::de::DeserializeOwned;

/// Label on every Job and Pod of one configuration's replay: its letter.
pub const RUN_LABEL: &str = "replay.teamgpu.io/config";
/// Label on a Job's Pods: their GPUs each.
pub const GPUS_LABEL: &str = "replay.teamgpu.io/gpus";
/// Label on a Job's Pods: the Job's name.
pub const JOB_LABEL: &str = "replay.teamgpu.io/job";

/// Seconds since the configuration's replay started.
pub type Seconds = f64;

/// A Pod's life as the watch saw it.
#[derive(Debug, Clone, Default)]
pub struct PodTrace {
    pub namespace: String,
    pub name: String,
    pub job: String,
    pub gpus: u32,
    pub created: Seconds,
    /// `spec.nodeName` set: the scheduler bound it (its claim is allocated).
    pub bound: Option<Seconds>,
    /// The node it was bound to.
    pub node: Option<String>,
    pub succeeded: Option<Seconds>,
    /// A `DisruptionTarget` condition appeared (an eviction).
    pub disrupted: Option<Seconds>,
    /// `deletionTimestamp` appeared.
    pub deleting: Option<Seconds>,
}

/// A ResourceClaim's allocation over time.
#[derive(Debug, Clone, Default)]
pub struct ClaimTrace {
    pub namespace: String,
    /// The uid of the Pod it was generated for (its owner).
    pub pod: Option<String>,
    pub created: Seconds,
    /// (when, devices allocated from then on), one entry per change.
    pub allocated: Vec<(Seconds, u32)>,
}

/// What the server reported of a namespace's ResourceQuota for the replay's device key.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct QuotaSample {
    pub at: Seconds,
    pub hard: u32,
    pub used: u32,
}

/// Everything observed during one configuration's replay.
#[derive(Debug, Default)]
pub struct Timeline {
    /// By Pod uid.
    pub pods: HashMap<String, PodTrace>,
    /// By claim uid.
    pub claims: HashMap<String, ClaimTrace>,
    /// By namespace, in order.
    pub quotas: BTreeMap<String, Vec<QuotaSample>>,
    /// (namespace, Job name) to when its `Complete` condition appeared.
    pub jobs_complete: HashMap<(String, String), Seconds>,
    /// By Pod (namespace, name): the note of the operator's `Reclaimed`, `Dequeued` or `Moved`
    /// Event on it (why it went).
    pub reclaimed: HashMap<(String, String), String>,
}

/// Watches running into a shared [`Timeline`] until [`Recorder::finish`].
#[derive(Debug)]
pub struct Recorder {
    timeline: Arc<Mutex<Timeline>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

/// What the recorder looks at: one configuration's namespaces and Pods.
#[derive(Debug, Clone)]
struct Scope {
    start: Instant,
    namespaces: Arc<BTreeSet<String>>,
    quota_key: String,
}

impl Scope {
    fn now(&self) -> Seconds {
        self.start.elapsed().as_secs_f64()
    }

    fn covers<K: Resource>(&self, object: &K) -> bool {
        (object.meta().namespace.as_ref()).is_some_and(|ns| self.namespaces.contains(ns))
    }
}

impl Recorder {
    /// Starts watching `namespaces` (Pods labelled [`RUN_LABEL`]` = config`), with times
    /// counted from `start`. Quotas are read for `quota_key`.
    pub fn start(
        client: &Client,
        config: &str,
        namespaces: BTreeSet<String>,
        quota_key: &str,
        start: Instant,
    ) -> Recorder {
        let scope = Scope {
            start,
            namespaces: Arc::new(namespaces),
            quota_key: quota_key.to_owned(),
        };
        let timeline = Arc::new(Mutex::new(Timeline::default()));
        let pods = watcher::Config::default().labels(&format!("{RUN_LABEL}={config}"));
        let tasks = vec![
            spawn_watch::<Pod>(client, pods, &scope, &timeline, record_pod),
            spawn_watch::<ResourceClaim>(
                client,
                Default::default(),
                &scope,
                &timeline,
                record_claim,
            ),
            spawn_watch::<ResourceQuota>(
                client,
                Default::default(),
                &scope,
                &timeline,
                record_quota,
            ),
            spawn_watch::<Job>(client, Default::default(), &scope, &timeline, record_job),
        ];
        Recorder { timeline, tasks }
    }

    /// How many of the configuration's Jobs are complete so far.
    pub fn completed_jobs(&self) -> usize {
        self.timeline
            .lock()
            .expect("no recorder panicked")
            .jobs_complete
            .len()
    }

    /// Stops the watches and hands over what they saw.
    pub fn finish(self) -> Timeline {
        for task in &self.tasks {
            task.abort();
        }
        std::mem::take(&mut *self.timeline.lock().expect("no recorder panicked"))
    }
}

/// Records how an object changed (`deleted`: it is gone) at `at`.
type RecordFn<K> = fn(&mut Timeline, &Scope, &K, Seconds, bool);

fn spawn_watch<K>(
    client: &Client,
    config: watcher::Config,
    scope: &Scope,
    timeline: &Arc<Mutex<Timeline>>,
    record: RecordFn<K>,
) -> tokio::task::JoinHandle<()>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    let events = watcher::watcher(Api::<K>::all(client.clone()), config);
    let (scope, timeline) = (scope.clone(), timeline.clone());
    tokio::spawn(follow(events, scope, timeline, record))
}

async fn follow<K: Resource>(
    events: impl Stream<Item = watcher::Result<Event<K>>>,
    scope: Scope,
    timeline: Arc<Mutex<Timeline>>,
    record: RecordFn<K>,
) {
    let mut events = std::pin::pin!(events);
    while let Some(event) = events.next().await {
        let (object, deleted) = match event {
            Ok(Event::Apply(object) | Event::InitApply(object)) => (object, false),
            Ok(Event::Delete(object)) => (object, true),
            Ok(Event::Init | Event::InitDone) => continue,
            Err(error) => {
                eprintln!("replay: a watch failed ({error}); it retries");
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                continue;
            }
        };
        if scope.covers(&object) {
            let mut timeline = timeline.lock().expect("no recorder panicked");
            record(&mut timeline, &scope, &object, scope.now(), deleted);
        }
    }
}

fn record_pod(timeline: &mut Timeline, _: &Scope, pod: &Pod, at: Seconds, deleted: bool) {
    let trace = (timeline.pods.entry(pod.uid().unwrap_or_default())).or_insert_with(|| PodTrace {
        namespace: pod.namespace().unwrap_or_default(),
        name: pod.name_any(),
        job: pod.labels().get(JOB_LABEL).cloned().unwrap_or_default(),
        gpus: (pod.labels().get(GPUS_LABEL))
            .and_then(|g| g.parse().ok())
            .unwrap_or(0),
        created: at,
        ..PodTrace::default()
    });
    let status = pod.status.as_ref();
    let node = pod.spec.as_ref().and_then(|s| s.node_name.as_ref());
    if trace.node.is_none() {
        trace.node = node.cloned();
    }
    let bound = node.is_some();
    let succeeded = status.and_then(|s| s.phase.as_deref()) == Some("Succeeded");
    let disrupted = (status
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten())
    .any(|c| c.type_ == "DisruptionTarget" && c.status == "True");
    let deleting = deleted || pod.metadata.deletion_timestamp.is_some();
    for (seen, when) in [
        (bound, &mut trace.bound),
        (succeeded, &mut trace.succeeded),
        (disrupted, &mut trace.disrupted),
        (deleting, &mut trace.deleting),
    ] {
        if seen && when.is_none() {
            *when = Some(at);
        }
    }
}

fn record_claim(
    timeline: &mut Timeline,
    _: &Scope,
    claim: &ResourceClaim,
    at: Seconds,
    deleted: bool,
) {
    let trace =
        (timeline.claims.entry(claim.uid().unwrap_or_default())).or_insert_with(|| ClaimTrace {
            namespace: claim.namespace().unwrap_or_default(),
            pod: (claim.owner_references().iter())
                .find(|owner| owner.kind == "Pod")
                .map(|owner| owner.uid.clone()),
            created: at,
            allocated: Vec::new(),
        });
    let devices = if deleted {
        0
    } else {
        (claim.status.as_ref().and_then(|s| s.allocation.as_ref()))
            .and_then(|a| a.devices.as_ref())
            .and_then(|d| d.results.as_ref())
            .map_or(0, |r| r.len() as u32)
    };
    if trace.allocated.last().map_or(0, |(_, n)| *n) != devices {
        trace.allocated.push((at, devices));
    }
}

fn record_quota(
    timeline: &mut Timeline,
    scope: &Scope,
    quota: &ResourceQuota,
    at: Seconds,
    deleted: bool,
) {
    let status = quota.status.as_ref();
    let read = |map: Option<
        &BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
    >| {
        (map.and_then(|m| m.get(&scope.quota_key))).and_then(|q| q.0.parse::<u32>().ok())
    };
    let (Some(hard), Some(used)) = (
        read(status.and_then(|s| s.hard.as_ref())),
        read(status.and_then(|s| s.used.as_ref())),
    ) else {
        return;
    };
    // The replay never deletes a quota while it records.
    if deleted {
        return;
    }
    let samples = timeline
        .quotas
        .entry(quota.namespace().unwrap_or_default())
        .or_default();
    if samples
        .last()
        .is_none_or(|last| (last.hard, last.used) != (hard, used))
    {
        samples.push(QuotaSample { at, hard, used });
    }
}

fn record_job(timeline: &mut Timeline, _: &Scope, job: &Job, at: Seconds, _deleted: bool) {
    let complete = (job
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter())
    .flatten()
    .any(|c| c.type_ == "Complete" && c.status == "True");
    if complete {
        let key = (job.namespace().unwrap_or_default(), job.name_any());
        timeline.jobs_complete.entry(key).or_insert(at);
    }
}
