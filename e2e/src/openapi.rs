//! Validation of objects against OpenAPI v3 schemas.
//!
//! Two kinds of schema are supported:
//!
//! * **Built-in kinds**: the component schemas of the OpenAPI v3 documents a real Kubernetes 1.36
//!   API server serves (`shared/fixtures/upstream/kubernetes/openapi-v1.36/*.json`). A kind's
//!   schema is found through its `x-kubernetes-group-version-kind` extension.
//! * **CRDs**: a version's `openAPIV3Schema`, which Kubernetes requires to be a *structural
//!   schema* (no `$ref`; `x-kubernetes-preserve-unknown-fields` where unknown fields are allowed).
//!
//! Supported keywords: `$ref` (to `#/components/schemas/...`), `allOf`, `oneOf`/`anyOf` (the value
//! must match at least one branch), `type` (`nullable`), `properties`, `required`, `items`,
//! `additionalProperties`, `enum`, `format` (`int32`, `int64`, `date-time`, `byte`,
//! `int-or-string`), `x-kubernetes-int-or-string`, `x-kubernetes-preserve-unknown-fields`,
//! `x-kubernetes-embedded-resource`, `x-kubernetes-list-type` (`set`/`map` uniqueness with
//! `x-kubernetes-list-map-keys`), and the CRD value constraints `pattern`, `minLength`,
//! `maxLength`, `minItems`, `maxItems`, `minProperties`, `maxProperties`, `minimum`, `maximum`,
//! `exclusiveMinimum`, `exclusiveMaximum`, `multipleOf`. Quantities
//! (`io.k8s.apimachinery.pkg.api.resource.Quantity`) are strings in Kubernetes' quantity syntax or
//! JSON numbers. CEL rules (`x-kubernetes-validations`) are *not* evaluated here; the API stand-in
//! evaluates them with `kube_cel::Validator`.
//!
//! **Unknown fields.** The API server's default field validation (`fieldValidation=Warn` for a
//! request without the parameter, since Kubernetes 1.27) drops unknown fields and returns a
//! warning; `fieldValidation=Strict` (kubectl's default) rejects them. Every object teamgpu
//! generates must pass Strict, so [`Schemas::validate`] reports unknown fields as errors
//! (`unknown field "spec.foo"`, the API server's strict-decoding wording). [`Schemas::check`]
//! reports them separately so that a caller can implement Warn/Ignore by pruning them.
//!
//! **Free-form objects.** In a built-in schema, an `object` with neither `properties` nor
//! `additionalProperties` (`RawExtension`, `FieldsV1`) accepts anything; in a structural schema it
//! accepts nothing unless `x-kubernetes-preserve-unknown-fields` is set. `null` is accepted for any
//! field of a built-in kind (Go's decoder reads it as the zero value) but only for `nullable`
//! fields of a CRD.
//!
//! **Stricter than Kubernetes.** `enum` lists of built-in schemas are enforced (Kubernetes enforces
//! most of them in hand-written validation, a few not at all).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use regex::Regex;
use serde_json::Value;

/// Errors while loading schema documents.
#[derive(Debug, thiserror::Error)]
pub enum OpenApiError {
    /// A schema document could not be read.
    #[error("reading {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// A schema document is not valid JSON.
    #[error("parsing {path}: {source}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: serde_json::Error,
    },
    /// A schema document has no `components.schemas`.
    #[error("{0} has no components.schemas")]
    NoComponents(PathBuf),
    /// Loading the upstream documents failed earlier in this process.
    #[error("loading the upstream OpenAPI documents failed: {0}")]
    Upstream(String),
    /// No schema declares this group-version-kind.
    #[error("no schema for {api_version} {kind}")]
    UnknownKind {
        /// `apiVersion` of the object.
        api_version: String,
        /// `kind` of the object.
        kind: String,
    },
}

/// Directory of the upstream Kubernetes 1.36 OpenAPI v3 documents.
pub fn upstream_dir() -> PathBuf {
    Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../shared/fixtures/upstream/kubernetes/openapi-v1.36"
    ))
    .to_path_buf()
}

