//! Which namespaces belong to which team. Pure.
//!
//! A namespace belongs to a team when the team's `namespaceSelector` matches its labels or the
//! team lists it by name. A namespace claimed by two or more teams stays with the one that had it
//! (its `status.namespaces`, as the operator last wrote it, lists it): otherwise anyone who may
//! write a TeamGpuPolicy (a department's members) could take a namespace from its team by naming
//! it. When none of them had it, it belongs to none of them: giving it to either would be a
//! guess. Every claimant reports the conflict.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use super::admission::EXEMPT_LABEL;
use crate::api::{TeamGpuPolicy, TeamGpuPolicySpec};
use crate::core::state::NamespaceInfo;

/// A label selector Kubernetes would reject, so teamgpu does not guess what it means.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LabelSelectorError {
    #[error("matchExpressions[{index}]: operator {operator} needs at least one value")]
    MissingValues { index: usize, operator: String },
    #[error("matchExpressions[{index}]: operator {operator} takes no values")]
    UnexpectedValues { index: usize, operator: String },
    #[error(
        "matchExpressions[{index}]: unknown operator {operator} (In, NotIn, Exists, DoesNotExist)"
    )]
    UnknownOperator { index: usize, operator: String },
}

/// Whether `selector` matches `labels`, with Kubernetes' semantics
/// (apimachinery `LabelSelectorAsSelector`): all `matchLabels` and all `matchExpressions` must hold.
pub fn label_selector_matches(
    selector: &LabelSelector,
    labels: &BTreeMap<String, String>,
) -> Result<bool, LabelSelectorError> {
    let mut matches = selector
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    for (index, expr) in selector.match_expressions.iter().flatten().enumerate() {
        let values = expr.values.as_deref().unwrap_or_default();
        let value = labels.get(&expr.key);
        let operator = expr.operator.clone();
        let holds = match expr.operator.as_str() {
            "In" | "NotIn" if values.is_empty() => {
                return Err(LabelSelectorError::MissingValues { index, operator });
            }
            "Exists" | "DoesNotExist" if !values.is_empty() => {
                return Err(LabelSelectorError::UnexpectedValues { index, operator });
            }
            "In" => value.is_some_and(|v| values.contains(v)),
            "NotIn" => !value.is_some_and(|v| values.contains(v)),
            "Exists" => value.is_some(),
            "DoesNotExist" => value.is_none(),
            _ => return Err(LabelSelectorError::UnknownOperator { index, operator }),
        };
        matches &= holds;
    }
    Ok(matches)
}

/// The resolved membership of every team.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Membership {
    /// Team name -> the namespaces it owns, sorted.
    pub namespaces: BTreeMap<String, Arc<[String]>>,
    /// Team name -> namespace -> the other teams that also claim it.
    pub conflicts: BTreeMap<String, BTreeMap<String, Vec<String>>>,
    /// Namespace claimed by several teams -> the one of them that keeps it: the one that had it
    /// (its `status.namespaces` lists it). A namespace not here belongs to none of them.
    pub kept: BTreeMap<String, String>,
    /// Team name -> why its `namespaceSelector` could not be used.
    pub label_selector_errors: BTreeMap<String, LabelSelectorError>,
    /// Team name -> namespaces it lists by name that do not exist.
    pub missing: BTreeMap<String, Vec<String>>,
    /// The departments and who belongs to which (see [`Tree`]).
    pub tree: Tree,
    /// The namespaces of no team that a cluster admin did not exempt, sorted: teamgpu guards
    /// them with a quota of 0 ([`super::outside_teams`]).
    pub outside: Vec<String>,
}

/// Departments (TeamGpuPolicies with `department: true`) and their members.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Tree {
    /// Team or department -> the department it belongs to, when that is usable.
    pub parent: BTreeMap<String, String>,
    /// Department -> its members (teams and departments), sorted.
    pub children: BTreeMap<String, Vec<String>>,
    /// Team or department -> why its `parent` is not used (it is planned at the top).
    pub problems: BTreeMap<String, String>,
    /// Department -> the sharing policies it has a quota for.
    pub quotas: BTreeMap<String, BTreeSet<String>>,
}

