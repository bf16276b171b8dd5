//! Apply: perform the writes the plan asks for, and the status updates. Needs a client.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::time::{Duration, Instant};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams};
use kube::{Resource, ResourceExt};
use serde_json::json;

use super::{FIELD_MANAGER, Reconciler, metrics::ErrorLabels, metrics::WriteLabels};
use crate::api::{GpuSharingPolicy, TeamGpuPolicy};
use crate::core::diff::{ObjectKey, Write};
use crate::core::plan::Plan;

/// Per-object retry state for failed writes: exponential backoff with jitter, so one object
/// the API server refuses never holds up the others or hammers the server.
#[derive(Debug, Default)]
pub struct Backoff {
    failures: HashMap<String, (u32, Instant)>,
    jitter: RandomState,
}

impl Backoff {
    fn ready(&self, key: &str) -> bool {
        self.failures
            .get(key)
            .is_none_or(|(_, at)| Instant::now() >= *at)
    }

    fn failed(&mut self, key: &str) {
        let attempts = self.failures.get(key).map_or(0, |(n, _)| *n) + 1;
        let base = Duration::from_millis(200)
            .saturating_mul(1 << attempts.min(8))
            .min(Duration::from_secs(60));
        let jitter = Duration::from_millis(
            self.jitter.hash_one((key, attempts)) % (base.as_millis() as u64 / 2 + 1),
        );
        self.failures.insert(
            key.to_owned(),
            (attempts, Instant::now() + base / 2 + jitter),
        );
    }

    fn succeeded(&mut self, key: &str) {
        self.failures.remove(key);
    }

    /// When the next object is due for a retry.
    pub fn next_retry(&self) -> Option<Instant> {
        self.failures.values().map(|(_, at)| *at).min()
    }
}

/// A short, stable label of an error, for metrics and logs.
fn error_label(error: &kube::Error) -> &'static str {
    match error {
        kube::Error::Api(s) if s.code == 409 => "conflict",
        kube::Error::Api(s) if s.code == 422 => "invalid",
        kube::Error::Api(s) if s.code == 429 => "too_many_requests",
        kube::Error::Api(s) if s.code == 403 => "forbidden",
        kube::Error::Api(s) if s.code == 404 => "not_found",
        kube::Error::Api(s) if s.code >= 500 => "server_error",
        kube::Error::Api(_) => "api",
        _ => "transport",
    }
}

fn api_for(client: &kube::Client, key: &ObjectKey) -> Api<DynamicObject> {
    let ar = key.kind.api_resource();
    match &key.namespace {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &ar),
        None => Api::all_with(client.clone(), &ar),
    }
}

fn apply_params() -> PatchParams {
    PatchParams::apply(FIELD_MANAGER).force()
}

/// One write. Takes owned handles so that writes can run concurrently in `Send` futures.
/// Returns the resourceVersion the server answered an apply with.
async fn perform(
    client: kube::Client,
    metrics: std::sync::Arc<super::Metrics>,
    own_writes: std::sync::Arc<crate::core::diff::OwnWrites>,
    write: Write,
) -> Result<Option<String>, kube::Error> {
    let write = &write;
    let key = write.key();
    let api = api_for(&client, key);
    let count = |verb: &'static str| {
        metrics
            .writes
            .get_or_create(&WriteLabels {
                kind: key.kind.label(),
                verb,
            })
            .inc();
    };
    match write {
        Write::Apply { object, .. } => {
            count("apply");
            let stored = api
                .patch(&key.name, &apply_params(), &Patch::Apply(object))
                .await?;
            remember(
                &own_writes,
                stored.metadata.resource_version.as_deref(),
                object,
            );
            return Ok(stored.metadata.resource_version);
        }
        Write::Recreate { object, .. } => {
            count("delete");
            match api.delete(&key.name, &DeleteParams::default()).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(e),
            }
            count("apply");
            let stored = api
                .patch(&key.name, &apply_params(), &Patch::Apply(object))
                .await?;
            remember(
                &own_writes,
                stored.metadata.resource_version.as_deref(),
                object,
            );
        }
        Write::Delete { .. } => {
            count("delete");
            match api.delete(&key.name, &DeleteParams::default()).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(None)
}

