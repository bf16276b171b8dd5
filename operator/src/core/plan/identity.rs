//! What tells the planner's input objects apart: their name, and their identity (uid and
//! resourceVersion), by which every phase's cache knows an input it has seen.

use std::hash::{Hash, Hasher};

pub(super) fn name_of<K: kube::Resource>(obj: &K) -> String {
    obj.meta().name.clone().unwrap_or_default()
}

/// The identity of an object read from the API server: its uid and resourceVersion, which the
/// server changes on every write; an object without a resourceVersion (read from a file) is
/// identified by its content.
pub(super) fn identity<K: kube::Resource + serde::Serialize>(obj: &K, hasher: &mut impl Hasher) {
    let meta = obj.meta();
    meta.name.hash(hasher);
    match &meta.resource_version {
        Some(rv) => (&meta.uid, rv).hash(hasher),
        None => serde_json::to_vec(obj).unwrap_or_default().hash(hasher),
    }
}
