//! Who may move a namespace into or out of a team, as a ValidatingAdmissionPolicy on namespaces.
//! Pure.
//!
//! A namespace joins a team when its labels start to match the team's `namespaceSelector`, and
//! leaves it when they stop matching. The policy `teamgpu-namespace-membership` allows either
//! only to the team's `spec.members` and to the admin groups; a change that neither joins nor
//! leaves a team (another label, or a namespace that already carries the team's label) is
//! never denied, so existing namespaces keep working. The exemption label
//! ([`EXEMPT_LABEL`](super::admission::EXEMPT_LABEL)) may be set or changed only by the admin
//! groups. Namespaces a team names in `spec.namespaces` are not decided by labels and need no
//! check.
//!
//! The teams' selectors and members are compiled into the policy (no params: one policy, one
//! binding), so a change of any team's selector or members rewrites one object.

use k8s_openapi::api::admissionregistration::v1::{
    MatchCondition, MatchResources, NamedRuleWithOperations, ValidatingAdmissionPolicy,
    ValidatingAdmissionPolicyBinding, ValidatingAdmissionPolicyBindingSpec,
    ValidatingAdmissionPolicySpec, Validation, Variable,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};

use super::admission::EXEMPT_LABEL;
use super::objects::managed_labels;
use super::selector::cel_string;
use crate::api::{MemberKind, TeamGpuPolicy};

pub const MEMBERSHIP_POLICY_NAME: &str = "teamgpu-namespace-membership";
/// Groups that may add any namespace to any team and set the exemption label, unless the
/// operator is told otherwise (`--admin-group`): Kubernetes' superuser group and the group of
/// kubeadm's `admin.conf`.
pub const DEFAULT_ADMIN_GROUPS: [&str; 2] = ["system:masters", "kubeadm:cluster-admins"];

fn meta(name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_owned()),
        labels: Some(managed_labels("teamgpu")),
        ..ObjectMeta::default()
    }
}

/// `selector` as a CEL expression over the label map `labels`, with Kubernetes' semantics; a
/// selector Kubernetes would reject matches nothing, as in the planner's membership.
pub fn selector_cel(selector: &LabelSelector, labels: &str) -> String {
    if super::membership::selector_matches(selector, &Default::default()).is_err() {
        return "false".into();
    }
    let has = |k: &str| format!("{} in {labels}", cel_string(k));
    let value = |k: &str| format!("{labels}[{}]", cel_string(k));
    let mut terms: Vec<String> = selector
        .match_labels
        .iter()
        .flatten()
        .map(|(k, v)| format!("({} && {} == {})", has(k), value(k), cel_string(v)))
        .collect();
    for expr in selector.match_expressions.iter().flatten() {
        let values = expr
            .values
            .iter()
            .flatten()
            .map(|v| cel_string(v))
            .collect::<Vec<_>>()
            .join(", ");
        let k = &expr.key;
        terms.push(match expr.operator.as_str() {
            "In" => format!("({} && {} in [{values}])", has(k), value(k)),
            "NotIn" => format!("(!({}) || !({} in [{values}]))", has(k), value(k)),
            "Exists" => format!("({})", has(k)),
            _ => format!("!({})", has(k)), // DoesNotExist; others were rejected above
        });
    }
    if terms.is_empty() {
        // An empty selector (which the CRD rejects) would match every namespace; never here.
        return "false".into();
    }
    terms.join(" && ")
}

/// Whether the requester is one of `team`'s members, as CEL.
fn member_cel(team: &TeamGpuPolicy) -> String {
    let mut users = Vec::new();
    let mut groups = Vec::new();
    for member in &team.spec.members {
        match member.kind {
            MemberKind::Group => groups.push(cel_string(&member.name)),
            _ => users.extend(member.user_name().map(|u| cel_string(&u))),
        }
    }
    let mut terms = Vec::new();
    if !users.is_empty() {
        terms.push(format!(
            "request.userInfo.username in [{}]",
            users.join(", ")
        ));
    }
    if !groups.is_empty() {
        terms.push(format!(
            "(has(request.userInfo.groups) && request.userInfo.groups.exists(g, g in [{}]))",
            groups.join(", ")
        ));
    }
    if terms.is_empty() {
        "false".into()
    } else {
        terms.join(" || ")
    }
}

/// `[name]` when `condition` holds, else `[]`, for each team; summed to one list.
fn team_list(teams: &[&TeamGpuPolicy], condition: impl Fn(&TeamGpuPolicy) -> String) -> String {
    let parts: Vec<String> = teams
        .iter()
        .map(|t| {
            let name = cel_string(t.metadata.name.as_deref().unwrap_or_default());
            format!("(({}) ? [{name}] : [])", condition(t))
        })
        .collect();
    if parts.is_empty() {
        "[]".into()
    } else {
        parts.join(" + ")
    }
}