/// Tells the owned objects' watches that `version` is an apply of `object`.
fn remember(
    own_writes: &crate::core::diff::OwnWrites,
    version: Option<&str>,
    object: &crate::core::diff::Payload,
) {
    if let (Some(version), Some(fingerprint)) = (version, object.fingerprint()) {
        own_writes.record(version, fingerprint);
    }
}

/// Writes in flight at once within one phase. The API server handles concurrent writes well; one
/// at a time, a first converge of thousands of templates would hold up every later event.
/// Kept full (a new write starts as soon as one ends), as a plain client would.
const WRITE_CONCURRENCY: usize = 16;

/// The phase of a write: writes of one kind (applies in dependency order, then deletions in
/// reverse) may run concurrently; phases run one after another.
fn phase(write: &Write) -> (bool, crate::core::diff::Kind) {
    (matches!(write, Write::Delete { .. }), write.key().kind)
}

/// Perform `writes` (in the order `diff::writes` gives), skipping objects still backing off.
/// Stops starting writes at once when this replica loses the lease.
pub async fn execute(r: &mut Reconciler, writes: Vec<Write>) {
    use futures::StreamExt;
    let ready: Vec<Write> = writes
        .into_iter()
        .filter(|w| r.backoff.ready(&w.key().to_string()))
        .collect();
    for batch in ready.chunk_by(|a, b| phase(a) == phase(b)) {
        if !r.is_leader() {
            return;
        }
        let leader = r.leader.clone();
        let (client, metrics) = (r.client.clone(), r.metrics.clone());
        let own_writes = r.stores.own_writes.clone();
        let results: Vec<_> = futures::stream::iter(batch.iter().cloned())
            // Checked before every write: a replica that lost the lease starts no more.
            .take_while(|_| std::future::ready(*leader.borrow()))
            .map(|write| {
                let (client, metrics) = (client.clone(), metrics.clone());
                let own_writes = own_writes.clone();
                async move {
                    let key = write.key().clone();
                    let verb = write.verb();
                    let result = perform(client, metrics, own_writes, write).await;
                    if result.is_ok() {
                        tracing::info!(object = %key, action = verb, "wrote");
                    }
                    (key, result)
                }
            })
            .buffer_unordered(WRITE_CONCURRENCY)
            .collect()
            .await;
        for (key, result) in results {
            let id = key.to_string();
            match result {
                Ok(version) => {
                    r.backoff.succeeded(&id);
                    r.differ.applied(&key, version.as_deref());
                }
                Err(error) => failed(r, &id, &error),
            }
        }
    }
}

/// A write of `id` (an object, or a policy's status) failed: counted, logged, and backed off.
fn failed(r: &mut Reconciler, id: &str, error: &kube::Error) {
    r.metrics
        .errors
        .get_or_create(&ErrorLabels {
            controller: "teamgpu",
            error: error_label(error),
        })
        .inc();
    tracing::warn!(object = %id, %error, "write failed; retrying with backoff");
    r.backoff.failed(id);
}

/// Write the status of every policy whose computed status differs from the live one.
pub async fn write_statuses(
    r: &mut Reconciler,
    plan: &Plan,
    sharing: &[GpuSharingPolicy],
    teams: &[TeamGpuPolicy],
    now: &Time,
) {
    let mut updates = Vec::new();
    for p in sharing {
        let name = p.name_any();
        if let Some(status) = plan.sharing_status(&name, p.status.as_ref(), now)
            && p.status.as_ref() != Some(&status)
        {
            updates.push((
                GpuSharingPolicy::api_version(&()).into_owned(),
                GpuSharingPolicy::kind(&()).into_owned(),
                name,
                json!(status),
            ));
        }
    }
    for t in teams {
        let name = t.name_any();
        if let Some(status) = plan.team_status(&name, t.status.as_ref(), now)
            && t.status.as_ref() != Some(&status)
        {
            updates.push((
                TeamGpuPolicy::api_version(&()).into_owned(),
                TeamGpuPolicy::kind(&()).into_owned(),
                name,
                json!(status),
            ));
        }
    }
    // Concurrently, as the objects: one claim can move several teams' entitlements, and a status
    // written one after another would wait for every status before it.
    use futures::StreamExt;
    let ready: Vec<_> = updates
        .into_iter()
        .map(|(api_version, kind, name, status)| {
            let id = format!("{kind} {name} status");
            (id, api_version, kind, name, status)
        })
        .filter(|(id, ..)| r.backoff.ready(id))
        .collect();
    let shared: &Reconciler = r;
    let leader = shared.leader.clone();
    let results: Vec<_> = futures::stream::iter(ready)
        // Checked before every write: a replica that lost the lease starts no more.
        .take_while(|_| std::future::ready(*leader.borrow()))
        .map(|(id, api_version, kind, name, status)| async move {
            let result = if kind == "GpuSharingPolicy" {
                patch_status::<GpuSharingPolicy>(shared, &api_version, &kind, &name, status).await
            } else {
                patch_status::<TeamGpuPolicy>(shared, &api_version, &kind, &name, status).await
            };
            (id, result)
        })
        .buffer_unordered(WRITE_CONCURRENCY)
        .collect()
        .await;
    for (id, result) in results {
        match result {
            Ok(()) => r.backoff.succeeded(&id),
            Err(error) => failed(r, &id, &error),
        }
    }
}

