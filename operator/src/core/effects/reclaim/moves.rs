//! Moves: room on one node for a waiting team's claim, within its guarantee, when the free
//! devices are spread so thin that no node holds the claim, and the borrowers' workloads alone
//! (reclaim, [`super::nodes`]) clear none either. Pure.
//!
//! Measured on the replay: 23 devices free, nobody above its guarantee, and a team's 8-device
//! Pod waiting 18 s, because 1-device Pods of teams within their guarantees sat one on each of
//! three otherwise empty nodes. Nobody owes anything back, so reclaim has no borrower to take
//! from. A workload that its controller makes again and that fits another node's free devices
//! can be moved instead: evicted, it runs again elsewhere, its team keeps its share, and the node
//! it leaves has room for the claim.
//!
//! Per claim (largest first), the node where moving workloads makes room at the least cost:
//! lowest priority first, then the fewest devices moved, then those evicted fewer times before
//! (the shorter wait for their controller to make them again), then the most recently started
//! (the least work lost). Each moved workload must fit the free devices of the other nodes (the
//! fullest that holds it, the claim's node left out), and that room counts as taken. Only
//! workloads of other teams, with every device on that one node, every Pod movable
//! ([`super::workload::PodView::movable`]), and that have run for the minimum runtime.
//!
//! A borrower's workload on the node is taken back instead of moved, while its team holds it
//! above its effective guarantee: it need not fit elsewhere (and need not be movable). Measured
//! on the replay: vision 24 short, research 9 above its guarantee, but research's 6 devices on a
//! node shared it with two 1-device Pods of teams within their guarantees, so reclaim alone
//! cleared no node and said `ReclaimBlocked` while 24 devices sat idle.

use std::cmp::Reverse;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::jiff::Timestamp;

use super::kept::{PassBudgets, choose_within_budgets};
use super::nodes::{self, Free, MOST_WEIGHED, fit};
use super::victims::{Borrower, Choice, eligible_at, runtime};
use super::workload::{NodeOf, Workload, workloads};
use super::{
    EvictionWhy, ReclaimDefaults, ReclaimInput, ReclaimTracker, Reclaimed, TeamInPlan,
    above_guarantee, eviction, queued_if_borrowed, queued_of, quota_of,
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
    /// The moves due at `now` (`wall` on the Pods' clock) for every `fragmented` team that
    /// reclaims and has waited its grace period ([`Self::make_room`]).
    pub(super) fn move_for(
        &mut self,
        input: ReclaimInput<'_>,
        fragmented: &BTreeMap<(String, String), (&Placement, &[u32])>,
        defaults: ReclaimDefaults,
        (now, wall): (Instant, Timestamp),
        budgets: &mut PassBudgets<'_>,
        out: &mut Reclaimed,
    ) {
        for ((policy, team), unplaced) in fragmented {
            let Some((_, min_runtime)) = self.due(input, defaults, (policy, team), now) else {
                continue;
            };
            let waiting = Waiting {
                policy,
                team,
                unplaced: *unplaced,
                min_runtime,
            };
            self.make_room(input, waiting, (now, wall), &[], budgets, out);
        }
    }

    /// Room on a node for the waiting team's unplaced claims: the workloads of other teams to
    /// evict ([`choose_moves`]), within what the budgets allow, added to `out`. Not one asked
    /// for already in this pass (those `freeing` it, its own reclaim's, count as on their way
    /// out), nor one moved in the last [`MOVED_AGAIN_AFTER`]. Gives the choice: what is still
    /// uncovered, and when a workload too young now may go.
    pub(super) fn make_room(
        &mut self,
        input: ReclaimInput<'_>,
        waiting: Waiting<'_>,
        (now, wall): (Instant, Timestamp),
        freeing: &[Vec<(String, String)>],
        budgets: &mut PassBudgets<'_>,
        out: &mut Reclaimed,
    ) -> Choice {
        let Waiting {
            policy,
            team,
            unplaced: (placement, claims),
            min_runtime,
        } = waiting;
        let node_of = |id: &DeviceId| nodes::node_of(placement, id);
        let taken: Vec<Vec<(String, String)>> =
            out.evictions.iter().map(|e| e.pods.clone()).collect();
        let is_any =
            |pods: &[Vec<(String, String)>], w: &Workload| pods.iter().any(|p| w.has_pods(p));
        let mut others = other_teams(input, (policy, team), &node_of);
        self.count_in_flight(input.pods, &mut others, now);
        self.pass_over_refused(&mut others, now);
        for other in &mut others {
            (other.workloads).retain_mut(|w| {
                if is_any(freeing, w) {
                    w.terminating = true;
                    return true;
                }
                !is_any(&taken, w) && (w.terminating || !self.moved.contains_key(&w.name))
            });
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
        self.wake_when_eligible(choice.eligible_at, (now, wall));
        let waiting_namespaces = TeamInPlan::of(input.plan, team).namespaces;
        let order = |other: &str| ReclaimOrder {
            sharing_policy: policy.to_owned(),
            borrower: other.to_owned(),
            devices: u32::try_from(wanted).unwrap_or(u32::MAX),
            for_team: team.to_owned(),
        };
        if !choice.evict.is_empty() {
            let queued = self.dequeue(input, queued_of(&others), &order, waiting_namespaces);
            (out.evictions).extend(queued.into_iter().filter(|e| !taken.contains(&e.pods)));
        }
        for (k, (t, w)) in choice.evict.iter().enumerate() {
            let order = order(&others[*t].team);
            let why = if choice.moved.contains(&k) {
                self.moved.insert(w.name.clone(), now);
                EvictionWhy::Move
            } else {
                EvictionWhy::Reclaim
            };
            out.evictions
                .push(eviction(input, order, w, (waiting_namespaces, why)));
        }
        choice
    }
}

/// The teams other than the waiting `team`, each with its workloads holding devices of
/// `policy`, what it holds above its effective guarantee, and, for a team that holds its
/// guarantee, its workloads queued for room (they would take the room made first).
fn other_teams(
    input: ReclaimInput<'_>,
    (policy, team): (&str, &str),
    node_of: NodeOf,
) -> Vec<Borrower> {
    let class = objects::device_class_name(policy);
    (input.plan.teams.iter())
        .filter(|t| t.name != *team)
        .map(|t| Borrower {
            team: t.name.clone(),
            owes: 0,
            above_guarantee: above_guarantee(quota_of(t, policy)),
            workloads: workloads(input.pods, input.claims, &t.namespaces, (&class, &node_of)),
            queued: queued_if_borrowed(input, t, (policy, &class)),
        })
        .collect()
}

/// A team waiting for room on a node: its sharing policy, its name, its placement and the claims
/// in it that fit no node, and its minimum runtime (seconds).
#[derive(Clone, Copy)]
pub(super) struct Waiting<'a> {
    pub policy: &'a str,
    pub team: &'a str,
    pub unplaced: (&'a Placement, &'a [u32]),
    pub min_runtime: u64,
}

