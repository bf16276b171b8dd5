//! Reclaim: when the fair-share engine names a borrower that must give devices back to a team
//! waiting below its guarantee, and that team opted in, the borrower's newest Pods are evicted
//! (through the Eviction API, which enforces PodDisruptionBudgets) after a grace period.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ObjectReference;
use kube::{Resource, ResourceExt};

use super::{Event, EventType, Eviction, in_team_namespaces};
use crate::api::TeamGpuPolicy;
use crate::core::plan::usage::ClaimView;
use crate::core::plan::{Plan, ReclaimOrder, objects};

/// How soon a refused eviction (a PodDisruptionBudget) is tried again.
const RETRY_REFUSED: Duration = Duration::from_secs(10);

/// What a team that says nothing in `spec.reclaim` gets.
#[derive(Clone, Copy, Debug)]
pub struct ReclaimDefaults {
    /// Whether teams reclaim borrowed devices by eviction.
    pub enabled: bool,
    /// How long a team waits below its guarantee before borrowers' Pods are evicted.
    pub grace: Duration,
}

/// Since when each (sharing policy, waiting team) has been owed devices, and when a pass must
/// run for reclaim even if nothing changes.
#[derive(Debug, Default)]
pub struct ReclaimTracker {
    waiting_since: BTreeMap<(String, String), Instant>,
    next_attempt: Option<Instant>,
}

impl ReclaimTracker {
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

    /// An eviction was refused at `now`: it is tried again 10 s later.
    pub fn refused(&mut self, now: Instant) {
        self.wake_at(now + RETRY_REFUSED);
    }

    fn wake_at(&mut self, at: Instant) {
        self.next_attempt = Some(self.next_attempt.map_or(at, |t| t.min(at)));
    }

    /// The evictions due at `now`: for every reclaim `plan` orders whose waiting team opted in
    /// (`teams`, or `defaults`) and has waited its grace period, the victims among `claims`.
    /// A reclaim seen for the first time starts its grace period; one no longer ordered is
    /// forgotten.
    pub fn evictions(
        &mut self,
        plan: &Plan,
        teams: &[TeamGpuPolicy],
        claims: &[Arc<ClaimView>],
        defaults: ReclaimDefaults,
        now: Instant,
    ) -> Vec<Eviction> {
        let owed: Vec<_> = plan
            .reclaims
            .iter()
            .map(|o| (o.sharing_policy.clone(), o.for_team.clone()))
            .collect();
        self.waiting_since.retain(|k, _| owed.contains(k));
        self.next_attempt = None;
        let mut evictions = Vec::new();
        for order in &plan.reclaims {
            let Some(waiting) = teams.iter().find(|t| t.name_any() == order.for_team) else {
                continue;
            };
            let settings = waiting.spec.reclaim.clone().unwrap_or_default();
            if !settings.enabled.unwrap_or(defaults.enabled) {
                continue;
            }
            let grace = settings
                .grace_period_seconds
                .map_or(defaults.grace, |s| Duration::from_secs(s.into()));
            let since = *self
                .waiting_since
                .entry((order.sharing_policy.clone(), order.for_team.clone()))
                .or_insert(now);
            if now.duration_since(since) < grace {
                self.wake_at(since + grace);
                continue;
            }
            evictions.extend(order_evictions(plan, teams, claims, order));
        }
        evictions
    }
}

/// The evictions that serve `order`, each with whom to tell.
fn order_evictions(
    plan: &Plan,
    teams: &[TeamGpuPolicy],
    claims: &[Arc<ClaimView>],
    order: &ReclaimOrder,
) -> Vec<Eviction> {
    let namespaces_of = |team: &str| {
        plan.teams
            .iter()
            .find(|t| t.name == team)
            .map(|t| t.namespaces.as_slice())
    };
    let Some(borrower_namespaces) = namespaces_of(&order.borrower) else {
        return Vec::new();
    };
    let waiting_namespaces = namespaces_of(&order.for_team).unwrap_or_default();
    let class = objects::device_class_name(&order.sharing_policy);
    let held = claims.iter().map(|c| &**c);
    victims(held, borrower_namespaces, &class, order.devices)
        .into_iter()
        .map(|(namespace, pod)| {
            let pod_ref = ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: Some(pod.clone()),
                namespace: Some(namespace.clone()),
                ..Default::default()
            };
            let mut notify = vec![(pod_ref, String::new())];
            if let Some(team) = teams.iter().find(|t| t.name_any() == order.borrower) {
                notify.push((team.object_ref(&()), String::new()));
            }
            // Both teams' members see it in their own namespaces.
            for (team, namespaces) in [
                (&order.borrower, borrower_namespaces),
                (&order.for_team, waiting_namespaces),
            ] {
                let reference = ObjectReference {
                    kind: Some("TeamGpuPolicy".into()),
                    name: Some(team.clone()),
                    ..Default::default()
                };
                notify.extend(in_team_namespaces(&reference, namespaces));
            }
            Eviction {
                namespace,
                pod,
                order: order.clone(),
                notify,
            }
        })
        .collect()
}