/// Levels a tree may have: departments up to three deep, teams under them.
pub const MAX_LEVELS: usize = 4;

impl Tree {
    /// Resolves every policy's `parent`: it must name a department; a chain that comes back to
    /// where it started, or runs deeper than [`MAX_LEVELS`], is cut where it goes wrong.
    pub fn resolve(teams: &[TeamGpuPolicy]) -> Self {
        let departments: BTreeSet<&str> = (teams.iter())
            .filter(|t| t.spec.department)
            .filter_map(|t| t.metadata.name.as_deref())
            .collect();
        let names: BTreeSet<&str> = teams
            .iter()
            .filter_map(|t| t.metadata.name.as_deref())
            .collect();
        let mut tree = Tree::default();
        for team in teams.iter().filter(|t| t.spec.department) {
            let quotas = team.spec.quotas.iter().map(|q| q.sharing_policy.clone());
            tree.quotas
                .insert(super::identity::name_of(team), quotas.collect());
        }
        let mut wanted: BTreeMap<&str, &str> = BTreeMap::new();
        for team in teams {
            let (Some(name), Some(parent)) =
                (team.metadata.name.as_deref(), team.spec.parent.as_deref())
            else {
                continue;
            };
            if departments.contains(parent) {
                wanted.insert(name, parent);
            } else {
                let why = if names.contains(parent) {
                    format!("parent {parent} is a team, not a department (department: true)")
                } else {
                    format!("parent {parent} does not exist")
                };
                tree.problems
                    .insert(name.to_owned(), format!("{why}: planned at the top level"));
            }
        }
        for (&name, &parent) in &wanted {
            let mut chain = vec![name, parent];
            let mut at = parent;
            let problem = loop {
                let Some(&up) = wanted.get(at) else {
                    break None;
                };
                if chain.contains(&up) {
                    chain.push(up);
                    break Some(format!("parents form a cycle ({})", chain.join(" -> ")));
                }
                chain.push(up);
                at = up;
            };
            let problem = problem.or_else(|| {
                (chain.len() > MAX_LEVELS)
                    .then(|| format!("more than {MAX_LEVELS} levels ({})", chain.join(" -> ")))
            });
            match problem {
                Some(why) => {
                    tree.problems
                        .insert(name.to_owned(), format!("{why}: planned at the top level"));
                }
                None => {
                    tree.parent.insert(name.to_owned(), parent.to_owned());
                    tree.children
                        .entry(parent.to_owned())
                        .or_default()
                        .push(name.to_owned());
                }
            }
        }
        tree
    }

    /// The nearest department above `team` for which `has` holds (a department without a quota
    /// for a sharing policy is passed through in that policy's pool).
    pub fn ancestor(&self, team: &str, has: impl Fn(&str) -> bool) -> Option<&str> {
        let mut at = self.parent.get(team)?;
        for _ in 0..MAX_LEVELS {
            if has(at) {
                return Some(at);
            }
            at = self.parent.get(at.as_str())?;
        }
        None
    }
}

impl Tree {
    /// Whether `name` is a department (`department: true`).
    pub fn is_department(&self, name: &str) -> bool {
        self.quotas.contains_key(name)
    }

    /// The teams below `department`, at every level (departments own no namespaces).
    pub fn teams_under(&self, department: &str) -> Vec<&str> {
        let mut teams = Vec::new();
        let mut below: Vec<&str> = vec![department];
        while let Some(at) = below.pop() {
            for child in self.children.get(at).into_iter().flatten() {
                match self.is_department(child) {
                    true => below.push(child),
                    false => teams.push(child.as_str()),
                }
            }
        }
        teams
    }
}

impl Membership {
    /// Where a namespace several teams claim goes, as a person reads it: `it stays with ml,
    /// which had it`, or `none` when none of them had it.
    pub fn whose(&self, namespace: &str, none: &str) -> String {
        match self.kept.get(namespace) {
            Some(keeper) => format!("it stays with {keeper}, which had it"),
            None => none.to_owned(),
        }
    }

