//! What admission policies cost the API server for writes outside every team: teamgpu's (as the
//! number of team namespaces grows, and each of its two request policies alone) and policies of
//! the benchmark's own that add one feature at a time:
//!
//! ```sh
//! TEAMGPU_E2E_ASSETS=/path/to/bin cargo run --release -p teamgpu-e2e --example admission_cost -- \
//!     [writes] [configuration ...]
//! ```
//!
//! Defaults: 2000 writes; configurations `none 0 10000 none 0 10000`, run in the order given, so
//! that a drift of the machine's load shows. A configuration is one of:
//! - `none`: no admission policy at all;
//! - a number: the four policies and bindings that teamgpu generates (by the library's own
//!   builders), with that many team namespaces listed in the non-team policy;
//! - `team-only`: teamgpu's team policy and binding alone (params: the namespace's ResourceQuota
//!   `teamgpu`, which the benchmark's namespace has not: parameterNotFoundAction Allow);
//! - `non-team-only`: teamgpu's non-team policy (no team namespace listed) and binding alone;
//!   `non-team-selector`: with one more requirement in the binding's namespace selector
//!   (`teamgpu.io/team` DoesNotExist, which the benchmark's namespace meets);
//! - `trivial`: one policy of teamgpu's rules (claims, templates and Pods, on creation) with the
//!   single validation `true`, no match condition, no params, a binding without selector;
//!   `trivial-condition`: with a match condition `true`; `trivial-params`: with the team
//!   binding's params; `trivial-twice`: two such policies;
//! - `zero-quota`: no policy, and in the written namespace a ResourceQuota of 0 devices of every
//!   governed class (by claim and by extended resource), as a quota could guard it instead;
//! - `guarded`: what teamgpu writes now for a namespace outside every team at 10,000 team
//!   namespaces: its policies and bindings, and in the written namespace its quota of 0 and,
//!   once the quota is in force, its guard label, which the non-team binding leaves out.
//!
//! For each, the benchmark deletes every admission policy, applies the configuration's, waits
//! until admission sees them (a sentinel policy applied after them refuses a probe, then goes),
//! and creates, 16 in flight, `writes` ResourceClaims (of a class teamgpu does not govern) and
//! `writes` Pods (held by a scheduling gate) in a namespace outside every team. It prints the
//! API server's CPU per write (`process_cpu_seconds_total` of its own `/metrics`, so other load
//! on the machine counts little) and its ratio to the last `none` before it, the
//! ValidatingAdmissionPolicy plugin's admission time per write and the wall time; and, per size
//! of teamgpu's policies, what a namespace joining a team costs (the non-team policy rewritten,
//! and the time until admission lets the namespace use its class).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use teamgpu::core::plan::admission::{self, Enforcement, GovernedClasses};
use teamgpu::core::plan::namespace_admission;
use teamgpu::core::plan::outside_teams::{self, OutsideTeams};
use teamgpu_e2e::cluster::TestCluster;

/// Requests in flight, as in the scale benchmark.
const PARALLEL: usize = 16;
/// The field manager of the policies applied here.
const MANAGER: &str = "teamgpu-admission-cost";
/// The sharing policies of the scale benchmark: the classes every policy names.
const CLASSES: usize = 20;
/// The namespace where admission is probed (dry runs only).
const PROBE_NAMESPACE: &str = "probe-outside";
/// The name of the claim that the sentinel policy refuses, and of that policy.
const SENTINEL: &str = "admission-cost-sentinel";
/// The label of a namespace's team (`non-team-selector`).
const TEAM_LABEL: &str = "teamgpu.io/team";
/// A class teamgpu governs: its policies refuse a claim of it outside every team.
const GOVERNED: &str = "gpu-00.teamgpu.io";
/// The team namespaces teamgpu's policies list in [`Configuration::Guarded`].
const GUARDED_TEAM_NAMESPACES: usize = 10_000;

/// The admission objects of one measurement (see the module documentation).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Configuration {
    None,
    /// teamgpu's policies with this many team namespaces.
    Teamgpu(usize),
    TeamOnly,
    NonTeamOnly,
    NonTeamSelector,
    Trivial,
    TrivialCondition,
    TrivialParams,
    TrivialTwice,
    /// No policy; a ResourceQuota of 0 devices per governed class in the written namespace.
    ZeroQuota,
    /// teamgpu's policies with 10,000 team namespaces, the written namespace guarded.
    Guarded,
}

