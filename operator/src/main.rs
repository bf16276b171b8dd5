use std::io::Write;

use anyhow::Context;
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

// A pass makes and frees many small objects (statuses, desired objects, their keys); with
// glibc's malloc the freeing and consolidating took as long as the pass's own work.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// teamgpu: fair multi-team GPU sharing on Kubernetes DRA.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Show what teamgpu would do: with no cluster, from YAML files (a table per team and sharing
    /// policy, or every object it would apply with `-o yaml|json`); without `-f`, a built-in
    /// example (the config/samples policies on six 8-GPU nodes). With `--live`, the what-if of a
    /// change on the cluster of the kubeconfig: the objects the operator would write and each
    /// team's numbers before and after.
    Plan {
        /// YAML or JSON files or folders (`-` is standard input): GpuSharingPolicies,
        /// TeamGpuPolicies, Namespaces, DeviceClasses, ResourceSlices, ResourceClaims (other
        /// kinds are skipped with a note). teamgpu's policies are checked as the API server
        /// checks them; any invalid object fails the command (exit 1). With `--live`, they
        /// replace the live objects of the same name.
        #[arg(short = 'f', long = "filename")]
        files: Vec<std::path::PathBuf>,
        /// Fail (exit 1) when the plan has warnings: an unknown sharing policy, a namespace
        /// claimed twice, overcommitted guarantees, a hardware selector that matches no device or
        /// does not compile. For CI.
        #[arg(long)]
        fail_on_warnings: bool,
        /// The most YAML nodes one file may have (a List of 5,000 8-GPU ResourceSlices has
        /// about 2.3 million).
        #[arg(long, env = teamgpu::cli::input::MAX_YAML_NODES_ENV,
              default_value_t = teamgpu::cli::input::Limits::DEFAULT_MAX_YAML_NODES)]
        max_yaml_nodes: usize,
        /// Output format.
        #[arg(short = 'o', long, value_enum, default_value_t = Format::Table)]
        output: Format,
        /// Read the cluster of the current kubeconfig context and plan the change against it.
        #[arg(long)]
        live: bool,
        /// With `--live`: the user the operator writes as (exempt from its own admission
        /// policies), as `teamgpu run` finds it. Default: the ServiceAccount of config/rbac.
        #[arg(long, requires = "live")]
        operator_user: Option<String>,
        /// With `--live`: the operator's `--admin-group`s (repeat, or comma-separated).
        #[arg(long = "admin-group", requires = "live", value_delimiter = ',')]
        admin_groups: Vec<String>,
    },
    /// Show each team's devices now, as the operator reports them in the policies' status, on the
    /// cluster of the current kubeconfig context.
    Top {
        /// Output format.
        #[arg(short = 'o', long, value_enum, default_value_t = Format::Table)]
        output: Format,
        /// Only this team (also for a member who may read only their own team).
        #[arg(long)]
        team: Option<String>,
        /// Where a member who may not list the teams is looked up: the team of this namespace's
        /// teamgpu ResourceQuota (default: the kubeconfig context's namespace).
        #[arg(short = 'n', long)]
        namespace: Option<String>,
    },
    /// Say why a Pod waits for GPUs (quota, entitlement, capacity), who borrows, when reclaim
    /// acts and its place in the team's queue, on the cluster of the current kubeconfig context.
    Why {
        /// The Pod: pod/NAME (also pods/NAME, po/NAME or NAME).
        pod: String,
        /// The Pod's namespace (default: the kubeconfig context's, then `default`).
        #[arg(short = 'n', long)]
        namespace: Option<String>,
        /// Output format.
        #[arg(short = 'o', long, value_enum, default_value_t = Format::Table)]
        output: Format,
    },
    /// Run the operator against the cluster of the current kubeconfig (or in-cluster config).
    Run(RunArgs),
    /// Print every CustomResourceDefinition as multi-document YAML.
    Crd {
        /// Write one file per CRD and a kustomization.yaml into this folder instead (e.g. `crds`).
        #[arg(long)]
        output_dir: Option<std::path::PathBuf>,
        /// Print the API reference of the CRDs as Markdown instead (`docs/api.md`).
        #[arg(long, conflicts_with = "output_dir")]
        reference: bool,
    },
    /// Print the whole install as one YAML stream (CRDs, RBAC, namespace, Deployment): the
    /// objects of `kubectl kustomize config/default`. Apply it with
    /// `teamgpu manifests | kubectl apply --server-side -f -`.
    #[command(visible_alias = "install")]
    Manifests {
        /// The operator's image.
        #[arg(long, default_value_t = teamgpu::cli::manifests::default_image())]
        image: String,
    },
    /// Print a shell completion script (e.g. `source <(teamgpu completion bash)`); as the kubectl
    /// plugin, one that completes `kubectl teamgpu ...` (source it after kubectl's own).
    Completion {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

/// Flags of `teamgpu run`; each can also be set by its environment variable.
#[derive(clap::Args, Debug)]
struct RunArgs {
    /// Elect a leader on a Lease so that only one replica writes.
    #[arg(long, env = "TEAMGPU_LEADER_ELECT")]
    leader_elect: bool,
    /// Namespace of the leader Lease (defaults to the Pod's namespace).
    #[arg(long, env = "POD_NAMESPACE", default_value = "teamgpu-system")]
    lease_namespace: String,
    #[arg(long, env = "TEAMGPU_LEASE_NAME", default_value = "teamgpu-leader")]
    lease_name: String,
    /// This replica's name in the Lease (defaults to the Pod name, then the host name).
    #[arg(long, env = "POD_NAME")]
    identity: Option<String>,
    /// Address of /metrics (which also answers /healthz and /readyz).
    #[arg(long, env = "TEAMGPU_METRICS_ADDR", default_value = "0.0.0.0:8080")]
    metrics_addr: std::net::SocketAddr,
    /// Address of the probes /healthz and /readyz.
    #[arg(long, env = "TEAMGPU_HEALTH_ADDR", default_value = "0.0.0.0:8081")]
    health_addr: std::net::SocketAddr,
    /// /healthz fails (503, with the reason) once work has waited this many seconds without a
    /// reconcile pass finishing; 0 never fails it.
    #[arg(long, env = "TEAMGPU_HEALTHZ_STALL_SECONDS", default_value_t = teamgpu::controller::DEFAULT_HEALTHZ_STALL.as_secs())]
    healthz_stall_seconds: u64,
    /// Reclaim borrowed devices by eviction for teams that do not say otherwise.
    #[arg(long, env = "TEAMGPU_RECLAIM")]
    reclaim: bool,
    /// Seconds a team waits below its guarantee before borrowers are evicted.
    #[arg(long, env = "TEAMGPU_RECLAIM_GRACE_SECONDS", default_value_t = 120)]
    reclaim_grace_seconds: u64,
    /// Seconds a borrower's workload runs before reclaim may evict it (a team's
    /// `spec.reclaim.minRuntimeSeconds` overrides it).
    #[arg(long, env = "TEAMGPU_RECLAIM_MIN_RUNTIME_SECONDS", default_value_t = 0)]
    reclaim_min_runtime_seconds: u64,
    /// Seconds between resyncs: the owned objects listed again and every object compared, so
    /// that what a watch missed is repaired (they write nothing when nothing differs).
    #[arg(long, env = "TEAMGPU_RESYNC_SECONDS", default_value_t = 3600)]
    resync_seconds: u64,
    /// Object writes one batch carries at most: a long converge goes out in batches, and what
    /// changes meanwhile is written between them.
    #[arg(long, env = "TEAMGPU_WRITES_PER_BATCH", default_value_t = teamgpu::core::engine::WRITES_PER_BATCH)]
    writes_per_batch: usize,
    /// A group that may move any namespace into or out of any team and exempt namespaces from
    /// teamgpu (repeat, or comma-separated). Default: system:masters, kubeadm:cluster-admins.
    #[arg(
        long = "admin-group",
        env = "TEAMGPU_ADMIN_GROUPS",
        value_delimiter = ','
    )]
    admin_groups: Vec<String>,
    /// What the admission policies do with a request they would refuse: Deny, or Warn (admit,
    /// warn the client, annotate the audit log) or Audit (annotate only) to see it first.
    #[arg(long, env = "TEAMGPU_ENFORCEMENT", default_value = "Deny")]
    enforcement: teamgpu::core::plan::admission::Enforcement,
    /// Log format.
    #[arg(long, env = "TEAMGPU_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug)]
