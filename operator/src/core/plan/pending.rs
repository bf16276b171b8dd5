//! Pending demand: devices that Pods wait for because their claims could not be created (quota
//! refused them) or are not allocated yet. Pure.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Pod, PodResourceClaim};
use k8s_openapi::api::resource::v1::ResourceClaimTemplate;
use k8s_openapi::jiff::Timestamp;

use super::usage::{ClaimView, quota_charge};
use crate::core::state::PendingDemand;

/// What quota charges for a claim made from each of `templates`, by (namespace, name).
pub fn template_charges(
    templates: &[&ResourceClaimTemplate],
) -> BTreeMap<(String, String), BTreeMap<String, u64>> {
    templates
        .iter()
        .filter_map(|t| {
            Some((
                (t.metadata.namespace.clone()?, t.metadata.name.clone()?),
                quota_charge(&t.spec.spec),
            ))
        })
        .collect()
}

/// The claims the resourceclaim controller made for `pod`'s entries from templates, by entry
/// name (`None`: it decided the Pod needs no claim for the entry), as the Pod's status says.
pub fn generated_claim_names(pod: &Pod) -> BTreeMap<&str, Option<&str>> {
    pod.status
        .iter()
        .flat_map(|s| s.resource_claim_statuses.iter().flatten())
        .map(|s| (s.name.as_str(), s.resource_claim_name.as_deref()))
        .collect()
}

/// Each of `pod`'s `spec.resourceClaims` entries with the claim it uses: the one it names, or
/// the one the resourceclaim controller made for it from its template (`None` before that).
pub fn pod_claims(pod: &Pod) -> impl Iterator<Item = (&PodResourceClaim, Option<&str>)> {
    let generated = generated_claim_names(pod);
    (pod.spec.iter())
        .flat_map(|s| s.resource_claims.iter().flatten())
        .map(move |entry| {
            let made = || generated.get(entry.name.as_str()).copied().flatten();
            (entry, entry.resource_claim_name.as_deref().or_else(made))
        })
}

/// What pending demand reads of a Pending Pod. A Pod that is not Pending, or asks for no
/// claim, has no claims here: it counts for nothing (the operator's watch keeps it so, and its
/// events wake no pass).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PendingPodView {
    pub namespace: String,
    pub name: String,
    /// `spec.priority`, resolved from the PriorityClass at admission (0 without one).
    pub priority: i32,
    pub created: Option<Timestamp>,
    /// Being deleted: it waits for nothing.
    pub deleting: bool,
    /// Each entry of `spec.resourceClaims`.
    pub claims: Box<[PodClaim]>,
}

/// One entry of a Pod's `spec.resourceClaims`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodClaim {
    /// The claim it names, or the one the resourceclaim controller made for it from its
    /// template (the Pod's status says which); `None` before that.
    pub claim: Option<String>,
    /// The template its claim is made from.
    pub template: Option<String>,
}

impl PendingPodView {
    pub fn project(pod: &Pod) -> Self {
        let meta = &pod.metadata;
        let pending = pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Pending");
        let claims = (pod_claims(pod).filter(|_| pending))
            .map(|(entry, claim)| PodClaim {
                claim: claim.map(str::to_owned),
                template: entry.resource_claim_template_name.clone(),
            })
            .collect();
        PendingPodView {
            namespace: meta.namespace.clone().unwrap_or_default(),
            name: meta.name.clone().unwrap_or_default(),
            priority: pod.spec.as_ref().and_then(|s| s.priority).unwrap_or(0),
            created: meta.creation_timestamp.as_ref().map(|t| t.0),
            deleting: meta.deletion_timestamp.is_some(),
            claims,
        }
    }
}

