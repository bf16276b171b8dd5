//! Whether PodDisruptionBudgets let every Pod of a workload go. The dry run of each eviction
//! asks the API server about one Pod at a time, and a dry run does not spend the budget: a
//! budget that allows one disruption passes the dry runs of both Pods of a Job, then refuses
//! the second eviction after the first went through, and the Job is left half evicted. So
//! before a workload of several Pods is evicted, its budgets are counted here, as the Eviction
//! API counts them (`pkg/registry/core/pod/storage/eviction.go`, Kubernetes 1.36): a Pod that
//! is Pending, finished or being deleted goes without asking its budget. A running Pod that is
//! not Ready may also go without spending it (`unhealthyPodEvictionPolicy`); it is counted here
//! all the same, so such a workload is refused rather than risked.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::ResourceExt;

use crate::core::plan::membership::label_selector_matches;

/// What a budget says, as far as an eviction reads it.
#[derive(Debug, Clone, PartialEq)]
pub struct BudgetView {
    pub name: String,
    /// `None`: a null label selector, which selects no Pod (policy/v1).
    pub label_selector: Option<LabelSelector>,
    /// `status.disruptionsAllowed`, as the disruption controller last counted it.
    pub disruptions_allowed: i32,
}

impl BudgetView {
    pub fn project(budget: &PodDisruptionBudget) -> Self {
        BudgetView {
            name: budget.name_any(),
            label_selector: budget.spec.as_ref().and_then(|s| s.selector.clone()),
            disruptions_allowed: (budget.status.as_ref()).map_or(0, |s| s.disruptions_allowed),
        }
    }
}

/// A Pod of the workload, as a budget reads it.
#[derive(Debug, Clone, PartialEq)]
pub struct BudgetedPod {
    pub labels: BTreeMap<String, String>,
    /// Pending, finished or being deleted: the Eviction API lets such a Pod go without asking
    /// its budget.
    pub exempt: bool,
}

impl BudgetedPod {
    pub fn project(pod: &Pod) -> Self {
        let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
        BudgetedPod {
            labels: pod.labels().clone(),
            exempt: matches!(phase, Some("Pending" | "Succeeded" | "Failed"))
                || pod.metadata.deletion_timestamp.is_some(),
        }
    }
}

/// Why the workload of `pods` (all in one namespace) may not go whole under the `budgets` of
/// that namespace: the first budget that covers more of its Pods than it allows disruptions.
/// `None`: each budget allows as many as it covers (the dry runs asked the rest).
pub fn overdrawn(pods: &[BudgetedPod], budgets: &[BudgetView]) -> Option<String> {
    budgets.iter().find_map(|budget| {
        let label_selector = budget.label_selector.as_ref()?;
        // One the API server let through but that reads as invalid here covers the Pod: the
        // workload is refused rather than risked.
        let covers = |p: &&BudgetedPod| {
            !p.exempt && label_selector_matches(label_selector, &p.labels).unwrap_or(true)
        };
        let covered = pods.iter().filter(covers).count();
        let allowed = usize::try_from(budget.disruptions_allowed).unwrap_or(0);
        (covered > allowed).then(|| {
            format!(
                "PodDisruptionBudget {} allows {allowed} disruption{} and covers {covered} of \
                 the workload's Pods, so only part of it could go",
                budget.name,
                if allowed == 1 { "" } else { "s" },
            )
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(name: &str, app: &str, phase: &str) -> BudgetedPod {
        BudgetedPod::project(
            &serde_json::from_value(json!({
                "metadata": {"name": name, "labels": {"app": app}},
                "status": {"phase": phase}
            }))
            .unwrap(),
        )
    }

    fn budget(name: &str, label_selector: serde_json::Value, allowed: i32) -> BudgetView {
        BudgetView::project(
            &serde_json::from_value(json!({
                "metadata": {"name": name},
                "spec": {"selector": label_selector},
                "status": {"disruptionsAllowed": allowed, "currentHealthy": 0,
                           "desiredHealthy": 0, "expectedPods": 0}
            }))
            .unwrap(),
        )
    }

    #[test]
    fn a_budget_allowing_one_disruption_refuses_a_job_of_two_running_pods() {
        let job = [
            pod("train-a", "train", "Running"),
            pod("train-b", "train", "Running"),
        ];
        let one = budget("train", json!({"matchLabels": {"app": "train"}}), 1);
        assert_eq!(
            overdrawn(&job, &[one]).as_deref(),
            Some(
                "PodDisruptionBudget train allows 1 disruption and covers 2 of the workload's \
                 Pods, so only part of it could go"
            )
        );
        let two = budget("train", json!({"matchLabels": {"app": "train"}}), 2);
        assert_eq!(overdrawn(&job, &[two]), None);
    }

    #[test]
    fn pods_a_budget_does_not_cover_or_that_need_not_ask_it_do_not_count() {
        let job = [
            pod("train-a", "train", "Running"),
            pod("train-b", "train", "Pending"),
            pod("train-c", "train", "Failed"),
            pod("web-a", "web", "Running"),
        ];
        let budgets = [
            budget("train", json!({"matchLabels": {"app": "train"}}), 1),
            budget("other", json!({"matchLabels": {"app": "other"}}), 0),
            // A null selector selects no Pod.
            BudgetView {
                name: "null".into(),
                label_selector: None,
                disruptions_allowed: 0,
            },
        ];
        assert_eq!(overdrawn(&job, &budgets), None);
        let mut terminating = pod("train-d", "train", "Running");
        terminating.exempt = true;
        assert_eq!(overdrawn(&[job[0].clone(), terminating], &budgets), None);
    }

    #[test]
    fn a_budget_selecting_everything_covers_every_pod_and_expressions_are_read() {
        let job = [pod("a", "train", "Running"), pod("b", "web", "Running")];
        let all = budget("all", json!({}), 1);
        assert!(overdrawn(&job, &[all]).unwrap().contains("covers 2"));
        let some = budget(
            "some",
            json!({"matchExpressions": [{"key": "app", "operator": "In", "values": ["web"]}]}),
            1,
        );
        assert_eq!(overdrawn(&job, &[some]), None);
        let none_left = budget(
            "none-left",
            json!({"matchExpressions": [{"key": "app", "operator": "NotIn", "values": ["x"]}]}),
            0,
        );
        assert!(
            overdrawn(&job, &[none_left])
                .unwrap()
                .contains("allows 0 disruptions")
        );
    }
}
