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

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

pub use super::counter_values::{Amounts, CounterSetView, CounterValues, Draw};
use super::most_that_fit::{Fit, fits_alone, most_that_fit};

/// What one device draws, by slot of its group's budget: shared between the devices that draw
/// alike (the same MIG placement of every GPU of a model), as budgets are.
pub type Slots = Arc<[(u16, i128)]>;

/// Shares the budgets and draws of counter groups between pools as they are built (every GPU
/// of a model has the same).
#[derive(Debug, Default)]
pub struct GroupValues {
    budgets: crate::intern::Interner<[i128]>,
    slots: crate::intern::Interner<[(u16, i128)]>,
    /// The counters of pools built, by what their slices publish: every node of a model
    /// publishes the same sets and draws, so thousands of pools share a few.
    /// Keyed by [`PoolKey::hash_of`].
    pools: HashMap<u64, Vec<(PoolKey, Arc<PoolCounters>)>, rustc_hash::FxBuildHasher>,
}

/// The counter sets and draws of a pool, in the order [`PoolCounters::build`] takes them.
#[derive(Debug)]
struct PoolKey {
    sets: Box<[CounterSetView]>,
    draws: Box<[Draw]>,
    /// Where each device's draws end in `draws`.
    ends: Box<[u32]>,
}

impl PoolKey {
    /// A hash of what a pool publishes, by where its values are, which is the same for equal
    /// values: they are interned by [`CounterValues`] (and held here, so no other value takes
    /// their place). Made of the pool's views, not of a key: most pools find theirs.
    fn hash_of(sets: &[&CounterSetView], draws: &[&[Draw]]) -> u64 {
        use std::hash::{Hash, Hasher};
        let mut hasher = rustc_hash::FxHasher::default();
        let mut at = |name: &Arc<str>, amounts: &Amounts| {
            Arc::as_ptr(name).cast::<u8>().hash(&mut hasher);
            Arc::as_ptr(amounts).cast::<u8>().hash(&mut hasher);
        };
        for set in sets {
            at(&set.name, &set.counters);
        }
        for draw in draws.iter().flat_map(|d| d.iter()) {
            at(&draw.set, &draw.counters);
        }
        for device_draws in draws {
            device_draws.len().hash(&mut hasher);
        }
        hasher.finish()
    }

    fn of(sets: &[&CounterSetView], draws: &[&[Draw]]) -> Self {
        let mut ends = Vec::with_capacity(draws.len());
        let mut flat = Vec::with_capacity(draws.len());
        for device_draws in draws {
            flat.extend_from_slice(device_draws);
            ends.push(u32::try_from(flat.len()).unwrap_or(u32::MAX));
        }
        PoolKey {
            sets: sets.iter().map(|&s| s.clone()).collect(),
            draws: flat.into_boxed_slice(),
            ends: ends.into_boxed_slice(),
        }
    }

    /// Whether the key is that of a pool publishing `sets` and `draws`.
    fn is(&self, sets: &[&CounterSetView], draws: &[&[Draw]]) -> bool {
        let mut start = 0;
        self.sets.len() == sets.len()
            && self.ends.len() == draws.len()
            && (self.sets.iter().zip(sets)).all(|(a, b)| a == *b)
            && (self.ends.iter().zip(draws)).all(|(&end, device_draws)| {
                let end = end as usize;
                let same = self.draws.get(start..end) == Some(*device_draws);
                start = end;
                same
            })
    }
}

/// A copy shares with the pools built before it through their values, not through the
/// interners: it starts empty.
impl Clone for GroupValues {
    fn clone(&self) -> Self {
        Self::default()
    }
}

impl GroupValues {
    /// Forgets what no pool holds any more.
    pub fn prune(&mut self) {
        self.pools.retain(|_, built| {
            built.retain(|(_, counters)| Arc::strong_count(counters) > 1);
            !built.is_empty()
        });
        self.budgets.prune();
        self.slots.prune();
    }
}