    /// The team that owns `namespace`, if exactly one does.
    pub fn team_of<'a>(&'a self, namespace: &str) -> Option<&'a str> {
        self.namespaces
            .iter()
            .find(|(_, nss)| nss.binary_search_by(|n| n.as_str().cmp(namespace)).is_ok())
            .map(|(team, _)| team.as_str())
    }

    /// Every namespace that belongs to some team.
    pub fn all_team_namespaces(&self) -> BTreeSet<&str> {
        self.namespaces
            .values()
            .flat_map(|namespaces| namespaces.iter())
            .map(String::as_str)
            .collect()
    }
}

/// [`resolve`], kept while what it reads of the teams and the namespaces is the same, so that
/// a pass after a claim does not match every team's selector against every namespace again.
/// The namespaces are compared by pointer first: the watch cache hands the same view of a
/// namespace whose labels did not change.
#[derive(Debug, Default)]
pub struct KeptMembership {
    /// Per team: its name, its spec and the namespaces its status says it had.
    teams: Vec<(Option<String>, TeamGpuPolicySpec, Vec<String>)>,
    namespaces: Vec<Arc<NamespaceInfo>>,
    membership: Option<Arc<Membership>>,
}

impl KeptMembership {
    pub fn resolve(
        &mut self,
        teams: &[TeamGpuPolicy],
        namespaces: &[Arc<NamespaceInfo>],
    ) -> Arc<Membership> {
        fn had(t: &TeamGpuPolicy) -> &[String] {
            t.status.as_ref().map_or(&[], |s| &s.namespaces[..])
        }
        let same_teams = self.teams.len() == teams.len()
            && (self.teams.iter().zip(teams)).all(|((name, spec, namespaces), t)| {
                *name == t.metadata.name && *spec == t.spec && had(t) == &namespaces[..]
            });
        let same_namespaces = self.namespaces.len() == namespaces.len()
            && (self.namespaces.iter().zip(namespaces)).all(|(a, b)| Arc::ptr_eq(a, b) || a == b);
        match &self.membership {
            Some(kept) if same_teams && same_namespaces => Arc::clone(kept),
            _ => {
                let resolved = Arc::new(resolve(teams, namespaces));
                self.teams = (teams.iter())
                    .map(|t| {
                        let had = had(t).to_vec();
                        (t.metadata.name.clone(), t.spec.clone(), had)
                    })
                    .collect();
                self.namespaces = namespaces.to_vec();
                self.membership = Some(Arc::clone(&resolved));
                resolved
            }
        }
    }
}

