//! Garbage collector: background cascading deletion by ownerReferences
//! (https://kubernetes.io/docs/concepts/architecture/garbage-collection/).
//!
//! An owner reference is dangling when no object of its kind with its name (in the dependent's
//! namespace for a namespaced owner; cluster-wide for a cluster-scoped owner) has its uid. A
//! dependent whose owner references all dangle is deleted (finalizers honoured); dangling
//! references beside a live owner are removed. References to kinds the stand-in does not serve
//! are left alone.
//!
//! Foreground deletion: an owner being deleted with the `foregroundDeletion` finalizer has its
//! dependents deleted; once none is left, the finalizer is removed (and the owner with it).

use serde_json::{Value, json};

use crate::core::{Core, DeleteOptions, meta_str, owner_refs};
use crate::store::ObjKey;

/// One pass.
pub fn reconcile(core: &Core) {
    let mut st = core.lock();
    let dependents: Vec<(ObjKey, Value)> = st
        .objects
        .iter()
        .filter(|(_, v)| !owner_refs(v).is_empty())
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let mut changed = false;
    for (key, obj) in dependents {
        let refs = owner_refs(&obj);
        let mut dangling = Vec::new();
        let mut unknown = 0;
        for r in &refs {
            let av = r["apiVersion"].as_str().unwrap_or("");
            let kind = r["kind"].as_str().unwrap_or("");
            let group = av.rsplit_once('/').map(|(g, _)| g).unwrap_or("");
            let Some(ort) = core
                .registry
                .by_kind(av, kind)
                .or_else(|| core.registry.by_group_kind(group, kind))
            else {
                unknown += 1;
                continue;
            };
            let ons = if ort.namespaced {
                key.1.clone()
            } else {
                String::new()
            };
            let okey = (ort.key(), ons, r["name"].as_str().unwrap_or("").to_string());
            let alive = st
                .objects
                .get(&okey)
                .is_some_and(|o| meta_str(o, "uid") == r["uid"].as_str().unwrap_or(""));
            if !alive {
                dangling.push(r.clone());
            }
        }
        if dangling.is_empty() {
            continue;
        }
        let Some(rt) = core
            .registry
            .types
            .iter()
            .find(|t| t.key() == key.0)
            .cloned()
        else {
            continue;
        };
        if dangling.len() + unknown == refs.len() && unknown == 0 {
            if obj.pointer("/metadata/deletionTimestamp").is_none() {
                let _ = core.delete_locked(&mut st, &rt, &key.1, &key.2, &DeleteOptions::default());
                changed = true;
            }
        } else {
            let mut o = obj.clone();
            let keep: Vec<Value> = refs.into_iter().filter(|r| !dangling.contains(r)).collect();
            o["metadata"]["ownerReferences"] = json!(keep);
            st.put(key, o);
            changed = true;
        }
    }
    // Foreground deletion.
    let owners: Vec<(ObjKey, Value)> = st
        .objects
        .iter()
        .filter(|(_, v)| {
            v.pointer("/metadata/deletionTimestamp").is_some()
                && crate::core::finalizers(v)
                    .iter()
                    .any(|f| f == "foregroundDeletion")
        })
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    for (okey, owner) in owners {
        let uid = meta_str(&owner, "uid").to_string();
        let deps: Vec<(ObjKey, bool)> = st
            .objects
            .iter()
            .filter(|(_, v)| owner_refs(v).iter().any(|r| r["uid"] == json!(uid)))
            .map(|(k, v)| {
                (
                    k.clone(),
                    v.pointer("/metadata/deletionTimestamp").is_some(),
                )
            })
            .collect();
        for (dkey, deleting) in &deps {
            if *deleting {
                continue;
            }
            if let Some(rt) = core
                .registry
                .types
                .iter()
                .find(|t| t.key() == dkey.0)
                .cloned()
            {
                let _ =
                    core.delete_locked(&mut st, &rt, &dkey.1, &dkey.2, &DeleteOptions::default());
                changed = true;
            }
        }
        let still = st
            .objects
            .iter()
            .any(|(_, v)| owner_refs(v).iter().any(|r| r["uid"] == json!(uid)));
        if !still {
            let mut o = owner.clone();
            let left: Vec<String> = crate::core::finalizers(&o)
                .into_iter()
                .filter(|f| f != "foregroundDeletion")
                .collect();
            if left.is_empty() {
                st.remove(&okey);
            } else {
                o["metadata"]["finalizers"] = json!(left);
                st.put(okey, o);
            }
            changed = true;
        }
    }
    drop(st);
    if changed {
        core.put_notify();
    }
}
