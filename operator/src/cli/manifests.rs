//! The release bundle (`teamgpu manifests`): the whole install as one YAML stream, the same
//! objects as `kubectl kustomize config/default`. Pure; needs no client.
//!
//! The kustomizations of `config/` are embedded at compile time and read by a small subset of
//! kustomize (`resources`, `namespace`, `labels` without selectors or templates, `images`), so
//! a change to them is a change to the bundle. Anything else in a kustomization is refused
//! rather than ignored. The CRDs come from the Rust types ([`crate::cli::crd::files`]), which is
//! what `crds/` holds (a test keeps the two equal).

use std::collections::BTreeMap;

use serde_json::Value;

/// The image repository of the operator.
pub const IMAGE_REPOSITORY: &str = "ghcr.io/teamgpu/teamgpu";

/// The image of this version: `ghcr.io/teamgpu/teamgpu:v<version>`.
pub fn default_image() -> String {
    format!("{IMAGE_REPOSITORY}:v{}", env!("CARGO_PKG_VERSION"))
}

/// The kustomization the bundle is built from.
pub const ROOT: &str = "config/default";

/// The files of `config/` the bundle reads, by path from the repository root.
const EMBEDDED: [(&str, &str); 16] = [
    (
        "config/default/kustomization.yaml",
        include_str!("../../../config/default/kustomization.yaml"),
    ),
    (
        "config/default/namespace.yaml",
        include_str!("../../../config/default/namespace.yaml"),
    ),
    (
        "config/crd/kustomization.yaml",
        include_str!("../../../config/crd/kustomization.yaml"),
    ),
    (
        "config/rbac/kustomization.yaml",
        include_str!("../../../config/rbac/kustomization.yaml"),
    ),
    (
        "config/rbac/service_account.yaml",
        include_str!("../../../config/rbac/service_account.yaml"),
    ),
    (
        "config/rbac/role.yaml",
        include_str!("../../../config/rbac/role.yaml"),
    ),
    (
        "config/rbac/role_binding.yaml",
        include_str!("../../../config/rbac/role_binding.yaml"),
    ),
    (
        "config/rbac/leader_election_role.yaml",
        include_str!("../../../config/rbac/leader_election_role.yaml"),
    ),
    (
        "config/rbac/leader_election_role_binding.yaml",
        include_str!("../../../config/rbac/leader_election_role_binding.yaml"),
    ),
    (
        "config/rbac/viewer_role.yaml",
        include_str!("../../../config/rbac/viewer_role.yaml"),
    ),
    (
        "config/rbac/planner_role.yaml",
        include_str!("../../../config/rbac/planner_role.yaml"),
    ),
    (
        "config/rbac/department_member_role.yaml",
        include_str!("../../../config/rbac/department_member_role.yaml"),
    ),
    (
        "config/manager/kustomization.yaml",
        include_str!("../../../config/manager/kustomization.yaml"),
    ),
    (
        "config/manager/manager.yaml",
        include_str!("../../../config/manager/manager.yaml"),
    ),
    (
        "config/manager/service.yaml",
        include_str!("../../../config/manager/service.yaml"),
    ),
    (
        "config/manager/networkpolicy.yaml",
        include_str!("../../../config/manager/networkpolicy.yaml"),
    ),
];

/// The folder of the generated CRDs, served from [`crate::cli::crd::files`].
const CRDS: &str = "crds";

#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error("{0} is not embedded in the binary (add it to operator/src/cli/manifests.rs)")]
    NotEmbedded(String),
    #[error("{path}: not valid YAML: {message}")]
    Yaml { path: String, message: String },
    #[error("{path}: `{field}` is not supported by `teamgpu manifests`")]
    Unsupported { path: String, field: String },
    #[error("serializing the manifests: {0}")]
    Serialize(#[from] serde_saphyr::SerializeError),
    #[error("serializing the CRDs: {0}")]
    Crd(serde_saphyr::SerializeError),
}

