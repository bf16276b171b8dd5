//! The what-if of `teamgpu plan --live`: a change to policies (or any planner input) laid over the
//! live cluster, and what it would do: the writes the operator would make against the objects it
//! manages, and each team's numbers before and after. Pure; needs no client.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use serde::Serialize;
use serde_json::Value;

use crate::api::QuotaStatus;
use crate::cli::output::{align, tree_order};
use crate::core::diff::{self, ObjectKey, Write};
use crate::core::plan::Plan;
use crate::core::state::ClusterState;

/// `base` with `changes` laid over it: an object of `changes` replaces the one of the same kind
/// and name (namespace and name for claims), others are added. A replaced policy keeps its
/// live uid, so the objects generated from it keep their owner (a file has no uid).
pub fn overlay(base: &ClusterState, changes: ClusterState) -> ClusterState {
    fn merge<T: Clone>(base: &[T], changes: Vec<T>, key: impl Fn(&T) -> String) -> Vec<T> {
        let replaced: BTreeSet<String> = changes.iter().map(&key).collect();
        base.iter()
            .filter(|item| !replaced.contains(&key(item)))
            .cloned()
            .chain(changes)
            .collect()
    }
    fn name<K: kube::Resource>(object: &K) -> String {
        let meta = object.meta();
        format!(
            "{}/{}",
            meta.namespace.as_deref().unwrap_or_default(),
            meta.name.as_deref().unwrap_or_default()
        )
    }
    fn keep_uid<K: kube::Resource>(base: &[K], mut changes: Vec<K>) -> Vec<K> {
        for changed in &mut changes {
            if changed.meta().uid.is_none()
                && let Some(live) = base.iter().find(|b| name(*b) == name(changed))
            {
                changed.meta_mut().uid = live.meta().uid.clone();
            }
        }
        changes
    }
    let sharing = keep_uid(&base.sharing_policies, changes.sharing_policies);
    let teams = keep_uid(&base.teams, changes.teams);
    ClusterState {
        sharing_policies: merge(&base.sharing_policies, sharing, name),
        teams: merge(&base.teams, teams, name),
        namespaces: merge(&base.namespaces, changes.namespaces, |n| n.name.clone()),
        device_classes: merge(&base.device_classes, changes.device_classes, name),
        slices: merge(&base.slices, changes.slices, name),
        claims: merge(&base.claims, changes.claims, name),
        pending: base.pending.clone(),
        operator_user: base.operator_user.clone(),
        admin_groups: base.admin_groups.clone(),
        unreadable_sharing_policies: base.unreadable_sharing_policies.clone(),
        unreadable_teams: base.unreadable_teams.clone(),
        enforcement: base.enforcement,
        crd_owners: base.crd_owners.clone(),
        device_taints: base.device_taints.clone(),
    }
}

/// What a write would do to a live object.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    Create,
    Update,
    Recreate,
    Delete,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Create => "create",
            Action::Update => "update",
            Action::Recreate => "recreate",
            Action::Delete => "delete",
        }
    }
}

/// One object the operator would write.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Change {
    pub action: Action,
    pub kind: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    pub name: String,
    /// The object as it would be applied (none for a deletion).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub object: Option<Value>,
    #[serde(skip)]
    key: ObjectKey,
}

impl Change {
    /// `update resourcequota ml-dev/teamgpu`.
    pub fn line(&self) -> String {
        format!("{} {}", self.action.as_str(), self.key)
    }
}

/// The writes that would make `live` (the objects teamgpu manages, as listed) what `plan` wants,
/// in the order the operator makes them.
pub fn changes(plan: &Plan, live: &BTreeMap<ObjectKey, Value>) -> Vec<Change> {
    let desired = diff::desired(&plan.objects);
    diff::writes(
        &desired,
        &plan.objects.retained_device_classes,
        &plan.objects.retained_owners,
        live,
    )
    .into_iter()
    .map(|write| {
        let key = write.key().clone();
        let (action, object) = match write {
            Write::Apply { key, object } if live.contains_key(&key) => {
                (Action::Update, Some(object.to_value()))
            }
            Write::Apply { object, .. } => (Action::Create, Some(object.to_value())),
            Write::Recreate { object, .. } => (Action::Recreate, Some(object.to_value())),
            Write::Delete { .. } => (Action::Delete, None),
        };
        Change {
            action,
            kind: key.kind.api_resource().kind,
            namespace: key.namespace.clone(),
            name: key.name.clone(),
            object,
            key,
        }
    })
    .collect()
}

