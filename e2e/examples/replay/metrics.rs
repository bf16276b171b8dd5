//! The figures of one configuration, computed from its [`Timeline`] alone: the same timeline
//! gives the same figures, and nothing here reads the operator's code or state. Along the way
//! it prints to stderr what explains a figure (the slow Pods, the evictions no guarantee
//! needed, where a shortfall went), for a reader of one run.

use std::collections::{BTreeMap, HashMap};

use crate::diagnose;
use crate::observe::{PodTrace, QuotaSample, Seconds, Timeline};
use crate::reference::{self, Bounds, Queue};
use crate::workload::{CAPACITY, GPUS_PER_NODE, GRACE_SECONDS, Job, NODES, Team};

/// Sampling step of the time integrals.
pub const STEP: Seconds = 0.1;

/// What the metrics need to know of a configuration besides its timeline.
#[derive(Debug)]
pub struct Setting<'a> {
    pub teams: &'a [Team],
    /// Each team's limit in this configuration (`CAPACITY` when there are none).
    pub limits: Vec<u32>,
    /// Each team's lending limit in this configuration (`None` when it lends everything, and
    /// for every team without teamgpu).
    pub lending_limits: Vec<Option<u32>>,
    /// Namespace to team index.
    pub team_of: HashMap<String, usize>,
    pub jobs: &'a [Job],
    /// Job name to (namespace, when it was created).
    pub submitted: HashMap<String, (String, Seconds)>,
    /// The end of the measured window.
    pub end: Seconds,
}

/// One team's figures.
#[derive(Debug, Clone, Default)]
pub struct TeamFigures {
    /// Device-seconds the team wanted within its guarantee and did not hold, counted once the
    /// want had lasted [`GRACE_SECONDS`].
    pub shortfall: f64,
    /// Of `shortfall`, what was missing while at least as many devices were idle: not for want
    /// of devices, but of a node with room for the team's Pods (or of time to bind them).
    pub shortfall_while_idle: f64,
    /// Of `shortfall_while_idle`, what was missing while none of the team's waiting Pods fitted
    /// the free devices of any one node: fragmentation, where the rest is time to bind.
    pub shortfall_no_room: f64,
    /// Device-seconds it wanted within its guarantee: the integral of min(guarantee, demand).
    pub wanted_in_guarantee: f64,
    /// Mean devices allocated.
    pub mean_held: f64,
    /// Mean |allocated - weighted max-min share| over the samples.
    pub fairness_deviation: f64,
    /// Its Pods evicted.
    pub evictions: usize,
}

/// The figures of one configuration.
#[derive(Debug, Clone, Default)]
pub struct Figures {
    pub end: Seconds,
    /// Allocated device-seconds / capacity-seconds.
    pub utilization: f64,
    /// The integral of min(capacity, demand) / capacity-seconds.
    pub ideal: f64,
    /// The same jobs placed with no latency within the configuration's bounds (see
    /// `reference.rs`), first come and by a weighted fair queue.
    pub first_come: Reference,
    pub fair_queue: Reference,
    pub teams: Vec<TeamFigures>,
    /// Sum of guarantee x window.
    pub guaranteed_device_seconds: f64,
    /// Seconds from quota room to bound, for Pods whose claim quota had refused.
    pub headroom_to_bound: Vec<f64>,
    /// Of it, the seconds from quota room to the Pod's claim created: the wake-up, before the
    /// scheduler's part.
    pub headroom_to_claim: Vec<f64>,
    /// Jobs: submit to all Pods bound; submit to Complete (for jobs unfinished at the end: to
    /// the end, a lower bound).
    pub job_wait: Vec<f64>,
    pub job_completion: Vec<f64>,
    pub jobs_submitted: usize,
    pub jobs_unfinished: usize,
    pub evictions: usize,
    /// GPU-seconds of work the evicted Pods had done.
    pub evicted_gpu_seconds: f64,
    /// Evictions while no other team waited below its guarantee, or that took a team below
    /// its own guarantee.
    pub unneeded_evictions: usize,
    /// Devices allocated per team at every sample (for the chart).
    pub held: Vec<Vec<u32>>,
    /// Where the utilization below the ideal went.
    pub idle_while_wanted: IdleWhileWanted,
    /// How the first Pods of each Job started.
    pub pod_start: PodStart,
}

/// The start of each Job's first Pods (a replaced Pod is not counted): the path every Pod
/// takes, whatever the quota, through the job controller, the resourceclaim controller and the
/// scheduler.
#[derive(Debug, Clone, Default)]
pub struct PodStart {
    /// Seconds from the Job's creation to each Pod's.
    pub submitted_to_created: Vec<f64>,
    /// Seconds from a Pod's creation to its binding, for those bound.
    pub created_to_bound: Vec<f64>,
    /// Of that, seconds from a Pod's creation to its claim's (the resourceclaim controller,
    /// quota admission, and its retries when quota refused).
    pub created_to_claimed: Vec<f64>,
    /// Device-seconds the ideal counts before the Pods existed (Σ GPUs × (created −
    /// submitted)): out of reach of any quota or scheduler.
    pub before_created: f64,
    /// Claims made for a Pod that had already succeeded: the resourceclaim controller makes a
    /// claim again for a finished Pod whose claim it deleted when the Pod is tried again, and
    /// quota charges each while it exists.
    pub claims_for_finished_pods: usize,
    pub claims: usize,
}

/// Device-seconds that were idle while submitted Pods wanted more than their teams held, by
/// what stood between them: the gap between utilization and the ideal, taken apart. Each
/// idle device-second is counted once, in this order.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct IdleWhileWanted {
    /// Wanted within the team's quota hard (and limit) at the time, yet not allocated: no node
    /// had room for the Pod (an 8-GPU Pod needs a whole node), or its Pod, claim or binding
    /// was still on the way.
    pub placement: f64,
    /// Within the team's limit but above its quota hard at the time: not lent (yet).
    pub quota: f64,
    /// Of `quota`, the idle devices a lending limit kept for their team: its guarantee it
    /// neither held nor charged a claim for, beyond what it lends.
    pub kept_unlent: f64,
    /// Above the team's limit in this configuration.
    pub limit: f64,
}

impl Figures {
    pub fn shortfall(&self) -> f64 {
        self.teams.iter().map(|t| t.shortfall).sum()
    }

    pub fn shortfall_while_idle(&self) -> f64 {
        self.teams.iter().map(|t| t.shortfall_while_idle).sum()
    }

    pub fn shortfall_no_room(&self) -> f64 {
        self.teams.iter().map(|t| t.shortfall_no_room).sum()
    }

    pub fn fairness_deviation(&self) -> f64 {
        let n = self.teams.len().max(1) as f64;
        self.teams.iter().map(|t| t.fairness_deviation).sum::<f64>() / n
    }
}

