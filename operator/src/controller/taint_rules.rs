//! DeviceTaintRules where the API server serves them. Needs a client.
//!
//! Kubernetes 1.36 serves them in `resource.k8s.io/v1beta2` (and `v1alpha3`, of 1.33-1.35) only
//! with the DRADeviceTaintRules feature gate and that API version turned on, both off by
//! default; elsewhere teamgpu neither watches nor lists them. The served version is looked up
//! once, at start.

use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
use kube::{Api, Client};
use tokio::sync::watch;
use tokio::task::JoinSet;

use super::changes::{Wake, Watch};
use super::projected::{self, Projected, Projector};
use crate::core::plan::taints::TaintRuleView;

/// The DeviceTaintRule resource the API server serves, newest version first; `None` where it
/// serves none (or discovery fails: teamgpu then counts slice taints only, as before).
pub async fn served(client: &Client) -> Option<ApiResource> {
    for version in ["v1beta2", "v1alpha3"] {
        let gvk = GroupVersionKind::gvk("resource.k8s.io", version, "DeviceTaintRule");
        if let Ok((resource, _)) = kube::discovery::pinned_kind(client, &gvk).await {
            return Some(resource);
        }
    }
    None
}

/// The rule of a listed or watched object (see [`TaintRuleView::from_object`]).
pub fn view(object: &DynamicObject) -> Option<TaintRuleView> {
    TaintRuleView::from_object(&serde_json::to_value(object).ok()?)
}

/// Watches the DeviceTaintRules of `resource`, each kept as the planner reads it.
pub(super) fn watch(
    client: &Client,
    wake: &Wake,
    tasks: &mut JoinSet<()>,
    resource: &ApiResource,
) -> Projected<Option<TaintRuleView>, ()> {
    projected::spawn(
        tasks,
        Api::<DynamicObject>::all_with(client.clone(), resource),
        kube::runtime::watcher::Config::default(),
        watch::channel(Some(())).1,
        TaintRuleProjector,
        wake.clone(),
        Watch::TaintRules,
    )
}

/// A DeviceTaintRule as the planner reads it: what it taints, when its taint keeps claims off.
#[derive(Debug)]
struct TaintRuleProjector;

impl Projector<DynamicObject> for TaintRuleProjector {
    type View = Option<TaintRuleView>;
    type Params = ();

    fn project(&mut self, rule: &DynamicObject, (): &()) -> Option<TaintRuleView> {
        view(rule)
    }

    fn same(kept: &Option<TaintRuleView>, new: &Option<TaintRuleView>) -> bool {
        kept == new
    }
}
