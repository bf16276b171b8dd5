//! Memory slices of GPUs that many claims share (consumable capacity): one node of four H100
//! 80GB GPUs as the NVIDIA driver publishes them with `--consumable-shares=memory` (81559Mi
//! each, 1Mi steps, a claim naming no memory takes the whole GPU), and one with
//! `--consumable-shares=4` (no memory by default, 4 shares a GPU).

use std::sync::Arc;

use k8s_openapi::api::resource::v1::ResourceClaim;
use serde_json::json;
use teamgpu::core::plan::{Plan, plan};
use teamgpu::core::state::{ClusterState, NamespaceInfo};

use super::{condition, fixture_slices, hard, policy, report_of, team};

const MEMORY_MODE: &str = include_str!(
    "../../testdata/nvidia-dra-driver-gpu/resourceslice/h100-consumable-memory-node.teamgpu.yaml"
);
const SHARES_MODE: &str = include_str!(
    "../../testdata/nvidia-dra-driver-gpu/resourceslice/h100-consumable-shares-node.teamgpu.yaml"
);

/// `h100-10g` and `h100-20g`: slices of 10Gi and 20Gi; `h100`: whole GPUs, Exclusive.
fn sharing_policy(name: &str) -> teamgpu::api::GpuSharingPolicy {
    let sharing = match name {
        "h100-10g" => json!({"strategy": "MemorySlices", "memorySlices": {"size": "10Gi"}}),
        "h100-20g" => json!({"strategy": "MemorySlices", "memorySlices": {"size": "20Gi"}}),
        "h100-100g" => json!({"strategy": "MemorySlices", "memorySlices": {"size": "100Gi"}}),
        "h100" => json!({"strategy": "Exclusive"}),
        "h100-own" => json!({"strategy": "MemorySlices",
                             "memorySlices": {"size": "10Gi", "placement": "TeamGpus"}}),
        other => panic!("no policy {other}"),
    };
    policy(json!({"metadata": {"name": name}, "spec": {
        "selector": {"productNames": ["NVIDIA H100 80GB HBM3"]}, "sharing": sharing}}))
}

fn team_of(name: &str, quotas: serde_json::Value) -> teamgpu::api::TeamGpuPolicy {
    team(json!({"metadata": {"name": name}, "spec": {"namespaces": [name], "quotas": quotas}}))
}

fn state(
    fixture: &str,
    policies: &[&str],
    teams: Vec<teamgpu::api::TeamGpuPolicy>,
) -> ClusterState {
    let namespaces = (teams.iter())
        .map(|t| t.metadata.name.clone().unwrap())
        .chain(["legacy".to_owned()])
        .map(|name| {
            Arc::new(NamespaceInfo {
                name,
                ..Default::default()
            })
        })
        .collect();
    ClusterState {
        slices: fixture_slices(fixture),
        sharing_policies: policies.iter().map(|p| sharing_policy(p)).collect(),
        teams,
        namespaces,
        ..Default::default()
    }
}

/// A claim of `namespace` through `class`, allocated one share of `node-m`'s `device` that
/// consumes `memory`, as the scheduler records it (`consumedCapacity`, `shareID`).
fn share(namespace: &str, name: &str, class: &str, device: &str, memory: &str) -> ResourceClaim {
    serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": class, "capacity": {"requests": {"memory": memory}}}}]}},
        "status": {"allocation": {"devices": {"results": [{
            "request": "gpu", "driver": "gpu.nvidia.com", "pool": "node-m", "device": device,
            "shareID": format!("{name}-share"), "consumedCapacity": {"memory": memory}}]}}}
    }))
    .unwrap()
}

fn capacities(planned: &Plan, policies: &[&str]) -> Vec<u32> {
    (policies.iter())
        .map(|p| report_of(planned, p).capacity)
        .collect()
}

#[test]
fn a_gpu_counts_the_whole_slices_its_memory_holds() {
    // 81559Mi hold 7 slices of 10Gi (10240Mi; not 8: the GPU has less than 80Gi) and 3 of
    // 20Gi; four GPUs.
    let planned = plan(&state(MEMORY_MODE, &["h100-10g"], Vec::new()));
    assert_eq!(capacities(&planned, &["h100-10g"]), [28]);
    let planned = plan(&state(MEMORY_MODE, &["h100-20g"], Vec::new()));
    assert_eq!(capacities(&planned, &["h100-20g"]), [12]);
    // A slice larger than the GPU: no device matches (the class asks for that much memory).
    let planned = plan(&state(MEMORY_MODE, &["h100-100g"], Vec::new()));
    assert_eq!(capacities(&planned, &["h100-100g"]), [0]);
    // With 4 shares a GPU, 4 claims fit whatever their memory.
    let planned = plan(&state(SHARES_MODE, &["h100-10g"], Vec::new()));
    assert_eq!(capacities(&planned, &["h100-10g"]), [16]);
}

