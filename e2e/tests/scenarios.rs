//! End-to-end scenarios: the real operator (`teamgpu::controller::run`, as its own
//! ServiceAccount with the RBAC of `config/rbac`) against a real Kubernetes control plane: the
//! one `TEAMGPU_E2E_ASSETS` starts, or the throwaway cluster of `TEAMGPU_E2E_KUBECONFIG` (see
//! `teamgpu_e2e::sandbox`). Each asserts what a user would check with kubectl; expected values
//! are written here or read from the server, never computed by teamgpu's own planning code.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicy;
use k8s_openapi::api::core::v1::{Namespace, Pod, ResourceQuota};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceClaimTemplate};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use teamgpu::api::{GpuSharingPolicy, TeamGpuPolicy};
use teamgpu_e2e::cluster::OPERATOR_NAMESPACE;
use teamgpu_e2e::fixtures::{fresh, gpu_pod, samples};
use teamgpu_e2e::operator::Operator;
use teamgpu_e2e::recording::Counters;
use teamgpu_e2e::sandbox::{Sandbox, TEAM_LABEL};
use teamgpu_e2e::{TestCluster, eventually};

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
        Some((world, operator))
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn installing_the_samples_creates_device_classes_and_ready_policies() {
    let Some(world) = World::new().await else {
        return;
    };
    let _operator = world.operator();
    world.install_samples().await;

    let classes: Api<DeviceClass> = Api::all(world.client.clone());
    let shared = eventually("DeviceClass a100-shared.teamgpu.io", CONVERGE, || async {
        classes
            .get_opt("a100-shared.teamgpu.io")
            .await
            .map_err(|e| e.to_string())?
            .ok_or("missing".to_owned())
    })
    .await;
    let exprs: Vec<_> = shared
        .spec
        .selectors
        .iter()
        .flatten()
        .filter_map(|s| s.cel.as_ref())
        .map(|c| c.expression.clone())
        .collect();
    assert!(
        exprs.iter().any(|e| e.contains("'NVIDIA A100-PCIE-40GB'")),
        "{exprs:?}"
    );
    let config = &shared.spec.config.as_ref().unwrap()[0]
        .opaque
        .as_ref()
        .unwrap()
        .parameters
        .0;
    assert_eq!(config["sharing"]["strategy"], "TimeSlicing");
    assert_eq!(config["sharing"]["timeSlicingConfig"]["interval"], "Long");
    assert_eq!(shared.labels()["app.kubernetes.io/managed-by"], "teamgpu");

    let gsp: Api<GpuSharingPolicy> = Api::all(world.client.clone());
    for name in ["a100-80gb", "a100-shared"] {
        eventually(
            &format!("GpuSharingPolicy {name} Ready"),
            CONVERGE,
            || async {
                let p = gsp.get(name).await.map_err(|e| e.to_string())?;
                let status = p.status.clone().ok_or("no status")?;
                match condition(&status.conditions, "Ready") {
                    Some(c) if c.status == "True" && status.devices > 0 => Ok(()),
                    other => Err(format!("{other:?} devices {}", status.devices)),
                }
            },
        )
        .await;
    }
    let tgp: Api<TeamGpuPolicy> = Api::all(world.client.clone());
    let ml = eventually("TeamGpuPolicy ml-research Ready", CONVERGE, || async {
        let t = tgp.get("ml-research").await.map_err(|e| e.to_string())?;
        let status = t.status.clone().ok_or("no status")?;
        match condition(&status.conditions, "Ready") {
            Some(c) if c.status == "True" => Ok(status),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    assert_eq!(
        ml.namespaces,
        [world.ns("ml-research-dev"), world.ns("ml-research-train")]
    );
    let q = ml
        .quotas
        .iter()
        .find(|q| q.sharing_policy == "a100-80gb")
        .unwrap();
    assert_eq!((q.guaranteed, q.limit, q.capacity), (8, 16, 32));
    assert_eq!(
        world.templates("ml-research-dev").await,
        [
            "a100-80gb",
            "a100-80gb-x2",
            "a100-80gb-x4",
            "a100-80gb-x8",
            "a100-shared"
        ]
    );
}

impl World {
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

    /// A GpuSharingPolicy `pcie` of the 16 PCIe GPUs, and per (name, quota, reclaim) a team
    /// owning a namespace of that name with that quota of `pcie`.
    async fn pcie_teams<const N: usize>(
        &self,
        teams: [(&str, serde_json::Value, serde_json::Value); N],
    ) {
        let policy: GpuSharingPolicy = serde_json::from_value(json!({"apiVersion": "teamgpu.io/v1alpha1", "kind": "GpuSharingPolicy",
            "metadata": {"name": "pcie"}, "spec": {"selector": {"productNames": ["NVIDIA A100-PCIE-40GB"]}}})).unwrap();
        Api::<GpuSharingPolicy>::all(self.client.clone())
            .create(&PostParams::default(), &policy)
            .await
            .unwrap();
        for (name, mut quota, reclaim) in teams {
            self.namespace(name, None).await;
            quota["sharingPolicy"] = json!("pcie");
            let team: TeamGpuPolicy = serde_json::from_value(
                json!({"apiVersion": "teamgpu.io/v1alpha1", "kind": "TeamGpuPolicy",
                "metadata": {"name": name},
                "spec": {"namespaces": [self.ns(name)], "quotas": [quota], "reclaim": reclaim}}),
            )
            .unwrap();
            Api::<TeamGpuPolicy>::all(self.client.clone())
                .create(&PostParams::default(), &team)
                .await
                .unwrap();
        }
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

    /// The objects the samples ask for on the example's cluster, as `owned_objects` names
    /// them: two DeviceClasses, four admission policies and their bindings, and in every team
    /// namespace a quota and a
    /// template per offered count (a100-80gb offers 1, 2, 4 and 8 devices, a100-shared 1) of the
    /// team's sharing policies.
    fn expected_objects(&self) -> Vec<String> {
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn labelling_a_namespace_joins_the_team_and_unlabelling_leaves_it() {
    let Some((world, _operator)) = World::with_samples().await else {
        return;
    };

    world.namespace("ml-new", None).await;
    world.label("ml-new", Some("ml-research")).await;
    let joined = Instant::now();
    eventually(
        "ml-new gets templates, quota and binding",
        // A timeout on a shared 2-core machine, not a speed target: the join time is printed
        // (and the scale example reports claim -> status latency).
        Duration::from_secs(20),
        || async {
            let templates = world.templates("ml-new").await;
            let quota = world.quota_hard("ml-new").await;
            let bound = world.admitted_as_team_namespace("ml-new").await;
            if templates.len() == 5 && quota.is_ok() && bound {
                Ok(())
            } else {
                Err(format!("{templates:?} {quota:?} {bound}"))
            }
        },
    )
    .await;
    eprintln!("self-service join took {:?}", joined.elapsed());

    world.label("ml-new", None).await;
    eventually(
        "ml-new loses everything",
        // A timeout on a shared 2-core machine, not a speed target: the join time is printed
        // (and the scale example reports claim -> status latency).
        Duration::from_secs(20),
        || async {
            let templates = world.templates("ml-new").await;
            let quota = world.quota_hard("ml-new").await;
            let bound = world.admitted_as_team_namespace("ml-new").await;
            if templates.is_empty() && quota.is_err() && !bound {
                Ok(())
            } else {
                Err(format!("{templates:?} {quota:?} {bound}"))
            }
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_up_to_the_entitlement_are_admitted_and_the_next_is_refused() {
    let Some((world, _operator)) = World::with_samples().await else {
        return;
    };
    // ml-research has a100-shared guaranteed 2 = limit 2 (nothing to borrow), split over its two
    // namespaces; as one namespace uses its share, the team's headroom moves to it. So the team
    // can create exactly 2 claims in ml-research-dev, and the third is refused for good.
    let claims: Api<ResourceClaim> =
        Api::namespaced(world.client.clone(), &world.ns("ml-research-dev"));
    let create = |name: &'static str| {
        let claims = claims.clone();
        async move {
            claims
                .create(
                    &PostParams::default(),
                    &claim(name, "a100-shared.teamgpu.io", 1),
                )
                .await
        }
    };
    for name in ["first", "second"] {
        // A refusal may only mean the quota has not followed the team's headroom yet.
        eventually(&format!("claim {name} admitted"), CONVERGE, || async {
            create(name).await.map(drop).map_err(|e| e.to_string())
        })
        .await;
    }
    // Once the operator has seen both claims, the team's entitlement is used up: the third
    // claim is refused, and stays refused.
    eventually("status counts both claims", CONVERGE, || async {
        let q = world.quota_status("ml-research", "a100-shared").await?;
        if q.requested == 2 {
            Ok(())
        } else {
            Err(format!("{q:?}"))
        }
    })
    .await;
    for _ in 0..5 {
        match create("one-too-many").await {
            Err(kube::Error::Api(s)) => {
                assert_eq!(s.code, 403);
                assert!(s.message.contains("exceeded quota"), "{}", s.message);
            }
            other => panic!("the team's third claim must be refused by quota, got {other:?}"),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let admitted = 2;
    let allowed = admitted;
    // The driver's own class is closed to the team: by admission policy, before quota.
    let bypass = claims
        .create(
            &PostParams::default(),
            &claim("bypass", "gpu.nvidia.com", 1),
        )
        .await
        .unwrap_err();
    assert!(
        bypass
            .to_string()
            .contains("belongs to TeamGpuPolicy ml-research"),
        "{bypass}"
    );
    eventually("status counts the claims", CONVERGE, || async {
        let q = world.quota_status("ml-research", "a100-shared").await?;
        if i64::from(q.requested) == allowed {
            Ok(())
        } else {
            Err(format!("{q:?}"))
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policy_changes_flow_to_quotas_classes_and_templates_and_deletion_cleans_up() {
    let Some((world, _operator)) = World::with_samples().await else {
        return;
    };
    let tgp: Api<TeamGpuPolicy> = Api::all(world.client.clone());
    let gsp: Api<GpuSharingPolicy> = Api::all(world.client.clone());
    let key = "a100-shared.teamgpu.io.deviceclass.resource.k8s.io/devices";
    let sum = |ns_hard: Vec<BTreeMap<String, String>>| {
        ns_hard
            .iter()
            .map(|h| h[key].parse::<u32>().unwrap())
            .sum::<u32>()
    };

    // Raising ml-research's a100-shared limit from 2 to 6 raises its quotas.
    let before = sum(vec![
        world.quota_hard("ml-research-dev").await.unwrap(),
        world.quota_hard("ml-research-train").await.unwrap(),
    ]);
    let patch = json!({"spec": {"quotas": [{"sharingPolicy": "a100-80gb", "guaranteed": 8, "limit": 16},
                                           {"sharingPolicy": "a100-shared", "guaranteed": 2, "limit": 6}]}});
    tgp.patch(
        "ml-research",
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await
    .unwrap();
    eventually("quotas rise", CONVERGE, || async {
        let after = sum(vec![
            world.quota_hard("ml-research-dev").await?,
            world.quota_hard("ml-research-train").await?,
        ]);
        if after > before {
            Ok(())
        } else {
            Err(format!("{before} -> {after}"))
        }
    })
    .await;

    // Changing the sharing strategy updates the DeviceClass.
    let patch = json!({"spec": {"sharing": {"strategy": "MPS", "timeSlicing": null, "mps": {"defaultActiveThreadPercentage": 25}}}});
    gsp.patch(
        "a100-shared",
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await
    .unwrap();
    let classes: Api<DeviceClass> = Api::all(world.client.clone());
    eventually("DeviceClass switches to MPS", CONVERGE, || async {
        let c = classes
            .get("a100-shared.teamgpu.io")
            .await
            .map_err(|e| e.to_string())?;
        let p = c
            .spec
            .config
            .as_ref()
            .and_then(|c| c[0].opaque.as_ref())
            .map(|o| o.parameters.0.clone())
            .unwrap_or_default();
        if p["sharing"]["strategy"] == "MPS" && p["sharing"].get("timeSlicingConfig").is_none() {
            Ok(())
        } else {
            Err(p.to_string())
        }
    })
    .await;

    // Changing the offered counts recreates the templates.
    let dev_templates: Api<ResourceClaimTemplate> =
        Api::namespaced(world.client.clone(), &world.ns("ml-research-dev"));
    let old_uid = dev_templates.get("a100-80gb").await.unwrap().uid();
    gsp.patch(
        "a100-80gb",
        &PatchParams::default(),
        &Patch::Merge(&json!({"spec": {"claimTemplates": {"counts": [1, 3]}}})),
    )
    .await
    .unwrap();
    eventually("templates follow the counts", CONVERGE, || async {
        let t = world.templates("ml-research-dev").await;
        if t == ["a100-80gb", "a100-80gb-x3", "a100-shared"] {
            Ok(())
        } else {
            Err(format!("{t:?}"))
        }
    })
    .await;
    let new_uid = dev_templates.get("a100-80gb").await.unwrap().uid();
    assert_eq!(old_uid, new_uid, "an unchanged template is left alone");

    // Deleting the team removes everything made for it.
    tgp.delete("ml-research", &DeleteParams::default())
        .await
        .unwrap();
    eventually("ml-research's objects are gone", CONVERGE, || async {
        let team_namespaces = [world.ns("ml-research-dev"), world.ns("ml-research-train")];
        let left: Vec<_> = world
            .owned_objects()
            .await?
            .into_iter()
            .filter(|o| {
                team_namespaces
                    .iter()
                    .any(|ns| o.contains(&format!("/{ns}/")))
            })
            .collect();
        let mut bound = Vec::new();
        for ns in ["ml-research-dev", "ml-research-train"] {
            if world.admitted_as_team_namespace(ns).await {
                bound.push(ns);
            }
        }
        if left.is_empty() && bound.is_empty() {
            Ok(())
        } else {
            Err(format!("{left:?} {bound:?}"))
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_claimed_twice_gets_nothing_until_fixed() {
    let Some((world, _operator)) = World::with_samples().await else {
        return;
    };
    let rogue: TeamGpuPolicy = serde_json::from_value(json!({
        "apiVersion": "teamgpu.io/v1alpha1", "kind": "TeamGpuPolicy", "metadata": {"name": "rogue"},
        "spec": {"namespaces": [world.ns("ml-research-dev")], "quotas": [{"sharingPolicy": "a100-80gb", "guaranteed": 1}]}
    }))
    .unwrap();
    let tgp: Api<TeamGpuPolicy> = Api::all(world.client.clone());
    tgp.create(&PostParams::default(), &rogue).await.unwrap();
    eventually(
        "ml-research-dev is stripped and both report Conflict",
        CONVERGE,
        || async {
            let templates = world.templates("ml-research-dev").await;
            let quota = world.quota_hard("ml-research-dev").await;
            let mut messages = Vec::new();
            for team in ["ml-research", "rogue"] {
                let s = world.team_status(team).await?;
                match condition(&s.conditions, "Conflict") {
                    Some(c) if c.status == "True" => messages.push(c.message.clone()),
                    other => return Err(format!("{team}: {other:?}")),
                }
            }
            if templates.is_empty() && quota.is_err() {
                Ok(messages)
            } else {
                Err(format!("{templates:?} {quota:?}"))
            }
        },
    )
    .await;
    tgp.delete("rogue", &DeleteParams::default()).await.unwrap();
    eventually("resolved", CONVERGE, || async {
        let s = world.team_status("ml-research").await?;
        let ok = condition(&s.conditions, "Conflict").is_some_and(|c| c.status == "False");
        if ok && world.templates("ml-research-dev").await.len() == 5 {
            Ok(())
        } else {
            Err(format!("{:?}", s.conditions))
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn edits_and_deletions_of_managed_objects_are_undone() {
    let Some((world, _operator)) = World::with_samples().await else {
        return;
    };
    let quotas: Api<ResourceQuota> =
        Api::namespaced(world.client.clone(), &world.ns("data-science"));
    let original = world.quota_hard("data-science").await.unwrap();
    let key = "a100-shared.teamgpu.io.deviceclass.resource.k8s.io/devices";
    quotas
        .patch(
            "teamgpu",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"hard": {key: "99"}}})),
        )
        .await
        .unwrap();
    eventually("quota edit undone", CONVERGE, || async {
        let h = world.quota_hard("data-science").await?;
        if h == original {
            Ok(())
        } else {
            Err(format!("{h:?}"))
        }
    })
    .await;
    let templates: Api<ResourceClaimTemplate> =
        Api::namespaced(world.client.clone(), &world.ns("data-science"));
    templates
        .delete("a100-shared", &DeleteParams::default())
        .await
        .unwrap();
    eventually("template restored", CONVERGE, || async {
        templates
            .get_opt("a100-shared")
            .await
            .map_err(|e| e.to_string())?
            .map(drop)
            .ok_or("missing".to_owned())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_reported_and_other_policies_are_unaffected() {
    let Some(world) = World::new().await else {
        return;
    };
    let _operator = world.operator();
    world.install_samples().await;
    let gsp: Api<GpuSharingPolicy> = Api::all(world.client.clone());
    let tgp: Api<TeamGpuPolicy> = Api::all(world.client.clone());
    let bad_cel: GpuSharingPolicy = serde_json::from_value(json!({"apiVersion": "teamgpu.io/v1alpha1", "kind": "GpuSharingPolicy",
        "metadata": {"name": "broken"}, "spec": {"selector": {"cel": ["device.attributes['gpu.nvidia.com'].productName =="]}}})).unwrap();
    let nothing: GpuSharingPolicy = serde_json::from_value(
        json!({"apiVersion": "teamgpu.io/v1alpha1", "kind": "GpuSharingPolicy",
        "metadata": {"name": "b200"}, "spec": {"selector": {"productNames": ["NVIDIA B200"]}}}),
    )
    .unwrap();
    let missing: TeamGpuPolicy = serde_json::from_value(json!({"apiVersion": "teamgpu.io/v1alpha1", "kind": "TeamGpuPolicy",
        "metadata": {"name": "robotics"}, "spec": {"namespaces": [world.ns("web")], "quotas": [{"sharingPolicy": "h100", "guaranteed": 2}]}})).unwrap();
    gsp.create(&PostParams::default(), &bad_cel).await.unwrap();
    gsp.create(&PostParams::default(), &nothing).await.unwrap();
    tgp.create(&PostParams::default(), &missing).await.unwrap();

    let sharing_condition = |name: &'static str, type_: &'static str| {
        let gsp = gsp.clone();
        async move {
            let s = gsp
                .get(name)
                .await
                .map_err(|e| e.to_string())?
                .status
                .ok_or("no status")?;
            condition(&s.conditions, type_)
                .cloned()
                .ok_or_else(|| format!("no {type_}"))
        }
    };
    let invalid = eventually("broken reports its selector", CONVERGE, || {
        sharing_condition("broken", "SelectorValid")
    })
    .await;
    assert_eq!(invalid.status, "False");
    assert!(
        invalid.message.contains("productName =="),
        "{}",
        invalid.message
    );
    let found = eventually("b200 reports no devices", CONVERGE, || {
        sharing_condition("b200", "DevicesFound")
    })
    .await;
    assert_eq!(found.status, "False");
    let robotics = eventually("robotics reports the missing policy", CONVERGE, || async {
        let s = world.team_status("robotics").await?;
        condition(&s.conditions, "SharingPoliciesResolved")
            .cloned()
            .ok_or("no condition".to_owned())
    })
    .await;
    assert_eq!(robotics.status, "False");
    assert!(robotics.message.contains("h100"), "{}", robotics.message);
    world.converged().await;
    let ready = world.team_status("ml-research").await.unwrap();
    assert_eq!(
        condition(&ready.conditions, "Ready").unwrap().status,
        "True"
    );
}

/// Applies and creates the API server counted for what teamgpu writes (its generated kinds and
/// the policies' status), by (verb, resource), whoever sent them. Deletions are left out: the
/// namespace controller and the garbage collector delete these kinds too, when an earlier
/// scenario's namespaces terminate.
async fn server_writes_of_teamgpu_kinds(world: &World) -> BTreeMap<(String, String), u64> {
    const TEAMGPU_WRITES: [&str; 9] = [
        "clusterroles.rbac.authorization.k8s.io",
        "clusterrolebindings.rbac.authorization.k8s.io",
        "deviceclasses.resource.k8s.io",
        "resourceclaimtemplates.resource.k8s.io",
        "resourcequotas",
        "validatingadmissionpolicies.admissionregistration.k8s.io",
        "validatingadmissionpolicybindings.admissionregistration.k8s.io",
        "teamgpupolicies.teamgpu.io/status",
        "gpusharingpolicies.teamgpu.io/status",
    ];
    world
        .cluster()
        .server_request_counts()
        .await
        .unwrap()
        .into_iter()
        .filter(|((verb, resource), _)| {
            ["patch", "create", "update"].contains(&verb.as_str())
                && TEAMGPU_WRITES.contains(&resource.as_str())
        })
        .collect()
}

/// The objects the operator wrote: its write requests but the SelfSubjectReview it creates at
/// start to learn its user name (a question, stored nowhere).
fn stored_writes(requests: &Counters) -> u64 {
    requests.writes(None) - requests.get("create", "selfsubjectreviews.authentication.k8s.io")
}

/// How long the scenarios watch an idle operator: `TEAMGPU_E2E_IDLE_SECONDS`, a minute by default.
fn idle_time() -> Duration {
    Duration::from_secs(
        std::env::var("TEAMGPU_E2E_IDLE_SECONDS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(60),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_converges_and_a_converged_restart_and_an_idle_minute_write_nothing() {
    let Some(world) = World::new().await else {
        return;
    };
    world.install_samples().await;
    // Killed while converging, at once.
    let first = world.operator();
    tokio::time::sleep(Duration::from_millis(30)).await;
    drop(first);
    let second = world.operator();
    world.converged().await;
    let expected = world.owned_objects().await.unwrap();
    assert_eq!(expected, world.expected_objects());
    second.stop().await;

    // A restart on the converged cluster, then idle time: the operator's client and the API
    // server's own counters (for what teamgpu writes, which no other client here writes) agree
    // that nothing is written.
    let server_before = server_writes_of_teamgpu_kinds(&world).await;
    let (client, requests) = world.operator_client();
    let restarted = Instant::now();
    let third = Operator::start(client, world.config());
    eventually(
        "the restarted operator lists the policies",
        CONVERGE,
        || async {
            if requests.get("list", "teamgpupolicies.teamgpu.io") > 0 {
                Ok(())
            } else {
                Err(format!("{:?}", requests.snapshot()))
            }
        },
    )
    .await;
    let idle = idle_time();
    tokio::time::sleep(idle).await;
    let server_after = server_writes_of_teamgpu_kinds(&world).await;
    eprintln!(
        "restart and {:?} idle: {} writes by the operator; API server: {:?} -> {:?}",
        restarted.elapsed(),
        stored_writes(&requests),
        server_before.values().sum::<u64>(),
        server_after.values().sum::<u64>(),
    );
    assert_eq!(
        stored_writes(&requests),
        0,
        "a restart on a converged cluster must not write: {:?}",
        requests.snapshot()
    );
    assert_eq!(
        server_after, server_before,
        "the API server counted applies of teamgpu's kinds"
    );
    assert_eq!(world.owned_objects().await.unwrap(), expected);
    third.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn joining_a_team_and_deleting_a_team_meet_no_denied_write() {
    let Some((world, first)) = World::with_samples().await else {
        return;
    };
    first.stop().await;
    let (client, requests) = world.operator_client();
    let _operator = Operator::start(client, world.config());
    // A namespace joins a team: its templates are written right after its binding, before the
    // API server's admission has seen the binding.
    for name in ["join-a", "join-b", "join-c"] {
        world.namespace(name, Some("data-science")).await;
    }
    eventually(
        "the new namespaces get their templates",
        CONVERGE,
        || async {
            let mut counts = Vec::new();
            for name in ["join-a", "join-b", "join-c"] {
                counts.push(world.templates(name).await.len());
            }
            if counts == [5, 5, 5] {
                Ok(())
            } else {
                Err(format!("{counts:?}"))
            }
        },
    )
    .await;
    // The team is deleted in the foreground: it stays, with a deletionTimestamp, until the
    // garbage collector has deleted what it owns.
    Api::<TeamGpuPolicy>::all(world.client.clone())
        .delete("data-science", &DeleteParams::foreground())
        .await
        .unwrap();
    eventually("data-science's objects are gone", CONVERGE, || async {
        let ns = world.ns("join-a");
        let left: Vec<String> = world
            .owned_objects()
            .await?
            .into_iter()
            .filter(|o| o.contains(&format!("/{ns}/")) || o.contains("data-science"))
            .collect();
        if left.is_empty() {
            Ok(())
        } else {
            Err(format!("{left:?}"))
        }
    })
    .await;
    let denied: Vec<String> = requests
        .errors()
        .into_iter()
        .filter(|e| e.starts_with("403") || e.starts_with("422"))
        .collect();
    assert!(
        denied.is_empty(),
        "the operator's writes were denied: {denied:?}"
    );
    eprintln!("answers to the operator: {:?}", requests.status_codes());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn everything_converges_through_server_errors_dropped_watches_and_gone_resource_versions() {
    let Some(world) = World::new().await else {
        return;
    };
    world.install_samples().await;
    let expected = world.expected_objects();
    // The operator talks to the API server through a proxy. For its first two seconds every
    // request fails with 500 (an API server that is not well yet: start-up must wait, not give
    // up); then 5% of its requests get 500 and 5% 429, every watch is cut after a second, and
    // 30% of watch resumptions get the 410 Expired event a compacted resourceVersion gets.
    let upstream = Client::try_from(world.operator.clone()).unwrap();
    let proxy = teamgpu_e2e::FaultProxy::start(
        upstream,
        teamgpu_e2e::Faults {
            rate_500: 1.0,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let _operator = Operator::start(Client::try_from(proxy.config()).unwrap(), world.config());
    tokio::time::sleep(Duration::from_secs(2)).await;
    proxy.set_faults(teamgpu_e2e::Faults {
        rate_500: 0.05,
        rate_429: 0.05,
        retry_after_secs: 1,
        watch_close_after: Some(Duration::from_secs(1)),
        rate_watch_gone: 0.3,
    });
    let started = Instant::now();
    eventually(
        "convergence under faults",
        Duration::from_secs(120),
        || async {
            let live = world.owned_objects().await?;
            if live == expected {
                Ok(())
            } else {
                Err(format!("{} of {} objects", live.len(), expected.len()))
            }
        },
    )
    .await;
    let injected = proxy.counters();
    eprintln!(
        "converged under faults in {:?}: {} requests forwarded, {} 500s, {} 429s, {} watches cut, {} 410s",
        started.elapsed(),
        injected.forwarded(),
        injected.injected_500(),
        injected.injected_429(),
        injected.watches_cut(),
        injected.watches_gone(),
    );
    assert!(injected.injected_500() + injected.injected_429() > 0);
    proxy.set_faults(teamgpu_e2e::Faults::default());
    // No duplicate and no orphan: exactly the expected objects, and every team reports Ready.
    assert_eq!(world.owned_objects().await.unwrap(), expected);
    world.converged().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_leader_writes_and_a_killed_leader_is_replaced_quickly() {
    let Some(world) = World::new().await else {
        return;
    };
    world.install_samples().await;
    let replica = |name: &str| {
        Operator::start(
            world.operator_client().0,
            teamgpu::controller::Config {
                leader_elect: true,
                identity: name.into(),
                lease_duration: Duration::from_secs(6),
                ..world.config()
            },
        )
    };
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(world.client.clone(), OPERATOR_NAMESPACE);
    let lease_name = world.config().lease_name;
    let holder = || async {
        let lease = leases
            .get_opt(&lease_name)
            .await
            .map_err(|e| e.to_string())?
            .ok_or("no lease")?;
        lease
            .spec
            .and_then(|s| s.holder_identity)
            .ok_or("no holder".to_owned())
    };
    let a = replica("replica-a");
    eventually("replica-a leads", CONVERGE, || async {
        let h = holder().await?;
        if h == "replica-a" { Ok(()) } else { Err(h) }
    })
    .await;
    let b = replica("replica-b");
    world.converged().await;
    assert_eq!(holder().await.unwrap(), "replica-a");

    // Kill the leader without letting it hand the lease back.
    drop(a);
    let killed = Instant::now();
    world.namespace("ml-late", Some("ml-research")).await;
    let took_lease = eventually(
        "replica-b takes the lease",
        Duration::from_secs(15),
        || async {
            let h = holder().await?;
            if h == "replica-b" {
                Ok(killed.elapsed())
            } else {
                Err(h)
            }
        },
    )
    .await;
    eprintln!("replica-b holds the lease {took_lease:?} after the crash");
    eventually(
        "replica-b takes over and reconciles",
        Duration::from_secs(15),
        || async {
            let h = holder().await?;
            let t = world.templates("ml-late").await;
            if h == "replica-b" && t.len() == 5 {
                Ok(())
            } else {
                Err(format!("holder {h}, templates {t:?}"))
            }
        },
    )
    .await;
    eprintln!("handover after a crash took {:?}", killed.elapsed());

    // A graceful stop hands the lease back at once.
    b.stop().await;
    let lease = leases.get(&lease_name).await.unwrap();
    let holder_after = lease.spec.and_then(|s| s.holder_identity);
    assert!(
        holder_after.is_none() || holder_after.as_deref() == Some(""),
        "{holder_after:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_devices_are_lent_and_taken_back_when_their_owner_returns() {
    let Some(world) = World::new().await else {
        return;
    };
    let client = world.client.clone();
    // 16 PCIe GPUs; "owner" is guaranteed 8, "borrower" 4 and may borrow up to 16.
    world.owner_and_borrower().await;
    let _operator = world.operator();
    let key = "pcie.teamgpu.io.deviceclass.resource.k8s.io/devices";
    let hard = |ns: &'static str| {
        let world = &world;
        async move {
            world
                .quota_hard(ns)
                .await
                .map(|h| h.get(key).and_then(|v| v.parse::<u32>().ok()).unwrap_or(0))
        }
    };

    // The owner is idle: the borrower may use everything beyond the owner's... idle devices.
    let lent = eventually("the borrower may borrow", CONVERGE, || async {
        let h = hard("borrower").await?;
        if h > 4 {
            Ok(h)
        } else {
            Err(format!("hard {h}"))
        }
    })
    .await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &world.ns("borrower"));
    let borrowed = lent.min(12);
    for i in 0..borrowed {
        pods.create(
            &PostParams::default(),
            &gpu_pod(&format!("job-{i:02}"), "pcie"),
        )
        .await
        .unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let allocated = |ns: &'static str| {
        let (client, ns) = (client.clone(), world.ns(ns));
        async move {
            let claims = Api::<ResourceClaim>::namespaced(client, &ns)
                .list(&Default::default())
                .await
                .map_err(|e| e.to_string())?;
            Ok::<usize, String>(
                claims
                    .items
                    .iter()
                    .filter(|c| c.status.as_ref().is_some_and(|s| s.allocation.is_some()))
                    .count(),
            )
        }
    };
    eventually(
        "the borrower's pods get devices beyond its guarantee",
        CONVERGE,
        || async {
            let n = allocated("borrower").await?;
            if n as u32 == borrowed {
                Ok(())
            } else {
                Err(format!("{n} allocated"))
            }
        },
    )
    .await;

    // The owner comes back and wants its guarantee.
    let owner_pods: Api<Pod> = Api::namespaced(client.clone(), &world.ns("owner"));
    for i in 0..8 {
        owner_pods
            .create(
                &PostParams::default(),
                &gpu_pod(&format!("serve-{i}"), "pcie"),
            )
            .await
            .unwrap();
    }
    eventually(
        "the owner gets all 8 guaranteed devices",
        Duration::from_secs(30),
        || async {
            let n = allocated("owner").await?;
            if n == 8 {
                Ok(())
            } else {
                Err(format!("{n} allocated to the owner"))
            }
        },
    )
    .await;
    // The borrower's newest pods were evicted; its quota shrank so it cannot take them back.
    let left: Vec<String> = pods
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(|p| p.name_any())
        .collect();
    assert!(left.len() as u32 <= 8, "{left:?}");
    assert!(
        left.iter().all(|p| p.as_str() < "job-08"),
        "the newest pods go first: {left:?}"
    );
    eventually(
        "the borrower's quota shrank to what the pool allows",
        CONVERGE,
        || async {
            let h = hard("borrower").await?;
            if h <= 8 {
                Ok(())
            } else {
                Err(format!("hard {h}"))
            }
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lending_limit_keeps_part_of_an_idle_guarantee_unlent() {
    let Some(world) = World::new().await else {
        return;
    };
    // 16 PCIe GPUs. "owner" is guaranteed 8 and lends at most 2 of them; "borrower" is
    // guaranteed 4 and may hold up to 16. Nobody uses anything.
    world
        .pcie_teams([
            (
                "owner",
                json!({"guaranteed": 8, "lendingLimit": 2}),
                json!({}),
            ),
            ("borrower", json!({"guaranteed": 4, "limit": 16}), json!({})),
        ])
        .await;
    let tgp: Api<TeamGpuPolicy> = Api::all(world.client.clone());
    let _operator = world.operator();
    let key = "pcie.teamgpu.io.deviceclass.resource.k8s.io/devices";
    let hard = |ns: &'static str, want: &'static str| {
        let world = &world;
        async move {
            let h = world.quota_hard(ns).await?;
            match h.get(key) {
                Some(v) if v == want => Ok(()),
                other => Err(format!("{ns}: {other:?}")),
            }
        }
    };
    // The borrower gets its 4, the 4 nobody is guaranteed and the owner's 2: 10, not 16.
    eventually("the borrower may borrow 6", CONVERGE, || {
        hard("borrower", "10")
    })
    .await;
    eventually("the owner keeps its 8", CONVERGE, || hard("owner", "8")).await;
    let owner = eventually(
        "the owner's status says 6 kept unlent",
        CONVERGE,
        || async {
            let s = world.team_status("owner").await?;
            let q = s.quotas.first().cloned().ok_or("no quota status")?;
            if q.reserved == 6 {
                Ok(q)
            } else {
                Err(format!("{q:?}"))
            }
        },
    )
    .await;
    assert!(
        owner.explanation.contains("lending limit 2"),
        "{}",
        owner.explanation
    );
    // Without the limit, everything idle may be lent.
    tgp.patch(
        "owner",
        &PatchParams::default(),
        &Patch::Merge(&json!({"spec": {"quotas": [{"sharingPolicy": "pcie", "guaranteed": 8}]}})),
    )
    .await
    .unwrap();
    eventually("the borrower may borrow 12", CONVERGE, || {
        hard("borrower", "16")
    })
    .await;
}

/// The RBAC view of the requests a recorded client made: (API group, resource[/subresource],
/// verb), e.g. ("", "pods/eviction", "create") from the counters' ("create", "pods/eviction").
fn rbac_calls(requests: &Counters) -> BTreeSet<(String, String, String)> {
    requests
        .snapshot()
        .into_keys()
        .map(|(verb, resource)| {
            let (base, sub) = resource.split_once('/').unwrap_or((&resource, ""));
            let (plural, group) = base.split_once('.').unwrap_or((base, ""));
            let resource = if sub.is_empty() {
                plural.to_owned()
            } else {
                format!("{plural}/{sub}")
            };
            (group.to_owned(), resource, verb)
        })
        .collect()
}

/// The rules of `config/rbac`: (API groups, resources, verbs).
/// The rules `config/rbac` grants the operator's ServiceAccount: those of the roles its bindings
/// name (not, say, `teamgpu-viewer`, which is for people).
fn rbac_rules() -> Vec<(Vec<String>, Vec<String>, Vec<String>)> {
    let docs = teamgpu_e2e::fixtures::rbac_manifests().unwrap();
    let bound: BTreeSet<(String, String)> = docs
        .iter()
        .filter(|d| {
            d["subjects"].as_array().into_iter().flatten().any(|s| {
                s["kind"] == "ServiceAccount"
                    && s["name"] == teamgpu_e2e::cluster::OPERATOR_SERVICE_ACCOUNT
            })
        })
        .map(|d| {
            let role = &d["roleRef"];
            (
                role["kind"].as_str().unwrap_or_default().to_owned(),
                role["name"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    let mut rules = Vec::new();
    for doc in docs.iter().filter(|d| {
        bound.contains(&(
            d["kind"].as_str().unwrap_or_default().to_owned(),
            d["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
        ))
    }) {
        for rule in doc["rules"].as_array().into_iter().flatten() {
            let strings = |k: &str| -> Vec<String> {
                rule[k]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|v| v.as_str().map(str::to_owned))
                    .collect()
            };
            rules.push((strings("apiGroups"), strings("resources"), strings("verbs")));
        }
    }
    rules
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_calls_exactly_what_its_rbac_grants() {
    let Some(world) = World::new().await else {
        return;
    };
    let (client, requests) = world.operator_client();
    // Everything the operator does: leader election, planning, applying, pruning, statuses,
    // events, pending demand and reclaim by eviction.
    let config = teamgpu::controller::Config {
        leader_elect: true,
        identity: "rbac".into(),
        ..world.config()
    };
    let operator = Operator::start(client, config);
    world.install_samples().await;
    world.converged().await;
    let tgp: Api<TeamGpuPolicy> = Api::all(world.client.clone());
    let patch = json!({"spec": {"reclaim": {"enabled": true, "gracePeriodSeconds": 0},
        "quotas": [{"sharingPolicy": "a100-80gb", "guaranteed": 8, "limit": 8}]}});
    tgp.patch(
        "data-science",
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await
    .unwrap();
    let patch =
        json!({"spec": {"quotas": [{"sharingPolicy": "a100-80gb", "guaranteed": 8, "limit": 32}]}});
    tgp.patch(
        "ml-research",
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await
    .unwrap();
    // ml-research borrows the whole 80GB pool while data-science is idle ...
    let ml: Api<Pod> = Api::namespaced(world.client.clone(), &world.ns("ml-research-train"));
    let mut started = 0;
    for i in 0..32 {
        if ml
            .create(
                &PostParams::default(),
                &gpu_pod(&format!("train-{i:02}"), "a100-80gb"),
            )
            .await
            .is_ok()
        {
            started += 1;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(started > 8, "ml-research could borrow ({started} pods)");
    // ... until data-science wants its guarantee back, which takes an eviction.
    let ds: Api<Pod> = Api::namespaced(world.client.clone(), &world.ns("data-science"));
    for i in 0..4 {
        ds.create(
            &PostParams::default(),
            &gpu_pod(&format!("nb-{i}"), "a100-80gb"),
        )
        .await
        .unwrap();
    }
    eventually("an eviction happened", Duration::from_secs(20), || async {
        if requests.get("create", "pods/eviction") > 0 {
            Ok(())
        } else {
            Err(format!("{:?}", rbac_calls(&requests)))
        }
    })
    .await;
    world.label("ml-research-dev", None).await; // pruning: deletes
    eventually("pruned", CONVERGE, || async {
        if world.templates("ml-research-dev").await.is_empty() {
            Ok(())
        } else {
            Err("templates left".to_owned())
        }
    })
    .await;
    // A DeviceClass carrying teamgpu's label that no policy wants is pruned. (Deleting a policy
    // below need not show the operator's own delete: its DeviceClass may go to the garbage
    // collector first, when a pass re-applies the class between the orphaning and the policy's
    // removal reaching the cache.)
    let classes: Api<DeviceClass> = Api::all(world.client.clone());
    let stray: DeviceClass = serde_json::from_value(json!({
        "metadata": {"name": "stray.teamgpu.io",
                     "labels": {"app.kubernetes.io/managed-by": "teamgpu"}},
        "spec": {}
    }))
    .unwrap();
    classes
        .create(&PostParams::default(), &stray)
        .await
        .unwrap();
    eventually("the stray DeviceClass pruned", CONVERGE, || async {
        match classes.get_opt("stray.teamgpu.io").await {
            Ok(None) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    // Deleting every policy deletes every kind of generated object, admission policies included.
    // Orphaning keeps the garbage collector out of it: the operator's pruning does it all.
    for t in tgp.list(&Default::default()).await.unwrap().items {
        tgp.delete(&t.name_any(), &DeleteParams::orphan())
            .await
            .unwrap();
    }
    let gsp: Api<GpuSharingPolicy> = Api::all(world.client.clone());
    for p in gsp.list(&Default::default()).await.unwrap().items {
        gsp.delete(&p.name_any(), &DeleteParams::orphan())
            .await
            .unwrap();
    }
    eventually("everything generated is gone", CONVERGE, || async {
        let left = world.owned_objects().await?;
        if left.is_empty() {
            Ok(())
        } else {
            Err(format!("{left:?}"))
        }
    })
    .await;
    operator.stop().await;

    let rules = rbac_rules();
    let allowed = |(group, resource, verb): &(String, String, String)| {
        rules.iter().any(|(g, r, v)| {
            (g.contains(group) || g.iter().any(|x| x == "*"))
                && (r.contains(resource) || r.iter().any(|x| x == "*"))
                && (v.contains(verb) || v.iter().any(|x| x == "*"))
        })
    };
    // Every authenticated user may ask who it is (the `system:basic-user` ClusterRole): the
    // operator does, once at start, to exempt itself from its own admission policies.
    let granted_to_everyone = (
        "authentication.k8s.io".to_owned(),
        "selfsubjectreviews".to_owned(),
        "create".to_owned(),
    );
    let calls = rbac_calls(&requests);
    assert!(calls.contains(&granted_to_everyone), "{calls:?}");
    let denied: Vec<_> = calls
        .iter()
        .filter(|c| !allowed(c) && **c != granted_to_everyone)
        .collect();
    assert!(
        denied.is_empty(),
        "calls config/rbac does not grant: {denied:?}"
    );
    // And nothing granted goes unused (server-side apply's implicit `create` is the one grant a
    // PATCH needs without a POST).
    let mut unused = Vec::new();
    for (groups, resources, verbs) in &rules {
        for g in groups {
            for r in resources {
                for v in verbs {
                    let call = (g.clone(), r.clone(), v.clone());
                    let apply_create =
                        v == "create" && calls.contains(&(g.clone(), r.clone(), "patch".into()));
                    // A policy's `paramKind` and a binding's `paramRef.name` are authorized
                    // against `get` on the param kind.
                    let param_get = [("", "resourcequotas"), ("teamgpu.io", "teamgpupolicies")]
                        .contains(&(g.as_str(), r.as_str()))
                        && v == "get"
                        && calls.contains(&(
                            "admissionregistration.k8s.io".into(),
                            "validatingadmissionpolicybindings".into(),
                            "patch".into(),
                        ));
                    // Held so that the operator may grant it to members (RBAC escalation check).
                    let granted_on = g == "teamgpu.io" && r == "gpusharingpolicies" && v == "get";
                    if !calls.contains(&call) && !apply_create && !param_get && !granted_on {
                        unused.push(format!("{g}/{r}:{v}"));
                    }
                }
            }
        }
    }
    assert!(
        unused.is_empty(),
        "granted but never used: {unused:?}\nused: {calls:?}"
    );
}

/// `GET path` on a local HTTP server: (status code, body).
async fn http_get(addr: std::net::SocketAddr, path: &str) -> Result<(u16, String), String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    stream
        .write_all(
            format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
                .as_bytes(),
        )
        .await
        .map_err(|e| e.to_string())?;
    let mut response = String::new();
    stream
        .read_to_string(&mut response)
        .await
        .map_err(|e| e.to_string())?;
    let code = response
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or("no status line")?;
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    Ok((code, body))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_metrics_and_the_writes_of_a_converge_and_of_idle_time() {
    let Some(world) = World::new().await else {
        return;
    };
    world.install_samples().await;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr: std::net::SocketAddr = ([127, 0, 0, 1], port).into();
    let health_port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let health: std::net::SocketAddr = ([127, 0, 0, 1], health_port).into();
    let (client, requests) = world.operator_client();
    let _operator = Operator::start(
        client,
        teamgpu::controller::Config {
            metrics_addr: addr,
            health_addr: Some(health),
            ..world.config()
        },
    );
    eventually("/healthz", CONVERGE, || async {
        let (code, _) = http_get(health, "/healthz").await?;
        if code == 200 {
            Ok(())
        } else {
            Err(code.to_string())
        }
    })
    .await;
    eventually("/readyz once the caches synced", CONVERGE, || async {
        let (code, body) = http_get(health, "/readyz").await?;
        if code == 200 {
            Ok(())
        } else {
            Err(format!("{code} {body}"))
        }
    })
    .await;
    world.converged().await;
    // The pass that wrote the last status may still be publishing its events: idle time starts
    // once the operator's writes have stopped for a while.
    let converged = eventually("the operator settles", CONVERGE, || async {
        let before = stored_writes(&requests);
        tokio::time::sleep(Duration::from_millis(500)).await;
        let after = stored_writes(&requests);
        if after == before {
            Ok(after)
        } else {
            Err(format!("{before} -> {after} writes"))
        }
    })
    .await;
    let at_converge = requests.snapshot();
    let series = [
        r#"teamgpu_team_guaranteed_devices{team="ml-research",sharing_policy="a100-80gb"} 8"#,
        r#"teamgpu_team_limit_devices{team="ml-research",sharing_policy="a100-80gb"} 16"#,
        r#"teamgpu_sharing_policy_capacity_devices{sharing_policy="a100-80gb"} 32"#,
        "teamgpu_reconciles_total{controller=\"teamgpu\"}",
        "teamgpu_api_writes_total{kind=\"resourceclaimtemplate\",verb=\"apply\"}",
        "teamgpu_leader 1",
    ];
    eventually("/metrics has every series", CONVERGE, || async {
        let (code, body) = http_get(addr, "/metrics").await?;
        let missing: Vec<&str> = series
            .iter()
            .copied()
            .filter(|s| !body.contains(s))
            .collect();
        if code == 200 && missing.is_empty() {
            Ok(())
        } else {
            Err(format!("{code}, lacking {missing:?} in:\n{body}"))
        }
    })
    .await;
    // Idle: nothing changes, so nothing is written (the restart scenario watches a minute), and
    // the reconciler sleeps.
    let reconciles = || async {
        let (_, body) = http_get(addr, "/metrics").await.unwrap();
        body.lines()
            .find_map(|l| l.strip_prefix("teamgpu_reconciles_total{controller=\"teamgpu\"} "))
            .and_then(|v| v.parse::<u64>().ok())
            .expect("teamgpu_reconciles_total")
    };
    let passes_before = reconciles().await;
    let idle = Duration::from_secs(3);
    tokio::time::sleep(idle).await;
    let idle_passes = reconciles().await - passes_before;
    assert!(
        idle_passes <= 2,
        "an idle operator makes no passes; it made {idle_passes} in {idle:?}"
    );
    let now = requests.snapshot();
    let idle_writes = stored_writes(&requests) - converged;
    eprintln!(
        "converge: {converged} writes for {} objects and 5 statuses; idle {idle:?}: {idle_writes} writes",
        world.expected_objects().len(),
    );
    let by_verb = |from: &BTreeMap<(String, String), u64>, to: &BTreeMap<(String, String), u64>| {
        let mut out: BTreeMap<String, i64> = BTreeMap::new();
        for ((verb, _), n) in to {
            *out.entry(verb.clone()).or_insert(0) += *n as i64;
        }
        for ((verb, _), n) in from {
            *out.entry(verb.clone()).or_insert(0) -= *n as i64;
        }
        out.retain(|_, n| *n != 0);
        out
    };
    eprintln!(
        "requests by verb to converge: {:?}",
        by_verb(&BTreeMap::new(), &at_converge)
    );
    eprintln!(
        "requests by verb while idle for {idle:?}: {:?}",
        by_verb(&at_converge, &now)
    );
    let diff: Vec<_> = now
        .iter()
        .filter_map(|(k, v)| {
            let was = at_converge.get(k).copied().unwrap_or(0);
            (was != *v).then(|| format!("{} {}: {was} -> {v}", k.0, k.1))
        })
        .collect();
    assert_eq!(idle_writes, 0, "an idle operator writes nothing: {diff:?}");
}

// ---------------------------------------------------------------------------------------------
// Tenancy: what a team member can and cannot do, on the real API server, as that member.

/// `world`'s admin client impersonating `user` (in `system:authenticated` and `groups`).
fn as_user(world: &World, user: &str, groups: &[&str]) -> Client {
    let mut config = world.cluster().config().clone();
    config.auth_info.impersonate = Some(user.to_owned());
    config.auth_info.impersonate_groups = Some(
        std::iter::once("system:authenticated")
            .chain(groups.iter().copied())
            .map(str::to_owned)
            .collect(),
    );
    Client::try_from(config).unwrap()
}

/// Binds the ClusterRole `role` to `user` in namespace `ns` (a RoleBinding, as a platform team
/// gives a team member `edit` in the team's namespaces).
async fn grant_in(world: &World, ns: &str, user: &str, role: &str) {
    let binding: k8s_openapi::api::rbac::v1::RoleBinding = serde_json::from_value(json!({
        "metadata": {"name": format!("{user}-{role}")},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]
    }))
    .unwrap();
    Api::namespaced(world.client.clone(), &world.ns(ns))
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();
}

/// Binds the ClusterRole `role` to `user` cluster-wide, once per world; `rules` (when given)
/// first create that ClusterRole.
async fn grant_cluster(world: &World, user: &str, role: &str, rules: Option<serde_json::Value>) {
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
    let params = PatchParams::apply("teamgpu-e2e").force();
    let labels = json!({"teamgpu.io/e2e": "true"});
    if let Some(rules) = rules {
        let cluster_role = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": role, "labels": labels}, "rules": rules});
        Api::<ClusterRole>::all(world.client.clone())
            .patch(role, &params, &Patch::Apply(&cluster_role))
            .await
            .unwrap();
    }
    let name = world.ns(&format!("{user}-{role}"));
    let binding = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": name, "labels": labels},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]});
    Api::<ClusterRoleBinding>::all(world.client.clone())
        .patch(&name, &params, &Patch::Apply(&binding))
        .await
        .unwrap();
}

/// A Pod whose container asks for `resources` as requests and limits (extended resources must
/// have both equal).
fn extended_pod(name: &str, resources: serde_json::Value) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10",
                                 "resources": {"requests": resources, "limits": resources}}]}
    }))
    .unwrap()
}

/// What became of one attempt: `Ok` when admitted, else the API server's status code and message.
type Outcome = Result<(), (u16, String)>;

fn outcome<T>(result: Result<T, kube::Error>) -> Outcome {
    match result {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) => Err((s.code, s.message)),
        Err(e) => Err((0, e.to_string())),
    }
}

/// Waits until admission applies the policies the operator wrote (bindings take effect a moment
/// after they are written): a dry run of `claim` in `ns` is refused with `says`.
async fn admission_denies(world: &World, ns: &str, claim: &ResourceClaim, says: &str) {
    let api: Api<ResourceClaim> = Api::namespaced(world.client.clone(), &world.ns(ns));
    eventually(&format!("admission in {ns} applies"), CONVERGE, || async {
        match outcome(
            api.create(
                &PostParams {
                    dry_run: true,
                    ..Default::default()
                },
                claim,
            )
            .await,
        ) {
            Err((_, message)) if message.contains(says) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_team_member_with_edit_cannot_escape_the_entitlement() {
    let Some((world, _operator)) = World::with_samples().await else {
        return;
    };
    // alice is in ml-research (a100-80gb and a100-shared) and in inference (a100-80gb only),
    // with the built-in `edit` role in two of their namespaces and in the non-team `web`.
    for ns in ["ml-research-dev", "inference-prod", "web"] {
        grant_in(&world, ns, "alice", "edit").await;
    }
    let alice = as_user(&world, "alice", &[]);
    let (dev, prod, web) = (
        world.ns("ml-research-dev"),
        world.ns("inference-prod"),
        world.ns("web"),
    );
    admission_denies(
        &world,
        "ml-research-dev",
        &claim("probe", "gpu.nvidia.com", 1),
        "belongs to TeamGpuPolicy",
    )
    .await;
    admission_denies(
        &world,
        "web",
        &claim("probe", "gpu.nvidia.com", 1),
        "belongs to no TeamGpuPolicy",
    )
    .await;

    let claims = |ns: &str| Api::<ResourceClaim>::namespaced(alice.clone(), ns);
    let templates = |ns: &str| Api::<ResourceClaimTemplate>::namespaced(alice.clone(), ns);
    let pods = |ns: &str| Api::<Pod>::namespaced(alice.clone(), ns);
    let pp = PostParams::default();
    let devices = |d: serde_json::Value| -> ResourceClaim {
        serde_json::from_value(json!({"metadata": {"name": "escape"}, "spec": {"devices": d}}))
            .unwrap()
    };
    let exactly = |class: &str, extra: serde_json::Value| {
        let mut e = json!({"deviceClassName": class});
        e.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        json!({"requests": [{"name": "gpu", "exactly": e}]})
    };
    let in_team = "belongs to TeamGpuPolicy";
    let outside = "belongs to no TeamGpuPolicy";
    let forbidden = "forbidden: User \"alice\" cannot";

    // (attempt, what the refusal must say, outcome)
    let mut table: Vec<(&str, &str, Outcome)> = Vec::new();
    table.push((
        "the driver's class gpu.nvidia.com in a team namespace",
        in_team,
        outcome(
            claims(&dev)
                .create(&pp, &claim("e1", "gpu.nvidia.com", 1))
                .await,
        ),
    ));
    table.push((
        "a class of another team's sharing policy (a100-shared in inference)",
        in_team,
        outcome(
            claims(&prod)
                .create(&pp, &claim("e2", "a100-shared.teamgpu.io", 1))
                .await,
        ),
    ));
    table.push((
        "more devices than the quota (a100-80gb x 40)",
        "exceeded quota",
        outcome(
            claims(&dev)
                .create(&pp, &claim("e3", "a100-80gb.teamgpu.io", 40))
                .await,
        ),
    ));
    table.push((
        "firstAvailable hiding gpu.nvidia.com behind the team's class",
        in_team,
        outcome(
            claims(&dev)
                .create(
                    &pp,
                    &devices(json!({"requests": [{"name": "gpu", "firstAvailable": [
                    {"name": "ok", "deviceClassName": "a100-80gb.teamgpu.io"},
                    {"name": "bad", "deviceClassName": "gpu.nvidia.com"}]}]})),
                )
                .await,
        ),
    ));
    table.push((
        "opaque driver config overriding the sharing strategy",
        "opaque device config is not allowed",
        outcome(
            claims(&dev)
                .create(&pp, &{
                    let mut d = exactly("a100-80gb.teamgpu.io", json!({}));
                    d["config"] = json!([{"opaque": {"driver": "gpu.nvidia.com", "parameters": {
                        "apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
                        "sharing": {"strategy": "TimeSlicing"}}}}]);
                    devices(d)
                })
                .await,
        ),
    ));
    table.push((
        "adminAccess on the team's class",
        // The API server itself refuses it first unless the namespace carries
        // `resource.kubernetes.io/admin-access`, which `edit` cannot set; teamgpu's policy too.
        "adminAccess",
        outcome(
            claims(&dev)
                .create(
                    &pp,
                    &devices(exactly(
                        "a100-80gb.teamgpu.io",
                        json!({"adminAccess": true}),
                    )),
                )
                .await,
        ),
    ));
    table.push((
        "allocationMode All on the team's class",
        "allocationMode All is not allowed",
        outcome(
            claims(&dev)
                .create(
                    &pp,
                    &devices(exactly(
                        "a100-80gb.teamgpu.io",
                        json!({"allocationMode": "All"}),
                    )),
                )
                .await,
        ),
    ));
    table.push((
        "the driver's MIG class mig.nvidia.com",
        in_team,
        outcome(
            claims(&dev)
                .create(&pp, &claim("e8", "mig.nvidia.com", 1))
                .await,
        ),
    ));
    table.push((
        "the member's own template naming gpu.nvidia.com",
        in_team,
        outcome(
            templates(&dev)
                .create(
                    &pp,
                    &serde_json::from_value(json!({"metadata": {"name": "mine"},
                        "spec": {"spec": {"devices": exactly("gpu.nvidia.com", json!({}))}}}))
                    .unwrap(),
                )
                .await,
        ),
    ));
    table.push((
        "a Pod asking for nvidia.com/gpu (the driver class's extended resource)",
        "extended resource outside the team's quotas",
        outcome(
            pods(&dev)
                .create(&pp, &extended_pod("e10", json!({"nvidia.com/gpu": "1"})))
                .await,
        ),
    ));
    table.push((
        "a Pod asking for deviceclass.resource.kubernetes.io/gpu.nvidia.com",
        "extended resource outside the team's quotas",
        outcome(
            pods(&dev)
                .create(
                    &pp,
                    &extended_pod(
                        "e11",
                        json!({"deviceclass.resource.kubernetes.io/gpu.nvidia.com": "1"}),
                    ),
                )
                .await,
        ),
    ));
    table.push((
        "deleting the team's ResourceQuota",
        forbidden,
        outcome(
            Api::<ResourceQuota>::namespaced(alice.clone(), &dev)
                .delete("teamgpu", &DeleteParams::default())
                .await,
        ),
    ));
    table.push((
        "relabelling the namespace into another team",
        forbidden,
        outcome(
            Api::<Namespace>::all(alice.clone())
                .patch(
                    &dev,
                    &PatchParams::default(),
                    &Patch::Merge(&json!({"metadata": {"labels": {TEAM_LABEL: "inference"}}})),
                )
                .await,
        ),
    ));
    table.push((
        "creating a DeviceClass of her own",
        forbidden,
        outcome(
            Api::<DeviceClass>::all(alice.clone())
                .create(
                    &pp,
                    &serde_json::from_value(
                        json!({"metadata": {"name": "alice.example.com"}, "spec": {}}),
                    )
                    .unwrap(),
                )
                .await,
        ),
    ));
    table.push((
        "a teamgpu class in a namespace outside every team",
        outside,
        outcome(
            claims(&web)
                .create(&pp, &claim("e15", "a100-80gb.teamgpu.io", 1))
                .await,
        ),
    ));
    table.push((
        "the driver's class gpu.nvidia.com outside every team",
        outside,
        outcome(
            claims(&web)
                .create(&pp, &claim("e16", "gpu.nvidia.com", 4))
                .await,
        ),
    ));
    table.push((
        "a template with mig.nvidia.com in firstAvailable outside every team",
        outside,
        outcome(
            templates(&web)
                .create(
                    &pp,
                    &serde_json::from_value(json!({"metadata": {"name": "mine"},
                        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "firstAvailable": [
                            {"name": "nic", "deviceClassName": "nic.example.com"},
                            {"name": "mig", "deviceClassName": "mig.nvidia.com"}]}]}}}}))
                    .unwrap(),
                )
                .await,
        ),
    ));
    table.push((
        "a Pod asking for nvidia.com/gpu outside every team",
        outside,
        outcome(
            pods(&web)
                .create(&pp, &extended_pod("e18", json!({"nvidia.com/gpu": "2"})))
                .await,
        ),
    ));
    table.push((
        "a Pod asking for deviceclass.resource.kubernetes.io/a100-80gb.teamgpu.io outside every team",
        outside,
        outcome(
            pods(&web)
                .create(&pp, &extended_pod("e19", json!({"deviceclass.resource.kubernetes.io/a100-80gb.teamgpu.io": "1"})))
                .await,
        ),
    ));
    table.push((
        "labelling web as exempt",
        forbidden,
        outcome(
            Api::<Namespace>::all(alice.clone())
                .patch(
                    &web,
                    &PatchParams::default(),
                    &Patch::Merge(&json!({"metadata": {"labels": {"teamgpu.io/exempt": "true"}}})),
                )
                .await,
        ),
    ));
    println!("\n| # | escape attempt (as alice, `edit`) | result |\n|---|---|---|");
    for (i, (attempt, _, outcome)) in table.iter().enumerate() {
        let result = match outcome {
            Ok(()) => "**admitted**".to_owned(),
            Err((code, message)) => format!(
                "refused {code}: {}",
                message.chars().take(140).collect::<String>()
            ),
        };
        println!("| {} | {attempt} | {result} |", i + 1);
    }
    for (attempt, says, outcome) in &table {
        match outcome {
            Err((_, message)) => assert!(
                message.contains(says),
                "{attempt}: refused, but saying {message:?} instead of {says:?}"
            ),
            Ok(()) => panic!("{attempt}: admitted"),
        }
    }

    // What she may do still works: her team's class, other devices outside teams, and reading
    // her team's events and quota.
    claims(&dev)
        .create(&pp, &claim("fine", "a100-80gb.teamgpu.io", 1))
        .await
        .unwrap();
    claims(&web)
        .create(&pp, &claim("nic", "nic.example.com", 1))
        .await
        .unwrap();
    pods(&web)
        .create(
            &pp,
            &extended_pod("dongle", json!({"example.com/dongle": "1"})),
        )
        .await
        .unwrap();
    let quota = Api::<ResourceQuota>::namespaced(alice.clone(), &dev)
        .get("teamgpu")
        .await
        .unwrap();
    assert!(quota.spec.is_some());
    // Events about her team are recorded in her namespace, about its quota.
    let events = eventually("team events in ml-research-dev", CONVERGE, || async {
        let list = Api::<k8s_openapi::api::events::v1::Event>::namespaced(alice.clone(), &dev)
            .list(&Default::default())
            .await
            .map_err(|e| e.to_string())?;
        let ours: Vec<_> = list
            .items
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some("QuotaChanged"))
            .collect();
        if ours.is_empty() {
            Err("no QuotaChanged event".to_owned())
        } else {
            Ok(ours)
        }
    })
    .await;
    let event = &events[0];
    let regarding = event.regarding.as_ref().unwrap();
    assert_eq!(
        (regarding.kind.as_deref(), regarding.name.as_deref()),
        (Some("ResourceQuota"), Some("teamgpu"))
    );
    assert!(
        event
            .note
            .as_deref()
            .unwrap_or_default()
            .starts_with("TeamGpuPolicy ml-research: "),
        "{event:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_members_move_namespaces_into_and_out_of_their_team() {
    let Some((world, _operator)) = World::with_samples().await else {
        return;
    };
    // ml-research's members: alice, and the group ml-leads. Both alice and bob may label
    // namespaces (a ClusterRole of their own), as in a cluster where teams self-serve.
    let patch = json!({"spec": {"members": [
        {"kind": "User", "name": "alice"}, {"kind": "Group", "name": "ml-leads"}]}});
    Api::<TeamGpuPolicy>::all(world.client.clone())
        .patch(
            "ml-research",
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
        .unwrap();
    for user in ["alice", "bob", "carol"] {
        grant_cluster(
            &world,
            user,
            "e2e-namespace-labeller",
            Some(json!([{"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get", "list", "patch", "update"]}])),
        )
        .await;
    }
    let namespaces = |client: &Client| Api::<Namespace>::all(client.clone());
    let label =
        |team: Option<&str>| Patch::Merge(json!({"metadata": {"labels": {TEAM_LABEL: team}}}));
    let alice = as_user(&world, "alice", &[]);
    let bob = as_user(&world, "bob", &[]);
    let carol = as_user(&world, "carol", &["ml-leads"]);
    world.namespace("ml-alice", None).await;
    world.namespace("ml-bob", None).await;
    let (ml_alice, ml_bob) = (world.ns("ml-alice"), world.ns("ml-bob"));
    let pp = PatchParams::default();

    // Admission has the policy with the new members once alice's dry run passes (the samples'
    // members did not name her, so until then she is refused too).
    let dry = PatchParams {
        dry_run: true,
        ..Default::default()
    };
    eventually("admission knows alice is a member", CONVERGE, || async {
        namespaces(&alice)
            .patch(&ml_alice, &dry, &label(Some("ml-research")))
            .await
            .map(drop)
            .map_err(|e| e.to_string())
    })
    .await;
    // bob is no member: refused.
    let refused = eventually("bob is refused", CONVERGE, || async {
        match outcome(
            namespaces(&bob)
                .patch(&ml_bob, &pp, &label(Some("ml-research")))
                .await,
        ) {
            Err((code, message)) => Ok((code, message)),
            Ok(()) => {
                // Admitted before admission saw the policy: undo and try again.
                world.label("ml-bob", None).await;
                Err("admitted".to_owned())
            }
        }
    })
    .await;
    assert_eq!(refused.0, 403, "{refused:?}");
    assert!(
        refused.1.contains(
            "only members of TeamGpuPolicy ml-research (spec.members) or cluster admins may add a namespace to the team"
        ),
        "{refused:?}"
    );
    // alice (by name) and carol (by group) may.
    namespaces(&alice)
        .patch(&ml_alice, &pp, &label(Some("ml-research")))
        .await
        .unwrap();
    namespaces(&carol)
        .patch(&ml_bob, &pp, &label(Some("ml-research")))
        .await
        .unwrap();
    // An unrelated label on a team namespace is anyone's business.
    namespaces(&bob)
        .patch(
            &ml_alice,
            &pp,
            &Patch::Merge(json!({"metadata": {"labels": {"cost-center": "42"}}})),
        )
        .await
        .unwrap();
    // Taking a namespace out, or over to another team, needs membership too.
    let left = outcome(namespaces(&bob).patch(&ml_alice, &pp, &label(None)).await);
    assert!(
        matches!(&left, Err((403, m)) if m.contains("may take a namespace out of the team")),
        "{left:?}"
    );
    let moved = outcome(
        namespaces(&alice)
            .patch(&ml_alice, &pp, &label(Some("inference")))
            .await,
    );
    assert!(
        matches!(&moved, Err((403, m)) if m.contains("only members of TeamGpuPolicy inference")),
        "{moved:?}"
    );
    namespaces(&alice)
        .patch(&ml_alice, &pp, &label(None))
        .await
        .unwrap();
    // The exemption is the admins' alone.
    let exempt = Patch::Merge(json!({"metadata": {"labels": {"teamgpu.io/exempt": "true"}}}));
    let by_alice = outcome(namespaces(&alice).patch(&ml_alice, &pp, &exempt).await);
    assert!(
        matches!(&by_alice, Err((403, m)) if m.contains("only cluster admins may set or change the label teamgpu.io/exempt")),
        "{by_alice:?}"
    );
    namespaces(&world.client)
        .patch(&ml_alice, &pp, &exempt)
        .await
        .unwrap();

    // A member list naming an unknown kind is refused by the CRD, saying what is allowed.
    let robot = json!({"spec": {"members": [{"kind": "Robot", "name": "r2d2"}]}});
    let bad = outcome(
        Api::<TeamGpuPolicy>::all(world.client.clone())
            .patch("ml-research", &pp, &Patch::Merge(&robot))
            .await,
    );
    assert!(
        matches!(&bad, Err((422, m)) if m.contains("spec.members[0].kind: Unsupported value: \"Robot\"")
            && m.contains("\"User\", \"Group\", \"ServiceAccount\"")),
        "{bad:?}"
    );
    let sa = json!({"spec": {"members": [{"kind": "ServiceAccount", "name": "argocd"}]}});
    let bad = outcome(
        Api::<TeamGpuPolicy>::all(world.client.clone())
            .patch("ml-research", &pp, &Patch::Merge(&sa))
            .await,
    );
    assert!(
        matches!(&bad, Err((422, m)) if m.contains("namespace is required for a ServiceAccount member")),
        "{bad:?}"
    );

    // Members read their team's policy through `view`, which teamgpu-viewer is aggregated into.
    let read = outcome(
        Api::<TeamGpuPolicy>::all(bob.clone())
            .get("ml-research")
            .await,
    );
    assert!(matches!(&read, Err((403, _))), "{read:?}");
    grant_cluster(&world, "bob", "view", None).await;
    eventually(
        "bob reads TeamGpuPolicies through view",
        CONVERGE,
        || async {
            Api::<TeamGpuPolicy>::all(bob.clone())
                .get("ml-research")
                .await
                .map(drop)
                .map_err(|e| e.to_string())?;
            Api::<GpuSharingPolicy>::all(bob.clone())
                .list(&Default::default())
                .await
                .map(drop)
                .map_err(|e| e.to_string())
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exempt_namespace_may_use_governed_devices_and_teams_see_them_used_outside() {
    let Some((world, _operator)) = World::with_samples().await else {
        return;
    };
    let client = world.client.clone();
    world.namespace("monitoring", None).await;
    let monitoring = world.ns("monitoring");
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), &monitoring);
    let pp = PostParams::default();
    admission_denies(
        &world,
        "monitoring",
        &claim("probe", "gpu.nvidia.com", 1),
        "belongs to no TeamGpuPolicy",
    )
    .await;
    // An admin exempts the namespace; admission lets the driver's class through there.
    Api::<Namespace>::all(client.clone())
        .patch(
            &monitoring,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"teamgpu.io/exempt": "true"}}})),
        )
        .await
        .unwrap();
    let admitted = eventually(
        "the exempt namespace may claim gpu.nvidia.com",
        CONVERGE,
        || async {
            claims
                .create(&pp, &claim("dcgm", "gpu.nvidia.com", 2))
                .await
                .map_err(|e| e.to_string())
        },
    )
    .await;
    // Two A100-80GB devices (as the server lists them) are allocated to it, as the scheduler would.
    let slices = Api::<k8s_openapi::api::resource::v1::ResourceSlice>::all(client.clone())
        .list(&kube::api::ListParams::default().labels("teamgpu.io/e2e=true"))
        .await
        .unwrap();
    let a100: Vec<(String, String)> = slices
        .items
        .iter()
        .flat_map(|s| {
            s.spec.devices.iter().flatten().filter_map(move |d| {
                let product = d.attributes.as_ref()?.get("productName")?.string.clone()?;
                (product == "NVIDIA A100-SXM4-80GB")
                    .then(|| (s.spec.pool.name.clone(), d.name.clone()))
            })
        })
        .take(2)
        .collect();
    assert_eq!(a100.len(), 2);
    let status = json!({"status": {"allocation": {"devices": {"results": a100.iter().map(|(pool, device)| json!({
        "request": "gpu", "driver": "gpu.nvidia.com", "pool": pool, "device": device})).collect::<Vec<_>>()}}}});
    claims
        .patch_status(
            &admitted.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&status),
        )
        .await
        .unwrap();
    // The sharing policy says so, and the teams share 30 of its 32 devices.
    let policy = eventually(
        "a100-80gb reports devices used outside teams",
        CONVERGE,
        || async {
            let p = Api::<GpuSharingPolicy>::all(client.clone())
                .get("a100-80gb")
                .await
                .map_err(|e| e.to_string())?;
            let status = p.status.clone().ok_or("no status")?;
            if status.used_outside_teams == 2 {
                Ok(status)
            } else {
                Err(format!("{status:?}"))
            }
        },
    )
    .await;
    assert_eq!(policy.devices, 32);
    let c = condition(&policy.conditions, "UsedOutsideTeams").unwrap();
    assert_eq!(c.status, "True");
    assert_eq!(
        c.message,
        format!(
            "2 of 32 matching devices are allocated through other DeviceClasses, to {monitoring}/dcgm: teams share the other 30"
        )
    );
    eventually("teams count 30 devices", CONVERGE, || async {
        let q = world.quota_status("inference", "a100-80gb").await?;
        if q.capacity == 30 {
            Ok(())
        } else {
            Err(format!("{q:?}"))
        }
    })
    .await;
    // Once the claim is gone, the devices are the teams' again.
    claims
        .delete("dcgm", &DeleteParams::default())
        .await
        .unwrap();
    eventually("the condition clears", CONVERGE, || async {
        let p = Api::<GpuSharingPolicy>::all(client.clone())
            .get("a100-80gb")
            .await
            .map_err(|e| e.to_string())?;
        let status = p.status.ok_or("no status")?;
        let c = condition(&status.conditions, "UsedOutsideTeams").ok_or("no condition")?;
        if status.used_outside_teams == 0 && c.status == "False" {
            Ok(())
        } else {
            Err(format!("{c:?}"))
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reclaim_waits_for_a_pod_disruption_budget_and_stops_at_the_borrowers_guarantee() {
    let Some(world) = World::new().await else {
        return;
    };
    let client = world.client.clone();
    world.owner_and_borrower().await;
    let _operator = world.operator();
    let borrower = world.ns("borrower");
    // The borrower's Pods may not be disrupted at all.
    let pdb: k8s_openapi::api::policy::v1::PodDisruptionBudget = serde_json::from_value(json!({
        "metadata": {"name": "no-disruption"},
        "spec": {"maxUnavailable": 0, "selector": {}}
    }))
    .unwrap();
    let pdbs = Api::<k8s_openapi::api::policy::v1::PodDisruptionBudget>::namespaced(
        client.clone(),
        &borrower,
    );
    pdbs.create(&PostParams::default(), &pdb).await.unwrap();
    eventually("the borrower may borrow 8 more", CONVERGE, || async {
        let q = world.quota_status("borrower", "pcie").await?;
        if q.entitlement >= 12 {
            Ok(())
        } else {
            Err(format!("{q:?}"))
        }
    })
    .await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &borrower);
    for i in 0..12 {
        pods.create(
            &PostParams::default(),
            &gpu_pod(&format!("job-{i:02}"), "pcie"),
        )
        .await
        .unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    eventually("the borrower holds 12 devices", CONVERGE, || async {
        let q = world.quota_status("borrower", "pcie").await?;
        if q.allocated == 12 {
            Ok(())
        } else {
            Err(format!("{q:?}"))
        }
    })
    .await;

    // The owner wants its 8: 4 are free, 4 must come back, but the budget refuses evictions.
    let owner_pods: Api<Pod> = Api::namespaced(client.clone(), &world.ns("owner"));
    for i in 0..8 {
        owner_pods
            .create(
                &PostParams::default(),
                &gpu_pod(&format!("serve-{i}"), "pcie"),
            )
            .await
            .unwrap();
    }
    let events = Api::<k8s_openapi::api::events::v1::Event>::namespaced(client.clone(), &borrower);
    let refused = eventually(
        "a refused eviction is reported",
        Duration::from_secs(40),
        || async {
            let list = events
                .list(&Default::default())
                .await
                .map_err(|e| e.to_string())?;
            list.items
                .into_iter()
                .find(|e| e.reason.as_deref() == Some("EvictionRefused"))
                .ok_or_else(|| "no EvictionRefused event".to_owned())
        },
    )
    .await;
    assert_eq!(
        refused.regarding.as_ref().and_then(|r| r.kind.as_deref()),
        Some("Pod"),
        "{refused:?}"
    );
    assert_eq!(
        pods.list(&Default::default()).await.unwrap().items.len(),
        12
    );

    // Once the budget allows it, reclaim goes on by itself (no other change wakes it) and takes
    // exactly what was borrowed beyond the free devices: the borrower keeps 8, above its 4.
    pdbs.delete("no-disruption", &DeleteParams::default())
        .await
        .unwrap();
    eventually(
        "the owner gets all 8 guaranteed devices",
        Duration::from_secs(60),
        || async {
            let q = world.quota_status("owner", "pcie").await?;
            if q.allocated == 8 {
                Ok(())
            } else {
                Err(format!("{q:?}"))
            }
        },
    )
    .await;
    let left: Vec<String> = pods
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .map(|p| p.name_any())
        .collect();
    assert_eq!(
        left,
        [
            "job-00", "job-01", "job-02", "job-03", "job-04", "job-05", "job-06", "job-07"
        ],
        "the newest 4 go, no more"
    );
}

/// The operator keeps of each device only the attributes some selector reads. A policy whose
/// selector reads attributes nothing read before must see them: the slices are listed again,
/// and its devices are counted as the whole device would be.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_selector_reading_new_attributes_counts_devices_as_if_whole() {
    let Some((world, _operator)) = World::with_samples().await else {
        return;
    };
    let gsp: Api<GpuSharingPolicy> = Api::all(world.client.clone());
    let devices_of = |name: &'static str, want: u32| {
        let gsp = gsp.clone();
        async move {
            eventually(
                &format!("{name} counts {want} devices"),
                CONVERGE,
                || async {
                    let p = gsp.get(name).await.map_err(|e| e.to_string())?;
                    let status = p.status.ok_or("no status")?;
                    let ready = condition(&status.conditions, "Ready").map(|c| c.status.clone());
                    if status.devices == want && ready.as_deref() == Some("True") {
                        Ok(())
                    } else {
                        Err(format!("{} devices, Ready {ready:?}", status.devices))
                    }
                },
            )
            .await;
        }
    };
    // No sample and no NVIDIA class reads `addressingMode`: every one of the 48 GPUs of the
    // six fixture nodes has `addressingMode: HMM`.
    let policy: GpuSharingPolicy = serde_json::from_value(json!({
        "apiVersion": "teamgpu.io/v1alpha1", "kind": "GpuSharingPolicy",
        "metadata": {"name": "hmm"},
        "spec": {"driver": "gpu.nvidia.com",
                 "selector": {"deviceType": "gpu",
                              "cel": ["device.attributes['gpu.nvidia.com'].addressingMode == 'HMM'"]},
                 "sharing": {"strategy": "Exclusive"}}
    }))
    .unwrap();
    gsp.create(&PostParams::default(), &policy).await.unwrap();
    devices_of("hmm", 48).await;
    // Nor `uuid`: the fixture nodes repeat the template slice's UUIDs, so gpu-0 of each of the
    // six nodes has this one.
    let patch = json!({"spec": {"selector": {"cel": [
        "device.attributes['gpu.nvidia.com'].uuid == 'GPU-2fa81118-5a5f-aa66-7660-471eed407181'"
    ]}}});
    gsp.patch("hmm", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    devices_of("hmm", 6).await;
    // The samples are counted as before.
    devices_of("a100-80gb", 32).await;
}
