//! What the workload and a configuration allow: the same jobs placed by a scheduler with no
//! latency at all (no control plane, no claim to make, no queue to wait in), to tell how much
//! of the gap between the replay's figures and the ideal is the shape of the work (8-GPU Pods
//! need a whole node, and small Pods that finish at different times leave nodes partly used)
//! and how much the time a real cluster takes to make claims and bind Pods. Pure: no client,
//! no clock.
//!
//! The reference scheduler binds instantly: at every arrival and completion it takes the
//! waiting Pods in the order of its [`Queue`] and binds each that fits on the fullest node with
//! room (best fit, what kube-scheduler does with the replay's `--scoring packing`); a Pod that
//! fits nowhere waits without holding up the Pods behind it. It keeps to the configuration's
//! hard bounds: no team above its limit, and no team's guarantee lent beyond its lending limit
//! (serving's idle devices stay idle). It never evicts, so a team holds what it was given until
//! its Pods finish. It is not an upper bound for every scheduler (one that held free devices
//! back for a large waiting Pod could do better for it, one that evicts could follow the fair
//! shares closer), only a reference without the cluster's latencies.

use std::cmp::Reverse;

use crate::observe::Seconds;
use crate::workload::{CAPACITY, GPUS_PER_NODE, Job, NODES, Team};

/// The order in which the reference scheduler takes the waiting Pods.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Queue {
    /// Higher PriorityClass first, then earlier submission: kube-scheduler's queue.
    Arrival,
    /// The team furthest below its guarantee first, then the one holding the least for its
    /// weight (what it would hold with the Pod, divided by its weight), then as [`Queue::Arrival`]:
    /// a weighted fair queue.
    FairShare,
}

/// The configuration's hard bounds, by team index.
#[derive(Debug, Clone, Copy)]
pub struct Bounds<'a> {
    pub teams: &'a [Team],
    /// Each team's limit (`CAPACITY` when there is none).
    pub limits: &'a [u32],
    /// Each team's lending limit, if it has one.
    pub lending_limits: &'a [Option<u32>],
}

impl Bounds<'_> {
    /// Whether `team` may hold `gpus` more, given what every team holds: within its limit, and
    /// what the lending limits keep idle (guarantees neither held nor lent) still free.
    fn allow(&self, held: &[u32], team: usize, gpus: u32) -> bool {
        let after = |t: usize| held[t] + if t == team { gpus } else { 0 };
        let kept: u32 = (0..held.len())
            .filter_map(|t| {
                let unused = self.teams[t].guaranteed.saturating_sub(after(t));
                Some(unused.saturating_sub(self.lending_limits[t]?))
            })
            .sum();
        after(team) <= self.limits[team] && held.iter().sum::<u32>() + gpus + kept <= CAPACITY
    }
}

/// A change of one team's devices: (when, team, devices added or, negative, given back).
pub type Change = (Seconds, usize, i64);

/// What the reference run did, as changes per team (what `metrics::step_series` takes).
#[derive(Debug, Default, PartialEq)]
pub struct Placement {
    /// The team's allocated devices.
    pub held: Vec<Change>,
    /// The devices of its submitted Pods that have not finished.
    pub demand: Vec<Change>,
}

/// A Pod of a job, waiting for a node.
#[derive(Debug, Clone, Copy)]
struct Waiting {
    team: usize,
    gpus: u32,
    run_seconds: f64,
    priority: Reverse<i32>,
    submit_at: f64,
}

/// Places `jobs` with no latency within `bounds`, in the order of `queue`, until `window`.
pub fn place(jobs: &[Job], bounds: Bounds, queue: Queue, window: Seconds) -> Placement {
    let mut arrivals: Vec<Waiting> = (jobs.iter())
        .flat_map(|job| {
            let pod = Waiting {
                team: job.team,
                gpus: job.gpus_per_pod,
                run_seconds: job.run_seconds,
                priority: Reverse(job.priority.value()),
                submit_at: job.submit_at,
            };
            (0..job.pods).map(move |_| pod)
        })
        .collect();
    arrivals.sort_by(|a, b| a.submit_at.total_cmp(&b.submit_at));
    let mut arrivals = arrivals.into_iter().peekable();
    let mut free = vec![GPUS_PER_NODE; NODES as usize];
    let mut held = vec![0u32; bounds.teams.len()];
    // (ends at, node, team, devices) of every Pod bound and not finished.
    let mut running: Vec<(f64, usize, usize, u32)> = Vec::new();
    let mut waiting: Vec<Waiting> = Vec::new();
    let mut out = Placement::default();
    let mut now = 0.0;
    while now < window {
        for &(_, node, team, gpus) in running.iter().filter(|r| r.0 <= now) {
            free[node] += gpus;
            held[team] -= gpus;
            out.held.push((now, team, -i64::from(gpus)));
            out.demand.push((now, team, -i64::from(gpus)));
        }
        running.retain(|r| r.0 > now);
        while let Some(pod) = arrivals.next_if(|p| p.submit_at <= now) {
            out.demand.push((now, pod.team, i64::from(pod.gpus)));
            waiting.push(pod);
        }
        // The first waiting Pod, in the queue's order, that the bounds allow and a node fits.
        while let Some((index, node)) = (waiting.iter().enumerate())
            .filter(|(_, pod)| bounds.allow(&held, pod.team, pod.gpus))
            .filter_map(|(i, pod)| best_fit(&free, pod.gpus).map(|node| (i, node)))
            .min_by(|(a, _), (b, _)| {
                let (a, b) = (&waiting[*a], &waiting[*b]);
                let (key_a, key_b) = (
                    queue_key(queue, bounds, &held, a),
                    queue_key(queue, bounds, &held, b),
                );
                (key_a.0.cmp(&key_b.0))
                    .then(key_a.1.total_cmp(&key_b.1))
                    .then(a.priority.cmp(&b.priority))
                    .then(a.submit_at.total_cmp(&b.submit_at))
            })
        {
            let pod = waiting.remove(index);
            free[node] -= pod.gpus;
            held[pod.team] += pod.gpus;
            out.held.push((now, pod.team, i64::from(pod.gpus)));
            running.push((now + pod.run_seconds, node, pod.team, pod.gpus));
        }
        now = (running.iter().map(|r| r.0))
            .chain(arrivals.peek().map(|p| p.submit_at))
            .fold(window, f64::min);
    }
    out
}

/// The node with the fewest free devices that still fits `gpus` (the first of equals).
fn best_fit(free: &[u32], gpus: u32) -> Option<usize> {
    (0..free.len())
        .filter(|&n| free[n] >= gpus)
        .min_by_key(|&n| free[n])
}

/// A Pod's place in `queue` before priority and submission (lower first): (0, 0) for
/// [`Queue::Arrival`]; for [`Queue::FairShare`], whether its team already holds its guarantee,
/// then what the team would hold with the Pod per unit of weight.
fn queue_key(queue: Queue, bounds: Bounds, held: &[u32], pod: &Waiting) -> (u8, f64) {
    match queue {
        Queue::Arrival => (0, 0.0),
        Queue::FairShare => {
            let team = &bounds.teams[pod.team];
            let after = held[pod.team] + pod.gpus;
            let level = f64::from(after) / f64::from(team.weight.max(1));
            (u8::from(held[pod.team] >= team.guaranteed), level)
        }
    }
}

#[cfg(test)]
mod tests;
