//! End-to-end scenarios: the real operator (`teamgpu::controller::run`, as its own
//! ServiceAccount with the RBAC of `config/rbac`) against a real Kubernetes control plane: the
//! one `TEAMGPU_E2E_ASSETS` starts, or the throwaway cluster of `TEAMGPU_E2E_KUBECONFIG` (see
//! `teamgpu_e2e::sandbox`). Each asserts what a user would check with kubectl; expected values
//! are written here or read from the server, never computed by teamgpu's own planning code.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicy;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Namespace, Pod, ResourceQuota};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceClaimTemplate};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use teamgpu::api::{GpuSharingPolicy, TeamGpuPolicy};
use teamgpu::core::plan::outside_teams::GUARD_LABEL;
use teamgpu_e2e::cluster::OPERATOR_NAMESPACE;
use teamgpu_e2e::fixtures::{fresh, gpu_pod, samples};
use teamgpu_e2e::operator::Operator;
use teamgpu_e2e::recording::Counters;
use teamgpu_e2e::sandbox::{Sandbox, TEAM_LABEL};
use teamgpu_e2e::{TestCluster, eventually};

mod counters;
mod department_sharing;
mod departments;
mod fill;
mod operations;
mod policies;
mod restarts;
mod sharing;
mod slices;
mod taints;
mod tenancy;

/// A cluster with the NVIDIA driver's DeviceClasses, six 8-GPU nodes and the namespaces of the
/// built-in example, in a [`Sandbox`]: the namespaces have names of their own (`world.ns(name)`;
/// the helpers below take the example's names and map them), and everything is cleaned up
/// before and after the scenario.
struct World {
    sandbox: Sandbox,
    /// The test's own client: the cluster's admin.
    client: Client,
    /// The operator's: its ServiceAccount.
    operator: kube::Config,
}

