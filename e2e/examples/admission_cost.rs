//! What teamgpu's admission policies cost the API server for writes outside every team, as the
//! number of team namespaces grows:
//!
//! ```sh
//! TEAMGPU_E2E_ASSETS=/path/to/bin cargo run --release -p teamgpu-e2e --example admission_cost -- \
//!     [writes] [none | team-namespaces ...]
//! ```
//!
//! Defaults: 2000 writes; configurations `none 0 10000 none 0 10000` (`none`: no teamgpu policy
//! at all; a number: teamgpu's policies with that many team namespaces, run in the order given,
//! so that a drift of the machine's load shows). For each size the benchmark applies the four
//! admission policies and bindings that teamgpu generates (built by the library's own
//! builders, with that many team namespaces listed in the non-team policy's match condition),
//! waits until admission enforces them, and then creates, 16 in flight, `writes`
//! ResourceClaims (of a DeviceClass teamgpu does not govern) and `writes` Pods (held by a
//! scheduling gate, so nothing else touches them) in a namespace outside every team. It prints
//! per configuration the API server's CPU per write (`process_cpu_seconds_total` of its `/metrics`; its own
//! process only, so other load on the machine counts little), its admission time per write
//! (`apiserver_admission_controller_admission_duration_seconds`, per plugin) and the wall time,
//! each ratio to the first configuration; and, per size, what a namespace joining a team costs:
//! the non-team policy rewritten, and the time until admission lets the namespace use its class.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;
use teamgpu::core::plan::admission::{self, Enforcement, GovernedClasses};
use teamgpu::core::plan::namespace_admission;
use teamgpu_e2e::cluster::TestCluster;

/// Requests in flight, as in the scale benchmark.
const PARALLEL: usize = 16;
/// The field manager of the policies applied here.
const MANAGER: &str = "teamgpu-admission-cost";
/// The sharing policies of the scale benchmark: the classes every policy names.
const CLASSES: usize = 20;

/// One configuration's figures.
struct Measured {
    label: String,
    claims: Cost,
    pods: Cost,
}

/// What `writes` creates cost.
struct Cost {
    cpu_per_write_ms: f64,
    /// Milliseconds per write, by admission plugin, where more than 0.005.
    admission_per_write_ms: BTreeMap<String, f64>,
    wall: Duration,
}

/// The API server's counters that the benchmark reads.
#[derive(Clone)]
struct Counters {
    cpu_seconds: f64,
    /// Seconds spent per admission plugin (`name`).
    by_label: BTreeMap<String, f64>,
}

fn gauge(metrics: &str, name: &str, labels_contain: &[&str]) -> f64 {
    metrics
        .lines()
        .filter(|l| l.starts_with(name))
        .filter(|l| labels_contain.iter().all(|want| l.contains(want)))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}

async fn counters(cluster: &TestCluster) -> Counters {
    let request = http::Request::get("/metrics").body(Vec::new()).unwrap();
    let text = cluster.client().request_text(request).await.unwrap();
    let mut by_label = BTreeMap::new();
    for (family, label) in [
        (
            "apiserver_admission_controller_admission_duration_seconds_sum{",
            "name",
        ),
        (
            "apiserver_validating_admission_policy_check_duration_seconds_sum{",
            "policy",
        ),
    ] {
        for line in text.lines().filter(|l| l.starts_with(family)) {
            let Some((labels, value)) = line.rsplit_once(' ') else {
                continue;
            };
            let key = labels
                .split(',')
                .find_map(|kv| {
                    kv.trim_start_matches(family)
                        .strip_prefix(&format!("{label}=\""))
                })
                .map(|v| v.trim_end_matches(['"', '}']).to_owned());
            if let (Some(key), Ok(value)) = (key, value.parse::<f64>()) {
                *by_label.entry(format!("{label} {key}")).or_default() += value;
            }
        }
    }
    Counters {
        cpu_seconds: gauge(&text, "process_cpu_seconds_total", &[]),
        by_label,
    }
}

/// `n` team namespace names, shaped like the scale benchmark's (100 per team).
fn team_namespaces(n: usize) -> BTreeSet<String> {
    (0..n)
        .map(|i| format!("team-{:03}-ns-{:03}", i / 100, i % 100))
        .collect()
}

fn governed() -> GovernedClasses {
    GovernedClasses {
        foreign: BTreeSet::new(),
        extended: (0..CLASSES)
            .map(|i| {
                format!(
                    "{}gpu-{i:02}.teamgpu.io",
                    admission::IMPLICIT_EXTENDED_PREFIX
                )
            })
            .collect(),
    }
}