/// The result of checking one object: schema violations and unknown fields, each a message that
/// starts with or names the field path.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Report {
    /// Violations of the schema (`spec.count: Invalid value: ...`, `spec.name: Required value`).
    pub errors: Vec<String>,
    /// Paths of fields the schema does not know (`spec.foo`, `metadata.labelz`).
    pub unknown_fields: Vec<String>,
}

impl Report {
    /// True when there are neither errors nor unknown fields.
    pub fn is_clean(&self) -> bool {
        self.errors.is_empty() && self.unknown_fields.is_empty()
    }

    /// Errors plus unknown fields in the API server's strict-decoding wording.
    pub fn into_strict(self) -> Vec<String> {
        let mut all = self.errors;
        all.extend(
            self.unknown_fields
                .into_iter()
                .map(|p| format!("unknown field \"{p}\"")),
        );
        all
    }
}

/// Component schemas of a set of OpenAPI v3 documents, indexed by group-version-kind.
#[derive(Debug)]
pub struct Schemas {
    components: HashMap<String, Value>,
    /// (apiVersion, kind) -> component name.
    by_gvk: HashMap<(String, String), String>,
}

const QUANTITY: &str = "io.k8s.apimachinery.pkg.api.resource.Quantity";
const OBJECT_META: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta";

fn quantity_regex() -> &'static Regex {
    static RE: OnceLock<Regex> = OnceLock::new();
    RE.get_or_init(|| {
        // k8s.io/apimachinery/pkg/api/resource/quantity.go, the grammar in Quantity's doc comment.
        Regex::new(r"^[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+|Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E)?$")
            .expect("static regex")
    })
}

/// Whether `s` is a well-formed Kubernetes quantity string.
pub fn is_quantity(s: &str) -> bool {
    quantity_regex().is_match(s)
}

