//! End-to-end test support for teamgpu, against a real Kubernetes API server: a control plane
//! started from release binaries (`TEAMGPU_E2E_ASSETS`) with a node agent playing the kubelet's
//! API part, or a throwaway cluster (`TEAMGPU_E2E_KUBECONFIG`); a fault-injecting proxy in front
//! of it; request counting; and the sandbox that isolates the operator scenarios.

pub mod cluster;
pub mod control_plane;
pub mod docs;
pub mod fixtures;
pub mod http;
pub mod node_agent;
pub mod operator;
pub mod proxy;
pub mod recording;
pub mod sandbox;

pub use cluster::{ClusterError, TestCluster};
pub use proxy::{FaultProxy, Faults};

use std::future::Future;
use std::time::{Duration, Instant};

/// What refuses a governed class in a namespace outside every team, in its message: the quota
/// of 0 once it is in force there, the non-team admission policy before.
pub const REFUSED_OUTSIDE_TEAMS: [&str; 2] = [
    "exceeded quota: teamgpu-outside-teams",
    "belongs to no TeamGpuPolicy",
];

/// Whether `message` is a refusal of [`REFUSED_OUTSIDE_TEAMS`].
pub fn refused_outside_teams(message: &str) -> bool {
    REFUSED_OUTSIDE_TEAMS.iter().any(|m| message.contains(m))
}

/// Polls `check` every 25 ms until it returns `Ok`, or panics after `timeout` with `what` and
/// the last `Err`.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    let started = Instant::now();
    loop {
        match check().await {
            Ok(value) => return value,
            Err(last) if started.elapsed() > timeout => {
                panic!("{what}: not within {timeout:?}; last: {last}")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(25)).await,
        }
    }
}

/// For a failure message: the quota `quota` of `ns` (spec, status, and who wrote it when, from
/// its managed fields) and the namespace's claims (created when, allocated or not).
pub async fn quota_and_claims(client: &kube::Client, ns: &str, quota: &str) -> String {
    use k8s_openapi::api::core::v1::ResourceQuota;
    use k8s_openapi::api::resource::v1::ResourceClaim;
    use kube::{Api, ResourceExt};
    let quota = Api::<ResourceQuota>::namespaced(client.clone(), ns)
        .get_opt(quota)
        .await;
    let claims = Api::<ResourceClaim>::namespaced(client.clone(), ns)
        .list(&Default::default())
        .await;
    let claims: Vec<String> = (claims.map(|l| l.items).unwrap_or_default().iter())
        .map(|c| {
            let created = c.metadata.creation_timestamp.as_ref().map(|t| t.0);
            let allocated = c.status.as_ref().is_some_and(|s| s.allocation.is_some());
            format!("{} created {created:?} allocated {allocated}", c.name_any())
        })
        .collect();
    let quota = quota.map(|q| {
        q.map(|q| {
            let writers: Vec<String> = (q.managed_fields().iter())
                .map(|m| {
                    let time = m.time.as_ref().map(|t| t.0);
                    let (manager, subresource) = (&m.manager, &m.subresource);
                    format!("{manager:?} {subresource:?} at {time:?}")
                })
                .collect();
            (q.spec, q.status, writers)
        })
    });
    format!("quota (spec, status, writers): {quota:?}; claims: {claims:?}")
}

// The Rust code of docs/fair-sharing.md runs as a doctest (here, not in the operator crate, whose
// sources the image builds from without docs/), so the page cannot drift from the API.
#[cfg(doctest)]
#[doc = include_str!("../../docs/fair-sharing.md")]
struct FairSharingPage;
