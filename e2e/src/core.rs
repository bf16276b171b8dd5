//! The API server's request semantics, independent of HTTP: create, get, list, update, patch,
//! delete on JSON objects, with validation, admission, managed fields and the store.
//!
//! The in-process controllers (`crate::controllers`) call these same functions, so their writes
//! go through validation and admission like a real controller's would (but are not counted as
//! client requests).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use serde_json::{Map, Value, json};
use tokio::sync::watch;

use crate::admission;
use crate::openapi::{Schemas, prune};
use crate::patch::{self, PatchType};
use crate::resources::{Registry, ResourceType};
use crate::selectors::{FieldSelector, LabelSelector};
use crate::ssa;
use crate::status::ApiError;
use crate::store::{ObjKey, Store};

/// `fieldValidation` of a write.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum FieldValidation {
    /// Drop unknown fields silently.
    Ignore,
    /// Drop unknown fields and warn (the API server's default).
    #[default]
    Warn,
    /// Reject unknown fields with 400 BadRequest.
    Strict,
}

/// Options of a write request.
#[derive(Debug, Clone, Default)]
pub struct WriteOptions {
    /// `fieldManager` (required for apply; for other writes the API server derives it from the
    /// User-Agent).
    pub field_manager: Option<String>,
    /// `force` (apply only).
    pub force: bool,
    /// `dryRun=All`.
    pub dry_run: bool,
    /// `fieldValidation`.
    pub field_validation: FieldValidation,
    /// User-Agent of the request (for the default field manager).
    pub user_agent: String,
}

impl WriteOptions {
    /// Options with a field manager.
    pub fn manager(name: &str) -> WriteOptions {
        WriteOptions {
            field_manager: Some(name.to_string()),
            ..WriteOptions::default()
        }
    }

    fn manager_name(&self) -> String {
        if let Some(m) = &self.field_manager {
            return m.clone();
        }
        // k8s.io/apiserver/pkg/endpoints/handlers/rest.go managerOrUserAgent/prefixFromUserAgent:
        // the User-Agent up to the first '/' (kube-rs sends none, so its manager is "").
        self.user_agent
            .split('/')
            .next()
            .unwrap_or("")
            .chars()
            .take(128)
            .collect()
    }
}

/// `DeleteOptions` the stand-in honours.
#[derive(Debug, Clone, Default)]
pub struct DeleteOptions {
    /// `preconditions.uid`.
    pub uid: Option<String>,
    /// `preconditions.resourceVersion`.
    pub resource_version: Option<String>,
    /// `propagationPolicy`: Background (default), Foreground, Orphan.
    pub propagation: Option<String>,
    /// `dryRun=All`.
    pub dry_run: bool,
    /// `gracePeriodSeconds` (Pods bound to a node only).
    pub grace_period: Option<i64>,
}

impl DeleteOptions {
    /// Parses a DeleteOptions body (may be empty).
    pub fn from_body(body: &Value) -> DeleteOptions {
        DeleteOptions {
            uid: body
                .pointer("/preconditions/uid")
                .and_then(Value::as_str)
                .map(String::from),
            resource_version: body
                .pointer("/preconditions/resourceVersion")
                .and_then(Value::as_str)
                .map(String::from),
            propagation: body
                .get("propagationPolicy")
                .and_then(Value::as_str)
                .map(String::from)
                .or_else(
                    || match body.get("orphanDependents").and_then(Value::as_bool) {
                        Some(true) => Some("Orphan".to_string()),
                        _ => None,
                    },
                ),
            dry_run: body
                .get("dryRun")
                .and_then(Value::as_array)
                .is_some_and(|a| !a.is_empty()),
            grace_period: body.get("gracePeriodSeconds").and_then(Value::as_i64),
        }
    }
}

/// Options of a list.
#[derive(Debug, Clone, Default)]
pub struct ListOptions {
    /// `labelSelector`.
    pub label_selector: Option<String>,
    /// `fieldSelector`.
    pub field_selector: Option<String>,
    /// `limit`.
    pub limit: Option<usize>,
    /// `continue`.
    pub continue_token: Option<String>,
    /// `resourceVersion`.
    pub resource_version: Option<String>,
    /// `resourceVersionMatch`.
    pub resource_version_match: Option<String>,
}

/// The result of a write.
#[derive(Debug, Clone)]
pub struct Written {
    /// The stored (or, for dry runs, would-be) object.
    pub object: Value,
    /// Whether it was created (201) rather than updated (200).
    pub created: bool,
    /// Warnings for the `Warning` header.
    pub warnings: Vec<String>,
}

/// The API server core.
#[derive(Debug)]
pub struct Core {
    /// Served types.
    pub registry: Registry,
    store: Mutex<Store>,
    rv_tx: watch::Sender<u64>,
    cel: Mutex<Option<kube_cel::Validator>>,
    seed: Mutex<u64>,
}

/// Now, as the API server writes timestamps (RFC 3339, seconds).
pub fn now() -> String {
    jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

/// Namespace and name of an object.
pub fn meta_str<'a>(obj: &'a Value, field: &str) -> &'a str {
    obj.get("metadata")
        .and_then(|m| m.get(field))
        .and_then(Value::as_str)
        .unwrap_or("")
}