/// A team's numbers for one sharing policy.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TeamNumbers {
    pub guaranteed: u32,
    pub effective_guarantee: u32,
    pub limit: u32,
    pub entitlement: u32,
    pub borrowed: u32,
    pub capacity: u32,
}

impl From<&QuotaStatus> for TeamNumbers {
    fn from(q: &QuotaStatus) -> Self {
        TeamNumbers {
            guaranteed: q.guaranteed,
            effective_guarantee: q.effective_guarantee,
            limit: q.limit,
            entitlement: q.entitlement,
            borrowed: q.borrowed,
            capacity: q.capacity,
        }
    }
}

/// A team's numbers for one sharing policy, before and after (none: no such quota then).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TeamDiff {
    pub team: String,
    /// The department the team is planned in after the change (before, if it goes).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub department: Option<String>,
    /// How many departments are above it: teams come in tree order, each department before
    /// its members.
    pub depth: u32,
    pub sharing_policy: String,
    pub before: Option<TeamNumbers>,
    pub after: Option<TeamNumbers>,
}

/// A sharing policy's numbers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SharingNumbers {
    pub devices: u32,
    pub used_outside_teams: u32,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SharingDiff {
    pub name: String,
    pub before: Option<SharingNumbers>,
    pub after: Option<SharingNumbers>,
}

/// Everything `plan --live` reports.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WhatIf {
    pub changes: Vec<Change>,
    pub teams: Vec<TeamDiff>,
    pub sharing_policies: Vec<SharingDiff>,
    /// The plan's warnings after the change.
    pub warnings: Vec<String>,
}

/// `before` is the plan of the live cluster, `after` the plan with the change laid over it.
pub fn what_if(before: &Plan, after: &Plan, live: &BTreeMap<ObjectKey, Value>) -> WhatIf {
    let quotas = |plan: &Plan| -> BTreeMap<(String, String), TeamNumbers> {
        plan.teams
            .iter()
            .flat_map(|t| {
                t.quotas
                    .iter()
                    .map(|q| ((t.name.clone(), q.sharing_policy.clone()), q.into()))
            })
            .collect()
    };
    let (mut old, mut new) = (quotas(before), quotas(after));
    let keys: BTreeSet<(String, String)> = old.keys().chain(new.keys()).cloned().collect();
    // Each team's department after the change, else before it.
    let mut parents: BTreeMap<String, Option<String>> = BTreeMap::new();
    for t in before.teams.iter().chain(&after.teams) {
        parents.insert(t.name.clone(), t.department.clone());
    }
    let place: BTreeMap<String, (usize, u32)> = (tree_order(&parents).into_iter().enumerate())
        .map(|(i, (team, depth))| (team, (i, depth)))
        .collect();
    let mut teams: Vec<TeamDiff> = keys
        .into_iter()
        .map(|key| TeamDiff {
            before: old.remove(&key),
            after: new.remove(&key),
            department: parents.get(&key.0).cloned().flatten(),
            depth: place.get(&key.0).map_or(0, |p| p.1),
            team: key.0,
            sharing_policy: key.1,
        })
        .collect();
    teams.sort_by_key(|t| place.get(&t.team).map_or(usize::MAX, |p| p.0));
    let pools = |plan: &Plan| -> BTreeMap<String, SharingNumbers> {
        plan.sharing_policies
            .iter()
            .map(|p| {
                let numbers = SharingNumbers {
                    devices: p.capacity,
                    used_outside_teams: p.used_outside_teams,
                };
                (p.name.clone(), numbers)
            })
            .collect()
    };
    let (mut old, mut new) = (pools(before), pools(after));
    let names: BTreeSet<String> = old.keys().chain(new.keys()).cloned().collect();
    let sharing_policies = names
        .into_iter()
        .map(|name| SharingDiff {
            before: old.remove(&name),
            after: new.remove(&name),
            name,
        })
        .collect();
    WhatIf {
        changes: changes(after, live),
        teams,
        sharing_policies,
        warnings: after.warnings.clone(),
    }
}

/// One number before and after: `5` when it stays, `5 -> 7` when it changes, `- -> 7` for a new
/// quota, `5 -> -` for one that goes.
fn cell<T>(before: Option<&T>, after: Option<&T>, show: impl Fn(&T) -> String) -> String {
    match (before.map(&show), after.map(&show)) {
        (Some(b), Some(a)) if b == a => a,
        (b, a) => format!(
            "{} -> {}",
            b.as_deref().unwrap_or("-"),
            a.as_deref().unwrap_or("-")
        ),
    }
}

