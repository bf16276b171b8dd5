//! Who may write the TeamGpuPolicies of a department, and how much they may guarantee, as
//! ValidatingAdmissionPolicies on TeamGpuPolicies. Pure. Only planned while a department exists.
//!
//! - `teamgpu-department-teams` takes every TeamGpuPolicy as params (as the namespace membership
//!   policy does), so it is evaluated once per TeamGpuPolicy `P` for each TeamGpuPolicy written,
//!   and stays the same object when teams come, go or change. Where `P` is a department:
//!   - a TeamGpuPolicy whose `spec.parent` is `P` before or after the request may be created,
//!     changed or deleted only by `P`'s `spec.members` and the admin groups (delegation);
//!   - unless `P` says `overcommit: Warn`, a member's guarantee must fit in what `P` guarantees
//!     beside its other members (`status.quotas[].membersGuaranteed`, as the operator last
//!     counted it, less the member's own guarantee before the request), and its limit in `P`'s
//!     limit; and `P` may not lower its guarantee below its members'. This holds for everyone.
//! - `teamgpu-top-level-teams`: only the admin groups write TeamGpuPolicies without a parent
//!   (the top level), or take one out of its department to the top level.
//!
//! Admission sees what the operator counted at its last pass: two members created within a
//! moment of each other may each fit alone and not together. The department's status then says
//! so and the guarantees are scaled down, as with `overcommit: Warn`.
//!
//! Amounts written in memory (`80Gi`, for MemorySlices policies) count the whole slices they
//! hold, at the slice size the department's status gives (`status.quotas[].sliceSize`); until
//! the operator has written it, they are not counted.

use k8s_openapi::api::admissionregistration::v1::{
    MatchResources, NamedRuleWithOperations, ParamKind, ValidatingAdmissionPolicy,
    ValidatingAdmissionPolicyBinding, ValidatingAdmissionPolicyBindingSpec,
    ValidatingAdmissionPolicySpec, Variable,
};

use super::admission::{Enforcement, meta, not_the_operator, validation};
use super::cel::string_literal;
use super::namespace_admission::{PARAMS_MEMBER, every_team_as_params, not_an_admin};
use crate::api::GROUP;

pub const DEPARTMENT_POLICY_NAME: &str = "teamgpu-department-teams";
pub const TOP_LEVEL_POLICY_NAME: &str = "teamgpu-top-level-teams";

/// Creating, changing and deleting TeamGpuPolicies (not their status).
fn team_policy_writes() -> MatchResources {
    MatchResources {
        resource_rules: Some(vec![NamedRuleWithOperations {
            api_groups: Some(vec![GROUP.into()]),
            api_versions: Some(vec!["*".into()]),
            operations: Some(vec!["CREATE".into(), "UPDATE".into(), "DELETE".into()]),
            resources: Some(vec!["teamgpupolicies".into()]),
            ..NamedRuleWithOperations::default()
        }]),
        ..MatchResources::default()
    }
}

/// The department policy's variables: the request's parents and guarantees, and whether the
/// params are a department the request concerns.
fn department_variables(admin_groups: &[String]) -> Vec<Variable> {
    let admins = (admin_groups.iter())
        .map(|g| string_literal(g))
        .collect::<Vec<_>>()
        .join(", ");
    let parent = |o: &str| format!("({o} != null && has({o}.spec.parent) ? {o}.spec.parent : '')");
    let variable = |name: &str, expression: String| Variable {
        name: name.into(),
        expression,
    };
    vec![
        variable("newParent", parent("object")),
        variable("oldParent", parent("oldObject")),
        variable(
            "department",
            "has(params.spec.department) && params.spec.department".into(),
        ),
        variable(
            "under",
            "variables.department && (variables.newParent == params.metadata.name || \
             variables.oldParent == params.metadata.name)"
                .into(),
        ),
        variable(
            "refuses",
            "variables.department && \
             (!has(params.spec.overcommit) || params.spec.overcommit == 'Refuse')"
                .into(),
        ),
        variable(
            "admin",
            format!(
                "has(request.userInfo.groups) && request.userInfo.groups.exists(g, g in [{admins}])"
            ),
        ),
        variable("member", PARAMS_MEMBER.into()),
    ]
}

/// What the department's (the params') members guarantee of the policy of quota `q`, as the
/// operator last counted it (`status.quotas[].membersGuaranteed`; 0 before it has).
const MEMBERS: &str = "(has(params.status) && has(params.status.quotas) ? \
       params.status.quotas.filter(s, s.sharingPolicy == q.sharingPolicy && \
         has(s.membersGuaranteed)).map(s, int(s.membersGuaranteed)) : []) + [0]";

