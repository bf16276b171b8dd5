//! What a slice's counter sets and its devices' draws on them hold ([`CounterSetView`],
//! [`Draw`]), parsed once per distinct text and shared between the slices that publish it
//! ([`CounterValues`]).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use k8s_openapi::api::resource::v1::{Counter, CounterSet, DeviceCounterConsumption};

use crate::quantity;

/// Counter name → amount in nano-units, sorted by name. A quantity that does not parse (the
/// API server validates them, so only a hand-made object has one) counts as nothing available
/// in a set and as more than any set holds in a draw: such a device never fits.
/// Shared between the sets and draws of equal counters (every GPU of a model publishes the same).
pub type Amounts = Arc<[(Arc<str>, i128)]>;

/// A counter set as its slice publishes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CounterSetView {
    pub name: Arc<str>,
    pub counters: Amounts,
    /// [`digest`] of `counters`.
    digest: u64,
}

/// What a device draws from one counter set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Draw {
    pub set: Arc<str>,
    pub counters: Amounts,
    /// [`digest`] of `counters`.
    digest: u64,
}

/// A hash of `amounts`, made once per distinct amounts: a slice is told apart by hashing what
/// it holds ([`super::SliceView`]), and with a counter set per GPU that is mostly counters.
fn digest(amounts: &[(Arc<str>, i128)]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::hash::DefaultHasher::new();
    amounts.hash(&mut hasher);
    hasher.finish()
}

impl std::hash::Hash for CounterSetView {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        (&*self.name, self.digest).hash(state);
    }
}

impl std::hash::Hash for Draw {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        (&*self.set, self.digest).hash(state);
    }
}

/// Amounts made of a text, their [`digest`], and whether every quantity parsed.
type Made = (Amounts, u64, bool);

/// Amounts made before, with the text they were made of and what an unparsable quantity counted
/// as (which does not matter when every quantity parsed).
#[derive(Debug)]
struct Known {
    text: Box<[u8]>,
    /// [`text_hash`] of the counters.
    hash: u64,
    unparsed: i128,
    made: Made,
}

/// Shares the names and amounts of counters across slices as they are projected: thousands of
/// GPUs of one model publish the same counters, parsed and held once.
///
/// With a counter set per GPU, reading the counters is most of what projecting a slice costs, so
/// they are read where they lie in the object, not copied, and mostly once: a slice lists the
/// same counters in the same places as the slice before it (nodes of one GPU model), so what was
/// found at a place ([`CounterValues::begin_slice`]) is compared first, and only then is the
/// text hashed and looked up.
#[derive(Debug, Default)]
pub struct CounterValues {
    names: crate::intern::Interner<str>,
    amounts: crate::intern::Interner<[(Arc<str>, i128)]>,
    /// Quantities parsed, by their text (`None`: not a quantity).
    parsed: HashMap<Box<str>, Option<i128>, rustc_hash::FxBuildHasher>,
    /// Every amounts made, with the text it was made of.
    known: Vec<Known>,
    /// Places in `known`, by a hash of the text ([`text_hash`]).
    by_hash: HashMap<u64, Vec<usize>, rustc_hash::FxBuildHasher>,
    /// What was found at each place of the slices projected so far (its n-th counters).
    placed: Vec<usize>,
    /// The place of the next counters in the slice being projected.
    place: usize,
}

/// A hash of the names and quantities of `counters`, as written.
fn text_hash(counters: &BTreeMap<String, Counter>) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = rustc_hash::FxHasher::default();
    for (name, c) in counters {
        name.hash(&mut hasher);
        c.value.0.hash(&mut hasher);
    }
    hasher.finish()
}

/// Each name and quantity of `counters` behind its length, in one run of bytes.
fn text_of(counters: &BTreeMap<String, Counter>) -> Box<[u8]> {
    let mut text = Vec::new();
    for (name, c) in counters {
        for part in [name.as_str(), c.value.0.as_str()] {
            let len = u32::try_from(part.len()).unwrap_or(u32::MAX);
            text.extend_from_slice(&len.to_le_bytes());
            text.extend_from_slice(part.as_bytes());
        }
    }
    text.into()
}

/// Whether `text` ([`text_of`]) is the text of `counters`.
fn is_text_of(text: &[u8], counters: &BTreeMap<String, Counter>) -> bool {
    let mut rest = text;
    for (name, c) in counters {
        for part in [name.as_bytes(), c.value.0.as_bytes()] {
            let Some((len, after)) = rest.split_first_chunk::<4>() else {
                return false;
            };
            if u32::from_le_bytes(*len) as usize != part.len() || !after.starts_with(part) {
                return false;
            }
            rest = &after[part.len()..];
        }
    }
    rest.is_empty()
}

/// Reads one byte of every counter name and quantity a slice lists before any is projected:
/// these loads do not depend on each other, so the processor fetches them from memory together
/// rather than one at a time as [`CounterValues::amounts`] compares them (a plan from objects
/// with a counter set per GPU: about 3% faster).
fn warm(spec: &k8s_openapi::api::resource::v1::ResourceSliceSpec) {
    let mut first = 0u8;
    let sets = spec.shared_counters.iter().flatten().map(|s| &s.counters);
    let draws = (spec.devices.iter().flatten())
        .flat_map(|d| d.consumes_counters.iter().flatten())
        .map(|d| &d.counters);
    for counters in sets.chain(draws) {
        for (name, c) in counters {
            first ^= name.as_bytes().first().copied().unwrap_or(0);
            first ^= c.value.0.as_bytes().first().copied().unwrap_or(0);
        }
    }
    std::hint::black_box(first);
}

