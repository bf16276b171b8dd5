//! The real control plane harness (`control_plane`, `node_agent`) against real Kubernetes
//! binaries, all tests sharing one control plane. Needs `TEAMGPU_E2E_ASSETS`; without it the
//! tests skip, except under `CI=true`, where they fail.

use std::future::Future;
use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::{SelfSubjectReview, TokenRequest};
use k8s_openapi::api::core::v1::{Namespace, Pod, ServiceAccount};
use k8s_openapi::api::resource::v1::DeviceClass;
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};
use teamgpu_e2e::control_plane::{ControlPlane, ControlPlaneError};
use teamgpu_e2e::node_agent;

/// The shared control plane and an admin client for this test's runtime, or `None` (skip).
async fn cluster() -> Option<(&'static ControlPlane, Client)> {
    let plane = teamgpu_e2e::cluster::control_plane_or_skip().await?;
    Some((
        plane,
        Client::try_from(plane.admin_config()).expect("an admin client"),
    ))
}

fn object<T: serde::de::DeserializeOwned>(value: Value) -> T {
    serde_json::from_value(value).expect("a valid object")
}

/// Polls `probe` every 100 ms until it yields a value, panicking after 20 s.
async fn eventually<T, Fut: Future<Output = Option<T>>>(
    what: &str,
    mut probe: impl FnMut() -> Fut,
) -> T {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(value) = probe().await {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Creates a namespace enforcing the `restricted` Pod Security Standard and waits for its
/// `default` ServiceAccount (Pods are rejected until the controller-manager has made it).
async fn namespace(client: &Client, name: &str) {
    let labels = json!({"pod-security.kubernetes.io/enforce": "restricted"});
    let namespace = object(json!({"metadata": {"name": name, "labels": labels}}));
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &namespace)
        .await
        .expect("create the namespace");
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), name);
    eventually("the default ServiceAccount", || async {
        accounts.get_opt("default").await.ok().flatten()
    })
    .await;
}

async fn delete_namespace(client: Client, name: &str) {
    Api::<Namespace>::all(client)
        .delete(name, &DeleteParams::default())
        .await
        .expect("delete the namespace");
}

#[test]
fn missing_assets_are_reported() {
    let error = ControlPlane::start(&std::env::temp_dir().join("no-such-teamgpu-assets"))
        .expect_err("no programs, no control plane");
    assert!(
        matches!(error, ControlPlaneError::MissingAsset(_, "etcd")),
        "{error}"
    );
}

#[tokio::test]
async fn serves_dra_v1() {
    let Some((plane, client)) = cluster().await else {
        return;
    };
    assert!(plane.url().starts_with("https://127.0.0.1:"));
    assert!(plane.admin_kubeconfig().is_file());
    let version = client.apiserver_version().await.expect("GET /version");
    let minor: u32 = version
        .minor
        .trim_end_matches('+')
        .parse()
        .expect("a minor");
    assert!(
        version.major == "1" && minor >= 34,
        "Kubernetes 1.34+ expected, got {}",
        version.git_version
    );

    // resource.k8s.io/v1 is served, with its CEL validation.
    let classes: Api<DeviceClass> = Api::all(client);
    let class = |name: &str, cel: &str| -> DeviceClass {
        object(json!({"metadata": {"name": name},
                      "spec": {"selectors": [{"cel": {"expression": cel}}]}}))
    };
    let valid = class(
        "control-plane-test.example.com",
        "device.driver == 'gpu.example.com'",
    );
    classes
        .create(&PostParams::default(), &valid)
        .await
        .expect("create a DeviceClass");
    let error = classes
        .create(
            &PostParams::default(),
            &class("invalid-cel.example.com", "device.driver =="),
        )
        .await
        .expect_err("the API server compiles CEL selectors");
    assert!(
        matches!(&error, kube::Error::Api(status) if status.code == 422),
        "{error}"
    );
    classes
        .delete("control-plane-test.example.com", &DeleteParams::default())
        .await
        .expect("delete the DeviceClass");
    classes
        .list(&ListParams::default())
        .await
        .expect("list DeviceClasses");
}

