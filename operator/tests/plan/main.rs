//! The planning core end to end: from cluster state to objects and statuses, on the built-in
//! example (config/samples on six nodes shaped like the NVIDIA driver's ResourceSlice).

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim};
use serde_json::json;
use teamgpu::api::{GpuSharingPolicy, TeamGpuPolicy};
use teamgpu::core::plan::{Plan, plan};
use teamgpu::core::state::{ClusterState, NamespaceInfo};

mod counters;
mod departments;
mod objects;
mod slices;

fn example() -> ClusterState {
    teamgpu::cli::example::state().expect("the built-in example loads")
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

/// The ResourceSlices of a multi-document fixture.
fn fixture_slices(fixture: &str) -> Vec<k8s_openapi::api::resource::v1::ResourceSlice> {
    fixture
        .split("\n---\n")
        .filter(|doc| doc.contains("kind: ResourceSlice"))
        .map(|doc| serde_saphyr::from_str(doc).expect("slice"))
        .collect()
}

fn policy(yaml: serde_json::Value) -> GpuSharingPolicy {
    serde_json::from_value(yaml).unwrap()
}

fn team(yaml: serde_json::Value) -> TeamGpuPolicy {
    serde_json::from_value(yaml).unwrap()
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
    /// A DeviceTaintRule on a slice's pool, one device of it or all (or its removal: `None`),
    /// or a Pod's report that a device is unhealthy, as the operator reads them.
    ExtraTaint(usize, Option<Option<usize>>),
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
        (
            0..64usize,
            proptest::option::of(proptest::option::of(0..8usize))
        )
            .prop_map(|(s, d)| Change::ExtraTaint(s, d)),
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
                    q.guaranteed = (*g).into();
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
                    charged: Vec::new(),
                    oldest: None,
                }];
            }
        }
        Change::ExtraTaint(n, device) => {
            let Some(i) = pick(*n, state.slices.len()) else {
                return;
            };
            let slice = &state.slices[i];
            match device {
                None => {
                    state.device_taints.pop();
                }
                Some(device) => {
                    let name = device
                        .and_then(|d| Some(slice.spec.devices.as_ref()?.get(d)?.name.clone()));
                    state
                        .device_taints
                        .push(teamgpu::core::plan::inventory::ExtraTaint {
                            driver: Some(slice.spec.driver.clone()),
                            pool: Some(slice.spec.pool.name.clone()),
                            device: name,
                            key: "example.com/maintenance".into(),
                        });
                }
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
    // The regressions beside this file (tests/plan/main.proptest-regressions): the default
    // would look for a `main.rs` folder and share one file with every other test folder.
    #![proptest_config(proptest::prelude::ProptestConfig {
        cases: 64,
        failure_persistence: Some(Box::new(
            proptest::test_runner::FileFailurePersistence::WithSource("proptest-regressions"),
        )),
        ..proptest::prelude::ProptestConfig::default()
    })]

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
        let mut envs = teamgpu::core::plan::inventory::SliceValues::default();
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
    // As without it: 2 in use and 4 lent, the lowest holdings per weight first (2 at weight 1,
    // against inference's 12 at 3 and ml-research's 12 at 2).
    assert_eq!(
        hard(&plan, "data-science")["a100-80gb.teamgpu.io.deviceclass.resource.k8s.io/devices"],
        "6"
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

/// The example's four 8-GPU A100 80GB nodes; a borrower (guarantee 0) holds 6 one-GPU claims
/// on each (24), so 8 are free, 2 per node; the owner (guarantee 8, limit `owner_limit`) has
/// made one claim of 8, not allocated, which fits no node. What its Pods wait for is the
/// caller's to say.
fn an_owner_whose_claim_fits_no_node(owner_limit: u32) -> ClusterState {
    let mut state = example();
    state.teams = vec![
        team(
            json!({"metadata": {"name": "owner"}, "spec": {"namespaces": ["owner"],
            "quotas": [{"sharingPolicy": "a100-80gb", "guaranteed": 8, "limit": owner_limit}]}}),
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
    state.claims = (NODES.iter())
        .flat_map(|node| {
            (0..6).map(move |i| a100_claim("borrower", &format!("{node}-{i}"), 1, Some((node, i))))
        })
        .collect();
    state.claims.push(a100_claim("owner", "train", 8, None));
    state
}

/// The example's A100 80GB nodes.
const NODES: [&str; 4] = ["gpu-a-01", "gpu-a-02", "gpu-a-03", "gpu-a-04"];

#[test]
fn a_claim_that_fits_no_node_is_reclaimed_for_though_the_pool_counts_enough_free() {
    let mut state = an_owner_whose_claim_fits_no_node(8);
    let nodes = NODES;
    state.pending = vec![teamgpu::core::state::PendingDemand {
        namespace: "owner".into(),
        device_class: "a100-80gb.teamgpu.io".into(),
        devices: 8,
        claims: vec![8],
        charged: Vec::new(),
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

#[test]
fn the_devices_of_a_claim_that_fits_no_node_leave_room_in_its_teams_quota() {
    // The owner's 8-GPU claim waits charged; beside it a 2-GPU Pod waits, its claim refused.
    // Counted as used, the claim's 8 filled the owner's quota (8): the 2-GPU Pod waited below
    // the guarantee beside 8 free devices. Its Pods may use them: the quota has room for it.
    let mut state = an_owner_whose_claim_fits_no_node(16);
    let waiting = |charged: Vec<u32>| teamgpu::core::state::PendingDemand {
        namespace: "owner".into(),
        device_class: "a100-80gb.teamgpu.io".into(),
        devices: 10,
        claims: vec![8, 2],
        charged,
        oldest: None,
    };
    let key = "a100-80gb.teamgpu.io.deviceclass.resource.k8s.io/devices";
    state.pending = vec![waiting(Vec::new())];
    assert_eq!(hard(&plan(&state), "owner")[key], "8");
    state.pending = vec![waiting(vec![8])];
    let planned = plan(&state);
    assert_eq!(hard(&planned, "owner")[key], "10");
    // Room on a node for the 8-GPU claim is still ordered from the borrower.
    let orders: Vec<(&str, u32, &str)> = (planned.reclaims.iter())
        .map(|r| (r.borrower.as_str(), r.devices, r.for_team.as_str()))
        .collect();
    assert_eq!(orders, [("borrower", 8, "owner")]);

    // The borrower waits too, for a 4-GPU and a 1-GPU Pod: of the 8 the owner's claim is
    // charged it may use none.
    let mut both = state.clone();
    both.pending.push(teamgpu::core::state::PendingDemand {
        namespace: "borrower".into(),
        devices: 5,
        claims: vec![4, 1],
        charged: Vec::new(),
        ..waiting(Vec::new())
    });
    let planned = plan(&both);
    assert_eq!(hard(&planned, "owner")[key], "10");
    assert_eq!(hard(&planned, "borrower")[key], "24");

    // A node's claims end: the claim fits it, so its 8 are nobody's to reuse. Idle are the 6
    // nobody is charged for (32 - 18 - 8): the owner borrows the 2 its Pod waits for first,
    // then the other 4 as well: at the same weight it holds 10 against the borrower's 18.
    (state.claims).retain(|c| !c.metadata.name.as_deref().unwrap().starts_with("gpu-a-04"));
    let planned = plan(&state);
    assert_eq!(hard(&planned, "owner")[key], "14");
    assert!(planned.reclaims.is_empty(), "{:?}", planned.reclaims);
}
