//! A real Kubernetes control plane for tests, in the manner of controller-runtime's envtest.
//!
//! [`ControlPlane::start`] runs `etcd`, `kube-apiserver`, `kube-controller-manager` and
//! `kube-scheduler` from a "test assets" directory (see [`ASSETS_ENV`]) as child processes, with
//! certificates made in-process, and returns once the API server is ready and the controllers
//! work. Tests then talk to the real API server (real validation, admission, RBAC, garbage
//! collection, scheduling) instead of an imitation.
//!
//! There is no kubelet: Nodes are made by hand and Pods never run unless something plays the
//! kubelet's API part, which [`crate::node_agent`] does.
//!
//! Start-up takes ~5-6 s and ~600 MiB, so a test binary normally shares one control plane
//! between all its tests through [`shared`]. Because statics are never dropped, that one is torn
//! down by a watchdog process (see [`ControlPlane::start`]) when the test process is gone, however
//! it ended (normal exit, panic, `SIGKILL`).

use std::fmt::Write as _;
use std::fs::{self, File};
use std::io::{self, Read, Seek, SeekFrom};
use std::net::TcpListener;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use k8s_openapi::api::core::v1::ServiceAccount;
use kube::config::{KubeConfigOptions, Kubeconfig, KubeconfigError};
use kube::{Api, Client};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};

/// The environment variable naming the directory with the four control-plane programs.
pub const ASSETS_ENV: &str = "TEAMGPU_E2E_ASSETS";

/// The programs that must be in the assets directory, in start order.
pub const COMPONENTS: [&str; 4] = [
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
];

/// How long [`ControlPlane::start`] waits for readiness: normally 5-6 s, but a loaded 2-core
/// machine building Rust at the same time can be much slower.
pub const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// How often [`ControlPlane::start`] tries when a port was taken between choosing and binding.
pub const START_ATTEMPTS: u32 = 3;

/// How often readiness and the children's liveness are polled during start-up.
const POLL_INTERVAL: Duration = Duration::from_millis(100);

/// How many log lines an error message carries: enough to show a Go program's fatal error.
const LOG_TAIL_LINES: usize = 30;

/// How long [`ControlPlane::stop`] lets the processes exit on `SIGTERM` before `SIGKILL`.
const STOP_GRACE: Duration = Duration::from_secs(3);

/// The service-account issuer and audience: the usual in-cluster one, so that tokens look like
/// those of a real cluster.
const SERVICE_ACCOUNT_ISSUER: &str = "https://kubernetes.default.svc";

/// The admin user's certificate subject. `system:masters` bypasses RBAC.
pub const ADMIN_USER: &str = "teamgpu-e2e-admin";

/// The watchdog script, run as `sh -c WATCHDOG sh TEST_PID PGID DIR`. It waits until the test
/// process is gone, then stops the control plane's process group (`SIGTERM`, up to 3 s, then
/// `SIGKILL`) and removes the working directory. It ignores `SIGHUP`/`SIGINT` so that closing the
/// terminal or pressing Ctrl-C reaches the test process (which then exits) and not the
/// watchdog. A zombie counts as gone: `kill -0` succeeds on one, and an orphan may wait a while
/// for its reaper. Dash's `kill` needs the `-s SIG -- -PGID` form for process groups.
const WATCHDOG: &str = r#"trap '' HUP INT
alive() { kill -s 0 "$1" 2>/dev/null && [ "$(sed 's/.*) //;s/ .*//' "/proc/$1/stat" 2>/dev/null)" != Z ]; }
while alive "$1"; do sleep 0.2; done
kill -s TERM -- "-$2" 2>/dev/null
i=0
while [ "$i" -lt 15 ] && kill -s 0 -- "-$2" 2>/dev/null; do sleep 0.2; i=$((i + 1)); done
kill -s KILL -- "-$2" 2>/dev/null
rm -rf -- "$3"
"#;

