//! Namespace controller: deleting a namespace deletes its contents, then removes the
//! `kubernetes` finalizer (`spec.finalizers`), after which the namespace goes away
//! (https://kubernetes.io/docs/concepts/overview/working-with-objects/namespaces/).

use serde_json::{Value, json};

use crate::core::{Core, DeleteOptions, WriteOptions, Written, finalizers, meta_str};
use crate::status::ApiError;

/// One pass.
pub fn reconcile(core: &Core) {
    let terminating: Vec<Value> = super::objects(core, "/namespaces")
        .into_iter()
        .filter(|n| n.pointer("/metadata/deletionTimestamp").is_some())
        .collect();
    for ns in terminating {
        let name = meta_str(&ns, "name").to_string();
        let mut st = core.lock();
        let rv_before = st.rv;
        let contents: Vec<(String, String)> = st
            .objects
            .iter()
            .filter(|(k, _)| k.1 == name)
            .map(|(k, v)| (k.0.clone(), meta_str(v, "name").to_string()))
            .collect();
        let mut remaining = 0;
        for (res, obj_name) in &contents {
            let Some(rt) = core
                .registry
                .types
                .iter()
                .find(|t| &t.key() == res)
                .cloned()
            else {
                continue;
            };
            match core.delete_locked(&mut st, &rt, &name, obj_name, &DeleteOptions::default()) {
                Ok(v)
                    if v.pointer("/metadata/deletionTimestamp").is_some()
                        && st.objects.contains_key(&(
                            res.clone(),
                            name.clone(),
                            obj_name.clone(),
                        )) =>
                {
                    remaining += 1
                }
                _ => {}
            }
        }
        let mut changed = st.rv != rv_before;
        if remaining == 0 && st.objects.iter().all(|(k, _)| k.1 != name) {
            let nrt = super::rt(core, "", "namespaces");
            let key = ("/namespaces".to_string(), String::new(), name.clone());
            if let Some(mut n) = st.objects.get(&key).cloned() {
                let had_spec_finalizers = n["spec"]["finalizers"]
                    .as_array()
                    .is_some_and(|a| !a.is_empty());
                n["spec"]["finalizers"] = json!([]);
                if finalizers(&n).is_empty() {
                    st.remove(&key);
                    changed = true;
                } else if had_spec_finalizers {
                    core.put_unchecked(&mut st, &nrt, n);
                }
            }
        }
        drop(st);
        if changed {
            core.put_notify();
        }
    }
}

/// PUT namespaces/{name}/finalize: replaces `spec.finalizers`; a terminating namespace without
/// finalizers is removed.
pub fn finalize(core: &Core, name: &str, body: &Value) -> Result<Written, ApiError> {
    let nrt = super::rt(core, "", "namespaces");
    let mut st = core.lock();
    let key = ("/namespaces".to_string(), String::new(), name.to_string());
    let mut n = st
        .objects
        .get(&key)
        .cloned()
        .ok_or_else(|| ApiError::not_found(nrt.gr(), name))?;
    n["spec"]["finalizers"] = body
        .pointer("/spec/finalizers")
        .cloned()
        .unwrap_or(json!([]));
    let empty = n["spec"]["finalizers"].as_array().is_none_or(Vec::is_empty);
    if empty && n.pointer("/metadata/deletionTimestamp").is_some() && finalizers(&n).is_empty() {
        let removed = st.remove(&key).unwrap_or(n);
        drop(st);
        core.put_notify();
        return Ok(Written {
            object: removed,
            created: false,
            warnings: Vec::new(),
        });
    }
    let _ = WriteOptions::default();
    let object = core.put_unchecked(&mut st, &nrt, n);
    Ok(Written {
        object,
        created: false,
        warnings: Vec::new(),
    })
}
