//! The scenarios' sandbox on a real cluster deletes what scenarios leave and nothing else, and
//! refuses a cluster with a real GPU driver's devices. A test binary of its own: it publishes
//! devices the scenarios' sandbox would refuse.

use k8s_openapi::api::core::v1::{Namespace, ResourceQuota};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use kube::api::{Api, ListParams, PostParams};
use kube::{Client, ResourceExt};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use teamgpu::api::{GpuSharingPolicy, TeamGpuPolicy};
use teamgpu_e2e::TestCluster;
use teamgpu_e2e::fixtures::fresh;
use teamgpu_e2e::sandbox::{E2E_LABEL, Sandbox, SandboxError, TEAM_LABEL, clean};

const MANAGED: &str = "app.kubernetes.io/managed-by";

async fn create<K>(api: &Api<K>, value: Value)
where
    K: kube::Resource + Clone + DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let object: K = serde_json::from_value(value).unwrap();
    api.create(&PostParams::default(), &object).await.unwrap();
}

async fn names<K>(api: &Api<K>) -> Vec<String>
where
    K: kube::Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    let list = api.list(&ListParams::default()).await.unwrap();
    list.items.iter().map(ResourceExt::name_any).collect()
}

#[tokio::test]
async fn cleaning_deletes_what_scenarios_leave_and_nothing_else() {
    let Some(cluster) = TestCluster::start_or_skip().await else {
        return;
    };
    let client: Client = cluster.client();
    // A GPU driver's own class and slice: not the harness's.
    let example = teamgpu::cli::example::state().unwrap();
    let driver_class = example
        .device_classes
        .iter()
        .find(|c| c.name_any() == "gpu.nvidia.com")
        .unwrap();
    let classes: Api<DeviceClass> = Api::all(client.clone());
    classes
        .create(&PostParams::default(), &fresh(driver_class))
        .await
        .unwrap();
    let slices: Api<ResourceSlice> = Api::all(client.clone());
    let mut driver_slice = fresh(&example.slices[0]);
    driver_slice.spec.node_name = Some("e2e-node-0".into());
    slices
        .create(&PostParams::default(), &driver_slice)
        .await
        .unwrap();
    // What a scenario leaves behind, and what is not the harness's.
    let namespaces: Api<Namespace> = Api::all(client.clone());
    create(
        &namespaces,
        json!({"metadata": {"name": "e2e-team", "labels": {E2E_LABEL: "true", TEAM_LABEL: "ml"}}}),
    )
    .await;
    create(&namespaces, json!({"metadata": {"name": "someone-else"}})).await;
    create(
        &Api::<TeamGpuPolicy>::all(client.clone()),
        json!({"apiVersion": "teamgpu.io/v1alpha1", "kind": "TeamGpuPolicy", "metadata": {"name": "ml"},
               "spec": {"namespaces": ["e2e-team"], "quotas": [{"sharingPolicy": "a100", "guaranteed": 1}]}}),
    )
    .await;
    create(
        &Api::<GpuSharingPolicy>::all(client.clone()),
        json!({"apiVersion": "teamgpu.io/v1alpha1", "kind": "GpuSharingPolicy", "metadata": {"name": "a100"},
               "spec": {}}),
    )
    .await;
    for (name, label, value) in [
        ("a100.teamgpu.io", MANAGED, "teamgpu"),
        ("e2e.example.com", E2E_LABEL, "true"),
    ] {
        create(
            &classes,
            json!({"metadata": {"name": name, "labels": {label: value}}, "spec": {}}),
        )
        .await;
    }
    for ns in ["e2e-team", "someone-else"] {
        create(
            &Api::<ResourceQuota>::namespaced(client.clone(), ns),
            json!({"metadata": {"name": "teamgpu", "labels": {MANAGED: "teamgpu"}}, "spec": {"hard": {"pods": "1"}}}),
        )
        .await;
    }
    create(
        &Api::<ResourceQuota>::namespaced(client.clone(), "someone-else"),
        json!({"metadata": {"name": "theirs"}, "spec": {"hard": {"pods": "1"}}}),
    )
    .await;
    let team_claims: Api<ResourceClaim> = Api::namespaced(client.clone(), "e2e-team");
    create(
        &team_claims,
        json!({"metadata": {"name": "gpu"}, "spec": {"devices": {"requests": [
            {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}}}),
    )
    .await;

    clean(&client).await.unwrap();

    assert!(
        names(&Api::<TeamGpuPolicy>::all(client.clone()))
            .await
            .is_empty()
    );
    assert!(
        names(&Api::<GpuSharingPolicy>::all(client.clone()))
            .await
            .is_empty()
    );
    let quotas = Api::<ResourceQuota>::all(client.clone())
        .list(&ListParams::default())
        .await
        .unwrap();
    let quotas: Vec<String> = quotas
        .items
        .iter()
        .map(|q| format!("{}/{}", q.namespace().unwrap(), q.name_any()))
        .collect();
    assert!(
        !quotas.iter().any(|q| q.ends_with("/teamgpu")),
        "{quotas:?}"
    );
    assert!(
        quotas.contains(&"someone-else/theirs".to_owned()),
        "{quotas:?}"
    );
    assert!(names(&team_claims).await.is_empty());
    let left = names(&classes).await;
    assert_eq!(left, ["gpu.nvidia.com"]);
    assert_eq!(names(&slices).await, [driver_slice.name_any()]);
    // The e2e namespace is gone, or terminating without its team label; others stay.
    if let Some(team) = namespaces.get_opt("e2e-team").await.unwrap() {
        assert!(team.metadata.deletion_timestamp.is_some());
        assert!(
            !team.labels().contains_key(TEAM_LABEL),
            "{:?}",
            team.labels()
        );
    }
    assert!(namespaces.get_opt("someone-else").await.unwrap().is_some());

    // The driver's devices are there: the scenarios refuse to run on this cluster.
    match Sandbox::start(cluster).await {
        Err(e @ SandboxError::ForeignSlices(_)) => {
            assert!(e.to_string().contains("without a GPU driver"), "{e}")
        }
        other => panic!("expected ForeignSlices, got {other:?}"),
    }
}