impl World {
    /// None when no control plane is configured (the scenario is skipped).
    async fn new() -> Option<World> {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_from_default_env()
                    .unwrap_or_else(|_| "warn,kube_client::client::builder=off".into()),
            )
            .with_test_writer()
            .try_init();
        let (sandbox, operator) = Sandbox::with_example_devices().await?;
        let example = teamgpu::cli::example::state().unwrap();
        let world = World {
            client: sandbox.client(),
            operator,
            sandbox,
        };
        for ns in &example.namespaces {
            world
                .namespace(&ns.name, ns.labels.get(TEAM_LABEL).map(String::as_str))
                .await;
        }
        Some(world)
    }

    /// A client that is the operator's ServiceAccount, its requests counted.
    fn operator_client(&self) -> (Client, Arc<Counters>) {
        teamgpu_e2e::cluster::recorded(self.operator.clone())
    }

    fn cluster(&self) -> &TestCluster {
        self.sandbox.cluster()
    }

    /// The actual name of the example's (or the scenario's) namespace `name`.
    fn ns(&self, name: &str) -> String {
        self.sandbox.ns(name)
    }

    async fn namespace(&self, name: &str, team: Option<&str>) {
        self.sandbox.namespace(name, team).await.unwrap();
    }

    async fn install_samples(&self) {
        let (sharing, teams) = samples();
        for p in &sharing {
            Api::<GpuSharingPolicy>::all(self.client.clone())
                .create(&PostParams::default(), &fresh(p))
                .await
                .unwrap();
        }
        for t in &teams {
            // Namespaces named explicitly (inference's `inference-prod`) are this world's.
            let mut t = fresh(t);
            t.spec.namespaces = t.spec.namespaces.iter().map(|n| self.ns(n)).collect();
            Api::<TeamGpuPolicy>::all(self.client.clone())
                .create(&PostParams::default(), &t)
                .await
                .unwrap();
        }
    }

    /// The samples installed and converged, with the operator running.
    async fn with_samples() -> Option<(World, Operator)> {
        let world = World::new().await?;
        let operator = world.operator();
        world.install_samples().await;
        world.converged().await;
        // The one namespace of the samples outside every team: its quota of 0 in force.
        world.guarded("web").await;
        Some((world, operator))
    }

    /// The admin client impersonating `user` (in `system:authenticated` and `groups`).
    fn as_user(&self, user: &str, groups: &[&str]) -> Client {
        self.cluster().as_user(user, groups)
    }

    fn operator(&self) -> Operator {
        Operator::start(self.operator_client().0, self.config())
    }

    /// The scenarios' operator configuration: its Lease, when it elects a leader, in the
    /// operator's namespace (where `config/rbac` lets it write Leases), named for this world.
    fn config(&self) -> teamgpu::controller::Config {
        teamgpu::controller::Config {
            lease_namespace: OPERATOR_NAMESPACE.into(),
            lease_name: self.ns("teamgpu-leader"),
            ..Operator::test_config()
        }
    }

    async fn quota_hard(&self, ns: &str) -> Result<BTreeMap<String, String>, String> {
        let ns = &self.ns(ns);
        let q = Api::<ResourceQuota>::namespaced(self.client.clone(), ns)
            .get_opt("teamgpu")
            .await
            .map_err(|e| e.to_string())?;
        let q = q.ok_or_else(|| format!("no quota in {ns}"))?;
        Ok(q.spec
            .and_then(|s| s.hard)
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| (k, v.0))
            .collect())
    }

    /// Waits until `ns`'s quota holds `want` devices of `class`.
    async fn hard_is(&self, ns: &str, class: &str, want: &str) {
        let key = format!("{class}.teamgpu.io.deviceclass.resource.k8s.io/devices");
        eventually(&format!("{ns}: {key} = {want}"), CONVERGE, || async {
            let hard = self.quota_hard(ns).await?;
            match hard.get(&key) {
                Some(v) if v == want => Ok(()),
                other => Err(format!("{other:?}")),
            }
        })
        .await;
    }

    /// How many of `ns`'s claims are allocated.
    async fn allocated(&self, ns: &str) -> Result<usize, String> {
        let claims: Api<ResourceClaim> = Api::namespaced(self.client.clone(), &self.ns(ns));
        let list = (claims.list(&Default::default()).await).map_err(|e| e.to_string())?;
        Ok((list.items.iter())
            .filter(|c| c.status.as_ref().is_some_and(|s| s.allocation.is_some()))
            .count())
    }

    /// Waits until `devices` of `ns`'s claims are allocated.
    async fn allocated_in(&self, ns: &str, devices: usize) {
        let what = format!("{devices} allocated in {ns}");
        eventually(&what, Duration::from_secs(60), || async {
            match self.allocated(ns).await? {
                n if n == devices => Ok(()),
                n => Err(format!("{n}")),
            }
        })
        .await;
    }

    async fn templates(&self, ns: &str) -> Vec<String> {
        let list = Api::<ResourceClaimTemplate>::namespaced(self.client.clone(), &self.ns(ns))
            .list(&Default::default())
            .await
            .unwrap();
        let mut names: Vec<_> = list.items.iter().map(|t| t.name_any()).collect();
        names.sort();
        names
    }
}

fn condition<'a>(
    conds: &'a [k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition],
    t: &str,
) -> Option<&'a k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    conds.iter().find(|c| c.type_ == t)
}

const CONVERGE: Duration = Duration::from_secs(20);

impl World {
    /// Waits until `ns` (the example's name) carries the guard label of a namespace outside
    /// every team: its quota of 0 is in force.
    async fn guarded(&self, ns: &str) {
        let api: Api<Namespace> = Api::all(self.client.clone());
        let name = self.ns(ns);
        eventually(&format!("{ns} guarded"), CONVERGE, || async {
            let namespace = api.get(&name).await.map_err(|e| e.to_string())?;
            match namespace.labels().get(GUARD_LABEL) {
                Some(_) => Ok(()),
                None => Err(format!("{:?}", namespace.labels())),
            }
        })
        .await;
    }

