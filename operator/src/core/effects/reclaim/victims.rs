//! Which workloads reclaim evicts so that a waiting team gets its guarantee back. Pure.
//!
//! The rules (docs/fair-sharing.md, "Reclaim"):
//! - the freed devices cover the shortfall; a workload may be larger than what is still short,
//!   and the devices beyond it go back to the pool, where fair share hands them out again;
//! - a borrower is never taken below its effective guarantee;
//! - borrowers furthest above their fair share give first (the engine's order), each first up to
//!   what the engine says it owes, then, if workloads were too large or too young elsewhere, up
//!   to what it holds above its guarantee;
//! - within a borrower: the lowest priority first (a higher one only when all of the lower ones
//!   do not cover the shortfall), then the workloads that together free the fewest devices
//!   beyond what is still short, then those evicted fewer times before, then the most recently
//!   started;
//! - a workload that has run for less than the minimum runtime is not taken;
//! - workloads already being deleted count first, and are not evicted again.

use std::cmp::Reverse;

use k8s_openapi::jiff::Timestamp;

use super::workload::Workload;

/// One borrower a waiting team takes devices back from.
#[derive(Clone, Debug, PartialEq)]
pub struct Borrower {
    pub team: String,
    /// What the fair-share engine says it gives back.
    pub owes: u64,
    /// Devices it holds above its effective guarantee: the most it ever gives.
    pub above_guarantee: u64,
    /// Its workloads holding devices of the pool.
    pub workloads: Vec<Workload>,
    /// Its workloads queued for room ([`super::workload::queued`]): they hold nothing, are
    /// not chosen among, and go before those chosen.
    pub queued: Vec<Workload>,
}

/// What reclaim takes for one waiting team, now.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Choice {
    /// The workloads to evict, each with the index of its borrower, in the order chosen.
    pub evict: Vec<(usize, Workload)>,
    /// Devices of workloads already being deleted.
    pub in_flight: u64,
    /// Devices the chosen workloads free.
    pub freed: u64,
    /// What is still short after both.
    pub uncovered: u64,
    /// When a workload that is too young now, and could cover more, reaches the minimum
    /// runtime.
    pub eligible_at: Option<Timestamp>,
    /// Where each waiting claim goes (its devices, its node), when reclaim makes room per node
    /// ([`super::nodes::choose_on_nodes`]).
    pub placed: Vec<(u64, Option<std::sync::Arc<str>>)>,
    /// Of `evict`, the places of the workloads moved to run again on another node rather than
    /// taken back from a borrower ([`super::moves`]); empty for reclaim's own choices.
    pub moved: Vec<usize>,
}

