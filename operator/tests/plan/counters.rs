//! Devices that draw on shared counters (partitionable devices): one node of two A100-40GB GPUs
//! as the NVIDIA driver publishes them with dynamic MIG, each GPU's full device and MIG
//! placements drawing on that GPU's counter set.

use std::sync::Arc;

use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use serde_json::json;
use teamgpu::core::plan::{Plan, plan};
use teamgpu::core::state::{ClusterState, NamespaceInfo};

use super::{condition, fixture_slices, policy, report_of, team};

const FIXTURE: &str = include_str!(
    "../../testdata/nvidia-dra-driver-gpu/resourceslice/a100-dynamic-mig-node.teamgpu.yaml"
);

fn slices() -> Vec<ResourceSlice> {
    fixture_slices(FIXTURE)
}

/// A policy per kind of device of the fixture: whole GPUs, and MIG devices of one profile.
fn sharing_policy(name: &str) -> teamgpu::api::GpuSharingPolicy {
    let selector = match name {
        "a100" => json!({"deviceType": "gpu", "productNames": ["NVIDIA A100-SXM4-40GB"]}),
        "mig-1g" => json!({"deviceType": "mig", "migProfiles": ["1g.5gb"]}),
        "mig-3g" => json!({"deviceType": "mig", "migProfiles": ["3g.20gb"]}),
        "mig-7g" => json!({"deviceType": "mig", "migProfiles": ["7g.40gb"]}),
        other => panic!("no policy {other}"),
    };
    policy(json!({"metadata": {"name": name}, "spec": {
        "driver": "gpu.nvidia.com", "selector": selector, "sharing": {"strategy": "Exclusive"}}}))
}

/// Team `name` with namespace `name`, guaranteed `guaranteed` devices of each policy (up to
/// `limit`).
fn team_of(name: &str, quotas: &[(&str, u32, u32)]) -> teamgpu::api::TeamGpuPolicy {
    let quotas: Vec<serde_json::Value> = (quotas.iter())
        .map(|(p, g, l)| json!({"sharingPolicy": p, "guaranteed": g, "limit": l}))
        .collect();
    team(json!({"metadata": {"name": name}, "spec": {"namespaces": [name], "quotas": quotas}}))
}

fn state(policies: &[&str], teams: Vec<teamgpu::api::TeamGpuPolicy>) -> ClusterState {
    let namespaces = (teams.iter())
        .map(|t| {
            Arc::new(NamespaceInfo {
                name: t.metadata.name.clone().unwrap(),
                ..Default::default()
            })
        })
        .collect();
    ClusterState {
        slices: slices(),
        sharing_policies: policies.iter().map(|p| sharing_policy(p)).collect(),
        teams,
        namespaces,
        ..Default::default()
    }
}

/// A claim of `namespace` through DeviceClass `class`, allocated the fixture's `devices`.
fn claim(namespace: &str, name: &str, class: &str, devices: &[&str]) -> ResourceClaim {
    let results: Vec<serde_json::Value> = (devices.iter())
        .map(|d| json!({"request": "gpu", "driver": "gpu.nvidia.com", "pool": "node-a", "device": d}))
        .collect();
    serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": class, "count": devices.len()}}]}},
        "status": {"allocation": {"devices": {"results": results}}}
    }))
    .unwrap()
}

/// Namespace `legacy`, of no team, with a claim of gpu-0's 7 1g slices of pool `node-a`
/// through the driver's own class.
fn seven_slices_outside_teams(cluster: &mut ClusterState) {
    cluster.namespaces.push(Arc::new(NamespaceInfo {
        name: "legacy".into(),
        ..Default::default()
    }));
    let slices: Vec<String> = (0..7).map(|s| format!("gpu-0-mig-1g5gb-19-{s}")).collect();
    let names: Vec<&str> = slices.iter().map(String::as_str).collect();
    cluster
        .claims
        .push(claim("legacy", "seven", "gpu.nvidia.com", &names));
}

fn capacities(planned: &Plan, policies: &[&str]) -> Vec<u32> {
    policies
        .iter()
        .map(|p| report_of(planned, p).capacity)
        .collect()
}

