//! The diagnosis: the verdict, and each finding behind it, over the [`Facts`].

use std::cmp::Ordering;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;

use super::claims::{pod_claims, waits_for};
use super::evidence::{CLAIM_CREATION_REASON, evidence};
use super::facts::{
    Facts, created, namespaces_of, parse_count, placed, pod_namespace, quota_of, sharing_policy_of,
    team_name,
};
use super::{
    Borrower, CapacityFacts, ClaimState, EntitlementFacts, Evidence, PodClaim, QueuePlace,
    QuotaFacts, ReclaimFacts, Verdict, Why,
};
use crate::api::{QuotaStatus, TeamGpuPolicy};
use crate::core::plan::objects::{QUOTA_NAME, is_teamgpu_class};
use crate::core::plan::usage::{allocated_by_class, quota_resource_name};

/// The grace period of `teamgpu run --reclaim-grace-seconds` unless it is set otherwise.
pub const DEFAULT_RECLAIM_GRACE_SECONDS: u64 = 120;

/// Diagnoses why `facts.pod` waits, at `now`.
pub fn diagnose(facts: &Facts, now: Timestamp) -> Why {
    let pod = &facts.pod;
    let namespace = pod_namespace(pod).to_owned();
    let claims = pod_claims(pod, facts);
    let team = team_of(facts, &namespace);
    let verdict = first_verdict(pod, &claims, team.is_some());
    let wait = wait_of(&claims);
    let mut why = Why {
        namespace,
        pod: pod.metadata.name.clone().unwrap_or_default(),
        verdict,
        waiting: verdict.waiting(),
        phase: pod.status.as_ref().and_then(|s| s.phase.clone()),
        node: pod.spec.as_ref().and_then(|s| s.node_name.clone()),
        team: team.map(team_name),
        claims,
        quota: None,
        entitlement: None,
        capacity: None,
        borrowers: Vec::new(),
        reclaim: None,
        queue: None,
        evidence: evidence(pod, &facts.events),
    };
    if let (true, Some(team), Some(wait)) = (why.waiting, team, wait) {
        add_findings(&mut why, facts, team, &wait, now);
    }
    why
}

/// What the Pod waits for: the class of its first waiting claim, and its claims of that class.
struct Wait {
    class: String,
    /// The class's sharing policy.
    policy: String,
    /// Devices of the claims not created yet.
    not_created: u64,
    /// Whether a claim exists without allocation.
    unallocated: bool,
}

fn wait_of(claims: &[PodClaim]) -> Option<Wait> {
    let class = waits_for(claims).next()?.device_class.clone()?;
    let of_class: Vec<&PodClaim> = waits_for(claims)
        .filter(|c| c.device_class.as_deref() == Some(class.as_str()))
        .collect();
    Some(Wait {
        policy: sharing_policy_of(&class).unwrap_or_default().to_owned(),
        not_created: of_class
            .iter()
            .filter(|c| c.state == ClaimState::NotCreated)
            .map(|c| c.devices)
            .sum(),
        unallocated: of_class.iter().any(|c| c.state == ClaimState::Unallocated),
        class,
    })
}

/// The team whose namespaces hold the Pod's.
fn team_of<'a>(facts: &'a Facts, namespace: &str) -> Option<&'a TeamGpuPolicy> {
    facts
        .teams
        .iter()
        .find(|t| namespaces_of(t).iter().any(|n| n == namespace))
}

/// The verdict from the Pod, its claims and whether it has a team; [`refined_verdict`] tells
/// quota and capacity apart.
fn first_verdict(pod: &Pod, claims: &[PodClaim], has_team: bool) -> Verdict {
    let waiting: Vec<&PodClaim> = waits_for(claims).collect();
    let uses_teamgpu = claims
        .iter()
        .any(|c| c.device_class.as_deref().is_some_and(is_teamgpu_class));
    let missing = claims.iter().any(|c| c.state == ClaimState::Missing);
    if placed(pod) {
        Verdict::NotWaiting
    } else if !uses_teamgpu && !missing {
        // No claim, or claims of other classes only: not teamgpu's matter.
        Verdict::NoTeamgpuClass
    } else if waiting.is_empty() && !missing {
        Verdict::Allocated
    } else if !has_team {
        Verdict::NoTeam
    } else if waiting.iter().any(|c| c.state == ClaimState::Missing)
        || (waiting.is_empty() && missing)
    {
        Verdict::ClaimMissing
    } else {
        Verdict::Capacity // refined by `add_findings`
    }
}

