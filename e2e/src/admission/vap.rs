//! ValidatingAdmissionPolicy (admissionregistration.k8s.io/v1), evaluated with
//! `kube_cel::VapEvaluator`.
//!
//! Implemented (https://kubernetes.io/docs/reference/access-authn-authz/validating-admission-policy/):
//! a binding (`spec.policyName`) applies its policy to CREATE and UPDATE requests matched by the
//! policy's `matchConstraints` (resourceRules: apiGroups, apiVersions, resources, operations;
//! namespaceSelector; objectSelector; excludeResourceRules) and the binding's `matchResources`
//! (same fields; when set it further restricts); `matchConditions` (all must be true); params via
//! `paramKind` + `paramRef` (`name` or `selector`, `namespace` defaulting to the request's namespace
//! for namespaced params, `parameterNotFoundAction` Deny/Allow); `validations` with `message`,
//! `messageExpression` and `reason` (default Forbidden → 403; Invalid → 422; Unauthorized → 401;
//! RequestEntityTooLarge → 413); `validationActions` Deny (reject), Warn (warning header), Audit
//! (ignored); `failurePolicy` Fail (default: an evaluation error rejects) and Ignore; `namespaceObject`.
//! Rejection message: `ValidatingAdmissionPolicy '<policy>' with binding '<binding>' denied
//! request: <message>`.
//!
//! `spec.variables` are inlined into the expressions that use them
//! (`teamgpu::plan::admission::inline_variables`). Not implemented: `auditAnnotations`,
//! `authorizer`, DELETE/CONNECT operations, policy `status.typeChecking`.

use serde_json::{Value, json};

use crate::core::{Core, WriteOptions, meta_str};
use crate::resources::ResourceType;
use crate::selectors::{LabelSelector, labels_of};
use crate::status::ApiError;
use crate::store::Store;