enum LogFormat {
    Text,
    Json,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug)]
enum Format {
    Table,
    Yaml,
    Json,
}

/// Errors go to standard error as their chain of causes, never with a backtrace (a user's
/// `RUST_BACKTRACE` is for panics), and exit 1.
fn main() -> std::process::ExitCode {
    match run_command() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("Error: {error}");
            for cause in error.chain().skip(1) {
                eprintln!("  caused by: {cause}");
            }
            std::process::ExitCode::FAILURE
        }
    }
}

fn run_command() -> anyhow::Result<()> {
    let name = teamgpu::cli::plugin::program_name(std::env::args_os().next().as_deref());
    let mut command = Cli::command().bin_name(name);
    let cli = Cli::from_arg_matches_mut(&mut command.get_matches_mut())
        .unwrap_or_else(|e| e.format(&mut command).exit());
    match cli.command {
        Command::Run(args) => run(args)?,
        Command::Plan {
            files,
            output,
            live: false,
            fail_on_warnings,
            max_yaml_nodes,
            ..
        } => plan(&files, output, fail_on_warnings, max_yaml_nodes)?,
        Command::Plan {
            files,
            output,
            live: true,
            operator_user,
            admin_groups,
            max_yaml_nodes,
            ..
        } => {
            let admin_groups = (!admin_groups.is_empty()).then_some(admin_groups);
            block_on(plan_live(
                &files,
                output,
                operator_user,
                admin_groups,
                max_yaml_nodes,
            ))?
        }
        Command::Top {
            output,
            team,
            namespace,
        } => block_on(top(output, team, namespace))?,
        Command::Why {
            pod,
            namespace,
            output,
        } => block_on(why(&pod, namespace, output))?,
        Command::Manifests { image } => {
            let yaml = teamgpu::cli::manifests::to_yaml(&image)?;
            std::io::stdout().write_all(yaml.as_bytes())?;
        }
        Command::Completion { shell } => {
            // A fresh command: the parsed one carries bin names ("kubectl teamgpu plan") that
            // the generators cannot look subcommands up by.
            let script = teamgpu::cli::plugin::completion_script(shell, &Cli::command(), name);
            std::io::stdout().write_all(&script)?;
        }
        Command::Crd {
            reference: true, ..
        } => {
            let markdown = teamgpu::cli::crd::reference_markdown()?;
            std::io::stdout().write_all(markdown.as_bytes())?;
        }
        Command::Crd {
            output_dir: None, ..
        } => {
            let yaml = teamgpu::cli::crd::to_yaml().context("serializing the CRDs")?;
            std::io::stdout().write_all(yaml.as_bytes())?;
        }
        Command::Crd {
            output_dir: Some(dir),
            ..
        } => {
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            for (name, content) in teamgpu::cli::crd::files().context("serializing the CRDs")? {
                let path = dir.join(name);
                std::fs::write(&path, content)
                    .with_context(|| format!("writing {}", path.display()))?;
            }
        }
    }
    Ok(())
}

