//! What the nodes held during a team's longest wait below its guarantee while none of its
//! waiting Pods fitted a node. With what other teams borrowed meanwhile, it tells
//! fragmentation reclaim may not undo (every node also holds devices of teams within their
//! guarantees) from room reclaim could have made and did not. Printed to stderr for a reader of
//! one run; no figure depends on it.

use std::collections::BTreeMap;

use crate::metrics::{MOVE_PAID_OFF, STEP, Setting, ended, move_note, moved_for_team};
use crate::observe::{PodTrace, Seconds, Timeline};
use crate::workload::{GPUS_PER_NODE, GRACE_SECONDS};

/// Waits shorter than this are left out: reclaim's grace.
const SHORTEST: Seconds = GRACE_SECONDS as Seconds;

/// Prints, per team, its longest such wait and, at its middle, each node's devices by team.
/// `no_node[team][sample]`: none of the team's waiting Pods fitted the free devices of a node.
pub fn print_longest_no_node_waits(
    setting: &Setting,
    timeline: &Timeline,
    held: &[Vec<u32>],
    demand: &[Vec<u32>],
    no_node: &[Vec<bool>],
) {
    let samples = held.first().map_or(0, Vec::len);
    for (t, team) in setting.teams.iter().enumerate() {
        let lacks = |i: usize| demand[t][i].min(team.guaranteed).saturating_sub(held[t][i]);
        let borrowed = |i: usize| -> u32 {
            (setting.teams.iter().enumerate())
                .filter(|&(u, _)| u != t)
                .map(|(u, other)| held[u][i].saturating_sub(other.guaranteed))
                .sum()
        };
        let stuck = |i: usize| no_node[t][i] && lacks(i) > 0;
        let Some((from, until)) = longest_run(samples, stuck) else {
            continue;
        };
        let (start, end) = (from as f64 * STEP, until as f64 * STEP);
        if end - start < SHORTEST {
            continue;
        }
        let middle = (from + until) / 2;
        let at = middle as f64 * STEP;
        let waiting: Vec<String> = (timeline.pods.values())
            .filter(|p| setting.team_of.get(&p.namespace) == Some(&t))
            .filter(|p| p.created <= at && p.bound.is_none_or(|b| b > at) && at < ended(p))
            .map(|p| format!("{} ({} GPUs, since {:.1} s)", p.name, p.gpus, p.created))
            .collect();
        eprintln!(
            "replay: {}: longest wait below its guarantee with no node for its Pods: \
             {start:.1}-{end:.1} s; at {at:.1} s it held {} and lacked {}, others borrowed {}; \
             waiting: {}",
            team.name,
            held[t][middle],
            lacks(middle),
            borrowed(middle),
            waiting.join(", ")
        );
        print_jobs_without_a_waiting_pod(setting, timeline, t, at);
        for (node, by_team) in holdings_at(setting, timeline, at) {
            let used: u32 = by_team.values().sum();
            let teams: Vec<String> = (by_team.iter())
                .map(|(&u, devices)| {
                    let other = &setting.teams[u];
                    let above = held[u][middle].saturating_sub(other.guaranteed);
                    format!("{} {devices} (above its guarantee by {above})", other.name)
                })
                .collect();
            eprintln!(
                "replay:   {node}: {} free; {}",
                GPUS_PER_NODE.saturating_sub(used),
                teams.join(", ")
            );
        }
        for pod in timeline.pods.values() {
            if let Some(evicted) = pod.disrupted.filter(|&d| start <= d && d <= end) {
                let owner = setting
                    .team_of
                    .get(&pod.namespace)
                    .map(|&u| setting.teams[u].name);
                eprintln!(
                    "replay:   evicted meanwhile at {evicted:.1} s: {}/{} ({}, {} GPUs)",
                    pod.namespace,
                    pod.name,
                    owner.unwrap_or("?"),
                    pod.gpus
                );
            }
        }
    }
}

/// The team's Jobs submitted and not done at `at` with none of their Pods alive then: demand
/// the team counts while no Pod of it can wait for a node (its controller has not made them
/// yet, or made them again after an eviction). Each with its Pods' history.
fn print_jobs_without_a_waiting_pod(
    setting: &Setting,
    timeline: &Timeline,
    team: usize,
    at: Seconds,
) {
    for job in setting.jobs.iter().filter(|j| j.team == team) {
        let Some((namespace, submitted)) = setting.submitted.get(&job.name) else {
            continue;
        };
        let pods: Vec<&PodTrace> = (timeline.pods.values())
            .filter(|p| p.namespace == *namespace && p.job == job.name)
            .collect();
        let succeeded = pods.iter().filter(|p| p.succeeded.is_some_and(|s| s <= at));
        let alive = pods.iter().any(|p| p.created <= at && at < ended(p));
        if *submitted > at || succeeded.count() >= job.pods as usize || alive {
            continue;
        }
        let history: Vec<String> = (pods.iter())
            .map(|p| {
                let when = |t: Option<Seconds>| t.map_or("-".to_owned(), |t| format!("{t:.1}"));
                format!(
                    "{} created {:.1}, bound {}, ended {}",
                    p.name,
                    p.created,
                    when(p.bound),
                    when(Some(ended(p)).filter(|e| e.is_finite()))
                )
            })
            .collect();
        eprintln!(
            "replay:   wanted without a Pod alive: {} ({} x {} GPUs, submitted {submitted:.1} s); \
             its Pods: {}",
            job.name,
            job.pods,
            job.gpus_per_pod,
            if history.is_empty() {
                "none".to_owned()
            } else {
                history.join("; ")
            }
        );
    }
}

