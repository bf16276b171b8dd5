//! ResourceQuota admission and usage, as Kubernetes counts it.
//!
//! Usage of a ResourceClaim comes from `teamgpu::plan::usage::quota_usage`, which mirrors the
//! upstream evaluator `pkg/quota/v1/evaluator/core/resource_claims.go`:
//! `count/resourceclaims.resource.k8s.io` = 1 and `<class>.deviceclass.resource.k8s.io/devices`
//! = `count` for ExactCount, 32 (`AllocationResultsMaxSize`) for All, and for `firstAvailable`
//! the largest subrequest per class. Pods are charged `pods` and `count/pods` unless terminal
//! (Succeeded/Failed). Every other kind is charged `count/<resource>[.<group>]`.
//!
//! Admission (k8s.io/apiserver/pkg/admission/plugin/resourcequota/controller.go): for each quota
//! of the namespace that constrains a resource the new object uses, `status.used + usage` must
//! not exceed `status.hard`, else `403 Forbidden` with `exceeded quota: <quota>, requested: ...,
//! used: ..., limited: ...` (`hard` from `spec.hard`, `used` recounted from the live objects under
//! the store lock); on success the quota's `status.used` is updated in the same step (as the
//! admission plugin does). The quota controller (`crate::controllers`) recalculates
//! `status.used` from the live objects after every change (replenishment).
//!
//! Not implemented: quota `scopes`/`scopeSelector`, `requests.*`/`limits.*` compute resources,
//! and the "status unknown for quota" rejection (a quota whose status was not yet computed is
//! computed on the spot).

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::ResourceClaimSpec;
use serde_json::{Value, json};

use crate::core::{Core, WriteOptions, meta_str};
use crate::resources::ResourceType;
use crate::status::ApiError;
use crate::store::Store;

/// Parses an integral quantity (`4`, `2k`, `1Ki`, `1500m` rounds up) to an integer.
pub fn parse_quantity(s: &str) -> Option<u64> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, suffix) = s.split_at(split);
    let x: f64 = num.parse().ok()?;
    let mult: f64 = match suffix {
        "" => 1.0,
        "m" => 0.001,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "Ki" => 1024.0,
        "Mi" => 1024.0 * 1024.0,
        "Gi" => 1024.0 * 1024.0 * 1024.0,
        _ => return None,
    };
    Some((x * mult).ceil() as u64)
}

fn quantity_of(v: &Value) -> u64 {
    match v {
        Value::String(s) => parse_quantity(s).unwrap_or(0),
        Value::Number(n) => n.as_u64().unwrap_or(0),
        _ => 0,
    }
}

/// The quota usage of one object.
pub fn usage(rt: &ResourceType, obj: &Value) -> BTreeMap<String, u64> {
    let mut u = BTreeMap::new();
    let count_name = if rt.group.is_empty() {
        format!("count/{}", rt.plural)
    } else {
        format!("count/{}.{}", rt.plural, rt.group)
    };
    match (rt.group.as_str(), rt.kind.as_str()) {
        ("resource.k8s.io", "ResourceClaim") => {
            match serde_json::from_value::<ResourceClaimSpec>(
                obj.get("spec").cloned().unwrap_or(json!({})),
            ) {
                Ok(spec) => u.extend(teamgpu::plan::usage::quota_usage(&spec)),
                Err(_) => {
                    u.insert(count_name, 1);
                }
            }
        }
        ("", "Pod") => {
            let phase = obj
                .pointer("/status/phase")
                .and_then(Value::as_str)
                .unwrap_or("");
            if !matches!(phase, "Succeeded" | "Failed") {
                u.insert("pods".into(), 1);
                u.insert(count_name, 1);
            }
        }
        _ => {
            u.insert(count_name, 1);
        }
    }
    u
}

