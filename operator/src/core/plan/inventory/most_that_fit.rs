//! The most devices that fit a counter group's budget at once: an exact branch-and-bound
//! search (see [`super::counters`] for where the budgets and draws come from).

use std::collections::BTreeMap;

/// What [`CounterGroup::fit`] finds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Fit {
    /// Allocated devices among the candidates.
    pub held: u32,
    /// The most further candidates that fit at once.
    pub more: u32,
    /// Whether `more` is proven the most; else it is what the search found in its budget, a
    /// count that fits but may not be the most.
    pub exact: bool,
}

/// Whether one device drawing `draws` (a slot may be named twice) fits `left`.
pub(super) fn fits_alone(left: &[i128], draws: &[(u16, i128)]) -> bool {
    draws.iter().enumerate().all(|(i, &(slot, _))| {
        let drawn = (draws[..=i].iter())
            .filter(|(s, _)| *s == slot)
            .fold(0i128, |sum, (_, a)| sum.saturating_add(*a));
        drawn <= left[usize::from(slot)]
    })
}

/// Search steps [`most_that_fit`] takes before it settles for the best it has found.
const STEPS: u32 = 200_000;

/// The most of `devices` (each a list of (slot, amount) drawn from `left`) that fit `left` at
/// the same time. An exact branch-and-bound search, smallest devices first: a counter group of
/// the NVIDIA driver (a full GPU and some twenty MIG placements) takes a few hundred steps. Past
/// [`STEPS`] it answers the best count found, which fits: a capacity may then be low, never more
/// than the allocator can give.
pub fn most_that_fit(left: &[i128], devices: &[&[(u16, i128)]]) -> Fit {
    // What each device draws per slot (a slot named twice draws twice); a device that does not
    // fit alone never fits.
    let merged: Vec<Vec<(u16, i128)>> = (devices.iter())
        .map(|d| {
            let mut by_slot: BTreeMap<u16, i128> = BTreeMap::new();
            for &(s, a) in d.iter() {
                let slot = by_slot.entry(s).or_default();
                *slot = slot.saturating_add(a);
            }
            by_slot.into_iter().collect()
        })
        .collect();
    let mut order: Vec<&[(u16, i128)]> = (merged.iter())
        .map(Vec::as_slice)
        .filter(|d| d.iter().all(|&(s, a)| a <= left[usize::from(s)]))
        .collect();
    let share = |d: &[(u16, i128)]| -> u128 {
        d.iter()
            .map(|&(s, a)| {
                let total = left[usize::from(s)].max(1);
                u128::try_from(a.max(0)).unwrap_or(0) * 1_000_000
                    / u128::try_from(total).unwrap_or(1)
            })
            .sum()
    };
    order.sort_by_key(|d| share(d));
    let mut search = Search {
        devices: &order,
        left: left.to_vec(),
        best: 0,
        steps: 0,
    };
    search.run(0, 0);
    Fit {
        held: 0,
        more: search.best,
        exact: search.steps < STEPS,
    }
}

struct Search<'a> {
    devices: &'a [&'a [(u16, i128)]],
    left: Vec<i128>,
    best: u32,
    steps: u32,
}

impl Search<'_> {
    fn run(&mut self, next: usize, taken: u32) {
        self.best = self.best.max(taken);
        let remaining = u32::try_from(self.devices.len() - next).unwrap_or(u32::MAX);
        if next == self.devices.len() || taken + remaining <= self.best || self.steps >= STEPS {
            return;
        }
        self.steps += 1;
        let device = self.devices[next];
        if device.iter().all(|&(s, a)| a <= self.left[usize::from(s)]) {
            for &(s, a) in device {
                self.left[usize::from(s)] -= a;
            }
            self.run(next + 1, taken + 1);
            for &(s, a) in device {
                self.left[usize::from(s)] += a;
            }
        }
        self.run(next + 1, taken);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Every subset of `devices`: the most that fit `left`.
    fn most_by_every_subset(left: &[i128], devices: &[&[(u16, i128)]]) -> u32 {
        (0u32..1 << devices.len())
            .filter(|mask| {
                let mut used = vec![0i128; left.len()];
                for (i, d) in devices.iter().enumerate() {
                    if mask & (1 << i) != 0 {
                        for &(s, a) in d.iter() {
                            used[usize::from(s)] += a;
                        }
                    }
                }
                used.iter().zip(left).all(|(u, l)| u <= l)
            })
            .map(u32::count_ones)
            .max()
            .unwrap_or(0)
    }

    proptest! {
        #[test]
        fn the_search_finds_as_many_as_the_best_subset(
            left in proptest::collection::vec(0..12i128, 1..4),
            raw in proptest::collection::vec(proptest::collection::vec((0..4u16, 0..7i128), 0..4), 0..11),
        ) {
            let slots = u16::try_from(left.len()).unwrap();
            let devices: Vec<Vec<(u16, i128)>> = raw
                .into_iter()
                .map(|d| d.into_iter().map(|(s, a)| (s % slots, a)).collect())
                .collect();
            let refs: Vec<&[(u16, i128)]> = devices.iter().map(Vec::as_slice).collect();
            let fit = most_that_fit(&left, &refs);
            prop_assert!(fit.exact);
            prop_assert_eq!(fit.more, most_by_every_subset(&left, &refs));
            // The shortcut for one device agrees with the search.
            for one in &refs {
                prop_assert_eq!(u32::from(fits_alone(&left, one)), most_that_fit(&left, &[one]).more);
            }
        }
    }
}
