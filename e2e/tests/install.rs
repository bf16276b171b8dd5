//! The operator on a cluster without teamgpu's CRDs: it stops at once and says how to install
//! them. A test binary of its own, since it takes the CRDs away from its control plane.

use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams};
use teamgpu_e2e::TestCluster;

#[tokio::test]
async fn missing_crds_stop_the_operator_with_the_install_command() {
    let Some(cluster) = TestCluster::start_or_skip().await else {
        return;
    };
    let crds: Api<CustomResourceDefinition> = Api::all(cluster.client());
    let names = [
        "gpusharingpolicies.teamgpu.io",
        "teamgpupolicies.teamgpu.io",
    ];
    for name in names {
        let _ = crds.delete(name, &DeleteParams::default()).await;
    }
    // A CRD is removed once the API server has deleted its objects (a finalizer).
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    for name in names {
        while crds.get_opt(name).await.unwrap().is_some() {
            assert!(
                std::time::Instant::now() < deadline,
                "CRD {name} still there"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let operator = cluster.operator_config().await.unwrap();
    let config = teamgpu::controller::Config {
        metrics_addr: ([127, 0, 0, 1], 0).into(),
        ..Default::default()
    };
    let result = tokio::time::timeout(
        Duration::from_secs(10),
        teamgpu::controller::run(
            kube::Client::try_from(operator).unwrap(),
            config,
            std::future::pending(),
        ),
    )
    .await
    .expect("the operator stops at once instead of waiting");
    let error = result.expect_err("no CRDs, no operator").to_string();
    assert!(error.contains("kubectl apply -k config/crd"), "{error}");
}