/// What the reference scheduler did with the same jobs in the same configuration, measured
/// as the replay is.
#[derive(Debug, Clone, Copy, Default)]
pub struct Reference {
    pub utilization: f64,
    pub ideal: f64,
    /// Mean |allocated - weighted max-min share| per team.
    pub fairness_deviation: f64,
}

fn reference_figures(setting: &Setting, queue: Queue, samples: usize) -> Reference {
    let bounds = Bounds {
        teams: setting.teams,
        limits: &setting.limits,
        lending_limits: &setting.lending_limits,
    };
    let placed = reference::place(setting.jobs, bounds, queue, setting.end);
    let teams = setting.teams.len();
    let held = step_series(teams, samples, placed.held);
    let demand = step_series(teams, samples, placed.demand);
    let (utilization, ideal) = utilization_and_ideal(&held, &demand);
    let deviations = fairness_deviations(setting, &setting.lending_limits, &held, &demand);
    Reference {
        utilization,
        ideal,
        fairness_deviation: deviations.iter().map(Deviation::total).sum::<f64>()
            / teams.max(1) as f64,
    }
}

/// Allocated device-seconds / capacity-seconds, and the ideal's: min(capacity, demand).
fn utilization_and_ideal(held: &[Vec<u32>], demand: &[Vec<u32>]) -> (f64, f64) {
    let samples = held.first().map_or(0, Vec::len);
    let window = f64::from(CAPACITY) * samples as f64;
    let total_at = |series: &[Vec<u32>], i: usize| series.iter().map(|s| s[i]).sum::<u32>();
    let utilization = (0..samples)
        .map(|i| f64::from(total_at(held, i)))
        .sum::<f64>();
    let ideal = (0..samples)
        .map(|i| f64::from(total_at(demand, i).min(CAPACITY)))
        .sum::<f64>();
    (utilization / window.max(1.0), ideal / window.max(1.0))
}

/// Computes the figures of `timeline` in `setting`.
pub fn figures(setting: &Setting, timeline: &Timeline) -> Figures {
    let samples = (setting.end / STEP).ceil() as usize;
    let held = held_series(setting, timeline, samples);
    let demand = step_series(
        setting.teams.len(),
        samples,
        demand_changes(setting, timeline),
    );
    let (utilization, ideal) = utilization_and_ideal(&held, &demand);
    let most_free = most_free_series(timeline, samples);
    let (room, unfitting) = room_series(setting, timeline, &most_free);
    let mut teams = team_figures(setting, &held, &demand, &room);
    let no_node: Vec<Vec<bool>> = (room.iter())
        .map(|team| team.iter().map(|fit| *fit == Fit::NoNode).collect())
        .collect();
    diagnose::print_longest_no_node_waits(setting, timeline, &held, &demand, &no_node);
    let evictions = evictions(setting, timeline, (&held, &demand), &unfitting);
    let mut replaced = replacement_delays(timeline);
    replaced.sort_by(f64::total_cmp);
    eprintln!(
        "replay: an evicted Pod's replacement created after it went, s: p50 {:.1}, max {:.1} \
         ({} of them)",
        quantile(&replaced, 0.5).unwrap_or(0.0),
        replaced.last().copied().unwrap_or(0.0),
        replaced.len()
    );
    for (team, _) in &evictions {
        teams[*team].evictions += 1;
    }
    let (job_wait, job_completion, jobs_unfinished) = job_times(setting, timeline);
    let hards = quota_series(setting, timeline, samples, |q| q.hard);
    let charged = quota_series(setting, timeline, samples, |q| q.used);
    let idle_while_wanted = idle_while_wanted(setting, &held, &demand, &hards, &charged);
    let (headroom_to_bound, headroom_to_claim) = headroom_to_bound(timeline, &most_free);
    Figures {
        end: setting.end,
        utilization,
        ideal,
        first_come: reference_figures(setting, Queue::Arrival, samples),
        fair_queue: reference_figures(setting, Queue::FairShare, samples),
        guaranteed_device_seconds: (setting.teams.iter())
            .map(|t| f64::from(t.guaranteed) * setting.end)
            .sum(),
        headroom_to_bound,
        headroom_to_claim,
        jobs_submitted: setting.submitted.len(),
        job_wait,
        job_completion,
        jobs_unfinished,
        evictions: evictions.len(),
        // `+ 0.0`: an empty sum of floats is -0.0, which would print as "-0".
        evicted_gpu_seconds: evictions
            .iter()
            .map(|(_, e)| e.lost_gpu_seconds)
            .sum::<f64>()
            + 0.0,
        unneeded_evictions: evictions.iter().filter(|(_, e)| !e.needed).count(),
        pod_start: pod_start(setting, timeline),
        teams,
        held,
        idle_while_wanted,
    }
}

/// The sample covering time `at`.
fn sample_of(at: Seconds, samples: usize) -> usize {
    ((at / STEP).floor().max(0.0) as usize).min(samples)
}

/// A step series per team from (time, team, change) events.
fn step_series(
    teams: usize,
    samples: usize,
    mut changes: Vec<(Seconds, usize, i64)>,
) -> Vec<Vec<u32>> {
    changes.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut level = vec![0i64; teams];
    let mut series = vec![vec![0u32; samples]; teams];
    let mut next = changes.iter().peekable();
    for i in 0..samples {
        let t = i as f64 * STEP;
        while let Some((_, team, change)) = next.next_if(|(at, _, _)| *at <= t) {
            level[*team] += change;
        }
        for (team, series) in series.iter_mut().enumerate() {
            series[i] = level[team].max(0) as u32;
        }
    }
    series
}

/// Devices allocated to each team's claims over time.
fn held_series(setting: &Setting, timeline: &Timeline, samples: usize) -> Vec<Vec<u32>> {
    let mut changes = Vec::new();
    for claim in timeline.claims.values() {
        let Some(&team) = setting.team_of.get(&claim.namespace) else {
            continue;
        };
        let mut before = 0i64;
        for &(at, devices) in &claim.allocated {
            changes.push((at, team, i64::from(devices) - before));
            before = i64::from(devices);
        }
    }
    step_series(setting.teams.len(), samples, changes)
}

/// Devices each team's submitted, unfinished Pods want over time: a Job's GPUs from its
/// submission, less a Pod's GPUs for each of its Pods that succeeded.
fn demand_changes(setting: &Setting, timeline: &Timeline) -> Vec<reference::Change> {
    let mut changes = Vec::new();
    let mut successes: HashMap<(&str, &str), Vec<Seconds>> = HashMap::new();
    for pod in timeline.pods.values() {
        if let Some(at) = pod.succeeded {
            successes
                .entry((&pod.namespace, &pod.job))
                .or_default()
                .push(at);
        }
    }
    for job in setting.jobs {
        let Some((namespace, at)) = setting.submitted.get(&job.name) else {
            continue;
        };
        changes.push((*at, job.team, i64::from(job.gpus())));
        let done = successes.get(&(namespace.as_str(), job.name.as_str()));
        let mut done = done.cloned().unwrap_or_default();
        done.sort_by(f64::total_cmp);
        for at in done.into_iter().take(job.pods as usize) {
            changes.push((at, job.team, -i64::from(job.gpus_per_pod)));
        }
    }
    changes
}

