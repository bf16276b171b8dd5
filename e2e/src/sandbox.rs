//! Isolation of the operator scenarios on a real cluster (the harness's own control plane, or a
//! throwaway cluster of `TEAMGPU_E2E_KUBECONFIG`).
//!
//! A [`Sandbox`] gives its namespaces names of their own (`<name>-<suffix>`, labelled
//! `teamgpu.io/e2e=true`), publishes the scenarios' devices (DeviceClasses and ResourceSlices
//! labelled `teamgpu.io/e2e=true`), and cleans up before it starts (what a crashed run left) and
//! when it is dropped (also on panic): every TeamGpuPolicy and GpuSharingPolicy, everything
//! labelled `app.kubernetes.io/managed-by=teamgpu`, its devices, and the pods, claims and
//! namespaces of every e2e namespace. The policies are cluster-scoped and every scenario runs its
//! own operator, so sandboxes hold a process-wide lock for their lifetime: the scenarios of one
//! test binary run one at a time.

use std::collections::BTreeMap;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, ListParams, ObjectMeta, Patch, PatchParams,
    PostParams,
};
use kube::{Client, Resource, ResourceExt};
use serde_json::json;
use teamgpu::api::{GpuSharingPolicy, TeamGpuPolicy};

use crate::TestCluster;
use crate::fixtures::fresh;

/// Label of everything the harness makes (namespaces, DeviceClasses, ResourceSlices).
pub const E2E_LABEL: &str = "teamgpu.io/e2e";
/// Label by which the sample teams select their namespaces.
pub const TEAM_LABEL: &str = "teamgpu.io/team";
/// The driver of the fixture devices.
pub const DRIVER: &str = "gpu.nvidia.com";
/// How long cleaning up may take (namespaces may terminate slowly; this waits for the rest).
const CLEAN_TIMEOUT: Duration = Duration::from_secs(120);

/// Held by the sandbox on a real cluster: one scenario at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Errors of the sandbox.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// The API refused a request.
    #[error(transparent)]
    Kube(#[from] kube::Error),
    /// Objects were still there when cleaning up timed out.
    #[error("cleaning up: still there after {CLEAN_TIMEOUT:?}: {0:?}")]
    NotClean(Vec<String>),
    /// The cluster already has the fixture driver's devices.
    #[error(
        "the cluster has ResourceSlices of driver {DRIVER} that the e2e harness did not make \
         ({0:?}); the scenarios assume exactly the fixture's devices, so run them on a throwaway \
         cluster without a GPU driver"
    )]
    ForeignSlices(Vec<String>),
    /// No Node to publish the fixture devices on.
    #[error("the cluster has no schedulable Node (none without NoSchedule/NoExecute taints)")]
    NoNodes,
}

/// Isolation for one scenario; see the module documentation.
#[derive(Debug)]
pub struct Sandbox {
    cluster: TestCluster,
    suffix: String,
    // Dropped after `cluster` (fields drop in order, after `Drop::drop` has cleaned up).
    _serial: tokio::sync::MutexGuard<'static, ()>,
}

impl Sandbox {
    /// Takes the lock (real cluster), cleans up, and checks that the cluster has none of the
    /// fixture driver's devices but the harness's.
    pub async fn start(cluster: TestCluster) -> Result<Sandbox, SandboxError> {
        let serial = SERIAL.lock().await;
        let sandbox = Sandbox {
            cluster,
            suffix: suffix(),
            _serial: serial,
        };
        clean(&sandbox.client()).await?;
        let foreign: Vec<String> = Api::<ResourceSlice>::all(sandbox.client())
            .list(&ListParams::default())
            .await?
            .items
            .iter()
            .filter(|s| s.spec.driver == DRIVER && !s.labels().contains_key(E2E_LABEL))
            .map(ResourceExt::name_any)
            .collect();
        if !foreign.is_empty() {
            return Err(SandboxError::ForeignSlices(foreign));
        }
        Ok(sandbox)
    }

    /// The scenarios' start: the cluster (`None` when none is configured: the scenario is
    /// skipped), the operator ServiceAccount's config, and a sandbox with the built-in example's
    /// devices (the NVIDIA DeviceClasses and six 8-GPU nodes' ResourceSlices). Panics on
    /// failure, as a test would.
    pub async fn with_example_devices() -> Option<(Sandbox, kube::Config)> {
        let cluster = TestCluster::start_or_skip().await?;
        let operator = cluster.operator_config().await.expect("operator token");
        let sandbox = Sandbox::start(cluster)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let example = teamgpu::cli::example::state().expect("the built-in example");
        sandbox
            .devices(&example.device_classes, &example.slices)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        Some((sandbox, operator))
    }

