//! Reclaim: when the fair-share engine names borrowers that must give devices back to a team
//! waiting below its guarantee, and that team opted in, whole workloads of the borrowers are
//! evicted (through the Eviction API, which enforces PodDisruptionBudgets) after a grace period.
//! Which workloads: [`victims::choose`]; what a workload is: [`workload`]; whether budgets let
//! all of a workload's Pods go: [`budgets`], counted as reclaim chooses ([`kept`]). A workload
//! whose eviction was refused is passed over for a while, so that another may cover the
//! shortfall.

pub mod budgets;
mod kept;
pub mod moves;
pub mod nodes;
mod notes;
pub mod suspended;
pub mod victims;
pub mod workload;

pub use notes::{Taken, eviction_events};

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::jiff::Timestamp;
use kube::{Resource, ResourceExt};

use super::{Event, Eviction, EvictionWhy, in_team_namespaces};
use crate::api::{QuotaStatus, TeamGpuPolicy};
use crate::core::plan::inventory::DeviceId;
use crate::core::plan::usage::ClaimView;
use crate::core::plan::{Plan, ReclaimOrder, TeamReport, objects};
use budgets::BudgetView;
use kept::{PassBudgets, choose_within_budgets, from_borrowers};
use notes::waiting_note;
use victims::Borrower;
use workload::{NodeOf, PodView, Workload, label_elsewhere, queued, workloads};

/// How soon a refused eviction (a PodDisruptionBudget) is tried again; meanwhile its workload is
/// passed over, so that another may cover the shortfall.
const RETRY_REFUSED: Duration = Duration::from_secs(10);

/// How long devices count as on their way back: those of an evicted Pod the Pod cache does not
/// show being deleted yet (the watch brings it within moments; a Pod still there after this was
/// not evicted after all, deleted and recreated under its name, say), and those of a claim still
/// allocated whose Pods are gone (the claim controller frees it within moments; one still
/// allocated after this is kept on purpose).
const IN_FLIGHT_AT_MOST: Duration = Duration::from_secs(60);

/// How long a workload's evictions are remembered: longer than a Job controller's longest
/// backoff before it makes a failed Pod again (6 minutes).
const EVICTIONS_REMEMBERED: Duration = Duration::from_secs(10 * 60);

/// What a team that says nothing in `spec.reclaim` gets.
#[derive(Clone, Copy, Debug)]
pub struct ReclaimDefaults {
    /// Whether teams reclaim borrowed devices by eviction.
    pub enabled: bool,
    /// How long a team waits below its guarantee before borrowers' workloads are evicted.
    pub grace: Duration,
    /// How long a borrower's workload runs before it may be evicted.
    pub min_runtime: Duration,
}

/// What reclaim reads: the plan, the teams' settings, the claims and the Pods not done yet.
#[derive(Clone, Copy, Debug)]
pub struct ReclaimInput<'a> {
    pub plan: &'a Plan,
    pub teams: &'a [TeamGpuPolicy],
    pub claims: &'a [Arc<ClaimView>],
    pub pods: &'a [Arc<PodView>],
    /// Every PodDisruptionBudget.
    pub budgets: &'a [Arc<BudgetView>],
}

/// What a reclaim pass asks for: evictions, and Events that say why a reclaim waits.
#[derive(Debug, Default)]
pub struct Reclaimed {
    pub evictions: Vec<Eviction>,
    pub events: Vec<Event>,
}

/// Since when each (sharing policy, waiting team) has been owed devices, and when a pass must
/// run for reclaim even if nothing changes.
#[derive(Debug, Default)]
pub struct ReclaimTracker {
    waiting_since: BTreeMap<(String, String), Instant>,
    next_attempt: Option<Instant>,
    /// Pods the Eviction API evicted (namespace, name), and when, until the Pod cache shows
    /// them being deleted: a pass in between counts their workload as on its way out, instead
    /// of evicting another one for the same shortfall.
    evicted: BTreeMap<(String, String), Instant>,
    /// Claims that no Pod holds any more but still hold devices ([`workload::workloads`]): since
    /// when, and the pass that saw them last. Counted as on their way back for a minute, then
    /// not at all; forgotten by a pass that no longer sees them.
    released: BTreeMap<String, (Instant, Instant)>,
    /// Workloads whose eviction was refused (their Pods), and when.
    refused: BTreeMap<Vec<(String, String)>, Instant>,
    /// Workloads moved to make room on their node ([`moves`]), by name, and when.
    moved: BTreeMap<String, Instant>,
    /// Workloads taken back, moved or dequeued, by team and name (two teams' Pods may carry
    /// the same workload label): how many times, and when last; forgotten
    /// [`EVICTIONS_REMEMBERED`] after. Of otherwise equal choices, the one taken fewer times
    /// goes ([`Workload::evicted_before`]).
    evicted_workloads: BTreeMap<String, BTreeMap<String, (u32, Instant)>>,
}

