//! Reclaim: when the fair-share engine names a borrower that must give devices back to a team
//! waiting below its guarantee, and that team opted in, evict the borrower's newest Pods through
//! the Eviction API (PodDisruptionBudgets are enforced by the API server) after a grace period.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::api::{Api, EvictParams};
use kube::runtime::events::{Event, EventType};
use kube::{Resource, ResourceExt};

use super::Reconciler;
use super::metrics::{EvictionLabels, WriteLabels};
use crate::api::TeamGpuPolicy;
use crate::plan::Plan;
use crate::plan::usage::allocated_by_class;

/// How long one eviction may take (the client retries a PodDisruptionBudget's 429 meanwhile).
const EVICTION_TIMEOUT: Duration = Duration::from_secs(5);

/// Since when each (sharing policy, waiting team) has been owed devices.
#[derive(Debug, Default)]
pub struct Tracker {
    waiting_since: BTreeMap<(String, String), Instant>,
}

/// The Pods to evict so that up to `devices` devices of `class` come free in `namespaces`: the
/// Pods holding the newest allocated claims first (the least work lost). A claim holding more
/// than what is still to free is passed over: `devices` is what the borrower holds above its
/// own fair entitlement, and evicting more would take it below its guarantee. Pure.
pub fn victims<'a>(
    claims: impl IntoIterator<Item = &'a ResourceClaim>,
    namespaces: &[String],
    class: &str,
    devices: u32,
) -> Vec<(String, String)> {
    let mut held: Vec<(&ResourceClaim, u64)> = claims
        .into_iter()
        .filter(|c| {
            c.metadata
                .namespace
                .as_ref()
                .is_some_and(|ns| namespaces.contains(ns))
        })
        .filter_map(|c| Some((c, *allocated_by_class(c).get(class)?)))
        .filter(|(_, n)| *n > 0)
        .collect();
    held.sort_by(|(a, _), (b, _)| {
        b.metadata
            .creation_timestamp
            .cmp(&a.metadata.creation_timestamp)
            .then_with(|| b.metadata.name.cmp(&a.metadata.name))
    });
    let mut freed = 0u64;
    let mut out = Vec::new();
    for (claim, n) in held {
        if freed >= u64::from(devices) {
            break;
        }
        if freed + n > u64::from(devices) {
            continue;
        }
        let namespace = claim.metadata.namespace.clone().unwrap_or_default();
        let pods: Vec<_> = claim
            .status
            .iter()
            .flat_map(|s| s.reserved_for.iter().flatten())
            .filter(|r| r.resource == "pods" && r.api_group.as_deref().unwrap_or("").is_empty())
            .map(|r| (namespace.clone(), r.name.clone()))
            .collect();
        if pods.is_empty() {
            continue;
        }
        freed += n;
        for pod in pods {
            if !out.contains(&pod) {
                out.push(pod);
            }
        }
    }
    out
}

