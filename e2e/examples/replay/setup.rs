//! The replay's cluster and each configuration's objects, on the API server (needs a client).

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

use k8s_openapi::api::batch::v1::Job as BatchJob;
use k8s_openapi::api::core::v1::{Namespace, ResourceQuota};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceClaimTemplate};
use k8s_openapi::api::scheduling::v1::PriorityClass;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::{Client, Resource, ResourceExt as _};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use teamgpu::api::{GpuSharingPolicy, TeamGpuPolicy};
use teamgpu_e2e::node_agent::{self, NodeAgent, NodeSpec, RUN_SECONDS_ANNOTATION};
use teamgpu_e2e::sandbox::Sandbox;

use crate::observe::{GPUS_LABEL, JOB_LABEL, RUN_LABEL};
use crate::workload::{GPUS_PER_NODE, GRACE_SECONDS, Job, NODES, Priority, Team};

/// The GpuSharingPolicy of configurations (a) and (b): every GPU of the replay's nodes.
pub const SHARING_POLICY: &str = "gpu";
/// The DeviceClass of configuration (c), which has no teamgpu.
const PLAIN_CLASS: &str = "replay-plain";
/// The product name of the replay's GPUs (`teamgpu_synthetic::synthetic`'s first).
const PRODUCT: &str = "NVIDIA Model 0";
/// Template sizes: `gpu`, `gpu-x2`, `gpu-x4`, `gpu-x8`.
const TEMPLATE_COUNTS: [u32; 4] = [1, 2, 4, 8];
/// How long a configuration's objects may take to appear or go.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(90);

pub type Error = Box<dyn std::error::Error + Send + Sync>;

/// One of the three configurations, each replaying the same jobs on a clean slate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Configuration {
    /// teamgpu, limits above guarantees: idle devices lent by weight, reclaimed by eviction.
    Borrowing,
    /// teamgpu with limit = guarantee: static quotas, nothing lent.
    Static,
    /// No teamgpu: a plain DeviceClass, no quotas, first come first served.
    Plain,
}

impl Configuration {
    pub const ALL: [Configuration; 3] = [
        Configuration::Borrowing,
        Configuration::Static,
        Configuration::Plain,
    ];

    pub fn letter(self) -> &'static str {
        match self {
            Configuration::Borrowing => "a",
            Configuration::Static => "b",
            Configuration::Plain => "c",
        }
    }

    pub fn title(self) -> &'static str {
        match self {
            Configuration::Borrowing => "teamgpu, borrowing and reclaim",
            Configuration::Static => "teamgpu, static quotas (limit = guarantee)",
            Configuration::Plain => "no teamgpu (first come, first served)",
        }
    }

    /// Each team's limit here (no quota at all without teamgpu).
    pub fn limits(self, teams: &[Team]) -> Vec<u32> {
        let capacity = NODES * GPUS_PER_NODE;
        teams
            .iter()
            .map(|t| match self {
                Configuration::Borrowing => t.limit,
                Configuration::Static => t.guaranteed,
                Configuration::Plain => capacity,
            })
            .collect()
    }

    /// Each team's lending limit: as its TeamGpuPolicy says, and none without teamgpu.
    pub fn lending_limits(self, teams: &[Team]) -> Vec<Option<u32>> {
        (teams.iter())
            .map(|t| t.lending_limit.filter(|_| self.uses_teamgpu()))
            .collect()
    }

    pub fn uses_teamgpu(self) -> bool {
        self != Configuration::Plain
    }
}

/// The quota key of the replay's devices in a team namespace.
pub fn quota_key() -> String {
    format!("{SHARING_POLICY}.teamgpu.io.deviceclass.resource.k8s.io/devices")
}

/// The template of `count` devices, named as teamgpu names its own.
fn template_name(count: u32) -> String {
    match count {
        1 => SHARING_POLICY.to_owned(),
        n => format!("{SHARING_POLICY}-x{n}"),
    }
}

/// Registers the Nodes beyond the harness's six (`e2e-node-6` ..), with a node agent of their
/// own, so the cluster has [`NODES`]; then the sandbox publishes one 8-GPU slice on each.
pub async fn cluster(sandbox: &Sandbox) -> Result<NodeAgent, Error> {
    let extra: Vec<NodeSpec> = (6..NODES)
        .map(|i| NodeSpec::new(format!("e2e-node-{i}")))
        .collect();
    let config = sandbox.cluster().config().clone();
    let agent = tokio::task::spawn_blocking(move || node_agent::start(config, &extra)).await??;
    let scale = teamgpu_synthetic::Scale {
        teams: 0,
        namespaces_per_team: 0,
        sharing_policies: 1,
        nodes: NODES as usize,
        claims: 0,
        counter_sets: false,
        departments: 0,
    };
    let slices = teamgpu_synthetic::synthetic(scale)?.slices;
    sandbox.devices(&[], &slices).await?;
    priority_classes(&sandbox.client()).await?;
    Ok(agent)
}

