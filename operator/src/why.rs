//! `teamgpu why pod/NAME`: why a Pod waits for GPUs. Pure: a diagnosis over the objects
//! [`crate::live::why_facts`] reads (the Pod, its claims and their templates, the namespace's
//! `teamgpu` ResourceQuota, the policies with their status, the Events about the Pod, the team's
//! pending Pods and the claims of the teams' namespaces), and its rendering.
//!
//! The diagnosis reads what the cluster says now, and the numbers the operator last wrote in the
//! TeamGpuPolicies' status; it computes no fair share of its own.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use k8s_openapi::api::core::v1::{Event, Pod, ResourceQuota};
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceClaimTemplate};
use k8s_openapi::jiff::Timestamp;
use serde::Serialize;

use crate::api::{GROUP, GpuSharingPolicy, QuotaStatus, TeamGpuPolicy};
use crate::core::plan::objects::{QUOTA_NAME, is_teamgpu_class};
use crate::core::plan::usage::{allocated_by_class, quota_charge, quota_resource_name};

/// The grace period of `teamgpu run --reclaim-grace-seconds` unless it is set otherwise.
pub const DEFAULT_RECLAIM_GRACE_SECONDS: u64 = 120;

/// Errors of the command's argument.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WhyError {
    #[error("`{0}` is not a Pod: give pod/NAME (also pods/NAME, po/NAME or NAME)")]
    NotAPod(String),
    #[error("`{0}` names no Pod: give pod/NAME")]
    NoName(String),
}

/// The Pod's name of `pod/NAME`, `pods/NAME`, `po/NAME` or a bare `NAME`.
pub fn pod_name(arg: &str) -> Result<&str, WhyError> {
    let name = match arg.split_once('/') {
        Some((kind, name)) => {
            if !["pod", "pods", "po"].contains(&kind.to_ascii_lowercase().as_str()) {
                return Err(WhyError::NotAPod(arg.to_owned()));
            }
            name
        }
        None => arg,
    };
    if name.is_empty() || name.contains('/') {
        return Err(WhyError::NoName(arg.to_owned()));
    }
    Ok(name)
}

/// What the diagnosis reads; see the module documentation.
#[derive(Debug, Clone, Default)]
pub struct Facts {
    pub pod: Pod,
    /// ResourceClaims of the Pod's namespace, and of the teams' namespaces that could be read.
    pub claims: Vec<ResourceClaim>,
    /// Whether `claims` holds the claims of every team namespace; if not, who holds how many
    /// devices comes from the TeamGpuPolicies' status.
    pub claims_of_every_team: bool,
    /// ResourceClaimTemplates of the team's namespaces (the Pod's at least).
    pub templates: Vec<ResourceClaimTemplate>,
    /// The namespace's `teamgpu` ResourceQuota.
    pub quota: Option<ResourceQuota>,
    /// Events about the Pod.
    pub events: Vec<Event>,
    pub teams: Vec<TeamGpuPolicy>,
    pub sharing_policies: Vec<GpuSharingPolicy>,
    /// The Pending Pods of the team's namespaces (with or without the Pod itself).
    pub team_pods: Vec<Pod>,
}

/// The answer in one word.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Verdict {
    /// Bound to a node, running or done.
    NotWaiting,
    /// Pending, but its devices are allocated: it waits for the scheduler or kubelet.
    Allocated,
    /// It asks for no teamgpu DeviceClass.
    NoTeamgpuClass,
    /// Its namespace belongs to no team.
    NoTeam,
    /// Its team has no quota for the sharing policy it asks for.
    NoEntitlement,
    /// A claim could not be created: the namespace's ResourceQuota has no room.
    Quota,
    /// A claim could not be created for another reason (an Event says which), or not yet.
    ClaimNotCreated,
    /// A claim or template it names does not exist.
    ClaimMissing,
    /// A claim exists but the scheduler could not allocate it.
    Capacity,
}

impl Verdict {
    /// Whether the Pod waits for devices.
    pub fn waiting(self) -> bool {
        !matches!(
            self,
            Verdict::NotWaiting | Verdict::Allocated | Verdict::NoTeamgpuClass
        )
    }

