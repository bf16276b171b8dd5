//! Status from what was applied, on a real control plane: an admission policy of the test's own
//! refuses the operator's ResourceQuota in one team namespace. The team's status must say so
//! (condition `Applied`, naming the quota and the API server's message; `Ready` not True), a
//! Warning Event must follow after three refusals in a row, once; and once the test removes its
//! policy, the quota is applied, the status is Ready again and an idle operator writes nothing.
//! The `teamgpu_condition` metrics say what the status says, at each step.
//! Expected values are written here or come from the API server.

use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::core::v1::ResourceQuota;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::json;
use teamgpu::api::{GpuSharingPolicy, TeamGpuPolicy, TeamGpuPolicyStatus};
use teamgpu_e2e::cluster::{OPERATOR_NAMESPACE, recorded};
use teamgpu_e2e::eventually;
use teamgpu_e2e::fixtures::{fresh, samples};
use teamgpu_e2e::http::{free_local_addr, http_get, series_value};
use teamgpu_e2e::operator::Operator;
use teamgpu_e2e::sandbox::{E2E_LABEL, Sandbox, TEAM_LABEL};

/// The test's admission policy and its binding.
const REFUSER: &str = "e2e-refuse-teamgpu-quota";
/// What the test's policy says when it refuses.
const REFUSAL: &str = "e2e: the quota of this namespace is set by hand";
/// Generous: a shared 2-core machine; the operator's backoff reaches tens of seconds.
const WAIT: Duration = Duration::from_secs(120);
/// How long the cleared cluster is watched for writes.
const IDLE: Duration = Duration::from_secs(5);

/// The test's ValidatingAdmissionPolicy and binding, which refuse a ResourceQuota named
/// `teamgpu` in one namespace; deleted when dropped (also on panic).
struct Refuser {
    client: Client,
    config: kube::Config,
}

impl Refuser {
    async fn install(client: Client, config: kube::Config, namespace: &str) -> Refuser {
        let refuser = Refuser { client, config };
        refuser.delete().await;
        let policy: ValidatingAdmissionPolicy = serde_json::from_value(json!({
            "metadata": {"name": REFUSER, "labels": {E2E_LABEL: "true"}},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {
                    "resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
                                       "operations": ["CREATE", "UPDATE"],
                                       "resources": ["resourcequotas"]}],
                    "namespaceSelector": {
                        "matchLabels": {"kubernetes.io/metadata.name": namespace}
                    }
                },
                "validations": [{"expression": "object.metadata.name != 'teamgpu'",
                                 "message": REFUSAL}]
            }
        }))
        .unwrap();
        let binding: ValidatingAdmissionPolicyBinding = serde_json::from_value(json!({
            "metadata": {"name": REFUSER, "labels": {E2E_LABEL: "true"}},
            "spec": {"policyName": REFUSER, "validationActions": ["Deny"]}
        }))
        .unwrap();
        let pp = PostParams::default();
        Api::<ValidatingAdmissionPolicy>::all(refuser.client.clone())
            .create(&pp, &policy)
            .await
            .unwrap();
        Api::<ValidatingAdmissionPolicyBinding>::all(refuser.client.clone())
            .create(&pp, &binding)
            .await
            .unwrap();
        // Admission takes a policy in a moment later: wait until it refuses a dry run.
        let quotas: Api<ResourceQuota> = Api::namespaced(refuser.client.clone(), namespace);
        let quota: ResourceQuota =
            serde_json::from_value(json!({"metadata": {"name": "teamgpu"}})).unwrap();
        let dry_run = PostParams {
            dry_run: true,
            ..PostParams::default()
        };
        eventually("the test's policy refuses the quota", WAIT, || async {
            match quotas.create(&dry_run, &quota).await {
                Err(kube::Error::Api(s)) if s.message.contains(REFUSAL) => Ok(()),
                other => Err(format!("{other:?}")),
            }
        })
        .await;
        refuser
    }

    async fn delete(&self) {
        delete_refuser(&self.client).await;
    }
}

async fn delete_refuser(client: &Client) {
    let dp = DeleteParams::default();
    let _ = Api::<ValidatingAdmissionPolicyBinding>::all(client.clone())
        .delete(REFUSER, &dp)
        .await;
    let _ = Api::<ValidatingAdmissionPolicy>::all(client.clone())
        .delete(REFUSER, &dp)
        .await;
}

impl Drop for Refuser {
    /// Deletes on a thread with its own runtime (Drop cannot await).
    fn drop(&mut self) {
        let config = self.config.clone();
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime");
            rt.block_on(async move {
                if let Ok(client) = Client::try_from(config) {
                    delete_refuser(&client).await;
                }
            });
        })
        .join();
    }
}

