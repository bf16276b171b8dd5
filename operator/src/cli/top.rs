//! `teamgpu top`: each team's devices now, as the operator last reported them in the policies'
//! status. [`top`] and [`table`] are pure; [`read`] reads the policies: every one for whoever
//! may list them, else the reader's own team (a member, whom teamgpu's member ClusterRole lets
//! read only that team and its GpuSharingPolicies).

use std::fmt::Write as _;

use kube::{Api, Client};
use serde::Serialize;

use crate::api::{GpuSharingPolicy, TeamGpuPolicy};
use crate::cli::cluster::{Policies, ReadError};
use crate::cli::output::align;
use crate::core::plan::objects::QUOTA_NAME;
use crate::core::plan::objects::QUOTA_TEAM_ANNOTATION;

/// Why `teamgpu top` found no team to show.
#[derive(Debug, thiserror::Error)]
pub enum TopError {
    #[error(transparent)]
    Read(#[from] ReadError),
    #[error(
        "you may not list TeamGpuPolicies, and {reason}: pass --team <name>, or -n <a namespace \
         of your team>"
    )]
    NoTeam { reason: String },
    #[error(
        "you may not read TeamGpuPolicy {team}: a team's spec.members may read it (ask the \
         platform team to add you there), and `kubectl get tgp {team}` fails the same way"
    )]
    TeamForbidden { team: String },
    #[error("there is no TeamGpuPolicy {0}")]
    NoSuchTeam(String),
    #[error("reading {what}: {source}")]
    Get { what: String, source: kube::Error },
}

fn status_code(error: &kube::Error) -> Option<u16> {
    match error {
        kube::Error::Api(status) => Some(status.code),
        _ => None,
    }
}

/// The policies `teamgpu top` shows: every one (only `team` and its GpuSharingPolicies, when
/// given), or, for a reader who may not list the teams, their own team: `team`, or the team that
/// the teamgpu ResourceQuota of `namespace` names.
pub async fn read(
    client: &Client,
    team: Option<&str>,
    namespace: &str,
) -> Result<Policies, TopError> {
    match crate::cli::cluster::policies(client).await {
        Ok(mut all) => {
            if let Some(team) = team {
                all.teams
                    .retain(|t| t.metadata.name.as_deref() == Some(team));
                let Some(found) = all.teams.first() else {
                    return Err(TopError::NoSuchTeam(team.to_owned()));
                };
                let used = sharing_policies_of(found);
                all.sharing_policies
                    .retain(|p| used.contains(&p.metadata.name.clone().unwrap_or_default()));
            }
            Ok(all)
        }
        Err(ReadError::List { source, .. }) if status_code(&source) == Some(403) => {
            own_team(client, team, namespace).await
        }
        Err(error) => Err(error.into()),
    }
}

fn sharing_policies_of(team: &TeamGpuPolicy) -> Vec<String> {
    team.spec
        .quotas
        .iter()
        .map(|q| q.sharing_policy.clone())
        .collect()
}

/// The reader's own team and its GpuSharingPolicies, read one by one.
async fn own_team(
    client: &Client,
    team: Option<&str>,
    namespace: &str,
) -> Result<Policies, TopError> {
    let mut notes = Vec::new();
    let name = match team {
        Some(team) => team.to_owned(),
        None => {
            let name = team_of_namespace(client, namespace).await?;
            notes.push(format!(
                "you may not list every team: showing {name}, the team of namespace {namespace}"
            ));
            name
        }
    };
    let team = match Api::<TeamGpuPolicy>::all(client.clone()).get(&name).await {
        Ok(team) => team,
        Err(source) => {
            return Err(match status_code(&source) {
                Some(403) => TopError::TeamForbidden { team: name },
                Some(404) => TopError::NoSuchTeam(name),
                _ => TopError::Get {
                    what: format!("TeamGpuPolicy {name}"),
                    source,
                },
            });
        }
    };
    let policies: Api<GpuSharingPolicy> = Api::all(client.clone());
    let mut sharing_policies = Vec::new();
    for policy in sharing_policies_of(&team) {
        match policies.get(&policy).await {
            Ok(p) => sharing_policies.push(p),
            Err(error) => notes.push(format!("GpuSharingPolicy {policy} left out: {error}")),
        }
    }
    Ok(Policies {
        sharing_policies,
        teams: vec![team],
        notes,
    })
}

