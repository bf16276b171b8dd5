//! JSON merge patch (RFC 7386), JSON patch (RFC 6902) and strategic merge patch
//! (k8s.io/apimachinery/pkg/util/strategicpatch) for the built-in kinds, driven by the
//! `x-kubernetes-patch-strategy` / `x-kubernetes-patch-merge-key` extensions of the upstream
//! OpenAPI schema.
//!
//! Strategic merge patch supports: recursive map merge, `null` deletes a field, lists with patch
//! strategy `merge` and a merge key (items merged by key, `$patch: delete` removes an item),
//! primitive lists with strategy `merge` (union), `$patch: replace` on maps,
//! `$deleteFromPrimitiveList/<field>`, `$retainKeys`; `$setElementOrder` directives are accepted
//! and ignored (the result keeps the live order with new items appended).

use serde_json::{Map, Value};

use crate::ssa::{Nav, Node};
use crate::status::ApiError;

/// The Content-Type of a PATCH.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchType {
    /// `application/merge-patch+json`.
    Merge,
    /// `application/json-patch+json`.
    Json,
    /// `application/strategic-merge-patch+json`.
    Strategic,
    /// `application/apply-patch+yaml` (server-side apply).
    Apply,
}

impl PatchType {
    /// From a Content-Type header.
    pub fn from_content_type(ct: &str) -> Option<PatchType> {
        let ct = ct.split(';').next().unwrap_or("").trim();
        match ct {
            "application/merge-patch+json" => Some(PatchType::Merge),
            "application/json-patch+json" => Some(PatchType::Json),
            "application/strategic-merge-patch+json" => Some(PatchType::Strategic),
            "application/apply-patch+yaml" | "application/apply-patch+json" => {
                Some(PatchType::Apply)
            }
            _ => None,
        }
    }
}

/// RFC 7386 merge patch.
pub fn merge(target: &Value, patch: &Value) -> Value {
    let mut out = target.clone();
    json_patch::merge(&mut out, patch);
    out
}

/// RFC 6902 JSON patch; a failing operation is a 422 like the API server's.
pub fn json(target: &Value, patch: &Value) -> Result<Value, ApiError> {
    let ops: json_patch::Patch = serde_json::from_value(patch.clone()).map_err(|e| {
        ApiError::bad_request(format!(
            "the server rejected our request due to an error in our request: {e}"
        ))
    })?;
    let mut out = target.clone();
    json_patch::patch(&mut out, &ops).map_err(|e| ApiError::new(422, "Invalid", e.to_string()))?;
    Ok(out)
}

/// Strategic merge patch.
pub fn strategic(nav: &Nav<'_>, target: &Value, patch: &Value) -> Result<Value, ApiError> {
    if !patch.is_object() {
        return Err(ApiError::bad_request(
            "strategic merge patch must be an object",
        ));
    }
    Ok(smp_object(nav.root(), target, patch))
}

fn smp_object(node: Node<'_>, target: &Value, patch: &Value) -> Value {
    let Some(p) = patch.as_object() else {
        return patch.clone();
    };
    if p.get("$patch").and_then(Value::as_str) == Some("replace") {
        let mut r = p.clone();
        r.remove("$patch");
        return Value::Object(r);
    }
    let mut out: Map<String, Value> = target.as_object().cloned().unwrap_or_default();
    if let Some(Value::Array(keep)) = p.get("$retainKeys") {
        out.retain(|k, _| keep.iter().any(|x| x.as_str() == Some(k)));
    }
    for (k, v) in p {
        if let Some(field) = k.strip_prefix("$deleteFromPrimitiveList/") {
            if let (Some(Value::Array(cur)), Value::Array(del)) = (out.get_mut(field), v) {
                cur.retain(|x| !del.contains(x));
            }
            continue;
        }
        if k.starts_with('$') {
            continue;
        }
        if v.is_null() {
            out.remove(k);
            continue;
        }
        let child = node.field(k);
        let merged = match (out.get(k), v) {
            (Some(Value::Array(cur)), Value::Array(items)) if child.patch_merge() => {
                Value::Array(smp_list(child, cur, items))
            }
            (Some(cur @ Value::Object(_)), Value::Object(_)) => smp_object(child, cur, v),
            (None, Value::Object(_)) => smp_object(child, &Value::Object(Map::new()), v),
            _ => strip_directives(v),
        };
        out.insert(k.clone(), merged);
    }
    Value::Object(out)
}

fn strip_directives(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(k, _)| !k.starts_with('$'))
                .map(|(k, v)| (k.clone(), strip_directives(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(
            a.iter()
                .filter(|i| i.get("$patch").is_none())
                .map(strip_directives)
                .collect(),
        ),
        _ => v.clone(),
    }
}

fn smp_list(node: Node<'_>, cur: &[Value], items: &[Value]) -> Vec<Value> {
    let mut out = cur.to_vec();
    match node.patch_merge_key() {
        Some(key) => {
            let inode = node.items();
            for item in items {
                let k = item.get(key);
                let pos = out.iter().position(|x| x.get(key) == k);
                if item.get("$patch").and_then(Value::as_str) == Some("delete") {
                    if let Some(i) = pos {
                        out.remove(i);
                    }
                    continue;
                }
                match pos {
                    Some(i) => out[i] = smp_object(inode, &out[i], item),
                    None => out.push(strip_directives(item)),
                }
            }
        }
        None => {
            for item in items {
                if !out.contains(item) {
                    out.push(item.clone());
                }
            }
        }
    }
    out
}
