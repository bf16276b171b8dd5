//! The operator at scale on a real control plane, measured against the API server's write floor:
//!
//! ```sh
//! cargo build --release -p teamgpu            # the operator runs as its own process
//! TEAMGPU_E2E_ASSETS=/path/to/bin cargo run --release -p teamgpu-e2e --example scale -- \
//!     [teams] [namespaces-per-team] [sharing-policies] [nodes] [claims]
//! ```
//!
//! Defaults 10 2 5 20 200 (20 team namespaces, 160 devices); the benchmark of `docs/operator.md`
//! is `100 10 20 5000 10000` (1,000 namespaces, 40,000 devices, 10,000 claims). It prints:
//! - the write floor: a plain client (the operator's ServiceAccount, so the same API priority
//!   and fairness) with 16 requests in flight creating the same quotas and templates, owner
//!   references included (in namespaces of their own);
//! - the operator's time from an empty cluster to every quota and template in place, and the
//!   ratio to the floor; its writes as the API server counted them, per object;
//! - its resident memory (peak and settled, from /proc);
//! - the reaction time, claim created to the team's status counting it, p50 and p99 of 100;
//! - its writes during an idle minute (`TEAMGPU_SCALE_IDLE_SECONDS`, default 60).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Namespace, ResourceQuota};
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceClaimTemplate};
use kube::ResourceExt;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use serde_json::json;
use teamgpu::api::TeamGpuPolicy;
use teamgpu::core::plan::admission::EXEMPT_LABEL;
use teamgpu::core::plan::outside_teams;
use teamgpu_e2e::TestCluster;
use teamgpu_e2e::fixtures::fresh;
use teamgpu_synthetic::{Scale, synthetic};

/// Requests in flight, for the floor and for filling the cluster.
const PARALLEL: usize = 16;

/// Resources the operator writes, as `apiserver_request_total` names them.
const OPERATOR_RESOURCES: [&str; 7] = [
    "deviceclasses.resource.k8s.io",
    "resourceclaimtemplates.resource.k8s.io",
    "resourcequotas",
    "validatingadmissionpolicies.admissionregistration.k8s.io",
    "validatingadmissionpolicybindings.admissionregistration.k8s.io",
    "gpusharingpolicies.teamgpu.io/status",
    "teamgpupolicies.teamgpu.io/status",
];

/// Writes (create, patch, delete) the API server counted on the operator's resources. Nobody
/// else writes them here, except the quota controller's status updates, which are `update`s of
/// `resourcequotas/status` and so not counted.
async fn operator_writes(cluster: &TestCluster) -> u64 {
    writes_by_resource(cluster).await.values().sum()
}

/// [`operator_writes`] by (verb, resource).
async fn writes_by_resource(cluster: &TestCluster) -> BTreeMap<(String, String), u64> {
    requests(cluster, &["create", "patch", "delete"], &OPERATOR_RESOURCES).await
}

/// The requests the API server counted with one of `verbs` on one of `resources`, by (verb,
/// resource).
async fn requests(
    cluster: &TestCluster,
    verbs: &[&str],
    resources: &[&str],
) -> BTreeMap<(String, String), u64> {
    cluster
        .server_request_counts()
        .await
        .expect("API server metrics")
        .into_iter()
        .filter(|((verb, resource), _)| {
            verbs.contains(&verb.to_lowercase().as_str()) && resources.contains(&resource.as_str())
        })
        .collect()
}

fn minus(
    a: &BTreeMap<(String, String), u64>,
    b: &BTreeMap<(String, String), u64>,
) -> BTreeMap<String, u64> {
    a.iter()
        .map(|((verb, resource), n)| {
            (
                format!("{verb} {resource}"),
                n - b
                    .get(&(verb.clone(), resource.clone()))
                    .copied()
                    .unwrap_or(0),
            )
        })
        .filter(|(_, n)| *n > 0)
        .collect()
}