/// Each team's quota hard or used (`field`) over time, as the server reported it (`u32::MAX`
/// where the team has no quota, and before its first report).
fn quota_series(
    setting: &Setting,
    timeline: &Timeline,
    samples: usize,
    field: fn(&QuotaSample) -> u32,
) -> Vec<Vec<u32>> {
    let mut series = vec![vec![u32::MAX; samples]; setting.teams.len()];
    for (namespace, reports) in &timeline.quotas {
        let Some(&team) = setting.team_of.get(namespace) else {
            continue;
        };
        for (n, report) in reports.iter().enumerate() {
            let until = reports
                .get(n + 1)
                .map_or(samples, |next| sample_of(next.at, samples));
            for hard in &mut series[team][sample_of(report.at, samples)..until] {
                *hard = field(report);
            }
        }
    }
    series
}

/// Idle device-seconds while demand went unheld, split as [`IdleWhileWanted`] says
/// (`charged`: the quotas' used).
fn idle_while_wanted(
    setting: &Setting,
    held: &[Vec<u32>],
    demand: &[Vec<u32>],
    hards: &[Vec<u32>],
    charged: &[Vec<u32>],
) -> IdleWhileWanted {
    let samples = held.first().map_or(0, Vec::len);
    let mut out = IdleWhileWanted::default();
    for i in 0..samples {
        let (mut placement, mut quota, mut limit) = (0u32, 0u32, 0u32);
        for t in 0..setting.teams.len() {
            let (want, have, hard, cap) =
                (demand[t][i], held[t][i], hards[t][i], setting.limits[t]);
            placement += want.min(hard).min(cap).saturating_sub(have);
            quota += want.min(cap).saturating_sub(hard.max(have));
            limit += want.saturating_sub(cap.max(have));
        }
        let mut idle = CAPACITY.saturating_sub(held.iter().map(|h| h[i]).sum());
        let kept: u32 = (0..setting.teams.len())
            .filter(|&t| hards[t][i] != u32::MAX)
            .filter_map(|t| {
                let unused =
                    (setting.teams[t].guaranteed).saturating_sub(charged[t][i].max(held[t][i]));
                Some(unused.saturating_sub(setting.lending_limits[t]?))
            })
            .sum();
        let above_quota = quota.min(idle.saturating_sub(placement));
        out.kept_unlent += f64::from(above_quota.min(kept)) * STEP;
        for (lost, wanted) in [
            (&mut out.placement, placement),
            (&mut out.quota, quota),
            (&mut out.limit, limit),
        ] {
            let counted = idle.min(wanted);
            *lost += f64::from(counted) * STEP;
            idle -= counted;
        }
    }
    out
}

/// When a Pod stopped holding its devices, as far as the watch tells: succeeded, being deleted
/// or disrupted, whichever came first.
pub fn ended(pod: &PodTrace) -> Seconds {
    [pod.succeeded, pod.deleting, pod.disrupted]
        .into_iter()
        .flatten()
        .fold(f64::INFINITY, f64::min)
}

/// Per sample, the most devices free on one node, as the scheduler sees them: a claim's devices
/// are on its Pod's node from its allocation until it is deallocated or deleted (a finished
/// Pod's claim holds them until the resourceclaim controller lets it go).
fn most_free_series(timeline: &Timeline, samples: usize) -> Vec<u32> {
    let mut used = vec![HashMap::<&str, u32>::new(); samples];
    for claim in timeline.claims.values() {
        let Some(node) = (claim.pod.as_deref())
            .and_then(|uid| timeline.pods.get(uid))
            .and_then(|pod| pod.node.as_deref())
        else {
            continue;
        };
        // Each (from, devices) holds until the next change (or the end).
        for (k, &(from, devices)) in claim.allocated.iter().enumerate() {
            let until = claim
                .allocated
                .get(k + 1)
                .map_or(samples, |&(t, _)| sample_of(t, samples));
            for per_node in &mut used[sample_of(from, samples)..until] {
                *per_node.entry(node).or_default() += devices;
            }
        }
    }
    used.into_iter()
        .map(|per_node| {
            // Nodes nobody holds devices on are whole.
            if per_node.len() < NODES as usize {
                GPUS_PER_NODE
            } else {
                (per_node.values())
                    .map(|u| GPUS_PER_NODE.saturating_sub(*u))
                    .max()
                    .unwrap_or(GPUS_PER_NODE)
            }
        })
        .collect()
}

/// Whether one of a team's waiting Pods fitted a node at a sample, and if so how far the
/// oldest such Pod had got.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Fit {
    /// None of its waiting Pods fitted the free devices of any one node.
    NoNode,
    /// Some did, all created less than [`YOUNG`] ago: on their way.
    Young,
    /// One created [`YOUNG`] ago or more had its claim and was not bound yet: the scheduler.
    Claimed,
    /// One created [`YOUNG`] ago or more had no claim yet: the resourceclaim controller, quota.
    Unclaimed,
}

/// How long a Pod may take from creation to binding before its wait is told apart.
const YOUNG: Seconds = 2.0;

/// Per team and sample: whether one of the team's waiting Pods (created, not yet bound, not
/// ended) fitted the free devices of some node, and if so how far the oldest that fitted had
/// got; and whether one of them fitted no node.
fn room_series(
    setting: &Setting,
    timeline: &Timeline,
    most_free: &[u32],
) -> (Vec<Vec<Fit>>, Vec<Vec<bool>>) {
    let claimed = first_claims(timeline);
    let mut fits = vec![vec![Fit::NoNode; most_free.len()]; setting.teams.len()];
    let mut unfit = vec![vec![false; most_free.len()]; setting.teams.len()];
    for (i, &free) in most_free.iter().enumerate() {
        let at = i as f64 * STEP;
        for (uid, pod) in &timeline.pods {
            let waiting = pod.created <= at && pod.bound.is_none_or(|b| b > at) && at < ended(pod);
            let Some(&team) = setting.team_of.get(&pod.namespace).filter(|_| waiting) else {
                continue;
            };
            if pod.gpus > free {
                unfit[team][i] = true;
                continue;
            }
            let fit = if at - pod.created < YOUNG {
                Fit::Young
            } else if claimed.get(uid.as_str()).is_some_and(|&c| c <= at) {
                Fit::Claimed
            } else {
                Fit::Unclaimed
            };
            fits[team][i] = fits[team][i].max(fit);
        }
    }
    (fits, unfit)
}

