//! Moves: room on one node for a waiting team's claim, within its guarantee, when the free
//! devices are spread so thin that no node holds the claim and no team borrows what the waiting
//! team lacks. Pure.
//!
//! Measured on the replay: 23 devices free, nobody above its guarantee, and a team's 8-device
//! Pod waiting 18 s, because 1-device Pods of teams within their guarantees sat one on each of
//! three otherwise empty nodes. Nobody owes anything back, so reclaim has no borrower to take
//! from. A workload that its controller makes again and that fits another node's free devices
//! can be moved instead: evicted, it runs again elsewhere, its team keeps its share, and the node
//! it leaves has room for the claim.
//!
//! Per claim (largest first), the node where moving workloads makes room at the least cost:
//! lowest priority first, then the fewest devices moved, then the most recently started (the
//! least work lost). Each moved workload must fit the free devices of the other nodes (the
//! fullest that holds it, the claim's node left out), and that room counts as taken. Only
//! workloads of other teams, with every device on that one node, every Pod movable
//! ([`super::workload::PodView::movable`]), and that have run for the minimum runtime.

use std::cmp::Reverse;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::jiff::Timestamp;

use super::kept::{PassBudgets, choose_within_budgets};
use super::nodes::{self, Free, MOST_WEIGHED, fit};
use super::victims::{Borrower, Choice, eligible_at, runtime};
use super::workload::{Workload, workloads};
use super::{
    EvictionWhy, ReclaimDefaults, ReclaimInput, ReclaimTracker, Reclaimed, TeamInPlan, eviction,
};
use crate::core::plan::inventory::DeviceId;
use crate::core::plan::placement::Placement;
use crate::core::plan::{Plan, ReclaimOrder, objects};

/// How long a moved workload is not moved again: its Pods made again may land on the node it
/// left before the waiting claim's Pod does (a scheduler that spreads Pods prefers the emptiest
/// node), and moving it again and again would only lose its work.
pub const MOVED_AGAIN_AFTER: Duration = Duration::from_secs(600);

/// The claims within each team's guarantee that fit no node, per (sharing policy, team), for
/// the teams no reclaim is ordered for (nobody borrows what they lack): what moves are for.
pub(super) fn fragmented<'p, V>(
    plan: &'p Plan,
    owed: &BTreeMap<(String, String), V>,
) -> BTreeMap<(String, String), (&'p Placement, &'p [u32])> {
    (plan.placements.iter())
        .flat_map(|p| {
            (p.unplaced.iter()).map(move |(team, claims)| {
                (
                    (p.sharing_policy.clone(), team.clone()),
                    (p, claims.as_slice()),
                )
            })
        })
        .filter(|(key, _)| !owed.contains_key(key))
        .collect()
}