impl ReclaimTracker {
    /// When the reconcile loop must run again for reclaim even if nothing changes: a grace
    /// period ends, a workload reaches its minimum runtime, or a refused eviction is due to be
    /// retried.
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

    /// The eviction of the workload of `pods` was refused at `at`: a pass now may choose
    /// another workload instead; this one is tried again `RETRY_REFUSED` (10 s) later.
    pub fn refused(&mut self, pods: Vec<(String, String)>, at: Instant) {
        self.refused.insert(pods, at);
        self.wake_at(at);
    }

    /// Forgets the refusals older than [`RETRY_REFUSED`], wakes a pass when the next of the
    /// others ends, and takes the workloads they name out of the borrowers' choice.
    fn pass_over_refused(&mut self, borrowers: &mut [Borrower], now: Instant) {
        self.refused
            .retain(|_, at| now.duration_since(*at) < RETRY_REFUSED);
        let Some(first) = self.refused.values().min().copied() else {
            return;
        };
        self.wake_at(first + RETRY_REFUSED);
        let refused = |w: &Workload| self.refused.keys().any(|key| w.has_pods(key));
        for b in borrowers.iter_mut() {
            b.workloads.retain(|w| !refused(w));
            b.queued.retain(|w| !refused(w));
        }
    }

    /// Every Pod of `workload` of `team` (as an [`Eviction`] names them) went at `at`.
    pub fn workload_evicted(&mut self, (team, workload): (String, String), at: Instant) {
        let of_team = self.evicted_workloads.entry(team).or_default();
        let times = of_team.entry(workload).or_insert((0, at));
        *times = (times.0 + 1, at);
    }

    /// The Eviction API evicted `pod` (namespace, name) at `at`.
    pub fn evicted(&mut self, pod: (String, String), at: Instant) {
        self.evicted.insert(pod, at);
    }

    /// Forgets evicted Pods the cache shows being deleted or gone, or that it still shows as
    /// running long after; marks the workloads of the others as terminating. Drops the released
    /// claims seen for more than a minute. Tells each workload how often it was evicted lately.
    fn count_in_flight(&mut self, pods: &[Arc<PodView>], borrowers: &mut [Borrower], now: Instant) {
        for b in borrowers.iter_mut() {
            let Some(of_team) = self.evicted_workloads.get(&b.team) else {
                continue;
            };
            for w in &mut b.workloads {
                w.evicted_before = of_team.get(&w.name).map_or(0, |e| e.0);
            }
        }
        // Released claims: a claim still allocated a minute after its Pods went is not being
        // freed (an allocation kept on purpose) and counts for nothing.
        let released = (borrowers.iter().flat_map(|b| &b.workloads)).filter(|w| w.pods.is_empty());
        for w in released {
            self.released.entry(w.name.clone()).or_insert((now, now)).1 = now;
        }
        for b in borrowers.iter_mut() {
            b.workloads.retain(|w| {
                !w.pods.is_empty()
                    || (self.released.get(&w.name))
                        .is_some_and(|(since, _)| now.duration_since(*since) < IN_FLIGHT_AT_MOST)
            });
        }
        if self.evicted.is_empty() {
            return;
        }
        let running: std::collections::BTreeSet<(&str, &str)> = (pods.iter())
            .filter(|p| !p.terminating)
            .map(|p| (&*p.namespace, &*p.name))
            .collect();
        self.evicted.retain(|(namespace, name), at| {
            running.contains(&(namespace.as_str(), name.as_str()))
                && now.duration_since(*at) < IN_FLIGHT_AT_MOST
        });
        for w in borrowers.iter_mut().flat_map(|b| b.workloads.iter_mut()) {
            if !w.terminating && !w.pods.is_empty() && w.pods.iter().all(|p| self.is_evicted(p)) {
                w.terminating = true;
            }
        }
    }