/// Evict for every reclaim the plan names whose waiting team opted in and has waited long enough.
pub async fn act(r: &mut Reconciler, plan: &Plan, teams: &[TeamGpuPolicy]) {
    let now = Instant::now();
    let owed: Vec<_> = plan
        .reclaims
        .iter()
        .map(|o| (o.sharing_policy.clone(), o.for_team.clone()))
        .collect();
    r.reclaim.waiting_since.retain(|k, _| owed.contains(k));
    for order in &plan.reclaims {
        let Some(waiting) = teams.iter().find(|t| t.name_any() == order.for_team) else {
            continue;
        };
        let settings = waiting.spec.reclaim.clone().unwrap_or_default();
        if !settings.enabled.unwrap_or(r.config.reclaim_default) {
            continue;
        }
        let grace = settings
            .grace_period_seconds
            .map_or(r.config.reclaim_grace, |s| Duration::from_secs(s.into()));
        let since = *r
            .reclaim
            .waiting_since
            .entry((order.sharing_policy.clone(), order.for_team.clone()))
            .or_insert(now);
        if now.duration_since(since) < grace {
            continue;
        }
        let Some(borrower) = plan.teams.iter().find(|t| t.name == order.borrower) else {
            continue;
        };
        let class = crate::plan::objects::device_class_name(&order.sharing_policy);
        let claims = r.stores.claims.state();
        let held = claims.iter().map(|c| &**c);
        for (namespace, pod) in victims(held, &borrower.namespaces, &class, order.devices) {
            if !r.is_leader() {
                return;
            }
            r.metrics
                .writes
                .get_or_create(&WriteLabels {
                    kind: "pod",
                    verb: "evict",
                })
                .inc();
            let labels = EvictionLabels {
                sharing_policy: order.sharing_policy.clone(),
                for_team: order.for_team.clone(),
                borrower: order.borrower.clone(),
            };
            let api: Api<Pod> = Api::namespaced(r.client.clone(), &namespace);
            let note = format!(
                "evicting {namespace}/{pod}: {} borrowed {} devices of {} that {} needs back",
                order.borrower, order.devices, order.sharing_policy, order.for_team
            );
            // kube's client retries a 429 (what a PodDisruptionBudget answers) for minutes;
            // the reconcile loop must not wait on it, the next pass tries again.
            let params = EvictParams::default();
            let eviction = tokio::time::timeout(EVICTION_TIMEOUT, api.evict(&pod, &params));
            match eviction.await.unwrap_or_else(|_| {
                Err(kube::Error::Service(
                    "eviction not allowed yet (timed out)".into(),
                ))
            }) {
                Ok(_) => {
                    r.metrics.evictions.get_or_create(&labels).inc();
                    tracing::info!(%note, "reclaim");
                    let event = Event {
                        type_: EventType::Warning,
                        reason: "Reclaimed".into(),
                        note: Some(note.clone()),
                        action: "Evict".into(),
                        secondary: None,
                    };
                    if let Some(team) = teams.iter().find(|t| t.name_any() == order.borrower) {
                        let _ = r.recorder.publish(&event, &team.object_ref(&())).await;
                    }
                    // Both teams' members see it in their own namespaces.
                    let waiting_namespaces = plan
                        .teams
                        .iter()
                        .find(|t| t.name == order.for_team)
                        .map(|t| t.namespaces.as_slice())
                        .unwrap_or_default();
                    for (team, namespaces) in [
                        (&order.borrower, borrower.namespaces.as_slice()),
                        (&order.for_team, waiting_namespaces),
                    ] {
                        let reference = k8s_openapi::api::core::v1::ObjectReference {
                            kind: Some("TeamGpuPolicy".into()),
                            name: Some(team.clone()),
                            ..Default::default()
                        };
                        for (quota, prefix) in super::in_team_namespaces(&reference, namespaces) {
                            let copy = Event {
                                type_: EventType::Warning,
                                reason: "Reclaimed".into(),
                                note: Some(format!("{prefix}{note}")),
                                action: "Evict".into(),
                                secondary: None,
                            };
                            if let Err(error) = r.recorder.publish(&copy, &quota).await {
                                tracing::debug!(%error, "event not recorded");
                            }
                        }
                    }
                    let pod_ref = k8s_openapi::api::core::v1::ObjectReference {
                        api_version: Some("v1".into()),
                        kind: Some("Pod".into()),
                        name: Some(pod.clone()),
                        namespace: Some(namespace.clone()),
                        ..Default::default()
                    };
                    let _ = r.recorder.publish(&event, &pod_ref).await;
                }
                // 429: a PodDisruptionBudget does not allow it now; the next pass tries again.
                Err(error) => {
                    r.metrics.evictions_refused.get_or_create(&labels).inc();
                    tracing::info!(%error, %note, "eviction refused; will retry");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn claim(name: &str, created: &str, devices: usize, pod: &str) -> ResourceClaim {
        let results: Vec<_> = (0..devices)
            .map(|i| json!({"request": "gpu", "driver": "gpu.nvidia.com", "pool": "n", "device": format!("{name}-{i}")}))
            .collect();
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "b", "creationTimestamp": created},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "a.teamgpu.io", "count": devices}}]}},
            "status": {"allocation": {"devices": {"results": results}},
                       "reservedFor": [{"resource": "pods", "name": pod, "uid": "u"}]}
        }))
        .unwrap()
    }

    #[test]
    fn the_newest_pods_go_first_until_enough_devices_are_free() {
        let claims = [
            claim("old", "2026-01-01T00:00:00Z", 2, "p-old"),
            claim("mid", "2026-02-01T00:00:00Z", 1, "p-mid"),
            claim("new", "2026-03-01T00:00:00Z", 1, "p-new"),
        ];
        let ns = ["b".to_owned()];
        assert_eq!(
            victims(&claims, &ns, "a.teamgpu.io", 1),
            [("b".to_owned(), "p-new".to_owned())]
        );
        assert_eq!(
            victims(&claims, &ns, "a.teamgpu.io", 2),
            [
                ("b".to_owned(), "p-new".to_owned()),
                ("b".to_owned(), "p-mid".to_owned())
            ]
        );
        // The 2-device claim would free more than the borrower owes: never below its guarantee.
        assert_eq!(
            victims(&claims, &ns, "a.teamgpu.io", 3),
            [
                ("b".to_owned(), "p-new".to_owned()),
                ("b".to_owned(), "p-mid".to_owned())
            ]
        );
        assert_eq!(
            victims(&claims[..1], &ns, "a.teamgpu.io", 1),
            Vec::<(String, String)>::new()
        );
        assert!(victims(&claims, &ns, "other.teamgpu.io", 2).is_empty());
        assert!(victims(&claims, &["c".to_owned()], "a.teamgpu.io", 2).is_empty());
    }
}
