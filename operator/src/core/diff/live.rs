//! What the watch caches keep of the live objects teamgpu manages, and how an own apply is
//! recognised when its watch event comes back.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Weak};

use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaimSpec};
use kube::core::DynamicObject;
use serde_json::Value;

use super::{Kind, ObjectKey, key_of_meta};
use crate::core::plan::objects::CONTENT_HASH_ANNOTATION;
use crate::core::plan::outside_teams;

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
    pub(super) owner: Option<Box<str>>,
    pub(super) content_hash: Option<Box<str>>,
    /// For a ResourceClaimTemplate: what quota charges per DeviceClass for a claim made from
    /// it (for pending demand).
    pub template_charge: Option<Arc<BTreeMap<String, u64>>>,
    /// For a namespace's quota of 0 outside teams: the hash of its `status.hard`, once the
    /// quota controller has written it (see [`outside_teams::in_force`]).
    pub in_force: Option<Box<str>>,
    /// The object as the API server stores it (managed fields left out) until compared, or
    /// what it is known to hold. Shared with [`OwnWrites`] while it is text nobody claimed.
    content: Arc<std::sync::Mutex<Content>>,
}

/// What a [`LiveView`] knows of its object's content.
#[derive(Debug)]
enum Content {
    /// The object as JSON text, until the differ has compared it.
    Text(Box<str>),
    /// This version is what teamgpu's own apply of the desired object with this fingerprint
    /// stored: it holds that object, and its text is not needed.
    Written(u64),
    /// Compared: what the differ found is kept there.
    Forgotten,
}

/// What quota charges for a claim of a template, shared by the templates that charge the same:
/// 9,000 templates of 100 teams charge a few distinct ways.
pub type TemplateCharges = crate::intern::Interner<BTreeMap<String, u64>>;

/// The versions teamgpu's own applies stored, with the fingerprint of what each applied, so
/// that the watch event of an operator's own write is known without its content: during a
/// first converge, 10,000 events would otherwise hold their content until the next pass.
///
/// The event often comes back before the apply's answer: a view whose version nobody claimed
/// yet is remembered, and forgets its text when the answer names its version.
#[derive(Debug, Default)]
pub struct OwnWrites(std::sync::Mutex<Versions>);

#[derive(Debug, Default)]
struct Versions {
    /// Versions of own applies whose watch event has not come yet.
    written: HashMap<Box<str>, u64>,
    /// Views whose version no own apply has named yet, by version, with their content. Weak:
    /// a view replaced before it was compared (the quota controller writes a quota's status
    /// right after teamgpu's apply) takes its text with it, instead of leaving it here.
    unclaimed: HashMap<Box<str>, Weak<std::sync::Mutex<Content>>>,
    /// `unclaimed` is swept of views that are gone or compared when it grows past this.
    sweep_at: usize,
}

/// Versions remembered at most: one is forgotten when its watch event arrives, and a watch
/// that missed events (it listed again) must not make the map grow without end.
const OWN_WRITES_KEPT: usize = 100_000;

impl OwnWrites {
    fn lock(&self) -> std::sync::MutexGuard<'_, Versions> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// An apply of the desired object with `fingerprint` was stored as `resource_version`.
    pub fn record(&self, resource_version: &str, fingerprint: u64) {
        let mut versions = self.lock();
        if let Some(unclaimed) = versions.unclaimed.remove(resource_version) {
            // Its watch event came first: the view forgets its text now.
            if let Some(content) = unclaimed.upgrade() {
                let mut content = lock(&content);
                if matches!(*content, Content::Text(_)) {
                    *content = Content::Written(fingerprint);
                }
            }
            return;
        }
        if versions.written.len() >= OWN_WRITES_KEPT {
            versions.written.clear();
        }
        versions
            .written
            .insert(resource_version.into(), fingerprint);
    }

    /// What a view of `resource_version` holds: what an own apply stored, or `text`, which an
    /// own apply's answer may still claim (it is remembered for that).
    fn content(
        &self,
        resource_version: Option<&str>,
        text: impl FnOnce() -> Box<str>,
    ) -> Arc<std::sync::Mutex<Content>> {
        let Some(version) = resource_version else {
            return Arc::new(std::sync::Mutex::new(Content::Text(text())));
        };
        let written = |versions: &mut Versions| {
            let fingerprint = versions.written.remove(version)?;
            Some(Arc::new(std::sync::Mutex::new(Content::Written(
                fingerprint,
            ))))
        };
        if let Some(content) = written(&mut self.lock()) {
            return content;
        }
        // Made outside the lock; an answer that came meanwhile still wins.
        let text = text();
        let mut versions = self.lock();
        if let Some(content) = written(&mut versions) {
            return content;
        }
        if versions.unclaimed.len() >= versions.sweep_at {
            // Views that were replaced, or compared, are no one's to claim.
            versions.unclaimed.retain(|_, c| {
                c.upgrade()
                    .is_some_and(|c| matches!(*lock(&c), Content::Text(_)))
            });
            versions.sweep_at = (versions.unclaimed.len() * 2).max(1024);
        }
        let content = Arc::new(std::sync::Mutex::new(Content::Text(text)));
        versions
            .unclaimed
            .insert(version.into(), Arc::downgrade(&content));
        content
    }