/// Applies teamgpu's admission objects with `namespaces` as the team namespaces.
async fn install(cluster: &TestCluster, namespaces: &BTreeSet<String>) {
    let client = cluster.client();
    let names: BTreeSet<&str> = namespaces.iter().map(String::as_str).collect();
    let governed = governed();
    let operator = admission::DEFAULT_OPERATOR_USER;
    let admins: Vec<String> = namespace_admission::DEFAULT_ADMIN_GROUPS
        .map(str::to_owned)
        .to_vec();
    let policies = [
        admission::team_policy(&governed, operator),
        admission::non_team_policy(&governed, operator, &names),
        namespace_admission::membership_policy(&admins, operator),
        namespace_admission::exemption_policy(&admins, operator),
    ];
    let bindings = [
        admission::team_binding(Enforcement::Deny),
        admission::non_team_binding(Enforcement::Deny),
        namespace_admission::membership_binding(Enforcement::Deny),
        namespace_admission::exemption_binding(Enforcement::Deny),
    ];
    let apply = PatchParams::apply(MANAGER).force();
    let api: Api<ValidatingAdmissionPolicy> = Api::all(client.clone());
    for p in policies {
        let name = p.metadata.name.clone().unwrap();
        if let Err(error) = api.patch(&name, &apply, &Patch::Apply(&p)).await {
            let text = error.to_string();
            panic!("applying {name}: {}", &text[..text.len().min(400)]);
        }
    }
    let api: Api<ValidatingAdmissionPolicyBinding> = Api::all(client);
    for b in bindings {
        let name = b.metadata.name.clone().unwrap();
        api.patch(&name, &apply, &Patch::Apply(&b)).await.unwrap();
    }
}

async fn uninstall(cluster: &TestCluster) {
    let client = cluster.client();
    let dp = DeleteParams::default();
    let bindings: Api<ValidatingAdmissionPolicyBinding> = Api::all(client.clone());
    let policies: Api<ValidatingAdmissionPolicy> = Api::all(client);
    for name in [
        admission::TEAM_BINDING_NAME,
        admission::NON_TEAM_BINDING_NAME,
        namespace_admission::MEMBERSHIP_POLICY_NAME,
        namespace_admission::EXEMPTION_POLICY_NAME,
    ] {
        let _ = bindings.delete(name, &dp).await;
    }
    for name in [
        admission::TEAM_POLICY_NAME,
        admission::NON_TEAM_POLICY_NAME,
        namespace_admission::MEMBERSHIP_POLICY_NAME,
        namespace_admission::EXEMPTION_POLICY_NAME,
    ] {
        let _ = policies.delete(name, &dp).await;
    }
}

fn claim(name: &str, class: &str) -> ResourceClaim {
    serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": class}}]}},
    }))
    .unwrap()
}

fn pod(name: &str) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "schedulingGates": [{"name": "bench.teamgpu.io/hold"}],
            "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10"}],
        },
    }))
    .unwrap()
}

/// Whether admission now refuses a claim of a governed class in `namespace` (dry run).
async fn refused_in(cluster: &TestCluster, namespace: &str) -> bool {
    let api: Api<ResourceClaim> = Api::namespaced(cluster.client(), namespace);
    let dry = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let result = api.create(&dry, &claim("probe", "gpu-00.teamgpu.io")).await;
    matches!(result, Err(kube::Error::Api(s)) if s.code == 403 || s.code == 422)
}

/// Waits until admission in `namespace` refuses (or allows) a governed claim: a policy takes
/// effect a moment after it is written.
async fn until_refused(cluster: &TestCluster, namespace: &str, refused: bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while refused_in(cluster, namespace).await != refused {
        assert!(
            Instant::now() < deadline,
            "admission in {namespace} did not change"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn namespace(cluster: &TestCluster, name: &str) {
    let api: Api<Namespace> = Api::all(cluster.client());
    let ns: Namespace = serde_json::from_value(
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}),
    )
    .unwrap();
    match api.create(&PostParams::default(), &ns).await {
        Ok(_) | Err(kube::Error::Api(_)) => {}
        Err(e) => panic!("{e}"),
    }
}

/// Creates `n` objects made by `make` in `namespace`, `PARALLEL` in flight; what it cost.
async fn create_many<K>(
    cluster: &TestCluster,
    namespace: &str,
    n: usize,
    make: impl Fn(&str) -> K,
) -> Cost
where
    K: kube::Resource<Scope = kube::core::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + serde::Serialize
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let api: Api<K> = Api::namespaced(cluster.client(), namespace);
    let objects: Vec<K> = (0..n).map(|i| make(&format!("w-{i:05}"))).collect();
    let before = counters(cluster).await;
    let started = Instant::now();
    let pp = PostParams::default();
    let mut results = futures::stream::iter(objects.iter().map(|o| api.create(&pp, o)))
        .buffer_unordered(PARALLEL);
    while let Some(result) = results.next().await {
        result.unwrap_or_else(|e| panic!("create in {namespace}: {e}"));
    }
    let wall = started.elapsed();
    let after = counters(cluster).await;
    Cost {
        cpu_per_write_ms: (after.cpu_seconds - before.cpu_seconds) * 1000.0 / n as f64,
        admission_per_write_ms: after
            .by_label
            .iter()
            .map(|(k, v)| {
                let was = before.by_label.get(k).copied().unwrap_or(0.0);
                (k.clone(), (v - was) * 1000.0 / n as f64)
            })
            .filter(|(_, ms)| *ms > 0.005)
            .collect(),
        wall,
    }
}

