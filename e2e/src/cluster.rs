//! `TestCluster`: a real Kubernetes API server for a test. Either the control plane this process
//! starts from `TEAMGPU_E2E_ASSETS` (one per test binary, shared by its tests, with hand-made
//! Nodes played by [`crate::node_agent`]), or the cluster of `TEAMGPU_E2E_KUBECONFIG` (say, kind).
//!
//! Once per process the cluster is prepared as a user would install teamgpu: the CRDs of `crds/`
//! and the RBAC of `config/rbac` are applied, so the operator under test runs as its own
//! ServiceAccount ([`TestCluster::operator_client`]) with exactly the permissions it ships with.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Resource as _;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::discovery::ApiResource;
use serde_json::{Value, json};
use teamgpu::api::TeamGpuPolicy;

use crate::control_plane;
use crate::fixtures::{self, FixtureError};
use crate::recording::{Counters, Record};

/// Environment variable naming a kubeconfig of a (throwaway) cluster to run against instead.
pub const REAL_CLUSTER_ENV: &str = "TEAMGPU_E2E_KUBECONFIG";
/// The operator's namespace and ServiceAccount, as `config/rbac` names them.
pub const OPERATOR_NAMESPACE: &str = "teamgpu-system";
/// See [`OPERATOR_NAMESPACE`].
pub const OPERATOR_SERVICE_ACCOUNT: &str = "teamgpu";
/// The field manager of the harness's own applies.
const MANAGER: &str = "teamgpu-e2e";

