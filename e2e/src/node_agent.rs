//! The API part of a kubelet, for a control plane with no kubelet (see [`crate::control_plane`]),
//! in the manner of kwok.
//!
//! Without a kubelet, Nodes do not exist, scheduled Pods stay `Pending` forever, and a deleted
//! Pod bound to a Node stays `Terminating` forever, so evictions, rollouts and namespace
//! deletion never complete. The [`NodeAgent`] creates Ready Nodes, marks the Pods bound to them
//! `Running` (as if their containers had started) and finalizes the terminating ones (as a
//! kubelet does once their containers have stopped). No container ever runs.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, OnceLock, mpsc};
use std::thread::JoinHandle;
use std::time::Duration;

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStatus, Node,
    NodeCondition, NodeStatus, Pod, PodCondition, PodStatus,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::watcher;
use kube::runtime::{WatchStreamExt as _, watcher::Event};
use kube::{Api, Client, ResourceExt as _};
use tokio::sync::oneshot;

use crate::control_plane;

/// The label every default Node carries (value `"true"`), to select or pin to e2e Nodes.
pub const E2E_NODE_LABEL: &str = "teamgpu.io/e2e";

/// How many Nodes [`NodeSpec::defaults`] makes.
pub const DEFAULT_NODE_COUNT: usize = 6;

/// How often an action on a Pod is tried before giving up (the next watch event of that Pod
/// tries again anyway).
const ATTEMPTS: u32 = 5;