/// Everything but `metadata` (and `status` when the kind has a status subresource).
fn content(obj: &Value, drop_status: bool) -> Value {
    let mut c = obj.clone();
    if let Some(m) = c.as_object_mut() {
        m.remove("metadata");
        m.remove("apiVersion");
        m.remove("kind");
        if drop_status {
            m.remove("status");
        }
    }
    c
}

/// An object without resourceVersion and managedFields timestamps (for no-op detection: a
/// write that changes nothing but the time of a managedFields entry is not persisted, one that
/// changes ownership is).
fn comparable(obj: &Value) -> Value {
    let mut c = obj.clone();
    if let Some(m) = c.get_mut("metadata").and_then(Value::as_object_mut) {
        m.remove("resourceVersion");
        if let Some(Value::Array(entries)) = m.get_mut("managedFields") {
            for e in entries {
                if let Some(e) = e.as_object_mut() {
                    e.remove("time");
                }
            }
        }
    }
    c
}

impl Core {
    /// A core serving `registry`.
    pub fn new(registry: Registry, log_capacity: usize) -> Arc<Core> {
        let (rv_tx, _) = watch::channel(1);
        let seed = jiff::Timestamp::now().as_nanosecond() as u64 | 1;
        Arc::new(Core {
            registry,
            store: Mutex::new(Store::new(1, log_capacity)),
            rv_tx,
            cel: Mutex::new(None),
            seed: Mutex::new(seed),
        })
    }

