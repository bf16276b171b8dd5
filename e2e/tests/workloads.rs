//! Workloads shaped like real ones, on a real control plane (see `scenarios/` for how it is
//! started): Jobs of several Pods run by the real job controller, claims of 2 and 4 GPUs,
//! PriorityClasses, a Pod that has waited for a minute. What is asserted is what a user sees
//! with kubectl: whose Pods are evicted, what each team holds, how soon a waiting Pod is bound.
//! Expected values are written here.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use k8s_openapi::api::scheduling::v1::PriorityClass;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use teamgpu::api::{GpuSharingPolicy, TeamGpuPolicy};
use teamgpu_e2e::eventually;
use teamgpu_e2e::operator::Operator;
use teamgpu_e2e::sandbox::Sandbox;

const CONVERGE: Duration = Duration::from_secs(20);
/// The 16 A100 PCIe GPUs of the fixture's two PCIe nodes.
const POLICY: &str = "pcie";

/// A sandbox with the fixture's devices and one sharing policy (by default `pcie`, of its 16
/// PCIe GPUs on two nodes, templates of 1, 2 and 4 devices), and the operator running as its
/// ServiceAccount.
struct World {
    sandbox: Sandbox,
    client: Client,
    _operator: Operator,
    /// The sharing policy and how many templates it makes.
    policy: &'static str,
    templates: usize,
}

impl World {
    async fn new() -> Option<World> {
        World::with_policy(POLICY, "NVIDIA A100-PCIE-40GB", &[1, 2, 4]).await
    }

    /// The world with sharing policy `policy` of the fixture's `product` GPUs, with templates
    /// of `counts` devices.
    async fn with_policy(policy: &'static str, product: &str, counts: &[u32]) -> Option<World> {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_from_default_env()
                    .unwrap_or_else(|_| "warn,kube_client::client::builder=off".into()),
            )
            .with_test_writer()
            .try_init();
        let (sandbox, operator_config) = Sandbox::with_example_devices().await?;
        let client = sandbox.client();
        priority_classes(&client).await;
        let object: GpuSharingPolicy = serde_json::from_value(json!({
            "apiVersion": "teamgpu.io/v1alpha1", "kind": "GpuSharingPolicy",
            "metadata": {"name": policy},
            "spec": {"selector": {"productNames": [product]},
                     "claimTemplates": {"counts": counts}}}))
        .unwrap();
        Api::<GpuSharingPolicy>::all(client.clone())
            .create(&PostParams::default(), &object)
            .await
            .unwrap();
        let (operator_client, _) = teamgpu_e2e::cluster::recorded(operator_config);
        let operator = Operator::start(operator_client, Operator::test_config());
        Some(World {
            sandbox,
            client,
            _operator: operator,
            policy,
            templates: counts.len(),
        })
    }

    /// A team owning namespace `name` with `quota` of the policy and `reclaim` settings; returns
    /// the namespace once its templates are in and its quota is counted. Claims made in the
    /// first milliseconds of a team namespace, before the API server's admission sees its quota
    /// and before kube-controller-manager has counted it, can go uncharged (docs/tenancy.md,
    /// "What is not closed"); these scenarios are about what comes after.
    async fn team(&self, name: &str, quota: Value, reclaim: Value) -> String {
        let ns = self.sandbox.namespace(name, None).await.unwrap();
        let mut quota = quota;
        quota["sharingPolicy"] = json!(self.policy);
        let team: TeamGpuPolicy = serde_json::from_value(json!({
            "apiVersion": "teamgpu.io/v1alpha1", "kind": "TeamGpuPolicy",
            "metadata": {"name": name},
            "spec": {"namespaces": [ns], "quotas": [quota], "reclaim": reclaim}}))
        .unwrap();
        Api::<TeamGpuPolicy>::all(self.client.clone())
            .create(&PostParams::default(), &team)
            .await
            .unwrap();
        let templates = Api::<k8s_openapi::api::resource::v1::ResourceClaimTemplate>::namespaced(
            self.client.clone(),
            &ns,
        );
        eventually(&format!("templates in {ns}"), CONVERGE, || async {
            let n = (templates.list(&ListParams::default()).await)
                .map_err(|e| e.to_string())?
                .items
                .len();
            if n == self.templates {
                Ok(())
            } else {
                Err(format!("{n}"))
            }
        })
        .await;
        let quotas =
            Api::<k8s_openapi::api::core::v1::ResourceQuota>::namespaced(self.client.clone(), &ns);
        eventually(
            &format!("the quota of {ns} is counted"),
            CONVERGE,
            || async {
                let quota = quotas.get("teamgpu").await.map_err(|e| e.to_string())?;
                let spec = quota.spec.and_then(|s| s.hard);
                let status = quota.status.and_then(|s| s.hard);
                if spec.is_some() && spec == status {
                    Ok(())
                } else {
                    Err(format!("spec {spec:?}, status {status:?}"))
                }
            },
        )
        .await;
        ns
    }

    /// Devices allocated to the claims of namespace `ns`.
    async fn allocated(&self, ns: &str) -> Result<usize, String> {
        let claims = Api::<ResourceClaim>::namespaced(self.client.clone(), ns)
            .list(&ListParams::default())
            .await
            .map_err(|e| e.to_string())?;
        Ok(claims
            .items
            .iter()
            .filter_map(|c| c.status.as_ref()?.allocation.as_ref()?.devices.as_ref())
            .map(|d| d.results.as_ref().map_or(0, Vec::len))
            .sum())
    }

    /// Waits until namespace `ns` holds `devices` devices.
    async fn holds(&self, ns: &str, devices: usize, timeout: Duration) {
        eventually(
            &format!("{ns} holds {devices} devices"),
            timeout,
            || async {
                let n = self.allocated(ns).await?;
                if n == devices {
                    Ok(())
                } else {
                    Err(format!("{n} allocated"))
                }
            },
        )
        .await;
    }

    /// The Pods of `ns` not being deleted, by name, with their uids.
    async fn pods(&self, ns: &str) -> BTreeSet<(String, String)> {
        let pods = Api::<Pod>::namespaced(self.client.clone(), ns)
            .list(&ListParams::default())
            .await
            .unwrap();
        (pods.items.iter())
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .map(|p| (p.name_any(), p.uid().unwrap_or_default()))
            .collect()
    }

    /// Waits until none of Job `job`'s Pods in `before` is left in `ns` (the job controller
    /// may have made new ones); the Pods of `ns` then.
    async fn evicted_whole(
        &self,
        ns: &str,
        before: &BTreeSet<(String, String)>,
        job: &str,
    ) -> BTreeSet<(String, String)> {
        eventually(&format!("{job} evicted whole"), CONVERGE, || async {
            let after = self.pods(ns).await;
            match of_job(before, job).is_disjoint(&of_job(&after, job)) {
                true => Ok(after),
                false => Err(format!("before {before:?}, after {after:?}")),
            }
        })
        .await
    }

    /// Pod `name` of `ns` as the server has it.
    async fn pod_named(&self, ns: &str, name: &str) -> Pod {
        let pods = Api::<Pod>::namespaced(self.client.clone(), ns);
        pods.get(name).await.unwrap()
    }

    /// The notes of the Events with `reason` in `ns`.
    async fn events(&self, ns: &str, reason: &str) -> Vec<String> {
        let events = Api::<Event>::namespaced(self.client.clone(), ns)
            .list(&ListParams::default())
            .await
            .unwrap();
        (events.items.into_iter())
            .filter(|e| e.reason.as_deref() == Some(reason))
            .filter_map(|e| e.note)
            .collect()
    }

    /// Waits until an Event with `reason` in `ns` has a note that contains every one of `parts`.
    async fn told(&self, ns: &str, reason: &str, parts: &[&str]) {
        eventually(&format!("{reason} told in {ns}"), CONVERGE, || async {
            let told = self.events(ns, reason).await;
            if told.iter().any(|n| parts.iter().all(|p| n.contains(p))) {
                Ok(())
            } else {
                Err(format!("{told:?}"))
            }
        })
        .await;
    }

    /// Waits until the quota of `ns` reads `hard` and `used` devices of the policy's class on
    /// the server.
    async fn quota_reads(&self, ns: &str, hard: &str, used: &str) {
        let quotas =
            Api::<k8s_openapi::api::core::v1::ResourceQuota>::namespaced(self.client.clone(), ns);
        let key = format!(
            "{}.teamgpu.io.deviceclass.resource.k8s.io/devices",
            self.policy
        );
        let read = |map: Option<&std::collections::BTreeMap<String, _>>| {
            map.and_then(|m| m.get(&key))
                .map(|q: &k8s_openapi::apimachinery::pkg::api::resource::Quantity| q.0.clone())
        };
        eventually(
            &format!("the quota of {ns} reads hard {hard}, used {used}"),
            CONVERGE,
            || async {
                let quota = quotas.get("teamgpu").await.map_err(|e| e.to_string())?;
                let now_hard = read(quota.spec.as_ref().and_then(|s| s.hard.as_ref()));
                let now_used = read(quota.status.as_ref().and_then(|s| s.used.as_ref()));
                if (now_hard.as_deref(), now_used.as_deref()) == (Some(hard), Some(used)) {
                    Ok(())
                } else {
                    Err(format!("hard {now_hard:?}, used {now_used:?}"))
                }
            },
        )
        .await;
    }

    async fn create_pod(&self, ns: &str, pod: Pod) {
        Api::<Pod>::namespaced(self.client.clone(), ns)
            .create(&PostParams::default(), &pod)
            .await
            .unwrap();
    }

    /// Makes Pods pinned to the node of a ResourceSlice pool: `pinned(name, template, pool)`.
    async fn pinned(&self) -> impl Fn(&str, &str, &str) -> Pod + use<> {
        let slices = Api::<ResourceSlice>::all(self.client.clone())
            .list(&ListParams::default())
            .await
            .unwrap();
        move |name: &str, template: &str, pool: &str| {
            let node = (slices.items.iter())
                .find(|s| s.spec.pool.name == pool)
                .and_then(|s| s.spec.node_name.clone())
                .unwrap_or_else(|| panic!("no slice of pool {pool}"));
            let mut p = pod(name, template, None);
            p.spec.as_mut().unwrap().node_selector =
                Some([("kubernetes.io/hostname".to_owned(), node)].into());
            p
        }
    }

    /// Creates PodDisruptionBudget `name` of `ns` with `spec`, and waits until the disruption
    /// controller counts `healthy` Pods and allows `allowed` disruptions.
    async fn budget(
        &self,
        ns: &str,
        name: &str,
        spec: Value,
        (healthy, allowed): (i32, i32),
    ) -> Api<PodDisruptionBudget> {
        let budgets = Api::<PodDisruptionBudget>::namespaced(self.client.clone(), ns);
        let budget = json!({"metadata": {"name": name}, "spec": spec});
        let budget = serde_json::from_value(budget).unwrap();
        budgets
            .create(&PostParams::default(), &budget)
            .await
            .unwrap();
        eventually(&format!("budget {name} counted"), CONVERGE, || async {
            let b = budgets.get(name).await.map_err(|e| e.to_string())?;
            match b.status.map(|s| (s.current_healthy, s.disruptions_allowed)) {
                Some(counted) if counted == (healthy, allowed) => Ok(()),
                other => Err(format!("(healthy, allowed) {other:?}")),
            }
        })
        .await;
        budgets
    }

    /// Waits until Job `name` of `ns`, which reclaim took back, runs again: not suspended, no
    /// teamgpu label left, Pods not being deleted; asserts it counted no failure. How long after
    /// its `Suspended` condition turned False its Pods were made again (the latest creation).
    async fn resumed_without_failure(&self, ns: &str, name: &str) -> Duration {
        let jobs: Api<Job> = Api::namespaced(self.client.clone(), ns);
        let job = eventually(&format!("{name} resumed"), CONVERGE, || async {
            let job = jobs.get(name).await.map_err(|e| e.to_string())?;
            let suspended = job.spec.as_ref().and_then(|s| s.suspend);
            let labelled = job.labels().contains_key("teamgpu.io/suspended");
            let active = job.status.as_ref().and_then(|s| s.active).unwrap_or(0);
            match (suspended, labelled, active) {
                (Some(false), false, 2) => Ok(job),
                state => Err(format!("suspend, labelled, active: {state:?}")),
            }
        })
        .await;
        let status = job.status.unwrap_or_default();
        assert_eq!(status.failed.unwrap_or(0), 0, "{name} counted failures");
        let conditions = status.conditions.unwrap_or_default();
        let resumed = (conditions.iter())
            .find(|c| c.type_ == "Suspended")
            .unwrap_or_else(|| panic!("{name} was never suspended: {conditions:?}"));
        assert_eq!(resumed.status, "False", "{resumed:?}");
        let resumed_at = resumed.last_transition_time.as_ref().unwrap().0;
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), ns);
        let made = (pods.list(&ListParams::default().labels(&format!("job-name={name}"))))
            .await
            .unwrap()
            .items
            .iter()
            .filter_map(|p| p.metadata.creation_timestamp.as_ref().map(|t| t.0))
            .max()
            .unwrap();
        let after = made.duration_since(resumed_at);
        Duration::try_from(after).unwrap_or_default()
    }

    async fn create_job(&self, ns: &str, job: Job) {
        Api::<Job>::namespaced(self.client.clone(), ns)
            .create(&PostParams::default(), &job)
            .await
            .unwrap();
    }
}

