//! The resourceclaim controller's job (pkg/controller/resourceclaim/controller.go):
//!
//! * for each Pod entry `spec.resourceClaims[].resourceClaimTemplateName`, create a
//!   ResourceClaim from the template (generateName `<pod>-<claim>-`, annotation
//!   `resource.kubernetes.io/pod-claim-name`, owner reference to the Pod with `controller` and
//!   `blockOwnerDeletion`, the template's labels and annotations) through the normal create path
//!   (so quota and ValidatingAdmissionPolicies apply), and record it in the Pod's
//!   `status.resourceClaimStatuses`;
//! * when the create fails (e.g. `exceeded quota`), record a Warning Event
//!   `FailedResourceClaimCreation` on the Pod, set the Pod condition `PodScheduled=False` with
//!   the error as message, leave the Pod Pending and retry with per-Pod exponential backoff
//!   (the workqueue's default 5 ms · 2^n, capped at 1000 s);
//! * drop `status.reservedFor` entries of Pods that are gone or terminal, and deallocate a claim
//!   whose `reservedFor` becomes empty.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::core::{Core, WriteOptions, meta_str, now};
use crate::status::ApiError;

const MANAGER: &str = "resourceclaim-controller";

/// Backoff state of the controller.
#[derive(Debug, Default)]
pub struct ClaimController {
    /// Pod uid -> (failures, next attempt).
    backoff: HashMap<String, (u32, Instant)>,
}

impl ClaimController {
    /// Time until the earliest retry.
    pub fn next_retry(&self) -> Option<Duration> {
        let now = Instant::now();
        self.backoff
            .values()
            .map(|(_, at)| at.saturating_duration_since(now))
            .min()
    }

    /// One pass.
    pub fn reconcile(&mut self, core: &Core) {
        let pods = super::objects(core, "/pods");
        let live_uids: Vec<&str> = pods.iter().map(|p| meta_str(p, "uid")).collect();
        self.backoff
            .retain(|uid, _| live_uids.contains(&uid.as_str()));
        for pod in &pods {
            if pod.pointer("/metadata/deletionTimestamp").is_some() {
                continue;
            }
            let uid = meta_str(pod, "uid").to_string();
            if let Some((_, at)) = self.backoff.get(&uid)
                && Instant::now() < *at
            {
                continue;
            }
            match sync_pod(core, pod) {
                Ok(()) => {
                    self.backoff.remove(&uid);
                }
                Err(e) => {
                    let n = self.backoff.get(&uid).map(|(n, _)| n + 1).unwrap_or(0);
                    let delay = Duration::from_millis(5)
                        .saturating_mul(2u32.saturating_pow(n.min(30)))
                        .min(Duration::from_secs(1000));
                    self.backoff.insert(uid, (n, Instant::now() + delay));
                    record_failure(core, pod, &e);
                }
            }
        }
        release_reservations(core, &pods);
    }
}

fn sync_pod(core: &Core, pod: &Value) -> Result<(), Box<(String, ApiError)>> {
    let ns = meta_str(pod, "namespace").to_string();
    let pod_name = meta_str(pod, "name").to_string();
    let pod_uid = meta_str(pod, "uid").to_string();
    let statuses = pod
        .pointer("/status/resourceClaimStatuses")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let claim_rt = super::rt(core, "resource.k8s.io", "resourceclaims");
    let tmpl_rt = super::rt(core, "resource.k8s.io", "resourceclaimtemplates");
    let mut new_statuses = statuses.clone();
    for pc in pod
        .pointer("/spec/resourceClaims")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let Some(tmpl_name) = pc["resourceClaimTemplateName"].as_str() else {
            continue;
        };
        let pc_name = pc["name"].as_str().unwrap_or("").to_string();
        if statuses.iter().any(|s| s["name"] == json!(pc_name)) {
            continue;
        }
        // An existing claim owned by the pod for this entry (created before a failed status
        // update) is reused.
        let existing = super::objects(core, "resource.k8s.io/resourceclaims")
            .into_iter()
            .find(|c| {
                meta_str(c, "namespace") == ns
                    && c.pointer("/metadata/annotations/resource.kubernetes.io~1pod-claim-name")
                        == Some(&json!(pc_name))
                    && crate::core::owner_refs(c)
                        .iter()
                        .any(|r| r["uid"] == json!(pod_uid))
            });
        let claim_name = match existing {
            Some(c) => meta_str(&c, "name").to_string(),
            None => {
                let tmpl = core
                    .get(&tmpl_rt, &ns, tmpl_name)
                    .map_err(|e| Box::new((pc_name.clone(), e)))?;
                let mut annotations = tmpl
                    .pointer("/spec/metadata/annotations")
                    .cloned()
                    .unwrap_or(json!({}));
                annotations["resource.kubernetes.io/pod-claim-name"] = json!(pc_name);
                let mut prefix = format!("{pod_name}-{pc_name}");
                prefix.truncate(57);
                let mut meta = json!({
                    "generateName": format!("{prefix}-"),
                    "namespace": ns,
                    "annotations": annotations,
                    "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": pod_name, "uid": pod_uid,
                        "controller": true, "blockOwnerDeletion": true}],
                });
                if let Some(l) = tmpl.pointer("/spec/metadata/labels") {
                    meta["labels"] = l.clone();
                }
                let claim = json!({
                    "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": meta,
                    "spec": tmpl.pointer("/spec/spec").cloned().unwrap_or(json!({})),
                });
                let w = core
                    .create(&claim_rt, &ns, claim, &WriteOptions::manager(MANAGER))
                    .map_err(|e| Box::new((pc_name.clone(), e)))?;
                meta_str(&w.object, "name").to_string()
            }
        };
        new_statuses.push(json!({"name": pc_name, "resourceClaimName": claim_name}));
    }
    if new_statuses != statuses {
        let prt = super::rt(core, "", "pods");
        if let Ok(mut p) = core.get(&prt, &ns, &pod_name) {
            p["status"]["resourceClaimStatuses"] = json!(new_statuses);
            // A previous failure condition is cleared.
            if let Some(cs) = p["status"]["conditions"].as_array_mut() {
                cs.retain(|c| {
                    !(c["type"] == "PodScheduled" && c["reason"] == "FailedResourceClaimCreation")
                });
            }
            // Through the status subresource (validated, managedFields); a conflict is retried
            // on the next pass, which then finds the claim by its annotation and owner.
            let _ = core.update(
                &prt,
                &ns,
                &pod_name,
                p,
                Some("status"),
                &WriteOptions::manager(MANAGER),
            );
        }
    }
    Ok(())
}