/// The replay's PriorityClasses (cluster-scoped; kept if a previous run left them).
async fn priority_classes(client: &Client) -> Result<(), Error> {
    for priority in Priority::ALL {
        let class: PriorityClass = object(json!({
            "apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
            "metadata": {"name": priority.class_name()},
            "value": priority.value(), "preemptionPolicy": "Never",
            "description": "teamgpu workload replay"}))?;
        create_or_keep(&Api::all(client.clone()), &class).await?;
    }
    Ok(())
}

/// A configuration's namespaces, one per team (`<letter>-<team>-<suffix>`), in team order.
pub async fn namespaces(
    sandbox: &Sandbox,
    config: Configuration,
    teams: &[Team],
) -> Result<Vec<String>, Error> {
    let mut names = Vec::new();
    for team in teams {
        let name = format!("{}-{}", config.letter(), team.name);
        names.push(sandbox.namespace(&name, None).await?);
    }
    Ok(names)
}

/// Installs what `config` runs with in `namespaces` (one per team) and waits until every
/// namespace has its templates (and, with teamgpu, its quota): the operator, if any, must
/// already run.
pub async fn install(
    client: &Client,
    config: Configuration,
    teams: &[Team],
    namespaces: &[String],
) -> Result<(), Error> {
    if config.uses_teamgpu() {
        create(&Api::all(client.clone()), &sharing_policy()?).await?;
        let limits = config.limits(teams);
        for ((team, namespace), limit) in teams.iter().zip(namespaces).zip(limits) {
            create(
                &Api::all(client.clone()),
                &team_policy(team, namespace, limit)?,
            )
            .await?;
        }
    } else {
        create_or_keep(&Api::all(client.clone()), &plain_class()?).await?;
        for namespace in namespaces {
            for count in TEMPLATE_COUNTS {
                create(
                    &Api::namespaced(client.clone(), namespace),
                    &plain_template(count)?,
                )
                .await?;
            }
        }
    }
    for namespace in namespaces {
        wait_until_ready(client, config, namespace).await?;
    }
    Ok(())
}

fn sharing_policy() -> Result<GpuSharingPolicy, Error> {
    object(json!({
        "apiVersion": "teamgpu.io/v1alpha1", "kind": "GpuSharingPolicy",
        "metadata": {"name": SHARING_POLICY},
        "spec": {"selector": {"productNames": [PRODUCT]},
                 "claimTemplates": {"counts": TEMPLATE_COUNTS}}}))
}

fn team_policy(team: &Team, namespace: &str, limit: u32) -> Result<TeamGpuPolicy, Error> {
    let mut quota = json!({"sharingPolicy": SHARING_POLICY, "guaranteed": team.guaranteed,
                           "limit": limit});
    if let Some(lending_limit) = team.lending_limit {
        quota["lendingLimit"] = json!(lending_limit);
    }
    object(json!({
        "apiVersion": "teamgpu.io/v1alpha1", "kind": "TeamGpuPolicy",
        "metadata": {"name": team.name},
        "spec": {"namespaces": [namespace], "weight": team.weight, "quotas": [quota],
                 "reclaim": {"enabled": team.reclaim, "gracePeriodSeconds": GRACE_SECONDS}}}))
}

/// Configuration (c)'s DeviceClass: the replay's GPUs, no teamgpu in between. Labelled
/// `teamgpu.io/e2e`, so the sandbox deletes it at the end.
fn plain_class() -> Result<DeviceClass, Error> {
    object(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
        "metadata": {"name": PLAIN_CLASS, "labels": {"teamgpu.io/e2e": "true"}},
        "spec": {"selectors": [{"cel": {"expression": format!(
            "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].productName == '{PRODUCT}'")}}]}}))
}

fn plain_template(count: u32) -> Result<ResourceClaimTemplate, Error> {
    object(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": template_name(count)},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": PLAIN_CLASS, "allocationMode": "ExactCount", "count": count}}]}}}}))
}