fn plan(
    files: &[std::path::PathBuf],
    format: Format,
    fail_on_warnings: bool,
    max_yaml_nodes: usize,
) -> anyhow::Result<()> {
    let (state, invalid) = if files.is_empty() {
        let state = teamgpu::cli::example::state().context("loading the built-in example")?;
        (state, None)
    } else {
        let (state, invalid) = read_files(files, max_yaml_nodes);
        (state, invalid.err())
    };
    let plan = teamgpu::core::plan::plan(&state);
    let warnings = teamgpu::cli::validate::findings::warnings(&plan);
    let text = match format {
        Format::Table => teamgpu::cli::output::table(&plan),
        // An invalid input prints no objects: a pipe into `kubectl apply` applies nothing.
        _ if invalid.is_some() => String::new(),
        Format::Yaml => teamgpu::cli::output::yaml(&plan).context("serializing the plan")?,
        Format::Json => teamgpu::cli::output::json(&plan).context("serializing the plan")?,
    };
    std::io::stdout().write_all(text.as_bytes())?;
    if let Some(invalid) = invalid {
        return Err(invalid);
    }
    if fail_on_warnings && !warnings.is_empty() {
        for w in &warnings {
            eprintln!("warning: {w}");
        }
        anyhow::bail!(
            "{} warnings, and --fail-on-warnings was given",
            warnings.len()
        );
    }
    Ok(())
}

