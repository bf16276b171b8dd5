//! The Pod eviction subresource (policy/v1 Eviction), honouring PodDisruptionBudgets
//! (https://kubernetes.io/docs/concepts/scheduling-eviction/api-eviction/): a Pod covered by a
//! budget whose `status.disruptionsAllowed` is 0 is not evicted (`429 TooManyRequests`, cause
//! `DisruptionBudget`); otherwise the budget's allowance is decremented, the Pod recorded in
//! `status.disruptedPods`, and the Pod deleted. Terminal Pods are deleted without a check; a Pod
//! covered by more than one budget is a `500`.

use serde_json::{Value, json};

use crate::core::{Core, DeleteOptions, meta_str, now};
use crate::selectors::LabelSelector;
use crate::status::ApiError;

/// POST pods/{name}/eviction.
pub fn evict(core: &Core, ns: &str, name: &str, body: &Value) -> Result<Value, ApiError> {
    let prt = super::rt(core, "", "pods");
    let pdbrt = super::rt(core, "policy", "poddisruptionbudgets");
    let mut st = core.lock();
    let pod = st
        .objects
        .get(&("/pods".to_string(), ns.to_string(), name.to_string()))
        .cloned()
        .ok_or_else(|| ApiError::not_found(prt.gr(), name))?;
    let phase = pod
        .pointer("/status/phase")
        .and_then(Value::as_str)
        .unwrap_or("");
    let opts = DeleteOptions::from_body(body.get("deleteOptions").unwrap_or(&json!({})));
    if !matches!(phase, "Succeeded" | "Failed")
        && pod.pointer("/metadata/deletionTimestamp").is_none()
    {
        let pdbs: Vec<Value> = st
            .objects
            .iter()
            .filter(|(k, v)| {
                k.0 == "policy/poddisruptionbudgets"
                    && k.1 == ns
                    && LabelSelector::from_object(
                        v.pointer("/spec/selector").unwrap_or(&Value::Null),
                    )
                    .is_ok_and(|s| !s.0.is_empty() && s.matches_object(&pod))
            })
            .map(|(_, v)| v.clone())
            .collect();
        if pdbs.len() > 1 {
            return Err(ApiError::new(
                500,
                "InternalError",
                "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.",
            ));
        }
        if let Some(mut pdb) = pdbs.into_iter().next() {
            let allowed = pdb
                .pointer("/status/disruptionsAllowed")
                .and_then(Value::as_i64)
                .unwrap_or(0);
            if allowed <= 0 {
                let desired = pdb
                    .pointer("/status/desiredHealthy")
                    .and_then(Value::as_i64)
                    .unwrap_or(0);
                let current = pdb
                    .pointer("/status/currentHealthy")
                    .and_then(Value::as_i64)
                    .unwrap_or(0);
                return Err(ApiError {
                    details: Some(json!({"causes": [{"reason": "DisruptionBudget",
                        "message": format!("The disruption budget {} needs {desired} healthy pods and has {current} currently", meta_str(&pdb, "name"))}]})),
                    ..ApiError::new(
                        429,
                        "TooManyRequests",
                        "Cannot evict pod as it would violate the pod's disruption budget.",
                    )
                });
            }
            pdb["status"]["disruptionsAllowed"] = json!(allowed - 1);
            pdb["status"]["disruptedPods"][name] = json!(now());
            core.put_unchecked(&mut st, &pdbrt, pdb);
        }
    }
    core.delete_locked(&mut st, &prt, ns, name, &opts)?;
    drop(st);
    core.put_notify();
    Ok(
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}),
    )
}