/// Waits until `want` objects of `K` that teamgpu manages exist, seen by a watch of their
/// metadata: polling lists of 10,000 objects would load the API server being measured.
async fn until_managed<K>(client: &kube::Client, want: usize)
where
    K: kube::Resource<DynamicType = ()> + Clone + std::fmt::Debug + Send + Sync + 'static,
{
    use kube::core::PartialObjectMeta;
    use kube::runtime::watcher::{self, Event};
    let config = watcher::Config::default().labels("app.kubernetes.io/managed-by=teamgpu");
    let mut seen = std::collections::HashSet::new();
    let mut events = std::pin::pin!(watcher::watcher(
        Api::<PartialObjectMeta<K>>::all(client.clone()),
        config
    ));
    while seen.len() < want {
        match events.next().await {
            // Not the quotas of 0 outside teams (the system's namespaces): only the teams'.
            Some(Ok(Event::Apply(o) | Event::InitApply(o)))
                if o.metadata.name.as_deref() != Some(outside_teams::QUOTA_NAME) =>
            {
                seen.insert((o.metadata.namespace, o.metadata.name));
            }
            Some(Ok(Event::Apply(_) | Event::InitApply(_))) => {}
            Some(Ok(Event::Delete(o))) => {
                seen.remove(&(o.metadata.namespace, o.metadata.name));
            }
            Some(Ok(Event::Init | Event::InitDone)) => {}
            Some(Err(error)) => eprintln!("watching {}: {error}", K::kind(&())),
            None => panic!("the watch of {} ended", K::kind(&())),
        }
    }
}

/// Creates `objects` with [`PARALLEL`] requests in flight.
async fn create_all<K>(client: &kube::Client, objects: Vec<K>)
where
    K: kube::Resource<DynamicType = ()> + serde::Serialize,
{
    let resource = kube::api::ApiResource::erase::<K>(&());
    futures::stream::iter(objects)
        .map(|o| {
            let mut object: kube::api::DynamicObject =
                serde_json::from_value(serde_json::to_value(&o).expect("serializable"))
                    .expect("an object");
            object.types = Some(kube::api::TypeMeta {
                api_version: K::api_version(&()).into_owned(),
                kind: K::kind(&()).into_owned(),
            });
            let api: Api<kube::api::DynamicObject> = match o.meta().namespace.clone() {
                Some(ns) => Api::namespaced_with(client.clone(), &ns, &resource),
                None => Api::all_with(client.clone(), &resource),
            };
            async move { api.create(&PostParams::default(), &object).await.map(drop) }
        })
        .buffer_unordered(PARALLEL)
        .try_collect::<Vec<()>>()
        .await
        .expect("create");
}

/// Creates `objects` as new (see [`fresh`]).
async fn create_fresh<K>(client: &kube::Client, objects: &[K])
where
    K: kube::Resource<DynamicType = ()> + serde::Serialize + Clone,
{
    create_all(client, objects.iter().map(fresh).collect()).await;
}

/// Applies `objects` (server-side apply, field manager `floor`) with [`PARALLEL`] requests in
/// flight.
async fn apply_all<K>(client: &kube::Client, objects: Vec<K>)
where
    K: kube::Resource<DynamicType = ()> + serde::Serialize,
{
    let resource = kube::api::ApiResource::erase::<K>(&());
    let params = PatchParams::apply("floor").force();
    futures::stream::iter(objects)
        .map(|o| {
            let mut object = serde_json::to_value(&o).expect("serializable");
            object["apiVersion"] = json!(K::api_version(&()));
            object["kind"] = json!(K::kind(&()));
            let name = o.meta().name.clone().unwrap_or_default();
            let api: Api<kube::api::DynamicObject> = match o.meta().namespace.clone() {
                Some(ns) => Api::namespaced_with(client.clone(), &ns, &resource),
                None => Api::all_with(client.clone(), &resource),
            };
            let params = params.clone();
            async move {
                api.patch(&name, &params, &Patch::Apply(&object))
                    .await
                    .map(drop)
            }
        })
        .buffer_unordered(PARALLEL)
        .try_collect::<Vec<()>>()
        .await
        .expect("apply");
}

