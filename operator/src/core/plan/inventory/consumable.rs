//! Capacity that many claims share (consumable capacity, KEP-5075, beta and on by default in
//! Kubernetes 1.36): a device with `allowMultipleAllocations: true` may be allocated to many
//! claims at once, each consuming part of every capacity the device publishes, while the sum stays
//! within the capacity's `value`.
//!
//! What one allocation consumes mirrors the allocator
//! (`staging/src/k8s.io/dynamic-resource-allocation/structured/internal/incubating/consumable_capacity.go`,
//! Kubernetes 1.36.2): a capacity the request names consumes the request, rounded up by the
//! capacity's `requestPolicy` (`validRange`: to `min`, then to `min + k·step`; `validValues`: to
//! the smallest value at least the request); a capacity it does not name consumes the policy's
//! `default`, or the whole `value` without one (`fillEmptyRequest`). A consumption above `max`,
//! off the steps or outside `validValues` makes the device unfit for the request
//! (`violatesPolicy`), and so does a request naming a capacity the device lacks.
//!
//! The NVIDIA driver publishes whole GPUs this way with `--consumable-shares`: `memory` with a
//! `validRange` of 1Mi steps, its `default` the whole memory (`memory` mode) or 0 (`unlimited`,
//! and an integer mode that adds a `shares` capacity) (`consumable_shares.go` in
//! kubernetes-sigs/dra-driver-nvidia-gpu). A claim that names no memory then takes the whole GPU,
//! or none of its memory.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::resource::v1::DeviceCapacity;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::quantity;

/// One capacity of a device that allows multiple allocations, in nano-units. A value that does
/// not parse (the API server validates them) counts as 0: nothing fits.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ConsumableCapacity {
    /// The name as the device publishes it, and as requests and allocation results name it.
    pub name: Arc<str>,
    pub value: i128,
    pub policy: Option<RequestPolicy>,
}

/// `capacity.requestPolicy`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RequestPolicy {
    pub default: Option<i128>,
    /// Ascending, as the API server requires.
    pub valid_values: Box<[i128]>,
    pub valid_range: Option<ValidRange>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ValidRange {
    pub min: i128,
    pub max: Option<i128>,
    pub step: Option<i128>,
}

fn nanos(q: &Quantity) -> Option<i128> {
    quantity::parse_nanos(&q.0).ok()
}

impl ConsumableCapacity {
    pub fn project(name: &str, capacity: &DeviceCapacity) -> Self {
        let policy = capacity.request_policy.as_ref().map(|p| RequestPolicy {
            default: p.default.as_ref().and_then(nanos),
            valid_values: p.valid_values.iter().flatten().filter_map(nanos).collect(),
            valid_range: p.valid_range.as_ref().and_then(|r| {
                Some(ValidRange {
                    min: nanos(&r.min)?,
                    max: r.max.as_ref().and_then(nanos),
                    step: r.step.as_ref().and_then(nanos).filter(|s| *s > 0),
                })
            }),
        });
        Self {
            name: Arc::from(name),
            value: nanos(&capacity.value).unwrap_or(0),
            policy,
        }
    }

    /// What one allocation consumes of this capacity when the request asks for `requested` of it
    /// (`None`: not named); `None` when the amount breaks the request policy.
    pub fn consumes(&self, requested: Option<i128>) -> Option<i128> {
        let Some(policy) = &self.policy else {
            return Some(requested.unwrap_or(self.value));
        };
        let Some(requested) = requested else {
            return Some(policy.default.unwrap_or(self.value));
        };
        let consumed = if let Some(range) = policy.valid_range {
            if requested < range.min {
                range.min
            } else {
                match range.step {
                    Some(step) => {
                        let steps = (requested - range.min + step - 1) / step;
                        range.min + steps * step
                    }
                    None => requested,
                }
            }
        } else if !policy.valid_values.is_empty() {
            (policy.valid_values.iter())
                .copied()
                .find(|v| *v >= requested)
                .unwrap_or(requested)
        } else {
            requested
        };
        (!policy.violated_by(consumed)).then_some(consumed)
    }
}

impl RequestPolicy {
    fn violated_by(&self, consumed: i128) -> bool {
        if self.default == Some(consumed) {
            return false;
        }
        if let Some(range) = self.valid_range {
            return range.max.is_some_and(|max| consumed > max)
                || consumed < range.min
                || range
                    .step
                    .is_some_and(|step| (consumed - range.min) % step != 0);
        }
        !self.valid_values.is_empty() && !self.valid_values.contains(&consumed)
    }
}

/// What one allocation of a request asking for `requests` (capacity name → amount) consumes of
/// each of `capacities`, in their order; `None` when the device cannot serve the request: it
/// names a capacity the device lacks, or an amount its request policy refuses.
pub fn consumption(
    capacities: &[ConsumableCapacity],
    requests: &BTreeMap<&str, i128>,
) -> Option<Box<[i128]>> {
    if (requests.keys()).any(|name| !capacities.iter().any(|c| &*c.name == *name)) {
        return None;
    }
    capacities
        .iter()
        .map(|c| c.consumes(requests.get(&*c.name).copied()))
        .collect()
}

