//! The repository's manifests the harness installs (the CRDs of `crds/`, the RBAC of
//! `config/rbac`), read as JSON, and objects the tests create.

use std::path::{Path, PathBuf};

use serde_json::Value;

/// Errors while reading fixture files.
#[derive(Debug, thiserror::Error)]
pub enum FixtureError {
    /// The file could not be read.
    #[error("reading {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The file is not valid YAML.
    #[error("parsing {path}: {message}")]
    Yaml {
        /// The file.
        path: PathBuf,
        /// The parser's message.
        message: String,
    },
}

/// The repository's generated CRD manifests (`crds/`).
pub fn crds_dir() -> PathBuf {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../crds")).to_path_buf()
}

/// Every non-empty YAML document of a file, as JSON values.
pub fn yaml_documents(path: &Path) -> Result<Vec<Value>, FixtureError> {
    let text = std::fs::read_to_string(path).map_err(|source| FixtureError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    yaml_documents_str(&text).map_err(|message| FixtureError::Yaml {
        path: path.to_path_buf(),
        message,
    })
}

/// Every non-empty YAML document of a string, as JSON values.
pub fn yaml_documents_str(text: &str) -> Result<Vec<Value>, String> {
    let docs: Vec<Value> = serde_saphyr::from_multiple(text).map_err(|e| e.to_string())?;
    Ok(docs.into_iter().filter(|d| !d.is_null()).collect())
}

/// The CustomResourceDefinitions of `crds/` (files whose kind is CustomResourceDefinition),
/// read once per process.
pub fn our_crds() -> Result<Vec<Value>, FixtureError> {
    static CACHE: std::sync::OnceLock<Vec<Value>> = std::sync::OnceLock::new();
    if let Some(c) = CACHE.get() {
        return Ok(c.clone());
    }
    let crds = read_our_crds()?;
    Ok(CACHE.get_or_init(|| crds).clone())
}

/// The manifests of `config/rbac` (the files its kustomization lists), namespaced objects in the
/// namespace the Deployment uses.
pub fn rbac_manifests() -> Result<Vec<Value>, FixtureError> {
    let dir = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../config/rbac"));
    let kustomization = yaml_documents(&dir.join("kustomization.yaml"))?;
    let mut out = Vec::new();
    for file in kustomization
        .iter()
        .flat_map(|k| k["resources"].as_array().cloned().unwrap_or_default())
    {
        out.extend(yaml_documents(
            &dir.join(file.as_str().unwrap_or_default()),
        )?);
    }
    Ok(out)
}

fn read_our_crds() -> Result<Vec<Value>, FixtureError> {
    let dir = crds_dir();
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map_err(|source| FixtureError::Read {
            path: dir.clone(),
            source,
        })?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml" || x == "yml"))
        .collect();
    files.sort();
    let mut out = Vec::new();
    for f in files {
        for d in yaml_documents(&f)? {
            if d.get("kind").and_then(Value::as_str) == Some("CustomResourceDefinition") {
                out.push(d);
            }
        }
    }
    Ok(out)
}

/// `obj` as something to create: only its name, namespace and labels kept from the metadata
/// (no uid, resourceVersion or owner), so objects planned or read elsewhere can be created here.
pub fn fresh<K: kube::Resource + Clone>(obj: &K) -> K {
    let mut obj = obj.clone();
    let meta = obj.meta_mut();
    *meta = kube::api::ObjectMeta {
        name: meta.name.clone(),
        namespace: meta.namespace.clone(),
        labels: meta.labels.clone(),
        ..Default::default()
    };
    obj
}

/// A Pod using one claim from `template`: a real image, and admitted by the `restricted` Pod
/// Security level. On a real cluster without a driver it stays ContainerCreating (the kubelet
/// cannot prepare the devices), but its claim is allocated and reserved.
pub fn gpu_pod(name: &str, template: &str) -> k8s_openapi::api::core::v1::Pod {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {
            "securityContext": {"runAsNonRoot": true, "runAsUser": 65535,
                                "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10",
                            "securityContext": {"allowPrivilegeEscalation": false,
                                                "capabilities": {"drop": ["ALL"]}},
                            "resources": {"claims": [{"name": "gpu"}]}}],
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template}]}
    }))
    .unwrap()
}

/// The repository's root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("e2e/ lives in the workspace root")
        .to_path_buf()
}

/// The `teamgpu` binary of the running test's profile (`target/<profile>/teamgpu`), which
/// `cargo test --workspace` builds for operator/tests. Cargo builds no binary of another package
/// for an integration test, so a stale or missing one is reported, not used.
pub fn teamgpu_binary() -> PathBuf {
    let test = std::env::current_exe().expect("the test's own path");
    let profile_dir = test
        .parent()
        .and_then(Path::parent)
        .expect("tests live in target/<profile>/deps");
    let binary = profile_dir.join("teamgpu");
    let built = std::fs::metadata(&binary)
        .and_then(|m| m.modified())
        .unwrap_or_else(|_| {
            panic!(
                "{} is missing: run `cargo build -p teamgpu` (or `cargo test --workspace`) first",
                binary.display()
            )
        });
    let newest_source = newest_modification(&repo_root().join("operator/src"));
    assert!(
        built >= newest_source,
        "{} is older than operator/src: run `cargo build -p teamgpu` first",
        binary.display()
    );
    binary
}

fn newest_modification(dir: &Path) -> std::time::SystemTime {
    let mut newest = std::time::UNIX_EPOCH;
    for entry in std::fs::read_dir(dir).expect("readable") {
        let path = entry.expect("readable").path();
        let modified = if path.is_dir() {
            newest_modification(&path)
        } else {
            std::fs::metadata(&path)
                .and_then(|m| m.modified())
                .expect("mtime")
        };
        newest = newest.max(modified);
    }
    newest
}

/// `teamgpu run` of `binary` as `kubeconfig`'s user, its metrics and probes on free local ports
/// (stdio and the log level are the caller's).
pub fn operator_process(binary: &Path, kubeconfig: &Path) -> std::process::Command {
    let mut command = std::process::Command::new(binary);
    command
        .args([
            "run",
            "--metrics-addr",
            "127.0.0.1:0",
            "--health-addr",
            "127.0.0.1:0",
        ])
        .env("KUBECONFIG", kubeconfig);
    command
}

/// The policies of `config/samples`, read as `teamgpu plan -f` reads them.
pub fn samples() -> (
    Vec<teamgpu::api::GpuSharingPolicy>,
    Vec<teamgpu::api::TeamGpuPolicy>,
) {
    let dir = repo_root().join("config/samples");
    let mut loaded = teamgpu::cli::input::Loaded::default();
    for path in std::fs::read_dir(&dir)
        .expect("config/samples is readable")
        .map(|e| e.expect("a samples entry").path())
    {
        if path.file_name().is_some_and(|n| n != "kustomization.yaml") {
            let text = std::fs::read_to_string(&path).expect("a sample is readable");
            teamgpu::cli::input::add_documents(&mut loaded, &path, &text)
                .expect("the samples are valid");
        }
    }
    (loaded.state.sharing_policies, loaded.state.teams)
}