    /// Whether the Eviction API evicted `pod` and the Pod cache does not show it going yet.
    fn is_evicted(&self, (namespace, name): &(Arc<str>, Arc<str>)) -> bool {
        (self.evicted).contains_key(&(namespace.to_string(), name.to_string()))
    }

    /// The removal of the `queued` workloads (each with its team, borrowing what they are
    /// charged) that the Eviction API has not taken yet. They go before the evictions: the
    /// scheduler would give them the room the evictions make (quota charged them while their
    /// team could borrow), and their claims, made again, wait for quota now.
    fn dequeue<'w>(
        &self,
        input: ReclaimInput<'_>,
        queued: impl IntoIterator<Item = (&'w str, &'w Workload)>,
        order: &dyn Fn(&str) -> ReclaimOrder,
        waiting_namespaces: &[String],
    ) -> Vec<Eviction> {
        (queued.into_iter())
            .filter(|(_, w)| !w.pods.iter().all(|p| self.is_evicted(p)))
            .map(|(team, w)| {
                eviction(
                    input,
                    order(team),
                    w,
                    (waiting_namespaces, EvictionWhy::Queued),
                )
            })
            .collect()
    }

    /// The waiting `team`'s policy and minimum runtime, if it reclaims and has waited its grace
    /// period for devices of `policy` (a wait seen for the first time starts it; a pass is woken
    /// when it ends).
    fn due<'t>(
        &mut self,
        input: ReclaimInput<'t>,
        defaults: ReclaimDefaults,
        (policy, team): (&str, &str),
        now: Instant,
    ) -> Option<(&'t TeamGpuPolicy, u64)> {
        let waiting = input.teams.iter().find(|t| t.name_any() == team)?;
        let (grace, min_runtime) = opted_in(waiting, defaults)?;
        let key = (policy.to_owned(), team.to_owned());
        let since = *self.waiting_since.entry(key).or_insert(now);
        if now.duration_since(since) < grace {
            self.wake_at(since + grace);
            return None;
        }
        Some((waiting, min_runtime))
    }

    /// Wakes a pass at `at` on the Pods' clock (`wall` being `now`): when a workload too young
    /// now reaches the minimum runtime.
    fn wake_when_eligible(&mut self, at: Option<Timestamp>, (now, wall): (Instant, Timestamp)) {
        if let Some(at) = at {
            let wait = (at.as_second() - wall.as_second()).max(0);
            self.wake_at(now + Duration::from_secs(wait.unsigned_abs()));
        }
    }

    fn wake_at(&mut self, at: Instant) {
        self.next_attempt = Some(self.next_attempt.map_or(at, |t| t.min(at)));
    }

    /// The evictions due at `now` (`wall` on the clock that Pods' start times are on): for every
    /// team the plan's reclaims wait for, that opted in (its `spec.reclaim`, or `defaults`) and
    /// has waited its grace period, the borrowers' workloads that cover what it is short. A
    /// reclaim seen for the first time starts its grace period; one no longer ordered is
    /// forgotten.
    pub fn evictions(
        &mut self,
        input: ReclaimInput<'_>,
        defaults: ReclaimDefaults,
        now: Instant,
        wall: Timestamp,
    ) -> Reclaimed {
        let owed = owed_by_team(&input.plan.reclaims);
        let fragmented = moves::fragmented(input.plan, &owed);
        (self.waiting_since).retain(|k, _| owed.contains_key(k) || fragmented.contains_key(k));
        self.next_attempt = None;
        (self.moved).retain(|_, at| now.duration_since(*at) < moves::MOVED_AGAIN_AFTER);
        self.evicted_workloads.retain(|_, of_team| {
            of_team.retain(|_, (_, at)| now.duration_since(*at) < EVICTIONS_REMEMBERED);
            !of_team.is_empty()
        });
        let mut out = Reclaimed::default();
        let mut budgets = PassBudgets::new(input.budgets, input.pods);
        for ((policy, team), orders) in &owed {
            let Some(waiting) = self.due(input, defaults, (policy, team), now) else {
                continue;
            };
            let owed = (policy.as_str(), team.as_str(), orders.as_slice());
            self.reclaim_for(input, owed, waiting, (now, wall), &mut budgets, &mut out);
        }
        self.move_for(
            input,
            &fragmented,
            defaults,
            (now, wall),
            &mut budgets,
            &mut out,
        );
        self.released.retain(|_, (_, seen)| *seen == now);
        out
    }

    /// What reclaim takes for `team`, owed devices of `policy` by the borrowers of `orders`, that
    /// reclaims (`waiting`, its minimum runtime) and has waited its grace period: the borrowers'
    /// workloads, where its claims fit no node those that make room on one, with other teams'
    /// workloads moved where the borrowers' alone do not ([`moves`]); and an Event that says why
    /// when that does not cover its shortfall.
    fn reclaim_for(
        &mut self,
        input: ReclaimInput<'_>,
        (policy, team, orders): (&str, &str, &[&ReclaimOrder]),
        (waiting, min_runtime): (&TeamGpuPolicy, u64),
        (now, wall): (Instant, Timestamp),
        budgets: &mut PassBudgets<'_>,
        out: &mut Reclaimed,
    ) {
        // Where the team's claims fit no node, room is made on a node; else by count.
        let placement = (input.plan.placements.iter()).find(|p| p.sharing_policy == *policy);
        let unplaced = placement.and_then(|p| Some((p, p.unplaced.get(team)?)));
        let node_of = |id: &DeviceId| placement.and_then(|p| nodes::node_of(p, id));
        let mut borrowers = borrowers(input, policy, orders, &node_of);
        self.count_in_flight(input.pods, &mut borrowers, now);
        self.pass_over_refused(&mut borrowers, now);
        let choose = from_borrowers(unplaced, orders, (min_runtime, wall));
        let (shortfall, mut choice, kept) = choose_within_budgets(&mut borrowers, budgets, &choose);
        if !kept.is_empty() && choice.uncovered > 0 {
            // A budget's change wakes no pass: look again when a refusal would be retried.
            self.wake_at(now + RETRY_REFUSED);
        }
        self.wake_when_eligible(choice.eligible_at, (now, wall));
        let team = TeamInPlan::of(input.plan, team);
        let order = |borrower: &str| ReclaimOrder {
            sharing_policy: policy.to_owned(),
            borrower: borrower.to_owned(),
            devices: u32::try_from(shortfall).unwrap_or(u32::MAX),
            for_team: team.name.to_owned(),
        };
        let mut queued = self.dequeue(input, queued_of(&borrowers), &order, team.namespaces);
        if !choice.evict.is_empty() {
            let elsewhere = queued_elsewhere(input, (policy, team.name), orders);
            let elsewhere = elsewhere.iter().map(|(t, w)| (*t, w));
            queued.extend(self.dequeue(input, elsewhere, &order, team.namespaces));
        }
        // Asked for already for another waiting team: by its Pods (a label's name is the
        // same in two teams).
        let taken: Vec<_> = out.evictions.iter().map(|e| e.pods.clone()).collect();
        (out.evictions).extend(queued.into_iter().filter(|e| !taken.contains(&e.pods)));
        let reclaimed: Vec<Eviction> = (choice.evict.iter())
            .map(|(b, w)| {
                let why = EvictionWhy::Reclaim;
                eviction(input, order(&borrowers[*b].team), w, (team.namespaces, why))
            })
            .collect();
        let freeing: Vec<_> = reclaimed.iter().map(|e| e.pods.clone()).collect();
        out.evictions.extend(reclaimed);
        if let Some(unplaced) = unplaced.filter(|_| choice.uncovered > 0) {
            // Room the borrowers' workloads alone do not make on any node: with the others'
            // workloads moved too ([`moves`]).
            let waiting = moves::Waiting {
                policy,
                team: team.name,
                unplaced: (unplaced.0, unplaced.1.as_slice()),
                min_runtime,
            };
            let moved = self.make_room(input, waiting, (now, wall), &freeing, budgets, out);
            choice.uncovered = moved.uncovered;
            choice.eligible_at = choice
                .eligible_at
                .into_iter()
                .chain(moved.eligible_at)
                .min();
        }
        if let Some(note) = waiting_note(waiting, policy, &choice, min_runtime, &kept) {
            // Its members read it in their own namespaces.
            let copies = in_team_namespaces(&note.regarding, team.namespaces);
            out.events
                .extend(copies.into_iter().map(|(regarding, prefix)| Event {
                    regarding,
                    note: format!("{prefix}{}", note.note),
                    ..note.clone()
                }));
            out.events.push(note);
        }
    }
}

