//! Server-side apply and managed fields: a faithful subset of sigs.k8s.io/structured-merge-diff.
//!
//! * A field set is a set of paths (`f:<field>`, `k:<keys>` for items of `x-kubernetes-list-type:
//!   map` lists, `v:<value>` for items of `set` lists); `atomic` lists, atomic maps and scalars are
//!   leaves. Lists without a list type are atomic, as in SMD. Field sets are stored in
//!   `metadata.managedFields` as `FieldsV1`, one entry per (manager, operation, subresource).
//! * Apply: the applied configuration's field set becomes the manager's Apply set. A field in
//!   it that another manager owns and whose value the apply would change is a conflict (409,
//!   `Apply failed with N conflict(s)`), unless `force` moves ownership. Fields the manager owned
//!   before, no longer applies and nobody else owns are removed from the object
//!   (https://kubernetes.io/docs/reference/using-api/server-side-apply/#merge-strategy: "if a
//!   field is removed from the configuration and no other field manager owns it, the field is
//!   removed from the live object").
//! * Updates (create, PUT, non-apply patches) give the writer's Update entry the fields it
//!   changed and take them away from every other manager.
//! * Metadata the server owns (name, namespace, uid, resourceVersion, generation,
//!   creationTimestamp, managedFields) and apiVersion/kind are never tracked (SMD's stripmeta).
//!
//! Not implemented: `x-kubernetes-list-type: map` items whose keys are missing (SMD errors),
//! `granular` vs `atomic` structs beyond `x-kubernetes-map-type`, version conversion of field
//! sets, the managed-fields reset by `managedFields: [{}]`.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value, json};

use crate::openapi::Schemas;
use crate::resources::ResourceType;
use crate::status::ApiError;

/// One step of a field path.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Pe {
    /// A struct field or map key.
    Field(String),
    /// An item of an associative list, by its key fields (canonical JSON object).
    Key(String),
    /// An item of a set list, by value (JSON).
    Value(String),
}

/// A field path.
pub type Path = Vec<Pe>;
/// A field set.
pub type FieldSet = BTreeSet<Path>;

/// Kind of a list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListType {
    /// Replaced as a whole.
    Atomic,
    /// Items are unique scalars.
    Set,
    /// Items are objects identified by these key fields.
    Map(Vec<String>),
}

/// Schema navigation for SSA and strategic merge patch.
#[derive(Debug, Clone, Copy)]
pub struct Nav<'a> {
    schemas: &'a Schemas,
    root: Option<&'a Value>,
    crd: bool,
}

/// A schema node (possibly unknown).
#[derive(Debug, Clone, Copy)]
pub struct Node<'a> {
    schemas: &'a Schemas,
    /// The property schema as written (may carry list/patch extensions).
    raw: Option<&'a Value>,
    /// After following `$ref` / single-`allOf`.
    resolved: Option<&'a Value>,
    crd_root: bool,
}

fn resolve<'a>(schemas: &'a Schemas, mut s: &'a Value) -> &'a Value {
    for _ in 0..16 {
        if let Some(r) = s.get("$ref").and_then(Value::as_str) {
            match schemas.component(r.trim_start_matches("#/components/schemas/")) {
                Some(x) => s = x,
                None => return s,
            }
        } else if let Some(Value::Array(all)) = s.get("allOf")
            && all.len() == 1
            && s.get("properties").is_none()
        {
            s = &all[0];
        } else {
            return s;
        }
    }
    s
}

impl<'a> Nav<'a> {
    /// Navigation of a built-in kind's upstream schema.
    pub fn builtin(schemas: &'a Schemas, api_version: &str, kind: &str) -> Nav<'a> {
        Nav {
            schemas,
            root: schemas.schema_for(api_version, kind),
            crd: false,
        }
    }

    /// Navigation of a CRD's structural schema.
    pub fn crd(schemas: &'a Schemas, schema: &'a Value) -> Nav<'a> {
        Nav {
            schemas,
            root: Some(schema),
            crd: true,
        }
    }

    /// The root node.
    pub fn root(&self) -> Node<'a> {
        Node {
            schemas: self.schemas,
            raw: self.root,
            resolved: self.root.map(|r| resolve(self.schemas, r)),
            crd_root: self.crd,
        }
    }
}

