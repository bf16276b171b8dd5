//! The Pod's claims: each entry of its `spec.resourceClaims`, resolved against the claims and
//! templates of its namespace, with the DeviceClass and devices it asks for.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Pod, PodResourceClaim};
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceClaimTemplate};

use super::facts::{Facts, pod_namespace, sharing_policy_of};
use super::{ClaimState, PodClaim};
use crate::api::{GROUP, GpuSharingPolicy};
use crate::core::plan::objects::is_teamgpu_class;
use crate::core::plan::pending::generated_claim_names;
use crate::core::plan::usage::quota_charge;

/// Each of `pod`'s claims, resolved against the claims and templates of `facts`.
pub(super) fn pod_claims(pod: &Pod, facts: &Facts) -> Vec<PodClaim> {
    let namespace = pod_namespace(pod);
    let generated = generated_claim_names(pod);
    pod.spec
        .iter()
        .flat_map(|s| s.resource_claims.iter().flatten())
        .map(|entry| resolve(entry, &generated, facts, namespace))
        .collect()
}

/// The claims of `pod` it waits for, of a teamgpu class: not allocated and needed.
pub(super) fn waits_for(claims: &[PodClaim]) -> impl Iterator<Item = &PodClaim> {
    claims.iter().filter(|c| {
        !matches!(c.state, ClaimState::Allocated | ClaimState::NotNeeded)
            && c.device_class.as_deref().is_some_and(is_teamgpu_class)
    })
}

/// One entry: its claim (named, or made from its template), where it stands and what it asks.
fn resolve(
    entry: &PodResourceClaim,
    generated: &BTreeMap<&str, Option<&str>>,
    facts: &Facts,
    namespace: &str,
) -> PodClaim {
    let template_name = entry.resource_claim_template_name.clone();
    let template = template_name
        .as_deref()
        .and_then(|t| named(&facts.templates, namespace, t));
    let (claim_name, state) = claim_name_or_state(entry, generated);
    let existing = claim_name
        .as_deref()
        .and_then(|c| named(&facts.claims, namespace, c));
    let (state, charge) = match (state, existing) {
        (Some(state), _) => {
            let charge = match (template_name.as_deref(), template) {
                (Some(_), Some(t)) => template_charge(t),
                (Some(name), None) => template_by_name(name, &facts.sharing_policies),
                (None, _) => None,
            };
            // A template that is not there: the claim cannot be made from it.
            let missing = state == ClaimState::NotCreated && template.is_none();
            let state = if missing { ClaimState::Missing } else { state };
            (state, charge)
        }
        (None, Some(claim)) => (
            allocation_state(claim),
            main_class(&quota_charge(&claim.spec)),
        ),
        // The claim it names does not exist.
        (None, None) => (ClaimState::Missing, template.and_then(template_charge)),
    };
    let (device_class, devices) = charge.map_or((None, 0), |(class, n)| (Some(class), n));
    PodClaim {
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
    }
}

/// The claim `entry` names or the resourceclaim controller made for it; else where it stands
/// without one.
fn claim_name_or_state(
    entry: &PodResourceClaim,
    generated: &BTreeMap<&str, Option<&str>>,
) -> (Option<String>, Option<ClaimState>) {
    match (
        &entry.resource_claim_name,
        &entry.resource_claim_template_name,
    ) {
        (Some(name), _) => (Some(name.clone()), None),
        (None, Some(_)) => match generated.get(entry.name.as_str()) {
            Some(Some(name)) => (Some((*name).to_owned()), None),
            Some(None) => (None, Some(ClaimState::NotNeeded)),
            None => (None, Some(ClaimState::NotCreated)),
        },
        (None, None) => (None, Some(ClaimState::Missing)),
    }
}

fn allocation_state(claim: &ResourceClaim) -> ClaimState {
    if claim
        .status
        .as_ref()
        .is_some_and(|s| s.allocation.is_some())
    {
        ClaimState::Allocated
    } else {
        ClaimState::Unallocated
    }
}

/// The object of `items` named `name` in `namespace`.
fn named<'a, K: kube::Resource>(items: &'a [K], namespace: &str, name: &str) -> Option<&'a K> {
    items.iter().find(|o| {
        o.meta().namespace.as_deref() == Some(namespace) && o.meta().name.as_deref() == Some(name)
    })
}

fn template_charge(template: &ResourceClaimTemplate) -> Option<(String, u64)> {
    main_class(&quota_charge(&template.spec.spec))
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