/// How many more allocations that each consume `draw` fit in what is `left` of each capacity;
/// `None` when the allocations consume nothing, so that any number fits.
pub fn how_many_fit(left: &[i128], draw: &[i128]) -> Option<u32> {
    (left.iter().zip(draw))
        .filter(|(_, d)| **d > 0)
        .map(|(l, d)| u32::try_from((*l).max(0) / d).unwrap_or(u32::MAX))
        .min()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::resource::v1::{CapacityRequestPolicy, CapacityRequestPolicyRange};

    const MI: i128 = 1024 * 1024 * quantity::NANOS;
    const GI: i128 = 1024 * MI;

    fn q(s: &str) -> Quantity {
        Quantity(s.to_owned())
    }

    /// `memory` as the NVIDIA driver publishes it with `--consumable-shares=<mode>` for an
    /// 80Gi GPU (`consumable_shares.go`): a range of 1Mi steps up to the whole memory, the
    /// default the whole memory (`memory`) or nothing (`unlimited`).
    fn nvidia_memory(default: &str, min: &str) -> ConsumableCapacity {
        ConsumableCapacity::project(
            "memory",
            &DeviceCapacity {
                value: q("80Gi"),
                request_policy: Some(CapacityRequestPolicy {
                    default: Some(q(default)),
                    valid_range: Some(CapacityRequestPolicyRange {
                        min: q(min),
                        max: Some(q("80Gi")),
                        step: Some(q("1Mi")),
                    }),
                    valid_values: None,
                }),
            },
        )
    }

    #[test]
    fn a_request_is_rounded_up_to_the_policys_steps_and_refused_above_its_max() {
        let memory = nvidia_memory("80Gi", "1Mi");
        assert_eq!(memory.consumes(Some(10 * GI)), Some(10 * GI));
        // 10Gi and half a MiB: the next 1Mi step.
        assert_eq!(memory.consumes(Some(10 * GI + MI / 2)), Some(10 * GI + MI));
        assert_eq!(memory.consumes(Some(0)), Some(MI), "below min: min");
        assert_eq!(memory.consumes(Some(81 * GI)), None, "above max");
        assert_eq!(memory.consumes(None), Some(80 * GI), "the default");
        let unlimited = nvidia_memory("0", "0");
        assert_eq!(
            unlimited.consumes(None),
            Some(0),
            "a claim naming no memory takes none (the bypass MemorySlices closes)"
        );
    }

    #[test]
    fn valid_values_round_up_to_the_next_value_and_no_policy_takes_the_whole_value() {
        let sizes = ConsumableCapacity::project(
            "memory",
            &DeviceCapacity {
                value: q("80Gi"),
                request_policy: Some(CapacityRequestPolicy {
                    default: Some(q("20Gi")),
                    valid_values: Some(vec![q("20Gi"), q("40Gi")]),
                    valid_range: None,
                }),
            },
        );
        assert_eq!(sizes.consumes(Some(10 * GI)), Some(20 * GI));
        assert_eq!(sizes.consumes(Some(30 * GI)), Some(40 * GI));
        assert_eq!(sizes.consumes(Some(50 * GI)), None);
        let plain = ConsumableCapacity::project(
            "cores",
            &DeviceCapacity {
                value: q("8"),
                request_policy: None,
            },
        );
        assert_eq!(plain.consumes(None), Some(8 * quantity::NANOS));
        assert_eq!(
            plain.consumes(Some(2 * quantity::NANOS)),
            Some(2 * quantity::NANOS)
        );
    }

    #[test]
    fn how_many_slices_fit_beside_what_is_consumed() {
        let memory = nvidia_memory("0", "0");
        let shares = ConsumableCapacity::project(
            "shares",
            &DeviceCapacity {
                value: q("4"),
                request_policy: Some(CapacityRequestPolicy {
                    default: Some(q("1")),
                    valid_range: Some(CapacityRequestPolicyRange {
                        min: q("1"),
                        max: Some(q("4")),
                        step: Some(q("1")),
                    }),
                    valid_values: None,
                }),
            },
        );
        let caps = [memory, shares];
        let slice: BTreeMap<&str, i128> = [("memory", 10 * GI)].into();
        let draw = consumption(&caps, &slice).unwrap();
        assert_eq!(&*draw, &[10 * GI, quantity::NANOS]);
        // 80Gi would hold 8 slices, but 4 shares hold 4 claims.
        assert_eq!(
            how_many_fit(&[80 * GI, 4 * quantity::NANOS], &draw),
            Some(4)
        );
        assert_eq!(
            how_many_fit(&[25 * GI, 4 * quantity::NANOS], &draw),
            Some(2)
        );
        assert_eq!(how_many_fit(&[25 * GI, 0], &draw), Some(0));
        let nothing = consumption(&caps[..1], &BTreeMap::new()).unwrap();
        assert_eq!(
            how_many_fit(&[80 * GI], &nothing),
            None,
            "no draw: unbounded"
        );
        let unknown: BTreeMap<&str, i128> = [("cores", 1)].into();
        assert_eq!(consumption(&caps, &unknown), None);
    }
}