/// PriorityClasses `teamgpu-e2e-low` (100) and `teamgpu-e2e-high` (1000); kept between runs
/// (cluster-scoped, and the same every time).
async fn priority_classes(client: &Client) {
    let api: Api<PriorityClass> = Api::all(client.clone());
    for (name, value) in [("teamgpu-e2e-low", 100), ("teamgpu-e2e-high", 1000)] {
        let class: PriorityClass = serde_json::from_value(json!({
            "metadata": {"name": name}, "value": value,
            "preemptionPolicy": "Never", "description": "teamgpu e2e workloads"}))
        .unwrap();
        match api.create(&PostParams::default(), &class).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => panic!("PriorityClass {name}: {e}"),
        }
    }
}

/// The spec of a Pod holding one claim from `template`, with `priority_class` if given.
fn pod_spec(template: &str, priority_class: Option<&str>, restart: &str) -> Value {
    json!({
        "restartPolicy": restart,
        "priorityClassName": priority_class,
        "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10",
                        "resources": {"claims": [{"name": "gpu"}]}}],
        "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template}]})
}

fn pod(name: &str, template: &str, priority_class: Option<&str>) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": pod_spec(template, priority_class, "Always")}))
    .unwrap()
}

/// A training Job of `pods` Pods running at once, each with a claim from `template`.
fn job(name: &str, pods: i32, template: &str, priority_class: Option<&str>) -> Job {
    serde_json::from_value(json!({
        "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
        "spec": {"parallelism": pods, "completions": pods, "backoffLimit": 6,
                 "template": {"metadata": {"labels": {"app": name}},
                              "spec": pod_spec(template, priority_class, "Never")}}}))
    .unwrap()
}

/// The Pods of Job `job` in `pods`.
fn of_job<'a>(pods: &'a BTreeSet<(String, String)>, job: &str) -> BTreeSet<&'a (String, String)> {
    pods.iter()
        .filter(|(name, _)| name.starts_with(&format!("{job}-")))
        .collect()
}

/// Deletes Pod `room` and waits (up to 30 s) until Pod `waiting` is bound: how long after.
async fn bound_after_deleting(pods: &Api<Pod>, room: &str, waiting: &str) -> Duration {
    pods.delete(room, &DeleteParams::default()).await.unwrap();
    let freed = Instant::now();
    eventually(
        &format!("{waiting} is bound"),
        Duration::from_secs(30),
        || async {
            let p = pods.get(waiting).await.map_err(|e| e.to_string())?;
            match p.spec.and_then(|s| s.node_name) {
                Some(_) => Ok(freed.elapsed()),
                None => Err("not bound".to_owned()),
            }
        },
    )
    .await
}

