//! Synthetic clusters of any size for the benchmarks, the scale and converge examples and the
//! load tests: not part of the shipped library (a dev-dependency only). Nodes are the NVIDIA
//! driver's 8-GPU slice of the built-in example with other product names.

use std::sync::Arc;

use k8s_openapi::api::resource::v1::DeviceRequestAllocationResult;
use teamgpu::api::{GpuSharingPolicy, TeamGpuPolicy};
use teamgpu::cli::example::{claim, node_slice, node_template};
use teamgpu::cli::input::InputError;
use teamgpu::core::state::{ClusterState, NamespaceInfo};

/// The size of a synthetic cluster (benchmarks, load tests).
#[derive(Clone, Copy, Debug)]
pub struct Scale {
    pub teams: usize,
    pub namespaces_per_team: usize,
    pub sharing_policies: usize,
    /// Nodes, one 8-GPU ResourceSlice each.
    pub nodes: usize,
    pub claims: usize,
    /// Each GPU draws on a counter set of its own, as the NVIDIA driver publishes a GPU with
    /// dynamic MIG (partitionable devices): the same devices, counted through the counters.
    pub counter_sets: bool,
    /// Departments over the teams (0: flat): team `t` is a member of department
    /// `t % departments`, which guarantees what its members do, per sharing policy.
    pub departments: usize,
}

impl Scale {
    /// The benchmark of the planning core: 100 teams, 1,000 namespaces, 20 sharing policies,
    /// 5,000 ResourceSlices (40,000 devices), 10,000 claims.
    pub const BENCHMARK: Scale = Scale {
        teams: 100,
        namespaces_per_team: 10,
        sharing_policies: 20,
        nodes: 5_000,
        claims: 10_000,
        counter_sets: false,
        departments: 0,
    };
}