impl Schemas {
    /// The upstream Kubernetes 1.36 documents, loaded once per process.
    pub fn upstream() -> Result<&'static Schemas, OpenApiError> {
        static UPSTREAM: OnceLock<Result<Schemas, String>> = OnceLock::new();
        UPSTREAM
            .get_or_init(|| Schemas::load_dir(&upstream_dir()).map_err(|e| e.to_string()))
            .as_ref()
            .map_err(|e| OpenApiError::Upstream(e.clone()))
    }

    /// Loads every `*.json` OpenAPI v3 document of `dir`.
    pub fn load_dir(dir: &Path) -> Result<Schemas, OpenApiError> {
        let read_err = |source| OpenApiError::Read {
            path: dir.to_path_buf(),
            source,
        };
        let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
            .map_err(read_err)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "json"))
            .collect();
        files.sort();
        let mut docs = Vec::new();
        for path in files {
            let text = std::fs::read(&path).map_err(|source| OpenApiError::Read {
                path: path.clone(),
                source,
            })?;
            // Only `components.schemas` is kept, without documentation strings: skipping `paths`
            // and descriptions without building values makes loading several times faster.
            #[derive(serde::Deserialize)]
            struct Doc {
                #[serde(default)]
                components: Option<Components>,
            }
            #[derive(serde::Deserialize)]
            struct Components {
                #[serde(default)]
                schemas: Option<BTreeMap<String, NoDocs>>,
            }
            let doc: Doc = serde_json::from_slice(&text).map_err(|source| OpenApiError::Parse {
                path: path.clone(),
                source,
            })?;
            let doc = match doc.components.and_then(|c| c.schemas) {
                Some(m) => {
                    let schemas: serde_json::Map<String, Value> =
                        m.into_iter().map(|(k, v)| (k, v.0)).collect();
                    serde_json::json!({"components": {"schemas": schemas}})
                }
                None => Value::Null,
            };
            docs.push((path, doc));
        }
        Schemas::from_documents(docs)
    }

    /// Builds the index from parsed documents (path only used in errors).
    pub fn from_documents(
        docs: impl IntoIterator<Item = (PathBuf, Value)>,
    ) -> Result<Schemas, OpenApiError> {
        let mut components = HashMap::new();
        let mut by_gvk = HashMap::new();
        for (path, mut doc) in docs {
            let Some(Value::Object(schemas)) =
                doc.pointer_mut("/components/schemas").map(Value::take)
            else {
                return Err(OpenApiError::NoComponents(path));
            };
            for (name, schema) in schemas {
                if let Some(Value::Array(gvks)) = schema.get("x-kubernetes-group-version-kind") {
                    // Shared types (DeleteOptions, WatchEvent) list many GVKs; a kind's own schema
                    // lists exactly one, and wins.
                    let own = gvks.len() == 1;
                    for gvk in gvks {
                        let group = gvk.get("group").and_then(Value::as_str).unwrap_or("");
                        let version = gvk.get("version").and_then(Value::as_str).unwrap_or("");
                        let kind = gvk.get("kind").and_then(Value::as_str).unwrap_or("");
                        let api_version = if group.is_empty() {
                            version.to_string()
                        } else {
                            format!("{group}/{version}")
                        };
                        let key = (api_version, kind.to_string());
                        if own {
                            by_gvk.insert(key, name.clone());
                        } else {
                            by_gvk.entry(key).or_insert_with(|| name.clone());
                        }
                    }
                }
                components.entry(name).or_insert(schema);
            }
        }
        Ok(Schemas { components, by_gvk })
    }

    /// The component schema of a kind, if any document declares it.
    pub fn schema_for(&self, api_version: &str, kind: &str) -> Option<&Value> {
        self.by_gvk
            .get(&(api_version.to_string(), kind.to_string()))
            .and_then(|n| self.components.get(n))
    }

    /// A component schema by name (`io.k8s.api.core.v1.Pod`).
    pub fn component(&self, name: &str) -> Option<&Value> {
        self.components.get(name)
    }

    /// Validates a built-in object; unknown fields are errors (strict field validation).
    pub fn validate(
        &self,
        api_version: &str,
        kind: &str,
        object: &Value,
    ) -> Result<(), Vec<String>> {
        match self.check(api_version, kind, object) {
            Ok(report) if report.is_clean() => Ok(()),
            Ok(report) => Err(report.into_strict()),
            Err(e) => Err(vec![e.to_string()]),
        }
    }

    /// Checks a built-in object, reporting errors and unknown fields separately.
    pub fn check(
        &self,
        api_version: &str,
        kind: &str,
        object: &Value,
    ) -> Result<Report, OpenApiError> {
        let schema =
            self.schema_for(api_version, kind)
                .ok_or_else(|| OpenApiError::UnknownKind {
                    api_version: api_version.to_string(),
                    kind: kind.to_string(),
                })?;
        let mut walk = Walk {
            schemas: self,
            structural: false,
            report: Report::default(),
        };
        walk.node(schema, object, &mut String::new());
        Ok(walk.report)
    }

    /// Validates an object against a CRD version's structural `openAPIV3Schema`; unknown fields
    /// are errors. At the root, `apiVersion` and `kind` must be strings and `metadata` is
    /// validated as an upstream `ObjectMeta`, as the API server does for every custom resource.
    pub fn validate_structural(&self, schema: &Value, object: &Value) -> Result<(), Vec<String>> {
        let report = self.check_structural(schema, object);
        if report.is_clean() {
            Ok(())
        } else {
            Err(report.into_strict())
        }
    }

    /// Like [`Schemas::validate_structural`] with errors and unknown fields reported separately.
    pub fn check_structural(&self, schema: &Value, object: &Value) -> Report {
        let mut walk = Walk {
            schemas: self,
            structural: true,
            report: Report::default(),
        };
        walk.root_resource(schema, object, &mut String::new());
        walk.report
    }
}

/// A JSON value read without `description` members (half of the documents' size; never needed
/// for validation), which keeps loading the upstream documents fast.
struct NoDocs(Value);

impl<'de> serde::Deserialize<'de> for NoDocs {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(NoDocsVisitor).map(NoDocs)
    }
}

struct NoDocsVisitor;