/// Errors getting a test cluster.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// Neither variable is set.
    #[error(
        "no Kubernetes control plane for the end-to-end tests: set {assets} to a directory with \
         etcd, kube-apiserver, kube-controller-manager and kube-scheduler of Kubernetes 1.34+ \
         (release binaries), or {REAL_CLUSTER_ENV} to the kubeconfig of a throwaway cluster \
         (e.g. kind); see the README's \"Test\" section",
        assets = control_plane::ASSETS_ENV
    )]
    NotConfigured,
    /// Starting the control plane or the node agent failed.
    #[error("starting the control plane: {0}")]
    ControlPlane(String),
    /// Reading the kubeconfig of `TEAMGPU_E2E_KUBECONFIG` failed.
    #[error("kubeconfig {0}: {1}")]
    KubeconfigRead(PathBuf, String),
    /// Reading the CRDs or the RBAC manifests failed.
    #[error(transparent)]
    Fixture(#[from] FixtureError),
    /// Installing the CRDs or the RBAC failed.
    #[error("preparing the cluster: {0}")]
    Prepare(String),
    /// The kube client failed.
    #[error(transparent)]
    Kube(#[from] kube::Error),
}

/// A cluster for one test (see the module documentation).
pub struct TestCluster {
    config: kube::Config,
    client: kube::Client,
    kubeconfig: PathBuf,
    plane: Option<&'static control_plane::ControlPlane>,
}

/// Where the cluster comes from, prepared once per process.
#[derive(Debug, Clone)]
struct Prepared {
    config: kube::Config,
    kubeconfig: PathBuf,
    /// The control plane this process started, if it did (not a cluster of a kubeconfig).
    plane: Option<&'static control_plane::ControlPlane>,
}

impl TestCluster {
    /// The cluster of this process, prepared on the first call (which, for a control plane of
    /// our own, takes ~6 s). [`ClusterError::NotConfigured`] when there is none.
    pub async fn start() -> Result<TestCluster, ClusterError> {
        static PREPARED: OnceLock<Result<Prepared, String>> = OnceLock::new();
        // Preparing blocks (processes, a runtime of its own): not on this runtime's threads.
        let prepared = tokio::task::spawn_blocking(|| {
            PREPARED
                .get_or_init(|| prepare().map_err(|e| e.to_string()))
                .clone()
        })
        .await
        .map_err(|e| ClusterError::Prepare(e.to_string()))?;
        let prepared = match prepared {
            Ok(prepared) => prepared,
            Err(_) if !is_configured() => return Err(ClusterError::NotConfigured),
            Err(message) => return Err(ClusterError::Prepare(message)),
        };
        Ok(TestCluster {
            client: kube::Client::try_from(prepared.config.clone())?,
            config: prepared.config,
            kubeconfig: prepared.kubeconfig,
            plane: prepared.plane,
        })
    }

    /// For tests: the cluster, or `None` when none is configured, after saying once (past the
    /// test harness's output capture) how to configure one. Under `CI=true` a missing cluster
    /// fails the test instead: CI must run these tests, not skip them.
    pub async fn start_or_skip() -> Option<TestCluster> {
        match TestCluster::start().await {
            Ok(cluster) => Some(cluster),
            Err(ClusterError::NotConfigured) => skip(),
            Err(error) => panic!("{error}"),
        }
    }

    /// The control plane this process started, when the cluster is that one (not a cluster of
    /// `TEAMGPU_E2E_KUBECONFIG`): for scenarios that stop one of its components.
    pub fn control_plane(&self) -> Option<&'static control_plane::ControlPlane> {
        self.plane
    }

    /// An admin client (kube's defaults: kube 5 retries 429/503/504 itself).
    pub fn client(&self) -> kube::Client {
        self.client.clone()
    }

    /// The admin client configuration (for clients made on another runtime).
    /// A client that is `user` in `system:authenticated` and `groups`, impersonated by the
    /// admin.
    pub fn as_user(&self, user: &str, groups: &[&str]) -> kube::Client {
        let mut config = self.config().clone();
        config.auth_info.impersonate = Some(user.to_owned());
        config.auth_info.impersonate_groups = Some(
            std::iter::once("system:authenticated")
                .chain(groups.iter().copied())
                .map(str::to_owned)
                .collect(),
        );
        kube::Client::try_from(config).expect("an impersonating client")
    }

    pub fn config(&self) -> &kube::Config {
        &self.config
    }

    /// A kubeconfig file of the admin (for kubectl and the `teamgpu` binary).
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// The configuration of a client that is the operator's ServiceAccount (a fresh token from
    /// the TokenRequest API), so that the operator runs with `config/rbac` and nothing more.
    pub async fn operator_config(&self) -> Result<kube::Config, ClusterError> {
        let accounts: Api<ServiceAccount> =
            Api::namespaced(self.client.clone(), OPERATOR_NAMESPACE);
        let request = TokenRequest {
            spec: k8s_openapi::api::authentication::v1::TokenRequestSpec {
                expiration_seconds: Some(24 * 3600),
                ..Default::default()
            },
            ..Default::default()
        };
        let token = accounts
            .create_token_request(OPERATOR_SERVICE_ACCOUNT, &PostParams::default(), &request)
            .await?
            .status
            .map(|s| s.token)
            .ok_or_else(|| ClusterError::Prepare("TokenRequest without a token".into()))?;
        let mut config = self.config.clone();
        config.auth_info = kube::config::AuthInfo {
            token: Some(token.into()),
            ..Default::default()
        };
        Ok(config)
    }

    /// A kubeconfig file in `dir` for the operator's ServiceAccount (the admin's cluster with a
    /// fresh token), for the `teamgpu` binary.
    pub async fn operator_kubeconfig(&self, dir: &Path) -> Result<PathBuf, ClusterError> {
        use secrecy::ExposeSecret;
        let token = self
            .operator_config()
            .await?
            .auth_info
            .token
            .map(|t| t.expose_secret().to_owned())
            .ok_or_else(|| ClusterError::Prepare("no token".into()))?;
        let admin = std::fs::read_to_string(&self.kubeconfig)
            .map_err(|e| ClusterError::Prepare(format!("{}: {e}", self.kubeconfig.display())))?;
        let mut config: serde_json::Value = serde_saphyr::from_str(&admin)
            .map_err(|e| ClusterError::Prepare(format!("{}: {e}", self.kubeconfig.display())))?;
        config["users"] = serde_json::json!([{"name": "teamgpu", "user": {"token": token}}]);
        for context in config["contexts"].as_array_mut().into_iter().flatten() {
            context["context"]["user"] = serde_json::json!("teamgpu");
        }
        let path = dir.join("teamgpu-operator.kubeconfig");
        std::fs::write(&path, config.to_string())
            .map_err(|e| ClusterError::Prepare(format!("{}: {e}", path.display())))?;
        Ok(path)
    }

    /// Installs the CRDs again (after a test that uninstalled them) and waits until they are
    /// Established.
    pub async fn reinstall_crds(&self) -> Result<(), ClusterError> {
        install_crds(&self.client).await
    }

    /// A client that is the operator's ServiceAccount (see [`TestCluster::operator_config`]),
    /// its requests counted in the returned [`Counters`].
    pub async fn operator_client(&self) -> Result<(kube::Client, Arc<Counters>), ClusterError> {
        Ok(recorded(self.operator_config().await?))
    }

    /// The API server's own count of requests (`apiserver_request_total` of `/metrics`), by
    /// (verb, resource as `plural[.group][/subresource]`), summed over codes and scopes.
    /// Requests of every client count, the cluster's own controllers' included.
    pub async fn server_request_counts(
        &self,
    ) -> Result<BTreeMap<(String, String), u64>, ClusterError> {
        let request = http::Request::get("/metrics")
            .body(Vec::new())
            .map_err(|e| ClusterError::Prepare(e.to_string()))?;
        let text = self.client.request_text(request).await?;
        Ok(parse_request_totals(&text))
    }
}

