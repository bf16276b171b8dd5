//! Which workloads reclaim evicts so that a waiting team's claims fit a node. Pure.
//!
//! A claim's devices must all be on its Pod's node: freeing 8 devices on 8 nodes does not let
//! an 8-device claim run. For each claim that fits no node (largest first), this takes the node
//! where evicting the fewest borrowers' workloads makes room for it, by the rules of
//! [`super::victims`]: first what the borrowers owe (the engine's order), then the lowest
//! priority, then the fewest devices freed beyond what the node lacks (every device of a
//! workload counts, on every node it frees), then those evicted fewer times before, then the
//! most recently started. A workload's
//! devices on other nodes come free too and serve the next claims. Never below a borrower's
//! effective guarantee, whole workloads only, never one younger than the minimum runtime;
//! workloads already being deleted count first (their devices are on their way back).

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use k8s_openapi::jiff::Timestamp;

use super::victims::{Borrower, Choice, eligible_at, runtime};
use super::workload::Workload;
use crate::core::plan::inventory::{DeviceId, PoolKey};
use crate::core::plan::placement::Placement;

/// Free devices per node (`None`: devices reached from any node).
pub type Free = BTreeMap<Option<Arc<str>>, u64>;

/// The free devices per node of `placement`.
pub fn free_of(placement: &Placement) -> Free {
    (placement.free.iter())
        .map(|(node, n)| (node.clone(), u64::from(*n)))
        .collect()
}

/// The node of device `id`, by the pools of `placement` (`None`: its pool has none).
pub fn node_of(placement: &Placement, id: &DeviceId) -> Option<Arc<str>> {
    let pool = PoolKey {
        driver: id.driver.clone(),
        pool: id.pool.clone(),
    };
    placement.nodes.get(&pool).cloned()
}

/// Places `size` devices on the node with the fewest free that hold them (of equals, the first
/// by name), taking them from `free`; the node, or `None` when no node holds them.
pub(super) fn fit(free: &mut Free, size: u64) -> Option<Option<Arc<str>>> {
    let (node, left) = (free.iter_mut())
        .filter(|(_, f)| **f >= size)
        .min_by_key(|(_, f)| **f)?;
    *left -= size;
    Some(node.clone())
}

/// At most this many workloads on one node are weighed for a claim (the lowest priority, most
/// recently started first): every subset of them is tried.
pub(super) const MOST_WEIGHED: usize = 10;

/// Which of the `borrowers`' workloads to evict so that each of `claims` (devices per claim,
/// largest first) fits a node, given the `free` devices per node, at `now` with a minimum
/// runtime of `min_runtime` seconds. `Choice::uncovered` is the devices of the claims that
/// still fit nowhere; `Choice::placed` says where each of the others goes.
pub fn choose_on_nodes(
    borrowers: &[Borrower],
    free: &Free,
    claims: &[u32],
    min_runtime: u64,
    now: Timestamp,
) -> Choice {
    let mut state = State::new(borrowers, free);
    let mut choice = Choice {
        in_flight: state.given.iter().sum(),
        ..Choice::default()
    };
    let mut young = Vec::new();
    for &size in claims {
        let size = u64::from(size);
        if let Some(node) = state.fit(size) {
            choice.placed.push((size, node));
            continue;
        }
        let best = (state.nodes(borrowers).into_iter())
            .filter_map(|node| {
                let picked = state.best_on(borrowers, &node, size, min_runtime, now)?;
                Some((picked.0, node, picked.1))
            })
            .min_by(|a, b| a.0.cmp(&b.0).then_with(|| a.1.cmp(&b.1)));
        let Some((_, node, picked)) = best else {
            choice.uncovered += size;
            young.push(size);
            continue;
        };
        for (b, i) in picked {
            let w = &borrowers[b].workloads[i];
            state.take(b, i, w);
            choice.freed += w.devices;
            choice.evict.push((b, w.clone()));
        }
        let left = state.free.entry(node.clone()).or_default();
        *left = left.saturating_sub(size);
        choice.placed.push((size, node));
    }
    if !young.is_empty() {
        choice.eligible_at = (borrowers.iter().enumerate())
            .flat_map(|(b, borrower)| {
                let (taken, room) = (&state.taken[b], state.room[b]);
                (borrower.workloads.iter().enumerate())
                    .filter(move |(i, w)| !taken[*i] && w.devices > 0 && w.devices <= room)
                    .map(|(_, w)| w)
            })
            .filter(|w| runtime(w, now) < min_runtime)
            .map(|w| eligible_at(w, min_runtime, now))
            .min();
    }
    choice
}

/// What is taken so far: per borrower, its workloads taken, what it may still give, what it
/// gave; the free devices per node.
struct State {
    taken: Vec<Vec<bool>>,
    room: Vec<u64>,
    given: Vec<u64>,
    free: Free,
}

/// How a set of workloads ranks for one claim: lower is better. Start times are whole seconds:
/// of equals, the set whose first name is last goes (as `victims::choose`, for Pods numbered in
/// order).
type Cost = (
    u64,
    i32,
    u64,
    u32,
    usize,
    Reverse<Timestamp>,
    Reverse<String>,
);