async fn measure(cluster: &TestCluster, label: &str, round: usize, writes: usize) -> Measured {
    let outside = format!("outside-{round}");
    namespace(cluster, &outside).await;
    // Warm up the namespace's caches and the policies' compiled programs.
    let _ = create_many(cluster, &outside, 100, |n| {
        claim(&format!("warm-{n}"), "plain")
    })
    .await;
    let claims = create_many(cluster, &outside, writes, |n| claim(n, "plain")).await;
    let pods = create_many(cluster, &outside, writes, pod).await;
    // Deleted before the next configuration: the namespace controller deleting 6,000 objects
    // would load the API server that the next one measures.
    let api: Api<Namespace> = Api::all(cluster.client());
    let _ = api.delete(&outside, &DeleteParams::default()).await;
    let deadline = Instant::now() + Duration::from_secs(600);
    while api.get_opt(&outside).await.unwrap().is_some() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Measured {
        label: label.to_owned(),
        claims,
        pods,
    }
}

/// What it took for a namespace joining a team to be left alone by the non-team policy.
struct Join {
    size: usize,
    apply: Duration,
    cpu_ms: f64,
    enforced: Duration,
}

async fn join(cluster: &TestCluster, mut names: BTreeSet<String>) -> Join {
    let joining = "team-zzz-joining";
    namespace(cluster, joining).await;
    until_refused(cluster, joining, true).await;
    names.insert(joining.to_owned());
    let before = counters(cluster).await;
    let started = Instant::now();
    install(cluster, &names).await;
    let apply = started.elapsed();
    until_refused(cluster, joining, false).await;
    let enforced = started.elapsed();
    let after = counters(cluster).await;
    Join {
        size: names.len(),
        apply,
        cpu_ms: (after.cpu_seconds - before.cpu_seconds) * 1000.0,
        enforced,
    }
}

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let writes = args.next().and_then(|a| a.parse().ok()).unwrap_or(2000);
    // `none`: no teamgpu policy; a number: teamgpu's policies with that many team namespaces.
    let mut configurations: Vec<Option<usize>> = args.map(|a| a.parse().ok()).collect();
    if configurations.is_empty() {
        configurations = vec![None, Some(0), Some(10_000), None, Some(0), Some(10_000)];
    }
    let cluster = TestCluster::start().await.unwrap_or_else(|e| panic!("{e}"));
    let plain: DeviceClass = serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
        "metadata": {"name": "plain"},
        "spec": {"selectors": [{"cel": {"expression": "device.driver == 'plain.example.com'"}}]},
    }))
    .unwrap();
    let classes: Api<DeviceClass> = Api::all(cluster.client());
    let _ = classes.create(&PostParams::default(), &plain).await;
    namespace(&cluster, "probe-outside").await;

    let mut rows = Vec::new();
    let mut joins = Vec::new();
    for (round, configuration) in configurations.into_iter().enumerate() {
        let Some(size) = configuration else {
            uninstall(&cluster).await;
            until_refused(&cluster, "probe-outside", false).await;
            rows.push(measure(&cluster, "no teamgpu", round, writes).await);
            continue;
        };
        let names = team_namespaces(size);
        install(&cluster, &names).await;
        until_refused(&cluster, "probe-outside", true).await;
        // The list took effect when its last team namespace is left alone.
        if let Some(last) = names.last() {
            namespace(&cluster, last).await;
            until_refused(&cluster, last, false).await;
        }
        let label = format!("teamgpu, {size} team namespaces");
        rows.push(measure(&cluster, &label, round, writes).await);
        joins.push(join(&cluster, names).await);
    }
    uninstall(&cluster).await;

    let base = &rows[0];
    println!(
        "{writes} creates of each kind, {PARALLEL} in flight, in a namespace outside every team\n"
    );
    println!(
        "| configuration | claim: API server CPU per write | wall | Pod: CPU per write | wall |"
    );
    println!("|---|---|---|---|---|");
    for row in &rows {
        println!(
            "| {} | {:.2} ms ({:.2}x) | {:.1} s | {:.2} ms ({:.2}x) | {:.1} s |",
            row.label,
            row.claims.cpu_per_write_ms,
            row.claims.cpu_per_write_ms / base.claims.cpu_per_write_ms,
            row.claims.wall.as_secs_f64(),
            row.pods.cpu_per_write_ms,
            row.pods.cpu_per_write_ms / base.pods.cpu_per_write_ms,
            row.pods.wall.as_secs_f64(),
        );
    }
    println!("\nA namespace joins a team: the non-team policy rewritten with it in the list");
    println!(
        "| team namespaces | apply | API server CPU | joined namespace allowed its class after |"
    );
    println!("|---|---|---|---|");
    for j in &joins {
        println!(
            "| {} | {:.0} ms | {:.0} ms | {:.0} ms |",
            j.size,
            j.apply.as_secs_f64() * 1000.0,
            j.cpu_ms,
            j.enforced.as_secs_f64() * 1000.0
        );
    }
    println!("\nadmission time per write (ms, by plugin):");
    for row in &rows {
        println!(
            "- {}: claims {:?}; Pods {:?}",
            row.label, row.claims.admission_per_write_ms, row.pods.admission_per_write_ms
        );
    }
}