/// 16 GPUs: owner is guaranteed 8 (holds 6) and reclaims after 3 s; "other" holds its 2;
/// borrower is guaranteed 4 and holds 8 in two training Jobs of 2 Pods x 2 GPUs, train-low
/// (low priority, started first, with labels `low_labels`) and train-high. Returns the
/// namespaces of owner and borrower, and the borrower's Pods.
async fn two_training_jobs(
    world: &World,
    low_labels: Value,
) -> (String, String, BTreeSet<(String, String)>) {
    // 16 GPUs: owner is guaranteed 8 and reclaims after 3 s; "other" holds its 2; borrower is
    // guaranteed 4 and may borrow up to 12.
    let owner = (world.team(
        "owner",
        json!({"guaranteed": 8, "limit": 8}),
        json!({"enabled": true, "gracePeriodSeconds": 3}),
    ))
    .await;
    let other = (world.team("other", json!({"guaranteed": 2, "limit": 2}), json!({}))).await;
    let borrower = (world.team("borrower", json!({"guaranteed": 4, "limit": 12}), json!({}))).await;
    // Half of each on either node, so that each has 4 free, and every 2-GPU Pod of the
    // borrower fits wherever the scheduler puts it (left to the scheduler, the 1-GPU Pods could
    // leave 1 free on each node, and the borrower's last Pod none).
    let pinned = world.pinned().await;
    let node = |i: usize| ["gpu-b-01", "gpu-b-02"][i % 2];
    for i in 0..6 {
        let p = pinned(&format!("serve-{i}"), POLICY, node(i));
        world.create_pod(&owner, p).await;
    }
    for i in 0..2 {
        let p = pinned(&format!("etl-{i}"), POLICY, node(i));
        world.create_pod(&other, p).await;
    }
    world.holds(&owner, 6, CONVERGE).await;
    world.holds(&other, 2, CONVERGE).await;
    // Two training Jobs of 2 Pods x 2 GPUs: the low-priority one first, the high one later.
    let x2 = format!("{POLICY}-x2");
    let mut low = job("train-low", 2, &x2, Some("teamgpu-e2e-low"));
    let labels = low.metadata.labels.get_or_insert_default();
    labels.extend(serde_json::from_value::<BTreeMap<String, String>>(low_labels).unwrap());
    world.create_job(&borrower, low).await;
    world.holds(&borrower, 4, CONVERGE).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    world
        .create_job(
            &borrower,
            job("train-high", 2, &x2, Some("teamgpu-e2e-high")),
        )
        .await;
    world.holds(&borrower, 8, CONVERGE).await;
    let before = world.pods(&borrower).await;
    assert_eq!(before.len(), 4, "{before:?}");
    (owner, borrower, before)
}

/// The owner of [`two_training_jobs`] asks for the last 2 of its guarantee: nothing is free,
/// and every borrowed claim is 2 devices in a Job of 4.
async fn owner_asks_for_its_last_two(world: &World, owner: &str) {
    for i in 6..8 {
        world
            .create_pod(owner, pod(&format!("serve-{i}"), POLICY, None))
            .await;
    }
}

/// The case: the owner waits 2 devices short while the borrower holds them in Jobs of
/// 4 devices each. The whole low-priority Job is taken back, though the high-priority one
/// started later, and the owner gets its guarantee.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guarantee_comes_back_from_jobs_larger_than_the_shortfall_lowest_priority_first() {
    let Some(world) = World::new().await else {
        return;
    };
    let (owner, borrower, before) = two_training_jobs(&world, json!({})).await;
    let asked = Instant::now();
    owner_asks_for_its_last_two(&world, &owner).await;
    world.holds(&owner, 8, Duration::from_secs(40)).await;
    let restored = asked.elapsed();
    // Both Pods of train-low go (the job controller may have made new ones, which wait); the
    // owner may be bound on the first one's devices a moment before the second is evicted.
    let after = world.evicted_whole(&borrower, &before, "train-low").await;
    // Both of train-high kept their devices.
    assert_eq!(of_job(&before, "train-high"), of_job(&after, "train-high"));
    world.holds(&borrower, 4, CONVERGE).await;
    let told = world.events(&borrower, "Reclaimed").await;
    assert!(
        told.iter().any(|n| n.contains("suspending Job")
            && n.contains(
                "/train-low (2 Pods, 4 devices of pcie, priority teamgpu-e2e-low (100))"
            )),
        "{told:?}"
    );
    // The Job was suspended for a moment, not its Pods evicted: it counts no failure (two
    // evicted Pods would be two of its backoffLimit of 6, and delay its next Pods by 20 s), it
    // runs again, and its new Pods wait for room.
    let job = world.resumed_without_failure(&borrower, "train-low").await;
    eprintln!(
        "owner at 8 of 8 {restored:?} after asking (3 s grace); train-low made its Pods again {job:?} after it was resumed"
    );
}

/// A Job Kueue manages (its queue label) is not suspended: Kueue resumes a Job it admitted that
/// someone else suspended, and the two would fight over `spec.suspend`. Its Pods are evicted
/// instead, the job controller counts them as failed, and the Events say "evicting".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_kueue_manages_has_its_pods_evicted_and_is_never_suspended() {
    let Some(world) = World::new().await else {
        return;
    };
    let kueue = json!({"kueue.x-k8s.io/queue-name": "gpus"});
    let (owner, borrower, before) = two_training_jobs(&world, kueue).await;
    let jobs: Api<Job> = Api::namespaced(world.client.clone(), &borrower);
    owner_asks_for_its_last_two(&world, &owner).await;
    world.holds(&owner, 8, Duration::from_secs(40)).await;
    let after = world.evicted_whole(&borrower, &before, "train-low").await;
    assert_eq!(of_job(&before, "train-high"), of_job(&after, "train-high"));
    let told = world.events(&borrower, "Reclaimed").await;
    assert!(
        told.iter().any(|n| n.contains("evicting Job")
            && n.contains("/train-low (2 Pods, 4 devices of pcie")
            && !n.contains("resumes")),
        "{told:?}"
    );
    // Evicted, as the job controller tells: two failures.
    let failed = eventually("train-low counts its evicted Pods", CONVERGE, || async {
        let job = jobs.get("train-low").await.map_err(|e| e.to_string())?;
        match job.status.as_ref().and_then(|s| s.failed) {
            Some(2) => Ok(job),
            failed => Err(format!("failed: {failed:?}")),
        }
    })
    .await;
    // Never suspended: the job controller marks a Job it suspended (`Suspended`, True and then
    // False once resumed), and teamgpu labels one it suspends.
    assert!(!failed.labels().contains_key("teamgpu.io/suspended"));
    assert_ne!(failed.spec.as_ref().and_then(|s| s.suspend), Some(true));
    let conditions = failed.status.and_then(|s| s.conditions).unwrap_or_default();
    assert!(
        conditions.iter().all(|c| c.type_ != "Suspended"),
        "{conditions:?}"
    );
}

/// A PodDisruptionBudget that allows one disruption passes the dry run of each of a 2-Pod
/// Job's evictions, as a dry run does not spend it, and would refuse the second real one. The
/// low-priority Job it covers is left whole, the refusal says why, and the high-priority Job
/// goes instead: the guarantee still comes back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_a_budget_would_split_is_left_whole_and_another_goes_instead() {
    let Some(world) = World::new().await else {
        return;
    };
    let (owner, borrower, before) = two_training_jobs(&world, json!({})).await;
    // The disruption controller counts both Pods healthy: one may go.
    let spec = json!({"minAvailable": 1, "selector": {"matchLabels": {"app": "train-low"}}});
    world.budget(&borrower, "train-low", spec, (2, 1)).await;

    owner_asks_for_its_last_two(&world, &owner).await;
    // Reclaim counts the budget as it chooses: train-low, which it would take first, is passed
    // over before any eviction is asked for, and train-high goes in its place.
    world.holds(&owner, 8, Duration::from_secs(40)).await;
    let after = world.evicted_whole(&borrower, &before, "train-high").await;
    assert_eq!(of_job(&before, "train-low"), of_job(&after, "train-low"));
    let told = world.events(&borrower, "Reclaimed").await;
    assert!(
        told.iter()
            .any(|n| n.contains("/train-high (2 Pods, 4 devices of pcie")),
        "{told:?}"
    );
    let refused = world.events(&borrower, "EvictionRefused").await;
    assert!(refused.is_empty(), "no eviction was refused: {refused:?}");
}

/// When budgets keep every workload that could give the owner its guarantee back, reclaim asks
/// for no eviction and tells the owner which budget keeps what; once the budget is gone, it goes
/// on by itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn budgets_that_keep_every_borrowed_job_are_named_to_the_owner_and_reclaim_goes_on_without_them()
 {
    let Some(world) = World::new().await else {
        return;
    };
    let (owner, borrower, before) = two_training_jobs(&world, json!({})).await;
    let spec = json!({"minAvailable": 4, "selector": {"matchExpressions": [
        {"key": "app", "operator": "In", "values": ["train-low", "train-high"]}]}});
    let budgets = world.budget(&borrower, "training", spec, (4, 0)).await;
    owner_asks_for_its_last_two(&world, &owner).await;
    let blocked = eventually("the owner told why", Duration::from_secs(40), || async {
        let notes = world.events(&owner, "ReclaimBlocked").await;
        let pods = world.pods(&borrower).await;
        (notes.iter())
            .find(|n| n.contains("PodDisruptionBudget "))
            .cloned()
            .ok_or(format!(
                "ReclaimBlocked: {notes:?}; the borrower's Pods: {pods:?}"
            ))
    })
    .await;
    let keeps = format!(
        "PodDisruptionBudget {borrower}/training, which allows no disruption now, keeps Job \
         {borrower}/train-high (2 of its Pods), Job {borrower}/train-low (2 of its Pods); \
         reclaim looks again every 10 s"
    );
    assert!(
        blocked.contains("2 devices of pcie are still short and reclaim cannot free them now")
            && blocked.ends_with(&keeps),
        "{blocked}"
    );
    assert_eq!(world.pods(&borrower).await, before, "nothing evicted");
    let refused = world.events(&borrower, "EvictionRefused").await;
    assert!(refused.is_empty(), "no eviction was asked for: {refused:?}");
    // Without the budget, the lowest priority goes, within reclaim's next look.
    budgets
        .delete("training", &Default::default())
        .await
        .unwrap();
    world.holds(&owner, 8, Duration::from_secs(40)).await;
    let after = world.evicted_whole(&borrower, &before, "train-low").await;
    assert_eq!(of_job(&before, "train-high"), of_job(&after, "train-high"));
}

