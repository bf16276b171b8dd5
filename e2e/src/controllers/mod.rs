//! In-process stand-ins for the controllers the scenarios need: namespace deletion, garbage
//! collection, ResourceQuota status, PodDisruptionBudget status, the resourceclaim controller,
//! a simplified DRA scheduler and a simulated kubelet.
//!
//! They run in one background task that re-runs every pass after each change of the store
//! (and at least every 50 ms, for retries with backoff). Like the real controllers they act
//! asynchronously: a client can observe intermediate states.

pub mod claims;
pub mod eviction;
pub mod gc;
pub mod namespace;
pub mod pdb;
pub mod scheduler;

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use crate::core::Core;
use crate::resources::ResourceType;

/// Which controllers run.
#[derive(Debug, Clone)]
pub struct ControllerConfig {
    /// Namespace deletion.
    pub namespace: bool,
    /// Garbage collector.
    pub gc: bool,
    /// ResourceQuota status (replenishment).
    pub quota: bool,
    /// PodDisruptionBudget status.
    pub disruption: bool,
    /// resourceclaim controller (claims from templates).
    pub resourceclaim: bool,
    /// DRA scheduler and simulated kubelet.
    pub scheduler: bool,
    /// Node used for Pods without claims, and when no ResourceSlice names a node.
    pub default_node: String,
    /// How long the simulated kubelet takes to stop a deleted Pod's containers before it
    /// removes the Pod (at most the Pod's grace period). Default 0: on its next pass.
    pub pod_termination: Duration,
}

impl Default for ControllerConfig {
    fn default() -> Self {
        ControllerConfig {
            namespace: true,
            gc: true,
            quota: true,
            disruption: true,
            resourceclaim: true,
            scheduler: true,
            default_node: "e2e-node-0".to_string(),
            pod_termination: Duration::ZERO,
        }
    }
}

/// Runs the controllers until the task is aborted.
pub fn spawn(core: Arc<Core>, config: ControllerConfig) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut rx = core.subscribe();
        let mut claim_ctl = claims::ClaimController::default();
        let mut terminating = std::collections::HashMap::new();
        loop {
            if config.namespace {
                namespace::reconcile(&core);
            }
            if config.gc {
                gc::reconcile(&core);
            }
            if config.resourceclaim {
                claim_ctl.reconcile(&core);
            }
            if config.scheduler {
                scheduler::reconcile(&core, &config.default_node);
                scheduler::kubelet(&core, config.pod_termination, &mut terminating);
            }
            if config.quota {
                quota_status(&core);
            }
            if config.disruption {
                pdb::reconcile(&core);
            }
            let wait = claim_ctl
                .next_retry()
                .unwrap_or(Duration::from_millis(50))
                .min(Duration::from_millis(50));
            tokio::select! {
                r = rx.changed() => { if r.is_err() { return; } }
                _ = tokio::time::sleep(wait) => {}
            }
        }
    })
}

/// The type of a served built-in.
pub fn rt(core: &Core, group: &str, plural: &str) -> ResourceType {
    core.registry
        .types
        .iter()
        .find(|t| t.group == group && t.plural == plural)
        .cloned()
        .expect("built-in type served")
}

/// Live objects of one resource key (`group/plural`).
pub fn objects(core: &Core, key: &str) -> Vec<Value> {
    core.lock()
        .objects
        .iter()
        .filter(|(k, _)| k.0 == key)
        .map(|(_, v)| v.clone())
        .collect()
}

/// Quota controller: `status.hard` and `status.used` from the live objects.
pub fn quota_status(core: &Core) {
    let qrt = rt(core, "", "resourcequotas");
    let mut st = core.lock();
    let quotas: Vec<Value> = st
        .objects
        .iter()
        .filter(|(k, _)| k.0 == "/resourcequotas")
        .map(|(_, v)| v.clone())
        .collect();
    for q in quotas {
        let status = crate::admission::quota::status_for(core, &st, &q);
        if q.get("status") != Some(&status) {
            let mut q = q;
            q["status"] = status;
            core.put_unchecked(&mut st, &qrt, q);
        }
    }
}
