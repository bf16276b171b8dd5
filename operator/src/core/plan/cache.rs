//! The one cache of the planner: a value per key, computed from an input and kept until the
//! input changes. Every phase keeps what it computed in one of these, so "same input as last
//! time" is decided in one place, by comparing inputs (a fingerprint, or the input itself).

use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};

/// A fingerprint of `value`, for an input that is cheaper to hash than to keep.
pub fn fingerprint(value: &impl Hash) -> u64 {
    let mut hasher = std::hash::DefaultHasher::new();
    value.hash(&mut hasher);
    hasher.finish()
}

/// What a value made with `owners` as its owner references depends on: who they are and which
/// one controls it (the rest of a reference follows from its uid).
pub fn owners_key(
    owners: Option<&Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference>>,
) -> Option<Vec<(&str, Option<bool>)>> {
    owners.map(|o| o.iter().map(|r| (r.uid.as_str(), r.controller)).collect())
}

/// Values by key, each with the input it was computed from.
///
/// A pass asks for the values it needs with [`Cache::get`]; [`Cache::sweep`] then forgets the
/// keys the pass did not ask for (a deleted policy, a namespace that left its team).
#[derive(Debug)]
pub struct Cache<K, I, V> {
    entries: BTreeMap<K, Entry<I, V>>,
    /// `false` for a single plan: every value is computed, no input is compared.
    keep: bool,
    /// Counts sweeps; an entry asked for since the last sweep carries the current count.
    pass: u64,
}

#[derive(Debug)]
struct Entry<I, V> {
    input: I,
    value: V,
    pass: u64,
}

impl<K, I, V> Default for Cache<K, I, V> {
    fn default() -> Self {
        Self::new(true)
    }
}

impl<K, I, V> Cache<K, I, V> {
    /// A cache that keeps values (`keep`), or one that computes every value it is asked for,
    /// for a planner that plans once.
    pub fn new(keep: bool) -> Self {
        Self {
            entries: BTreeMap::new(),
            keep,
            pass: 0,
        }
    }
}

impl<K: Ord, I: PartialEq, V> Cache<K, I, V> {
    /// The value of `key` for `input`: the kept one if it was computed from an equal input,
    /// `compute(&input)` otherwise.
    pub fn get(&mut self, key: K, input: I, compute: impl FnOnce(&I) -> V) -> &V {
        let pass = self.pass;
        let keep = self.keep;
        let entry = match self.entries.entry(key) {
            std::collections::btree_map::Entry::Occupied(slot) => {
                let entry = slot.into_mut();
                if !keep || entry.input != input {
                    entry.value = compute(&input);
                    entry.input = input;
                }
                entry
            }
            std::collections::btree_map::Entry::Vacant(slot) => slot.insert(Entry {
                value: compute(&input),
                input,
                pass,
            }),
        };
        entry.pass = pass;
        &entry.value
    }

    /// [`Cache::get`], where `compute` is also handed what `key` held before, to reuse what
    /// of it is still right.
    pub fn get_reusing(
        &mut self,
        key: K,
        input: I,
        compute: impl FnOnce(&I, Option<V>) -> V,
    ) -> &V {
        let stale = (self.entries.get(&key)).is_some_and(|e| !self.keep || e.input != input);
        if stale {
            let before = self.entries.remove(&key).map(|e| e.value);
            let value = compute(&input, before.filter(|_| self.keep));
            let pass = self.pass;
            let entry = (self.entries.entry(key)).or_insert(Entry { input, value, pass });
            return &entry.value;
        }
        self.get(key, input, |input| compute(input, None))
    }

    /// The value `get` last gave for `key`.
    pub fn value<Q: Ord + ?Sized>(&self, key: &Q) -> Option<&V>
    where
        K: std::borrow::Borrow<Q>,
    {
        self.entries.get(key).map(|e| &e.value)
    }

    /// Forgets `key` (its input is gone); returns what it held.
    pub fn remove<Q: Ord + ?Sized>(&mut self, key: &Q) -> Option<V>
    where
        K: std::borrow::Borrow<Q>,
    {
        self.entries.remove(key).map(|e| e.value)
    }

    /// Every value, by key.
    pub fn values(&self) -> impl Iterator<Item = (&K, &V)> {
        self.entries.iter().map(|(k, e)| (k, &e.value))
    }

    /// Every value with the input it was computed from, by key.
    pub fn entries(&self) -> impl Iterator<Item = (&K, &I, &V)> {
        self.entries.iter().map(|(k, e)| (k, &e.input, &e.value))
    }

    /// Forgets every key [`Cache::get`] was not asked for since the last sweep; returns them.
    pub fn sweep(&mut self) -> Vec<K>
    where
        K: Clone,
    {
        let pass = self.pass;
        let stale: Vec<K> = self
            .entries
            .iter()
            .filter(|(_, e)| e.pass != pass)
            .map(|(k, _)| k.clone())
            .collect();
        for key in &stale {
            self.entries.remove(key);
        }
        self.pass += 1;
        stale
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_is_computed_again_only_when_its_input_changes() {
        let mut cache: Cache<&str, u32, String> = Cache::default();
        let mut computed = 0;
        let mut compute = |input: &u32| {
            computed += 1;
            format!("v{input}")
        };
        assert_eq!(cache.get("a", 1, &mut compute), "v1");
        assert_eq!(cache.get("a", 1, &mut compute), "v1");
        assert_eq!(cache.get("a", 2, &mut compute), "v2");
        assert_eq!(computed, 2);
    }

    #[test]
    fn a_value_computed_again_is_handed_what_the_key_held_before() {
        let mut cache: Cache<&str, u32, Vec<u32>> = Cache::default();
        let mut compute = |input: &u32, before: Option<Vec<u32>>| {
            let mut v = before.unwrap_or_default();
            v.push(*input);
            v
        };
        assert_eq!(cache.get_reusing("a", 1, &mut compute), &[1]);
        assert_eq!(cache.get_reusing("a", 1, &mut compute), &[1]);
        assert_eq!(cache.get_reusing("a", 2, &mut compute), &[1, 2]);
        assert_eq!(cache.get_reusing("b", 3, &mut compute), &[3]);
        // One that does not keep hands nothing over.
        let mut single: Cache<&str, u32, Vec<u32>> = Cache::new(false);
        single.get_reusing("a", 1, &mut compute);
        assert_eq!(single.get_reusing("a", 2, &mut compute), &[2]);
    }

    #[test]
    fn a_sweep_forgets_the_keys_not_asked_for() {
        let mut cache: Cache<&str, u32, u32> = Cache::default();
        cache.get("a", 1, |i| *i);
        cache.get("b", 1, |i| *i);
        assert!(cache.sweep().is_empty());
        cache.get("a", 1, |i| *i);
        assert_eq!(cache.sweep(), ["b"]);
        assert_eq!(cache.values().map(|(k, _)| *k).collect::<Vec<_>>(), ["a"]);
        assert_eq!(cache.value(&"b"), None);
    }

    #[test]
    fn a_cache_that_does_not_keep_computes_every_time() {
        let mut cache: Cache<&str, u32, u32> = Cache::new(false);
        let mut computed = 0;
        for _ in 0..3 {
            cache.get("a", 1, |i| {
                computed += 1;
                *i
            });
        }
        assert_eq!(computed, 3);
    }
}
