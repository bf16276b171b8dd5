//! Planning a dynamic-MIG fleet: 500 nodes of two A100-40GB GPUs each, published as the NVIDIA
//! driver does with partitionable devices (the fixture's node, `a100-dynamic-mig-node.teamgpu.yaml`,
//! repeated: 1,500 ResourceSlices, 15,000 device entries drawing on 1,000 counter sets), three
//! policies over the same GPUs (whole GPUs, 1g and 3g slices), 30 teams of 3 namespaces, and
//! 2,000 allocated 1g slices. What a pass costs once the counters count: a whole plan, and the
//! kept planner's plan after one claim changed (the counter groups are fitted again every pass).
//!
//! `cargo bench -p teamgpu --bench counters`

use std::hint::black_box;
use std::sync::Arc;

use criterion::{Criterion, criterion_group, criterion_main};
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use serde_json::json;
use teamgpu::api::{GpuSharingPolicy, TeamGpuPolicy};
use teamgpu::core::plan::{Planner, plan};
use teamgpu::core::state::{ClusterState, NamespaceInfo};

const FIXTURE: &str = include_str!(
    "../testdata/nvidia-dra-driver-gpu/resourceslice/a100-dynamic-mig-node.teamgpu.yaml"
);
const NODES: usize = 500;
const TEAMS: usize = 30;

fn fleet() -> ClusterState {
    let node: Vec<ResourceSlice> = FIXTURE
        .split("\n---\n")
        .filter(|d| d.contains("kind: ResourceSlice"))
        .map(|d| serde_saphyr::from_str(d).expect("slice"))
        .collect();
    let mut state = ClusterState::default();
    for n in 0..NODES {
        for slice in &node {
            let mut slice = slice.clone();
            let name = format!("node-{n:03}");
            slice.metadata.name = slice.metadata.name.map(|s| s.replace("node-a", &name));
            slice.spec.node_name = Some(name.clone());
            slice.spec.pool.name = name;
            state.slices.push(slice);
        }
    }
    for (name, selector) in [
        ("a100", json!({"deviceType": "gpu"})),
        (
            "mig-1g",
            json!({"deviceType": "mig", "migProfiles": ["1g.5gb"]}),
        ),
        (
            "mig-3g",
            json!({"deviceType": "mig", "migProfiles": ["3g.20gb"]}),
        ),
    ] {
        state.sharing_policies.push(
            serde_json::from_value::<GpuSharingPolicy>(json!({"metadata": {"name": name},
                "spec": {"driver": "gpu.nvidia.com", "selector": selector,
                         "sharing": {"strategy": "Exclusive"}}}))
            .expect("policy"),
        );
    }
    for t in 0..TEAMS {
        let namespaces: Vec<String> = (0..3).map(|i| format!("team-{t:02}-{i}")).collect();
        for ns in &namespaces {
            state.namespaces.push(Arc::new(NamespaceInfo {
                name: ns.clone(),
                ..Default::default()
            }));
        }
        let team = serde_json::from_value::<TeamGpuPolicy>(json!({
            "metadata": {"name": format!("team-{t:02}")},
            "spec": {"namespaces": namespaces, "quotas": [
                {"sharingPolicy": "a100", "guaranteed": 10, "limit": 40},
                {"sharingPolicy": "mig-1g", "guaranteed": 70, "limit": 280},
                {"sharingPolicy": "mig-3g", "guaranteed": 6, "limit": 24}]}}))
        .expect("team");
        state.teams.push(team);
    }
    // 2,000 one-slice claims on the first 286 GPUs (7 per GPU), spread over the teams.
    for c in 0..2_000 {
        let (gpu, slot) = (c / 7, c % 7);
        let node = format!("node-{:03}", gpu / 2);
        let device = format!("gpu-{}-mig-1g5gb-19-{slot}", gpu % 2);
        let ns = format!("team-{:02}-{}", c % TEAMS, c % 3);
        state.claims.push(
            serde_json::from_value::<ResourceClaim>(json!({
                "metadata": {"name": format!("claim-{c}"), "namespace": ns},
                "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                    "deviceClassName": "mig-1g.teamgpu.io", "count": 1}}]}},
                "status": {"allocation": {"devices": {"results": [{"request": "gpu",
                    "driver": "gpu.nvidia.com", "pool": node, "device": device}]}}}}))
            .expect("claim"),
        );
    }
    state
}

fn bench(c: &mut Criterion) {
    let state = fleet();
    let planned = plan(&state);
    for p in &planned.sharing_policies {
        println!("{}: {} devices", p.name, p.capacity);
    }
    let mut group = c.benchmark_group("counters");
    group.sample_size(10);
    group.bench_function("full plan, 500 dynamic-MIG nodes", |b| {
        b.iter(|| plan(black_box(&state)))
    });
    let mut planner = Planner::default();
    planner.update_slices(&state.slices);
    planner.update_claims(&state.claims);
    planner.plan(&state);
    let mut changed = state.claims.clone();
    changed.pop();
    let mut flip = false;
    group.bench_function("kept planner, one claim changed", |b| {
        b.iter(|| {
            flip = !flip;
            planner.update_claims(if flip { &changed } else { &state.claims });
            planner.plan(black_box(&state))
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
