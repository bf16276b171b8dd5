//! The replayed workload: the teams, and a seeded, time-compressed stream of GPU jobs drawn from
//! distributions shaped like published production traces. Pure: no client, no clock.
//!
//! Sources (the numbers below are read off their figures approximately; they were not checked
//! against the released trace files, and no exact value is claimed):
//!
//! - Jeon et al., "Analysis of Large-Scale Multi-Tenant GPU Clusters for DNN Training
//!   Workloads", USENIX ATC '19 (Microsoft Philly): the figures of job run time by the number of
//!   GPUs a job uses, in the section on job scheduling. Most jobs use one GPU; multi-GPU jobs
//!   (2-4, 5-8 and more than 8 GPUs) are a minority that grows rarer with size; run times span
//!   minutes to days, heavy-tailed, and larger jobs run longer. [`JOB_SIZES`] and
//!   [`run_seconds`] approximate those shapes.
//! - Weng et al., "MLaaS in the Wild: Workload Analysis and Scheduling in Large-Scale
//!   Heterogeneous GPU Clusters", USENIX NSDI '22 (Alibaba PAI): the CDFs of task run time and of
//!   the GPUs requested per task in the trace characterisation section. Run times are
//!   log-normal-like over several orders of magnitude (hence a log-normal here), and
//!   submissions come in bursts per user group (hence [`Team::burst_jobs`]).
//!
//! Time is compressed: a trace's minutes-to-hours become seconds here, so that three
//! configurations replay in under ten minutes.

/// GPUs of every node (ResourceSlice) of the replay cluster.
pub const GPUS_PER_NODE: u32 = 8;
/// Nodes of the replay cluster.
pub const NODES: u32 = 16;
/// Devices of the cluster.
pub const CAPACITY: u32 = NODES * GPUS_PER_NODE;
/// Jobs arrive during this many (compressed) seconds.
pub const ARRIVAL_SECONDS: f64 = 90.0;
/// How long a team waits below its guarantee before reclaim evicts (compressed).
pub const GRACE_SECONDS: u32 = 4;

/// Job sizes in GPUs and their probabilities, approximating the Philly GPU-count mix (mostly
/// single-GPU jobs, multi-GPU ones rarer with size). Jobs above one node's 8 GPUs are gangs of
/// 8-GPU pods (16 = 2 pods, 32 = 4 pods), as distributed training runs there.
pub const JOB_SIZES: [(u32, f64); 6] = [
    (1, 0.60),
    (2, 0.13),
    (4, 0.12),
    (8, 0.10),
    (16, 0.04),
    (32, 0.01),
];

/// One team of the replay, with its entitlement and the load it brings.
#[derive(Debug, Clone)]
pub struct Team {
    pub name: &'static str,
    pub guaranteed: u32,
    /// The limit when borrowing is on (configuration (a)); (b) uses the guarantee.
    pub limit: u32,
    pub weight: u32,
    pub lending_limit: Option<u32>,
    /// Whether the team takes its guarantee back by eviction (after [`GRACE_SECONDS`]).
    pub reclaim: bool,
    /// The share of the cluster's capacity the team's jobs want on average over the arrival
    /// window; the shares add up to more than 1, so the cluster is contended.
    pub load: f64,
    /// Mean number of jobs of one burst of submissions.
    pub burst_jobs: f64,
    /// The part of the arrival window the team submits in (fractions of it): teams come and
    /// go, so that guarantees lie idle, are lent, and are wanted back.
    pub active: (f64, f64),
    /// The largest job the team submits, in GPUs.
    pub max_gpus: u32,
    /// The PriorityClass of most of its jobs.
    pub priority: Priority,
}

/// The teams: guarantees add up to [`CAPACITY`]; different weights and limits; `serving` lends
/// nothing (`lendingLimit: 0`); reclaim on for some. `research` is busy early and `vision`
/// late, so research borrows vision's idle guarantee and vision wants it back; `speech` stops
/// halfway and lends from then on.
pub fn teams() -> Vec<Team> {
    let team = |name, guaranteed, limit, weight, reclaim, load, burst_jobs, max_gpus| Team {
        name,
        guaranteed,
        limit,
        weight,
        lending_limit: None,
        reclaim,
        load,
        burst_jobs,
        active: (0.0, 1.0),
        max_gpus,
        priority: Priority::Normal,
    };
    vec![
        Team {
            active: (0.35, 1.0),
            ..team("vision", 32, 64, 3, true, 0.30, 6.0, 32)
        },
        team("language", 32, 80, 3, true, 0.28, 3.0, 32),
        Team {
            active: (0.0, 0.55),
            ..team("speech", 24, 48, 2, true, 0.14, 5.0, 16)
        },
        team("recsys", 16, 40, 2, false, 0.14, 5.0, 8),
        Team {
            lending_limit: Some(0),
            priority: Priority::High,
            ..team("serving", 16, 16, 1, true, 0.10, 4.0, 2)
        },
        Team {
            priority: Priority::Low,
            active: (0.0, 0.5),
            ..team("research", 8, 48, 1, false, 0.22, 8.0, 8)
        },
    ]
}

/// The PriorityClasses the replay creates. None preempts (`preemptionPolicy: Never`): priority
/// only orders the scheduler's queue, so that every eviction measured is teamgpu's reclaim and
/// the three configurations differ only in what teamgpu does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Priority {
    High,
    Normal,
    Low,
}

