use super::*;
use crate::workload::Priority;

fn job(submit_at: f64, pods: u32, gpus_per_pod: u32, run_seconds: f64) -> Job {
    job_of(0, submit_at, pods, gpus_per_pod, run_seconds)
}

fn job_of(team: usize, submit_at: f64, pods: u32, gpus_per_pod: u32, run_seconds: f64) -> Job {
    Job {
        name: format!("j{team}-{submit_at}"),
        team,
        submit_at,
        pods,
        gpus_per_pod,
        run_seconds,
        priority: Priority::Normal,
    }
}

fn team(guaranteed: u32, weight: u32) -> Team {
    Team {
        guaranteed,
        weight,
        ..crate::workload::teams()[0].clone()
    }
}

/// The integral over `[0, window)` of `f` applied to the total of `changes`.
fn integral(changes: &[Change], window: f64, f: impl Fn(i64) -> f64) -> f64 {
    let mut changes = changes.to_vec();
    changes.sort_by(|a, b| a.0.total_cmp(&b.0));
    let (mut total, mut from, mut sum) = (0i64, 0.0, 0.0);
    for (at, _, change) in changes {
        sum += f(total) * (at - from);
        (total, from) = (total + change, at);
    }
    sum + f(total) * (window - from)
}

/// Allocated device-seconds and the ideal's, one team, no bounds, arrival order.
fn open(jobs: &[Job], window: f64) -> (f64, f64) {
    let teams = [team(0, 1)];
    let bounds = Bounds {
        teams: &teams,
        limits: &[CAPACITY],
        lending_limits: &[None],
    };
    let placed = place(jobs, bounds, Queue::Arrival, window);
    let ideal = integral(&placed.demand, window, |d| {
        d.min(i64::from(CAPACITY)) as f64
    });
    (integral(&placed.held, window, |h| h as f64), ideal)
}

/// Two teams, neither with a limit nor a lending limit.
fn unbounded(teams: &[Team]) -> Bounds<'_> {
    Bounds {
        teams,
        limits: &[CAPACITY, CAPACITY],
        lending_limits: &[None, None],
    }
}

/// Each team's devices at `at`.
fn held_at(placed: &Placement, teams: usize, at: f64) -> Vec<i64> {
    let mut held = vec![0; teams];
    for (_, team, change) in placed.held.iter().filter(|c| c.0 <= at) {
        held[*team] += change;
    }
    held
}

#[test]
fn work_that_fits_is_all_allocated() {
    // 16 whole-node Pods for 10 s, then nothing: 128 devices for 10 s, as wanted.
    assert_eq!(open(&[job(0.0, 16, 8, 10.0)], 20.0), (1280.0, 1280.0));
}

#[test]
fn best_fit_keeps_whole_nodes_for_whole_node_pods() {
    // 16 one-GPU Pods fill two nodes, not one GPU of each: the 8-GPU Pod starts at once.
    let mut jobs: Vec<Job> = (0..16).map(|_| job(0.0, 1, 1, 10.0)).collect();
    jobs.push(job(1.0, 1, 8, 5.0));
    let (allocated, ideal) = open(&jobs, 20.0);
    assert_eq!(allocated, 16.0 * 10.0 + 8.0 * 5.0);
    assert_eq!(allocated, ideal);
}

#[test]
fn a_whole_node_pod_waits_while_every_node_keeps_one_small_pod() {
    // 128 one-GPU Pods fill the cluster; on each node one runs 10 s and seven 1 s. An 8-GPU
    // Pod submitted at 2 s fits no node until 10 s, though 112 devices are free.
    let jobs: Vec<Job> = (0..128)
        .map(|i| job(0.0, 1, 1, if i % 8 == 0 { 10.0 } else { 1.0 }))
        .chain([job(2.0, 1, 8, 5.0)])
        .collect();
    let (allocated, ideal) = open(&jobs, 12.0);
    assert_eq!(allocated, 128.0 + 16.0 * 9.0 + 8.0 * 2.0);
    assert_eq!(ideal, 128.0 + 16.0 + 24.0 * 8.0 + 8.0 * 2.0);
}