    async fn converged(&self) {
        // The sample teams' namespaces all have their quota.
        for ns in [
            "ml-research-dev",
            "ml-research-train",
            "inference-prod",
            "inference-canary",
            "data-science",
        ] {
            eventually(&format!("quota in {ns}"), CONVERGE, || self.quota_hard(ns)).await;
        }
        eventually("templates in ml-research-dev", CONVERGE, || async {
            let t = self.templates("ml-research-dev").await;
            if t.len() == 5 {
                Ok(())
            } else {
                Err(format!("{t:?}"))
            }
        })
        .await;
        // Statuses are written last in a pass: once they are in, the pass is complete.
        for team in ["ml-research", "inference", "data-science"] {
            eventually(&format!("{team} status"), CONVERGE, || async {
                let s = self.team_status(team).await?;
                let ready = condition(&s.conditions, "Ready").is_some_and(|c| c.status == "True");
                if ready && s.quotas.iter().all(|q| q.capacity > 0) {
                    Ok(())
                } else {
                    Err(format!("{s:?}"))
                }
            })
            .await;
        }
        let gsp: Api<GpuSharingPolicy> = Api::all(self.client.clone());
        for name in ["a100-80gb", "a100-shared"] {
            eventually(&format!("{name} status"), CONVERGE, || async {
                let p = gsp.get(name).await.map_err(|e| e.to_string())?;
                let ready = p.status.as_ref().is_some_and(|s| {
                    condition(&s.conditions, "Ready").is_some_and(|c| c.status == "True")
                });
                if ready {
                    Ok(())
                } else {
                    Err(format!("{:?}", p.status))
                }
            })
            .await;
        }
    }

    /// Creates GpuSharingPolicy `name` with `spec`.
    async fn sharing_policy(&self, name: &str, spec: serde_json::Value) {
        let policy: GpuSharingPolicy = serde_json::from_value(json!({
            "apiVersion": "teamgpu.io/v1alpha1", "kind": "GpuSharingPolicy",
            "metadata": {"name": name}, "spec": spec}))
        .unwrap();
        Api::<GpuSharingPolicy>::all(self.client.clone())
            .create(&PostParams::default(), &policy)
            .await
            .unwrap();
    }

    /// A namespace `name` of this world and a TeamGpuPolicy `name` owning it, with `spec`
    /// (its `namespaces` set to that one).
    async fn create_team(&self, name: &str, mut spec: serde_json::Value) {
        self.namespace(name, None).await;
        spec["namespaces"] = json!([self.ns(name)]);
        let team: TeamGpuPolicy = serde_json::from_value(json!({
            "apiVersion": "teamgpu.io/v1alpha1", "kind": "TeamGpuPolicy",
            "metadata": {"name": name}, "spec": spec}))
        .unwrap();
        Api::<TeamGpuPolicy>::all(self.client.clone())
            .create(&PostParams::default(), &team)
            .await
            .unwrap();
    }

