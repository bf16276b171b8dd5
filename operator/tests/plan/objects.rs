//! What the built-in example plans: every kind of object, quotas that close the back doors,
//! entitlements, determinism, conflicts and what the status says of them.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::resource::v1::DeviceClass;
use serde_json::json;
use teamgpu::core::plan::plan;
use teamgpu::core::state::NamespaceInfo;

use crate::{condition, example, hard, policy, team};

#[test]
fn the_example_plans_every_kind_of_object() {
    let plan = plan(&example());
    let classes: Vec<_> = plan
        .objects
        .device_classes
        .iter()
        .map(|c| c.metadata.name.clone().unwrap())
        .collect();
    assert_eq!(classes, ["a100-80gb.teamgpu.io", "a100-shared.teamgpu.io"]);
    let capacity: BTreeMap<_, _> = plan
        .sharing_policies
        .iter()
        .map(|p| (p.name.as_str(), p.capacity))
        .collect();
    assert_eq!(
        capacity,
        BTreeMap::from([("a100-80gb", 32), ("a100-shared", 16)])
    );

    // Templates: a100-80gb offers counts 1,2,4,8; a100-shared offers 1.
    let in_ns = |ns: &str| -> Vec<String> {
        plan.objects
            .claim_templates
            .iter()
            .filter(|t| &*t.namespace == ns)
            .map(|t| t.name().to_owned())
            .collect()
    };
    assert_eq!(
        in_ns("ml-research-dev"),
        [
            "a100-80gb",
            "a100-80gb-x2",
            "a100-80gb-x4",
            "a100-80gb-x8",
            "a100-shared"
        ]
    );
    assert_eq!(
        in_ns("inference-prod"),
        ["a100-80gb", "a100-80gb-x2", "a100-80gb-x4", "a100-80gb-x8"]
    );
    assert!(in_ns("web").is_empty());

    let quotas_named = |name: &str| -> Vec<String> {
        (plan.objects.resource_quotas.iter())
            .filter(|q| q.name() == name)
            .map(|q| q.to_object().metadata.namespace.unwrap())
            .collect()
    };
    let team_namespaces = quotas_named("teamgpu");
    // The one namespace outside every team gets a quota of 0 of every governed class instead.
    assert_eq!(quotas_named("teamgpu-outside-teams"), ["web"]);
    let outside = (plan.objects.resource_quotas.iter())
        .find(|q| q.name() == "teamgpu-outside-teams")
        .unwrap();
    // teamgpu's two classes and the NVIDIA driver's three, which select the same GPUs: their
    // devices, the name every class has as an extended resource, and gpu.nvidia.com's own
    // extended resource name.
    let hard: Vec<&str> = outside
        .hard()
        .map(|(name, n)| {
            assert_eq!(n, 0);
            name
        })
        .collect();
    assert_eq!(
        hard,
        [
            "a100-80gb.teamgpu.io.deviceclass.resource.k8s.io/devices",
            "a100-shared.teamgpu.io.deviceclass.resource.k8s.io/devices",
            "gpu.nvidia.com.deviceclass.resource.k8s.io/devices",
            "mig.nvidia.com.deviceclass.resource.k8s.io/devices",
            "requests.deviceclass.resource.kubernetes.io/a100-80gb.teamgpu.io",
            "requests.deviceclass.resource.kubernetes.io/a100-shared.teamgpu.io",
            "requests.deviceclass.resource.kubernetes.io/gpu.nvidia.com",
            "requests.deviceclass.resource.kubernetes.io/mig.nvidia.com",
            "requests.deviceclass.resource.kubernetes.io/vfio.gpu.nvidia.com",
            "requests.nvidia.com/gpu",
            "vfio.gpu.nvidia.com.deviceclass.resource.k8s.io/devices",
        ]
    );
    let guard = plan.objects.outside_teams.as_deref().unwrap();
    assert_eq!(guard.namespaces, ["web"]);
    assert_eq!(
        team_namespaces,
        [
            "data-science",
            "inference-canary",
            "inference-prod",
            "ml-research-dev",
            "ml-research-train"
        ]
    );
    let names = |objects: Vec<Option<String>>| -> Vec<String> {
        objects.into_iter().map(Option::unwrap).collect()
    };
    assert_eq!(
        names(
            plan.objects
                .admission_policies
                .iter()
                .map(|p| p.metadata.name.clone())
                .collect()
        ),
        [
            "teamgpu-team-requests",
            "teamgpu-non-team-requests",
            "teamgpu-namespace-membership",
            "teamgpu-namespace-exemption"
        ]
    );
    assert_eq!(
        names(
            plan.objects
                .admission_bindings
                .iter()
                .map(|p| p.metadata.name.clone())
                .collect()
        ),
        [
            "teamgpu-team-requests",
            "teamgpu-namespace-membership",
            "teamgpu-namespace-exemption",
            "teamgpu-non-team-requests"
        ],
        "one binding per policy"
    );
    for report in &plan.sharing_policies {
        assert!(condition(&report.conditions, "Ready").status, "{report:?}");
    }
    for report in &plan.teams {
        assert!(condition(&report.conditions, "Ready").status, "{report:?}");
    }
    assert!(plan.warnings.is_empty(), "{:?}", plan.warnings);
}