/// The findings about a waiting Pod of `team`: quota, entitlement, capacity, who borrows, its
/// place in the queue and when reclaim acts.
fn add_findings(why: &mut Why, facts: &Facts, team: &TeamGpuPolicy, wait: &Wait, now: Timestamp) {
    let quota = quota_facts(facts, &why.namespace, wait);
    let Some(q) = quota_of(team, &wait.policy) else {
        why.verdict = Verdict::NoEntitlement;
        return;
    };
    why.entitlement = Some(entitlement_facts(q, wait));
    if why.verdict != Verdict::ClaimMissing {
        why.verdict = refined_verdict(&why.evidence, wait, quota.room);
    }
    if why.verdict == Verdict::Quota || wait.not_created > 0 {
        why.quota = Some(quota);
    }
    let holdings = holdings(facts, &wait.policy, &wait.class);
    if why.verdict == Verdict::Capacity {
        why.capacity = Some(capacity_facts(q, wait, &holdings));
    }
    why.borrowers = borrowers(&holdings);
    let holds = holdings
        .iter()
        .find(|h| std::ptr::eq(h.team, team))
        .map_or(q.allocated, |h| h.allocated);
    let (queue, oldest) = queue_place(facts, team, &wait.class);
    why.queue = Some(queue);
    why.reclaim = Some(reclaim_facts(team, q, holds, &why.borrowers, oldest, now));
}

/// The namespace's `teamgpu` ResourceQuota for the class, and whether the claims not created yet
/// fit in it.
fn quota_facts(facts: &Facts, namespace: &str, wait: &Wait) -> QuotaFacts {
    let key = quota_resource_name(&wait.class);
    let quota = facts.quota.as_ref();
    let hard = quota.and_then(|q| {
        parse_count(q.status.as_ref().and_then(|s| s.hard.as_ref()?.get(&key)))
            .or_else(|| parse_count(q.spec.as_ref().and_then(|s| s.hard.as_ref()?.get(&key))))
    });
    let used =
        quota.and_then(|q| parse_count(q.status.as_ref().and_then(|s| s.used.as_ref()?.get(&key))));
    // No hard limit for the class: quota does not hold the claim back.
    let room = hard.is_none_or(|h| used.unwrap_or(0).saturating_add(wait.not_created) <= h);
    QuotaFacts {
        namespace: namespace.to_owned(),
        name: QUOTA_NAME.to_owned(),
        device_class: wait.class.clone(),
        used,
        hard,
        needs: wait.not_created,
        room,
    }
}

/// The team's numbers for the sharing policy, and whether its requests leave no room for the Pod.
fn entitlement_facts(q: &QuotaStatus, wait: &Wait) -> EntitlementFacts {
    // A claim not created yet is not in `requested`; one that exists is.
    let at_entitlement = if wait.not_created > 0 {
        u64::from(q.requested).saturating_add(wait.not_created) > u64::from(q.entitlement)
    } else {
        q.requested >= q.entitlement
    };
    EntitlementFacts {
        sharing_policy: wait.policy.clone(),
        guaranteed: q.guaranteed,
        effective_guarantee: q.effective_guarantee,
        limit: q.limit,
        entitlement: q.entitlement,
        requested: q.requested,
        allocated: q.allocated,
        pending: q.pending,
        borrowed: q.borrowed,
        at_entitlement,
        explanation: q.explanation.clone(),
    }
}

/// Quota, a claim not created for another reason, or capacity: from the claims of the class,
/// the quota's room and the resourceclaim controller's Events.
fn refined_verdict(evidence: &[Evidence], wait: &Wait, room: bool) -> Verdict {
    let refused_for_quota = evidence
        .iter()
        .any(|e| e.reason == CLAIM_CREATION_REASON && e.message.contains("exceeded quota"));
    if wait.not_created > 0 && (refused_for_quota || !room) {
        Verdict::Quota
    } else if wait.not_created > 0 {
        Verdict::ClaimNotCreated
    } else if wait.unallocated {
        Verdict::Capacity
    } else {
        Verdict::ClaimNotCreated
    }
}

/// A team with a quota for the sharing policy, and the devices of the class it holds.
struct Holding<'a> {
    team: &'a TeamGpuPolicy,
    quota: &'a QuotaStatus,
    allocated: u32,
}

fn holdings<'a>(facts: &'a Facts, policy: &str, class: &str) -> Vec<Holding<'a>> {
    facts
        .teams
        .iter()
        .filter_map(|team| {
            let quota = quota_of(team, policy)?;
            let allocated = team_allocated(facts, team, quota, class);
            Some(Holding {
                team,
                quota,
                allocated,
            })
        })
        .collect()
}

/// Devices of `class` allocated to `team`: from the claims when every team's were read, else
/// as its status says.
fn team_allocated(facts: &Facts, team: &TeamGpuPolicy, q: &QuotaStatus, class: &str) -> u32 {
    if !facts.claims_of_every_team {
        return q.allocated;
    }
    let namespaces = namespaces_of(team);
    let devices: u64 = facts
        .claims
        .iter()
        .filter(|c| {
            c.metadata
                .namespace
                .as_ref()
                .is_some_and(|ns| namespaces.contains(ns))
        })
        .map(|c| allocated_by_class(c).get(class).copied().unwrap_or(0))
        .sum();
    u32::try_from(devices).unwrap_or(u32::MAX)
}

