//! Device usage of ResourceClaims: what quota charges and what is allocated.
//!
//! [`quota_charge`] mirrors the ResourceQuota evaluator for resourceclaims,
//! `pkg/quota/v1/evaluator/core/resource_claims.go` (`claimEvaluator.Usage`, resource.k8s.io/v1):
//!
//! * every claim is charged `count/resourceclaims.resource.k8s.io: 1`;
//! * an `exactly` request charges `<class>.deviceclass.resource.k8s.io/devices` with `count` for
//!   `ExactCount` and with `AllocationResultsMaxSize` (32) for `All` ("Worst case..."); an
//!   unknown mode charges 0 (but still names the class);
//! * a `firstAvailable` request charges, per device class, the largest of its subrequests for
//!   that class (classes of one request are charged independently; a class whose largest charge
//!   is 0 is not named);
//! * a request with neither is "some unknown, future request type" and charges nothing;
//! * `adminAccess` makes no difference: the evaluator has no case for it.
//!
//! The evaluator sees defaulted objects; these functions apply the API defaults themselves
//! (`allocationMode` ExactCount, `count` 1 for ExactCount) so they work on raw manifests too.
//!
//! Not mirrored: the extended-resource accounting for claims the scheduler creates for
//! `DRAExtendedResource` pods (annotation `resource.kubernetes.io/extended-resource-claim`),
//! which additionally charges the pod's extended resources.

use std::collections::BTreeMap;
use std::hash::Hasher;
use std::sync::Arc;

use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceClaimSpec};

use super::inventory::{DeviceId, PoolKey};
use super::objects::is_teamgpu_class;

/// `resourceapi.AllocationResultsMaxSize`: what an `All` request is charged.
pub const ALLOCATION_RESULTS_MAX_SIZE: u64 = 32;
/// The object-count quota resource of ResourceClaims.
pub const CLAIM_COUNT_RESOURCE: &str = "count/resourceclaims.resource.k8s.io";
/// `corev1.ResourceClaimsPerClass`: suffix of the per-class quota resource.
pub const DEVICES_PER_CLASS_SUFFIX: &str = ".deviceclass.resource.k8s.io/devices";

/// The quota resource name counting devices of `class` (`V1ResourceByDeviceClass`).
pub fn quota_resource_name(class: &str) -> String {
    format!("{class}{DEVICES_PER_CLASS_SUFFIX}")
}

fn devices_for(mode: Option<&str>, count: Option<i64>) -> u64 {
    match mode.unwrap_or("ExactCount") {
        "ExactCount" => u64::try_from(count.unwrap_or(1)).unwrap_or(0),
        "All" => ALLOCATION_RESULTS_MAX_SIZE,
        _ => 0,
    }
}

/// Devices charged per DeviceClass by a claim with this spec (the claim itself is charged
/// once more under [`CLAIM_COUNT_RESOURCE`]).
pub fn quota_charge(spec: &ResourceClaimSpec) -> BTreeMap<String, u64> {
    let mut result: BTreeMap<String, u64> = BTreeMap::new();
    let Some(devices) = &spec.devices else {
        return result;
    };
    for request in devices.requests.iter().flatten() {
        if let Some(subs) = request.first_available.as_ref().filter(|s| !s.is_empty()) {
            let mut max_by_class: BTreeMap<&str, u64> = BTreeMap::new();
            for sub in subs {
                let n = devices_for(sub.allocation_mode.as_deref(), sub.count);
                let current = max_by_class
                    .get(sub.device_class_name.as_str())
                    .copied()
                    .unwrap_or(0);
                if n > current {
                    max_by_class.insert(&sub.device_class_name, n);
                }
            }
            for (class, n) in max_by_class {
                let q = result.entry(class.to_owned()).or_default();
                *q = q.saturating_add(n);
            }
        } else if let Some(exactly) = &request.exactly {
            let n = devices_for(exactly.allocation_mode.as_deref(), exactly.count);
            let q = result.entry(exactly.device_class_name.clone()).or_default();
            *q = q.saturating_add(n);
        }
    }
    result
}

/// The full quota usage of one claim as ResourceQuota resource names.
pub fn quota_usage(spec: &ResourceClaimSpec) -> BTreeMap<String, u64> {
    let mut usage: BTreeMap<String, u64> = quota_charge(spec)
        .into_iter()
        .map(|(class, n)| (quota_resource_name(&class), n))
        .collect();
    usage.insert(CLAIM_COUNT_RESOURCE.to_owned(), 1);
    usage
}