/// Counter sets of one pool tied together by the devices that draw on them, and those devices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CounterGroup {
    /// The sets' names, sorted.
    pub sets: Box<[Arc<str>]>,
    /// What every counter of the sets holds, by slot.
    budget: Arc<[i128]>,
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
        let mut held = 0;
        // The free candidates: how many, and the first one's draws.
        let (mut free, mut first) = (0, None);
        let is_allocated = |i: usize| allocated.get(i).copied().unwrap_or(false);
        for (i, (_, draws)) in self.devices.iter().enumerate() {
            if is_allocated(i) {
                held += u32::from(candidate(i));
            } else if candidate(i) {
                free += 1;
                first.get_or_insert(&**draws);
            }
        }
        // What the allocated devices leave, worked out only when a free candidate needs it
        // (an allocated whole GPU, the usual group, has none).
        let mut left: std::borrow::Cow<[i128]> = std::borrow::Cow::Borrowed(&self.budget);
        if free > 0 {
            let taken = (self.devices.iter().enumerate()).filter(|&(i, _)| is_allocated(i));
            for (_, (_, draws)) in taken {
                let left = left.to_mut();
                for &(slot, amount) in draws.iter() {
                    let slot = &mut left[usize::from(slot)];
                    *slot = slot.saturating_sub(amount);
                }
            }
        }
        let mut fit = match first {
            None => Fit {
                exact: true,
                ..Fit::default()
            },
            // A GPU's full device, say: no search and nothing gathered (most groups are one
            // device of a policy, and a plan from objects fits 40,000 groups).
            Some(one) if free == 1 => Fit {
                more: u32::from(fits_alone(&left, one)),
                exact: true,
                ..Fit::default()
            },
            Some(_) => {
                let many: Vec<&[(u16, i128)]> = (self.devices.iter().enumerate())
                    .filter(|&(i, _)| !is_allocated(i) && candidate(i))
                    .map(|(_, (_, draws))| &**draws)
                    .collect();
                most_that_fit(&left, &many)
            }
        };
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
    /// [`PoolCounters::build`], shared with the pools built before that publish the same.
    pub fn shared(
        sets: &[&CounterSetView],
        draws: &[&[Draw]],
        values: &mut GroupValues,
    ) -> Option<Arc<Self>> {
        if draws.iter().all(|d| d.is_empty()) {
            return None;
        }
        let hash = PoolKey::hash_of(sets, draws);
        let known = values.pools.get(&hash).into_iter().flatten();
        if let Some((_, built)) = known.into_iter().find(|(k, _)| k.is(sets, draws)) {
            return Some(Arc::clone(built));
        }
        let built = Arc::new(Self::build(sets, draws, values)?);
        let key = PoolKey::of(sets, draws);
        (values.pools.entry(hash).or_default()).push((key, Arc::clone(&built)));
        Some(built)
    }

    /// The counters of a pool whose slices publish `sets` and whose devices draw `draws` (in the
    /// pool's device order). `None` when no device draws on counters. A set published twice is
    /// the pool's error (see the caller), the first one is kept here.
    pub fn build(
        sets: &[&CounterSetView],
        draws: &[&[Draw]],
        shared: &mut GroupValues,
    ) -> Option<Self> {
        if draws.iter().all(|d| d.is_empty()) {
            return None;
        }
        let mut by_name: BTreeMap<&str, usize> = BTreeMap::new();
        for (i, set) in sets.iter().enumerate() {
            by_name.entry(&set.name).or_insert(i);
        }
        let mut ties = Ties::new(sets.len());
        let mut drawing: Vec<Drawing> = (draws.iter())
            .map(|device_draws| ties.tie(device_draws, sets, &by_name))
            .collect();
        // Groups numbered by their first set's name, slots by (set, counter).
        let mut group_of_root: Vec<Option<u32>> = vec![None; sets.len()];
        let mut members: Vec<Vec<usize>> = Vec::new();
        for &i in by_name.values() {
            let g = *group_of_root[ties.root(i)].get_or_insert_with(|| {
                members.push(Vec::new());
                u32::try_from(members.len() - 1).unwrap_or(u32::MAX)
            });
            members[g as usize].push(i);
        }
        let mut slots = SlotPlaces::new(sets);
        let mut groups: Vec<CounterGroup> = (members.iter())
            .map(|sets_of| slots.group(sets_of, &mut shared.budgets))
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
                group = group_of_root[ties.root(i)].unwrap_or(0);
                for (name, amount) in draw.counters.iter() {
                    // `set_of` made sure the set has every counter the draw names.
                    taken.push((slots.of(i, name).unwrap_or(u16::MAX), *amount));
                }
            }
            *how = Drawing::Group(group);
            let place = u32::try_from(place).unwrap_or(u32::MAX);
            devices[group as usize].push((place, shared.slots.intern(&taken[..])));
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

/// Counter sets tied together by devices drawing on several (union-find by set index).
struct Ties(Vec<usize>);

impl Ties {
    fn new(sets: usize) -> Self {
        Self((0..sets).collect())
    }

    fn root(&mut self, mut i: usize) -> usize {
        let parent = &mut self.0;
        while parent[i] != i {
            parent[i] = parent[parent[i]];
            i = parent[i];
        }
        i
    }

