//! `kubectl get tgp` and `kubectl get gsp` at a glance: the printer columns of the CRDs, which
//! the API server evaluates over the status the operator writes, as kubectl prints them. The
//! numbers expected are worked out here from the devices, quotas and Pods the test makes.

use std::collections::BTreeMap;
use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, Pod, ResourceQuota};
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use teamgpu::api::{GpuSharingPolicy, TeamGpuPolicy};
use teamgpu_e2e::eventually;
use teamgpu_e2e::fixtures::gpu_pod;
use teamgpu_e2e::operator::Operator;
use teamgpu_e2e::sandbox::Sandbox;

/// `kubectl get <resource>` as the admin: each row by its NAME, as column -> value.
fn kubectl_get(
    kubeconfig: &std::path::Path,
    resource: &str,
) -> Result<BTreeMap<String, BTreeMap<String, String>>, String> {
    let out = Command::new("kubectl")
        .args([
            "--kubeconfig",
            kubeconfig.to_str().unwrap(),
            "get",
            resource,
        ])
        .output()
        .map_err(|e| format!("running kubectl: {e}"))?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut lines = text.lines();
    let header: Vec<&str> = lines
        .next()
        .ok_or("no header")?
        .split_whitespace()
        .collect();
    Ok(lines
        .map(|line| {
            let row: BTreeMap<String, String> = header
                .iter()
                .zip(line.split_whitespace())
                .map(|(h, v)| ((*h).to_owned(), v.to_owned()))
                .collect();
            (row["NAME"].clone(), row)
        })
        .collect())
}

/// How long the operator and the control plane may take (a loaded 2-core machine).
const WAIT: Duration = Duration::from_secs(60);

/// [`kubectl_get`], at most five times a second.
async fn kubectl_get_paced(
    kubeconfig: &std::path::Path,
    resource: &str,
) -> Result<BTreeMap<String, BTreeMap<String, String>>, String> {
    tokio::time::sleep(Duration::from_millis(200)).await;
    kubectl_get(kubeconfig, resource)
}

/// The columns of `row` named in `wanted`, with their values, or what differs.
fn columns_are(
    row: Option<&BTreeMap<String, String>>,
    wanted: &[(&str, &str)],
) -> Result<(), String> {
    let row = row.ok_or("no row")?;
    let differ: Vec<String> = wanted
        .iter()
        .filter(|(column, value)| row.get(*column).map(String::as_str) != Some(*value))
        .map(|(column, value)| format!("{column}: {:?}, want {value}", row.get(*column)))
        .collect();
    if differ.is_empty() {
        Ok(())
    } else {
        Err(format!("{differ:?} in {row:?}"))
    }
}

fn create<T: serde::de::DeserializeOwned>(value: serde_json::Value) -> T {
    serde_json::from_value(value).expect("a valid object")
}