fn namespace(name: &str, labels: BTreeMap<String, String>) -> Namespace {
    Namespace {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            labels: Some(labels),
            ..Default::default()
        },
        ..Default::default()
    }
}

/// The `teamgpu` binary next to this example's (`target/release/teamgpu`).
fn operator_binary() -> PathBuf {
    let exe = std::env::current_exe().expect("own path");
    let dir = exe.parent().and_then(|p| p.parent()).expect("target dir");
    let bin = dir.join("teamgpu");
    assert!(
        bin.exists(),
        "{} is missing: run `cargo build --release -p teamgpu` first",
        bin.display()
    );
    bin
}

/// (peak, current) resident memory of `pid` in MiB, from /proc.
fn memory_mib(pid: u32) -> Memory {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse::<f64>().ok())
            .map_or(0.0, |kib| kib / 1024.0)
    };
    Memory {
        peak: field("VmHWM:"),
        now: field("VmRSS:"),
        anon: field("RssAnon:"),
        file: field("RssFile:"),
    }
}

/// Resident memory in MiB: peak and now, and now split into heap and stacks (anonymous) and
/// the mapped binary and libraries (file).
struct Memory {
    peak: f64,
    now: f64,
    anon: f64,
    file: f64,
}

/// CPU seconds `pid` has used (user and system), from /proc.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command (which may hold spaces) start at the state, field 3.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // utime and stime are fields 14 and 15 (11 and 12 after the state), in clock ticks (100/s).
    (ticks(11) + ticks(12)) / 100.0
}