/// For the harness's own tests: the control plane of `TEAMGPU_E2E_ASSETS`, or `None` as for
/// [`TestCluster::start_or_skip`].
pub async fn control_plane_or_skip() -> Option<&'static control_plane::ControlPlane> {
    if control_plane::assets_from_env().is_none() {
        return skip();
    }
    let plane = tokio::task::spawn_blocking(control_plane::shared)
        .await
        .expect("start-up does not panic");
    Some(plane.unwrap_or_else(|error| panic!("the control plane did not start: {error}")))
}

/// `None`, after saying once (past the test harness's output capture) how to configure a
/// cluster; under `CI=true` it fails the test instead: CI must run these tests, not skip them.
fn skip<T>() -> Option<T> {
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("CI=true: {}", ClusterError::NotConfigured);
    }
    static SAID: OnceLock<()> = OnceLock::new();
    SAID.get_or_init(|| {
        let _ = writeln!(
            std::io::stderr(),
            "skipping the end-to-end tests: {}",
            ClusterError::NotConfigured
        );
    });
    None
}

/// A client of `config` whose requests are counted in the returned [`Counters`].
pub fn recorded(config: kube::Config) -> (kube::Client, Arc<Counters>) {
    let counters = Arc::new(Counters::default());
    let client = kube::client::ClientBuilder::try_from(config)
        .expect("client from a valid config")
        .with_layer(&Record(counters.clone()))
        .build();
    (client, counters)
}

fn is_configured() -> bool {
    control_plane::assets_from_env().is_some()
        || std::env::var_os(REAL_CLUSTER_ENV).is_some_and(|v| !v.is_empty())
}

/// `apiserver_request_total{...,resource="x",group="g",subresource="s",verb="PATCH",...} N`
/// lines summed by (verb, resource), verbs lower-cased as RBAC names them (`apply` is `patch`).
pub fn parse_request_totals(metrics: &str) -> BTreeMap<(String, String), u64> {
    let mut out = BTreeMap::new();
    for line in metrics.lines() {
        let Some(rest) = line.strip_prefix("apiserver_request_total{") else {
            continue;
        };
        let Some((labels, value)) = rest.rsplit_once("} ") else {
            continue;
        };
        let label = |name: &str| {
            labels
                .split("\",")
                .find_map(|kv| kv.strip_prefix(&format!("{name}=\"")))
                .map(|v| v.trim_end_matches('"').to_owned())
                .unwrap_or_default()
        };
        let mut resource = label("resource");
        if resource.is_empty() {
            continue;
        }
        let group = label("group");
        if !group.is_empty() {
            resource = format!("{resource}.{group}");
        }
        let subresource = label("subresource");
        if !subresource.is_empty() {
            resource = format!("{resource}/{subresource}");
        }
        let verb = match label("verb").as_str() {
            "APPLY" | "PATCH" => "patch".to_owned(),
            "POST" => "create".to_owned(),
            "PUT" => "update".to_owned(),
            other => other.to_lowercase(),
        };
        let count = value.trim().parse::<f64>().unwrap_or(0.0) as u64;
        *out.entry((verb, resource)).or_default() += count;
    }
    out
}