#[test]
fn what_other_claims_consume_leaves_the_slices_that_still_fit() {
    let mut cluster = state(
        MEMORY_MODE,
        &["h100-10g"],
        vec![team_of(
            "notebooks",
            json!([{"sharingPolicy": "h100-10g", "guaranteed": 4, "limit": 28}]),
        )],
    );
    for i in 0..3 {
        cluster.claims.push(share(
            "notebooks",
            &format!("nb-{i}"),
            "h100-10g.teamgpu.io",
            "gpu-0",
            "10Gi",
        ));
    }
    // 40Gi of gpu-1 through the driver's own class, outside every team.
    cluster
        .claims
        .push(share("legacy", "big", "gpu.nvidia.com", "gpu-1", "40Gi"));
    let planned = plan(&cluster);
    // gpu-0: its 3 slices and 4 more in the 50839Mi left; gpu-1: 3 in 40599Mi; 7 on each of
    // the other two.
    assert_eq!(capacities(&planned, &["h100-10g"]), [24]);
    let team = &planned.teams[0];
    assert_eq!(team.quotas[0].allocated, 3);
    assert_eq!(team.quotas[0].capacity, 24);
}

#[test]
fn two_slice_sizes_over_the_same_gpus_are_given_whole_gpus() {
    let teams = vec![
        team_of(
            "notebooks",
            json!([{"sharingPolicy": "h100-10g", "guaranteed": 14, "limit": 28}]),
        ),
        team_of(
            "inference",
            json!([{"sharingPolicy": "h100-20g", "guaranteed": 6, "limit": 12}]),
        ),
    ];
    let planned = plan(&state(MEMORY_MODE, &["h100-10g", "h100-20g"], teams));
    // Two GPUs for each guarantee (14 = 2 × 7, 6 = 2 × 3): alone, each would count all four.
    assert_eq!(capacities(&planned, &["h100-10g", "h100-20g"]), [14, 6]);
}

#[test]
fn a_whole_gpu_policy_counts_what_a_claim_naming_no_memory_takes() {
    // Memory mode: such a claim takes the whole GPU's memory, so one claim a GPU.
    let planned = plan(&state(MEMORY_MODE, &["h100"], Vec::new()));
    assert_eq!(capacities(&planned, &["h100"]), [4]);
    // 4 shares a GPU and no memory by default: four "exclusive" claims share each GPU.
    let planned = plan(&state(SHARES_MODE, &["h100"], Vec::new()));
    assert_eq!(capacities(&planned, &["h100"]), [16]);
}

#[test]
fn entitlements_in_memory_count_whole_slices() {
    let teams = vec![team_of(
        "notebooks",
        json!([{"sharingPolicy": "h100-10g", "guaranteed": "45Gi", "limit": "80Gi"}]),
    )];
    let planned = plan(&state(MEMORY_MODE, &["h100-10g"], teams));
    let quota = &planned.teams[0].quotas[0];
    assert_eq!((quota.guaranteed, quota.limit), (4, 8));
    // Nobody else wants the 28 slices: up to its limit.
    assert_eq!(
        hard(&planned, "notebooks")["h100-10g.teamgpu.io.deviceclass.resource.k8s.io/devices"],
        "8"
    );
}

#[test]
fn memory_on_a_policy_of_whole_gpus_is_refused_and_gets_nothing() {
    let teams = vec![team_of(
        "training",
        json!([{"sharingPolicy": "h100", "guaranteed": "80Gi"}]),
    )];
    let planned = plan(&state(MEMORY_MODE, &["h100"], teams));
    let team = &planned.teams[0];
    let ready = condition(&team.conditions, "Ready");
    assert!(!ready.status);
    assert_eq!(ready.reason, "InvalidQuota");
    assert_eq!(
        ready.message,
        "quota for h100: 80Gi is an amount of memory, but sharing policy h100 does not cut memory slices: give a number of devices: these entries get no devices (a hard of 0; what runs keeps running)"
    );
    assert_eq!(
        hard(&planned, "training")["h100.teamgpu.io.deviceclass.resource.k8s.io/devices"],
        "0"
    );
}