    fn words(self) -> &'static str {
        match self {
            Verdict::NotWaiting => "not waiting",
            Verdict::Allocated => "allocated",
            Verdict::NoTeamgpuClass => "no teamgpu class",
            Verdict::NoTeam => "no team",
            Verdict::NoEntitlement => "no entitlement",
            Verdict::Quota => "quota",
            Verdict::ClaimNotCreated => "claim not created",
            Verdict::ClaimMissing => "claim missing",
            Verdict::Capacity => "capacity",
        }
    }
}

/// Where one of the Pod's claims stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ClaimState {
    Allocated,
    /// The claim exists, without allocation.
    Unallocated,
    /// From a template, and the resourceclaim controller has not created it.
    NotCreated,
    /// The claim, or the template to make it from, does not exist.
    Missing,
    /// The resourceclaim controller decided the Pod needs no claim for this entry.
    NotNeeded,
}

/// One entry of the Pod's `spec.resourceClaims`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PodClaim {
    /// The entry's name in the Pod.
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub claim: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub template: Option<String>,
    pub state: ClaimState,
    /// The DeviceClass it asks for (a teamgpu class first, when it asks for several).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device_class: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sharing_policy: Option<String>,
    pub devices: u64,
}

/// The namespace's ResourceQuota for the class the Pod waits for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct QuotaFacts {
    pub namespace: String,
    pub name: String,
    pub device_class: String,
    /// `None`: the namespace has no `teamgpu` ResourceQuota, or it does not count the class.
    pub used: Option<u64>,
    pub hard: Option<u64>,
    /// Devices the Pod's claims not yet created need.
    pub needs: u64,
    /// Whether they fit now (the resourceclaim controller retries).
    pub room: bool,
}

/// The team's numbers for the sharing policy, from its status.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EntitlementFacts {
    pub sharing_policy: String,
    pub guaranteed: u32,
    pub effective_guarantee: u32,
    pub limit: u32,
    pub entitlement: u32,
    pub requested: u32,
    pub allocated: u32,
    pub pending: u32,
    pub borrowed: u32,
    /// Whether the team's requests leave no room for what the Pod needs.
    pub at_entitlement: bool,
    pub explanation: String,
}

/// The pool of the sharing policy.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CapacityFacts {
    pub sharing_policy: String,
    /// Devices available to teams (the status' `capacity`).
    pub capacity: u32,
    /// Devices allocated to the teams' claims.
    pub allocated: u32,
    pub free: u32,
}

/// A team holding more than its effective guarantee.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Borrower {
    pub team: String,
    pub allocated: u32,
    pub effective_guarantee: u32,
    pub above: u32,
}

/// Whether, and when, reclaim acts for the team.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReclaimFacts {
    /// Devices the team holds (allocated).
    pub holds: u32,
    /// min(effective guarantee, requested + pending): below it, reclaim is owed to the team.
    pub owed_up_to: u32,
    pub below: bool,
    /// `spec.reclaim.enabled`; `None`: the operator's `--reclaim` decides.
    pub enabled: Option<bool>,
    pub grace_period_seconds: u64,
    /// Whether the grace period is the team's own (else the operator's default).
    pub grace_from_team: bool,
    /// How long the team's oldest waiting Pod has waited.
    pub waited_seconds: Option<i64>,
    /// When borrowers may be evicted, from now (0: now); `None` when reclaim does not act.
    pub acts_in_seconds: Option<i64>,
}

/// The Pod's place among its team's waiting Pods.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct QueuePlace {
    pub device_class: String,
    pub position: usize,
    pub of: usize,
}

/// An Event about the Pod, or its `PodScheduled` condition.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Evidence {
    pub reason: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    pub count: u32,
    pub message: String,
}

/// The diagnosis.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Why {
    pub namespace: String,
    pub pod: String,
    pub verdict: Verdict,
    pub waiting: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub team: Option<String>,
    pub claims: Vec<PodClaim>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub quota: Option<QuotaFacts>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub entitlement: Option<EntitlementFacts>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub capacity: Option<CapacityFacts>,
    pub borrowers: Vec<Borrower>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reclaim: Option<ReclaimFacts>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queue: Option<QueuePlace>,
    pub evidence: Vec<Evidence>,
}

/// The Event reasons that say why a Pod waits for a claim.
const CLAIM_CREATION_REASON: &str = "FailedResourceClaimCreation";
const SCHEDULING_REASON: &str = "FailedScheduling";