/// The memory of one device of the policy of quota `q` (a MemorySlices policy), as the
/// department's (the params') status says it; `''` when it does not.
const SLICE: &str = "(has(params.status) && has(params.status.quotas) && \
       params.status.quotas.exists(s, s.sharingPolicy == q.sharingPolicy && has(s.sliceSize)) \
       ? params.status.quotas.filter(s, s.sharingPolicy == q.sharingPolicy && \
           has(s.sliceSize))[0].sliceSize : '')";

/// `amount` (a guarantee or limit of the policy of quota `q`) in devices, as CEL: a count as
/// it is; memory (`40Gi`) as the whole slices it holds ([`SLICE`]); -1 when that cannot be told
/// (the operator has not said the slice size yet), which no check counts.
fn devices(amount: &str) -> String {
    format!(
        "(string({amount}).matches('^[0-9]+$') ? int(string({amount})) : \
            (isQuantity(string({amount})) && quantity(string({amount})).isInteger() && \
             {SLICE} != '' && quantity({SLICE}).isInteger() && \
             quantity({SLICE}).asInteger() > 0 \
              ? quantity(string({amount})).asInteger() / quantity({SLICE}).asInteger() \
              : -1))"
    )
}

/// What the department's members other than the request's object guarantee of the policy of
/// quota `q`, as CEL: the members' sum less the object's own guarantee before the request.
fn others() -> String {
    let old = devices("o.guaranteed");
    format!(
        "(({MEMBERS}).sum() - \
         (oldObject != null && variables.oldParent == params.metadata.name && \
          has(oldObject.spec.quotas) \
           ? (oldObject.spec.quotas.filter(o, o.sharingPolicy == q.sharingPolicy) \
                .map(o, {old}).filter(d, d >= 0) + [0]).sum() \
           : 0))"
    )
}

/// What the department (the params) guarantees of the policy of quota `q`, in devices: a list
/// of one, or none when it has no quota for it or its amount cannot be told.
fn department_guarantee() -> String {
    let guaranteed = devices("p.guaranteed");
    format!(
        "params.spec.quotas.filter(p, p.sharingPolicy == q.sharingPolicy) \
           .map(p, {guaranteed}).filter(d, d >= 0)"
    )
}

/// The quotas of the request's object (a new or changed member) whose guarantee does not fit
/// what the department has left, as `policy: asked, left of total` lines.
fn over_guarantee() -> String {
    let (others, asked, parent) = (others(), devices("q.guaranteed"), department_guarantee());
    format!(
        "(has(object.spec.quotas) ? object.spec.quotas.filter(q, {asked} >= 0 && \
           {parent}.exists(g, {asked} + {others} > g)) \
           .map(q, q.sharingPolicy + ': ' + string({asked}) + ' asked, ' + \
             string({parent}.map(g, g - ({others}))[0]) + ' left of ' + \
             string({parent}[0])) : [])"
    )
}

/// The quotas of the request's object whose limit is above the department's (its limit, or
/// its guarantee when it sets none).
fn over_limit() -> String {
    let limit = devices("q.limit");
    let (parent_limit, parent_guarantee) = (devices("p.limit"), devices("p.guaranteed"));
    format!(
        "(has(object.spec.quotas) ? object.spec.quotas.filter(q, has(q.limit) && \
           {limit} >= 0 && params.spec.quotas.exists(p, p.sharingPolicy == q.sharingPolicy && \
             (has(p.limit) ? {parent_limit} : {parent_guarantee}) >= 0 && \
             {limit} > (has(p.limit) ? {parent_limit} : {parent_guarantee}))) \
         .map(q, q.sharingPolicy + ': limit ' + string(q.limit)) : [])"
    )
}

/// The department's own quotas (the request's object is the params) that its members'
/// guarantees exceed.
fn below_members() -> String {
    let guaranteed = devices("q.guaranteed");
    format!(
        "(has(object.spec.quotas) ? object.spec.quotas.filter(q, \
           {guaranteed} >= 0 && ({MEMBERS}).sum() > {guaranteed}) \
         .map(q, q.sharingPolicy + ': ' + string(q.guaranteed) + ', its members guarantee ' + \
           string(({MEMBERS}).sum())) : [])"
    )
}