/// Every object of the install, in the order `kubectl kustomize` prints them (namespaces and
/// CRDs first, workloads last), with the Deployment running `image`.
pub fn objects(image: &str) -> Result<Vec<Value>, ManifestError> {
    let files = files()?;
    let mut objects = build(&files, ROOT)?;
    // The images transformer of the kustomizations has run; `image` is the caller's choice.
    for object in &mut objects {
        for container in containers(object) {
            if image_name(container["image"].as_str().unwrap_or_default()) == IMAGE_REPOSITORY {
                container["image"] = Value::String(image.to_owned());
            }
        }
    }
    objects.iter_mut().for_each(whole_numbers);
    objects.sort_by_key(|o| (kind_rank(o["kind"].as_str().unwrap_or_default()), id(o)));
    Ok(objects)
}

/// `1.0` -> `1`, as kustomize prints numbers (the CRD schema's bounds are floats in Rust).
fn whole_numbers(value: &mut Value) {
    match value {
        Value::Number(n) => {
            if let Some(f) = n.as_f64().filter(|f| n.is_f64() && f.fract() == 0.0)
                && f.abs() < 2f64.powi(53)
            {
                *value = Value::from(f as i64);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(whole_numbers),
        Value::Object(fields) => fields.values_mut().for_each(whole_numbers),
        _ => {}
    }
}

/// The install as one multi-document YAML stream.
pub fn to_yaml(image: &str) -> Result<String, ManifestError> {
    let mut out = String::new();
    for object in objects(image)? {
        out.push_str("---\n");
        out.push_str(&serde_saphyr::to_string(&object)?);
    }
    Ok(out)
}

/// The embedded files and the generated CRDs, by path.
fn files() -> Result<BTreeMap<String, String>, ManifestError> {
    let mut files: BTreeMap<String, String> = EMBEDDED
        .iter()
        .map(|(path, text)| ((*path).to_owned(), (*text).to_owned()))
        .collect();
    for (name, text) in crate::cli::crd::files().map_err(ManifestError::Crd)? {
        files.insert(format!("{CRDS}/{name}"), text);
    }
    Ok(files)
}

/// `a/b/../c` -> `a/c`.
fn normalize(path: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." if parts.last().is_some_and(|p| *p != "..") => {
                parts.pop();
            }
            _ => parts.push(part),
        }
    }
    parts.join("/")
}

fn documents(files: &BTreeMap<String, String>, path: &str) -> Result<Vec<Value>, ManifestError> {
    let text = files
        .get(path)
        .ok_or_else(|| ManifestError::NotEmbedded(path.to_owned()))?;
    let docs: Vec<Value> = serde_saphyr::from_multiple(text).map_err(|e| ManifestError::Yaml {
        path: path.to_owned(),
        message: e.to_string(),
    })?;
    Ok(docs.into_iter().filter(|d| !d.is_null()).collect())
}

/// The objects of the kustomization in folder `dir`, its transformers applied.
fn build(files: &BTreeMap<String, String>, dir: &str) -> Result<Vec<Value>, ManifestError> {
    let path = format!("{dir}/kustomization.yaml");
    let kustomization = documents(files, &path)?
        .into_iter()
        .next()
        .unwrap_or_default();
    let unsupported = |field: &str| ManifestError::Unsupported {
        path: path.clone(),
        field: field.to_owned(),
    };
    for field in kustomization.as_object().into_iter().flat_map(|o| o.keys()) {
        if ![
            "apiVersion",
            "kind",
            "resources",
            "namespace",
            "labels",
            "images",
        ]
        .contains(&field.as_str())
        {
            return Err(unsupported(field));
        }
    }
    let mut objects = Vec::new();
    for resource in kustomization["resources"].as_array().into_iter().flatten() {
        let resource = normalize(&format!("{dir}/{}", resource.as_str().unwrap_or_default()));
        let is_folder = files.contains_key(&format!("{resource}/kustomization.yaml"));
        if is_folder {
            objects.extend(build(files, &resource)?);
        } else {
            objects.extend(documents(files, &resource)?);
        }
    }
    if let Some(namespace) = kustomization["namespace"].as_str() {
        for object in &mut objects {
            set_namespace(object, namespace);
        }
    }
    for label in kustomization["labels"].as_array().into_iter().flatten() {
        for field in label.as_object().into_iter().flat_map(|o| o.keys()) {
            let off = |flag: &str| label[flag].as_bool() != Some(true);
            match field.as_str() {
                "pairs" => {}
                "includeSelectors" | "includeTemplates" if off(field) => {}
                _ => return Err(unsupported(&format!("labels.{field}"))),
            }
        }
        for object in &mut objects {
            let labels = &mut object["metadata"]["labels"];
            if labels.is_null() {
                *labels = Value::Object(Default::default());
            }
            for (key, value) in label["pairs"].as_object().into_iter().flatten() {
                labels[key] = value.clone();
            }
        }
    }
    for image in kustomization["images"].as_array().into_iter().flatten() {
        let name = image["name"].as_str().unwrap_or_default();
        for object in &mut objects {
            for container in containers(object) {
                let current = container["image"].as_str().unwrap_or_default().to_owned();
                if image_name(&current) != name {
                    continue;
                }
                let mut new = image["newName"].as_str().unwrap_or(name).to_owned();
                if let Some(digest) = image["digest"].as_str() {
                    new = format!("{new}@{digest}");
                } else if let Some(tag) = image["newTag"].as_str() {
                    new = format!("{new}:{tag}");
                } else if let Some(rest) = current.strip_prefix(name) {
                    new.push_str(rest);
                }
                container["image"] = Value::String(new);
            }
        }
    }
    Ok(objects)
}

