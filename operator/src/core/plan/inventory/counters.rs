//! Counters that devices share (partitionable devices, KEP-4815, beta and on by default in
//! Kubernetes 1.36): a pool publishes counter sets (`spec.sharedCounters`, in slices of their
//! own since 1.35), and each device names what it draws from them (`consumesCounters`). A device
//! can be allocated only while what it draws is left; the allocator subtracts the draws of the
//! allocated devices (`checkAvailableCounters` in
//! `staging/src/k8s.io/dynamic-resource-allocation/structured/internal/incubating/allocator_incubating.go`).
//!
//! The NVIDIA driver's dynamic MIG publishes one counter set per GPU, the full GPU drawing all of
//! it and every MIG placement its memory slices and share of the rest (`partitions.go` in
//! kubernetes-sigs/dra-driver-nvidia-gpu). Counting devices would count each GPU once per
//! placement. What counts instead is the most devices that fit the counters at the same time:
//! [`most_that_fit`], over each [`CounterGroup`] (the sets tied together by devices drawing on
//! several; with the NVIDIA driver, one GPU).

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::resource::v1::{Counter, CounterSet, DeviceCounterConsumption};

use crate::core::quantity;

/// Counter name → amount in nano-units, sorted by name. A quantity that does not parse (the
/// API server validates them, so only a hand-made object has one) counts as nothing available
/// in a set and as more than any set holds in a draw: such a device never fits.
pub type Amounts = Box<[(Arc<str>, i128)]>;

/// What one device draws, by slot of its group's budget.
pub type Slots = Box<[(u16, i128)]>;

/// A counter set as its slice publishes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CounterSetView {
    pub name: Arc<str>,
    pub counters: Amounts,
}

/// What a device draws from one counter set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Draw {
    pub set: Arc<str>,
    pub counters: Amounts,
}

fn amounts(counters: &BTreeMap<String, Counter>, unparsed: i128) -> Amounts {
    counters
        .iter()
        .map(|(name, c)| {
            let nanos = quantity::parse_nanos(&c.value.0).unwrap_or(unparsed);
            (Arc::from(name.as_str()), nanos)
        })
        .collect()
}

impl CounterSetView {
    pub fn project(set: &CounterSet) -> Self {
        Self {
            name: Arc::from(set.name.as_str()),
            counters: amounts(&set.counters, 0),
        }
    }
}

impl Draw {
    pub fn project(draw: &DeviceCounterConsumption) -> Self {
        Self {
            set: Arc::from(draw.counter_set.as_str()),
            counters: amounts(&draw.counters, i128::MAX),
        }
    }
}

/// Counter sets of one pool tied together by the devices that draw on them, and those devices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CounterGroup {
    /// The sets' names, sorted.
    pub sets: Box<[Arc<str>]>,
    /// What every counter of the sets holds, by slot.
    budget: Box<[i128]>,
    /// Each device of the group: its place in the pool's device order, and what it draws by
    /// slot of `budget`.
    devices: Box<[(u32, Slots)]>,
    /// The slot that says how much of the group a device is: the first set's
    /// `multiprocessors` (a MIG device's compute), else its `memory`.
    share_slot: Option<u16>,
}

impl CounterGroup {
    /// The places, in the pool's device order, of the group's devices.
    pub fn device_places(&self) -> impl Iterator<Item = u32> + '_ {
        self.devices.iter().map(|(place, _)| *place)
    }

    /// What device `i` (in [`CounterGroup::device_places`]' order) draws of the group's
    /// [`share slot`](CounterGroup), and what the group holds of it.
    pub fn share(&self, i: usize) -> Option<(i128, i128)> {
        let slot = self.share_slot?;
        let (_, draws) = self.devices.get(i)?;
        let draw: i128 = (draws.iter())
            .filter(|(s, _)| *s == slot)
            .map(|(_, a)| *a)
            .sum();
        Some((draw, self.budget[usize::from(slot)]))
    }

    /// How many of the devices `candidate(i)` names (`i`: a device's index in the group, in
    /// [`CounterGroup::device_places`]' order) fit at once beside those `allocated` marks, which
    /// draw first; and how many of the allocated devices `candidate` also names.
    pub fn fit(&self, allocated: &[bool], candidate: impl Fn(usize) -> bool) -> Fit {
        let mut left = self.budget.to_vec();
        let mut held = 0;
        let mut free: Vec<&[(u16, i128)]> = Vec::new();
        for (i, (_, draws)) in self.devices.iter().enumerate() {
            if allocated.get(i).copied().unwrap_or(false) {
                for &(slot, amount) in draws.iter() {
                    let slot = &mut left[usize::from(slot)];
                    *slot = slot.saturating_sub(amount);
                }
                held += u32::from(candidate(i));
            } else if candidate(i) {
                free.push(draws);
            }
        }
        let mut fit = most_that_fit(&left, &free);
        fit.held = held;
        fit
    }
}

