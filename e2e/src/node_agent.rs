//! The API part of a kubelet, in the manner of kwok, for a control plane with none (see
//! [`crate::control_plane`]): without it there are no Nodes, scheduled Pods stay `Pending` and
//! deleted ones `Terminating`, so evictions, rollouts and namespace deletion never complete. The
//! [`NodeAgent`] makes Ready Nodes, reports the Pods bound to them `Running`, and reports the
//! terminating ones `Failed` (as a kubelet reports a Pod it stopped) and deletes them for good.
//! No container ever runs, but a Pod annotated [`RUN_SECONDS_ANNOTATION`] "finishes": it is
//! reported `Succeeded` that long after it was reported `Running`, so batch Jobs complete (the
//! workload replay, `examples/replay`).

use std::collections::{BTreeMap, HashSet};
use std::sync::OnceLock;
use std::thread::JoinHandle;
use std::time::Duration;

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Api, Client, ResourceExt as _};
use serde_json::json;
use tokio::sync::oneshot;

use crate::control_plane;

/// A Pod annotated with this (seconds, a decimal number) "runs" that long once it is `Running`,
/// then its containers exit 0 and it is reported `Succeeded`, as a kubelet reports a finished
/// batch Pod. Pods without it stay `Running` until deleted.
pub const RUN_SECONDS_ANNOTATION: &str = "teamgpu.io/e2e-run-seconds";

/// A Node to create: name, labels, and capacity (also its allocatable).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeSpec {
    /// The Node's name.
    pub name: String,
    /// Its labels.
    pub labels: BTreeMap<String, String>,
    /// Resource name to quantity.
    pub capacity: BTreeMap<String, String>,
}

impl NodeSpec {
    /// A Node labelled `teamgpu.io/e2e=true` with cpu 64, memory 512Gi and 110 pods: tests are
    /// never short of room unless they ask to be.
    pub fn new(name: impl Into<String>) -> NodeSpec {
        let name = name.into();
        let strings = |pairs: &[(&str, &str)]| {
            (pairs.iter())
                .map(|(key, value)| ((*key).to_owned(), (*value).to_owned()))
                .collect()
        };
        NodeSpec {
            labels: strings(&[
                ("teamgpu.io/e2e", "true"),
                ("kubernetes.io/hostname", &name),
                ("kubernetes.io/os", "linux"),
                ("kubernetes.io/arch", "amd64"),
            ]),
            capacity: strings(&[("cpu", "64"), ("memory", "512Gi"), ("pods", "110")]),
            name,
        }
    }

    /// `e2e-node-0` .. `e2e-node-5`, each as [`NodeSpec::new`].
    pub fn defaults() -> Vec<NodeSpec> {
        (0..6)
            .map(|i| NodeSpec::new(format!("e2e-node-{i}")))
            .collect()
    }
}

/// A running node agent, on a thread with a tokio runtime of its own (so it outlives the test
/// runtime that started it). Dropping it stops it; its Nodes stay.
#[derive(Debug)]
pub struct NodeAgent {
    nodes: Vec<String>,
    shutdown: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

/// Creates (or updates) the `nodes` with a Ready status, then plays the kubelet for the Pods
/// bound to them until dropped. Blocks until the Nodes are registered: from async code, call it
/// through `spawn_blocking`.
pub fn start(config: kube::Config, nodes: &[NodeSpec]) -> Result<NodeAgent, String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|error| format!("no runtime for the node agent: {error}"))?;
    let client = runtime.block_on(register(config, nodes))?;
    let names: HashSet<String> = nodes.iter().map(|node| node.name.clone()).collect();
    let (shutdown, stopped) = oneshot::channel();
    let thread = std::thread::Builder::new()
        .name("teamgpu-e2e-node-agent".into())
        .spawn(move || {
            runtime.block_on(async {
                tokio::select! {
                    _ = stopped => {}
                    () = play_kubelet(client, names) => {}
                }
            });
            runtime.shutdown_timeout(Duration::from_secs(1));
        })
        .map_err(|error| format!("no thread for the node agent: {error}"))?;
    Ok(NodeAgent {
        nodes: nodes.iter().map(|node| node.name.clone()).collect(),
        shutdown: Some(shutdown),
        thread: Some(thread),
    })
}

/// The node agent of this process, with [`NodeSpec::defaults`] on [`control_plane::shared`];
/// never stopped. Blocks during start-up: from async code, call it through `spawn_blocking`.
pub fn shared() -> Result<&'static NodeAgent, String> {
    static SHARED: OnceLock<Result<NodeAgent, String>> = OnceLock::new();
    SHARED
        .get_or_init(|| {
            start(
                control_plane::shared()?.admin_config(),
                &NodeSpec::defaults(),
            )
        })
        .as_ref()
        .map_err(Clone::clone)
}