/// The state of the files' valid objects; every error goes to standard error, and the
/// result is an error when there was one.
fn read_files(
    files: &[std::path::PathBuf],
    max_yaml_nodes: usize,
) -> (teamgpu::core::state::ClusterState, anyhow::Result<()>) {
    let limits = teamgpu::cli::input::Limits { max_yaml_nodes };
    let loaded = teamgpu::cli::input::load(files, &limits);
    for note in &loaded.notes {
        eprintln!("note: {note}");
    }
    for error in &loaded.errors {
        for line in error.to_string().lines() {
            eprintln!("error: {line}");
        }
    }
    let invalid = match loaded.errors.len() {
        0 => Ok(()),
        1 => Err(anyhow::anyhow!(
            "1 input is invalid (listed above) and was left out of the plan"
        )),
        n => Err(anyhow::anyhow!(
            "{n} inputs are invalid (listed above) and were left out of the plan"
        )),
    };
    (loaded.state, invalid)
}

/// A runtime for one command that reads the cluster.
fn block_on<T>(work: impl std::future::Future<Output = anyhow::Result<T>>) -> anyhow::Result<T> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(work)
}

async fn client() -> anyhow::Result<kube::Client> {
    kube::Client::try_default()
        .await
        .context("connecting to the cluster of the current kubeconfig context")
}

/// `value` in `format` (not a table).
fn serialized(value: &impl serde::Serialize, format: Format) -> anyhow::Result<String> {
    Ok(match format {
        Format::Yaml => serde_saphyr::to_string(value)?,
        _ => serde_json::to_string_pretty(value)? + "\n",
    })
}

async fn plan_live(
    files: &[std::path::PathBuf],
    format: Format,
    operator_user: Option<String>,
    admin_groups: Option<Vec<String>>,
    max_yaml_nodes: usize,
) -> anyhow::Result<()> {
    // The files first: a typo fails before the cluster is asked.
    let (changes, invalid) = read_files(files, max_yaml_nodes);
    invalid?;
    let live = teamgpu::cli::cluster::read(&client().await?, operator_user, admin_groups).await?;
    for note in &live.notes {
        eprintln!("note: {note}");
    }
    let before = teamgpu::core::plan::plan(&live.state);
    let after = teamgpu::core::plan::plan(&teamgpu::cli::whatif::overlay(&live.state, changes));
    let what_if = teamgpu::cli::whatif::what_if(&before, &after, &live.managed);
    let text = match format {
        Format::Table => teamgpu::cli::whatif::table(&what_if),
        _ => serialized(&what_if, format)?,
    };
    std::io::stdout().write_all(text.as_bytes())?;
    Ok(())
}

async fn top(
    format: Format,
    team: Option<String>,
    namespace: Option<String>,
) -> anyhow::Result<()> {
    let client = client().await?;
    let namespace = namespace.unwrap_or_else(|| client.default_namespace().to_owned());
    let policies = teamgpu::cli::top::read(&client, team.as_deref(), &namespace).await?;
    for note in &policies.notes {
        eprintln!("note: {note}");
    }
    let top = teamgpu::cli::top::top(&policies.teams, &policies.sharing_policies);
    let text = match format {
        Format::Table => teamgpu::cli::top::table(&top),
        _ => serialized(&top, format)?,
    };
    std::io::stdout().write_all(text.as_bytes())?;
    Ok(())
}

async fn why(pod: &str, namespace: Option<String>, format: Format) -> anyhow::Result<()> {
    let name = teamgpu::cli::why::pod_name(pod)?;
    let client = client().await?;
    let namespace = namespace.unwrap_or_else(|| client.default_namespace().to_owned());
    let read = teamgpu::cli::cluster::why_facts(&client, &namespace, name).await?;
    for note in &read.notes {
        eprintln!("note: {note}");
    }
    let why = teamgpu::cli::why::diagnose(&read.facts, k8s_openapi::jiff::Timestamp::now());
    let text = match format {
        Format::Table => teamgpu::cli::why::text(&why),
        _ => serialized(&why, format)?,
    };
    std::io::stdout().write_all(text.as_bytes())?;
    Ok(())
}