#[test]
fn quotas_close_every_governed_back_door() {
    let plan = plan(&example());
    let dev = hard(&plan, "ml-research-dev");
    // The NVIDIA driver's classes select the same devices: no quota for the team, so 0 ...
    assert_eq!(
        dev["gpu.nvidia.com.deviceclass.resource.k8s.io/devices"],
        "0"
    );
    assert_eq!(
        dev["mig.nvidia.com.deviceclass.resource.k8s.io/devices"],
        "0"
    );
    // ... including Pods that ask for the extended resource the driver's class maps.
    assert_eq!(dev["requests.nvidia.com/gpu"], "0");
    // ComputeDomain classes are another driver's devices: not governed, not in the quota.
    assert!(!dev.keys().any(|k| k.contains("compute-domain")), "{dev:?}");
    // inference has no quota for the shared class: 0 there.
    assert_eq!(
        hard(&plan, "inference-prod")["a100-shared.teamgpu.io.deviceclass.resource.k8s.io/devices"],
        "0"
    );
}

#[test]
fn namespace_hards_never_add_up_to_more_than_the_team_entitlement() {
    let plan = plan(&example());
    for team in &plan.teams {
        for quota in &team.quotas {
            let key = format!(
                "{}.teamgpu.io.deviceclass.resource.k8s.io/devices",
                quota.sharing_policy
            );
            let sum: u32 = team
                .namespaces
                .iter()
                .map(|ns| hard(&plan, ns)[&key].parse::<u32>().unwrap())
                .sum();
            assert!(
                sum <= quota.entitlement.max(quota.requested),
                "{}/{}: namespaces get {sum} > entitlement {}",
                team.name,
                quota.sharing_policy,
                quota.entitlement
            );
            assert!(
                quota.entitlement <= quota.limit.max(quota.requested),
                "{quota:?}"
            );
            assert!(!quota.explanation.is_empty());
        }
    }
}

#[test]
fn the_plan_is_byte_identical_whatever_the_input_order() {
    let state = example();
    let mut reversed = state.clone();
    reversed.sharing_policies.reverse();
    reversed.teams.reverse();
    reversed.namespaces.reverse();
    reversed.device_classes.reverse();
    reversed.slices.reverse();
    reversed.claims.reverse();
    let a = plan(&state);
    let b = plan(&reversed);
    assert_eq!(
        teamgpu::cli::output::yaml(&a).unwrap(),
        teamgpu::cli::output::yaml(&b).unwrap()
    );
    assert_eq!(
        teamgpu::cli::output::table(&a),
        teamgpu::cli::output::table(&b)
    );
    assert_eq!(a, b);
}