fn strs(v: &Value) -> Vec<&str> {
    v.as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

fn rule_matches(rule: &Value, rt: &ResourceType, op: &str) -> bool {
    let any = |list: Vec<&str>, x: &str| list.iter().any(|v| *v == "*" || *v == x);
    any(strs(&rule["apiGroups"]), &rt.group)
        && any(strs(&rule["apiVersions"]), &rt.version)
        && any(strs(&rule["resources"]), &rt.plural)
        && any(strs(&rule["operations"]), op)
        && match rule["scope"].as_str() {
            Some("Namespaced") => rt.namespaced,
            Some("Cluster") => !rt.namespaced,
            _ => true,
        }
}

fn selector_matches(sel: &Value, labels: &Value) -> bool {
    if sel.is_null() {
        return true;
    }
    match LabelSelector::from_object(sel) {
        Ok(s) => s.matches(&labels_of(&json!({"metadata": {"labels": labels}}))),
        Err(_) => false,
    }
}

/// Whether `match` (matchConstraints or matchResources) selects this request.
fn resources_match(
    m: &Value,
    rt: &ResourceType,
    op: &str,
    obj: &Value,
    ns_obj: Option<&Value>,
) -> bool {
    let rules = m["resourceRules"].as_array();
    if let Some(rules) = rules
        && !rules.iter().any(|r| rule_matches(r, rt, op))
    {
        return false;
    }
    if m["excludeResourceRules"]
        .as_array()
        .is_some_and(|ex| ex.iter().any(|r| rule_matches(r, rt, op)))
    {
        return false;
    }
    if rt.namespaced
        && let Some(ns) = ns_obj
        && !selector_matches(&m["namespaceSelector"], &ns["metadata"]["labels"])
    {
        return false;
    }
    selector_matches(&m["objectSelector"], &obj["metadata"]["labels"])
}

fn expressions(list: &Value) -> Vec<kube_cel::VapExpression> {
    list.as_array()
        .into_iter()
        .flatten()
        .map(|v| kube_cel::VapExpression {
            expression: v["expression"].as_str().unwrap_or("").to_string(),
            message: v["message"].as_str().map(String::from),
            message_expression: v["messageExpression"].as_str().map(String::from),
        })
        .collect()
}

fn reason_code(reason: &str) -> u16 {
    match reason {
        "Invalid" => 422,
        "Unauthorized" => 401,
        "RequestEntityTooLarge" => 413,
        _ => 403,
    }
}

/// Evaluates every binding on a CREATE or UPDATE.
pub fn admit(
    core: &Core,
    st: &mut Store,
    rt: &ResourceType,
    old: Option<&Value>,
    new: &Value,
    opts: &WriteOptions,
) -> Result<(), ApiError> {
    let bindings: Vec<Value> = st
        .objects
        .iter()
        .filter(|((r, _, _), _)| {
            r == "admissionregistration.k8s.io/validatingadmissionpolicybindings"
        })
        .map(|(_, v)| v.clone())
        .collect();
    if bindings.is_empty() {
        return Ok(());
    }
    let op = if old.is_some() { "UPDATE" } else { "CREATE" };
    let ns = meta_str(new, "namespace").to_string();
    let ns_obj = st
        .objects
        .get(&("/namespaces".to_string(), String::new(), ns.clone()))
        .cloned();
    let name = meta_str(new, "name").to_string();
    for binding in bindings {
        let policy_name = binding
            .pointer("/spec/policyName")
            .and_then(Value::as_str)
            .unwrap_or("");
        let Some(policy) = st
            .objects
            .get(&(
                "admissionregistration.k8s.io/validatingadmissionpolicies".to_string(),
                String::new(),
                policy_name.to_string(),
            ))
            .cloned()
        else {
            continue;
        };
        let spec = &policy["spec"];
        if !resources_match(&spec["matchConstraints"], rt, op, new, ns_obj.as_ref()) {
            continue;
        }
        let bspec = &binding["spec"];
        if !bspec["matchResources"].is_null()
            && !resources_match(&bspec["matchResources"], rt, op, new, ns_obj.as_ref())
        {
            continue;
        }
        let fail_closed = spec["failurePolicy"].as_str() != Some("Ignore");
        let actions = strs(&bspec["validationActions"]);
        let deny = actions.contains(&"Deny");
        let warn = actions.contains(&"Warn");
        let denied = |msg: String, reason: &str| {
            let full = format!(
                "ValidatingAdmissionPolicy '{policy_name}' with binding '{}' denied request: {msg}",
                meta_str(&binding, "name")
            );
            ApiError {
                details: Some(json!({"name": name, "group": rt.group, "kind": rt.plural})),
                ..ApiError::new(
                    reason_code(reason),
                    reason,
                    format!("{} \"{name}\" is forbidden: {full}", rt.gr().qualified()),
                )
            }
        };
        // Params.
        let mut params_list: Vec<Option<Value>> = vec![None];
        if let Some(pk) = spec.get("paramKind").filter(|p| p.is_object()) {
            let pref = &bspec["paramRef"];
            let prt = core.registry.by_kind(
                pk["apiVersion"].as_str().unwrap_or(""),
                pk["kind"].as_str().unwrap_or(""),
            );
            let found: Vec<Value> = match (prt, pref.is_object()) {
                (Some(prt), true) => {
                    let pns = match pref["namespace"].as_str() {
                        Some(n) if !n.is_empty() => n.to_string(),
                        _ if prt.namespaced => ns.clone(),
                        _ => String::new(),
                    };
                    st.objects
                        .iter()
                        .filter(|((r, ons, oname), obj)| {
                            *r == prt.key()
                                && *ons == pns
                                && match pref["name"].as_str() {
                                    Some(n) => n == oname,
                                    None => selector_matches(
                                        &pref["selector"],
                                        &obj["metadata"]["labels"],
                                    ),
                                }
                        })
                        .map(|(_, v)| v.clone())
                        .collect()
                }
                _ => Vec::new(),
            };
            if found.is_empty() {
                if pref["parameterNotFoundAction"].as_str() == Some("Allow") {
                    continue;
                }
                if deny {
                    return Err(denied(
                        "failed to configure binding: no params found for policy binding with `Deny` parameterNotFoundAction".into(),
                        "Forbidden",
                    ));
                }
                continue;
            }
            params_list = found.into_iter().map(Some).collect();
        }
        for params in params_list {
            let mut b = kube_cel::VapEvaluator::builder()
                .object(new.clone())
                .request(kube_cel::AdmissionRequest {
                    operation: op.into(),
                    name: name.clone(),
                    namespace: ns.clone(),
                    dry_run: opts.dry_run,
                    kind: kube_cel::GroupVersionKind {
                        group: rt.group.clone(),
                        version: rt.version.clone(),
                        kind: rt.kind.clone(),
                    },
                    resource: kube_cel::GroupVersionResource {
                        group: rt.group.clone(),
                        version: rt.version.clone(),
                        resource: rt.plural.clone(),
                    },
                    ..Default::default()
                });
            if let Some(o) = old {
                b = b.old_object(o.clone());
            }
            if let Some(p) = &params {
                b = b.params(p.clone());
            }
            if let Some(n) = &ns_obj {
                b = b.namespace_object(n.clone());
            }
            let eval = b.build();
            // `spec.variables`: kube-cel's evaluator has none, so each use is inlined (the same
            // result as Kubernetes' lazy evaluation; only the cost differs).
            let variables: Vec<(&str, &str)> = spec["variables"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|v| {
                    (
                        v["name"].as_str().unwrap_or(""),
                        v["expression"].as_str().unwrap_or(""),
                    )
                })
                .collect();
            let inline =
                |mut list: Vec<kube_cel::VapExpression>| -> Option<Vec<kube_cel::VapExpression>> {
                    for e in &mut list {
                        e.expression =
                            teamgpu::plan::admission::inline_variables(&variables, &e.expression)?;
                        if let Some(m) = &e.message_expression {
                            e.message_expression =
                                Some(teamgpu::plan::admission::inline_variables(&variables, m)?);
                        }
                    }
                    Some(list)
                };
            let (Some(conds), Some(checks)) = (
                inline(expressions(&spec["matchConditions"])),
                inline(expressions(&spec["validations"])),
            ) else {
                if fail_closed && deny {
                    return Err(denied(
                        "spec.variables refer to each other in a cycle".into(),
                        "Forbidden",
                    ));
                }
                continue;
            };
            // matchConditions: all must be true; an error follows failurePolicy.
            let cond_results = eval.evaluate(&conds);
            if cond_results.iter().any(|r| !r.passed) {
                let errored = cond_results.iter().any(|r| {
                    !r.passed
                        && r.message.as_deref().is_some_and(|m| {
                            m.starts_with("evaluation error:") || m.starts_with("failed to compile")
                        })
                });
                if errored && fail_closed && deny {
                    return Err(denied(
                        "match condition evaluation failed".into(),
                        "Forbidden",
                    ));
                }
                continue;
            }
            let validations = spec["validations"].as_array().cloned().unwrap_or_default();
            let results = eval.evaluate(&checks);
            for (v, r) in validations.iter().zip(results) {
                if r.passed {
                    continue;
                }
                let raw = r.message.clone().unwrap_or_default();
                let is_error = raw.starts_with("evaluation error:")
                    || raw.starts_with("expression returned non-boolean")
                    || raw.starts_with("failed to compile VAP expression");
                let expr = v["expression"].as_str().unwrap_or("");
                let msg = if is_error {
                    format!("expression '{expr}' resulted in error: {raw}")
                } else if v.get("message").is_none() && v.get("messageExpression").is_none() {
                    format!("failed expression: {expr}")
                } else {
                    raw
                };
                if is_error && !fail_closed {
                    continue;
                }
                if deny {
                    return Err(denied(msg, v["reason"].as_str().unwrap_or("Forbidden")));
                }
                if warn {
                    tracing::warn!(policy = policy_name, "{msg}");
                }
            }
        }
    }
    Ok(())
}