impl Priority {
    pub const ALL: [Priority; 3] = [Priority::High, Priority::Normal, Priority::Low];

    pub fn class_name(self) -> &'static str {
        match self {
            Priority::High => "replay-high",
            Priority::Normal => "replay-normal",
            Priority::Low => "replay-low",
        }
    }

    pub fn value(self) -> i32 {
        match self {
            Priority::High => 1000,
            Priority::Normal => 100,
            Priority::Low => 10,
        }
    }
}

/// One job to submit: `pods` pods of `gpus_per_pod` GPUs each, all running `run_seconds`.
#[derive(Debug, Clone, PartialEq)]
pub struct Job {
    /// Unique within the replay, e.g. `vision-017`.
    pub name: String,
    /// Index into [`teams`].
    pub team: usize,
    /// Seconds after the start of the replay.
    pub submit_at: f64,
    pub pods: u32,
    pub gpus_per_pod: u32,
    pub run_seconds: f64,
    pub priority: Priority,
}

impl Job {
    pub fn gpus(&self) -> u32 {
        self.pods * self.gpus_per_pod
    }
}

/// The jobs of the replay for `seed`, sorted by submission time. Each team submits bursts at
/// uniformly random times in its part of the arrival window (a Poisson process of bursts,
/// given their number); a burst has a geometrically distributed number of jobs a fraction of a second
/// apart. Bursts are added until the team's jobs add up to its [`Team::load`] in
/// device-seconds: sizes are heavy-tailed, so a fixed burst rate would give one seed a team
/// twice as busy as another seed's.
pub fn jobs(seed: u64, teams: &[Team]) -> Vec<Job> {
    let mut rng = SplitMix64::new(seed);
    let mut jobs = Vec::new();
    for (index, team) in teams.iter().enumerate() {
        let wanted = team.load * f64::from(CAPACITY) * ARRIVAL_SECONDS;
        let (mut work, mut count) = (0.0, 0);
        while work < wanted {
            let (from, to) = team.active;
            let mut at = (from + rng.uniform() * (to - from)) * ARRIVAL_SECONDS;
            for _ in 0..rng.geometric(team.burst_jobs) {
                count += 1;
                let job = job(&mut rng, team, index, count, at);
                work += f64::from(job.gpus()) * job.run_seconds;
                jobs.push(job);
                at += 0.2 + rng.uniform() * 0.6;
            }
        }
    }
    jobs.sort_by(|a, b| a.submit_at.total_cmp(&b.submit_at));
    jobs
}

fn job(rng: &mut SplitMix64, team: &Team, index: usize, count: u32, at: f64) -> Job {
    let gpus = draw_size(rng, team.max_gpus);
    let (pods, gpus_per_pod) = if gpus > GPUS_PER_NODE {
        (gpus / GPUS_PER_NODE, GPUS_PER_NODE)
    } else {
        (1, gpus)
    };
    // A team's jobs are mostly of its usual priority; some urgent ones of others are high.
    let priority = if team.priority == Priority::Normal && rng.uniform() < 0.15 {
        Priority::High
    } else {
        team.priority
    };
    Job {
        name: format!("{}-{count:03}", team.name),
        team: index,
        submit_at: at,
        pods,
        gpus_per_pod,
        run_seconds: run_seconds(rng, gpus),
        priority,
    }
}

/// A job size of [`JOB_SIZES`] at most `max_gpus`.
fn draw_size(rng: &mut SplitMix64, max_gpus: u32) -> u32 {
    let sizes: Vec<_> = JOB_SIZES.iter().filter(|(g, _)| *g <= max_gpus).collect();
    let total: f64 = sizes.iter().map(|(_, p)| p).sum();
    let mut pick = rng.uniform() * total;
    for (gpus, p) in &sizes {
        if pick < *p {
            return *gpus;
        }
        pick -= p;
    }
    sizes.last().map_or(1, |(g, _)| *g)
}

/// Compressed run time: log-normal (median 7 s, sigma 0.9), longer for larger jobs (by a
/// quarter per doubling of GPUs, as multi-GPU jobs run longer in Philly), within 2..60 s.
pub fn run_seconds(rng: &mut SplitMix64, gpus: u32) -> f64 {
    let size_factor = 1.0 + 0.25 * f64::from(gpus).log2();
    (7.0 * (0.9 * rng.normal()).exp() * size_factor).clamp(2.0, 60.0)
}

/// splitmix64 (Steele, Lea, Flood 2014): small, fast, and the same numbers on every machine,
/// so a seed replays the same workload.
#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    pub fn new(seed: u64) -> SplitMix64 {
        SplitMix64(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1), from the top 53 bits.
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Standard normal (Box-Muller).
    fn normal(&mut self) -> f64 {
        let (u, v) = (1.0 - self.uniform(), self.uniform());
        (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
    }

    /// At least 1, mean `mean` (geometric on 1, 2, ...).
    fn geometric(&mut self, mean: f64) -> u32 {
        let stop = 1.0 / mean.max(1.0);
        let mut n = 1;
        while self.uniform() >= stop && n < 64 {
            n += 1;
        }
        n
    }
}
