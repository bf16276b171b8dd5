//! Workload replay: the same seeded stream of GPU jobs, shaped like the Philly and Alibaba PAI
//! traces (see `workload.rs`), replayed on a real control plane under three configurations,
//! each on a clean slate: (a) teamgpu with borrowing and reclaim, (b) teamgpu with static
//! quotas (limit = guarantee), (c) no teamgpu at all. Prints a Markdown table per configuration
//! and writes an SVG of every team's allocated GPUs over time:
//!
//! ```sh
//! TEAMGPU_E2E_ASSETS=/path/to/bin cargo run --release -p teamgpu-e2e --example replay -- \
//!     [--seed N] [--svg PATH] [--only abc] [--scoring default|packing]
//! ```
//!
//! The cluster: 16 nodes of 8 GPUs (the NVIDIA DRA driver's slices), six teams with a
//! namespace each per configuration, three non-preempting PriorityClasses. The Jobs are real
//! batch/v1 Jobs run by the real job controller; the node agent "runs" each Pod for its
//! `teamgpu.io/e2e-run-seconds`. The operator runs in-process as its ServiceAccount. The
//! figures come from watches of Pods, claims, quotas and Jobs, not from the operator. It is a
//! benchmark: it prints, it asserts nothing, and exits non-zero only when the cluster could
//! not be set up. About seven minutes.
//!
//! Each Pod requests 8 CPUs per GPU (a node has 64 and 8 GPUs). `--scoring packing` starts
//! kube-scheduler with a profile that packs by cpu (`MostAllocated`), and so by GPUs, instead of
//! its default, which spreads (see [`NodeScoring`]); with `TEAMGPU_E2E_KUBECONFIG` the cluster's
//! own scheduler decides and the option is refused.

mod diagnose;
mod metrics;
mod observe;
mod reference;
mod report;
mod setup;
mod workload;

use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use k8s_openapi::api::batch::v1::Job as BatchJob;
use kube::Client;
use kube::api::{Api, PostParams};
use teamgpu_e2e::TestCluster;
use teamgpu_e2e::control_plane::{self, NodeScoring};
use teamgpu_e2e::node_agent::NodeAgent;
use teamgpu_e2e::operator::Operator;
use teamgpu_e2e::sandbox::Sandbox;

use crate::metrics::{Figures, Setting};
use crate::observe::{Recorder, Seconds};
use crate::setup::{Configuration, Error};
use crate::workload::{ARRIVAL_SECONDS, GRACE_SECONDS, Job, Team};

/// How long after the last arrival unfinished jobs are waited for.
const DRAIN_SECONDS: f64 = 45.0;
/// The operator's time to settle its quotas after the policies appear, before the replay.
const SETTLE: Duration = Duration::from_secs(2);

/// Command-line options.
#[derive(Debug)]
struct Options {
    seed: u64,
    svg: PathBuf,
    /// The configurations to replay, by letter (all by default).
    only: Vec<Configuration>,
    scoring: NodeScoring,
}

impl Options {
    fn parse() -> Result<Options, String> {
        let mut options = Options {
            seed: 22,
            svg: teamgpu_e2e::fixtures::repo_root().join("target/replay.svg"),
            only: Configuration::ALL.to_vec(),
            scoring: NodeScoring::Default,
        };
        let mut args = std::env::args().skip(1);
        while let Some(arg) = args.next() {
            let mut value = || args.next().ok_or(format!("{arg} needs a value"));
            match arg.as_str() {
                "--seed" => options.seed = value()?.parse().map_err(|e| format!("--seed: {e}"))?,
                "--svg" => options.svg = PathBuf::from(value()?),
                "--only" => options.only = configurations(&value()?)?,
                "--scoring" => options.scoring = scoring(&value()?)?,
                other => {
                    return Err(format!(
                        "unknown argument {other}; use [--seed N] [--svg PATH] [--only abc] [--scoring default|packing]"
                    ));
                }
            }
        }
        Ok(options)
    }
}

/// The configurations named by their letters, in the order of [`Configuration::ALL`].
fn configurations(letters: &str) -> Result<Vec<Configuration>, String> {
    if let Some(unknown) = letters.chars().find(|c| !"abc".contains(*c)) {
        return Err(format!(
            "--only: {unknown:?} is none of the configurations a, b, c"
        ));
    }
    Ok((Configuration::ALL.into_iter())
        .filter(|c| letters.contains(c.letter()))
        .collect())
}

