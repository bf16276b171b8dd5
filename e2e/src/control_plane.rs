//! A real Kubernetes control plane for tests, in the manner of controller-runtime's envtest:
//! `etcd`, `kube-apiserver`, `kube-controller-manager` and `kube-scheduler` from a test assets
//! directory ([`ASSETS_ENV`]) as child processes, with certificates made in-process. There is no
//! kubelet: [`crate::node_agent`] plays its API part.

use std::fs::{self, File};
use std::io;
use std::net::TcpListener;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use k8s_openapi::api::core::v1::ServiceAccount;
use kube::config::{KubeConfigOptions, Kubeconfig, KubeconfigError};
use kube::{Api, Client};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

/// The environment variable naming the directory with the four control-plane programs.
pub const ASSETS_ENV: &str = "TEAMGPU_E2E_ASSETS";

/// The programs of the assets directory, in start order.
const COMPONENTS: [&str; 4] = [
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
];

/// Normally 5-6 s, but a loaded 2-core machine building Rust meanwhile can be much slower.
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// The service-account issuer and audience of a real cluster.
const ISSUER: &str = "https://kubernetes.default.svc";

/// Run as `sh -c WATCHDOG sh TEST_PID PGID DIR`: once the test process is gone (however it
/// ended: exit, panic, SIGKILL, a never-dropped static), stops the process group (TERM, up to
/// 3 s, KILL) and removes the directory. It ignores HUP/INT so that Ctrl-C reaches only the test
/// process; a zombie counts as gone (`kill -0` succeeds on one, and an orphan's reaper may be
/// slow). Dash's `kill` needs the `-s SIG -- -PGID` form.
const WATCHDOG: &str = r#"trap '' HUP INT
alive() { kill -s 0 "$1" 2>/dev/null && [ "$(sed 's/.*) //;s/ .*//' "/proc/$1/stat" 2>/dev/null)" != Z ]; }
while alive "$1"; do sleep 0.2; done
kill -s TERM -- "-$2" 2>/dev/null
i=0
while [ "$i" -lt 15 ] && kill -s 0 -- "-$2" 2>/dev/null; do sleep 0.2; i=$((i + 1)); done
kill -s KILL -- "-$2" 2>/dev/null
rm -rf -- "$3"
"#;

/// How kube-scheduler scores the nodes that fit a Pod.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum NodeScoring {
    /// Its defaults: `NodeResourcesFit` with `LeastAllocated`, which spreads Pods over nodes.
    #[default]
    Default,
    /// A profile that packs: `NodeResourcesFit` with `MostAllocated` on cpu and no
    /// `NodeResourcesBalancedAllocation`. kube-scheduler 1.36 does not score DRA devices, so on
    /// nodes whose CPUs go with their GPUs, Pods that request cpu in proportion are packed onto
    /// the nodes already in use, and whole nodes stay free for large claims.
    MostAllocatedCpu,
}

/// The scoring of the control plane [`shared`] starts; set before it starts.
static SCORING: OnceLock<NodeScoring> = OnceLock::new();

/// Makes the control plane that [`shared`] starts score nodes with `scoring`. Call it before
/// the first [`shared`] (or [`crate::cluster::TestCluster::start`]); an error once another
/// scoring was chosen or the control plane started with its default.
pub fn use_node_scoring(scoring: NodeScoring) -> Result<(), String> {
    let chosen = *SCORING.get_or_init(|| scoring);
    if chosen == scoring {
        Ok(())
    } else {
        Err(format!(
            "the control plane already scores nodes with {chosen:?}"
        ))
    }
}

/// The kube-scheduler configuration of [`NodeScoring::MostAllocatedCpu`], with the client
/// settings that its flags give otherwise (a `--config` file overrides them).
const PACKING_SCHEDULER: &str = r#"apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection:
  kubeconfig: DIR/scheduler.kubeconfig
  qps: 500
  burst: 1000
leaderElection:
  leaderElect: false
