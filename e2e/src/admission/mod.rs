//! Admission and the validation the API server does beyond the OpenAPI schema.

pub mod quota;
pub mod vap;

use serde_json::{Value, json};

use crate::core::{Core, WriteOptions, meta_str};
use crate::resources::ResourceType;
use crate::status::{ApiError, Gr};
use crate::store::Store;

/// NamespaceLifecycle: namespaced objects need an existing, non-terminating namespace.
pub fn namespace_lifecycle(
    core: &Core,
    st: &Store,
    rt: &ResourceType,
    ns: &str,
    _name: &str,
) -> Result<(), ApiError> {
    let key = ("/namespaces".to_string(), String::new(), ns.to_string());
    match st.objects.get(&key) {
        None => Err(ApiError::not_found(
            Gr {
                group: "",
                resource: "namespaces",
            },
            ns,
        )),
        Some(n) if n.pointer("/metadata/deletionTimestamp").is_some() => {
            let _ = core;
            Err(ApiError {
                details: Some(
                    json!({"name": meta_str(n, "name"), "group": rt.group, "kind": rt.plural,
                    "causes": [{"reason": "NamespaceTerminating", "message": format!("namespace {ns} is being terminated"), "field": "metadata.namespace"}]}),
                ),
                ..ApiError::new(
                    403,
                    "Forbidden",
                    format!(
                        "{} is forbidden: unable to create new content in namespace {ns} because it is being terminated",
                        rt.gr().qualified()
                    ),
                )
            })
        }
        Some(_) => Ok(()),
    }
}

/// Defaults of built-in kinds that teamgpu reads back (the API server's defaulters,
/// k8s.io/kubernetes/pkg/apis/resource/v1/defaults.go): `exactly.allocationMode` = ExactCount and
/// `count` = 1 for ExactCount requests, for the same fields of `firstAvailable` subrequests.
///
/// Also the defaults of ValidatingAdmissionPolicy(Binding)
/// (k8s.io/kubernetes/pkg/apis/admissionregistration/v1/defaults.go: `failurePolicy: Fail`,
/// `matchPolicy: Equivalent`, empty namespace/object selectors, rule `scope: "*"`) and the
/// common Pod defaults (pkg/apis/core/v1/defaults.go: restartPolicy, dnsPolicy, schedulerName,
/// terminationGracePeriodSeconds, enableServiceLinks, securityContext, container
/// terminationMessagePath/Policy and imagePullPolicy).
pub fn defaults(rt: &ResourceType, obj: &mut Value) {
    match (rt.group.as_str(), rt.kind.as_str()) {
        ("admissionregistration.k8s.io", "ValidatingAdmissionPolicy") => {
            let spec = &mut obj["spec"];
            if spec.get("failurePolicy").is_none() {
                spec["failurePolicy"] = json!("Fail");
            }
            if let Some(m) = spec.get_mut("matchConstraints") {
                default_match_resources(m);
            }
            return;
        }
        ("admissionregistration.k8s.io", "ValidatingAdmissionPolicyBinding") => {
            if let Some(m) = obj.pointer_mut("/spec/matchResources") {
                default_match_resources(m);
            }
            if let Some(p) = obj.pointer_mut("/spec/paramRef").filter(|p| p.is_object())
                && p.get("parameterNotFoundAction").is_none()
            {
                p["parameterNotFoundAction"] = json!("Deny");
            }
            return;
        }
        ("", "Pod") => {
            default_pod(obj);
            return;
        }
        _ => {}
    }
    if rt.group != "resource.k8s.io" {
        return;
    }
    let spec = match rt.kind.as_str() {
        "ResourceClaim" => obj.get_mut("spec"),
        "ResourceClaimTemplate" => obj.get_mut("spec").and_then(|s| s.get_mut("spec")),
        _ => None,
    };
    let Some(requests) = spec
        .and_then(|s| s.pointer_mut("/devices/requests"))
        .and_then(Value::as_array_mut)
    else {
        return;
    };
    let default_one = |r: &mut Value| {
        if !r.is_object() {
            return;
        }
        if r.get("allocationMode").is_none() {
            r["allocationMode"] = json!("ExactCount");
        }
        if r["allocationMode"] == json!("ExactCount") && r.get("count").is_none() {
            r["count"] = json!(1);
        }
    };
    for req in requests {
        if let Some(e) = req.get_mut("exactly") {
            default_one(e);
        }
        if let Some(subs) = req.get_mut("firstAvailable").and_then(Value::as_array_mut) {
            for s in subs {
                default_one(s);
            }
        }
    }
}

fn default_match_resources(m: &mut Value) {
    if !m.is_object() {
        return;
    }
    if m.get("matchPolicy").is_none() {
        m["matchPolicy"] = json!("Equivalent");
    }
    for sel in ["namespaceSelector", "objectSelector"] {
        if m.get(sel).is_none() {
            m[sel] = json!({});
        }
    }
    for list in ["resourceRules", "excludeResourceRules"] {
        for r in m
            .get_mut(list)
            .and_then(Value::as_array_mut)
            .into_iter()
            .flatten()
        {
            if r.is_object() && r.get("scope").is_none() {
                r["scope"] = json!("*");
            }
        }
    }
}

