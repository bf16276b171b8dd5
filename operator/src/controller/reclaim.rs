//! Reclaim: when the fair-share engine names a borrower that must give devices back to a team
//! waiting below its guarantee, and that team opted in, evict the borrower's newest Pods through
//! the Eviction API (PodDisruptionBudgets are enforced by the API server) after a grace period.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, EvictParams};
use kube::runtime::events::{Event, EventType};
use kube::{Resource, ResourceExt};

use super::Reconciler;
use super::metrics::{EvictionLabels, WriteLabels};
use crate::api::TeamGpuPolicy;
use crate::core::plan::Plan;
use crate::core::plan::usage::ClaimView;

/// How long one eviction may take (the client retries a PodDisruptionBudget's 429 meanwhile).
const EVICTION_TIMEOUT: Duration = Duration::from_secs(5);

/// Since when each (sharing policy, waiting team) has been owed devices.
#[derive(Debug, Default)]
pub struct Tracker {
    waiting_since: BTreeMap<(String, String), Instant>,
    next_attempt: Option<Instant>,
}

/// The Pods to evict so that up to `devices` devices of `class` come free in `namespaces`: the
/// Pods holding the newest allocated claims first (the least work lost). A claim holding more
/// than what is still to free is passed over: `devices` is what the borrower holds above its
/// own fair entitlement, and evicting more would take it below its guarantee. Pure.
pub fn victims<'a>(
    claims: impl IntoIterator<Item = &'a ClaimView>,
    namespaces: &[String],
    class: &str,
    devices: u32,
) -> Vec<(String, String)> {
    let mut held: Vec<(&ClaimView, u64)> = claims
        .into_iter()
        .filter(|c| namespaces.iter().any(|ns| **ns == *c.namespace))
        .filter_map(|c| Some((c, *c.allocated_by_class().get(class)?)))
        .filter(|(_, n)| *n > 0)
        .collect();
    held.sort_by(|(a, _), (b, _)| b.created.cmp(&a.created).then_with(|| b.name.cmp(&a.name)));
    let mut freed = 0u64;
    let mut out = Vec::new();
    for (claim, n) in held {
        if freed >= u64::from(devices) {
            break;
        }
        if freed + n > u64::from(devices) {
            continue;
        }
        let pods: Vec<(String, String)> = claim
            .reserved_for_pods
            .iter()
            .map(|pod| (claim.namespace.to_string(), pod.to_string()))
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

/// How soon a refused eviction (a PodDisruptionBudget) is tried again.
const RETRY_REFUSED: Duration = Duration::from_secs(10);

impl Tracker {
    /// When the reconcile loop must run again for reclaim even if nothing changes: a grace
    /// period ends, or a refused eviction is due to be retried.
    pub fn next_attempt(&self) -> Option<Instant> {
        self.next_attempt
    }

    /// Forgets a wake-up that is due (the pass about to run sets the next one), so a pass that
    /// does not reach reclaim cannot leave a past instant that wakes the loop again and again.
    pub fn clear_due(&mut self, now: Instant) {
        if self.next_attempt.is_some_and(|t| t <= now) {
            self.next_attempt = None;
        }
    }
}

/// One eviction to make: the Pod, and the reclaim it serves.
struct Eviction<'p> {
    namespace: String,
    pod: String,
    order: &'p crate::core::plan::ReclaimOrder,
    borrower_namespaces: &'p [String],
}

/// Evict for every reclaim the plan names whose waiting team opted in and has waited long enough.
/// Evictions run concurrently, each bounded by [`EVICTION_TIMEOUT`], so a PodDisruptionBudget
/// holds up one pass by at most that long.
pub async fn act(r: &mut Reconciler, plan: &Plan, teams: &[TeamGpuPolicy]) {
    let now = Instant::now();
    let owed: Vec<_> = plan
        .reclaims
        .iter()
        .map(|o| (o.sharing_policy.clone(), o.for_team.clone()))
        .collect();
    r.reclaim.waiting_since.retain(|k, _| owed.contains(k));
    r.reclaim.next_attempt = None;
    let mut evictions = Vec::new();
    let claims = if plan.reclaims.is_empty() {
        Vec::new()
    } else {
        r.stores.claims.state().map(|(_, c)| c).unwrap_or_default()
    };
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
            r.reclaim.wake_at(since + grace);
            continue;
        }
        let Some(borrower) = plan.teams.iter().find(|t| t.name == order.borrower) else {
            continue;
        };
        let class = crate::core::plan::objects::device_class_name(&order.sharing_policy);
        let held = claims.iter().map(|c| &**c);
        for (namespace, pod) in victims(held, &borrower.namespaces, &class, order.devices) {
            evictions.push(Eviction {
                namespace,
                pod,
                order,
                borrower_namespaces: &borrower.namespaces,
            });
        }
    }
    if evictions.is_empty() || !r.is_leader() {
        return;
    }
    let attempts = evictions.iter().map(|e| {
        r.metrics
            .writes
            .get_or_create(&WriteLabels {
                kind: "pod",
                verb: "evict",
            })
            .inc();
        let api: Api<Pod> = Api::namespaced(r.client.clone(), &e.namespace);
        async move {
            // kube's client retries a 429 (what a PodDisruptionBudget answers) for minutes; the
            // reconcile loop must not wait on it: the eviction is tried again later.
            tokio::time::timeout(EVICTION_TIMEOUT, api.evict(&e.pod, &EvictParams::default()))
                .await
                .unwrap_or_else(|_| {
                    Err(kube::Error::Service(
                        "not allowed yet: the API server kept answering 429 (a PodDisruptionBudget?)"
                            .into(),
                    ))
                })
        }
    });
    let results = futures::future::join_all(attempts).await;
    for (e, result) in evictions.iter().zip(results) {
        let order = e.order;
        let labels = EvictionLabels {
            sharing_policy: order.sharing_policy.clone(),
            for_team: order.for_team.clone(),
            borrower: order.borrower.clone(),
        };
        let (event, note) = match result {
            Ok(_) => {
                r.metrics.evictions.get_or_create(&labels).inc();
                let note = format!(
                    "evicting {}/{}: {} borrowed {} devices of {} that {} needs back",
                    e.namespace,
                    e.pod,
                    order.borrower,
                    order.devices,
                    order.sharing_policy,
                    order.for_team
                );
                tracing::info!(%note, "reclaim");
                ("Reclaimed", note)
            }
            Err(error) => {
                r.metrics.evictions_refused.get_or_create(&labels).inc();
                r.reclaim.wake_at(Instant::now() + RETRY_REFUSED);
                let note = format!(
                    "could not evict {}/{} to give {} devices of {} back to {}: {error}; retrying",
                    e.namespace, e.pod, order.devices, order.sharing_policy, order.for_team
                );
                tracing::info!(%note, "eviction refused");
                ("EvictionRefused", note)
            }
        };
        let waiting_namespaces = plan
            .teams
            .iter()
            .find(|t| t.name == order.for_team)
            .map(|t| t.namespaces.as_slice())
            .unwrap_or_default();
        let pod_ref = k8s_openapi::api::core::v1::ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            name: Some(e.pod.clone()),
            namespace: Some(e.namespace.clone()),
            ..Default::default()
        };
        let mut references = vec![(pod_ref, String::new())];
        if let Some(team) = teams.iter().find(|t| t.name_any() == order.borrower) {
            references.push((team.object_ref(&()), String::new()));
        }
        // Both teams' members see it in their own namespaces.
        for (team, namespaces) in [
            (&order.borrower, e.borrower_namespaces),
            (&order.for_team, waiting_namespaces),
        ] {
            let reference = k8s_openapi::api::core::v1::ObjectReference {
                kind: Some("TeamGpuPolicy".into()),
                name: Some(team.clone()),
                ..Default::default()
            };
            references.extend(super::in_team_namespaces(&reference, namespaces));
        }
        for (reference, prefix) in references {
            let event = Event {
                type_: EventType::Warning,
                reason: event.into(),
                note: Some(format!("{prefix}{note}").chars().take(1000).collect()),
                action: "Evict".into(),
                secondary: None,
            };
            if let Err(error) = r.recorder.publish(&event, &reference).await {
                tracing::debug!(%error, "event not recorded");
            }
        }
    }
}

impl Tracker {
    fn wake_at(&mut self, at: Instant) {
        self.next_attempt = Some(self.next_attempt.map_or(at, |t| t.min(at)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn claim(name: &str, created: &str, devices: usize, pod: &str) -> ClaimView {
        let results: Vec<_> = (0..devices)
            .map(|i| json!({"request": "gpu", "driver": "gpu.nvidia.com", "pool": "n", "device": format!("{name}-{i}")}))
            .collect();
        let claim: Result<k8s_openapi::api::resource::v1::ResourceClaim, _> =
            serde_json::from_value(json!({
                "metadata": {"name": name, "namespace": "b", "creationTimestamp": created},
                "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "a.teamgpu.io", "count": devices}}]}},
                "status": {"allocation": {"devices": {"results": results}},
                           "reservedFor": [{"resource": "pods", "name": pod, "uid": "u"}]}
            }));
        ClaimView::project(&claim.unwrap(), &mut Default::default())
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