impl<'de> serde::de::Visitor<'de> for NoDocsVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("JSON")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_string()))
    }
    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut out = Vec::new();
        while let Some(NoDocs(v)) = seq.next_element()? {
            out.push(v);
        }
        Ok(Value::Array(out))
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = serde_json::Map::new();
        while let Some(k) = map.next_key::<String>()? {
            if k == "description" {
                // A documentation string is dropped; a property named "description" is kept.
                if let Some(NoDocs(v)) = map.next_value::<SkipString>()?.0 {
                    out.insert(k, v);
                }
            } else {
                let NoDocs(v) = map.next_value()?;
                out.insert(k, v);
            }
        }
        Ok(Value::Object(out))
    }
}

/// A value that is dropped, without copying, when it is a string.
struct SkipString(Option<NoDocs>);

impl<'de> serde::Deserialize<'de> for SkipString {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = SkipString;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("JSON")
            }
            fn visit_str<E>(self, _: &str) -> Result<SkipString, E> {
                Ok(SkipString(None))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                map: A,
            ) -> Result<SkipString, A::Error> {
                NoDocsVisitor
                    .visit_map(map)
                    .map(|v| SkipString(Some(NoDocs(v))))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                seq: A,
            ) -> Result<SkipString, A::Error> {
                NoDocsVisitor
                    .visit_seq(seq)
                    .map(|v| SkipString(Some(NoDocs(v))))
            }
            fn visit_bool<E>(self, v: bool) -> Result<SkipString, E> {
                Ok(SkipString(Some(NoDocs(Value::Bool(v)))))
            }
            fn visit_unit<E>(self) -> Result<SkipString, E> {
                Ok(SkipString(None))
            }
        }
        d.deserialize_any(V)
    }
}

/// Removes the fields at `paths` (as reported in [`Report::unknown_fields`]) from `object`, which
/// is what the API server's decoder does with unknown fields unless `fieldValidation=Strict`.
pub fn prune(object: &mut Value, paths: &[String]) {
    for path in paths {
        let segments = parse_path(path);
        remove_at(object, &segments);
    }
}

enum Seg {
    Field(String),
    Index(usize),
}

fn parse_path(path: &str) -> Vec<Seg> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut chars = path.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '.' => {
                if !cur.is_empty() {
                    out.push(Seg::Field(std::mem::take(&mut cur)));
                }
            }
            '[' => {
                if !cur.is_empty() {
                    out.push(Seg::Field(std::mem::take(&mut cur)));
                }
                let mut inner = String::new();
                for c in chars.by_ref() {
                    if c == ']' {
                        break;
                    }
                    inner.push(c);
                }
                match inner.parse::<usize>() {
                    Ok(i) => out.push(Seg::Index(i)),
                    Err(_) => out.push(Seg::Field(inner)),
                }
            }
            c => cur.push(c),
        }
    }
    if !cur.is_empty() {
        out.push(Seg::Field(cur));
    }
    out
}

fn remove_at(value: &mut Value, segs: &[Seg]) {
    match (segs, value) {
        ([Seg::Field(f)], Value::Object(map)) => {
            map.remove(f);
        }
        ([Seg::Field(f), rest @ ..], Value::Object(map)) => {
            if let Some(v) = map.get_mut(f) {
                remove_at(v, rest);
            }
        }
        ([Seg::Index(i), rest @ ..], Value::Array(items)) if !rest.is_empty() => {
            if let Some(v) = items.get_mut(*i) {
                remove_at(v, rest);
            }
        }
        _ => {}
    }
}

struct Walk<'a> {
    schemas: &'a Schemas,
    structural: bool,
    report: Report,
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn short(v: &Value) -> String {
    crate::status::truncate(&v.to_string(), 80)
}

fn push_field(path: &str, field: &str) -> String {
    if path.is_empty() {
        field.to_string()
    } else {
        format!("{path}.{field}")
    }
}

fn display(path: &str) -> &str {
    if path.is_empty() { "<root>" } else { path }
}

