//! What a team's members may read: their own TeamGpuPolicy and the GpuSharingPolicies of its
//! quotas, so that `kubectl get tgp <team>` and `teamgpu top` work for someone who has nothing
//! but `edit` in a team namespace. Pure.
//!
//! One ClusterRole and one ClusterRoleBinding per team with `spec.members`, both named
//! [`member_role_name`] and owned by the team (deleting the team deletes them). The policies are
//! cluster-scoped, so a namespaced Role cannot grant them; `resourceNames` keeps each team to
//! its own policy. The operator may write a role only with permissions it holds itself (the
//! RBAC escalation check): `get`, `list` and `watch` on both kinds, granted in `config/rbac`.

use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, RoleRef, Subject};

use super::objects::owned_meta;
use crate::api::{GROUP, MemberKind, TeamGpuPolicy};

const RBAC_GROUP: &str = "rbac.authorization.k8s.io";
/// What a member may do with the policies named: read them, one at a time or by name in a list
/// or watch (`--field-selector metadata.name=<name>`, which `kubectl get <kind> <name>` and
/// `--watch` send).
const READ: [&str; 3] = ["get", "list", "watch"];

/// The name of a team's member ClusterRole and ClusterRoleBinding.
pub fn member_role_name(team: &str) -> String {
    format!("teamgpu-member-{team}")
}

/// The ClusterRole and ClusterRoleBinding that let `team`'s `spec.members` read the team and the
/// GpuSharingPolicies its quotas name; `None` for a team without members.
pub fn member_access(team: &TeamGpuPolicy) -> Option<(ClusterRole, ClusterRoleBinding)> {
    if team.spec.members.is_empty() {
        return None;
    }
    let team_name = team.metadata.name.clone().unwrap_or_default();
    let name = member_role_name(&team_name);
    let rule = |resource: &str, names: Vec<String>| PolicyRule {
        api_groups: Some(vec![GROUP.to_owned()]),
        resources: Some(vec![resource.to_owned()]),
        resource_names: Some(names),
        verbs: READ.map(str::to_owned).to_vec(),
        non_resource_urls: None,
    };
    let mut sharing: Vec<String> = team
        .spec
        .quotas
        .iter()
        .map(|q| q.sharing_policy.clone())
        .collect();
    sharing.sort();
    sharing.dedup();
    let mut rules = vec![rule("teamgpupolicies", vec![team_name])];
    if !sharing.is_empty() {
        rules.push(rule("gpusharingpolicies", sharing));
    }
    let role = ClusterRole {
        metadata: owned_meta(team, name.clone(), None),
        rules: Some(rules),
        aggregation_rule: None,
    };
    let binding = ClusterRoleBinding {
        metadata: owned_meta(team, name.clone(), None),
        role_ref: RoleRef {
            api_group: RBAC_GROUP.to_owned(),
            kind: "ClusterRole".to_owned(),
            name,
        },
        subjects: Some(team.spec.members.iter().map(subject).collect()),
    };
    Some((role, binding))
}

/// A member as a binding's subject, as the API server stores it: a User or Group in the RBAC
/// group, a ServiceAccount in none (the server leaves its `apiGroup` empty, and an empty one
/// sent would never match what it returns).
fn subject(member: &crate::api::Member) -> Subject {
    let (kind, api_group) = match member.kind {
        MemberKind::User => ("User", Some(RBAC_GROUP.to_owned())),
        MemberKind::Group => ("Group", Some(RBAC_GROUP.to_owned())),
        MemberKind::ServiceAccount => ("ServiceAccount", None),
    };
    Subject {
        api_group,
        kind: kind.to_owned(),
        name: member.name.clone(),
        namespace: member.namespace.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn team(spec: serde_json::Value) -> TeamGpuPolicy {
        serde_json::from_value(json!({
            "apiVersion": "teamgpu.io/v1alpha1", "kind": "TeamGpuPolicy",
            "metadata": {"name": "ml", "uid": "uid-ml"}, "spec": spec
        }))
        .unwrap()
    }

    #[test]
    fn members_read_their_team_and_its_sharing_policies_and_nothing_else() {
        let team = team(json!({
            "namespaces": ["ml"],
            "quotas": [{"sharingPolicy": "b", "guaranteed": 1}, {"sharingPolicy": "a", "guaranteed": 1}],
            "members": [{"kind": "Group", "name": "ml"}, {"kind": "User", "name": "alice"},
                        {"kind": "ServiceAccount", "name": "argocd", "namespace": "argocd"}]
        }));
        let (role, binding) = member_access(&team).unwrap();
        assert_eq!(
            serde_json::to_value(&role.rules).unwrap(),
            json!([
                {"apiGroups": ["teamgpu.io"], "resources": ["teamgpupolicies"],
                 "resourceNames": ["ml"], "verbs": ["get", "list", "watch"]},
                {"apiGroups": ["teamgpu.io"], "resources": ["gpusharingpolicies"],
                 "resourceNames": ["a", "b"], "verbs": ["get", "list", "watch"]}
            ])
        );
        assert_eq!(
            serde_json::to_value(&binding.subjects).unwrap(),
            json!([
                {"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "ml"},
                {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "alice"},
                {"kind": "ServiceAccount", "name": "argocd", "namespace": "argocd"}
            ])
        );
        assert_eq!(binding.role_ref.name, "teamgpu-member-ml");
        for meta in [&role.metadata, &binding.metadata] {
            assert_eq!(meta.name.as_deref(), Some("teamgpu-member-ml"));
            let owner = &meta.owner_references.as_ref().unwrap()[0];
            assert_eq!(
                (owner.kind.as_str(), owner.uid.as_str()),
                ("TeamGpuPolicy", "uid-ml")
            );
            assert_eq!(
                meta.labels.as_ref().unwrap()["teamgpu.io/owner"],
                "TeamGpuPolicy.ml"
            );
        }
    }

    #[test]
    fn a_team_without_members_gets_no_role_and_one_without_quotas_only_its_own_policy() {
        assert!(member_access(&team(json!({"namespaces": ["ml"]}))).is_none());
        let (role, _) = member_access(&team(
            json!({"namespaces": ["ml"], "members": [{"kind": "User", "name": "bob"}]}),
        ))
        .unwrap();
        let rules = role.rules.unwrap();
        assert_eq!(rules.len(), 1);
        assert_eq!(
            rules[0].resources.as_deref(),
            Some(&["teamgpupolicies".to_owned()][..])
        );
    }
}
