//! What to write: the difference between the plan and what is live. Pure; the controller
//! executes the writes. A steady state gives no write at all.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use std::sync::Arc;

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::core::v1::ResourceQuota;
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaimSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::core::DynamicObject;
use serde_json::Value;

use crate::core::plan::objects::CONTENT_HASH_ANNOTATION;
use crate::core::plan::{DesiredObjects, NamespacedTemplate};
pub use crate::core::state::{Kind, ObjectKey};

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
            PayloadOf::Object(DesiredObject::DeviceClass(o)) => o.serialize(serializer),
            PayloadOf::Object(DesiredObject::AdmissionPolicy(o)) => o.serialize(serializer),
            PayloadOf::Object(DesiredObject::AdmissionBinding(o)) => o.serialize(serializer),
            PayloadOf::Object(DesiredObject::ResourceQuota(o)) => o.serialize(serializer),
            PayloadOf::Object(DesiredObject::ResourceClaimTemplate(o)) => o.serialize(serializer),
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
    out
}

/// Whether `live` already has everything `desired` says: every field of `desired` is in `live`
/// with the same value. Fields the server added (defaults, status, uid) do not matter.
pub fn covers(live: &Value, desired: &Value) -> bool {
    match (live, desired) {
        (Value::Object(l), Value::Object(d)) => d
            .iter()
            .all(|(k, dv)| l.get(k).is_some_and(|lv| covers(lv, dv)) || dv.is_null()),
        (Value::Array(l), Value::Array(d)) => {
            l.len() == d.len() && l.iter().zip(d).all(|(lv, dv)| covers(lv, dv))
        }
        (l, d) => l == d,
    }
}