impl<'a> Node<'a> {
    fn ext(&self, key: &str) -> Option<&'a Value> {
        self.raw
            .and_then(|r| r.get(key))
            .or_else(|| self.resolved.and_then(|r| r.get(key)))
    }

    fn make(&self, raw: Option<&'a Value>) -> Node<'a> {
        Node {
            schemas: self.schemas,
            raw,
            resolved: raw.map(|r| resolve(self.schemas, r)),
            crd_root: false,
        }
    }

    /// The node of a field or map value.
    pub fn field(&self, name: &str) -> Node<'a> {
        if self.crd_root && name == "metadata" {
            return self.make(
                self.schemas
                    .component("io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"),
            );
        }
        let r = self.resolved;
        let prop = r
            .and_then(|r| r.get("properties"))
            .and_then(|p| p.get(name));
        let child = prop.or_else(|| {
            r.and_then(|r| r.get("additionalProperties"))
                .filter(|a| a.is_object())
        });
        self.make(child)
    }

    /// The node of list items.
    pub fn items(&self) -> Node<'a> {
        self.make(self.resolved.and_then(|r| r.get("items")))
    }

    /// The list type (`x-kubernetes-list-type`, default atomic).
    pub fn list_type(&self) -> ListType {
        match self.ext("x-kubernetes-list-type").and_then(Value::as_str) {
            Some("set") => ListType::Set,
            Some("map") => ListType::Map(
                self.ext("x-kubernetes-list-map-keys")
                    .and_then(Value::as_array)
                    .map(|a| {
                        a.iter()
                            .filter_map(|k| k.as_str().map(String::from))
                            .collect()
                    })
                    .unwrap_or_default(),
            ),
            _ => ListType::Atomic,
        }
    }

    /// Whether an object here is atomic (`x-kubernetes-map-type: atomic`, or a free-form
    /// object without properties in a built-in schema).
    pub fn atomic_object(&self) -> bool {
        if self.ext("x-kubernetes-map-type").and_then(Value::as_str) == Some("atomic") {
            return true;
        }
        false
    }

    /// `x-kubernetes-patch-strategy` contains `merge`.
    pub fn patch_merge(&self) -> bool {
        self.ext("x-kubernetes-patch-strategy")
            .and_then(Value::as_str)
            .is_some_and(|s| s.split(',').any(|x| x == "merge"))
    }

    /// `x-kubernetes-patch-strategy` contains `retainKeys`.
    pub fn patch_merge_key(&self) -> Option<&'a str> {
        self.ext("x-kubernetes-patch-merge-key")
            .and_then(Value::as_str)
    }
}

fn key_of(item: &Value, keys: &[String]) -> String {
    let m: BTreeMap<&str, &Value> = keys
        .iter()
        .filter_map(|k| item.get(k).map(|v| (k.as_str(), v)))
        .collect();
    serde_json::to_string(&m).unwrap_or_default()
}

/// The field set of an object.
pub fn field_set(node: Node<'_>, value: &Value) -> FieldSet {
    let mut out = FieldSet::new();
    collect(node, value, &mut Vec::new(), &mut out);
    out
}

fn collect(node: Node<'_>, value: &Value, prefix: &mut Path, out: &mut FieldSet) {
    match value {
        Value::Object(m) if !node.atomic_object() => {
            if m.is_empty() && !prefix.is_empty() {
                out.insert(prefix.clone());
            }
            for (k, v) in m {
                if v.is_null() {
                    continue;
                }
                prefix.push(Pe::Field(k.clone()));
                collect(node.field(k), v, prefix, out);
                prefix.pop();
            }
        }
        Value::Array(items) => match node.list_type() {
            ListType::Map(keys) => {
                let inode = node.items();
                for item in items {
                    prefix.push(Pe::Key(key_of(item, &keys)));
                    out.insert(prefix.clone());
                    collect(inode, item, prefix, out);
                    prefix.pop();
                }
            }
            ListType::Set => {
                for item in items {
                    prefix.push(Pe::Value(item.to_string()));
                    out.insert(prefix.clone());
                    prefix.pop();
                }
            }
            ListType::Atomic => {
                out.insert(prefix.clone());
            }
        },
        _ => {
            if !prefix.is_empty() {
                out.insert(prefix.clone());
            }
        }
    }
}

