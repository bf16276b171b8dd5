//! The Pods not done yet, as reclaim weighs them, and the Pending Pods that ask for claims,
//! kept by namespace and name and updated by what their watches say changed: a Pod's event
//! costs that Pod, not every Pod of the cluster. Pure.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::core::effects::PodView;
use crate::core::plan::inventory::ExtraTaint;
use crate::core::plan::pending::PendingPodView;
use crate::core::state::Delta;

/// A Pod's namespace and name.
type PodKey = (Arc<str>, Arc<str>);

fn key(pod: &PodView) -> PodKey {
    (Arc::clone(&pod.namespace), Arc::clone(&pod.name))
}

/// The Pods not done yet; see the module documentation.
#[derive(Debug, Default)]
pub(super) struct KeptPods {
    pods: BTreeMap<PodKey, Arc<PodView>>,
    /// The Pods that report unhealthy devices (almost always none), kept apart so that the
    /// device taints are worked out from them alone.
    unhealthy: BTreeMap<PodKey, Arc<PodView>>,
}

impl KeptPods {
    /// Takes in every Pod, or what changed; whether the devices Pods report unhealthy changed.
    pub(super) fn take_in(&mut self, delta: Delta<'_, PodView>) -> bool {
        // Almost always empty: nothing is copied.
        let before: Vec<ExtraTaint> = self.unhealthy().cloned().collect();
        if let Delta::All(_) = delta {
            self.pods.clear();
            self.unhealthy.clear();
        }
        let (upserted, removed) = delta.parts();
        for pod in removed {
            let key = key(pod);
            self.pods.remove(&key);
            self.unhealthy.remove(&key);
        }
        for pod in upserted {
            let key = key(pod);
            if pod.unhealthy.is_empty() {
                self.unhealthy.remove(&key);
            } else {
                self.unhealthy.insert(key.clone(), Arc::clone(pod));
            }
            self.pods.insert(key, Arc::clone(pod));
        }
        !self.unhealthy().eq(before.iter())
    }

    /// The devices the Pods report unhealthy.
    pub(super) fn unhealthy(&self) -> impl Iterator<Item = &ExtraTaint> {
        self.unhealthy.values().flat_map(|p| p.unhealthy.iter())
    }

    /// Pod `name` of `namespace`, if it is not done yet.
    pub(super) fn get(&self, namespace: &str, name: &str) -> Option<&Arc<PodView>> {
        self.pods.get(&(Arc::from(namespace), Arc::from(name)))
    }

    /// Every Pod, by namespace and name (what reclaim reads, when a reclaim is due).
    pub(super) fn all(&self) -> Vec<Arc<PodView>> {
        self.pods.values().cloned().collect()
    }
}

/// The Pending Pods that ask for claims (the others count for nothing), by namespace and name.
#[derive(Debug, Default)]
pub(super) struct KeptPending(BTreeMap<(String, String), Arc<PendingPodView>>);

impl KeptPending {
    /// Takes in every Pending Pod, or what changed.
    pub(super) fn take_in(&mut self, delta: Delta<'_, PendingPodView>) {
        let key = |pod: &PendingPodView| (pod.namespace.clone(), pod.name.clone());
        if let Delta::All(_) = delta {
            self.0.clear();
        }
        let (upserted, removed) = delta.parts();
        for pod in removed {
            self.0.remove(&key(pod));
        }
        for pod in upserted {
            if pod.claims.is_empty() {
                self.0.remove(&key(pod));
            } else {
                self.0.insert(key(pod), Arc::clone(pod));
            }
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The Pods, by namespace and name.
    pub(super) fn views(&self) -> Vec<&PendingPodView> {
        self.0.values().map(|p| &**p).collect()
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::Pod;
    use serde_json::json;

    use super::*;
    use crate::core::plan::usage::Names;

    /// A Pod of `ns`, reporting the devices of `unhealthy` (pool, device) unhealthy, as the
    /// kubelet writes `status.containerStatuses[].allocatedResourcesStatus` (KEP-4680).
    fn pod(ns: &str, name: &str, unhealthy: &[&str]) -> Arc<PodView> {
        let health: Vec<_> = (unhealthy.iter())
            .map(|device| {
                json!({"resourceID": format!("gpu.nvidia.com/node-a/{device}"), "health": "Unhealthy"})
            })
            .collect();
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": ns},
            "spec": {"containers": [{"name": "c"}]},
            "status": {"phase": "Running", "containerStatuses": [{
                "name": "c", "image": "i", "imageID": "", "ready": true, "restartCount": 0,
                "allocatedResourcesStatus": [{"name": "claim:gpu", "resources": health}]
            }]}
        }))
        .unwrap();
        Arc::new(PodView::project(&pod, &mut Names::default()))
    }