/// The configurations but [`Configuration::Teamgpu`], by their name on the command line.
const NAMED: [(&str, Configuration); 10] = [
    ("none", Configuration::None),
    ("team-only", Configuration::TeamOnly),
    ("non-team-only", Configuration::NonTeamOnly),
    ("non-team-selector", Configuration::NonTeamSelector),
    ("trivial", Configuration::Trivial),
    ("trivial-condition", Configuration::TrivialCondition),
    ("trivial-params", Configuration::TrivialParams),
    ("trivial-twice", Configuration::TrivialTwice),
    ("zero-quota", Configuration::ZeroQuota),
    ("guarded", Configuration::Guarded),
];

impl Configuration {
    fn parse(arg: &str) -> Configuration {
        match NAMED.iter().find(|(name, _)| *name == arg) {
            Some((_, configuration)) => *configuration,
            None => Configuration::Teamgpu(arg.parse().unwrap_or_else(|_| {
                panic!("unknown configuration {arg}: see the example's documentation")
            })),
        }
    }

    fn label(self) -> String {
        match (self, NAMED.iter().find(|(_, c)| *c == self)) {
            (Configuration::Teamgpu(size), _) => format!("teamgpu, {size} team namespaces"),
            (_, named) => named.map_or("?", |(name, _)| name).to_owned(),
        }
    }
}