/// Removes the paths the server owns (stripmeta) and, depending on the subresource, status or
/// everything but status.
fn strip(set: FieldSet, subresource: Option<&str>, has_status: bool) -> FieldSet {
    const META: [&str; 8] = [
        "name",
        "namespace",
        "uid",
        "resourceVersion",
        "generation",
        "creationTimestamp",
        "managedFields",
        "selfLink",
    ];
    set.into_iter()
        .filter(|p| {
            let first = match p.first() {
                Some(Pe::Field(f)) => f.as_str(),
                _ => return false,
            };
            if first == "apiVersion" || first == "kind" {
                return false;
            }
            if first == "metadata" {
                if p.len() == 1 {
                    return false;
                }
                if let Some(Pe::Field(f)) = p.get(1)
                    && (META.contains(&f.as_str())
                        || f == "deletionTimestamp"
                        || f == "deletionGracePeriodSeconds")
                {
                    return false;
                }
            }
            match subresource {
                Some("status") => first == "status",
                _ => !(has_status && first == "status"),
            }
        })
        .collect()
}

/// The value at a path.
pub fn value_at<'v>(v: &'v Value, path: &[Pe]) -> Option<&'v Value> {
    let mut cur = v;
    for pe in path {
        cur = match pe {
            Pe::Field(f) => cur.get(f)?,
            Pe::Key(k) => {
                let key: Map<String, Value> = serde_json::from_str(k).ok()?;
                cur.as_array()?
                    .iter()
                    .find(|item| key.iter().all(|(kk, kv)| item.get(kk) == Some(kv)))?
            }
            Pe::Value(s) => {
                let want: Value = serde_json::from_str(s).ok()?;
                cur.as_array()?.iter().find(|i| **i == want)?
            }
        };
    }
    Some(cur)
}

fn same_leaf(a: Option<&Value>, b: Option<&Value>) -> bool {
    match (a, b) {
        (Some(Value::Object(x)), Some(Value::Object(y))) if !x.is_empty() && !y.is_empty() => true,
        (a, b) => a == b,
    }
}

/// Removes the value at a path; prunes emptied maps/lists below the top-level field.
fn remove_path(v: &mut Value, path: &[Pe]) {
    let Some((last, parent_path)) = path.split_last() else {
        return;
    };
    let mut cur = &mut *v;
    for pe in parent_path {
        let next = match pe {
            Pe::Field(f) => cur.get_mut(f),
            Pe::Key(_) | Pe::Value(_) => {
                let target = value_at(cur, std::slice::from_ref(pe)).cloned();
                cur.as_array_mut()
                    .and_then(|a| a.iter_mut().find(|i| Some(&**i) == target.as_ref()))
            }
        };
        match next {
            Some(n) => cur = n,
            None => return,
        }
    }
    match last {
        Pe::Field(f) => {
            if let Some(m) = cur.as_object_mut() {
                m.remove(f);
            }
        }
        Pe::Key(_) | Pe::Value(_) => {
            let target = value_at(cur, std::slice::from_ref(last)).cloned();
            if let Some(a) = cur.as_array_mut() {
                a.retain(|i| Some(i) != target.as_ref());
            }
        }
    }
    // Go's omitempty drops empty maps and slices of built-in types on re-encoding.
    if path.len() > 2 {
        let parent = &path[..path.len() - 1];
        if let Some(p) = value_at(v, parent)
            && (p.as_object().is_some_and(Map::is_empty) || p.as_array().is_some_and(Vec::is_empty))
        {
            remove_path(v, parent);
        }
    }
}

/// Merges an applied configuration into a live object (SMD's merge by schema).
pub fn merge(node: Node<'_>, live: Option<&Value>, cfg: &Value) -> Value {
    match (live, cfg) {
        (Some(Value::Object(l)), Value::Object(c)) if !node.atomic_object() => {
            let mut out = l.clone();
            for (k, v) in c {
                if v.is_null() {
                    continue;
                }
                let merged = merge(node.field(k), l.get(k), v);
                out.insert(k.clone(), merged);
            }
            Value::Object(out)
        }
        (Some(Value::Array(l)), Value::Array(c)) => match node.list_type() {
            ListType::Map(keys) => {
                let inode = node.items();
                let mut out = l.clone();
                for item in c {
                    let k = key_of(item, &keys);
                    match out.iter_mut().find(|i| key_of(i, &keys) == k) {
                        Some(existing) => *existing = merge(inode, Some(existing), item),
                        None => out.push(item.clone()),
                    }
                }
                Value::Array(out)
            }
            ListType::Set => {
                let mut out = l.clone();
                for item in c {
                    if !out.contains(item) {
                        out.push(item.clone());
                    }
                }
                Value::Array(out)
            }
            ListType::Atomic => cfg.clone(),
        },
        (_, Value::Object(c)) => {
            // Nothing live: drop nulls.
            let mut out = Map::new();
            for (k, v) in c {
                if !v.is_null() {
                    out.insert(k.clone(), merge(node.field(k), None, v));
                }
            }
            Value::Object(out)
        }
        _ => cfg.clone(),
    }
}