impl NodeAgent {
    /// The names of the agent's Nodes.
    pub fn node_names(&self) -> Vec<String> {
        self.nodes.clone()
    }
}

impl Drop for NodeAgent {
    fn drop(&mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Applies the Nodes and sets their status as a kubelet would: Ready, with the capacity as
/// allocatable (what the scheduler needs).
async fn register(config: kube::Config, specs: &[NodeSpec]) -> Result<Client, String> {
    let client = Client::try_from(config).map_err(|error| format!("no client: {error}"))?;
    let nodes: Api<Node> = Api::all(client.clone());
    let now = Time(Timestamp::now());
    for spec in specs {
        let node = json!({"apiVersion": "v1", "kind": "Node",
                          "metadata": {"name": spec.name, "labels": spec.labels}});
        let status = json!({"status": {
            "capacity": spec.capacity, "allocatable": spec.capacity,
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                            "message": "teamgpu e2e node agent", "lastHeartbeatTime": now,
                            "lastTransitionTime": now}]}});
        let apply = PatchParams::apply("teamgpu-e2e-node-agent").force();
        let result = match nodes.patch(&spec.name, &apply, &Patch::Apply(node)).await {
            Ok(_) => {
                (nodes.patch_status(&spec.name, &PatchParams::default(), &Patch::Merge(status)))
                    .await
                    .map(drop)
            }
            Err(error) => Err(error),
        };
        result.map_err(|error| format!("could not register Node {}: {error}", spec.name))?;
    }
    Ok(client)
}

/// Watches all Pods and acts on those bound to `nodes` that are being deleted or not yet running
/// (terminal ones are not restarted). Runs until cancelled; the watcher retries with backoff.
async fn play_kubelet(client: Client, nodes: HashSet<String>) {
    let pods: Api<Pod> = Api::all(client.clone());
    let mut pods = watcher(pods, watcher::Config::default())
        .default_backoff()
        .applied_objects()
        .boxed();
    // Pods of `RUN_SECONDS_ANNOTATION` whose run has started, so each finishes once.
    let mut runs_started = HashSet::new();
    while let Some(pod) = pods.next().await {
        let pod = match pod {
            Ok(pod) => pod,
            Err(error) => {
                tracing::warn!(%error, "node agent: watching Pods failed; retrying");
                continue;
            }
        };
        let bound_here = (pod.spec.as_ref().and_then(|spec| spec.node_name.as_ref()))
            .is_some_and(|node| nodes.contains(node));
        let phase = pod
            .status
            .as_ref()
            .and_then(|status| status.phase.as_deref());
        let done = matches!(phase, Some("Running" | "Succeeded" | "Failed"));
        if bound_here && (pod.metadata.deletion_timestamp.is_some() || !done) {
            // One task per Pod, so that a slow or failing request does not hold up the others.
            tokio::spawn(act(client.clone(), pod));
        } else if let Some(seconds) = run_seconds(&pod).filter(|_| bound_here)
            && phase == Some("Running")
            && runs_started.insert(pod.metadata.uid.clone().unwrap_or_default())
        {
            tokio::spawn(finish_after(client.clone(), pod, seconds));
        }
    }
}

/// The run time a Pod asks for with [`RUN_SECONDS_ANNOTATION`], if any (and sensible).
fn run_seconds(pod: &Pod) -> Option<Duration> {
    let value = pod.annotations().get(RUN_SECONDS_ANNOTATION)?;
    value
        .trim()
        .parse::<f64>()
        .ok()
        .and_then(|seconds| Duration::try_from_secs_f64(seconds).ok())
}

/// After `run`, reports the Pod `Succeeded` unless it is being deleted or already finished
/// meanwhile (an evicted Pod's work is lost, not completed). The status is written with the
/// resourceVersion just read as a precondition, so a deletion that comes in between wins.
async fn finish_after(client: Client, pod: Pod, run: Duration) {
    tokio::time::sleep(run).await;
    let name = pod.name_any();
    let pods: Api<Pod> = Api::namespaced(client, &pod.namespace().unwrap_or_default());
    for attempt in 0..5 {
        let current = match pods.get_opt(&name).await {
            Ok(Some(current)) if current.metadata.uid == pod.metadata.uid => current,
            Ok(_) => return,
            Err(error) => {
                tracing::debug!(%error, %name, attempt, "node agent: retrying");
                tokio::time::sleep(Duration::from_millis(100 << attempt)).await;
                continue;
            }
        };
        let phase = current.status.as_ref().and_then(|s| s.phase.as_deref());
        if current.metadata.deletion_timestamp.is_some() || phase != Some("Running") {
            return;
        }
        // Strategic: the conditions are merged by type (PodScheduled, DisruptionTarget stay).
        let status = Patch::Strategic(json!({
            "metadata": {"resourceVersion": current.metadata.resource_version},
            "status": succeeded_status(&current)}));
        match pods
            .patch_status(&name, &PatchParams::default(), &status)
            .await
        {
            Ok(_) => return,
            Err(kube::Error::Api(status)) if status.code == 404 => return,
            Err(error) => {
                tracing::debug!(%error, %name, attempt, "node agent: retrying");
                tokio::time::sleep(Duration::from_millis(100 << attempt)).await;
            }
        }
    }
    tracing::warn!(%name, "node agent: gave up finishing a Pod");
}

