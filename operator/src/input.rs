//! Reading cluster state from YAML files (`teamgpu plan -f`).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use serde::de::DeserializeOwned;

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
    #[error("{path}, document {index}: {kind}: {message}")]
    Document {
        path: PathBuf,
        index: usize,
        kind: String,
        message: String,
    },
}

/// What reading the inputs produced besides the state: documents that were skipped, and why.
#[derive(Debug, Default)]
pub struct Loaded {
    pub state: ClusterState,
    pub notes: Vec<String>,
}

/// The YAML files named by `paths`: files as given, folders by their `*.yaml`/`*.yml` files,
/// recursively, in name order.
pub fn files(paths: &[PathBuf]) -> Result<Vec<PathBuf>, InputError> {
    let mut out = Vec::new();
    for path in paths {
        collect(path, &mut out)?;
    }
    Ok(out)
}

fn collect(path: &Path, out: &mut Vec<PathBuf>) -> Result<(), InputError> {
    let read_err = |source| InputError::Read {
        path: path.to_owned(),
        source,
    };
    if path == Path::new(STDIN) || !path.is_dir() {
        out.push(path.to_owned());
        return Ok(());
    }
    let mut entries: Vec<PathBuf> = std::fs::read_dir(path)
        .map_err(read_err)?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()
        .map_err(read_err)?;
    entries.sort();
    for entry in entries {
        let is_yaml = entry.extension().is_some_and(|e| e == "yaml" || e == "yml");
        if entry.is_dir() || is_yaml {
            collect(&entry, out)?;
        }
    }
    Ok(())
}

/// The path that stands for standard input.
pub const STDIN: &str = "-";

/// Read every file into one cluster state; `-` is standard input.
pub fn load(paths: &[PathBuf]) -> Result<Loaded, InputError> {
    load_from(paths, &mut std::io::stdin().lock())
}

/// [`load`], with `stdin` for `-`.
pub fn load_from(paths: &[PathBuf], stdin: &mut dyn std::io::Read) -> Result<Loaded, InputError> {
    let mut loaded = Loaded::default();
    for path in files(paths)? {
        let read_err = |source| InputError::Read {
            path: path.clone(),
            source,
        };
        if path == Path::new(STDIN) {
            let mut text = String::new();
            stdin.read_to_string(&mut text).map_err(read_err)?;
            add_documents(&mut loaded, Path::new("<stdin>"), &text)?;
        } else {
            let text = std::fs::read_to_string(&path).map_err(read_err)?;
            add_documents(&mut loaded, &path, &text)?;
        }
    }
    Ok(loaded)
}

/// Add the documents of one YAML stream; `path` names it in messages.
pub fn add_documents(loaded: &mut Loaded, path: &Path, text: &str) -> Result<(), InputError> {
    let documents: Vec<serde_json::Value> =
        serde_saphyr::from_multiple(text).map_err(|e| InputError::Yaml {
            path: path.to_owned(),
            message: e.to_string(),
        })?;
    for (index, doc) in documents.into_iter().enumerate() {
        add_value(loaded, path, index, doc)?;
    }
    Ok(())
}

/// Add one document; a `List` (as `kubectl get -o yaml` prints) adds its items.
fn add_value(
    loaded: &mut Loaded,
    path: &Path,
    index: usize,
    doc: serde_json::Value,
) -> Result<(), InputError> {
    if doc.is_null() {
        return Ok(());
    }
    let api_version = doc
        .get("apiVersion")
        .and_then(|v| v.as_str())
        .unwrap_or_default()
        .to_owned();
    let kind = doc
        .get("kind")
        .and_then(|v| v.as_str())
        .unwrap_or_default()
        .to_owned();
    let at = |e: serde_json::Error| InputError::Document {
        path: path.to_owned(),
        index,
        kind: format!("{kind} ({api_version})"),
        message: e.to_string(),
    };
    let state = &mut loaded.state;
    match (api_version.as_str(), kind.as_str()) {
        ("teamgpu.io/v1alpha1", "GpuSharingPolicy") => {
            state.sharing_policies.push(typed(doc).map_err(at)?)
        }
        ("teamgpu.io/v1alpha1", "TeamGpuPolicy") => state.teams.push(typed(doc).map_err(at)?),
        ("v1", "Namespace") => {
            let ns: Namespace = typed(doc).map_err(at)?;
            state.namespaces.push(Arc::new(NamespaceInfo {
                name: ns.metadata.name.unwrap_or_default(),
                labels: ns.metadata.labels.unwrap_or_default(),
            }));
        }
        ("resource.k8s.io/v1", "DeviceClass") => state
            .device_classes
            .push(typed::<DeviceClass>(doc).map_err(at)?),
        ("resource.k8s.io/v1", "ResourceSlice") => {
            state.slices.push(typed::<ResourceSlice>(doc).map_err(at)?)
        }
        ("resource.k8s.io/v1", "ResourceClaim") => {
            state.claims.push(typed::<ResourceClaim>(doc).map_err(at)?)
        }
        ("v1", "List") => {
            let items = doc
                .get("items")
                .and_then(|i| i.as_array())
                .cloned()
                .unwrap_or_default();
            for item in items {
                add_value(loaded, path, index, item)?;
            }
        }
        _ => loaded.notes.push(format!(
            "{}, document {index}: skipped {kind} ({api_version}): not an input of the planner",
            path.display()
        )),
    }
    Ok(())
}

fn typed<T: DeserializeOwned>(doc: serde_json::Value) -> Result<T, serde_json::Error> {
    serde_json::from_value(doc)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_kinds_skips_others_and_names_the_broken_document() {
        let mut loaded = Loaded::default();
        let text = "apiVersion: v1\nkind: Namespace\nmetadata: {name: a, labels: {t: x}}\n---\n\
                    apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d}\n";
        add_documents(&mut loaded, Path::new("in.yaml"), text).unwrap();
        assert_eq!(loaded.state.namespaces[0].name, "a");
        assert_eq!(loaded.notes.len(), 1);
        assert!(
            loaded.notes[0].contains("document 1: skipped Deployment"),
            "{}",
            loaded.notes[0]
        );

        let broken = "apiVersion: v1\nkind: Namespace\nmetadata: {name: a}\n---\n\
                      apiVersion: teamgpu.io/v1alpha1\nkind: TeamGpuPolicy\nmetadata: {name: t}\nspec: {weight: many}\n";
        let err = add_documents(&mut Loaded::default(), Path::new("bad.yaml"), broken).unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.starts_with("bad.yaml, document 1: TeamGpuPolicy (teamgpu.io/v1alpha1):"),
            "{msg}"
        );
        assert!(
            msg.contains("weight") || msg.contains("invalid type"),
            "{msg}"
        );

        let err =
            add_documents(&mut Loaded::default(), Path::new("x.yaml"), "a: [b\n").unwrap_err();
        assert!(
            err.to_string().starts_with("x.yaml: not valid YAML"),
            "{err}"
        );

        let stdin = "apiVersion: v1\nkind: Namespace\nmetadata: {name: from-stdin}\n";
        let loaded = load_from(&[PathBuf::from("-")], &mut stdin.as_bytes()).unwrap();
        assert_eq!(loaded.state.namespaces[0].name, "from-stdin");
        let err = load_from(&[PathBuf::from("-")], &mut "a: [b\n".as_bytes()).unwrap_err();
        assert!(
            err.to_string().starts_with("<stdin>: not valid YAML"),
            "{err}"
        );
    }
}