/// The sharing policy of a teamgpu DeviceClass.
fn sharing_policy_of(class: &str) -> Option<&str> {
    class.strip_suffix(GROUP)?.strip_suffix('.')
}

/// What a template named `name` asks for when it is not there to read: teamgpu's templates are
/// `<policy>` and `<policy>-x<count>`.
fn template_by_name(name: &str, policies: &[GpuSharingPolicy]) -> Option<(String, u64)> {
    let exists = |p: &str| {
        policies
            .iter()
            .any(|s| s.metadata.name.as_deref() == Some(p))
    };
    if exists(name) {
        return Some((format!("{name}.{GROUP}"), 1));
    }
    let (policy, count) = name.rsplit_once("-x")?;
    let count: u64 = count.parse().ok().filter(|n| *n > 1)?;
    exists(policy).then(|| (format!("{policy}.{GROUP}"), count))
}

/// The class (a teamgpu one first) and devices of a quota charge.
fn main_class(charge: &BTreeMap<String, u64>) -> Option<(String, u64)> {
    charge
        .iter()
        .find(|(c, _)| is_teamgpu_class(c))
        .or_else(|| charge.iter().next())
        .map(|(c, n)| (c.clone(), *n))
}

fn pod_namespace(pod: &Pod) -> &str {
    pod.metadata.namespace.as_deref().unwrap_or_default()
}

/// Each of `pod`'s claims, resolved against the claims and templates of `facts`.
fn pod_claims(pod: &Pod, facts: &Facts) -> Vec<PodClaim> {
    let namespace = pod_namespace(pod);
    let generated: BTreeMap<&str, Option<&str>> = pod
        .status
        .iter()
        .flat_map(|s| s.resource_claim_statuses.iter().flatten())
        .map(|s| (s.name.as_str(), s.resource_claim_name.as_deref()))
        .collect();
    let claim = |name: &str| {
        facts.claims.iter().find(|c| {
            c.metadata.namespace.as_deref() == Some(namespace)
                && c.metadata.name.as_deref() == Some(name)
        })
    };
    let template = |name: &str| {
        facts.templates.iter().find(|t| {
            t.metadata.namespace.as_deref() == Some(namespace)
                && t.metadata.name.as_deref() == Some(name)
        })
    };
    let mut out = Vec::new();
    for entry in pod
        .spec
        .iter()
        .flat_map(|s| s.resource_claims.iter().flatten())
    {
        let template_name = entry.resource_claim_template_name.clone();
        let (claim_name, state) = match (&entry.resource_claim_name, &template_name) {
            (Some(name), _) => (Some(name.clone()), None),
            (None, Some(_)) => match generated.get(entry.name.as_str()) {
                Some(Some(name)) => (Some((*name).to_owned()), None),
                Some(None) => (None, Some(ClaimState::NotNeeded)),
                None => (None, Some(ClaimState::NotCreated)),
            },
            (None, None) => (None, Some(ClaimState::Missing)),
        };
        let existing = claim_name.as_deref().and_then(claim);
        let (state, charge) = match (state, existing) {
            (Some(state), _) => {
                let charge = match template_name.as_deref().map(|t| (t, template(t))) {
                    Some((_, Some(t))) => main_class(&quota_charge(&t.spec.spec)),
                    Some((name, None)) => template_by_name(name, &facts.sharing_policies),
                    None => None,
                };
                // A template that is not there: the claim cannot be made from it.
                let missing = state == ClaimState::NotCreated
                    && template_name.as_deref().and_then(template).is_none();
                let state = if missing { ClaimState::Missing } else { state };
                (state, charge)
            }
            (None, Some(c)) => {
                let allocated = c.status.as_ref().is_some_and(|s| s.allocation.is_some());
                let state = if allocated {
                    ClaimState::Allocated
                } else {
                    ClaimState::Unallocated
                };
                (state, main_class(&quota_charge(&c.spec)))
            }
            (None, None) => {
                let charge = template_name
                    .as_deref()
                    .and_then(|t| template(t).map(|t| main_class(&quota_charge(&t.spec.spec))))
                    .flatten();
                (ClaimState::Missing, charge)
            }
        };
        let (device_class, devices) = match charge {
            Some((class, n)) => (Some(class), n),
            None => (None, 0),
        };
        out.push(PodClaim {
            name: entry.name.clone(),
            claim: claim_name,
            template: template_name,
            state,
            sharing_policy: device_class
                .as_deref()
                .and_then(sharing_policy_of)
                .map(str::to_owned),
            device_class,
            devices,
        });
    }
    out
}