fn pretty(m: &BTreeMap<String, u64>) -> String {
    m.iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// The `status.used` a quota should have: usage summed over the live objects of its namespace,
/// for the resources of `spec.hard`.
pub fn compute_used(core: &Core, st: &Store, quota: &Value) -> BTreeMap<String, u64> {
    let ns = meta_str(quota, "namespace");
    let hard: Vec<String> = quota
        .pointer("/spec/hard")
        .and_then(Value::as_object)
        .map(|m| m.keys().cloned().collect())
        .unwrap_or_default();
    let mut used: BTreeMap<String, u64> = hard.iter().map(|k| (k.clone(), 0)).collect();
    for ((res, ons, _), obj) in &st.objects {
        if ons != ns {
            continue;
        }
        let Some(rt) = core.registry.types.iter().find(|t| &t.key() == res) else {
            continue;
        };
        for (k, v) in usage(rt, obj) {
            if let Some(u) = used.get_mut(&k) {
                *u += v;
            }
        }
    }
    used
}

/// The status a quota should have.
pub fn status_for(core: &Core, st: &Store, quota: &Value) -> Value {
    let used = compute_used(core, st, quota);
    json!({
        "hard": quota.pointer("/spec/hard").cloned().unwrap_or(json!({})),
        "used": used.iter().map(|(k, v)| (k.clone(), json!(v.to_string()))).collect::<serde_json::Map<_, _>>(),
    })
}

/// Quota admission of a create.
pub fn admit(
    core: &Core,
    st: &mut Store,
    rt: &ResourceType,
    obj: &Value,
    opts: &WriteOptions,
) -> Result<(), ApiError> {
    if !rt.namespaced {
        return Ok(());
    }
    let ns = meta_str(obj, "namespace").to_string();
    let requested = usage(rt, obj);
    let quotas: Vec<Value> = st
        .objects
        .iter()
        .filter(|((res, ons, _), _)| res == "/resourcequotas" && *ons == ns)
        .map(|(_, v)| v.clone())
        .collect();
    let mut updates = Vec::new();
    for mut q in quotas {
        let hard: BTreeMap<String, u64> = q
            .pointer("/spec/hard")
            .and_then(Value::as_object)
            .map(|m| m.iter().map(|(k, v)| (k.clone(), quantity_of(v))).collect())
            .unwrap_or_default();
        let relevant: Vec<&String> = requested.keys().filter(|k| hard.contains_key(*k)).collect();
        if relevant.is_empty() {
            continue;
        }
        // Usage is recounted from the live objects under the store lock rather than read from a
        // possibly stale `status.used` (Kubernetes keeps status.used exact through the admission
        // increments and the quota controller; with a status not yet computed it refuses with
        // "status unknown for quota", which this stand-in never does).
        let used = compute_used(core, st, &q);
        let mut exceeded = Vec::new();
        for k in &relevant {
            let u = used.get(*k).copied().unwrap_or(0);
            if u + requested[*k] > hard[*k] {
                exceeded.push((*k).clone());
            }
        }
        if !exceeded.is_empty() {
            let mask = |m: &BTreeMap<String, u64>| -> BTreeMap<String, u64> {
                exceeded
                    .iter()
                    .map(|k| (k.clone(), m.get(k).copied().unwrap_or(0)))
                    .collect()
            };
            return Err(ApiError::forbidden(
                rt.gr(),
                meta_str(obj, "name"),
                &format!(
                    "exceeded quota: {}, requested: {}, used: {}, limited: {}",
                    meta_str(&q, "name"),
                    pretty(&mask(&requested)),
                    pretty(&mask(&used)),
                    pretty(&mask(&hard))
                ),
            ));
        }
        let mut new_used: serde_json::Map<String, Value> = used
            .iter()
            .map(|(k, v)| (k.clone(), json!(v.to_string())))
            .collect();
        for k in relevant {
            let u = used.get(k).copied().unwrap_or(0) + requested[k];
            new_used.insert(k.clone(), json!(u.to_string()));
        }
        q["status"]["hard"] = q.pointer("/spec/hard").cloned().unwrap_or(json!({}));
        q["status"]["used"] = Value::Object(new_used);
        updates.push(q);
    }
    if opts.dry_run {
        return Ok(());
    }
    let qrt = core
        .registry
        .by_path("", "v1", "resourcequotas")
        .expect("resourcequotas served")
        .clone();
    for q in updates {
        core.put_unchecked(st, &qrt, q);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities() {
        assert_eq!(parse_quantity("4"), Some(4));
        assert_eq!(parse_quantity("2k"), Some(2000));
        assert_eq!(parse_quantity("1Ki"), Some(1024));
        assert_eq!(parse_quantity("1500m"), Some(2));
        assert_eq!(parse_quantity("x"), None);
    }
}
