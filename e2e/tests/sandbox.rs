//! The scenarios' isolation (`teamgpu_e2e::sandbox`) on the stand-in: what cleaning up deletes
//! and what it leaves alone, unique namespaces, and the devices it publishes. (On a real cluster
//! the same code runs; these tests make sure it does what the README promises.)
//!
//! Multi-threaded runtimes: a `Sandbox` cleans up when dropped, on another thread, while this
//! runtime keeps serving the stand-in.

mod common;

use common::*;
use k8s_openapi::api::core::v1::{Namespace, Pod, ResourceQuota};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use serde_json::json;
use teamgpu::api::{GpuSharingPolicy, TeamGpuPolicy};
use teamgpu_e2e::TestCluster;
use teamgpu_e2e::fixtures::fresh;
use teamgpu_e2e::sandbox::{E2E_LABEL, Sandbox, SandboxError, TEAM_LABEL, clean};

const MANAGED: &str = "app.kubernetes.io/managed-by";

async fn stand_in() -> TestCluster {
    TestCluster::start_local(Default::default()).await.unwrap()
}

async fn names<K>(api: &Api<K>) -> Vec<String>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let list = api.list(&ListParams::default()).await.unwrap();
    list.items.iter().map(ResourceExt::name_any).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cleaning_deletes_what_scenarios_leave_and_nothing_else() {
    let c = stand_in().await;
    let client = c.client();
    install_nvidia(&c).await; // the driver's own classes and slice: not the harness's
    let namespaces: Api<Namespace> = Api::all(client.clone());
    create(
        &namespaces,
        json!({"metadata": {"name": "team", "labels": {E2E_LABEL: "true", TEAM_LABEL: "ml"}}}),
    )
    .await;
    create(&namespaces, json!({"metadata": {"name": "other"}})).await;
    create(
        &Api::<TeamGpuPolicy>::all(client.clone()),
        json!({"apiVersion": "teamgpu.io/v1alpha1", "kind": "TeamGpuPolicy", "metadata": {"name": "ml"},
               "spec": {"namespaces": ["team"], "quotas": [{"sharingPolicy": "a100", "guaranteed": 1}]}}),
    )
    .await;
    create(
        &Api::<GpuSharingPolicy>::all(client.clone()),
        json!({"apiVersion": "teamgpu.io/v1alpha1", "kind": "GpuSharingPolicy", "metadata": {"name": "a100"},
               "spec": {}}),
    )
    .await;
    let classes: Api<DeviceClass> = Api::all(client.clone());
    for (name, label) in [("a100.teamgpu.io", MANAGED), ("e2e.example.com", E2E_LABEL)] {
        create(
            &classes,
            json!({"metadata": {"name": name, "labels": {label: if label == MANAGED { "teamgpu" } else { "true" }}},
                   "spec": {}}),
        )
        .await;
    }
    for ns in ["team", "other"] {
        create(
            &Api::<ResourceQuota>::namespaced(client.clone(), ns),
            json!({"metadata": {"name": "teamgpu", "labels": {MANAGED: "teamgpu"}}, "spec": {"hard": {"pods": "1"}}}),
        )
        .await;
    }
    let team_claims: Api<ResourceClaim> = Api::namespaced(client.clone(), "team");
    create(&team_claims, claim("gpu", "gpu.nvidia.com", 1)).await;
    create(
        &Api::<Pod>::namespaced(client.clone(), "team"),
        json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "pause"}]}}),
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
    assert!(
        names(&Api::<ResourceQuota>::all(client.clone()))
            .await
            .is_empty()
    );
    assert!(names(&team_claims).await.is_empty());
    let left = names(&classes).await;
    assert!(left.contains(&"gpu.nvidia.com".to_owned()), "{left:?}");
    assert!(
        !left
            .iter()
            .any(|c| c == "a100.teamgpu.io" || c == "e2e.example.com"),
        "{left:?}"
    );
    assert_eq!(
        names(&Api::<ResourceSlice>::all(client.clone()))
            .await
            .len(),
        1
    );
    // The e2e namespace is gone, or terminating without its team label; others stay.
    if let Some(team) = namespaces.get_opt("team").await.unwrap() {
        assert!(team.metadata.deletion_timestamp.is_some());
        assert!(
            !team.labels().contains_key(TEAM_LABEL),
            "{:?}",
            team.labels()
        );
    }
    assert!(namespaces.get_opt("other").await.unwrap().is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_with_the_drivers_own_devices_is_refused() {
    let c = stand_in().await;
    install_nvidia(&c).await;
    match Sandbox::start(c).await {
        Err(e @ SandboxError::ForeignSlices(_)) => {
            assert!(e.to_string().contains("without a GPU driver"), "{e}")
        }
        other => panic!("expected ForeignSlices, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandboxes_have_their_own_namespaces_and_publish_only_missing_classes() {
    let example = teamgpu::example::state().unwrap();
    let c = stand_in().await;
    let classes: Api<DeviceClass> = Api::all(c.client());
    let existing = &example.device_classes[0];
    classes
        .create(&Default::default(), &fresh(existing))
        .await
        .unwrap();
    let sandbox = Sandbox::start(c).await.unwrap();
    let other = Sandbox::start(stand_in().await).await.unwrap();
    assert_ne!(sandbox.ns("ml"), other.ns("ml"));

    let ns = sandbox.namespace("ml", Some("ml-research")).await.unwrap();
    assert_eq!(ns, sandbox.ns("ml"));
    assert!(ns.starts_with("ml-"), "{ns}");
    let labels = Api::<Namespace>::all(sandbox.client())
        .get(&ns)
        .await
        .unwrap()
        .labels()
        .clone();
    assert_eq!(
        (labels[E2E_LABEL].as_str(), labels[TEAM_LABEL].as_str()),
        ("true", "ml-research")
    );

    sandbox
        .devices(&example.device_classes, &example.slices)
        .await
        .unwrap();
    for class in classes.list(&ListParams::default()).await.unwrap().items {
        let ours = class.labels().contains_key(E2E_LABEL);
        assert_eq!(
            ours,
            class.name_any() != existing.name_any(),
            "{}",
            class.name_any()
        );
    }
    let slices = Api::<ResourceSlice>::all(sandbox.client())
        .list(&ListParams::default())
        .await
        .unwrap()
        .items;
    assert_eq!(slices.len(), example.slices.len());
    for (live, fixture) in slices.iter().zip(&example.slices) {
        assert_eq!(live.labels()[E2E_LABEL], "true");
        // The stand-in serves no Nodes: the fixture's node names stay.
        assert_eq!(live.spec.node_name, fixture.spec.node_name);
        assert_eq!(live.spec.pool.name, fixture.spec.pool.name);
    }

    clean(&sandbox.client()).await.unwrap();
    assert_eq!(names(&classes).await, [existing.name_any()]);
}