/// The department policy; requests of the operator (`operator`) are not checked, and those of
/// `admin_groups` only for overcommit.
pub fn department_policy(admin_groups: &[String], operator: &str) -> ValidatingAdmissionPolicy {
    let mut variables = department_variables(admin_groups);
    // What a new or changed member of the params, under overcommit: Refuse, does not fit.
    let of_member = |name: &str, list: String| Variable {
        name: name.into(),
        expression: format!(
            "variables.refuses && object != null && \
             variables.newParent == params.metadata.name ? {list} : []"
        ),
    };
    variables.extend([
        of_member("overGuarantee", over_guarantee()),
        of_member("overLimit", over_limit()),
        Variable {
            name: "belowMembers".into(),
            expression: format!(
                "variables.refuses && object != null && \
                 object.metadata.name == params.metadata.name && \
                 has(object.spec.department) && object.spec.department && \
                 (!has(object.spec.overcommit) || object.spec.overcommit == 'Refuse') \
                 ? {} : []",
                below_members()
            ),
        },
    ]);
    let refused = |what: &str, list: &str| {
        format!(
            "'TeamGpuPolicy ' + (object != null ? object : oldObject).metadata.name + {what} + \
             ' (department ' + params.metadata.name + ' has overcommit: Refuse): ' + \
             variables.{list}.join('; ')"
        )
    };
    ValidatingAdmissionPolicy {
        metadata: meta(DEPARTMENT_POLICY_NAME),
        spec: Some(ValidatingAdmissionPolicySpec {
            failure_policy: Some("Fail".into()),
            param_kind: Some(ParamKind {
                api_version: Some(format!("{GROUP}/v1alpha1")),
                kind: Some("TeamGpuPolicy".into()),
            }),
            match_constraints: Some(team_policy_writes()),
            match_conditions: Some(not_the_operator(operator)),
            variables: Some(variables),
            validations: Some(vec![
                validation(
                    "!variables.under || variables.admin || variables.member".into(),
                    "'only members of department ' + params.metadata.name + \
                     ' (its spec.members) or cluster admins may create, change or delete \
                     the TeamGpuPolicies under it, such as ' + \
                     (object != null ? object : oldObject).metadata.name",
                ),
                validation(
                    "size(variables.overGuarantee) == 0".into(),
                    &refused(
                        "' would guarantee more than the department has left'",
                        "overGuarantee",
                    ),
                ),
                validation(
                    "size(variables.overLimit) == 0".into(),
                    &refused(
                        "' would have a limit above the department\\'s'",
                        "overLimit",
                    ),
                ),
                validation(
                    "size(variables.belowMembers) == 0".into(),
                    &refused(
                        "' would guarantee less than its members do'",
                        "belowMembers",
                    ),
                ),
            ]),
            ..ValidatingAdmissionPolicySpec::default()
        }),
        status: None,
    }
}

/// The department policy's binding: every TeamGpuPolicy as params.
pub fn department_binding(enforcement: Enforcement) -> ValidatingAdmissionPolicyBinding {
    every_team_as_params(DEPARTMENT_POLICY_NAME, enforcement)
}

/// The top-level policy: only `admin_groups` (and the operator) write TeamGpuPolicies that
/// have no parent before or after the request.
pub fn top_level_policy(admin_groups: &[String], operator: &str) -> ValidatingAdmissionPolicy {
    ValidatingAdmissionPolicy {
        metadata: meta(TOP_LEVEL_POLICY_NAME),
        spec: Some(ValidatingAdmissionPolicySpec {
            failure_policy: Some("Fail".into()),
            match_constraints: Some(team_policy_writes()),
            match_conditions: Some(not_an_admin(admin_groups, operator)),
            validations: Some(vec![validation(
                "(object == null || has(object.spec.parent)) && \
                 (oldObject == null || has(oldObject.spec.parent))"
                    .into(),
                "'TeamGpuPolicies at the top level (without spec.parent) are the cluster \
                 admins\\': name a department you are a member of as the parent of ' + \
                 (object != null ? object : oldObject).metadata.name",
            )]),
            ..ValidatingAdmissionPolicySpec::default()
        }),
        status: None,
    }
}

pub fn top_level_binding(enforcement: Enforcement) -> ValidatingAdmissionPolicyBinding {
    ValidatingAdmissionPolicyBinding {
        metadata: meta(TOP_LEVEL_POLICY_NAME),
        spec: Some(ValidatingAdmissionPolicyBindingSpec {
            policy_name: Some(TOP_LEVEL_POLICY_NAME.into()),
            validation_actions: Some(enforcement.validation_actions()),
            ..ValidatingAdmissionPolicyBindingSpec::default()
        }),
    }
}
