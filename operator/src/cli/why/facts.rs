//! What the diagnosis reads, the command's argument, and the small things the plain inputs say
//! (a Pod's namespace, whether it is placed, a team's namespaces and numbers).

use k8s_openapi::api::core::v1::{Event, Pod, ResourceQuota};
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceClaimTemplate};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::jiff::Timestamp;

use crate::api::{GROUP, GpuSharingPolicy, QuotaStatus, TeamGpuPolicy};

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

pub(super) fn pod_namespace(pod: &Pod) -> &str {
    pod.metadata.namespace.as_deref().unwrap_or_default()
}

/// Whether `pod` is bound, running or done (its phase or node, for the verdict line).
pub(super) fn placed(pod: &Pod) -> bool {
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    phase.is_some_and(|p| p != "Pending")
        || pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.as_ref())
            .is_some()
}

pub(super) fn created(pod: &Pod) -> Option<Timestamp> {
    pod.metadata.creation_timestamp.as_ref().map(|t| t.0)
}

/// The sharing policy of a teamgpu DeviceClass.
pub(super) fn sharing_policy_of(class: &str) -> Option<&str> {
    class.strip_suffix(GROUP)?.strip_suffix('.')
}

/// A count of a ResourceQuota's `hard` or `used`.
pub(super) fn parse_count(q: Option<&Quantity>) -> Option<u64> {
    q.and_then(|q| q.0.trim().parse().ok())
}

pub(super) fn team_name(team: &TeamGpuPolicy) -> String {
    team.metadata.name.clone().unwrap_or_default()
}

/// The namespaces the operator last found in the team (its status).
pub(super) fn namespaces_of(team: &TeamGpuPolicy) -> &[String] {
    team.status
        .as_ref()
        .map(|s| &s.namespaces[..])
        .unwrap_or_default()
}

/// The team's numbers for `sharing_policy`, as the operator last wrote them.
pub(super) fn quota_of<'a>(
    team: &'a TeamGpuPolicy,
    sharing_policy: &str,
) -> Option<&'a QuotaStatus> {
    team.status
        .as_ref()?
        .quotas
        .iter()
        .find(|q| q.sharing_policy == sharing_policy)
}