/// Which of the `borrowers`' workloads to evict to free `shortfall` devices, at `now`, with a
/// minimum runtime of `min_runtime` seconds. `borrowers` come in the order they give.
pub fn choose(borrowers: &[Borrower], shortfall: u64, min_runtime: u64, now: Timestamp) -> Choice {
    let mut choice = Choice::default();
    let mut taken: Vec<Vec<bool>> = (borrowers.iter())
        .map(|b| b.workloads.iter().map(|w| w.terminating).collect())
        .collect();
    let mut room: Vec<u64> = borrowers.iter().map(|b| b.above_guarantee).collect();
    let mut given: Vec<u64> = vec![0; borrowers.len()];
    for (b, borrower) in borrowers.iter().enumerate() {
        for w in borrower.workloads.iter().filter(|w| w.terminating) {
            choice.in_flight += w.devices;
            given[b] += w.devices;
            room[b] = room[b].saturating_sub(w.devices);
        }
    }
    let mut left = shortfall.saturating_sub(choice.in_flight);
    let old_enough = |w: &Workload| runtime(w, now) >= min_runtime;
    for round in [Round::WhatItOwes, Round::AboveGuarantee] {
        for (b, borrower) in borrowers.iter().enumerate() {
            let mut need = match round {
                Round::WhatItOwes => left.min(borrower.owes.saturating_sub(given[b])),
                Round::AboveGuarantee => left,
            };
            let mut candidates: Vec<usize> = (0..borrower.workloads.len())
                .filter(|i| !taken[b][*i] && old_enough(&borrower.workloads[*i]))
                .collect();
            // By priority, lowest first; within one, those evicted fewer times before (their
            // controller's backoff is shorter), then the most recently started (start times are
            // whole seconds: of equals, the last name, as for Pods numbered in order).
            candidates.sort_by_key(|i| {
                let w = &borrower.workloads[*i];
                let started = Reverse(w.started.unwrap_or(Timestamp::MAX));
                (w.priority, w.evicted_before, started, Reverse(&w.name))
            });
            for tier in candidates
                .chunk_by(|x, y| borrower.workloads[*x].priority == borrower.workloads[*y].priority)
            {
                if need == 0 {
                    break;
                }
                let sizes: Vec<u64> = tier
                    .iter()
                    .map(|i| borrower.workloads[*i].devices)
                    .collect();
                for picked in fewest_beyond(&sizes, need, room[b]) {
                    let i = tier[picked];
                    let w = &borrower.workloads[i];
                    taken[b][i] = true;
                    room[b] -= w.devices;
                    given[b] += w.devices;
                    choice.freed += w.devices;
                    need = need.saturating_sub(w.devices);
                    left = left.saturating_sub(w.devices);
                    choice.evict.push((b, w.clone()));
                }
            }
        }
    }
    choice.uncovered = left;
    if left > 0 {
        choice.eligible_at = (borrowers.iter().enumerate())
            .flat_map(|(b, borrower)| {
                let (taken, room) = (&taken[b], room[b]);
                (borrower.workloads.iter().enumerate())
                    .filter(move |(i, w)| !taken[*i] && w.devices > 0 && w.devices <= room)
                    .map(|(_, w)| w)
            })
            .filter(|w| !old_enough(w))
            .map(|w| eligible_at(w, min_runtime, now))
            .min();
    }
    choice
}

/// Which of `sizes` (in order of preference) to take so that at least `need` devices come free
/// with the fewest beyond it, never more than `room` in all; when that is not possible, the most
/// that fits in `room`. Of equal sums, the earlier sizes are taken. A subset sum over at most
/// `need + the largest size` devices: a few hundred, for a pass's handful of workloads.
fn fewest_beyond(sizes: &[u64], need: u64, room: u64) -> Vec<usize> {
    let largest = sizes.iter().copied().max().unwrap_or(0);
    let cap = usize::try_from(room.min((need + largest).saturating_sub(1))).unwrap_or(0);
    let need = usize::try_from(need).unwrap_or(usize::MAX);
    // reach[s]: how the sum s is first reached (the sum before, the size added).
    let mut reach: Vec<Option<(usize, usize)>> = vec![None; cap + 1];
    let mut reached = vec![false; cap + 1];
    reached[0] = true;
    for (i, &size) in sizes.iter().enumerate() {
        let Ok(size) = usize::try_from(size) else {
            continue;
        };
        if size == 0 || size > cap {
            continue;
        }
        for sum in (0..=cap - size).rev() {
            if reached[sum] && !reached[sum + size] {
                reached[sum + size] = true;
                reach[sum + size] = Some((sum, i));
            }
        }
    }
    let best = (need.min(cap + 1)..=cap)
        .find(|s| reached[*s])
        .or_else(|| (1..=cap.min(need)).rev().find(|s| reached[*s]));
    let mut picked = Vec::new();
    let mut sum = best.unwrap_or(0);
    while let Some((before, i)) = reach[sum] {
        picked.push(i);
        sum = before;
    }
    picked.sort_unstable();
    picked
}

#[derive(Clone, Copy)]
enum Round {
    WhatItOwes,
    AboveGuarantee,
}

/// Seconds `w` has run at `now`; one not started yet has not run.
pub(super) fn runtime(w: &Workload, now: Timestamp) -> u64 {
    w.started.map_or(0, |s| {
        u64::try_from(now.as_second() - s.as_second()).unwrap_or(0)
    })
}

/// When `w` will have run `min_runtime` seconds.
pub(super) fn eligible_at(w: &Workload, min_runtime: u64, now: Timestamp) -> Timestamp {
    let start = w.started.unwrap_or(now).as_second();
    let at = start.saturating_add(i64::try_from(min_runtime).unwrap_or(i64::MAX));
    Timestamp::from_second(at).unwrap_or(Timestamp::MAX)
}