impl ReclaimTracker {
    /// The moves due at `now` (`wall` on the Pods' clock): for every `fragmented` team that
    /// reclaims and has waited its grace period, the workloads of other teams whose moves give
    /// its claims room ([`choose_moves`]), within what the budgets allow. Not one asked for
    /// already in this pass, nor one moved in the last [`MOVED_AGAIN_AFTER`].
    pub(super) fn move_for(
        &mut self,
        input: ReclaimInput<'_>,
        fragmented: &BTreeMap<(String, String), (&Placement, &[u32])>,
        defaults: ReclaimDefaults,
        (now, wall): (Instant, Timestamp),
        budgets: &mut PassBudgets<'_>,
        out: &mut Reclaimed,
    ) {
        (self.moved).retain(|_, at| now.duration_since(*at) < MOVED_AGAIN_AFTER);
        for ((policy, team), (placement, claims)) in fragmented {
            let Some((_, min_runtime)) = self.due(input, defaults, (policy, team), now) else {
                continue;
            };
            let node_of = |id: &DeviceId| nodes::node_of(placement, id);
            let class = objects::device_class_name(policy);
            let mut others: Vec<Borrower> = (input.plan.teams.iter())
                .filter(|t| t.name != *team)
                .map(|t| Borrower {
                    team: t.name.clone(),
                    owes: 0,
                    above_guarantee: 0,
                    workloads: workloads(
                        input.pods,
                        input.claims,
                        &t.namespaces,
                        (&class, &node_of),
                    ),
                    queued: Vec::new(),
                })
                .collect();
            self.count_in_flight(input.pods, &mut others, now);
            self.pass_over_refused(&mut others, now);
            for other in &mut others {
                (other.workloads).retain(|w| w.terminating || !self.moved.contains_key(&w.name));
            }
            let free = nodes::free_of(placement);
            let wanted: u64 = claims.iter().copied().map(u64::from).sum();
            let choose = |others: &[Borrower]| {
                (
                    wanted,
                    choose_moves(others, &free, claims, min_runtime, wall),
                )
            };
            let (_, choice, _) = choose_within_budgets(&mut others, budgets, &choose);
            if let Some(at) = choice.eligible_at {
                let wait = (at.as_second() - wall.as_second()).max(0);
                self.wake_at(now + Duration::from_secs(wait.unsigned_abs()));
            }
            let waiting_namespaces = TeamInPlan::of(input.plan, team).namespaces;
            let taken: Vec<_> = out.evictions.iter().map(|e| e.pods.clone()).collect();
            for (t, w) in &choice.evict {
                let order = ReclaimOrder {
                    sharing_policy: policy.clone(),
                    borrower: others[*t].team.clone(),
                    devices: u32::try_from(wanted).unwrap_or(u32::MAX),
                    for_team: team.clone(),
                };
                let e = eviction(input, order, w, (waiting_namespaces, EvictionWhy::Move));
                if !taken.contains(&e.pods) {
                    self.moved.insert(w.name.clone(), now);
                    out.evictions.push(e);
                }
            }
        }
    }
}

/// How a set of moved workloads ranks for one claim: lower is better.
type Cost = (i32, u64, Reverse<Timestamp>, Reverse<String>);

/// The cheapest moves on one node: their cost, the workloads (team, index), and the free
/// devices per node after them.
type Best = (Cost, Vec<(usize, usize)>, Free);

/// Which of the `teams`' workloads to move so that each of `claims` (devices per claim, largest
/// first) fits a node, given the `free` devices per node, at `now` with a minimum runtime of
/// `min_runtime` seconds. `Choice::evict` names the workloads with their team's index;
/// `Choice::uncovered` is the devices of the claims that still fit nowhere.
pub fn choose_moves(
    teams: &[Borrower],
    free: &Free,
    claims: &[u32],
    min_runtime: u64,
    now: Timestamp,
) -> Choice {
    let mut free = free.clone();
    let mut taken: Vec<Vec<bool>> = (teams.iter())
        .map(|t| t.workloads.iter().map(|w| w.terminating).collect())
        .collect();
    let mut choice = Choice::default();
    // Workloads being deleted (one moved in an earlier pass, say): their devices are on their
    // way back, on their nodes.
    for w in teams
        .iter()
        .flat_map(|t| &t.workloads)
        .filter(|w| w.terminating)
    {
        choice.in_flight += w.devices;
        for (node, devices) in &w.nodes {
            *free.entry(node.clone()).or_default() += devices;
        }
    }
    for &size in claims {
        let size = u64::from(size);
        if let Some(node) = fit(&mut free, size) {
            choice.placed.push((size, node));
            continue;
        }
        let best = (nodes_with_movable(teams, &taken).into_iter())
            .filter_map(|node| {
                let (cost, picked, after) =
                    best_on(teams, &taken, &free, &node, size, (min_runtime, now))?;
                Some((cost, node, picked, after))
            })
            .min_by(|a, b| a.0.cmp(&b.0).then_with(|| a.1.cmp(&b.1)));
        let Some((_, node, picked, after)) = best else {
            choice.uncovered += size;
            continue;
        };
        for (t, i) in picked {
            taken[t][i] = true;
            let w = &teams[t].workloads[i];
            choice.freed += w.devices;
            choice.evict.push((t, w.clone()));
        }
        free = after;
        choice.placed.push((size, Some(node)));
    }
    if choice.uncovered > 0 {
        choice.eligible_at = (teams.iter().flat_map(|t| &t.workloads))
            .filter(|w| on_one_node(w).is_some() && runtime(w, now) < min_runtime)
            .map(|w| eligible_at(w, min_runtime, now))
            .min();
    }
    choice
}