/// The longest run of consecutive samples where `holds`, as [from, until).
fn longest_run(samples: usize, holds: impl Fn(usize) -> bool) -> Option<(usize, usize)> {
    let mut longest: Option<(usize, usize)> = None;
    let mut start = None;
    for i in 0..=samples {
        if i < samples && holds(i) {
            start.get_or_insert(i);
        } else if let Some(s) = start.take()
            && longest.is_none_or(|(a, b)| i - s > b - a)
        {
            longest = Some((s, i));
        }
    }
    longest
}

/// Per node with devices allocated at `at`, the devices by team index.
fn holdings_at(
    setting: &Setting,
    timeline: &Timeline,
    at: Seconds,
) -> BTreeMap<String, BTreeMap<usize, u32>> {
    let mut nodes = BTreeMap::<String, BTreeMap<usize, u32>>::new();
    for claim in timeline.claims.values() {
        let node = (claim.pod.as_deref())
            .and_then(|uid| timeline.pods.get(uid))
            .and_then(|pod| pod.node.clone());
        let (Some(node), Some(&team)) = (node, setting.team_of.get(&claim.namespace)) else {
            continue;
        };
        let devices = (claim.allocated.iter().rev())
            .find(|(from, _)| *from <= at)
            .map_or(0, |&(_, devices)| devices);
        if devices > 0 {
            *nodes.entry(node).or_default().entry(team).or_default() += devices;
        }
    }
    nodes
}

/// Prints a move after which the waiting team's Pod was not bound on the node the moved Pod
/// (`pod`, gone at `ended`) left within [`MOVE_PAID_OFF`]: what was bound there instead, and
/// where the waiting team's Pods were bound meanwhile.
pub fn unpaid_move(setting: &Setting, timeline: &Timeline, pod: &PodTrace, ended: Seconds) {
    let (Some(note), Some(node)) = (move_note(timeline, pod), pod.node.as_deref()) else {
        return;
    };
    let waiting = moved_for_team(setting, note);
    let name = |t: Option<usize>| t.map_or("?", |t| setting.teams[t].name);
    let within = |p: &PodTrace| {
        p.bound
            .is_some_and(|b| b >= ended && b <= ended + MOVE_PAID_OFF)
    };
    let mut there: Vec<(Seconds, String)> = Vec::new();
    let mut elsewhere: Vec<(Seconds, String)> = Vec::new();
    let held: BTreeMap<usize, u32> = (holdings_at(setting, timeline, ended).into_values())
        .flatten()
        .fold(BTreeMap::new(), |mut held, (team, devices)| {
            *held.entry(team).or_default() += devices;
            held
        });
    for (uid, p) in timeline.pods.iter().filter(|(_, p)| within(p)) {
        let team = setting.team_of.get(&p.namespace).copied();
        let bound = p.bound.unwrap_or(ended);
        let what = format!(
            "{} {} ({} GPUs) at {bound:.1} s",
            name(team),
            p.name,
            p.gpus
        );
        if p.node.as_deref() == Some(node) {
            // Whether the team that took the room was owed it: what it held when the moved Pod
            // went, against its guarantee, and when its claim was made.
            let claimed = (timeline.claims.values())
                .filter(|c| c.pod.as_deref() == Some(uid.as_str()))
                .map(|c| c.created)
                .min_by(f64::total_cmp);
            let owed = team.map_or(String::new(), |t| {
                format!(
                    " (its team held {} of its guarantee of {} then; claim made at {})",
                    held.get(&t).copied().unwrap_or(0),
                    setting.teams[t].guaranteed,
                    claimed.map_or("?".to_owned(), |c| format!("{c:.1} s")),
                )
            });
            there.push((bound, what + &owed));
        } else if team.is_some() && team == waiting {
            let on = p.node.as_deref().unwrap_or("?");
            elsewhere.push((bound, format!("{what} on {on}")));
        }
    }
    there.sort_by(|a, b| a.0.total_cmp(&b.0));
    elsewhere.sort_by(|a, b| a.0.total_cmp(&b.0));
    let list = |v: Vec<(Seconds, String)>| {
        let v: Vec<String> = v.into_iter().map(|(_, w)| w).collect();
        if v.is_empty() {
            "none".to_owned()
        } else {
            v.join(", ")
        }
    };
    eprintln!(
        "replay: move not followed by {}'s Pod on {node}: {}/{} ({} GPUs) gone at {ended:.1} s; \
         bound there within {MOVE_PAID_OFF} s: {}; {}'s Pods bound elsewhere: {}",
        name(waiting),
        pod.namespace,
        pod.name,
        pod.gpus,
        list(there),
        name(waiting),
        list(elsewhere),
    );
}

#[cfg(test)]
mod tests {
    use super::longest_run;

    #[test]
    fn the_longest_run_is_found_wherever_it_lies() {
        let series = [false, true, true, false, true, true, true];
        assert_eq!(longest_run(series.len(), |i| series[i]), Some((4, 7)));
        let series = [true, true, false, true];
        assert_eq!(longest_run(series.len(), |i| series[i]), Some((0, 2)));
        assert_eq!(longest_run(3, |_| false), None);
    }
}