/// How a set of evicted workloads ranks for one claim: lower is better.
type Cost = (i32, u64, u32, Reverse<Timestamp>, Reverse<String>);

/// One workload weighed for a node: its team's index and its own.
type Candidate = (usize, usize);

/// The cheapest evictions on one node: their cost, the workloads with whether each is moved
/// (else taken back from its borrower), and the free devices per node after them.
type Best = (Cost, Vec<(Candidate, bool)>, Free);

/// Which of the `teams`' workloads to evict so that each of `claims` (devices per claim, largest
/// first) fits a node, given the `free` devices per node, at `now` with a minimum runtime of
/// `min_runtime` seconds. A workload is taken back when its team holds it above its guarantee
/// (`Borrower::above_guarantee`, what is left of it), else moved: it must fit the free devices
/// of another node. `Choice::evict` names the workloads with their team's index, `Choice::moved`
/// which of them move; `Choice::uncovered` is the devices of the claims that still fit nowhere.
/// Workloads being deleted count as free room on their nodes (and as given by their team).
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
    let mut room: Vec<u64> = teams.iter().map(|t| t.above_guarantee).collect();
    let mut choice = Choice::default();
    for (t, team) in teams.iter().enumerate() {
        for w in team.workloads.iter().filter(|w| w.terminating) {
            choice.in_flight += w.devices;
            room[t] = room[t].saturating_sub(w.devices);
            for (node, devices) in &w.nodes {
                *free.entry(node.clone()).or_default() += devices;
            }
        }
    }
    for &size in claims {
        let size = u64::from(size);
        if let Some(node) = fit(&mut free, size) {
            choice.placed.push((size, node));
            continue;
        }
        let state = Weighing {
            teams,
            taken: &taken,
            room: &room,
            free: &free,
            rules: (min_runtime, now),
        };
        let best = (state.nodes().into_iter())
            .filter_map(|node| {
                let (cost, picked, after) = state.best_on(&node, size)?;
                Some((cost, node, picked, after))
            })
            .min_by(|a, b| a.0.cmp(&b.0).then_with(|| a.1.cmp(&b.1)));
        let Some((_, node, picked, after)) = best else {
            choice.uncovered += size;
            continue;
        };
        for ((t, i), moved) in picked {
            taken[t][i] = true;
            let w = &teams[t].workloads[i];
            if moved {
                choice.moved.push(choice.evict.len());
            } else {
                room[t] -= w.devices;
            }
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

/// The node all of `w`'s devices are on, if it holds devices on exactly one and is not on its
/// way out.
fn on_one_node(w: &Workload) -> Option<&Arc<str>> {
    match w.nodes.as_slice() {
        [(Some(node), devices)] if !w.terminating && *devices > 0 => Some(node),
        _ => None,
    }
}

/// What one claim's choice weighs: the teams, their workloads taken so far, what each may still
/// give back above its guarantee, the free devices per node, and the minimum runtime at a time.
struct Weighing<'a> {
    teams: &'a [Borrower],
    taken: &'a [Vec<bool>],
    room: &'a [u64],
    free: &'a Free,
    rules: (u64, Timestamp),
}

impl Weighing<'_> {
    fn workload(&self, (t, i): Candidate) -> &Workload {
        &self.teams[t].workloads[i]
    }

    /// Whether workload `i` of team `t` may go: not taken yet, on one node, and either movable
    /// or within what its team may give back.
    fn may_go(&self, (t, i): Candidate) -> Option<&Arc<str>> {
        let w = self.workload((t, i));
        let node = on_one_node(w).filter(|_| !self.taken[t][i])?;
        (w.movable || w.devices <= self.room[t]).then_some(node)
    }

    /// The nodes a workload that may go sits on.
    fn nodes(&self) -> Vec<Arc<str>> {
        let mut nodes: Vec<Arc<str>> = (self.teams.iter().enumerate())
            .flat_map(|(t, team)| (0..team.workloads.len()).map(move |i| (t, i)))
            .filter_map(|c| self.may_go(c).cloned())
            .collect();
        nodes.sort();
        nodes.dedup();
        nodes
    }

    /// The workloads on `node` whose evictions make room for `size` devices there at the least
    /// [`Cost`], with that cost and the free devices per node afterwards (the claim placed, the
    /// moved workloads placed elsewhere); `None` when no set of them does.
    fn best_on(&self, node: &Arc<str>, size: u64) -> Option<Best> {
        let (min_runtime, now) = self.rules;
        let here = Some(node.clone());
        let free_here = self.free.get(&here).copied().unwrap_or(0);
        let need = size.saturating_sub(free_here);
        let mut candidates: Vec<Candidate> = (self.teams.iter().enumerate())
            .flat_map(|(t, team)| (0..team.workloads.len()).map(move |i| (t, i)))
            .filter(|&c| {
                self.may_go(c) == Some(node) && runtime(self.workload(c), now) >= min_runtime
            })
            .collect();
        // Lowest priority, evicted fewest times before, most recently started first (of
        // equals, the last name).
        candidates.sort_by_key(|&c| {
            let w = self.workload(c);
            let started = Reverse(w.started.unwrap_or(Timestamp::MAX));
            (
                w.priority,
                w.evicted_before,
                started,
                Reverse(w.name.clone()),
            )
        });
        candidates.truncate(MOST_WEIGHED);
        if candidates
            .iter()
            .map(|&c| self.workload(c).devices)
            .sum::<u64>()
            < need
        {
            return None;
        }
        let mut best: Option<Best> = None;
        for mask in 1u32..(1 << candidates.len()) {
            let set: Vec<Candidate> = (candidates.iter().enumerate())
                .filter(|(k, _)| mask & (1 << k) != 0)
                .map(|(_, c)| *c)
                .collect();
            let evicted: u64 = set.iter().map(|&c| self.workload(c).devices).sum();
            if evicted < need {
                continue;
            }
            let Some(split) = self.taken_back_or_moved(&set) else {
                continue;
            };
            let moved: Vec<&Workload> = (split.iter())
                .filter(|(_, moved)| *moved)
                .map(|(c, _)| self.workload(*c))
                .collect();
            let Some(mut after) = placed_elsewhere(self.free, &here, &moved) else {
                continue;
            };
            let workloads = || set.iter().map(|&c| self.workload(c));
            let cost = (
                workloads().map(|w| w.priority).max().unwrap_or(0),
                evicted,
                workloads().map(|w| w.evicted_before).sum(),
                Reverse((workloads().filter_map(|w| w.started).min()).unwrap_or(Timestamp::MAX)),
                Reverse(
                    workloads()
                        .map(|w| w.name.clone())
                        .min()
                        .unwrap_or_default(),
                ),
            );
            if best.as_ref().is_none_or(|(b, _, _)| cost < *b) {
                after.insert(here.clone(), free_here + evicted - size);
                best = Some((cost, split, after));
            }
        }
        best
    }

    /// Which of `set` are taken back (largest first, while their team may still give them) and
    /// which are moved; `None` when one that is not movable is not within its team's room.
    fn taken_back_or_moved(&self, set: &[Candidate]) -> Option<Vec<(Candidate, bool)>> {
        let mut room = self.room.to_vec();
        let mut by_size = set.to_vec();
        by_size.sort_by_key(|&c| Reverse(self.workload(c).devices));
        (by_size.into_iter())
            .map(|c| {
                let w = self.workload(c);
                if w.devices <= room[c.0] {
                    room[c.0] -= w.devices;
                    Some((c, false))
                } else {
                    w.movable.then_some((c, true))
                }
            })
            .collect()
    }
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