/// Two workloads one budget covers spend it together: with a budget allowing 1 disruption over
/// the borrower's two serving Jobs, reclaim takes one of them and then the training Job, rather
/// than asking for both serving Jobs and seeing the second eviction refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workloads_chosen_together_spend_one_budget_and_the_next_goes_instead() {
    let Some(world) = World::new().await else {
        return;
    };
    // 16 GPUs on two nodes: owner is guaranteed 8 and holds 4, "other" holds its 4, borrower
    // (guaranteed 2, so that it may give 6) holds 8: a serving Job of 1 Pod x 2 GPUs pinned to each node, low
    // priority, and a high-priority training Job of 2 Pods x 2 GPUs, one on each node.
    let owner = (world.team(
        "owner",
        json!({"guaranteed": 8, "limit": 8}),
        json!({"enabled": true, "gracePeriodSeconds": 3}),
    ))
    .await;
    let other = (world.team("other", json!({"guaranteed": 4, "limit": 4}), json!({}))).await;
    let borrower = (world.team("borrower", json!({"guaranteed": 2, "limit": 12}), json!({}))).await;
    let pinned = world.pinned().await;
    let pools = ["gpu-b-01", "gpu-b-02"];
    for i in 0..4 {
        let pool = pools[i % 2];
        (world.create_pod(&owner, pinned(&format!("serve-{i}"), POLICY, pool))).await;
        (world.create_pod(&other, pinned(&format!("etl-{i}"), POLICY, pool))).await;
    }
    world.holds(&owner, 4, CONVERGE).await;
    world.holds(&other, 4, CONVERGE).await;
    let x2 = format!("{POLICY}-x2");
    for (name, pool) in [("serve-a", pools[0]), ("serve-b", pools[1])] {
        let mut serving = job(name, 1, &x2, Some("teamgpu-e2e-low"));
        let template = &mut serving.spec.as_mut().unwrap().template;
        let pod = pinned(name, &x2, pool);
        template.spec.as_mut().unwrap().node_selector = pod.spec.unwrap().node_selector;
        let labels = template.metadata.as_mut().unwrap().labels.as_mut().unwrap();
        labels.insert("tier".into(), "serving".into());
        world.create_job(&borrower, serving).await;
    }
    world.holds(&borrower, 4, CONVERGE).await;
    let train = job("train", 2, &x2, Some("teamgpu-e2e-high"));
    world.create_job(&borrower, train).await;
    world.holds(&borrower, 8, CONVERGE).await;
    let before = world.pods(&borrower).await;
    let spec = json!({"minAvailable": 1, "selector": {"matchLabels": {"tier": "serving"}}});
    world.budget(&borrower, "serving", spec, (2, 1)).await;

    // The owner wants 4 more: one serving Job and the training Job make room for them.
    for i in 4..8 {
        world
            .create_pod(&owner, pod(&format!("serve-{i}"), POLICY, None))
            .await;
    }
    world.holds(&owner, 8, Duration::from_secs(40)).await;
    let after = world.evicted_whole(&borrower, &before, "train").await;
    let serving_left = ["serve-a", "serve-b"]
        .map(|job| of_job(&before, job).is_subset(&of_job(&after, job)))
        .iter()
        .filter(|kept| **kept)
        .count();
    assert_eq!(
        serving_left, 1,
        "one serving Job goes, the other stays: {after:?}"
    );
    let refused = world.events(&borrower, "EvictionRefused").await;
    assert!(refused.is_empty(), "no eviction was refused: {refused:?}");
}

/// A young workload is spared until it has run the waiting team's minimum runtime; the team is
/// told until when.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_minimum_runtime_is_respected_before_a_workload_is_taken() {
    let Some(world) = World::new().await else {
        return;
    };
    let owner = (world.team(
        "owner",
        json!({"guaranteed": 8, "limit": 8}),
        json!({"enabled": true, "gracePeriodSeconds": 0, "minRuntimeSeconds": 20}),
    ))
    .await;
    let borrower = (world.team("borrower", json!({"guaranteed": 8, "limit": 16}), json!({}))).await;
    let x4 = format!("{POLICY}-x4");
    for i in 0..4 {
        world
            .create_pod(&borrower, pod(&format!("job-{i}"), &x4, None))
            .await;
    }
    world.holds(&borrower, 16, CONVERGE).await;
    let started = Instant::now();
    world.create_pod(&owner, pod("serve", &x4, None)).await;
    // Nothing is evicted for 20 s after the borrower's Pods started; then one 4-GPU Pod goes.
    (world.told(&owner, "ReclaimWaiting", &["minimum runtime (20 s)"])).await;
    assert_eq!(world.pods(&borrower).await.len(), 4, "nothing evicted yet");
    world.holds(&owner, 4, Duration::from_secs(45)).await;
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_secs(17),
        "the borrower's Pods ran at least about 20 s first: {waited:?}"
    );
    assert_eq!(world.pods(&borrower).await.len(), 3);
    eprintln!("owner served {waited:?} after the borrower's Pods started (minimum runtime 20 s)");
}

/// A Pod whose claim quota refused for a minute (the resourceclaim controller's backoff is
/// then about a minute) is bound within seconds of its team getting room.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_that_waited_a_minute_is_bound_within_seconds_of_room_appearing() {
    let Some(world) = World::new().await else {
        return;
    };
    let team = (world.team("ml", json!({"guaranteed": 4, "limit": 4}), json!({}))).await;
    let x4 = format!("{POLICY}-x4");
    world.create_pod(&team, pod("first", &x4, None)).await;
    world.holds(&team, 4, CONVERGE).await;
    world
        .create_pod(&team, pod("second", &x4, Some("teamgpu-e2e-high")))
        .await;
    // It waits: quota refuses its claim, again and again, backing off.
    let waited = Duration::from_secs(
        std::env::var("TEAMGPU_E2E_WAIT_SECONDS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(60),
    );
    tokio::time::sleep(waited).await;
    let pods: Api<Pod> = Api::namespaced(world.client.clone(), &team);
    let second = pods.get("second").await.unwrap();
    assert!(
        second
            .spec
            .as_ref()
            .and_then(|s| s.node_name.as_ref())
            .is_none()
    );
    let told = world.events(&team, "WaitingForQuota").await;
    assert!(
        told.iter().any(|n| n
            .contains("waits for 4 devices of pcie: team ml has 4 of its 4 in use")
            && n.contains("place 1 of 1 in the team's queue")),
        "{told:?}"
    );
    // Room appears: the first Pod is done.
    let bound = bound_after_deleting(&pods, "first", "second").await;
    assert!(
        bound < Duration::from_secs(10),
        "bound {bound:?} after room appeared, having waited {waited:?}"
    );
    eprintln!("bound {bound:?} after the room appeared, having waited {waited:?}");
}

/// Room for one Pod goes to the waiting Pod of the highest priority, though another of the same
/// template (as 1-GPU Pods all are) waited longer: teamgpu wakes the Pods the room fits, in
/// order, not their template, which would make the resourceclaim controller try all of them at
/// once and the first one it got to win.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn room_for_one_pod_goes_to_the_highest_priority_of_one_template() {
    let Some(world) = World::new().await else {
        return;
    };
    let team = (world.team("ml", json!({"guaranteed": 2, "limit": 2}), json!({}))).await;
    world.create_pod(&team, pod("holder", POLICY, None)).await;
    world.create_pod(&team, pod("other", POLICY, None)).await;
    world.holds(&team, 2, CONVERGE).await;
    // Both wait for quota; the low-priority one first (and its name sorts first).
    (world.create_pod(&team, pod("a-low", POLICY, Some("teamgpu-e2e-low")))).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    (world.create_pod(&team, pod("b-high", POLICY, Some("teamgpu-e2e-high")))).await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    let pods: Api<Pod> = Api::namespaced(world.client.clone(), &team);
    let node = |p: Pod| p.spec.and_then(|s| s.node_name);
    for name in ["a-low", "b-high"] {
        let bound = node(pods.get(name).await.unwrap());
        if bound.is_some() {
            panic!(
                "{name} waits, but is bound to {bound:?}; {}",
                teamgpu_e2e::quota_and_claims(&world.client, &team, "teamgpu").await
            );
        }
    }
    // Room for one.
    let bound = bound_after_deleting(&pods, "holder", "b-high").await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let low = node(pods.get("a-low").await.unwrap());
    if low.is_some() {
        panic!(
            "the low-priority Pod still waits, but is bound to {low:?}; {}",
            teamgpu_e2e::quota_and_claims(&world.client, &team, "teamgpu").await
        );
    }
    assert!(
        bound < Duration::from_secs(10),
        "bound {bound:?} after room appeared"
    );
    eprintln!("the high-priority Pod was bound {bound:?} after the room appeared");
}