fn guarantee(n: &TeamNumbers) -> String {
    if n.effective_guarantee < n.guaranteed && n.capacity > 0 {
        format!("{} (of {})", n.effective_guarantee, n.guaranteed)
    } else {
        n.guaranteed.to_string()
    }
}

/// The what-if for people: the object changes, then each team's numbers with `before -> after`
/// where they change.
pub fn table(what_if: &WhatIf) -> String {
    let mut out = String::new();
    if what_if.changes.is_empty() {
        let _ = writeln!(out, "No object changes.");
    } else {
        let _ = writeln!(out, "Object changes ({}):", what_if.changes.len());
        for change in &what_if.changes {
            let _ = writeln!(out, "  {}", change.line());
        }
    }
    let _ = writeln!(out);
    let mut rows = vec![
        [
            "TEAM",
            "SHARING POLICY",
            "GUARANTEED",
            "LIMIT",
            "ENTITLEMENT",
            "BORROWED",
            "CAPACITY",
            "",
        ]
        .map(str::to_owned)
        .to_vec(),
    ];
    for t in &what_if.teams {
        let (b, a) = (t.before.as_ref(), t.after.as_ref());
        let n = |f: fn(&TeamNumbers) -> u32| cell(b, a, |x| f(x).to_string());
        rows.push(vec![
            format!("{}{}", "  ".repeat(t.depth as usize), t.team),
            t.sharing_policy.clone(),
            cell(b, a, guarantee),
            n(|x| x.limit),
            n(|x| x.entitlement),
            n(|x| x.borrowed),
            n(|x| x.capacity),
            if b != a { "*".into() } else { String::new() },
        ]);
    }
    out.push_str(&align(&rows));
    let _ = writeln!(out, "\nSharing policies:");
    let mut rows = vec![
        ["NAME", "DEVICES", "USED OUTSIDE TEAMS", ""]
            .map(str::to_owned)
            .to_vec(),
    ];
    for p in &what_if.sharing_policies {
        let (b, a) = (p.before.as_ref(), p.after.as_ref());
        rows.push(vec![
            p.name.clone(),
            cell(b, a, |x| x.devices.to_string()),
            cell(b, a, |x| x.used_outside_teams.to_string()),
            if b != a { "*".into() } else { String::new() },
        ]);
    }
    out.push_str(&align(&rows));
    if !what_if.warnings.is_empty() {
        let _ = writeln!(out, "\nWarnings:");
        for w in &what_if.warnings {
            let _ = writeln!(out, "  - {w}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn numbers(guaranteed: u32, entitlement: u32) -> TeamNumbers {
        TeamNumbers {
            guaranteed,
            effective_guarantee: guaranteed,
            limit: 16,
            entitlement,
            borrowed: entitlement.saturating_sub(guaranteed),
            capacity: 32,
        }
    }

    #[test]
    fn the_table_marks_what_changes_and_shows_new_and_gone_quotas() {
        let what_if = WhatIf {
            changes: vec![],
            teams: vec![
                TeamDiff {
                    team: "a".into(),
                    department: None,
                    depth: 0,
                    sharing_policy: "p".into(),
                    before: Some(numbers(8, 15)),
                    after: Some(numbers(12, 16)),
                },
                TeamDiff {
                    team: "b".into(),
                    department: None,
                    depth: 0,
                    sharing_policy: "p".into(),
                    before: Some(numbers(4, 4)),
                    after: Some(numbers(4, 4)),
                },
                TeamDiff {
                    team: "c".into(),
                    department: None,
                    depth: 0,
                    sharing_policy: "p".into(),
                    before: None,
                    after: Some(numbers(2, 2)),
                },
            ],
            sharing_policies: vec![],
            warnings: vec![],
        };
        let text = table(&what_if);
        let cells = |line: &str| -> Vec<String> {
            line.split("  ")
                .map(str::trim)
                .filter(|c| !c.is_empty())
                .map(str::to_owned)
                .collect()
        };
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "No object changes.");
        assert_eq!(
            cells(lines[2]),
            [
                "TEAM",
                "SHARING POLICY",
                "GUARANTEED",
                "LIMIT",
                "ENTITLEMENT",
                "BORROWED",
                "CAPACITY"
            ]
        );
        assert_eq!(
            cells(lines[3]),
            ["a", "p", "8 -> 12", "16", "15 -> 16", "7 -> 4", "32", "*"]
        );
        assert_eq!(cells(lines[4]), ["b", "p", "4", "16", "4", "0", "32"]);
        assert_eq!(
            cells(lines[5]),
            [
                "c", "p", "- -> 2", "- -> 16", "- -> 2", "- -> 0", "- -> 32", "*"
            ]
        );
    }

    #[test]
    fn changes_name_what_the_operator_would_write_to_the_live_objects() {
        let state = crate::cli::example::state().unwrap();
        let plan = crate::core::plan::plan(&state);
        let mut live = diff::desired(&plan.objects);
        assert_eq!(
            changes(&plan, &live),
            vec![],
            "live as planned: nothing to write"
        );

        let quota = live
            .keys()
            .find(|k| k.kind == diff::Kind::ResourceQuota)
            .unwrap()
            .clone();
        live.get_mut(&quota).unwrap()["spec"]["hard"] = serde_json::json!({});
        let class = live
            .keys()
            .find(|k| k.kind == diff::Kind::DeviceClass)
            .unwrap()
            .clone();
        live.remove(&class);
        let stale = ObjectKey {
            kind: diff::Kind::ResourceClaimTemplate,
            namespace: Some("web".into()),
            name: "old".into(),
        };
        live.insert(stale, serde_json::json!({"metadata": {"name": "old"}}));
        let lines: Vec<String> = changes(&plan, &live).iter().map(Change::line).collect();
        assert_eq!(
            lines,
            [
                "create deviceclass a100-80gb.teamgpu.io",
                "update resourcequota data-science/teamgpu",
                "delete resourceclaimtemplate web/old",
            ]
        );
    }

    #[test]
    fn overlay_replaces_same_named_policies_and_keeps_their_uid() {
        let mut base = crate::cli::example::state().unwrap();
        base.teams[0].metadata.uid = Some("uid-live".into());
        let name = base.teams[0].metadata.name.clone().unwrap();
        let mut changed = base.teams[0].clone();
        changed.metadata.uid = None;
        changed.spec.weight = 7;
        let merged = overlay(
            &base,
            ClusterState {
                teams: vec![changed],
                ..ClusterState::default()
            },
        );
        assert_eq!(merged.teams.len(), base.teams.len());
        let team = merged
            .teams
            .iter()
            .find(|t| t.metadata.name.as_deref() == Some(name.as_str()))
            .unwrap();
        assert_eq!(
            (team.spec.weight, team.metadata.uid.as_deref()),
            (7, Some("uid-live"))
        );
        assert_eq!(merged.slices.len(), base.slices.len());
    }

    #[test]
    fn departments_come_before_their_members_with_the_change_at_each_level() {
        let team = |v: serde_json::Value| -> crate::api::TeamGpuPolicy {
            let mut v = v;
            v["apiVersion"] = "teamgpu.io/v1alpha1".into();
            v["kind"] = "TeamGpuPolicy".into();
            serde_json::from_value(v).unwrap()
        };
        let a100 = |g: u32| serde_json::json!([{"sharingPolicy": "a100-80gb", "guaranteed": g, "limit": 32}]);
        let tree = |research: u32| {
            vec![
                team(serde_json::json!({"metadata": {"name": "research"},
                    "spec": {"department": true, "quotas": a100(research)}})),
                team(
                    serde_json::json!({"metadata": {"name": "ml-research"}, "spec": {"parent": "research",
                    "namespaces": ["ml-research-dev", "ml-research-train"], "quotas": a100(8)}}),
                ),
                team(
                    serde_json::json!({"metadata": {"name": "data-science"}, "spec": {"parent": "research",
                    "namespaces": ["data-science"], "quotas": a100(8)}}),
                ),
                team(
                    serde_json::json!({"metadata": {"name": "inference"}, "spec": {
                    "namespaces": ["inference-canary", "inference-prod"], "quotas": a100(16)}}),
                ),
            ]
        };
        let mut before = crate::cli::example::state().unwrap();
        before.teams = tree(16);
        let mut after = before.clone();
        after.teams = tree(12);
        let plan = crate::core::plan::plan;
        let what_if = what_if(&plan(&before), &plan(&after), &BTreeMap::new());
        let text = table(&what_if);
        let rows: Vec<(&str, &str)> = (text.lines())
            .skip_while(|l| !l.starts_with("TEAM"))
            .skip(1)
            .take_while(|l| !l.trim().is_empty())
            .map(|l| (l.split("  a100").next().unwrap().trim_end(), l))
            .collect();
        let names: Vec<&str> = rows.iter().map(|r| r.0).collect();
        assert_eq!(
            names,
            ["inference", "research", "  data-science", "  ml-research"]
        );
        // The department's own guarantee changes, and its members' entitlements follow.
        assert!(rows[1].1.contains("16 -> 12"), "{text}");
        assert_eq!(what_if.teams[2].department.as_deref(), Some("research"));
    }
}