fn team_figures(
    setting: &Setting,
    held: &[Vec<u32>],
    demand: &[Vec<u32>],
    room: &[Vec<Fit>],
) -> Vec<TeamFigures> {
    let grace_samples = (f64::from(GRACE_SECONDS) / STEP).round() as usize;
    let samples = held.first().map_or(0, Vec::len);
    let fairness = fairness_deviations(setting, &setting.lending_limits, held, demand);
    if setting.lending_limits.iter().any(Option::is_some) {
        // Runs before 2026-12-06 (late) lent what a lending limit keeps in the fair shares too.
        let lending_all = vec![None; setting.teams.len()];
        let before = fairness_deviations(setting, &lending_all, held, demand);
        eprintln!(
            "replay: fairness with every guarantee lendable (as before 2026-12-06 late): {:.2}",
            before.iter().map(Deviation::total).sum::<f64>() / before.len().max(1) as f64
        );
    }
    for (team, d) in setting.teams.iter().zip(&fairness) {
        eprintln!(
            "replay: {}: mean GPUs above its share {:.2}, below it while as many were idle {:.2}, \
             below it while other teams held them {:.2}",
            team.name, d.above, d.below_beside_idle, d.below
        );
    }
    let idle: Vec<u32> = (0..samples)
        .map(|i| CAPACITY.saturating_sub(held.iter().map(|h| h[i]).sum()))
        .collect();
    (setting.teams.iter().enumerate())
        .map(|(t, team)| {
            let want = |i: usize| demand[t][i].min(team.guaranteed);
            let missing: Vec<u32> = (0..samples)
                .map(|i| want(i).saturating_sub(held[t][i]))
                .collect();
            // What was missing throughout the last grace period: a want younger than the
            // grace is not yet owed.
            let overdue: Vec<u32> = (0..samples)
                .map(|i| {
                    let from = i.saturating_sub(grace_samples);
                    if i < grace_samples {
                        0
                    } else {
                        missing[from..=i].iter().copied().min().unwrap_or(0)
                    }
                })
                .collect();
            let while_idle: Vec<u32> = (overdue.iter().zip(&idle))
                .map(|(&o, &free)| o.min(free))
                .collect();
            let no_room = (while_idle.iter().zip(&room[t]))
                .filter(|(_, fit)| **fit == Fit::NoNode)
                .map(|(&o, _)| f64::from(o));
            // Folded from 0.0: a float sum of nothing is -0.0, printed "-0".
            let by_fit = |which: Fit| {
                (while_idle.iter().zip(&room[t]))
                    .filter(|(_, fit)| **fit == which)
                    .map(|(&o, _)| f64::from(o))
                    .fold(0.0, |sum, o| sum + o)
                    * STEP
            };
            // Of the shortfall with no node for its Pods, what other teams held above their
            // guarantees meanwhile (what reclaim could have taken to make room, at most).
            let borrowed = |i: usize| -> u32 {
                (setting.teams.iter().enumerate())
                    .filter(|&(u, _)| u != t)
                    .map(|(u, other)| held[u][i].saturating_sub(other.guaranteed))
                    .sum()
            };
            let no_room_borrowed: f64 = (while_idle.iter().zip(&room[t]).enumerate())
                .filter(|(_, (_, fit))| **fit == Fit::NoNode)
                .map(|(i, (&o, _))| f64::from(o.min(borrowed(i))))
                .fold(0.0, |sum, o| sum + o)
                * STEP;
            eprintln!(
                "replay: {}: shortfall with no node for its Pods, of it while other teams held \
                 as many above their guarantees: {no_room_borrowed:.0} GPU-s",
                team.name
            );
            // Where the shortfall with a node for the Pods went, by the oldest such Pod: on its
            // way, waiting for the scheduler with its claim, or for its claim (quota).
            eprintln!(
                "replay: {}: shortfall while a node had room for its Pods: {:.0} GPU-s on their \
                 way (< {YOUNG} s), {:.0} claimed and not bound, {:.0} without a claim",
                team.name,
                by_fit(Fit::Young),
                by_fit(Fit::Claimed),
                by_fit(Fit::Unclaimed)
            );
            TeamFigures {
                shortfall_no_room: no_room.fold(0.0, |sum, o| sum + o) * STEP,
                shortfall: overdue.iter().copied().map(f64::from).sum::<f64>() * STEP,
                shortfall_while_idle: while_idle.iter().copied().map(f64::from).sum::<f64>() * STEP,
                wanted_in_guarantee: (0..samples).map(|i| f64::from(want(i))).sum::<f64>() * STEP,
                mean_held: held[t].iter().map(|&h| f64::from(h)).sum::<f64>()
                    / samples.max(1) as f64,
                fairness_deviation: fairness[t].total(),
                evictions: 0,
            }
        })
        .collect()
}

/// One team's mean |allocated - fair share|, taken apart.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Deviation {
    /// Held above the share.
    above: f64,
    /// Held below the share while at least as many devices were idle: the team's Pods were on
    /// their way, or fitted no node.
    below_beside_idle: f64,
    /// Held below the share while other teams held the devices.
    below: f64,
}

impl Deviation {
    fn total(&self) -> f64 {
        self.above + self.below_beside_idle + self.below
    }
}

/// Per team, the mean |allocated - fair share| over the samples (every fifth, 0.5 s apart).
/// The devices a lending limit keeps for an idle owner (its guarantee beyond what it wants and
/// may lend) are nobody's share: the configuration says they stay idle.
fn fairness_deviations(
    setting: &Setting,
    lending_limits: &[Option<u32>],
    held: &[Vec<u32>],
    demand: &[Vec<u32>],
) -> Vec<Deviation> {
    let samples = held.first().map_or(0, Vec::len);
    let teams = setting.teams;
    let weights: Vec<f64> = teams.iter().map(|t| f64::from(t.weight)).collect();
    let mut deviation = vec![Deviation::default(); teams.len()];
    let mut counted = 0usize;
    for i in (0..samples).step_by(5) {
        let caps: Vec<f64> = (0..teams.len())
            .map(|t| f64::from(demand[t][i].min(setting.limits[t])))
            .collect();
        let floors: Vec<f64> = (0..teams.len())
            .map(|t| f64::from(demand[t][i].min(teams[t].guaranteed)))
            .collect();
        let kept: u32 = (0..teams.len())
            .filter_map(|t| {
                let unused = teams[t].guaranteed.saturating_sub(demand[t][i]);
                Some(unused.saturating_sub(lending_limits[t]?))
            })
            .sum();
        let capacity = f64::from(CAPACITY - kept);
        let shares = weighted_max_min(capacity, &floors, &caps, &weights);
        let idle = f64::from(CAPACITY.saturating_sub(held.iter().map(|h| h[i]).sum()));
        for t in 0..teams.len() {
            let off = f64::from(held[t][i]) - shares[t];
            let d = &mut deviation[t];
            match off {
                _ if off >= 0.0 => d.above += off,
                _ if -off <= idle => d.below_beside_idle -= off,
                _ => d.below -= off,
            }
        }
        counted += 1;
    }
    let n = counted.max(1) as f64;
    (deviation.iter())
        .map(|d| Deviation {
            above: d.above / n,
            below_beside_idle: d.below_beside_idle / n,
            below: d.below / n,
        })
        .collect()
}