/// Deletes a terminating Pod with grace period 0 (its containers have "stopped"), else reports
/// it Running and Ready; retries a few times (the Pod's next event tries again anyway).
async fn act(client: Client, pod: Pod) {
    let name = pod.name_any();
    let pods: Api<Pod> = Api::namespaced(client, &pod.namespace().unwrap_or_default());
    for attempt in 0..5 {
        let result = if pod.metadata.deletion_timestamp.is_some() {
            // A kubelet reports a Pod it stopped Failed before it goes (unless it finished): a
            // Job with a podFailurePolicy replaces a Pod only once it is terminal.
            let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
            if !matches!(phase, Some("Succeeded" | "Failed"))
                && pod.spec.as_ref().is_some_and(|s| s.node_name.is_some())
            {
                let status = Patch::Merge(json!({"status": {"phase": "Failed"}}));
                if let Err(error) = pods
                    .patch_status(&name, &PatchParams::default(), &status)
                    .await
                {
                    tracing::debug!(%error, %name, "node agent: could not report a Pod Failed");
                }
            }
            // The uid precondition spares a re-created Pod of the same name.
            let params = DeleteParams {
                grace_period_seconds: Some(0),
                preconditions: Some(Preconditions {
                    uid: pod.metadata.uid.clone(),
                    resource_version: None,
                }),
                ..DeleteParams::default()
            };
            pods.delete(&name, &params).await.map(drop)
        } else {
            let status = Patch::Merge(json!({ "status": running_status(&pod) }));
            pods.patch_status(&name, &PatchParams::default(), &status)
                .await
                .map(drop)
        };
        match result {
            Ok(()) => return,
            // Gone, or replaced by a new Pod of the same name: nothing left to do.
            Err(kube::Error::Api(status)) if status.code == 404 || status.code == 409 => return,
            Err(error) => {
                tracing::debug!(%error, %name, attempt, "node agent: retrying");
                tokio::time::sleep(Duration::from_millis(100 << attempt)).await;
            }
        }
    }
    tracing::warn!(%name, "node agent: gave up on a Pod");
}

/// The status of every container of `pod`: running (and ready) or not, in `state`.
fn container_statuses(
    pod: &Pod,
    running: bool,
    state: serde_json::Value,
) -> Vec<serde_json::Value> {
    let uid = pod.metadata.uid.as_deref().unwrap_or_default();
    (pod.spec.iter().flat_map(|spec| &spec.containers))
        .map(|container| {
            json!({"name": container.name, "image": container.image.as_deref().unwrap_or_default(),
                   "imageID": "", "containerID": format!("teamgpu-e2e://{uid}/{}", container.name),
                   "ready": running, "started": running, "restartCount": 0, "state": state})
        })
        .collect()
}

/// What a kubelet reports once all containers run and are ready.
fn running_status(pod: &Pod) -> serde_json::Value {
    let now = Time(Timestamp::now());
    let containers = container_statuses(pod, true, json!({"running": {"startedAt": now}}));
    let conditions: Vec<_> = ["Initialized", "Ready", "ContainersReady", "PodScheduled"]
        .map(|type_| json!({"type": type_, "status": "True", "lastTransitionTime": now}))
        .into();
    json!({"phase": "Running", "startTime": now, "conditions": conditions,
           "containerStatuses": containers})
}

/// What a kubelet reports once every container of a `restartPolicy: Never` Pod exited 0.
fn succeeded_status(pod: &Pod) -> serde_json::Value {
    let now = Time(Timestamp::now());
    let state = json!({"terminated": {"exitCode": 0, "reason": "Completed", "finishedAt": now}});
    let containers = container_statuses(pod, false, state);
    let conditions: Vec<_> = [("Ready", "False"), ("ContainersReady", "False")]
        .map(|(type_, status)| {
            json!({"type": type_, "status": status, "reason": "PodCompleted",
                   "lastTransitionTime": now})
        })
        .into();
    json!({"phase": "Succeeded", "conditions": conditions, "containerStatuses": containers})
}