/// The kube-scheduler scoring named `name`.
fn scoring(name: &str) -> Result<NodeScoring, String> {
    match name {
        "default" => Ok(NodeScoring::Default),
        "packing" => Ok(NodeScoring::MostAllocatedCpu),
        other => Err(format!(
            "--scoring: {other:?} is neither default nor packing"
        )),
    }
}

/// What every configuration's replay shares.
struct Bench {
    // Dropped first (fields drop in order): the sandbox cleans up while the agent of the
    // extra nodes still finalizes their Pods.
    sandbox: Sandbox,
    _agent: NodeAgent,
    operator: kube::Config,
    teams: Vec<Team>,
    jobs: Vec<Job>,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    let options = match Options::parse() {
        Ok(options) => options,
        Err(message) => {
            eprintln!("replay: {message}");
            return ExitCode::FAILURE;
        }
    };
    if options.scoring != NodeScoring::Default {
        if std::env::var_os(teamgpu_e2e::cluster::REAL_CLUSTER_ENV).is_some() {
            eprintln!(
                "replay: --scoring needs a control plane of the replay's own (TEAMGPU_E2E_ASSETS), not TEAMGPU_E2E_KUBECONFIG's"
            );
            return ExitCode::FAILURE;
        }
        if let Err(message) = control_plane::use_node_scoring(options.scoring) {
            eprintln!("replay: {message}");
            return ExitCode::FAILURE;
        }
    }
    let run = Instant::now();
    let teams = workload::teams();
    let jobs = workload::jobs(options.seed, &teams);
    println!("{}", report::workload_summary(options.seed, &teams, &jobs));
    println!("kube-scheduler scoring: {:?}", options.scoring);
    let bench = match prepare(teams, jobs).await {
        Ok(bench) => bench,
        Err(error) => {
            eprintln!("replay: could not set up the cluster: {error}");
            return ExitCode::FAILURE;
        }
    };
    let mut results = Vec::new();
    for config in options.only {
        println!("replaying ({}) {} ...", config.letter(), config.title());
        let started = Instant::now();
        match replay(&bench, config).await {
            Ok(figures) => results.push((config, figures)),
            Err(error) => eprintln!(
                "replay: configuration ({}) failed: {error}",
                config.letter()
            ),
        }
        println!("  done in {:.0?}", started.elapsed());
    }
    println!("{}", report::markdown(options.seed, &bench.teams, &results));
    write_svg(&options.svg, &report::svg(&bench.teams, &results));
    println!("whole run: {:.0?}", run.elapsed());
    ExitCode::SUCCESS
}

/// The control plane with [`workload::NODES`] nodes and their GPUs, in a sandbox (which
/// cleans up everything when dropped).
async fn prepare(teams: Vec<Team>, jobs: Vec<Job>) -> Result<Bench, Error> {
    let cluster = TestCluster::start().await?;
    let operator = cluster.operator_config().await?;
    let sandbox = Sandbox::start(cluster).await?;
    let agent = setup::cluster(&sandbox).await?;
    Ok(Bench {
        sandbox,
        _agent: agent,
        operator,
        teams,
        jobs,
    })
}

/// One configuration: install, replay the jobs while recording, tear down, compute.
async fn replay(bench: &Bench, config: Configuration) -> Result<Figures, Error> {
    let client = bench.sandbox.client();
    let namespaces = setup::namespaces(&bench.sandbox, config, &bench.teams).await?;
    let operator = config.uses_teamgpu().then(|| start_operator(bench));
    let outcome = async {
        setup::install(&client, config, &bench.teams, &namespaces).await?;
        tokio::time::sleep(SETTLE).await;
        record(bench, &client, config, &namespaces).await
    }
    .await;
    let torn_down = setup::tear_down(&client, &namespaces).await;
    if let Some(operator) = operator {
        operator.stop().await;
    }
    let (timeline, submitted, end) = outcome?;
    torn_down?;
    let setting = Setting {
        teams: &bench.teams,
        limits: config.limits(&bench.teams),
        lending_limits: config.lending_limits(&bench.teams),
        team_of: setup::team_of(&namespaces),
        jobs: &bench.jobs,
        submitted,
        end,
    };
    Ok(metrics::figures(&setting, &timeline))
}

type Recorded = (
    observe::Timeline,
    HashMap<String, (String, Seconds)>,
    Seconds,
);

