//! The real control plane harness (`control_plane`, `node_agent`) against real Kubernetes
//! binaries. All tests of this binary share one control plane (`control_plane::shared`).
//!
//! Needs `TEAMGPU_E2E_ASSETS` (a directory with etcd, kube-apiserver, kube-controller-manager and
//! kube-scheduler); without it the tests skip, except on CI (`CI=true`), where they fail.

use std::future::Future;
use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::{SelfSubjectReview, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{
    Capabilities, Container, Namespace, Pod, PodSecurityContext, PodSpec, SeccompProfile,
    SecurityContext, ServiceAccount,
};
use k8s_openapi::api::resource::v1::{
    CELDeviceSelector, DeviceClass, DeviceClassSpec, DeviceSelector,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::config::AuthInfo;
use kube::{Api, Client};
use teamgpu_e2e::control_plane::{self, ASSETS_ENV, ControlPlane, ControlPlaneError};
use teamgpu_e2e::node_agent;

/// How long the node agent may take to run or finalize a Pod.
const POD_TIMEOUT: Duration = Duration::from_secs(20);

/// The shared control plane and an admin client for this test's runtime, or `None` (skip) if
/// `TEAMGPU_E2E_ASSETS` is unset, which fails on CI instead.
async fn cluster() -> Option<(&'static ControlPlane, Client)> {
    if control_plane::assets_from_env().is_none() {
        let hint = format!(
            "set {ASSETS_ENV} to a directory with etcd, kube-apiserver, kube-controller-manager, kube-scheduler of Kubernetes 1.34+"
        );
        if std::env::var("CI").is_ok_and(|ci| ci == "true") {
            panic!("{ASSETS_ENV} is required on CI: {hint}");
        }
        println!("skipped (no control plane): {hint}");
        return None;
    }
    let plane = tokio::task::spawn_blocking(control_plane::shared)
        .await
        .expect("the start-up thread panicked")
        .unwrap_or_else(|error| panic!("the control plane did not start: {error}"));
    let client = Client::try_from(plane.admin_config()).expect("an admin client");
    Some((plane, client))
}

/// Polls `probe` every 100 ms until it yields a value, panicking after `timeout`.
async fn eventually<T, F, Fut>(timeout: Duration, what: &str, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = probe().await {
            return value;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Creates a namespace enforcing the `restricted` Pod Security Standard and waits for its
/// `default` ServiceAccount: the ServiceAccount admission plugin rejects Pods until the
/// controller-manager has made it.
async fn namespace(client: &Client, name: &str) {
    let namespace = Namespace {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            labels: Some(
                [(
                    "pod-security.kubernetes.io/enforce".to_owned(),
                    "restricted".to_owned(),
                )]
                .into(),
            ),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    };
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &namespace)
        .await
        .expect("create the namespace");
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), name);
    eventually(
        Duration::from_secs(20),
        "the namespace's default ServiceAccount",
        || async { accounts.get_opt("default").await.ok().flatten() },
    )
    .await;
}

/// A pause Pod that passes the `restricted` Pod Security Standard.
fn pause_pod(name: &str) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            security_context: Some(PodSecurityContext {
                run_as_non_root: Some(true),
                run_as_user: Some(65535),
                seccomp_profile: Some(SeccompProfile {
                    type_: "RuntimeDefault".to_owned(),
                    ..SeccompProfile::default()
                }),
                ..PodSecurityContext::default()
            }),
            containers: vec![Container {
                name: "pause".to_owned(),
                image: Some("registry.k8s.io/pause:3.10".to_owned()),
                security_context: Some(SecurityContext {
                    allow_privilege_escalation: Some(false),
                    capabilities: Some(Capabilities {
                        drop: Some(vec!["ALL".to_owned()]),
                        ..Capabilities::default()
                    }),
                    ..SecurityContext::default()
                }),
                ..Container::default()
            }],
            ..PodSpec::default()
        }),
        ..Pod::default()
    }
}

#[test]
fn missing_assets_are_reported() {
    let empty = std::env::temp_dir();
    let error = ControlPlane::start(&empty.join("no-such-teamgpu-assets"))
        .expect_err("no programs, no control plane");
    assert!(
        matches!(
            error,
            ControlPlaneError::MissingAsset {
                program: "etcd",
                ..
            }
        ),
        "{error}"
    );
}