/// A team is deleted while its Pod holds a device. Its namespace now belongs to no team, so
/// admission refuses new claims for teamgpu's classes there; but the Pod's claim must still go
/// when the Pod does. Found by the replay's tear-down: the resourceclaim controller takes its
/// `delete-protection` finalizer off with an update, which teamgpu's policy for namespaces
/// outside every team refused, so the claim and its namespace stayed for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_claims_of_a_deleted_team_go_with_their_pods() {
    let Some(world) = World::new().await else {
        return;
    };
    let team = (world.team("leaving", json!({"guaranteed": 2, "limit": 2}), json!({}))).await;
    world.create_pod(&team, pod("worker", POLICY, None)).await;
    world.holds(&team, 1, CONVERGE).await;
    Api::<TeamGpuPolicy>::all(world.client.clone())
        .delete("leaving", &DeleteParams::default())
        .await
        .unwrap();
    let claims: Api<ResourceClaim> = Api::namespaced(world.client.clone(), &team);
    let new_claim: ResourceClaim = serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "another"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": format!("{POLICY}.teamgpu.io")}}]}}}))
    .unwrap();
    eventually(
        "admission treats the namespace as outside every team",
        CONVERGE,
        || async {
            let dry_run = PostParams {
                dry_run: true,
                ..PostParams::default()
            };
            match claims.create(&dry_run, &new_claim).await {
                Err(kube::Error::Api(s)) if teamgpu_e2e::refused_outside_teams(&s.message) => {
                    Ok(())
                }
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
    Api::<Pod>::namespaced(world.client.clone(), &team)
        .delete("worker", &DeleteParams::default())
        .await
        .unwrap();
    eventually(
        "the Pod's claim is gone",
        Duration::from_secs(30),
        || async {
            let left = claims
                .list(&ListParams::default())
                .await
                .map_err(|e| e.to_string())?;
            match left.items.as_slice() {
                [] => Ok(()),
                items => Err(format!(
                    "{:?}",
                    items
                        .iter()
                        .map(|c| (c.name_any(), c.finalizers().to_vec()))
                        .collect::<Vec<_>>()
                )),
            }
        },
    )
    .await;
}

/// The owner's 8-GPU Pod `train`, created and waited for until its team holds 8 devices (30 s
/// at most) and it is bound: how long that took, and its node.
async fn train_on_a_whole_node(world: &World, owner: &str) -> (Duration, String) {
    let asked = Instant::now();
    world.create_pod(owner, pod("train", "sxm-x8", None)).await;
    world.holds(owner, 8, Duration::from_secs(30)).await;
    // The claim is allocated a moment before the Pod is bound.
    let pods = Api::<Pod>::namespaced(world.client.clone(), owner);
    let node = eventually("train bound", CONVERGE, || async {
        let p = pods.get("train").await.map_err(|e| e.to_string())?;
        p.spec
            .and_then(|s| s.node_name)
            .ok_or_else(|| "not bound".to_owned())
    })
    .await;
    (asked.elapsed(), node)
}

/// The node of Job `small`'s Pod not being deleted, once it has one.
async fn small_jobs_node(pods: &Api<Pod>) -> Option<String> {
    let list = pods.list(&ListParams::default()).await.unwrap();
    (list.items.into_iter())
        .filter(|p| p.name_any().starts_with("small-") && p.metadata.deletion_timestamp.is_none())
        .find_map(|p| p.spec.and_then(|s| s.node_name))
}

/// A control plane with policy `sxm` (A100s, templates of 1 and 8 GPUs) and the owner team:
/// guaranteed 8, its limit, reclaiming after 3 s with no minimum runtime. Returns the world and
/// the owner's namespace; `None` without a control plane.
async fn whole_nodes_and_an_owner() -> Option<(World, String)> {
    let world = World::with_policy("sxm", "NVIDIA A100-SXM4-80GB", &[1, 8]).await?;
    let owner = (world.team(
        "owner",
        json!({"guaranteed": 8, "limit": 8}),
        json!({"enabled": true, "gracePeriodSeconds": 3, "minRuntimeSeconds": 0}),
    ))
    .await;
    Some((world, owner))
}

/// The fixture's four A100 SXM nodes (pools gpu-a-01 .. gpu-a-04, 8 GPUs each), an owner
/// guaranteed 8 that reclaims after 3 s, and a borrower guaranteed none (limit 32) running six
/// 1-GPU Pods pinned to each node, 2 free on each; those on gpu-a-03's node (`low-gpu-a-03-N`)
/// are low priority, the others high. Returns the world and the two namespaces.
async fn scattered() -> Option<(World, String, String)> {
    let (world, owner) = whole_nodes_and_an_owner().await?;
    let borrower = (world.team("borrower", json!({"guaranteed": 0, "limit": 32}), json!({}))).await;
    let pinned = world.pinned().await;
    for node in ["gpu-a-01", "gpu-a-02", "gpu-a-03", "gpu-a-04"] {
        let (prefix, class) = match node {
            "gpu-a-03" => ("low", "teamgpu-e2e-low"),
            _ => ("high", "teamgpu-e2e-high"),
        };
        for i in 0..6 {
            let mut p = pinned(&format!("{prefix}-{node}-{i}"), "sxm", node);
            p.spec.as_mut().unwrap().priority_class_name = Some(class.to_owned());
            world.create_pod(&borrower, p).await;
        }
    }
    world.holds(&borrower, 24, Duration::from_secs(60)).await;
    Some((world, owner, borrower))
}

/// Issue 22's fragmentation: a borrower's 1-GPU Pods are spread over four 8-GPU nodes, 6 on
/// each, so the pool has 8 free devices (2 per node) and the owner's 8-GPU claim fits no node.
/// Counting, nothing would be short; reclaim evicts the 6 Pods of one node (the low-priority
/// ones) and the owner's Pod is bound there, within 30 s of asking (3 s grace).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_eight_gpu_claim_gets_a_whole_node_back_when_free_devices_are_scattered() {
    let Some((world, owner, borrower)) = scattered().await else {
        return;
    };
    let low_node =
        (world.pod_named(&borrower, "low-gpu-a-03-0").await.spec).and_then(|s| s.node_name);
    let before = world.pods(&borrower).await;

    let asked = Instant::now();
    world.create_pod(&owner, pod("train", "sxm-x8", None)).await;
    // Reclaim takes the low-priority node's 6 Pods (grace 3 s)...
    eventually(
        "the low-priority Pods evicted",
        Duration::from_secs(20),
        || async {
            let left = world.pods(&borrower).await;
            let low = left.iter().filter(|(n, _)| n.starts_with("low-")).count();
            if low == 0 {
                Ok(())
            } else {
                Err(format!("{low} left of {}", left.len()))
            }
        },
    )
    .await;
    eprintln!("low-priority Pods gone {:?} after asking", asked.elapsed());
    world.holds(&owner, 8, Duration::from_secs(30)).await;
    let restored = asked.elapsed();
    let train = Api::<Pod>::namespaced(world.client.clone(), &owner);
    eventually("train bound", Duration::from_secs(10), || async {
        let p = train.get("train").await.map_err(|e| e.to_string())?;
        match p.spec.and_then(|s| s.node_name) {
            Some(node) if Some(&node) == low_node.as_ref() => Ok(()),
            other => Err(format!("on {other:?}")),
        }
    })
    .await;
    // Exactly the 6 low-priority Pods of gpu-a-03's node went; the 18 others kept running.
    let after = world.pods(&borrower).await;
    let gone: BTreeSet<String> = before.difference(&after).map(|(n, _)| n.clone()).collect();
    let expected: BTreeSet<String> = (0..6).map(|i| format!("low-gpu-a-03-{i}")).collect();
    assert_eq!(gone, expected);
    assert_eq!(after.len(), 18, "{after:?}");
    world.holds(&borrower, 18, CONVERGE).await;
    // Each eviction is told in an Event, published after the evictions of its batch (the
    // scheduler may bind the owner's Pod before the last is written).
    eventually("each eviction told", CONVERGE, || async {
        let told = world.events(&borrower, "Reclaimed").await;
        let each = (0..6).all(|i| {
            let pod = format!("low-gpu-a-03-{i} (1 Pod, 1 devices of sxm");
            told.iter().any(|n| n.contains(&pod))
        });
        if each {
            Ok(())
        } else {
            Err(format!("{told:?}"))
        }
    })
    .await;
    eprintln!("owner's 8-GPU Pod bound {restored:?} after asking (3 s grace)");
}

/// A borrower's 8-GPU Job was charged while the borrower could borrow and waits for a node; the
/// owner then asks for its guarantee. The node reclaim empties for the owner would go to
/// whichever of the two Pods the scheduler tries first, and a borrower that wins it is evicted
/// again in the next round (the replay saw this take a guarantee 5-20 s longer). The queued Job
/// is removed with the evictions instead: nothing of it had run, and its Pod made again waits
/// for quota without a claim. The owner's Pod is bound on the emptied node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_borrowers_job_queued_for_a_node_does_not_take_the_room_made_for_the_owner() {
    let Some((world, owner, borrower)) = scattered().await else {
        return;
    };
    // The borrower may borrow the owner's unused 8: its 8-GPU Job's claim is made and charged,
    // and fits no node.
    world
        .create_job(
            &borrower,
            job("sweep", 1, "sxm-x8", Some("teamgpu-e2e-high")),
        )
        .await;
    world.quota_reads(&borrower, "32", "32").await;
    let before = world.pods(&borrower).await;
    let queued = of_job(&before, "sweep");
    let low_pod = world.pod_named(&borrower, "low-gpu-a-03-0").await;
    assert_eq!(queued.len(), 1, "{before:?}");

    let asked = Instant::now();
    world.create_pod(&owner, pod("train", "sxm-x8", None)).await;
    world.holds(&owner, 8, Duration::from_secs(30)).await;
    let restored = asked.elapsed();
    // The claim is allocated a moment before the Pod is bound.
    let low_node = low_pod.spec.and_then(|s| s.node_name);
    let train = Api::<Pod>::namespaced(world.client.clone(), &owner);
    eventually(
        "train bound where the low-priority Pods ran",
        CONVERGE,
        || async {
            let p = train.get("train").await.map_err(|e| e.to_string())?;
            match p.spec.and_then(|s| s.node_name) {
                Some(node) if Some(&node) == low_node.as_ref() => Ok(()),
                other => Err(format!("on {other:?}")),
            }
        },
    )
    .await;
    // The queued Pod is gone and told why; the 6 low-priority Pods went; the 18 others run.
    let after = world.pods(&borrower).await;
    let gone: BTreeSet<String> = before.difference(&after).map(|(n, _)| n.clone()).collect();
    let mut expected: BTreeSet<String> = (0..6).map(|i| format!("low-gpu-a-03-{i}")).collect();
    expected.extend(queued.iter().map(|(n, _)| n.clone()));
    assert_eq!(gone, expected);
    let note = "sweep (1 Pod, waiting for 8 devices of sxm, priority teamgpu-e2e-high (1000)) \
                before it starts: borrower is charged for it beyond its guarantee while owner \
                needs devices back";
    world.told(&borrower, "Dequeued", &[note]).await;
    // Its Job makes the Pod again, and quota refuses its claim: the borrower holds 18 and is
    // lent the 6 idle devices (32 - 8 - 18), 24 in all, 2 short of the 8-GPU claim.
    world.holds(&borrower, 18, CONVERGE).await;
    world.quota_reads(&borrower, "24", "18").await;
    eprintln!("owner's 8-GPU Pod bound {restored:?} after asking (3 s grace)");
}