/// Weighted max-min fair shares of `capacity`: each team gets clamp(weight x level, floor,
/// cap) for the one water level at which the shares add up to the capacity (or every team is
/// at its cap). The floors are the guarantees a team wants, so no team's fair share is below
/// the guarantee it asks for; above that, devices go by weight up to demand and limit.
/// Written here, not taken from the operator, so that the benchmark judges the operator by
/// an independent yardstick. Continuous (fractions of devices), by bisection.
pub fn weighted_max_min(capacity: f64, floors: &[f64], caps: &[f64], weights: &[f64]) -> Vec<f64> {
    let share = |level: f64| -> Vec<f64> {
        (0..caps.len())
            .map(|t| {
                (weights[t] * level)
                    .max(floors[t].min(caps[t]))
                    .min(caps[t])
            })
            .collect()
    };
    if caps.iter().sum::<f64>() <= capacity {
        return caps.to_vec();
    }
    let (mut low, mut high) = (0.0, capacity);
    for _ in 0..60 {
        let level = (low + high) / 2.0;
        if share(level).iter().sum::<f64>() > capacity {
            high = level;
        } else {
            low = level;
        }
    }
    share(low)
}

/// For each Pod evicted (or deleted) while bound and unfinished, the seconds until the job
/// controller made the next Pod of its Job.
fn replacement_delays(timeline: &Timeline) -> Vec<f64> {
    let evicted = (timeline.pods.values())
        .filter(|p| p.bound.is_some() && p.succeeded.is_none())
        .filter_map(|p| Some((p, p.disrupted.or(p.deleting)?)));
    evicted
        .filter_map(|(pod, gone)| {
            (timeline.pods.values())
                .filter(|p| p.namespace == pod.namespace && p.job == pod.job && p.created >= gone)
                .map(|p| p.created - gone)
                .min_by(f64::total_cmp)
        })
        .collect()
}

/// One evicted Pod.
#[derive(Debug)]
struct Eviction {
    lost_gpu_seconds: f64,
    /// Some other team waited below its guarantee, and the victim's team held more than its own
    /// (reclaim), or a Pod of the waiting team fitted no node (a move: the victim's team keeps
    /// its share, its Pod made again runs elsewhere).
    needed: bool,
}

/// How soon after a move the waiting team's Pod must be bound on the node the moved Pod left for
/// the move to have given it that node: the grace of the next pass and the scheduler's retry.
pub const MOVE_PAID_OFF: Seconds = 15.0;

/// The note of the operator's `Moved` Event on `pod`, if it was moved.
pub fn move_note<'t>(timeline: &'t Timeline, pod: &PodTrace) -> Option<&'t String> {
    (timeline
        .reclaimed
        .get(&(pod.namespace.clone(), pod.name.clone())))
    .filter(|n| n.starts_with("Moved:"))
}

/// The team a `Moved` Event's note names as waiting: "... so that it runs again on another node:
/// <team> waits, within its guarantee, ...".
pub fn moved_for_team(setting: &Setting, note: &str) -> Option<usize> {
    let waiting =
        (note.split("another node: ").nth(1)).and_then(|rest| rest.split(" waits").next());
    waiting.and_then(|w| setting.teams.iter().position(|t| t.name == w))
}

/// Whether, within [`MOVE_PAID_OFF`] of `ended`, a Pod of a team that `counts` was bound on the
/// node `pod` left.
fn room_went_to(
    setting: &Setting,
    timeline: &Timeline,
    (pod, ended): (&PodTrace, Seconds),
    counts: impl Fn(usize) -> bool,
) -> bool {
    let Some(node) = pod.node.as_deref() else {
        return false;
    };
    timeline.pods.values().any(|p| {
        setting
            .team_of
            .get(&p.namespace)
            .is_some_and(|&t| counts(t))
            && p.node.as_deref() == Some(node)
            && p.bound
                .is_some_and(|b| b >= ended && b <= ended + MOVE_PAID_OFF)
    })
}

/// The replay's Pods that were evicted or deleted while bound and unfinished, by team.
fn evictions(
    setting: &Setting,
    timeline: &Timeline,
    (held, demand): (&[Vec<u32>], &[Vec<u32>]),
    unfitting: &[Vec<bool>],
) -> Vec<(usize, Eviction)> {
    let samples = held.first().map_or(0, Vec::len);
    let below_guarantee =
        |t: usize, i: usize| held[t][i] < demand[t][i].min(setting.teams[t].guaranteed);
    let mut out = Vec::new();
    let mut moves = 0;
    // Moved Pods; those after which the waiting team's Pod was bound on the node they left; those
    // after which a Pod of it or of another team below its guarantee was.
    let mut moved = (0, 0, 0);
    for pod in timeline.pods.values() {
        let Some(&team) = setting.team_of.get(&pod.namespace) else {
            continue;
        };
        let ended = match (pod.disrupted, pod.deleting) {
            (Some(a), Some(b)) => a.min(b),
            (a, b) => match a.or(b) {
                Some(at) => at,
                None => continue,
            },
        };
        let Some(bound) = pod.bound.filter(|_| pod.succeeded.is_none()) else {
            continue;
        };
        let i = sample_of(ended, samples.saturating_sub(1));
        let someone_waits = (0..setting.teams.len()).any(|u| u != team && below_guarantee(u, i));
        let victim_borrowed = held[team][i] > setting.teams[team].guaranteed;
        let someone_fits_no_node =
            (0..setting.teams.len()).any(|u| u != team && below_guarantee(u, i) && unfitting[u][i]);
        // A move gave a node to a team below its guarantee: the one its Event names, or another
        // whose Pod the scheduler put there first.
        let note = move_note(timeline, pod);
        let named = note.and_then(|n| moved_for_team(setting, n));
        let went = |counts: &dyn Fn(usize) -> bool| {
            note.is_some() && room_went_to(setting, timeline, (pod, ended), counts)
        };
        let to_named = went(&|u| Some(u) == named);
        let to_waiting = went(&|u| u != team && below_guarantee(u, i));
        let needed =
            someone_waits && (victim_borrowed || someone_fits_no_node || to_named || to_waiting);
        if !victim_borrowed && needed {
            moves += 1;
        }
        if note.is_some() {
            moved.0 += 1;
            moved.1 += u32::from(to_named);
            moved.2 += u32::from(to_named || to_waiting);
            if !to_named && !to_waiting {
                diagnose::unpaid_move(setting, timeline, pod, ended);
            }
        }
        if !needed {
            let why = (timeline
                .reclaimed
                .get(&(pod.namespace.clone(), pod.name.clone())))
            .map_or("no Reclaimed, Dequeued or Moved Event", String::as_str);
            eprintln!(
                "replay: eviction no guarantee needed: {}/{} ({} GPUs) at {ended:.1} s, its team \
                 held {} (guaranteed {}), another team below its guarantee: {someone_waits}; the \
                 operator: {why}",
                pod.namespace, pod.job, pod.gpus, held[team][i], setting.teams[team].guaranteed
            );
        }
        out.push((
            team,
            Eviction {
                lost_gpu_seconds: f64::from(pod.gpus) * (ended - bound).max(0.0),
                needed,
            },
        ));
    }
    eprintln!(
        "replay: evictions of Pods whose team held no more than its guarantee while a Pod of \
         another team below its guarantee fitted no node, or whose move gave it a node (moves): \
         {moves}"
    );
    eprintln!(
        "replay: Pods moved (a `Moved` Event): {}; of them, followed within {MOVE_PAID_OFF} s by \
         a Pod bound on the node they left of the team the Event names: {}; of it or another team \
         below its guarantee: {}",
        moved.0, moved.1, moved.2
    );
    out
}

