//! Reading cluster state from YAML and JSON files (`teamgpu plan -f`): teamgpu's own objects
//! judged as the API server would ([`crate::cli::validate`]), the other kinds read with the field
//! path of any type error. Every error of every file is collected; an invalid object is left
//! out of the state.

mod files;
mod parse;

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::de::DeserializeOwned;
use serde_json::Value;

pub use files::{Files, files};
pub use parse::{Limits, MAX_YAML_NODES_ENV, documents};

use crate::api::{GpuSharingPolicy, TeamGpuPolicy};
use crate::cli::validate::{FieldError, Validator};
use crate::core::state::{ClusterState, NamespaceInfo};

#[derive(Debug, thiserror::Error)]
pub enum InputError {
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: not valid YAML: {message}")]
    Yaml { path: PathBuf, message: String },
    #[error("{path}: not valid JSON: {message}")]
    Json { path: PathBuf, message: String },
    #[error("{path}: too large: {what}")]
    TooLarge { path: PathBuf, what: String },
    /// An object the API server would refuse (or that does not fit its type): one line per
    /// error, each naming where the object is, the object and the field.
    #[error("{}", lines(at, object, errors))]
    Invalid {
        at: Origin,
        object: String,
        errors: Vec<FieldError>,
    },
}

fn lines(at: &Origin, object: &str, errors: &[FieldError]) -> String {
    let lines: Vec<String> = errors
        .iter()
        .map(|e| format!("{at}: {object}: {e}"))
        .collect();
    lines.join("\n")
}

/// Where an object is: its file, its document in the file, its item in a `List`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Origin {
    pub path: PathBuf,
    pub document: usize,
    pub item: Option<usize>,
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}, document {}", self.path.display(), self.document)?;
        if let Some(item) = self.item {
            write!(f, ", item {item}")?;
        }
        Ok(())
    }
}

/// What reading the inputs produced: the state of the objects that are valid, notes about
/// what was skipped or replaced, and every error.
#[derive(Debug, Default)]
pub struct Loaded {
    pub state: ClusterState,
    pub notes: Vec<String>,
    pub errors: Vec<InputError>,
    /// Where each object read so far came from and its place in the state, by kind,
    /// namespace and name.
    seen: HashMap<(String, String, String), (Origin, usize)>,
    /// Built at the first of teamgpu's objects (its CEL rules are compiled once).
    validator: Option<Validator>,
}

/// The path that stands for standard input.
pub const STDIN: &str = "-";

/// Read every file into one cluster state; `-` is standard input.
pub fn load(paths: &[PathBuf], limits: &Limits) -> Loaded {
    load_from(paths, &mut std::io::stdin().lock(), limits)
}

/// [`load`], with `stdin` for `-`.
pub fn load_from(paths: &[PathBuf], stdin: &mut dyn std::io::Read, limits: &Limits) -> Loaded {
    let found = files(paths);
    let mut loaded = Loaded {
        notes: found.notes,
        errors: found.errors,
        ..Loaded::default()
    };
    for path in found.paths {
        let read_err = |source| InputError::Read {
            path: path.clone(),
            source,
        };
        if path == Path::new(STDIN) {
            let mut text = String::new();
            match stdin.read_to_string(&mut text) {
                Ok(_) => loaded.add_text(Path::new("<stdin>"), &text, limits),
                Err(e) => loaded.errors.push(read_err(e)),
            }
        } else {
            match std::fs::read_to_string(&path) {
                Ok(text) => loaded.add_text(&path, &text, limits),
                Err(e) => loaded.errors.push(read_err(e)),
            }
        }
    }
    loaded
}

/// Add the documents of one YAML stream; `path` names it in messages. The first error, if
/// any, is returned (the others stay in `loaded.errors`).
pub fn add_documents(loaded: &mut Loaded, path: &Path, text: &str) -> Result<(), InputError> {
    let before = loaded.errors.len();
    loaded.add_text(path, text, &Limits::default());
    if loaded.errors.len() > before {
        Err(loaded.errors.remove(before))
    } else {
        Ok(())
    }
}

impl Loaded {
    /// Add the documents of one file's text; errors go to `self.errors`.
    pub fn add_text(&mut self, path: &Path, text: &str, limits: &Limits) {
        match documents(path, text, limits) {
            Ok(docs) => {
                for (document, doc) in docs.into_iter().enumerate() {
                    let at = Origin {
                        path: path.to_owned(),
                        document,
                        item: None,
                    };
                    self.add_value(&at, doc);
                }
            }
            Err(e) => self.errors.push(e),
        }
    }