/// One allocated device of a claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllocatedDevice {
    /// `request` of the result: `req` or `req/subreq`.
    pub request: String,
    /// The DeviceClass of that (sub)request, `None` if the spec has no such (sub)request.
    pub class: Option<String>,
    pub driver: String,
    pub pool: String,
    pub device: String,
    pub admin_access: bool,
    /// `consumedCapacity`: what it takes of a device that allows multiple allocations.
    pub consumed: BTreeMap<String, String>,
}

/// The DeviceClass of request `name` (`req` or `req/subreq`) in `spec`.
pub fn request_class<'a>(spec: &'a ResourceClaimSpec, name: &str) -> Option<&'a str> {
    let (main, sub) = match name.split_once('/') {
        Some((m, s)) => (m, Some(s)),
        None => (name, None),
    };
    let request = spec
        .devices
        .as_ref()?
        .requests
        .iter()
        .flatten()
        .find(|r| r.name == main)?;
    match sub {
        None => request
            .exactly
            .as_ref()
            .map(|e| e.device_class_name.as_str()),
        Some(sub) => request
            .first_available
            .iter()
            .flatten()
            .find(|s| s.name == sub)
            .map(|s| s.device_class_name.as_str()),
    }
}

/// The devices allocated to a claim (`status.allocation.devices.results`), each with the class
/// of the (sub)request it was allocated for.
pub fn allocated_devices(claim: &ResourceClaim) -> Vec<AllocatedDevice> {
    let results = claim
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.devices.as_ref())
        .and_then(|d| d.results.as_ref());
    results
        .into_iter()
        .flatten()
        .map(|r| AllocatedDevice {
            request: r.request.clone(),
            class: request_class(&claim.spec, &r.request).map(str::to_owned),
            driver: r.driver.clone(),
            pool: r.pool.clone(),
            device: r.device.clone(),
            admin_access: r.admin_access.unwrap_or(false),
            consumed: (r.consumed_capacity.iter().flatten())
                .map(|(name, q)| (name.clone(), q.0.clone()))
                .collect(),
        })
        .collect()
}

/// Allocated devices per DeviceClass. Results whose request is not in the spec are left out
/// (see [`allocated_devices`] to find them).
pub fn allocated_by_class(claim: &ResourceClaim) -> BTreeMap<String, u64> {
    let mut out: BTreeMap<String, u64> = BTreeMap::new();
    for d in allocated_devices(claim) {
        if let Some(class) = d.class {
            *out.entry(class).or_default() += 1;
        }
    }
    out
}

/// Usage of one DeviceClass in one namespace.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClassUsage {
    /// Devices charged by quota ([`quota_charge`]).
    pub requested: u64,
    /// Devices allocated ([`allocated_by_class`]), admin access included.
    pub allocated: u64,
    /// The part of `allocated` that is admin access (does not take the device from others).
    pub allocated_admin_access: u64,
    /// Claims charging or holding this class.
    pub claims: u64,
}

/// A device allocated through a DeviceClass that is not teamgpu's (or through a request the
/// claim's spec does not name), so that no team's quota counts it: if a sharing policy governs
/// the device, it is used outside teams.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutsideAllocation {
    /// `namespace/name` of the claim.
    pub claim: String,
    pub device: DeviceId,
}

/// What the planner, pending demand and reclaim read of a ResourceClaim: its name, what quota
/// charges for it, what is allocated to it and which Pods hold it. A few hundred bytes instead
/// of the whole claim; names shared through [`Names`].
#[derive(Debug, Clone, PartialEq)]
pub struct ClaimView {
    pub namespace: Arc<str>,
    pub name: Arc<str>,
    /// uid and resourceVersion (or the content, for a claim read from a file).
    pub identity: u64,
    pub created: Option<k8s_openapi::jiff::Timestamp>,
    /// [`quota_charge`] per DeviceClass.
    pub charge: Box<[(Arc<str>, u64)]>,
    /// Whether `status.allocation` is set.
    pub allocated: bool,
    /// [`allocated_devices`].
    pub devices: Box<[ClaimDevice]>,
    /// Pods in `status.reservedFor`.
    pub reserved_for_pods: Box<[Arc<str>]>,
}

/// One allocated device of a [`ClaimView`].
#[derive(Debug, Clone, PartialEq)]
pub struct ClaimDevice {
    /// The DeviceClass of the (sub)request, `None` if the spec has no such (sub)request.
    pub class: Option<Arc<str>>,
    pub id: DeviceId,
    pub admin_access: bool,
    /// What the result consumes of a device that allows multiple allocations, in nano-units
    /// (`consumedCapacity`; empty for other devices). A quantity that does not parse counts as
    /// the most there is.
    pub consumed: Box<[(Arc<str>, i128)]>,
}

