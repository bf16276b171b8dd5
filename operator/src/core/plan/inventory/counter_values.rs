//! What a slice's counter sets and its devices' draws on them hold ([`CounterSetView`],
//! [`Draw`]), parsed once per distinct text and shared between the slices that publish it
//! ([`CounterValues`]).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use k8s_openapi::api::resource::v1::{Counter, CounterSet, DeviceCounterConsumption};

use crate::core::quantity;

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
    /// Whether every quantity parsed: a device drawing the same text draws these amounts.
    exact: bool,
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

/// Shares the names and amounts of counters across slices as they are projected: thousands of
/// GPUs of one model publish the same counters, parsed and held once.
#[derive(Debug, Default)]
pub struct CounterValues {
    names: crate::intern::Interner<str>,
    amounts: crate::intern::Interner<[(Arc<str>, i128)]>,
    /// Quantities parsed, by their text (`None`: not a quantity).
    parsed: HashMap<Box<str>, Option<i128>, rustc_hash::FxBuildHasher>,
    /// Amounts already made, by the counters' text ([`CounterValues::text`]).
    made: HashMap<Box<[u8]>, Made, rustc_hash::FxBuildHasher>,
    /// The text of the counters being looked up (kept to save an allocation a lookup).
    text: Vec<u8>,
}

impl CounterValues {
    /// The amounts of `counters`, their [`digest`], and whether every quantity parsed.
    fn amounts(&mut self, counters: &BTreeMap<String, Counter>, unparsed: i128) -> Made {
        Self::text(&mut self.text, counters, unparsed);
        if let Some(made) = self.made.get(&self.text[..]) {
            return made.clone();
        }
        let (amounts, exact) = self.make(counters, unparsed);
        let made = (Arc::clone(&amounts), digest(&amounts), exact);
        self.made.insert(Box::from(&self.text[..]), made.clone());
        made
    }

    /// `counters` as one run of bytes, each name and quantity behind its length, after what an
    /// unparsable quantity counts as: one hash and one comparison find amounts made before.
    fn text(text: &mut Vec<u8>, counters: &BTreeMap<String, Counter>, unparsed: i128) {
        text.clear();
        text.extend_from_slice(&unparsed.to_le_bytes());
        for (name, c) in counters {
            for part in [name.as_str(), c.value.0.as_str()] {
                let len = u32::try_from(part.len()).unwrap_or(u32::MAX);
                text.extend_from_slice(&len.to_le_bytes());
                text.extend_from_slice(part.as_bytes());
            }
        }
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
        self.made
            .retain(|_, (amounts, _, _)| Arc::strong_count(amounts) > 2);
        self.amounts.prune();
        self.names.prune();
    }
}

impl CounterSetView {
    pub fn project(set: &CounterSet, values: &mut CounterValues) -> Self {
        let (counters, digest, exact) = values.amounts(&set.counters, 0);
        Self {
            name: values.names.intern(set.name.as_str()),
            counters,
            digest,
            exact,
        }
    }
}

impl Draw {
    /// `draw` of a slice whose counter set of the same name is `set` (as published, and as
    /// projected), if it has one.
    pub fn project(
        draw: &DeviceCounterConsumption,
        set: Option<(&CounterSet, &CounterSetView)>,
        values: &mut CounterValues,
    ) -> Self {
        // A full GPU draws its whole set: the amounts just made of the set, found without
        // reading the text twice.
        if let Some((published, view)) = set
            && view.exact
            && draw.counters == published.counters
        {
            return Self {
                set: Arc::clone(&view.name),
                counters: Arc::clone(&view.counters),
                digest: view.digest,
            };
        }
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
            exact: true,
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
        let draw = Draw::project(&whole(&set), Some((&set, &view)), &mut values);
        assert!(Arc::ptr_eq(&draw.counters, &view.counters));
        // The same text read the long way makes the same amounts.
        let read = Draw::project(&whole(&set), None, &mut values);
        assert_eq!(read, draw);
        assert!(Arc::ptr_eq(&read.counters, &view.counters));
        // A quantity that does not parse is nothing in a set and more than any set in a draw.
        let bad = published("eighty");
        let view = CounterSetView::project(&bad, &mut values);
        let draw = Draw::project(&whole(&bad), Some((&bad, &view)), &mut values);
        assert_eq!(view.counters[0].1, 0);
        assert_eq!(draw.counters[0].1, i128::MAX);
    }
}