/// Why the control plane could not be started.
#[derive(Debug, thiserror::Error)]
pub enum ControlPlaneError {
    /// The assets directory lacks one of [`COMPONENTS`].
    #[error(
        "the test assets directory {dir} has no program {program} (it needs etcd, kube-apiserver, kube-controller-manager and kube-scheduler)"
    )]
    MissingAsset {
        /// The assets directory.
        dir: PathBuf,
        /// The missing program.
        program: &'static str,
    },
    /// A file of the working directory (certificates, kubeconfigs) could not be written.
    #[error("could not write {path}: {source}")]
    Write {
        /// The file or directory.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// rcgen failed to make a key or certificate.
    #[error("could not make the control plane's certificates: {0}")]
    Certificates(#[from] rcgen::Error),
    /// No free local port could be reserved.
    #[error("could not find a free local port: {0}")]
    Port(#[source] io::Error),
    /// A component's process could not be spawned.
    #[error("could not start {component}: {source}")]
    Spawn {
        /// The component.
        component: String,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// A component exited while the control plane was starting.
    #[error("{component} exited during start-up ({status}); last lines of {}:\n{tail}", log.display())]
    Exited {
        /// The component.
        component: &'static str,
        /// Its exit status.
        status: String,
        /// Its log file.
        log: PathBuf,
        /// The end of its log.
        tail: String,
    },
    /// The control plane was not ready in time.
    #[error(
        "the control plane was not ready within {timeout:?}: {reason}; last lines of {}:\n{tail}", log.display()
    )]
    NotReady {
        /// How long was waited.
        timeout: Duration,
        /// What was still missing, with the last error seen.
        reason: String,
        /// The log of the component most likely at fault.
        log: PathBuf,
        /// The end of that log.
        tail: String,
    },
    /// The admin kubeconfig could not be loaded.
    #[error("could not load the admin kubeconfig: {0}")]
    Kubeconfig(#[from] KubeconfigError),
    /// The readiness check could not run (no thread, no tokio runtime, no client).
    #[error("could not check readiness: {0}")]
    Readiness(String),
}

/// One running component.
#[derive(Debug)]
struct Process {
    component: &'static str,
    child: Child,
    log: PathBuf,
}

/// A running control plane: four processes in one process group and a working directory with
/// their certificates, kubeconfigs, etcd data and logs. [`ControlPlane::stop`] (or dropping it)
/// stops them and removes the directory.
#[derive(Debug)]
pub struct ControlPlane {
    dir: PathBuf,
    url: String,
    ca_pem: String,
    admin_kubeconfig: PathBuf,
    config: kube::Config,
    processes: Vec<Process>,
    /// The process group of the four components: the first one's pid.
    pgid: Option<u32>,
    watchdog: Option<Child>,
    stopped: bool,
}

/// The assets directory from [`ASSETS_ENV`], if set and not empty.
pub fn assets_from_env() -> Option<PathBuf> {
    std::env::var_os(ASSETS_ENV)
        .filter(|value| !value.is_empty())
        .map(PathBuf::from)
}

/// The one control plane of this process, started on the first call from [`ASSETS_ENV`] and
/// shared by every test of the binary (starting one per test would cost ~6 s and ~600 MiB each).
///
/// It is never dropped: the watchdog started with it tears it down once the process is gone. A
/// failed start is remembered, so every later caller gets the same error at once. Blocks the
/// calling thread during start-up: from async code, call it through `spawn_blocking`.
pub fn shared() -> Result<&'static ControlPlane, String> {
    static SHARED: OnceLock<Result<ControlPlane, String>> = OnceLock::new();
    SHARED
        .get_or_init(|| {
            let assets = assets_from_env().ok_or_else(|| {
                format!(
                    "{ASSETS_ENV} is not set: set it to a directory with etcd, kube-apiserver, kube-controller-manager, kube-scheduler of Kubernetes 1.34+"
                )
            })?;
            ControlPlane::start(&assets).map_err(|error| error.to_string())
        })
        .as_ref()
        .map_err(Clone::clone)
}

impl ControlPlane {
    /// Starts the four components from `assets` and waits (up to [`READY_TIMEOUT`]) until the
    /// API server answers `/readyz` and the controller-manager has made the `default`
    /// ServiceAccount of namespace `default`.
    ///
    /// Blocks the calling thread; it needs no tokio runtime (the readiness check runs one of its
    /// own on a helper thread), so call it from a plain thread or `spawn_blocking`.
    ///
    /// The processes share one process group, and a small `sh` watchdog (in a process group of
    /// its own, so Ctrl-C does not reach it) stops that group and removes the working directory
    /// once this process is gone. That covers what `Drop` cannot: statics, `std::process::exit`,
    /// panics with `panic = "abort"`, and `SIGKILL`.
    ///
    /// Free ports are found by binding port 0 and releasing it, so another process may take one
    /// before the component binds it; a start that fails with "address already in use" is
    /// therefore retried (up to [`START_ATTEMPTS`] times) with fresh ports.
    pub fn start(assets: &Path) -> Result<ControlPlane, ControlPlaneError> {
        for program in COMPONENTS {
            if !assets.join(program).is_file() {
                return Err(ControlPlaneError::MissingAsset {
                    dir: assets.to_path_buf(),
                    program,
                });
            }
        }
        let mut attempt = 1;
        loop {
            match Self::start_once(assets) {
                Err(ControlPlaneError::Exited { tail, .. })
                    if attempt < START_ATTEMPTS && tail.contains("address already in use") =>
                {
                    attempt += 1;
                }
                result => return result,
            }
        }
    }

    /// One attempt of [`ControlPlane::start`].
    fn start_once(assets: &Path) -> Result<ControlPlane, ControlPlaneError> {
        let started = Instant::now();
        let dir = unique_temp_dir();
        fs::create_dir_all(&dir).map_err(|source| ControlPlaneError::Write {
            path: dir.clone(),
            source,
        })?;
        let setup = match Setup::prepare(&dir) {
            Ok(setup) => setup,
            Err(error) => {
                let _ = fs::remove_dir_all(&dir);
                return Err(error);
            }
        };
        // From here on, `Drop` stops whatever processes were started and removes the directory
        // if something fails.
        let mut plane = ControlPlane {
            admin_kubeconfig: dir.join("admin.kubeconfig"),
            dir,
            url: setup.url.clone(),
            ca_pem: setup.ca_pem.clone(),
            config: setup.config.clone(),
            processes: Vec::new(),
            pgid: None,
            watchdog: None,
            stopped: false,
        };
        plane.launch(assets, &setup)?;
        plane.wait_ready(setup.config, started + READY_TIMEOUT)?;
        Ok(plane)
    }

    /// Spawns the four components (and the watchdog, right after the first).
    fn launch(&mut self, assets: &Path, setup: &Setup) -> Result<(), ControlPlaneError> {
        let dir = self.dir.clone();
        let path = |name: &str| dir.join(name).display().to_string();
        let etcd_url = format!("http://127.0.0.1:{}", setup.etcd_port);
        self.spawn(
            assets,
            "etcd",
            vec![
                "--data-dir".into(),
                path("etcd"),
                "--listen-client-urls".into(),
                etcd_url.clone(),
                "--advertise-client-urls".into(),
                etcd_url.clone(),
                "--listen-peer-urls".into(),
                format!("http://127.0.0.1:{}", setup.etcd_peer_port),
                "--unsafe-no-fsync".into(),
                "--log-level".into(),
                "warn".into(),
            ],
        )?;
        self.spawn_watchdog()?;

        let kubeconfig_flags = |name: &str| {
            let kubeconfig = path(name);
            vec![
                format!("--kubeconfig={kubeconfig}"),
                format!("--authentication-kubeconfig={kubeconfig}"),
                format!("--authorization-kubeconfig={kubeconfig}"),
                // Else it may exit if it starts before the API server's RBAC is ready.
                "--authentication-skip-lookup=true".into(),
                format!("--client-ca-file={}", path("ca.crt")),
                "--bind-address=127.0.0.1".into(),
                "--leader-elect=false".into(),
                // The default client rate limits add ~5 s to start-up.
                "--kube-api-qps=500".into(),
                "--kube-api-burst=1000".into(),
            ]
        };
        self.spawn(
            assets,
            "kube-apiserver",
            vec![
                format!("--etcd-servers={etcd_url}"),
                format!("--secure-port={}", setup.api_port),
                "--bind-address=127.0.0.1".into(),
                "--advertise-address=127.0.0.1".into(),
                "--service-cluster-ip-range=10.96.0.0/16".into(),
                // 127.0.0.1 is no valid Endpoints address.
                "--endpoint-reconciler-type=none".into(),
                "--authorization-mode=Node,RBAC".into(),
                format!("--client-ca-file={}", path("ca.crt")),
                format!("--tls-cert-file={}", path("apiserver.crt")),
                format!("--tls-private-key-file={}", path("apiserver.key")),
                format!("--service-account-issuer={SERVICE_ACCOUNT_ISSUER}"),
                format!("--service-account-key-file={}", path("sa.pub")),
                format!("--service-account-signing-key-file={}", path("sa.key")),
                format!("--api-audiences={SERVICE_ACCOUNT_ISSUER}"),
                "--enable-admission-plugins=ResourceQuota,ValidatingAdmissionPolicy".into(),
                // Hand-made Nodes would get a not-ready taint that no kubelet ever lifts.
                "--disable-admission-plugins=TaintNodesByCondition".into(),
                "--profiling=false".into(),
            ],
        )?;
        let mut kcm = kubeconfig_flags("kcm.kubeconfig");
        kcm.extend([
            format!("--secure-port={}", setup.controller_manager_port),
            "--use-service-account-credentials=true".into(),
            format!("--service-account-private-key-file={}", path("sa.key")),
            format!("--root-ca-file={}", path("ca.crt")),
            // No kubelet posts Node status: keep hand-made Nodes Ready.
            "--controllers=*,-node-lifecycle-controller".into(),
        ]);
        self.spawn(assets, "kube-controller-manager", kcm)?;
        let mut scheduler = kubeconfig_flags("scheduler.kubeconfig");
        scheduler.push(format!("--secure-port={}", setup.scheduler_port));
        self.spawn(assets, "kube-scheduler", scheduler)
    }

    /// Spawns one component into the control plane's process group, with its output in
    /// `DIR/COMPONENT.log`.
    fn spawn(
        &mut self,
        assets: &Path,
        component: &'static str,
        args: Vec<String>,
    ) -> Result<(), ControlPlaneError> {
        let log = self.dir.join(format!("{component}.log"));
        let spawn_error = |source| ControlPlaneError::Spawn {
            component: component.to_owned(),
            source,
        };
        let stdout = File::create(&log).map_err(|source| ControlPlaneError::Write {
            path: log.clone(),
            source,
        })?;
        let stderr = stdout.try_clone().map_err(spawn_error)?;
        let mut command = Command::new(assets.join(component));
        command
            .args(args)
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr)
            // One group for all four, so that the watchdog and `stop` reach them all (and the
            // `kube` processes behind the wrapper scripts) with one signal.
            .process_group(self.pgid.map_or(0, |pgid| pgid as i32));
        let child = match command.spawn() {
            Ok(child) => child,
            // Joining the process group fails if its first member already exited: report that.
            Err(error) => return Err(self.exited_component().unwrap_or(spawn_error(error))),
        };
        if self.pgid.is_none() {
            self.pgid = Some(child.id());
        }
        self.processes.push(Process {
            component,
            child,
            log,
        });
        Ok(())
    }

    /// Starts the watchdog (see [`WATCHDOG`]) for the process group just created.
    fn spawn_watchdog(&mut self) -> Result<(), ControlPlaneError> {
        let Some(pgid) = self.pgid else {
            return Ok(());
        };
        let child = Command::new("sh")
            .arg("-c")
            .arg(WATCHDOG)
            .arg("sh")
            .arg(std::process::id().to_string())
            .arg(pgid.to_string())
            .arg(&self.dir)
            .stdin(Stdio::null())
            // No inherited stdout/stderr: a harness reading our output would otherwise wait for
            // the watchdog to close it.
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .map_err(|source| ControlPlaneError::Spawn {
                component: "watchdog".to_owned(),
                source,
            })?;
        self.watchdog = Some(child);
        Ok(())
    }

    /// Polls readiness on a helper thread while checking here that every component still runs.
    fn wait_ready(
        &mut self,
        config: kube::Config,
        deadline: Instant,
    ) -> Result<(), ControlPlaneError> {
        let cancel = Arc::new(AtomicBool::new(false));
        let checker = {
            let cancel = Arc::clone(&cancel);
            std::thread::Builder::new()
                .name("teamgpu-e2e-readiness".into())
                .spawn(move || poll_ready(config, deadline, &cancel))
                .map_err(|error| ControlPlaneError::Readiness(error.to_string()))?
        };
        loop {
            if let Some(error) = self.exited_component() {
                cancel.store(true, Ordering::Relaxed);
                let _ = checker.join();
                return Err(error);
            }
            if checker.is_finished() {
                let outcome = checker
                    .join()
                    .map_err(|_| ControlPlaneError::Readiness("the check panicked".into()))?;
                return match outcome {
                    Ok(()) => Ok(()),
                    Err(NotReady::Setup(message)) => Err(ControlPlaneError::Readiness(message)),
                    Err(NotReady::Timeout { component, reason }) => {
                        let log = self.log_path(component);
                        Err(ControlPlaneError::NotReady {
                            timeout: READY_TIMEOUT,
                            reason,
                            tail: log_tail(&log, LOG_TAIL_LINES),
                            log,
                        })
                    }
                };
            }
            std::thread::sleep(POLL_INTERVAL);
        }
    }

    /// The first component found to have exited, as an error with its log tail.
    fn exited_component(&mut self) -> Option<ControlPlaneError> {
        self.processes.iter_mut().find_map(|process| {
            let status = match process.child.try_wait() {
                Ok(None) => return None,
                Ok(Some(status)) => status.to_string(),
                Err(error) => format!("unknown status: {error}"),
            };
            Some(ControlPlaneError::Exited {
                component: process.component,
                status,
                log: process.log.clone(),
                tail: log_tail(&process.log, LOG_TAIL_LINES),
            })
        })
    }

    /// A kubeconfig file for the admin user (`CN=teamgpu-e2e-admin, O=system:masters`), with the
    /// certificates embedded, e.g. for `kubectl --kubeconfig`.
    pub fn admin_kubeconfig(&self) -> &Path {
        &self.admin_kubeconfig
    }

    /// The API server's URL, `https://127.0.0.1:PORT`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The cluster CA certificate (PEM), which signed the serving and client certificates.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// The working directory: certificates, kubeconfigs, etcd data and the components' logs
    /// (`etcd.log`, `kube-apiserver.log`, ...).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The log file of a component (one of [`COMPONENTS`]).
    pub fn log_path(&self, component: &str) -> PathBuf {
        self.dir.join(format!("{component}.log"))
    }

    /// The admin client configuration, loaded from [`ControlPlane::admin_kubeconfig`].
    ///
    /// A `kube::Client` is bound to the tokio runtime it was made in, so make a fresh one from
    /// this per runtime (each `#[tokio::test]` has its own).
    pub fn admin_config(&self) -> kube::Config {
        self.config.clone()
    }

    /// Stops the control plane: `SIGTERM` to the process group, `SIGKILL` after 3 s, then
    /// removes the working directory. Idempotent; also done on drop.
    pub fn stop(&mut self) {
        if self.stopped {
            return;
        }
        self.stopped = true;
        // The watchdog first, so that it does not act on a process group that may be gone.
        if let Some(mut watchdog) = self.watchdog.take() {
            signal_group(watchdog.id(), "KILL");
            let _ = watchdog.wait();
        }
        if let Some(pgid) = self.pgid.take() {
            signal_group(pgid, "TERM");
            let deadline = Instant::now() + STOP_GRACE;
            while Instant::now() < deadline
                && self
                    .processes
                    .iter_mut()
                    .any(|process| matches!(process.child.try_wait(), Ok(None)))
            {
                std::thread::sleep(Duration::from_millis(50));
            }
            // While a child is unreaped the group id cannot be reused, so this reaches no
            // stranger.
            signal_group(pgid, "KILL");
        }
        for process in &mut self.processes {
            let _ = process.child.kill();
            let _ = process.child.wait();
        }
        self.processes.clear();
        let _ = fs::remove_dir_all(&self.dir);
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Why [`poll_ready`] gave up.
enum NotReady {
    /// No runtime or client could be made.
    Setup(String),
    /// The deadline passed; `component` is the one most likely at fault.
    Timeout {
        component: &'static str,
        reason: String,
    },
}

/// Polls, on its own tokio runtime, until `/readyz` answers 200 and the `default`
/// ServiceAccount exists (made by the controller-manager, so this proves it works too).
fn poll_ready(
    config: kube::Config,
    deadline: Instant,
    cancel: &AtomicBool,
) -> Result<(), NotReady> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|error| NotReady::Setup(format!("no tokio runtime: {error}")))?;
    runtime.block_on(async {
        let client = Client::try_from(config)
            .map_err(|error| NotReady::Setup(format!("no admin client: {error}")))?;
        let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), "default");
        let attempt_timeout = Duration::from_secs(2);
        let mut api_ready = false;
        let mut last_error = String::from("no answer yet");
        while Instant::now() < deadline && !cancel.load(Ordering::Relaxed) {
            if !api_ready {
                let request = http::Request::get("/readyz").body(Vec::new());
                match request {
                    Ok(request) => {
                        match tokio::time::timeout(attempt_timeout, client.request_text(request))
                            .await
                        {
                            Ok(Ok(_)) => api_ready = true,
                            Ok(Err(error)) => last_error = format!("/readyz: {error}"),
                            Err(_) => last_error = "/readyz: no answer within 2 s".into(),
                        }
                    }
                    Err(error) => return Err(NotReady::Setup(error.to_string())),
                }
            }
            if api_ready {
                match tokio::time::timeout(attempt_timeout, accounts.get_opt("default")).await {
                    Ok(Ok(Some(_))) => return Ok(()),
                    Ok(Ok(None)) => {
                        last_error = "the default ServiceAccount does not exist yet".into()
                    }
                    Ok(Err(error)) => last_error = format!("reading ServiceAccounts: {error}"),
                    Err(_) => last_error = "reading ServiceAccounts: no answer within 2 s".into(),
                }
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        }
        let (component, missing) = if api_ready {
            ("kube-controller-manager", "the default ServiceAccount")
        } else {
            ("kube-apiserver", "/readyz")
        };
        Err(NotReady::Timeout {
            component,
            reason: format!("waiting for {missing}: {last_error}"),
        })
    })
}