/// The devices pending Pods wait for, per namespace and DeviceClass. `template_charge` says what
/// quota charges for a claim made from template `(namespace, name)`, if it exists
/// ([`template_charges`]).
///
/// For each claim of a pending Pod: an existing claim without allocation counts what quota charges
/// for it; a claim from a template that does not exist yet (the resourceclaim controller could not
/// create it, typically because quota refused) counts what the template would be charged.
pub fn pending_demand<'c>(
    pods: &[&PendingPodView],
    claim: impl Fn(&str, &str) -> Option<&'c ClaimView>,
    template_charge: impl Fn(&str, &str) -> Option<BTreeMap<String, u64>>,
) -> Vec<PendingDemand> {
    // Per (namespace, class): devices, each claim's devices, those of them charged, the oldest
    // Pod's creation.
    type Waiting = (u64, Vec<u32>, Vec<u32>, Option<Timestamp>);
    let mut demand: BTreeMap<(String, String), Waiting> = BTreeMap::new();
    for pod in pods {
        let (namespace, created) = (pod.namespace.as_str(), pod.created);
        for pod_claim in &pod.claims {
            let existing = (pod_claim.claim.as_deref()).and_then(|n| claim(namespace, n));
            let charge: BTreeMap<String, u64> = match existing {
                Some(claim) if claim.allocated => continue,
                Some(claim) => claim
                    .charge
                    .iter()
                    .map(|(class, n)| (class.to_string(), *n))
                    .collect(),
                None => match pod_claim.template.as_deref() {
                    Some(t) => match template_charge(namespace, t) {
                        Some(charge) => charge,
                        None => continue,
                    },
                    None => continue,
                },
            };
            for (class, devices) in charge {
                let (sum, claims, charged, oldest) =
                    demand.entry((namespace.to_owned(), class)).or_default();
                *sum += devices;
                let devices = u32::try_from(devices).unwrap_or(u32::MAX);
                claims.push(devices);
                if existing.is_some() {
                    charged.push(devices);
                }
                *oldest = match (*oldest, created) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
            }
        }
    }
    demand
        .into_iter()
        .map(
            |((namespace, device_class), (devices, mut claims, mut charged, oldest))| {
                claims.sort_unstable_by(|a, b| b.cmp(a));
                charged.sort_unstable_by(|a, b| b.cmp(a));
                PendingDemand {
                    namespace,
                    device_class,
                    devices: u32::try_from(devices).unwrap_or(u32::MAX),
                    claims,
                    charged,
                    oldest,
                }
            },
        )
        .collect()
}

/// Finds the claims of `claims` by namespace and name, for [`pending_demand`] and
/// [`waiting_on_quota`] (the operator finds them in the claims its planner keeps).
pub fn by_name<'c>(claims: &[&'c ClaimView]) -> impl Fn(&str, &str) -> Option<&'c ClaimView> {
    let by_name: BTreeMap<(&'c str, &'c str), &'c ClaimView> = (claims.iter())
        .map(|c| ((&*c.namespace, &*c.name), *c))
        .collect();
    move |namespace, name| by_name.get(&(namespace, name)).copied()
}

/// A Pod waiting for a claim from a template that quota refused (the claim does not exist).
#[derive(Clone, Debug, PartialEq)]
pub struct WaitingPod {
    pub namespace: String,
    pub name: String,
    pub priority: i32,
    pub created: Option<Timestamp>,
    /// What quota charges for a claim from the template, per DeviceClass.
    pub charge: BTreeMap<String, u64>,
}

