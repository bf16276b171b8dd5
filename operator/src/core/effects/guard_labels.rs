//! The guard label of namespaces outside teams (see [`crate::core::plan::outside_teams`]): set
//! once a namespace's quota of 0 is in force, taken off where it is not. Pure.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::core::plan::outside_teams::{GUARD_LABEL, OutsideTeams};
use crate::core::state::{Delta, NamespaceView};

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
    /// Namespace -> the value the watch showed when its label was last asked for. The write is
    /// settled later (its batch done), when the watch may already show it, or a value set after
    /// it: remembering the value at settle time would then wait for a change that never comes.
    asked: HashMap<String, Option<String>>,
}

#[derive(Debug)]
struct Written {
    value: Option<String>,
    over: Option<String>,
}

impl GuardLabels {
    /// Takes in the namespaces as the watch has them: every one, or what changed. A namespace
    /// being deleted is left alone. Returns whether what it keeps changed (always, when handed
    /// every namespace): a guard label, or a write whose watch event came.
    pub fn observe(&mut self, namespaces: Delta<'_, NamespaceView>) -> bool {
        let mut changed = matches!(namespaces, Delta::All(_));
        if let Delta::All(all) = namespaces {
            self.live.clear();
            let present: BTreeSet<&str> = all.iter().map(|n| n.info.name.as_str()).collect();
            self.written.retain(|ns, _| present.contains(ns.as_str()));
            self.asked.retain(|ns, _| present.contains(ns.as_str()));
        }
        let (upserted, removed) = namespaces.parts();
        for n in removed {
            changed |= self.live.remove(&n.info.name).is_some();
            changed |= self.written.remove(&n.info.name).is_some();
            self.asked.remove(&n.info.name);
        }
        for n in upserted {
            let label = (n.info.labels.get(GUARD_LABEL)).filter(|_| !n.terminating);
            let before = match label {
                Some(value) => self.live.insert(n.info.name.clone(), value.clone()),
                None => self.live.remove(&n.info.name),
            };
            changed |= before.as_ref() != label;
        }
        // A label written stays written until the watch shows another value than it was
        // written over (only the namespaces just seen can show one).
        let live = &self.live;
        for n in upserted {
            let name = &n.info.name;
            if (self.written.get(name)).is_some_and(|w| live.get(name) != w.over.as_ref()) {
                self.written.remove(name);
                changed = true;
            }
        }
        changed
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
                (self.asked).insert(namespace.to_owned(), have.map(str::to_owned));
                out.push(Label {
                    namespace: namespace.to_owned(),
                    value: want.map(str::to_owned),
                });
            }
        }
        out
    }

    /// `label` was written: it is not written again until the watch shows something else than
    /// when it was asked for. If the watch shows something else already (the write itself, or a
    /// value set since), nothing is remembered: the next pass compares with that.
    pub fn settle(&mut self, label: Label) {
        let live = self.live.get(&label.namespace);
        let over = match self.asked.remove(&label.namespace) {
            Some(asked) if asked.as_ref() != live => return,
            _ => live.cloned(),
        };
        let value = label.value;
        self.written
            .insert(label.namespace, Written { value, over });
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

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
        labels.observe(Delta::All(&[ns("ci", None), ns("team-a", Some("l"))]));
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
        labels.observe(Delta::All(&[ns("ci", Some("l")), ns("team-a", None)]));
        assert!(labels.written.is_empty());
        assert_eq!(labels.writes(Some(&guard), in_force), []);
        // Someone took the label off: it is set again. The bindings stop denying: all go.
        labels.observe(Delta::All(&[ns("ci", None), ns("team-a", None)]));
        assert_eq!(
            labels.writes(Some(&guard), in_force),
            [label("ci", Some("l"))]
        );
        labels.observe(Delta::All(&[ns("ci", Some("l")), ns("team-a", None)]));
        assert_eq!(labels.writes(None, in_force), [label("ci", None)]);
    }

    #[test]
    fn a_change_that_comes_with_the_written_labels_event_is_seen() {
        let mut labels = GuardLabels::default();
        labels.observe(Delta::All(&[ns("ci", None)]));
        let guard = outside(&["ci"]);
        let in_force = |_: &str| Some("l");
        for write in labels.writes(Some(&guard), in_force) {
            labels.settle(write);
        }
        // Before the operator takes the watch in, someone sets another value: the one event
        // shows only that. It is put right.
        labels.observe(Delta::All(&[ns("ci", Some("other"))]));
        assert_eq!(
            labels.writes(Some(&guard), in_force),
            [label("ci", Some("l"))]
        );
    }

    #[test]
    fn a_value_set_before_the_write_is_settled_is_put_right() {
        let mut labels = GuardLabels::default();
        labels.observe(Delta::All(&[ns("ci", None)]));
        let guard = outside(&["ci"]);
        let in_force = |_: &str| Some("l");
        let writes = labels.writes(Some(&guard), in_force);
        // The write's batch is still running: its echo comes, then an admin sets another value
        // (the e2e test's race under load); only then is the write settled.
        labels.observe(Delta::All(&[ns("ci", Some("l"))]));
        labels.observe(Delta::All(&[ns("ci", Some("bogus"))]));
        for write in writes {
            labels.settle(write);
        }
        assert_eq!(
            labels.writes(Some(&guard), in_force),
            [label("ci", Some("l"))]
        );
    }

    #[test]
    fn what_changed_is_taken_in_as_the_whole_would_be() {
        let changed = |upserted: &[Arc<NamespaceView>], removed: &[Arc<NamespaceView>]| {
            let mut labels = GuardLabels::default();
            labels.observe(Delta::All(&[ns("ci", None), ns("docs", None)]));
            let guard = outside(&["ci", "docs"]);
            let in_force = |_: &str| Some("l");
            for write in labels.writes(Some(&guard), in_force) {
                labels.settle(write);
            }
            labels.observe(Delta::Changed { upserted, removed });
            labels.writes(Some(&guard), in_force)
        };
        // Another namespace's event: both writes are still on their way.
        assert_eq!(changed(&[ns("web", None)], &[]), []);
        // ci's echo comes, docs' not yet: nothing to write.
        assert_eq!(changed(&[ns("ci", Some("l"))], &[]), []);
        // Someone set another value on ci: it is put right.
        assert_eq!(
            changed(&[ns("ci", Some("x"))], &[]),
            [label("ci", Some("l"))]
        );
        // docs is gone (the guard still names it, as a plan before the deletion would): its
        // write is forgotten, and asked for again.
        assert_eq!(
            changed(&[], &[ns("docs", None)]),
            [label("docs", Some("l"))]
        );
    }

    #[test]
    fn a_write_that_did_not_happen_is_asked_for_again() {
        let mut labels = GuardLabels::default();
        labels.observe(Delta::All(&[ns("ci", None)]));
        let guard = outside(&["ci"]);
        let in_force = |_: &str| Some("l");
        assert_eq!(labels.writes(Some(&guard), in_force).len(), 1);
        // Failed or backed off: not settled, so asked for at the next pass.
        assert_eq!(labels.writes(Some(&guard), in_force).len(), 1);
    }
}
