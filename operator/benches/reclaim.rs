//! Reclaim pass benchmark: what one pass of reclaim costs while a team waits below its
//! guarantee, with and without PodDisruptionBudgets.
//!
//! A borrower runs 10,000 one-Pod Jobs of 1 device each in 100 namespaces; the owner waits 2
//! devices short. "with budgets" adds, in each of the borrower's namespaces, a budget that
//! allows no disruption of half its Jobs (`tier=protected`), and 1,000 budgets in namespaces
//! with no Pod that uses claims (the web applications of a shared cluster).
//!
//! Run with `cargo bench -p teamgpu --bench reclaim`.

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::resource::v1::ResourceClaim;
use k8s_openapi::jiff::Timestamp;
use serde_json::json;
use teamgpu::api::{QuotaStatus, TeamGpuPolicy};
use teamgpu::core::effects::reclaim::budgets::BudgetView;
use teamgpu::core::effects::{PodView, ReclaimDefaults, ReclaimInput, ReclaimTracker};
use teamgpu::core::plan::usage::{ClaimView, Names};
use teamgpu::core::plan::{Plan, ReclaimOrder, TeamReport};

const JOBS: usize = 10_000;
const NAMESPACES: usize = 100;
const CLASS: &str = "a.teamgpu.io";

fn team_report(name: &str, namespaces: Vec<String>, allocated: u32, guarantee: u32) -> TeamReport {
    TeamReport {
        name: name.into(),
        namespaces: namespaces.into(),
        quotas: vec![QuotaStatus {
            sharing_policy: "a".into(),
            allocated,
            effective_guarantee: guarantee,
            weight: 1,
            ..QuotaStatus::default()
        }],
        ..TeamReport::default()
    }
}

fn policy(name: &str, reclaim: serde_json::Value) -> TeamGpuPolicy {
    serde_json::from_value(json!({
        "apiVersion": "teamgpu.io/v1alpha1", "kind": "TeamGpuPolicy",
        "metadata": {"name": name, "uid": format!("u-{name}")},
        "spec": {"reclaim": reclaim}
    }))
    .unwrap()
}

/// The borrower's Jobs: their Pods as reclaim's watch keeps them, and their claims.
fn cluster() -> (Vec<Arc<PodView>>, Vec<Arc<ClaimView>>) {
    let mut names = Names::default();
    let (mut pods, mut claims) = (Vec::new(), Vec::new());
    for i in 0..JOBS {
        let ns = format!("b-{}", i % NAMESPACES);
        let tier = if i % 2 == 0 { "protected" } else { "batch" };
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": format!("job-{i}-0"), "namespace": ns,
                         "labels": {"app": format!("job-{i}"), "tier": tier},
                         "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job",
                             "name": format!("job-{i}"), "uid": format!("u{i}"), "controller": true}]},
            "spec": {"containers": [{"name": "c"}], "priority": 100,
                     "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "x1"}]},
            "status": {"phase": "Running", "startTime": "2026-12-05T10:00:00Z"}
        }))
        .unwrap();
        pods.push(Arc::new(PodView::project(&pod, &mut names)));
        let claim: ResourceClaim = serde_json::from_value(json!({
            "metadata": {"name": format!("job-{i}-0-gpu"), "namespace": ns},
            "spec": {"devices": {"requests": [{"name": "gpu",
                "exactly": {"deviceClassName": CLASS, "count": 1}}]}},
            "status": {
                "allocation": {"devices": {"results": [{"request": "gpu",
                    "driver": "gpu.nvidia.com", "pool": format!("node-{}", i / 8),
                    "device": format!("gpu-{}", i % 8)}]}},
                "reservedFor": [{"resource": "pods", "name": format!("job-{i}-0"),
                                 "uid": format!("p{i}")}]
            }
        }))
        .unwrap();
        claims.push(Arc::new(ClaimView::project(&claim, &mut names)));
    }
    (pods, claims)
}

fn budgets() -> Vec<Arc<BudgetView>> {
    let budget = |ns: String, name: &str, selector: serde_json::Value| {
        let budget: PodDisruptionBudget = serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": ns},
            "spec": {"selector": selector},
            "status": {"disruptionsAllowed": 0, "currentHealthy": 50, "desiredHealthy": 50,
                       "expectedPods": 50}
        }))
        .unwrap();
        Arc::new(BudgetView::project(&budget))
    };
    let protected = (0..NAMESPACES).map(|n| {
        let selector = json!({"matchLabels": {"tier": "protected"}});
        budget(format!("b-{n}"), "protected", selector)
    });
    let web = (0..1_000).map(|n| budget(format!("web-{n}"), "web", json!({})));
    protected.chain(web).collect()
}

fn bench(c: &mut Criterion) {
    let namespaces: Vec<String> = (0..NAMESPACES).map(|n| format!("b-{n}")).collect();
    let plan = Plan {
        teams: vec![
            team_report("owner", vec!["o".into()], 6, 8),
            team_report("borrower", namespaces, JOBS as u32, 100),
        ],
        reclaims: vec![ReclaimOrder {
            sharing_policy: "a".into(),
            borrower: "borrower".into(),
            devices: 2,
            for_team: "owner".into(),
        }],
        ..Plan::default()
    };
    let teams = [
        policy("owner", json!({"enabled": true, "gracePeriodSeconds": 0})),
        policy("borrower", json!({})),
    ];
    let (pods, claims) = cluster();
    let defaults = ReclaimDefaults {
        enabled: false,
        grace: Duration::from_secs(120),
        min_runtime: Duration::ZERO,
    };
    let wall: Timestamp = "2026-12-05T12:00:00Z".parse().unwrap();
    let mut group = c.benchmark_group("reclaim pass, 10,000 one-Pod Jobs in 100 namespaces");
    for (name, budgets) in [("no budgets", Vec::new()), ("1,100 budgets", budgets())] {
        let input = ReclaimInput {
            plan: &plan,
            teams: &teams,
            claims: &claims,
            pods: &pods,
            budgets: &budgets,
        };
        let mut tracker = ReclaimTracker::default();
        let evicted = tracker.evictions(input, defaults, Instant::now(), wall);
        assert_eq!(evicted.evictions.len(), 2, "{name}: two 1-device Jobs go");
        group.bench_function(name, |b| {
            b.iter(|| tracker.evictions(black_box(input), defaults, Instant::now(), wall))
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
