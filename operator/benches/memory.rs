//! What the operator keeps in memory besides its watch caches, at the plan benchmark's scale
//! (100 teams, 1,000 namespaces, 20 sharing policies, 5,000 ResourceSlices / 40,000 devices,
//! 10,000 claims): the planner (inventory, matching, usage, fair shares, namespace objects) and
//! the differ (which shares the planner's objects and the caches' objects rather than copying
//! them). Measured as the growth of the resident set (Linux), so figures are approximate.
//!
//! `cargo bench -p teamgpu --bench memory` (docs/sizing.md); another scale with
//! `cargo bench -p teamgpu --bench memory -- TEAMS NAMESPACES-PER-TEAM SHARING-POLICIES NODES CLAIMS`.

use std::sync::Arc;

use kube::core::DynamicObject;
use teamgpu::core::diff::{Differ, Kind, LiveObject};
use teamgpu::core::plan::Planner;
use teamgpu::core::plan::inventory::SliceValues;
use teamgpu::core::plan::inventory::SliceView;
use teamgpu::core::plan::usage::{ClaimView, Names};
use teamgpu::core::state::Delta;
use teamgpu_synthetic::{Scale, synthetic};

/// Resident memory of this process (Linux `/proc/self/statm`), 0 where it cannot be read.
fn held() -> isize {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<isize>().ok())
        .map_or(0, |pages| pages * 4096)
}

fn mib(bytes: isize) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

/// The peak resident set of this process so far (Linux `VmHWM`), 0 where it cannot be read.
fn peak() -> isize {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
            line.split_whitespace().nth(1)?.parse::<isize>().ok()
        })
        .map_or(0, |kib| kib * 1024)
}

/// The benchmark scale, or the one given as five numbers (cargo adds `--bench`, which is skipped).
fn scale() -> Scale {
    let numbers: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    match numbers[..] {
        [teams, namespaces_per_team, sharing_policies, nodes, claims] => Scale {
            teams,
            namespaces_per_team,
            sharing_policies,
            nodes,
            claims,
            counter_sets: false,
            departments: 0,
        },
        [] => Scale::BENCHMARK,
        _ => panic!(
            "give no scale or all of TEAMS NAMESPACES-PER-TEAM SHARING-POLICIES NODES CLAIMS"
        ),
    }
}

fn main() {
    let scale = scale();
    println!(
        "scale: {} teams, {} namespaces, {} sharing policies, {} nodes, {} claims",
        scale.teams,
        scale.teams * scale.namespaces_per_team,
        scale.sharing_policies,
        scale.nodes,
        scale.claims
    );
    let before = held();
    let mut state = synthetic(scale).expect("synthetic cluster");
    for s in &mut state.slices {
        s.metadata.resource_version = Some("1".into());
    }
    for c in &mut state.claims {
        c.metadata.resource_version = Some("1".into());
    }
    let input = held() - before;

    // The watch caches, as `teamgpu run` keeps them: slices reduced to what the class
    // expressions read, claims to what the planner reads.
    let before = held();
    let reads = teamgpu::core::plan::device_reads(&state);
    let mut envs = SliceValues::default();
    let slices: Vec<Arc<SliceView>> = state
        .slices
        .iter()
        .map(|s| Arc::new(SliceView::project(s, &reads, &mut envs)))
        .collect();
    let mut names = Names::default();
    let claims: Vec<Arc<ClaimView>> = state
        .claims
        .iter()
        .map(|c| Arc::new(ClaimView::project(c, &mut names)))
        .collect();
    let caches_held = held() - before;

    let before = held();
    let mut planner = Planner::default();
    planner.update_slice_views(Delta::All(&slices), &reads);
    let inventory_held = held() - before;
    planner.update_claim_views(Delta::All(&claims));
    let plan = planner.plan(&state);
    let objects = plan.objects.clone();
    drop(plan);
    let planner_held = held() - before;

    // The live objects, as the watch caches hold them (converged: equal to the plan), each
    // made from the object the watch brings (parsed from its JSON text) and that object
    // dropped, and the differ. The text is made first, outside what is measured.
    let texts: Vec<(Kind, String)> = teamgpu::core::diff::desired(&objects)
        .into_iter()
        .filter(|(k, _)| k.kind != Kind::DeviceClass)
        .map(|(k, mut v)| {
            v["metadata"]["resourceVersion"] = "1".into();
            (k.kind, v.to_string())
        })
        .collect();
    let before = held();
    let live: Vec<LiveObject> = texts
        .iter()
        .map(|(kind, text)| {
            let object: DynamicObject = serde_json::from_str(text).expect("object");
            LiveObject::owned(*kind, &object)
        })
        .collect();
    let mut differ = Differ::default();
    for kind in Kind::ALL.into_iter().filter(|k| *k != Kind::DeviceClass) {
        differ.update_live(kind, live.iter().filter(|o| o.kind() == kind).cloned());
    }
    let writes = differ.writes(&objects);
    drop(writes);
    let differ_held = held() - before;

    println!(
        "cluster state as plain data (policies, namespaces, {} slices, {} claims): {}",
        state.slices.len(),
        state.claims.len(),
        mib(input)
    );
    println!(
        "watch caches of slices and claims, projected ({} distinct device environments, \
         keeping {}): {}",
        envs.envs.len(),
        reads.describe(),
        mib(caches_held)
    );
    println!(
        "kept planner after its first plan ({} desired objects): {}, of which the device \
         inventory ({} devices) {}",
        objects.claim_templates.len() + objects.resource_quotas.len(),
        mib(planner_held),
        planner.inventory().device_count(),
        mib(inventory_held)
    );
    println!(
        "live objects as the watches keep them, and the differ, after its first pass ({} \
         objects): {}",
        live.len(),
        mib(differ_held)
    );
    println!("peak resident set of the whole process: {}", mib(peak()));
}