/// One configuration's figures.
struct Measured {
    configuration: Configuration,
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
struct Counters {
    cpu_seconds: f64,
    /// Seconds spent per admission plugin (`name`).
    by_label: BTreeMap<String, f64>,
}

fn gauge(metrics: &str, name: &str) -> f64 {
    metrics
        .lines()
        .filter(|l| l.starts_with(name))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}

async fn counters(cluster: &TestCluster) -> Counters {
    let request = http::Request::get("/metrics").body(Vec::new()).unwrap();
    let text = cluster.client().request_text(request).await.unwrap();
    // Per plugin (`name`). The policies' own `apiserver_validating_admission_policy_check_*`
    // count only denials and errors.
    let family = "apiserver_admission_controller_admission_duration_seconds_sum{";
    let mut by_label = BTreeMap::new();
    for line in text.lines().filter(|l| l.starts_with(family)) {
        let Some((labels, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let key = labels
            .trim_start_matches(family)
            .split(',')
            .find_map(|kv| kv.strip_prefix("name=\""))
            .map(|v| v.trim_end_matches(['"', '}']).to_owned());
        if let (Some(key), Ok(value)) = (key, value.parse::<f64>()) {
            *by_label.entry(key).or_default() += value;
        }
    }
    Counters {
        cpu_seconds: gauge(&text, "process_cpu_seconds_total"),
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
    let prefix = admission::IMPLICIT_EXTENDED_PREFIX;
    GovernedClasses {
        foreign: BTreeSet::new(),
        extended: (0..CLASSES)
            .map(|i| format!("{prefix}gpu-{i:02}.teamgpu.io"))
            .collect(),
    }
}

type Objects = (
    Vec<ValidatingAdmissionPolicy>,
    Vec<ValidatingAdmissionPolicyBinding>,
);

/// teamgpu's admission objects with `namespaces` as the team namespaces; `guarded`: the value
/// of the guard label that the non-team binding leaves out.
fn teamgpu_objects(namespaces: &BTreeSet<String>, guarded: Option<&str>) -> Objects {
    let names: BTreeSet<&str> = namespaces.iter().map(String::as_str).collect();
    let governed = governed();
    let operator = admission::DEFAULT_OPERATOR_USER;
    let admins: Vec<String> = namespace_admission::DEFAULT_ADMIN_GROUPS
        .map(str::to_owned)
        .to_vec();
    let policies = vec![
        admission::team_policy(&governed, operator),
        admission::non_team_policy(&governed, operator, &names),
        namespace_admission::membership_policy(&admins, operator),
        namespace_admission::exemption_policy(&admins, operator),
    ];
    let bindings = vec![
        admission::team_binding(Enforcement::Deny),
        admission::non_team_binding(Enforcement::Deny, guarded),
        namespace_admission::membership_binding(Enforcement::Deny),
        namespace_admission::exemption_binding(Enforcement::Deny),
    ];
    (policies, bindings)
}

/// A policy named `name` of `rules` (its `matchConstraints`) with the one validation
/// `validation` and a binding without selector; with `params`, the team binding's params (the
/// namespace's ResourceQuota `teamgpu`, not found: Allow); with `condition`, a match condition
/// `true`.
fn plain_policy(
    name: &str,
    rules: Value,
    validation: &str,
    params: bool,
    condition: bool,
) -> Objects {
    let mut spec = json!({"matchConstraints": rules, "validations": [{"expression": validation}]});
    let mut binding = json!({"policyName": name, "validationActions": ["Deny"]});
    if params {
        spec["paramKind"] = json!({"apiVersion": "v1", "kind": "ResourceQuota"});
        let team = admission::team_binding(Enforcement::Deny).spec.unwrap();
        binding["paramRef"] = serde_json::to_value(team.param_ref).unwrap();
    }
    if condition {
        spec["matchConditions"] = json!([{"name": "always", "expression": "true"}]);
    }
    let object = |kind: &str, spec: Value| {
        let version = "admissionregistration.k8s.io/v1";
        json!({"apiVersion": version, "kind": kind, "metadata": {"name": name}, "spec": spec})
    };
    let policy = object("ValidatingAdmissionPolicy", spec);
    let binding = object("ValidatingAdmissionPolicyBinding", binding);
    (
        vec![serde_json::from_value(policy).unwrap()],
        vec![serde_json::from_value(binding).unwrap()],
    )
}

/// The admission objects of `configuration`.
fn objects(configuration: Configuration) -> Objects {
    let governed = governed();
    let operator = admission::DEFAULT_OPERATOR_USER;
    let non_team = admission::non_team_policy(&governed, operator, &BTreeSet::new());
    let mut non_team_binding = admission::non_team_binding(Enforcement::Deny, None);
    let team = admission::team_policy(&governed, operator);
    // The trivial policies judge what teamgpu's do.
    let rules = serde_json::to_value(&team.spec.as_ref().unwrap().match_constraints).unwrap();
    let trivial =
        |name, params, condition| plain_policy(name, rules.clone(), "true", params, condition);
    match configuration {
        Configuration::None | Configuration::ZeroQuota => (Vec::new(), Vec::new()),
        Configuration::Teamgpu(size) => teamgpu_objects(&team_namespaces(size), None),
        Configuration::Guarded => {
            let label = guard().label;
            teamgpu_objects(&team_namespaces(GUARDED_TEAM_NAMESPACES), Some(&label))
        }
        Configuration::TeamOnly => (vec![team], vec![admission::team_binding(Enforcement::Deny)]),
        Configuration::NonTeamOnly => (vec![non_team], vec![non_team_binding]),
        Configuration::NonTeamSelector => {
            let spec = non_team_binding.spec.as_mut().unwrap();
            let selector = spec
                .match_resources
                .as_mut()
                .unwrap()
                .namespace_selector
                .as_mut();
            let requirements = selector.unwrap().match_expressions.get_or_insert_default();
            requirements.push(LabelSelectorRequirement {
                key: TEAM_LABEL.into(),
                operator: "DoesNotExist".into(),
                values: None,
            });
            (vec![non_team], vec![non_team_binding])
        }
        Configuration::Trivial => trivial("bench-trivial", false, false),
        Configuration::TrivialCondition => trivial("bench-trivial", false, true),
        Configuration::TrivialParams => trivial("bench-trivial", true, false),
        Configuration::TrivialTwice => {
            let (mut policies, mut bindings) = trivial("bench-trivial", false, false);
            let (p, b) = trivial("bench-trivial-2", false, false);
            policies.extend(p);
            bindings.extend(b);
            (policies, bindings)
        }
    }
}

async fn apply(cluster: &TestCluster, (policies, bindings): Objects) {
    let client = cluster.client();
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

/// Deletes every admission policy and binding of the cluster (the benchmark's own).
async fn uninstall(cluster: &TestCluster) {
    let client = cluster.client();
    let (dp, all) = (DeleteParams::default(), ListParams::default());
    let bindings: Api<ValidatingAdmissionPolicyBinding> = Api::all(client.clone());
    bindings.delete_collection(&dp, &all).await.unwrap();
    let policies: Api<ValidatingAdmissionPolicy> = Api::all(client);
    policies.delete_collection(&dp, &all).await.unwrap();
}

/// Waits until admission has seen every policy written so far: a sentinel policy written after
/// them refuses a claim named [`SENTINEL`], and once it has gone, admission is left with exactly
/// the policies and bindings written before it (each kind is watched in order).
async fn settle(cluster: &TestCluster) {
    let rules = json!({"resourceRules": [{
        "apiGroups": ["resource.k8s.io"], "apiVersions": ["*"],
        "operations": ["CREATE"], "resources": ["resourceclaims"],
    }]});
    let refuse = format!("object.metadata.name != '{SENTINEL}'");
    let sentinel = plain_policy(SENTINEL, rules, &refuse, false, false);
    apply(cluster, sentinel).await;
    let probe = claim(SENTINEL, "plain");
    until_refused(cluster, PROBE_NAMESPACE, &probe, true).await;
    let dp = DeleteParams::default();
    let bindings: Api<ValidatingAdmissionPolicyBinding> = Api::all(cluster.client());
    bindings.delete(SENTINEL, &dp).await.unwrap();
    let policies: Api<ValidatingAdmissionPolicy> = Api::all(cluster.client());
    policies.delete(SENTINEL, &dp).await.unwrap();
    until_refused(cluster, PROBE_NAMESPACE, &probe, false).await;
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

/// Whether admission now refuses `probe` in `namespace` (dry run).
async fn refused_in(cluster: &TestCluster, namespace: &str, probe: &ResourceClaim) -> bool {
    let api: Api<ResourceClaim> = Api::namespaced(cluster.client(), namespace);
    let dry = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let result = api.create(&dry, probe).await;
    matches!(result, Err(kube::Error::Api(s)) if s.code == 403 || s.code == 422)
}

/// Waits until admission in `namespace` refuses (or allows) `probe`: a policy takes effect a
/// moment after it is written.
async fn until_refused(
    cluster: &TestCluster,
    namespace: &str,
    probe: &ResourceClaim,
    refused: bool,
) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while refused_in(cluster, namespace, probe).await != refused {
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

/// Every governed class's devices and extended resource, as quota resource names.
fn zero_hard() -> Vec<Arc<str>> {
    (0..CLASSES)
        .map(|i| format!("gpu-{i:02}.teamgpu.io"))
        .flat_map(|class| {
            let prefix = admission::IMPLICIT_EXTENDED_PREFIX;
            [
                format!("{class}.deviceclass.resource.k8s.io/devices"),
                format!("requests.{prefix}{class}"),
            ]
        })
        .map(Arc::from)
        .collect()
}

/// teamgpu's guard of a namespace outside every team, against [`zero_hard`].
fn guard() -> OutsideTeams {
    OutsideTeams::new(Vec::new(), &zero_hard()).expect("resources to guard")
}

/// A ResourceQuota of 0 devices of every governed class in `namespace`, by claim and by
/// extended resource, as teamgpu guards a namespace outside every team; with `label`, the
/// namespace is labelled as teamgpu does once the quota is in force.
async fn zero_quota(cluster: &TestCluster, namespace: &str, label: bool) {
    let hard: BTreeMap<String, String> = (zero_hard().iter())
        .map(|resource| (resource.to_string(), "0".to_owned()))
        .collect();
    let quota = json!({
        "apiVersion": "v1", "kind": "ResourceQuota",
        "metadata": {"name": outside_teams::QUOTA_NAME, "namespace": namespace},
        "spec": {"hard": hard},
    });
    let api: Api<k8s_openapi::api::core::v1::ResourceQuota> =
        Api::namespaced(cluster.client(), namespace);
    let quota = serde_json::from_value(quota).unwrap();
    api.create(&PostParams::default(), &quota).await.unwrap();
    // Refused once quota admission sees it.
    until_refused(cluster, namespace, &claim("probe", GOVERNED), true).await;
    if label {
        let deadline = Instant::now() + Duration::from_secs(60);
        let guard = guard();
        loop {
            let quota = api.get(outside_teams::QUOTA_NAME).await.unwrap();
            let hard = serde_json::to_value(quota.status.and_then(|s| s.hard)).unwrap();
            if outside_teams::in_force(&hard).as_deref() == Some(&*guard.label) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the quota controller filled no status"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let patch = json!({"metadata": {"labels": {outside_teams::GUARD_LABEL: guard.label}}});
        Api::<Namespace>::all(cluster.client())
            .patch(namespace, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap();
        // The binding's namespace informer sees the label within moments.
        tokio::time::sleep(Duration::from_secs(2)).await;
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

async fn measure(
    cluster: &TestCluster,
    configuration: Configuration,
    round: usize,
    writes: usize,
) -> Measured {
    let outside = format!("outside-{round}");
    namespace(cluster, &outside).await;
    if matches!(
        configuration,
        Configuration::ZeroQuota | Configuration::Guarded
    ) {
        zero_quota(cluster, &outside, configuration == Configuration::Guarded).await;
    }
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
        configuration,
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
    until_refused(cluster, joining, &claim("probe", GOVERNED), true).await;
    names.insert(joining.to_owned());
    let before = counters(cluster).await;
    let started = Instant::now();
    apply(cluster, teamgpu_objects(&names, None)).await;
    let apply = started.elapsed();
    until_refused(cluster, joining, &claim("probe", GOVERNED), false).await;
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
    let mut configurations: Vec<Configuration> = args.map(|a| Configuration::parse(&a)).collect();
    if configurations.is_empty() {
        configurations = ["none", "0", "10000", "none", "0", "10000"]
            .map(Configuration::parse)
            .to_vec();
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
    namespace(&cluster, PROBE_NAMESPACE).await;

    let mut rows = Vec::new();
    let mut joins = Vec::new();
    for (round, configuration) in configurations.into_iter().enumerate() {
        uninstall(&cluster).await;
        apply(&cluster, objects(configuration)).await;
        settle(&cluster).await;
        let Configuration::Teamgpu(size) = configuration else {
            rows.push(measure(&cluster, configuration, round, writes).await);
            continue;
        };
        let names = team_namespaces(size);
        until_refused(&cluster, PROBE_NAMESPACE, &claim("probe", GOVERNED), true).await;
        // The list took effect when its last team namespace is left alone.
        if let Some(last) = names.last() {
            namespace(&cluster, last).await;
            until_refused(&cluster, last, &claim("probe", GOVERNED), false).await;
        }
        rows.push(measure(&cluster, configuration, round, writes).await);
        joins.push(join(&cluster, names).await);
    }
    uninstall(&cluster).await;
    report(writes, &rows, &joins);
}

/// The ValidatingAdmissionPolicy plugin's milliseconds per write.
fn vap_ms(cost: &Cost) -> f64 {
    cost.admission_per_write_ms
        .get("ValidatingAdmissionPolicy")
        .copied()
        .unwrap_or(0.0)
}

fn report(writes: usize, rows: &[Measured], joins: &[Join]) {
    println!(
        "{writes} creates of each kind, {PARALLEL} in flight, in a namespace outside every team"
    );
    println!("(ratio: to the last `none` before the row; VAP: the plugin's admission time)\n");
    println!(
        "| # | configuration | claim: API server CPU per write | VAP | wall | Pod: CPU per write | VAP | wall |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    let mut base = &rows[0];
    for (i, row) in rows.iter().enumerate() {
        if row.configuration == Configuration::None {
            base = row;
        }
        println!(
            "| {i} | {} | {:.2} ms ({:.2}x) | {:.2} ms | {:.1} s | {:.2} ms ({:.2}x) | {:.2} ms | {:.1} s |",
            row.configuration.label(),
            row.claims.cpu_per_write_ms,
            row.claims.cpu_per_write_ms / base.claims.cpu_per_write_ms,
            vap_ms(&row.claims),
            row.claims.wall.as_secs_f64(),
            row.pods.cpu_per_write_ms,
            row.pods.cpu_per_write_ms / base.pods.cpu_per_write_ms,
            vap_ms(&row.pods),
            row.pods.wall.as_secs_f64(),
        );
    }
    if !joins.is_empty() {
        println!("\nA namespace joins a team: the non-team policy rewritten with it in the list");
        println!(
            "| team namespaces | apply | API server CPU | joined namespace allowed its class after |"
        );
        println!("|---|---|---|---|");
    }
    for j in joins {
        println!(
            "| {} | {:.0} ms | {:.0} ms | {:.0} ms |",
            j.size,
            j.apply.as_secs_f64() * 1000.0,
            j.cpu_ms,
            j.enforced.as_secs_f64() * 1000.0
        );
    }
}
