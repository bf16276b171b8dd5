//! Disruption controller: PodDisruptionBudget status from the matching Pods.
//!
//! `expectedPods` = matching Pods; `currentHealthy` = matching Pods that are Ready and not being
//! deleted; `desiredHealthy` = `minAvailable` (integer or percentage of expectedPods, rounded up)
//! or expectedPods - `maxUnavailable`; `disruptionsAllowed` = max(0, currentHealthy -
//! desiredHealthy). Simplification: the expected count comes from the Pods themselves, not from
//! their controllers' scale.

use serde_json::{Value, json};

use crate::core::{Core, meta_str};
use crate::selectors::LabelSelector;

fn ready(p: &Value) -> bool {
    p.pointer("/metadata/deletionTimestamp").is_none()
        && p.pointer("/status/conditions")
            .and_then(Value::as_array)
            .is_some_and(|cs| {
                cs.iter()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True")
            })
}

fn resolve(v: &Value, total: i64, round_up: bool) -> i64 {
    match v {
        Value::Number(n) => n.as_i64().unwrap_or(0),
        Value::String(s) if s.ends_with('%') => {
            let pct: i64 = s.trim_end_matches('%').parse().unwrap_or(0);
            if round_up {
                (pct * total + 99) / 100
            } else {
                pct * total / 100
            }
        }
        Value::String(s) => s.parse().unwrap_or(0),
        _ => 0,
    }
}

/// The status a PDB should have.
pub fn status_for(pdb: &Value, pods: &[Value]) -> Value {
    let ns = meta_str(pdb, "namespace");
    let sel = LabelSelector::from_object(pdb.pointer("/spec/selector").unwrap_or(&Value::Null))
        .unwrap_or_default();
    let matching: Vec<&Value> = pods
        .iter()
        .filter(|p| meta_str(p, "namespace") == ns && sel.matches_object(p))
        .collect();
    let expected = matching.len() as i64;
    let healthy = matching.iter().filter(|p| ready(p)).count() as i64;
    let desired = if let Some(min) = pdb.pointer("/spec/minAvailable") {
        resolve(min, expected, true)
    } else if let Some(max) = pdb.pointer("/spec/maxUnavailable") {
        (expected - resolve(max, expected, true)).max(0)
    } else {
        expected
    };
    let allowed = (healthy - desired).max(0);
    let gen_ = pdb
        .pointer("/metadata/generation")
        .cloned()
        .unwrap_or(json!(1));
    let disrupted = pdb.pointer("/status/disruptedPods").cloned();
    let mut status = json!({
        "observedGeneration": gen_, "expectedPods": expected, "currentHealthy": healthy,
        "desiredHealthy": desired, "disruptionsAllowed": allowed,
        "conditions": [{"type": "DisruptionAllowed", "status": if allowed > 0 {"True"} else {"False"},
            "reason": if allowed > 0 {"SufficientPods"} else {"InsufficientPods"}, "message": "",
            "observedGeneration": gen_,
            "lastTransitionTime": pdb.pointer("/status/conditions/0/lastTransitionTime").cloned().unwrap_or(json!(crate::core::now()))}],
    });
    // Pods evicted but not yet gone stay counted as disrupted.
    if let Some(d) = disrupted.filter(|d| d.as_object().is_some_and(|m| !m.is_empty())) {
        let still: serde_json::Map<String, Value> = d
            .as_object()
            .into_iter()
            .flatten()
            .filter(|(name, _)| {
                matching
                    .iter()
                    .any(|p| meta_str(p, "name") == name.as_str())
            })
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        if !still.is_empty() {
            status["disruptedPods"] = Value::Object(still.clone());
            status["disruptionsAllowed"] = json!((allowed - still.len() as i64).max(0));
        }
    }
    status
}

/// One pass.
pub fn reconcile(core: &Core) {
    let prt = super::rt(core, "policy", "poddisruptionbudgets");
    let mut st = core.lock();
    let pods: Vec<Value> = st
        .objects
        .iter()
        .filter(|(k, _)| k.0 == "/pods")
        .map(|(_, v)| v.clone())
        .collect();
    let pdbs: Vec<Value> = st
        .objects
        .iter()
        .filter(|(k, _)| k.0 == "policy/poddisruptionbudgets")
        .map(|(_, v)| v.clone())
        .collect();
    for mut pdb in pdbs {
        let mut status = status_for(&pdb, &pods);
        if let (Some(old), Some(new)) = (
            pdb.pointer("/status/conditions/0"),
            status.pointer_mut("/conditions/0"),
        ) && old["status"] == new["status"]
        {
            new["lastTransitionTime"] = old["lastTransitionTime"].clone();
        }
        if pdb.get("status") != Some(&status) {
            pdb["status"] = status;
            core.put_unchecked(&mut st, &prt, pdb);
        }
    }
}
