//! Planning time at the scale: 100 teams, 1,000 namespaces, 20 sharing policies,
//! 5,000 ResourceSlices (40,000 devices), 10,000 claims. The CEL matching of devices against the
//! sharing policies' class expressions is measured on its own, and so is what the operator pays per
//! event: its kept planner and differ taking in one change.
//!
//! `cargo bench -p teamgpu --bench plan`; with `TEAMGPU_BENCH_COUNTER_SETS=1` every GPU draws on
//! a counter set of its own (as the NVIDIA driver publishes GPUs with dynamic MIG), and with
//! `=both` the same cluster is measured without and then with them in one run, then the two
//! alternately pass by pass (`=interleaved`: only that), so that what counting through shared
//! counters costs is compared on a machine in one state. `TEAMGPU_BENCH_DEPARTMENTS=interleaved`
//! compares the same way the flat cluster with its 100 teams in 10 departments.

use std::collections::BTreeMap;
use std::hint::black_box;
use std::sync::Arc;

use criterion::{Criterion, criterion_group, criterion_main};
use k8s_openapi::api::resource::v1::DeviceClass;
use kube::core::DynamicObject;
use teamgpu::core::diff::{Differ, Kind, LiveObject, LiveView};
use teamgpu::core::plan::inventory::{Inventory, SliceView};
use teamgpu::core::plan::usage::{ClaimView, Names};
use teamgpu::core::plan::{Planner, cel, pending, plan};
use teamgpu::core::state::{ClusterState, Delta};
use teamgpu::dra_cel::{CompiledExpressions, DeviceReads};
use teamgpu_synthetic::{Scale, synthetic};

fn bench(c: &mut Criterion) {
    // Departments against the flat cluster: the interleaved comparison only.
    if std::env::var("TEAMGPU_BENCH_DEPARTMENTS").as_deref() == Ok("interleaved") {
        let tree = Scale {
            departments: 10,
            ..Scale::BENCHMARK
        };
        // Every team is planned inside its department (what the comparison is about).
        let planned = plan(&synthetic(tree).expect("synthetic cluster"));
        let inside = (planned.teams.iter())
            .filter(|t| (t.quotas.iter()).all(|q| q.explanation.contains("within department")))
            .count();
        assert_eq!(inside, 100, "teams planned inside their department");
        interleaved(["flat", "in 10 departments"], [Scale::BENCHMARK, tree]);
        return;
    }
    let counters = Scale {
        counter_sets: true,
        ..Scale::BENCHMARK
    };
    let compared = ["without counter sets", "with"];
    let variants: &[bool] = match std::env::var("TEAMGPU_BENCH_COUNTER_SETS").as_deref() {
        Ok("both") => &[false, true],
        // Only the interleaved comparison.
        Ok("interleaved") => {
            interleaved(compared, [Scale::BENCHMARK, counters]);
            return;
        }
        Ok(_) => &[true],
        Err(_) => &[false],
    };
    for &counter_sets in variants {
        bench_cluster(c, counter_sets);
    }
    if variants.len() == 2 {
        interleaved(compared, [Scale::BENCHMARK, counters]);
    }
}