/// Resolve which namespaces belong to which team.
pub fn resolve(teams: &[TeamGpuPolicy], namespaces: &[Arc<NamespaceInfo>]) -> Membership {
    let existing: BTreeSet<&str> = namespaces.iter().map(|n| n.name.as_str()).collect();
    let mut claims: BTreeMap<&str, BTreeSet<String>> = BTreeMap::new();
    let mut membership = Membership::default();
    let mut lists: BTreeMap<String, Vec<String>> = BTreeMap::new();

    for team in teams {
        let name = team.metadata.name.clone().unwrap_or_default();
        lists.entry(name.clone()).or_default();
        for listed in &team.spec.namespaces {
            if existing.contains(listed.as_str()) {
                claims
                    .entry(listed.as_str())
                    .or_default()
                    .insert(name.clone());
            } else {
                membership
                    .missing
                    .entry(name.clone())
                    .or_default()
                    .push(listed.clone());
            }
        }
        let Some(selector) = &team.spec.namespace_selector else {
            continue;
        };
        for ns in namespaces {
            match label_selector_matches(selector, &ns.labels) {
                Ok(true) => {
                    claims
                        .entry(ns.name.as_str())
                        .or_default()
                        .insert(name.clone());
                }
                Ok(false) => {}
                Err(error) => {
                    membership.label_selector_errors.insert(name.clone(), error);
                    break;
                }
            }
        }
    }

    // A namespace two teams claim stays with the one that had it, so that naming a namespace, or
    // selecting its labels, takes it from nobody; when none of them had it, none gets it.
    let had = |team: &str, namespace: &str| {
        (teams.iter())
            .find(|t| t.metadata.name.as_deref() == Some(team))
            .and_then(|t| t.status.as_ref())
            .is_some_and(|s| s.namespaces.iter().any(|n| n == namespace))
    };
    for (namespace, owners) in claims {
        let mut holders = owners
            .iter()
            .filter(|o| owners.len() == 1 || had(o, namespace));
        if let (Some(owner), None) = (holders.next(), holders.next()) {
            (lists.entry(owner.clone()).or_default()).push(namespace.to_owned());
            if owners.len() > 1 {
                membership.kept.insert(namespace.to_owned(), owner.clone());
            }
        }
        if owners.len() == 1 {
            continue;
        }
        for team in &owners {
            let others = owners.iter().filter(|o| *o != team).cloned().collect();
            membership
                .conflicts
                .entry(team.clone())
                .or_default()
                .insert(namespace.to_owned(), others);
        }
    }
    membership.tree = Tree::resolve(teams);
    // A department owns no namespaces (the CRD refuses them; an object stored before keeps none).
    for team in teams.iter().filter(|t| t.spec.department) {
        if let Some(name) = team.metadata.name.as_deref() {
            lists.remove(name);
        }
    }
    membership.namespaces = (lists.into_iter())
        .map(|(team, mut list)| {
            list.sort();
            (team, list.into())
        })
        .collect();
    let in_teams = membership.all_team_namespaces();
    let mut outside: Vec<String> = (namespaces.iter())
        .filter(|n| !in_teams.contains(n.name.as_str()))
        .filter(|n| n.labels.get(EXEMPT_LABEL).is_none_or(|v| v != "true"))
        .map(|n| n.name.clone())
        .collect();
    outside.sort();
    membership.outside = outside;
    membership
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::TeamGpuPolicySpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

    fn ns(name: &str, labels: &[(&str, &str)]) -> Arc<NamespaceInfo> {
        Arc::new(NamespaceInfo {
            name: name.into(),
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        })
    }

    fn team(name: &str, label: Option<&str>, names: &[&str]) -> TeamGpuPolicy {
        TeamGpuPolicy::new(
            name,
            TeamGpuPolicySpec {
                namespace_selector: label.map(|l| LabelSelector {
                    match_labels: Some([("teamgpu.io/team".to_string(), l.to_string())].into()),
                    ..Default::default()
                }),
                namespaces: names.iter().map(|n| n.to_string()).collect(),
                weight: 1,
                quotas: vec![],
                reclaim: None,
                budget: None,
                members: vec![],
                department: false,
                parent: None,
                overcommit: None,
            },
        )
    }

    #[test]
    fn kept_membership_is_resolved_again_when_what_it_reads_changes() {
        let mut kept = KeptMembership::default();
        let mut namespaces = vec![ns("ml-dev", &[("teamgpu.io/team", "ml")]), ns("web", &[])];
        let mut teams = vec![team("ml", Some("ml"), &[])];
        let first = kept.resolve(&teams, &namespaces);
        assert_eq!(first.namespaces["ml"][..], ["ml-dev"]);
        // The same views (a claim's pass): the kept answer.
        assert!(Arc::ptr_eq(&first, &kept.resolve(&teams, &namespaces)));
        // Equal labels in a new view: still the same answer.
        namespaces[1] = ns("web", &[]);
        assert!(Arc::ptr_eq(&first, &kept.resolve(&teams, &namespaces)));
        // A namespace labelled into the team.
        namespaces[1] = ns("web", &[("teamgpu.io/team", "ml")]);
        assert_eq!(
            kept.resolve(&teams, &namespaces).namespaces["ml"][..],
            ["ml-dev", "web"]
        );
        // The team's selector changed.
        teams[0] = team("ml", Some("web"), &[]);
        assert!(kept.resolve(&teams, &namespaces).namespaces["ml"].is_empty());
        // Another team names `web`: which team had it (its status) decides.
        teams = vec![team("ml", Some("ml"), &[]), team("web", None, &["web"])];
        assert_eq!(kept.resolve(&teams, &namespaces).team_of("web"), None);
        teams[1].status = Some(crate::api::TeamGpuPolicyStatus {
            namespaces: vec!["web".into()].into(),
            ..Default::default()
        });
        assert_eq!(
            kept.resolve(&teams, &namespaces).team_of("web"),
            Some("web")
        );
    }

    #[test]
    fn label_and_explicit_names_join_a_team() {
        let namespaces = [
            ns("ml-dev", &[("teamgpu.io/team", "ml")]),
            ns("ml-prod", &[]),
            ns("web", &[("teamgpu.io/team", "web")]),
        ];
        let m = resolve(&[team("ml", Some("ml"), &["ml-prod", "gone"])], &namespaces);
        assert_eq!(m.namespaces["ml"][..], ["ml-dev", "ml-prod"]);
        assert_eq!(m.missing["ml"], ["gone"]);
        assert_eq!(m.team_of("ml-prod"), Some("ml"));
        assert_eq!(m.team_of("web"), None);
    }

    #[test]
    fn a_namespace_claimed_twice_belongs_to_neither_and_both_name_the_other() {
        let namespaces = [ns("shared", &[("teamgpu.io/team", "a")]), ns("b-only", &[])];
        let m = resolve(
            &[
                team("a", Some("a"), &[]),
                team("b", None, &["shared", "b-only"]),
            ],
            &namespaces,
        );
        assert!(m.namespaces["a"].is_empty());
        assert_eq!(m.namespaces["b"][..], ["b-only"]);
        assert_eq!(m.conflicts["a"]["shared"], ["b"]);
        assert_eq!(m.conflicts["b"]["shared"], ["a"]);
        assert_eq!(m.team_of("shared"), None);
    }

    #[test]
    fn a_namespace_claimed_twice_stays_with_the_team_that_had_it() {
        let namespaces = [ns("a-train", &[("teamgpu.io/team", "a")])];
        let mut a = team("a", None, &["a-train"]);
        a.status = Some(crate::api::TeamGpuPolicyStatus {
            namespaces: vec!["a-train".into()].into(),
            ..Default::default()
        });
        // b selects a's namespace by its label: it takes nothing from a.
        let m = resolve(&[a.clone(), team("b", Some("a"), &[])], &namespaces);
        assert_eq!(m.team_of("a-train"), Some("a"));
        assert_eq!(m.kept["a-train"], "a");
        assert_eq!(m.conflicts["b"]["a-train"], ["a"]);
        // When both say they had it (a status not yet rewritten), neither gets it.
        let mut b = team("b", Some("a"), &[]);
        b.status = a.status.clone();
        let m = resolve(&[a, b], &namespaces);
        assert_eq!(m.team_of("a-train"), None);
        assert!(m.kept.is_empty());
    }

    #[test]
    fn match_expressions_follow_kubernetes_semantics() {
        let labels: BTreeMap<String, String> = [("tier".to_string(), "gold".to_string())].into();
        let expr = |op: &str, values: &[&str]| LabelSelector {
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: "tier".into(),
                operator: op.into(),
                values: (!values.is_empty())
                    .then(|| values.iter().map(|v| v.to_string()).collect()),
            }]),
            ..Default::default()
        };
        assert_eq!(
            label_selector_matches(&expr("In", &["gold", "silver"]), &labels),
            Ok(true)
        );
        assert_eq!(
            label_selector_matches(&expr("NotIn", &["gold"]), &labels),
            Ok(false)
        );
        assert_eq!(
            label_selector_matches(&expr("NotIn", &["gold"]), &BTreeMap::new()),
            Ok(true)
        );
        assert_eq!(
            label_selector_matches(&expr("Exists", &[]), &labels),
            Ok(true)
        );
        assert_eq!(
            label_selector_matches(&expr("DoesNotExist", &[]), &labels),
            Ok(false)
        );
        assert!(matches!(
            label_selector_matches(&expr("In", &[]), &labels),
            Err(LabelSelectorError::MissingValues { .. })
        ));
        assert!(matches!(
            label_selector_matches(&expr("Exists", &["x"]), &labels),
            Err(LabelSelectorError::UnexpectedValues { .. })
        ));
        assert!(matches!(
            label_selector_matches(&expr("Gt", &["1"]), &labels),
            Err(LabelSelectorError::UnknownOperator { .. })
        ));
    }
}