/// What is decided and written before any process starts: ports, certificates, kubeconfigs.
struct Setup {
    etcd_port: u16,
    etcd_peer_port: u16,
    api_port: u16,
    controller_manager_port: u16,
    scheduler_port: u16,
    url: String,
    ca_pem: String,
    config: kube::Config,
}

impl Setup {
    /// Picks the ports, makes the certificates and writes them and the kubeconfigs to `dir`.
    fn prepare(dir: &Path) -> Result<Setup, ControlPlaneError> {
        let [
            etcd_port,
            etcd_peer_port,
            api_port,
            controller_manager_port,
            scheduler_port,
        ] = free_ports::<5>().map_err(ControlPlaneError::Port)?;
        let url = format!("https://127.0.0.1:{api_port}");
        let pki = Pki::generate()?;
        let files = [
            ("ca.crt", pki.ca_cert.clone()),
            ("ca.key", pki.ca_key.clone()),
            ("apiserver.crt", pki.apiserver_cert.clone()),
            ("apiserver.key", pki.apiserver_key.clone()),
            ("sa.key", pki.sa_key.clone()),
            ("sa.pub", pki.sa_pub.clone()),
            (
                "admin.kubeconfig",
                kubeconfig(&url, &pki.ca_cert, &pki.admin),
            ),
            (
                "kcm.kubeconfig",
                kubeconfig(&url, &pki.ca_cert, &pki.controller_manager),
            ),
            (
                "scheduler.kubeconfig",
                kubeconfig(&url, &pki.ca_cert, &pki.scheduler),
            ),
        ];
        for (name, contents) in &files {
            write_file(&dir.join(name), contents)?;
        }
        let kubeconfig = Kubeconfig::read_from(dir.join("admin.kubeconfig"))?;
        // Loading a kubeconfig is async only in signature (it would run exec plugins, which a
        // certificate user has not), so a trivial executor does, with no tokio runtime needed.
        let mut config = futures::executor::block_on(kube::Config::from_custom_kubeconfig(
            kubeconfig,
            &KubeConfigOptions::default(),
        ))?;
        // A proxy from the environment (HTTPS_PROXY) must not apply to a local test cluster.
        config.proxy_url = None;
        Ok(Setup {
            etcd_port,
            etcd_peer_port,
            api_port,
            controller_manager_port,
            scheduler_port,
            url,
            ca_pem: pki.ca_cert,
            config,
        })
    }
}

