//! Taints on devices from outside their ResourceSlices ([`ExtraTaint`]), read from the two
//! places Kubernetes 1.36 keeps them:
//!
//! - **DeviceTaintRules** (`resource.k8s.io/v1beta2`, served where the DRADeviceTaintRules
//!   feature, beta and off by default in 1.36, and that API version are on; `v1alpha3` before):
//!   an admin taints the devices its `deviceSelector` names (driver, pool, device, each
//!   optional; an empty selector names every device). The scheduler keeps claims that do not
//!   tolerate a NoSchedule or NoExecute taint off them, so they are no capacity.
//! - **Device health in Pod status** (`status.containerStatuses[].allocatedResourcesStatus`,
//!   KEP-4680, ResourceHealthStatus beta and on by default in 1.36): the kubelet reports each
//!   DRA device a container holds (`resourceID` `<driver>/<pool>/<device>`) as Healthy,
//!   Unhealthy or Unknown. A device reported Unhealthy is counted as tainted `unhealthy` for as
//!   long as a Pod reports it, so that nobody is promised it again.

use k8s_openapi::api::core::v1::Pod;
use serde_json::Value;

use super::inventory::ExtraTaint;

/// The key an unhealthy device is counted as tainted with.
pub const UNHEALTHY: &str = "unhealthy";

/// What a DeviceTaintRule says, when its taint keeps devices from claims (NoSchedule or
/// NoExecute; `None` and unknown effects are informational).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaintRuleView {
    pub name: String,
    pub taint: ExtraTaint,
}

impl TaintRuleView {
    /// The rule of a DeviceTaintRule object (any served version: their specs agree); `None`
    /// for a rule that selects nothing (no `deviceSelector`) or whose taint keeps no claim off.
    pub fn from_object(object: &Value) -> Option<Self> {
        let spec = object.get("spec")?;
        let selector = spec.get("deviceSelector")?.as_object()?;
        let taint = spec.get("taint")?;
        let effect = taint.get("effect")?.as_str()?;
        if !matches!(effect, "NoSchedule" | "NoExecute") {
            return None;
        }
        let field = |name: &str| {
            selector
                .get(name)
                .and_then(Value::as_str)
                .map(str::to_owned)
        };
        Some(Self {
            name: object["metadata"]["name"].as_str()?.to_owned(),
            taint: ExtraTaint {
                driver: field("driver"),
                pool: field("pool"),
                device: field("device"),
                key: taint.get("key")?.as_str()?.to_owned(),
            },
        })
    }
}

/// The devices `pod`'s containers report Unhealthy, each as a taint of that one device.
pub fn unhealthy(pod: &Pod) -> Vec<ExtraTaint> {
    let Some(status) = &pod.status else {
        return Vec::new();
    };
    let containers = (status.container_statuses.iter().flatten())
        .chain(status.init_container_statuses.iter().flatten());
    let mut out: Vec<ExtraTaint> = containers
        .flat_map(|c| c.allocated_resources_status.iter().flatten())
        .filter(|r| r.name.starts_with("claim:"))
        .flat_map(|r| r.resources.iter().flatten())
        .filter(|h| h.health.as_deref() == Some("Unhealthy"))
        .filter_map(|h| {
            // The pool may hold slashes; the driver and the device do not.
            let (driver, rest) = h.resource_id.split_once('/')?;
            let (pool, device) = rest.rsplit_once('/')?;
            Some(ExtraTaint {
                driver: Some(driver.to_owned()),
                pool: Some(pool.to_owned()),
                device: Some(device.to_owned()),
                key: UNHEALTHY.to_owned(),
            })
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

/// Every taint from outside the slices: the rules', then the devices Pods report unhealthy,
/// sorted and without repeats.
pub fn device_taints<'a>(
    rules: impl IntoIterator<Item = &'a TaintRuleView>,
    unhealthy: impl IntoIterator<Item = &'a ExtraTaint>,
) -> Vec<ExtraTaint> {
    let mut out: Vec<ExtraTaint> = (rules.into_iter().map(|r| r.taint.clone()))
        .chain(unhealthy.into_iter().cloned())
        .collect();
    out.sort();
    out.dedup();
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_rule_taints_the_devices_it_names_when_it_keeps_claims_off() {
        let rule = |effect: &str, selector: Value| {
            json!({"apiVersion": "resource.k8s.io/v1beta2", "kind": "DeviceTaintRule",
                   "metadata": {"name": "maintenance"},
                   "spec": {"deviceSelector": selector,
                            "taint": {"key": "example.com/maintenance", "effect": effect}}})
        };
        let one = TaintRuleView::from_object(&rule(
            "NoExecute",
            json!({"driver": "gpu.nvidia.com", "pool": "node-a", "device": "gpu-3"}),
        ))
        .unwrap();
        assert_eq!(
            one.taint,
            ExtraTaint {
                driver: Some("gpu.nvidia.com".into()),
                pool: Some("node-a".into()),
                device: Some("gpu-3".into()),
                key: "example.com/maintenance".into(),
            }
        );
        let every = TaintRuleView::from_object(&rule("NoSchedule", json!({}))).unwrap();
        assert_eq!(
            (every.taint.driver, every.taint.pool, every.taint.device),
            (None, None, None)
        );
        assert_eq!(
            TaintRuleView::from_object(&rule("None", json!({}))),
            None,
            "informational"
        );
        let mut nothing = rule("NoSchedule", json!({}));
        nothing["spec"]
            .as_object_mut()
            .unwrap()
            .remove("deviceSelector");
        assert_eq!(
            TaintRuleView::from_object(&nothing),
            None,
            "no selector, no device"
        );
    }

    #[test]
    fn devices_a_pod_reports_unhealthy_are_tainted() {
        let pod: Pod = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "train-0"},
            "status": {"containerStatuses": [{
                "name": "main", "image": "x", "imageID": "", "ready": true, "restartCount": 0,
                "allocatedResourcesStatus": [{"name": "claim:train-0-gpu-x7k2/gpu", "resources": [
                    {"resourceID": "gpu.nvidia.com/node-a/gpu-0", "health": "Healthy"},
                    {"resourceID": "gpu.nvidia.com/node-a/gpu-1", "health": "Unhealthy"},
                    {"resourceID": "gpu.nvidia.com/rack/7/node-b/gpu-2", "health": "Unhealthy"},
                    {"resourceID": "gpu.nvidia.com/node-a/gpu-3", "health": "Unknown"}]},
                    {"name": "nvidia.com/gpu", "resources": [
                    {"resourceID": "GPU-1234", "health": "Unhealthy"}]}]}]}
        }))
        .unwrap();
        let found = unhealthy(&pod);
        let named: Vec<(String, String)> = (found.iter())
            .map(|t| (t.pool.clone().unwrap(), t.device.clone().unwrap()))
            .collect();
        assert_eq!(
            named,
            [
                ("node-a".to_owned(), "gpu-1".to_owned()),
                ("rack/7/node-b".to_owned(), "gpu-2".to_owned())
            ]
        );
        assert!(found.iter().all(|t| t.key == UNHEALTHY));
    }
}
