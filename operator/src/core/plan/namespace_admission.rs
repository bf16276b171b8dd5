//! Who may move a namespace into or out of a team, and who may exempt one, as
//! ValidatingAdmissionPolicies on namespaces. Pure.
//!
//! A namespace joins a team when its labels start to match the team's `namespaceSelector`, and
//! leaves it when they stop matching. The policy `teamgpu-namespace-membership` allows either
//! only to the team's `spec.members` and to the admin groups; a change that neither joins nor
//! leaves a team (another label, or a namespace that already carries the team's label) is
//! never denied, so existing namespaces keep working. Namespaces a team names in
//! `spec.namespaces` are not decided by labels and need no check.
//!
//! The policy takes every TeamGpuPolicy as params (its binding selects them all), so it is
//! evaluated once per team for a namespace written, and stays the same object when teams come, go
//! or change. Compiling every team's `namespaceSelector` and members into the policy instead cost
//! the API server 1.3 s and the controller manager (which type-checks policies) 4.4 s of CPU for
//! each write of it at 100 teams (Kubernetes 1.36.2).
//!
//! The exemption label ([`EXEMPT_LABEL`](super::admission::EXEMPT_LABEL)) may be set or changed
//! only by the admin groups: `teamgpu-namespace-exemption`, a policy without params, so that it
//! holds with no team at all. The same policy keeps the guard label of a namespace outside teams
//! ([`super::outside_teams`]) to the operator (and the admin groups): with it set, the non-team
//! policy no longer looks at the namespace.