impl Walk<'_> {
    fn err(&mut self, path: &str, msg: String) {
        self.report.errors.push(format!("{}: {msg}", display(path)));
    }

    fn invalid(&mut self, path: &str, value: &Value, detail: &str) {
        self.err(path, format!("Invalid value: {}: {detail}", short(value)));
    }

    fn resolve<'s>(schemas: &'s Schemas, schema: &'s Value) -> (&'s Value, Option<&'s str>) {
        let mut schema = schema;
        let mut name = None;
        for _ in 0..16 {
            match schema.get("$ref").and_then(Value::as_str) {
                Some(r) => {
                    let n = r.trim_start_matches("#/components/schemas/");
                    match schemas.components.get(n) {
                        Some(s) => {
                            name = Some(n);
                            schema = s;
                        }
                        None => return (schema, name),
                    }
                }
                None => break,
            }
        }
        (schema, name)
    }

    /// The root of a custom resource (or an embedded resource): apiVersion, kind and metadata are
    /// implicit properties.
    fn root_resource(&mut self, schema: &Value, value: &Value, path: &mut String) {
        if let Value::Object(map) = value {
            for f in ["apiVersion", "kind"] {
                if let Some(v) = map.get(f)
                    && !v.is_string()
                {
                    let p = push_field(path, f);
                    self.invalid(
                        &p,
                        v,
                        &format!("{p} in body must be of type string: \"{}\"", type_name(v)),
                    );
                }
            }
            if let Some(meta) = map.get("metadata")
                && let Some(meta_schema) = self.schemas.components.get(OBJECT_META)
            {
                let was = std::mem::replace(&mut self.structural, false);
                let mut p = push_field(path, "metadata");
                self.node(meta_schema, meta, &mut p);
                self.structural = was;
            }
        }
        self.node_with(schema, value, path, &["apiVersion", "kind", "metadata"]);
    }

    fn node(&mut self, schema: &Value, value: &Value, path: &mut String) {
        self.node_with(schema, value, path, &[]);
    }

    fn node_with(&mut self, schema: &Value, value: &Value, path: &mut String, implicit: &[&str]) {
        let schemas = self.schemas;
        let (schema, name) = Self::resolve(schemas, schema);
        if name == Some(QUANTITY) {
            match value {
                Value::String(s) if is_quantity(s) => {}
                Value::Number(_) | Value::Null => {}
                _ => self.invalid(
                    path,
                    value,
                    "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'",
                ),
            }
            return;
        }
        if value.is_null() {
            let nullable = schema.get("nullable").and_then(Value::as_bool) == Some(true);
            if !self.structural || nullable {
                return;
            }
        }
        if let Some(Value::Array(all)) = schema.get("allOf") {
            for sub in all {
                self.node_with(sub, value, path, implicit);
            }
        }
        for key in ["oneOf", "anyOf"] {
            if let Some(Value::Array(alts)) = schema.get(key) {
                let ok = alts.iter().any(|alt| {
                    let mut w = Walk {
                        schemas: self.schemas,
                        structural: self.structural,
                        report: Report::default(),
                    };
                    w.node(alt, value, &mut path.clone());
                    w.report.errors.is_empty()
                });
                if !ok {
                    self.invalid(
                        path,
                        value,
                        &format!("{} must validate {key}", display(path)),
                    );
                }
            }
        }
        let int_or_string = schema
            .get("x-kubernetes-int-or-string")
            .and_then(Value::as_bool)
            == Some(true)
            || schema.get("format").and_then(Value::as_str) == Some("int-or-string");
        if int_or_string {
            if !matches!(type_name(value), "integer" | "string") {
                self.invalid(
                    path,
                    value,
                    &format!(
                        "{} in body must be of type integer or string",
                        display(path)
                    ),
                );
                return;
            }
            self.scalar_constraints(schema, value, path);
            return;
        }
        if let Some(ty) = schema.get("type").and_then(Value::as_str) {
            let actual = type_name(value);
            let ok = actual == ty || (ty == "number" && actual == "integer");
            if !ok {
                self.invalid(
                    path,
                    value,
                    &format!(
                        "{} in body must be of type {ty}: \"{actual}\"",
                        display(path)
                    ),
                );
                return;
            }
        }
        if let Some(Value::Array(allowed)) = schema.get("enum")
            && !allowed.contains(value)
        {
            let list: Vec<String> = allowed.iter().map(short).collect();
            self.err(
                path,
                format!(
                    "Unsupported value: {}: supported values: {}",
                    short(value),
                    list.join(", ")
                ),
            );
        }
        match value {
            Value::Object(map) => self.object(schema, map, path, implicit),
            Value::Array(items) => self.array(schema, items, path),
            _ => self.scalar_constraints(schema, value, path),
        }
    }

    fn scalar_constraints(&mut self, schema: &Value, value: &Value, path: &str) {
        let format = schema.get("format").and_then(Value::as_str);
        match value {
            Value::Number(n) => {
                if format == Some("int32")
                    && let Some(i) = n.as_i64()
                    && i32::try_from(i).is_err()
                {
                    self.invalid(path, value, "must fit in a 32-bit integer");
                }
                if format == Some("int32") && n.as_u64().is_some_and(|u| u > i32::MAX as u64) {
                    self.invalid(path, value, "must fit in a 32-bit integer");
                }
                if format == Some("int64") && n.is_u64() && !n.is_i64() {
                    self.invalid(path, value, "must fit in a 64-bit integer");
                }
                let x = n.as_f64().unwrap_or(0.0);
                let excl_min =
                    schema.get("exclusiveMinimum").and_then(Value::as_bool) == Some(true);
                let excl_max =
                    schema.get("exclusiveMaximum").and_then(Value::as_bool) == Some(true);
                if let Some(min) = schema.get("minimum").and_then(Value::as_f64)
                    && (x < min || (excl_min && x == min))
                {
                    let rel = if excl_min {
                        "greater than"
                    } else {
                        "greater than or equal to"
                    };
                    self.invalid(
                        path,
                        value,
                        &format!("{path} in body should be {rel} {min}"),
                    );
                }
                if let Some(max) = schema.get("maximum").and_then(Value::as_f64)
                    && (x > max || (excl_max && x == max))
                {
                    let rel = if excl_max {
                        "less than"
                    } else {
                        "less than or equal to"
                    };
                    self.invalid(
                        path,
                        value,
                        &format!("{path} in body should be {rel} {max}"),
                    );
                }
                if let Some(m) = schema.get("multipleOf").and_then(Value::as_f64)
                    && m > 0.0
                    && (x / m).fract() != 0.0
                {
                    self.invalid(
                        path,
                        value,
                        &format!("{path} in body should be a multiple of {m}"),
                    );
                }
            }
            Value::String(s) => {
                match format {
                    Some("date-time") if s.parse::<jiff::Timestamp>().is_err() => {
                        self.invalid(
                            path,
                            value,
                            &format!("{path} in body must be of type date-time"),
                        );
                    }
                    Some("byte") if !is_base64(s) => {
                        self.invalid(path, value, &format!("{path} in body must be of type byte"));
                    }
                    _ => {}
                }
                let len = s.chars().count() as u64;
                if let Some(max) = schema.get("maxLength").and_then(Value::as_u64)
                    && len > max
                {
                    self.err(path, format!("Too long: may not be more than {max} bytes"));
                }
                if let Some(min) = schema.get("minLength").and_then(Value::as_u64)
                    && len < min
                {
                    self.invalid(
                        path,
                        value,
                        &format!("{path} in body should be at least {min} chars long"),
                    );
                }
                if let Some(p) = schema.get("pattern").and_then(Value::as_str) {
                    match Regex::new(p) {
                        Ok(re) if !re.is_match(s) => {
                            self.invalid(
                                path,
                                value,
                                &format!("{path} in body should match '{p}'"),
                            );
                        }
                        Ok(_) => {}
                        Err(e) => self.err(path, format!("Invalid pattern {p:?} in schema: {e}")),
                    }
                }
            }
            _ => {}
        }
    }

    fn object(
        &mut self,
        schema: &Value,
        map: &serde_json::Map<String, Value>,
        path: &mut String,
        implicit: &[&str],
    ) {
        let props = schema.get("properties").and_then(Value::as_object);
        let additional = schema.get("additionalProperties");
        let preserve = schema
            .get("x-kubernetes-preserve-unknown-fields")
            .and_then(Value::as_bool)
            == Some(true);
        let embedded = schema
            .get("x-kubernetes-embedded-resource")
            .and_then(Value::as_bool)
            == Some(true);
        if embedded && path_is_nested(path) {
            // An embedded resource gets the implicit apiVersion/kind/metadata of a root resource.
            let mut p = path.clone();
            let mut inner = schema.clone();
            if let Some(o) = inner.as_object_mut() {
                o.remove("x-kubernetes-embedded-resource");
            }
            self.root_resource(&inner, &Value::Object(map.clone()), &mut p);
            return;
        }
        if let Some(Value::Array(required)) = schema.get("required") {
            for r in required.iter().filter_map(Value::as_str) {
                if !map.contains_key(r) {
                    self.err(&push_field(path, r), "Required value".to_string());
                }
            }
        }
        let n = map.len() as u64;
        if let Some(max) = schema.get("maxProperties").and_then(Value::as_u64)
            && n > max
        {
            self.err(
                path,
                format!("Too many: {n}: must have at most {max} items"),
            );
        }
        if let Some(min) = schema.get("minProperties").and_then(Value::as_u64)
            && n < min
        {
            self.err(
                path,
                format!("Invalid value: {n}: should have at least {min} properties"),
            );
        }
        let free_form = props.is_none() && additional.is_none() && !self.structural;
        for (key, v) in map {
            if implicit.contains(&key.as_str()) {
                // apiVersion/kind/metadata of a resource root: checked by `root_resource`.
                continue;
            }
            let child = match props.and_then(|p| p.get(key)) {
                Some(s) => Some(s),
                None => match additional {
                    Some(Value::Object(_)) => additional,
                    Some(Value::Bool(true)) => None,
                    _ => {
                        if !(free_form || preserve || implicit.contains(&key.as_str())) {
                            self.report.unknown_fields.push(push_field(path, key));
                        }
                        None
                    }
                },
            };
            if let Some(child) = child {
                let is_map_entry = props.and_then(|p| p.get(key)).is_none();
                let saved = path.len();
                if is_map_entry {
                    path.push_str(&format!("[{key}]"));
                } else {
                    if !path.is_empty() {
                        path.push('.');
                    }
                    path.push_str(key);
                }
                self.node(child, v, path);
                path.truncate(saved);
            }
        }
    }

    fn array(&mut self, schema: &Value, items: &[Value], path: &mut String) {
        let n = items.len() as u64;
        if let Some(max) = schema.get("maxItems").and_then(Value::as_u64)
            && n > max
        {
            self.err(
                path,
                format!("Too many: {n}: must have at most {max} items"),
            );
        }
        if let Some(min) = schema.get("minItems").and_then(Value::as_u64)
            && n < min
        {
            self.invalid(
                path,
                &Value::from(n),
                &format!("{path} in body should have at least {min} items"),
            );
        }
        match schema.get("x-kubernetes-list-type").and_then(Value::as_str) {
            Some("set") => {
                let mut seen = HashSet::new();
                for (i, v) in items.iter().enumerate() {
                    if !seen.insert(v.to_string()) {
                        self.err(
                            &format!("{path}[{i}]"),
                            format!("Duplicate value: {}", short(v)),
                        );
                    }
                }
            }
            Some("map") => {
                let keys: Vec<&str> = schema
                    .get("x-kubernetes-list-map-keys")
                    .and_then(Value::as_array)
                    .map(|k| k.iter().filter_map(Value::as_str).collect())
                    .unwrap_or_default();
                let mut seen = HashSet::new();
                for (i, v) in items.iter().enumerate() {
                    let key: BTreeMap<&str, &Value> = keys
                        .iter()
                        .filter_map(|k| v.get(*k).map(|x| (*k, x)))
                        .collect();
                    let key = serde_json::to_string(&key).unwrap_or_default();
                    if !seen.insert(key.clone()) {
                        self.err(&format!("{path}[{i}]"), format!("Duplicate value: {key}"));
                    }
                }
            }
            _ => {}
        }
        if let Some(item_schema) = schema.get("items") {
            for (i, v) in items.iter().enumerate() {
                let saved = path.len();
                path.push_str(&format!("[{i}]"));
                self.node(item_schema, v, path);
                path.truncate(saved);
            }
        }
    }
}

fn path_is_nested(path: &str) -> bool {
    !path.is_empty()
}

fn is_base64(s: &str) -> bool {
    let s = s.trim_end_matches('=');
    s.bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'+' || b == b'/')
}