#[test]
fn a_namespace_claimed_by_two_teams_gets_nothing_and_both_say_so() {
    let mut state = example();
    // data-science also lists ml-research-dev by name.
    let ds = state
        .teams
        .iter_mut()
        .find(|t| t.metadata.name.as_deref() == Some("data-science"))
        .unwrap();
    ds.spec.namespaces.push("ml-research-dev".into());
    let plan = plan(&state);
    // It is no team's: the quota of 0 of a namespace outside teams, not a team's.
    let quotas: Vec<&str> = (plan.objects.resource_quotas.iter())
        .filter(|q| &*q.namespace == "ml-research-dev")
        .map(|q| q.name())
        .collect();
    assert_eq!(quotas, ["teamgpu-outside-teams"]);
    assert!(
        !plan
            .objects
            .claim_templates
            .iter()
            .any(|t| &*t.namespace == "ml-research-dev")
    );
    for (name, other) in [
        ("data-science", "ml-research"),
        ("ml-research", "data-science"),
    ] {
        let report = plan.teams.iter().find(|t| t.name == name).unwrap();
        let conflict = condition(&report.conditions, "Conflict");
        assert!(conflict.status);
        assert!(
            conflict.message.contains(&format!(
                "namespace ml-research-dev is also claimed by {other}"
            )),
            "{}",
            conflict.message
        );
    }
    assert!(
        plan.warnings.iter().any(|w| w
            .contains("ml-research-dev is claimed by TeamGpuPolicies data-science, ml-research")),
        "{:?}",
        plan.warnings
    );
    // The non-team binding covers it again: no teamgpu class there until resolved.
    let non_team = plan
        .objects
        .admission_bindings
        .iter()
        .find(|b| b.metadata.name.as_deref() == Some("teamgpu-non-team-requests"))
        .unwrap();
    let values = non_team
        .spec
        .as_ref()
        .unwrap()
        .match_resources
        .as_ref()
        .unwrap()
        .namespace_selector
        .as_ref()
        .unwrap()
        .match_expressions
        .as_ref()
        .unwrap()[0]
        .values
        .clone()
        .unwrap();
    assert!(
        !values.contains(&"ml-research-dev".to_owned()),
        "{values:?}"
    );
}

#[test]
fn a_namespace_a_team_had_stays_with_it_when_another_team_names_it() {
    let mut state = example();
    let owner_of = |plan: &teamgpu::core::plan::Plan| {
        let quota = (plan.objects.resource_quotas.iter())
            .find(|q| &*q.namespace == "ml-research-dev")
            .expect("ml-research-dev keeps its quota")
            .to_object();
        quota.metadata.labels.unwrap_or_default()["teamgpu.io/owner"].clone()
    };
    // ml-research had it at the operator's last pass (its status says so).
    let ml = (state.teams.iter_mut())
        .find(|t| t.metadata.name.as_deref() == Some("ml-research"))
        .unwrap();
    ml.status = Some(teamgpu::api::TeamGpuPolicyStatus {
        namespaces: ["ml-research-dev".into(), "ml-research-train".into()].into(),
        ..Default::default()
    });
    let before = plan(&state);
    let ds = (state.teams.iter_mut())
        .find(|t| t.metadata.name.as_deref() == Some("data-science"))
        .unwrap();
    ds.spec.namespaces.push("ml-research-dev".into());
    let after = plan(&state);
    assert_eq!(owner_of(&after), "TeamGpuPolicy.ml-research");
    assert_eq!(
        hard(&after, "ml-research-dev"),
        hard(&before, "ml-research-dev"),
        "its quota is unchanged"
    );
    let report = |name: &str| after.teams.iter().find(|t| t.name == name).unwrap();
    assert_eq!(
        condition(&report("data-science").conditions, "Conflict").message,
        "namespace ml-research-dev is also claimed by ml-research (it stays with ml-research, \
         which had it)"
    );
    assert_eq!(
        condition(&report("ml-research").conditions, "Conflict").message,
        "namespace ml-research-dev is also claimed by data-science (it stays with ml-research, \
         which had it)"
    );
    assert!(
        (after.warnings.iter()).any(|w| w
            == "namespace ml-research-dev is claimed by \
             TeamGpuPolicies data-science, ml-research: it stays with ml-research, which had it"),
        "{:?}",
        after.warnings
    );
}

#[test]
fn a_device_class_someone_else_owns_is_never_overwritten() {
    let mut state = example();
    state.device_classes.push(
        serde_json::from_value::<DeviceClass>(json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
            "metadata": {"name": "a100-80gb.teamgpu.io"},
            "spec": {"selectors": [{"cel": {"expression": "true"}}]}
        }))
        .unwrap(),
    );
    let plan = plan(&state);
    assert!(
        !plan
            .objects
            .device_classes
            .iter()
            .any(|c| c.metadata.name.as_deref() == Some("a100-80gb.teamgpu.io"))
    );
    let report = plan
        .sharing_policies
        .iter()
        .find(|p| p.name == "a100-80gb")
        .unwrap();
    assert!(condition(&report.conditions, "DeviceClassConflict").status);
    let ready = condition(&report.conditions, "Ready");
    assert!(!ready.status);
    assert_eq!(ready.reason, "DeviceClassConflict");
    // The other policy is unaffected.
    assert!(
        plan.objects
            .device_classes
            .iter()
            .any(|c| c.metadata.name.as_deref() == Some("a100-shared.teamgpu.io"))
    );
}