/// The Pods waiting because quota refused the claim a template would make: a Pending Pod not
/// being deleted, and a claim of it from a template whose claim does not exist. One entry per
/// such claim; `template_charge` as for [`pending_demand`] (templates it does not know are left
/// out: they are not teamgpu's to wake).
pub fn waiting_on_quota<'c>(
    pods: &[&PendingPodView],
    claim_of: impl Fn(&str, &str) -> Option<&'c ClaimView>,
    template_charge: impl Fn(&str, &str) -> Option<BTreeMap<String, u64>>,
) -> Vec<WaitingPod> {
    let mut out = Vec::new();
    for pod in pods.iter().filter(|p| !p.deleting) {
        let namespace = pod.namespace.as_str();
        for pod_claim in &pod.claims {
            let Some(template) = pod_claim.template.as_deref() else {
                continue;
            };
            if (pod_claim.claim.as_deref()).is_some_and(|c| claim_of(namespace, c).is_some()) {
                continue;
            }
            let Some(charge) = template_charge(namespace, template) else {
                continue;
            };
            out.push(WaitingPod {
                namespace: pod.namespace.clone(),
                name: pod.name.clone(),
                priority: pod.priority,
                created: pod.created,
                charge,
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::resource::v1::ResourceClaim;
    use serde_json::json;

    fn template() -> ResourceClaimTemplate {
        serde_json::from_value(json!({
            "metadata": {"name": "a100-x2", "namespace": "ml"},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": "a100.teamgpu.io", "allocationMode": "ExactCount", "count": 2}}]}}}
        }))
        .unwrap()
    }

    fn pod(name: &str, phase: &str, generated: Option<&str>) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ml"},
            "spec": {"containers": [], "resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": "a100-x2"}]},
            "status": {"phase": phase, "resourceClaimStatuses": generated.map(|c| vec![json!({"name": "gpus", "resourceClaimName": c})])}
        }))
        .unwrap()
    }

    #[test]
    fn a_pending_pods_view_has_its_claims_and_a_pod_asking_for_none_has_none() {
        let generated = pod("train", "Pending", Some("train-gpus-x7k2"));
        let mut named = pod("named", "Pending", None);
        named.spec.as_mut().unwrap().resource_claims = Some(vec![
            serde_json::from_value(json!({"name": "shared", "resourceClaimName": "team-pool"}))
                .unwrap(),
        ]);
        let mut plain = pod("web", "Pending", None);
        plain.spec.as_mut().unwrap().resource_claims = None;
        let running = pod("running", "Running", Some("running-gpus"));
        let claims = |pod: &Pod| -> Vec<(Option<String>, Option<String>)> {
            (PendingPodView::project(pod).claims.iter())
                .map(|c| (c.claim.clone(), c.template.clone()))
                .collect()
        };
        let some = |s: &str| Some(s.to_owned());
        assert_eq!(
            claims(&generated),
            [(some("train-gpus-x7k2"), some("a100-x2"))]
        );
        assert_eq!(claims(&named), [(some("team-pool"), None)]);
        assert_eq!(
            claims(&pod("new", "Pending", None)),
            [(None, some("a100-x2"))]
        );
        assert_eq!(claims(&plain), []);
        assert_eq!(claims(&running), []);
    }

    fn views(pods: &[&Pod]) -> Vec<PendingPodView> {
        pods.iter().map(|p| PendingPodView::project(p)).collect()
    }

    fn claim(name: &str, allocated: bool) -> ResourceClaim {
        let mut c: ResourceClaim = serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ml"},
            "spec": template().spec.spec,
        }))
        .unwrap();
        if allocated {
            c.status = Some(
                serde_json::from_value(json!({"allocation": {"devices": {"results": []}}}))
                    .unwrap(),
            );
        }
        c
    }

    #[test]
    fn pods_waiting_for_claims_count_what_they_would_be_charged_and_which_are_charged() {
        let t = template();
        let (refused, unallocated, allocated, running) = (
            pod("refused", "Pending", None),
            pod("waiting", "Pending", Some("waiting-gpus")),
            pod("placed", "Pending", Some("placed-gpus")),
            pod("running", "Running", None),
        );
        let (c1, c2) = (claim("waiting-gpus", false), claim("placed-gpus", true));
        let mut names = crate::core::plan::usage::Names::default();
        let (c1, c2) = (
            ClaimView::project(&c1, &mut names),
            ClaimView::project(&c2, &mut names),
        );
        let pods = views(&[&refused, &unallocated, &allocated, &running]);
        let demand = pending_demand(
            &pods.iter().collect::<Vec<_>>(),
            by_name(&[&c1, &c2]),
            |ns, name| {
                template_charges(&[&t])
                    .get(&(ns.to_owned(), name.to_owned()))
                    .cloned()
            },
        );
        assert_eq!(
            demand,
            [PendingDemand {
                namespace: "ml".into(),
                device_class: "a100.teamgpu.io".into(),
                devices: 4,
                claims: vec![2, 2],
                // The claim that exists and waits is charged; the refused one is not.
                charged: vec![2],
                oldest: None,
            }]
        );
    }

    #[test]
    fn pods_whose_template_claims_quota_refused_are_waiting_with_their_priority() {
        let t = template();
        let mut refused = pod("refused", "Pending", None);
        refused.spec.as_mut().unwrap().priority = Some(1000);
        refused.metadata.creation_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                "2026-01-01T00:00:00Z".parse().unwrap(),
            ));
        let mut leaving = pod("leaving", "Pending", None);
        leaving.metadata.deletion_timestamp = refused.metadata.creation_timestamp.clone();
        let (created, named_but_gone, running) = (
            pod("created", "Pending", Some("created-gpus")),
            pod("gone", "Pending", Some("gone-gpus")),
            pod("running", "Running", None),
        );
        let mut names = crate::core::plan::usage::Names::default();
        let c = ClaimView::project(&claim("created-gpus", false), &mut names);
        let pods = views(&[&refused, &leaving, &created, &named_but_gone, &running]);
        let waiting = waiting_on_quota(
            &pods.iter().collect::<Vec<_>>(),
            by_name(&[&c]),
            |ns, name| {
                template_charges(&[&t])
                    .get(&(ns.to_owned(), name.to_owned()))
                    .cloned()
            },
        );
        let found: Vec<(&str, i32, Option<String>)> = (waiting.iter())
            .map(|w| {
                let created = w.created.map(|t| t.to_string());
                (w.name.as_str(), w.priority, created)
            })
            .collect();
        assert_eq!(
            found,
            [
                ("refused", 1000, Some("2026-01-01T00:00:00Z".to_owned())),
                ("gone", 0, None),
            ]
        );
        assert_eq!(
            waiting[0].charge,
            BTreeMap::from([("a100.teamgpu.io".to_owned(), 2)])
        );
    }
}