/// As above, but the Job queued for a node is a third team's, guaranteed none (limit 8), that
/// was lent the owner's unused 8 before the owner asked. It holds its guarantee (none), so
/// reclaim asks nothing of it, yet every device its Job is charged is borrowed and the
/// scheduler would give the Job the node reclaim empties. It is removed with the evictions
/// (`Dequeued`), and the owner's Pod is bound where the low-priority Pods ran.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_queued_by_a_team_at_its_guarantee_does_not_take_the_room_reclaim_makes() {
    let Some((world, owner, borrower)) = scattered().await else {
        return;
    };
    let queued = (world.team("queued", json!({"guaranteed": 0, "limit": 8}), json!({}))).await;
    world
        .create_job(&queued, job("big", 1, "sxm-x8", None))
        .await;
    world.quota_reads(&queued, "8", "8").await;
    let low_node = (world.pod_named(&borrower, "low-gpu-a-03-0").await)
        .spec
        .and_then(|s| s.node_name);

    let (bound, train_node) = train_on_a_whole_node(&world, &owner).await;
    assert_eq!(
        Some(train_node),
        low_node,
        "train bound where the low-priority Pods ran"
    );
    world
        .told(&queued, "Dequeued", &["big (1 Pod", "owner"])
        .await;
    world.holds(&borrower, 18, CONVERGE).await;
    eprintln!("owner's 8-GPU Pod bound {bound:?} after asking (3 s grace)");
}

/// An owner 2 devices below its guarantee whose next Pod asks for 4, while a borrower holds 2
/// devices of the guarantees beyond its own: 4 devices are idle (the guarantee of a team that
/// uses none), 4 of them on one node. Lending nothing while an owner waits kept the owner's
/// quota at its guarantee, so quota refused its 4-GPU claim for as long as the borrower
/// borrowed, beside the idle devices. It borrows the 2 beyond its guarantee that its Pod
/// needs, and the Pod is bound; nothing is evicted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_whose_next_pod_is_larger_than_what_it_lacks_borrows_the_rest_from_idle_devices() {
    let Some(world) = World::new().await else {
        return;
    };
    let owner = (world.team(
        "owner",
        json!({"guaranteed": 8, "limit": 12, "weight": 1}),
        json!({"enabled": true, "gracePeriodSeconds": 3}),
    ))
    .await;
    // The borrower's weight takes every idle device lent by weight while nobody waits.
    let borrower = (world.team(
        "borrower",
        json!({"guaranteed": 4, "limit": 12, "weight": 1000}),
        json!({}),
    ))
    .await;
    world
        .team("idle", json!({"guaranteed": 4, "limit": 4}), json!({}))
        .await;
    let pinned = world.pinned().await;
    let x2 = format!("{POLICY}-x2");
    // The owner's 6 and 2 of the borrower's fill gpu-b-01; the borrower's other 4 are on
    // gpu-b-02, which has 4 free.
    for i in 0..3 {
        let p = pinned(&format!("serve-{i}"), &x2, "gpu-b-01");
        world.create_pod(&owner, p).await;
    }
    world.holds(&owner, 6, CONVERGE).await;
    for (i, pool) in ["gpu-b-01", "gpu-b-02", "gpu-b-02"].iter().enumerate() {
        let p = pinned(&format!("job-{i}"), &x2, pool);
        world.create_pod(&borrower, p).await;
    }
    world.holds(&borrower, 6, CONVERGE).await;

    let asked = Instant::now();
    let x4 = format!("{POLICY}-x4");
    world.create_pod(&owner, pod("train", &x4, None)).await;
    world.holds(&owner, 10, Duration::from_secs(30)).await;
    let served = asked.elapsed();
    let quotas =
        Api::<k8s_openapi::api::core::v1::ResourceQuota>::namespaced(world.client.clone(), &owner);
    let hard = quotas
        .get("teamgpu")
        .await
        .unwrap()
        .spec
        .unwrap()
        .hard
        .unwrap();
    assert_eq!(
        hard.get("pcie.teamgpu.io.deviceclass.resource.k8s.io/devices")
            .map(|q| q.0.as_str()),
        Some("10"),
        "{hard:?}"
    );
    assert_eq!(world.pods(&borrower).await.len(), 3, "nothing evicted");
    world.holds(&borrower, 6, CONVERGE).await;
    eprintln!("owner's 4-GPU Pod holds its devices {served:?} after asking");
}