/// Whether `pod` is bound, running or done (its phase or node, for the verdict line).
fn placed(pod: &Pod) -> bool {
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    phase.is_some_and(|p| p != "Pending")
        || pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.as_ref())
            .is_some()
}

/// The claims of `pod` it waits for, of a teamgpu class: not allocated and needed.
fn waits_for(claims: &[PodClaim]) -> impl Iterator<Item = &PodClaim> {
    claims.iter().filter(|c| {
        !matches!(c.state, ClaimState::Allocated | ClaimState::NotNeeded)
            && c.device_class.as_deref().is_some_and(is_teamgpu_class)
    })
}

fn parse_count(q: Option<&k8s_openapi::apimachinery::pkg::api::resource::Quantity>) -> Option<u64> {
    q.and_then(|q| q.0.trim().parse().ok())
}

fn seconds_since(now: Timestamp, then: Option<Timestamp>) -> Option<i64> {
    then.map(|t| (now.as_second() - t.as_second()).max(0))
}

fn created(pod: &Pod) -> Option<Timestamp> {
    pod.metadata.creation_timestamp.as_ref().map(|t| t.0)
}

/// The Events about the Pod that say why it waits (the latest of each reason), else its
/// `PodScheduled` condition.
fn evidence(pod: &Pod, events: &[Event]) -> Vec<Evidence> {
    let uid = pod.metadata.uid.as_deref();
    let mut latest: BTreeMap<&str, (&Event, Option<Timestamp>)> = BTreeMap::new();
    for e in events {
        let reason = e.reason.as_deref().unwrap_or_default();
        if ![CLAIM_CREATION_REASON, SCHEDULING_REASON].contains(&reason) {
            continue;
        }
        // An Event of an earlier Pod of the same name.
        if uid.is_some()
            && e.involved_object.uid.is_some()
            && e.involved_object.uid.as_deref() != uid
        {
            continue;
        }
        let at = e
            .last_timestamp
            .as_ref()
            .map(|t| t.0)
            .or(e.event_time.as_ref().map(|t| t.0))
            .or(e.metadata.creation_timestamp.as_ref().map(|t| t.0));
        if latest.get(reason).is_none_or(|(_, seen)| at >= *seen) {
            latest.insert(reason, (e, at));
        }
    }
    let mut out: Vec<Evidence> = latest
        .into_values()
        .map(|(e, _)| Evidence {
            reason: e.reason.clone().unwrap_or_default(),
            source: e
                .reporting_component
                .clone()
                .filter(|c| !c.is_empty())
                .or_else(|| e.source.as_ref().and_then(|s| s.component.clone())),
            count: e
                .series
                .as_ref()
                .and_then(|s| s.count)
                .or(e.count)
                .and_then(|n| u32::try_from(n).ok())
                .unwrap_or(1)
                .max(1),
            message: e.message.clone().unwrap_or_default().trim().to_owned(),
        })
        .collect();
    if !out.iter().any(|e| e.reason == SCHEDULING_REASON)
        && let Some(c) = pod
            .status
            .iter()
            .flat_map(|s| s.conditions.iter().flatten())
            .find(|c| c.type_ == "PodScheduled" && c.status == "False")
        && let Some(message) = c.message.as_ref().filter(|m| !m.is_empty())
    {
        out.push(Evidence {
            reason: format!("PodScheduled={}", c.reason.as_deref().unwrap_or("False")),
            source: None,
            count: 1,
            message: message.clone(),
        });
    }
    out
}

fn team_name(team: &TeamGpuPolicy) -> String {
    team.metadata.name.clone().unwrap_or_default()
}

fn namespaces_of(team: &TeamGpuPolicy) -> &[String] {
    team.status
        .as_ref()
        .map(|s| s.namespaces.as_slice())
        .unwrap_or_default()
}

fn quota_of<'a>(team: &'a TeamGpuPolicy, sharing_policy: &str) -> Option<&'a QuotaStatus> {
    team.status
        .as_ref()?
        .quotas
        .iter()
        .find(|q| q.sharing_policy == sharing_policy)
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