/// One `managedFields` entry.
#[derive(Debug, Clone)]
pub struct Entry {
    /// Manager name.
    pub manager: String,
    /// `Apply` or `Update`.
    pub operation: String,
    /// "" or "status".
    pub subresource: String,
    /// apiVersion.
    pub api_version: String,
    /// Time of the last change.
    pub time: String,
    /// Owned fields.
    pub set: FieldSet,
}

impl Entry {
    fn to_json(&self) -> Value {
        let mut v = json!({
            "manager": self.manager, "operation": self.operation, "apiVersion": self.api_version,
            "time": self.time, "fieldsType": "FieldsV1", "fieldsV1": to_fields_v1(&self.set),
        });
        if !self.subresource.is_empty() {
            v["subresource"] = json!(self.subresource);
        }
        v
    }
}

fn pe_string(pe: &Pe) -> String {
    match pe {
        Pe::Field(f) => format!("f:{f}"),
        Pe::Key(k) => format!("k:{k}"),
        Pe::Value(v) => format!("v:{v}"),
    }
}

fn parse_pe(s: &str) -> Option<Pe> {
    let (p, rest) = s.split_at_checked(2)?;
    match p {
        "f:" => Some(Pe::Field(rest.to_string())),
        "k:" => {
            // Canonicalise key order.
            let m: BTreeMap<String, Value> = serde_json::from_str(rest).ok()?;
            Some(Pe::Key(serde_json::to_string(&m).ok()?))
        }
        "v:" => Some(Pe::Value(rest.to_string())),
        _ => None,
    }
}

/// Encodes a field set as FieldsV1: a member without members below it is `{}`; a member with
/// members below it carries `".": {}`.
pub fn to_fields_v1(set: &FieldSet) -> Value {
    let mut root = Map::new();
    for path in set {
        let mut cur = &mut root;
        for pe in path {
            let entry = cur
                .entry(pe_string(pe))
                .or_insert_with(|| Value::Object(Map::new()));
            cur = entry.as_object_mut().expect("object");
        }
    }
    for path in set {
        let mut cur = &mut root;
        for pe in path {
            cur = cur
                .get_mut(&pe_string(pe))
                .and_then(Value::as_object_mut)
                .expect("inserted above");
        }
        if !cur.is_empty() {
            cur.insert(".".into(), json!({}));
        }
    }
    Value::Object(root)
}

/// Decodes FieldsV1.
pub fn from_fields_v1(v: &Value) -> FieldSet {
    let mut out = FieldSet::new();
    fn walk(v: &Value, prefix: &mut Path, out: &mut FieldSet) {
        let Some(m) = v.as_object() else { return };
        if (m.is_empty() || m.contains_key(".")) && !prefix.is_empty() {
            out.insert(prefix.clone());
        }
        for (k, child) in m {
            if k == "." {
                continue;
            }
            if let Some(pe) = parse_pe(k) {
                prefix.push(pe);
                walk(child, prefix, out);
                prefix.pop();
            }
        }
    }
    walk(v, &mut Vec::new(), &mut out);
    out
}

/// The managedFields entries of an object.
pub fn entries(obj: Option<&Value>) -> Vec<Entry> {
    obj.and_then(|o| o.pointer("/metadata/managedFields"))
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .map(|e| Entry {
                    manager: e["manager"].as_str().unwrap_or("").into(),
                    operation: e["operation"].as_str().unwrap_or("").into(),
                    subresource: e["subresource"].as_str().unwrap_or("").into(),
                    api_version: e["apiVersion"].as_str().unwrap_or("").into(),
                    time: e["time"].as_str().unwrap_or("").into(),
                    set: from_fields_v1(&e["fieldsV1"]),
                })
                .collect()
        })
        .unwrap_or_default()
}

