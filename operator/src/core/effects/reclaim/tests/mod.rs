use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaim;
use proptest::prelude::*;
use serde_json::{Value, json};

use super::budgets::Overdrawn;
use super::kept::kept_by_budgets;
use super::victims::{Borrower, Choice, choose};
use super::workload::{PodView, Workload, WorkloadKey, workloads};
use super::*;
use crate::api::QuotaStatus;
use crate::core::effects::EventType;
use crate::core::plan::TeamReport;
use crate::core::plan::usage::Names;

const NOW: &str = "2026-06-01T12:00:00Z";
const CLASS: &str = "a.teamgpu.io";

fn at(s: &str) -> Timestamp {
    s.parse().unwrap()
}

/// A Pod of namespace `ns` as the API server stores it: `owner` is its controller as
/// (kind, name), `labels` its labels.
fn pod(ns: &str, name: &str, owner: Option<(&str, &str)>, labels: Value, extra: Value) -> Pod {
    let owners: Vec<Value> = owner
        .map(|(kind, owner)| {
            json!({"apiVersion": "batch/v1", "kind": kind, "name": owner, "uid": "u", "controller": true})
        })
        .into_iter()
        .collect();
    let mut pod = json!({
        "metadata": {"name": name, "namespace": ns, "labels": labels, "ownerReferences": owners,
                     "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {"containers": []},
        "status": {"phase": "Running", "startTime": "2026-01-01T00:00:00Z"}
    });
    merge(&mut pod, extra);
    serde_json::from_value(pod).unwrap()
}

fn merge(into: &mut Value, from: Value) {
    match (into, from) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                merge(a.entry(k).or_insert(Value::Null), v);
            }
        }
        (a, b) => *a = b,
    }
}

/// An allocated claim of `devices` devices of [`CLASS`] reserved for `pods`.
fn claim(ns: &str, name: &str, devices: usize, pods: &[&str]) -> Arc<ClaimView> {
    let results: Vec<_> = (0..devices)
        .map(|i| json!({"request": "gpu", "driver": "gpu.nvidia.com", "pool": "n", "device": format!("{name}-{i}")}))
        .collect();
    let reserved: Vec<_> = (pods.iter())
        .map(|p| json!({"resource": "pods", "name": p, "uid": format!("u-{p}")}))
        .collect();
    let claim: ResourceClaim = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": ns},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": CLASS, "count": devices}}]}},
        "status": {"allocation": {"devices": {"results": results}}, "reservedFor": reserved}
    }))
    .unwrap();
    Arc::new(ClaimView::project(&claim, &mut Names::default()))
}

fn views(pods: &[Pod]) -> Vec<Arc<PodView>> {
    let mut names = Names::default();
    (pods.iter())
        .map(|p| Arc::new(PodView::project(p, &mut names)))
        .collect()
}

mod nodes;
/// A workload with `devices` on each node of `on` (`None`: no node), with `priority`, started
/// at `started`.
fn workload(name: &str, on: &[(Option<&str>, u64)], priority: i32, started: &str) -> Workload {
    Workload {
        name: name.into(),
        label: None,
        pods: vec![(Arc::from("b"), Arc::from(name))],
        devices: on.iter().map(|(_, d)| d).sum(),
        nodes: on.iter().map(|(n, d)| (n.map(Arc::from), *d)).collect(),
        priority,
        priority_class: None,
        started: Some(at(started)),
        terminating: false,
        movable: true,
        evicted_before: 0,
        job: None,
    }
}

fn borrower(team: &str, owes: u64, above_guarantee: u64, workloads: Vec<Workload>) -> Borrower {
    Borrower {
        team: team.into(),
        owes,
        above_guarantee,
        workloads,
        queued: Vec::new(),
    }
}

/// Room above each borrower's guarantee once its workloads on their way out are counted.
fn room_left(borrowers: &[Borrower]) -> Vec<u64> {
    (borrowers.iter())
        .map(|x| {
            let leaving: u64 = (x.workloads.iter())
                .filter(|w| w.terminating)
                .map(|w| w.devices)
                .sum();
            x.above_guarantee.saturating_sub(leaving)
        })
        .collect()
}

mod kept;
mod moves;
mod queued;
mod tracker;
mod victims;
mod workloads;