/// Submits the jobs on their schedule and records until all completed or the drain time ran
/// out; returns the timeline, when each job was submitted, and when recording ended.
async fn record(
    bench: &Bench,
    client: &Client,
    config: Configuration,
    namespaces: &[String],
) -> Result<Recorded, Error> {
    let start = Instant::now();
    let covered: BTreeSet<String> = namespaces.iter().cloned().collect();
    let recorder = Recorder::start(client, config.letter(), covered, &setup::quota_key(), start);
    let submitted = submit(client, config, &bench.jobs, namespaces, start).await;
    while recorder.completed_jobs() < submitted.len()
        && start.elapsed().as_secs_f64() < ARRIVAL_SECONDS + DRAIN_SECONDS
    {
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let end = start.elapsed().as_secs_f64();
    let mut timeline = recorder.finish();
    timeline.reclaimed = reclaim_notes(client, namespaces).await;
    Ok((timeline, submitted, end))
}

/// By Pod (namespace, name), why the operator evicted or removed it: the reason and note of its
/// `Reclaimed`, `Dequeued` or `Moved` Event (read before the namespaces go; a failed list only leaves the
/// notes out). A Pod removed while queued for room can be bound by the time it goes.
async fn reclaim_notes(
    client: &Client,
    namespaces: &[String],
) -> HashMap<(String, String), String> {
    let mut notes = HashMap::new();
    for namespace in namespaces {
        let api: Api<k8s_openapi::api::events::v1::Event> =
            Api::namespaced(client.clone(), namespace);
        let Ok(events) = api.list(&kube::api::ListParams::default()).await else {
            continue;
        };
        for event in events.items {
            let pod = (event.regarding.as_ref())
                .filter(|r| r.kind.as_deref() == Some("Pod"))
                .and_then(|r| r.name.clone());
            if let (Some(name), Some(reason @ ("Reclaimed" | "Dequeued" | "Moved")), Some(note)) =
                (pod, event.reason.as_deref(), event.note.as_deref())
            {
                notes.insert((namespace.clone(), name), format!("{reason}: {note}"));
            } else if let (Some(reason @ ("ReclaimBlocked" | "ReclaimWaiting")), Some(note)) =
                (event.reason.as_deref(), event.note.as_deref())
            {
                // Why reclaim did not cover a team's shortfall, for a reader of one run.
                let times = event.series.as_ref().map_or(1, |s| s.count);
                eprintln!("replay: {namespace}: {reason} ({times} times): {note}");
            }
        }
    }
    notes
}

/// Creates each job's Job at its time (each in a task of its own, so a slow request delays
/// no other); returns job name -> (namespace, when its creation was sent). A job the API
/// refused is reported and left out.
async fn submit(
    client: &Client,
    config: Configuration,
    jobs: &[Job],
    namespaces: &[String],
    start: Instant,
) -> HashMap<String, (String, Seconds)> {
    let mut tasks = tokio::task::JoinSet::new();
    for job in jobs {
        tokio::time::sleep_until((start + Duration::from_secs_f64(job.submit_at)).into()).await;
        let namespace = namespaces[job.team].clone();
        let api: Api<BatchJob> = Api::namespaced(client.clone(), &namespace);
        let object = setup::batch_job(job, config);
        let name = job.name.clone();
        tasks.spawn(async move {
            let at = start.elapsed().as_secs_f64();
            let created = match object {
                Ok(object) => api
                    .create(&PostParams::default(), &object)
                    .await
                    .map_err(Error::from),
                Err(error) => Err(error),
            };
            created
                .map(|_| (name, (namespace, at)))
                .map_err(|e| e.to_string())
        });
    }
    let mut submitted = HashMap::new();
    while let Some(result) = tasks.join_next().await {
        match result {
            Ok(Ok((name, at))) => {
                submitted.insert(name, at);
            }
            Ok(Err(error)) => eprintln!("replay: a Job was refused: {error}"),
            Err(error) => eprintln!("replay: submitting a Job panicked: {error}"),
        }
    }
    submitted
}

/// The operator in-process, as its ServiceAccount; reclaim as each team's policy says, with
/// the replay's grace as the default.
fn start_operator(bench: &Bench) -> Operator {
    let config = teamgpu::controller::Config {
        metrics_addr: ([127, 0, 0, 1], 0).into(),
        reclaim_grace: Duration::from_secs(u64::from(GRACE_SECONDS)),
        ..Default::default()
    };
    let client = Client::try_from(bench.operator.clone()).expect("a client of a valid config");
    Operator::start(client, config)
}

fn write_svg(path: &PathBuf, svg: &str) {
    let written = path
        .parent()
        .map_or(Ok(()), std::fs::create_dir_all)
        .and_then(|()| std::fs::write(path, svg));
    match written {
        Ok(()) => println!("chart: {}", path.display()),
        Err(error) => eprintln!("replay: could not write {}: {error}", path.display()),
    }
}