/// One claim of the driver's own class in an exempt namespace, allocated one A100 PCIe device
/// by hand (as a scheduler would): a device of sharing policy `pcie` used outside every team.
async fn claim_one_pcie_device_outside_teams(sandbox: &Sandbox) {
    let client = sandbox.client();
    let ns = sandbox.namespace("outside", None).await.unwrap();
    Api::<Namespace>::all(client.clone())
        .patch(
            &ns,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"teamgpu.io/exempt": "true"}}})),
        )
        .await
        .unwrap();
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), &ns);
    let claim: ResourceClaim = create(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "dcgm"},
        "spec": {"devices": {"requests": [{"name": "gpu",
            "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 1}}]}}}));
    // Admission follows the exemption a moment later.
    eventually(
        "the exempt namespace may claim gpu.nvidia.com",
        WAIT,
        || async {
            claims
                .create(&PostParams::default(), &claim)
                .await
                .map_err(|e| e.to_string())
        },
    )
    .await;
    let slices = Api::<ResourceSlice>::all(client)
        .list(&ListParams::default().labels("teamgpu.io/e2e=true"))
        .await
        .unwrap();
    let (pool, device) = slices
        .items
        .iter()
        .find_map(|s| {
            s.spec.devices.iter().flatten().find_map(|d| {
                let product = d.attributes.as_ref()?.get("productName")?.string.clone()?;
                (product == "NVIDIA A100-PCIE-40GB")
                    .then(|| (s.spec.pool.name.clone(), d.name.clone()))
            })
        })
        .expect("an A100 PCIe device");
    let status = json!({"status": {"allocation": {"devices": {"results": [{
        "request": "gpu", "driver": "gpu.nvidia.com", "pool": pool, "device": device}]}}}});
    claims
        .patch_status("dcgm", &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_get_shows_each_teams_and_policys_numbers() {
    let Some((sandbox, operator_config)) = Sandbox::with_example_devices().await else {
        return;
    };
    let client = sandbox.client();
    let kubeconfig = sandbox.cluster().kubeconfig().to_owned();
    // The example's devices: 32 A100 SXM4 80GB (four nodes) and 16 A100 PCIe 40GB (two).
    for (name, product) in [
        ("sxm", "NVIDIA A100-SXM4-80GB"),
        ("pcie", "NVIDIA A100-PCIE-40GB"),
    ] {
        let policy: GpuSharingPolicy = create(json!({
            "apiVersion": "teamgpu.io/v1alpha1", "kind": "GpuSharingPolicy",
            "metadata": {"name": name},
            "spec": {"selector": {"productNames": [product]}}}));
        Api::<GpuSharingPolicy>::all(client.clone())
            .create(&PostParams::default(), &policy)
            .await
            .unwrap();
    }
    let train = sandbox.namespace("columns-train", None).await.unwrap();
    let serve = sandbox.namespace("columns-serve", None).await.unwrap();
    // The only team: 4 of sxm (limit 4) and 2 of pcie, borrowing up to a limit of 6.
    let team: TeamGpuPolicy = create(json!({
        "apiVersion": "teamgpu.io/v1alpha1", "kind": "TeamGpuPolicy",
        "metadata": {"name": "columns"},
        "spec": {"namespaces": [train, serve], "quotas": [
            {"sharingPolicy": "sxm", "guaranteed": 4, "limit": 4},
            {"sharingPolicy": "pcie", "guaranteed": 2, "limit": 6}]}}));
    Api::<TeamGpuPolicy>::all(client.clone())
        .create(&PostParams::default(), &team)
        .await
        .unwrap();
    let operator = Operator::start(
        kube::Client::try_from(operator_config).unwrap(),
        Operator::test_config(),
    );
    claim_one_pcie_device_outside_teams(&sandbox).await;

    eventually("the team's empty row", WAIT, || async {
        let rows = kubectl_get_paced(&kubeconfig, "tgp").await?;
        columns_are(
            rows.get("columns"),
            &[
                ("NAMESPACES", "2"),
                ("GUARANTEED", "6"),
                ("ENTITLEMENT", "10"),
                ("READY", "True"),
            ],
        )
    })
    .await;
    // The quotas are in force (the quota controller has filled in their status) before the
    // Pods come. The team's hards are split between its namespaces until demand shows.
    for ns in [&train, &serve] {
        let quotas: Api<ResourceQuota> = Api::namespaced(client.clone(), ns);
        eventually("the team namespace's quota in force", WAIT, || async {
            let quota = quotas.get_opt("teamgpu").await.map_err(|e| e.to_string())?;
            let hard = quota
                .and_then(|q| q.status)
                .and_then(|s| s.hard)
                .unwrap_or_default();
            let devices = |class: &str| {
                hard.get(&format!(
                    "{class}.teamgpu.io.deviceclass.resource.k8s.io/devices"
                ))
            };
            match (devices("sxm"), devices("pcie")) {
                (Some(_), Some(_)) => Ok(()),
                other => Err(format!("{ns}: {other:?}")),
            }
        })
        .await;
    }
    // Five one-GPU Pods of sxm (a quota of 4: one waits) and two of pcie, one at a time, each
    // allocated before the next comes. With all five at once, while the operator moves the
    // team's quota to the namespace with demand, 5 claims were admitted against a limit of 4 in
    // 3 of about 20 runs (the status then says "quota held at use"): a race of its own, not
    // what this test is about.
    let teams: Api<TeamGpuPolicy> = Api::all(client.clone());
    for (ns, template, count) in [(&train, "sxm", 5), (&serve, "pcie", 2)] {
        let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
        for i in 0..count {
            let pod = gpu_pod(&format!("{template}-{i}"), template);
            pods.create(&PostParams::default(), &pod).await.unwrap();
            let (allocated, pending) = if i < 4 { (i + 1, 0) } else { (4, 1) };
            eventually("the team's status counts the Pod", WAIT, || async {
                let status = teams
                    .get("columns")
                    .await
                    .map_err(|e| e.to_string())?
                    .status;
                let quota = status
                    .and_then(|s| s.quotas.into_iter().find(|q| q.sharing_policy == template))
                    .ok_or("no quota status")?;
                if (quota.allocated, quota.pending) == (allocated, pending) {
                    Ok(())
                } else {
                    Err(format!("{quota:?}"))
                }
            })
            .await;
        }
    }

    eventually("kubectl get tgp", WAIT, || async {
        let rows = kubectl_get_paced(&kubeconfig, "tgp").await?;
        let status = teams
            .get("columns")
            .await
            .map_err(|e| e.to_string())?
            .status;
        let quotas = status.map(|s| s.quotas).unwrap_or_default();
        let context = |e: String| format!("{e}; quotas {quotas:?}");
        columns_are(
            rows.get("columns"),
            &[
                ("WEIGHT", "1"),
                ("NAMESPACES", "2"),
                ("GUARANTEED", "6"),
                ("ENTITLEMENT", "10"),
                ("ALLOCATED", "6"),
                ("PENDING", "1"),
                ("READY", "True"),
            ],
        )
        .map_err(context)
    })
    .await;
    eventually("kubectl get gsp", WAIT, || async {
        let rows = kubectl_get_paced(&kubeconfig, "gsp").await?;
        columns_are(
            rows.get("sxm"),
            &[
                ("DEVICES", "32"),
                ("ALLOCATED", "4"),
                ("OUTSIDE-TEAMS", "0"),
            ],
        )?;
        columns_are(
            rows.get("pcie"),
            &[
                ("DEVICES", "16"),
                ("ALLOCATED", "2"),
                ("OUTSIDE-TEAMS", "1"),
            ],
        )
    })
    .await;
    operator.stop().await;
}