/// The certificates and keys of a control plane, all PEM.
struct Pki {
    ca_cert: String,
    ca_key: String,
    apiserver_cert: String,
    apiserver_key: String,
    sa_key: String,
    sa_pub: String,
    admin: ClientCert,
    controller_manager: ClientCert,
    scheduler: ClientCert,
}

/// A client certificate and its key, PEM, and the user name for the kubeconfig.
struct ClientCert {
    user: &'static str,
    cert: String,
    key: String,
}

impl Pki {
    /// Makes a fresh CA and everything signed by it (ECDSA P-256, which every component accepts
    /// and ring generates quickly).
    fn generate() -> Result<Pki, rcgen::Error> {
        let ca_key = KeyPair::generate()?;
        let mut ca_params = CertificateParams::default();
        ca_params.distinguished_name = distinguished_name("teamgpu-e2e-ca", None);
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca_cert = ca_params.self_signed(&ca_key)?.pem();
        let ca_key_pem = ca_key.serialize_pem();
        let issuer = Issuer::new(ca_params, ca_key);

        let apiserver_key = KeyPair::generate()?;
        let mut apiserver = CertificateParams::new(vec!["127.0.0.1".into(), "localhost".into()])?;
        apiserver.distinguished_name = distinguished_name("kube-apiserver", None);
        apiserver.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        apiserver.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let apiserver_cert = apiserver.signed_by(&apiserver_key, &issuer)?.pem();

        let sa = KeyPair::generate()?;
        let client = |user: &'static str, organization: Option<&str>| {
            let key = KeyPair::generate()?;
            let mut params = CertificateParams::default();
            params.distinguished_name = distinguished_name(user, organization);
            params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
            params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
            Ok::<_, rcgen::Error>(ClientCert {
                user,
                cert: params.signed_by(&key, &issuer)?.pem(),
                key: key.serialize_pem(),
            })
        };
        Ok(Pki {
            ca_cert,
            ca_key: ca_key_pem,
            apiserver_cert,
            apiserver_key: apiserver_key.serialize_pem(),
            sa_key: sa.serialize_pem(),
            // PKIX "PUBLIC KEY", as --service-account-key-file expects.
            sa_pub: sa.public_key_pem(),
            admin: client(ADMIN_USER, Some("system:masters"))?,
            controller_manager: client("system:kube-controller-manager", None)?,
            scheduler: client("system:kube-scheduler", None)?,
        })
    }
}

