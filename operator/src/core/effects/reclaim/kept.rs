//! Reclaim's choice for one waiting team within what PodDisruptionBudgets allow. Pure. A
//! workload its budgets would not let go whole is not chosen, and the workloads chosen in one
//! pass spend the budgets together ([`super::budgets::Ledger`]), so that reclaim asks the
//! Eviction API only for what it will allow; the waiting team is told which workloads the
//! budgets keep.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use k8s_openapi::jiff::Timestamp;
use rustc_hash::FxHashMap;

use super::budgets::{BudgetView, BudgetedPod, Ledger, Overdrawn};
use super::nodes;
use super::victims::{self, Borrower, Choice};
use super::workload::{PodView, Workload};
use crate::core::plan::ReclaimOrder;
use crate::core::plan::placement::Placement;

/// The budgets as reclaim reads them in one pass: what they still allow, and the Pods they may
/// cover (those that use claims; a workload's other Pods are counted by the executor's read).
#[derive(Debug)]
pub struct PassBudgets<'a> {
    ledger: Ledger<'a>,
    pods: FxHashMap<(&'a str, &'a str), &'a BudgetedPod>,
}

impl<'a> PassBudgets<'a> {
    pub fn new(budgets: &'a [Arc<BudgetView>], pods: &'a [Arc<PodView>]) -> Self {
        // Only budgets beside Pods that use claims count: most of a cluster's budgets cover
        // other applications, and most borrowers have none. With no budget at all, no Pod is
        // looked at.
        if budgets.is_empty() {
            return PassBudgets {
                ledger: Ledger::new([]),
                pods: FxHashMap::default(),
            };
        }
        let budgeted = || pods.iter().filter(|p| p.budgeted.is_some());
        let with_pods: BTreeSet<&str> = budgeted().map(|p| &*p.namespace).collect();
        let budgets: Vec<&BudgetView> = (budgets.iter().map(|b| &**b))
            .filter(|b| with_pods.contains(b.namespace.as_str()))
            .collect();
        let namespaces: BTreeSet<&str> = budgets.iter().map(|b| b.namespace.as_str()).collect();
        let pods = budgeted()
            .filter(|p| namespaces.contains(&*p.namespace))
            .filter_map(|p| Some(((&*p.namespace, &*p.name), p.budgeted.as_deref()?)))
            .collect();
        PassBudgets {
            ledger: Ledger::new(budgets),
            pods,
        }
    }

    fn pods_of<'w>(&self, w: &'w Workload) -> Vec<(&'w str, &'a BudgetedPod)> {
        (w.pods.iter())
            .filter_map(|(ns, name)| Some((&**ns, *self.pods.get(&(&**ns, &**name))?)))
            .collect()
    }

    /// Takes out of the `borrowers` the workloads that their budgets keep even alone; says
    /// which, and why.
    pub fn keep(&self, borrowers: &mut [Borrower]) -> Vec<(String, Overdrawn)> {
        let mut kept = Vec::new();
        if self.pods.is_empty() {
            return kept;
        }
        for b in borrowers.iter_mut() {
            b.workloads
                .retain(|w| match self.ledger.allows(&self.pods_of(w)) {
                    Ok(()) => true,
                    Err(why) => {
                        kept.push((w.name.clone(), why));
                        false
                    }
                });
        }
        kept
    }

    /// Spends the budgets for the workloads of `choice`, in the order chosen. `Err`: the first
    /// that the ones before it left its budgets too short for (its borrower's index, its place
    /// among the borrower's workloads, why); nothing is spent then.
    pub fn spend(
        &mut self,
        choice: &Choice,
        borrowers: &[Borrower],
    ) -> Result<(), (usize, Option<usize>, Overdrawn)> {
        let mut ledger = self.ledger.clone();
        for (b, w) in &choice.evict {
            if let Err(why) = ledger.spend(&self.pods_of(w)) {
                let place = borrowers[*b].workloads.iter().position(|x| x == w);
                return Err((*b, place, why));
            }
        }
        self.ledger = ledger;
        Ok(())
    }
}

/// How reclaim chooses for one waiting team: room on a node for its `unplaced` claims, else the
/// devices `orders` say it is owed ([`nodes::choose_on_nodes`] or [`victims::choose`]), with the
/// minimum runtime at the wall time `wall`. Gives the shortfall covered and the choice.
pub(super) fn from_borrowers<'a>(
    unplaced: Option<(&'a Placement, &'a Vec<u32>)>,
    orders: &'a [&'a ReclaimOrder],
    (min_runtime, wall): (u64, Timestamp),
) -> impl Fn(&[Borrower]) -> (u64, Choice) + 'a {
    move |borrowers: &[Borrower]| match unplaced {
        Some((placement, claims)) => {
            let free = nodes::free_of(placement);
            let choice = nodes::choose_on_nodes(borrowers, &free, claims, min_runtime, wall);
            (claims.iter().copied().map(u64::from).sum(), choice)
        }
        None => {
            let shortfall = orders.iter().map(|o| u64::from(o.devices)).sum();
            (
                shortfall,
                victims::choose(borrowers, shortfall, min_runtime, wall),
            )
        }
    }
}

/// What reclaim takes for one waiting team, as `choose` picks it from the `borrowers` (the
/// shortfall it covers, and the choice). Never what the `budgets` keep: they spend what is
/// chosen, and the workloads they keep are named.
pub(super) fn choose_within_budgets(
    borrowers: &mut [Borrower],
    budgets: &mut PassBudgets<'_>,
    choose: &dyn Fn(&[Borrower]) -> (u64, Choice),
) -> (u64, Choice, Vec<(String, Overdrawn)>) {
    let mut kept = budgets.keep(borrowers);
    loop {
        let (shortfall, choice) = choose(borrowers);
        match budgets.spend(&choice, borrowers) {
            Err((b, Some(place), why)) => {
                let w = borrowers[b].workloads.remove(place);
                kept.push((w.name, why));
            }
            _ => return (shortfall, choice, kept),
        }
    }
}

/// The workloads that budgets keep, by budget: "PodDisruptionBudget ml/serve, which allows no
/// disruption now, keeps Pod ml/serve-0, Job ml/train (2 of its Pods) and 3 more".
pub(super) fn kept_by_budgets(kept: &[(String, Overdrawn)]) -> String {
    const NAMED: usize = 5;
    let mut by_budget: BTreeMap<(&str, String), Vec<String>> = BTreeMap::new();
    for (workload, why) in kept {
        let item = match why.covered {
            1 => workload.clone(),
            n => format!("{workload} ({n} of its Pods)"),
        };
        (by_budget.entry((&why.budget, why.allows())).or_default()).push(item);
    }
    let budgets: Vec<String> = (by_budget.into_iter())
        .map(|((budget, allows), workloads)| {
            let mut named = workloads[..workloads.len().min(NAMED)].join(", ");
            if workloads.len() > NAMED {
                named = format!("{named} and {} more", workloads.len() - NAMED);
            }
            format!("PodDisruptionBudget {budget}, which {allows}, keeps {named}")
        })
        .collect();
    budgets.join("; ")
}
