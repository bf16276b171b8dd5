//! The Pod watches: the Pending Pods whole, and every Pod not done yet as reclaim weighs it.
//! Needs a client.

use k8s_openapi::api::core::v1::Pod;
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher;
use kube::{Api, Client};
use tokio::sync::watch;
use tokio::task::JoinSet;

use super::changes::{Wake, Watch};
use super::projected::{self, Projected, Projector};
use super::reflect::spawn;
use crate::core::effects::PodView;
use crate::core::plan::usage::Names;

/// The two Pod watches: the Pending Pods whole (their claims' statuses, for pending demand and
/// waking waiting Pods), and every Pod not done yet as a [`PodView`] (for reclaim).
pub(super) fn watch_pods(
    client: &Client,
    wake: &Wake,
    tasks: &mut JoinSet<()>,
) -> (Store<Pod>, Projected<PodView, ()>) {
    let (pending_pods, writer) = reflector::store();
    let pending = watcher(
        Api::<Pod>::all(client.clone()),
        watcher::Config::default().fields("status.phase=Pending"),
    );
    spawn(
        tasks,
        writer,
        pending,
        wake.clone(),
        Watch::PendingPods,
        "pods",
    );
    let pods = projected::spawn(
        tasks,
        Api::<Pod>::all(client.clone()),
        watcher::Config::default().fields("status.phase!=Succeeded,status.phase!=Failed"),
        watch::channel(Some(())).1,
        PodProjector::default(),
        wake.clone(),
        Watch::Pods,
    );
    (pending_pods, pods)
}

/// Pods as [`PodView`]s, their namespaces and workload names shared.
#[derive(Debug, Default)]
struct PodProjector {
    names: Names,
}

impl Projector<Pod> for PodProjector {
    type View = PodView;
    type Params = ();
    const TRACKED: bool = true;

    fn project(&mut self, pod: &Pod, (): &()) -> PodView {
        PodView::project(pod, &mut self.names)
    }

    fn same(kept: &PodView, new: &PodView) -> bool {
        kept == new
    }

    /// Pods not pending wake no pass: reclaim reads them in a pass that runs anyway (a claim
    /// changed, a grace period ended), and the status changes of thousands of running Pods
    /// would otherwise make passes that find nothing to do. But a device reported unhealthy
    /// (or healthy again, or its Pod gone) changes capacity now.
    fn wakes(kept: Option<&PodView>, new: Option<&PodView>) -> bool {
        fn unhealthy(pod: Option<&PodView>) -> &[crate::core::plan::inventory::ExtraTaint] {
            pod.map_or(&[], |p| &p.unhealthy)
        }
        unhealthy(kept) != unhealthy(new)
    }

    fn relisted(&mut self) {
        self.names.prune();
    }
}