/// The same owner, 2 devices below its guarantee with a Pod of 4 waiting, but nothing idle:
/// the borrower holds 4 devices beyond its guarantee in Pods of 2. Counting, reclaim owed the
/// owner 2 and evicted one Pod, whose 2 devices the owner could not use, and the owner stayed
/// at 6 for as long as the borrower borrowed. Room is made for its claim: two of the
/// borrower's Pods on one node go, and the owner's Pod is bound there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_whose_next_pod_is_larger_than_what_it_lacks_gets_room_for_it_back() {
    let Some(world) = World::new().await else {
        return;
    };
    let owner = (world.team(
        "owner",
        json!({"guaranteed": 8, "limit": 12}),
        json!({"enabled": true, "gracePeriodSeconds": 3, "minRuntimeSeconds": 0}),
    ))
    .await;
    let borrower = (world.team("borrower", json!({"guaranteed": 4, "limit": 12}), json!({}))).await;
    let idle = (world.team("idle", json!({"guaranteed": 4, "limit": 4}), json!({}))).await;
    let pinned = world.pinned().await;
    let x2 = format!("{POLICY}-x2");
    // gpu-b-01: the owner's 6 and 2 of the third team's; gpu-b-02: the borrower's 8.
    for i in 0..3 {
        let p = pinned(&format!("serve-{i}"), &x2, "gpu-b-01");
        world.create_pod(&owner, p).await;
    }
    world
        .create_pod(&idle, pinned("etl", &x2, "gpu-b-01"))
        .await;
    world.holds(&owner, 6, CONVERGE).await;
    world.holds(&idle, 2, CONVERGE).await;
    for i in 0..4 {
        let p = pinned(&format!("job-{i}"), &x2, "gpu-b-02");
        world.create_pod(&borrower, p).await;
    }
    world.holds(&borrower, 8, CONVERGE).await;

    let asked = Instant::now();
    let x4 = format!("{POLICY}-x4");
    world.create_pod(&owner, pod("train", &x4, None)).await;
    world.holds(&owner, 10, Duration::from_secs(40)).await;
    let served = asked.elapsed();
    // Two of the borrower's Pods went (4 devices on gpu-b-02), never below its guarantee.
    assert_eq!(world.pods(&borrower).await.len(), 2);
    world.holds(&borrower, 4, CONVERGE).await;
    world.holds(&idle, 2, CONVERGE).await;
    eprintln!("owner's 4-GPU Pod holds its devices {served:?} after asking (3 s grace)");
}

/// An owner below its guarantee whose 4-GPU claim fits no node: its quota admitted the claim,
/// but the 4 free devices are 2 on each node, and nobody borrows (the other team holds its own
/// guarantee), so no reclaim can make room. Counted by charge nothing was idle: the claim held
/// the owner's quota at its guarantee, and quota refused the owner's next 2-GPU Pod for as
/// long as the claim waited, beside the free devices. The owner's other Pods may use what a
/// claim of its own that fits no node is charged, within its guarantee, so its 2-GPU Pod is
/// bound; another team's waiting Pod gets none of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_that_fits_no_node_does_not_keep_its_teams_next_pod_waiting() {
    let Some(world) = World::new().await else {
        return;
    };
    let owner = (world.team("owner", json!({"guaranteed": 8, "limit": 12}), json!({}))).await;
    let other = (world.team("other", json!({"guaranteed": 8, "limit": 16}), json!({}))).await;
    let pinned = world.pinned().await;
    let x2 = format!("{POLICY}-x2");
    // Each node: 2 of the owner's and 4 of the other team's, 2 free.
    for node in ["gpu-b-01", "gpu-b-02"] {
        world
            .create_pod(&owner, pinned(&format!("serve-{node}"), &x2, node))
            .await;
        for i in 0..2 {
            let p = pinned(&format!("etl-{node}-{i}"), &x2, node);
            world.create_pod(&other, p).await;
        }
    }
    world.holds(&owner, 4, CONVERGE).await;
    world.holds(&other, 8, CONVERGE).await;
    let x4 = format!("{POLICY}-x4");
    world.create_pod(&owner, pod("train", &x4, None)).await;
    let claims = Api::<ResourceClaim>::namespaced(world.client.clone(), &owner);
    eventually("the 4-GPU claim is made", CONVERGE, || async {
        let list = claims.list(&ListParams::default()).await;
        let n = list.map_err(|e| e.to_string())?.items.len();
        if n == 3 {
            Ok(())
        } else {
            Err(format!("{n} claims"))
        }
    })
    .await;

    // The other team, at its guarantee, may borrow up to 16 (it was lent the owner's unused 4
    // before the owner's claim was made): its 2-GPU Pod waits too.
    world.quota_reads(&other, "8", "8").await;
    world.create_pod(&other, pod("eval", &x2, None)).await;
    let asked = Instant::now();
    world.create_pod(&owner, pod("eval", &x2, None)).await;
    world.holds(&owner, 6, Duration::from_secs(30)).await;
    let served = asked.elapsed();
    // What it holds (6, of its 8 guaranteed) and what its waiting claim is charged (4): 2 of
    // them reused by the 2-GPU Pod while that claim fits no node. The 4-GPU claim still
    // waits, charged: 4 + 2 allocated, 4 waiting. (The quota settles there a moment after the
    // Pod is bound: while the 2-GPU Pod still waited it had room for it.)
    world.quota_reads(&owner, "10", "10").await;
    // The devices that claim is charged are the owner's: the other team borrows none of them,
    // and its 2-GPU Pod makes no claim. (Lent to it, its Pod would fill the free devices of a
    // node that the owner's 4-GPU claim needs.)
    world.quota_reads(&other, "8", "8").await;
    world.holds(&other, 8, CONVERGE).await;
    let other_claims = Api::<ResourceClaim>::namespaced(world.client.clone(), &other);
    let made = other_claims.list(&ListParams::default()).await.unwrap();
    let owners: Vec<String> = (made.items.iter())
        .flat_map(|c| c.owner_references().iter().map(|o| o.name.clone()))
        .collect();
    assert!(
        owners.len() == 4 && !owners.contains(&"eval".to_owned()),
        "the other team's claims are its 4 pinned Pods': {owners:?}"
    );
    eprintln!("owner's 2-GPU Pod holds its devices {served:?} after asking");
}

/// The other team (guaranteed 24, its limit) holding 22: gpu-a-02 and gpu-a-03 whole, 5 of
/// gpu-a-04, and a 1-GPU Job `small` alone on gpu-a-01. 7 devices are free on gpu-a-01, 3 on
/// gpu-a-04: no node has room for 8, but the Job fits gpu-a-04. Returns the other team's
/// namespace, its Pods and the Job's node.
async fn a_small_job_alone_on_a_node(world: &World) -> (String, Api<Pod>, String) {
    let other = (world.team("other", json!({"guaranteed": 24, "limit": 24}), json!({}))).await;
    let pinned = world.pinned().await;
    // gpu-a-02 and gpu-a-03 full, gpu-a-04 full for now: the Job can only go to gpu-a-01.
    for node in ["gpu-a-02", "gpu-a-03"] {
        let p = pinned(&format!("full-{node}"), "sxm-x8", node);
        world.create_pod(&other, p).await;
    }
    for i in 0..8 {
        let p = pinned(&format!("part-gpu-a-04-{i}"), "sxm", "gpu-a-04");
        world.create_pod(&other, p).await;
    }
    world.holds(&other, 24, Duration::from_secs(60)).await;
    let pods = Api::<Pod>::namespaced(world.client.clone(), &other);
    pods.delete("part-gpu-a-04-7", &DeleteParams::default())
        .await
        .unwrap();
    world.holds(&other, 23, CONVERGE).await;
    world.create_job(&other, job("small", 1, "sxm", None)).await;
    world.holds(&other, 24, CONVERGE).await;
    // Now 2 free on gpu-a-04 (the Job's next home), 7 on gpu-a-01 beside the Job.
    for i in 5..7 {
        let name = format!("part-gpu-a-04-{i}");
        pods.delete(&name, &DeleteParams::default()).await.unwrap();
    }
    world.holds(&other, 22, CONVERGE).await;
    let node = small_jobs_node(&pods)
        .await
        .expect("the Job's Pod on a node");
    (other, pods, node)
}

/// Issue 22's fragmentation with nobody borrowing (the replay, seed 22: 23 devices free, no team
/// above its guarantee, an 8-GPU Pod waiting 18 s): the other team, within its guarantee, has a
/// 1-GPU Job alone on one node and full or nearly full nodes elsewhere, so the owner's 8-GPU
/// claim, within its guarantee, fits no node and there is no borrower to take from. After the
/// owner's grace period the Job's Pod is moved: evicted (`Moved`), the owner's Pod is bound on
/// the node it left, and the Job's Pod made again runs on another node; the other team holds
/// what it held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_job_moves_to_another_node_so_that_an_eight_gpu_claim_fits() {
    let Some((world, owner)) = whole_nodes_and_an_owner().await else {
        return;
    };
    let (other, pods, first_node) = a_small_job_alone_on_a_node(&world).await;

    let (bound, train_node) = train_on_a_whole_node(&world, &owner).await;
    assert_eq!(
        train_node, first_node,
        "the owner's Pod is bound on the node the Job left"
    );
    let about = "owner waits, within its guarantee, for 8 devices in claims";
    world.told(&other, "Moved", &["Job ", about]).await;
    // The Job controller makes its Pod again (after its failure backoff, 10 s) and it runs on
    // another node: the other team holds its 22 again, nothing else of it was evicted.
    world.holds(&other, 22, Duration::from_secs(60)).await;
    let now = world.pods(&other).await;
    let second_node = small_jobs_node(&pods)
        .await
        .expect("the Job's Pod made again, on a node");
    assert_ne!(second_node, first_node);
    assert_eq!(now.len(), 2 + 5 + 1, "{now:?}");
    eprintln!("owner's 8-GPU Pod bound {bound:?} after asking (3 s grace)");
}

