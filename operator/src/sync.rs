//! What to write: the difference between the plan and what is live. Pure; the controller
//! executes the writes. A steady state gives no write at all.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use kube::core::{ApiResource, GroupVersionKind};
use serde_json::Value;

use crate::plan::DesiredObjects;
use crate::plan::objects::CONTENT_HASH_ANNOTATION;

/// The kinds of object teamgpu writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    DeviceClass,
    ValidatingAdmissionPolicy,
    ValidatingAdmissionPolicyBinding,
    ResourceQuota,
    ResourceClaimTemplate,
}

impl Kind {
    pub const ALL: [Kind; 5] = [
        Kind::DeviceClass,
        Kind::ValidatingAdmissionPolicy,
        Kind::ValidatingAdmissionPolicyBinding,
        Kind::ResourceQuota,
        Kind::ResourceClaimTemplate,
    ];

    pub fn api_resource(self) -> ApiResource {
        let (group, version, kind, plural) = match self {
            Kind::DeviceClass => ("resource.k8s.io", "v1", "DeviceClass", "deviceclasses"),
            Kind::ValidatingAdmissionPolicy => (
                "admissionregistration.k8s.io",
                "v1",
                "ValidatingAdmissionPolicy",
                "validatingadmissionpolicies",
            ),
            Kind::ValidatingAdmissionPolicyBinding => (
                "admissionregistration.k8s.io",
                "v1",
                "ValidatingAdmissionPolicyBinding",
                "validatingadmissionpolicybindings",
            ),
            Kind::ResourceQuota => ("", "v1", "ResourceQuota", "resourcequotas"),
            Kind::ResourceClaimTemplate => (
                "resource.k8s.io",
                "v1",
                "ResourceClaimTemplate",
                "resourceclaimtemplates",
            ),
        };
        ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural)
    }

    pub fn namespaced(self) -> bool {
        matches!(self, Kind::ResourceQuota | Kind::ResourceClaimTemplate)
    }

    /// Lower-case name for logs and metric labels.
    pub fn label(self) -> &'static str {
        match self {
            Kind::DeviceClass => "deviceclass",
            Kind::ValidatingAdmissionPolicy => "validatingadmissionpolicy",
            Kind::ValidatingAdmissionPolicyBinding => "validatingadmissionpolicybinding",
            Kind::ResourceQuota => "resourcequota",
            Kind::ResourceClaimTemplate => "resourceclaimtemplate",
        }
    }
}

/// Which object.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectKey {
    pub kind: Kind,
    pub namespace: Option<String>,
    pub name: String,
}

impl fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.namespace {
            Some(ns) => write!(f, "{} {ns}/{}", self.kind.label(), self.name),
            None => write!(f, "{} {}", self.kind.label(), self.name),
        }
    }
}

/// One write to perform.
#[derive(Clone, Debug, PartialEq)]
pub enum Write {
    /// Server-side apply of the whole object (creates it when missing, restores drift).
    Apply { key: ObjectKey, object: Value },
    /// Delete, then apply: the object's spec is immutable and has changed.
    Recreate { key: ObjectKey, object: Value },
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

/// The writes that make `live` (teamgpu-labelled objects only) equal to `desired`, in a safe
/// order: classes and policies before what uses them, deletions last.
/// `retained` DeviceClasses are neither applied nor deleted.
pub fn writes(
    desired: &BTreeMap<ObjectKey, Value>,
    retained: &BTreeSet<String>,
    live: &BTreeMap<ObjectKey, Value>,
) -> Vec<Write> {
    let mut out = Vec::new();
    for (key, object) in desired {
        let Some(current) = live.get(key) else {
            out.push(Write::Apply {
                key: key.clone(),
                object: object.clone(),
            });
            continue;
        };
        let same_content = content_hash(current) == content_hash(object);
        if key.kind == Kind::ResourceClaimTemplate && !same_content {
            out.push(Write::Recreate {
                key: key.clone(),
                object: object.clone(),
            });
        } else if !same_content || !covers(current, object) {
            out.push(Write::Apply {
                key: key.clone(),
                object: object.clone(),
            });
        }
    }
    for key in live.keys() {
        let keep = key.kind == Kind::DeviceClass && retained.contains(&key.name);
        if !desired.contains_key(key) && !keep {
            out.push(Write::Delete { key: key.clone() });
        }
    }
    // `Kind`'s order is the dependency order: applies follow it, deletions (last) reverse it.
    // The sort is stable, so objects of one kind stay in key order.
    out.sort_by_key(|w| {
        let order = w.key().kind as i8;
        match w {
            Write::Delete { .. } => (1, -order),
            Write::Apply { .. } | Write::Recreate { .. } => (0, order),
        }
    });
    out
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
        assert!(writes(&desired, &BTreeSet::new(), &live).is_empty());
    }

    #[test]
    fn drift_and_removed_fields_are_written_back() {
        let k = key(Kind::ResourceQuota, Some("a"), "teamgpu");
        let desired = BTreeMap::from([(k.clone(), quota("h1", "4"))]);
        // Someone edited the value.
        let live = BTreeMap::from([(k.clone(), quota("h1", "9"))]);
        assert!(matches!(
            &writes(&desired, &BTreeSet::new(), &live)[..],
            [Write::Apply { .. }]
        ));
        // The plan dropped a field: only the hash tells (the live object still covers the plan).
        let mut old = quota("h0", "4");
        old["spec"]["hard"]["y.deviceclass.resource.k8s.io/devices"] = json!("0");
        let live = BTreeMap::from([(k, old)]);
        assert!(matches!(
            &writes(&desired, &BTreeSet::new(), &live)[..],
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
        let out = writes(&desired, &retained, &live);
        assert_eq!(out.len(), 2, "{out:?}");
        assert!(matches!(&out[0], Write::Recreate { key, .. } if key == &t));
        assert!(matches!(&out[1], Write::Delete { key } if key == &stale));
    }

    #[test]
    fn classes_are_applied_before_the_templates_that_use_them() {
        let class = key(Kind::DeviceClass, None, "a.teamgpu.io");
        let tmpl = key(Kind::ResourceClaimTemplate, Some("ns"), "a");
        let desired = BTreeMap::from([(tmpl.clone(), json!({})), (class.clone(), json!({}))]);
        let out = writes(&desired, &BTreeSet::new(), &BTreeMap::new());
        assert_eq!(
            out.iter().map(|w| w.key().clone()).collect::<Vec<_>>(),
            [class, tmpl]
        );
    }
}
