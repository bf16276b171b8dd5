//! A platform team's first day with teamgpu, on a real API server: team members read their own
//! team with nothing but `edit` in a team namespace; a Warn-mode install admits what Deny would
//! refuse, with a warning to the client; `teamgpu plan --live` needs only `teamgpu-planner`;
//! and deleting the CRDs leaves no admission object behind.

use std::panic::AssertUnwindSafe;
use std::time::{Duration, Instant};

use futures::FutureExt as _;
use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, RoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use teamgpu::api::{GpuSharingPolicy, TeamGpuPolicy};
use teamgpu::core::plan::admission::Enforcement;
use teamgpu_e2e::eventually;
use teamgpu_e2e::fixtures::{fresh, samples};
use teamgpu_e2e::operator::Operator;
use teamgpu_e2e::sandbox::{Sandbox, TEAM_LABEL};

const CONVERGE: Duration = Duration::from_secs(20);
const MANAGED: &str = "app.kubernetes.io/managed-by=teamgpu";
/// The refusal of `teamgpu-non-team-requests`, in its message.
const OUTSIDE: &str = "belongs to no TeamGpuPolicy";

/// The example's devices and namespaces, the samples, and an operator in `enforcement` mode.
struct Day {
    sandbox: Sandbox,
    operator: kube::Config,
}

impl Day {
    async fn start() -> Option<Day> {
        let (sandbox, operator) = Sandbox::with_example_devices().await?;
        let example = teamgpu::cli::example::state().unwrap();
        for ns in &example.namespaces {
            let team = ns.labels.get(TEAM_LABEL).map(String::as_str);
            sandbox.namespace(&ns.name, team).await.unwrap();
        }
        sandbox.namespace("outsider", None).await.unwrap();
        let day = Day { sandbox, operator };
        day.install_samples().await;
        Some(day)
    }

    /// [`Day::start`] with an operator in `enforcement` mode, converged.
    async fn with_operator(enforcement: Enforcement) -> Option<(Day, Operator)> {
        let day = Day::start().await?;
        let operator = day.operator(enforcement);
        day.converged(enforcement).await;
        Some((day, operator))
    }

    fn client(&self) -> Client {
        self.sandbox.client()
    }

    fn ns(&self, name: &str) -> String {
        self.sandbox.ns(name)
    }

    fn operator(&self, enforcement: Enforcement) -> Operator {
        let config = teamgpu::controller::Config {
            enforcement,
            ..Operator::test_config()
        };
        Operator::start(Client::try_from(self.operator.clone()).unwrap(), config)
    }

    async fn install_samples(&self) {
        let (sharing, teams) = samples();
        for p in &sharing {
            Api::<GpuSharingPolicy>::all(self.client())
                .create(&PostParams::default(), &fresh(p))
                .await
                .unwrap();
        }
        for t in &teams {
            let mut t = fresh(t);
            t.spec.namespaces = t.spec.namespaces.iter().map(|n| self.ns(n)).collect();
            Api::<TeamGpuPolicy>::all(self.client())
                .create(&PostParams::default(), &t)
                .await
                .unwrap();
        }
    }

    /// Waits until the operator wrote what this file looks at: the members' access of every
    /// sample team and the non-team binding in `enforcement` mode.
    async fn converged(&self, enforcement: Enforcement) {
        let actions = enforcement.validation_actions();
        let roles: Api<ClusterRoleBinding> = Api::all(self.client());
        for team in ["ml-research", "inference", "data-science"] {
            eventually(&format!("{team}'s member binding"), CONVERGE, || async {
                match roles.get_opt(&format!("teamgpu-member-{team}")).await {
                    Ok(Some(_)) => Ok(()),
                    other => Err(format!("{other:?}")),
                }
            })
            .await;
        }
        let bindings: Api<ValidatingAdmissionPolicyBinding> = Api::all(self.client());
        eventually("the non-team binding", CONVERGE, || async {
            let binding = bindings
                .get_opt("teamgpu-non-team-requests")
                .await
                .map_err(|e| e.to_string())?;
            let found = binding.and_then(|b| b.spec?.validation_actions);
            if found.as_ref() == Some(&actions) {
                Ok(())
            } else {
                Err(format!("{found:?}"))
            }
        })
        .await;
    }