/// The policy for `teams` (those with a label selector; sorted by the caller for a stable
/// object). Requests of `admin_groups` and of the operator (`operator`) are not checked.
pub fn membership_policy(
    teams: &[&TeamGpuPolicy],
    admin_groups: &[String],
    operator: &str,
) -> ValidatingAdmissionPolicy {
    let selected: Vec<&TeamGpuPolicy> = teams
        .iter()
        .copied()
        .filter(|t| t.spec.namespace_selector.is_some())
        .collect();
    let matches = |t: &TeamGpuPolicy, labels: &str| {
        selector_cel(
            t.spec
                .namespace_selector
                .as_ref()
                .unwrap_or(&LabelSelector::default()),
            labels,
        )
    };
    let new = "variables.newLabels";
    let old = "variables.oldLabels";
    let variables = vec![
        Variable {
            name: "newLabels".into(),
            expression: "has(object.metadata.labels) ? object.metadata.labels : {}".into(),
        },
        Variable {
            name: "oldLabels".into(),
            expression:
                "oldObject != null && has(oldObject.metadata.labels) ? oldObject.metadata.labels : {}"
                    .into(),
        },
        Variable {
            name: "joined".into(),
            expression: team_list(&selected, |t| {
                format!("({}) && !({})", matches(t, new), matches(t, old))
            }),
        },
        Variable {
            name: "left".into(),
            expression: team_list(&selected, |t| {
                format!("({}) && !({})", matches(t, old), matches(t, new))
            }),
        },
        Variable {
            name: "memberOf".into(),
            expression: team_list(&selected, member_cel),
        },
    ];
    let exempt = cel_string(EXEMPT_LABEL);
    let validations = vec![
        Validation {
            expression: "variables.joined.all(t, t in variables.memberOf)".into(),
            message_expression: Some(
                "'only members of TeamGpuPolicy ' + variables.joined.filter(t, !(t in variables.memberOf)).join(', ') + \
                 ' (spec.members) or cluster admins may add a namespace to the team'"
                    .into(),
            ),
            reason: Some("Forbidden".into()),
            ..Validation::default()
        },
        Validation {
            expression: "variables.left.all(t, t in variables.memberOf)".into(),
            message_expression: Some(
                "'only members of TeamGpuPolicy ' + variables.left.filter(t, !(t in variables.memberOf)).join(', ') + \
                 ' (spec.members) or cluster admins may take a namespace out of the team'"
                    .into(),
            ),
            reason: Some("Forbidden".into()),
            ..Validation::default()
        },
        Validation {
            expression: format!(
                "({exempt} in {new} ? {new}[{exempt}] : '') == ({exempt} in {old} ? {old}[{exempt}] : '')"
            ),
            message: Some(format!(
                "only cluster admins may set or change the label {EXEMPT_LABEL}"
            )),
            reason: Some("Forbidden".into()),
            ..Validation::default()
        },
    ];
    let admins = admin_groups
        .iter()
        .map(|g| cel_string(g))
        .collect::<Vec<_>>()
        .join(", ");
    ValidatingAdmissionPolicy {
        metadata: meta(MEMBERSHIP_POLICY_NAME),
        spec: Some(ValidatingAdmissionPolicySpec {
            failure_policy: Some("Fail".into()),
            match_constraints: Some(MatchResources {
                resource_rules: Some(vec![NamedRuleWithOperations {
                    api_groups: Some(vec![String::new()]),
                    api_versions: Some(vec!["v1".into()]),
                    operations: Some(vec!["CREATE".into(), "UPDATE".into()]),
                    resources: Some(vec!["namespaces".into()]),
                    ..NamedRuleWithOperations::default()
                }]),
                ..MatchResources::default()
            }),
            match_conditions: Some(vec![
                MatchCondition {
                    name: "not-the-teamgpu-operator".into(),
                    expression: format!("request.userInfo.username != {}", cel_string(operator)),
                },
                MatchCondition {
                    name: "not-an-admin".into(),
                    expression: format!(
                        "!has(request.userInfo.groups) || !request.userInfo.groups.exists(g, g in [{admins}])"
                    ),
                },
            ]),
            variables: Some(variables),
            validations: Some(validations),
            ..ValidatingAdmissionPolicySpec::default()
        }),
        status: None,
    }
}

/// The policy's binding: every namespace.
pub fn membership_binding() -> ValidatingAdmissionPolicyBinding {
    ValidatingAdmissionPolicyBinding {
        metadata: meta(MEMBERSHIP_POLICY_NAME),
        spec: Some(ValidatingAdmissionPolicyBindingSpec {
            policy_name: Some(MEMBERSHIP_POLICY_NAME.into()),
            validation_actions: Some(vec!["Deny".into()]),
            ..ValidatingAdmissionPolicyBindingSpec::default()
        }),
    }
}
