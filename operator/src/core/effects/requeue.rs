//! Waking Pods that wait for room teamgpu has made. Pure.
//!
//! kube-controller-manager's resourceclaim controller tries again to create a claim that quota
//! refused with a per-Pod backoff (5 ms, doubling up to 1,000 s), and nothing tries it again
//! when a ResourceQuota changes: a Pod that waited 20 minutes would notice new room a quarter of
//! an hour late. The controller does try every Pod of a ResourceClaimTemplate again at once when
//! the template changes, so teamgpu changes an annotation of its own template. That needs no
//! RBAC beyond applying the templates; annotating the Pods would need `patch` on every Pod.
//!
//! Which templates: a namespace's waiting Pods, highest priority first and then the longest
//! waiting, as many as its room fits; each one's template. Every Pod of a touched template is
//! tried again, and quota takes them in the order the controller creates their claims: the
//! order is exact across templates, not among the Pods of one template.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::jiff::Timestamp;

use crate::core::plan::Plan;
pub use crate::core::plan::pending::WaitingPod;
use crate::core::plan::usage::{ClaimView, DEVICES_PER_CLASS_SUFFIX};

/// The annotation teamgpu changes on a template to wake the Pods that wait for its claims.
pub const REQUEUE_ANNOTATION: &str = "teamgpu.io/requeued-at";

/// The first retry of a wake-up that did not take (quota's cache may not have had the new
/// room yet); it doubles up to [`RETRY_MAX`], and stops after [`RETRIES`].
const RETRY_FIRST: Duration = Duration::from_secs(1);
const RETRY_MAX: Duration = Duration::from_secs(30);
const RETRIES: u32 = 6;

/// Change `template`'s requeue annotation to `value`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Requeue {
    pub namespace: String,
    pub template: String,
    pub value: String,
}

/// A template woken, for the room it was woken for.
#[derive(Debug)]
struct Woken {
    room: Vec<(String, u64)>,
    at: Instant,
    retries: u32,
}

/// Which templates were woken for which room, so that the same room wakes a template once
/// (and a few retries), and when a retry is due.
#[derive(Debug, Default)]
pub struct Requeuer {
    woken: BTreeMap<(String, String), Woken>,
    next_attempt: Option<Instant>,
}

/// Room per (namespace, DeviceClass): the quota's hard in the plan less what the namespace's
/// claims are charged; only for `namespaces`.
pub fn room(
    plan: &Plan,
    claims: &[Arc<ClaimView>],
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
    for claim in claims.iter().filter(|c| namespaces.contains(&*c.namespace)) {
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

    /// The templates to wake at `now` (`wall` names the moment in the annotation), given the
    /// `waiting` Pods and the `room` per (namespace, class). A template is woken when room for
    /// one of its waiting Pods appears, and again after 1, 2, 4 ... 30 s while that Pod still
    /// waits with the same room; waking stops after six retries until the room changes.
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
                    template: key.1,
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

/// The templates whose Pods the room fits, each with the room of its namespace for the classes
/// it charges: per namespace, the waiting Pods by priority (highest first), then age (oldest
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
        out.entry((pod.namespace.clone(), pod.template.clone()))
            .or_insert(snapshot);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, template: &str, devices: u64, priority: i32, created: &str) -> WaitingPod {
        WaitingPod {
            namespace: "ml".into(),
            name: name.into(),
            template: template.into(),
            priority,
            created: created.parse().ok(),
            charge: BTreeMap::from([("a.teamgpu.io".to_owned(), devices)]),
        }
    }

    fn room(devices: u64) -> BTreeMap<(String, String), u64> {
        BTreeMap::from([(("ml".to_owned(), "a.teamgpu.io".to_owned()), devices)])
    }

    fn templates(requeues: &[Requeue]) -> Vec<&str> {
        requeues.iter().map(|r| r.template.as_str()).collect()
    }

    #[test]
    fn room_wakes_the_templates_of_the_pods_it_fits_highest_priority_first() {
        let waiting = [
            pod("old-low", "a-x4", 4, 0, "2026-01-01T00:00:00Z"),
            pod("new-high", "a-x8", 8, 1000, "2026-01-02T00:00:00Z"),
            pod("small", "a", 1, 0, "2026-01-03T00:00:00Z"),
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
            templates(&Requeuer::default().requeues(&waiting, &room(8), t0, wall)),
            ["a-x8"]
        );
        // 5: the 8-GPU Pod does not fit; the 4-GPU Pod and then the 1-GPU Pod do.
        assert_eq!(
            templates(&Requeuer::default().requeues(&waiting, &room(5), t0, wall)),
            ["a", "a-x4"]
        );
        // A class without a teamgpu quota in the namespace is not waited for here.
        assert!(
            Requeuer::default()
                .requeues(&waiting, &BTreeMap::new(), t0, wall)
                .is_empty()
        );
    }

    #[test]
    fn the_same_room_wakes_a_template_once_then_retries_with_backoff_then_stops() {
        let waiting = [pod("p", "a-x4", 4, 0, "2026-01-01T00:00:00Z")];
        let mut requeuer = Requeuer::default();
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let wall = Timestamp::UNIX_EPOCH;
        let woken = |r: &mut Requeuer, s| r.requeues(&waiting, &room(4), at(s), wall).len();
        assert_eq!(woken(&mut requeuer, 0), 1);
        assert_eq!(requeuer.next_attempt(), Some(at(1)));
        assert_eq!(
            woken(&mut requeuer, 0),
            0,
            "not again for the same room at once"
        );
        // Still waiting: retried after 1, 2, 4, 8, 16 and 30 s, then no more.
        let mut retried_at = Vec::new();
        for s in 1..200 {
            if woken(&mut requeuer, s) == 1 {
                retried_at.push(s);
            }
        }
        assert_eq!(retried_at, [1, 3, 7, 15, 31, 61]);
        assert_eq!(requeuer.next_attempt(), None);
        // New room wakes it again.
        assert_eq!(
            requeuer.requeues(&waiting, &room(5), at(300), wall).len(),
            1
        );
        // The Pod got its claim: forgotten.
        assert!(requeuer.requeues(&[], &room(5), at(301), wall).is_empty());
        assert_eq!(requeuer.next_attempt(), None);
    }
}
