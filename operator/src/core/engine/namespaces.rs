//! The namespaces, kept by name and updated by what their watch says changed: a namespace's
//! event costs that namespace, and plans again only when it changes what the planner reads.
//! Pure.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use crate::api::TeamGpuPolicy;
use crate::core::plan::admission::EXEMPT_LABEL;
use crate::core::state::{Delta, NamespaceInfo, NamespaceView};

/// The namespace labels the planner reads: the keys of the teams' namespace selectors, and the
/// exemption.
pub(super) fn planned_labels(teams: &[TeamGpuPolicy]) -> BTreeSet<&str> {
    let selectors = teams
        .iter()
        .filter_map(|t| t.spec.namespace_selector.as_ref());
    let keys = selectors.flat_map(|s| {
        let labels = s.match_labels.iter().flatten().map(|(key, _)| key.as_str());
        let expressions = s.match_expressions.iter().flatten();
        labels.chain(expressions.map(|e| e.key.as_str()))
    });
    keys.chain([EXEMPT_LABEL]).collect()
}

/// Whether the planner reads the same of `new` as of `old` (`None`: no such namespace): a
/// namespace being deleted is none to it, and of the others it reads the name and the labels
/// `read`. A label nothing selects by (a cost centre, Argo CD's tracking label) plans nothing
/// again when it changes.
fn same_as_planned(
    old: Option<&NamespaceView>,
    new: Option<&NamespaceView>,
    read: &BTreeSet<&str>,
) -> bool {
    fn planned(n: Option<&NamespaceView>) -> Option<&Arc<NamespaceInfo>> {
        n.filter(|n| !n.terminating).map(|n| &n.info)
    }
    match (planned(old), planned(new)) {
        (None, None) => true,
        (Some(a), Some(b)) => {
            Arc::ptr_eq(a, b) || read.iter().all(|k| a.labels.get(*k) == b.labels.get(*k))
        }
        _ => false,
    }
}

/// The namespaces as the watch has them, and the planner's list of them built again only when
/// one changed.
#[derive(Debug, Default)]
pub(super) struct KeptNamespaces {
    by_name: BTreeMap<String, Arc<NamespaceView>>,
    /// A namespace changed since [`KeptNamespaces::planned`] last built the list.
    changed: bool,
}

impl KeptNamespaces {
    /// Takes in every namespace, or what changed; whether the planner reads something that
    /// changed ([`same_as_planned`], with the labels `read`).
    pub(super) fn take_in(
        &mut self,
        delta: Delta<'_, NamespaceView>,
        read: &BTreeSet<&str>,
    ) -> bool {
        let mut replan = false;
        let mut remove = |by_name: &mut BTreeMap<String, Arc<NamespaceView>>, name: &str| {
            let old = by_name.remove(name);
            replan |= !same_as_planned(old.as_deref(), None, read);
        };
        if let Delta::All(all) = delta {
            let present: BTreeSet<&str> = all.iter().map(|n| n.info.name.as_str()).collect();
            let gone: Vec<String> = (self.by_name.keys())
                .filter(|name| !present.contains(name.as_str()))
                .cloned()
                .collect();
            gone.iter().for_each(|name| remove(&mut self.by_name, name));
        }
        let (upserted, removed) = delta.parts();
        removed
            .iter()
            .for_each(|n| remove(&mut self.by_name, &n.info.name));
        for n in upserted {
            let old = self.by_name.insert(n.info.name.clone(), Arc::clone(n));
            replan |= !same_as_planned(old.as_deref(), Some(n), read);
        }
        self.changed = true;
        replan
    }

    /// The namespaces not being deleted, by name, if one changed since the last call (the
    /// planner's input; a namespace being deleted is no team's, nothing is written into it).
    pub(super) fn planned(&mut self) -> Option<Vec<Arc<NamespaceInfo>>> {
        if !std::mem::take(&mut self.changed) {
            return None;
        }
        let planned = self.by_name.values().filter(|n| !n.terminating);
        Some(planned.map(|n| Arc::clone(&n.info)).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn namespace(name: &str, labels: &[(&str, &str)], terminating: bool) -> Arc<NamespaceView> {
        let labels = (labels.iter()).map(|(k, v)| ((*k).to_owned(), (*v).to_owned()));
        Arc::new(NamespaceView {
            info: Arc::new(NamespaceInfo {
                name: name.to_owned(),
                labels: labels.collect(),
            }),
            terminating,
        })
    }

    fn names(kept: &mut KeptNamespaces) -> Option<Vec<String>> {
        Some(kept.planned()?.iter().map(|n| n.name.clone()).collect())
    }

    #[test]
    fn a_namespace_plans_again_only_when_it_changes_what_the_planner_reads() {
        let read = BTreeSet::from(["teamgpu.io/team", EXEMPT_LABEL]);
        let team = [("teamgpu.io/team", "ml")];
        let mut kept = KeptNamespaces::default();
        let ml = namespace("ml-dev", &team, false);
        let web = namespace("web", &[], false);
        assert!(kept.take_in(Delta::All(&[web.clone(), ml.clone()]), &read));
        assert_eq!(names(&mut kept).unwrap(), ["ml-dev", "web"]);
        assert_eq!(names(&mut kept), None, "nothing changed since");

        let changed = |kept: &mut KeptNamespaces, upserted: &[Arc<NamespaceView>]| {
            let delta = Delta::Changed {
                upserted,
                removed: &[],
            };
            kept.take_in(delta, &read)
        };
        // A label no team reads: nothing to plan, but the list is new for the next plan.
        let costed = namespace("web", &[("cost-center", "4711")], false);
        assert!(!changed(&mut kept, std::slice::from_ref(&costed)));
        let planned = kept.planned().unwrap();
        assert_eq!(planned[1].labels["cost-center"], "4711");
        // The team label, the exemption, a new namespace: plan again.
        assert!(changed(&mut kept, &[namespace("web", &team, false)]));
        assert!(changed(
            &mut kept,
            &[namespace("web", &[(EXEMPT_LABEL, "true")], false)]
        ));
        assert!(changed(&mut kept, &[namespace("cv", &[], false)]));
        assert_eq!(names(&mut kept).unwrap(), ["cv", "ml-dev", "web"]);
        // Being deleted: no longer the planner's; then gone: nothing more to plan.
        assert!(changed(&mut kept, &[namespace("cv", &[], true)]));
        assert_eq!(names(&mut kept).unwrap(), ["ml-dev", "web"]);
        let gone = Delta::Changed {
            upserted: &[],
            removed: &[namespace("cv", &[], true)],
        };
        assert!(!kept.take_in(gone, &read));
        // ml-dev goes: plan again. Every namespace again, the same: nothing to plan.
        let gone = Delta::Changed {
            upserted: &[],
            removed: &[ml],
        };
        assert!(kept.take_in(gone, &read));
        let all = [namespace("web", &[(EXEMPT_LABEL, "true")], false)];
        assert!(!kept.take_in(Delta::All(&all), &read));
        assert_eq!(names(&mut kept).unwrap(), ["web"]);
    }
}
