//! What to write: the difference between the plan and what is live. Pure; the controller
//! executes the writes. A steady state gives no write at all.
//!
//! [`writes`] is the full comparison, [`Differ`] the same comparison kept between passes (it
//! compares only what changed); the tests hold the two together. `live.rs` is what the watch
//! caches keep of the objects teamgpu owns.

mod desired;
mod differ;
mod live;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::Value;

use crate::core::plan::DesiredObjects;
use crate::core::plan::objects::CONTENT_HASH_ANNOTATION;
pub use crate::core::state::{Kind, ObjectKey};
use desired::DesiredObject;
pub use differ::Differ;
pub use live::{LiveObject, LiveView, OwnWrites, TemplateCharges};

/// One write to perform.
#[derive(Clone, Debug, PartialEq)]
pub enum Write {
    /// Server-side apply of the whole object (creates it when missing, restores drift).
    Apply { key: ObjectKey, object: Payload },
    /// Delete, then apply: the object's spec is immutable and has changed.
    Recreate { key: ObjectKey, object: Payload },
    /// The object carries teamgpu's label but is no longer wanted.
    Delete { key: ObjectKey },
}

impl Write {
    /// What the write does, for logs.
    pub fn verb(&self) -> &'static str {
        match self {
            Write::Apply { .. } => "apply",
            Write::Recreate { .. } => "recreate",
            Write::Delete { .. } => "delete",
        }
    }

    pub fn key(&self) -> &ObjectKey {
        match self {
            Write::Apply { key, .. } | Write::Recreate { key, .. } | Write::Delete { key } => key,
        }
    }
}

/// The object a write sends: the planner's object itself, turned into JSON only when it is
/// sent (a first pass over 10,000 objects would otherwise hold them all as JSON trees), or JSON.
#[derive(Clone, Debug)]
pub struct Payload(PayloadOf, Option<u64>);

#[derive(Clone, Debug)]
enum PayloadOf {
    Json(Value),
    Object(DesiredObject),
}

impl Payload {
    /// The identity of the desired object, as the differ knows it (see [`OwnWrites`]).
    pub fn fingerprint(&self) -> Option<u64> {
        self.1
    }

    /// The object as JSON.
    pub fn to_value(&self) -> Value {
        match &self.0 {
            PayloadOf::Json(v) => v.clone(),
            PayloadOf::Object(o) => o.to_json().unwrap_or_default(),
        }
    }
}

impl From<Value> for Payload {
    fn from(value: Value) -> Self {
        Payload(PayloadOf::Json(value), None)
    }
}

impl PartialEq for Payload {
    fn eq(&self, other: &Self) -> bool {
        self.to_value() == other.to_value()
    }
}

impl serde::Serialize for Payload {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match &self.0 {
            PayloadOf::Json(v) => v.serialize(serializer),
            PayloadOf::Object(o) => o.serialize(serializer),
        }
    }
}

fn key_of(kind: Kind, value: &Value) -> ObjectKey {
    let meta = &value["metadata"];
    ObjectKey {
        kind,
        namespace: meta["namespace"].as_str().map(str::to_owned),
        name: meta["name"].as_str().unwrap_or_default().to_owned(),
    }
}

/// The plan's objects as JSON, by key.
pub fn desired(objects: &DesiredObjects) -> BTreeMap<ObjectKey, Value> {
    fn add<T: serde::Serialize>(out: &mut BTreeMap<ObjectKey, Value>, kind: Kind, items: &[T]) {
        for item in items {
            if let Ok(value) = serde_json::to_value(item) {
                out.insert(key_of(kind, &value), value);
            }
        }
    }
    let mut out = BTreeMap::new();
    add(&mut out, Kind::DeviceClass, &objects.device_classes);
    add(
        &mut out,
        Kind::ValidatingAdmissionPolicy,
        &objects.admission_policies,
    );
    add(
        &mut out,
        Kind::ValidatingAdmissionPolicyBinding,
        &objects.admission_bindings,
    );
    add(&mut out, Kind::ResourceQuota, &objects.resource_quotas);
    add(
        &mut out,
        Kind::ResourceClaimTemplate,
        &objects.claim_templates,
    );
    add(&mut out, Kind::ClusterRole, &objects.member_roles);
    add(&mut out, Kind::ClusterRoleBinding, &objects.member_bindings);
    out
}

/// Whether `live` already has everything `desired` says: every field of `desired` is in `live`
/// with the same value. Fields the server added (defaults, status, uid) do not matter.
pub fn holds(live: &Value, desired: &Value) -> bool {
    match (live, desired) {
        (Value::Object(l), Value::Object(d)) => d
            .iter()
            .all(|(k, dv)| l.get(k).is_some_and(|lv| holds(lv, dv)) || dv.is_null()),
        (Value::Array(l), Value::Array(d)) => {
            l.len() == d.len() && l.iter().zip(d).all(|(lv, dv)| holds(lv, dv))
        }
        (l, d) => l == d,
    }
}

fn content_hash(value: &Value) -> Option<&str> {
    value["metadata"]["annotations"][CONTENT_HASH_ANNOTATION].as_str()
}