/// The cluster of the benchmark as the operator's caches hold it, and the changes its passes
/// take in.
struct Setup {
    state: ClusterState,
    cached: Cached,
    /// (what, the state after it, its caches, which cache it touched).
    changes: Vec<(&'static str, ClusterState, Cached, Watched)>,
    live: Live,
}

fn setup(scale: Scale) -> Setup {
    let mut state = synthetic(scale).expect("synthetic cluster");
    for s in &mut state.slices {
        s.metadata.resource_version = Some("1".into());
    }
    for c in &mut state.claims {
        c.metadata.resource_version = Some("1".into());
    }
    let mut caches = Caches::default();
    let cached = caches.of(&state);
    let changes = changes(&state)
        .into_iter()
        .map(|(what, changed, watched)| {
            let changed_caches = caches.of(&changed);
            (what, changed, changed_caches, watched)
        })
        .collect();
    let live = Live::of(&plan(&state));
    Setup {
        state,
        cached,
        changes,
        live,
    }
}

/// Passes of each cluster for the whole-cluster figures (first pass, full plan): a 2-core VM's
/// speed drifts by some percent over seconds, and the medians of fewer wander as much.
const FULL_PASSES: usize = 30;

/// What the second of two clusters (`names`) costs the operator against the first (counter
/// sets, departments), measured alternately (one pass of each, again and again), so that a
/// machine whose speed drifts (a shared VM) slows both alike: the median of each and their
/// ratio.
fn interleaved(names: [&str; 2], scales: [Scale; 2]) {
    use std::time::{Duration, Instant};
    let setups = scales.map(setup);
    let median = |mut d: Vec<Duration>| {
        d.sort();
        d[d.len() / 2]
    };
    let report = |what: &str, times: [Vec<Duration>; 2]| {
        let [before, after] = times.map(median);
        println!(
            "interleaved {what}: {before:.2?} {}, {after:.2?} {} ({:.2}x)",
            names[0],
            names[1],
            after.as_secs_f64() / before.as_secs_f64()
        );
    };
    for change in 0..setups[0].changes.len() {
        let mut kept: Vec<(Planner, Differ)> = (setups.iter())
            .map(|s| started(&s.state, &s.cached, s.live.objects()))
            .collect();
        let mut times: [Vec<Duration>; 2] = [Vec::new(), Vec::new()];
        for round in 0..60 {
            for (i, s) in setups.iter().enumerate() {
                let (what, changed, changed_caches, watched) = &s.changes[change];
                let _ = what;
                let (now, caches) = if round % 2 == 0 {
                    (changed, changed_caches)
                } else {
                    (&s.state, &s.cached)
                };
                let (planner, differ) = &mut kept[i];
                let started = Instant::now();
                black_box(pass(planner, differ, now, caches, *watched));
                times[i].push(started.elapsed());
            }
        }
        report(setups[0].changes[change].0, times);
    }
    let mut times: [Vec<Duration>; 2] = [Vec::new(), Vec::new()];
    for _ in 0..FULL_PASSES {
        for (i, s) in setups.iter().enumerate() {
            let started_at = Instant::now();
            black_box(started(&s.state, &s.cached, s.live.objects()));
            times[i].push(started_at.elapsed());
        }
    }
    report("first pass of a started operator", times);
    let mut times: [Vec<Duration>; 2] = [Vec::new(), Vec::new()];
    for _ in 0..FULL_PASSES {
        for (i, s) in setups.iter().enumerate() {
            let started_at = Instant::now();
            black_box(plan(&s.state));
            times[i].push(started_at.elapsed());
        }
    }
    report("full plan", times);
}

fn bench_cluster(c: &mut Criterion, counter_sets: bool) {
    let state = synthetic(Scale {
        counter_sets,
        ..Scale::BENCHMARK
    })
    .expect("synthetic cluster");
    let suffix = if counter_sets { " (counter sets)" } else { "" };
    assert_eq!(state.slices.len(), 5_000);
    let sets: BTreeMap<String, CompiledExpressions> = state
        .sharing_policies
        .iter()
        .map(|p| {
            let exprs = cel::class_expressions(&p.spec);
            (
                p.metadata.name.clone().unwrap_or_default(),
                CompiledExpressions::compile(&exprs).expect("the expressions compile"),
            )
        })
        .collect();
    let inventory = Inventory::from_slices(&state.slices);
    let report = inventory.match_sets(&sets);
    assert_eq!(
        report.counts.values().sum::<u32>(),
        40_000,
        "every device matches one policy"
    );

    let mut group = c.benchmark_group(format!("plan{suffix}"));
    group.sample_size(10);
    group.bench_function(
        "full plan (inventory + CEL matching + everything else)",
        |b| b.iter(|| plan(black_box(&state))),
    );
    group.bench_function("inventory from 5,000 slices", |b| {
        b.iter(|| Inventory::from_slices(black_box(&state.slices)))
    });
    group.bench_function(
        "CEL matching: 20 policies x 40,000 devices (fresh selectors)",
        |b| {
            b.iter_batched(
                || {
                    state
                        .sharing_policies
                        .iter()
                        .map(|p| {
                            let exprs = cel::class_expressions(&p.spec);
                            (
                                p.metadata.name.clone().unwrap_or_default(),
                                CompiledExpressions::compile(&exprs).unwrap(),
                            )
                        })
                        .collect::<BTreeMap<_, _>>()
                },
                |sets| inventory.match_sets(black_box(&sets)),
                criterion::BatchSize::LargeInput,
            )
        },
    );
    group.finish();

    // What the operator pays per event: its kept planner and differ (operator/src/controller)
    // after one change, alternating between the state before and after it, so every iteration
    // is one change to take in.
    let mut events = c.benchmark_group(format!("operator pass{suffix}"));
    events.sample_size(20);
    // Objects from the API server carry resourceVersions, which the planner tells them apart by.
    let mut state = state;
    for s in &mut state.slices {
        s.metadata.resource_version = Some("1".into());
    }
    for c in &mut state.claims {
        c.metadata.resource_version = Some("1".into());
    }
    let changes = changes(&state);

    let converged = plan(&state);
    let live = Live::of(&converged);
    // The watch caches of each state, projected as `teamgpu run` keeps them (by the watches,
    // not by the pass).
    let mut caches = Caches::default();
    let cached = caches.of(&state);
    for (what, changed, watched) in &changes {
        let (mut planner, mut differ) = started(&state, &cached, live.objects());
        let changed_caches = caches.of(changed);
        let mut flip = false;
        events.bench_function(*what, |b| {
            b.iter(|| {
                flip = !flip;
                let (now, now_caches) = if flip {
                    (changed, &changed_caches)
                } else {
                    (&state, &cached)
                };
                pass(&mut planner, &mut differ, now, now_caches, *watched)
            })
        });
    }
    // As the operator takes them in: the watch caches' projections.
    let mut planner = Planner::default();
    planner.update_slice_views(Delta::All(&cached.slices), &cached.reads);
    events.bench_function("take in 5,000 ResourceSlices, none changed", |b| {
        b.iter(|| planner.update_slice_views(Delta::All(black_box(&cached.slices)), &cached.reads))
    });
    planner.update_claim_views(Delta::All(&cached.claims));
    events.bench_function("take in 10,000 ResourceClaims, none changed", |b| {
        b.iter(|| planner.update_claim_views(Delta::All(black_box(&cached.claims))))
    });
    // The quota controller updated one quota's status (a claim was made): its watch hands the
    // differ that quota, as the operator does, or (before) every quota of the cache.
    let quota_objects: Vec<&DynamicObject> = (live.owned.iter())
        .filter(|(kind, _)| *kind == Kind::ResourceQuota)
        .map(|(_, o)| &**o)
        .collect();
    let quotas: Vec<Arc<LiveView>> = (quota_objects.iter())
        .map(|o| Arc::new(LiveView::new(Kind::ResourceQuota, o)))
        .collect();
    let mut updated = quota_objects[0].clone();
    updated.metadata.resource_version = Some("2".into());
    let versions = [
        quotas[0].clone(),
        Arc::new(LiveView::new(Kind::ResourceQuota, &updated)),
    ];
    let (_, mut differ) = started(&state, &cached, live.objects());
    let mut flip = 0;
    events.bench_function("take in one quota's status update, whole cache", |b| {
        b.iter(|| {
            flip ^= 1;
            let all = (quotas.iter().skip(1).cloned())
                .chain([versions[flip].clone()])
                .map(LiveObject::Owned);
            differ.update_live(Kind::ResourceQuota, all)
        })
    });
    events.bench_function("take in one quota's status update, what changed", |b| {
        b.iter(|| {
            flip ^= 1;
            let changed = Delta::Changed {
                upserted: &versions[flip..=flip],
                removed: &[],
            };
            differ.update_owned(Kind::ResourceQuota, changed)
        })
    });
    bench_engine_take_in(&mut events);
    // Pending demand, read at every pass while a Pod is Pending anywhere: one Pod's claim
    // found among the planner's, or (before) every claim copied and indexed by name first.
    let (planner, _) = started(&state, &cached, live.objects());
    let claim = &state.claims[0];
    let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "waits", "namespace": claim.metadata.namespace},
        "spec": {"containers": [], "resourceClaims": [{"name": "gpu", "resourceClaimName": claim.metadata.name}]},
        "status": {"phase": "Pending"}
    }))
    .unwrap();
    let pod = pending::PendingPodView::project(&pod);
    let none = |_: &str, _: &str| None;
    events.bench_function(
        "pending demand of one Pending Pod, its claim looked up",
        |b| b.iter(|| pending::pending_demand(&[&pod], |ns, n| planner.claim(ns, n), none)),
    );
    events.bench_function(
        "pending demand of one Pending Pod, every claim indexed (before)",
        |b| {
            b.iter(|| {
                let all = planner.claim_views();
                let all: Vec<&ClaimView> = all.iter().map(|c| &**c).collect();
                pending::pending_demand(&[&pod], pending::by_name(&all), none)
            })
        },
    );
    events.bench_function("first pass of a started operator", |b| {
        b.iter_batched(
            || live.objects(),
            |objects| started(&state, &cached, objects),
            criterion::BatchSize::LargeInput,
        )
    });
    events.finish();
}