fn run(args: RunArgs) -> anyhow::Result<()> {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(DEFAULT_LOG_FILTER));
    // Colours only for a person at a terminal: a Pod's log (a pipe) gets plain text.
    use std::io::IsTerminal as _;
    let colour = std::io::stdout().is_terminal()
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(colour);
    match args.log_format {
        LogFormat::Text => logs.init(),
        LogFormat::Json => logs.json().init(),
    }
    let identity = args
        .identity
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| format!("teamgpu-{}", std::process::id()));
    let config = teamgpu::controller::Config {
        leader_elect: args.leader_elect,
        lease_namespace: args.lease_namespace,
        lease_name: args.lease_name,
        identity,
        metrics_addr: args.metrics_addr,
        health_addr: Some(args.health_addr),
        reclaim_default: args.reclaim,
        reclaim_grace: std::time::Duration::from_secs(args.reclaim_grace_seconds),
        reclaim_min_runtime: std::time::Duration::from_secs(args.reclaim_min_runtime_seconds),
        resync: std::time::Duration::from_secs(args.resync_seconds.max(1)),
        writes_per_batch: args.writes_per_batch.max(1),
        admin_groups: (!args.admin_groups.is_empty()).then_some(args.admin_groups),
        enforcement: args.enforcement,
        healthz_stall: std::time::Duration::from_secs(args.healthz_stall_seconds),
        ..teamgpu::controller::Config::default()
    };
    // One thread: the operator waits on the API server far more than it computes (5 s of CPU
    // in a 30 s first converge of 10,000 objects, a pass after a change tens of ms), and with
    // one thread glibc keeps one heap instead of one per worker, each holding its own free
    // memory: 4-5 MiB less resident at 1,000 namespaces.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let result = runtime.block_on(async {
        // Listening from the start, so that a stop request during start-up, or while the API
        // server does not answer, is a graceful stop too.
        let stop = shutdown_signal()?;
        let client = kube::Client::try_default()
            .await
            .context("connecting to the cluster")?;
        let stopping = std::sync::Arc::new(tokio::sync::Notify::new());
        let notified = stopping.clone();
        let operator =
            teamgpu::controller::run(client, config, async move { notified.notified().await });
        tokio::pin!(operator);
        tokio::select! {
            result = &mut operator => return result.map_err(Into::into),
            () = stop => {}
        }
        tracing::info!("stopping");
        stopping.notify_one();
        match tokio::time::timeout(STOP_GRACE, operator).await {
            Ok(result) => result.map_err(Into::into),
            Err(_) => {
                tracing::warn!("not stopped gracefully within {STOP_GRACE:?}; exiting anyway");
                anyhow::Ok(())
            }
        }
    });
    // Tasks still blocked (a DNS lookup, say) must not hold the process.
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    result
}

/// The log filter without `RUST_LOG`. kube-client's request tracing logs every failed request at
/// ERROR, which `kube=warn` lets through: each API error twice, once without context, beside
/// teamgpu's own line that names the step and says whether it retries. `RUST_LOG` (e.g.
/// `info,kube_client=debug`) brings them back.
const DEFAULT_LOG_FILTER: &str = "info,kube=warn,kube_client::client::builder=off";

/// How long a graceful stop (handing the Lease back) may take: the Deployment gives the Pod 10 s
/// after SIGTERM before it kills it.
const STOP_GRACE: std::time::Duration = std::time::Duration::from_secs(7);

/// Resolves on SIGTERM (what Kubernetes sends) or Ctrl-C. The handlers are installed when this is
/// called, not when the future is first polled.
fn shutdown_signal() -> anyhow::Result<impl std::future::Future<Output = ()>> {
    #[cfg(unix)]
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("listening for SIGTERM")?;
    Ok(async move {
        let ctrl_c = tokio::signal::ctrl_c();
        #[cfg(unix)]
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
        #[cfg(not(unix))]
        let _ = ctrl_c.await;
    })
}
