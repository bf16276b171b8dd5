//! The operator (`teamgpu::controller::run`) running in-process until stopped or dropped, for
//! scenarios that drive it; and filling a cluster with a synthetic workload.

use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::Client;
use kube::api::{Api, ObjectMeta, PostParams};
use teamgpu::api::{GpuSharingPolicy, TeamGpuPolicy};
use teamgpu::core::state::ClusterState;
use tokio::sync::oneshot;

use crate::fixtures::fresh;

/// The operator running in-process until [`Operator::stop`] or drop.
#[derive(Debug)]
pub struct Operator {
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<Result<(), teamgpu::controller::Error>>,
}

impl Operator {
    /// Runs the operator as `client` with `config`.
    pub fn start(client: Client, config: teamgpu::controller::Config) -> Operator {
        let (stop, stopped) = oneshot::channel();
        let task = tokio::spawn(teamgpu::controller::run(client, config, async {
            let _ = stopped.await;
        }));
        Operator {
            stop: Some(stop),
            task,
        }
    }

    /// The tests' configuration: metrics on a free local port, a short debounce.
    pub fn test_config() -> teamgpu::controller::Config {
        teamgpu::controller::Config {
            metrics_addr: ([127, 0, 0, 1], 0).into(),
            debounce: Duration::from_millis(20),
            ..Default::default()
        }
    }

    /// Graceful stop (as on SIGTERM).
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = (&mut self.task).await;
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Creates `state`'s namespaces (with their labels), ResourceSlices, GpuSharingPolicies and
/// TeamGpuPolicies, one at a time (claims and classes are left out).
pub async fn fill(client: &Client, state: &ClusterState) -> Result<(), kube::Error> {
    let pp = PostParams::default();
    for ns in &state.namespaces {
        let namespace = Namespace {
            metadata: ObjectMeta {
                name: Some(ns.name.clone()),
                labels: Some(ns.labels.clone()),
                ..Default::default()
            },
            ..Default::default()
        };
        Api::<Namespace>::all(client.clone())
            .create(&pp, &namespace)
            .await?;
    }
    for slice in &state.slices {
        Api::<ResourceSlice>::all(client.clone())
            .create(&pp, &fresh(slice))
            .await?;
    }
    for p in &state.sharing_policies {
        Api::<GpuSharingPolicy>::all(client.clone())
            .create(&pp, &fresh(p))
            .await?;
    }
    for t in &state.teams {
        Api::<TeamGpuPolicy>::all(client.clone())
            .create(&pp, &fresh(t))
            .await?;
    }
    Ok(())
}