#[test]
fn an_invalid_raw_cel_keeps_the_last_class_and_says_why() {
    let mut state = example();
    let shared = state
        .sharing_policies
        .iter_mut()
        .find(|p| p.metadata.name.as_deref() == Some("a100-shared"))
        .unwrap();
    shared.spec.selector.cel = vec!["device.attributes['gpu.nvidia.com'].productName ==".into()];
    let plan = plan(&state);
    assert!(
        plan.objects
            .retained_device_classes
            .contains("a100-shared.teamgpu.io")
    );
    assert!(
        !plan
            .objects
            .device_classes
            .iter()
            .any(|c| c.metadata.name.as_deref() == Some("a100-shared.teamgpu.io"))
    );
    let report = plan
        .sharing_policies
        .iter()
        .find(|p| p.name == "a100-shared")
        .unwrap();
    let valid = condition(&report.conditions, "SelectorValid");
    assert!(!valid.status);
    assert!(
        valid.message.contains("productName =="),
        "{}",
        valid.message
    );
    assert_eq!(
        condition(&report.conditions, "Ready").reason,
        "InvalidSelector"
    );
    // Its class stays closed in every team namespace: a hard of 0, not no entry (no limit).
    for ns in ["data-science", "ml-research-dev"] {
        assert_eq!(
            hard(&plan, ns)["a100-shared.teamgpu.io.deviceclass.resource.k8s.io/devices"],
            "0",
            "{ns}"
        );
    }
    // Teams still get their other quotas; the broken policy's templates are not offered.
    let data_science = plan
        .teams
        .iter()
        .find(|t| t.name == "data-science")
        .unwrap();
    assert!(!condition(&data_science.conditions, "SharingPoliciesResolved").status);
    assert!(
        plan.objects
            .claim_templates
            .iter()
            .all(|t| t.name() != "a100-shared")
    );
    assert_eq!(
        plan.sharing_policies
            .iter()
            .find(|p| p.name == "a100-80gb")
            .unwrap()
            .capacity,
        32
    );
}

#[test]
fn unknown_sharing_policies_and_empty_selectors_are_reported() {
    let mut state = example();
    state.teams.push(team(json!({"metadata": {"name": "robotics"},
        "spec": {"namespaces": ["robotics"], "quotas": [{"sharingPolicy": "h100", "guaranteed": 4}]}})));
    state.namespaces.push(Arc::new(NamespaceInfo {
        name: "robotics".into(),
        labels: BTreeMap::new(),
    }));
    state
        .sharing_policies
        .push(policy(json!({"metadata": {"name": "b200"},
        "spec": {"selector": {"productNames": ["NVIDIA B200"]}}})));
    let plan = plan(&state);
    assert!(
        plan.warnings.contains(
            &"TeamGpuPolicy robotics names GpuSharingPolicy h100, which does not exist".to_owned()
        ),
        "{:?}",
        plan.warnings
    );
    assert!(
        plan.warnings
            .contains(&"GpuSharingPolicy b200 matches no device".to_owned()),
        "{:?}",
        plan.warnings
    );
    let robotics = plan.teams.iter().find(|t| t.name == "robotics").unwrap();
    let resolved = condition(&robotics.conditions, "SharingPoliciesResolved");
    assert!(!resolved.status);
    assert!(resolved.message.contains("h100"));
    // robotics still gets a quota that closes every governed class.
    let robotics_hard = hard(&plan, "robotics");
    assert!(
        robotics_hard.values().all(|v| v == "0"),
        "{robotics_hard:?}"
    );
    let b200 = plan
        .sharing_policies
        .iter()
        .find(|p| p.name == "b200")
        .unwrap();
    assert!(!condition(&b200.conditions, "DevicesFound").status);
}

#[test]
fn guarantees_above_capacity_are_scaled_and_reported() {
    let mut state = example();
    for t in &mut state.teams {
        for q in &mut t.spec.quotas {
            if q.sharing_policy == "a100-80gb" {
                q.guaranteed = 16.into();
                q.limit = Some(16.into());
            }
        }
    }
    let plan = plan(&state);
    let effective: u32 = plan
        .teams
        .iter()
        .flat_map(|t| t.quotas.iter())
        .filter(|q| q.sharing_policy == "a100-80gb")
        .map(|q| q.effective_guarantee)
        .sum();
    assert!(
        effective <= 32,
        "effective guarantees {effective} exceed capacity"
    );
    assert!(
        plan.warnings
            .iter()
            .any(|w| w.starts_with("sharing policy a100-80gb:")),
        "{:?}",
        plan.warnings
    );
    let ml = plan.teams.iter().find(|t| t.name == "ml-research").unwrap();
    assert!(condition(&ml.conditions, "Overcommitted").status);
}

