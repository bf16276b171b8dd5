//! Waking Pods that wait for room teamgpu has made. Pure.
//!
//! kube-controller-manager's resourceclaim controller tries again to create a claim that quota
//! refused with a per-Pod backoff (5 ms, doubling up to 1,000 s), and nothing tries it again
//! when a ResourceQuota changes: a Pod that waited 20 minutes would notice new room a quarter of
//! an hour late. A change to the Pod itself makes the controller try it again at once, so
//! teamgpu changes an annotation of each Pod the room fits.
//!
//! Not the template's annotation, though the 1.36 controller tries every Pod of a changed
//! template again, and that needs no RBAC on Pods: it tries the *finished* Pods too, and makes a
//! claim again for each one whose claim it had deleted (nothing stops it for a Pod that is done),
//! then deletes it again. Each such claim is charged to the namespace's quota while it exists,
//! so waking a template with many finished Pods (a Job's, kept until its TTL) filled the room
//! with claims nobody runs and refused the Pods it was for. Measured by the workload replay:
//! 1,135 claims for 439 Pods in one run, against 620 for 450 without teamgpu.
//!
//! Which Pods: a namespace's waiting Pods, highest priority first and then the longest waiting,
//! as many as its room fits.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use k8s_openapi::jiff::Timestamp;

use crate::core::plan::Plan;
pub use crate::core::plan::pending::WaitingPod;
use crate::core::plan::usage::{ClaimView, DEVICES_PER_CLASS_SUFFIX};

/// The annotation teamgpu changes on a waiting Pod to wake it.
pub const REQUEUE_ANNOTATION: &str = "teamgpu.io/requeued-at";

/// The first retry of a wake-up that did not take; it doubles up to [`RETRY_MAX`], and stops
/// after [`RETRIES`]. The room is teamgpu's count (the plan's hard less the claims it sees),
/// which runs ahead of the quota admission judges by: the quota's `status.used`, lowered by
/// kube-controller-manager's quota controller a moment after a claim goes. Each wake the quota
/// refuses adds to the Pod's backoff in the controller, so the retries do not wait for it: the
/// first ones come soon, so that a Pod starts within about the quota controller's lag.
const RETRY_FIRST: Duration = Duration::from_millis(250);
const RETRY_MAX: Duration = Duration::from_secs(30);
const RETRIES: u32 = 9;

/// Change the requeue annotation of the Pod `pod` to `value`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Requeue {
    pub namespace: String,
    pub pod: String,
    pub value: String,
}

/// A Pod woken, for the room it was woken for.
#[derive(Debug)]
struct Woken {
    room: Vec<(String, u64)>,
    at: Instant,
    retries: u32,
}

/// Which Pods were woken for which room, so that the same room wakes a Pod once (and a few
/// retries), and when a retry is due.
#[derive(Debug, Default)]
pub struct Requeuer {
    woken: BTreeMap<(String, String), Woken>,
    next_attempt: Option<Instant>,
}

/// Room per (namespace, DeviceClass): the quota's hard in the plan less what the namespace's
/// claims are charged; only for `namespaces`.
pub fn room<'c>(
    plan: &Plan,
    claims: impl IntoIterator<Item = &'c ClaimView>,
    namespaces: &BTreeSet<&str>,
) -> BTreeMap<(String, String), u64> {
    let mut out = BTreeMap::new();
    for quota in &plan.objects.resource_quotas {
        if !namespaces.contains(&*quota.namespace) {
            continue;
        }
        for (resource, hard) in quota.hard() {
            if let Some(class) = resource.strip_suffix(DEVICES_PER_CLASS_SUFFIX) {
                out.insert(
                    (quota.namespace.to_string(), class.to_owned()),
                    u64::from(hard),
                );
            }
        }
    }
    for claim in claims
        .into_iter()
        .filter(|c| namespaces.contains(&*c.namespace))
    {
        for (class, n) in &claim.charge {
            if let Some(room) = out.get_mut(&(claim.namespace.to_string(), class.to_string())) {
                *room = room.saturating_sub(*n);
            }
        }
    }
    out
}

impl Requeuer {
    /// When a retry is due.
    pub fn next_attempt(&self) -> Option<Instant> {
        self.next_attempt
    }

    /// Forgets a retry that is due (the pass about to run sets the next one), so that a pass
    /// that does not reach this (a replica that is not the leader) cannot wake the loop again
    /// and again.
    pub fn clear_due(&mut self, now: Instant) {
        if self.next_attempt.is_some_and(|t| t <= now) {
            self.next_attempt = None;
        }
    }

    /// The Pods to wake at `now` (`wall` names the moment in the annotation), given the
    /// `waiting` Pods and the `room` per (namespace, class). A Pod is woken when room for it
    /// appears, and again after 0.25, 0.5, 1, 2 ... 30 s while it still waits with the same
    /// room; waking stops after nine retries until the room changes.
    pub fn requeues(
        &mut self,
        waiting: &[WaitingPod],
        room: &BTreeMap<(String, String), u64>,
        now: Instant,
        wall: Timestamp,
    ) -> Vec<Requeue> {
        let wanted = fitting(waiting, room);
        self.woken.retain(|key, _| wanted.contains_key(key));
        let mut out = Vec::new();
        for (key, room) in wanted {
            let due = match self.woken.get_mut(&key) {
                Some(w) if w.room == room => {
                    let due = w.retries < RETRIES && now >= w.at + retry_after(w.retries);
                    if due {
                        w.retries += 1;
                        w.at = now;
                    }
                    due
                }
                _ => {
                    self.woken.insert(
                        key.clone(),
                        Woken {
                            room,
                            at: now,
                            retries: 0,
                        },
                    );
                    true
                }
            };
            if due {
                out.push(Requeue {
                    namespace: key.0,
                    pod: key.1,
                    value: wall.to_string(),
                });
            }
        }
        self.next_attempt = (self.woken.values())
            .filter(|w| w.retries < RETRIES)
            .map(|w| w.at + retry_after(w.retries))
            .min();
        out
    }
}