fn record_failure(core: &Core, pod: &Value, failure: &(String, ApiError)) {
    let (pc_name, err) = failure;
    let ns = meta_str(pod, "namespace").to_string();
    let name = meta_str(pod, "name").to_string();
    let message = format!(
        "PodResourceClaim {pc_name}: create ResourceClaim: {}",
        err.message
    );
    let prt = super::rt(core, "", "pods");
    let ert = super::rt(core, "", "events");
    let opts = WriteOptions::manager(MANAGER);
    let Ok(mut p) = core.get(&prt, &ns, &name) else {
        return;
    };
    let conds = p["status"]["conditions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let same = conds
        .iter()
        .any(|c| c["type"] == "PodScheduled" && c["message"] == json!(message));
    if !same {
        let mut conds: Vec<Value> = conds
            .into_iter()
            .filter(|c| c["type"] != "PodScheduled")
            .collect();
        conds.push(json!({"type": "PodScheduled", "status": "False", "reason": "FailedResourceClaimCreation",
            "message": message, "lastTransitionTime": now()}));
        p["status"]["conditions"] = json!(conds);
        let _ = core.update(&prt, &ns, &name, p, Some("status"), &opts);
    }
    // One Event per Pod and reason, its count incremented like the event recorder's aggregation.
    let ev_name = format!("{name}.failedresourceclaimcreation");
    match core.get(&ert, &ns, &ev_name) {
        Ok(mut e) => {
            e["count"] = json!(e["count"].as_i64().unwrap_or(1) + 1);
            e["message"] = json!(message);
            e["lastTimestamp"] = json!(now());
            let _ = core.update(&ert, &ns, &ev_name, e, None, &opts);
        }
        Err(_) => {
            let ev = json!({"apiVersion": "v1", "kind": "Event",
                "metadata": {"name": ev_name, "namespace": ns},
                "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": name, "namespace": ns, "uid": meta_str(pod, "uid")},
                "reason": "FailedResourceClaimCreation", "message": message, "type": "Warning", "count": 1,
                "firstTimestamp": now(), "lastTimestamp": now(), "source": {"component": "resource_claim"}});
            let _ = core.create(&ert, &ns, ev, &opts);
        }
    }
}

/// Drops reservations of Pods that are gone or terminal; deallocates unreserved claims.
fn release_reservations(core: &Core, pods: &[Value]) {
    let crt = super::rt(core, "resource.k8s.io", "resourceclaims");
    let mut st = core.lock();
    let claims: Vec<Value> = st
        .objects
        .iter()
        .filter(|(k, _)| k.0 == "resource.k8s.io/resourceclaims")
        .map(|(_, v)| v.clone())
        .collect();
    for c in claims {
        let Some(reserved) = c.pointer("/status/reservedFor").and_then(Value::as_array) else {
            continue;
        };
        let keep: Vec<Value> = reserved
            .iter()
            .filter(|r| {
                r["resource"] != "pods"
                    || pods.iter().any(|p| {
                        meta_str(p, "uid") == r["uid"].as_str().unwrap_or("")
                            && !matches!(
                                p.pointer("/status/phase").and_then(Value::as_str),
                                Some("Succeeded" | "Failed")
                            )
                    })
            })
            .cloned()
            .collect();
        if keep.len() == reserved.len() {
            continue;
        }
        let mut c = c.clone();
        if keep.is_empty() {
            let status = c["status"].as_object_mut().expect("status");
            status.remove("reservedFor");
            status.remove("allocation");
        } else {
            c["status"]["reservedFor"] = json!(keep);
        }
        core.put_unchecked(&mut st, &crt, c);
    }
}
