//! `TestCluster`: the in-process API stand-in (or, with `TEAMGPU_E2E_KUBECONFIG`, a real
//! cluster) for tests.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube::api::{Api, DeleteParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use serde_json::{Value, json};

use crate::controllers::{self, ControllerConfig};
use crate::core::Core;
use crate::faults::{Counters, FaultState, Faults};
use crate::fixtures::{FixtureError, our_crds};
use crate::openapi::{OpenApiError, Schemas};
use crate::resources::{Registry, RegistryError};
use crate::server::{ServeError, Server, ServerConfig};
use crate::store::DEFAULT_LOG_CAPACITY;

/// Environment variable naming a kubeconfig of a real cluster to run against instead.
pub const REAL_CLUSTER_ENV: &str = "TEAMGPU_E2E_KUBECONFIG";

/// Errors starting a test cluster.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// Reading fixtures (CRDs) failed.
    #[error(transparent)]
    Fixture(#[from] FixtureError),
    /// A CRD is malformed.
    #[error(transparent)]
    Registry(#[from] RegistryError),
    /// Loading the OpenAPI schemas failed.
    #[error(transparent)]
    OpenApi(#[from] OpenApiError),
    /// Serving failed.
    #[error(transparent)]
    Serve(#[from] ServeError),
    /// Writing the kubeconfig failed.
    #[error("writing kubeconfig {path}: {source}")]
    Kubeconfig {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// Reading a real cluster's kubeconfig failed.
    #[error("kubeconfig {0}: {1}")]
    KubeconfigRead(PathBuf, String),
    /// The kube client failed.
    #[error(transparent)]
    Kube(#[from] kube::Error),
}

/// Options of an in-process stand-in.
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    /// Serve the CRDs of `crds/` (default true).
    pub our_crds: bool,
    /// Additional CRD objects to serve.
    pub extra_crds: Vec<Value>,
    /// Controllers to run.
    pub controllers: ControllerConfig,
    /// Events retained for watch resumption (older resumes get 410 Gone).
    pub log_capacity: usize,
    /// Interval of watch bookmarks.
    pub bookmark_interval: Duration,
}

impl Default for ClusterOptions {
    fn default() -> Self {
        ClusterOptions {
            our_crds: true,
            extra_crds: Vec::new(),
            controllers: ControllerConfig::default(),
            log_capacity: DEFAULT_LOG_CAPACITY,
            bookmark_interval: ServerConfig::default().bookmark_interval,
        }
    }
}

#[derive(Debug)]
struct Local {
    server: Arc<Server>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

/// A cluster for one test: the in-process stand-in, or a real cluster.
pub struct TestCluster {
    client: kube::Client,
    config: kube::Config,
    kubeconfig: PathBuf,
    local: Option<Local>,
    created_namespaces: Mutex<Vec<String>>,
}

fn kubeconfig_yaml(url: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: teamgpu-e2e\n  cluster:\n    server: {url}\nusers:\n- name: teamgpu-e2e\n  user:\n    token: teamgpu-e2e\ncontexts:\n- name: teamgpu-e2e\n  context:\n    cluster: teamgpu-e2e\n    user: teamgpu-e2e\n    namespace: default\ncurrent-context: teamgpu-e2e\n"
    )
}

impl TestCluster {
    /// Starts the stand-in with default options, or connects to the real cluster named by
    /// `TEAMGPU_E2E_KUBECONFIG`.
    pub async fn start() -> Result<TestCluster, ClusterError> {
        TestCluster::start_with(ClusterOptions::default()).await
    }

    /// Like [`TestCluster::start`] with options (ignored for a real cluster).
    pub async fn start_with(opts: ClusterOptions) -> Result<TestCluster, ClusterError> {
        if let Some(path) = std::env::var_os(REAL_CLUSTER_ENV).filter(|p| !p.is_empty()) {
            return TestCluster::connect(PathBuf::from(path)).await;
        }
        TestCluster::start_local(opts).await
    }

    /// Starts the in-process stand-in regardless of `TEAMGPU_E2E_KUBECONFIG`.
    pub async fn start_local(opts: ClusterOptions) -> Result<TestCluster, ClusterError> {
        // The upstream OpenAPI documents (about 60 ms to load, once per process) load on a
        // background thread; the first validated write waits for them.
        let dir = crate::openapi::upstream_dir();
        if !dir.is_dir() {
            return Err(ClusterError::OpenApi(OpenApiError::Upstream(format!(
                "{} is missing",
                dir.display()
            ))));
        }
        std::thread::spawn(|| {
            let _ = Schemas::upstream();
        });
        let mut crds = if opts.our_crds {
            our_crds()?
        } else {
            Vec::new()
        };
        crds.extend(opts.extra_crds.iter().cloned());
        let registry = Registry::with_crds(&crds)?;
        let core = Core::new(registry, opts.log_capacity);
        for ns in ["default", "kube-system", "kube-public"] {
            core.bootstrap_namespace(ns);
        }
        let server = Arc::new(Server {
            core: core.clone(),
            faults: FaultState::default(),
            counters: Counters::default(),
            config: ServerConfig {
                bookmark_interval: opts.bookmark_interval,
            },
        });
        let (addr, serve_task) = server.serve().await?;
        let url = format!("http://{addr}");
        let path = std::env::temp_dir().join(format!(
            "teamgpu-e2e-{}-{}.kubeconfig",
            std::process::id(),
            addr.port()
        ));
        std::fs::write(&path, kubeconfig_yaml(&url)).map_err(|source| {
            ClusterError::Kubeconfig {
                path: path.clone(),
                source,
            }
        })?;
        let mut config = kube::Config::new(url.parse().expect("valid url"));
        config.default_namespace = "default".into();
        let client = kube::Client::try_from(config.clone())?;
        let ctl = controllers::spawn(core, opts.controllers);
        Ok(TestCluster {
            client,
            config,
            kubeconfig: path,
            local: Some(Local {
                server,
                tasks: vec![serve_task, ctl],
            }),
            created_namespaces: Mutex::new(Vec::new()),
        })
    }

    async fn connect(path: PathBuf) -> Result<TestCluster, ClusterError> {
        let kc = Kubeconfig::read_from(&path)
            .map_err(|e| ClusterError::KubeconfigRead(path.clone(), e.to_string()))?;
        let config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
            .await
            .map_err(|e| ClusterError::KubeconfigRead(path.clone(), e.to_string()))?;
        let client = kube::Client::try_from(config.clone())?;
        Ok(TestCluster {
            client,
            config,
            kubeconfig: path,
            local: None,
            created_namespaces: Mutex::new(Vec::new()),
        })
    }

    /// A client of the cluster, configured like kube's defaults (and the teamgpu binary): kube 5
    /// retries 429/503/504 answers itself (up to 15 times, 5 ms to 1000 s exponential backoff,
    /// honouring `Retry-After`).
    pub fn client(&self) -> kube::Client {
        self.client.clone()
    }

    /// A client that does not retry 429/503/504, so that a test sees every answer.
    pub fn client_without_retry(&self) -> kube::Client {
        let mut config = self.config.clone();
        config.default_retry = false;
        kube::Client::try_from(config).expect("client from a valid config")
    }

    /// A client (with kube's default retries) whose requests are counted by verb and resource
    /// in the returned [`Counters`], on either backend: give it to the operator to count exactly
    /// the operator's requests.
    pub fn recorded_client(&self) -> (kube::Client, Arc<Counters>) {
        let counters = Arc::new(Counters::default());
        let client = kube::client::ClientBuilder::try_from(self.config.clone())
            .expect("client from a valid config")
            .with_layer(&crate::recording::Record(counters.clone()))
            .build();
        (client, counters)
    }

    /// The client configuration (for clients made elsewhere, e.g. on another runtime).
    pub fn config(&self) -> &kube::Config {
        &self.config
    }

    /// Path of a kubeconfig file for the cluster (for the `teamgpu` binary).
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// Whether this is a real cluster (`TEAMGPU_E2E_KUBECONFIG`).
    pub fn is_real(&self) -> bool {
        self.local.is_none()
    }

    /// Creates a fresh namespace `<prefix><random>`, labelled `teamgpu.io/e2e=true`, deleted by
    /// [`TestCluster::shutdown`] or, failing that, when the cluster is dropped.
    pub async fn namespace(&self, prefix: &str) -> Result<String, ClusterError> {
        let api: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(self.client.clone());
        let ns: k8s_openapi::api::core::v1::Namespace = serde_json::from_value(json!({
            "metadata": {"generateName": prefix, "labels": {"teamgpu.io/e2e": "true"}}
        }))
        .expect("namespace");
        let created = api.create(&PostParams::default(), &ns).await?;
        let name = created.metadata.name.unwrap_or_default();
        self.created_namespaces
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(name.clone());
        Ok(name)
    }

    /// Deletes the namespaces made by [`TestCluster::namespace`] and stops the stand-in.
    pub async fn shutdown(self) -> Result<(), ClusterError> {
        let names = std::mem::take(
            &mut *self
                .created_namespaces
                .lock()
                .unwrap_or_else(|e| e.into_inner()),
        );
        let api: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(self.client.clone());
        for n in names {
            match api.delete(&n, &DeleteParams::background()).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    fn server(&self) -> Option<&Arc<Server>> {
        self.local.as_ref().map(|l| &l.server)
    }

    /// Sets the injected faults (no effect on a real cluster).
    pub fn set_faults(&self, faults: Faults) {
        if let Some(s) = self.server() {
            s.faults.set(faults);
        }
    }

    /// Request counters (None on a real cluster).
    pub fn counters(&self) -> Option<&Counters> {
        self.server().map(|s| &s.counters)
    }

    /// The API core, for direct inspection (None on a real cluster).
    pub fn core(&self) -> Option<&Arc<Core>> {
        self.server().map(|s| &s.core)
    }

    /// Drops the retained watch events, so that every resume from an older resourceVersion gets
    /// 410 Gone (no effect on a real cluster).
    pub fn compact(&self) {
        if let Some(core) = self.core() {
            core.lock().compact();
        }
    }
}

impl std::fmt::Debug for TestCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestCluster")
            .field("kubeconfig", &self.kubeconfig)
            .field("real", &self.is_real())
            .finish()
    }
}

impl Drop for TestCluster {
    fn drop(&mut self) {
        if let Some(l) = &self.local {
            for t in &l.tasks {
                t.abort();
            }
            let _ = std::fs::remove_file(&self.kubeconfig);
            return;
        }
        // A real cluster: delete the namespaces a test made even when it did not call
        // `shutdown` (e.g. it panicked), on a thread with its own runtime (Drop cannot await).
        let names = std::mem::take(
            &mut *self
                .created_namespaces
                .lock()
                .unwrap_or_else(|e| e.into_inner()),
        );
        if names.is_empty() {
            return;
        }
        let config = self.config.clone();
        let cleanup = std::thread::spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            rt.block_on(async move {
                let Ok(client) = kube::Client::try_from(config) else {
                    return;
                };
                let api: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client);
                for n in names {
                    let _ = api.delete(&n, &DeleteParams::background()).await;
                }
            });
        });
        let _ = cleanup.join();
    }
}