#[test]
fn each_policy_counts_the_devices_that_fit_at_once_not_every_placement() {
    // Each policy alone (no other policy's devices compete): 2 GPUs, 7 1g slices per GPU, 2
    // 3g slices per GPU (placements at 0 and 4, of which both fit), one 7g per GPU.
    for (name, fits, entries) in [
        ("a100", 2, 2),
        ("mig-1g", 14, 14),
        ("mig-3g", 4, 4),
        ("mig-7g", 2, 2),
    ] {
        let planned = plan(&state(&[name], Vec::new()));
        let report = report_of(&planned, name);
        assert_eq!(report.capacity, fits, "{name}");
        let shared = condition(&report.conditions, "SharedCounters");
        assert!(!shared.status, "{name}: {shared:?}");
        assert!(
            shared.message.starts_with(&format!(
                "{entries} matching devices draw on shared counters; {fits} devices count"
            )),
            "{name}: {}",
            shared.message
        );
    }
}

#[test]
fn allocated_slices_leave_no_whole_gpu_and_the_rest_of_the_counters_count() {
    // gpu-0 runs 7 1g slices (through another class, outside any team: nothing to share).
    let mut cluster = state(&["a100"], Vec::new());
    seven_slices_outside_teams(&mut cluster);
    let planned = plan(&cluster);
    assert_eq!(report_of(&planned, "a100").capacity, 1, "gpu-1 only");

    // One 3g slice on gpu-1 (placement 4: memory slices 4-7, 42 of 98 SMs, 19968Mi of
    // 40192Mi): a 1g policy still fits 4 there (slices 0-3, 4 × 14 SMs, 4 × 4864Mi), none on
    // gpu-0.
    let mut cluster = state(&["mig-1g", "a100"], Vec::new());
    seven_slices_outside_teams(&mut cluster);
    cluster.claims.push(claim(
        "legacy",
        "one-3g",
        "gpu.nvidia.com",
        &["gpu-1-mig-3g20gb-9-4"],
    ));
    let planned = plan(&cluster);
    // mig-1g: its 7 allocated on gpu-0 (outside teams) plus 4 free on gpu-1; a100: none.
    assert_eq!(capacities(&planned, &["mig-1g", "a100"]), [11, 0]);
    assert_eq!(report_of(&planned, "mig-1g").used_outside_teams, 7);
}

#[test]
fn policies_on_the_same_gpus_are_given_whole_gpus_and_never_count_one_twice() {
    // Whole GPUs and 1g slices over the same two GPUs: alone each would count both GPUs.
    let teams = vec![
        team_of("training", &[("a100", 1, 2)]),
        team_of("notebooks", &[("mig-1g", 7, 14)]),
    ];
    let planned = plan(&state(&["a100", "mig-1g"], teams));
    assert_eq!(capacities(&planned, &["a100", "mig-1g"]), [1, 7]);
    let shared = condition(&report_of(&planned, "a100").conditions, "SharedCounters");
    assert!(shared.status);
    assert_eq!(shared.reason, "CountersShared");
    assert!(
        shared
            .message
            .contains("also fit devices of mig-1g: 1 of those groups were given to this policy"),
        "{}",
        shared.message
    );
    for team in &planned.teams {
        let overcommitted = condition(&team.conditions, "Overcommitted");
        assert!(!overcommitted.status, "{}: {overcommitted:?}", team.name);
    }

    // Training is guaranteed nothing and wants nothing; the notebooks wait for 10 slices, 3
    // beyond their guarantee: their guarantee gets the first GPU, their demand the second.
    let mut cluster = state(
        &["a100", "mig-1g"],
        vec![
            team_of("training", &[("a100", 0, 2)]),
            team_of("notebooks", &[("mig-1g", 7, 14)]),
        ],
    );
    cluster.pending = vec![teamgpu::core::state::PendingDemand {
        namespace: "notebooks".into(),
        device_class: "mig-1g.teamgpu.io".into(),
        devices: 10,
        claims: vec![1; 10],
        charged: Vec::new(),
        oldest: None,
    }];
    let planned = plan(&cluster);
    assert_eq!(capacities(&planned, &["a100", "mig-1g"]), [0, 14]);
}

