//! The desired side of the differ: the planner's objects, shared with it, and what the differ
//! reads of them without turning them into JSON (key, content hash, fingerprint).

use std::sync::Arc;

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use k8s_openapi::api::resource::v1::DeviceClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::Value;

use super::{Kind, ObjectKey, key_of_meta};
use crate::core::plan::objects::CONTENT_HASH_ANNOTATION;
use crate::core::plan::{DesiredObjects, NamespacedQuota, NamespacedTemplate};

/// Feeds the JSON text of an object into a hasher, without keeping the text.
struct Hashing(std::hash::DefaultHasher);

impl std::io::Write for Hashing {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        std::hash::Hasher::write(&mut self.0, bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A desired object, shared with the planner; serialized as the object itself.
#[derive(Debug, Clone)]
pub(super) enum DesiredObject {
    DeviceClass(Arc<DeviceClass>),
    AdmissionPolicy(Arc<ValidatingAdmissionPolicy>),
    AdmissionBinding(Arc<ValidatingAdmissionPolicyBinding>),
    ResourceQuota(Arc<NamespacedQuota>),
    ResourceClaimTemplate(NamespacedTemplate),
    ClusterRole(Arc<ClusterRole>),
    ClusterRoleBinding(Arc<ClusterRoleBinding>),
}

impl DesiredObject {
    /// The metadata of a cluster-wide object, or a template's shared one; a quota keeps its
    /// own (see [`NamespacedQuota::same_as`]).
    fn meta(&self) -> Option<&ObjectMeta> {
        match self {
            DesiredObject::DeviceClass(o) => Some(&o.metadata),
            DesiredObject::AdmissionPolicy(o) => Some(&o.metadata),
            DesiredObject::AdmissionBinding(o) => Some(&o.metadata),
            DesiredObject::ResourceQuota(_) => None,
            DesiredObject::ResourceClaimTemplate(o) => Some(&o.template.metadata),
            DesiredObject::ClusterRole(o) => Some(&o.metadata),
            DesiredObject::ClusterRoleBinding(o) => Some(&o.metadata),
        }
    }

    /// The namespace and name of the object, borrowed (see [`DesiredObject::key`]).
    pub(super) fn key_parts(&self) -> (Option<&str>, &str) {
        fn of_meta(meta: &ObjectMeta) -> (Option<&str>, &str) {
            (
                meta.namespace.as_deref(),
                meta.name.as_deref().unwrap_or_default(),
            )
        }
        match self {
            DesiredObject::DeviceClass(o) => of_meta(&o.metadata),
            DesiredObject::AdmissionPolicy(o) => of_meta(&o.metadata),
            DesiredObject::AdmissionBinding(o) => of_meta(&o.metadata),
            DesiredObject::ResourceQuota(q) => (Some(&q.namespace), q.name()),
            DesiredObject::ResourceClaimTemplate(t) => (Some(&t.namespace), t.name()),
            DesiredObject::ClusterRole(o) => of_meta(&o.metadata),
            DesiredObject::ClusterRoleBinding(o) => of_meta(&o.metadata),
        }
    }

    /// Whether `other` is this very object (not an equal one): a template is shared by the
    /// namespaces of its team, so its namespace counts too.
    pub(super) fn is(&self, other: &DesiredObject) -> bool {
        match (self, other) {
            (DesiredObject::ResourceClaimTemplate(a), DesiredObject::ResourceClaimTemplate(b)) => {
                Arc::ptr_eq(&a.template, &b.template) && Arc::ptr_eq(&a.namespace, &b.namespace)
            }
            _ => std::ptr::eq(self.address(), other.address()),
        }
    }

    pub(super) fn key(&self, kind: Kind) -> ObjectKey {
        let in_namespace = |namespace: &str, name: &str| ObjectKey {
            kind,
            namespace: Some(namespace.to_owned()),
            name: name.to_owned(),
        };
        match self {
            DesiredObject::DeviceClass(o) => key_of_meta(kind, &o.metadata),
            DesiredObject::AdmissionPolicy(o) => key_of_meta(kind, &o.metadata),
            DesiredObject::AdmissionBinding(o) => key_of_meta(kind, &o.metadata),
            DesiredObject::ResourceQuota(q) => in_namespace(&q.namespace, q.name()),
            DesiredObject::ResourceClaimTemplate(t) => in_namespace(&t.namespace, t.name()),
            DesiredObject::ClusterRole(o) => key_of_meta(kind, &o.metadata),
            DesiredObject::ClusterRoleBinding(o) => key_of_meta(kind, &o.metadata),
        }
    }

    /// Whether `self` is `known` unchanged without comparing content: the same object, or one
    /// with equal metadata that carries the hash of its spec.
    pub(super) fn same_as(&self, known: &DesiredObject) -> bool {
        if std::ptr::eq(known.address(), self.address()) {
            return true;
        }
        match (self, known) {
            (DesiredObject::ResourceQuota(a), DesiredObject::ResourceQuota(b)) => a.same_as(b),
            _ => self.meta().is_some_and(|meta| {
                let hashed = meta
                    .annotations
                    .as_ref()
                    .is_some_and(|a| a.contains_key(CONTENT_HASH_ANNOTATION));
                hashed && known.meta() == Some(meta)
            }),
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
            DesiredObject::ClusterRole(o) => Arc::as_ptr(o).cast(),
            DesiredObject::ClusterRoleBinding(o) => Arc::as_ptr(o).cast(),
        }
    }

    /// The content hash its annotation carries.
    pub(super) fn content_hash(&self) -> Option<&str> {
        match self {
            DesiredObject::ResourceQuota(q) => Some(q.content_hash()),
            _ => self
                .meta()?
                .annotations
                .as_ref()?
                .get(CONTENT_HASH_ANNOTATION)
                .map(String::as_str),
        }
    }

    /// A fingerprint of the object's JSON (the identity of what an apply sends); None if it
    /// cannot be serialized.
    pub(super) fn fingerprint(&self) -> Option<u64> {
        let mut hashing = Hashing(std::hash::DefaultHasher::new());
        serde_json::to_writer(&mut hashing, self).ok()?;
        Some(std::hash::Hasher::finish(&hashing.0))
    }

    pub(super) fn to_json(&self) -> Option<Value> {
        serde_json::to_value(self).ok()
    }

    /// Every desired object, with its key.
    pub(super) fn all(
        objects: &DesiredObjects,
    ) -> impl Iterator<Item = (Kind, DesiredObject)> + '_ {
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
        .chain(
            o.member_roles
                .iter()
                .map(|r| (Kind::ClusterRole, DesiredObject::ClusterRole(r.clone()))),
        )
        .chain(o.member_bindings.iter().map(|b| {
            (
                Kind::ClusterRoleBinding,
                DesiredObject::ClusterRoleBinding(b.clone()),
            )
        }))
    }
}

impl serde::Serialize for DesiredObject {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            DesiredObject::DeviceClass(o) => o.serialize(serializer),
            DesiredObject::AdmissionPolicy(o) => o.serialize(serializer),
            DesiredObject::AdmissionBinding(o) => o.serialize(serializer),
            DesiredObject::ResourceQuota(o) => o.serialize(serializer),
            DesiredObject::ResourceClaimTemplate(o) => o.serialize(serializer),
            DesiredObject::ClusterRole(o) => o.serialize(serializer),
            DesiredObject::ClusterRoleBinding(o) => o.serialize(serializer),
        }
    }
}