    /// How many texts of views no apply claimed are held (by their views).
    #[cfg(test)]
    pub(super) fn texts_held(&self) -> usize {
        self.lock()
            .unclaimed
            .values()
            .filter_map(Weak::upgrade)
            .filter(|c| matches!(*lock(c), Content::Text(_)))
            .count()
    }
}

fn lock(content: &std::sync::Mutex<Content>) -> std::sync::MutexGuard<'_, Content> {
    content
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl LiveView {
    /// `object` (of `kind`) as the watch cache keeps it; without its content when it is the
    /// version one of teamgpu's own applies stored.
    pub fn observed(
        kind: Kind,
        object: &DynamicObject,
        own: &OwnWrites,
        charges: &mut TemplateCharges,
    ) -> Self {
        let version = object.metadata.resource_version.as_deref();
        let content = own.content(version, || Self::text(kind, object));
        Self::make(kind, object, content, |charge| charges.share(charge))
    }

    /// `object` (of `kind`) as the watch cache keeps it.
    pub fn new(kind: Kind, object: &DynamicObject) -> Self {
        let text = Content::Text(Self::text(kind, object));
        Self::make(
            kind,
            object,
            Arc::new(std::sync::Mutex::new(text)),
            Arc::new,
        )
    }

    fn make(
        kind: Kind,
        object: &DynamicObject,
        content: Arc<std::sync::Mutex<Content>>,
        share: impl FnOnce(BTreeMap<String, u64>) -> Arc<BTreeMap<String, u64>>,
    ) -> Self {
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
            .map(|spec| share(crate::core::plan::usage::quota_charge(&spec)));
        let in_force = (kind == Kind::ResourceQuota
            && meta.name.as_deref() == Some(outside_teams::QUOTA_NAME))
        .then(|| outside_teams::in_force(&object.data["status"]["hard"]))
        .flatten()
        .map(String::into_boxed_str);
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
            in_force,
            content,
        }
    }

    /// The fingerprint of the desired object whose apply stored this version, if one did.
    pub(super) fn written(&self) -> Option<u64> {
        match *lock(&self.content) {
            Content::Written(fingerprint) => Some(fingerprint),
            Content::Text(_) | Content::Forgotten => None,
        }
    }

    /// The object's JSON text, while the view holds it.
    pub(super) fn text_json(&self) -> Option<Value> {
        match &*lock(&self.content) {
            Content::Text(text) => serde_json::from_str(text).ok(),
            Content::Written(_) | Content::Forgotten => None,
        }
    }

    /// Whether the view holds its object's text.
    #[cfg(test)]
    pub(super) fn holds_text(&self) -> bool {
        matches!(*lock(&self.content), Content::Text(_))
    }

    /// `object` as JSON text, as the API server stores it, without its managed fields and
    /// status. Items of a list carry no `apiVersion` and `kind`; the key says what they are.
    fn text(kind: Kind, object: &DynamicObject) -> Box<str> {
        let mut value = serde_json::to_value(object).unwrap_or_default();
        if let Value::Object(fields) = &mut value {
            let resource = kind.api_resource();
            fields.insert("apiVersion".into(), resource.api_version.into());
            fields.insert("kind".into(), resource.kind.into());
            if let Some(Value::Object(meta)) = fields.get_mut("metadata") {
                meta.remove("managedFields");
            }
            // Others' to write (the quota controller's usage), never compared: a first converge
            // holds the text of every quota the controller updated until the next pass.
            fields.remove("status");
        }
        value.to_string().into_boxed_str()
    }
}

impl LiveObject {
    /// An owned object of `kind` as the watch cache keeps it.
    pub fn owned(kind: Kind, object: &DynamicObject) -> Self {
        LiveObject::Owned(Arc::new(LiveView::new(kind, object)))
    }

    pub(super) fn key(&self) -> ObjectKey {
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

    pub(super) fn resource_version(&self) -> Option<&str> {
        match self {
            LiveObject::DeviceClass(o) => o.metadata.resource_version.as_deref(),
            LiveObject::Owned(v) => v.resource_version.as_deref(),
        }
    }

    /// The object as the API server stores it, while it is known.
    pub(super) fn to_json(&self) -> Option<Value> {
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
            LiveObject::Owned(v) => v.text_json(),
        }
    }

    /// Forgets the content once it has been compared: what is kept decides from now on.
    pub(super) fn compared(&self) {
        if let LiveObject::Owned(v) = self {
            *lock(&v.content) = Content::Forgotten;
        }
    }
}