#[test]
fn guarantees_that_cannot_fit_together_are_scaled_down_and_say_so() {
    // 2 whole GPUs and 7 slices guaranteed, on two GPUs: one of them cannot be kept.
    let teams = vec![
        team_of("training", &[("a100", 2, 2)]),
        team_of("notebooks", &[("mig-1g", 7, 7)]),
    ];
    let planned = plan(&state(&["a100", "mig-1g"], teams));
    // The two GPUs go one by one to the policy with the least of its guarantee covered: a100
    // first (a tie at none, by name), then mig-1g (none of 7 against 1 of 2).
    assert_eq!(capacities(&planned, &["a100", "mig-1g"]), [1, 7]);
    let training = planned.teams.iter().find(|t| t.name == "training").unwrap();
    let overcommitted = condition(&training.conditions, "Overcommitted");
    assert!(overcommitted.status, "{overcommitted:?}");
    assert!(
        planned.warnings.contains(&"sharing policy a100: its teams' guarantees (2 devices) do not fit beside those of mig-1g, whose devices draw on the same counters: it counts 1 devices".to_owned()),
        "{:?}",
        planned.warnings
    );
}

#[test]
fn a_gpu_its_driver_marks_lost_is_not_counted_and_the_status_says_why() {
    // The NVIDIA driver's health monitor taints a lost GPU `gpu.nvidia.com/gpu-lost`,
    // NoSchedule (device_health.go); a non-fatal XID gets effect None and still counts.
    let mut cluster = state(&["a100"], Vec::new());
    for device in devices_mut(&mut cluster) {
        let (key, effect) = match device.name.as_str() {
            "gpu-1" => ("gpu.nvidia.com/gpu-lost", "NoSchedule"),
            "gpu-0" => ("gpu.nvidia.com/xid", "None"),
            _ => continue,
        };
        device.taints = Some(vec![k8s_openapi::api::resource::v1::DeviceTaint {
            key: key.into(),
            effect: effect.into(),
            value: None,
            time_added: None,
        }]);
    }
    let planned = plan(&cluster);
    let report = report_of(&planned, "a100");
    assert_eq!(report.capacity, 1);
    assert_eq!(
        condition(&report.conditions, "DevicesFound").message,
        "1 devices match; 1 more are tainted NoSchedule or NoExecute (gpu.nvidia.com/gpu-lost) and not counted"
    );
}

#[test]
fn a_device_drawing_on_a_counter_set_its_pool_lacks_is_not_counted_and_the_status_says_why() {
    // A driver bug: gpu-1's full device names a counter set no slice of the pool publishes. The
    // allocator cannot allocate it; the other GPU still counts.
    let mut cluster = state(&["a100"], Vec::new());
    for device in devices_mut(&mut cluster).filter(|d| d.name == "gpu-1") {
        for draw in device.consumes_counters.iter_mut().flatten() {
            draw.counter_set = "gpu-9-counter-set".into();
        }
    }
    let planned = plan(&cluster);
    let report = report_of(&planned, "a100");
    assert_eq!(report.capacity, 1);
    assert_eq!(
        condition(&report.conditions, "DevicesFound").message,
        "1 devices match; 1 more draw on counters their pool does not publish, which no claim can get, and are not counted (gpu-1: draws on counter set gpu-9-counter-set, which the pool does not publish)"
    );
}