    /// `kubectl` as the cluster's admin, with `stdin`: (success, stdout, stderr).
    fn kubectl(&self, args: &[&str], stdin: &str) -> (bool, String, String) {
        use std::io::Write as _;
        let mut child = std::process::Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(self.sandbox.cluster().kubeconfig())
            .args(args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("kubectl on PATH");
        child
            .stdin
            .take()
            .unwrap()
            .write_all(stdin.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        let text = |b: Vec<u8>| String::from_utf8_lossy(&b).into_owned();
        (out.status.success(), text(out.stdout), text(out.stderr))
    }

    /// A server-side dry run of a claim of the driver's own class in `ns`, by kubectl (which
    /// prints the warnings the API server returns): (admitted, everything kubectl printed).
    fn driver_claim(&self, ns: &str) -> (bool, String) {
        let claim = json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": "direct"},
            "spec": {"devices": {"requests": [{"name": "gpu",
                "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}}});
        let (ok, stdout, stderr) = self.kubectl(
            &["create", "--dry-run=server", "-n", &self.ns(ns), "-f", "-"],
            &claim.to_string(),
        );
        (ok, format!("{stdout}{stderr}"))
    }
}

/// What becomes of a claim of the driver's class outside every team.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Outcome {
    Refused,
    /// Admitted with the non-team policy's warning.
    Warned,
    /// Admitted without a word.
    Admitted,
}

impl Day {
    /// Waits until a claim of the driver's class in namespace `outsider` (in no team) meets
    /// `want` (admission applies a binding a moment after it is written); what kubectl printed.
    async fn outsider_claim(&self, want: Outcome) -> String {
        eventually(&format!("{want:?} outside teams"), CONVERGE, || async {
            let (admitted, out) = self.driver_claim("outsider");
            let got = match (admitted, out.contains("Warning:") && out.contains(OUTSIDE)) {
                (false, _) if teamgpu_e2e::refused_outside_teams(&out) => Some(Outcome::Refused),
                (true, true) => Some(Outcome::Warned),
                (true, false) => Some(Outcome::Admitted),
                (false, _) => None,
            };
            if got == Some(want) {
                Ok(out)
            } else {
                Err(format!("{got:?}: {out}"))
            }
        })
        .await
    }
}

/// A client that is `user` in `groups`, impersonated by the admin.
fn as_user(day: &Day, user: &str, groups: &[&str]) -> Client {
    day.sandbox.cluster().as_user(user, groups)
}

/// Gives `user` the built-in `edit` role in `ns`, and nothing else.
async fn edit_in(day: &Day, ns: &str, user: &str) {
    let binding: RoleBinding = serde_json::from_value(json!({
        "metadata": {"name": format!("{user}-edit")},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "edit"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]
    }))
    .unwrap();
    Api::namespaced(day.client(), &day.ns(ns))
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();
}

fn code<T>(result: &Result<T, kube::Error>) -> Option<u16> {
    match result {
        Ok(_) => None,
        Err(kube::Error::Api(s)) => Some(s.code),
        Err(_) => Some(0),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_with_edit_reads_their_team_and_top_shows_it() {
    let Some((day, _operator)) = Day::with_operator(Enforcement::Deny).await else {
        return;
    };
    // bob is in the group ml-research (a member of that team) and has `edit` in one of its
    // namespaces; carol has `edit` in data-science's namespace but is in no member group.
    edit_in(&day, "ml-research-train", "bob").await;
    edit_in(&day, "data-science", "carol").await;
    edit_in(&day, "outsider", "dave").await;
    let bob = as_user(&day, "bob", &["ml-research"]);
    let teams: Api<TeamGpuPolicy> = Api::all(bob.clone());
    let team = teams.get("ml-research").await.expect("bob reads his team");
    assert!(team.status.is_some(), "with its status");
    assert_eq!(code(&teams.get("data-science").await), Some(403));
    assert_eq!(code(&teams.list(&ListParams::default()).await), Some(403));
    // By name, as `kubectl get tgp ml-research --watch` lists and watches.
    let by_name = ListParams::default().fields("metadata.name=ml-research");
    assert_eq!(teams.list(&by_name).await.unwrap().items.len(), 1);
    let sharing: Api<GpuSharingPolicy> = Api::all(bob.clone());
    for policy in ["a100-80gb", "a100-shared"] {
        sharing
            .get(policy)
            .await
            .expect("the team's sharing policies");
    }
    // `kubectl get tgp <team> -o yaml`, as bob.
    let (ok, stdout, stderr) = day.kubectl(
        &[
            "get",
            "tgp",
            "ml-research",
            "-o",
            "yaml",
            "--as",
            "bob",
            "--as-group",
            "ml-research",
        ],
        "",
    );
    assert!(ok, "{stderr}");
    assert!(stdout.contains("name: ml-research"), "{stdout}");

    // `teamgpu top` as bob: his team, found through the namespace he works in.
    let train = day.ns("ml-research-train");
    let policies = teamgpu::cli::top::read(&bob, None, &train).await.unwrap();
    let top = teamgpu::cli::top::top(&policies.teams, &policies.sharing_policies);
    let rows: Vec<(&str, &str)> = top
        .teams
        .iter()
        .map(|r| (r.team.as_str(), r.sharing_policy.as_str()))
        .collect();
    assert_eq!(
        rows,
        [("ml-research", "a100-80gb"), ("ml-research", "a100-shared")]
    );
    assert!(top.teams.iter().all(|r| r.capacity > 0), "{top:?}");
    assert_eq!(top.sharing_policies.len(), 2);
    assert!(
        policies.notes[0].contains("you may not list every team"),
        "{:?}",
        policies.notes
    );
    // carol's namespace names its team, which she may not read: she is told why.
    let carol = as_user(&day, "carol", &[]);
    let error = teamgpu::cli::top::read(&carol, None, &day.ns("data-science"))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("you may not read TeamGpuPolicy data-science")
            && error.contains("spec.members"),
        "{error}"
    );
    // dave's namespace is in no team.
    let dave = as_user(&day, "dave", &[]);
    let error = teamgpu::cli::top::read(&dave, None, &day.ns("outsider"))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("belongs to no team") && error.contains("--team"),
        "{error}"
    );

    // Deleting a team takes its members' access with it (the team owns both objects).
    Api::<TeamGpuPolicy>::all(day.client())
        .delete("ml-research", &DeleteParams::default())
        .await
        .unwrap();
    let roles: Api<ClusterRole> = Api::all(day.client());
    eventually("ml-research's member role gone", CONVERGE, || async {
        match roles.get_opt("teamgpu-member-ml-research").await {
            Ok(None) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warn_admits_a_driver_claim_outside_teams_with_a_warning_and_deny_refuses_it() {
    let Some((day, operator)) = Day::with_operator(Enforcement::Warn).await else {
        return;
    };
    // Admission applies a binding a moment after it is written.
    let warned = day.outsider_claim(Outcome::Warned).await;
    assert!(warned.contains("created (server dry run)"), "{warned}");
    let request = http::Request::get("/metrics").body(Vec::new()).unwrap();
    let metrics = day.client().request_text(request).await.unwrap();
    // The API server counts what Deny would have refused, per policy: the platform team's
    // dashboard before the switch.
    let warned_count = metrics.lines().find(|l| {
        l.starts_with("apiserver_validating_admission_policy_check_total{")
            && l.contains(r#"enforcement_action="warn""#)
            && l.contains(r#"policy="teamgpu-non-team-requests""#)
    });
    assert!(
        warned_count.is_some_and(|l| !l.ends_with(" 0")),
        "{warned_count:?}"
    );
    // The same install switched to Deny.
    operator.stop().await;
    let _operator = day.operator(Enforcement::Deny);
    day.converged(Enforcement::Deny).await;
    day.outsider_claim(Outcome::Refused).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plan_live_needs_only_the_planner_role() {
    let Some((day, _operator)) = Day::with_operator(Enforcement::Deny).await else {
        return;
    };
    // A CI job's ServiceAccount, bound to teamgpu-planner and nothing else.
    let ns = day.ns("outsider");
    let accounts: Api<ServiceAccount> = Api::namespaced(day.client(), &ns);
    let account: ServiceAccount =
        serde_json::from_value(json!({"metadata": {"name": "ci"}})).unwrap();
    accounts
        .create(&PostParams::default(), &account)
        .await
        .unwrap();
    let token = accounts
        .create_token_request("ci", &PostParams::default(), &TokenRequest::default())
        .await
        .unwrap()
        .status
        .unwrap()
        .token;
    let mut config = day.sandbox.cluster().config().clone();
    config.auth_info = kube::config::AuthInfo {
        token: Some(token.into()),
        ..Default::default()
    };
    let ci = Client::try_from(config).unwrap();
    // Without the role: refused.
    let refused = teamgpu::cli::cluster::read(&ci, None, None)
        .await
        .unwrap_err();
    assert!(refused.to_string().contains("forbidden"), "{refused}");
    let name = day.ns("ci-planner");
    let binding: ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": "teamgpu-planner"},
        "subjects": [{"kind": "ServiceAccount", "name": "ci", "namespace": ns}]
    }))
    .unwrap();
    let bindings: Api<ClusterRoleBinding> = Api::all(day.client());
    bindings
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();
    let live = eventually("plan --live as ci", CONVERGE, || async {
        teamgpu::cli::cluster::read(&ci, None, None)
            .await
            .map_err(|e| e.to_string())
    })
    .await;
    bindings
        .delete(&name, &DeleteParams::default())
        .await
        .unwrap();
    // It read everything: the converged cluster needs no write.
    let planned = teamgpu::core::plan::plan(&live.state);
    let desired = teamgpu::core::diff::desired(&planned.objects);
    assert!(
        live.managed
            .keys()
            .any(|k| k.kind == teamgpu::core::diff::Kind::ClusterRoleBinding),
        "the member bindings are read"
    );
    let writes = teamgpu::core::diff::writes(
        &desired,
        &planned.objects.retained_device_classes,
        &planned.objects.retained_owners,
        &live.managed,
    );
    let keys: Vec<String> = writes.iter().map(|w| w.key().to_string()).collect();
    assert!(keys.is_empty(), "plan --live would write: {keys:?}");
}

const CRDS: [&str; 2] = [
    "gpusharingpolicies.teamgpu.io",
    "teamgpupolicies.teamgpu.io",
];

/// teamgpu's admission policies and bindings, as listed: (kind, metadata).
async fn admission_objects(day: &Day) -> Result<Vec<(&'static str, ObjectMeta)>, kube::Error> {
    let managed = ListParams::default().labels(MANAGED);
    let policies = Api::<ValidatingAdmissionPolicy>::all(day.client())
        .list_metadata(&managed)
        .await?;
    let bindings = Api::<ValidatingAdmissionPolicyBinding>::all(day.client())
        .list_metadata(&managed)
        .await?;
    let policies = policies.items.into_iter().map(|p| ("policy", p.metadata));
    let bindings = bindings.items.into_iter().map(|b| ("binding", b.metadata));
    Ok(policies.chain(bindings).collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_the_crds_leaves_no_admission_object_and_the_drivers_classes_open() {
    let Some((day, operator)) = Day::with_operator(Enforcement::Deny).await else {
        return;
    };
    day.outsider_claim(Outcome::Refused).await;
    // Each admission object names both CRDs as its owners.
    let crds: Api<CustomResourceDefinition> = Api::all(day.client());
    let mut uids = Vec::new();
    for name in CRDS {
        uids.push(crds.get(name).await.unwrap().uid().unwrap());
    }
    let objects = admission_objects(&day).await.unwrap();
    assert_eq!(objects.len(), 8, "{objects:?}");
    for (kind, meta) in &objects {
        let owners: Vec<&str> = meta
            .owner_references
            .iter()
            .flatten()
            .map(|o| o.uid.as_str())
            .collect();
        assert_eq!(owners, uids, "{kind} {:?}", meta.name);
    }
    // The operator is uninstalled first (or has crashed): nothing prunes but the collector.
    operator.stop().await;
    uninstall_and_reinstall(&day).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_the_crds_under_a_running_operator_leaves_nothing_behind_either() {
    // `kubectl delete -k config/default` deletes the CRDs and the Deployment together: the
    // operator may see its CRDs go.
    let Some((day, _operator)) = Day::with_operator(Enforcement::Deny).await else {
        return;
    };
    day.outsider_claim(Outcome::Refused).await;
    uninstall_and_reinstall(&day).await;
}

/// [`uninstall`], then the CRDs back, which the other tests of this binary need, also when
/// `uninstall` failed.
async fn uninstall_and_reinstall(day: &Day) {
    let uninstalled = AssertUnwindSafe(uninstall(day)).catch_unwind().await;
    day.sandbox.cluster().reinstall_crds().await.unwrap();
    if let Err(panic) = uninstalled {
        std::panic::resume_unwind(panic);
    }
}

/// Deletes the CRDs and checks that no admission object of teamgpu's remains within 30 s, that
/// a claim of the driver's class is then admitted where no team ever was, and that nothing comes
/// back.
async fn uninstall(day: &Day) {
    let crds: Api<CustomResourceDefinition> = Api::all(day.client());
    let deleted = Instant::now();
    for name in CRDS {
        crds.delete(name, &DeleteParams::default()).await.unwrap();
    }
    let none_left = || async {
        let left = admission_objects(day).await.map_err(|e| e.to_string())?;
        if left.is_empty() {
            Ok(())
        } else {
            Err(format!("{left:?}"))
        }
    };
    eventually(
        "no teamgpu admission object",
        Duration::from_secs(30),
        none_left,
    )
    .await;
    eprintln!(
        "uninstall: no teamgpu admission object {:?} after the CRDs were deleted",
        deleted.elapsed()
    );
    day.outsider_claim(Outcome::Admitted).await;
    eprintln!(
        "uninstall: the driver's class admitted outside teams {:?} after the CRDs were deleted",
        deleted.elapsed()
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    none_left().await.expect("nothing written again");
}