/// Prepares the cluster once per process: starts the control plane and the node agent (or reads
/// `TEAMGPU_E2E_KUBECONFIG`), then installs the CRDs and the operator's RBAC.
fn prepare() -> Result<Prepared, ClusterError> {
    let prepared = if let Some(path) = std::env::var_os(REAL_CLUSTER_ENV).filter(|p| !p.is_empty())
    {
        let path = PathBuf::from(path);
        let kubeconfig = Kubeconfig::read_from(&path)
            .map_err(|e| ClusterError::KubeconfigRead(path.clone(), e.to_string()))?;
        let config = run(kube::Config::from_custom_kubeconfig(
            kubeconfig,
            &KubeConfigOptions::default(),
        ))?
        .map_err(|e| ClusterError::KubeconfigRead(path.clone(), e.to_string()))?;
        Prepared {
            config,
            kubeconfig: path,
            plane: None,
        }
    } else if control_plane::assets_from_env().is_some() {
        let plane = control_plane::shared().map_err(ClusterError::ControlPlane)?;
        crate::node_agent::shared().map_err(ClusterError::ControlPlane)?;
        Prepared {
            config: plane.admin_config(),
            kubeconfig: plane.admin_kubeconfig().to_path_buf(),
            plane: Some(plane),
        }
    } else {
        return Err(ClusterError::NotConfigured);
    };
    let config = prepared.config.clone();
    run(async move { install(config).await })??;
    Ok(prepared)
}

/// Runs `future` to completion on a runtime of its own (the caller is a blocking thread).
fn run<F: std::future::Future>(future: F) -> Result<F::Output, ClusterError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| ClusterError::Prepare(e.to_string()))?;
    Ok(runtime.block_on(future))
}

/// Server-side applies the CRDs of `crds/` and the manifests of `config/rbac` (with the
/// operator's namespace), and waits until the CRDs are established.
async fn install(config: kube::Config) -> Result<(), ClusterError> {
    let client = kube::Client::try_from(config)?;
    let mut objects = vec![json!({"apiVersion": "v1", "kind": "Namespace",
                        "metadata": {"name": OPERATOR_NAMESPACE}})];
    objects.extend(fixtures::rbac_manifests()?);
    install_crds(&client).await?;
    let discovery = kube::Discovery::new(client.clone()).run().await?;
    for object in &objects {
        apply(&client, &discovery, object).await?;
    }
    Ok(())
}

/// Applies the CRDs of `crds/` and waits until both are Established.
async fn install_crds(client: &kube::Client) -> Result<(), ClusterError> {
    let discovery = kube::Discovery::new(client.clone()).run().await?;
    for crd in fixtures::our_crds()? {
        apply(client, &discovery, &crd).await?;
    }
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in fixtures::our_crds()? {
        let name = crd["metadata"]["name"].as_str().unwrap_or_default();
        let established = kube::runtime::wait::await_condition(
            crds.clone(),
            name,
            kube::runtime::wait::conditions::is_crd_established(),
        );
        tokio::time::timeout(Duration::from_secs(30), established)
            .await
            .map_err(|_| ClusterError::Prepare(format!("CRD {name} not established in 30 s")))?
            .map_err(|e| ClusterError::Prepare(e.to_string()))?;
    }
    admission_knows_the_team_kind(client, &discovery).await
}