/// The node all of `w`'s devices are on, if it is movable and holds devices on exactly one.
fn on_one_node(w: &Workload) -> Option<&Arc<str>> {
    match w.nodes.as_slice() {
        [(Some(node), devices)] if w.movable && !w.terminating && *devices > 0 => Some(node),
        _ => None,
    }
}

/// The nodes a movable workload not taken yet sits on.
fn nodes_with_movable(teams: &[Borrower], taken: &[Vec<bool>]) -> Vec<Arc<str>> {
    let mut nodes: Vec<Arc<str>> = (teams.iter().enumerate())
        .flat_map(|(t, team)| {
            (team.workloads.iter().enumerate())
                .filter(move |(i, _)| !taken[t][*i])
                .filter_map(|(_, w)| on_one_node(w).cloned())
        })
        .collect();
    nodes.sort();
    nodes.dedup();
    nodes
}

/// The workloads on `node` whose moves make room for `size` devices there at the least [`Cost`],
/// with that cost and the free devices per node afterwards (the claim placed, the workloads
/// placed elsewhere); `None` when no set of them does.
fn best_on(
    teams: &[Borrower],
    taken: &[Vec<bool>],
    free: &Free,
    node: &Arc<str>,
    size: u64,
    (min_runtime, now): (u64, Timestamp),
) -> Option<Best> {
    let here = Some(node.clone());
    let free_here = free.get(&here).copied().unwrap_or(0);
    let need = size.saturating_sub(free_here);
    let workload = |&(t, i): &(usize, usize)| &teams[t].workloads[i];
    let mut candidates: Vec<(usize, usize)> = (teams.iter().enumerate())
        .flat_map(|(t, team)| (0..team.workloads.len()).map(move |i| (t, i)))
        .filter(|&(t, i)| {
            let w = &teams[t].workloads[i];
            !taken[t][i] && on_one_node(w) == Some(node) && runtime(w, now) >= min_runtime
        })
        .collect();
    // Lowest priority, most recently started first (of equals, the last name).
    candidates.sort_by_key(|c| {
        let w = workload(c);
        let started = Reverse(w.started.unwrap_or(Timestamp::MAX));
        (w.priority, started, Reverse(w.name.clone()))
    });
    candidates.truncate(MOST_WEIGHED);
    if candidates.iter().map(|c| workload(c).devices).sum::<u64>() < need {
        return None;
    }
    let mut best: Option<(Cost, u32, Free)> = None;
    for mask in 1u32..(1 << candidates.len()) {
        let set: Vec<&Workload> = (candidates.iter().enumerate())
            .filter(|(k, _)| mask & (1 << k) != 0)
            .map(|(_, c)| workload(c))
            .collect();
        let moved: u64 = set.iter().map(|w| w.devices).sum();
        if moved < need {
            continue;
        }
        let Some(after) = placed_elsewhere(free, &here, &set) else {
            continue;
        };
        let cost = (
            set.iter().map(|w| w.priority).max().unwrap_or(0),
            moved,
            Reverse((set.iter().filter_map(|w| w.started).min()).unwrap_or(Timestamp::MAX)),
            Reverse(set.iter().map(|w| w.name.clone()).min().unwrap_or_default()),
        );
        if best.as_ref().is_none_or(|(b, _, _)| cost < *b) {
            let mut after = after;
            after.insert(here.clone(), free_here + moved - size);
            best = Some((cost, mask, after));
        }
    }
    let (cost, mask, after) = best?;
    let picked = (candidates.iter().enumerate())
        .filter(|(k, _)| mask & (1 << k) != 0)
        .map(|(_, c)| *c)
        .collect();
    Some((cost, picked, after))
}

/// The free devices per node once each of `moved` (largest first) is placed on a node other
/// than `from`; `None` when one fits nowhere.
fn placed_elsewhere(free: &Free, from: &Option<Arc<str>>, moved: &[&Workload]) -> Option<Free> {
    let mut elsewhere = free.clone();
    let left_out = elsewhere.remove(from);
    let mut sizes: Vec<u64> = moved.iter().map(|w| w.devices).collect();
    sizes.sort_unstable_by(|a, b| b.cmp(a));
    for size in sizes {
        fit(&mut elsewhere, size)?;
    }
    if let Some(f) = left_out {
        elsewhere.insert(from.clone(), f);
    }
    Some(elsewhere)
}