/// When each Pod's first claim appeared, by Pod uid: the resourceclaim controller may make
/// more for a Pod once it is done, and those say nothing of its start.
fn first_claims(timeline: &Timeline) -> HashMap<&str, Seconds> {
    let mut first: HashMap<&str, Seconds> = HashMap::new();
    for claim in timeline.claims.values() {
        if let Some(pod) = claim.pod.as_deref() {
            let at = first.entry(pod).or_insert(claim.created);
            *at = at.min(claim.created);
        }
    }
    first
}

/// For each Pod whose claim quota refused (its namespace's quota had no room for it at some
/// moment between the Pod's creation and its claim's), the seconds from the start of the room
/// its claim was then created in (hard - used >= its GPUs, as the server reported) to the Pod
/// being bound. Pods never bound are left out.
/// Also returns, for the same Pods, the seconds from that room to their claim created.
fn headroom_to_bound(timeline: &Timeline, most_free: &[u32]) -> (Vec<f64>, Vec<f64>) {
    let claim_created = first_claims(timeline);
    let (mut out, mut to_claim) = (Vec::new(), Vec::new());
    for (uid, pod) in &timeline.pods {
        let (Some(bound), Some(&claimed)) = (pod.bound, claim_created.get(uid.as_str())) else {
            continue;
        };
        let Some(quota) = timeline.quotas.get(&pod.namespace) else {
            continue;
        };
        if let Some(room) = room_since(quota, pod.gpus, pod.created, claimed) {
            let waited = (bound - room).max(0.0);
            // Where the tail goes: the claim made late (the wake-up), no node with room for it
            // yet, or the scheduler late after both.
            if waited > 2.0 {
                let samples = most_free.len();
                let node_room = (sample_of(claimed, samples)..sample_of(bound, samples))
                    .find(|&i| most_free[i] >= pod.gpus)
                    .map_or("none before it was bound".to_owned(), |i| {
                        format!("from {:.1} s", i as f64 * STEP)
                    });
                eprintln!(
                    "replay: headroom -> bound {waited:.1} s: {}/{} ({} GPUs), room at {room:.1} s, \
                     claim created at {claimed:.1} s, a node with room {node_room}, bound at \
                     {bound:.1} s",
                    pod.namespace, pod.job, pod.gpus
                );
            }
            out.push(waited);
            to_claim.push((claimed - room).max(0.0));
        }
    }
    (out, to_claim)
}

/// When the room `gpus` was created in began, if quota had refused them before: the last
/// switch from no room to room at or before `claimed`, provided there was no room at some
/// point after `created`.
fn room_since(
    quota: &[crate::observe::QuotaSample],
    gpus: u32,
    created: Seconds,
    claimed: Seconds,
) -> Option<Seconds> {
    let has_room = |s: &crate::observe::QuotaSample| s.hard.saturating_sub(s.used) >= gpus;
    // The state at `created` is the last sample before it; then every change until `claimed`.
    let start = quota.iter().rposition(|s| s.at <= created).unwrap_or(0);
    let relevant: Vec<_> = quota[start..]
        .iter()
        .take_while(|s| s.at <= claimed)
        .collect();
    if relevant.iter().all(|s| has_room(s)) {
        return None;
    }
    let mut since = None;
    for sample in relevant {
        match (has_room(sample), since) {
            (true, None) => since = Some(sample.at.max(created)),
            (false, _) => since = None,
            (true, Some(_)) => {}
        }
    }
    since
}

/// Per submitted Job, the seconds to all its Pods bound and to Complete (to the end of the
/// window for those that did not get there); and how many did not complete.
fn job_times(setting: &Setting, timeline: &Timeline) -> (Vec<f64>, Vec<f64>, usize) {
    let mut bound: BTreeMap<(&str, &str), Vec<Seconds>> = BTreeMap::new();
    for pod in timeline.pods.values() {
        if let Some(at) = pod.bound {
            bound
                .entry((&pod.namespace, &pod.job))
                .or_default()
                .push(at);
        }
    }
    let (mut waits, mut completions, mut unfinished) = (Vec::new(), Vec::new(), 0);
    for job in setting.jobs {
        let Some((namespace, submitted)) = setting.submitted.get(&job.name) else {
            continue;
        };
        let mut times = bound
            .get(&(namespace.as_str(), job.name.as_str()))
            .cloned()
            .unwrap_or_default();
        times.sort_by(f64::total_cmp);
        // A job still waiting at the end counts with the time it waited so far (a lower bound),
        // so that a configuration that never runs some jobs does not look faster for it.
        let all_bound = times
            .get(job.pods as usize - 1)
            .copied()
            .unwrap_or(setting.end);
        waits.push(all_bound - submitted);
        let complete = timeline
            .jobs_complete
            .get(&(namespace.clone(), job.name.clone()));
        unfinished += usize::from(complete.is_none());
        completions.push(complete.copied().unwrap_or(setting.end) - submitted);
    }
    (waits, completions, unfinished)
}

