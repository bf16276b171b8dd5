//! A plan's effects, in the order they are performed: guard labels taken off, objects, guard
//! labels set, statuses, requeues, Jobs resumed, Events, evictions.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use std::collections::BTreeSet;

use super::{Engine, Now};
use crate::core::effects::{
    self, Effect, Event, EventKey, PolicyStatuses, ReclaimInput, RefusedByOwner,
};
use crate::core::plan::Plan;

impl Engine {
    /// The status of each policy as it is written (see [`effects::applied_statuses`]), with
    /// the refused writes of each policy that it shows.
    pub(super) fn statuses(&mut self, plan: &Plan, now: Now) -> (PolicyStatuses, RefusedByOwner) {
        let refused = self.refusals.of_policies(plan);
        let (sharing, teams) = (&self.state.sharing_policies, &self.state.teams);
        let time = Time(now.wall);
        let statuses = effects::applied_statuses(plan, sharing, teams, &refused, &time);
        (statuses, refused)
    }

    /// What `plan` asks for, in the order it is done: objects (the differ's order), statuses,
    /// wake-ups of waiting Pods and Jobs resumed (after the quotas that make their room), Events,
    /// evictions.
    /// `seen`: the differ compared this plan's objects already (an earlier pass's plan).
    pub(super) fn effects(
        &mut self,
        plan: &Plan,
        seen: bool,
        (statuses, refused): (&PolicyStatuses, &RefusedByOwner),
        now: Now,
    ) -> Vec<Effect> {
        let writes = if seen {
            self.differ.writes_again(&plan.objects)
        } else {
            self.differ.writes(&plan.objects)
        };
        tracing::debug!(writes = writes.len(), "compared");
        let time = Time(now.wall);
        let (sharing, teams) = (&self.state.sharing_policies, &self.state.teams);
        // A guard label whose quota is not in force comes off before anything is written (a
        // binding that leaves labelled namespaces out may be among the objects); a label is
        // set after the objects, as it says that they are in force.
        let differ = &self.differ;
        let outside = plan.objects.outside_teams.as_deref();
        let labels = (self.guard_labels).writes(outside, |ns| differ.outside_quota_in_force(ns));
        let (set, off): (Vec<_>, Vec<_>) = labels.into_iter().partition(|l| l.value.is_some());
        let mut out: Vec<Effect> = off.into_iter().map(Effect::Label).collect();
        out.extend(writes.into_iter().map(Effect::Object));
        out.extend(set.into_iter().map(Effect::Label));
        out.extend(effects::malformed_statuses(&self.malformed, &time));
        // Status from what was applied: the refused writes of each policy.
        out.extend(effects::status_changes(
            statuses,
            sharing,
            teams,
            &mut self.written,
            now.instant,
        ));
        // Reclaim reads the claims and Pods only for the reclaims the plan orders and the
        // claims that fit no node (which moves may make room for), room only in the namespaces
        // where a Pod waits: most passes read neither.
        let (claims, pods) = if plan.reclaims.is_empty() && plan.placements.is_empty() {
            (Vec::new(), Vec::new())
        } else {
            (self.planner.claim_views(), self.pods.all())
        };
        let input = ReclaimInput {
            plan,
            teams,
            claims: &claims,
            pods: &pods,
            budgets: &self.budgets,
        };
        let defaults = self.settings.reclaim;
        let reclaimed = (self.reclaim).evictions(input, defaults, now.instant, now.wall);
        let namespaces: BTreeSet<&str> =
            self.waiting.iter().map(|w| w.namespace.as_str()).collect();
        let in_waiting = namespaces.iter().flat_map(|ns| self.planner.claims_in(ns));
        // A wake-up follows the quotas that make its room: none while writes still wait (a
        // long converge), among which they may be.
        if !self.differ.writes_wait() {
            let room = effects::room(plan, in_waiting, &namespaces);
            let requeues = (self.requeuer).requeues(&self.waiting, &room, now.instant, now.wall);
            out.extend(requeues.into_iter().map(Effect::Requeue));
            // A suspended Job is resumed by the pass that sees its claims gone, after the
            // quotas that pass lowers.
            if !self.suspended.is_empty() {
                let (pods, planner) = (&self.pods, &self.planner);
                let resumes = (self.suspended).due(
                    |namespace, pod| pods.get(namespace, pod).is_some(),
                    |namespace, claim| planner.claim(namespace, claim).is_some(),
                );
                out.extend(resumes.into_iter().map(Effect::Resume));
            }
        }
        let mut events = effects::event_transitions(plan, sharing, teams);
        events.extend(refused.events(sharing, teams));
        events.extend(reclaimed.events);
        events.extend(effects::waiting_events(plan, &self.waiting));
        let unpublished = self.published.unpublished(events);
        let waiting_writes = self.differ.writes_wait();
        let events = held_while_writes_wait(&mut self.held_events, unpublished, waiting_writes);
        out.extend(events.into_iter().map(|e| Effect::Event(Box::new(e))));
        out.extend((reclaimed.evictions.into_iter()).map(|e| Effect::Evict(Box::new(e))));
        out
    }
}

/// The Events to publish now, of `found` and those `held` before: none while writes wait in
/// the differ's backlog or a prefetched batch. A first converge at 1,000 team namespaces finds over a thousand
/// Events, which published in its first batch held up the next one for seconds; held, they go
/// out after the last batch, as they did when the converge was one batch. One found is
/// published even if the status shows its finding by then.
fn held_while_writes_wait(
    held: &mut Vec<Event>,
    found: Vec<Event>,
    waiting_writes: bool,
) -> Vec<Event> {
    let mut events = std::mem::take(held);
    let known: BTreeSet<EventKey> = events.iter().map(Event::key).collect();
    events.extend(found.into_iter().filter(|e| !known.contains(&e.key())));
    if waiting_writes {
        *held = events;
        return Vec::new();
    }
    events
}