#[tokio::test]
async fn serves_dra_v1_and_reports_its_version() {
    let Some((plane, client)) = cluster().await else {
        return;
    };
    assert!(plane.url().starts_with("https://127.0.0.1:"));
    assert!(plane.ca_pem().starts_with("-----BEGIN CERTIFICATE-----"));
    assert!(plane.admin_kubeconfig().is_file());

    let version = client.apiserver_version().await.expect("GET /version");
    let minor: u32 = version
        .minor
        .trim_end_matches('+')
        .parse()
        .expect("a numeric minor version");
    println!("API server {}", version.git_version);
    assert_eq!(version.major, "1");
    assert!(
        minor >= 34 && version.git_version.starts_with(&format!("v1.{minor}.")),
        "Kubernetes 1.34+ expected (resource.k8s.io/v1), got {}",
        version.git_version
    );

    // resource.k8s.io/v1 is served, with its CEL validation.
    let classes: Api<DeviceClass> = Api::all(client.clone());
    classes
        .list(&ListParams::default())
        .await
        .expect("list DeviceClasses (resource.k8s.io/v1)");
    let class = DeviceClass {
        metadata: ObjectMeta {
            name: Some("control-plane-test.example.com".to_owned()),
            ..ObjectMeta::default()
        },
        spec: DeviceClassSpec {
            selectors: Some(vec![DeviceSelector {
                cel: Some(CELDeviceSelector {
                    expression: "device.driver == 'gpu.example.com'".to_owned(),
                }),
            }]),
            ..DeviceClassSpec::default()
        },
    };
    classes
        .create(&PostParams::default(), &class)
        .await
        .expect("create a DeviceClass");
    let mut invalid = class.clone();
    invalid.metadata.name = Some("invalid-cel.example.com".to_owned());
    invalid.spec.selectors = Some(vec![DeviceSelector {
        cel: Some(CELDeviceSelector {
            expression: "device.driver ==".to_owned(),
        }),
    }]);
    let error = classes
        .create(&PostParams::default(), &invalid)
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
}

#[tokio::test]
async fn node_agent_runs_and_finalizes_pods() {
    let Some((_, client)) = cluster().await else {
        return;
    };
    let agent = tokio::task::spawn_blocking(node_agent::shared)
        .await
        .expect("the node agent's start-up panicked")
        .unwrap_or_else(|error| panic!("the node agent did not start: {error}"));
    let ns = "control-plane-pods";
    namespace(&client, ns).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    pods.create(&PostParams::default(), &pause_pod("pause"))
        .await
        .expect("create a restricted pause Pod");

    let running = eventually(
        POD_TIMEOUT,
        "the Pod to be scheduled and Running",
        || async {
            let pod = pods.get("pause").await.ok()?;
            let phase = pod.status.as_ref()?.phase.as_deref()?;
            (phase == "Running").then_some(pod)
        },
    )
    .await;
    let node = running
        .spec
        .as_ref()
        .and_then(|spec| spec.node_name.clone())
        .expect("a Running Pod is bound");
    assert!(agent.node_names().contains(&node), "bound to {node}");
    let status = running.status.expect("status");
    let ready = status
        .conditions
        .unwrap_or_default()
        .into_iter()
        .any(|condition| condition.type_ == "Ready" && condition.status == "True");
    assert!(ready, "the Pod is Ready");
    assert!(
        status
            .container_statuses
            .unwrap_or_default()
            .iter()
            .all(|container| container.ready),
        "every container is ready"
    );

    // A graceful delete leaves the Pod Terminating until the "kubelet" finalizes it.
    pods.delete("pause", &DeleteParams::default())
        .await
        .expect("delete the Pod");
    eventually(POD_TIMEOUT, "the deleted Pod to disappear", || async {
        matches!(pods.get_opt("pause").await, Ok(None)).then_some(())
    })
    .await;

    Api::<Namespace>::all(client)
        .delete(ns, &DeleteParams::default())
        .await
        .expect("delete the namespace");
}

#[tokio::test]
async fn service_account_tokens_authenticate() {
    let Some((plane, client)) = cluster().await else {
        return;
    };
    let ns = "control-plane-tokens";
    namespace(&client, ns).await;
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), ns);
    let account = ServiceAccount {
        metadata: ObjectMeta {
            name: Some("operator".to_owned()),
            ..ObjectMeta::default()
        },
        ..ServiceAccount::default()
    };
    accounts
        .create(&PostParams::default(), &account)
        .await
        .expect("create a ServiceAccount");
    let request = TokenRequest {
        spec: TokenRequestSpec {
            // Empty: the API server's audiences.
            audiences: Vec::new(),
            expiration_seconds: Some(600),
            ..TokenRequestSpec::default()
        },
        ..TokenRequest::default()
    };
    let token = accounts
        .create_token_request("operator", &PostParams::default(), &request)
        .await
        .expect("TokenRequest")
        .status
        .expect("a TokenRequest status")
        .token;

    let mut config = plane.admin_config();
    config.auth_info = serde_json::from_value::<AuthInfo>(serde_json::json!({ "token": token }))
        .expect("a token AuthInfo");
    let as_account = Client::try_from(config).expect("a ServiceAccount client");
    let review = Api::<SelfSubjectReview>::all(as_account.clone())
        .create(&PostParams::default(), &SelfSubjectReview::default())
        .await
        .expect("SelfSubjectReview");
    let user = review
        .status
        .and_then(|status| status.user_info)
        .and_then(|user| user.username);
    assert_eq!(
        user.as_deref(),
        Some("system:serviceaccount:control-plane-tokens:operator")
    );

    // RBAC applies to it: it may not read Pods elsewhere.
    let error = Api::<Pod>::namespaced(as_account, "kube-system")
        .list(&ListParams::default())
        .await
        .expect_err("no RBAC grant, no access");
    assert!(
        matches!(&error, kube::Error::Api(status) if status.code == 403
            && status.message.contains("system:serviceaccount:control-plane-tokens:operator")),
        "{error}"
    );

    Api::<Namespace>::all(client)
        .delete(ns, &DeleteParams::default())
        .await
        .expect("delete the namespace");
}
