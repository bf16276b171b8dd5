//! The planning core end to end: from cluster state to objects and statuses, on the built-in
//! example (config/samples on six nodes shaped like the NVIDIA driver's ResourceSlice).

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim};
use serde_json::json;
use teamgpu::api::{GpuSharingPolicy, TeamGpuPolicy};
use teamgpu::core::plan::{Plan, plan};
use teamgpu::core::state::{ClusterState, NamespaceInfo};

fn example() -> ClusterState {
    teamgpu::example::state().expect("the built-in example loads")
}

fn hard(plan: &Plan, namespace: &str) -> BTreeMap<String, String> {
    let quota = plan
        .objects
        .resource_quotas
        .iter()
        .find(|q| &*q.namespace == namespace)
        .unwrap_or_else(|| panic!("no quota in {namespace}"))
        .to_object();
    quota
        .spec
        .as_ref()
        .unwrap()
        .hard
        .clone()
        .unwrap()
        .into_iter()
        .map(|(k, v)| (k, v.0))
        .collect()
}

fn condition<'a>(
    conds: &'a [teamgpu::core::plan::conditions::DesiredCondition],
    type_: &str,
) -> &'a teamgpu::core::plan::conditions::DesiredCondition {
    conds
        .iter()
        .find(|c| c.type_ == type_)
        .unwrap_or_else(|| panic!("no {type_} condition in {conds:?}"))
}

fn policy(yaml: serde_json::Value) -> GpuSharingPolicy {
    serde_json::from_value(yaml).unwrap()
}

fn team(yaml: serde_json::Value) -> TeamGpuPolicy {
    serde_json::from_value(yaml).unwrap()
}

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

    let team_namespaces: Vec<_> = plan
        .objects
        .resource_quotas
        .iter()
        .map(|q| q.to_object().metadata.namespace.unwrap())
        .collect();
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
        teamgpu::output::yaml(&a).unwrap(),
        teamgpu::output::yaml(&b).unwrap()
    );
    assert_eq!(teamgpu::output::table(&a), teamgpu::output::table(&b));
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
    assert!(
        !plan
            .objects
            .resource_quotas
            .iter()
            .any(|q| &*q.namespace == "ml-research-dev")
    );
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
                q.guaranteed = 16;
                q.limit = Some(16);
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
    assert_eq!(first.namespaces, ["ml-research-dev", "ml-research-train"]);
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