fn pod_start(setting: &Setting, timeline: &Timeline) -> PodStart {
    let mut pods: BTreeMap<(&str, &str), Vec<(&str, &PodTrace)>> = BTreeMap::new();
    for (uid, pod) in &timeline.pods {
        (pods.entry((&pod.namespace, &pod.job)).or_default()).push((uid, pod));
    }
    let claimed = first_claims(timeline);
    let mut start = PodStart::default();
    for job in setting.jobs {
        let Some((namespace, submitted)) = setting.submitted.get(&job.name) else {
            continue;
        };
        let Some(own) = pods.get_mut(&(namespace.as_str(), job.name.as_str())) else {
            continue;
        };
        own.sort_by(|(_, a), (_, b)| a.created.total_cmp(&b.created));
        for (uid, pod) in own.iter().take(job.pods as usize) {
            let before = (pod.created - submitted).max(0.0);
            start.submitted_to_created.push(before);
            start.before_created += f64::from(pod.gpus) * before;
            if let Some(bound) = pod.bound {
                start.created_to_bound.push(bound - pod.created);
                if let Some(claim) = claimed.get(uid) {
                    start.created_to_claimed.push(claim - pod.created);
                }
            }
        }
    }
    start.claims = timeline.claims.len();
    start.claims_for_finished_pods = (timeline.claims.values())
        .filter(|c| {
            let pod = c.pod.as_deref().and_then(|uid| timeline.pods.get(uid));
            pod.and_then(|p| p.succeeded)
                .is_some_and(|done| c.created >= done)
        })
        .count();
    start
}