/// Shares the text of names that repeat across objects (namespaces, classes, drivers, pools).
pub type Names = crate::intern::Interner<str>;

impl ClaimView {
    pub fn project(claim: &ResourceClaim, names: &mut Names) -> Self {
        let mut hasher = std::hash::DefaultHasher::new();
        super::identity(claim, &mut hasher);
        let reserved_for_pods = claim
            .status
            .iter()
            .flat_map(|s| s.reserved_for.iter().flatten())
            .filter(|r| r.resource == "pods" && r.api_group.as_deref().unwrap_or("").is_empty())
            .map(|r| Arc::from(r.name.as_str()))
            .collect();
        ClaimView {
            namespace: names.intern(claim.metadata.namespace.as_deref().unwrap_or_default()),
            name: Arc::from(claim.metadata.name.as_deref().unwrap_or_default()),
            identity: hasher.finish(),
            created: claim.metadata.creation_timestamp.as_ref().map(|t| t.0),
            charge: quota_charge(&claim.spec)
                .into_iter()
                .map(|(class, n)| (names.intern(&class), n))
                .collect(),
            allocated: claim
                .status
                .as_ref()
                .is_some_and(|s| s.allocation.is_some()),
            devices: allocated_devices(claim)
                .into_iter()
                .map(|d| ClaimDevice {
                    class: d.class.as_deref().map(|c| names.intern(c)),
                    id: DeviceId {
                        driver: names.intern(&d.driver),
                        pool: names.intern(&d.pool),
                        device: names.intern(&d.device),
                    },
                    admin_access: d.admin_access,
                    consumed: (d.consumed.iter())
                        .map(|(name, q)| {
                            let nanos = crate::quantity::parse_nanos(q);
                            (names.intern(name), nanos.unwrap_or(i128::MAX))
                        })
                        .collect(),
                })
                .collect(),
            reserved_for_pods,
        }
    }

    /// Whether `other` holds what this view holds, whatever its identity says (a new
    /// resourceVersion for a change of something not projected: a label, the drivers' device
    /// status): a watch cache keeps the view it has then, and wakes no pass.
    pub fn same_content(&self, other: &ClaimView) -> bool {
        self.namespace == other.namespace
            && self.name == other.name
            && self.created == other.created
            && self.charge == other.charge
            && self.allocated == other.allocated
            && self.devices == other.devices
            && self.reserved_for_pods == other.reserved_for_pods
    }

    /// Allocated devices per DeviceClass (results whose request is not in the spec left out).
    pub fn allocated_by_class(&self) -> BTreeMap<&str, u64> {
        let mut out: BTreeMap<&str, u64> = BTreeMap::new();
        for d in self.devices.iter() {
            if let Some(class) = &d.class {
                *out.entry(&**class).or_default() += 1;
            }
        }
        out
    }
}

/// Usage per namespace and DeviceClass.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Usage {
    /// Keyed by (namespace, class).
    pub by_class: BTreeMap<(String, String), ClassUsage>,
    /// `count/resourceclaims.resource.k8s.io` per namespace.
    pub claims: BTreeMap<String, u64>,
    /// Devices allocated through classes that are not teamgpu's. Admin access is left out: it
    /// does not take the device from anyone.
    pub outside: Vec<OutsideAllocation>,
    /// Devices allocated per (DeviceClass, pool), admin access left out: where the devices are,
    /// for placement (a claim's devices are all on its Pod's node).
    pub by_pool: BTreeMap<(Arc<str>, PoolKey), u64>,
}