impl State {
    fn new(borrowers: &[Borrower], free: &Free) -> Self {
        let mut state = State {
            taken: (borrowers.iter())
                .map(|b| b.workloads.iter().map(|w| w.terminating).collect())
                .collect(),
            room: borrowers.iter().map(|b| b.above_guarantee).collect(),
            given: vec![0; borrowers.len()],
            free: free.clone(),
        };
        for (b, borrower) in borrowers.iter().enumerate() {
            for w in borrower.workloads.iter().filter(|w| w.terminating) {
                state.given[b] += w.devices;
                state.room[b] = state.room[b].saturating_sub(w.devices);
                state.release(w);
            }
        }
        state
    }

    /// The devices of `w` come free on its nodes.
    fn release(&mut self, w: &Workload) {
        for (node, devices) in &w.nodes {
            *self.free.entry(node.clone()).or_default() += devices;
        }
    }

    fn take(&mut self, b: usize, i: usize, w: &Workload) {
        self.taken[b][i] = true;
        self.room[b] -= w.devices;
        self.given[b] += w.devices;
        self.release(w);
    }

    fn fit(&mut self, size: u64) -> Option<Option<Arc<str>>> {
        fit(&mut self.free, size)
    }

    /// The nodes some workload not taken yet holds devices on.
    fn nodes(&self, borrowers: &[Borrower]) -> BTreeSet<Option<Arc<str>>> {
        (borrowers.iter().enumerate())
            .flat_map(|(b, borrower)| {
                (borrower.workloads.iter().enumerate())
                    .filter(move |(i, _)| !self.taken[b][*i])
                    .flat_map(|(_, w)| w.nodes.iter().map(|(n, _)| n.clone()))
            })
            .collect()
    }

    /// The workloads whose eviction makes room for `size` devices on `node` at the least
    /// [`Cost`], with that cost; `None` when no set of them does.
    fn best_on(
        &self,
        borrowers: &[Borrower],
        node: &Option<Arc<str>>,
        size: u64,
        min_runtime: u64,
        now: Timestamp,
    ) -> Option<(Cost, Vec<(usize, usize)>)> {
        let need = size.saturating_sub(self.free.get(node).copied().unwrap_or(0));
        let on_node = |w: &Workload| (w.nodes.iter().find(|(n, _)| n == node)).map_or(0, |d| d.1);
        let mut candidates: Vec<(usize, usize)> = (borrowers.iter().enumerate())
            .flat_map(|(b, borrower)| (0..borrower.workloads.len()).map(move |i| (b, i)))
            .filter(|&(b, i)| {
                let w = &borrowers[b].workloads[i];
                !self.taken[b][i]
                    && on_node(w) > 0
                    && w.devices <= self.room[b]
                    && runtime(w, now) >= min_runtime
            })
            .collect();
        // Lowest priority, evicted fewest times before, most recently started first (of
        // equals, the last name).
        candidates.sort_by_key(|&(b, i)| {
            let w = &borrowers[b].workloads[i];
            let started = Reverse(w.started.unwrap_or(Timestamp::MAX));
            (
                w.priority,
                w.evicted_before,
                started,
                Reverse(w.name.clone()),
                b,
            )
        });
        candidates.truncate(MOST_WEIGHED);
        let workload = |c: &(usize, usize)| &borrowers[c.0].workloads[c.1];
        if candidates.iter().map(|c| on_node(workload(c))).sum::<u64>() < need {
            return None;
        }
        let mut best: Option<(Cost, u32)> = None;
        for mask in 1u32..(1 << candidates.len()) {
            let set: Vec<&(usize, usize)> = (candidates.iter().enumerate())
                .filter(|(k, _)| mask & (1 << k) != 0)
                .map(|(_, c)| c)
                .collect();
            let freed_here: u64 = set.iter().map(|c| on_node(workload(c))).sum();
            if freed_here < need {
                continue;
            }
            let mut by_borrower: BTreeMap<usize, u64> = BTreeMap::new();
            for c in &set {
                *by_borrower.entry(c.0).or_default() += workload(c).devices;
            }
            if by_borrower.iter().any(|(b, d)| *d > self.room[*b]) {
                continue;
            }
            let over_owed: u64 = (by_borrower.iter())
                .map(|(&b, d)| {
                    let owes = borrowers[b].owes;
                    (self.given[b] + d).saturating_sub(owes) - self.given[b].saturating_sub(owes)
                })
                .sum();
            let top = set.iter().map(|c| workload(c).priority).max().unwrap_or(0);
            let devices: u64 = set.iter().map(|c| workload(c).devices).sum();
            let evicted_before: u32 = set.iter().map(|c| workload(c).evicted_before).sum();
            let last_borrower = set.iter().map(|c| c.0).max().unwrap_or(0);
            let oldest = (set.iter())
                .map(|c| workload(c).started.unwrap_or(Timestamp::MAX))
                .min()
                .unwrap_or(Timestamp::MAX);
            let first_name = (set.iter())
                .map(|c| workload(c).name.to_string())
                .min()
                .unwrap_or_default();
            let cost = (
                over_owed,
                top,
                devices - need,
                evicted_before,
                last_borrower,
                Reverse(oldest),
                Reverse(first_name),
            );
            if best.as_ref().is_none_or(|(b, _)| cost < *b) {
                best = Some((cost, mask));
            }
        }
        let (cost, mask) = best?;
        let picked = (candidates.iter().enumerate())
            .filter(|(k, _)| mask & (1 << k) != 0)
            .map(|(_, c)| *c)
            .collect();
        Some((cost, picked))
    }
}