/// The example's namespaces.
async fn namespaces(sandbox: &Sandbox) {
    let example = teamgpu::cli::example::state().unwrap();
    for ns in &example.namespaces {
        let team = ns.labels.get(TEAM_LABEL).map(String::as_str);
        sandbox.namespace(&ns.name, team).await.unwrap();
    }
}

/// The samples' policies, as a user installs them.
async fn install(sandbox: &Sandbox) {
    let (sharing, teams) = samples();
    let pp = PostParams::default();
    for p in &sharing {
        Api::<GpuSharingPolicy>::all(sandbox.client())
            .create(&pp, &fresh(p))
            .await
            .unwrap();
    }
    for t in &teams {
        // Namespaces named explicitly are this sandbox's.
        let mut t = fresh(t);
        t.spec.namespaces = t.spec.namespaces.iter().map(|n| sandbox.ns(n)).collect();
        Api::<TeamGpuPolicy>::all(sandbox.client())
            .create(&pp, &t)
            .await
            .unwrap();
    }
}

async fn team_status(client: &Client, team: &str) -> Result<TeamGpuPolicyStatus, String> {
    let t = Api::<TeamGpuPolicy>::all(client.clone())
        .get(team)
        .await
        .map_err(|e| e.to_string())?;
    t.status.ok_or_else(|| format!("{team} has no status"))
}

/// The `teamgpu_condition` series of team `team` and condition `type_` on the operator's
/// `/metrics` at `addr`; `None` when there is none.
async fn condition_metric(addr: std::net::SocketAddr, team: &str, type_: &str) -> Option<f64> {
    let (code, body) = http_get(addr, "/metrics").await.expect("/metrics answers");
    assert_eq!(code, 200, "{body}");
    let series =
        format!(r#"teamgpu_condition{{kind="TeamGpuPolicy",name="{team}",type="{type_}"}}"#);
    series_value(&body, &series)
}

fn condition<'a>(status: &'a TeamGpuPolicyStatus, type_: &str) -> Option<&'a Condition> {
    status.conditions.iter().find(|c| c.type_ == type_)
}

