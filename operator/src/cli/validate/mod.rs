//! Client-side validation of teamgpu's own objects (`teamgpu plan -f`), as the API server
//! judges them on create, with no cluster: strict field validation (unknown fields, as
//! `kubectl apply` refuses them), the name rules of `metadata.name`, the OpenAPI checks of the
//! CRDs' schema ([`schema`]) and then their CEL rules (`x-kubernetes-validations`, with
//! kube-cel). The schema is the one `teamgpu crd` generates, taken in-process. Pure.

pub mod findings;
pub mod schema;

use std::sync::LazyLock;

use kube_cel::{CompiledSchema, ErrorKind, Validator as CelValidator, compile_schema};
use regex::Regex;
use serde_json::Value;

use schema::{Patterns, join};

/// One thing the API server would refuse, at a field of the object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldError {
    /// `spec.quotas[0]`; empty for a rule on the whole object.
    pub path: String,
    pub message: String,
}

impl FieldError {
    pub fn new(path: &str, message: impl Into<String>) -> FieldError {
        FieldError {
            path: path.to_owned(),
            message: message.into(),
        }
    }

    /// `Invalid value: VALUE: DETAIL`, as the API server words it.
    fn invalid(path: &str, value: String, detail: String) -> FieldError {
        FieldError::new(path, format!("Invalid value: {value}: {detail}"))
    }

    fn unknown(path: &str) -> FieldError {
        FieldError::new(path, "unknown field")
    }
}

impl std::fmt::Display for FieldError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.path.is_empty() {
            write!(f, "{}", self.message)
        } else {
            write!(f, "{}: {}", self.path, self.message)
        }
    }
}

/// The fields of `metadata` (ObjectMeta) the API server knows.
const OBJECT_META_FIELDS: [&str; 15] = [
    "annotations",
    "creationTimestamp",
    "deletionGracePeriodSeconds",
    "deletionTimestamp",
    "finalizers",
    "generateName",
    "generation",
    "labels",
    "managedFields",
    "name",
    "namespace",
    "ownerReferences",
    "resourceVersion",
    "selfLink",
    "uid",
];

/// One served kind: its schema as JSON, its patterns and its compiled CEL rules.
struct Kind {
    api_version: String,
    kind: String,
    schema: Value,
    patterns: Patterns,
    rules: CompiledSchema,
}

impl std::fmt::Debug for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.api_version, self.kind)
    }
}

/// The checks of every CRD teamgpu serves; build it once, its CEL rules are compiled.
#[derive(Debug)]
pub struct Validator {
    kinds: Vec<Kind>,
    cel: CelValidator,
}

/// A DNS-1123 subdomain, what the API server requires of a custom resource's name.
static DNS_SUBDOMAIN: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
        .expect("the DNS-1123 subdomain pattern compiles")
});
const DNS_SUBDOMAIN_MESSAGE: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";

/// What the API server adds when an object fails the OpenAPI checks: its CEL rules are not run.
const RULES_NOT_CHECKED: &str = "some validation rules were not checked because the object was invalid; correct the existing errors to complete validation";

impl Default for Validator {
    fn default() -> Self {
        Validator::new()
    }
}

impl Validator {
    /// The checks of the CRDs of [`crate::cli::crd::all`].
    pub fn new() -> Validator {
        let kinds = crate::cli::crd::all()
            .into_iter()
            .flat_map(|(_, crd)| {
                let group = crd.spec.group.clone();
                let kind = crd.spec.names.kind.clone();
                crd.spec.versions.into_iter().filter_map(move |v| {
                    let schema = serde_json::to_value(v.schema?.open_api_v3_schema?).ok()?;
                    Some(Kind {
                        api_version: format!("{group}/{}", v.name),
                        kind: kind.clone(),
                        patterns: Patterns::of(&schema),
                        rules: compile_schema(&schema),
                        schema,
                    })
                })
            })
            .collect();
        Validator {
            kinds,
            cel: CelValidator::new(),
        }
    }

    /// Whether `apiVersion`/`kind` is one of teamgpu's CRDs, which [`Self::check`] judges.
    pub fn governs(&self, api_version: &str, kind: &str) -> bool {
        self.kind(api_version, kind).is_some()
    }