/// The `q`-quantile (0..=1) of `values`, nearest rank; `None` when empty.
pub fn quantile(values: &[f64], q: f64) -> Option<f64> {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len().max(1));
    sorted.get(rank - 1).copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A configuration of `teams` alone: no jobs, no namespaces.
    fn bare<'a>(
        teams: &'a [Team],
        limits: Vec<u32>,
        lending_limits: Vec<Option<u32>>,
        end: Seconds,
    ) -> Setting<'a> {
        Setting {
            teams,
            limits,
            lending_limits,
            team_of: HashMap::new(),
            jobs: &[],
            submitted: HashMap::new(),
            end,
        }
    }

    #[test]
    fn idle_devices_are_counted_within_quota_then_above_quota_then_above_limit() {
        // 128 devices; team 0 holds 100 of the 126 it wants (hard 110, limit 120), team 1
        // holds 0 of the 4 it wants (hard 0, limit 4), team 2 wants nothing and may lend 6 of
        // its 16 guaranteed. Idle: 28. Within quota: 10 (team 0); above quota: 10 (team 0) +
        // 4 (team 1), of which 10 are team 2's kept ones; above limit: 6 (team 0), of which
        // only 4 are still idle.
        let mut teams = crate::workload::teams()[..3].to_vec();
        teams[2].guaranteed = 16;
        teams[2].lending_limit = Some(6);
        let setting = bare(&teams, vec![120, 4, 16], vec![None, None, Some(6)], STEP);
        let lost = idle_while_wanted(
            &setting,
            &[vec![100], vec![0], vec![0]],
            &[vec![126], vec![4], vec![0]],
            &[vec![110], vec![0], vec![16]],
            &[vec![110], vec![0], vec![0]],
        );
        let expected = IdleWhileWanted {
            placement: 10.0 * STEP,
            quota: 14.0 * STEP,
            kept_unlent: 10.0 * STEP,
            limit: 4.0 * STEP,
        };
        assert_eq!(lost, expected);
    }

    #[test]
    fn a_shortfall_is_told_apart_by_whether_as_many_devices_were_idle() {
        // vision (guaranteed 32) wants 32 and holds 24 for 5 s; the others hold 100, so 4 are
        // idle. Past the 4-s grace (the last 1 s, 10 samples) 8 are overdue, 4 of them while
        // idle.
        let teams = crate::workload::teams()[..2].to_vec();
        let setting = bare(&teams, vec![64, 80], vec![None; 2], 5.0);
        let samples = 50;
        // In the first 4.5 s a waiting Pod of vision's fits a node, in the last 0.5 s none.
        let mut room = vec![vec![Fit::Claimed; samples], vec![Fit::NoNode; samples]];
        room[0][45..].fill(Fit::NoNode);
        let figures = team_figures(
            &setting,
            &[vec![24; samples], vec![100; samples]],
            &[vec![32; samples], vec![100; samples]],
            &room,
        );
        assert!((figures[0].shortfall - 8.0).abs() < 1e-9, "{figures:?}");
        assert!(
            (figures[0].shortfall_while_idle - 4.0).abs() < 1e-9,
            "{figures:?}"
        );
        assert!(
            (figures[0].shortfall_no_room - 2.0).abs() < 1e-9,
            "{figures:?}"
        );
        assert_eq!(figures[1].shortfall, 0.0);
    }

    #[test]
    fn headroom_to_bound_is_taken_apart_at_the_claim() {
        // An 8-GPU Pod created at 10 s while its quota has room for 4; the quota has room for 8
        // from 30 s, the claim is created at 30.2 s and the Pod bound at 37 s (no node had
        // room until then). A 1-GPU Pod that always had room does not count.
        let pod = |gpus, created, bound| PodTrace {
            namespace: "a-vision".into(),
            gpus,
            created,
            bound: Some(bound),
            ..PodTrace::default()
        };
        let claim = |pod: &str, created| crate::observe::ClaimTrace {
            namespace: "a-vision".into(),
            pod: Some(pod.into()),
            created,
            allocated: Vec::new(),
        };
        let sample = |at, hard| crate::observe::QuotaSample { at, hard, used: 0 };
        let timeline = Timeline {
            pods: HashMap::from([
                ("big".into(), pod(8, 10.0, 37.0)),
                ("small".into(), pod(1, 12.0, 12.5)),
            ]),
            claims: HashMap::from([
                ("c1".into(), claim("big", 30.2)),
                ("c2".into(), claim("small", 12.1)),
            ]),
            quotas: BTreeMap::from([("a-vision".into(), vec![sample(0.0, 4), sample(30.0, 8)])]),
            ..Timeline::default()
        };
        let (to_bound, to_claim) = headroom_to_bound(&timeline, &[0; 400]);
        let rounded =
            |v: Vec<f64>| -> Vec<f64> { v.iter().map(|s| (s * 10.0).round() / 10.0).collect() };
        assert_eq!(rounded(to_bound), vec![7.0]);
        assert_eq!(rounded(to_claim), vec![0.2]);
    }

    #[test]
    fn a_jobs_first_pods_count_from_its_submission_and_a_replacement_does_not() {
        // A 2-Pod Job of 8 GPUs each, submitted at 10 s: Pods created at 10.5 and 11 s, claims
        // 0.1 and 0.4 s later, bound 0.3 and 0.5 s later; the first is evicted and its
        // replacement (created at 20 s) is not a start. The second succeeds at 41.5 s and gets
        // a claim again at 41.6 s.
        let teams = crate::workload::teams()[..1].to_vec();
        let job = Job {
            name: "vision-000".into(),
            team: 0,
            submit_at: 10.0,
            pods: 2,
            gpus_per_pod: 8,
            run_seconds: 30.0,
            priority: crate::workload::Priority::Normal,
        };
        let pod = |created: f64, bound: f64| PodTrace {
            namespace: "a-vision".into(),
            job: "vision-000".into(),
            gpus: 8,
            created,
            bound: Some(bound),
            ..PodTrace::default()
        };
        let done = |pod: PodTrace, at: f64| PodTrace {
            succeeded: Some(at),
            ..pod
        };
        let claim = |pod: &str, created: f64| crate::observe::ClaimTrace {
            namespace: "a-vision".into(),
            pod: Some(pod.into()),
            created,
            allocated: Vec::new(),
        };
        let timeline = Timeline {
            pods: HashMap::from([
                ("p1".into(), pod(10.5, 10.8)),
                ("p2".into(), done(pod(11.0, 11.5), 41.5)),
                ("p3".into(), pod(20.0, 24.0)),
            ]),
            claims: HashMap::from([
                ("c1".into(), claim("p1", 10.6)),
                ("c2".into(), claim("p2", 11.4)),
                ("c3".into(), claim("p3", 23.0)),
                ("c4".into(), claim("p2", 41.6)),
            ]),
            ..Timeline::default()
        };
        let setting = Setting {
            teams: &teams,
            limits: vec![64],
            lending_limits: vec![None],
            team_of: HashMap::from([("a-vision".into(), 0)]),
            jobs: std::slice::from_ref(&job),
            submitted: HashMap::from([("vision-000".into(), ("a-vision".into(), 10.0))]),
            end: 60.0,
        };
        let start = pod_start(&setting, &timeline);
        assert_eq!(start.submitted_to_created, vec![0.5, 1.0]);
        let bound: Vec<f64> = (start.created_to_bound.iter())
            .map(|s| (s * 10.0).round() / 10.0)
            .collect();
        assert_eq!(bound, vec![0.3, 0.5]);
        let claimed: Vec<f64> = (start.created_to_claimed.iter())
            .map(|s| (s * 10.0).round() / 10.0)
            .collect();
        assert_eq!(claimed, vec![0.1, 0.4], "a Pod's first claim");
        assert_eq!(
            (start.claims_for_finished_pods, start.claims),
            (1, 4),
            "c4 came after its Pod succeeded"
        );
        assert!((start.before_created - 12.0).abs() < 1e-9, "{start:?}");
    }

    #[test]
    fn an_evicted_pods_replacement_is_timed_from_its_eviction_to_the_next_pod_of_its_job() {
        let pod = |job: &str, created: f64, bound: Option<f64>| PodTrace {
            namespace: "a-vision".into(),
            job: job.into(),
            gpus: 8,
            created,
            bound,
            ..PodTrace::default()
        };
        let timeline = Timeline {
            pods: HashMap::from([
                // Evicted at 20 s (a DisruptionTarget, then deleted); replaced at 29.4 s, and
                // that replacement evicted at 40 s and replaced at 60 s.
                (
                    "a1".into(),
                    PodTrace {
                        disrupted: Some(20.0),
                        deleting: Some(20.1),
                        ..pod("a", 10.0, Some(10.5))
                    },
                ),
                (
                    "a2".into(),
                    PodTrace {
                        deleting: Some(40.0),
                        ..pod("a", 29.4, Some(30.0))
                    },
                ),
                ("a3".into(), pod("a", 60.0, None)),
                // Succeeded, not evicted; and a Pod deleted before it was bound (not an eviction).
                (
                    "b1".into(),
                    PodTrace {
                        succeeded: Some(30.0),
                        ..pod("b", 10.0, Some(11.0))
                    },
                ),
                ("b2".into(), pod("b", 31.0, None)),
                (
                    "c1".into(),
                    PodTrace {
                        deleting: Some(15.0),
                        ..pod("c", 10.0, None)
                    },
                ),
                ("c2".into(), pod("c", 16.0, None)),
                // Evicted at the end of the run, never replaced.
                (
                    "d1".into(),
                    PodTrace {
                        deleting: Some(55.0),
                        ..pod("d", 10.0, Some(11.0))
                    },
                ),
            ]),
            ..Timeline::default()
        };
        let mut delays: Vec<f64> = (replacement_delays(&timeline).iter())
            .map(|s| (s * 10.0).round() / 10.0)
            .collect();
        delays.sort_by(f64::total_cmp);
        assert_eq!(delays, vec![9.4, 20.0]);
    }

    #[test]
    fn what_a_lending_limit_keeps_idle_is_nobodys_share() {
        // vision (guaranteed 32, lends none of it) wants 8; language wants every device. Of
        // the 128, vision's 24 unused stay idle, so language's share is 96, not 120.
        let teams = crate::workload::teams()[..2].to_vec();
        let setting = bare(&teams, vec![64, 128], vec![Some(0), None], 1.0);
        let (held, demand) = ([vec![8; 10], vec![96; 10]], [vec![8; 10], vec![128; 10]]);
        let kept = fairness_deviations(&setting, &setting.lending_limits, &held, &demand);
        assert_eq!(kept, vec![Deviation::default(); 2]);
        // Counting vision's 24 as language's share, language would seem 24 short, and as
        // many idle.
        let lent = fairness_deviations(&setting, &[None, None], &held, &demand);
        assert!((lent[1].below_beside_idle - 24.0).abs() < 1e-6, "{lent:?}");
        assert_eq!(lent[1].total(), lent[1].below_beside_idle);
    }

    #[test]
    fn a_team_below_its_share_is_told_apart_by_whether_the_devices_were_idle() {
        // vision and language (weights 3 and 3) each want 64: shares of 64. language holds 60
        // throughout; in the first sample the other 4 are idle, in the second vision holds them.
        let teams = crate::workload::teams()[..2].to_vec();
        let setting = bare(&teams, vec![64, 80], vec![None; 2], 1.0);
        let mut vision = vec![64; 10];
        vision[5..].fill(68);
        let held = [vision, vec![60; 10]];
        let demand = [vec![64; 10], vec![64; 10]];
        let deviations = fairness_deviations(&setting, &[None, None], &held, &demand);
        let (vision, language) = (deviations[0], deviations[1]);
        assert_eq!((vision.above, vision.total()), (2.0, 2.0));
        assert_eq!((language.below_beside_idle, language.below), (2.0, 2.0));
        assert_eq!(language.above, 0.0);
    }

    #[test]
    fn water_fills_by_weight_above_the_floors_up_to_the_caps() {
        // 10 devices; a wants 8 at weight 1, b wants 8 at weight 4, c is guaranteed 3.
        let shares = weighted_max_min(10.0, &[0.0, 0.0, 3.0], &[8.0, 8.0, 3.0], &[1.0, 4.0, 1.0]);
        assert!((shares[0] - 1.4).abs() < 1e-6, "{shares:?}");
        assert!((shares[1] - 5.6).abs() < 1e-6, "{shares:?}");
        assert!((shares[2] - 3.0).abs() < 1e-6, "{shares:?}");
    }
}