async fn patch_status<K>(
    r: &Reconciler,
    api_version: &str,
    kind: &str,
    name: &str,
    status: serde_json::Value,
) -> Result<(), kube::Error>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::ClusterResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let kind_label = if kind == "GpuSharingPolicy" {
        "gpusharingpolicy"
    } else {
        "teamgpupolicy"
    };
    r.metrics
        .writes
        .get_or_create(&WriteLabels {
            kind: kind_label,
            verb: "status",
        })
        .inc();
    let patch = json!({"apiVersion": api_version, "kind": kind, "status": status});
    Api::<K>::all(r.client.clone())
        .patch_status(name, &apply_params(), &Patch::Apply(patch))
        .await?;
    Ok(())
}

/// The status that tells a person why teamgpu skips a malformed policy: `Ready=False`, reason
/// `Malformed`; `None` when the live status says so already.
pub(crate) fn malformed_status(
    live: &serde_json::Value,
    message: &str,
    generation: Option<i64>,
    now: &Time,
) -> Option<serde_json::Value> {
    let conditions = live["status"]["conditions"].as_array();
    let current = conditions.and_then(|c| c.iter().find(|c| c["type"] == "Ready"));
    if current.is_some_and(|c| c["reason"] == "Malformed" && c["message"] == message) {
        return None;
    }
    Some(json!({"conditions": [{
        "type": "Ready", "status": "False", "reason": "Malformed", "message": message,
        "observedGeneration": generation, "lastTransitionTime": now,
    }]}))
}

/// Report malformed policies in their status (the only place a person looks).
pub(crate) async fn report_malformed(
    r: &mut Reconciler,
    malformed: &[super::Malformed],
    now: &Time,
) {
    for m in malformed {
        let live = serde_json::to_value(&m.object).unwrap_or_default();
        let Some(status) = malformed_status(&live, &m.message, m.object.metadata.generation, now)
        else {
            continue;
        };
        let name = m.object.name_any();
        let id = format!("{} {name} status", m.resource.kind);
        if !r.is_leader() || !r.backoff.ready(&id) {
            continue;
        }
        let api: Api<DynamicObject> = Api::all_with(r.client.clone(), &m.resource);
        let patch = json!({"apiVersion": m.resource.api_version, "kind": m.resource.kind, "status": status});
        match api
            .patch_status(&name, &apply_params(), &Patch::Apply(patch))
            .await
        {
            Ok(_) => r.backoff.succeeded(&id),
            Err(error) => failed(r, &id, &error),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_malformed_policy_is_reported_once() {
        let now = Time(k8s_openapi::jiff::Timestamp::from_second(1).unwrap());
        let status = malformed_status(&json!({}), "bad weight", Some(3), &now).unwrap();
        assert_eq!(status["conditions"][0]["reason"], "Malformed");
        assert_eq!(status["conditions"][0]["observedGeneration"], 3);
        let live = json!({"status": status});
        assert_eq!(malformed_status(&live, "bad weight", Some(3), &now), None);
        assert!(malformed_status(&live, "another problem", Some(4), &now).is_some());
    }
}