fn default_pod(obj: &mut Value) {
    let Some(spec) = obj.get_mut("spec").filter(|s| s.is_object()) else {
        return;
    };
    for (k, v) in [
        ("restartPolicy", json!("Always")),
        ("dnsPolicy", json!("ClusterFirst")),
        ("schedulerName", json!("default-scheduler")),
        ("terminationGracePeriodSeconds", json!(30)),
        ("enableServiceLinks", json!(true)),
        ("securityContext", json!({})),
    ] {
        if spec.get(k).is_none() {
            spec[k] = v;
        }
    }
    for list in ["containers", "initContainers"] {
        for c in spec
            .get_mut(list)
            .and_then(Value::as_array_mut)
            .into_iter()
            .flatten()
        {
            if !c.is_object() {
                continue;
            }
            if c.get("terminationMessagePath").is_none() {
                c["terminationMessagePath"] = json!("/dev/termination-log");
            }
            if c.get("terminationMessagePolicy").is_none() {
                c["terminationMessagePolicy"] = json!("File");
            }
            if c.get("imagePullPolicy").is_none() {
                let image = c["image"].as_str().unwrap_or("");
                let tag = image.rsplit('/').next().unwrap_or("");
                let latest = !tag.contains(':') || tag.ends_with(":latest");
                c["imagePullPolicy"] = json!(if latest && !image.contains('@') {
                    "Always"
                } else {
                    "IfNotPresent"
                });
            }
        }
    }
}

fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|l| {
            !l.is_empty()
                && l.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        })
}

/// Name validation (ValidateObjectMeta): DNS-1123 subdomain; namespaces a DNS-1123 label.
pub fn validate_metadata(rt: &ResourceType, obj: &Value) -> Vec<String> {
    let mut out = Vec::new();
    let name = meta_str(obj, "name");
    let label = rt.kind == "Namespace" && rt.group.is_empty();
    let ok = if label {
        name.len() <= 63 && !name.contains('.') && is_dns_subdomain(name)
    } else {
        is_dns_subdomain(name)
    };
    if !ok {
        let what = if label {
            "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
        } else {
            "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
        };
        out.push(format!("metadata.name: Invalid value: \"{name}\": {what}"));
    }
    out
}

/// DRAAdminAccess (k8s.io/kubernetes/pkg/registry/resource `AuthorizedForAdmin`): an `exactly`
/// request with `adminAccess: true` is only valid in a namespace labelled
/// `resource.kubernetes.io/admin-access: "true"`.
pub fn admin_access(st: &Store, rt: &ResourceType, obj: &Value) -> Vec<String> {
    let (prefix, spec) = match (rt.group.as_str(), rt.kind.as_str()) {
        ("resource.k8s.io", "ResourceClaim") => ("spec", obj.get("spec")),
        ("resource.k8s.io", "ResourceClaimTemplate") => ("spec.spec", obj.pointer("/spec/spec")),
        _ => return Vec::new(),
    };
    let ns = meta_str(obj, "namespace");
    let labelled = st
        .objects
        .get(&("/namespaces".to_string(), String::new(), ns.to_string()))
        .and_then(|n| n.pointer("/metadata/labels/resource.kubernetes.io~1admin-access"))
        .is_some_and(|v| v == "true");
    let mut out = Vec::new();
    for (i, r) in spec
        .and_then(|s| s.pointer("/devices/requests"))
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
    {
        if r.pointer("/exactly/adminAccess") == Some(&json!(true)) && !labelled {
            out.push(format!(
                "{prefix}.devices.requests[{i}].exactly.adminAccess: Forbidden: admin access to devices requires the `resource.kubernetes.io/admin-access: true` label on the containing namespace"
            ));
        }
    }
    out
}

/// Update validation: immutable fields.
pub fn validate_update(rt: &ResourceType, old: &Value, new: &Value) -> Vec<String> {
    let mut out = Vec::new();
    // k8s.io/kubernetes/pkg/apis/resource/validation: ValidateResourceClaimUpdate and
    // ValidateResourceClaimTemplateUpdate reject any change of spec ("field is immutable").
    if rt.group == "resource.k8s.io"
        && matches!(rt.kind.as_str(), "ResourceClaim" | "ResourceClaimTemplate")
        && old.get("spec") != new.get("spec")
    {
        out.push(format!(
            "spec: Invalid value: {}: field is immutable",
            crate::status::short_json(new.get("spec").unwrap_or(&Value::Null))
        ));
    }
    // Pod spec is immutable apart from a few fields; nodeName may only be set via binding.
    if rt.group.is_empty() && rt.kind == "Pod" {
        let strip = |v: &Value| {
            let mut s = v.get("spec").cloned().unwrap_or(Value::Null);
            if let Some(m) = s.as_object_mut() {
                for f in [
                    "activeDeadlineSeconds",
                    "tolerations",
                    "terminationGracePeriodSeconds",
                    "schedulingGates",
                ] {
                    m.remove(f);
                }
                if let Some(cs) = m.get_mut("containers").and_then(Value::as_array_mut) {
                    for c in cs {
                        if let Some(c) = c.as_object_mut() {
                            c.remove("image");
                        }
                    }
                }
            }
            s
        };
        if strip(old) != strip(new) {
            out.push("spec: Forbidden: pod updates may not change fields other than `spec.containers[*].image`,`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions to existing tolerations),`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)".to_string());
        }
    }
    out
}

/// Admission plugins for writes of the main resource: ResourceQuota, then
/// ValidatingAdmissionPolicy.
pub fn admit(
    core: &Core,
    st: &mut Store,
    rt: &ResourceType,
    old: Option<&Value>,
    new: &Value,
    opts: &WriteOptions,
) -> Result<(), ApiError> {
    vap::admit(core, st, rt, old, new, opts)?;
    if old.is_none() {
        quota::admit(core, st, rt, new, opts)?;
    }
    Ok(())
}