    /// The upstream OpenAPI schemas. `TestCluster` starts loading them on a background thread;
    /// the first caller waits until they are loaded (once per process).
    pub fn schemas(&self) -> &'static Schemas {
        Schemas::upstream().expect("upstream OpenAPI documents load (checked at start-up)")
    }

    /// Creates a namespace without validation or admission (for bootstrapping `default`,
    /// `kube-system`, `kube-public`).
    pub fn bootstrap_namespace(&self, name: &str) {
        let Some(rt) = self.registry.by_path("", "v1", "namespaces").cloned() else {
            return;
        };
        let mut obj = json!({"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": name, "uid": self.uid(), "creationTimestamp": now(), "generation": 1}});
        prepare_for_create(&rt, &mut obj);
        let mut st = self.lock();
        st.put(Self::key(&rt, "", name), obj);
    }

    /// Locks the store.
    pub fn lock(&self) -> MutexGuard<'_, Store> {
        self.store.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A receiver notified of every new revision.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.rv_tx.subscribe()
    }

    fn notify(&self, rv: u64) {
        self.rv_tx.send_replace(rv);
    }

    fn random(&self) -> u64 {
        let mut s = self.seed.lock().unwrap_or_else(|e| e.into_inner());
        // xorshift64*
        *s ^= *s >> 12;
        *s ^= *s << 25;
        *s ^= *s >> 27;
        s.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn uid(&self) -> String {
        let a = self.random();
        let b = self.random();
        format!(
            "{:08x}-{:04x}-4{:03x}-{:04x}-{:012x}",
            a >> 32,
            (a >> 16) & 0xffff,
            a & 0xfff,
            ((b >> 48) & 0x3fff) | 0x8000,
            b & 0xffff_ffff_ffff
        )
    }

    fn generated_name(&self, prefix: &str) -> String {
        // k8s.io/apiserver/pkg/storage/names: 5 characters of utilrand's alphabet.
        const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
        let mut r = self.random();
        let mut s = prefix.chars().take(58).collect::<String>();
        for _ in 0..5 {
            s.push(ALPHABET[(r % ALPHABET.len() as u64) as usize] as char);
            r /= ALPHABET.len() as u64;
        }
        s
    }

    /// The type of a path or kind, or 404.
    pub fn resource(
        &self,
        group: &str,
        version: &str,
        plural: &str,
    ) -> Result<&ResourceType, ApiError> {
        self.registry
            .by_path(group, version, plural)
            .ok_or_else(|| ApiError::no_route(&format!("{group}/{version}/{plural}")))
    }

    fn key(rt: &ResourceType, ns: &str, name: &str) -> ObjKey {
        (
            rt.key(),
            if rt.namespaced {
                ns.to_string()
            } else {
                String::new()
            },
            name.to_string(),
        )
    }

    /// GET one object.
    pub fn get(&self, rt: &ResourceType, ns: &str, name: &str) -> Result<Value, ApiError> {
        self.lock()
            .objects
            .get(&Self::key(rt, ns, name))
            .cloned()
            .ok_or_else(|| ApiError::not_found(rt.gr(), name))
    }

    /// LIST (one namespace or, with `ns` None, all), with selectors and paging.
    pub fn list(
        &self,
        rt: &ResourceType,
        ns: Option<&str>,
        opts: &ListOptions,
    ) -> Result<Value, ApiError> {
        let labels = LabelSelector::parse(opts.label_selector.as_deref().unwrap_or(""))?;
        let fields = FieldSelector::parse(opts.field_selector.as_deref().unwrap_or(""), &rt.kind)?;
        let st = self.lock();
        let ns = if rt.namespaced { ns } else { None };
        // A continue token pins the list's revision and the last key returned
        // (k8s.io/apiserver/pkg/storage continue tokens).
        let (list_rv, after) = match opts.continue_token.as_deref().filter(|c| !c.is_empty()) {
            Some(tok) => {
                let (rv, after) = decode_continue(tok)?;
                (rv, Some(after))
            }
            None => {
                let exact = opts.resource_version_match.as_deref() == Some("Exact");
                match opts
                    .resource_version
                    .as_deref()
                    .filter(|r| !r.is_empty() && *r != "0")
                {
                    Some(r) if exact => (
                        r.parse::<u64>().map_err(|_| {
                            ApiError::bad_request(format!("invalid resource version: {r}"))
                        })?,
                        None,
                    ),
                    Some(r) => {
                        let want = r.parse::<u64>().map_err(|_| {
                            ApiError::bad_request(format!("invalid resource version: {r}"))
                        })?;
                        if want > st.rv {
                            return Err(ApiError::new(
                                504,
                                "Timeout",
                                format!("Too large resource version: {want}, current: {}", st.rv),
                            ));
                        }
                        (st.rv, None)
                    }
                    None => (st.rv, None),
                }
            }
        };
        let snapshot = st.snapshot(&rt.key(), ns, list_rv).ok_or_else(|| {
            if opts.continue_token.is_some() {
                ApiError::expired(
                    "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter, or use the continue token in this response to retrieve the remainder of the results. Continuing with the provided token results in an inconsistent list - objects that were created, modified, or deleted between the time the first chunk was returned and now may show up in the list.",
                )
            } else {
                ApiError::expired(format!("too old resource version: {list_rv} ({})", st.compacted()))
            }
        })?;
        drop(st);
        let mut items = Vec::new();
        let mut next = None;
        let mut remaining = 0usize;
        for (key, obj) in snapshot.iter() {
            if let Some(a) = &after
                && (key.1.as_str(), key.2.as_str()) <= (a.0.as_str(), a.1.as_str())
            {
                continue;
            }
            if !labels.matches_object(obj) || !fields.matches(obj) {
                continue;
            }
            if let Some(limit) = opts.limit.filter(|l| *l > 0)
                && items.len() == limit
            {
                if next.is_none() {
                    let last: &Value = items.last().expect("limit > 0");
                    next = Some(encode_continue(
                        list_rv,
                        meta_str(last, "namespace"),
                        meta_str(last, "name"),
                    ));
                }
                remaining += 1;
                continue;
            }
            items.push(obj.clone());
        }
        let mut metadata = json!({"resourceVersion": list_rv.to_string()});
        if let Some(c) = next {
            metadata["continue"] = json!(c);
            // Like the API server, the count of the remaining items is only given for
            // unfiltered lists.
            if labels.0.is_empty() && fields.0.is_empty() {
                metadata["remainingItemCount"] = json!(remaining);
            }
        }
        Ok(json!({
            "apiVersion": rt.api_version(),
            "kind": format!("{}List", rt.kind),
            "metadata": metadata,
            "items": items,
        }))
    }

    /// CREATE (POST). `ns` is the request's namespace ("" for cluster-scoped).
    pub fn create(
        &self,
        rt: &ResourceType,
        ns: &str,
        body: Value,
        opts: &WriteOptions,
    ) -> Result<Written, ApiError> {
        let mut st = self.lock();
        self.create_locked(&mut st, rt, ns, body, opts, None)
    }

    fn create_locked(
        &self,
        st: &mut Store,
        rt: &ResourceType,
        ns: &str,
        mut body: Value,
        opts: &WriteOptions,
        applied: Option<ssa::Applied>,
    ) -> Result<Written, ApiError> {
        if !body.is_object() {
            return Err(ApiError::bad_request(
                "the body of the request was not an object",
            ));
        }
        check_type_meta(rt, &body)?;
        let meta = body
            .as_object_mut()
            .expect("object")
            .entry("metadata")
            .or_insert_with(|| json!({}));
        if !meta.is_object() {
            return Err(ApiError::bad_request("metadata must be an object"));
        }
        if rt.namespaced {
            match meta.get("namespace").and_then(Value::as_str) {
                Some(n) if !n.is_empty() && n != ns => {
                    return Err(ApiError::bad_request(
                        "the namespace of the provided object does not match the namespace sent on the request",
                    ));
                }
                _ => meta["namespace"] = json!(ns),
            }
        } else if let Some(m) = meta.as_object_mut() {
            m.remove("namespace");
        }
        let mut name = meta
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        if name.is_empty() {
            let gen_name = meta
                .get("generateName")
                .and_then(Value::as_str)
                .unwrap_or("");
            if gen_name.is_empty() {
                return Err(ApiError::invalid(
                    rt.gr(),
                    &rt.kind,
                    "",
                    &[
                        "metadata.name: Required value: name or generateName is required"
                            .to_string(),
                    ],
                ));
            }
            name = self.generated_name(gen_name);
            meta["name"] = json!(name);
        }
        let key = Self::key(rt, ns, &name);
        if st.objects.contains_key(&key) {
            return Err(ApiError::already_exists(rt.gr(), &name));
        }
        if rt.namespaced {
            admission::namespace_lifecycle(self, st, rt, ns, &name)?;
        }
        let m = meta.as_object_mut().expect("object");
        for f in [
            "resourceVersion",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "selfLink",
            "managedFields",
        ] {
            m.remove(f);
        }
        m.insert("uid".into(), json!(self.uid()));
        m.insert("creationTimestamp".into(), json!(now()));
        m.insert("generation".into(), json!(1));
        if rt.status
            && let Some(o) = body.as_object_mut()
        {
            o.remove("status");
        }
        prepare_for_create(rt, &mut body);
        self.finish_write(st, rt, None, body, None, opts, applied)
    }

    /// UPDATE (PUT) of the main resource or, with `subresource` "status", of the status.
    pub fn update(
        &self,
        rt: &ResourceType,
        ns: &str,
        name: &str,
        body: Value,
        subresource: Option<&str>,
        opts: &WriteOptions,
    ) -> Result<Written, ApiError> {
        let mut st = self.lock();
        if !body.is_object() || body.get("metadata").is_some_and(|m| !m.is_object()) {
            return Err(ApiError::bad_request(
                "the body of the request was not an object",
            ));
        }
        check_type_meta(rt, &body)?;
        if meta_str(&body, "name") != name {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({}) does not match the name on the URL ({name})",
                meta_str(&body, "name")
            )));
        }
        let old = st
            .objects
            .get(&Self::key(rt, ns, name))
            .cloned()
            .ok_or_else(|| ApiError::not_found(rt.gr(), name))?;
        let rv = meta_str(&body, "resourceVersion");
        if rv.is_empty() && rt.is_crd() {
            // Custom resources do not allow unconditional updates.
            return Err(ApiError::invalid(
                rt.gr(),
                &rt.kind,
                name,
                &[
                    "metadata.resourceVersion: Invalid value: 0: must be specified for an update"
                        .to_string(),
                ],
            ));
        }
        if !rv.is_empty() && rv != meta_str(&old, "resourceVersion") {
            return Err(ApiError::conflict(rt.gr(), name));
        }
        self.finish_write(&mut st, rt, Some(&old), body, subresource, opts, None)
    }

    /// PATCH (merge, JSON, strategic merge, or server-side apply).
    #[allow(clippy::too_many_arguments)]
    pub fn patch(
        &self,
        rt: &ResourceType,
        ns: &str,
        name: &str,
        patch_type: PatchType,
        patch: &Value,
        subresource: Option<&str>,
        opts: &WriteOptions,
    ) -> Result<Written, ApiError> {
        let mut st = self.lock();
        let old = st.objects.get(&Self::key(rt, ns, name)).cloned();
        if patch_type == PatchType::Apply {
            let manager = opts
                .field_manager
                .clone()
                .filter(|m| !m.is_empty())
                .ok_or_else(|| {
                    ApiError::bad_request(
                        "PATCH, application/apply-patch+yaml requires fieldManager to be set",
                    )
                })?;
            if !patch.is_object() || patch.get("metadata").is_some_and(|m| !m.is_object()) {
                return Err(ApiError::bad_request("error decoding patch: not an object"));
            }
            check_type_meta(rt, patch)?;
            // An apply configuration may omit the name (the URL names the object), but may not
            // contradict it.
            if !meta_str(patch, "name").is_empty() && meta_str(patch, "name") != name {
                return Err(ApiError::bad_request(format!(
                    "the name of the object ({}) does not match the name on the URL ({name})",
                    meta_str(patch, "name")
                )));
            }
            // A resourceVersion in an apply configuration is a precondition.
            let want_rv = meta_str(patch, "resourceVersion");
            if !want_rv.is_empty()
                && old
                    .as_ref()
                    .is_none_or(|o| meta_str(o, "resourceVersion") != want_rv)
            {
                return Err(ApiError::conflict(rt.gr(), name));
            }
            let nav = self.nav(rt);
            let applied = ssa::apply(
                &nav,
                old.as_ref(),
                patch,
                &manager,
                subresource,
                rt.status,
                opts.force,
                &now(),
                &rt.api_version(),
            )
            .map_err(|c| ssa::conflict_error(rt, name, &c))?;
            let mut object = applied.object.clone();
            if meta_str(&object, "name").is_empty() {
                if !object["metadata"].is_object() {
                    object["metadata"] = json!({});
                }
                object["metadata"]["name"] = json!(name);
            }
            return match old {
                None => {
                    if subresource.is_some() {
                        return Err(ApiError::not_found(rt.gr(), name));
                    }
                    self.create_locked(&mut st, rt, ns, object, opts, Some(applied))
                }
                Some(old) => self.finish_write(
                    &mut st,
                    rt,
                    Some(&old),
                    object,
                    subresource,
                    opts,
                    Some(applied),
                ),
            };
        }
        let old = old.ok_or_else(|| ApiError::not_found(rt.gr(), name))?;
        let mut patched = match patch_type {
            PatchType::Merge => patch::merge(&old, patch),
            PatchType::Json => patch::json(&old, patch)?,
            PatchType::Strategic => {
                if rt.is_crd() {
                    return Err(ApiError::new(
                        415,
                        "UnsupportedMediaType",
                        "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml",
                    ));
                }
                patch::strategic(&self.nav(rt), &old, patch)?
            }
            PatchType::Apply => unreachable!("handled above"),
        };
        if !patched.is_object() || patched.get("metadata").is_some_and(|m| !m.is_object()) {
            return Err(ApiError::bad_request(
                "the patched object is not a valid object",
            ));
        }
        let rv = meta_str(&patched, "resourceVersion");
        if !rv.is_empty() && rv != meta_str(&old, "resourceVersion") {
            return Err(ApiError::conflict(rt.gr(), name));
        }
        if patched.get("metadata").is_none() {
            patched["metadata"] = json!({});
        }
        if meta_str(&patched, "name") != name {
            patched["metadata"]["name"] = json!(name);
        }
        self.finish_write(&mut st, rt, Some(&old), patched, subresource, opts, None)
    }

    /// The schema navigator of a type (for SSA and strategic merge).
    pub fn nav<'a>(&'a self, rt: &'a ResourceType) -> ssa::Nav<'a> {
        match &rt.crd_schema {
            Some(s) => ssa::Nav::crd(self.schemas(), s),
            None => ssa::Nav::builtin(self.schemas(), &rt.api_version(), &rt.kind),
        }
    }

    /// Common tail of every write: system metadata, status/spec split, defaults, validation,
    /// generation, admission, managed fields, no-op detection, finalizer-driven removal, commit.
    #[allow(clippy::too_many_arguments)]
    fn finish_write(
        &self,
        st: &mut Store,
        rt: &ResourceType,
        old: Option<&Value>,
        mut new: Value,
        subresource: Option<&str>,
        opts: &WriteOptions,
        applied: Option<ssa::Applied>,
    ) -> Result<Written, ApiError> {
        let name = meta_str(&new, "name").to_string();
        new["apiVersion"] = json!(rt.api_version());
        new["kind"] = json!(rt.kind);
        if let Some(old) = old {
            // The status subresource ignores everything but status; the main resource of a kind
            // with a status subresource ignores status.
            if subresource == Some("status") {
                let status = new.get("status").cloned();
                new = old.clone();
                match status {
                    Some(s) => new["status"] = s,
                    None => {
                        new.as_object_mut().expect("object").remove("status");
                    }
                }
            } else if rt.status {
                match old.get("status") {
                    Some(s) => new["status"] = s.clone(),
                    None => {
                        new.as_object_mut().expect("object").remove("status");
                    }
                }
            }
            // System metadata cannot be changed by clients.
            let om = &old["metadata"];
            let nm = new["metadata"]
                .as_object_mut()
                .ok_or_else(|| ApiError::bad_request("metadata must be an object"))?;
            for f in [
                "name",
                "namespace",
                "uid",
                "creationTimestamp",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "generation",
                "generateName",
            ] {
                match om.get(f) {
                    Some(v) => nm.insert(f.to_string(), v.clone()),
                    None => nm.remove(f),
                };
            }
            if om.get("deletionTimestamp").is_some() {
                let old_f = finalizers(old);
                if let Some(added) = finalizers(&new).into_iter().find(|f| !old_f.contains(f)) {
                    return Err(ApiError::invalid(
                        rt.gr(),
                        &rt.kind,
                        &name,
                        &[format!(
                            "metadata.finalizers: Forbidden: no new finalizers can be added if the object is being deleted, found new finalizers []string{{\"{added}\"}}"
                        )],
                    ));
                }
            }
        }
        if let Some(m) = new["metadata"].as_object_mut() {
            m.remove("managedFields");
            m.remove("resourceVersion");
        }
        // The namespace strategy re-sets the immutable `kubernetes.io/metadata.name` label on
        // every write.
        if rt.kind == "Namespace" && rt.group.is_empty() && old.is_some() {
            if !new["metadata"]["labels"].is_object() {
                new["metadata"]["labels"] = json!({});
            }
            new["metadata"]["labels"]["kubernetes.io/metadata.name"] = json!(name);
        }
        let mut warnings = Vec::new();
        // Defaults, then schema validation (with unknown-field handling), then CEL rules.
        if let Some(schema) = &rt.crd_schema {
            new = kube_cel::apply_defaults(schema, &new);
            let report = self.schemas().check_structural(schema, &new);
            self.unknown_fields(&report.unknown_fields, &mut new, opts, &mut warnings)?;
            if !report.errors.is_empty() {
                return Err(ApiError::invalid(rt.gr(), &rt.kind, &name, &report.errors));
            }
            let root = kube_cel::RootContext {
                api_version: rt.api_version(),
                api_group: rt.group.clone(),
                kind: rt.kind.clone(),
            };
            let mut cel = self.cel.lock().unwrap_or_else(|e| e.into_inner());
            let cel = cel.get_or_insert_with(kube_cel::Validator::new);
            if let Err(errs) = cel.validate_with_context(schema, &new, old, Some(&root)) {
                let causes: Vec<String> = errs
                    .iter()
                    .map(|e| {
                        let path = if e.field_path.is_empty() {
                            "<root>"
                        } else {
                            &e.field_path
                        };
                        format!("{path}: Invalid value: \"object\": {}", e.message)
                    })
                    .collect();
                return Err(ApiError::invalid(rt.gr(), &rt.kind, &name, &causes));
            }
        } else {
            admission::defaults(rt, &mut new);
            let report = self
                .schemas()
                .check(&rt.api_version(), &rt.kind, &new)
                .map_err(|e| ApiError::new(500, "InternalError", e.to_string()))?;
            self.unknown_fields(&report.unknown_fields, &mut new, opts, &mut warnings)?;
            if !report.errors.is_empty() {
                return Err(ApiError::invalid(rt.gr(), &rt.kind, &name, &report.errors));
            }
        }
        let mut causes = admission::validate_metadata(rt, &new);
        match old {
            Some(old) => causes.extend(admission::validate_update(rt, old, &new)),
            None => causes.extend(admission::admin_access(st, rt, &new)),
        }
        if !causes.is_empty() {
            return Err(ApiError::invalid(rt.gr(), &rt.kind, &name, &causes));
        }
        // Generation: incremented when anything but metadata (and status, for kinds with a
        // status subresource) changes.
        if let Some(old) = old {
            let gen_ = old["metadata"]["generation"].as_i64().unwrap_or(0);
            let changed = content(old, rt.status) != content(&new, rt.status);
            new["metadata"]["generation"] = json!(if changed { gen_ + 1 } else { gen_ });
        }
        if subresource.is_none() {
            admission::admit(self, st, rt, old, &new, opts)?;
        }
        // Managed fields.
        let managed = match applied {
            Some(a) => a.managed,
            None => ssa::record_update(
                &self.nav(rt),
                old,
                &new,
                &opts.manager_name(),
                subresource,
                rt.status,
                &now(),
                &rt.api_version(),
            ),
        };
        if !managed.is_empty() {
            new["metadata"]["managedFields"] = Value::Array(managed);
        }
        if let Some(old) = old
            && comparable(old) == comparable(&new)
        {
            // A no-op write is not persisted (no new resourceVersion, no watch event).
            return Ok(Written {
                object: old.clone(),
                created: false,
                warnings,
            });
        }
        let key = Self::key(rt, meta_str(&new, "namespace"), &name);
        if opts.dry_run {
            if let Some(old) = old {
                new["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"].clone();
            }
            return Ok(Written {
                object: new,
                created: old.is_none(),
                warnings,
            });
        }
        // An update that removes the last finalizer of an object whose graceful deletion is over
        // (deletionGracePeriodSeconds 0) deletes it (ShouldDeleteDuringUpdate).
        if old.is_some()
            && new["metadata"].get("deletionTimestamp").is_some()
            && new["metadata"]["deletionGracePeriodSeconds"]
                .as_i64()
                .unwrap_or(0)
                == 0
            && finalizers(&new).is_empty()
        {
            let removed = st.remove(&key).unwrap_or(new);
            self.after_delete(st, rt, &removed, None);
            self.notify(st.rv);
            return Ok(Written {
                object: removed,
                created: false,
                warnings,
            });
        }
        let stored = st.put(key, new);
        self.notify(st.rv);
        Ok(Written {
            object: stored,
            created: old.is_none(),
            warnings,
        })
    }

    fn unknown_fields(
        &self,
        unknown: &[String],
        new: &mut Value,
        opts: &WriteOptions,
        warnings: &mut Vec<String>,
    ) -> Result<(), ApiError> {
        if unknown.is_empty() {
            return Ok(());
        }
        match opts.field_validation {
            FieldValidation::Strict => {
                let list: Vec<String> = unknown
                    .iter()
                    .map(|p| format!("unknown field \"{p}\""))
                    .collect();
                Err(ApiError::bad_request(format!(
                    "strict decoding error: {}",
                    list.join(", ")
                )))
            }
            FieldValidation::Warn => {
                warnings.extend(unknown.iter().map(|p| format!("unknown field \"{p}\"")));
                prune(new, unknown);
                Ok(())
            }
            FieldValidation::Ignore => {
                prune(new, unknown);
                Ok(())
            }
        }
    }

    /// DELETE one object. Returns the deleted object, or the object marked for deletion when
    /// finalizers remain.
    pub fn delete(
        &self,
        rt: &ResourceType,
        ns: &str,
        name: &str,
        opts: &DeleteOptions,
    ) -> Result<Value, ApiError> {
        let mut st = self.lock();
        let r = self.delete_locked(&mut st, rt, ns, name, opts);
        self.notify(st.rv);
        r
    }

    /// DELETE under the store lock (for controllers).
    pub fn delete_locked(
        &self,
        st: &mut Store,
        rt: &ResourceType,
        ns: &str,
        name: &str,
        opts: &DeleteOptions,
    ) -> Result<Value, ApiError> {
        let key = Self::key(rt, ns, name);
        let old = st
            .objects
            .get(&key)
            .cloned()
            .ok_or_else(|| ApiError::not_found(rt.gr(), name))?;
        if let Some(uid) = &opts.uid
            && uid != meta_str(&old, "uid")
        {
            return Err(ApiError::conflict_msg(
                rt.gr(),
                name,
                &format!(
                    "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                    meta_str(&old, "uid")
                ),
            ));
        }
        if let Some(rv) = &opts.resource_version
            && rv != meta_str(&old, "resourceVersion")
        {
            return Err(ApiError::conflict_msg(
                rt.gr(),
                name,
                &format!(
                    "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {}",
                    meta_str(&old, "resourceVersion")
                ),
            ));
        }
        if opts.dry_run {
            return Ok(old);
        }
        // Graceful deletion of a Pod bound to a node (pkg/registry/core/pod/strategy.go
        // CheckGracefulDelete): deletionTimestamp = now + grace period, and the kubelet (the
        // simulated one in `controllers::scheduler::kubelet`) removes it once its containers
        // stopped. Unbound and terminal Pods, and a grace period of 0, delete at once.
        let bound_pod = rt.kind == "Pod"
            && rt.group.is_empty()
            && old.pointer("/spec/nodeName").is_some()
            && !matches!(
                old.pointer("/status/phase").and_then(Value::as_str),
                Some("Succeeded" | "Failed")
            );
        if bound_pod {
            let grace = opts
                .grace_period
                .or_else(|| {
                    old.pointer("/spec/terminationGracePeriodSeconds")
                        .and_then(Value::as_i64)
                })
                .unwrap_or(30)
                .max(0);
            let current = old["metadata"]["deletionGracePeriodSeconds"].as_i64();
            if grace > 0 || !finalizers(&old).is_empty() {
                if current.is_some_and(|c| c <= grace) {
                    return Ok(old);
                }
                let mut marked = old.clone();
                let at = jiff::Timestamp::now()
                    .checked_add(jiff::SignedDuration::from_secs(grace))
                    .unwrap_or_else(|_| jiff::Timestamp::now());
                marked["metadata"]["deletionTimestamp"] =
                    json!(at.strftime("%Y-%m-%dT%H:%M:%SZ").to_string());
                marked["metadata"]["deletionGracePeriodSeconds"] = json!(grace);
                if current.is_none()
                    && let Some(g) = marked["metadata"]["generation"].as_i64()
                {
                    marked["metadata"]["generation"] = json!(g + 1);
                }
                return Ok(st.put(key, marked));
            }
        }
        // Foreground cascading deletion: the owner gets the `foregroundDeletion` finalizer and
        // stays until the garbage collector has deleted its dependents.
        let mut old = old;
        if opts.propagation.as_deref() == Some("Foreground")
            && old["metadata"].get("deletionTimestamp").is_none()
            && !finalizers(&old).iter().any(|f| f == "foregroundDeletion")
        {
            let mut f = finalizers(&old);
            f.push("foregroundDeletion".into());
            old["metadata"]["finalizers"] = json!(f);
        }
        let namespace_finalizers = rt.kind == "Namespace"
            && rt.group.is_empty()
            && old
                .pointer("/spec/finalizers")
                .and_then(Value::as_array)
                .is_some_and(|a| !a.is_empty());
        if !finalizers(&old).is_empty() || namespace_finalizers {
            if old["metadata"].get("deletionTimestamp").is_some() {
                return Ok(old);
            }
            let mut marked = old.clone();
            marked["metadata"]["deletionTimestamp"] = json!(now());
            marked["metadata"]["deletionGracePeriodSeconds"] = json!(0);
            // BeforeDelete increments the generation of a gracefully deleted object.
            if let Some(g) = marked["metadata"]["generation"].as_i64() {
                marked["metadata"]["generation"] = json!(g + 1);
            }
            if rt.kind == "Namespace" && rt.group.is_empty() {
                marked["status"]["phase"] = json!("Terminating");
            }
            if opts.propagation.as_deref() == Some("Orphan") {
                self.orphan_dependents(st, &old);
            }
            return Ok(st.put(key, marked));
        }
        let removed = st.remove(&key).expect("present");
        self.after_delete(st, rt, &removed, opts.propagation.as_deref());
        Ok(removed)
    }

    fn after_delete(
        &self,
        st: &mut Store,
        _rt: &ResourceType,
        removed: &Value,
        propagation: Option<&str>,
    ) {
        if propagation == Some("Orphan") {
            self.orphan_dependents(st, removed);
        }
    }

    /// Removes ownerReferences to `owner` from every object (propagationPolicy=Orphan).
    fn orphan_dependents(&self, st: &mut Store, owner: &Value) {
        let uid = meta_str(owner, "uid").to_string();
        let keys: Vec<ObjKey> = st
            .objects
            .iter()
            .filter(|(_, o)| owner_refs(o).iter().any(|r| r["uid"] == json!(uid)))
            .map(|(k, _)| k.clone())
            .collect();
        for k in keys {
            let mut o = st.objects[&k].clone();
            if let Some(refs) = o["metadata"]["ownerReferences"].as_array_mut() {
                refs.retain(|r| r["uid"] != json!(uid));
                if refs.is_empty() {
                    o["metadata"]
                        .as_object_mut()
                        .expect("object")
                        .remove("ownerReferences");
                }
            }
            st.put(k, o);
        }
    }

    /// DELETE a collection (with selectors).
    pub fn delete_collection(
        &self,
        rt: &ResourceType,
        ns: Option<&str>,
        list: &ListOptions,
        opts: &DeleteOptions,
    ) -> Result<Value, ApiError> {
        let items = self.list(rt, ns, list)?;
        let mut st = self.lock();
        let mut deleted = Vec::new();
        for item in items["items"].as_array().into_iter().flatten() {
            match self.delete_locked(
                &mut st,
                rt,
                meta_str(item, "namespace"),
                meta_str(item, "name"),
                opts,
            ) {
                Ok(o) => deleted.push(o),
                Err(e) if e.code == 404 => {}
                Err(e) => return Err(e),
            }
        }
        self.notify(st.rv);
        Ok(
            json!({"apiVersion": rt.api_version(), "kind": format!("{}List", rt.kind),
            "metadata": {"resourceVersion": st.rv.to_string()}, "items": deleted}),
        )
    }

    /// Writes an object directly (controllers): validation and admission are skipped.
    pub fn put_unchecked(&self, st: &mut Store, rt: &ResourceType, object: Value) -> Value {
        let key = Self::key(
            rt,
            meta_str(&object, "namespace"),
            meta_str(&object, "name"),
        );
        let v = st.put(key, object);
        self.notify(st.rv);
        v
    }

    /// Notifies watchers of the current revision (after direct store writes). Must not be called
    /// with the store locked.
    pub fn put_notify(&self) {
        let rv = self.lock().rv;
        self.notify(rv);
    }

    /// Current revision.
    pub fn revision(&self) -> u64 {
        self.lock().rv
    }
}