/// The grace period and minimum runtime (seconds) of a team that reclaims: its `spec.reclaim`,
/// else `defaults`; `None` when it does not.
fn opted_in(team: &TeamGpuPolicy, defaults: ReclaimDefaults) -> Option<(Duration, u64)> {
    let settings = team.spec.reclaim.clone().unwrap_or_default();
    settings.enabled.unwrap_or(defaults.enabled).then(|| {
        let grace = (settings.grace_period_seconds)
            .map_or(defaults.grace, |s| Duration::from_secs(s.into()));
        let min_runtime =
            (settings.min_runtime_seconds).map_or(defaults.min_runtime.as_secs(), u64::from);
        (grace, min_runtime)
    })
}

/// The reclaims of `orders` per (sharing policy, waiting team).
fn owed_by_team(orders: &[ReclaimOrder]) -> BTreeMap<(String, String), Vec<&ReclaimOrder>> {
    let mut out: BTreeMap<_, Vec<_>> = BTreeMap::new();
    for o in orders {
        out.entry((o.sharing_policy.clone(), o.for_team.clone()))
            .or_default()
            .push(o);
    }
    out
}

/// A team's name and namespaces as the plan has them.
#[derive(Clone, Copy)]
struct TeamInPlan<'a> {
    name: &'a str,
    namespaces: &'a [String],
    report: Option<&'a TeamReport>,
}

