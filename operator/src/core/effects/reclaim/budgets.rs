//! Whether PodDisruptionBudgets let every Pod of a workload go. The dry run of each eviction
//! asks the API server about one Pod at a time, and a dry run does not spend the budget: a
//! budget that allows one disruption passes the dry runs of both Pods of a Job, then refuses
//! the second eviction after the first went through, and the Job is left half evicted. So
//! budgets are counted here, as the Eviction API counts them
//! (`pkg/registry/core/pod/storage/eviction.go`, Kubernetes 1.36): a Pod that is Pending,
//! finished or being deleted goes without asking its budget. A running Pod that is not Ready
//! may also go without spending it (`unhealthyPodEvictionPolicy`); it is counted here all the
//! same, so such a workload is passed over rather than risked.
//!
//! Reclaim counts them from the watched budgets when it chooses ([`super::kept`]), and the
//! executor counts them again from a fresh read before it evicts a workload of several Pods.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::ResourceExt;

use crate::core::plan::membership::label_selector_matches;

/// What a budget says, as far as an eviction reads it.
#[derive(Debug, Clone, PartialEq)]
pub struct BudgetView {
    pub namespace: String,
    pub name: String,
    /// `None`: a null label selector, which selects no Pod (policy/v1).
    pub label_selector: Option<LabelSelector>,
    /// `status.disruptionsAllowed`, as the disruption controller last counted it.
    pub disruptions_allowed: i32,
}

impl BudgetView {
    pub fn project(budget: &PodDisruptionBudget) -> Self {
        BudgetView {
            namespace: budget.namespace().unwrap_or_default(),
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

/// The disruptions the budgets still allow while evictions are chosen or made: each workload
/// that goes spends from the budgets that cover its Pods.
#[derive(Clone, Debug)]
pub struct Ledger<'b> {
    /// Each budget and what it still allows, by namespace (a workload's Pods ask only the
    /// budgets of their namespaces).
    left: Vec<(&'b BudgetView, usize)>,
}

impl<'b> Ledger<'b> {
    pub fn new(budgets: impl IntoIterator<Item = &'b BudgetView>) -> Self {
        let mut left: Vec<_> = (budgets.into_iter())
            .map(|b| (b, usize::try_from(b.disruptions_allowed).unwrap_or(0)))
            .collect();
        left.sort_by(|(a, _), (b, _)| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
        Ledger { left }
    }

    /// Spends what evicting all of `pods` (each with its namespace) asks of the budgets, or
    /// says why they cannot all go ([`Ledger::allows`]); nothing is spent then.
    pub fn spend(&mut self, pods: &[(&str, &BudgetedPod)]) -> Result<(), Overdrawn> {
        for (i, n) in self.covered(pods)? {
            self.left[i].1 -= n;
        }
        Ok(())
    }

    /// Whether all of `pods` may go: if not, why (the first budget, by namespace and name,
    /// that covers more of them than it still allows).
    pub fn allows(&self, pods: &[(&str, &BudgetedPod)]) -> Result<(), Overdrawn> {
        self.covered(pods).map(drop)
    }

    /// The budgets that cover some of `pods` (their places in `left`) and how many, when none
    /// covers more than it allows.
    fn covered(&self, pods: &[(&str, &BudgetedPod)]) -> Result<Vec<(usize, usize)>, Overdrawn> {
        let mut namespaces: Vec<&str> = pods.iter().map(|(ns, _)| *ns).collect();
        namespaces.sort_unstable();
        namespaces.dedup();
        let mut out = Vec::new();
        for namespace in namespaces {
            let start = (self.left).partition_point(|(b, _)| b.namespace.as_str() < namespace);
            let in_namespace = (self.left[start..].iter().enumerate())
                .take_while(|(_, (b, _))| b.namespace == namespace);
            for (i, (budget, left)) in in_namespace {
                let n = pods.iter().filter(|(ns, p)| covers(budget, ns, p)).count();
                if n > *left {
                    return Err(Overdrawn {
                        budget: format!("{}/{}", budget.namespace, budget.name),
                        allowed: *left,
                        covered: n,
                    });
                }
                if n > 0 {
                    out.push((start + i, n));
                }
            }
        }
        Ok(out)
    }
}

/// A budget that covers more of a workload's Pods than it still allows disruptions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Overdrawn {
    /// The budget's namespace and name.
    pub budget: String,
    /// The disruptions it still allows.
    pub allowed: usize,
    /// The workload's Pods it covers.
    pub covered: usize,
}

impl Overdrawn {
    /// What the budget allows, for a person: "allows no disruption now", "allows 1 disruption".
    pub fn allows(&self) -> String {
        match self.allowed {
            0 => "allows no disruption now".to_owned(),
            1 => "allows 1 disruption".to_owned(),
            n => format!("allows {n} disruptions"),
        }
    }
}

impl std::fmt::Display for Overdrawn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let part = if self.allowed == 0 {
            ""
        } else {
            ", so only part of it could go"
        };
        write!(
            f,
            "PodDisruptionBudget {} {} and covers {} of the workload's Pods{part}",
            self.budget,
            self.allows(),
            self.covered
        )
    }
}

/// Whether evicting `pod` of `namespace` asks `budget`. A selector the API server let through
/// but that reads as invalid here covers the Pod: the workload is kept rather than risked.
fn covers(budget: &BudgetView, namespace: &str, pod: &BudgetedPod) -> bool {
    let Some(label_selector) = &budget.label_selector else {
        return false;
    };
    budget.namespace == namespace
        && !pod.exempt
        && label_selector_matches(label_selector, &pod.labels).unwrap_or(true)
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
                "metadata": {"name": name, "namespace": "ml"},
                "spec": {"selector": label_selector},
                "status": {"disruptionsAllowed": allowed, "currentHealthy": 0,
                           "desiredHealthy": 0, "expectedPods": 0}
            }))
            .unwrap(),
        )
    }

    /// Why the Pods of `ml` cannot all go under `budgets`, none spent before.
    fn overdrawn(pods: &[BudgetedPod], budgets: &[BudgetView]) -> Option<String> {
        let pods: Vec<_> = pods.iter().map(|p| ("ml", p)).collect();
        Ledger::new(budgets)
            .spend(&pods)
            .err()
            .map(|o| o.to_string())
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
                "PodDisruptionBudget ml/train allows 1 disruption and covers 2 of the \
                 workload's Pods, so only part of it could go"
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
                namespace: "ml".into(),
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
                .ends_with("allows no disruption now and covers 2 of the workload's Pods")
        );
    }

    #[test]
    fn workloads_chosen_together_spend_one_budget_and_other_namespaces_budgets_do_not_count() {
        let (a, b) = (
            pod("serve-a", "serve", "Running"),
            pod("serve-b", "serve", "Running"),
        );
        let one = budget("serve", json!({"matchLabels": {"app": "serve"}}), 1);
        let mut elsewhere = budget("serve", json!({}), 0);
        elsewhere.namespace = "web".into();
        let budgets = [one, elsewhere];
        let mut ledger = Ledger::new(&budgets);
        assert_eq!(ledger.spend(&[("ml", &a)]), Ok(()));
        let refused = ledger.spend(&[("ml", &b)]).unwrap_err();
        assert_eq!(
            refused.to_string(),
            "PodDisruptionBudget ml/serve allows no disruption now and covers 1 of the \
             workload's Pods"
        );
        // A refusal spends nothing: a Pod the budget does not cover still goes.
        let other = pod("train-a", "train", "Running");
        assert_eq!(ledger.spend(&[("ml", &other)]), Ok(()));
    }
}
