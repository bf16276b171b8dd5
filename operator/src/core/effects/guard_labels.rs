//! The guard label of namespaces outside teams (see [`crate::core::plan::outside_teams`]): set
//! once a namespace's quota of 0 is in force, taken off where it is not. Pure.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use crate::core::plan::outside_teams::{GUARD_LABEL, OutsideTeams};
use crate::core::state::NamespaceView;

/// Set (`Some`) or take off (`None`) the guard label of a namespace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Label {
    pub namespace: String,
    pub value: Option<String>,
}

/// The guard labels the namespaces carry, and those written whose watch event has not come.
#[derive(Debug, Default)]
pub struct GuardLabels {
    /// Namespace -> the value of its guard label, as the watch has it.
    live: BTreeMap<String, String>,
    /// Labels written whose watch event has not come yet, with the value the watch showed when
    /// they were written: not written again until the watch shows another value (the write's
    /// own, or someone's after it, which one event may bring together).
    written: HashMap<String, Written>,
}

#[derive(Debug)]
struct Written {
    value: Option<String>,
    over: Option<String>,
}

impl GuardLabels {
    /// Takes in the namespaces as the watch has them. A namespace being deleted is left alone.
    pub fn observe(&mut self, namespaces: &[Arc<NamespaceView>]) {
        self.live = (namespaces.iter())
            .filter(|n| !n.terminating)
            .filter_map(|n| {
                let value = n.info.labels.get(GUARD_LABEL)?;
                Some((n.info.name.clone(), value.clone()))
            })
            .collect();
        if self.written.is_empty() {
            return;
        }
        // Of the namespaces written, those that still exist (the few, not a set of all).
        let present: BTreeSet<&str> = (namespaces.iter())
            .map(|n| n.info.name.as_str())
            .filter(|name| self.written.contains_key(*name))
            .collect();
        let live = &self.live;
        self.written
            .retain(|ns, w| present.contains(ns.as_str()) && live.get(ns) == w.over.as_ref());
    }

    /// The labels to write so that each namespace carries what `outside` asks of it, given the
    /// hash of each namespace's live quota status (`in_force`).
    pub fn writes<'a>(
        &mut self,
        outside: Option<&OutsideTeams>,
        in_force: impl Fn(&str) -> Option<&'a str>,
    ) -> Vec<Label> {
        let guarded = outside.map_or(&[][..], |o| &o.namespaces[..]);
        let namespaces: BTreeSet<&str> = (guarded.iter().map(String::as_str))
            .chain(self.live.keys().map(String::as_str))
            .collect();
        let mut out = Vec::new();
        for namespace in namespaces {
            let want = outside.and_then(|o| o.label_of(namespace, in_force(namespace)));
            let have = self.live.get(namespace).map(String::as_str);
            let written = self.written.get(namespace).map(|w| w.value.as_deref());
            if want != have && written != Some(want) {
                out.push(Label {
                    namespace: namespace.to_owned(),
                    value: want.map(str::to_owned),
                });
            }
        }
        out
    }

    /// `label` was written: it is not written again until the watch shows something else.
    pub fn settle(&mut self, label: Label) {
        let over = self.live.get(&label.namespace).cloned();
        let value = label.value;
        self.written
            .insert(label.namespace, Written { value, over });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::state::NamespaceInfo;

    fn ns(name: &str, label: Option<&str>) -> Arc<NamespaceView> {
        let labels = label.map(|l| (GUARD_LABEL.to_owned(), l.to_owned()));
        Arc::new(NamespaceView {
            info: Arc::new(NamespaceInfo {
                name: name.into(),
                labels: labels.into_iter().collect(),
            }),
            terminating: false,
        })
    }

    fn outside(namespaces: &[&str]) -> OutsideTeams {
        OutsideTeams {
            namespaces: namespaces.iter().map(|n| n.to_string()).collect(),
            label: "l".into(),
        }
    }

    fn label(namespace: &str, value: Option<&str>) -> Label {
        Label {
            namespace: namespace.into(),
            value: value.map(str::to_owned),
        }
    }

    #[test]
    fn a_namespace_is_labelled_once_its_quota_is_in_force_and_unlabelled_when_it_joins_a_team() {
        let mut labels = GuardLabels::default();
        labels.observe(&[ns("ci", None), ns("team-a", Some("l"))]);
        let guard = outside(&["ci"]);
        // The quota of "ci" is not in force yet; "team-a" joined a team and keeps a label.
        let none = |_: &str| None;
        assert_eq!(labels.writes(Some(&guard), none), [label("team-a", None)]);
        let in_force = |n: &str| (n == "ci").then_some("l");
        let writes = labels.writes(Some(&guard), in_force);
        assert_eq!(writes, [label("ci", Some("l")), label("team-a", None)]);
        // Written, the watch not there yet: nothing again.
        for write in writes {
            labels.settle(write);
        }
        assert_eq!(labels.writes(Some(&guard), in_force), []);
        // The watch shows both: nothing to do, and nothing remembered.
        labels.observe(&[ns("ci", Some("l")), ns("team-a", None)]);
        assert!(labels.written.is_empty());
        assert_eq!(labels.writes(Some(&guard), in_force), []);
        // Someone took the label off: it is set again. The bindings stop denying: all go.
        labels.observe(&[ns("ci", None), ns("team-a", None)]);
        assert_eq!(
            labels.writes(Some(&guard), in_force),
            [label("ci", Some("l"))]
        );
        labels.observe(&[ns("ci", Some("l")), ns("team-a", None)]);
        assert_eq!(labels.writes(None, in_force), [label("ci", None)]);
    }

    #[test]
    fn a_change_that_comes_with_the_written_labels_event_is_seen() {
        let mut labels = GuardLabels::default();
        labels.observe(&[ns("ci", None)]);
        let guard = outside(&["ci"]);
        let in_force = |_: &str| Some("l");
        for write in labels.writes(Some(&guard), in_force) {
            labels.settle(write);
        }
        // Before the operator takes the watch in, someone sets another value: the one event
        // shows only that. It is put right.
        labels.observe(&[ns("ci", Some("other"))]);
        assert_eq!(
            labels.writes(Some(&guard), in_force),
            [label("ci", Some("l"))]
        );
    }

    #[test]
    fn a_write_that_did_not_happen_is_asked_for_again() {
        let mut labels = GuardLabels::default();
        labels.observe(&[ns("ci", None)]);
        let guard = outside(&["ci"]);
        let in_force = |_: &str| Some("l");
        assert_eq!(labels.writes(Some(&guard), in_force).len(), 1);
        // Failed or backed off: not settled, so asked for at the next pass.
        assert_eq!(labels.writes(Some(&guard), in_force).len(), 1);
    }
}