/// A move's room is not taken by a team that holds its guarantee. As in the move above, and a
/// third team, guaranteed none (limit 8), was lent 8 idle devices before the owner asked: its
/// 1-Pod 8-GPU Job's claim is charged and fits no node. Holding its guarantee (none), it
/// borrows all 8; the scheduler would give it the node the move empties as readily as the
/// owner's Pod. The move removes the queued Job with it (`Dequeued`), and the owner's Pod is
/// bound on the node the small Job left. Until moves removed the queued workloads of a team at
/// exactly its guarantee (not only above it), the Job stayed and raced the owner for the node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_team_at_its_guarantee_with_a_job_queued_for_a_node_does_not_take_a_moves_room() {
    let Some((world, owner)) = whole_nodes_and_an_owner().await else {
        return;
    };
    let (_, _, first_node) = a_small_job_alone_on_a_node(&world).await;
    let queued = (world.team("queued", json!({"guaranteed": 0, "limit": 8}), json!({}))).await;
    world
        .create_job(&queued, job("big", 1, "sxm-x8", None))
        .await;
    world.quota_reads(&queued, "8", "8").await;

    let (bound, train_node) = train_on_a_whole_node(&world, &owner).await;
    assert_eq!(
        train_node, first_node,
        "the owner's Pod is bound on the node the small Job left"
    );
    world
        .told(&queued, "Dequeued", &["big (1 Pod", "owner"])
        .await;
    // Its Pod made again waits without a claim: the team is lent the 2 idle devices (32 - 8 -
    // 22), not the 8 it asks for.
    world.quota_reads(&queued, "2", "0").await;
    eprintln!("owner's 8-GPU Pod bound {bound:?} after asking (3 s grace)");
}

/// Reclaim and a move together. The owner (guaranteed 8) asks for an 8-GPU claim. The
/// borrower holds 6 above its guarantee: six 1-GPU Pods on gpu-a-01 and a whole node, but its
/// 6 on gpu-a-01 share the node with a 1-GPU Job of another team within its guarantee (and 1
/// free), so taking the borrower's back alone clears no node (what reclaim did before: nothing,
/// and `ReclaimBlocked`). After the grace period the borrower's six are taken back
/// (`Reclaimed`), the Job is moved (`Moved`) to the free device of gpu-a-04, and the owner's Pod
/// is bound on gpu-a-01.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_borrowers_pods_taken_back_and_a_small_job_moved_clear_a_node_for_an_eight_gpu_claim() {
    let Some((world, owner)) = whole_nodes_and_an_owner().await else {
        return;
    };
    let borrower = (world.team("borrower", json!({"guaranteed": 8, "limit": 24}), json!({}))).await;
    let other = (world.team("other", json!({"guaranteed": 16, "limit": 16}), json!({}))).await;
    let pinned = world.pinned().await;
    let node_of = |pool: &str| {
        let p = pinned("probe", "sxm", pool);
        let selector = p.spec.and_then(|s| s.node_selector).unwrap_or_default();
        selector["kubernetes.io/hostname"].clone()
    };
    // gpu-a-02 the borrower's, gpu-a-03 the other team's; gpu-a-04: 7 of the other team and a
    // placeholder of the borrower; gpu-a-01: 7 of the borrower. The Job can only go to gpu-a-01.
    world
        .create_pod(&borrower, pinned("full-gpu-a-02", "sxm-x8", "gpu-a-02"))
        .await;
    world
        .create_pod(&other, pinned("full-gpu-a-03", "sxm-x8", "gpu-a-03"))
        .await;
    for i in 0..7 {
        let p = pinned(&format!("part-gpu-a-04-{i}"), "sxm", "gpu-a-04");
        world.create_pod(&other, p).await;
        let p = pinned(&format!("part-gpu-a-01-{i}"), "sxm", "gpu-a-01");
        world.create_pod(&borrower, p).await;
    }
    (world.create_pod(&borrower, pinned("placeholder", "sxm", "gpu-a-04"))).await;
    world.holds(&other, 15, Duration::from_secs(60)).await;
    world.holds(&borrower, 16, Duration::from_secs(60)).await;
    world.create_job(&other, job("small", 1, "sxm", None)).await;
    world.holds(&other, 16, CONVERGE).await;
    let borrower_pods = Api::<Pod>::namespaced(world.client.clone(), &borrower);
    for name in ["placeholder", "part-gpu-a-01-6"] {
        borrower_pods
            .delete(name, &DeleteParams::default())
            .await
            .unwrap();
    }
    // Now 1 free on gpu-a-01 (beside the borrower's six and the Job) and 1 on gpu-a-04.
    world.holds(&borrower, 14, CONVERGE).await;

    let (bound, train_node) = train_on_a_whole_node(&world, &owner).await;
    assert_eq!(
        train_node,
        node_of("gpu-a-01"),
        "the owner's Pod is bound on the node cleared for it"
    );
    for (namespace, reason, what) in [(&other, "Moved", "Job "), (&borrower, "Reclaimed", "Pod ")] {
        world.told(namespace, reason, &[what, "owner"]).await;
    }
    // The borrower is back at its guarantee (its bare Pods are not made again); the Job's Pod
    // made again runs on gpu-a-04, and the other team holds its 16 again.
    world.holds(&borrower, 8, CONVERGE).await;
    world.holds(&other, 16, Duration::from_secs(60)).await;
    let pods = Api::<Pod>::namespaced(world.client.clone(), &other);
    assert_eq!(small_jobs_node(&pods).await, Some(node_of("gpu-a-04")));
    eprintln!("owner's 8-GPU Pod bound {bound:?} after asking (3 s grace)");
}

/// An operator that stopped after suspending a Job for reclaim and before resuming it resumes
/// it when it starts again (the label says which Jobs are its to resume); a Job someone else
/// suspended stays suspended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_left_suspended_by_an_operator_that_stopped_is_resumed_when_it_starts_again() {
    let Some((sandbox, operator_config)) = Sandbox::with_example_devices().await else {
        return;
    };
    let client = sandbox.client();
    let ns = sandbox.namespace("left", None).await.unwrap();
    let jobs: Api<Job> = Api::namespaced(client.clone(), &ns);
    for (name, labels) in [
        ("train", json!({"teamgpu.io/suspended": "reclaim"})),
        ("held", json!({})),
    ] {
        let job: Job = serde_json::from_value(json!({
            "apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": name, "labels": labels},
            "spec": {"suspend": true, "parallelism": 1, "completions": 1,
                     "template": {"spec": {"restartPolicy": "Never",
                         "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10"}]}}}}))
        .unwrap();
        jobs.create(&PostParams::default(), &job).await.unwrap();
    }
    // The job controller has acted on both.
    for name in ["train", "held"] {
        eventually(&format!("{name} suspended"), CONVERGE, || async {
            let job = jobs.get(name).await.map_err(|e| e.to_string())?;
            let conditions = job.status.and_then(|s| s.conditions).unwrap_or_default();
            match conditions
                .iter()
                .any(|c| c.type_ == "Suspended" && c.status == "True")
            {
                true => Ok(()),
                false => Err(format!("{conditions:?}")),
            }
        })
        .await;
    }
    let (operator_client, _) = teamgpu_e2e::cluster::recorded(operator_config);
    let _operator = Operator::start(operator_client, Operator::test_config());
    eventually("train resumed", CONVERGE, || async {
        let job = jobs.get("train").await.map_err(|e| e.to_string())?;
        let suspended = job.spec.as_ref().and_then(|s| s.suspend);
        let labelled = job.labels().contains_key("teamgpu.io/suspended");
        let active = job.status.as_ref().and_then(|s| s.active).unwrap_or(0);
        match (suspended, labelled, active) {
            (Some(false), false, 1) => Ok(()),
            state => Err(format!("suspend, labelled, active: {state:?}")),
        }
    })
    .await;
    let held = jobs.get("held").await.unwrap();
    assert_eq!(held.spec.and_then(|s| s.suspend), Some(true));
}