/// What the engine pays for one Pod's event at 10,000 Pods not done yet (the Pod watch of
/// every Pod reclaim may weigh), and for one namespace's at 10,000 namespaces: that object
/// (what changed), or every one (a resync; how they were handed before).
fn bench_engine_take_in(events: &mut criterion::BenchmarkGroup<criterion::measurement::WallTime>) {
    use teamgpu::core::effects::{PodView, ReclaimDefaults};
    use teamgpu::core::engine::{Engine, Input, Settings};
    use teamgpu::core::state::Taken;
    let mut names = Names::default();
    let pods: Vec<Arc<PodView>> = (0..10_000)
        .map(|i| {
            let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
                "metadata": {"name": format!("job-{i}-0"), "namespace": format!("team-{}", i % 1_000),
                             "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job",
                                 "name": format!("job-{i}"), "uid": format!("u{i}"), "controller": true}]},
                "spec": {"containers": [{"name": "c"}], "priority": 100},
                "status": {"phase": "Running", "startTime": "2026-12-05T10:00:00Z"}
            }))
            .unwrap();
            Arc::new(PodView::project(&pod, &mut names))
        })
        .collect();
    let mut engine = Engine::new(Settings {
        operator_user: "system:serviceaccount:teamgpu-system:teamgpu".into(),
        admin_groups: None,
        enforcement: teamgpu::core::plan::admission::Enforcement::Deny,
        reclaim: ReclaimDefaults {
            enabled: false,
            grace: std::time::Duration::from_secs(120),
            min_runtime: std::time::Duration::ZERO,
        },
        writes_per_batch: teamgpu::core::engine::WRITES_PER_BATCH,
    });
    engine.take_in(Input::Pods(Taken::All(pods.clone())));
    events.bench_function("take in one Pod's change of 10,000 Pods", |b| {
        b.iter(|| {
            let changed = Taken::Changed {
                upserted: vec![pods[4_321].clone()],
                removed: Vec::new(),
            };
            engine.take_in(Input::Pods(black_box(changed)))
        })
    });
    events.bench_function("take in 10,000 Pods whole (a resync)", |b| {
        b.iter(|| engine.take_in(Input::Pods(Taken::All(black_box(pods.clone())))))
    });

    use teamgpu::core::state::{NamespaceInfo, NamespaceView};
    let namespace = |i: usize, cost_center: usize| {
        let labels = [
            ("teamgpu.io/team", format!("team-{}", i / 100)),
            ("cost-center", cost_center.to_string()),
        ];
        Arc::new(NamespaceView {
            info: Arc::new(NamespaceInfo {
                name: format!("team-{}-ns-{i}", i / 100),
                labels: labels.map(|(k, v)| (k.to_owned(), v)).into(),
            }),
            terminating: false,
        })
    };
    let namespaces: Vec<Arc<NamespaceView>> = (0..10_000).map(|i| namespace(i, 0)).collect();
    engine.take_in(Input::Namespaces(Taken::All(namespaces.clone())));
    let relabelled = [namespace(4_321, 1), namespace(4_321, 2)];
    let mut flip = 0;
    events.bench_function("take in one namespace's change of 10,000 namespaces", |b| {
        b.iter(|| {
            flip ^= 1;
            let changed = Taken::Changed {
                upserted: vec![relabelled[flip].clone()],
                removed: Vec::new(),
            };
            engine.take_in(Input::Namespaces(black_box(changed)))
        })
    });
    events.bench_function("take in 10,000 namespaces whole (a resync)", |b| {
        b.iter(|| engine.take_in(Input::Namespaces(Taken::All(black_box(namespaces.clone())))))
    });
}