impl<'a> TeamInPlan<'a> {
    fn of(plan: &'a Plan, name: &'a str) -> Self {
        let report = plan.teams.iter().find(|t| t.name == name);
        TeamInPlan {
            name,
            namespaces: report.map(|t| &t.namespaces[..]).unwrap_or_default(),
            report,
        }
    }

    /// Its quota of sharing policy `policy`, as the plan reports it.
    fn quota(&self, policy: &str) -> Option<&'a QuotaStatus> {
        self.report.and_then(|r| quota_of(r, policy))
    }
}

/// `team`'s quota of sharing policy `policy`.
fn quota_of<'a>(team: &'a TeamReport, policy: &str) -> Option<&'a QuotaStatus> {
    team.quotas.iter().find(|q| q.sharing_policy == policy)
}

/// `team`'s workloads queued for room of `policy` ([`queued`]) when it holds its guarantee
/// (allocated devices at least its effective guarantee): every device they are charged is
/// borrowed, and the scheduler would give them the room that reclaim or a move makes first.
/// `class` is the policy's DeviceClass.
fn queued_if_borrowed(
    input: ReclaimInput<'_>,
    team: &TeamReport,
    (policy, class): (&str, &str),
) -> Vec<Workload> {
    let quota = quota_of(team, policy);
    if quota.is_some_and(|q| q.allocated >= q.effective_guarantee) {
        queued(input.pods, input.claims, &team.namespaces, class)
    } else {
        Vec::new()
    }
}

/// The teams other than `waiting` and the borrowers of `orders` with workloads queued for room
/// of `policy` while they hold their guarantee ([`queued_if_borrowed`]), to remove with
/// reclaim's evictions: they give back nothing, but would take the room made.
fn queued_elsewhere<'p>(
    input: ReclaimInput<'p>,
    (policy, waiting): (&str, &str),
    orders: &[&ReclaimOrder],
) -> Vec<(&'p str, Workload)> {
    let class = objects::device_class_name(policy);
    (input.plan.teams.iter())
        .filter(|t| t.name != waiting && !orders.iter().any(|o| o.borrower == t.name))
        .flat_map(|t| {
            let queued = queued_if_borrowed(input, t, (policy, &class));
            queued.into_iter().map(|w| (t.name.as_str(), w))
        })
        .collect()
}

