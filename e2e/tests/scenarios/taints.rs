//! Devices leave capacity within a pass when something keeps claims off them, on the real
//! control plane: a NoSchedule taint in their ResourceSlice, a DeviceTaintRule (served by the
//! harness's control plane, where the DRADeviceTaintRules gate is on), and a Pod's report that a
//! device it holds is unhealthy (`allocatedResourcesStatus`).

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::api::{DynamicObject, ListParams};

use super::*;

impl World {
    /// Waits until GpuSharingPolicy `name` counts `devices`; returns its DevicesFound message.
    async fn devices_are(&self, name: &str, devices: u32) -> String {
        let gsp: Api<GpuSharingPolicy> = Api::all(self.client.clone());
        eventually(&format!("{name} counts {devices}"), CONVERGE, || async {
            let status =
                (gsp.get(name).await.map_err(|e| e.to_string())?.status).ok_or("no status")?;
            let message = condition(&status.conditions, "DevicesFound")
                .map(|c| c.message.clone())
                .unwrap_or_default();
            if status.devices == devices {
                Ok(message)
            } else {
                Err(format!("{} devices: {message}", status.devices))
            }
        })
        .await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_tainted_by_its_slice_a_rule_or_its_pod_leaves_capacity_within_a_pass() {
    let Some(world) = World::new().await else {
        return;
    };
    let client = world.client.clone();
    let policy: GpuSharingPolicy = serde_json::from_value(json!({
        "apiVersion": "teamgpu.io/v1alpha1", "kind": "GpuSharingPolicy",
        "metadata": {"name": "a100-80gb"},
        "spec": {"selector": {"productNames": ["NVIDIA A100-SXM4-80GB"]}}}))
    .unwrap();
    Api::<GpuSharingPolicy>::all(client.clone())
        .create(&PostParams::default(), &policy)
        .await
        .unwrap();
    world.namespace("training", None).await;
    let team: TeamGpuPolicy = serde_json::from_value(json!({
        "apiVersion": "teamgpu.io/v1alpha1", "kind": "TeamGpuPolicy",
        "metadata": {"name": "training"},
        "spec": {"namespaces": [world.ns("training")],
                 "quotas": [{"sharingPolicy": "a100-80gb", "guaranteed": 4, "limit": 8}]}}))
    .unwrap();
    Api::<TeamGpuPolicy>::all(client.clone())
        .create(&PostParams::default(), &team)
        .await
        .unwrap();
    let _operator = world.operator();
    // Four 80GB nodes of 8 GPUs.
    world.devices_are("a100-80gb", 32).await;

    // The driver taints gpu-0 of node gpu-a-01 (as its health check does a lost GPU).
    let slices: Api<ResourceSlice> = Api::all(client.clone());
    let listed = slices.list(&ListParams::default()).await.unwrap();
    let mut slice = (listed.items.into_iter())
        .find(|s| s.spec.pool.name == "gpu-a-01")
        .unwrap();
    let device = &mut slice.spec.devices.as_mut().unwrap()[0];
    device.taints = Some(vec![
        serde_json::from_value(json!({"key": "gpu.nvidia.com/gpu-lost", "effect": "NoSchedule"}))
            .unwrap(),
    ]);
    let started = Instant::now();
    slices
        .replace(&slice.name_any(), &PostParams::default(), &slice)
        .await
        .unwrap();
    let message = world.devices_are("a100-80gb", 31).await;
    println!(
        "slice taint: counted 31 after {} ms",
        started.elapsed().as_millis()
    );
    assert_eq!(
        message,
        "31 devices match; 1 more are tainted NoSchedule or NoExecute (gpu.nvidia.com/gpu-lost) and not counted"
    );

    // An admin takes node gpu-a-02 out for maintenance with a DeviceTaintRule.
    let rules = teamgpu::controller::taint_rules::served(&client)
        .await
        .expect("the harness's control plane serves DeviceTaintRules");
    let rule: DynamicObject = serde_json::from_value(json!({
        "apiVersion": rules.api_version, "kind": "DeviceTaintRule",
        "metadata": {"name": world.ns("maintenance"),
                     "labels": {teamgpu_e2e::sandbox::E2E_LABEL: "true"}},
        "spec": {"deviceSelector": {"driver": "gpu.nvidia.com", "pool": "gpu-a-02"},
                 "taint": {"key": "example.com/maintenance", "effect": "NoSchedule"}}}))
    .unwrap();
    let started = Instant::now();
    Api::<DynamicObject>::all_with(client.clone(), &rules)
        .create(&PostParams::default(), &rule)
        .await
        .unwrap();
    world.devices_are("a100-80gb", 23).await;
    println!(
        "DeviceTaintRule: counted 23 after {} ms",
        started.elapsed().as_millis()
    );

    // A training Pod gets a GPU; its container then reports that GPU unhealthy.
    let ns = world.ns("training");
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    // Kept off the nodes of the two tainted pools: the scheduler may not have seen the rule
    // yet, and a Pod on a device already left out would prove nothing.
    let tainted_nodes: Vec<String> = (slices.list(&ListParams::default()).await.unwrap().items)
        .into_iter()
        .filter(|s| ["gpu-a-01", "gpu-a-02"].contains(&s.spec.pool.name.as_str()))
        .filter_map(|s| s.spec.node_name)
        .collect();
    let mut train = gpu_pod("train", "a100-80gb");
    train.spec.as_mut().unwrap().affinity = Some(
        serde_json::from_value(
            json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            // A node field selector takes one value: one requirement per node, all met.
            "nodeSelectorTerms": [{"matchFields": tainted_nodes.iter().map(|n| json!(
                {"key": "metadata.name", "operator": "NotIn", "values": [n]})).collect::<Vec<_>>()}]}}}),
        )
        .unwrap(),
    );
    pods.create(&PostParams::default(), &train).await.unwrap();
    let device = eventually("train holds a GPU", Duration::from_secs(60), || async {
        let claims = Api::<ResourceClaim>::namespaced(client.clone(), &ns)
            .list(&ListParams::default())
            .await
            .map_err(|e| e.to_string())?;
        let claim = claims.items.first().ok_or("no claim")?;
        let result = (claim.status.as_ref())
            .and_then(|s| {
                s.allocation
                    .as_ref()?
                    .devices
                    .as_ref()?
                    .results
                    .as_ref()?
                    .first()
            })
            .ok_or("not allocated")?;
        let running = pods.get("train").await.map_err(|e| e.to_string())?;
        match running.status.and_then(|s| s.phase).as_deref() {
            Some("Running") => Ok(format!(
                "{}/{}/{}",
                result.driver, result.pool, result.device
            )),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    let report = json!({"status": {"containerStatuses": [{
        "name": "main", "image": "registry.k8s.io/pause:3.10", "imageID": "", "ready": true,
        "restartCount": 0, "started": true, "state": {"running": {}},
        // Named by the container's claim (`resources.claims[].name`, no request named).
        "allocatedResourcesStatus": [{"name": "claim:gpu",
            "resources": [{"resourceID": device, "health": "Unhealthy"}]}]}]}});
    let started = Instant::now();
    pods.patch_status("train", &PatchParams::default(), &Patch::Merge(&report))
        .await
        .unwrap();
    let message = world.devices_are("a100-80gb", 22).await;
    println!(
        "unhealthy report: counted 22 after {} ms",
        started.elapsed().as_millis()
    );
    assert!(
        message.contains("10 more are tainted") && message.contains("unhealthy"),
        "{message}"
    );
}
