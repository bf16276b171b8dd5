//! Reclaim under PodDisruptionBudgets: what they keep is passed over before any eviction.

use super::tracker::{Waiting, cluster, plan};
use super::*;
use crate::core::effects::reclaim::budgets::BudgetView;

/// [`cluster`], its Jobs' Pods using claims from a template and labelled `app=<job>`, as
/// PodDisruptionBudgets read them.
fn cluster_under_budgets() -> (Vec<Arc<PodView>>, Vec<Arc<ClaimView>>) {
    let job = |name: &str, h: u32| {
        let extra = json!({
            "spec": {"resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "x4"}]},
            "status": {"startTime": format!("2026-06-01T{h:02}:00:00Z")}
        });
        let owner = Some(("Job", name));
        pod(
            "b",
            &format!("{name}-0"),
            owner,
            json!({"app": name}),
            extra,
        )
    };
    let pods = views(&[job("j1", 8), job("j2", 9), job("j3", 10)]);
    (pods, cluster().1)
}

/// A PodDisruptionBudget of namespace `b` as the disruption controller left it.
fn budget(name: &str, label_selector: Value, allowed: i32) -> Arc<BudgetView> {
    Arc::new(BudgetView::project(
        &serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "b"},
            "spec": {"selector": label_selector},
            "status": {"disruptionsAllowed": allowed, "currentHealthy": 1, "desiredHealthy": 1,
                       "expectedPods": 1}
        }))
        .unwrap(),
    ))
}

#[test]
fn workloads_their_budgets_keep_are_passed_over_before_any_eviction_and_the_owner_is_told() {
    let mut waiting = Waiting::new();
    let evicted = |waiting: &mut Waiting, plan: &Plan, secs| -> (Vec<String>, Vec<String>) {
        let r = waiting.reclaimed_in(plan, secs, cluster_under_budgets());
        let evicted = r.evictions.iter().map(|e| e.workload.clone()).collect();
        let told = (r.events.iter().filter(|e| e.regarding.namespace.is_none()))
            .map(|e| format!("{}: {}", e.reason, e.note))
            .collect();
        (evicted, told)
    };
    evicted(&mut waiting, &plan(), 0);
    // j3, the newest, may not be disrupted: j2 goes in its place, with no refused eviction.
    waiting.budgets = vec![budget("j3", json!({"matchLabels": {"app": "j3"}}), 0)];
    assert_eq!(evicted(&mut waiting, &plan(), 30).0, ["Job b/j2"]);
    // A budget over every Pod of the namespace that allows nothing keeps all three.
    waiting.budgets = vec![budget("all", json!({}), 0)];
    let (none, told) = evicted(&mut waiting, &plan(), 31);
    assert!(none.is_empty(), "{none:?}");
    assert_eq!(
        told,
        [
            "ReclaimBlocked: 2 devices of a are still short and reclaim cannot free them now; \
             PodDisruptionBudget b/all, which allows no disruption now, keeps Job b/j1, Job b/j2, \
             Job b/j3; reclaim looks again every 10 s"
        ]
    );
    assert_eq!(waiting.wakes_at(), Some(41), "budgets wake no pass");
    // Allowing one disruption, it lets one Job go but not two: the owner short 6 gets j3, and
    // is told that the budget keeps the others now.
    waiting.budgets = vec![budget("all", json!({}), 1)];
    let mut six = plan();
    six.reclaims[0].devices = 6;
    six.teams[0].quotas[0].allocated = 2;
    let (one, told) = evicted(&mut waiting, &six, 41);
    assert_eq!(one, ["Job b/j3"]);
    assert_eq!(
        told,
        [
            "ReclaimBlocked: 2 devices of a are still short and reclaim cannot free them now; \
             PodDisruptionBudget b/all, which allows no disruption now, keeps Job b/j2, Job b/j1; \
             reclaim looks again every 10 s"
        ]
    );
    // Budgets only count where Pods use claims: the same Jobs without them go as before.
    let r = waiting.reclaimed(&six, 42);
    let all: Vec<_> = r.evictions.iter().map(|e| e.workload.as_str()).collect();
    assert_eq!(all, ["Job b/j3", "Job b/j2"]);
}

#[test]
fn the_owner_reads_each_budget_once_with_the_workloads_it_keeps() {
    let why = |budget: &str, allowed, covered| Overdrawn {
        budget: budget.into(),
        allowed,
        covered,
    };
    let serving = (0..7).map(|i| (format!("Pod ml/serve-{i}"), why("ml/serve", 0, 1)));
    let kept: Vec<(String, Overdrawn)> = serving
        .chain([("Job ml/train".to_owned(), why("ml/train", 1, 2))])
        .collect();
    assert_eq!(
        kept_by_budgets(&kept),
        "PodDisruptionBudget ml/serve, which allows no disruption now, keeps Pod ml/serve-0, \
         Pod ml/serve-1, Pod ml/serve-2, Pod ml/serve-3, Pod ml/serve-4 and 2 more; \
         PodDisruptionBudget ml/train, which allows 1 disruption, keeps Job ml/train (2 of its \
         Pods)"
    );
}