/// The image reference without its tag or digest.
fn image_name(image: &str) -> &str {
    let without_digest = image.split('@').next().unwrap_or(image);
    match without_digest.rsplit_once(':') {
        // A colon after the last slash is a tag; before it, a registry port.
        Some((name, tag)) if !tag.contains('/') => name,
        _ => without_digest,
    }
}

/// The containers of a workload's Pod template.
fn containers(object: &mut Value) -> impl Iterator<Item = &mut Value> {
    let mut all = Vec::new();
    if let Some(Value::Object(spec)) = object.pointer_mut("/spec/template/spec") {
        for (field, list) in spec.iter_mut() {
            if field == "containers" || field == "initContainers" {
                all.extend(list.as_array_mut().into_iter().flatten());
            }
        }
    }
    all.into_iter()
}

/// Kinds that are not namespaced, among those an install holds.
const CLUSTER_SCOPED: [&str; 9] = [
    "Namespace",
    "CustomResourceDefinition",
    "ClusterRole",
    "ClusterRoleBinding",
    "PriorityClass",
    "StorageClass",
    "PersistentVolume",
    "ValidatingWebhookConfiguration",
    "MutatingWebhookConfiguration",
];

/// What kustomize's namespace transformer does: namespaced objects move to `namespace`, and
/// ServiceAccount subjects of bindings that name no namespace (or `default`) follow.
fn set_namespace(object: &mut Value, namespace: &str) {
    let kind = object["kind"].as_str().unwrap_or_default().to_owned();
    if !CLUSTER_SCOPED.contains(&kind.as_str()) {
        object["metadata"]["namespace"] = Value::String(namespace.to_owned());
    }
    if kind == "RoleBinding" || kind == "ClusterRoleBinding" {
        for subject in object["subjects"].as_array_mut().into_iter().flatten() {
            let unset = subject["namespace"]
                .as_str()
                .is_none_or(|ns| ns.is_empty() || ns == "default");
            if subject["kind"] == "ServiceAccount" && unset {
                subject["namespace"] = Value::String(namespace.to_owned());
            }
        }
    }
}

/// kustomize's (and Helm's) install order: what others depend on first.
fn kind_rank(kind: &str) -> usize {
    const FIRST: [&str; 22] = [
        "Namespace",
        "ResourceQuota",
        "StorageClass",
        "CustomResourceDefinition",
        "ServiceAccount",
        "PodSecurityPolicy",
        "Role",
        "ClusterRole",
        "RoleBinding",
        "ClusterRoleBinding",
        "ConfigMap",
        "Secret",
        "Endpoints",
        "Service",
        "LimitRange",
        "PriorityClass",
        "PersistentVolume",
        "PersistentVolumeClaim",
        "Deployment",
        "StatefulSet",
        "CronJob",
        "PodDisruptionBudget",
    ];
    const LAST: [&str; 2] = [
        "MutatingWebhookConfiguration",
        "ValidatingWebhookConfiguration",
    ];
    if let Some(i) = FIRST.iter().position(|k| *k == kind) {
        i
    } else if let Some(i) = LAST.iter().position(|k| *k == kind) {
        FIRST.len() + 2 + i
    } else {
        FIRST.len() + 1
    }
}