/// Each of `borrowers`' workloads queued for room, with its team.
fn queued_of(borrowers: &[Borrower]) -> impl Iterator<Item = (&str, &Workload)> {
    (borrowers.iter()).flat_map(|b| b.queued.iter().map(move |w| (b.team.as_str(), w)))
}

/// Devices a team holds above its effective guarantee, by its quota: the most it ever gives.
fn above_guarantee(quota: Option<&QuotaStatus>) -> u64 {
    quota.map_or(0, |q| {
        u64::from(q.allocated.saturating_sub(q.effective_guarantee))
    })
}

/// The borrowers of `orders`, furthest above their fair share first: the engine's water-fill
/// asks most, per weight, of those (ties by name).
fn borrowers(
    input: ReclaimInput<'_>,
    policy: &str,
    orders: &[&ReclaimOrder],
    node_of: NodeOf,
) -> Vec<Borrower> {
    let class = objects::device_class_name(policy);
    let mut out: Vec<(u64, Borrower)> = orders
        .iter()
        .map(|order| {
            let team = TeamInPlan::of(input.plan, &order.borrower);
            let quota = team.quota(policy);
            let weight = quota.map_or(1, |q| u64::from(q.weight.max(1)));
            let borrower = Borrower {
                team: order.borrower.clone(),
                owes: order.devices.into(),
                above_guarantee: above_guarantee(quota),
                workloads: workloads(input.pods, input.claims, team.namespaces, (&class, node_of)),
                queued: queued(input.pods, input.claims, team.namespaces, &class),
            };
            (weight, borrower)
        })
        .collect();
    out.sort_by(|(wa, a), (wb, b)| {
        (b.owes * wa)
            .cmp(&(a.owes * wb))
            .then_with(|| a.team.cmp(&b.team))
    });
    out.into_iter().map(|(_, b)| b).collect()
}

/// The eviction of workload `w` for `order` and `why`, with whom to tell: its Pods, its team,
/// and the quota in every namespace of both teams.
fn eviction(
    input: ReclaimInput<'_>,
    order: ReclaimOrder,
    w: &Workload,
    (waiting_namespaces, why): (&[String], EvictionWhy),
) -> Eviction {
    let borrower = TeamInPlan::of(input.plan, &order.borrower);
    let mut notify: Vec<(ObjectReference, String)> = (w.pods.iter())
        .map(|(namespace, pod)| {
            let pod = ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: Some(pod.to_string()),
                namespace: Some(namespace.to_string()),
                ..Default::default()
            };
            (pod, String::new())
        })
        .collect();
    if let Some(team) = input.teams.iter().find(|t| t.name_any() == order.borrower) {
        notify.push((team.object_ref(&()), String::new()));
    }
    // Both teams' members see it in their own namespaces.
    for (team, namespaces) in [
        (&order.borrower, borrower.namespaces),
        (&order.for_team, waiting_namespaces),
    ] {
        let reference = ObjectReference {
            kind: Some("TeamGpuPolicy".into()),
            name: Some(team.clone()),
            ..Default::default()
        };
        notify.extend(in_team_namespaces(&reference, namespaces));
    }
    let shared_label = w
        .label
        .as_deref()
        .map(|label| label_elsewhere(input.pods, borrower.namespaces, label))
        .unwrap_or_default();
    let borrower_held =
        (borrower.quota(&order.sharing_policy)).map(|q| (q.allocated, q.effective_guarantee));
    Eviction {
        workload: w.name.clone(),
        pods: (w.pods.iter())
            .map(|(ns, pod)| (ns.to_string(), pod.to_string()))
            .collect(),
        job: w.job.as_deref().map(str::to_owned),
        devices: w.devices,
        priority: priority_text(w),
        also_labelled_in: shared_label,
        borrower_held,
        why,
        order,
        notify,
    }
}

fn priority_text(w: &Workload) -> String {
    match &w.priority_class {
        Some(class) => format!("{class} ({})", w.priority),
        None => w.priority.to_string(),
    }
}

#[cfg(test)]
mod tests;
