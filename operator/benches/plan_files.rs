//! `teamgpu plan -f` on a dump of a mid-sized cluster: the config/samples policies and
//! `kubectl get resourceslices -o yaml` (and `-o json`) of 5,000 8-GPU nodes shaped like the
//! NVIDIA DRA driver's (40,000 devices): reading the text, checking the policies, planning.
//!
//! `cargo bench -p teamgpu --bench plan_files`

use std::hint::black_box;
use std::path::Path;

use criterion::{Criterion, criterion_group, criterion_main};
use serde_json::{Value, json};
use teamgpu::cli::input::{Limits, Loaded};

const SAMPLES: [&str; 5] = [
    include_str!("../../config/samples/gpusharingpolicy-a100-80gb.yaml"),
    include_str!("../../config/samples/gpusharingpolicy-a100-shared.yaml"),
    include_str!("../../config/samples/teamgpupolicy-ml-research.yaml"),
    include_str!("../../config/samples/teamgpupolicy-inference.yaml"),
    include_str!("../../config/samples/teamgpupolicy-data-science.yaml"),
];

/// The List of `nodes` copies of the example's 8-GPU node, each its own node and pool.
fn dump(nodes: usize) -> Value {
    let template: Value = serde_saphyr::from_str(teamgpu::cli::example::NODE_SLICE_YAML).unwrap();
    let items: Vec<Value> = (0..nodes)
        .map(|i| {
            let node = format!("gpu-{i:05}");
            let mut slice = template.clone();
            slice["metadata"] = json!({"name": format!("{node}-gpu.nvidia.com-x")});
            slice["spec"]["nodeName"] = node.clone().into();
            slice["spec"]["pool"]["name"] = node.into();
            slice
        })
        .collect();
    json!({"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": ""}, "items": items})
}

/// What `teamgpu plan -f config/samples -f cluster.EXT` does: read, check, plan.
fn read_and_plan(file: &str, dump: &str) -> usize {
    let mut loaded = Loaded::default();
    let limits = Limits::default();
    for sample in SAMPLES {
        loaded.add_text(Path::new("sample.yaml"), sample, &limits);
    }
    loaded.add_text(Path::new(file), dump, &limits);
    assert!(loaded.errors.is_empty(), "{:?}", loaded.errors);
    assert_eq!(loaded.state.slices.len(), 5_000);
    teamgpu::core::plan::plan(&loaded.state)
        .sharing_policies
        .len()
}

fn bench(c: &mut Criterion) {
    let list = dump(5_000);
    let yaml = serde_saphyr::to_string(&list).unwrap();
    let json = serde_json::to_string_pretty(&list).unwrap();
    drop(list);
    println!(
        "the dump: {:.1} MB as YAML, {:.1} MB as JSON",
        yaml.len() as f64 / 1e6,
        json.len() as f64 / 1e6
    );
    let mut group = c.benchmark_group("plan -f");
    group.sample_size(10);
    group.bench_function("5,000 ResourceSlices as YAML: read, check, plan", |b| {
        b.iter(|| read_and_plan("cluster.yaml", black_box(&yaml)))
    });
    group.bench_function("5,000 ResourceSlices as JSON: read, check, plan", |b| {
        b.iter(|| read_and_plan("cluster.json", black_box(&json)))
    });
    let limits = Limits::default();
    group.bench_function("5,000 ResourceSlices as YAML: parse only", |b| {
        b.iter(|| {
            teamgpu::cli::input::documents(Path::new("cluster.yaml"), black_box(&yaml), &limits)
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