fn content_hash(value: &Value) -> Option<&str> {
    value["metadata"]["annotations"][CONTENT_HASH_ANNOTATION].as_str()
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
        covers: bool,
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

    fn covers(&self, desired: &Value) -> bool {
        match self {
            Live::Object(v) => covers(v, desired),
            Live::Known { covers, .. } => *covers,
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
    desired: Option<&Value>,
    live: Option<Live<'_>>,
    retained: &BTreeSet<String>,
    retained_owners: &BTreeSet<String>,
) -> Option<Needs> {
    match (desired, live) {
        (Some(_), None) => Some(Needs::Apply),
        (Some(object), Some(current)) => {
            let same_content = current.content_hash() == content_hash(object);
            if key.kind == Kind::ResourceClaimTemplate && !same_content {
                Some(Needs::Recreate)
            } else if !same_content || !current.covers(object) {
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

/// `Kind`'s order is the dependency order: applies follow it, deletions (last) reverse it.
/// The sort is stable, so objects of one kind stay in key order.
fn in_safe_order(mut writes: Vec<Write>) -> Vec<Write> {
    writes.sort_by_key(|w| {
        let order = w.key().kind as i8;
        match w {
            Write::Delete { .. } => (1, -order),
            Write::Apply { .. } | Write::Recreate { .. } => (0, order),
        }
    });
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
                let needs = verdict(k, desired.get(k), live, retained, retained_owners)?;
                Some(needs.write(k.clone(), || {
                    Payload::from(desired.get(k).cloned().unwrap_or_default())
                }))
            })
            .collect(),
    )
}

/// A live object teamgpu manages, shared with the watch cache that holds it.
#[derive(Debug, Clone)]
pub enum LiveObject {
    DeviceClass(Arc<DeviceClass>),
    Owned(Arc<LiveView>),
}

/// What the watch cache keeps of an object teamgpu owns (a quota, a template, an admission
/// policy or binding): its key, version, owner and content hash, and its content as JSON text
/// only until the differ has compared it once. 10,000 owned objects are a few MiB instead of
/// the ~70 MiB of the same objects as JSON trees.
#[derive(Debug)]
pub struct LiveView {
    pub key: ObjectKey,
    pub resource_version: Option<Box<str>>,
    owner: Option<Box<str>>,
    content_hash: Option<Box<str>>,
    /// For a ResourceClaimTemplate: what quota charges per DeviceClass for a claim made from
    /// it (for pending demand).
    pub template_charge: Option<BTreeMap<String, u64>>,
    /// The object as the API server stores it (managed fields left out), until compared.
    body: std::sync::Mutex<Option<Box<str>>>,
    /// This version is what teamgpu's own apply of the desired object with this fingerprint
    /// stored: it holds that object, and its content is not needed.
    written: Option<u64>,
}

/// The versions teamgpu's own applies stored, with the fingerprint of what each applied, so
/// that the watch event of an operator's own write is known without its content: during a
/// first converge, 10,000 events would otherwise hold their content until the next pass.
#[derive(Debug, Default)]
pub struct OwnWrites(std::sync::Mutex<HashMap<Box<str>, u64>>);

/// Versions remembered at most: one is forgotten when its watch event arrives, and a watch
/// that missed events (it listed again) must not make the map grow without end.
const OWN_WRITES_KEPT: usize = 100_000;

impl OwnWrites {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Box<str>, u64>> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// An apply of the desired object with `fingerprint` was stored as `resource_version`.
    pub fn record(&self, resource_version: &str, fingerprint: u64) {
        let mut written = self.lock();
        if written.len() >= OWN_WRITES_KEPT {
            written.clear();
        }
        written.insert(resource_version.into(), fingerprint);
    }

    fn take(&self, resource_version: &str) -> Option<u64> {
        self.lock().remove(resource_version)
    }
}

impl LiveView {
    /// `object` (of `kind`) as the watch cache keeps it; without its content when it is the
    /// version one of teamgpu's own applies stored.
    pub fn observed(kind: Kind, object: &DynamicObject, own: &OwnWrites) -> Self {
        let written = object
            .metadata
            .resource_version
            .as_deref()
            .and_then(|v| own.take(v));
        Self::make(kind, object, written)
    }

    /// `object` (of `kind`) as the watch cache keeps it.
    pub fn new(kind: Kind, object: &DynamicObject) -> Self {
        Self::make(kind, object, None)
    }

    fn make(kind: Kind, object: &DynamicObject, written: Option<u64>) -> Self {
        let meta = &object.metadata;
        let annotation = |name: &str| {
            meta.annotations
                .as_ref()
                .and_then(|a| a.get(name))
                .map(|v| Box::from(v.as_str()))
        };
        // Only the spec of a template is read, and only for pending demand.
        let template_charge = (kind == Kind::ResourceClaimTemplate)
            .then(|| {
                serde_json::from_value::<ResourceClaimSpec>(object.data["spec"]["spec"].clone())
                    .ok()
            })
            .flatten()
            .map(|spec| crate::core::plan::usage::quota_charge(&spec));
        LiveView {
            key: key_of_meta(kind, meta),
            resource_version: meta.resource_version.as_deref().map(Box::from),
            owner: meta
                .labels
                .as_ref()
                .and_then(|l| l.get(crate::core::plan::objects::OWNER_LABEL))
                .map(|v| Box::from(v.as_str())),
            content_hash: annotation(CONTENT_HASH_ANNOTATION),
            template_charge,
            // The text of an own apply is never needed (see [`OwnWrites`]).
            body: std::sync::Mutex::new(written.is_none().then(|| Self::text(kind, object))),
            written,
        }
    }

    /// `object` as JSON text, as the API server stores it, without its managed fields. Items of
    /// a list carry no `apiVersion` and `kind`; the key says what they are.
    fn text(kind: Kind, object: &DynamicObject) -> Box<str> {
        let mut value = serde_json::to_value(object).unwrap_or_default();
        if let Value::Object(fields) = &mut value {
            let resource = kind.api_resource();
            fields.insert("apiVersion".into(), resource.api_version.into());
            fields.insert("kind".into(), resource.kind.into());
            if let Some(Value::Object(meta)) = fields.get_mut("metadata") {
                meta.remove("managedFields");
            }
        }
        value.to_string().into_boxed_str()
    }

    fn body(&self) -> std::sync::MutexGuard<'_, Option<Box<str>>> {
        self.body
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl LiveObject {
    /// An owned object of `kind` as the watch cache keeps it.
    pub fn owned(kind: Kind, object: &DynamicObject) -> Self {
        LiveObject::Owned(Arc::new(LiveView::new(kind, object)))
    }

    fn key(&self) -> ObjectKey {
        match self {
            LiveObject::DeviceClass(o) => key_of_meta(Kind::DeviceClass, &o.metadata),
            LiveObject::Owned(v) => v.key.clone(),
        }
    }

    pub fn kind(&self) -> Kind {
        match self {
            LiveObject::DeviceClass(_) => Kind::DeviceClass,
            LiveObject::Owned(v) => v.key.kind,
        }
    }

    fn resource_version(&self) -> Option<&str> {
        match self {
            LiveObject::DeviceClass(o) => o.metadata.resource_version.as_deref(),
            LiveObject::Owned(v) => v.resource_version.as_deref(),
        }
    }

    /// The object as the API server stores it, while it is known.
    fn to_json(&self) -> Option<Value> {
        match self {
            LiveObject::DeviceClass(o) => {
                let mut value = serde_json::to_value(&**o).ok()?;
                if let Value::Object(fields) = &mut value {
                    let resource = Kind::DeviceClass.api_resource();
                    fields.insert("apiVersion".into(), resource.api_version.into());
                    fields.insert("kind".into(), resource.kind.into());
                }
                Some(value)
            }
            LiveObject::Owned(v) => serde_json::from_str(v.body().as_deref()?).ok(),
        }
    }

    /// Forgets the content once it has been compared: what is kept decides from now on.
    fn compared(&self) {
        if let LiveObject::Owned(v) = self {
            *v.body() = None;
        }
    }
}

/// A live object in the differ, with the fingerprint of the desired object this version was
/// found to hold everything of.
#[derive(Debug, Clone)]
struct LiveEntry {
    object: LiveObject,
    covers: Option<u64>,
}

/// Fingerprint of a desired object's JSON.
fn fingerprint(value: &Value) -> u64 {
    use std::hash::{BuildHasher, BuildHasherDefault};
    BuildHasherDefault::<std::hash::DefaultHasher>::default().hash_one(value.to_string())
}

/// A desired object, shared with the planner.
#[derive(Debug, Clone)]
enum DesiredObject {
    DeviceClass(Arc<DeviceClass>),
    AdmissionPolicy(Arc<ValidatingAdmissionPolicy>),
    AdmissionBinding(Arc<ValidatingAdmissionPolicyBinding>),
    ResourceQuota(Arc<ResourceQuota>),
    ResourceClaimTemplate(NamespacedTemplate),
}

impl DesiredObject {
    fn meta(&self) -> &ObjectMeta {
        match self {
            DesiredObject::DeviceClass(o) => &o.metadata,
            DesiredObject::AdmissionPolicy(o) => &o.metadata,
            DesiredObject::AdmissionBinding(o) => &o.metadata,
            DesiredObject::ResourceQuota(o) => &o.metadata,
            DesiredObject::ResourceClaimTemplate(o) => &o.template.metadata,
        }
    }

    fn key(&self, kind: Kind) -> ObjectKey {
        match self {
            DesiredObject::ResourceClaimTemplate(t) => ObjectKey {
                kind,
                namespace: Some(t.namespace.to_string()),
                name: t.name().to_owned(),
            },
            _ => key_of_meta(kind, self.meta()),
        }
    }

    /// Where the object lives: the planner hands out the same object while it is unchanged.
    fn address(&self) -> *const () {
        match self {
            DesiredObject::DeviceClass(o) => Arc::as_ptr(o).cast(),
            DesiredObject::AdmissionPolicy(o) => Arc::as_ptr(o).cast(),
            DesiredObject::AdmissionBinding(o) => Arc::as_ptr(o).cast(),
            DesiredObject::ResourceQuota(o) => Arc::as_ptr(o).cast(),
            DesiredObject::ResourceClaimTemplate(o) => Arc::as_ptr(&o.template).cast(),
        }
    }

    fn to_json(&self) -> Option<Value> {
        match self {
            DesiredObject::DeviceClass(o) => serde_json::to_value(&**o).ok(),
            DesiredObject::AdmissionPolicy(o) => serde_json::to_value(&**o).ok(),
            DesiredObject::AdmissionBinding(o) => serde_json::to_value(&**o).ok(),
            DesiredObject::ResourceQuota(o) => serde_json::to_value(&**o).ok(),
            DesiredObject::ResourceClaimTemplate(o) => serde_json::to_value(o).ok(),
        }
    }

    /// Every desired object, with its key.
    fn all(objects: &DesiredObjects) -> impl Iterator<Item = (Kind, DesiredObject)> + '_ {
        let o = objects;
        (o.device_classes
            .iter()
            .map(|c| (Kind::DeviceClass, DesiredObject::DeviceClass(c.clone()))))
        .chain(o.admission_policies.iter().map(|p| {
            (
                Kind::ValidatingAdmissionPolicy,
                DesiredObject::AdmissionPolicy(p.clone()),
            )
        }))
        .chain(o.admission_bindings.iter().map(|b| {
            (
                Kind::ValidatingAdmissionPolicyBinding,
                DesiredObject::AdmissionBinding(b.clone()),
            )
        }))
        .chain(
            o.resource_quotas
                .iter()
                .map(|q| (Kind::ResourceQuota, DesiredObject::ResourceQuota(q.clone()))),
        )
        .chain(o.claim_templates.iter().map(|t| {
            (
                Kind::ResourceClaimTemplate,
                DesiredObject::ResourceClaimTemplate(t.clone()),
            )
        }))
    }
}

fn key_of_meta(kind: Kind, meta: &ObjectMeta) -> ObjectKey {
    ObjectKey {
        kind,
        namespace: meta.namespace.clone(),
        name: meta.name.clone().unwrap_or_default(),
    }
}

/// Drops the objects `keep` does not keep from `map`, marking them to be compared again.
fn forget<V>(
    map: &mut HashMap<ObjectKey, V>,
    dirty: &mut BTreeSet<ObjectKey>,
    keep: impl Fn(&ObjectKey) -> bool,
) {
    map.retain(|key, _| {
        let kept = keep(key);
        if !kept {
            dirty.insert(key.clone());
        }
        kept
    });
}

/// [`writes`] kept between passes, so that a pass costs what changed, not what exists: an
/// object is compared again only when one of its sides changed or its last comparison asked for
/// a write, and only then turned into JSON. A desired object is unchanged when the planner hands
/// out the same one, or one with equal metadata (which carries the hash of the spec); a live
/// object when its resourceVersion is the same. Both sides are shared with the planner and the
/// watch caches, not copied. Gives the same writes as [`writes`] on the same input.
#[derive(Debug, Default)]
pub struct Differ {
    desired: HashMap<ObjectKey, DesiredObject>,
    live: HashMap<ObjectKey, LiveEntry>,
    retained: BTreeSet<String>,
    retained_owners: BTreeSet<String>,
    /// Objects to compare at the next [`Differ::writes`]: a side changed, or the last
    /// comparison asked for a write.
    dirty: BTreeSet<ObjectKey>,
    /// The live resourceVersion each apply asked for by the last [`Differ::writes`] was decided
    /// on, and the fingerprint of what it applies (see [`Differ::applied`]).
    applying: HashMap<ObjectKey, (String, u64)>,
}

impl Differ {
    /// Takes in the live objects of `kind` (all of them). Kinds whose watch saw no event since
    /// the last call need not be passed again.
    pub fn update_live(&mut self, kind: Kind, objects: impl IntoIterator<Item = LiveObject>) {
        let mut seen = HashSet::new();
        for object in objects {
            let key = object.key();
            let version = object.resource_version().unwrap_or_default();
            let known = self.live.get(&key).is_some_and(|known| {
                !version.is_empty() && known.object.resource_version() == Some(version)
            });
            // A known version keeps what its comparison found; one of teamgpu's own applies
            // holds what it applied.
            if !known {
                self.dirty.insert(key.clone());
                let covers = match &object {
                    LiveObject::Owned(view) => view.written,
                    LiveObject::DeviceClass(_) => None,
                };
                self.live.insert(key.clone(), LiveEntry { object, covers });
            }
            seen.insert(key);
        }
        forget(&mut self.live, &mut self.dirty, |key| {
            key.kind != kind || seen.contains(key)
        });
    }

    /// The writes that make the live objects equal to `objects` (see [`writes`]).
    pub fn writes(&mut self, objects: &DesiredObjects) -> Vec<Write> {
        self.update_desired(objects);
        for name in self
            .retained
            .symmetric_difference(&objects.retained_device_classes)
        {
            self.dirty.insert(ObjectKey {
                kind: Kind::DeviceClass,
                namespace: None,
                name: name.clone(),
            });
        }
        self.retained.clone_from(&objects.retained_device_classes);
        if self.retained_owners != objects.retained_owners {
            // Rare (a policy became unreadable, or readable again): compare every live object.
            self.dirty.extend(self.live.keys().cloned());
            self.retained_owners.clone_from(&objects.retained_owners);
        }
        let mut out = Vec::new();
        self.applying.clear();
        for key in std::mem::take(&mut self.dirty) {
            let desired = match self.desired.get(&key).map(DesiredObject::to_json) {
                Some(Some(value)) => Some(value),
                // Wanted but not serializable (a bug, never seen): neither applied nor deleted.
                Some(None) => {
                    tracing::error!(object = %key, "a desired object could not be serialized; left as it is");
                    continue;
                }
                None => None,
            };
            let desired_fingerprint = desired.as_ref().map(fingerprint);
            let live = self.live.get_mut(&key);
            let live_json = live.as_ref().and_then(|l| l.object.to_json());
            let live_side = match (&live, &live_json) {
                (_, Some(json)) => Some(Live::Object(json)),
                (Some(entry), None) => {
                    let LiveObject::Owned(view) = &entry.object else {
                        unreachable!("a DeviceClass is always known whole")
                    };
                    Some(Live::Known {
                        content_hash: view.content_hash.as_deref(),
                        owner: view.owner.as_deref(),
                        covers: entry.covers.is_some() && entry.covers == desired_fingerprint,
                    })
                }
                (None, None) => None,
            };
            let write = verdict(
                &key,
                desired.as_ref(),
                live_side,
                &self.retained,
                &self.retained_owners,
            );
            let desired_object = self.desired.get(&key);
            let write = write.map(|needs| {
                needs.write(key.clone(), || match desired_object {
                    Some(object) => Payload(PayloadOf::Object(object.clone()), desired_fingerprint),
                    // Apply and Recreate are only asked for a desired object.
                    None => Payload::from(Value::Null),
                })
            });
            match (write, live) {
                (Some(write), live) => {
                    if let (Write::Apply { .. }, Some(version), Some(f)) = (
                        &write,
                        live.and_then(|l| l.object.resource_version().map(str::to_owned)),
                        desired_fingerprint,
                    ) {
                        self.applying.insert(key.clone(), (version, f));
                    }
                    out.push(write);
                    self.dirty.insert(key);
                }
                // Settled: what was found is remembered, the content is no longer needed.
                (None, Some(entry)) if desired_fingerprint.is_some() => {
                    entry.covers = desired_fingerprint;
                    entry.object.compared();
                }
                (None, _) => {}
            }
        }
        in_safe_order(out)
    }

    /// An apply of `key` succeeded and the server answered with `resource_version`. The same
    /// version the apply was decided on means the server already stored what teamgpu manages,
    /// and whatever the comparison saw (a field the server normalises, say) is no difference:
    /// the object is settled until one of its sides changes, instead of being applied again
    /// and again. A new version is compared again when the watch brings it.
    pub fn applied(&mut self, key: &ObjectKey, resource_version: Option<&str>) {
        let Some((known, desired)) = self.applying.get(key) else {
            return;
        };
        if resource_version == Some(known.as_str()) {
            self.dirty.remove(key);
            if let Some(entry) = self.live.get_mut(key) {
                entry.covers = Some(*desired);
                entry.object.compared();
            }
        }
    }

    /// What quota charges for a claim made from the live template `namespace/name` that
    /// teamgpu owns.
    pub fn template_charge(&self, namespace: &str, name: &str) -> Option<&BTreeMap<String, u64>> {
        let key = ObjectKey {
            kind: Kind::ResourceClaimTemplate,
            namespace: Some(namespace.to_owned()),
            name: name.to_owned(),
        };
        match &self.live.get(&key)?.object {
            LiveObject::Owned(view) => view.template_charge.as_ref(),
            LiveObject::DeviceClass(_) => None,
        }
    }

    fn update_desired(&mut self, objects: &DesiredObjects) {
        let mut seen = HashSet::with_capacity(self.desired.len());
        for (kind, object) in DesiredObject::all(objects) {
            let meta = object.meta();
            let key = object.key(kind);
            let hashed = meta
                .annotations
                .as_ref()
                .is_some_and(|a| a.contains_key(CONTENT_HASH_ANNOTATION));
            let same = self.desired.get(&key).is_some_and(|known| {
                std::ptr::eq(known.address(), object.address()) || (hashed && known.meta() == meta)
            });
            if !same {
                self.dirty.insert(key.clone());
            }
            self.desired.insert(key.clone(), object);
            seen.insert(key);
        }
        forget(&mut self.desired, &mut self.dirty, |key| seen.contains(key));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn key(kind: Kind, ns: Option<&str>, name: &str) -> ObjectKey {
        ObjectKey {
            kind,
            namespace: ns.map(str::to_owned),
            name: name.into(),
        }
    }

    fn quota(hash: &str, devices: &str) -> Value {
        json!({"apiVersion": "v1", "kind": "ResourceQuota",
               "metadata": {"name": "teamgpu", "namespace": "a", "annotations": {CONTENT_HASH_ANNOTATION: hash}},
               "spec": {"hard": {"x.deviceclass.resource.k8s.io/devices": devices}}})
    }

    #[test]
    fn covers_ignores_what_the_server_added_but_not_changed_values() {
        let desired = quota("h1", "4");
        let mut live = desired.clone();
        live["metadata"]["uid"] = json!("u");
        live["status"] = json!({"used": {}});
        assert!(covers(&live, &desired));
        live["spec"]["hard"]["x.deviceclass.resource.k8s.io/devices"] = json!("5");
        assert!(!covers(&live, &desired));
        assert!(!covers(&json!({"a": [1, 2]}), &json!({"a": [1]})));
    }

    #[test]
    fn a_steady_state_writes_nothing() {
        let k = key(Kind::ResourceQuota, Some("a"), "teamgpu");
        let desired = BTreeMap::from([(k.clone(), quota("h1", "4"))]);
        let mut live_obj = quota("h1", "4");
        live_obj["metadata"]["resourceVersion"] = json!("7");
        let live = BTreeMap::from([(k, live_obj)]);
        assert!(writes(&desired, &BTreeSet::new(), &BTreeSet::new(), &live).is_empty());
    }

    #[test]
    fn drift_and_removed_fields_are_written_back() {
        let k = key(Kind::ResourceQuota, Some("a"), "teamgpu");
        let desired = BTreeMap::from([(k.clone(), quota("h1", "4"))]);
        // Someone edited the value.
        let live = BTreeMap::from([(k.clone(), quota("h1", "9"))]);
        assert!(matches!(
            &writes(&desired, &BTreeSet::new(), &BTreeSet::new(), &live)[..],
            [Write::Apply { .. }]
        ));
        // The plan dropped a field: only the hash tells (the live object still covers the plan).
        let mut old = quota("h0", "4");
        old["spec"]["hard"]["y.deviceclass.resource.k8s.io/devices"] = json!("0");
        let live = BTreeMap::from([(k, old)]);
        assert!(matches!(
            &writes(&desired, &BTreeSet::new(), &BTreeSet::new(), &live)[..],
            [Write::Apply { .. }]
        ));
    }

    #[test]
    fn changed_templates_are_recreated_and_stale_objects_deleted_last() {
        let t = key(Kind::ResourceClaimTemplate, Some("a"), "gpu");
        let template = |hash: &str| json!({"metadata": {"name": "gpu", "namespace": "a", "annotations": {CONTENT_HASH_ANNOTATION: hash}}, "spec": {}});
        let stale = key(Kind::ResourceQuota, Some("gone"), "teamgpu");
        let kept_class = key(Kind::DeviceClass, None, "broken.teamgpu.io");
        let desired = BTreeMap::from([(t.clone(), template("new"))]);
        let live = BTreeMap::from([
            (t.clone(), template("old")),
            (stale.clone(), quota("h", "1")),
            (kept_class, json!({})),
        ]);
        let retained = BTreeSet::from(["broken.teamgpu.io".to_owned()]);
        let out = writes(&desired, &retained, &BTreeSet::new(), &live);
        assert_eq!(out.len(), 2, "{out:?}");
        assert!(matches!(&out[0], Write::Recreate { key, .. } if key == &t));
        assert!(matches!(&out[1], Write::Delete { key } if key == &stale));
    }

    #[test]
    fn the_objects_of_an_unreadable_policy_are_kept() {
        let q = key(Kind::ResourceQuota, Some("robotics"), "teamgpu");
        let mut owned = quota("h", "4");
        owned["metadata"]["labels"] = json!({"teamgpu.io/owner": "TeamGpuPolicy.robotics"});
        let live = BTreeMap::from([(q.clone(), owned)]);
        let unreadable = BTreeSet::from(["TeamGpuPolicy.robotics".to_owned()]);
        assert_eq!(
            writes(&BTreeMap::new(), &BTreeSet::new(), &unreadable, &live),
            []
        );
        // Once the policy is gone for good (or readable and wanting less), the quota goes.
        assert!(matches!(
            &writes(&BTreeMap::new(), &BTreeSet::new(), &BTreeSet::new(), &live)[..],
            [Write::Delete { key }] if key == &q
        ));
    }

    #[test]
    fn classes_are_applied_before_the_templates_that_use_them() {
        let class = key(Kind::DeviceClass, None, "a.teamgpu.io");
        let tmpl = key(Kind::ResourceClaimTemplate, Some("ns"), "a");
        let desired = BTreeMap::from([(tmpl.clone(), json!({})), (class.clone(), json!({}))]);
        let out = writes(
            &desired,
            &BTreeSet::new(),
            &BTreeSet::new(),
            &BTreeMap::new(),
        );
        assert_eq!(
            out.iter().map(|w| w.key().clone()).collect::<Vec<_>>(),
            [class, tmpl]
        );
    }

    /// Random sequences of desired and live states: the kept differ asks for exactly the writes
    /// the full comparison asks for, at every step.
    mod differ {
        use super::*;
        use k8s_openapi::api::core::v1::ResourceQuota;
        use proptest::prelude::*;

        /// A quota in `namespace` allowing `devices`, stamped with its content hash.
        fn desired_quota(namespace: &str, devices: u8) -> ResourceQuota {
            let mut q: ResourceQuota = serde_json::from_value(json!({
                "metadata": {"name": "teamgpu", "namespace": namespace},
                "spec": {"hard": {"x.deviceclass.resource.k8s.io/devices": devices.to_string()}}
            }))
            .unwrap();
            let hash = crate::core::plan::objects::content_hash(&q.spec);
            q.metadata.annotations = Some([(CONTENT_HASH_ANNOTATION.to_owned(), hash)].into());
            q
        }

        /// The live side: absent, as desired with `devices`, or that edited by someone
        /// (`drift`); its resourceVersion names its content.
        fn live_quota(namespace: &str, devices: u8, drift: bool) -> DynamicObject {
            let mut v = serde_json::to_value(desired_quota(namespace, devices)).unwrap();
            if drift {
                v["spec"]["hard"]["x.deviceclass.resource.k8s.io/devices"] = json!("99");
            }
            v["apiVersion"] = json!("v1");
            v["kind"] = json!("ResourceQuota");
            v["metadata"]["resourceVersion"] = json!(format!("{devices}-{drift}"));
            serde_json::from_value(v).unwrap()
        }

        fn class(devices: u8) -> DeviceClass {
            serde_json::from_value(json!({
                "metadata": {"name": "x.teamgpu.io", "resourceVersion": devices.to_string(),
                             "annotations": {CONTENT_HASH_ANNOTATION: devices.to_string()}},
                "spec": {}
            }))
            .unwrap()
        }

        #[derive(Clone, Debug)]
        struct Step {
            desired: [Option<u8>; 2],
            live: [Option<(u8, bool)>; 2],
            class_live: Option<u8>,
            class_desired: Option<u8>,
            retained: bool,
        }

        fn step() -> impl Strategy<Value = Step> {
            let v = proptest::option::of(0..3u8);
            (
                [v.clone(), v.clone()],
                [
                    proptest::option::of((0..3u8, any::<bool>())),
                    proptest::option::of((0..3u8, any::<bool>())),
                ],
                v.clone(),
                v,
                any::<bool>(),
            )
                .prop_map(|(desired, live, class_live, class_desired, retained)| {
                    Step {
                        desired,
                        live,
                        class_live,
                        class_desired,
                        retained,
                    }
                })
        }

        #[test]
        fn a_changed_desired_object_is_compared_again_though_nothing_live_changed() {
            let mut differ = Differ::default();
            let live = Arc::new(live_quota("a", 0, false));
            differ.update_live(
                Kind::ResourceQuota,
                [LiveObject::owned(Kind::ResourceQuota, &live)],
            );
            let mut objects = DesiredObjects::default();
            objects
                .resource_quotas
                .push(Arc::new(desired_quota("a", 0)));
            assert_eq!(differ.writes(&objects), []);
            objects.resource_quotas = vec![Arc::new(desired_quota("a", 1))];
            assert!(matches!(
                &differ.writes(&objects)[..],
                [Write::Apply { .. }]
            ));
        }

        fn quotas(devices: u8) -> DesiredObjects {
            DesiredObjects {
                resource_quotas: vec![Arc::new(desired_quota("a", devices))],
                ..DesiredObjects::default()
            }
        }

        #[test]
        fn a_compared_object_is_kept_without_its_content_and_still_decided_on() {
            let live = LiveObject::owned(Kind::ResourceQuota, &live_quota("a", 3, false));
            let LiveObject::Owned(view) = &live else {
                unreachable!()
            };
            let mut differ = Differ::default();
            differ.update_live(Kind::ResourceQuota, [live.clone()]);
            assert!(view.body().is_some());
            assert!(differ.writes(&quotas(3)).is_empty());
            assert!(
                view.body().is_none(),
                "the content is dropped once it is found converged"
            );
            // The same version passed again (the next event of another quota) keeps that.
            differ.update_live(Kind::ResourceQuota, [live.clone()]);
            assert!(differ.writes(&quotas(3)).is_empty());
            // A new desired quota is applied; back to the old one, the live one holds it.
            assert!(matches!(
                &differ.writes(&quotas(4))[..],
                [Write::Apply { .. }]
            ));
            assert!(differ.writes(&quotas(3)).is_empty());
            // No longer wanted: deleted, decided without the content.
            assert!(matches!(
                &differ.writes(&DesiredObjects::default())[..],
                [Write::Delete { .. }]
            ));
        }

        #[test]
        fn the_watch_event_of_an_own_apply_is_known_without_its_content() {
            let mut differ = Differ::default();
            let writes = differ.writes(&quotas(3));
            let [Write::Apply { object, .. }] = &writes[..] else {
                panic!("{writes:?}")
            };
            let own = OwnWrites::default();
            // The server stored the apply as version "3-false" (see `live_quota`).
            own.record(
                "3-false",
                object.fingerprint().expect("the differ's payload"),
            );
            let view = LiveView::observed(Kind::ResourceQuota, &live_quota("a", 3, false), &own);
            assert!(view.body().is_none());
            differ.update_live(Kind::ResourceQuota, [LiveObject::Owned(Arc::new(view))]);
            assert!(differ.writes(&quotas(3)).is_empty());
            // Someone else's version is kept whole until compared.
            let edited = LiveView::observed(Kind::ResourceQuota, &live_quota("a", 3, true), &own);
            assert!(edited.body().is_some());
            differ.update_live(Kind::ResourceQuota, [LiveObject::Owned(Arc::new(edited))]);
            assert!(matches!(
                &differ.writes(&quotas(3))[..],
                [Write::Apply { .. }]
            ));
        }

        #[test]
        fn a_listed_object_without_api_version_and_kind_is_converged() {
            // A watch cache filled by a list holds items without apiVersion and kind (the API
            // server leaves them out of list items); only events carry them.
            let mut listed = live_quota("a", 0, false);
            listed.types = None;
            let mut differ = Differ::default();
            differ.update_live(
                Kind::ResourceQuota,
                [LiveObject::owned(Kind::ResourceQuota, &listed)],
            );
            assert_eq!(differ.writes(&quotas(0)), []);
        }

        #[test]
        fn a_no_op_apply_settles_the_object_until_a_side_changes() {
            // The server stores the value in another form than teamgpu sent ("4.0" for "4"):
            // the comparison sees a difference that an apply cannot remove.
            let stored = |version: &str| {
                let mut q = live_quota("a", 4, false);
                q.data["spec"]["hard"]["x.deviceclass.resource.k8s.io/devices"] = json!("4.0");
                q.metadata.resource_version = Some(version.into());
                LiveObject::owned(Kind::ResourceQuota, &q)
            };
            let key = key(Kind::ResourceQuota, Some("a"), "teamgpu");
            let mut differ = Differ::default();
            differ.update_live(Kind::ResourceQuota, [stored("7")]);
            assert!(matches!(
                &differ.writes(&quotas(4))[..],
                [Write::Apply { .. }]
            ));
            // The apply changed nothing: the server answered with the same resourceVersion.
            differ.applied(&key, Some("7"));
            assert_eq!(differ.writes(&quotas(4)), []);
            assert_eq!(differ.writes(&quotas(4)), []);
            // Someone edits the object: it is compared, and applied, again.
            differ.update_live(Kind::ResourceQuota, [stored("8")]);
            assert!(matches!(
                &differ.writes(&quotas(4))[..],
                [Write::Apply { .. }]
            ));
            // An apply that did change the object is compared again when the watch brings it.
            differ.applied(&key, Some("9"));
            assert!(matches!(
                &differ.writes(&quotas(4))[..],
                [Write::Apply { .. }]
            ));
        }

        proptest! {
            #[test]
            fn the_kept_differ_agrees_with_the_full_comparison(
                mut steps in proptest::collection::vec(step(), 1..16),
                quiet in proptest::collection::vec(any::<bool>(), 16),
            ) {
                // Most passes see no live change: a quiet step keeps the live side as it was.
                for i in 1..steps.len() {
                    if quiet[i] {
                        steps[i].live = steps[i - 1].live;
                        steps[i].class_live = steps[i - 1].class_live;
                    }
                }
                let mut differ = Differ::default();
                let mut previous: Option<Step> = None;
                let mut shared = std::collections::HashMap::new();
                for step in &steps {
                    let namespaces = ["a", "b"];
                    let mut objects = DesiredObjects::default();
                    // Quotas are shared while unchanged, as the planner does; classes are new
                    // objects every time, as for the planner's few cluster-wide objects.
                    for (ns, d) in namespaces.iter().zip(step.desired) {
                        objects.resource_quotas.extend(d.map(|d| {
                            shared
                                .entry((*ns, d))
                                .or_insert_with(|| Arc::new(desired_quota(ns, d)))
                                .clone()
                        }));
                    }
                    objects
                        .device_classes
                        .extend(step.class_desired.map(|d| Arc::new(class(d))));
                    if step.retained {
                        objects.retained_device_classes.insert("x.teamgpu.io".into());
                    }
                    let live_quotas: Vec<DynamicObject> = namespaces
                        .iter()
                        .zip(step.live)
                        .filter_map(|(ns, l)| l.map(|(d, drift)| live_quota(ns, d, drift)))
                        .collect();
                    let live_class = step.class_live.map(class);
                    let live_quotas: Vec<Arc<DynamicObject>> =
                        live_quotas.into_iter().map(Arc::new).collect();
                    let live_class = live_class.map(Arc::new);
                    let full_live: BTreeMap<ObjectKey, Value> = live_quotas
                        .iter()
                        .map(|q| LiveObject::owned(Kind::ResourceQuota, q))
                        .chain(live_class.iter().cloned().map(LiveObject::DeviceClass))
                        .map(|o| (o.key(), o.to_json().unwrap()))
                        .collect();
                    let expected = writes(
                        &desired(&objects),
                        &objects.retained_device_classes,
                        &objects.retained_owners,
                        &full_live,
                    );
                    // As the operator does: a kind is passed again only when its watch saw an
                    // event (here: when it changed, or at random).
                    if previous.as_ref().is_none_or(|p: &Step| p.live != step.live || step.retained) {
                        differ.update_live(
                            Kind::ResourceQuota,
                            live_quotas
                                .iter()
                                .map(|q| LiveObject::owned(Kind::ResourceQuota, q)),
                        );
                    }
                    if previous.as_ref().is_none_or(|p| p.class_live != step.class_live) {
                        differ.update_live(
                            Kind::DeviceClass,
                            live_class.iter().cloned().map(LiveObject::DeviceClass),
                        );
                    }
                    previous = Some(step.clone());
                    prop_assert_eq!(differ.writes(&objects), expected, "at {:?}", step);
                }
            }
        }
    }
}