    /// Ties the sets one device draws on, and says how it draws. A draw the pool cannot serve
    /// ties nothing: the device is never allocated.
    fn tie(
        &mut self,
        device_draws: &[Draw],
        sets: &[&CounterSetView],
        by_name: &BTreeMap<&str, usize>,
    ) -> Drawing {
        if let Some(reason) = (device_draws.iter()).find_map(|d| set_of(d, sets, by_name).err()) {
            return Drawing::Unknown(reason);
        }
        let mut first: Option<usize> = None;
        for draw in device_draws {
            let Ok(i) = set_of(draw, sets, by_name) else {
                continue;
            };
            let root = self.root(i);
            match first {
                None => first = Some(root),
                Some(f) => self.0[root] = f,
            }
        }
        match first {
            None => Drawing::Nothing,
            // Numbered once the groups are known.
            Some(_) => Drawing::Group(0),
        }
    }
}

/// Where each counter of a pool's sets sits in its group's budget: a set's first counter at
/// `first[set]`, its others after it in name order (a set's counters are sorted by name).
struct SlotPlaces<'a> {
    sets: &'a [&'a CounterSetView],
    first: Vec<u16>,
}

impl<'a> SlotPlaces<'a> {
    fn new(sets: &'a [&'a CounterSetView]) -> Self {
        Self {
            sets,
            first: vec![0; sets.len()],
        }
    }

    fn of(&self, set: usize, counter: &str) -> Option<u16> {
        let counters = &self.sets[set].counters;
        let at = (counters.binary_search_by(|(n, _)| (**n).cmp(counter))).ok()?;
        Some(self.first[set] + u16::try_from(at).unwrap_or(u16::MAX))
    }

    /// The group of sets `sets_of` (indices, by name), its budget laid out; no devices yet.
    fn group(
        &mut self,
        sets_of: &[usize],
        budgets: &mut crate::intern::Interner<[i128]>,
    ) -> CounterGroup {
        let mut budget = Vec::new();
        for &i in sets_of {
            self.first[i] = u16::try_from(budget.len()).unwrap_or(u16::MAX);
            budget.extend(self.sets[i].counters.iter().map(|(_, amount)| *amount));
        }
        let share_slot = (sets_of.first()).and_then(|&first| {
            ["multiprocessors", "memory"]
                .iter()
                .find_map(|name| self.of(first, name))
        });
        CounterGroup {
            sets: sets_of.iter().map(|&i| self.sets[i].name.clone()).collect(),
            budget: budgets.intern(&budget[..]),
            devices: Box::default(),
            share_slot,
        }
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
    // A full GPU draws its whole set: the same (shared) counters.
    let set = &sets[i].counters;
    if Arc::ptr_eq(&draw.counters, set) {
        return Ok(i);
    }
    match (draw.counters.iter())
        .find(|(name, _)| set.binary_search_by(|(n, _)| n.cmp(name)).is_err())
    {
        Some((name, _)) => Err(format!(
            "draws counter {name} of counter set {}, which has no such counter",
            draw.set
        )),
        None => Ok(i),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(name: &str, counters: &[(&str, i128)]) -> CounterSetView {
        CounterSetView::of(name, counters)
    }

    fn draw(set: &str, counters: &[(&str, i128)]) -> Draw {
        Draw::of(set, counters)
    }

    #[test]
    fn a_group_fits_its_free_candidates_in_what_the_allocated_devices_leave() {
        // A GPU of 7 compute units: three 1-unit slices and one 2-unit slice, the first slice
        // allocated. The 1-unit policy holds one and fits two more; the 2-unit device is not
        // its candidate, and the allocated slice is not counted again as room.
        let sets = [set("gpu", &[("compute", 7)])];
        let one = [draw("gpu", &[("compute", 1)])];
        let two = [draw("gpu", &[("compute", 2)])];
        let draws: [&[Draw]; 4] = [&one, &one, &one, &two];
        let counters = PoolCounters::build(
            &sets.iter().collect::<Vec<_>>(),
            &draws,
            &mut Default::default(),
        )
        .unwrap();
        let g = &counters.groups[0];
        let allocated = [true, false, false, false];
        let fit = g.fit(&allocated, |i| i < 3);
        assert_eq!((fit.held, fit.more, fit.exact), (1, 2, true));
        // The 2-unit policy: nothing held, and one more fits in the 6 units left.
        let fit = g.fit(&allocated, |i| i == 3);
        assert_eq!((fit.held, fit.more), (0, 1));
        // Nothing allocated: the three slices fit whole.
        let fit = g.fit(&[false; 4], |i| i < 3);
        assert_eq!((fit.held, fit.more), (0, 3));
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
        let counters = PoolCounters::build(
            &sets.iter().collect::<Vec<_>>(),
            &draws,
            &mut Default::default(),
        )
        .unwrap();
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
        let no_draws = PoolCounters::build(
            &sets.iter().collect::<Vec<_>>(),
            &[&[], &[]],
            &mut Default::default(),
        );
        assert!(no_draws.is_none());
    }
}