/// One change to a cluster, as the operator would see it through its watches.
#[derive(Clone, Debug)]
enum Change {
    DropClaim(usize),
    CopyClaim(usize),
    Deallocate(usize),
    Relabel(usize, Option<&'static str>),
    NewNamespace(Option<&'static str>),
    TaintDevice(usize, usize),
    DropSlice(usize),
    RepublishSlice(usize),
    Product(usize, &'static str),
    Guarantee(usize, u32),
    Selector(usize, &'static str),
    DropSharingPolicy(usize),
    Pending(usize, u32),
    ForeignClass(&'static str),
}

fn change() -> impl proptest::strategy::Strategy<Value = Change> {
    use proptest::prelude::*;
    const TEAMS: [Option<&str>; 4] = [
        Some("ml-research"),
        Some("inference"),
        Some("data-science"),
        None,
    ];
    const PRODUCTS: [&str; 2] = ["NVIDIA A100-SXM4-80GB", "NVIDIA A100-PCIE-40GB"];
    let i = 0..64usize;
    prop_oneof![
        i.clone().prop_map(Change::DropClaim),
        i.clone().prop_map(Change::CopyClaim),
        i.clone().prop_map(Change::Deallocate),
        (i.clone(), proptest::sample::select(&TEAMS[..])).prop_map(|(n, t)| Change::Relabel(n, t)),
        proptest::sample::select(&TEAMS[..]).prop_map(Change::NewNamespace),
        (i.clone(), 0..8usize).prop_map(|(s, d)| Change::TaintDevice(s, d)),
        i.clone().prop_map(Change::DropSlice),
        i.clone().prop_map(Change::RepublishSlice),
        (i.clone(), proptest::sample::select(&PRODUCTS[..]))
            .prop_map(|(s, p)| Change::Product(s, p)),
        (i.clone(), 0..20u32).prop_map(|(t, g)| Change::Guarantee(t, g)),
        (i.clone(), proptest::sample::select(&PRODUCTS[..]))
            .prop_map(|(p, n)| Change::Selector(p, n)),
        i.clone().prop_map(Change::DropSharingPolicy),
        (i, 0..6u32).prop_map(|(n, d)| Change::Pending(n, d)),
        proptest::sample::select(&["device.driver == 'gpu.nvidia.com'", "true", "false",][..])
            .prop_map(Change::ForeignClass),
    ]
}

/// `prefix` and a number no object of `objects` is named: names are unique (claims' in a
/// namespace, and these are all in a few), as on the API server.
fn unused_name<K: kube::Resource>(objects: &[K], prefix: &str) -> String {
    (0..)
        .map(|n| format!("{prefix}-{n}"))
        .find(|name| objects.iter().all(|o| o.meta().name.as_ref() != Some(name)))
        .unwrap_or_default()
}

/// Applies `change`; `version` plays the API server, which gives every write a new
/// resourceVersion (when `versioned`).
fn apply(state: &mut ClusterState, change: &Change, version: &mut u64, versioned: bool) {
    let mut bump = |meta: &mut k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta| {
        *version += 1;
        if versioned {
            meta.resource_version = Some(version.to_string());
        }
    };
    let pick = |n: usize, len: usize| (len > 0).then(|| n % len);
    match change {
        Change::DropClaim(n) => {
            if let Some(i) = pick(*n, state.claims.len()) {
                state.claims.remove(i);
            }
        }
        Change::CopyClaim(n) => {
            if let Some(i) = pick(*n, state.claims.len()) {
                let mut c = state.claims[i].clone();
                bump(&mut c.metadata);
                c.metadata.name = Some(unused_name(&state.claims, "copy"));
                state.claims.push(c);
            }
        }
        Change::Deallocate(n) => {
            if let Some(i) = pick(*n, state.claims.len()) {
                state.claims[i].status = None;
                bump(&mut state.claims[i].metadata);
            }
        }
        Change::Relabel(n, team) => {
            if let Some(i) = pick(*n, state.namespaces.len()) {
                let labels = &mut Arc::make_mut(&mut state.namespaces[i]).labels;
                labels.remove("teamgpu.io/team");
                if let Some(t) = team {
                    labels.insert("teamgpu.io/team".into(), (*t).into());
                }
            }
        }
        Change::NewNamespace(team) => state.namespaces.push(Arc::new(NamespaceInfo {
            name: format!("ns-{}", state.namespaces.len()),
            labels: team
                .iter()
                .map(|t| ("teamgpu.io/team".to_owned(), (*t).to_owned()))
                .collect(),
        })),
        Change::TaintDevice(n, d) => {
            if let Some(i) = pick(*n, state.slices.len()) {
                let slice = &mut state.slices[i];
                if let Some(device) = slice.spec.devices.iter_mut().flatten().nth(*d) {
                    device.taints = Some(vec![k8s_openapi::api::resource::v1::DeviceTaint {
                        key: "gpu.nvidia.com/xid".into(),
                        effect: "NoSchedule".into(),
                        value: None,
                        time_added: None,
                    }]);
                }
                bump(&mut slice.metadata);
            }
        }
        Change::DropSlice(n) => {
            if let Some(i) = pick(*n, state.slices.len()) {
                state.slices.remove(i);
            }
        }
        Change::RepublishSlice(n) => {
            // A driver restart: a new generation of the pool, one device fewer.
            if let Some(i) = pick(*n, state.slices.len()) {
                let mut s = state.slices[i].clone();
                let name = format!("{}-next", s.metadata.name.unwrap_or_default());
                s.metadata.name = Some(unused_name(&state.slices, &name));
                s.spec.pool.generation += 1;
                if let Some(devices) = s.spec.devices.as_mut() {
                    devices.pop();
                }
                bump(&mut s.metadata);
                state.slices.push(s);
            }
        }
        Change::Product(n, product) => {
            if let Some(i) = pick(*n, state.slices.len()) {
                let slice = &mut state.slices[i];
                for d in slice.spec.devices.iter_mut().flatten() {
                    if let Some(a) = d.attributes.as_mut().and_then(|a| a.get_mut("productName")) {
                        a.string = Some((*product).into());
                    }
                }
                bump(&mut slice.metadata);
            }
        }
        Change::Guarantee(n, g) => {
            if let Some(i) = pick(*n, state.teams.len()) {
                let team = &mut state.teams[i];
                if let Some(q) = team.spec.quotas.first_mut() {
                    q.guaranteed = *g;
                }
                bump(&mut team.metadata);
            }
        }
        Change::Selector(n, product) => {
            if let Some(i) = pick(*n, state.sharing_policies.len()) {
                let p = &mut state.sharing_policies[i];
                p.spec.selector.product_names = vec![(*product).into()];
                bump(&mut p.metadata);
            }
        }
        Change::DropSharingPolicy(n) => {
            if let Some(i) = pick(*n, state.sharing_policies.len()) {
                state.sharing_policies.remove(i);
            }
        }
        Change::Pending(n, devices) => {
            if let Some(i) = pick(*n, state.namespaces.len()) {
                state.pending = vec![teamgpu::core::state::PendingDemand {
                    namespace: state.namespaces[i].name.clone(),
                    device_class: "a100-80gb.teamgpu.io".into(),
                    devices: *devices,
                    claims: vec![*devices],
                    oldest: None,
                }];
            }
        }
        Change::ForeignClass(expression) => {
            let class: DeviceClass = serde_json::from_value(json!({
                "metadata": {"name": format!("foreign-{}", state.device_classes.len())},
                "spec": {"selectors": [{"cel": {"expression": expression}}]}
            }))
            .unwrap();
            state.device_classes.push(class);
        }
    }
}

/// A watch cache as `teamgpu run` keeps it, for the planner fed what changed: the projection
/// of every object by key; an object whose projection is the same keeps the kept one.
struct Watched<V> {
    kept: BTreeMap<String, Arc<V>>,
}

impl<V> Watched<V> {
    fn new() -> Self {
        Watched {
            kept: BTreeMap::new(),
        }
    }

    /// Takes in the cluster's objects now; returns what changed: (upserted, removed).
    fn changes(
        &mut self,
        now: Vec<(String, V)>,
        same: impl Fn(&V, &V) -> bool,
    ) -> (Vec<Arc<V>>, Vec<Arc<V>>) {
        let mut upserted = Vec::new();
        let mut next = BTreeMap::new();
        for (key, view) in now {
            match self.kept.remove(&key) {
                Some(kept) if same(&kept, &view) => {
                    next.insert(key, kept);
                }
                _ => {
                    let view = Arc::new(view);
                    upserted.push(view.clone());
                    next.insert(key, view);
                }
            }
        }
        let removed = std::mem::replace(&mut self.kept, next)
            .into_values()
            .collect();
        (upserted, removed)
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]

    /// The operator's planner, kept across changes, always agrees with a plan made from scratch,
    /// whether objects carry resourceVersions (from the API server) or not (from files), and
    /// whether it is handed every object or only what changed since the last change.
    #[test]
    fn the_kept_planner_agrees_with_a_fresh_plan_after_any_changes(
        changes in proptest::collection::vec(change(), 1..12),
        versioned: bool,
    ) {
        use teamgpu::core::plan::inventory::SliceView;
        use teamgpu::core::plan::usage::ClaimView;
        use teamgpu::core::state::Delta;
        let mut state = example();
        let mut version = 0;
        let mut planner = teamgpu::core::plan::Planner::default();
        // As `teamgpu run` keeps them: slices reduced to what the selectors read, listed again
        // when a selector reads more; claims projected. One planner is handed every object,
        // one only what changed.
        let mut projected = teamgpu::core::plan::Planner::default();
        let mut deltas = teamgpu::core::plan::Planner::default();
        let (mut slices, mut claims) = (Watched::<SliceView>::new(), Watched::<ClaimView>::new());
        let mut reads = teamgpu::dra_cel::DeviceReads::default();
        let mut envs = teamgpu::dra_cel::DeviceEnvs::default();
        let mut names = teamgpu::core::plan::usage::Names::default();
        for change in &changes {
            apply(&mut state, change, &mut version, versioned);
            planner.update_slices(&state.slices);
            planner.update_claims(&state.claims);
            let fresh = plan(&state);
            proptest::prop_assert_eq!(planner.plan(&state), fresh.clone(), "after {:?}", change);

            let wanted = teamgpu::core::plan::device_reads(&state);
            if !reads.covers(&wanted) {
                reads = wanted;
            }
            let slice_views: Vec<(String, SliceView)> = state
                .slices
                .iter()
                .map(|s| (s.metadata.name.clone().unwrap_or_default(), SliceView::project(s, &reads, &mut envs)))
                .collect();
            let claim_views: Vec<(String, ClaimView)> = state
                .claims
                .iter()
                .map(|c| (format!("{:?}/{:?}", c.metadata.namespace, c.metadata.name), ClaimView::project(c, &mut names)))
                .collect();
            let (upserted, removed) = slices.changes(slice_views, SliceView::same_content);
            deltas.update_slice_views(Delta::Changed { upserted: &upserted, removed: &removed }, &reads);
            let all: Vec<Arc<SliceView>> = slices.kept.values().cloned().collect();
            projected.update_slice_views(Delta::All(&all), &reads);
            let (upserted, removed) = claims.changes(claim_views, ClaimView::same_content);
            deltas.update_claim_views(Delta::Changed { upserted: &upserted, removed: &removed });
            let all: Vec<Arc<ClaimView>> = claims.kept.values().cloned().collect();
            projected.update_claim_views(Delta::All(&all));
            proptest::prop_assert!(projected.reads_cover(&teamgpu::core::plan::device_reads(&state)));
            proptest::prop_assert_eq!(projected.plan(&state), fresh.clone(), "projected, after {:?}", change);
            proptest::prop_assert_eq!(deltas.plan(&state), fresh, "fed what changed, after {:?}", change);
        }
    }
}

#[test]
fn a_claim_change_recounts_one_namespace_and_a_slice_change_one_pool() {
    let mut state = example();
    let mut planner = teamgpu::core::plan::Planner::default();
    assert_eq!(planner.update_slices(&state.slices).len(), 6);
    assert_eq!(planner.update_claims(&state.claims).len(), 5);
    planner.plan(&state);

    let mut version = 0;
    apply(&mut state, &Change::Deallocate(0), &mut version, true);
    assert!(planner.update_slices(&state.slices).is_empty());
    let namespace = state.claims[0].metadata.namespace.clone().unwrap();
    assert_eq!(planner.update_claims(&state.claims), [namespace]);
    apply(&mut state, &Change::TaintDevice(2, 0), &mut version, true);
    let pools = planner.update_slices(&state.slices);
    assert_eq!(pools.len(), 1);
    assert_eq!(&*pools[0].pool, state.slices[2].spec.pool.name);
    assert!(planner.update_claims(&state.claims).is_empty());
    assert_eq!(planner.plan(&state), plan(&state));
}

/// A claim in `namespace` for `devices` (pool, device) of the NVIDIA driver through the
/// driver's own class `gpu.nvidia.com`, allocated; with admin access when `admin`.
fn driver_claim(namespace: &str, devices: &[(String, String)], admin: bool) -> ResourceClaim {
    serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "legacy", "namespace": namespace},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": "gpu.nvidia.com", "count": devices.len(), "adminAccess": admin}}]}},
        "status": {"allocation": {"devices": {"results": devices.iter().map(|(pool, device)| json!({
            "request": "gpu", "driver": "gpu.nvidia.com", "pool": pool, "device": device,
            "adminAccess": admin})).collect::<Vec<_>>()}}}
    }))
    .unwrap()
}

/// A100-80GB devices of the example that no claim holds: (pool, device).
fn free_80gb_devices(state: &ClusterState) -> Vec<(String, String)> {
    let taken: Vec<(String, String)> = state
        .claims
        .iter()
        .filter_map(|c| {
            c.status
                .as_ref()?
                .allocation
                .as_ref()?
                .devices
                .as_ref()?
                .results
                .clone()
        })
        .flatten()
        .map(|r| (r.pool, r.device))
        .collect();
    let mut free = Vec::new();
    for slice in &state.slices {
        for device in slice.spec.devices.iter().flatten() {
            let product = device
                .attributes
                .as_ref()
                .and_then(|a| a.get("productName")?.string.clone());
            let id = (slice.spec.pool.name.clone(), device.name.clone());
            if product.as_deref() == Some("NVIDIA A100-SXM4-80GB") && !taken.contains(&id) {
                free.push(id);
            }
        }
    }
    free
}

/// The plan's report on sharing policy `name`.
fn report_of<'a>(plan: &'a Plan, name: &str) -> &'a teamgpu::core::plan::SharingPolicyReport {
    plan.sharing_policies
        .iter()
        .find(|p| p.name == name)
        .unwrap_or_else(|| panic!("no report on {name}"))
}