fn check_type_meta(rt: &ResourceType, body: &Value) -> Result<(), ApiError> {
    let kind = body.get("kind").and_then(Value::as_str).unwrap_or("");
    let av = body.get("apiVersion").and_then(Value::as_str).unwrap_or("");
    if (!kind.is_empty() && kind != rt.kind) || (!av.is_empty() && av != rt.api_version()) {
        return Err(ApiError::bad_request(format!(
            "the API version in the data ({av}) does not match the expected API version ({})",
            rt.api_version()
        )));
    }
    Ok(())
}

/// The object's finalizers.
pub fn finalizers(obj: &Value) -> Vec<String> {
    obj.pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|f| f.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

/// The object's ownerReferences.
pub fn owner_refs(obj: &Value) -> Vec<Value> {
    obj.pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default()
}

/// Per-kind PrepareForCreate of the API server's registry strategies.
fn prepare_for_create(rt: &ResourceType, obj: &mut Value) {
    match (rt.group.as_str(), rt.kind.as_str()) {
        ("", "Namespace") => {
            let name = meta_str(obj, "name").to_string();
            obj["status"] = json!({"phase": "Active"});
            // The namespace lifecycle finalizer and the immutable name label (Kubernetes 1.21+).
            let fins = obj["spec"]["finalizers"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            if !fins.contains(&json!("kubernetes")) {
                let mut f = fins;
                f.push(json!("kubernetes"));
                obj["spec"]["finalizers"] = Value::Array(f);
            }
            if !obj["metadata"]["labels"].is_object() {
                obj["metadata"]["labels"] = json!({});
            }
            obj["metadata"]["labels"]["kubernetes.io/metadata.name"] = json!(name);
        }
        ("", "Pod") => {
            obj["status"] = json!({"phase": "Pending"});
        }
        _ => {}
    }
}

/// Builds a continue token.
fn encode_continue(rv: u64, ns: &str, name: &str) -> String {
    let raw = json!({"v": "meta.k8s.io/v1", "rv": rv, "start": format!("{ns}/{name}")}).to_string();
    hex(&raw)
}

fn hex(s: &str) -> String {
    s.bytes().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<String> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    let bytes: Option<Vec<u8>> = (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).ok())
        .collect();
    String::from_utf8(bytes?).ok()
}

fn decode_continue(tok: &str) -> Result<(u64, (String, String)), ApiError> {
    let bad = || {
        ApiError::bad_request("continue key is not valid: incorrect encoded start resourceVersion")
    };
    let raw = unhex(tok).ok_or_else(bad)?;
    let v: Value = serde_json::from_str(&raw).map_err(|_| bad())?;
    let rv = v["rv"].as_u64().ok_or_else(bad)?;
    let start = v["start"].as_str().ok_or_else(bad)?;
    let (ns, name) = start.split_once('/').ok_or_else(bad)?;
    Ok((rv, (ns.to_string(), name.to_string())))
}

/// Converts `metadata.labels` etc. helpers for admission plugins.
pub fn object_map(v: &Value) -> Map<String, Value> {
    v.as_object().cloned().unwrap_or_default()
}

/// Counts of objects per resource key, for diagnostics.
pub fn counts(st: &Store) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for k in st.objects.keys() {
        *m.entry(k.0.clone()).or_default() += 1;
    }
    m
}