    /// The cluster.
    pub fn cluster(&self) -> &TestCluster {
        &self.cluster
    }

    /// A client of the cluster.
    pub fn client(&self) -> Client {
        self.cluster.client()
    }

    /// The actual name of this sandbox's namespace `name`.
    pub fn ns(&self, name: &str) -> String {
        format!("{name}-{}", self.suffix)
    }

    /// Creates namespace [`Sandbox::ns`]`(name)`, in `team` (label `teamgpu.io/team`) if given.
    pub async fn namespace(&self, name: &str, team: Option<&str>) -> Result<String, SandboxError> {
        let mut labels = BTreeMap::from([(E2E_LABEL.to_owned(), "true".to_owned())]);
        labels.extend(team.map(|t| (TEAM_LABEL.to_owned(), t.to_owned())));
        let ns = Namespace {
            metadata: ObjectMeta {
                name: Some(self.ns(name)),
                labels: Some(labels),
                ..Default::default()
            },
            ..Default::default()
        };
        let created = Api::<Namespace>::all(self.client())
            .create(&PostParams::default(), &ns)
            .await?;
        Ok(created.name_any())
    }

    /// Publishes the fixture devices: the DeviceClasses the cluster does not have yet, and the
    /// ResourceSlices with their nodes moved round-robin onto the cluster's schedulable Nodes (a
    /// real scheduler only allocates devices of a slice that names a node it can place the Pod
    /// on; the pool names stay). Both labelled `teamgpu.io/e2e=true`, so only they are deleted.
    pub async fn devices(
        &self,
        classes: &[DeviceClass],
        slices: &[ResourceSlice],
    ) -> Result<(), SandboxError> {
        let class_api: Api<DeviceClass> = Api::all(self.client());
        for class in classes {
            if class_api.get_opt(&class.name_any()).await?.is_none() {
                class_api
                    .create(&PostParams::default(), &labelled(class))
                    .await?;
            }
        }
        let nodes = self.nodes().await?;
        let slice_api: Api<ResourceSlice> = Api::all(self.client());
        for (slice, node) in slices.iter().zip(nodes.iter().cycle()) {
            let mut slice = labelled(slice);
            slice.spec.node_name = Some(node.clone());
            slice_api.create(&PostParams::default(), &slice).await?;
        }
        Ok(())
    }

    /// The nodes to publish `slices` on, in order.
    async fn nodes(&self) -> Result<Vec<String>, SandboxError> {
        let nodes: Vec<String> = Api::<Node>::all(self.client())
            .list(&ListParams::default())
            .await?
            .items
            .iter()
            .filter(|n| {
                let spec = n.spec.as_ref();
                spec.and_then(|s| s.unschedulable) != Some(true)
                    && !spec
                        .and_then(|s| s.taints.as_ref())
                        .into_iter()
                        .flatten()
                        .any(|t| t.effect == "NoSchedule" || t.effect == "NoExecute")
            })
            .map(ResourceExt::name_any)
            .collect();
        if nodes.is_empty() {
            return Err(SandboxError::NoNodes);
        }
        Ok(nodes)
    }
}

impl Drop for Sandbox {
    /// Cleans up on a thread with its own runtime (Drop cannot await).
    fn drop(&mut self) {
        let config = self.cluster.config().clone();
        let cleaned = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?;
            rt.block_on(async move {
                let client = Client::try_from(config).map_err(|e| e.to_string())?;
                clean(&client).await.map_err(|e| e.to_string())
            })
        })
        .join();
        match cleaned {
            Ok(Ok(())) => {}
            Ok(Err(e)) => eprintln!("e2e sandbox: {e}"),
            Err(_) => eprintln!("e2e sandbox: cleaning up panicked"),
        }
    }
}

/// A suffix of namespace names unique to one sandbox (also across runs: a namespace of an earlier
/// run may still be terminating).
fn suffix() -> String {
    static COUNT: AtomicU64 = AtomicU64::new(0);
    let random = std::collections::hash_map::RandomState::new()
        .hash_one((COUNT.fetch_add(1, Ordering::Relaxed), std::process::id()));
    format!("{:06x}", random & 0xff_ffff)
}

/// `obj` to create, labelled `teamgpu.io/e2e=true`.
fn labelled<K: Resource + Clone>(obj: &K) -> K {
    let mut obj = fresh(obj);
    obj.labels_mut()
        .insert(E2E_LABEL.to_owned(), "true".to_owned());
    obj
}