impl Usage {
    pub fn from_claims<'a>(claims: impl IntoIterator<Item = &'a ResourceClaim>) -> Self {
        let mut names = Names::default();
        Self::from_views(
            claims
                .into_iter()
                .map(|c| ClaimView::project(c, &mut names)),
        )
    }

    pub fn from_views<C: std::borrow::Borrow<ClaimView>>(
        claims: impl IntoIterator<Item = C>,
    ) -> Self {
        let mut usage = Usage::default();
        for claim in claims {
            usage.add(claim.borrow());
        }
        usage
    }

    pub fn add(&mut self, claim: &ClaimView) {
        let ns = claim.namespace.to_string();
        *self.claims.entry(ns.clone()).or_default() += 1;
        let mut allocated: BTreeMap<&str, (u64, u64)> = BTreeMap::new();
        for d in claim.devices.iter() {
            if !d.admin_access && !d.class.as_deref().is_some_and(is_teamgpu_class) {
                self.outside.push(OutsideAllocation {
                    claim: format!("{ns}/{}", claim.name),
                    device: d.id.clone(),
                });
            }
            if let Some(class) = &d.class {
                if !d.admin_access {
                    let pool = PoolKey {
                        driver: d.id.driver.clone(),
                        pool: d.id.pool.clone(),
                    };
                    *self.by_pool.entry((class.clone(), pool)).or_default() += 1;
                }
                let e = allocated.entry(class).or_default();
                e.0 += 1;
                e.1 += u64::from(d.admin_access);
            }
        }
        let mut classes: Vec<&str> = claim
            .charge
            .iter()
            .map(|(c, _)| &**c)
            .chain(allocated.keys().copied())
            .collect();
        classes.sort();
        classes.dedup();
        for class in classes {
            let u = self
                .by_class
                .entry((ns.clone(), class.to_owned()))
                .or_default();
            let requested = claim
                .charge
                .iter()
                .find(|(c, _)| &**c == class)
                .map_or(0, |(_, n)| *n);
            u.requested = u.requested.saturating_add(requested);
            let (a, admin) = allocated.get(class).copied().unwrap_or((0, 0));
            u.allocated += a;
            u.allocated_admin_access += admin;
            u.claims += 1;
        }
    }

    pub fn get(&self, namespace: &str, class: &str) -> ClassUsage {
        self.by_class
            .get(&(namespace.to_owned(), class.to_owned()))
            .copied()
            .unwrap_or_default()
    }

    /// The use of `class` in the one namespace this usage counts (the planner keeps a usage
    /// per namespace): its few classes looked through, without a key made or the namespace
    /// compared, which the shares would do for every team namespace and pool each pass.
    pub fn of_class(&self, class: &str) -> ClassUsage {
        (self.by_class.iter())
            .find(|((_, c), _)| c == class)
            .map_or_else(ClassUsage::default, |(_, u)| *u)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::resource::v1::{
        AllocationResult, DeviceAllocationResult, DeviceRequestAllocationResult,
        ResourceClaimStatus, ResourceClaimTemplate,
    };

    fn fixture(rel: &str) -> String {
        crate::dra_cel::tests::fixture(rel)
    }

    fn docs(rel: &str) -> Vec<String> {
        fixture(rel).split("\n---").map(str::to_owned).collect()
    }

    fn templates(rel: &str) -> Vec<ResourceClaimTemplate> {
        docs(rel)
            .iter()
            .filter(|d| d.contains("kind: ResourceClaimTemplate"))
            .map(|d| serde_saphyr::from_str(d).expect("template"))
            .collect()
    }

    fn claims(rel: &str) -> Vec<ResourceClaim> {
        docs(rel)
            .iter()
            .filter(|d| d.contains("kind: ResourceClaim\n"))
            .map(|d| serde_saphyr::from_str(d).expect("claim"))
            .collect()
    }

    fn charge(rel: &str) -> BTreeMap<String, u64> {
        let t = templates(rel);
        assert_eq!(t.len(), 1, "{rel}");
        quota_charge(&t[0].spec.spec)
    }

    fn m(pairs: &[(&str, u64)]) -> BTreeMap<String, u64> {
        pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
    }

    const Q: &str = "nvidia-dra-driver-gpu/demo-specs/quickstart-v1/";

    #[test]
    fn quickstart_templates() {
        assert_eq!(
            charge(&format!("{Q}gpu-test1.yaml")),
            m(&[("gpu.nvidia.com", 1)])
        );
        // Two requests of one class add up.
        assert_eq!(
            charge(&format!("{Q}gpu-test5.yaml")),
            m(&[("gpu.nvidia.com", 2)])
        );
        // Four MIG requests with selectors.
        assert_eq!(
            charge(&format!("{Q}gpu-test4.yaml")),
            m(&[("mig.nvidia.com", 4)])
        );
        assert_eq!(
            charge(&format!("{Q}gpu-test-vfiopci.yaml")),
            m(&[("vfio.gpu.nvidia.com", 1)])
        );
        assert_eq!(
            charge(
                "nvidia-dra-driver-gpu/demo-specs/fabric-manager-partitioning/resourceClaimTemplates.yaml"
            ),
            m(&[("vfio.gpu.nvidia.com", 2)])
        );
    }

    #[test]
    fn imex_claims_and_all_mode() {
        let c = claims(&format!("{Q}imex-test1.yaml"));
        assert_eq!(c.len(), 4);
        let u = Usage::from_claims(&c);
        assert_eq!(u.claims["imex-test1"], 4);
        assert_eq!(u.get("imex-test1", "imex.nvidia.com").requested, 4);
        assert_eq!(
            quota_charge(&templates(&format!("{Q}imex-test1.yaml"))[0].spec.spec),
            m(&[("gpu.nvidia.com", 1)])
        );
        // The same template asking for All GPUs is charged the worst case, 32.
        let mut t = templates(&format!("{Q}imex-test1.yaml")).remove(0);
        for r in t
            .spec
            .spec
            .devices
            .iter_mut()
            .flat_map(|d| d.requests.iter_mut().flatten())
        {
            if let Some(e) = r.exactly.as_mut() {
                e.allocation_mode = Some("All".into());
            }
        }
        assert_eq!(
            quota_charge(&t.spec.spec),
            m(&[("gpu.nvidia.com", ALLOCATION_RESULTS_MAX_SIZE)])
        );
    }

    fn claim_yaml(requests: &str) -> ResourceClaim {
        let y = format!(
            "apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata:\n  name: c\n  namespace: team-a\nspec:\n  devices:\n    requests:\n{requests}"
        );
        serde_saphyr::from_str(&y).expect("claim")
    }

    #[test]
    fn first_available_charges_the_largest_per_class() {
        let c = claim_yaml(
            "    - name: gpu\n      firstAvailable:\n      - name: big\n        deviceClassName: a100\n        count: 4\n      - name: small\n        deviceClassName: a100\n        count: 2\n      - name: other\n        deviceClassName: t4\n      - name: all\n        deviceClassName: h100\n        allocationMode: All\n    - name: admin\n      exactly:\n        deviceClassName: a100\n        adminAccess: true\n        count: 3\n    - name: future\n      exactly:\n        deviceClassName: l4\n        allocationMode: Future\n",
        );
        assert_eq!(
            quota_charge(&c.spec),
            m(&[("a100", 7), ("h100", 32), ("l4", 0), ("t4", 1)])
        );
        let usage = quota_usage(&c.spec);
        assert_eq!(usage["count/resourceclaims.resource.k8s.io"], 1);
        assert_eq!(usage["a100.deviceclass.resource.k8s.io/devices"], 7);
    }

    #[test]
    fn allocated_results_map_back_to_classes() {
        let mut c = claim_yaml(
            "    - name: gpu\n      firstAvailable:\n      - name: big\n        deviceClassName: a100\n        count: 2\n      - name: small\n        deviceClassName: t4\n    - name: mon\n      exactly:\n        deviceClassName: a100\n        adminAccess: true\n",
        );
        let result = |request: &str, device: &str, admin: bool| DeviceRequestAllocationResult {
            request: request.into(),
            driver: "gpu.nvidia.com".into(),
            pool: "worker-gpu-01".into(),
            device: device.into(),
            admin_access: admin.then_some(true),
            ..Default::default()
        };
        c.status = Some(ResourceClaimStatus {
            allocation: Some(AllocationResult {
                devices: Some(DeviceAllocationResult {
                    results: Some(vec![
                        result("gpu/big", "gpu-0", false),
                        result("gpu/big", "gpu-1", false),
                        result("mon", "gpu-0", true),
                        result("gone", "gpu-2", false),
                    ]),
                    config: None,
                }),
                ..Default::default()
            }),
            ..Default::default()
        });
        assert_eq!(allocated_by_class(&c), m(&[("a100", 3)]));
        assert_eq!(allocated_devices(&c)[3].class, None);
        let u = Usage::from_claims([&c]);
        assert_eq!(
            u.get("team-a", "a100"),
            ClassUsage {
                requested: 3,
                allocated: 3,
                allocated_admin_access: 1,
                claims: 1
            }
        );
        assert_eq!(
            u.get("team-a", "t4"),
            ClassUsage {
                requested: 1,
                allocated: 0,
                allocated_admin_access: 0,
                claims: 1
            }
        );
        assert_eq!(u.claims["team-a"], 1);
    }

    #[test]
    fn unknown_request_type_is_free() {
        let c = claim_yaml("    - name: x\n");
        assert!(quota_charge(&c.spec).is_empty());
        assert_eq!(
            quota_usage(&c.spec),
            m(&[("count/resourceclaims.resource.k8s.io", 1)])
        );
    }
}