#[test]
fn devices_on_a_tainted_or_incomplete_pool_are_not_capacity() {
    let mut state = example();
    // Taint every device of one 80GB node.
    let node = state
        .slices
        .iter_mut()
        .find(|s| s.spec.pool.name == "gpu-a-01")
        .unwrap();
    for d in node.spec.devices.iter_mut().flatten() {
        d.taints = Some(vec![
            serde_json::from_value(json!({"key": "maintenance", "effect": "NoSchedule"})).unwrap(),
        ]);
    }
    // Another 80GB node says its pool has two slices, but publishes one.
    let node = state
        .slices
        .iter_mut()
        .find(|s| s.spec.pool.name == "gpu-a-02")
        .unwrap();
    node.spec.pool.resource_slice_count = 2;
    let plan = plan(&state);
    let a100 = plan
        .sharing_policies
        .iter()
        .find(|p| p.name == "a100-80gb")
        .unwrap();
    assert_eq!(a100.capacity, 16);
    assert!(
        plan.warnings
            .iter()
            .any(|w| w.contains("pool gpu-a-02") && w.contains("incomplete")),
        "{:?}",
        plan.warnings
    );
}

#[test]
fn devices_a_taint_rule_or_a_pods_health_report_names_are_not_capacity() {
    use teamgpu::core::plan::inventory::ExtraTaint;
    let capacity = |state: &teamgpu::core::state::ClusterState| {
        let plan = plan(state);
        (plan.sharing_policies.iter())
            .find(|p| p.name == "a100-80gb")
            .unwrap()
            .clone()
    };
    let mut state = example();
    assert_eq!(capacity(&state).capacity, 32);
    // A DeviceTaintRule on one 80GB node's pool (every device of it), and a Pod's report that a
    // device of another node is unhealthy.
    state.device_taints = vec![
        ExtraTaint {
            driver: Some("gpu.nvidia.com".into()),
            pool: Some("gpu-a-01".into()),
            device: None,
            key: "example.com/maintenance".into(),
        },
        ExtraTaint {
            driver: Some("gpu.nvidia.com".into()),
            pool: Some("gpu-a-02".into()),
            device: Some("gpu-3".into()),
            key: teamgpu::core::plan::taints::UNHEALTHY.into(),
        },
    ];
    let a100 = capacity(&state);
    assert_eq!(a100.capacity, 32 - 8 - 1);
    let found = condition(&a100.conditions, "DevicesFound");
    assert_eq!(
        found.message,
        "23 devices match; 9 more are tainted NoSchedule or NoExecute (example.com/maintenance, unhealthy) and not counted"
    );
    // The rule deleted, the report gone: all of them count again.
    state.device_taints.clear();
    assert_eq!(capacity(&state).capacity, 32);
}

#[test]
fn statuses_are_deterministic_and_keep_transition_times() {
    let plan = plan(&example());
    let t0 = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        k8s_openapi::jiff::Timestamp::from_second(1_000).unwrap(),
    );
    let t1 = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        k8s_openapi::jiff::Timestamp::from_second(2_000).unwrap(),
    );
    let first = plan.team_status("ml-research", None, &t0).unwrap();
    let again = plan.team_status("ml-research", Some(&first), &t1).unwrap();
    assert_eq!(
        first, again,
        "the same plan must not change the status (no reconcile storm)"
    );
    assert_eq!(
        first.namespaces[..],
        ["ml-research-dev", "ml-research-train"]
    );
    let q = first
        .quotas
        .iter()
        .find(|q| q.sharing_policy == "a100-80gb")
        .unwrap();
    assert_eq!(
        (q.guaranteed, q.limit, q.weight, q.capacity),
        (8, 16, 2, 32)
    );
    assert_eq!(q.requested, 12);
    let gsp = plan.sharing_status("a100-80gb", None, &t0).unwrap();
    assert_eq!(
        gsp.device_class_name.as_deref(),
        Some("a100-80gb.teamgpu.io")
    );
    assert_eq!(gsp.devices, 32);
}