/// The team the teamgpu ResourceQuota of `namespace` names (readable with `view` there).
async fn team_of_namespace(client: &Client, namespace: &str) -> Result<String, TopError> {
    let quotas: Api<k8s_openapi::api::core::v1::ResourceQuota> =
        Api::namespaced(client.clone(), namespace);
    let reason = match quotas.get_opt(QUOTA_NAME).await {
        Ok(Some(quota)) => {
            let team = quota
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(QUOTA_TEAM_ANNOTATION));
            match team {
                Some(team) if !team.is_empty() => return Ok(team.clone()),
                _ => {
                    format!("the ResourceQuota {QUOTA_NAME} in namespace {namespace} names no team")
                }
            }
        }
        Ok(None) => format!(
            "namespace {namespace} belongs to no team (it has no ResourceQuota {QUOTA_NAME})"
        ),
        Err(error) => format!(
            "the ResourceQuota {QUOTA_NAME} in namespace {namespace} cannot be read ({error})"
        ),
    };
    Err(TopError::NoTeam { reason })
}

/// One team's devices of one sharing policy.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TeamRow {
    pub team: String,
    /// The department the team is in (`spec.parent`), when it names one that is listed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    /// How many departments are above the team: rows come in tree order, each department
    /// before its members.
    pub depth: u32,
    pub sharing_policy: String,
    pub guaranteed: u32,
    pub effective_guarantee: u32,
    pub entitlement: u32,
    pub allocated: u32,
    pub borrowed: u32,
    pub pending: u32,
    pub capacity: u32,
    /// The entitlement and the allocated devices in GPU-equivalents (absent from a status of
    /// an operator before 0.1).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu_equivalents: Option<crate::api::QuotaEquivalents>,
}

/// One sharing policy's devices.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SharingRow {
    pub name: String,
    pub device_class: Option<String>,
    pub devices: u32,
    pub used_outside_teams: u32,
    /// GPU-equivalents of one device.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu_equivalents_per_device: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Top {
    pub teams: Vec<TeamRow>,
    pub sharing_policies: Vec<SharingRow>,
    /// Policies the operator has not reported on yet (no status), or not since their last
    /// change (`observedGeneration` behind `generation`).
    pub not_reported: Vec<String>,
}

fn stale(generation: Option<i64>, observed: Option<i64>) -> bool {
    generation.is_some() && observed != generation
}

/// The rows of the policies' status, sorted by team and sharing policy.
pub fn top(teams: &[TeamGpuPolicy], sharing_policies: &[GpuSharingPolicy]) -> Top {
    let mut out = Top::default();
    for team in teams {
        let name = team.metadata.name.clone().unwrap_or_default();
        let status = team.status.as_ref();
        if stale(
            team.metadata.generation,
            status.and_then(|s| s.observed_generation),
        ) {
            out.not_reported.push(format!("TeamGpuPolicy {name}"));
        }
        for q in status.map(|s| s.quotas.as_slice()).unwrap_or_default() {
            out.teams.push(TeamRow {
                team: name.clone(),
                parent: team.spec.parent.clone(),
                depth: 0,
                sharing_policy: q.sharing_policy.clone(),
                guaranteed: q.guaranteed,
                effective_guarantee: q.effective_guarantee,
                entitlement: q.entitlement,
                allocated: q.allocated,
                borrowed: q.borrowed,
                pending: q.pending,
                capacity: q.capacity,
                gpu_equivalents: q.gpu_equivalents.clone(),
            });
        }
    }
    for policy in sharing_policies {
        let name = policy.metadata.name.clone().unwrap_or_default();
        let status = policy.status.as_ref();
        if stale(
            policy.metadata.generation,
            status.and_then(|s| s.observed_generation),
        ) {
            out.not_reported.push(format!("GpuSharingPolicy {name}"));
        }
        out.sharing_policies.push(SharingRow {
            name,
            device_class: status.and_then(|s| s.device_class_name.clone()),
            devices: status.map_or(0, |s| s.devices),
            // Absent when zero.
            used_outside_teams: status.map_or(0, |s| s.used_outside_teams),
            gpu_equivalents_per_device: status
                .and_then(|s| Some(s.gpu_equivalents.as_ref()?.per_device.clone())),
        });
    }
    out.teams = in_tree_order(out.teams);
    out.sharing_policies.sort_by(|a, b| a.name.cmp(&b.name));
    out.not_reported.sort();
    out
}

