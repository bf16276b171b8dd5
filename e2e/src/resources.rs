//! The resource types the stand-in serves: built-in kinds and the CRDs of `crds/`.

use serde_json::Value;

use crate::status::Gr;

/// One served resource (a group-version-resource with its kind).
#[derive(Debug, Clone)]
pub struct ResourceType {
    /// API group ("" for core).
    pub group: String,
    /// API version.
    pub version: String,
    /// Kind.
    pub kind: String,
    /// Plural resource name.
    pub plural: String,
    /// Singular name.
    pub singular: String,
    /// Namespaced (true) or cluster-scoped.
    pub namespaced: bool,
    /// Has a status subresource.
    pub status: bool,
    /// Short names.
    pub short_names: Vec<String>,
    /// `openAPIV3Schema` of a CRD version (None for built-in kinds).
    pub crd_schema: Option<Value>,
}

impl ResourceType {
    /// `group/version` or `version` for the core group.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// Group and resource, for error messages.
    pub fn gr(&self) -> Gr<'_> {
        Gr {
            group: &self.group,
            resource: &self.plural,
        }
    }

    /// Key of this resource in the store (`group/plural`).
    pub fn key(&self) -> String {
        format!("{}/{}", self.group, self.plural)
    }

    /// Whether it is a custom resource.
    pub fn is_crd(&self) -> bool {
        self.crd_schema.is_some()
    }

    /// The verbs advertised in discovery.
    pub fn verbs(&self) -> Vec<&'static str> {
        vec![
            "create",
            "delete",
            "deletecollection",
            "get",
            "list",
            "patch",
            "update",
            "watch",
        ]
    }
}

/// Errors while loading CRDs.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// A CRD file could not be read.
    #[error(transparent)]
    Fixture(#[from] crate::fixtures::FixtureError),
    /// A CRD lacks a required field.
    #[error("CRD {name}: {message}")]
    BadCrd {
        /// metadata.name of the CRD.
        name: String,
        /// What is wrong.
        message: String,
    },
}

/// All served resource types.
#[derive(Debug, Clone)]
pub struct Registry {
    /// The types, built-in first.
    pub types: Vec<ResourceType>,
}

fn builtin(
    group: &str,
    version: &str,
    kind: &str,
    plural: &str,
    namespaced: bool,
    status: bool,
    short: &[&str],
) -> ResourceType {
    ResourceType {
        group: group.into(),
        version: version.into(),
        kind: kind.into(),
        plural: plural.into(),
        singular: kind.to_lowercase(),
        namespaced,
        status,
        short_names: short.iter().map(|s| s.to_string()).collect(),
        crd_schema: None,
    }
}

impl Registry {
    /// The built-in kinds teamgpu touches.
    pub fn builtins() -> Registry {
        let r = "resource.k8s.io";
        let a = "admissionregistration.k8s.io";
        Registry {
            types: vec![
                builtin("", "v1", "Namespace", "namespaces", false, true, &["ns"]),
                builtin(
                    "",
                    "v1",
                    "ResourceQuota",
                    "resourcequotas",
                    true,
                    true,
                    &["quota"],
                ),
                builtin("", "v1", "Pod", "pods", true, true, &["po"]),
                builtin("", "v1", "Event", "events", true, false, &["ev"]),
                builtin(
                    "events.k8s.io",
                    "v1",
                    "Event",
                    "events",
                    true,
                    false,
                    &["ev"],
                ),
                builtin(
                    "policy",
                    "v1",
                    "PodDisruptionBudget",
                    "poddisruptionbudgets",
                    true,
                    true,
                    &["pdb"],
                ),
                builtin(
                    "coordination.k8s.io",
                    "v1",
                    "Lease",
                    "leases",
                    true,
                    false,
                    &[],
                ),
                builtin(r, "v1", "DeviceClass", "deviceclasses", false, false, &[]),
                builtin(
                    r,
                    "v1",
                    "ResourceSlice",
                    "resourceslices",
                    false,
                    false,
                    &[],
                ),
                builtin(r, "v1", "ResourceClaim", "resourceclaims", true, true, &[]),
                builtin(
                    r,
                    "v1",
                    "ResourceClaimTemplate",
                    "resourceclaimtemplates",
                    true,
                    false,
                    &[],
                ),
                builtin(
                    a,
                    "v1",
                    "ValidatingAdmissionPolicy",
                    "validatingadmissionpolicies",
                    false,
                    true,
                    &[],
                ),
                builtin(
                    a,
                    "v1",
                    "ValidatingAdmissionPolicyBinding",
                    "validatingadmissionpolicybindings",
                    false,
                    false,
                    &[],
                ),
            ],
        }
    }

    /// Built-ins plus the served versions of the given CRDs (with their status subresource).
    pub fn with_crds(crds: &[Value]) -> Result<Registry, RegistryError> {
        let mut reg = Registry::builtins();
        for crd in crds {
            let name = crd["metadata"]["name"].as_str().unwrap_or("").to_string();
            let bad = |m: &str| RegistryError::BadCrd {
                name: name.clone(),
                message: m.to_string(),
            };
            let spec = &crd["spec"];
            let group = spec["group"].as_str().ok_or_else(|| bad("no spec.group"))?;
            let names = &spec["names"];
            let kind = names["kind"].as_str().ok_or_else(|| bad("no names.kind"))?;
            let plural = names["plural"]
                .as_str()
                .ok_or_else(|| bad("no names.plural"))?;
            let versions = spec["versions"]
                .as_array()
                .ok_or_else(|| bad("no versions"))?;
            for v in versions {
                if v["served"].as_bool() == Some(false) {
                    continue;
                }
                reg.types.push(ResourceType {
                    group: group.into(),
                    version: v["name"]
                        .as_str()
                        .ok_or_else(|| bad("version without name"))?
                        .into(),
                    kind: kind.into(),
                    plural: plural.into(),
                    singular: names["singular"]
                        .as_str()
                        .unwrap_or(&kind.to_lowercase())
                        .into(),
                    namespaced: spec["scope"].as_str() == Some("Namespaced"),
                    status: v.pointer("/subresources/status").is_some(),
                    short_names: names["shortNames"]
                        .as_array()
                        .map(|a| {
                            a.iter()
                                .filter_map(|s| s.as_str().map(String::from))
                                .collect()
                        })
                        .unwrap_or_default(),
                    crd_schema: Some(
                        v.pointer("/schema/openAPIV3Schema")
                            .cloned()
                            .unwrap_or(Value::Null),
                    ),
                });
            }
        }
        Ok(reg)
    }

    /// The type served at group/version/plural.
    pub fn by_path(&self, group: &str, version: &str, plural: &str) -> Option<&ResourceType> {
        self.types
            .iter()
            .find(|t| t.group == group && t.version == version && t.plural == plural)
    }

    /// The type of apiVersion + kind.
    pub fn by_kind(&self, api_version: &str, kind: &str) -> Option<&ResourceType> {
        self.types
            .iter()
            .find(|t| t.kind == kind && t.api_version() == api_version)
    }

    /// The type of group + kind (any version).
    pub fn by_group_kind(&self, group: &str, kind: &str) -> Option<&ResourceType> {
        self.types
            .iter()
            .find(|t| t.kind == kind && t.group == group)
    }

    /// Served group-versions, core first, in registration order.
    pub fn group_versions(&self) -> Vec<(String, String)> {
        let mut out: Vec<(String, String)> = Vec::new();
        for t in &self.types {
            let gv = (t.group.clone(), t.version.clone());
            if !out.contains(&gv) {
                out.push(gv);
            }
        }
        out
    }
}