    /// Merges `spec` into TeamGpuPolicy `name`'s spec (a list replaces the list).
    async fn edit_team(&self, name: &str, spec: serde_json::Value) {
        Api::<TeamGpuPolicy>::all(self.client.clone())
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(&json!({"spec": spec})),
            )
            .await
            .unwrap();
    }

    /// A GpuSharingPolicy `pcie` of the 16 PCIe GPUs, and per (name, quota, reclaim) a team
    /// owning a namespace of that name with that quota of `pcie`.
    async fn pcie_teams<const N: usize>(
        &self,
        teams: [(&str, serde_json::Value, serde_json::Value); N],
    ) {
        self.pcie_policy().await;
        for (name, mut quota, reclaim) in teams {
            quota["sharingPolicy"] = json!("pcie");
            let spec = json!({"quotas": [quota], "reclaim": reclaim});
            self.create_team(name, spec).await;
        }
    }

    /// A GpuSharingPolicy `pcie` of the 16 PCIe GPUs.
    async fn pcie_policy(&self) {
        self.sharing_policy(
            "pcie",
            json!({"selector": {"productNames": ["NVIDIA A100-PCIE-40GB"]}}),
        )
        .await;
    }

    /// The reclaim scenarios' teams on the 16 PCIe GPUs: "owner" is guaranteed 8 (limit 8) and
    /// reclaims at once; "borrower" is guaranteed 4 and may borrow up to 16.
    async fn owner_and_borrower(&self) {
        self.pcie_teams([
            (
                "owner",
                json!({"guaranteed": 8, "limit": 8}),
                json!({"enabled": true, "gracePeriodSeconds": 0}),
            ),
            (
                "borrower",
                json!({"guaranteed": 4, "limit": 16}),
                json!({"enabled": false}),
            ),
        ])
        .await;
    }

    async fn team_status(&self, name: &str) -> Result<teamgpu::api::TeamGpuPolicyStatus, String> {
        let t = Api::<TeamGpuPolicy>::all(self.client.clone())
            .get(name)
            .await
            .map_err(|e| e.to_string())?;
        t.status.ok_or_else(|| "no status".to_owned())
    }

    /// What `team`'s status says of its quota for `sharing_policy`.
    async fn quota_status(
        &self,
        team: &str,
        sharing_policy: &str,
    ) -> Result<teamgpu::api::QuotaStatus, String> {
        let status = self.team_status(team).await?;
        status
            .quotas
            .into_iter()
            .find(|q| q.sharing_policy == sharing_policy)
            .ok_or_else(|| format!("no {sharing_policy} quota in {team}'s status"))
    }

    async fn label(&self, ns: &str, team: Option<&str>) {
        let patch = json!({"metadata": {"labels": {TEAM_LABEL: team}}});
        Api::<Namespace>::all(self.client.clone())
            .patch(&self.ns(ns), &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap();
    }

    /// Whether the non-team admission policy leaves `ns` to the team policy: its match condition
    /// lists the team namespaces.
    async fn admitted_as_team_namespace(&self, ns: &str) -> bool {
        let api: Api<ValidatingAdmissionPolicy> = Api::all(self.client.clone());
        let Some(policy) = api.get_opt("teamgpu-non-team-requests").await.unwrap() else {
            return false;
        };
        policy
            .spec
            .and_then(|s| s.match_conditions)
            .unwrap_or_default()
            .iter()
            .any(|c| {
                c.name == "outside-every-team"
                    && c.expression.contains(&format!("'{}'", self.ns(ns)))
            })
    }

    /// Every teamgpu-labelled object, by kind/namespace/name.
    async fn owned_objects(&self) -> Result<Vec<String>, String> {
        let lp = kube::api::ListParams::default().labels("app.kubernetes.io/managed-by=teamgpu");
        let mut out = Vec::new();
        for kind in teamgpu::core::diff::Kind::ALL {
            let api: Api<kube::api::DynamicObject> =
                Api::all_with(self.client.clone(), &kind.api_resource());
            for o in api.list(&lp).await.map_err(|e| e.to_string())?.items {
                out.push(format!(
                    "{}/{}/{}",
                    kind.label(),
                    o.namespace().unwrap_or_default(),
                    o.name_any()
                ));
            }
        }
        out.sort();
        Ok(out)
    }

    /// The namespaces the server lists that are in no sample team, not exempt and not being
    /// deleted: each gets a quota of 0 and, once it is counted, the guard label.
    async fn outside_sample_teams(&self) -> Vec<Namespace> {
        let teams = [
            "ml-research-dev",
            "ml-research-train",
            "inference-prod",
            "inference-canary",
            "data-science",
        ]
        .map(|ns| self.ns(ns));
        let namespaces = Api::<Namespace>::all(self.client.clone())
            .list(&Default::default())
            .await
            .unwrap();
        (namespaces.items.into_iter())
            .filter(|ns| {
                let exempt =
                    ns.labels().get("teamgpu.io/exempt").map(String::as_str) == Some("true");
                !teams.contains(&ns.name_any())
                    && !exempt
                    && ns.metadata.deletion_timestamp.is_none()
            })
            .collect()
    }

    /// Waits until every namespace outside the sample teams carries the guard label: its quota
    /// of 0 counted by kube-controller-manager, which can come well after the rest converged.
    async fn all_guarded(&self) {
        eventually(
            "every namespace outside teams guarded",
            CONVERGE,
            || async {
                let unguarded: Vec<String> = (self.outside_sample_teams().await.iter())
                    .filter(|ns| !ns.labels().contains_key(GUARD_LABEL))
                    .map(ResourceExt::name_any)
                    .collect();
                if unguarded.is_empty() {
                    Ok(())
                } else {
                    Err(format!("not guarded: {unguarded:?}"))
                }
            },
        )
        .await;
    }

    /// The objects the samples ask for on the example's cluster, as `owned_objects` names
    /// them: two DeviceClasses, four admission policies and their bindings, in every team
    /// namespace a quota and a template per offered count (a100-80gb offers 1, 2, 4 and 8
    /// devices, a100-shared 1) of the team's sharing policies, and a quota of 0 in every other
    /// namespace the server lists (`web`, the system's, the operator's) that is not exempt or
    /// being deleted.
    async fn expected_objects(&self) -> Vec<String> {
        let mut out = vec![
            "deviceclass//a100-80gb.teamgpu.io".to_owned(),
            "deviceclass//a100-shared.teamgpu.io".to_owned(),
            "validatingadmissionpolicy//teamgpu-namespace-exemption".to_owned(),
            "validatingadmissionpolicy//teamgpu-namespace-membership".to_owned(),
            "validatingadmissionpolicy//teamgpu-non-team-requests".to_owned(),
            "validatingadmissionpolicy//teamgpu-team-requests".to_owned(),
        ];
        for binding in [
            "teamgpu-namespace-exemption",
            "teamgpu-namespace-membership",
            "teamgpu-non-team-requests",
            "teamgpu-team-requests",
        ] {
            out.push(format!("validatingadmissionpolicybinding//{binding}"));
        }
        let big = ["a100-80gb", "a100-80gb-x2", "a100-80gb-x4", "a100-80gb-x8"];
        for ns in self.outside_sample_teams().await {
            out.push(format!(
                "resourcequota/{}/teamgpu-outside-teams",
                ns.name_any()
            ));
        }
        for (ns, shared) in [
            ("ml-research-dev", true),
            ("ml-research-train", true),
            ("inference-prod", false),
            ("inference-canary", false),
            ("data-science", true),
        ] {
            let ns = self.ns(ns);
            out.push(format!("resourcequota/{ns}/teamgpu"));
            let shared = shared.then_some("a100-shared");
            for t in big.iter().copied().chain(shared) {
                out.push(format!("resourceclaimtemplate/{ns}/{t}"));
            }
        }
        // Every sample team has members: they read their team.
        for team in ["data-science", "inference", "ml-research"] {
            out.push(format!("clusterrole//teamgpu-member-{team}"));
            out.push(format!("clusterrolebinding//teamgpu-member-{team}"));
        }
        out.sort();
        out
    }
}

fn claim(name: &str, class: &str, count: i64) -> ResourceClaim {
    serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": class, "count": count}}]}}
    }))
    .unwrap()
}

/// The operator's [`stored_writes`] once they have stopped for a while (the pass that wrote the
/// last status may still be publishing its events).
async fn settled_writes(requests: &Counters) -> u64 {
    eventually("the operator settles", CONVERGE, || async {
        let before = stored_writes(requests);
        tokio::time::sleep(Duration::from_millis(1000)).await;
        let after = stored_writes(requests);
        if after == before {
            Ok(after)
        } else {
            Err(format!("{before} -> {after} writes"))
        }
    })
    .await
}

/// The objects the operator wrote: its write requests but the SelfSubjectReview it creates at
/// start to learn its user name (a question, stored nowhere).
fn stored_writes(requests: &Counters) -> u64 {
    requests.writes(None) - requests.get("create", "selfsubjectreviews.authentication.k8s.io")
}