fn id(object: &Value) -> (String, String, String) {
    let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
    (
        text(&object["apiVersion"]),
        text(&object["metadata"]["namespace"]),
        text(&object["metadata"]["name"]),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(objects: &[Value]) -> Vec<String> {
        objects
            .iter()
            .map(|o| {
                format!(
                    "{} {}/{}",
                    o["kind"].as_str().unwrap(),
                    o["metadata"]["namespace"].as_str().unwrap_or(""),
                    o["metadata"]["name"].as_str().unwrap()
                )
            })
            .collect()
    }

    #[test]
    fn the_bundle_holds_the_install_in_dependency_order() {
        let objects = objects("example.com/teamgpu:dev").unwrap();
        assert_eq!(
            keys(&objects),
            [
                "Namespace /teamgpu-system",
                "CustomResourceDefinition /gpusharingpolicies.teamgpu.io",
                "CustomResourceDefinition /teamgpupolicies.teamgpu.io",
                "ServiceAccount teamgpu-system/teamgpu",
                "Role teamgpu-system/teamgpu-leader-election",
                "ClusterRole /teamgpu",
                "ClusterRole /teamgpu-department-member",
                "ClusterRole /teamgpu-planner",
                "ClusterRole /teamgpu-viewer",
                "RoleBinding teamgpu-system/teamgpu-leader-election",
                "ClusterRoleBinding /teamgpu",
                "Service teamgpu-system/teamgpu-metrics",
                "Deployment teamgpu-system/teamgpu",
                "NetworkPolicy teamgpu-system/teamgpu-metrics",
            ]
        );
        assert!(
            objects
                .iter()
                .all(|o| o["metadata"]["labels"]["app.kubernetes.io/part-of"] == "teamgpu")
        );
        let deployment = objects.iter().find(|o| o["kind"] == "Deployment").unwrap();
        assert_eq!(
            deployment["spec"]["template"]["spec"]["containers"][0]["image"],
            "example.com/teamgpu:dev"
        );
    }

    #[test]
    fn the_default_image_is_this_version() {
        let objects = objects(&default_image()).unwrap();
        let deployment = objects.iter().find(|o| o["kind"] == "Deployment").unwrap();
        assert_eq!(
            deployment["spec"]["template"]["spec"]["containers"][0]["image"],
            format!("ghcr.io/teamgpu/teamgpu:v{}", env!("CARGO_PKG_VERSION"))
        );
    }

    #[test]
    fn whole_numbers_print_as_integers() {
        let mut value = serde_json::json!({"minimum": 1.0, "maximum": 0.5, "n": [100000.0, 3]});
        whole_numbers(&mut value);
        assert_eq!(
            serde_json::to_string(&value).unwrap(),
            r#"{"maximum":0.5,"minimum":1,"n":[100000,3]}"#
        );
    }

    #[test]
    fn image_names_drop_tags_and_digests_but_keep_registry_ports() {
        assert_eq!(
            image_name("ghcr.io/teamgpu/teamgpu:v1"),
            "ghcr.io/teamgpu/teamgpu"
        );
        assert_eq!(image_name("reg:5000/teamgpu@sha256:ab"), "reg:5000/teamgpu");
        assert_eq!(image_name("reg:5000/teamgpu"), "reg:5000/teamgpu");
        assert_eq!(normalize("config/crd/../../crds"), "crds");
    }

    #[test]
    fn a_kustomize_feature_the_bundle_does_not_implement_is_refused() {
        let mut files = files().unwrap();
        files.insert(
            "x/kustomization.yaml".into(),
            "resources: [../config/default]\npatches: [{path: p.yaml}]\n".into(),
        );
        let err = build(&files, "x").unwrap_err().to_string();
        assert_eq!(
            err,
            "x/kustomization.yaml: `patches` is not supported by `teamgpu manifests`"
        );
        files.insert(
            "y/kustomization.yaml".into(),
            "resources: [new.yaml]\n".into(),
        );
        let err = build(&files, "y").unwrap_err().to_string();
        assert!(err.starts_with("y/new.yaml is not embedded"), "{err}");
    }
}