    fn kind(&self, api_version: &str, kind: &str) -> Option<&Kind> {
        self.kinds
            .iter()
            .find(|k| k.api_version == api_version && k.kind == kind)
    }

    /// Every reason the API server would refuse to create `object`; empty when it would
    /// accept it (or it is not one of teamgpu's kinds). The CEL rules run only on an object
    /// that passes the OpenAPI checks, as on the API server.
    pub fn check(&self, object: &Value) -> Vec<FieldError> {
        let text = |key: &str| object.get(key).and_then(Value::as_str).unwrap_or_default();
        let Some(kind) = self.kind(text("apiVersion"), text("kind")) else {
            return Vec::new();
        };
        let mut errors = Vec::new();
        strict_fields(kind, object, &mut errors);
        let before = errors.len();
        metadata_name(object, &mut errors);
        let mut body = object.clone();
        if let Some(fields) = body.as_object_mut() {
            // The API server drops a status sent on create (it is a subresource), and checks
            // the object after dropping `null`s, like absent fields.
            fields.remove("status");
            fields.remove("metadata");
        }
        drop_nulls(&mut body);
        schema::check(&kind.schema, &body, "", &kind.patterns, &mut errors);
        if errors.len() > before {
            errors.push(FieldError::new("", RULES_NOT_CHECKED));
            return errors;
        }
        if let Some(metadata) = object.get("metadata") {
            body["metadata"] = metadata.clone();
        }
        if let Err(failures) = self.cel.validate_compiled(&kind.rules, &body, None) {
            errors.extend(failures.iter().map(|e| {
                if e.kind == ErrorKind::ValidationFailure {
                    FieldError::new(&e.field_path, format!("Invalid value: {}", e.message))
                } else {
                    FieldError::new(
                        &e.field_path,
                        format!("rule `{}` could not be evaluated: {}", e.rule, e.message),
                    )
                }
            }));
        }
        errors
    }
}

/// Unknown fields anywhere, `metadata` (ObjectMeta) and `status` included.
fn strict_fields(kind: &Kind, object: &Value, errors: &mut Vec<FieldError>) {
    let Some(fields) = object.as_object() else {
        return;
    };
    let properties = kind.schema.get("properties").and_then(Value::as_object);
    for (name, child) in fields {
        match name.as_str() {
            "apiVersion" | "kind" => {}
            "metadata" => {
                for field in child.as_object().into_iter().flat_map(|m| m.keys()) {
                    if !OBJECT_META_FIELDS.contains(&field.as_str()) {
                        errors.push(FieldError::unknown(&join("metadata", field)));
                    }
                }
            }
            _ => match properties.and_then(|p| p.get(name)) {
                Some(s) => schema::unknown_fields(s, child, name, errors),
                None => errors.push(FieldError::unknown(name)),
            },
        }
    }
}

/// `metadata.name`: present, a DNS-1123 subdomain, at most 253 characters.
fn metadata_name(object: &Value, errors: &mut Vec<FieldError>) {
    let path = "metadata.name";
    match object.pointer("/metadata/name") {
        None | Some(Value::Null) => errors.push(FieldError::new(
            path,
            "Required value: name or generateName is required",
        )),
        Some(Value::String(name)) => {
            if name.len() > 253 {
                errors.push(FieldError::invalid(
                    path,
                    Value::from(name.as_str()).to_string(),
                    "must be no more than 253 characters".into(),
                ));
            } else if !DNS_SUBDOMAIN.is_match(name) {
                errors.push(FieldError::invalid(
                    path,
                    Value::from(name.as_str()).to_string(),
                    DNS_SUBDOMAIN_MESSAGE.into(),
                ));
            }
        }
        Some(other) => errors.push(FieldError::new(
            path,
            format!("invalid type: {other}, expected a string"),
        )),
    }
}

/// `null` object fields removed, at every depth.
fn drop_nulls(value: &mut Value) {
    match value {
        Value::Object(fields) => {
            fields.retain(|_, v| !v.is_null());
            fields.values_mut().for_each(drop_nulls);
        }
        Value::Array(items) => items.iter_mut().for_each(drop_nulls),
        _ => {}
    }
}