/// The desired side of one comparison: JSON, or the planner's object, turned into JSON only
/// when a live object must be compared with it field by field (an object the differ compared
/// before, or one that is missing, needs only its content hash).
#[derive(Clone, Copy, Debug)]
enum Desired<'a> {
    Json(&'a Value),
    Object(&'a DesiredObject),
}

impl Desired<'_> {
    fn content_hash(&self) -> Option<&str> {
        match self {
            Desired::Json(v) => content_hash(v),
            Desired::Object(o) => o.content_hash(),
        }
    }

    /// Whether `live` has everything this says (see [`holds`]).
    fn held_by(&self, live: &Value) -> bool {
        match self {
            Desired::Json(v) => holds(live, v),
            Desired::Object(o) => o.to_json().is_some_and(|v| holds(live, &v)),
        }
    }
}

/// The live side of one comparison: the object itself, or what is known of it once it has
/// been compared (see [`LiveView`]).
#[derive(Clone, Copy, Debug)]
enum Live<'a> {
    Object(&'a Value),
    Known {
        content_hash: Option<&'a str>,
        owner: Option<&'a str>,
        /// Whether this version was found to hold everything the desired object says.
        holds: bool,
    },
}

impl Live<'_> {
    fn content_hash(&self) -> Option<&str> {
        match self {
            Live::Object(v) => content_hash(v),
            Live::Known { content_hash, .. } => *content_hash,
        }
    }

    fn owner(&self) -> Option<&str> {
        match self {
            Live::Object(v) => {
                v["metadata"]["labels"][crate::core::plan::objects::OWNER_LABEL].as_str()
            }
            Live::Known { owner, .. } => *owner,
        }
    }

    fn holds(&self, desired: Desired<'_>) -> bool {
        match self {
            Live::Object(v) => desired.held_by(v),
            Live::Known { holds, .. } => *holds,
        }
    }
}

/// What one object needs.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Needs {
    Apply,
    Recreate,
    Delete,
}

impl Needs {
    /// The write, sending `payload` (the desired object) if it sends one.
    fn write(self, key: ObjectKey, payload: impl FnOnce() -> Payload) -> Write {
        match self {
            Needs::Apply => Write::Apply {
                key,
                object: payload(),
            },
            Needs::Recreate => Write::Recreate {
                key,
                object: payload(),
            },
            Needs::Delete => Write::Delete { key },
        }
    }
}

/// What one object needs, if anything: `desired` and `live` are its two sides.
fn verdict(
    key: &ObjectKey,
    desired: Option<Desired<'_>>,
    live: Option<Live<'_>>,
    retained: &BTreeSet<String>,
    retained_owners: &BTreeSet<String>,
) -> Option<Needs> {
    match (desired, live) {
        (Some(_), None) => Some(Needs::Apply),
        (Some(object), Some(current)) => {
            let same_content = current.content_hash() == object.content_hash();
            if key.kind == Kind::ResourceClaimTemplate && !same_content {
                Some(Needs::Recreate)
            } else if !same_content || !current.holds(object) {
                Some(Needs::Apply)
            } else {
                None
            }
        }
        (None, Some(current)) => {
            let owner = current.owner();
            let keep = (key.kind == Kind::DeviceClass && retained.contains(&key.name))
                || owner.is_some_and(|o| retained_owners.contains(o));
            (!keep).then_some(Needs::Delete)
        }
        (None, None) => None,
    }
}

/// Where a write goes in the safe order: `Kind`'s order is the dependency order, applies
/// follow it, deletions (last) reverse it.
type Rank = (i8, i8);

fn rank(write: &Write) -> Rank {
    let order = write.key().kind as i8;
    match write {
        Write::Delete { .. } => (1, -order),
        Write::Apply { .. } | Write::Recreate { .. } => (0, order),
    }
}

/// The ranks a write of an object of `kind` can have: an apply's, a deletion's.
fn ranks(kind: Kind) -> [Rank; 2] {
    [(0, kind as i8), (1, -(kind as i8))]
}

/// `writes` in the safe order ([`rank`]). The sort is stable, so objects of one kind stay in
/// the order they came.
fn in_safe_order(mut writes: Vec<Write>) -> Vec<Write> {
    writes.sort_by_key(rank);
    writes
}

/// The writes that make `live` (teamgpu-labelled objects only) equal to `desired`, in a safe
/// order: classes and policies before what uses them, deletions last.
/// `retained` DeviceClasses, and objects whose owner label is in `retained_owners`, are not
/// deleted when they are not desired.
pub fn writes(
    desired: &BTreeMap<ObjectKey, Value>,
    retained: &BTreeSet<String>,
    retained_owners: &BTreeSet<String>,
    live: &BTreeMap<ObjectKey, Value>,
) -> Vec<Write> {
    let keys: BTreeSet<&ObjectKey> = desired.keys().chain(live.keys()).collect();
    in_safe_order(
        keys.into_iter()
            .filter_map(|k| {
                let live = live.get(k).map(Live::Object);
                let desired_side = desired.get(k).map(Desired::Json);
                let needs = verdict(k, desired_side, live, retained, retained_owners)?;
                Some(needs.write(k.clone(), || {
                    Payload::from(desired.get(k).cloned().unwrap_or_default())
                }))
            })
            .collect(),
    )
}

fn key_of_meta(kind: Kind, meta: &ObjectMeta) -> ObjectKey {
    ObjectKey {
        kind,
        namespace: meta.namespace.clone(),
        name: meta.name.clone().unwrap_or_default(),
    }
}