/// How a device of a pool draws on counters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Drawing {
    /// On none: it counts alone.
    Nothing,
    /// On the sets of group `n` of the pool.
    Group(u32),
    /// On a set or counter the pool does not publish: the allocator cannot allocate it.
    Unknown(String),
}

/// The counters of one pool: its groups, and how each device draws (in the pool's device order).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PoolCounters {
    pub groups: Box<[CounterGroup]>,
    pub drawing: Box<[Drawing]>,
}

impl PoolCounters {
    /// The counters of a pool whose slices publish `sets` and whose devices draw `draws` (in the
    /// pool's device order). `None` when no device draws on counters. A set published twice is
    /// the pool's error (see the caller), the first one is kept here.
    pub fn build(sets: &[&CounterSetView], draws: &[&[Draw]]) -> Option<Self> {
        if draws.iter().all(|d| d.is_empty()) {
            return None;
        }
        let mut by_name: BTreeMap<&str, usize> = BTreeMap::new();
        for (i, set) in sets.iter().enumerate() {
            by_name.entry(&set.name).or_insert(i);
        }
        // Sets tied by a device drawing on several share a group (union-find by set index).
        let mut parent: Vec<usize> = (0..sets.len()).collect();
        fn root(parent: &mut [usize], mut i: usize) -> usize {
            while parent[i] != i {
                parent[i] = parent[parent[i]];
                i = parent[i];
            }
            i
        }
        let mut drawing: Vec<Drawing> = Vec::with_capacity(draws.len());
        for device_draws in draws {
            let found: Result<Vec<usize>, String> = (device_draws.iter())
                .map(|draw| set_of(draw, sets, &by_name))
                .collect();
            drawing.push(match found {
                Err(reason) => Drawing::Unknown(reason),
                Ok(found) if found.is_empty() => Drawing::Nothing,
                Ok(found) => {
                    let first = root(&mut parent, found[0]);
                    for &other in &found[1..] {
                        let other = root(&mut parent, other);
                        parent[other] = first;
                    }
                    Drawing::Group(0)
                }
            });
        }
        // Groups numbered by their first set's name, slots by (set, counter).
        let mut group_of_root: BTreeMap<usize, u32> = BTreeMap::new();
        let mut members: Vec<Vec<usize>> = Vec::new();
        for &i in by_name.values() {
            let r = root(&mut parent, i);
            let g = *group_of_root.entry(r).or_insert_with(|| {
                members.push(Vec::new());
                u32::try_from(members.len() - 1).unwrap_or(u32::MAX)
            });
            members[g as usize].push(i);
        }
        let mut slots: BTreeMap<(usize, &str), u16> = BTreeMap::new();
        let mut groups: Vec<CounterGroup> = members
            .iter()
            .map(|sets_of| {
                let mut budget = Vec::new();
                for &i in sets_of {
                    for (name, amount) in sets[i].counters.iter() {
                        slots.insert((i, name), u16::try_from(budget.len()).unwrap_or(u16::MAX));
                        budget.push(*amount);
                    }
                }
                let first = sets_of.first().copied();
                let share_slot = ["multiprocessors", "memory"]
                    .iter()
                    .find_map(|name| slots.get(&(first?, *name)).copied());
                CounterGroup {
                    sets: sets_of.iter().map(|&i| sets[i].name.clone()).collect(),
                    budget: budget.into_boxed_slice(),
                    devices: Box::default(),
                    share_slot,
                }
            })
            .collect();
        let mut devices: Vec<Vec<(u32, Slots)>> = vec![Vec::new(); groups.len()];
        for (place, (device_draws, how)) in draws.iter().zip(drawing.iter_mut()).enumerate() {
            if !matches!(how, Drawing::Group(_)) {
                continue;
            }
            let mut taken = Vec::new();
            let mut group = 0;
            for draw in device_draws.iter() {
                let i = by_name[&*draw.set];
                group = group_of_root[&root(&mut parent, i)];
                for (name, amount) in draw.counters.iter() {
                    taken.push((slots[&(i, &**name)], *amount));
                }
            }
            *how = Drawing::Group(group);
            let place = u32::try_from(place).unwrap_or(u32::MAX);
            devices[group as usize].push((place, taken.into_boxed_slice()));
        }
        for (group, devices) in groups.iter_mut().zip(devices) {
            group.devices = devices.into_boxed_slice();
        }
        Some(Self {
            groups: groups.into_boxed_slice(),
            drawing: drawing.into_boxed_slice(),
        })
    }
}