/// Diagnoses why `facts.pod` waits, at `now`.
pub fn diagnose(facts: &Facts, now: Timestamp) -> Why {
    let pod = &facts.pod;
    let namespace = pod_namespace(pod).to_owned();
    let claims = pod_claims(pod, facts);
    let mut why = Why {
        namespace: namespace.clone(),
        pod: pod.metadata.name.clone().unwrap_or_default(),
        verdict: Verdict::NotWaiting,
        waiting: false,
        phase: pod.status.as_ref().and_then(|s| s.phase.clone()),
        node: pod.spec.as_ref().and_then(|s| s.node_name.clone()),
        team: None,
        claims: Vec::new(),
        quota: None,
        entitlement: None,
        capacity: None,
        borrowers: Vec::new(),
        reclaim: None,
        queue: None,
        evidence: evidence(pod, &facts.events),
    };
    let team = facts
        .teams
        .iter()
        .find(|t| namespaces_of(t).contains(&namespace));
    why.team = team.map(team_name);
    let waiting: Vec<&PodClaim> = waits_for(&claims).collect();
    let uses_teamgpu = claims
        .iter()
        .any(|c| c.device_class.as_deref().is_some_and(is_teamgpu_class));
    let missing = claims.iter().any(|c| c.state == ClaimState::Missing);
    why.verdict = if placed(pod) {
        Verdict::NotWaiting
    } else if !uses_teamgpu && !missing {
        // No claim, or claims of other classes only: not teamgpu's matter.
        Verdict::NoTeamgpuClass
    } else if waiting.is_empty() && !missing {
        Verdict::Allocated
    } else if team.is_none() {
        Verdict::NoTeam
    } else if waiting.iter().any(|c| c.state == ClaimState::Missing)
        || (waiting.is_empty() && missing)
    {
        Verdict::ClaimMissing
    } else {
        Verdict::Capacity // refined below
    };
    why.claims = claims.clone();
    why.waiting = why.verdict.waiting();
    let (true, Some(team)) = (why.waiting, team) else {
        return why;
    };
    // The class the Pod waits for: that of its first waiting claim.
    let Some(class) = waiting.first().and_then(|c| c.device_class.clone()) else {
        return why;
    };
    let policy = sharing_policy_of(&class).unwrap_or_default().to_owned();
    let of_class = |c: &&PodClaim| c.device_class.as_deref() == Some(class.as_str());
    let not_created: u64 = waiting
        .iter()
        .copied()
        .filter(of_class)
        .filter(|c| c.state == ClaimState::NotCreated)
        .map(|c| c.devices)
        .sum();
    let unallocated = waiting
        .iter()
        .copied()
        .filter(of_class)
        .any(|c| c.state == ClaimState::Unallocated);

    // The namespace's quota.
    let key = quota_resource_name(&class);
    let quota = facts.quota.as_ref();
    let hard = quota.and_then(|q| {
        parse_count(q.status.as_ref().and_then(|s| s.hard.as_ref()?.get(&key)))
            .or_else(|| parse_count(q.spec.as_ref().and_then(|s| s.hard.as_ref()?.get(&key))))
    });
    let used =
        quota.and_then(|q| parse_count(q.status.as_ref().and_then(|s| s.used.as_ref()?.get(&key))));
    // No hard limit for the class: quota does not hold the claim back.
    let room = hard.is_none_or(|h| used.unwrap_or(0).saturating_add(not_created) <= h);
    let quota_facts = QuotaFacts {
        namespace: namespace.clone(),
        name: QUOTA_NAME.to_owned(),
        device_class: class.clone(),
        used,
        hard,
        needs: not_created,
        room,
    };

    // The team's numbers.
    let Some(q) = quota_of(team, &policy) else {
        why.verdict = Verdict::NoEntitlement;
        return why;
    };
    // A claim not created yet is not in `requested`; one that exists is.
    let at_entitlement = if not_created > 0 {
        u64::from(q.requested).saturating_add(not_created) > u64::from(q.entitlement)
    } else {
        q.requested >= q.entitlement
    };
    why.entitlement = Some(EntitlementFacts {
        sharing_policy: policy.clone(),
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
    });

    if why.verdict != Verdict::ClaimMissing {
        let refused_for_quota = why
            .evidence
            .iter()
            .any(|e| e.reason == CLAIM_CREATION_REASON && e.message.contains("exceeded quota"));
        why.verdict = if not_created > 0 && (refused_for_quota || !room) {
            Verdict::Quota
        } else if not_created > 0 {
            Verdict::ClaimNotCreated
        } else if unallocated {
            Verdict::Capacity
        } else {
            Verdict::ClaimNotCreated
        };
    }
    if matches!(why.verdict, Verdict::Quota) || not_created > 0 {
        why.quota = Some(quota_facts);
    }

    // The pool, and who holds more than its guarantee.
    let mut allocated_total: u32 = 0;
    let mut own_allocated = q.allocated;
    for other in &facts.teams {
        let Some(oq) = quota_of(other, &policy) else {
            continue;
        };
        let allocated = team_allocated(facts, other, oq, &class);
        allocated_total = allocated_total.saturating_add(allocated);
        if std::ptr::eq(other, team) {
            own_allocated = allocated;
        }
        if allocated > oq.effective_guarantee {
            why.borrowers.push(Borrower {
                team: team_name(other),
                allocated,
                effective_guarantee: oq.effective_guarantee,
                above: allocated - oq.effective_guarantee,
            });
        }
    }
    why.borrowers
        .sort_by(|a, b| b.above.cmp(&a.above).then_with(|| a.team.cmp(&b.team)));
    if why.verdict == Verdict::Capacity {
        why.capacity = Some(CapacityFacts {
            sharing_policy: policy.clone(),
            capacity: q.capacity,
            allocated: allocated_total,
            free: q.capacity.saturating_sub(allocated_total),
        });
    }

    // The team's queue for the class.
    let team_namespaces = namespaces_of(team);
    let mut queue: Vec<(&Pod, i32, Option<Timestamp>)> = facts
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
            waits_for(&claims).any(|c| c.device_class.as_deref() == Some(class.as_str()))
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
    queue.sort_by(|a, b| {
        b.1.cmp(&a.1)
            .then_with(|| match (a.2, b.2) {
                (Some(x), Some(y)) => x.cmp(&y),
                (Some(_), None) => std::cmp::Ordering::Less,
                (None, Some(_)) => std::cmp::Ordering::Greater,
                (None, None) => std::cmp::Ordering::Equal,
            })
            .then_with(|| {
                (&a.0.metadata.namespace, &a.0.metadata.name)
                    .cmp(&(&b.0.metadata.namespace, &b.0.metadata.name))
            })
    });
    let position = queue
        .iter()
        .position(|(p, _, _)| std::ptr::eq(*p, pod))
        .map_or(1, |i| i + 1);
    why.queue = Some(QueuePlace {
        device_class: class.clone(),
        position,
        of: queue.len(),
    });
    let oldest = queue.iter().filter_map(|(_, _, c)| *c).min();

    // Reclaim.
    let owed_up_to = q
        .effective_guarantee
        .min(q.requested.saturating_add(q.pending));
    let below = own_allocated < owed_up_to;
    let settings = team.spec.reclaim.clone().unwrap_or_default();
    let grace = settings
        .grace_period_seconds
        .map_or(DEFAULT_RECLAIM_GRACE_SECONDS, u64::from);
    let waited = seconds_since(now, oldest);
    let others_borrow = why.borrowers.iter().any(|b| b.team != team_name(team));
    let acts_in = (below && others_borrow && settings.enabled != Some(false)).then(|| {
        let grace = i64::try_from(grace).unwrap_or(i64::MAX);
        (grace - waited.unwrap_or(0)).max(0)
    });
    why.reclaim = Some(ReclaimFacts {
        holds: own_allocated,
        owed_up_to,
        below,
        enabled: settings.enabled,
        grace_period_seconds: grace,
        grace_from_team: settings.grace_period_seconds.is_some(),
        waited_seconds: waited,
        acts_in_seconds: acts_in,
    });
    why
}

