//! Whole-device apportionment primitives: guarantee scaling and weighted water-filling.
//!
//! Both are defined as "hand out devices one at a time to the best next slot", which makes them
//! monotone by construction (one more device never takes one away from anybody), and computed
//! in O(n log n) without walking device by device. Ties between equal slots go to the lower
//! index; callers pass items sorted by team or namespace name, so ties go to the name that sorts
//! first.

use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;

/// [`water_fill`] of `amount` units where item i already holds `floors[i]` of them (at most its
/// cap; together at most `amount`): the units beyond the floors go to the lowest levels, a floor's
/// units counting as given, so item i ends with max(its floor, its share at the water level).
///
/// The level is found by a walk over the items' breakpoints (O(n log n)); the last few units
/// are placed exactly, one at a time.
pub(crate) fn water_fill_above(amount: u64, items: &[(u64, u32)], floors: &[u64]) -> Vec<u64> {
    fill_from(amount, items, |i| floors[i])
}

/// Water-fills `amount` units over `items` where item i starts from `floor(i)` units (see
/// [`water_fill_above`]; [`water_fill`] is the case of no floors).
fn fill_from(amount: u64, items: &[(u64, u32)], floor: impl Fn(usize) -> u64) -> Vec<u64> {
    let total_cap: u64 = items
        .iter()
        .map(|&(cap, _)| cap)
        .fold(0, u64::saturating_add);
    if amount >= total_cap {
        return items.iter().map(|&(cap, _)| cap).collect();
    }
    let at = |level: f64, i: usize| -> u64 {
        let (cap, w) = items[i];
        // `as` saturates: a level beyond u64 is the cap anyway.
        let units = (level * f64::from(w.max(1))).floor() as u64;
        units.clamp(floor(i).min(cap), cap)
    };
    let count = |level: f64| -> u64 { (0..items.len()).map(|i| at(level, i)).sum() };
    // The continuous level: sum of clamp(level * w, floor, cap) rises with slope `w` between an
    // item's floor / w and cap / w. Walk those breakpoints in order to where it reaches `amount`.
    let mut breaks: Vec<(f64, f64)> = Vec::with_capacity(2 * items.len());
    let mut value = 0.0f64;
    for (i, &(cap, w)) in items.iter().enumerate() {
        let (from, w) = (floor(i).min(cap) as f64, f64::from(w.max(1)));
        value += from;
        if (cap as f64) > from {
            breaks.push((from / w, w));
            breaks.push((cap as f64 / w, -w));
        }
    }
    breaks.sort_unstable_by(|a, b| a.0.total_cmp(&b.0));
    let (target, mut slope, mut level) = (amount as f64, 0.0f64, 0.0f64);
    for (at_level, change) in breaks {
        let reached = value + slope * (at_level - level);
        if reached >= target && slope > 0.0 {
            break;
        }
        (value, level) = (reached, at_level);
        slope += change;
    }
    let mut low = if slope > 0.0 {
        level + (target - value).max(0.0) / slope
    } else {
        level
    };
    // Rounding may overshoot by an ulp or so: step down until every unit at the level fits (at
    // level 0 only the floors are given, and they fit).
    let mut step = low.max(1.0) * f64::EPSILON * 4.0;
    while low > 0.0 && count(low) > amount {
        low = (low - step).max(0.0);
        step *= 2.0;
    }
    let mut out: Vec<u64> = (0..items.len()).map(|i| at(low, i)).collect();
    let given: u64 = out.iter().sum();
    fill_lowest(&mut out, items, amount.saturating_sub(given));
    out
}

/// Weighted max-min (water-filling) split of `amount` whole units among items `(cap, weight)`.
///
/// The k-th unit of item i (k = 1..=cap) has level k / weight; the result gives out the
/// `amount` lowest-level units, ties to the lower index. Returns how many units each item gets;
/// the sum is `min(amount, sum of caps)`. Weights must be at least 1.
pub(crate) fn water_fill(amount: u64, items: &[(u64, u32)]) -> Vec<u64> {
    fill_from(amount, items, |_| 0)
}

/// Hands `deficit` more units, one at a time, to the lowest next levels of `out` (ties to the
/// lower index), within the caps.
fn fill_lowest(out: &mut [u64], items: &[(u64, u32)], mut deficit: u64) {
    if deficit == 0 {
        return;
    }
    let mut heap: BinaryHeap<Reverse<Slot>> = out
        .iter()
        .enumerate()
        .filter(|&(i, &got)| got < items[i].0)
        .map(|(i, &got)| {
            Reverse(Slot {
                num: got + 1,
                den: items[i].1,
                index: i,
            })
        })
        .collect();
    while deficit > 0 {
        let Some(Reverse(slot)) = heap.pop() else {
            break;
        };
        out[slot.index] += 1;
        deficit -= 1;
        if out[slot.index] < items[slot.index].0 {
            heap.push(Reverse(Slot {
                num: slot.num + 1,
                ..slot
            }));
        }
    }
}