#[test]
fn devices_allocated_outside_teams_are_taken_from_the_teams_capacity_and_reported() {
    let mut state = example();
    let free = free_80gb_devices(&state);
    state.namespaces.push(Arc::new(NamespaceInfo {
        name: "legacy-batch".into(),
        ..Default::default()
    }));
    state
        .claims
        .push(driver_claim("legacy-batch", &free[..2], false));
    let planned = plan(&state);
    let a100 = report_of(&planned, "a100-80gb");
    assert_eq!((a100.capacity, a100.used_outside_teams), (32, 2));
    let outside = condition(&a100.conditions, "UsedOutsideTeams");
    assert!(outside.status);
    assert_eq!(
        outside.message,
        "2 of 32 matching devices are allocated through other DeviceClasses, to legacy-batch/legacy: teams share the other 30"
    );
    let shared = report_of(&planned, "a100-shared");
    assert!(!condition(&shared.conditions, "UsedOutsideTeams").status);
    for team in &planned.teams {
        for q in team
            .quotas
            .iter()
            .filter(|q| q.sharing_policy == "a100-80gb")
        {
            assert_eq!(q.capacity, 30, "{}: {q:?}", team.name);
        }
    }

    // Admin access (a monitoring agent, say) takes no device from anyone.
    let mut state = example();
    state
        .claims
        .push(driver_claim("legacy-batch", &free[..2], true));
    let planned = plan(&state);
    let a100 = report_of(&planned, "a100-80gb");
    assert_eq!(a100.used_outside_teams, 0);
    assert!(!condition(&a100.conditions, "UsedOutsideTeams").status);
}

