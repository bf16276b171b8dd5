//! Planning time at the scale: 100 teams, 1,000 namespaces, 20 sharing policies,
//! 5,000 ResourceSlices (40,000 devices), 10,000 claims. The CEL matching of devices against the
//! sharing policies' selectors is measured on its own, and so is the rest of the plan.
//!
//! `cargo bench -p teamgpu --bench plan`

use std::collections::BTreeMap;
use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use teamgpu::example::{Scale, synthetic};
use teamgpu::plan::device_cel::CompiledSelectors;
use teamgpu::plan::inventory::Inventory;
use teamgpu::plan::{MatchCache, plan, plan_cached, plan_with_inventory, selector};

fn bench(c: &mut Criterion) {
    let state = synthetic(Scale::BENCHMARK).expect("synthetic cluster");
    assert_eq!(state.slices.len(), 5_000);
    let sets: BTreeMap<String, CompiledSelectors> = state
        .sharing_policies
        .iter()
        .map(|p| {
            let exprs = selector::device_class_selectors(&p.spec);
            (
                p.metadata.name.clone().unwrap_or_default(),
                CompiledSelectors::compile(&exprs).expect("selectors compile"),
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

    let mut group = c.benchmark_group("plan");
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
                            let exprs = selector::device_class_selectors(&p.spec);
                            (
                                p.metadata.name.clone().unwrap_or_default(),
                                CompiledSelectors::compile(&exprs).unwrap(),
                            )
                        })
                        .collect::<BTreeMap<_, _>>()
                },
                |sets| inventory.match_sets(black_box(&sets)),
                criterion::BatchSize::LargeInput,
            )
        },
    );
    group.bench_function("plan with a built inventory", |b| {
        b.iter(|| plan_with_inventory(black_box(&state), black_box(&inventory)))
    });
    // What the operator pays for a claim or namespace change: inventory and device matching
    // are cached until a ResourceSlice or a selector changes.
    let mut cache = MatchCache::default();
    cache.inventory_id = 1;
    plan_cached(&state, &inventory, &mut cache);
    group.bench_function(
        "plan after a claim change (inventory and matching cached)",
        |b| b.iter(|| plan_cached(black_box(&state), black_box(&inventory), &mut cache)),
    );
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