/// Requests the API server's priority and fairness rejected, from its metrics.
async fn rejected_by_priority_and_fairness(cluster: &TestCluster) -> u64 {
    let request = http::Request::get("/metrics")
        .body(Vec::new())
        .expect("request");
    let text = cluster
        .client()
        .request_text(request)
        .await
        .unwrap_or_default();
    text.lines()
        .filter(|l| l.starts_with("apiserver_flowcontrol_rejected_requests_total{"))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// The list and watch requests on the big collections, by (verb, resource).
async fn reads_of_big_collections(cluster: &TestCluster) -> BTreeMap<(String, String), u64> {
    let big = [
        "resourceslices.resource.k8s.io",
        "resourceclaims.resource.k8s.io",
    ];
    requests(cluster, &["list", "watch"], &big).await
}

struct Operator(Child);

impl Drop for Operator {
    fn drop(&mut self) {
        // The whole process group: a wrapper's (`TEAMGPU_SCALE_WRAP`) child too.
        let _ = Command::new("kill")
            .args(["-TERM", "--", &format!("-{}", self.0.id())])
            .status();
        let _ = self.0.wait();
    }
}

/// `command` run by the program `TEAMGPU_SCALE_WRAP` names, if set (`heaptrack -o /tmp/ht`
/// profiles the operator's heap), in a process group of its own. Memory and CPU figures are then
/// the wrapper's.
fn wrapped(command: Command) -> Command {
    use std::os::unix::process::CommandExt;
    let mut command = match std::env::var("TEAMGPU_SCALE_WRAP") {
        Ok(wrap) if !wrap.trim().is_empty() => {
            let mut words = wrap.split_whitespace();
            let mut outer = Command::new(words.next().expect("a program"));
            outer
                .args(words)
                .arg(command.get_program())
                .args(command.get_args());
            for (key, value) in command.get_envs() {
                match value {
                    Some(value) => outer.env(key, value),
                    None => outer.env_remove(key),
                };
            }
            outer
        }
        _ => command,
    };
    command.process_group(0);
    command
}

/// Copies of the planned quotas and templates, their metadata changed by `change`.
fn copies(
    planned: &teamgpu::core::plan::Plan,
    change: impl Fn(&mut ObjectMeta),
) -> (Vec<ResourceQuota>, Vec<ResourceClaimTemplate>) {
    let quotas = planned
        .objects
        .resource_quotas
        .iter()
        .map(|q| {
            let mut q = q.to_object();
            change(&mut q.metadata);
            q
        })
        .collect();
    let templates = planned
        .objects
        .claim_templates
        .iter()
        .map(|t| {
            let mut t = t.to_object();
            change(&mut t.metadata);
            t
        })
        .collect();
    (quotas, templates)
}

/// The class a synthetic claim asks for.
fn class_of(claim: &ResourceClaim) -> String {
    let requests = claim
        .spec
        .devices
        .as_ref()
        .and_then(|d| d.requests.as_ref());
    requests.expect("a claim's requests")[0]
        .exactly
        .as_ref()
        .expect("an exact request")
        .device_class_name
        .clone()
}

/// The team whose selector takes namespace `ns` (by its labels).
fn team_of(state: &teamgpu::core::state::ClusterState, ns: &str) -> String {
    let labels = &(state.namespaces.iter())
        .find(|n| n.name == ns)
        .expect("the claim's namespace")
        .labels;
    (state.teams.iter())
        .find(|t| {
            t.spec
                .namespace_selector
                .as_ref()
                .and_then(|s| s.match_labels.as_ref())
                .is_some_and(|l| l.iter().all(|(k, v)| labels.get(k) == Some(v)))
        })
        .and_then(|t| t.metadata.name.clone())
        .expect("the namespace's team")
}

/// What `team`'s status says its claims request of `policy` (0 without a status).
async fn requested(teams: &Api<TeamGpuPolicy>, team: &str, policy: &str) -> u32 {
    (teams.get(team).await.ok())
        .and_then(|t| t.status)
        .and_then(|s| s.quotas.into_iter().find(|q| q.sharing_policy == policy))
        .map_or(0, |q| q.requested)
}

/// Status during the converge: a claim deleted `after` the operator started, until its team's
/// status counts it (the synthetic claims ask for one device each). What the operator plans
/// while it writes, and writes between its batches; None if not counted in 2 minutes.
async fn deleted_during_converge(
    client: &kube::Client,
    state: &teamgpu::core::state::ClusterState,
    after: Duration,
) -> Option<Duration> {
    // Not one of the claims the reactions below delete (every hundredth, from the first).
    let claim = state.claims.get(1)?;
    let ns = claim.metadata.namespace.clone()?;
    let (team, class) = (team_of(state, &ns), class_of(claim));
    let policy = class.trim_end_matches(".teamgpu.io");
    let left = (state.claims.iter())
        .filter(|c| class_of(c) == class)
        .filter(|c| {
            c.metadata
                .namespace
                .as_deref()
                .is_some_and(|n| team_of(state, n) == team)
        })
        .count() as u32
        - 1;
    tokio::time::sleep(after).await;
    let t = Instant::now();
    Api::<ResourceClaim>::namespaced(client.clone(), &ns)
        .delete(claim.metadata.name.as_deref()?, &Default::default())
        .await
        .expect("delete a claim");
    let teams = Api::<TeamGpuPolicy>::all(client.clone());
    while t.elapsed() < Duration::from_secs(120) {
        if requested(&teams, &team, policy).await == left {
            return Some(t.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    None
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

#[tokio::main]
async fn main() {
    // Stopped early (Ctrl-C, SIGTERM), the benchmark is dropped, and with it the operator it
    // started (see `Operator`): it would otherwise outlive the benchmark.
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("a SIGTERM handler");
    tokio::select! {
        () = benchmark() => {}
        _ = tokio::signal::ctrl_c() => eprintln!("interrupted: stopping the operator"),
        _ = terminate.recv() => eprintln!("terminated: stopping the operator"),
    }
}

async fn benchmark() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let arg = |i: usize, default: usize| args.get(i).copied().unwrap_or(default);
    let scale = Scale {
        teams: arg(0, 10),
        namespaces_per_team: arg(1, 2),
        sharing_policies: arg(2, 5),
        nodes: arg(3, 20),
        claims: arg(4, 200),
        counter_sets: false,
        departments: 0,
    };
    let idle = Duration::from_secs(
        std::env::var("TEAMGPU_SCALE_IDLE_SECONDS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(60),
    );
    let binary = operator_binary();
    let state = synthetic(scale).expect("synthetic cluster");
    let planned = teamgpu::core::plan::plan(&state);
    let cluster = TestCluster::start().await.unwrap_or_else(|e| panic!("{e}"));
    let client = cluster.client();
    println!(
        "cluster: {} teams, {} team namespaces, {} sharing policies, {} ResourceSlices ({} devices), {} claims",
        state.teams.len(),
        state.namespaces.len(),
        state.sharing_policies.len(),
        state.slices.len(),
        state.slices.len() * 8,
        state.claims.len()
    );

    // Fill the cluster (the NVIDIA driver's classes, nodes' slices, namespaces, claims).
    let t = Instant::now();
    create_fresh(&client, &state.device_classes).await;
    create_fresh(&client, &state.slices).await;
    create_all(
        &client,
        state
            .namespaces
            .iter()
            .map(|n| namespace(&n.name, n.labels.clone()))
            .collect(),
    )
    .await;
    create_fresh(&client, &state.claims).await;
    futures::stream::iter(state.claims.iter().filter(|c| c.status.is_some()))
        .map(|c| {
            let api: Api<ResourceClaim> =
                Api::namespaced(client.clone(), c.metadata.namespace.as_deref().unwrap());
            let status = json!({"status": c.status});
            async move {
                api.patch_status(
                    c.metadata.name.as_deref().unwrap(),
                    &PatchParams::default(),
                    &Patch::Merge(&status),
                )
                .await
                .map(drop)
            }
        })
        .buffer_unordered(PARALLEL)
        .try_collect::<Vec<()>>()
        .await
        .expect("allocate claims");
    println!("filled in {:.1?}", t.elapsed());

    // The write floor: the same quotas and templates, created by a plain client, in namespaces
    // of their own (`f-<namespace>`). Exempt: outside every team, the operator would otherwise
    // guard each of them with a quota of 0.
    let floor_ns = |ns: &str| format!("f-{ns}");
    let exempt = || BTreeMap::from([(EXEMPT_LABEL.to_owned(), "true".to_owned())]);
    create_all(
        &client,
        state
            .namespaces
            .iter()
            .map(|n| namespace(&floor_ns(&n.name), exempt()))
            .collect(),
    )
    .await;
    // The policies first: the floor's objects are the operator's, owner references included
    // (the garbage collector tracks every owned object), and their owners must exist.
    create_fresh(&client, &state.sharing_policies).await;
    create_fresh(&client, &state.teams).await;
    let uids: BTreeMap<String, String> = Api::<TeamGpuPolicy>::all(client.clone())
        .list(&Default::default())
        .await
        .expect("list the teams")
        .items
        .into_iter()
        .map(|t| (t.name_any(), t.uid().unwrap_or_default()))
        .collect();
    let owned_by_the_live_team = |meta: &mut ObjectMeta| {
        for owner in meta.owner_references.iter_mut().flatten() {
            if let Some(uid) = uids.get(&owner.name) {
                owner.uid.clone_from(uid);
            }
        }
    };
    // Not teamgpu's: no labels (so no one takes them for the operator's).
    let strip = |meta: &mut ObjectMeta| {
        meta.namespace = meta.namespace.as_deref().map(floor_ns);
        meta.labels = None;
        owned_by_the_live_team(meta);
    };
    let (quotas, templates) = copies(&planned, strip);
    let objects = quotas.len() + templates.len();
    // As the operator's ServiceAccount: the same API priority and fairness as the operator (the
    // admin is exempt from it).
    let as_operator =
        kube::Client::try_from(cluster.operator_config().await.expect("operator token")).unwrap();
    // The same again as server-side applies (what the operator sends), in a third set of
    // namespaces (`a-<namespace>`): how much of the difference is the kind of write.
    let applied = |meta: &mut ObjectMeta| {
        meta.namespace = meta
            .namespace
            .as_deref()
            .map(|ns| format!("a-{}", ns.trim_start_matches("f-")));
    };
    let mut apply_quotas = quotas.clone();
    apply_quotas
        .iter_mut()
        .for_each(|q| applied(&mut q.metadata));
    let mut apply_templates = templates.clone();
    apply_templates
        .iter_mut()
        .for_each(|t| applied(&mut t.metadata));
    let t = Instant::now();
    create_all(&as_operator, quotas).await;
    create_all(&as_operator, templates).await;
    let floor = t.elapsed();
    println!(
        "write floor: {objects} quotas and templates created in {floor:.1?} ({:.0}/s, {PARALLEL} in flight)",
        objects as f64 / floor.as_secs_f64()
    );
    create_all(
        &client,
        state
            .namespaces
            .iter()
            .map(|n| namespace(&format!("a-{}", n.name), exempt()))
            .collect(),
    )
    .await;
    let t = Instant::now();
    apply_all(&as_operator, apply_quotas).await;
    let apply_quotas_took = t.elapsed();
    apply_all(&as_operator, apply_templates).await;
    let apply_floor = t.elapsed();
    println!(
        "apply floor: the same applied (server-side apply) in {apply_floor:.1?} ({:.0}/s; quotas {apply_quotas_took:.1?}, templates {:.1?})",
        objects as f64 / apply_floor.as_secs_f64(),
        apply_floor - apply_quotas_took
    );

    // The operator as its own process, as its ServiceAccount.
    let dir = std::env::temp_dir().join(format!("teamgpu-scale-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let kubeconfig = cluster
        .operator_kubeconfig(&dir)
        .await
        .expect("operator kubeconfig");
    let by_resource_before = writes_by_resource(&cluster).await;
    let writes_before = by_resource_before.values().sum::<u64>();
    let reads_before = reads_of_big_collections(&cluster).await;
    let rejected_before = rejected_by_priority_and_fairness(&cluster).await;
    let started = Instant::now();
    let operator = Operator(
        wrapped(teamgpu_e2e::fixtures::operator_process(
            &binary,
            &kubeconfig,
        ))
        // `TEAMGPU_SCALE_LOG=info` shows the operator's passes and its memory after each.
        .env(
            "RUST_LOG",
            std::env::var("TEAMGPU_SCALE_LOG").unwrap_or_else(|_| "warn".into()),
        )
        // The operator logs to stdout: shown when asked for.
        .stdout(if std::env::var_os("TEAMGPU_SCALE_LOG").is_some() {
            Stdio::inherit()
        } else {
            Stdio::null()
        })
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start the operator"),
    );
    let pid = operator.0.id();
    let (want_quotas, want_templates) = (
        planned.objects.resource_quotas.len(),
        planned.objects.claim_templates.len(),
    );
    const DURING: Duration = Duration::from_secs(3);
    let (quotas_in_place, templates_in_place, during) = tokio::join!(
        async {
            until_managed::<ResourceQuota>(&client, want_quotas).await;
            started.elapsed()
        },
        async {
            until_managed::<ResourceClaimTemplate>(&client, want_templates).await;
            started.elapsed()
        },
        deleted_during_converge(&client, &state, DURING)
    );
    let in_place = quotas_in_place.max(templates_in_place);
    // Converged: no write for 3 s.
    let (mut last, mut last_change) = (operator_writes(&cluster).await, Instant::now());
    while last_change.elapsed() < Duration::from_secs(3) {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let now = operator_writes(&cluster).await;
        if now != last {
            (last, last_change) = (now, Instant::now());
        }
    }
    let converged = last_change.duration_since(started);
    let writes = last - writes_before;
    let statuses = state.teams.len() + state.sharing_policies.len();
    let wanted = want_quotas
        + want_templates
        + planned.objects.device_classes.len()
        + planned.objects.admission_policies.len()
        + planned.objects.admission_bindings.len();
    println!(
        "operator: every quota and template in place after {in_place:.1?} ({:.2}x the floor, {:.2}x the apply floor); last write after {converged:.1?}",
        in_place.as_secs_f64() / floor.as_secs_f64(),
        in_place.as_secs_f64() / apply_floor.as_secs_f64()
    );
    println!(
        "  quotas in place after {quotas_in_place:.1?}, templates after {templates_in_place:.1?}"
    );
    match during {
        Some(took) => println!(
            "  a claim deleted {DURING:?} into the converge, to its team's status counting it: {took:.1?}"
        ),
        None => println!(
            "  a claim deleted {DURING:?} into the converge: not counted in its team's status after 2 minutes"
        ),
    }
    println!(
        "writes: {writes} for {wanted} objects and {statuses} statuses ({:.2} per object)",
        writes as f64 / (wanted + statuses) as f64
    );
    println!(
        "  by verb and resource: {:?}",
        minus(&writes_by_resource(&cluster).await, &by_resource_before)
    );
    let m = memory_mib(pid);
    println!(
        "memory after converging: peak {:.0} MiB, now {:.0} MiB ({:.0} anonymous, {:.0} the mapped binary)",
        m.peak, m.now, m.anon, m.file
    );
    println!(
        "operator CPU to converge: {:.1} s; lists and watches of slices and claims: {:?}; \
         requests rejected by priority and fairness: {}",
        cpu_seconds(pid),
        minus(&reads_of_big_collections(&cluster).await, &reads_before),
        rejected_by_priority_and_fairness(&cluster).await - rejected_before
    );

    // Reaction: a claim deleted, then one created in its place, until the team's status counts
    // each (the synthetic claims fill their quotas, so a new claim needs the room first).
    let mut created = Vec::new();
    let mut deleted = Vec::new();
    let mut refused = BTreeMap::<String, usize>::new();
    let mut missed = 0;
    let mut refused_for_a_moment = 0;
    let teams: Api<TeamGpuPolicy> = Api::all(client.clone());
    let step = (state.claims.len() / 100).max(1);
    for (i, old) in state.claims.iter().step_by(step).take(100).enumerate() {
        let ns = old.metadata.namespace.clone().unwrap();
        let class = class_of(old);
        let policy = class.trim_end_matches(".teamgpu.io").to_owned();
        let team_name = team_of(&state, &ns);
        let requested = || {
            let (teams, team_name, policy) = (teams.clone(), team_name.clone(), policy.clone());
            async move { requested(&teams, &team_name, &policy).await }
        };
        // A reaction not seen in 2 minutes is reported, with what the status said, and the
        // measurement goes on (a loaded machine at 10,000 namespaces is not a test to fail).
        let wait = |until: u32, what: String| async move {
            let t = Instant::now();
            loop {
                let now = requested().await;
                if now == until {
                    return true;
                }
                if t.elapsed() > Duration::from_secs(120) {
                    println!(
                        "{what}: not counted after {:.0?} (requested {now}, waiting for {until})",
                        t.elapsed()
                    );
                    return false;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        };
        let claims = Api::<ResourceClaim>::namespaced(client.clone(), &ns);
        let before = requested().await;
        let t = Instant::now();
        claims
            .delete(old.metadata.name.as_deref().unwrap(), &Default::default())
            .await
            .expect("delete a claim");
        let what = format!("deleting {ns}/{}", old.metadata.name.as_deref().unwrap());
        if !wait(before.saturating_sub(1), what).await {
            missed += 1;
            continue;
        }
        deleted.push(t.elapsed());
        let claim: ResourceClaim = serde_json::from_value(json!({
            "metadata": {"name": format!("reaction-{i}")},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": class, "count": 1}}]}}
        }))
        .unwrap();
        // A creation right after the team's status counted the deletion can be refused for a
        // moment: quota admission counts the quota's `status.used`, which kube-controller-manager
        // lowers only once it sees the deletion, and teamgpu's admission refuses claims while the
        // quota it just rewrote (the deletion moved what is lent) is not in force yet ("try
        // again in a moment"; 9 of 100 in one run at 1,000 namespaces). Such a creation is tried
        // again (and counted); the reaction is timed from the creation that went in.
        let mut t = Instant::now();
        let mut created_at_last = claims.create(&PostParams::default(), &claim).await;
        while let Err(kube::Error::Api(s)) = &created_at_last
            && (s.message.contains("exceeded quota") || s.message.contains("try again in a moment"))
            && t.elapsed() < Duration::from_secs(30)
        {
            refused_for_a_moment += 1;
            tokio::time::sleep(Duration::from_millis(10)).await;
            t = Instant::now();
            created_at_last = claims.create(&PostParams::default(), &claim).await;
        }
        match created_at_last {
            Ok(_) => {
                if wait(before, format!("creating {ns}/reaction-{i}")).await {
                    created.push(t.elapsed());
                } else {
                    missed += 1;
                }
            }
            Err(error) => {
                let reason = match error {
                    kube::Error::Api(s) => format!("{}: {}", s.reason, s.message),
                    other => other.to_string(),
                };
                *refused.entry(reason).or_default() += 1;
            }
        }
    }
    if refused_for_a_moment > 0 {
        println!(
            "reaction claims refused for a moment (quota not yet counting the deletion, or not \
             in force yet), then created: {refused_for_a_moment} refusals"
        );
    }
    if !refused.is_empty() {
        println!("claims refused while measuring reactions: {refused:?}");
    }
    if missed > 0 {
        println!("reactions not seen in 2 minutes: {missed}");
    }
    for (what, mut times) in [("created", created), ("deleted", deleted)] {
        times.sort();
        if !times.is_empty() {
            println!(
                "reaction, claim {what} to the team's status counting it, {} claims: p50 {:.0?}, p99 {:.0?}",
                times.len(),
                percentile(&times, 0.5),
                percentile(&times, 0.99)
            );
        }
    }

    // Idle.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let before = operator_writes(&cluster).await;
    tokio::time::sleep(idle).await;
    let idle_writes = operator_writes(&cluster).await - before;
    let m = memory_mib(pid);
    println!(
        "idle {idle:?}: {idle_writes} writes; memory peak {:.0} MiB, settled {:.0} MiB ({:.0} anonymous, {:.0} the mapped binary)",
        m.peak, m.now, m.anon, m.file
    );
    // The apply floor once more, now into the team namespaces themselves (objects of other
    // names, not teamgpu's): with the claims there, teamgpu's admission bindings in force and
    // its watches running. The difference to the first apply floor is what the cluster teamgpu
    // governs costs any writer, not the operator's own overhead.
    let in_team = |meta: &mut ObjectMeta| {
        meta.name = meta.name.as_deref().map(|n| format!("floor-{n}"));
        meta.labels = None;
        owned_by_the_live_team(meta);
    };
    let (team_quotas, team_templates) = copies(&planned, in_team);
    let t = Instant::now();
    apply_all(&as_operator, team_quotas).await;
    let team_quotas_took = t.elapsed();
    apply_all(&as_operator, team_templates).await;
    let team_floor = t.elapsed();
    println!(
        "apply floor into the team namespaces, teamgpu running: {team_floor:.1?} ({:.2}x the first apply floor; quotas {team_quotas_took:.1?}, templates {:.1?}; the operator's converge is {:.2}x this)",
        team_floor.as_secs_f64() / apply_floor.as_secs_f64(),
        team_floor - team_quotas_took,
        in_place.as_secs_f64() / team_floor.as_secs_f64()
    );
    // `TEAMGPU_SCALE_HOLD_SECONDS` keeps the operator running, to look at it from outside.
    if let Some(hold) = std::env::var("TEAMGPU_SCALE_HOLD_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        println!("holding the operator (pid {pid}) for {hold} s");
        tokio::time::sleep(Duration::from_secs(hold)).await;
    }
    drop(operator);
    let _ = std::fs::remove_dir_all(dir);
}