fn distinguished_name(common_name: &str, organization: Option<&str>) -> DistinguishedName {
    let mut name = DistinguishedName::new();
    if let Some(organization) = organization {
        name.push(DnType::OrganizationName, organization);
    }
    name.push(DnType::CommonName, common_name);
    name
}

/// A kubeconfig with the CA and the client certificate embedded (`*-data`, base64), so that it
/// is usable from anywhere.
fn kubeconfig(url: &str, ca_pem: &str, client: &ClientCert) -> String {
    format!(
        "apiVersion: v1
kind: Config
clusters:
- name: teamgpu-e2e
  cluster:
    server: {url}
    certificate-authority-data: {ca}
users:
- name: {user}
  user:
    client-certificate-data: {cert}
    client-key-data: {key}
contexts:
- name: teamgpu-e2e
  context:
    cluster: teamgpu-e2e
    user: {user}
current-context: teamgpu-e2e
",
        ca = base64(ca_pem.as_bytes()),
        user = client.user,
        cert = base64(client.cert.as_bytes()),
        key = base64(client.key.as_bytes()),
    )
}

/// Standard base64 with padding: a few lines instead of a dependency.
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[(n >> (18 - 6 * i)) as usize & 63]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

fn write_file(path: &Path, contents: &str) -> Result<(), ControlPlaneError> {
    fs::write(path, contents).map_err(|source| ControlPlaneError::Write {
        path: path.to_path_buf(),
        source,
    })
}