#[test]
fn the_templates_ask_for_exactly_one_slice_per_device() {
    let teams = vec![team_of(
        "notebooks",
        json!([{"sharingPolicy": "h100-10g", "guaranteed": 4}]),
    )];
    let planned = plan(&state(MEMORY_MODE, &["h100-10g"], teams));
    let template = (planned.objects.claim_templates.iter())
        .find(|t| t.name() == "h100-10g")
        .expect("template");
    let object = serde_json::to_value(template.to_object()).unwrap();
    assert_eq!(
        object["spec"]["spec"]["devices"]["requests"][0]["exactly"],
        json!({"deviceClassName": "h100-10g.teamgpu.io", "allocationMode": "ExactCount",
               "count": 1, "capacity": {"requests": {"memory": "10Gi"}}})
    );
    let class = (planned.objects.device_classes.iter())
        .find(|c| c.metadata.name.as_deref() == Some("h100-10g.teamgpu.io"))
        .unwrap();
    let expressions: Vec<&str> = (class.spec.selectors.iter().flatten())
        .filter_map(|s| Some(s.cel.as_ref()?.expression.as_str()))
        .collect();
    assert!(
        expressions.contains(&"device.allowMultipleAllocations == true"),
        "{expressions:?}"
    );
    assert!(
        expressions.contains(&"has(device.capacity['gpu.nvidia.com'].memory) && device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('10Gi')) >= 0"),
        "{expressions:?}"
    );
}

/// The CEL selection of `namespace`'s template `template`, if it has one.
fn template_selection(planned: &Plan, namespace: &str, template: &str) -> Option<String> {
    let t = (planned.objects.claim_templates.iter())
        .find(|t| t.name() == template && &*t.namespace == namespace)
        .expect("template");
    let object = serde_json::to_value(t.to_object()).unwrap();
    let selectors = &object["spec"]["spec"]["devices"]["requests"][0]["exactly"]["selectors"];
    selectors[0]["cel"]["expression"]
        .as_str()
        .map(str::to_owned)
}

#[test]
fn with_team_gpus_each_team_selects_gpus_of_its_own() {
    // notebooks: 10 slices (2 GPUs of 7), inference: 5 (1 GPU); inference already holds a
    // slice on gpu-2, notebooks on gpu-0 (and a claim of inference there too, fewer).
    let teams = vec![
        team_of(
            "notebooks",
            json!([{"sharingPolicy": "h100-own", "guaranteed": 10, "limit": 10}]),
        ),
        team_of(
            "inference",
            json!([{"sharingPolicy": "h100-own", "guaranteed": 5, "limit": 5}]),
        ),
    ];
    let mut cluster = state(MEMORY_MODE, &["h100-own"], teams);
    let class = "h100-own.teamgpu.io";
    for (ns, name, device) in [
        ("notebooks", "nb-0", "gpu-0"),
        ("notebooks", "nb-1", "gpu-0"),
        ("inference", "inf-0", "gpu-0"),
        ("inference", "inf-1", "gpu-2"),
    ] {
        cluster.claims.push(share(ns, name, class, device, "10Gi"));
    }
    let planned = plan(&cluster);
    let uuid = |i: u32| format!("GPU-5e1f0c6a-{i:04}-4c2b-9d1e-7a3f00c0ffee");
    let selects = |uuids: &[String]| {
        let list: Vec<String> = uuids.iter().map(|u| format!("'{u}'")).collect();
        format!(
            "has(device.attributes['gpu.nvidia.com'].uuid) && device.attributes['gpu.nvidia.com'].uuid in [{}]",
            list.join(", ")
        )
    };
    // notebooks keeps gpu-0 (2 of its slices against 1) and gets gpu-1, the first empty GPU;
    // inference keeps gpu-2, which holds its 5 slices (7).
    let notebooks = selects(&[uuid(0), uuid(1)]);
    let inference = selects(&[uuid(2)]);
    assert_eq!(
        template_selection(&planned, "notebooks", "h100-own").as_deref(),
        Some(notebooks.as_str())
    );
    assert_eq!(
        template_selection(&planned, "inference", "h100-own").as_deref(),
        Some(inference.as_str())
    );
    let quota = (planned.objects.resource_quotas.iter())
        .find(|q| &*q.namespace == "notebooks")
        .unwrap()
        .to_object();
    assert_eq!(
        quota.metadata.annotations.unwrap()["teamgpu.io/gpus-h100-own.teamgpu.io"],
        notebooks
    );
    let explanation = &(planned
        .teams
        .iter()
        .find(|t| t.name == "notebooks")
        .unwrap())
    .quotas[0]
        .explanation;
    assert!(
        explanation.ends_with(&format!(
            "; its slices go on 2 GPUs of its own, which hold 13 ({}, {})",
            uuid(0),
            uuid(1)
        )),
        "{explanation}"
    );
}