#[test]
fn an_unreadable_sharing_policy_keeps_its_class_and_closes_it_to_new_claims() {
    let mut state = example();
    state
        .sharing_policies
        .retain(|p| p.metadata.name.as_deref() != Some("a100-shared"));
    state.unreadable_sharing_policies = vec!["a100-shared".into()];
    let plan = plan(&state);
    assert!(
        plan.objects
            .retained_device_classes
            .contains("a100-shared.teamgpu.io")
    );
    assert_eq!(
        hard(&plan, "data-science")["a100-shared.teamgpu.io.deviceclass.resource.k8s.io/devices"],
        "0"
    );
    assert_eq!(
        hard(&plan, "data-science")["a100-80gb.teamgpu.io.deviceclass.resource.k8s.io/devices"],
        "4"
    );
}

#[test]
fn an_unreadable_team_keeps_what_it_had() {
    let mut state = example();
    state
        .teams
        .retain(|t| t.metadata.name.as_deref() != Some("inference"));
    state.unreadable_teams = vec!["inference".into()];
    let plan = plan(&state);
    assert_eq!(
        plan.objects.retained_owners,
        ["TeamGpuPolicy.inference".to_owned()].into()
    );
}

/// A claim of `devices` whole A100 80GB GPUs in `namespace`, allocated on pool `node` of the
/// example (devices `gpu-<first>` ..) when `node` is given.
fn a100_claim(
    namespace: &str,
    name: &str,
    devices: usize,
    on: Option<(&str, usize)>,
) -> ResourceClaim {
    let results: Vec<serde_json::Value> = (on.iter())
        .flat_map(|(pool, first)| {
            (0..devices).map(move |i| {
                json!({"request": "gpu", "driver": "gpu.nvidia.com",
                "pool": pool, "device": format!("gpu-{}", first + i)})
            })
        })
        .collect();
    let mut claim = json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": "a100-80gb.teamgpu.io", "count": devices}}]}}});
    if on.is_some() {
        claim["status"] = json!({"allocation": {"devices": {"results": results}}});
    }
    serde_json::from_value(claim).unwrap()
}