/// Polls until `namespace` has the four templates and, with teamgpu, a quota for the replay's
/// devices in its status (the quota controller has seen it, so quota admission counts).
async fn wait_until_ready(
    client: &Client,
    config: Configuration,
    namespace: &str,
) -> Result<(), Error> {
    let templates: Api<ResourceClaimTemplate> = Api::namespaced(client.clone(), namespace);
    let quotas: Api<ResourceQuota> = Api::namespaced(client.clone(), namespace);
    let key = quota_key();
    let started = Instant::now();
    loop {
        let names: BTreeSet<String> = templates
            .list(&ListParams::default())
            .await?
            .items
            .iter()
            .map(|t| t.name_any())
            .collect();
        let templates_ready = TEMPLATE_COUNTS
            .iter()
            .all(|&c| names.contains(&template_name(c)));
        let quota_ready = !config.uses_teamgpu()
            || (quotas.list(&ListParams::default()).await?.items.iter()).any(|q| {
                (q.status.as_ref().and_then(|s| s.hard.as_ref()))
                    .is_some_and(|h| h.contains_key(&key))
            });
        if templates_ready && quota_ready {
            return Ok(());
        }
        if started.elapsed() > SETTLE_TIMEOUT {
            return Err(
                format!("{namespace}: templates {names:?}, quota ready {quota_ready}").into(),
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The CPUs a Pod requests per GPU: a node's 64 go with its 8 GPUs, as on DGX-like nodes, so a
/// scheduler that packs by cpu packs by GPUs.
const CPUS_PER_GPU: u32 = 8;

/// The batch/v1 Job of `job` in `namespace`: `pods` Pods at once (parallelism = completions),
/// each with one claim from the template of its size, "running" `run_seconds` on the node
/// agent. No `podFailurePolicy`, so an evicted Pod counts as failed (the backoff limit is out
/// of reach); the job controller makes its replacement after its failure backoff, 9.4 s after
/// the eviction (p50; 20 s for a Job's second), as the replay prints. A policy ignoring
/// `DisruptionTarget` keeps the backoff limit and not the delay (9.7 s in a run with it).
pub fn batch_job(job: &Job, config: Configuration) -> Result<BatchJob, Error> {
    let labels = json!({RUN_LABEL: config.letter(), JOB_LABEL: job.name,
                        GPUS_LABEL: job.gpus_per_pod.to_string()});
    object(json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": job.name, "labels": {RUN_LABEL: config.letter()}},
        "spec": {
            "parallelism": job.pods, "completions": job.pods, "backoffLimit": 1000,
            "template": {
                "metadata": {"labels": labels,
                             "annotations": {RUN_SECONDS_ANNOTATION: format!("{:.2}", job.run_seconds)}},
                "spec": {
                    "restartPolicy": "Never",
                    "priorityClassName": job.priority.class_name(),
                    "terminationGracePeriodSeconds": 0,
                    "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10",
                                    "resources": {"claims": [{"name": "gpu"}],
                                                  "requests": {"cpu": (CPUS_PER_GPU * job.gpus_per_pod).to_string()}}}],
                    "resourceClaims": [{"name": "gpu",
                                        "resourceClaimTemplateName": template_name(job.gpus_per_pod)}]}}}}))
}

/// Removes a configuration: its policies (the operator, still running, prunes what it made),
/// the plain class's templates with the namespaces, and waits until no claim of
/// `namespaces` holds a device, so the next configuration starts with every GPU free.
pub async fn tear_down(client: &Client, namespaces: &[String]) -> Result<(), Error> {
    delete_all::<TeamGpuPolicy>(client).await?;
    delete_all::<GpuSharingPolicy>(client).await?;
    let namespace_api: Api<Namespace> = Api::all(client.clone());
    for namespace in namespaces {
        // Jobs first, with their Pods (background): the namespace then goes quickly.
        let jobs: Api<BatchJob> = Api::namespaced(client.clone(), namespace);
        jobs.delete_collection(&DeleteParams::background(), &ListParams::default())
            .await?;
        ignore_gone(
            namespace_api
                .delete(namespace, &DeleteParams::background())
                .await,
        )?;
    }
    let covered: BTreeSet<&String> = namespaces.iter().collect();
    let claims: Api<ResourceClaim> = Api::all(client.clone());
    let started = Instant::now();
    loop {
        let left = (claims.list(&ListParams::default()).await?.items.iter())
            .filter(|c| c.namespace().is_some_and(|ns| covered.contains(&ns)))
            .count();
        let managed = ListParams::default().labels("app.kubernetes.io/managed-by=teamgpu");
        let quotas = Api::<ResourceQuota>::all(client.clone())
            .list(&managed)
            .await?
            .items
            .len();
        if left == 0 && quotas == 0 {
            return Ok(());
        }
        if started.elapsed() > SETTLE_TIMEOUT {
            return Err(format!("tearing down: {left} claims and {quotas} quotas left").into());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

async fn delete_all<K>(client: &Client) -> Result<(), Error>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug,
{
    let api: Api<K> = Api::all(client.clone());
    for object in api.list(&ListParams::default()).await?.items {
        ignore_gone(
            api.delete(&object.name_any(), &DeleteParams::background())
                .await,
        )?;
    }
    Ok(())
}

fn object<K: DeserializeOwned>(value: Value) -> Result<K, Error> {
    Ok(serde_json::from_value(value)?)
}

async fn create<K>(api: &Api<K>, object: &K) -> Result<(), Error>
where
    K: Resource + Clone + DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    api.create(&PostParams::default(), object).await?;
    Ok(())
}

async fn create_or_keep<K>(api: &Api<K>, object: &K) -> Result<(), Error>
where
    K: Resource + Clone + DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    match api.create(&PostParams::default(), object).await {
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(()),
        other => other.map(drop).map_err(Into::into),
    }
}

fn ignore_gone<T>(result: Result<T, kube::Error>) -> Result<(), kube::Error> {
    match result {
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        other => other.map(drop),
    }
}

/// Namespace -> team index, for a configuration's namespaces in team order.
pub fn team_of(namespaces: &[String]) -> HashMap<String, usize> {
    namespaces
        .iter()
        .cloned()
        .enumerate()
        .map(|(i, ns)| (ns, i))
        .collect()
}