/// The API server's admission resolves an admission policy's `paramKind` through a discovery
/// cache that kube-apiserver refreshes every 30 s, not when a CRD is created. Until it has, a
/// policy whose `paramKind` is TeamGpuPolicy (`teamgpu-namespace-membership`) fails to
/// configure and, with `failurePolicy: Fail`, refuses every namespace it matches: seen in CI
/// when a test deleted a namespace right after another had reinstalled the CRDs. So this waits
/// until a probe policy with that `paramKind` is configured: it then refuses a dry-run namespace
/// for want of parameters, not for want of the kind.
async fn admission_knows_the_team_kind(
    client: &kube::Client,
    discovery: &kube::Discovery,
) -> Result<(), ClusterError> {
    const PROBE: &str = "teamgpu-e2e-param-kind-probe";
    const WAIT: Duration = Duration::from_secs(60);
    let policy = json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": PROBE},
        "spec": {
            "failurePolicy": "Fail",
            "paramKind": {"apiVersion": TeamGpuPolicy::api_version(&()),
                          "kind": TeamGpuPolicy::kind(&())},
            "matchConstraints": {
                "objectSelector": {"matchLabels": {PROBE: "true"}},
                "resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
                                   "operations": ["CREATE"], "resources": ["namespaces"]}]
            },
            "validations": [{"expression": "false"}]
        }
    });
    let binding = json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": PROBE},
        "spec": {
            "policyName": PROBE,
            "paramRef": {"selector": {}, "parameterNotFoundAction": "Deny"},
            "validationActions": ["Deny"]
        }
    });
    apply(client, discovery, &policy).await?;
    apply(client, discovery, &binding).await?;
    let namespace: Namespace = serde_json::from_value(json!({
        "metadata": {"generateName": "probe-", "labels": {PROBE: "true"}}
    }))
    .map_err(|e| ClusterError::Prepare(e.to_string()))?;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let started = std::time::Instant::now();
    let outcome = loop {
        let message = match namespaces
            .create(
                &PostParams {
                    dry_run: true,
                    field_manager: None,
                },
                &namespace,
            )
            .await
        {
            Ok(_) => "admitted".to_owned(),
            Err(e) => e.to_string(),
        };
        let configured = message.contains(PROBE)
            && !message.contains("failed to configure policy")
            && !message.contains("not yet synced");
        if configured {
            break Ok(());
        }
        if started.elapsed() > WAIT {
            break Err(ClusterError::Prepare(format!(
                "admission did not resolve paramKind TeamGpuPolicy in {WAIT:?}: {message}"
            )));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    Api::<ValidatingAdmissionPolicyBinding>::all(client.clone())
        .delete(PROBE, &Default::default())
        .await?;
    Api::<ValidatingAdmissionPolicy>::all(client.clone())
        .delete(PROBE, &Default::default())
        .await?;
    if outcome.is_ok() {
        eprintln!(
            "e2e: admission resolved paramKind TeamGpuPolicy after {:?}",
            started.elapsed()
        );
    }
    outcome
}

/// Server-side applies one manifest as the harness.
async fn apply(
    client: &kube::Client,
    discovery: &kube::Discovery,
    object: &Value,
) -> Result<(), ClusterError> {
    let (api_version, kind) = (
        object["apiVersion"].as_str().unwrap_or_default(),
        object["kind"].as_str().unwrap_or_default(),
    );
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let gvk = kube::core::GroupVersionKind::gvk(group, version, kind);
    let (resource, capabilities): (ApiResource, _) = discovery
        .resolve_gvk(&gvk)
        .ok_or_else(|| ClusterError::Prepare(format!("the cluster does not serve {kind}")))?;
    let name = object["metadata"]["name"].as_str().unwrap_or_default();
    let api: Api<DynamicObject> = match object["metadata"]["namespace"].as_str() {
        Some(ns) if capabilities.scope == kube::discovery::Scope::Namespaced => {
            Api::namespaced_with(client.clone(), ns, &resource)
        }
        _ => Api::all_with(client.clone(), &resource),
    };
    api.patch(
        name,
        &PatchParams::apply(MANAGER).force(),
        &Patch::Apply(object),
    )
    .await?;
    Ok(())
}

impl std::fmt::Debug for TestCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestCluster")
            .field("kubeconfig", &self.kubeconfig)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::parse_request_totals;

    #[test]
    fn request_totals_are_summed_by_verb_and_resource() {
        let text = r#"# HELP apiserver_request_total Counter of apiserver requests
apiserver_request_total{code="201",component="apiserver",dry_run="",group="resource.k8s.io",resource="resourceclaimtemplates",scope="resource",subresource="",verb="APPLY",version="v1"} 3
apiserver_request_total{code="200",component="apiserver",dry_run="",group="resource.k8s.io",resource="resourceclaimtemplates",scope="resource",subresource="",verb="PATCH",version="v1"} 2
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="resourcequotas",scope="resource",subresource="status",verb="PUT",version="v1"} 5
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="",scope="",subresource="/readyz",verb="GET",version=""} 9
"#;
        let totals = parse_request_totals(text);
        assert_eq!(
            totals[&(
                "patch".into(),
                "resourceclaimtemplates.resource.k8s.io".into()
            )],
            5
        );
        assert_eq!(
            totals[&("update".into(), "resourcequotas/status".into())],
            5
        );
        assert_eq!(totals.len(), 2);
    }
}
