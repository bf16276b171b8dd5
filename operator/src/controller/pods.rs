//! The Pod watches: the Pending Pods as pending demand reads them, and every Pod not done yet
//! as reclaim weighs it; and the PodDisruptionBudgets, which reclaim counts before it chooses.
//! Needs a client.

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::runtime::watcher;
use kube::{Api, Client};
use tokio::sync::watch;
use tokio::task::JoinSet;

use super::changes::{Wake, Watch};
use super::projected::{self, Projected, Projector};
use crate::core::effects::PodView;
use crate::core::effects::reclaim::budgets::BudgetView;
use crate::core::plan::pending::PendingPodView;
use crate::core::plan::usage::Names;

/// The two Pod watches: the Pending Pods as [`PendingPodView`]s (their claims, for pending
/// demand and waking waiting Pods), and every Pod not done yet as a [`PodView`] (for reclaim).
pub(super) fn watch_pods(
    client: &Client,
    wake: &Wake,
    tasks: &mut JoinSet<()>,
) -> (Projected<PendingPodView, ()>, Projected<PodView, ()>) {
    let pending_pods = projected::spawn(
        tasks,
        Api::<Pod>::all(client.clone()),
        watcher::Config::default().fields("status.phase=Pending"),
        watch::channel(Some(())).1,
        PendingProjector,
        wake.clone(),
        Watch::PendingPods,
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

/// Every PodDisruptionBudget, as reclaim counts it.
pub(super) fn watch_budgets(
    client: &Client,
    wake: &Wake,
    tasks: &mut JoinSet<()>,
) -> Projected<BudgetView, ()> {
    projected::spawn(
        tasks,
        Api::<PodDisruptionBudget>::all(client.clone()),
        watcher::Config::default(),
        watch::channel(Some(())).1,
        BudgetProjector,
        wake.clone(),
        Watch::Budgets,
    )
}

#[derive(Debug)]
struct BudgetProjector;

impl Projector<PodDisruptionBudget> for BudgetProjector {
    type View = BudgetView;
    type Params = ();

    fn project(&mut self, budget: &PodDisruptionBudget, (): &()) -> BudgetView {
        BudgetView::project(budget)
    }

    fn same(kept: &BudgetView, new: &BudgetView) -> bool {
        kept == new
    }

    /// The disruption controller counts a budget again whenever one of its Pods changes: none
    /// of that wakes a pass. Reclaim reads the budgets in a pass that runs anyway, and while
    /// budgets keep what a waiting team needs it looks again every 10 s.
    fn wakes(_: Option<&BudgetView>, _: Option<&BudgetView>) -> bool {
        false
    }
}

/// Pending Pods as [`PendingPodView`]s.
#[derive(Debug, Default)]
struct PendingProjector;

impl Projector<Pod> for PendingProjector {
    type View = PendingPodView;
    type Params = ();
    const TRACKED: bool = true;

    fn project(&mut self, pod: &Pod, (): &()) -> PendingPodView {
        PendingPodView::project(pod)
    }

    fn same(kept: &PendingPodView, new: &PendingPodView) -> bool {
        kept == new
    }

    /// A Pod that asks for no claim (most Pending Pods of a cluster) counts for nothing, and
    /// its events wake no pass.
    fn wakes(kept: Option<&PendingPodView>, new: Option<&PendingPodView>) -> bool {
        let claims = |pod: Option<&PendingPodView>| pod.is_some_and(|p| !p.claims.is_empty());
        claims(kept) || claims(new)
    }
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

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn only_pending_pods_that_ask_for_claims_wake_a_pass() {
        let pending = |claims: serde_json::Value| -> PendingPodView {
            let pod: Pod = serde_json::from_value(json!({
                "metadata": {"name": "p", "namespace": "ml"},
                "spec": {"containers": [], "resourceClaims": claims},
                "status": {"phase": "Pending"}
            }))
            .unwrap();
            PendingPodView::project(&pod)
        };
        let (gpu, web) = (
            pending(json!([{"name": "gpu", "resourceClaimTemplateName": "a100"}])),
            pending(json!([])),
        );
        let wakes = <PendingProjector as Projector<Pod>>::wakes;
        assert!(wakes(None, Some(&gpu)));
        assert!(wakes(Some(&gpu), Some(&gpu)));
        assert!(wakes(Some(&gpu), None));
        assert!(!wakes(None, Some(&web)));
        assert!(!wakes(Some(&web), Some(&web)));
        assert!(!wakes(Some(&web), None));
    }
}