    /// Add one document; a `List` (as `kubectl get -o yaml` prints) adds its items, each with
    /// its index.
    fn add_value(&mut self, at: &Origin, doc: Value) {
        if doc.is_null() {
            return;
        }
        let text = |key: &str| doc.get(key).and_then(Value::as_str).unwrap_or_default();
        let (api_version, kind) = (text("apiVersion").to_owned(), text("kind").to_owned());
        if kind == "List" || (kind.ends_with("List") && doc.get("items").is_some()) {
            let Value::Object(mut list) = doc else {
                return;
            };
            let items = match list.remove("items") {
                Some(Value::Array(items)) => items,
                _ => Vec::new(),
            };
            for (i, item) in items.into_iter().enumerate() {
                let at = Origin {
                    item: Some(i),
                    ..at.clone()
                };
                self.add_value(&at, item);
            }
            return;
        }
        let validator = self.validator.get_or_insert_with(Validator::new);
        if validator.governs(&api_version, &kind) {
            let errors = validator.check(&doc);
            if !errors.is_empty() {
                let object = object_name(&kind, &doc);
                self.errors.push(InputError::Invalid {
                    at: at.clone(),
                    object,
                    errors,
                });
                return;
            }
        }
        let state = &mut self.state;
        let mut slot = Slot {
            seen: &mut self.seen,
            notes: &mut self.notes,
            at,
            kind: &kind,
        };
        let result = match (api_version.as_str(), kind.as_str()) {
            ("teamgpu.io/v1alpha1", "GpuSharingPolicy") => {
                read(at, &kind, doc).map(|o: GpuSharingPolicy| {
                    slot.put(&mut state.sharing_policies, names(&o.metadata), o)
                })
            }
            ("teamgpu.io/v1alpha1", "TeamGpuPolicy") => read(at, &kind, doc)
                .map(|o: TeamGpuPolicy| slot.put(&mut state.teams, names(&o.metadata), o)),
            ("v1", "Namespace") => read(at, &kind, doc).map(|ns: Namespace| {
                let info = Arc::new(NamespaceInfo {
                    name: ns.metadata.name.clone().unwrap_or_default(),
                    labels: ns.metadata.labels.clone().unwrap_or_default(),
                });
                slot.put(&mut state.namespaces, names(&ns.metadata), info)
            }),
            ("resource.k8s.io/v1", "DeviceClass") => read(at, &kind, doc)
                .map(|o: DeviceClass| slot.put(&mut state.device_classes, names(&o.metadata), o)),
            ("resource.k8s.io/v1", "ResourceSlice") => read(at, &kind, doc)
                .map(|o: ResourceSlice| slot.put(&mut state.slices, names(&o.metadata), o)),
            ("resource.k8s.io/v1", "ResourceClaim") => read(at, &kind, doc)
                .map(|o: ResourceClaim| slot.put(&mut state.claims, names(&o.metadata), o)),
            _ => {
                self.notes.push(format!(
                    "{at}: skipped {kind} ({api_version}): not an input of the planner"
                ));
                Ok(())
            }
        };
        if let Err(e) = result {
            self.errors.push(e);
        }
    }
}

/// `doc` as a `T`; an error names the field that does not fit (`spec.devices[0].name`).
fn read<T: DeserializeOwned>(at: &Origin, kind: &str, doc: Value) -> Result<T, InputError> {
    let object = object_name(kind, &doc);
    serde_path_to_error::deserialize(doc).map_err(|e| {
        let path = e.path().to_string();
        let path = if path == "." { String::new() } else { path };
        InputError::Invalid {
            at: at.clone(),
            object,
            errors: vec![FieldError::new(&path, e.into_inner().to_string())],
        }
    })
}

/// Where an object goes in the state: after the one of the same kind, namespace and name read
/// before, which it replaces (with a note).
struct Slot<'a> {
    seen: &'a mut HashMap<(String, String, String), (Origin, usize)>,
    notes: &'a mut Vec<String>,
    at: &'a Origin,
    kind: &'a str,
}