/// A fresh directory name under the system temp dir: pid and time make it unique without a
/// crate, and the `teamgpu-e2e-cp-` prefix makes leftovers (and their processes, whose command
/// lines name it) easy to find.
fn unique_temp_dir() -> PathBuf {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_nanos());
    std::env::temp_dir().join(format!("teamgpu-e2e-cp-{}-{nanos}", std::process::id()))
}

/// `N` distinct free local ports: all bound at once (so none is handed out twice), then released
/// for the components to bind. Another process could take one in between; that shows up as a
/// component exiting with "address already in use".
fn free_ports<const N: usize>() -> io::Result<[u16; N]> {
    let mut listeners = Vec::with_capacity(N);
    let mut ports = [0; N];
    for port in &mut ports {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        *port = listener.local_addr()?.port();
        listeners.push(listener);
    }
    Ok(ports)
}

/// Sends `signal` to process group `pgid` through `sh`'s `kill` (no `unsafe`, so no libc).
fn signal_group(pgid: u32, signal: &str) {
    let _ = Command::new("sh")
        .arg("-c")
        .arg(r#"kill -s "$1" -- "-$2" 2>/dev/null"#)
        .arg("sh")
        .arg(signal)
        .arg(pgid.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

/// The last `lines` lines of a log file (reading at most its last 64 KiB).
fn log_tail(path: &Path, lines: usize) -> String {
    const MAX: u64 = 64 * 1024;
    let read = || -> io::Result<String> {
        let mut file = File::open(path)?;
        let len = file.metadata()?.len();
        file.seek(SeekFrom::Start(len.saturating_sub(MAX)))?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)?;
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    };
    match read() {
        Ok(text) => {
            let all: Vec<&str> = text.lines().collect();
            let mut tail = String::new();
            for line in &all[all.len().saturating_sub(lines)..] {
                let _ = writeln!(tail, "  {line}");
            }
            tail
        }
        Err(error) => format!("  (could not read the log: {error})"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_rfc_4648_vectors() {
        for (input, expected) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64(input.as_bytes()), expected);
        }
    }

    #[test]
    fn free_ports_are_distinct() {
        let ports = free_ports::<5>().expect("free ports");
        let mut sorted = ports.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), 5);
    }
}