/// `n` as an English ordinal: 1st, 2nd, 3rd, 4th, 11th, 21st.
fn ordinal(n: usize) -> String {
    let suffix = match (n % 10, n % 100) {
        (_, 11..=13) => "th",
        (1, _) => "st",
        (2, _) => "nd",
        (3, _) => "rd",
        _ => "th",
    };
    format!("{n}{suffix}")
}

fn plural(n: u64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

fn claim_state_words(state: ClaimState) -> &'static str {
    match state {
        ClaimState::Allocated => "allocated",
        ClaimState::Unallocated => "not allocated",
        ClaimState::NotCreated => "not created",
        ClaimState::Missing => "missing",
        ClaimState::NotNeeded => "not needed",
    }
}

/// The verdict line, then `why:` lines.
pub fn text(why: &Why) -> String {
    let who = format!("pod {}/{}", why.namespace, why.pod);
    let mut out = String::new();
    let _ = match why.verdict {
        Verdict::NotWaiting => {
            let phase = why.phase.as_deref().unwrap_or("Pending");
            match (&why.node, phase) {
                (Some(node), "Pending") => {
                    writeln!(out, "{who} is not waiting: bound to node {node}")
                }
                (Some(node), _) => writeln!(out, "{who} is not waiting: {phase} on node {node}"),
                (None, _) => writeln!(out, "{who} is not waiting: {phase}"),
            }
        }
        Verdict::Allocated => writeln!(
            out,
            "{who} does not wait for GPUs: its devices are allocated, the scheduler places it"
        ),
        Verdict::NoTeamgpuClass => writeln!(
            out,
            "{who} does not wait for teamgpu: it asks for no teamgpu DeviceClass"
        ),
        v => writeln!(out, "{who} waits: {}", v.words()),
    };
    let lines = why_lines(why);
    if !lines.is_empty() {
        out.push_str("why:\n");
        for line in lines {
            let _ = writeln!(out, "  {line}");
        }
    }
    out
}