impl Slot<'_> {
    fn put<T>(&mut self, list: &mut Vec<T>, (namespace, name): (String, String), object: T) {
        if name.is_empty() {
            list.push(object);
            return;
        }
        let key = (self.kind.to_owned(), namespace, name);
        match self.seen.get(&key) {
            Some((before, index)) => {
                self.notes.push(format!(
                    "{}: {}/{} replaces the one read at {before}",
                    self.at, self.kind, key.2
                ));
                list[*index] = object;
                let index = *index;
                self.seen.insert(key, (self.at.clone(), index));
            }
            None => {
                self.seen.insert(key, (self.at.clone(), list.len()));
                list.push(object);
            }
        }
    }
}

/// An object's namespace and name (empty when it has none).
fn names(meta: &ObjectMeta) -> (String, String) {
    (
        meta.namespace.clone().unwrap_or_default(),
        meta.name.clone().unwrap_or_default(),
    )
}

/// `Kind/name`, as errors name an object.
fn object_name(kind: &str, doc: &Value) -> String {
    let name = doc
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("<no name>");
    match doc.pointer("/metadata/namespace").and_then(Value::as_str) {
        Some(ns) => format!("{kind}/{name} (namespace {ns})"),
        None => format!("{kind}/{name}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn loaded(text: &str) -> Loaded {
        let mut loaded = Loaded::default();
        loaded.add_text(Path::new("in.yaml"), text, &Limits::default());
        loaded
    }

    #[test]
    fn reads_kinds_skips_others_and_names_the_broken_document() {
        let text = "apiVersion: v1\nkind: Namespace\nmetadata: {name: a, labels: {t: x}}\n---\n\
                    apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d}\n";
        let read = loaded(text);
        assert_eq!(read.state.namespaces[0].name, "a");
        assert_eq!(
            read.notes,
            ["in.yaml, document 1: skipped Deployment (apps/v1): not an input of the planner"]
        );

        let err =
            add_documents(&mut Loaded::default(), Path::new("x.yaml"), "a: [b\n").unwrap_err();
        assert!(
            err.to_string().starts_with("x.yaml: not valid YAML"),
            "{err}"
        );

        let stdin = "apiVersion: v1\nkind: Namespace\nmetadata: {name: from-stdin}\n";
        let read = load_from(
            &[PathBuf::from("-")],
            &mut stdin.as_bytes(),
            &Limits::default(),
        );
        assert_eq!(read.state.namespaces[0].name, "from-stdin");
        let read = load_from(
            &[PathBuf::from("-")],
            &mut "a: [b\n".as_bytes(),
            &Limits::default(),
        );
        assert!(
            read.errors[0]
                .to_string()
                .starts_with("<stdin>: not valid YAML"),
            "{:?}",
            read.errors
        );
    }

    #[test]
    fn a_type_error_names_the_item_the_object_and_the_field() {
        let text = "apiVersion: v1\nkind: List\nitems:\n\
                    - {apiVersion: v1, kind: Namespace, metadata: {name: a}}\n\
                    - {apiVersion: resource.k8s.io/v1, kind: ResourceSlice, metadata: {name: s},\n   \
                       spec: {driver: d, pool: {name: p, generation: 1, resourceSliceCount: 1}, devices: [{name: [x]}]}}\n";
        let read = loaded(text);
        assert_eq!(read.state.namespaces.len(), 1);
        assert!(read.state.slices.is_empty());
        assert_eq!(
            read.errors[0].to_string(),
            "in.yaml, document 0, item 1: ResourceSlice/s: spec.devices[0].name: invalid type: sequence, expected a string"
        );
    }

    #[test]
    fn the_later_of_two_same_objects_replaces_the_earlier() {
        let text = "apiVersion: v1\nkind: Namespace\nmetadata: {name: a, labels: {t: x}}\n---\n\
                    apiVersion: v1\nkind: Namespace\nmetadata: {name: b}\n---\n\
                    apiVersion: v1\nkind: Namespace\nmetadata: {name: a, labels: {t: z}}\n";
        let read = loaded(text);
        let names: Vec<_> = read
            .state
            .namespaces
            .iter()
            .map(|n| (n.name.as_str(), n.labels.get("t").map(String::as_str)))
            .collect();
        assert_eq!(names, [("a", Some("z")), ("b", None)]);
        assert_eq!(
            read.notes,
            ["in.yaml, document 2: Namespace/a replaces the one read at in.yaml, document 0"]
        );
    }
}