#[test]
fn a_gpu_running_slices_is_no_room_for_a_waiting_whole_gpu_claim() {
    // Two such nodes. On node-a, gpu-0 runs 7 slices outside teams: 1 whole GPU is free there,
    // though both entries are unallocated. On node-b the borrower holds gpu-0: 1 is free. The
    // owner (guarantee 2) waits for one 2-GPU claim: the pool has 2 free, no node has.
    let mut cluster = state(
        &["a100"],
        vec![
            team_of("owner", &[("a100", 2, 2)]),
            team_of("borrower", &[("a100", 0, 4)]),
        ],
    );
    let node_b: Vec<ResourceSlice> = (cluster.slices.iter())
        .map(|s| {
            let mut s = s.clone();
            s.metadata.name = s.metadata.name.map(|n| n.replace("node-a", "node-b"));
            s.spec.node_name = Some("node-b".into());
            s.spec.pool.name = "node-b".into();
            s
        })
        .collect();
    cluster.slices.extend(node_b);
    seven_slices_outside_teams(&mut cluster);
    let mut held = claim("borrower", "one", "a100.teamgpu.io", &["gpu-0"]);
    held.status
        .as_mut()
        .unwrap()
        .allocation
        .as_mut()
        .unwrap()
        .devices
        .as_mut()
        .unwrap()
        .results
        .as_mut()
        .unwrap()[0]
        .pool = "node-b".into();
    cluster.claims.push(held);
    cluster.pending = vec![teamgpu::core::state::PendingDemand {
        namespace: "owner".into(),
        device_class: "a100.teamgpu.io".into(),
        devices: 2,
        claims: vec![2],
        charged: Vec::new(),
        oldest: None,
    }];
    let planned = plan(&cluster);
    assert_eq!(report_of(&planned, "a100").capacity, 3);
    let placement = &planned.placements[0];
    assert_eq!(placement.unplaced["owner"], [2]);
    let free: Vec<(&str, u32)> = (placement.free.iter())
        .map(|(node, n)| (node.as_deref().unwrap_or("-"), *n))
        .collect();
    assert_eq!(free, [("node-a", 1), ("node-b", 1)]);
    let orders: Vec<(&str, &str)> = (planned.reclaims.iter())
        .map(|r| (r.borrower.as_str(), r.for_team.as_str()))
        .collect();
    assert_eq!(orders, [("borrower", "owner")]);
}

const H100: &str = include_str!(
    "../../testdata/nvidia-dra-driver-gpu/resourceslice/h100-dynamic-mig-node.teamgpu.yaml"
);

#[test]
fn on_h100s_each_profile_counts_what_fits_at_once() {
    // Two H100 80GB GPUs with dynamic MIG: 26 device entries each. Counted one by one (before),
    // against what the counters let the allocator give at once (now): the +me profiles share the
    // GPU's one optical-flow engine, 1g.20gb takes two of its eight memory slices.
    let slices = fixture_slices(H100);
    for (profiles, entries, fits) in [
        (json!([]), 2, 2),
        (json!(["1g.10gb"]), 14, 14),
        (json!(["1g.10gb+me"]), 14, 2),
        (json!(["1g.20gb"]), 8, 8),
        (json!(["2g.20gb"]), 6, 6),
        (json!(["3g.40gb"]), 4, 4),
        (json!(["4g.40gb"]), 2, 2),
        (json!(["7g.80gb"]), 2, 2),
        // Any MIG device: as many as the smallest profiles fit, 7 a GPU.
        (json!(null), 50, 14),
    ] {
        let selector = match &profiles {
            serde_json::Value::Null => json!({"deviceType": "mig"}),
            p if p.as_array().is_some_and(Vec::is_empty) => json!({"deviceType": "gpu"}),
            p => json!({"deviceType": "mig", "migProfiles": p}),
        };
        let cluster = ClusterState {
            slices: slices.clone(),
            sharing_policies: vec![policy(json!({"metadata": {"name": "h100"}, "spec": {
                "selector": selector, "sharing": {"strategy": "Exclusive"}}}))],
            ..Default::default()
        };
        let planned = plan(&cluster);
        let report = report_of(&planned, "h100");
        assert_eq!(report.capacity, fits, "{profiles}");
        let shared = condition(&report.conditions, "SharedCounters");
        assert!(
            shared.message.starts_with(&format!(
                "{entries} matching devices draw on shared counters"
            )),
            "{profiles}: {}",
            shared.message
        );
    }
}

/// Every device of the cluster's slices, to change.
fn devices_mut(
    cluster: &mut ClusterState,
) -> impl Iterator<Item = &mut k8s_openapi::api::resource::v1::Device> {
    (cluster.slices.iter_mut()).flat_map(|s| s.spec.devices.iter_mut().flatten())
}