/// A synthetic cluster of the given size: node `n` carries 8 GPUs of product `n % policies`
/// (the NVIDIA fixture's device shape), policy `p` selects that product, and team `t` holds
/// quotas on three products with claims spread over its namespaces.
pub fn synthetic(scale: Scale) -> Result<ClusterState, InputError> {
    let Some(slice) = node_template()? else {
        return Ok(ClusterState::default());
    };
    let policies = scale.sharing_policies.max(1);
    let product = |p: usize| format!("NVIDIA Model {p}");
    let mut state = ClusterState::default();
    for p in 0..policies {
        let policy: Result<GpuSharingPolicy, _> = serde_json::from_value(serde_json::json!({
            "apiVersion": "teamgpu.io/v1alpha1", "kind": "GpuSharingPolicy",
            "metadata": {"name": format!("model-{p}"), "uid": format!("gsp-{p}")},
            "spec": {"selector": {"productNames": [product(p)], "minMemory": "40Gi", "minComputeCapability": "8.0"},
                     "claimTemplates": {"counts": [1, 2, 4]}}
        }));
        state.sharing_policies.extend(policy.ok());
    }
    state.slices = (0..scale.nodes)
        .map(|n| {
            let slice = node_slice(
                &slice,
                &format!("node-{n:05}"),
                &product(n % policies),
                "80Gi",
            );
            match scale.counter_sets {
                true => with_counter_sets(slice),
                false => slice,
            }
        })
        .collect();
    let team_policies = |t: usize| [t % policies, (t + 7) % policies, (t + 13) % policies];
    for t in 0..scale.teams {
        let quotas: Vec<_> = team_policies(t)
            .iter()
            .map(|p| serde_json::json!({"sharingPolicy": format!("model-{p}"), "guaranteed": 20, "limit": 80}))
            .collect();
        let parent = (scale.departments > 0).then(|| department(t % scale.departments));
        let team: Result<TeamGpuPolicy, _> = serde_json::from_value(serde_json::json!({
            "apiVersion": "teamgpu.io/v1alpha1", "kind": "TeamGpuPolicy",
            "metadata": {"name": format!("team-{t:03}"), "uid": format!("tgp-{t}")},
            "spec": {"namespaceSelector": {"matchLabels": {"teamgpu.io/team": format!("team-{t:03}")}},
                     "parent": parent, "weight": 1 + t % 5, "quotas": quotas}
        }));
        state.teams.extend(team.ok());
        for n in 0..scale.namespaces_per_team {
            state.namespaces.push(Arc::new(NamespaceInfo {
                name: format!("team-{t:03}-ns-{n:02}"),
                labels: [("teamgpu.io/team".to_owned(), format!("team-{t:03}"))].into(),
            }));
        }
    }
    for d in 0..scale.departments {
        // What its members guarantee and may hold, per sharing policy.
        let mut totals = std::collections::BTreeMap::<usize, (u32, u32)>::new();
        for t in (d..scale.teams).step_by(scale.departments) {
            for p in team_policies(t) {
                let total = totals.entry(p).or_default();
                *total = (total.0 + 20, total.1 + 80);
            }
        }
        let quotas: Vec<_> = (totals.iter())
            .map(|(p, (g, l))| serde_json::json!({"sharingPolicy": format!("model-{p}"), "guaranteed": g, "limit": l}))
            .collect();
        let object: Result<TeamGpuPolicy, _> = serde_json::from_value(serde_json::json!({
            "apiVersion": "teamgpu.io/v1alpha1", "kind": "TeamGpuPolicy",
            "metadata": {"name": department(d), "uid": format!("dept-{d}")},
            "spec": {"department": true, "quotas": quotas}
        }));
        state.teams.extend(object.ok());
    }
    // Claims: round-robin over namespaces; each takes one device of one of its team's products
    // from that product's nodes, while devices last.
    let mut next_device = vec![0usize; policies];
    for c in 0..scale.claims {
        let Some(ns) = state
            .namespaces
            .get(c % state.namespaces.len().max(1))
            .map(|n| n.name.clone())
        else {
            break;
        };
        let team = c % state.namespaces.len().max(1) / scale.namespaces_per_team.max(1);
        let p = team_policies(team)[c % 3];
        // Devices of product p: node indices p, p + policies, ..., 8 devices each.
        let d = next_device[p];
        next_device[p] += 1;
        let node = p + (d / 8) * policies;
        let allocated = (node < scale.nodes).then(|| DeviceRequestAllocationResult {
            request: "gpu".into(),
            driver: "gpu.nvidia.com".into(),
            pool: format!("node-{node:05}"),
            device: format!("gpu-{}", d % 8),
            ..Default::default()
        });
        state.claims.push(claim(
            &ns,
            &format!("claim-{c}"),
            &format!("model-{p}.teamgpu.io"),
            1,
            allocated.map(|r| vec![r]),
        ));
    }
    Ok(state)
}

/// The name of department `d`.
fn department(d: usize) -> String {
    format!("dept-{d:02}")
}

/// `slice` with a counter set per GPU (`gpu-<i>-counter-set`: its memory, multiprocessors and
/// memory slices, as the driver's `PartSharedCounterSets` names them) that the GPU draws whole.
fn with_counter_sets(
    mut slice: k8s_openapi::api::resource::v1::ResourceSlice,
) -> k8s_openapi::api::resource::v1::ResourceSlice {
    use k8s_openapi::api::resource::v1::{Counter, CounterSet, DeviceCounterConsumption};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    let counters = || -> std::collections::BTreeMap<String, Counter> {
        [("memory", "80Gi"), ("multiprocessors", "98")]
            .into_iter()
            .chain((0..8).map(|i| {
                (
                    [
                        "memory-slice-0",
                        "memory-slice-1",
                        "memory-slice-2",
                        "memory-slice-3",
                        "memory-slice-4",
                        "memory-slice-5",
                        "memory-slice-6",
                        "memory-slice-7",
                    ][i],
                    "1",
                )
            }))
            .map(|(name, value)| {
                (
                    name.to_owned(),
                    Counter {
                        value: Quantity(value.to_owned()),
                    },
                )
            })
            .collect()
    };
    let mut sets = Vec::new();
    for (i, device) in slice.spec.devices.iter_mut().flatten().enumerate() {
        let set = format!("gpu-{i}-counter-set");
        device.consumes_counters = Some(vec![DeviceCounterConsumption {
            counter_set: set.clone(),
            counters: counters(),
        }]);
        sets.push(CounterSet {
            name: set,
            counters: counters(),
        });
    }
    slice.spec.shared_counters = Some(sets);
    slice
}