/// The WriteRefused Events about `kind` `name`, anywhere.
async fn refused_events(client: &Client, kind: &str, name: &str) -> Vec<Event> {
    let events = Api::<Event>::all(client.clone())
        .list(&ListParams::default())
        .await
        .unwrap();
    (events.items.into_iter())
        .filter(|e| e.reason.as_deref() == Some("WriteRefused"))
        .filter(|e| {
            e.regarding
                .as_ref()
                .is_some_and(|r| r.kind.as_deref() == Some(kind) && r.name.as_deref() == Some(name))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_quota_shows_on_its_team_until_it_is_applied() {
    let Some((sandbox, operator)) = Sandbox::with_example_devices().await else {
        return;
    };
    let client = sandbox.client();
    // The sample team ml-research owns ml-research-dev (by label) and ml-research-train.
    let refused_ns = sandbox.ns("ml-research-dev");
    namespaces(&sandbox).await;
    let refuser = Refuser::install(
        client.clone(),
        sandbox.cluster().config().clone(),
        &refused_ns,
    )
    .await;
    install(&sandbox).await;
    let (operator_client, requests) = recorded(operator);
    let metrics = free_local_addr();
    let running = Operator::start(
        operator_client,
        teamgpu::controller::Config {
            metrics_addr: metrics,
            lease_namespace: OPERATOR_NAMESPACE.into(),
            lease_name: sandbox.ns("teamgpu-leader"),
            ..Operator::test_config()
        },
    );

    // The team's status names the refused quota and the API server's words; Ready is not True.
    let object = format!("ResourceQuota {refused_ns}/teamgpu");
    let status = eventually("ml-research shows the refused quota", WAIT, || async {
        let s = team_status(&client, "ml-research").await?;
        let applied = condition(&s, "Applied").ok_or(format!("no Applied: {s:?}"))?;
        if applied.message.contains(&object) && applied.message.contains(REFUSAL) {
            Ok(s)
        } else {
            Err(format!("{applied:?}"))
        }
    })
    .await;
    let applied = condition(&status, "Applied").unwrap();
    assert_eq!(
        (applied.status.as_str(), applied.reason.as_str()),
        ("False", "WriteRefused")
    );
    assert!(
        applied
            .message
            .contains(&format!("ValidatingAdmissionPolicy '{REFUSER}'")),
        "the API server's message names the policy that refused: {}",
        applied.message
    );
    let ready = condition(&status, "Ready").unwrap();
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("False", "WriteRefused"),
        "{ready:?}"
    );
    // The metrics are set in the pass that writes the status, before the write.
    assert_eq!(
        (
            condition_metric(metrics, "ml-research", "Ready").await,
            condition_metric(metrics, "ml-research", "Applied").await
        ),
        (Some(0.0), Some(0.0)),
        "the metrics say what the status says while the quota is refused"
    );
    // The team's other namespace got its quota; the other teams are Ready.
    eventually("a quota in ml-research-train", WAIT, || async {
        Api::<ResourceQuota>::namespaced(client.clone(), &sandbox.ns("ml-research-train"))
            .get("teamgpu")
            .await
            .map_err(|e| e.to_string())
    })
    .await;
    for team in ["inference", "data-science"] {
        eventually(&format!("{team} is Ready"), WAIT, || async {
            let s = team_status(&client, team).await?;
            match condition(&s, "Ready") {
                Some(c) if c.status == "True" && condition(&s, "Applied").is_none() => Ok(()),
                other => Err(format!("{other:?}")),
            }
        })
        .await;
    }

    // A Warning Event on the team after three refusals in a row, and on the quota in its
    // namespace, where the team's members read Events.
    let events = eventually("a WriteRefused Event on ml-research", WAIT, || async {
        let events = refused_events(&client, "TeamGpuPolicy", "ml-research").await;
        if events.is_empty() {
            Err("none yet".to_owned())
        } else {
            Ok(events)
        }
    })
    .await;
    let note = events[0].note.clone().unwrap_or_default();
    assert_eq!(events[0].type_.as_deref(), Some("Warning"));
    assert!(
        note.contains(&object)
            && note.contains("refused 3 times in a row")
            && note.contains(REFUSAL),
        "{note}"
    );
    let in_namespace = refused_events(&client, "ResourceQuota", "teamgpu").await;
    assert!(
        in_namespace
            .iter()
            .any(|e| e.metadata.namespace.as_deref() == Some(&refused_ns)
                && e.note
                    .as_deref()
                    .is_some_and(|n| n.starts_with("TeamGpuPolicy ml-research: "))),
        "{in_namespace:?}"
    );

    // While the refusals go on, the status changes only with a new refusal (it says how many),
    // and the Event is not published again.
    let now = team_status(&client, "ml-research").await.unwrap();
    let refused_before = count_in(&condition(&now, "Applied").unwrap().message);
    let (statuses, quota_applies) = (
        requests.get("patch", "teamgpupolicies.teamgpu.io/status"),
        requests.get("patch", "resourcequotas"),
    );
    eventually("two more refusals", WAIT, || async {
        let s = team_status(&client, "ml-research").await?;
        let n = condition(&s, "Applied").map(|c| count_in(&c.message));
        match n {
            Some(n) if n >= refused_before + 2 => Ok(()),
            other => Err(format!("refused {other:?} times")),
        }
    })
    .await;
    let status_writes = requests.get("patch", "teamgpupolicies.teamgpu.io/status") - statuses;
    let refusals = requests.get("patch", "resourcequotas") - quota_applies;
    eprintln!(
        "Applied: {}\nEvent: {note}\nwhile refused: {status_writes} status writes, {refusals} quota applies",
        applied.message
    );
    assert!(refusals >= 2, "{refusals} refused applies");
    assert!(
        status_writes <= refusals + 1,
        "{status_writes} status writes for {refusals} refused applies"
    );
    let events = refused_events(&client, "TeamGpuPolicy", "ml-research").await;
    assert_eq!(events.len(), 1, "{events:?}");
    assert!(
        events[0].series.is_none(),
        "published once: {:?}",
        events[0]
    );

    // The test's policy goes: the quota is applied, the condition clears, Ready is True.
    refuser.delete().await;
    eventually("the quota in ml-research-dev", WAIT, || async {
        Api::<ResourceQuota>::namespaced(client.clone(), &refused_ns)
            .get("teamgpu")
            .await
            .map_err(|e| e.to_string())
    })
    .await;
    eventually("ml-research is Ready again", WAIT, || async {
        let s = team_status(&client, "ml-research").await?;
        match (condition(&s, "Ready"), condition(&s, "Applied")) {
            (Some(r), None) if r.status == "True" && r.reason == "Planned" => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    assert_eq!(
        (
            condition_metric(metrics, "ml-research", "Ready").await,
            condition_metric(metrics, "ml-research", "Applied").await
        ),
        (Some(1.0), None),
        "the metrics say what the status says once the quota is applied"
    );

    // Settled, then idle: nothing is written.
    let settled = requests.settled(WAIT).await;
    let at_settle = requests.snapshot();
    tokio::time::sleep(IDLE).await;
    assert_eq!(
        requests.stored_writes(),
        settled,
        "an idle operator writes nothing: {at_settle:?} -> {:?}",
        requests.snapshot()
    );
    running.stop().await;
    drop(refuser);
}

/// N of "refused N times" (1 for "once") in a condition's message.
fn count_in(message: &str) -> u32 {
    if message.contains("refused once") {
        return 1;
    }
    (message.split("refused ").nth(1))
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}