fn why_lines(why: &Why) -> Vec<String> {
    let mut lines = Vec::new();
    if !why.waiting && why.verdict != Verdict::Allocated {
        return lines;
    }
    match &why.team {
        Some(team) => lines.push(format!("team: {team} (namespace {})", why.namespace)),
        None => lines.push(format!(
            "team: namespace {} belongs to no TeamGpuPolicy: teamgpu's admission refuses claims \
             of its DeviceClasses here; a platform admin can add the namespace to a team",
            why.namespace
        )),
    }
    for c in &why.claims {
        let from = match (&c.claim, &c.template) {
            (Some(claim), Some(t)) => format!("claim {claim} from template {t}"),
            (Some(claim), None) => format!("claim {claim}"),
            (None, Some(t)) => format!("template {t}"),
            (None, None) => "no claim or template".to_owned(),
        };
        let asks = match (&c.device_class, &c.sharing_policy) {
            (Some(class), Some(policy)) => format!(
                "{} of sharing policy {policy} ({class})",
                plural(c.devices, "device", "devices")
            ),
            (Some(class), None) => format!("{} of {class}", plural(c.devices, "device", "devices")),
            (None, _) => "devices of an unknown class".to_owned(),
        };
        lines.push(format!(
            "claim {}: {from}: {asks}, {}",
            c.name,
            claim_state_words(c.state)
        ));
    }
    if let Some(q) = &why.quota {
        let name = format!("ResourceQuota {}/{}", q.namespace, q.name);
        lines.push(match q.hard {
            Some(hard) => {
                let state = if q.room {
                    "has room now (the resourceclaim controller retries)"
                } else {
                    "has no room"
                };
                format!(
                    "quota: {name} {state}: {} of {hard} {} devices used, the pod needs {}",
                    q.used.unwrap_or(0),
                    q.device_class,
                    q.needs
                )
            }
            None => format!(
                "quota: {name} does not limit {} (not written by the operator yet?), the pod \
                 needs {}",
                q.device_class, q.needs
            ),
        });
    }
    if let Some(c) = &why.capacity {
        let placing = if c.free == 0 {
            String::new()
        } else {
            "; the scheduler could not place the pod on the free ones (see its message)".to_owned()
        };
        lines.push(format!(
            "capacity: sharing policy {} has {} for teams, {} allocated, {} free{placing}",
            c.sharing_policy,
            plural(u64::from(c.capacity), "device", "devices"),
            c.allocated,
            c.free
        ));
    }
    if why.verdict == Verdict::NoEntitlement {
        lines.push(format!(
            "entitlement: team {} has no quota for this sharing policy: teamgpu's admission \
             refuses its claims",
            why.team.as_deref().unwrap_or_default()
        ));
    }
    if let (Some(e), Some(team)) = (&why.entitlement, &why.team) {
        let state = if e.at_entitlement {
            format!(
                "{team} is at its entitlement: requests {} of {}",
                e.requested, e.entitlement
            )
        } else {
            let rest = if why.verdict == Verdict::Quota {
                ": the operator moves the rest to namespaces with waiting pods"
            } else {
                ""
            };
            format!(
                "{team} requests {} of its entitlement {}{rest}",
                e.requested, e.entitlement
            )
        };
        let scaled = if e.effective_guarantee < e.guaranteed {
            format!("{} (of {})", e.effective_guarantee, e.guaranteed)
        } else {
            e.guaranteed.to_string()
        };
        let explanation = if e.explanation.is_empty() {
            String::new()
        } else {
            format!("; {}", e.explanation)
        };
        lines.push(format!(
            "entitlement: {state} (guaranteed {scaled}, limit {}){explanation}",
            e.limit
        ));
    }
    if why.entitlement.is_some() {
        if why.borrowers.is_empty() {
            lines.push("who borrows: no team holds more than its guarantee".to_owned());
        } else {
            let list: Vec<String> = why
                .borrowers
                .iter()
                .map(|b| {
                    let this = if why.team.as_ref() == Some(&b.team) {
                        " (this team)"
                    } else {
                        ""
                    };
                    format!(
                        "{}{this} holds {}, {} above its guarantee of {}",
                        b.team, b.allocated, b.above, b.effective_guarantee
                    )
                })
                .collect();
            lines.push(format!("who borrows: {}", list.join("; ")));
        }
    }
    if let (Some(r), Some(team)) = (&why.reclaim, &why.team) {
        lines.push(reclaim_line(r, team, &why.borrowers));
    }
    if let (Some(q), Some(team)) = (&why.queue, &why.team) {
        lines.push(format!(
            "queue: {} of {} waiting for {} in team {team}",
            ordinal(q.position),
            plural(q.of as u64, "pod", "pods"),
            q.device_class
        ));
    }
    for e in &why.evidence {
        let source = e
            .source
            .as_deref()
            .map(|s| format!(" from {s}"))
            .unwrap_or_default();
        let times = if e.count > 1 {
            format!(", {} times", e.count)
        } else {
            String::new()
        };
        lines.push(format!("event: {}{source}{times}: {}", e.reason, e.message));
    }
    lines
}

