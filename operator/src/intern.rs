//! One interner for values that repeat across many objects: the names of namespaces, classes,
//! drivers and pools in claims ([`crate::core::plan::usage::Names`]), and the DRA CEL input of
//! devices and the names in it ([`crate::dra_cel::DeviceEnvs`]).

use std::collections::HashSet;
use std::hash::Hash;
use std::sync::Arc;

use rustc_hash::FxBuildHasher;

/// Hands out one shared `Arc<T>` per distinct value, so that a value repeated on thousands of
/// objects is held once. It keeps every value it handed out until [`Interner::prune`], which
/// forgets the ones nothing else holds any more (e.g. after a watch's relist).
#[derive(Debug)]
pub struct Interner<T: ?Sized> {
    values: HashSet<Arc<T>, FxBuildHasher>,
}

impl<T: ?Sized> Default for Interner<T> {
    fn default() -> Self {
        Self {
            values: HashSet::default(),
        }
    }
}

impl<T: ?Sized + Hash + Eq> Interner<T> {
    /// The shared copy of `value`, e.g. of a `&str` for an `Interner<str>`.
    pub fn intern(&mut self, value: &T) -> Arc<T>
    where
        for<'a> &'a T: Into<Arc<T>>,
    {
        match self.values.get(value) {
            Some(shared) => shared.clone(),
            None => self.insert(value.into()),
        }
    }

    /// The shared copy of `value`, which is dropped when an equal one is already shared.
    pub fn share(&mut self, value: T) -> Arc<T>
    where
        T: Sized,
    {
        match self.values.get(&value) {
            Some(shared) => shared.clone(),
            None => self.insert(Arc::new(value)),
        }
    }

    fn insert(&mut self, shared: Arc<T>) -> Arc<T> {
        self.values.insert(shared.clone());
        shared
    }

    /// Forgets the values nothing but this interner holds.
    pub fn prune(&mut self) {
        self.values.retain(|v| Arc::strong_count(v) > 1);
        self.values.shrink_to_fit();
    }

    /// How many distinct values are shared.
    pub fn len(&self) -> usize {
        self.values.len()
    }

    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_values_share_one_arc_until_pruned() {
        let mut names: Interner<str> = Interner::default();
        let a = names.intern("gpu.nvidia.com");
        let b = names.intern(&String::from("gpu.nvidia.com"));
        assert!(Arc::ptr_eq(&a, &b));
        let other = names.intern("dra.example.com");
        assert_eq!(names.len(), 2);
        drop(other);
        names.prune();
        assert_eq!(names.len(), 1);
        assert!(Arc::ptr_eq(&names.intern("gpu.nvidia.com"), &a));

        let mut lists: Interner<Vec<u32>> = Interner::default();
        let x = lists.share(vec![1, 2]);
        let y = lists.share(vec![1, 2]);
        assert!(Arc::ptr_eq(&x, &y));
        assert!(!Arc::ptr_eq(&x, &lists.share(vec![3])));
        drop((x, y));
        lists.prune();
        assert!(lists.is_empty());
    }
}