/// A conflict of an apply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conflict {
    /// The other manager, as the API server prints it (`printManager` of
    /// k8s.io/apiserver/pkg/endpoints/handlers/fieldmanager: `"name"`, `"name" with subresource
    /// "status"`, and for Update entries `... using <apiVersion> at <time>`).
    pub manager: String,
    /// The field (`.spec.containers[name="c"].image`).
    pub field: String,
}

fn print_manager(e: &Entry) -> String {
    let mut s = format!("\"{}\"", e.manager);
    if !e.subresource.is_empty() {
        s.push_str(&format!(" with subresource \"{}\"", e.subresource));
    }
    if e.operation == "Update" {
        s.push_str(&format!(" using {}", e.api_version));
        if !e.time.is_empty() {
            s.push_str(&format!(" at {}", e.time));
        }
    }
    s
}

/// Renders a path like SMD does in conflict messages.
pub fn path_string(path: &[Pe]) -> String {
    let mut s = String::new();
    for pe in path {
        match pe {
            Pe::Field(f) => {
                s.push('.');
                s.push_str(f);
            }
            Pe::Key(k) => {
                let m: BTreeMap<String, Value> = serde_json::from_str(k).unwrap_or_default();
                let parts: Vec<String> = m.iter().map(|(k, v)| format!("{k}={v}")).collect();
                s.push_str(&format!("[{}]", parts.join(",")));
            }
            Pe::Value(v) => s.push_str(&format!("[={v}]")),
        }
    }
    s
}

/// The 409 for apply conflicts (k8s.io/apiserver/pkg/endpoints/handlers/fieldmanager).
pub fn conflict_error(rt: &ResourceType, name: &str, conflicts: &[Conflict]) -> ApiError {
    let n = conflicts.len();
    let mut by_manager: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for c in conflicts {
        by_manager.entry(&c.manager).or_default().push(&c.field);
    }
    let msg = if n == 1 {
        format!(
            "Apply failed with 1 conflict: conflict with {}: {}",
            conflicts[0].manager, conflicts[0].field
        )
    } else {
        let mut m = format!("Apply failed with {n} conflicts:");
        for (mgr, fields) in &by_manager {
            m.push_str(&format!(" conflicts with {mgr}:"));
            for f in fields {
                m.push_str(&format!("\n- {f}"));
            }
        }
        m
    };
    let causes: Vec<Value> = conflicts
        .iter()
        .map(|c| json!({"reason": "FieldManagerConflict", "message": format!("conflict with {}", c.manager), "field": c.field}))
        .collect();
    ApiError {
        details: Some(
            json!({"name": name, "group": rt.group, "kind": rt.plural, "causes": causes}),
        ),
        ..ApiError::new(409, "Conflict", msg)
    }
}

/// The result of an apply.
#[derive(Debug, Clone)]
pub struct Applied {
    /// The merged object (not yet validated or stored).
    pub object: Value,
    /// The new managedFields.
    pub managed: Vec<Value>,
}

/// Whether `path` is a key field of a list-map item (`...[k=v].k`).
fn is_key_field(path: &[Pe]) -> bool {
    match path {
        [.., Pe::Key(key), Pe::Field(field)] => serde_json::from_str::<Map<String, Value>>(key)
            .is_ok_and(|keys| keys.contains_key(field)),
        _ => false,
    }
}