    #[test]
    fn pending_pods_that_ask_for_no_claim_are_not_kept() {
        let pending = |name: &str, claims: serde_json::Value| -> Arc<PendingPodView> {
            let pod: Pod = serde_json::from_value(json!({
                "metadata": {"name": name, "namespace": "ml"},
                "spec": {"containers": [], "resourceClaims": claims},
                "status": {"phase": "Pending"}
            }))
            .unwrap();
            Arc::new(PendingPodView::project(&pod))
        };
        let template = json!([{"name": "gpu", "resourceClaimTemplateName": "a100"}]);
        let names = |kept: &KeptPending| -> Vec<String> {
            kept.views().iter().map(|p| p.name.clone()).collect()
        };
        let (train, web) = (
            pending("train", template.clone()),
            pending("web", json!([])),
        );
        let mut kept = KeptPending::default();
        kept.take_in(Delta::All(&[train.clone(), web.clone()]));
        assert_eq!(names(&kept), ["train"]);
        let eval = pending("eval", template);
        kept.take_in(Delta::Changed {
            upserted: &[eval, pending("api", json!([]))],
            removed: std::slice::from_ref(&web),
        });
        assert_eq!(names(&kept), ["eval", "train"]);
        kept.take_in(Delta::Changed {
            upserted: &[],
            removed: &[train],
        });
        assert_eq!(names(&kept), ["eval"]);
        kept.take_in(Delta::All(&[web]));
        assert!(kept.is_empty());
    }

    fn devices(kept: &KeptPods) -> Vec<String> {
        (kept.unhealthy().filter_map(|t| t.device.clone())).collect()
    }

    fn names(kept: &KeptPods) -> Vec<String> {
        (kept.all().iter())
            .map(|p| format!("{}/{}", p.namespace, p.name))
            .collect()
    }

    #[test]
    fn a_pods_change_replaces_that_pod_and_says_when_the_unhealthy_devices_changed() {
        let mut kept = KeptPods::default();
        let (a, b) = (pod("ml", "a", &[]), pod("ml", "b", &["gpu-0"]));
        assert!(kept.take_in(Delta::All(&[a.clone(), b.clone()])));
        assert_eq!(names(&kept), ["ml/a", "ml/b"]);
        assert_eq!(devices(&kept), ["gpu-0"]);

        // A healthy Pod changes, one is added: the devices are the same.
        let a2 = pod("ml", "a", &[]);
        let c = pod("cv", "c", &[]);
        let changed = Delta::Changed {
            upserted: &[a2.clone(), c.clone()],
            removed: &[],
        };
        assert!(!kept.take_in(changed));
        assert_eq!(names(&kept), ["cv/c", "ml/a", "ml/b"]);
        assert!(Arc::ptr_eq(&kept.all()[1], &a2));

        // b reports a second device, then c reports one too, then b goes.
        let b2 = pod("ml", "b", &["gpu-0", "gpu-1"]);
        let changed = Delta::Changed {
            upserted: std::slice::from_ref(&b2),
            removed: &[],
        };
        assert!(kept.take_in(changed));
        assert_eq!(devices(&kept), ["gpu-0", "gpu-1"]);
        let c2 = pod("cv", "c", &["gpu-7"]);
        let changed = Delta::Changed {
            upserted: &[c2],
            removed: &[],
        };
        assert!(kept.take_in(changed));
        assert_eq!(devices(&kept), ["gpu-7", "gpu-0", "gpu-1"]);
        let changed = Delta::Changed {
            upserted: &[],
            removed: &[b2],
        };
        assert!(kept.take_in(changed));
        assert_eq!(devices(&kept), ["gpu-7"]);
        assert_eq!(names(&kept), ["cv/c", "ml/a"]);

        // Every Pod again (a resync): what is not among them is gone.
        assert!(kept.take_in(Delta::All(std::slice::from_ref(&a))));
        assert_eq!(names(&kept), ["ml/a"]);
        assert_eq!(devices(&kept), Vec::<String>::new());
        assert!(!kept.take_in(Delta::All(&[a])));
        assert_eq!(names(&kept), ["ml/a"]);
    }
}