/// The pool: what the status counts for teams, and what the teams hold of it.
fn capacity_facts(q: &QuotaStatus, wait: &Wait, holdings: &[Holding]) -> CapacityFacts {
    let allocated = holdings
        .iter()
        .fold(0u32, |sum, h| sum.saturating_add(h.allocated));
    CapacityFacts {
        sharing_policy: wait.policy.clone(),
        capacity: q.capacity,
        allocated,
        free: q.capacity.saturating_sub(allocated),
    }
}

/// The teams holding more than their effective guarantee, the most above it first.
fn borrowers(holdings: &[Holding]) -> Vec<Borrower> {
    let mut borrowers: Vec<Borrower> = holdings
        .iter()
        .filter(|h| h.allocated > h.quota.effective_guarantee)
        .map(|h| Borrower {
            team: team_name(h.team),
            allocated: h.allocated,
            effective_guarantee: h.quota.effective_guarantee,
            above: h.allocated - h.quota.effective_guarantee,
        })
        .collect();
    borrowers.sort_by(|a, b| b.above.cmp(&a.above).then_with(|| a.team.cmp(&b.team)));
    borrowers
}

/// A Pod in the queue: its priority and when it was created.
type Queued<'a> = (&'a Pod, i32, Option<Timestamp>);

/// The Pod's place among its team's Pending Pods that wait for `class`, and when the oldest of
/// them was created.
fn queue_place(
    facts: &Facts,
    team: &TeamGpuPolicy,
    class: &str,
) -> (QueuePlace, Option<Timestamp>) {
    let pod = &facts.pod;
    let team_namespaces = namespaces_of(team);
    let mut queue: Vec<Queued> = facts
        .team_pods
        .iter()
        .filter(|p| {
            p.metadata
                .namespace
                .as_ref()
                .is_some_and(|ns| team_namespaces.contains(ns))
                && p.metadata.deletion_timestamp.is_none()
                && !placed(p)
                && !(p.metadata.namespace == pod.metadata.namespace
                    && p.metadata.name == pod.metadata.name)
        })
        .filter(|p| {
            let claims = pod_claims(p, facts);
            waits_for(&claims).any(|c| c.device_class.as_deref() == Some(class))
        })
        .chain(std::iter::once(pod))
        .map(|p| {
            (
                p,
                p.spec.as_ref().and_then(|s| s.priority).unwrap_or(0),
                created(p),
            )
        })
        .collect();
    queue.sort_by(queue_order);
    let position = queue
        .iter()
        .position(|(p, _, _)| std::ptr::eq(*p, pod))
        .map_or(1, |i| i + 1);
    let place = QueuePlace {
        device_class: class.to_owned(),
        position,
        of: queue.len(),
    };
    (place, queue.iter().filter_map(|(_, _, c)| *c).min())
}

/// Higher priority first, then older (a Pod without a creation time last), then by name.
fn queue_order(a: &Queued, b: &Queued) -> Ordering {
    b.1.cmp(&a.1)
        .then_with(|| match (a.2, b.2) {
            (Some(x), Some(y)) => x.cmp(&y),
            (Some(_), None) => Ordering::Less,
            (None, Some(_)) => Ordering::Greater,
            (None, None) => Ordering::Equal,
        })
        .then_with(|| {
            (&a.0.metadata.namespace, &a.0.metadata.name)
                .cmp(&(&b.0.metadata.namespace, &b.0.metadata.name))
        })
}

/// Whether reclaim is owed to the team, which holds `holds` devices, and when it may evict
/// borrowers for it: once the oldest waiting Pod has waited the grace period.
fn reclaim_facts(
    team: &TeamGpuPolicy,
    q: &QuotaStatus,
    holds: u32,
    borrowers: &[Borrower],
    oldest: Option<Timestamp>,
    now: Timestamp,
) -> ReclaimFacts {
    let owed_up_to = q
        .effective_guarantee
        .min(q.requested.saturating_add(q.pending));
    let below = holds < owed_up_to;
    let settings = team.spec.reclaim.clone().unwrap_or_default();
    let grace = settings
        .grace_period_seconds
        .map_or(DEFAULT_RECLAIM_GRACE_SECONDS, u64::from);
    let waited = oldest.map(|t| (now.as_second() - t.as_second()).max(0));
    let others_borrow = borrowers.iter().any(|b| b.team != team_name(team));
    let acts_in = (below && others_borrow && settings.enabled != Some(false)).then(|| {
        let grace = i64::try_from(grace).unwrap_or(i64::MAX);
        (grace - waited.unwrap_or(0)).max(0)
    });
    ReclaimFacts {
        holds,
        owed_up_to,
        below,
        enabled: settings.enabled,
        grace_period_seconds: grace,
        grace_from_team: settings.grace_period_seconds.is_some(),
        waited_seconds: waited,
        acts_in_seconds: acts_in,
    }
}