#[test]
fn a_claim_that_fits_no_node_is_reclaimed_for_though_the_pool_counts_enough_free() {
    // The example's four 8-GPU A100 80GB nodes; a borrower holds 6 one-GPU claims on each
    // (24), so 8 are free, 2 per node; the owner (guarantee 8) waits for one claim of 8.
    let mut state = example();
    state.teams = vec![
        team(
            json!({"metadata": {"name": "owner"}, "spec": {"namespaces": ["owner"],
            "quotas": [{"sharingPolicy": "a100-80gb", "guaranteed": 8, "limit": 8}]}}),
        ),
        team(
            json!({"metadata": {"name": "borrower"}, "spec": {"namespaces": ["borrower"],
            "quotas": [{"sharingPolicy": "a100-80gb", "guaranteed": 0, "limit": 32}]}}),
        ),
    ];
    state.namespaces = ["owner", "borrower"]
        .map(|n| {
            Arc::new(NamespaceInfo {
                name: n.into(),
                ..Default::default()
            })
        })
        .to_vec();
    let nodes = ["gpu-a-01", "gpu-a-02", "gpu-a-03", "gpu-a-04"];
    state.claims = (nodes.iter())
        .flat_map(|node| {
            (0..6).map(move |i| a100_claim("borrower", &format!("{node}-{i}"), 1, Some((node, i))))
        })
        .collect();
    state.claims.push(a100_claim("owner", "train", 8, None));
    state.pending = vec![teamgpu::core::state::PendingDemand {
        namespace: "owner".into(),
        device_class: "a100-80gb.teamgpu.io".into(),
        devices: 8,
        claims: vec![8],
        oldest: None,
    }];
    let planned = plan(&state);
    let orders: Vec<(&str, u32, &str)> = (planned.reclaims.iter())
        .map(|r| (r.borrower.as_str(), r.devices, r.for_team.as_str()))
        .collect();
    assert_eq!(orders, [("borrower", 8, "owner")]);
    let placement = &planned.placements[0];
    assert_eq!(placement.sharing_policy, "a100-80gb");
    assert_eq!(placement.unplaced["owner"], [8]);
    let free: Vec<u32> = placement.free.values().copied().collect();
    assert_eq!(free, [2, 2, 2, 2]);
    assert_eq!(
        placement.nodes.values().map(|n| &**n).collect::<Vec<_>>(),
        nodes
    );

    // gpu-a-04's claims end: that node has 8 free, the claim fits, nothing is reclaimed.
    (state.claims).retain(|c| !c.metadata.name.as_deref().unwrap().starts_with("gpu-a-04"));
    let planned = plan(&state);
    assert!(planned.reclaims.is_empty(), "{:?}", planned.reclaims);
    assert!(planned.placements.is_empty());
}