impl CounterValues {
    /// Starts a slice: its counters are looked up in the order it lists them.
    pub fn begin_slice(&mut self, spec: &k8s_openapi::api::resource::v1::ResourceSliceSpec) {
        warm(spec);
        self.place = 0;
    }

    /// The amounts of `counters`, their [`digest`], and whether every quantity parsed.
    fn amounts(&mut self, counters: &BTreeMap<String, Counter>, unparsed: i128) -> Made {
        let place = self.place;
        self.place += 1;
        let made_of =
            |k: &Known| (k.made.2 || k.unparsed == unparsed) && is_text_of(&k.text, counters);
        if let Some(&i) = self.placed.get(place)
            && made_of(&self.known[i])
        {
            return self.known[i].made.clone();
        }
        let hash = text_hash(counters);
        let found = (self.by_hash.get(&hash).into_iter().flatten())
            .copied()
            .find(|&i| made_of(&self.known[i]));
        let i = found.unwrap_or_else(|| {
            let (amounts, exact) = self.make(counters, unparsed);
            self.known.push(Known {
                text: text_of(counters),
                hash,
                unparsed,
                made: (Arc::clone(&amounts), digest(&amounts), exact),
            });
            let i = self.known.len() - 1;
            self.by_hash.entry(hash).or_default().push(i);
            i
        });
        match self.placed.get_mut(place) {
            Some(placed) => *placed = i,
            None => self.placed.push(i),
        }
        self.known[i].made.clone()
    }

    /// The amounts of `counters`, and whether every quantity parsed.
    fn make(&mut self, counters: &BTreeMap<String, Counter>, unparsed: i128) -> (Amounts, bool) {
        let mut exact = true;
        let values: Vec<(Arc<str>, i128)> = counters
            .iter()
            .map(|(name, c)| {
                let text = c.value.0.as_str();
                let nanos = match self.parsed.get(text) {
                    Some(parsed) => *parsed,
                    None => {
                        let parsed = quantity::parse_nanos(text).ok();
                        self.parsed.insert(Box::from(text), parsed);
                        parsed
                    }
                };
                exact &= nanos.is_some();
                (self.names.intern(name.as_str()), nanos.unwrap_or(unparsed))
            })
            .collect();
        (self.amounts.intern(&values[..]), exact)
    }

    /// Forgets what no slice holds any more.
    pub fn prune(&mut self) {
        self.known.retain(|k| Arc::strong_count(&k.made.0) > 2);
        self.by_hash.clear();
        for (i, k) in self.known.iter().enumerate() {
            self.by_hash.entry(k.hash).or_default().push(i);
        }
        self.placed.clear();
        self.amounts.prune();
        self.names.prune();
    }
}

impl CounterSetView {
    pub fn project(set: &CounterSet, values: &mut CounterValues) -> Self {
        let (counters, digest, _) = values.amounts(&set.counters, 0);
        Self {
            name: values.names.intern(set.name.as_str()),
            counters,
            digest,
        }
    }
}

impl Draw {
    pub fn project(draw: &DeviceCounterConsumption, values: &mut CounterValues) -> Self {
        let (counters, digest, _) = values.amounts(&draw.counters, i128::MAX);
        Self {
            set: values.names.intern(draw.counter_set.as_str()),
            counters,
            digest,
        }
    }
}

/// `counters` as amounts, with their digest (tests build sets and draws by hand).
#[cfg(test)]
fn made_of(counters: &[(&str, i128)]) -> (Amounts, u64) {
    let amounts: Amounts = counters.iter().map(|(n, a)| (Arc::from(*n), *a)).collect();
    let digest = digest(&amounts);
    (amounts, digest)
}

#[cfg(test)]
impl CounterSetView {
    /// A set of `counters` that parsed.
    pub(super) fn of(name: &str, counters: &[(&str, i128)]) -> Self {
        let (counters, digest) = made_of(counters);
        let name = name.into();
        Self {
            name,
            counters,
            digest,
        }
    }
}

#[cfg(test)]
impl Draw {
    /// A draw of `counters` from `set`.
    pub(super) fn of(set: &str, counters: &[(&str, i128)]) -> Self {
        let (counters, digest) = made_of(counters);
        let set = set.into();
        Self {
            set,
            counters,
            digest,
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    use super::*;

    #[test]
    fn a_device_drawing_its_whole_set_draws_what_the_set_holds_unless_a_quantity_is_bad() {
        let published = |memory: &str| CounterSet {
            name: "gpu-0-counter-set".into(),
            counters: [("memory", memory), ("multiprocessors", "98")]
                .map(|(n, v)| {
                    (
                        n.to_owned(),
                        Counter {
                            value: Quantity(v.to_owned()),
                        },
                    )
                })
                .into(),
        };
        let whole = |set: &CounterSet| DeviceCounterConsumption {
            counter_set: set.name.clone(),
            counters: set.counters.clone(),
        };
        let mut values = CounterValues::default();
        let set = published("80Gi");
        let view = CounterSetView::project(&set, &mut values);
        let draw = Draw::project(&whole(&set), &mut values);
        assert!(Arc::ptr_eq(&draw.counters, &view.counters));
        // A quantity that does not parse is nothing in a set and more than any set in a draw.
        let bad = published("eighty");
        let view = CounterSetView::project(&bad, &mut values);
        let draw = Draw::project(&whole(&bad), &mut values);
        assert_eq!(view.counters[0].1, 0);
        assert_eq!(draw.counters[0].1, i128::MAX);
    }
}