/// Why the node agent could not start.
#[derive(Debug, thiserror::Error)]
pub enum NodeAgentError {
    /// Its thread or tokio runtime could not be made.
    #[error("could not start the node agent's thread or runtime: {0}")]
    Thread(#[source] std::io::Error),
    /// No client could be made from the configuration.
    #[error("could not make a client for the node agent: {0}")]
    Client(#[source] kube::Error),
    /// A Node could not be created or its status set.
    #[error("could not register Node {name}: {source}")]
    RegisterNode {
        /// The Node.
        name: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// The agent's thread ended before it reported its Nodes registered.
    #[error("the node agent's thread ended during start-up")]
    Exited,
}

/// A Node to create: name, labels, and capacity (also used as allocatable).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeSpec {
    /// The Node's name.
    pub name: String,
    /// Its labels.
    pub labels: BTreeMap<String, String>,
    /// Its `status.capacity` and `status.allocatable`: resource name to quantity.
    pub capacity: BTreeMap<String, String>,
}

impl NodeSpec {
    /// A Node with label [`E2E_NODE_LABEL`]`=true` and capacity cpu 64, memory 512Gi, pods 110:
    /// large enough that tests are never short of room unless they ask to be.
    pub fn new(name: impl Into<String>) -> NodeSpec {
        let name = name.into();
        NodeSpec {
            labels: BTreeMap::from([
                (E2E_NODE_LABEL.to_owned(), "true".to_owned()),
                ("kubernetes.io/hostname".to_owned(), name.clone()),
                ("kubernetes.io/os".to_owned(), "linux".to_owned()),
                ("kubernetes.io/arch".to_owned(), "amd64".to_owned()),
            ]),
            capacity: BTreeMap::from([
                ("cpu".to_owned(), "64".to_owned()),
                ("memory".to_owned(), "512Gi".to_owned()),
                ("pods".to_owned(), "110".to_owned()),
            ]),
            name,
        }
    }

    /// The default Nodes: `e2e-node-0` .. `e2e-node-5`, each as [`NodeSpec::new`].
    pub fn defaults() -> Vec<NodeSpec> {
        (0..DEFAULT_NODE_COUNT)
            .map(|i| NodeSpec::new(format!("e2e-node-{i}")))
            .collect()
    }

    /// Adds or replaces a label.
    pub fn with_label(mut self, key: impl Into<String>, value: impl Into<String>) -> NodeSpec {
        self.labels.insert(key.into(), value.into());
        self
    }

    /// Adds or replaces a capacity (e.g. an extended resource).
    pub fn with_capacity(
        mut self,
        resource: impl Into<String>,
        quantity: impl Into<String>,
    ) -> NodeSpec {
        self.capacity.insert(resource.into(), quantity.into());
        self
    }
}

/// A running node agent. It works on a thread of its own with its own tokio runtime, so it
/// outlives the runtime of the test that started it; dropping the handle (or
/// [`NodeAgent::stop`]) stops it.
#[derive(Debug)]
pub struct NodeAgent {
    nodes: Vec<String>,
    shutdown: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

/// Starts a node agent: creates (or updates) the `nodes` with a `Ready=True` status, then plays
/// the kubelet for the Pods bound to them until stopped. Returns once the Nodes are registered.
///
/// Blocks the calling thread meanwhile; from async code call it through `spawn_blocking`.
/// Starting a second agent for the same Nodes is harmless (both do idempotent work), but
/// wasteful: share one through [`shared`] where possible.
pub fn start(config: kube::Config, nodes: &[NodeSpec]) -> Result<NodeAgent, NodeAgentError> {
    let specs = nodes.to_vec();
    let names: Vec<String> = specs.iter().map(|node| node.name.clone()).collect();
    let (ready_tx, ready_rx) = mpsc::channel();
    let (shutdown_tx, shutdown_rx) = oneshot::channel();
    let thread = std::thread::Builder::new()
        .name("teamgpu-e2e-node-agent".into())
        .spawn(move || run(config, specs, ready_tx, shutdown_rx))
        .map_err(NodeAgentError::Thread)?;
    let mut agent = NodeAgent {
        nodes: names,
        shutdown: Some(shutdown_tx),
        thread: Some(thread),
    };
    match ready_rx.recv() {
        Ok(Ok(())) => Ok(agent),
        Ok(Err(error)) => {
            agent.stop();
            Err(error)
        }
        Err(mpsc::RecvError) => {
            agent.stop();
            Err(NodeAgentError::Exited)
        }
    }
}

/// The one node agent of this process, with [`NodeSpec::defaults`], on
/// [`control_plane::shared`]; started on the first call and never stopped (it ends with the
/// process). Blocks during start-up: from async code call it through `spawn_blocking`.
pub fn shared() -> Result<&'static NodeAgent, String> {
    static SHARED: OnceLock<Result<NodeAgent, String>> = OnceLock::new();
    SHARED
        .get_or_init(|| {
            let plane = control_plane::shared()?;
            start(plane.admin_config(), &NodeSpec::defaults()).map_err(|error| error.to_string())
        })
        .as_ref()
        .map_err(Clone::clone)
}

impl NodeAgent {
    /// The names of the agent's Nodes.
    pub fn node_names(&self) -> Vec<String> {
        self.nodes.clone()
    }

    /// Stops the agent and waits for its thread. Its Nodes stay (and stay Ready). Idempotent.
    pub fn stop(&mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for NodeAgent {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The agent's thread: its own runtime, the Nodes, then the Pod loop until shutdown.
fn run(
    config: kube::Config,
    nodes: Vec<NodeSpec>,
    ready: mpsc::Sender<Result<(), NodeAgentError>>,
    shutdown: oneshot::Receiver<()>,
) {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            let _ = ready.send(Err(NodeAgentError::Thread(error)));
            return;
        }
    };
    runtime.block_on(async move {
        let client = match Client::try_from(config) {
            Ok(client) => client,
            Err(error) => {
                let _ = ready.send(Err(NodeAgentError::Client(error)));
                return;
            }
        };
        for node in &nodes {
            if let Err(source) = register(&client, node).await {
                let _ = ready.send(Err(NodeAgentError::RegisterNode {
                    name: node.name.clone(),
                    source,
                }));
                return;
            }
        }
        let _ = ready.send(Ok(()));
        let names: Arc<HashSet<String>> = Arc::new(nodes.into_iter().map(|n| n.name).collect());
        tokio::select! {
            _ = shutdown => {}
            () = play_kubelet(client, names) => {}
        }
    });
    runtime.shutdown_timeout(Duration::from_secs(1));
}

/// Creates the Node (or updates its labels if it exists) and sets a Ready status.
async fn register(client: &Client, spec: &NodeSpec) -> Result<(), kube::Error> {
    let nodes: Api<Node> = Api::all(client.clone());
    let status = node_status(spec);
    let node = Node {
        metadata: ObjectMeta {
            name: Some(spec.name.clone()),
            labels: Some(spec.labels.clone()),
            ..ObjectMeta::default()
        },
        status: Some(status.clone()),
        ..Node::default()
    };
    match nodes.create(&PostParams::default(), &node).await {
        Ok(_) => {}
        Err(kube::Error::Api(status)) if status.code == 409 => {
            let labels = serde_json::json!({ "metadata": { "labels": spec.labels } });
            nodes
                .patch(&spec.name, &PatchParams::default(), &Patch::Merge(&labels))
                .await?;
        }
        Err(error) => return Err(error),
    }
    // A create may drop or default parts of the status; the status subresource is what a
    // kubelet writes.
    let patch = serde_json::json!({ "status": status });
    nodes
        .patch_status(&spec.name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

fn node_status(spec: &NodeSpec) -> NodeStatus {
    let now = Time(Timestamp::now());
    let condition = |type_: &str, status: &str, reason: &str, message: &str| NodeCondition {
        type_: type_.to_owned(),
        status: status.to_owned(),
        reason: Some(reason.to_owned()),
        message: Some(message.to_owned()),
        last_heartbeat_time: Some(now.clone()),
        last_transition_time: Some(now.clone()),
    };
    let resources: BTreeMap<String, Quantity> = spec
        .capacity
        .iter()
        .map(|(name, quantity)| (name.clone(), Quantity(quantity.clone())))
        .collect();
    NodeStatus {
        capacity: Some(resources.clone()),
        allocatable: Some(resources),
        conditions: Some(vec![
            condition(
                "Ready",
                "True",
                "KubeletReady",
                "teamgpu e2e node agent is posting ready status",
            ),
            condition(
                "MemoryPressure",
                "False",
                "KubeletHasSufficientMemory",
                "no pressure",
            ),
            condition(
                "DiskPressure",
                "False",
                "KubeletHasNoDiskPressure",
                "no pressure",
            ),
            condition(
                "PIDPressure",
                "False",
                "KubeletHasSufficientPID",
                "no pressure",
            ),
        ]),
        ..NodeStatus::default()
    }
}

/// Watches all Pods and acts on those bound to the agent's Nodes. Runs until cancelled; watch
/// errors are retried with backoff by the watcher.
async fn play_kubelet(client: Client, nodes: Arc<HashSet<String>>) {
    let pods: Api<Pod> = Api::all(client.clone());
    let mut events = watcher(pods, watcher::Config::default())
        .default_backoff()
        .boxed();
    while let Some(event) = events.next().await {
        let pod = match event {
            Ok(Event::Apply(pod) | Event::InitApply(pod)) => pod,
            Ok(Event::Delete(_) | Event::Init | Event::InitDone) => continue,
            Err(error) => {
                tracing::warn!(%error, "node agent: watching Pods failed; retrying");
                continue;
            }
        };
        let bound_here = pod
            .spec
            .as_ref()
            .and_then(|spec| spec.node_name.as_ref())
            .is_some_and(|node| nodes.contains(node));
        if !bound_here {
            continue;
        }
        let Some(action) = Action::for_pod(&pod) else {
            continue;
        };
        // One task per action, so that a slow or failing request does not hold up the others.
        tokio::spawn(act(client.clone(), pod, action));
    }
}

/// What the kubelet would do with a Pod bound to its Node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Action {
    /// Report its containers started and ready.
    Run,
    /// It is being deleted and its containers have "stopped": delete it for good.
    Finalize,
}

impl Action {
    fn for_pod(pod: &Pod) -> Option<Action> {
        if pod.metadata.deletion_timestamp.is_some() {
            return Some(Action::Finalize);
        }
        let phase = pod
            .status
            .as_ref()
            .and_then(|status| status.phase.as_deref());
        match phase {
            // Terminal Pods are not restarted.
            Some("Running" | "Succeeded" | "Failed") => None,
            _ => Some(Action::Run),
        }
    }
}

/// Performs `action`, retrying transient failures a few times.
async fn act(client: Client, pod: Pod, action: Action) {
    let namespace = pod.namespace().unwrap_or_default();
    let name = pod.name_any();
    let pods: Api<Pod> = Api::namespaced(client, &namespace);
    let mut delay = Duration::from_millis(100);
    for attempt in 1..=ATTEMPTS {
        let result = match action {
            Action::Run => mark_running(&pods, &pod).await,
            Action::Finalize => finalize(&pods, &pod).await,
        };
        match result {
            Ok(()) => return,
            // Gone, or replaced by a new Pod of the same name: nothing left to do.
            Err(kube::Error::Api(status)) if status.code == 404 || status.code == 409 => return,
            Err(error) => {
                tracing::debug!(%error, %namespace, %name, ?action, attempt, "node agent: retrying");
                tokio::time::sleep(delay).await;
                delay *= 2;
            }
        }
    }
    tracing::warn!(%namespace, %name, ?action, "node agent: gave up on a Pod");
}

/// Deletes a terminating Pod with grace period 0, as a kubelet does once its containers have
/// stopped; the uid precondition keeps it from deleting a re-created Pod of the same name.
async fn finalize(pods: &Api<Pod>, pod: &Pod) -> Result<(), kube::Error> {
    let params = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(Preconditions {
            uid: pod.metadata.uid.clone(),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    pods.delete(&pod.name_any(), &params).await.map(|_| ())
}

/// Sets the status a kubelet reports once all containers run and are ready.
async fn mark_running(pods: &Api<Pod>, pod: &Pod) -> Result<(), kube::Error> {
    let patch = serde_json::json!({ "status": running_status(pod) });
    pods.patch_status(
        &pod.name_any(),
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await
    .map(|_| ())
}

fn running_status(pod: &Pod) -> PodStatus {
    let now = Time(Timestamp::now());
    let condition = |type_: &str| PodCondition {
        type_: type_.to_owned(),
        status: "True".to_owned(),
        last_transition_time: Some(now.clone()),
        ..PodCondition::default()
    };
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let container_id = |name: &str| format!("teamgpu-e2e://{uid}/{name}");
    let spec = pod.spec.clone().unwrap_or_default();
    let containers = spec
        .containers
        .iter()
        .map(|container| ContainerStatus {
            name: container.name.clone(),
            image: container.image.clone().unwrap_or_default(),
            image_id: String::new(),
            container_id: Some(container_id(&container.name)),
            ready: true,
            started: Some(true),
            restart_count: 0,
            state: Some(ContainerState {
                running: Some(ContainerStateRunning {
                    started_at: Some(now.clone()),
                }),
                ..ContainerState::default()
            }),
            ..ContainerStatus::default()
        })
        .collect();
    let init_containers: Vec<ContainerStatus> = spec
        .init_containers
        .iter()
        .flatten()
        .map(|container| ContainerStatus {
            name: container.name.clone(),
            image: container.image.clone().unwrap_or_default(),
            image_id: String::new(),
            container_id: Some(container_id(&container.name)),
            ready: true,
            started: Some(false),
            restart_count: 0,
            state: Some(ContainerState {
                terminated: Some(ContainerStateTerminated {
                    exit_code: 0,
                    reason: Some("Completed".to_owned()),
                    started_at: Some(now.clone()),
                    finished_at: Some(now.clone()),
                    container_id: Some(container_id(&container.name)),
                    ..ContainerStateTerminated::default()
                }),
                ..ContainerState::default()
            }),
            ..ContainerStatus::default()
        })
        .collect();
    PodStatus {
        phase: Some("Running".to_owned()),
        start_time: Some(now.clone()),
        conditions: Some(vec![
            condition("PodReadyToStartContainers"),
            condition("Initialized"),
            condition("Ready"),
            condition("ContainersReady"),
            condition("PodScheduled"),
        ]),
        container_statuses: Some(containers),
        init_container_statuses: (!init_containers.is_empty()).then_some(init_containers),
        ..PodStatus::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{Container, PodSpec};

    fn pod(phase: Option<&str>, deleting: bool) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some("p".into()),
                deletion_timestamp: deleting.then(|| Time(Timestamp::now())),
                ..ObjectMeta::default()
            },
            spec: Some(PodSpec {
                containers: vec![Container {
                    name: "c".into(),
                    image: Some("registry.k8s.io/pause:3.10".into()),
                    ..Container::default()
                }],
                ..PodSpec::default()
            }),
            status: phase.map(|phase| PodStatus {
                phase: Some(phase.into()),
                ..PodStatus::default()
            }),
        }
    }

    #[test]
    fn actions_follow_a_kubelet() {
        assert_eq!(Action::for_pod(&pod(None, false)), Some(Action::Run));
        assert_eq!(
            Action::for_pod(&pod(Some("Pending"), false)),
            Some(Action::Run)
        );
        assert_eq!(Action::for_pod(&pod(Some("Running"), false)), None);
        assert_eq!(Action::for_pod(&pod(Some("Succeeded"), false)), None);
        assert_eq!(
            Action::for_pod(&pod(Some("Running"), true)),
            Some(Action::Finalize)
        );
    }

    #[test]
    fn running_status_reports_every_container_ready() {
        let status = running_status(&pod(None, false));
        assert_eq!(status.phase.as_deref(), Some("Running"));
        let containers = status.container_statuses.unwrap_or_default();
        assert_eq!(containers.len(), 1);
        assert!(containers[0].ready);
        assert!(status.init_container_statuses.is_none());
    }

    #[test]
    fn default_nodes() {
        let nodes = NodeSpec::defaults();
        assert_eq!(nodes.len(), DEFAULT_NODE_COUNT);
        assert_eq!(nodes[0].name, "e2e-node-0");
        assert_eq!(nodes[5].labels[E2E_NODE_LABEL], "true");
        assert_eq!(nodes[5].capacity["memory"], "512Gi");
    }
}