profiles:
- schedulerName: default-scheduler
  plugins:
    score:
      disabled:
      - name: NodeResourcesBalancedAllocation
  pluginConfig:
  - name: NodeResourcesFit
    args:
      scoringStrategy:
        type: MostAllocated
        resources:
        - name: cpu
          weight: 1
"#;

/// Why the control plane could not be started.
#[derive(Debug, thiserror::Error)]
pub enum ControlPlaneError {
    /// The assets directory lacks a program.
    #[error(
        "the test assets directory {0} has no program {1} (it needs etcd, kube-apiserver, kube-controller-manager and kube-scheduler)"
    )]
    MissingAsset(PathBuf, &'static str),
    /// Writing the working directory, finding free ports or spawning failed.
    #[error("could not set up the control plane: {0}")]
    Io(#[from] io::Error),
    /// rcgen failed to make a key or certificate.
    #[error("could not make the control plane's certificates: {0}")]
    Certificates(#[from] rcgen::Error),
    /// The admin kubeconfig could not be loaded.
    #[error("could not load the admin kubeconfig: {0}")]
    Kubeconfig(#[from] KubeconfigError),
    /// A component exited or was not ready in time; the message ends with its log's tail.
    #[error("{0}")]
    NotReady(String),
}

/// A running control plane: four processes in one process group and a working directory
/// `$TMPDIR/teamgpu-e2e-cp-*` (certificates, kubeconfigs, etcd data, `COMPONENT.log`).
/// [`ControlPlane::stop`] (or dropping it) stops them and removes the directory.
#[derive(Debug)]
pub struct ControlPlane {
    dir: PathBuf,
    url: String,
    config: kube::Config,
    /// The first one's pid is the process group.
    children: Vec<(&'static str, Child)>,
    watchdog: Option<Child>,
}

/// The assets directory from [`ASSETS_ENV`], if set and not empty. A relative path is taken
/// from the workspace root, where `cargo test` is run (test binaries run in their crate's
/// directory).
pub fn assets_from_env() -> Option<PathBuf> {
    let dir = PathBuf::from(std::env::var_os(ASSETS_ENV).filter(|value| !value.is_empty())?);
    Some(if dir.is_absolute() {
        dir
    } else {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(dir)
    })
}

/// The control plane of this process, started on the first call and shared by all its tests
/// (~6 s and ~600 MiB each). Never dropped: the watchdog tears it down. A failed start is
/// remembered. Blocks: from async code, call it through `spawn_blocking`.
pub fn shared() -> Result<&'static ControlPlane, String> {
    static SHARED: OnceLock<Result<ControlPlane, String>> = OnceLock::new();
    SHARED
        .get_or_init(|| {
            let assets = assets_from_env().ok_or_else(|| {
                format!(
                    "{ASSETS_ENV} is not set: set it to a directory with etcd, kube-apiserver, kube-controller-manager, kube-scheduler of Kubernetes 1.34+"
                )
            })?;
            let scoring = *SCORING.get_or_init(NodeScoring::default);
            ControlPlane::start_with(&assets, scoring).map_err(|error| error.to_string())
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// The feature gate that serves DeviceTaintRules, for every component.
const TAINT_RULES: &str = "--feature-gates=DRADeviceTaintRules=true";

impl ControlPlane {
    /// Starts the four components from `assets` and waits until the API server is ready and the
    /// controller-manager works. Blocks the thread (with a tokio runtime of its own), so call it
    /// from a plain thread or `spawn_blocking`.
    pub fn start(assets: &Path) -> Result<ControlPlane, ControlPlaneError> {
        Self::start_with(assets, NodeScoring::Default)
    }

    /// [`ControlPlane::start`], with kube-scheduler scoring nodes by `scoring`.
    pub fn start_with(
        assets: &Path,
        scoring: NodeScoring,
    ) -> Result<ControlPlane, ControlPlaneError> {
        if let Some(program) = COMPONENTS.into_iter().find(|p| !assets.join(p).is_file()) {
            return Err(ControlPlaneError::MissingAsset(
                assets.to_path_buf(),
                program,
            ));
        }
        // Free ports are bound and released before a component binds them, so another process
        // may take one in between: then try again with fresh ones.
        for _ in 1..3 {
            match Self::start_once(assets, scoring) {
                Err(ControlPlaneError::NotReady(message))
                    if message.contains("address already in use") => {}
                result => return result,
            }
        }
        Self::start_once(assets, scoring)
    }

    fn start_once(assets: &Path, scoring: NodeScoring) -> Result<ControlPlane, ControlPlaneError> {
        let deadline = Instant::now() + READY_TIMEOUT;
        // All bound at once, so that none is handed out twice.
        let listeners = (0..5)
            .map(|_| TcpListener::bind("127.0.0.1:0"))
            .collect::<io::Result<Vec<_>>>()?;
        let ports = listeners
            .iter()
            .map(|listener| Ok(listener.local_addr()?.port()))
            .collect::<io::Result<Vec<_>>>()?;
        drop(listeners);
        let [etcd, peer, api, kcm, scheduler] = ports[..] else {
            unreachable!("five ports")
        };
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |elapsed| elapsed.as_nanos());
        // The prefix makes leftovers, and their processes (whose arguments name it), easy to find.
        let dir =
            std::env::temp_dir().join(format!("teamgpu-e2e-cp-{}-{nanos}", std::process::id()));
        let url = format!("https://127.0.0.1:{api}");
        fs::create_dir_all(&dir)?;
        let config = match write_pki(&dir, &url) {
            Ok(config) => config,
            Err(error) => {
                let _ = fs::remove_dir_all(&dir);
                return Err(error);
            }
        };
        // From here on, dropping `plane` stops what was started and removes the directory.
        let mut plane = ControlPlane {
            dir,
            url,
            config,
            children: Vec::new(),
            watchdog: None,
        };
        let etcd = format!("http://127.0.0.1:{etcd}");
        // 8 GiB of database instead of etcd's 2 GiB: the scale example at 10,000 namespaces
        // writes 400,000 objects (three floors and the operator's).
        plane.spawn(
            assets,
            "etcd",
            &format!(
                "--data-dir=DIR/etcd --listen-client-urls={etcd} --advertise-client-urls={etcd} \
                 --listen-peer-urls=http://127.0.0.1:{peer} --unsafe-no-fsync --log-level=warn \
                 --quota-backend-bytes=8589934592"
            ),
        )?;
        plane.watchdog = Some(
            Command::new("sh")
                .args(["-c", WATCHDOG, "sh", &std::process::id().to_string()])
                .arg(plane.children[0].1.id().to_string())
                .arg(&plane.dir)
                .stdin(Stdio::null())
                // Else a harness reading our output would wait for the watchdog to close it.
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                // Its own group, so that Ctrl-C does not reach it.
                .process_group(0)
                .spawn()?,
        );
        // Endpoints cannot hold 127.0.0.1 (so no reconciler); hand-made Nodes would get a
        // not-ready taint that no kubelet ever lifts (TaintNodesByCondition). DeviceTaintRules
        // (beta, off by default in 1.36) are served, so that teamgpu's use of them is tested.
        plane.spawn(
            assets,
            "kube-apiserver",
            &format!(
                "--etcd-servers={etcd} --secure-port={api} --bind-address=127.0.0.1 \
                 --advertise-address=127.0.0.1 --service-cluster-ip-range=10.96.0.0/16 \
                 --endpoint-reconciler-type=none --authorization-mode=Node,RBAC \
                 --client-ca-file=DIR/ca.crt --tls-cert-file=DIR/apiserver.crt \
                 --tls-private-key-file=DIR/apiserver.key --service-account-issuer={ISSUER} \
                 --service-account-key-file=DIR/sa.pub --api-audiences={ISSUER} \
                 --service-account-signing-key-file=DIR/sa.key --profiling=false \
                 --enable-admission-plugins=ResourceQuota,ValidatingAdmissionPolicy \
                 --disable-admission-plugins=TaintNodesByCondition \
                 {TAINT_RULES} --runtime-config=resource.k8s.io/v1beta2=true"
            ),
        )?;
        // Skipping the lookup avoids an exit when started before the API server's RBAC is
        // ready; the default client rate limits would add ~5 s to start-up.
        let common = |name: &str| {
            format!(
                "--kubeconfig=DIR/{name}.kubeconfig --authentication-kubeconfig=DIR/{name}.kubeconfig \
                 --authorization-kubeconfig=DIR/{name}.kubeconfig --authentication-skip-lookup=true \
                 --client-ca-file=DIR/ca.crt --bind-address=127.0.0.1 --leader-elect=false \
                 --kube-api-qps=500 --kube-api-burst=1000 {TAINT_RULES}"
            )
        };
        // No kubelet posts Node status, so no node lifecycle controller: hand-made Nodes stay Ready.
        plane.spawn(
            assets,
            "kube-controller-manager",
            &format!(
                "{} --secure-port={kcm} --use-service-account-credentials=true \
                 --service-account-private-key-file=DIR/sa.key --root-ca-file=DIR/ca.crt \
                 --controllers=*,-node-lifecycle-controller",
                common("kcm")
            ),
        )?;
        let scheduler_args = match scoring {
            NodeScoring::Default => format!("{} --secure-port={scheduler}", common("scheduler")),
            NodeScoring::MostAllocatedCpu => {
                let file = plane.dir.join("scheduler.yaml");
                let dir = plane.dir.display().to_string();
                fs::write(&file, PACKING_SCHEDULER.replace("DIR", &dir))?;
                format!(
                    "--config={} --authentication-kubeconfig=DIR/scheduler.kubeconfig \
                     --authorization-kubeconfig=DIR/scheduler.kubeconfig \
                     --authentication-skip-lookup=true --client-ca-file=DIR/ca.crt \
                     --bind-address=127.0.0.1 --secure-port={scheduler} {TAINT_RULES}",
                    file.display()
                )
            }
        };
        plane.spawn(assets, "kube-scheduler", &scheduler_args)?;
        plane.wait_ready(deadline)?;
        Ok(plane)
    }

    /// Spawns a component with `args` (split at whitespace, `DIR` the working directory) into the
    /// process group, with its output in `DIR/COMPONENT.log`.
    fn spawn(
        &mut self,
        assets: &Path,
        component: &'static str,
        args: &str,
    ) -> Result<(), ControlPlaneError> {
        let dir = self.dir.display().to_string();
        let log = File::create(self.dir.join(format!("{component}.log")))?;
        let spawned = Command::new(assets.join(component))
            .args(args.split_whitespace().map(|arg| arg.replace("DIR", &dir)))
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            // One group for all (and the processes behind wrapper scripts): one signal stops all.
            .process_group(self.children.first().map_or(0, |(_, c)| c.id() as i32))
            .spawn();
        match spawned {
            Ok(child) => {
                self.children.push((component, child));
                Ok(())
            }
            // Joining the group fails if its first member already exited: report that.
            Err(error) => Err(self.exited().unwrap_or_else(|| {
                ControlPlaneError::NotReady(format!("could not start {component}: {error}"))
            })),
        }
    }

    /// Polls until `/readyz` answers and the `default` ServiceAccount exists (made by the
    /// controller-manager, so that works too), failing early if a component exits.
    fn wait_ready(&mut self, deadline: Instant) -> Result<(), ControlPlaneError> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let config = self.config.clone();
        runtime.block_on(async {
            let client = Client::try_from(config)
                .map_err(|error| ControlPlaneError::NotReady(format!("no client: {error}")))?;
            let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), "default");
            let mut last = ("kube-apiserver", "no answer yet".to_owned());
            while Instant::now() < deadline {
                if let Some(error) = self.exited() {
                    return Err(error);
                }
                let attempt = async {
                    let readyz = http::Request::get("/readyz").body(Vec::new());
                    let readyz = readyz.expect("a valid request");
                    let api = |error: kube::Error| ("kube-apiserver", format!("/readyz: {error}"));
                    client.request_text(readyz).await.map_err(api)?;
                    let kcm = "kube-controller-manager";
                    match accounts.get_opt("default").await {
                        Ok(Some(_)) => Ok(()),
                        Ok(None) => Err((kcm, "no default ServiceAccount yet".into())),
                        Err(error) => Err((kcm, format!("reading ServiceAccounts: {error}"))),
                    }
                };
                match tokio::time::timeout(Duration::from_secs(2), attempt).await {
                    Ok(Ok(())) => return Ok(()),
                    Ok(Err(error)) => last = error,
                    Err(_) => last = ("kube-apiserver", "no answer within 2 s".into()),
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(ControlPlaneError::NotReady(format!(
                "the control plane was not ready within {READY_TIMEOUT:?}: {}; {}",
                last.1,
                self.log_tail(last.0)
            )))
        })
    }

    /// The first component that has exited, as an error with its log's tail.
    fn exited(&mut self) -> Option<ControlPlaneError> {
        let (component, status) =
            self.children
                .iter_mut()
                .find_map(|(component, child)| match child.try_wait() {
                    Ok(None) => None,
                    Ok(Some(status)) => Some((*component, status.to_string())),
                    Err(error) => Some((*component, error.to_string())),
                })?;
        Some(ControlPlaneError::NotReady(format!(
            "{component} exited during start-up ({status}); {}",
            self.log_tail(component)
        )))
    }

    /// The last 30 lines of a component's log: enough to show a Go program's fatal error.
    fn log_tail(&self, component: &str) -> String {
        let log = self.dir.join(format!("{component}.log"));
        let text = fs::read(&log).map_or_else(
            |error| format!("(unreadable: {error})"),
            |bytes| String::from_utf8_lossy(&bytes).into_owned(),
        );
        let lines: Vec<&str> = text.lines().collect();
        let tail = lines[lines.len().saturating_sub(30)..].join("\n  ");
        format!("last lines of {}:\n  {tail}", log.display())
    }

    /// Stops `component` (say `kube-controller-manager`) with SIGSTOP until the [`Paused`] is
    /// dropped: its connections stay open and it acts on nothing, as a component far behind or
    /// hung does. `None` if this control plane has no such component.
    pub fn pause(&self, component: &str) -> Option<Paused> {
        let (_, child) = self.children.iter().find(|(name, _)| *name == component)?;
        signal_process(child.id(), "STOP");
        Some(Paused { pid: child.id() })
    }

    /// The admin's kubeconfig file (`O=system:masters`), e.g. for `kubectl --kubeconfig`.
    pub fn admin_kubeconfig(&self) -> PathBuf {
        self.dir.join("admin.kubeconfig")
    }

    /// The API server's URL, `https://127.0.0.1:PORT`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The admin client configuration. A `kube::Client` is bound to the runtime it was made in,
    /// so make one per runtime (each `#[tokio::test]` has its own).
    pub fn admin_config(&self) -> kube::Config {
        self.config.clone()
    }

    /// Stops the processes (TERM, KILL after 3 s) and removes the working directory. Idempotent.
    pub fn stop(&mut self) {
        // The watchdog first, so that it does not act on a process group that may be gone.
        if let Some(mut watchdog) = self.watchdog.take() {
            signal_group(watchdog.id(), "KILL");
            let _ = watchdog.wait();
        }
        if let Some(pgid) = self.children.first().map(|(_, child)| child.id()) {
            signal_group(pgid, "TERM");
            let deadline = Instant::now() + Duration::from_secs(3);
            while Instant::now() < deadline
                && (self.children.iter_mut()).any(|(_, c)| matches!(c.try_wait(), Ok(None)))
            {
                std::thread::sleep(Duration::from_millis(50));
            }
            // While a child is unreaped its group id cannot be reused: this reaches no stranger.
            signal_group(pgid, "KILL");
        }
        for (_, mut child) in self.children.drain(..) {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = fs::remove_dir_all(&self.dir);
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Writes a fresh CA (ECDSA P-256, which every component accepts and ring makes quickly), the
/// certificates it signs, the service-account keys and the kubeconfigs (file paths, not
/// embedded data); returns the admin's client configuration.
fn write_pki(dir: &Path, url: &str) -> Result<kube::Config, ControlPlaneError> {
    let write = |name: &str, contents: &str| fs::write(dir.join(name), contents);
    let ca_key = KeyPair::generate()?;
    let mut ca = CertificateParams::default();
    ca.distinguished_name
        .push(DnType::CommonName, "teamgpu-e2e-ca");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    write("ca.crt", &ca.self_signed(&ca_key)?.pem())?;
    let issuer = Issuer::new(ca, ca_key);
    let sa = KeyPair::generate()?;
    write("sa.key", &sa.serialize_pem())?;
    // PKIX "PUBLIC KEY", as --service-account-key-file expects.
    write("sa.pub", &sa.public_key_pem())?;
    let certificates = [
        ("apiserver", "kube-apiserver", None),
        ("admin", "teamgpu-e2e-admin", Some("system:masters")),
        ("kcm", "system:kube-controller-manager", None),
        ("scheduler", "system:kube-scheduler", None),
    ];
    for (name, user, group) in certificates {
        let key = KeyPair::generate()?;
        let server = name == "apiserver";
        let sans = if server {
            vec!["127.0.0.1".into(), "localhost".into()]
        } else {
            vec![]
        };
        let mut params = CertificateParams::new(sans)?;
        params.distinguished_name.push(DnType::CommonName, user);
        if let Some(group) = group {
            params
                .distinguished_name
                .push(DnType::OrganizationName, group);
        }
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![if server {
            ExtendedKeyUsagePurpose::ServerAuth
        } else {
            ExtendedKeyUsagePurpose::ClientAuth
        }];
        write(
            &format!("{name}.crt"),
            &params.signed_by(&key, &issuer)?.pem(),
        )?;
        write(&format!("{name}.key"), &key.serialize_pem())?;
        let d = dir.display();
        write(
            &format!("{name}.kubeconfig"),
            &format!(
                "apiVersion: v1\nkind: Config\ncurrent-context: e2e\n\
                 clusters: [{{name: e2e, cluster: {{server: '{url}', certificate-authority: '{d}/ca.crt'}}}}]\n\
                 users: [{{name: {name}, user: {{client-certificate: '{d}/{name}.crt', client-key: '{d}/{name}.key'}}}}]\n\
                 contexts: [{{name: e2e, context: {{cluster: e2e, user: {name}}}}}]\n"
            ),
        )?;
    }
    let kubeconfig = Kubeconfig::read_from(dir.join("admin.kubeconfig"))?;
    // Async only in signature (it would run exec plugins): no tokio runtime needed.
    let mut config = futures::executor::block_on(kube::Config::from_custom_kubeconfig(
        kubeconfig,
        &KubeConfigOptions::default(),
    ))?;
    // A proxy from the environment (HTTPS_PROXY) must not apply to a local cluster.
    config.proxy_url = None;
    Ok(config)
}

/// A component of a [`ControlPlane`] stopped by [`ControlPlane::pause`]; dropping it (also on a
/// test's panic) lets it go on.
#[derive(Debug)]
pub struct Paused {
    pid: u32,
}

impl Drop for Paused {
    fn drop(&mut self) {
        signal_process(self.pid, "CONT");
    }
}

/// Sends `signal` to process `pid` and to its children (a wrapper script's program).
fn signal_process(pid: u32, signal: &str) {
    shell_kill(
        r#"kill -s "$1" "$2" 2>/dev/null; pkill "-$1" -P "$2" 2>/dev/null"#,
        signal,
        pid,
    );
}

/// Sends `signal` to process group `pgid`.
fn signal_group(pgid: u32, signal: &str) {
    shell_kill(r#"kill -s "$1" -- "-$2" 2>/dev/null"#, signal, pgid);
}

/// Runs `script` with `$1` the signal and `$2` the id, through `sh`'s `kill` (no `unsafe`, so
/// no libc).
fn shell_kill(script: &str, signal: &str, id: u32) {
    let _ = Command::new("sh")
        .args(["-c", script, "sh", signal])
        .arg(id.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}