/// Jefferson / D'Hondt apportionment of `seats` in proportion to `claims`.
///
/// Units are handed out one at a time to the item with the highest `claim / (got + 1)`, ties to
/// the lower index. When `seats <= sum(claims)` nobody gets more than its claim, everybody gets
/// at least the floor of its exact proportional share, and one more seat never lowers anybody's
/// result (no Alabama paradox, unlike largest remainder).
pub(crate) fn dhondt(seats: u64, claims: &[u64]) -> Vec<u64> {
    let total: u128 = claims.iter().map(|&c| u128::from(c)).sum();
    if total <= u128::from(seats) {
        return claims.to_vec();
    }
    // Start from the lower quota, which every D'Hondt result contains.
    let mut out: Vec<u64> = claims
        .iter()
        .map(|&c| u64::try_from(u128::from(seats) * u128::from(c) / total).unwrap_or(c))
        .collect();
    let given: u64 = out.iter().sum();
    let mut rest = seats.saturating_sub(given);
    let mut heap: BinaryHeap<DhondtSlot> = claims
        .iter()
        .enumerate()
        .filter(|&(_, &c)| c > 0)
        .map(|(i, &c)| DhondtSlot {
            claim: c,
            next: out[i] + 1,
            index: i,
        })
        .collect();
    while rest > 0 {
        let Some(slot) = heap.pop() else { break };
        out[slot.index] += 1;
        rest -= 1;
        heap.push(DhondtSlot {
            next: slot.next + 1,
            ..slot
        });
    }
    out
}

/// A unit at level `num / den` of item `index`; smaller level first, then smaller index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Slot {
    num: u64,
    den: u32,
    index: usize,
}

impl Ord for Slot {
    fn cmp(&self, other: &Self) -> Ordering {
        let lhs = u128::from(self.num) * u128::from(other.den);
        let rhs = u128::from(other.num) * u128::from(self.den);
        lhs.cmp(&rhs).then(self.index.cmp(&other.index))
    }
}

impl PartialOrd for Slot {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// The next D'Hondt seat of item `index`, worth `claim / next`; max-heap order puts the largest
/// quotient first, then the smaller index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct DhondtSlot {
    claim: u64,
    next: u64,
    index: usize,
}

impl Ord for DhondtSlot {
    fn cmp(&self, other: &Self) -> Ordering {
        let lhs = u128::from(self.claim) * u128::from(other.next);
        let rhs = u128::from(other.claim) * u128::from(self.next);
        lhs.cmp(&rhs).then(other.index.cmp(&self.index))
    }
}

impl PartialOrd for DhondtSlot {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reference: from `floors`, hand out units one by one to the lowest next level until
    /// `amount` are given or every item is full.
    fn water_fill_slow(amount: u64, items: &[(u64, u32)], floors: &[u64]) -> Vec<u64> {
        let mut out = floors.to_vec();
        while out.iter().sum::<u64>() < amount {
            let best = (0..items.len())
                .filter(|&i| out[i] < items[i].0)
                .map(|i| Slot {
                    num: out[i] + 1,
                    den: items[i].1,
                    index: i,
                })
                .min();
            match best {
                Some(s) => out[s.index] += 1,
                None => break,
            }
        }
        out
    }

    /// A small xorshift generator: `next(m)` is in `0..m`.
    fn random(mut seed: u64) -> impl FnMut(u64) -> u64 {
        move |m| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % m
        }
    }

    fn dhondt_slow(seats: u64, claims: &[u64]) -> Vec<u64> {
        let total: u64 = claims.iter().sum();
        if total <= seats {
            return claims.to_vec();
        }
        let mut out = vec![0u64; claims.len()];
        for _ in 0..seats {
            let best = (0..claims.len())
                .filter(|&i| claims[i] > 0)
                .map(|i| DhondtSlot {
                    claim: claims[i],
                    next: out[i] + 1,
                    index: i,
                })
                .max();
            if let Some(s) = best {
                out[s.index] += 1;
            }
        }
        out
    }

    #[test]
    fn water_fill_matches_one_by_one() {
        let mut next = random(12345u64);
        for _ in 0..3000 {
            let n = next(8) as usize;
            let items: Vec<(u64, u32)> = (0..n).map(|_| (next(12), 1 + next(6) as u32)).collect();
            let amount = next(40);
            assert_eq!(
                water_fill(amount, &items),
                water_fill_slow(amount, &items, &vec![0; items.len()]),
                "{amount} {items:?}"
            );
        }
    }

    #[test]
    fn water_fill_above_floors_matches_one_by_one() {
        let mut next = random(4242u64);
        for _ in 0..5000 {
            let n = next(8) as usize;
            let items: Vec<(u64, u32)> = (0..n).map(|_| (next(12), 1 + next(6) as u32)).collect();
            let floors: Vec<u64> = items.iter().map(|&(cap, _)| next(cap + 1) / 2).collect();
            let amount = floors.iter().sum::<u64>() + next(40);
            assert_eq!(
                water_fill_above(amount, &items, &floors),
                water_fill_slow(amount, &items, &floors),
                "{amount} {items:?} {floors:?}"
            );
        }
    }

    #[test]
    fn dhondt_matches_one_by_one() {
        let mut next = random(987u64);
        for _ in 0..3000 {
            let n = next(8) as usize;
            let claims: Vec<u64> = (0..n).map(|_| next(15)).collect();
            let seats = next(60);
            assert_eq!(
                dhondt(seats, &claims),
                dhondt_slow(seats, &claims),
                "{seats} {claims:?}"
            );
        }
    }
}