#[tokio::test]
async fn node_agent_runs_and_finalizes_pods() {
    let Some((_, client)) = cluster().await else {
        return;
    };
    let agent = tokio::task::spawn_blocking(node_agent::shared)
        .await
        .expect("start-up does not panic")
        .unwrap_or_else(|error| panic!("the node agent did not start: {error}"));
    let ns = "control-plane-pods";
    namespace(&client, ns).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    // A pause Pod that passes the `restricted` Pod Security Standard.
    let pod = object(json!({"metadata": {"name": "pause"}, "spec": {
        "securityContext": {"runAsNonRoot": true, "runAsUser": 65535,
                            "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [{"name": "pause", "image": "registry.k8s.io/pause:3.10",
                        "securityContext": {"allowPrivilegeEscalation": false,
                                            "capabilities": {"drop": ["ALL"]}}}]}}));
    pods.create(&PostParams::default(), &pod)
        .await
        .expect("create a pause Pod");

    let running = eventually("the Pod to be scheduled and Running", || async {
        let pod = pods.get("pause").await.ok()?;
        (pod.status.as_ref()?.phase.as_deref()? == "Running").then_some(pod)
    })
    .await;
    let node = running
        .spec
        .as_ref()
        .and_then(|spec| spec.node_name.clone());
    assert!(agent.node_names().contains(&node.expect("bound")));
    let status = running.status.expect("status");
    let conditions = status.conditions.unwrap_or_default();
    assert!(
        conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True")
    );
    let containers = status.container_statuses.unwrap_or_default();
    assert!(
        containers.len() == 1 && containers[0].ready,
        "{containers:?}"
    );

    // A graceful delete leaves the Pod Terminating until the "kubelet" finalizes it.
    pods.delete("pause", &DeleteParams::default())
        .await
        .expect("delete the Pod");
    eventually("the deleted Pod to disappear", || async {
        matches!(pods.get_opt("pause").await, Ok(None)).then_some(())
    })
    .await;
    delete_namespace(client, ns).await;
}

#[tokio::test]
async fn service_account_tokens_authenticate() {
    let Some((plane, client)) = cluster().await else {
        return;
    };
    let ns = "control-plane-tokens";
    namespace(&client, ns).await;
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), ns);
    let account = object(json!({"metadata": {"name": "operator"}}));
    accounts
        .create(&PostParams::default(), &account)
        .await
        .expect("create a ServiceAccount");
    let request: TokenRequest =
        object(json!({"spec": {"audiences": [], "expirationSeconds": 600}}));
    let token = accounts
        .create_token_request("operator", &PostParams::default(), &request)
        .await
        .expect("TokenRequest")
        .status
        .expect("a TokenRequest status")
        .token;

    let mut config = plane.admin_config();
    config.auth_info = object(json!({ "token": token }));
    let as_account = Client::try_from(config).expect("a ServiceAccount client");
    let review = Api::<SelfSubjectReview>::all(as_account.clone())
        .create(&PostParams::default(), &SelfSubjectReview::default())
        .await
        .expect("SelfSubjectReview");
    let user = review
        .status
        .and_then(|s| s.user_info)
        .and_then(|u| u.username);
    let expected = "system:serviceaccount:control-plane-tokens:operator";
    assert_eq!(user.as_deref(), Some(expected));

    // RBAC applies to it: it may not read Pods elsewhere.
    let error = Api::<Pod>::namespaced(as_account, "kube-system")
        .list(&ListParams::default())
        .await
        .expect_err("no RBAC grant, no access");
    assert!(
        matches!(&error, kube::Error::Api(s) if s.code == 403 && s.message.contains(expected)),
        "{error}"
    );
    delete_namespace(client, ns).await;
}