#[test]
fn a_pod_that_fits_nowhere_does_not_hold_up_the_smaller_ones_behind_it() {
    // 15 nodes taken by 8-GPU Pods and 4 GPUs of the last: a second 8-GPU Pod waits, the
    // 1-GPU Pod after it is bound at once.
    let jobs = vec![
        job(0.0, 15, 8, 10.0),
        job(0.0, 1, 4, 10.0),
        job(1.0, 1, 8, 10.0),
        job(2.0, 1, 1, 10.0),
    ];
    let (allocated, ideal) = open(&jobs, 10.0);
    // 124 devices from 0 s, one more from 2 s; the ideal is capped at 128 from 1 s.
    assert_eq!(allocated, 124.0 * 10.0 + 8.0);
    assert_eq!(ideal, 124.0 + 128.0 * 9.0);
}

#[test]
fn higher_priority_is_bound_first_when_both_wait() {
    // The cluster is full; at 10 s one node frees. The high-priority 4-GPU Pod, submitted
    // after the normal 8-GPU one, takes it, and the normal one then fits nowhere.
    let mut high = job(1.5, 1, 4, 100.0);
    high.priority = Priority::High;
    let jobs = vec![
        job(0.0, 15, 8, 100.0),
        job(0.0, 1, 8, 10.0),
        job(1.0, 1, 8, 100.0),
        high,
    ];
    assert_eq!(open(&jobs, 15.0).0, 128.0 * 10.0 + 124.0 * 5.0);
}

#[test]
fn no_team_goes_above_its_limit_nor_borrows_what_a_lending_limit_keeps() {
    // Team 0 (limit 64) wants the whole cluster; team 1, guaranteed 32 and lending none,
    // wants 8 from 5 s. Team 0 holds 64 and no more, though 64 devices are idle. With a limit
    // of 120, it holds 96: team 1's unused 32 are kept. Team 1's Pod starts at 5 s all the same.
    let teams = [team(0, 1), team(32, 1)];
    let mut jobs: Vec<Job> = (0..16).map(|_| job(0.0, 1, 8, 10.0)).collect();
    jobs.push(job_of(1, 5.0, 1, 8, 10.0));
    for (limit, expected) in [(64, [64, 8]), (120, [96, 8])] {
        let bounds = Bounds {
            teams: &teams,
            limits: &[limit, 32],
            lending_limits: &[None, Some(0)],
        };
        let placed = place(&jobs, bounds, Queue::Arrival, 10.0);
        assert_eq!(held_at(&placed, 2, 6.0), expected, "limit {limit}");
    }
}

#[test]
fn a_fair_queue_splits_by_weight_where_arrival_order_lets_the_first_take_all() {
    // Teams of weights 1 and 3 each want the whole cluster, team 0 first.
    let teams = [team(0, 1), team(0, 3)];
    let jobs = vec![job_of(0, 0.0, 16, 8, 10.0), job_of(1, 0.5, 16, 8, 10.0)];
    let bounds = unbounded(&teams);
    // Both submitted by 0.5 s, nothing bound before 0.5 s under a fair queue either: team 0's
    // Pods came alone at 0 s and took the cluster.
    let late = |at: f64| -> Vec<Job> {
        let mut jobs = jobs.clone();
        jobs[1].submit_at = at;
        jobs
    };
    let arrival = place(&late(0.0), bounds, Queue::Arrival, 5.0);
    assert_eq!(held_at(&arrival, 2, 1.0), [128, 0]);
    let fair = place(&late(0.0), bounds, Queue::FairShare, 5.0);
    assert_eq!(held_at(&fair, 2, 1.0), [32, 96]);
    // Submitted half a second later, team 1 finds every node taken and waits: no eviction.
    let fair = place(&jobs, bounds, Queue::FairShare, 5.0);
    assert_eq!(held_at(&fair, 2, 1.0), [128, 0]);
}

#[test]
fn a_fair_queue_serves_a_team_below_its_guarantee_before_any_weight() {
    // Team 0 is guaranteed 16 at weight 1; team 1 has none, at weight 100. Team 0 gets its 16
    // first, then the weights decide.
    let teams = [team(16, 1), team(0, 100)];
    let jobs = vec![job_of(0, 0.0, 16, 8, 10.0), job_of(1, 0.0, 16, 8, 10.0)];
    let bounds = unbounded(&teams);
    let fair = place(&jobs, bounds, Queue::FairShare, 5.0);
    assert_eq!(held_at(&fair, 2, 1.0), [16, 112]);
}