fn reclaim_line(r: &ReclaimFacts, team: &str, borrowers: &[Borrower]) -> String {
    if !r.below {
        return format!(
            "reclaim: {team} holds {}, not below min(guarantee, requested + pending) = {}: \
             reclaim does not act for it",
            r.holds, r.owed_up_to
        );
    }
    let holds = format!("{team} holds {}, below {}", r.holds, r.owed_up_to);
    if r.enabled == Some(false) {
        return format!(
            "reclaim: {holds}, but reclaim is off for this team: it waits until borrowers finish"
        );
    }
    if !borrowers.iter().any(|b| b.team != team) {
        return format!(
            "reclaim: {holds}, but no other team holds more than its guarantee: it waits for \
             devices to free up"
        );
    }
    let grace = if r.grace_from_team {
        format!("grace {} s", r.grace_period_seconds)
    } else {
        format!(
            "grace {} s unless the operator's --reclaim-grace-seconds says otherwise",
            r.grace_period_seconds
        )
    };
    let waited = r
        .waited_seconds
        .map(|w| format!(", the oldest waiting pod has waited {w} s"))
        .unwrap_or_default();
    let when = match r.acts_in_seconds {
        Some(0) => "reclaim may evict borrowers now".to_owned(),
        Some(n) => format!("reclaim may evict borrowers in about {n} s"),
        None => "reclaim does not act".to_owned(),
    };
    match r.enabled {
        Some(true) => format!("reclaim: {holds}; {grace}{waited}: {when}"),
        _ => format!(
            "reclaim: {holds}; the team sets no spec.reclaim.enabled, so the operator's default \
             (--reclaim) decides; if on, {grace}{waited}: {when}"
        ),
    }
}

#[cfg(test)]
mod tests;