/// The Pods to evict so that up to `devices` devices of `class` come free in `namespaces`: the
/// Pods holding the newest allocated claims first (the least work lost). A claim holding more
/// than what is still to free is passed over: `devices` is what the borrower holds above its
/// own fair entitlement, and evicting more would take it below its guarantee.
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

/// The Events that tell of an eviction's outcome: `Ok`, or `Err` with why it was refused.
pub fn eviction_events(eviction: &Eviction, outcome: Result<(), &str>) -> Vec<Event> {
    let (e, order) = (eviction, &eviction.order);
    let (reason, note) = match outcome {
        Ok(()) => (
            "Reclaimed",
            format!(
                "evicting {}/{}: {} borrowed {} devices of {} that {} needs back",
                e.namespace,
                e.pod,
                order.borrower,
                order.devices,
                order.sharing_policy,
                order.for_team
            ),
        ),
        Err(refusal) => (
            "EvictionRefused",
            format!(
                "could not evict {}/{} to give {} devices of {} back to {}: {refusal}; retrying",
                e.namespace, e.pod, order.devices, order.sharing_policy, order.for_team
            ),
        ),
    };
    e.notify
        .iter()
        .map(|(regarding, prefix)| Event {
            regarding: regarding.clone(),
            type_: EventType::Warning,
            reason,
            action: "Evict",
            note: format!("{prefix}{note}"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::core::plan::TeamReport;

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

    /// Team `owner` (namespace `o`) waits for 1 device of sharing policy `a` that `borrower`
    /// (namespace `b`) holds.
    fn plan() -> Plan {
        let team = |name: &str, namespace: &str| TeamReport {
            name: name.into(),
            namespaces: vec![namespace.into()],
            ..TeamReport::default()
        };
        Plan {
            teams: vec![team("owner", "o"), team("borrower", "b")],
            reclaims: vec![order()],
            ..Plan::default()
        }
    }

    fn order() -> ReclaimOrder {
        ReclaimOrder {
            sharing_policy: "a".into(),
            borrower: "borrower".into(),
            devices: 1,
            for_team: "owner".into(),
        }
    }

    fn team(name: &str, reclaim: serde_json::Value) -> TeamGpuPolicy {
        serde_json::from_value(json!({
            "apiVersion": "teamgpu.io/v1alpha1", "kind": "TeamGpuPolicy",
            "metadata": {"name": name, "uid": format!("u-{name}")},
            "spec": {"reclaim": reclaim}
        }))
        .unwrap()
    }

    fn teams(owner_reclaim: serde_json::Value) -> Vec<TeamGpuPolicy> {
        vec![team("owner", owner_reclaim), team("borrower", json!({}))]
    }

    fn claims() -> Vec<Arc<ClaimView>> {
        vec![
            Arc::new(claim("old", "2026-01-01T00:00:00Z", 1, "p-old")),
            Arc::new(claim("new", "2026-03-01T00:00:00Z", 1, "p-new")),
        ]
    }

    const OFF: ReclaimDefaults = ReclaimDefaults {
        enabled: false,
        grace: Duration::from_secs(120),
    };

    /// A tracker for the waiting team, from `t0`.
    struct Waiting {
        teams: Vec<TeamGpuPolicy>,
        defaults: ReclaimDefaults,
        tracker: ReclaimTracker,
        t0: Instant,
    }

    impl Waiting {
        /// The team opted in with a grace period of 30 s.
        fn new() -> Self {
            Self::with(json!({"enabled": true, "gracePeriodSeconds": 30}), OFF)
        }

        /// The team's `spec.reclaim` is `reclaim`; the operator's defaults are `defaults`.
        fn with(reclaim: serde_json::Value, defaults: ReclaimDefaults) -> Self {
            Waiting {
                teams: teams(reclaim),
                defaults,
                tracker: ReclaimTracker::default(),
                t0: Instant::now(),
            }
        }

        /// The Pods evicted in a pass of `plan` at `secs` after `t0`.
        fn pass(&mut self, plan: &Plan, secs: u64) -> Vec<String> {
            let now = self.t0 + Duration::from_secs(secs);
            let evictions =
                self.tracker
                    .evictions(plan, &self.teams, &claims(), self.defaults, now);
            evictions
                .iter()
                .map(|e| format!("{}/{}", e.namespace, e.pod))
                .collect()
        }

        fn wakes_at(&self) -> Option<u64> {
            let at = self.tracker.next_attempt()?;
            Some(at.duration_since(self.t0).as_secs())
        }
    }

    #[test]
    fn an_opted_in_team_evicts_once_its_grace_period_has_passed() {
        let mut waiting = Waiting::new();
        assert!(waiting.pass(&plan(), 0).is_empty());
        assert_eq!(waiting.wakes_at(), Some(30), "woken when the grace ends");
        assert!(waiting.pass(&plan(), 29).is_empty());
        assert_eq!(waiting.pass(&plan(), 30), ["b/p-new"]);
        assert_eq!(waiting.wakes_at(), None);
        // A refused eviction wakes the loop 10 s later.
        waiting
            .tracker
            .refused(waiting.t0 + Duration::from_secs(31));
        assert_eq!(waiting.wakes_at(), Some(41));
        waiting
            .tracker
            .clear_due(waiting.t0 + Duration::from_secs(41));
        assert_eq!(waiting.wakes_at(), None);
    }

    #[test]
    fn a_reclaim_no_longer_ordered_starts_its_grace_period_again() {
        let mut waiting = Waiting::new();
        waiting.pass(&plan(), 0);
        let settled = Plan {
            reclaims: Vec::new(),
            ..plan()
        };
        assert!(waiting.pass(&settled, 10).is_empty());
        assert_eq!(waiting.wakes_at(), None);
        assert!(
            waiting.pass(&plan(), 30).is_empty(),
            "the grace period starts again at 30 s"
        );
        assert_eq!(waiting.wakes_at(), Some(60));
    }

    #[test]
    fn a_team_reclaims_only_when_it_or_the_operators_default_opts_in() {
        let evicted = |reclaim, defaults, secs| {
            let mut waiting = Waiting::with(reclaim, defaults);
            waiting.pass(&plan(), 0);
            waiting.pass(&plan(), secs)
        };
        let on = ReclaimDefaults {
            enabled: true,
            ..OFF
        };
        let none = Vec::<String>::new();
        assert_eq!(evicted(json!({}), OFF, 120), none);
        assert_eq!(evicted(json!({}), on, 120), ["b/p-new"]);
        assert_eq!(evicted(json!({"enabled": false}), on, 120), none);
        assert_eq!(evicted(json!({"enabled": true}), OFF, 120), ["b/p-new"]);
        // The operator's grace period (120 s) applies to a team that sets none.
        assert_eq!(evicted(json!({}), on, 119), none);
    }

    #[test]
    fn an_eviction_is_told_on_the_pod_the_borrower_and_in_both_teams_namespaces() {
        let teams = teams(json!({"enabled": true, "gracePeriodSeconds": 0}));
        let mut tracker = ReclaimTracker::default();
        let [eviction] = &tracker.evictions(&plan(), &teams, &claims(), OFF, Instant::now())[..]
        else {
            panic!("one eviction")
        };
        let reference =
            |api_version: &str, kind: &str, namespace: Option<&str>, name: &str| ObjectReference {
                api_version: Some(api_version.into()),
                kind: Some(kind.into()),
                namespace: namespace.map(Into::into),
                name: Some(name.into()),
                ..Default::default()
            };
        let borrower = ObjectReference {
            uid: Some("u-borrower".into()),
            ..reference("teamgpu.io/v1alpha1", "TeamGpuPolicy", None, "borrower")
        };
        let told = |reason: &'static str, note: &str| -> Vec<Event> {
            [
                (reference("v1", "Pod", Some("b"), "p-new"), String::new()),
                (borrower.clone(), String::new()),
                (
                    reference("v1", "ResourceQuota", Some("b"), "teamgpu"),
                    "TeamGpuPolicy borrower: ".to_owned(),
                ),
                (
                    reference("v1", "ResourceQuota", Some("o"), "teamgpu"),
                    "TeamGpuPolicy owner: ".to_owned(),
                ),
            ]
            .into_iter()
            .map(|(regarding, prefix)| Event {
                regarding,
                type_: EventType::Warning,
                reason,
                action: "Evict",
                note: format!("{prefix}{note}"),
            })
            .collect()
        };
        assert_eq!(
            eviction_events(eviction, Ok(())),
            told(
                "Reclaimed",
                "evicting b/p-new: borrower borrowed 1 devices of a that owner needs back"
            )
        );
        assert_eq!(
            eviction_events(eviction, Err("a PodDisruptionBudget")),
            told(
                "EvictionRefused",
                "could not evict b/p-new to give 1 devices of a back to owner: a PodDisruptionBudget; retrying"
            )
        );
    }
}