use k8s_openapi::api::admissionregistration::v1::{
    MatchCondition, MatchResources, NamedRuleWithOperations, ParamKind, ParamRef,
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
    ValidatingAdmissionPolicyBindingSpec, ValidatingAdmissionPolicySpec, Validation, Variable,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use super::admission::{EXEMPT_LABEL, Enforcement, meta, not_the_operator, validation};
use super::cel::string_literal;
use super::outside_teams::{GUARD_LABEL, QUOTA_NAME as OUTSIDE_QUOTA};
use crate::api::GROUP;

pub const MEMBERSHIP_POLICY_NAME: &str = "teamgpu-namespace-membership";
pub const EXEMPTION_POLICY_NAME: &str = "teamgpu-namespace-exemption";
/// Groups that may add any namespace to any team and set the exemption label, unless the
/// operator is told otherwise (`--admin-group`): Kubernetes' superuser group and the group of
/// kubeadm's `admin.conf`.
pub const DEFAULT_ADMIN_GROUPS: [&str; 2] = ["system:masters", "kubeadm:cluster-admins"];

/// Whether `params.spec.namespaceSelector` (a TeamGpuPolicy's) matches the label map `labels`, as
/// CEL, with Kubernetes' semantics. As in the planner's membership, a label selector Kubernetes
/// would reject (`In` or `NotIn` without values, `Exists` or `DoesNotExist` with values, another
/// operator) matches nothing, and so do no selector and an empty one.
fn namespace_selector_matches(labels: &str) -> String {
    let s = "params.spec.namespaceSelector";
    let no_values = "(!has(e.values) || size(e.values) == 0)";
    format!(
        "has({s}) && \
         ((has({s}.matchLabels) && size({s}.matchLabels) > 0) || \
          (has({s}.matchExpressions) && size({s}.matchExpressions) > 0)) && \
         (!has({s}.matchLabels) || {s}.matchLabels.all(k, k in {labels} && {labels}[k] == {s}.matchLabels[k])) && \
         (!has({s}.matchExpressions) || {s}.matchExpressions.all(e, \
           (e.operator == 'In' && !{no_values} && e.key in {labels} && {labels}[e.key] in e.values) || \
           (e.operator == 'NotIn' && !{no_values} && !(e.key in {labels} && {labels}[e.key] in e.values)) || \
           (e.operator == 'Exists' && {no_values} && e.key in {labels}) || \
           (e.operator == 'DoesNotExist' && {no_values} && !(e.key in {labels}))))"
    )
}

/// Whether the requester is one of the params' (a TeamGpuPolicy's) `spec.members`, as CEL: a
/// group by membership, a ServiceAccount by its user name, a user by name.
pub(super) const PARAMS_MEMBER: &str = "has(params.spec.members) && params.spec.members.exists(m, \
     m.kind == 'Group' ? (has(request.userInfo.groups) && m.name in request.userInfo.groups) : \
     request.userInfo.username == (m.kind == 'ServiceAccount' \
       ? 'system:serviceaccount:' + (has(m.namespace) ? m.namespace : '') + ':' + m.name \
       : m.name))";

/// Creating and updating namespaces.
fn namespace_writes() -> MatchResources {
    MatchResources {
        resource_rules: Some(vec![NamedRuleWithOperations {
            api_groups: Some(vec![String::new()]),
            api_versions: Some(vec!["v1".into()]),
            operations: Some(vec!["CREATE".into(), "UPDATE".into()]),
            resources: Some(vec!["namespaces".into()]),
            ..NamedRuleWithOperations::default()
        }]),
        ..MatchResources::default()
    }
}

/// Requests of anyone but the operator (`operator`) and the `admin_groups`.
pub(super) fn not_an_admin(admin_groups: &[String], operator: &str) -> Vec<MatchCondition> {
    let admins = admin_groups
        .iter()
        .map(|g| string_literal(g))
        .collect::<Vec<_>>()
        .join(", ");
    let mut conditions = not_the_operator(operator);
    conditions.push(MatchCondition {
        name: "not-an-admin".into(),
        expression: format!(
            "!has(request.userInfo.groups) || !request.userInfo.groups.exists(g, g in [{admins}])"
        ),
    });
    conditions
}

/// The namespace's labels after (`newLabels`) and before (`oldLabels`) the request.
fn label_variables() -> Vec<Variable> {
    vec![
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
    ]
}

/// The membership policy, with a TeamGpuPolicy as params. Requests of `admin_groups` and of the
/// operator (`operator`) are not checked.
pub fn membership_policy(admin_groups: &[String], operator: &str) -> ValidatingAdmissionPolicy {
    let mut variables = label_variables();
    variables.extend([
        Variable {
            name: "inTeamAfter".into(),
            expression: namespace_selector_matches("variables.newLabels"),
        },
        Variable {
            name: "inTeamBefore".into(),
            expression: namespace_selector_matches("variables.oldLabels"),
        },
        Variable {
            name: "member".into(),
            expression: PARAMS_MEMBER.into(),
        },
    ]);
    let only_members = |what: &str| {
        format!(
            "'only members of TeamGpuPolicy ' + params.metadata.name + ' (spec.members) or cluster admins may {what}'"
        )
    };
    ValidatingAdmissionPolicy {
        metadata: meta(MEMBERSHIP_POLICY_NAME),
        spec: Some(ValidatingAdmissionPolicySpec {
            failure_policy: Some("Fail".into()),
            param_kind: Some(ParamKind {
                api_version: Some(format!("{GROUP}/v1alpha1")),
                kind: Some("TeamGpuPolicy".into()),
            }),
            match_constraints: Some(namespace_writes()),
            match_conditions: Some(not_an_admin(admin_groups, operator)),
            variables: Some(variables),
            validations: Some(vec![
                validation(
                    "!variables.inTeamAfter || variables.inTeamBefore || variables.member".into(),
                    &only_members("add a namespace to the team"),
                ),
                validation(
                    "!variables.inTeamBefore || variables.inTeamAfter || variables.member".into(),
                    &only_members("take a namespace out of the team"),
                ),
            ]),
            ..ValidatingAdmissionPolicySpec::default()
        }),
        status: None,
    }
}

/// The membership policy's binding: every namespace, every TeamGpuPolicy as params (none: no
/// team to join or leave).
pub fn membership_binding(enforcement: Enforcement) -> ValidatingAdmissionPolicyBinding {
    every_team_as_params(MEMBERSHIP_POLICY_NAME, enforcement)
}

/// A binding of policy `name` with every TeamGpuPolicy as params (none: nothing to check).
pub(super) fn every_team_as_params(
    name: &str,
    enforcement: Enforcement,
) -> ValidatingAdmissionPolicyBinding {
    ValidatingAdmissionPolicyBinding {
        metadata: meta(name),
        spec: Some(ValidatingAdmissionPolicyBindingSpec {
            policy_name: Some(name.into()),
            param_ref: Some(ParamRef {
                selector: Some(LabelSelector::default()),
                parameter_not_found_action: Some("Allow".into()),
                ..ParamRef::default()
            }),
            validation_actions: Some(enforcement.validation_actions()),
            ..ValidatingAdmissionPolicyBindingSpec::default()
        }),
    }
}

/// The exemption policy: only `admin_groups` (and the operator) set or change the exemption
/// label, and the guard label of a namespace outside teams ([`GUARD_LABEL`]).
pub fn exemption_policy(admin_groups: &[String], operator: &str) -> ValidatingAdmissionPolicy {
    let exempt = string_literal(EXEMPT_LABEL);
    let guard = string_literal(GUARD_LABEL);
    let (new, old) = ("variables.newLabels", "variables.oldLabels");
    ValidatingAdmissionPolicy {
        metadata: meta(EXEMPTION_POLICY_NAME),
        spec: Some(ValidatingAdmissionPolicySpec {
            failure_policy: Some("Fail".into()),
            match_constraints: Some(namespace_writes()),
            match_conditions: Some(not_an_admin(admin_groups, operator)),
            variables: Some(label_variables()),
            validations: Some(vec![
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
                Validation {
                    // Taking it off is harmless: the non-team policy applies again.
                    expression: format!(
                        "!({guard} in {new}) || ({guard} in {old} && {old}[{guard}] == {new}[{guard}])"
                    ),
                    message: Some(format!(
                        "only the teamgpu operator sets the label {GUARD_LABEL}: it says that the namespace's ResourceQuota {OUTSIDE_QUOTA} is in force"
                    )),
                    reason: Some("Forbidden".into()),
                    ..Validation::default()
                },
            ]),
            ..ValidatingAdmissionPolicySpec::default()
        }),
        status: None,
    }
}

/// The exemption policy's binding: every namespace.
pub fn exemption_binding(enforcement: Enforcement) -> ValidatingAdmissionPolicyBinding {
    ValidatingAdmissionPolicyBinding {
        metadata: meta(EXEMPTION_POLICY_NAME),
        spec: Some(ValidatingAdmissionPolicyBindingSpec {
            policy_name: Some(EXEMPTION_POLICY_NAME.into()),
            validation_actions: Some(enforcement.validation_actions()),
            ..ValidatingAdmissionPolicyBindingSpec::default()
        }),
    }
}