fn retry_after(retries: u32) -> Duration {
    RETRY_FIRST
        .saturating_mul(1 << retries.min(16))
        .min(RETRY_MAX)
}

/// The Pods the room fits, each with the room of its namespace for the classes it charges: per
/// namespace, the waiting Pods by priority (highest first), then age (oldest
/// first), each taken when its charge fits what the Pods before it left.
fn fitting(
    waiting: &[WaitingPod],
    room: &BTreeMap<(String, String), u64>,
) -> BTreeMap<(String, String), Vec<(String, u64)>> {
    let mut order: Vec<&WaitingPod> = waiting.iter().collect();
    order.sort_by(|a, b| {
        (a.namespace.cmp(&b.namespace))
            .then(b.priority.cmp(&a.priority))
            .then(
                a.created
                    .unwrap_or(Timestamp::MAX)
                    .cmp(&b.created.unwrap_or(Timestamp::MAX)),
            )
            .then(a.name.cmp(&b.name))
    });
    let mut left = room.clone();
    let mut out = BTreeMap::new();
    for pod in order {
        let key = |class: &String| (pod.namespace.clone(), class.clone());
        // A class without a teamgpu quota in the namespace is not what this Pod waits for.
        let Some(snapshot) = (pod.charge.keys())
            .map(|class| Some((class.clone(), *room.get(&key(class))?)))
            .collect::<Option<Vec<_>>>()
        else {
            continue;
        };
        let fits = (pod.charge.iter()).all(|(class, n)| left.get(&key(class)) >= Some(n));
        if !fits || pod.charge.values().all(|n| *n == 0) {
            continue;
        }
        for (class, n) in &pod.charge {
            if let Some(room) = left.get_mut(&key(class)) {
                *room -= n;
            }
        }
        out.insert((pod.namespace.clone(), pod.name.clone()), snapshot);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, devices: u64, priority: i32, created: &str) -> WaitingPod {
        WaitingPod {
            namespace: "ml".into(),
            name: name.into(),
            priority,
            created: created.parse().ok(),
            charge: BTreeMap::from([("a.teamgpu.io".to_owned(), devices)]),
        }
    }

    fn room(devices: u64) -> BTreeMap<(String, String), u64> {
        BTreeMap::from([(("ml".to_owned(), "a.teamgpu.io".to_owned()), devices)])
    }

    fn pods(requeues: &[Requeue]) -> Vec<&str> {
        requeues.iter().map(|r| r.pod.as_str()).collect()
    }

    #[test]
    fn room_wakes_the_pods_it_fits_highest_priority_first() {
        let waiting = [
            pod("old-low", 4, 0, "2026-01-01T00:00:00Z"),
            pod("new-high", 8, 1000, "2026-01-02T00:00:00Z"),
            pod("small", 1, 0, "2026-01-03T00:00:00Z"),
        ];
        let (t0, wall) = (Instant::now(), Timestamp::UNIX_EPOCH);
        // No room: nothing to wake.
        assert!(
            Requeuer::default()
                .requeues(&waiting, &room(0), t0, wall)
                .is_empty()
        );
        // 8 devices: the high-priority 8-GPU Pod takes them all, though the others waited longer.
        assert_eq!(
            pods(&Requeuer::default().requeues(&waiting, &room(8), t0, wall)),
            ["new-high"]
        );
        // 5: the 8-GPU Pod does not fit; the 4-GPU Pod and then the 1-GPU Pod do.
        assert_eq!(
            pods(&Requeuer::default().requeues(&waiting, &room(5), t0, wall)),
            ["old-low", "small"]
        );
        // A class without a teamgpu quota in the namespace is not waited for here.
        assert!(
            Requeuer::default()
                .requeues(&waiting, &BTreeMap::new(), t0, wall)
                .is_empty()
        );
    }

    #[test]
    fn the_same_room_wakes_a_pod_once_then_retries_with_backoff_then_stops() {
        let waiting = [pod("p", 4, 0, "2026-01-01T00:00:00Z")];
        let mut requeuer = Requeuer::default();
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let wall = Timestamp::UNIX_EPOCH;
        let woken = |r: &mut Requeuer, ms| r.requeues(&waiting, &room(4), at(ms), wall).len();
        assert_eq!(woken(&mut requeuer, 0), 1);
        assert_eq!(requeuer.next_attempt(), Some(at(250)));
        assert_eq!(
            woken(&mut requeuer, 0),
            0,
            "not again for the same room at once"
        );
        // Still waiting: retried after 0.25, 0.5, 1, 2, 4, 8, 16, 30 and 30 s, then no more.
        let mut retried_at = Vec::new();
        for ms in (50..200_000).step_by(50) {
            if woken(&mut requeuer, ms) == 1 {
                retried_at.push(ms);
            }
        }
        assert_eq!(
            retried_at,
            [250, 750, 1750, 3750, 7750, 15750, 31750, 61750, 91750]
        );
        assert_eq!(requeuer.next_attempt(), None);
        // New room wakes it again.
        assert_eq!(
            requeuer
                .requeues(&waiting, &room(5), at(300_000), wall)
                .len(),
            1
        );
        // The Pod got its claim: forgotten.
        assert!(
            requeuer
                .requeues(&[], &room(5), at(301_000), wall)
                .is_empty()
        );
        assert_eq!(requeuer.next_attempt(), None);
    }
}