/// The changes the passes take in, each with the state after it and the cache it touched:
/// the operator takes in only the caches whose watch saw an event.
fn changes(state: &ClusterState) -> Vec<(&'static str, ClusterState, Watched)> {
    let mut changes: Vec<(&str, ClusterState, Watched)> = Vec::new();
    let mut claim = state.clone();
    claim.claims[0].status = None;
    claim.claims[0].metadata.resource_version = Some("changed".into());
    changes.push(("one claim changed", claim, Watched::Claims));
    let mut slice = state.clone();
    if let Some(d) = slice.slices[0].spec.devices.iter_mut().flatten().next() {
        d.taints = Some(vec![k8s_openapi::api::resource::v1::DeviceTaint {
            key: "gpu.nvidia.com/xid".into(),
            effect: "NoSchedule".into(),
            value: None,
            time_added: None,
        }]);
    }
    slice.slices[0].metadata.resource_version = Some("changed".into());
    changes.push(("one ResourceSlice changed", slice, Watched::Slices));
    let mut relabelled = state.clone();
    let moved = relabelled
        .namespaces
        .iter_mut()
        .find(|n| n.labels.contains_key("teamgpu.io/team"))
        .expect("a team namespace");
    std::sync::Arc::make_mut(moved)
        .labels
        .insert("teamgpu.io/team".into(), "team-0".into());
    changes.push((
        "one namespace moved to another team",
        relabelled,
        Watched::Other,
    ));
    changes.push(("nothing changed (resync)", state.clone(), Watched::Other));
    changes
}