/// Deletes what the scenarios leave behind, again and again until a pass finds nothing (an
/// operator that was just stopped may still write, and claims go only once their pods are gone).
/// Namespaces are not waited for (they may terminate slowly and their names are never reused),
/// but they lose their team label first, since a terminating namespace keeps its labels and would
/// still match a team.
pub async fn clean(client: &Client) -> Result<(), SandboxError> {
    let started = Instant::now();
    loop {
        let left = sweep(client).await?;
        if left.is_empty() {
            return Ok(());
        }
        if started.elapsed() > CLEAN_TIMEOUT {
            return Err(SandboxError::NotClean(left));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// One cleaning pass: deletes everything found, and says what it found.
async fn sweep(client: &Client) -> Result<Vec<String>, SandboxError> {
    let every = ListParams::default();
    let e2e = ListParams::default().labels(&format!("{E2E_LABEL}=true"));
    let managed = ListParams::default().labels("app.kubernetes.io/managed-by=teamgpu");
    let mut found = Vec::new();
    // Policies first, so that a running operator prunes rather than restores what goes next.
    for (resource, lp) in [
        (ApiResource::erase::<TeamGpuPolicy>(&()), &every),
        (ApiResource::erase::<GpuSharingPolicy>(&()), &every),
    ]
    .into_iter()
    .chain(
        teamgpu::core::diff::Kind::ALL
            .into_iter()
            .map(|kind| (kind.api_resource(), &managed)),
    )
    .chain([
        (ApiResource::erase::<DeviceClass>(&()), &e2e),
        (ApiResource::erase::<ResourceSlice>(&()), &e2e),
    ]) {
        found.extend(delete_listed(client, &resource, None, lp).await?);
    }
    // DeviceTaintRules, where the API server serves them (the harness's does).
    if let Some(rules) = teamgpu::controller::taint_rules::served(client).await {
        found.extend(delete_listed(client, &rules, None, &e2e).await?);
    }
    let namespaces: Api<Namespace> = Api::all(client.clone());
    // The guard label teamgpu sets on namespaces outside teams (the system's among them).
    let guard = teamgpu::core::plan::outside_teams::GUARD_LABEL;
    for ns in namespaces
        .list(&ListParams::default().labels(guard))
        .await?
        .items
    {
        let unlabel = json!({"metadata": {"labels": {guard: null}}});
        let patch = Patch::Merge(&unlabel);
        ignore_gone(
            namespaces
                .patch(&ns.name_any(), &PatchParams::default(), &patch)
                .await,
        )?;
    }
    for ns in namespaces.list(&e2e).await?.items {
        let name = ns.name_any();
        // Pods at once (grace 0), so that their claims are released now.
        Api::<Pod>::namespaced(client.clone(), &name)
            .delete_collection(
                &DeleteParams {
                    grace_period_seconds: Some(0),
                    ..Default::default()
                },
                &every,
            )
            .await?;
        found.extend(
            delete_listed(
                client,
                &ApiResource::erase::<ResourceClaim>(&()),
                Some(&name),
                &every,
            )
            .await?,
        );
        if ns.metadata.deletion_timestamp.is_none() {
            let unlabel = json!({"metadata": {"labels": {TEAM_LABEL: null}}});
            namespaces
                .patch(&name, &PatchParams::default(), &Patch::Merge(&unlabel))
                .await?;
            ignore_gone(namespaces.delete(&name, &DeleteParams::background()).await)?;
        }
    }
    Ok(found)
}

/// Deletes every object of `resource` that `lp` lists in `namespace` (None: in every
/// namespace); returns them as `<plural> <namespace>/<name>`.
async fn delete_listed(
    client: &Client,
    resource: &ApiResource,
    namespace: Option<&str>,
    lp: &ListParams,
) -> Result<Vec<String>, SandboxError> {
    let list: Api<DynamicObject> = match namespace {
        Some(ns) => Api::namespaced_with(client.clone(), ns, resource),
        None => Api::all_with(client.clone(), resource),
    };
    let mut found = Vec::new();
    for o in list.list(lp).await?.items {
        let (name, ns) = (o.name_any(), o.namespace());
        let api = match &ns {
            Some(ns) => Api::namespaced_with(client.clone(), ns, resource),
            None => list.clone(),
        };
        ignore_gone(api.delete(&name, &DeleteParams::background()).await)?;
        found.push(format!(
            "{} {}/{name}",
            resource.plural,
            ns.unwrap_or_default()
        ));
    }
    Ok(found)
}

fn ignore_gone<T>(result: Result<T, kube::Error>) -> Result<(), kube::Error> {
    match result {
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        other => other.map(drop),
    }
}