/// `rows` with each department's members after it (indented by their depth), in
/// [`tree_order`](crate::cli::output::tree_order).
fn in_tree_order(mut rows: Vec<TeamRow>) -> Vec<TeamRow> {
    let parents: std::collections::BTreeMap<String, Option<String>> = (rows.iter())
        .map(|r| (r.team.clone(), r.parent.clone()))
        .collect();
    let place: std::collections::BTreeMap<String, (usize, u32)> =
        (crate::cli::output::tree_order(&parents)
            .into_iter()
            .enumerate())
        .map(|(i, (team, depth))| (team, (i, depth)))
        .collect();
    for r in &mut rows {
        r.depth = place[&r.team].1;
    }
    rows.sort_by(|a, b| {
        (place[&a.team].0, &a.sharing_policy).cmp(&(place[&b.team].0, &b.sharing_policy))
    });
    rows
}

/// A table per team and sharing policy, then one per sharing policy.
pub fn table(top: &Top) -> String {
    let mut rows = vec![
        [
            "TEAM",
            "SHARING POLICY",
            "GUARANTEED",
            "ENTITLEMENT",
            "ALLOCATED",
            "BORROWED",
            "PENDING",
            "CAPACITY",
            "GPU-EQ ENTITLED",
            "GPU-EQ ALLOCATED",
        ]
        .map(str::to_owned)
        .to_vec(),
    ];
    for r in &top.teams {
        let ge = r.gpu_equivalents.as_ref();
        let guaranteed = if r.effective_guarantee < r.guaranteed && r.capacity > 0 {
            format!("{} (of {})", r.effective_guarantee, r.guaranteed)
        } else {
            r.guaranteed.to_string()
        };
        rows.push(vec![
            format!("{}{}", "  ".repeat(r.depth as usize), r.team),
            r.sharing_policy.clone(),
            guaranteed,
            r.entitlement.to_string(),
            r.allocated.to_string(),
            r.borrowed.to_string(),
            r.pending.to_string(),
            r.capacity.to_string(),
            ge.map_or("-".into(), |g| g.entitlement.clone()),
            ge.map_or("-".into(), |g| g.allocated.clone()),
        ]);
    }
    let mut out = align(&rows);
    let _ = writeln!(out);
    let mut rows = vec![
        [
            "SHARING POLICY",
            "DEVICE CLASS",
            "DEVICES",
            "USED OUTSIDE TEAMS",
            "GPU-EQ PER DEVICE",
        ]
        .map(str::to_owned)
        .to_vec(),
    ];
    for r in &top.sharing_policies {
        rows.push(vec![
            r.name.clone(),
            r.device_class.clone().unwrap_or_else(|| "-".into()),
            r.devices.to_string(),
            r.used_outside_teams.to_string(),
            (r.gpu_equivalents_per_device.clone()).unwrap_or_else(|| "-".into()),
        ]);
    }
    out.push_str(&align(&rows));
    if !top.not_reported.is_empty() {
        let _ = writeln!(
            out,
            "\nNot reported by the operator yet (status missing or older than the spec):"
        );
        for p in &top.not_reported {
            let _ = writeln!(out, "  {p}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn rows_come_from_the_status_and_a_policy_without_one_is_named() {
        let team: TeamGpuPolicy = serde_json::from_value(json!({
            "apiVersion": "teamgpu.io/v1alpha1", "kind": "TeamGpuPolicy",
            "metadata": {"name": "ml", "generation": 2},
            "spec": {"namespaces": ["ml"]},
            "status": {"observedGeneration": 2, "quotas": [{"sharingPolicy": "a100",
                "guaranteed": 8, "effectiveGuarantee": 6, "limit": 16, "weight": 1, "capacity": 32,
                "entitlement": 10, "borrowed": 4, "requested": 9, "allocated": 9, "pending": 1,
                "gpuEquivalents": {"perDevice": "0.6", "entitlement": "6", "allocated": "5.4"}}]}
        }))
        .unwrap();
        let new: TeamGpuPolicy = serde_json::from_value(json!({
            "apiVersion": "teamgpu.io/v1alpha1", "kind": "TeamGpuPolicy",
            "metadata": {"name": "new", "generation": 1}, "spec": {"namespaces": ["n"]}
        }))
        .unwrap();
        let sharing: GpuSharingPolicy = serde_json::from_value(json!({
            "apiVersion": "teamgpu.io/v1alpha1", "kind": "GpuSharingPolicy",
            "metadata": {"name": "a100", "generation": 1}, "spec": {},
            "status": {"observedGeneration": 1, "deviceClassName": "a100.teamgpu.io", "devices": 32}
        }))
        .unwrap();
        let top = top(&[new, team], &[sharing]);
        assert_eq!(top.not_reported, ["TeamGpuPolicy new"]);
        let text = table(&top);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[1].split_whitespace().collect::<Vec<_>>(),
            [
                "ml", "a100", "6", "(of", "8)", "10", "9", "4", "1", "32", "6", "5.4"
            ]
        );
        assert_eq!(
            lines[4].split_whitespace().collect::<Vec<_>>(),
            ["a100", "a100.teamgpu.io", "32", "0", "-"]
        );
        assert!(text.contains("\n  TeamGpuPolicy new\n"), "{text}");
    }

    #[test]
    fn departments_come_before_their_members_indented_and_a_cycle_stays_at_the_top() {
        let tgp = |name: &str, parent: Option<&str>| -> TeamGpuPolicy {
            serde_json::from_value(json!({
                "apiVersion": "teamgpu.io/v1alpha1", "kind": "TeamGpuPolicy",
                "metadata": {"name": name}, "spec": {"parent": parent, "namespaces": ["n"]},
                "status": {"quotas": [{"sharingPolicy": "a100", "guaranteed": 1,
                    "effectiveGuarantee": 1, "limit": 1, "weight": 1, "capacity": 8,
                    "entitlement": 1, "borrowed": 0, "requested": 0, "allocated": 0,
                    "pending": 0}]}
            }))
            .unwrap()
        };
        let teams = [
            tgp("vision", Some("research")),
            tgp("inference", None),
            tgp("x", Some("y")),
            tgp("lab", Some("research")),
            tgp("research", None),
            tgp("robots", Some("lab")),
            tgp("y", Some("x")),
            tgp("orphan", Some("gone")),
        ];
        let text = table(&top(&teams, &[]));
        let names: Vec<&str> = (text.lines().skip(1))
            .take_while(|l| !l.trim().is_empty())
            .map(|l| l.split("  a100").next().unwrap().trim_end())
            .collect();
        assert_eq!(
            names,
            [
                "inference",
                "orphan",
                "research",
                "  lab",
                "    robots",
                "  vision",
                "x",
                "  y"
            ]
        );
    }
}