/// Converged live objects, as the operator's watch caches hold them.
struct Live {
    classes: Vec<Arc<DeviceClass>>,
    owned: Vec<(Kind, Arc<DynamicObject>)>,
}

impl Live {
    fn of(plan: &teamgpu::core::plan::Plan) -> Live {
        let versioned = |mut v: serde_json::Value| {
            v["metadata"]["resourceVersion"] = "1".into();
            v
        };
        let classes = plan
            .objects
            .device_classes
            .iter()
            .map(|c| serde_json::from_value(versioned(serde_json::to_value(c).unwrap())).unwrap())
            .collect();
        let owned = teamgpu::core::diff::desired(&plan.objects)
            .into_iter()
            .filter(|(k, _)| k.kind != Kind::DeviceClass)
            .map(|(k, v)| (k.kind, serde_json::from_value(versioned(v)).unwrap()))
            .collect();
        Live { classes, owned }
    }

    /// The live objects as the watches hand them to the differ (made by the watches, not by
    /// the pass).
    fn objects(&self) -> Vec<LiveObject> {
        self.classes
            .iter()
            .cloned()
            .map(LiveObject::DeviceClass)
            .chain(self.owned.iter().map(|(k, o)| LiveObject::owned(*k, o)))
            .collect()
    }
}

/// The slices and claims of a state, as the operator's watch caches keep them.
#[derive(Default)]
struct Caches {
    envs: teamgpu::core::plan::inventory::SliceValues,
    names: Names,
}

struct Cached {
    reads: DeviceReads,
    slices: Vec<Arc<SliceView>>,
    claims: Vec<Arc<ClaimView>>,
}

impl Caches {
    fn of(&mut self, state: &ClusterState) -> Cached {
        let reads = teamgpu::core::plan::device_reads(state);
        Cached {
            slices: state
                .slices
                .iter()
                .map(|s| Arc::new(SliceView::project(s, &reads, &mut self.envs)))
                .collect(),
            claims: state
                .claims
                .iter()
                .map(|c| Arc::new(ClaimView::project(c, &mut self.names)))
                .collect(),
            reads,
        }
    }
}

/// Which of the big caches a change touched.
#[derive(Clone, Copy, PartialEq)]
enum Watched {
    Slices,
    Claims,
    Other,
}

/// One pass of the operator's reconciler, without the API calls: take in what the changed
/// cache says changed (the first slice or claim: each change of `changes` is to that one; the
/// live objects did not change), plan, diff. Returns the number of writes.
fn pass(
    planner: &mut Planner,
    differ: &mut Differ,
    state: &ClusterState,
    cached: &Cached,
    watched: Watched,
) -> usize {
    if watched == Watched::Slices {
        let changed = Delta::Changed {
            upserted: &cached.slices[..1],
            removed: &[],
        };
        planner.update_slice_views(changed, &cached.reads);
    }
    if watched == Watched::Claims {
        let changed = Delta::Changed {
            upserted: &cached.claims[..1],
            removed: &[],
        };
        planner.update_claim_views(changed);
    }
    let plan = planner.plan(state);
    differ.writes(&plan.objects).len()
}

/// The operator's first pass, when every cache is new.
fn started(state: &ClusterState, cached: &Cached, live: Vec<LiveObject>) -> (Planner, Differ) {
    let mut planner = Planner::default();
    let mut differ = Differ::default();
    for kind in Kind::ALL {
        differ.update_live(kind, live.iter().filter(|o| o.kind() == kind).cloned());
    }
    planner.update_slice_views(Delta::All(&cached.slices), &cached.reads);
    planner.update_claim_views(Delta::All(&cached.claims));
    let writes = pass(&mut planner, &mut differ, state, cached, Watched::Other);
    assert_eq!(writes, 0, "the live objects are the plan's");
    (planner, differ)
}

criterion_group!(benches, bench);
criterion_main!(benches);