/// Server-side apply of `cfg` by `manager` onto `live` (None: the apply creates the object).
#[allow(clippy::too_many_arguments)]
pub fn apply(
    nav: &Nav<'_>,
    live: Option<&Value>,
    cfg: &Value,
    manager: &str,
    subresource: Option<&str>,
    has_status: bool,
    force: bool,
    now: &str,
    api_version: &str,
) -> Result<Applied, Vec<Conflict>> {
    let root = nav.root();
    let sub = subresource.unwrap_or("");
    let new_set = strip(field_set(root, cfg), subresource, has_status);
    let mut entries = entries(live);
    let empty = json!({});
    let live_obj = live.unwrap_or(&empty);
    let mine = |e: &Entry| e.manager == manager && e.operation == "Apply" && e.subresource == sub;
    let mut conflicts = Vec::new();
    let mut conflicting: BTreeSet<(usize, Path)> = BTreeSet::new();
    for (i, e) in entries.iter().enumerate() {
        if mine(e) {
            continue;
        }
        for p in new_set.intersection(&e.set) {
            if !same_leaf(value_at(live_obj, p), value_at(cfg, p)) {
                conflicts.push(Conflict {
                    manager: print_manager(e),
                    field: path_string(p),
                });
                conflicting.insert((i, p.clone()));
            }
        }
    }
    if !conflicts.is_empty() && !force {
        return Err(conflicts);
    }
    for (i, p) in &conflicting {
        entries[*i].set.remove(p);
    }
    let mut object = merge(root, live, cfg);
    let old_set = entries
        .iter()
        .find(|e| mine(e))
        .map(|e| e.set.clone())
        .unwrap_or_default();
    let others: FieldSet = entries
        .iter()
        .filter(|e| !mine(e))
        .flat_map(|e| e.set.iter().cloned())
        .collect();
    let mut to_remove: Vec<&Path> = old_set
        .iter()
        .filter(|p| !new_set.contains(*p) && !others.contains(*p))
        // A list-map item's key fields live as long as the item (SMD keeps them while anyone
        // owns a field of it, and removes them with it).
        .filter(|p| !is_key_field(p))
        // A child of a still-applied list item or field is removed; a path below a removed
        // one goes with it.
        .collect();
    to_remove.sort_by_key(|p| std::cmp::Reverse(p.len()));
    for p in to_remove {
        remove_path(&mut object, p);
    }
    entries.retain(|e| !mine(e));
    entries.push(Entry {
        manager: manager.to_string(),
        operation: "Apply".into(),
        subresource: sub.to_string(),
        api_version: api_version.to_string(),
        time: now.to_string(),
        set: new_set,
    });
    entries.retain(|e| !e.set.is_empty());
    Ok(Applied {
        object,
        managed: entries.iter().map(Entry::to_json).collect(),
    })
}

/// Managed fields after a non-apply write by `manager`.
#[allow(clippy::too_many_arguments)]
pub fn record_update(
    nav: &Nav<'_>,
    old: Option<&Value>,
    new: &Value,
    manager: &str,
    subresource: Option<&str>,
    has_status: bool,
    now: &str,
    api_version: &str,
) -> Vec<Value> {
    let root = nav.root();
    let sub = subresource.unwrap_or("");
    let new_set = strip(field_set(root, new), subresource, has_status);
    let mut entries = entries(old);
    let (changed, removed): (FieldSet, FieldSet) = match old {
        None => (new_set.clone(), FieldSet::new()),
        Some(old) => {
            let old_set = strip(field_set(root, old), subresource, has_status);
            let changed = new_set
                .iter()
                .filter(|p| !same_leaf(value_at(old, p), value_at(new, p)) || !old_set.contains(*p))
                .cloned()
                .collect();
            let removed = old_set.difference(&new_set).cloned().collect();
            (changed, removed)
        }
    };
    if changed.is_empty() && removed.is_empty() {
        return entries.iter().map(Entry::to_json).collect();
    }
    let mine = |e: &Entry| e.manager == manager && e.operation == "Update" && e.subresource == sub;
    for e in entries.iter_mut() {
        if !mine(e) {
            e.set
                .retain(|p| !changed.contains(p) && !removed.contains(p));
        }
    }
    match entries.iter_mut().find(|e| mine(e)) {
        Some(e) => {
            e.set.extend(changed);
            e.set.retain(|p| !removed.contains(p));
            e.time = now.to_string();
        }
        None => entries.push(Entry {
            manager: manager.to_string(),
            operation: "Update".into(),
            subresource: sub.to_string(),
            api_version: api_version.to_string(),
            time: now.to_string(),
            set: changed,
        }),
    }
    entries.retain(|e| !e.set.is_empty());
    entries.iter().map(Entry::to_json).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_v1_round_trips() {
        let v = json!({"f:metadata": {"f:labels": {"f:a": {}}}, "f:spec": {"f:items": {"k:{\"name\":\"x\"}": {".": {}, "f:name": {}}, "v:\"s\"": {}}}});
        let set = from_fields_v1(&v);
        assert_eq!(set.len(), 4);
        assert_eq!(to_fields_v1(&set), v);
    }

    #[test]
    fn path_strings_look_like_the_api_servers() {
        let p = vec![
            Pe::Field("spec".into()),
            Pe::Key("{\"name\":\"c\"}".into()),
            Pe::Field("image".into()),
        ];
        assert_eq!(path_string(&p), ".spec[name=\"c\"].image");
    }
}