/// The index in `sets` of the set `draw` draws on, or why the allocator cannot allocate it.
fn set_of(
    draw: &Draw,
    sets: &[&CounterSetView],
    by_name: &BTreeMap<&str, usize>,
) -> Result<usize, String> {
    let &i = (by_name.get(&*draw.set)).ok_or_else(|| {
        format!(
            "draws on counter set {}, which the pool does not publish",
            draw.set
        )
    })?;
    match (draw.counters.iter()).find(|(name, _)| !sets[i].counters.iter().any(|(n, _)| n == name))
    {
        Some((name, _)) => Err(format!(
            "draws counter {name} of counter set {}, which has no such counter",
            draw.set
        )),
        None => Ok(i),
    }
}

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
        }
    }

    fn set(name: &str, counters: &[(&str, i128)]) -> CounterSetView {
        CounterSetView {
            name: name.into(),
            counters: counters.iter().map(|(n, a)| (Arc::from(*n), *a)).collect(),
        }
    }

    fn draw(set: &str, counters: &[(&str, i128)]) -> Draw {
        Draw {
            set: set.into(),
            counters: counters.iter().map(|(n, a)| (Arc::from(*n), *a)).collect(),
        }
    }

    #[test]
    fn sets_tied_by_a_device_form_one_group_and_unknown_draws_are_told() {
        let sets = [
            set("a", &[("x", 2)]),
            set("b", &[("y", 2)]),
            set("c", &[("z", 1)]),
        ];
        let both = [draw("a", &[("x", 1)]), draw("b", &[("y", 1)])];
        let only_c = [draw("c", &[("z", 1)])];
        let missing_set = [draw("d", &[("x", 1)])];
        let missing_counter = [draw("a", &[("w", 1)])];
        let draws: [&[Draw]; 5] = [&both, &only_c, &[], &missing_set, &missing_counter];
        let counters = PoolCounters::build(&sets.iter().collect::<Vec<_>>(), &draws).unwrap();
        let groups: Vec<Vec<&str>> = (counters.groups.iter())
            .map(|g| g.sets.iter().map(|s| &**s).collect())
            .collect();
        assert_eq!(groups, [vec!["a", "b"], vec!["c"]]);
        assert_eq!(counters.drawing[0], Drawing::Group(0));
        assert_eq!(counters.drawing[1], Drawing::Group(1));
        assert_eq!(counters.drawing[2], Drawing::Nothing);
        assert_eq!(
            counters.drawing[3],
            Drawing::Unknown("draws on counter set d, which the pool does not publish".into())
        );
        assert_eq!(
            counters.drawing[4],
            Drawing::Unknown("draws counter w of counter set a, which has no such counter".into())
        );
        // Group 0 holds the tying device (index 0): free, it fits; allocated, it is held.
        let g = &counters.groups[0];
        let fit = g.fit(&[false], |i| i == 0);
        assert_eq!(
            (fit.held, fit.more),
            (0, 1),
            "one device of its kind at place 0"
        );
        let fit = g.fit(&[true], |i| i == 0);
        assert_eq!((fit.held, fit.more), (1, 0));
        assert!(PoolCounters::build(&sets.iter().collect::<Vec<_>>(), &[&[], &[]]).is_none());
    }
}
