//! The ValidatingAdmissionPolicies that keep teams inside their entitlement. Pure.
//!
//! Two policies, each with one binding:
//! - `teamgpu-team-requests` takes as params the namespace's own teamgpu ResourceQuota (named
//!   `teamgpu`, see [`QUOTA_NAME`]), which names its team and the team's DeviceClasses in its
//!   annotations ([`QUOTA_TEAM_ANNOTATION`], [`QUOTA_CLASSES_ANNOTATION`]). A namespace without
//!   that quota has no params, and the policy lets it be. It denies, in ResourceClaims and
//!   ResourceClaimTemplates, a governed DeviceClass the team has no quota for (in `exactly` and in
//!   every `firstAvailable` subrequest), opaque config for a teamgpu class (it would override the
//!   sharing strategy), `adminAccess`, and `allocationMode: All` on a teamgpu class. And it
//!   denies a claim of one of the team's classes while the quota is not in force for it
//!   ([`quota_in_force`]): kube-controller-manager counts a quota a moment after it is written
//!   or changed (much later when it is down or behind), and until then a new quota limits
//!   nothing (measured on 1.36.2 with the controller-manager stopped: three claims of one device
//!   admitted under a hard of 1).
//! - `teamgpu-non-team-requests`, in every namespace outside all teams (a match condition lists
//!   the team namespaces) except those a cluster admin exempted (label `teamgpu.io/exempt:
//!   "true"`): no governed class there at all, neither teamgpu's nor a foreign class that selects
//!   governed devices. Where a quota of 0 already refuses the same, its binding leaves the
//!   namespace out ([`super::outside_teams`]).
//!
//! Why not one binding per team whose namespace selector names its namespaces: the API server
//! parses every binding's selector, values validated one by one, on every request a policy
//! matches. With 100 teams and 1,000 team namespaces that more than doubled its CPU for every
//! claim, template and Pod written (measured on 1.36: 2.4 ms a template instead of 0.9). One
//! binding without a selector and a list in a CEL match condition cost 1.4 ms.
//!
//! Both also deny Pods that ask for a governed class's devices as an extended resource (the
//! class's `extendedResourceName`, or the `deviceclass.resource.kubernetes.io/<class>` name every
//! class has under DRAExtendedResource): the scheduler would create the claim for them, past
//! the policies above. In a team namespace a class the team has a quota for is allowed.
//!
//! Neither policy applies to the operator itself (a `matchConditions` entry on its user name):
//! admission takes a moment to see a policy or quota the operator just wrote, and the operator's
//! own templates in a namespace that has just joined a team, or whose team is being deleted, would
//! otherwise be denied by the policy that applied a moment ago. Only the operator's own identity is
//! exempt, so a team member still cannot escape: that needs the operator's ServiceAccount token.
//!
//! The governed classes (teamgpu's and foreign ones that select the same devices) are compiled
//! into both policies as a variable, so a change of the set rewrites two objects.

use std::collections::BTreeSet;

use k8s_openapi::api::admissionregistration::v1::{
    MatchCondition, MatchResources, NamedRuleWithOperations, ParamKind, ParamRef,
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
    ValidatingAdmissionPolicyBindingSpec, ValidatingAdmissionPolicySpec, Validation, Variable,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    LabelSelector, LabelSelectorRequirement, ObjectMeta,
};

use super::objects::{
    OWN_GPUS_ANNOTATION_PREFIX, QUOTA_CLASSES_ANNOTATION, QUOTA_NAME, QUOTA_TEAM_ANNOTATION,
    SLICE_ANNOTATION_PREFIX, SLICE_CAPACITY, managed_labels,
};
use super::outside_teams::GUARD_LABEL;
use super::usage::DEVICES_PER_CLASS_SUFFIX;

pub const TEAM_POLICY_NAME: &str = "teamgpu-team-requests";
/// The binding of the team policy.
pub const TEAM_BINDING_NAME: &str = "teamgpu-team-requests";
pub const NON_TEAM_POLICY_NAME: &str = "teamgpu-non-team-requests";
/// The binding of the non-team policy.
pub const NON_TEAM_BINDING_NAME: &str = "teamgpu-non-team-requests";
/// The operator's user name when it runs as the ServiceAccount of `config/rbac`.
pub const DEFAULT_OPERATOR_USER: &str = "system:serviceaccount:teamgpu-system:teamgpu";
/// A namespace outside every team with this label set to `"true"` may use governed classes
/// directly (system workloads such as monitoring agents). Only admin groups may set it.
pub const EXEMPT_LABEL: &str = "teamgpu.io/exempt";
pub use super::objects::IMPLICIT_EXTENDED_PREFIX;

pub use crate::core::state::{Enforcement, UnknownEnforcement};

/// The DeviceClasses whose devices teamgpu governs, as admission needs them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct GovernedClasses {
    /// Foreign classes (not teamgpu's) that select governed devices; teamgpu's own classes are
    /// recognised by their suffix.
    pub foreign: BTreeSet<String>,
    /// Every extended resource name that reaches a governed class, teamgpu's included.
    pub extended: BTreeSet<String>,
}

/// Whether a request `r` (a DeviceRequest) names a DeviceClass for which `pred(class)` holds.
fn request_uses(pred: &str) -> String {
    request_where(|r| pred.replace("CLASS", &format!("{r}.deviceClassName")))
}

/// Whether `holds(x)` is true of request `r`'s `exactly` (`x` = `r.exactly`) or of one of its
/// `firstAvailable` subrequests (`x` = `s`).
fn request_where(holds: impl Fn(&str) -> String) -> String {
    format!(
        "((has(r.exactly) && {}) || (has(r.firstAvailable) && r.firstAvailable.exists(s, {})))",
        holds("r.exactly"),
        holds("s")
    )
}

const TEAMGPU_CLASS: &str = "CLASS.endsWith('.teamgpu.io')";

/// Variables shared by both policies: the claim spec of a ResourceClaim or of a template, and its
/// requests. Kubernetes compiles VAP expressions with `object` as a dynamic type, so the branch for
/// the other kind is only a type-checking warning, never evaluated.
fn common_variables() -> Vec<Variable> {
    vec![
        Variable {
            name: "claimSpec".into(),
            expression: "object.kind == 'ResourceClaimTemplate' ? object.spec.spec : object.spec"
                .into(),
        },
        Variable {
            name: "devices".into(),
            expression: "has(variables.claimSpec.devices) ? variables.claimSpec.devices : {}"
                .into(),
        },
        Variable {
            name: "requests".into(),
            expression: "has(variables.devices.requests) ? variables.devices.requests : []".into(),
        },
    ]
}

/// [`common_variables`] and the governed classes and extended resource names.
fn governed_variables(governed: &GovernedClasses) -> Vec<Variable> {
    let mut variables = common_variables();
    variables.push(Variable {
        name: "governed".into(),
        expression: cel_list(&governed.foreign),
    });
    variables.push(Variable {
        name: "extended".into(),
        expression: cel_list(&governed.extended),
    });
    variables
}

fn rules() -> MatchResources {
    MatchResources {
        resource_rules: Some(vec![
            // Creation only: a claim's and a template's spec cannot change after it, and an
            // update is metadata, such as the resourceclaim controller taking its finalizer off
            // a claim being deleted. Judged against a namespace that has left its team since,
            // that update would be refused and the claim never go.
            NamedRuleWithOperations {
                api_groups: Some(vec!["resource.k8s.io".into()]),
                api_versions: Some(vec!["*".into()]),
                operations: Some(vec!["CREATE".into()]),
                resources: Some(vec![
                    "resourceclaims".into(),
                    "resourceclaimtemplates".into(),
                ]),
                ..NamedRuleWithOperations::default()
            },
            // Nor can a Pod's resources.
            NamedRuleWithOperations {
                api_groups: Some(vec![String::new()]),
                api_versions: Some(vec!["v1".into()]),
                operations: Some(vec!["CREATE".into()]),
                resources: Some(vec!["pods".into()]),
                ..NamedRuleWithOperations::default()
            },
        ]),
        ..MatchResources::default()
    }
}

/// The annotation of the namespace's quota (the team policy's params) at `prefix` + the class
/// of request (or subrequest) `r`, or `''`. The quota that lets a team use a class also says what
/// its requests of the class must be: one object, so that admission never sees one without the
/// other (a policy's text reaches admission a moment after it is written).
fn class_annotation(prefix: &str, r: &str) -> String {
    let annotations = "params.metadata.annotations";
    let key = format!("('{prefix}' + {r}.deviceClassName)");
    format!("(has({annotations}) && {key} in {annotations} ? {annotations}[{key}] : '')")
}

/// Whether request (or subrequest) `r` names a memory-slice class (its slice in the quota's
/// [`SLICE_ANNOTATION_PREFIX`] annotation) and asks for anything but exactly one slice.
fn not_one_slice(r: &str) -> String {
    let requests = format!("{r}.capacity.requests");
    let slice = class_annotation(SLICE_ANNOTATION_PREFIX, r);
    format!(
        "({slice} != '' && !(has({r}.capacity) && has({requests}) && size({requests}) == 1 && \
         '{SLICE_CAPACITY}' in {requests} && quantity(string({requests}['{SLICE_CAPACITY}'])).compareTo(quantity({slice})) == 0))"
    )
}

/// Whether request (or subrequest) `r` names a class whose teams get GPUs of their own (the
/// selection in the quota's [`OWN_GPUS_ANNOTATION_PREFIX`] annotation) and does not select them
/// with exactly that expression.
fn not_own_gpus(r: &str) -> String {
    let own = class_annotation(OWN_GPUS_ANNOTATION_PREFIX, r);
    format!(
        "({own} != '' && !(has({r}.selectors) && {r}.selectors.exists(x, has(x.cel) && x.cel.expression == {own})))"
    )
}

/// A CEL list literal of `items`.
fn cel_list(items: impl IntoIterator<Item = impl AsRef<str>>) -> String {
    let items: Vec<String> = items
        .into_iter()
        .map(|c| super::cel::string_literal(c.as_ref()))
        .collect();
    format!("[{}]", items.join(", "))
}

/// Whether a Pod (`object`) has a container or init container asking for an extended resource
/// for which `pred(k)` holds (`K` stands for the resource name in `pred`).
fn pod_asks_for(pred: &str) -> String {
    let pred = pred.replace('K', "k");
    let asks = format!(
        "has(c.resources) && ((has(c.resources.requests) && c.resources.requests.exists(k, {pred})) || \
         (has(c.resources.limits) && c.resources.limits.exists(k, {pred})))"
    );
    format!(
        "(object.kind == 'Pod' && (object.spec.containers.exists(c, {asks}) || \
         (has(object.spec.initContainers) && object.spec.initContainers.exists(c, {asks}))))"
    )
}

/// Requests by anyone but the operator (`operator`, its user name).
pub(super) fn not_the_operator(operator: &str) -> Vec<MatchCondition> {
    vec![MatchCondition {
        name: "not-the-teamgpu-operator".into(),
        expression: format!(
            "request.userInfo.username != {}",
            super::cel::string_literal(operator)
        ),
    }]
}

pub(super) fn meta(name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_owned()),
        labels: Some(managed_labels(MANAGED_OWNER)),
        ..ObjectMeta::default()
    }
}

/// Owner label of the cluster-wide admission objects, which no single policy owns.
const MANAGED_OWNER: &str = "teamgpu";

pub(super) fn validation(expression: String, message_expression: &str) -> Validation {
    Validation {
        expression,
        message_expression: Some(message_expression.to_owned()),
        reason: Some("Forbidden".into()),
        ..Validation::default()
    }
}

/// Whether the namespace's quota (the params) is in force for the devices of `class`: quota
/// admission judges by `status.hard`, which kube-controller-manager copies from the spec when it
/// counts the namespace. Until it has, a new quota limits nothing and a lowered hard still
/// allows the old one. A raised hard not yet counted refuses what the old one refuses, so it
/// does not hold a claim back (it is when waiting Pods are woken).
fn quota_in_force(class: &str) -> String {
    let key = format!("({class} + '{DEVICES_PER_CLASS_SUFFIX}')");
    format!(
        "(!has(params.spec.hard) || !({key} in params.spec.hard) || (has(params.status) && \
         has(params.status.hard) && {key} in params.status.hard && \
         quantity(params.status.hard[{key}]).compareTo(quantity(params.spec.hard[{key}])) <= 0))"
    )
}

/// The team policy's variables: [`governed_variables`], the team and its classes (from the
/// namespace's quota), the memory-slice classes and those of GPUs of a team's own.
fn team_variables(governed: &GovernedClasses) -> Vec<Variable> {
    let mut variables = governed_variables(governed);
    let annotation = |key: &str| {
        format!(
            "has(params.metadata.annotations) && '{key}' in params.metadata.annotations ? params.metadata.annotations['{key}'] : ''"
        )
    };
    variables.push(Variable {
        name: "allowed".into(),
        expression: format!(
            "({}).split(' ').filter(c, c != '')",
            annotation(QUOTA_CLASSES_ANNOTATION)
        ),
    });
    variables.push(Variable {
        name: "team".into(),
        expression: annotation(QUOTA_TEAM_ANNOTATION),
    });
    // Not a slice class: the claim the scheduler makes for an extended resource asks for no
    // memory, and takes the whole GPU or none of its memory.
    variables.push(Variable {
        name: "allowedExtended".into(),
        expression: format!(
            "variables.allowed.filter(c, !(has(params.metadata.annotations) && ('{SLICE_ANNOTATION_PREFIX}' + c) in params.metadata.annotations)).map(c, '{IMPLICIT_EXTENDED_PREFIX}' + c)"
        ),
    });
    variables
}

/// The policy for team namespaces. `governed` are the foreign DeviceClass names that select
/// devices teamgpu governs; teamgpu's own classes are recognised by their suffix. `operator` is
/// the operator's user name, which the policy leaves alone.
pub fn team_policy(governed: &GovernedClasses, operator: &str) -> ValidatingAdmissionPolicy {
    let variables = team_variables(governed);
    let denied_class = "((CLASS.endsWith('.teamgpu.io') || CLASS in variables.governed) && !(CLASS in variables.allowed))";
    let who =
        "' (namespace ' + request.namespace + ' belongs to TeamGpuPolicy ' + variables.team + ')'";
    let validations = vec![
        validation(
            format!("!variables.requests.exists(r, {})", request_uses(denied_class)),
            &format!(
                "'a request names a GPU DeviceClass outside the team\\'s quotas; allowed: [' + variables.allowed.join(', ') + ']' + {who}"
            ),
        ),
        validation(
            format!(
                "!(has(variables.devices.config) && variables.devices.config.exists(c, has(c.opaque) && \
                 variables.requests.exists(r, {uses} && (!has(c.requests) || size(c.requests) == 0 || \
                 r.name in c.requests || (has(r.firstAvailable) && r.firstAvailable.exists(s, r.name + '/' + s.name in c.requests))))))",
                uses = request_uses(TEAMGPU_CLASS)
            ),
            &format!(
                "'opaque device config is not allowed on teamgpu DeviceClasses: the class sets the sharing strategy' + {who}"
            ),
        ),
        validation(
            format!("!variables.requests.exists(r, {})", request_where(not_one_slice)),
            &format!(
                "'a request of a memory-slice class must ask for exactly one slice per device, as its ResourceClaimTemplates do: capacity.requests: {{memory: <the slice in annotation {SLICE_ANNOTATION_PREFIX}<class> of the namespace\\'s ResourceQuota teamgpu>}}' + {who}"
            ),

        ),
        validation(
            format!("!variables.requests.exists(r, {})", request_where(not_own_gpus)),
            &format!(
                "'a request of a class whose teams get GPUs of their own must select the team\\'s GPUs exactly as its ResourceClaimTemplates do (a selector of the expression in annotation {OWN_GPUS_ANNOTATION_PREFIX}<class> of the namespace\\'s ResourceQuota teamgpu): use the templates' + {who}"
            ),
        ),
        validation(
            format!(
                "object.kind != 'ResourceClaim' || !variables.requests.exists(r, {})",
                request_uses(&format!(
                    "CLASS in variables.allowed && !{}",
                    quota_in_force("CLASS")
                ))
            ),
            &format!(
                "'the namespace\\'s ResourceQuota teamgpu is not in force yet (kube-controller-manager has not counted its current hard), so quota admission would not count this claim: try again in a moment' + {who}"
            ),
        ),
        validation(
            "!variables.requests.exists(r, has(r.exactly) && has(r.exactly.adminAccess) && r.exactly.adminAccess)".into(),
            &format!("'adminAccess is not allowed in team namespaces' + {who}"),
        ),
        validation(
            "!variables.requests.exists(r, (has(r.exactly) && has(r.exactly.allocationMode) && r.exactly.allocationMode == 'All' && r.exactly.deviceClassName.endsWith('.teamgpu.io')) || \
             (has(r.firstAvailable) && r.firstAvailable.exists(s, has(s.allocationMode) && s.allocationMode == 'All' && s.deviceClassName.endsWith('.teamgpu.io'))))".into(),
            &format!("'allocationMode All is not allowed on teamgpu DeviceClasses: request an exact count' + {who}"),
        ),
        validation(
            format!(
                "!{}",
                pod_asks_for("K in variables.extended && !(K in variables.allowedExtended)")
            ),
            &format!(
                "'a container asks for a GPU extended resource outside the team\\'s quotas; use a ResourceClaimTemplate of: [' + variables.allowed.join(', ') + ']' + {who}"
            ),
        ),
    ];
    ValidatingAdmissionPolicy {
        metadata: meta(TEAM_POLICY_NAME),
        spec: Some(ValidatingAdmissionPolicySpec {
            failure_policy: Some("Fail".into()),
            match_constraints: Some(rules()),
            match_conditions: Some(not_the_operator(operator)),
            param_kind: Some(ParamKind {
                api_version: Some("v1".into()),
                kind: Some("ResourceQuota".into()),
            }),
            variables: Some(variables),
            validations: Some(validations),
            ..ValidatingAdmissionPolicySpec::default()
        }),
        status: None,
    }
}

/// The policy for namespaces outside every team: no governed DeviceClass, by claim, template or
/// extended resource. `governed` and `operator` as for [`team_policy`]; `team_namespaces` are
/// every namespace a team owns, which the policy leaves to the team policy.
pub fn non_team_policy(
    governed: &GovernedClasses,
    operator: &str,
    team_namespaces: &BTreeSet<&str>,
) -> ValidatingAdmissionPolicy {
    let variables = governed_variables(governed);
    let mut match_conditions = not_the_operator(operator);
    match_conditions.extend(outside_every_team(team_namespaces));
    let outside = format!(
        "'namespace ' + request.namespace + ' belongs to no TeamGpuPolicy, so it may not use GPUs that teamgpu governs (teamgpu DeviceClasses and classes selecting the same devices): label it for a team, or ask a cluster admin to exempt it with {EXEMPT_LABEL}=true'"
    );
    ValidatingAdmissionPolicy {
        metadata: meta(NON_TEAM_POLICY_NAME),
        spec: Some(ValidatingAdmissionPolicySpec {
            failure_policy: Some("Fail".into()),
            match_constraints: Some(rules()),
            match_conditions: Some(match_conditions),
            variables: Some(variables),
            validations: Some(vec![
                validation(
                    format!(
                        "!variables.requests.exists(r, {})",
                        request_uses(
                            "(CLASS.endsWith('.teamgpu.io') || CLASS in variables.governed)"
                        )
                    ),
                    &outside,
                ),
                validation(
                    format!("!{}", pod_asks_for("K in variables.extended")),
                    &outside,
                ),
            ]),
            ..ValidatingAdmissionPolicySpec::default()
        }),
        status: None,
    }
}

/// The API server refuses a CEL expression of more than 100,000 code points; the match
/// conditions that list the team namespaces stay below it with room for the text around the list.
const MAX_LIST_CHARS: usize = 90_000;

/// Match conditions that leave out every namespace of `team_namespaces`, a list per condition
/// of at most [`MAX_LIST_CHARS`] (about 4,500 names of the benchmark's length; 10,000 namespaces
/// take three conditions, of the 64 a policy may have). The first is `outside-every-team`, the
/// others `outside-every-team-2`, ...
fn outside_every_team(team_namespaces: &BTreeSet<&str>) -> Vec<MatchCondition> {
    let mut chunks: Vec<Vec<&str>> = vec![Vec::new()];
    let mut chars = 0;
    for name in team_namespaces {
        // A quoted name and its separator.
        let size = name.chars().count() + 4;
        if chars + size > MAX_LIST_CHARS && chunks.last().is_some_and(|c| !c.is_empty()) {
            chunks.push(Vec::new());
            chars = 0;
        }
        chars += size;
        chunks.last_mut().expect("one chunk at least").push(name);
    }
    chunks
        .into_iter()
        .enumerate()
        .map(|(i, names)| MatchCondition {
            name: match i {
                0 => "outside-every-team".into(),
                i => format!("outside-every-team-{}", i + 1),
            },
            expression: format!("!(request.namespace in {})", cel_list(names)),
        })
        .collect()
}

/// The binding of the team policy: the namespace's teamgpu quota as params, in every namespace
/// (where there is none, the namespace is outside every team and the policy lets it be).
pub fn team_binding(enforcement: Enforcement) -> ValidatingAdmissionPolicyBinding {
    ValidatingAdmissionPolicyBinding {
        metadata: meta(TEAM_BINDING_NAME),
        spec: Some(ValidatingAdmissionPolicyBindingSpec {
            policy_name: Some(TEAM_POLICY_NAME.into()),
            param_ref: Some(ParamRef {
                name: Some(QUOTA_NAME.into()),
                parameter_not_found_action: Some("Allow".into()),
                ..ParamRef::default()
            }),
            validation_actions: Some(enforcement.validation_actions()),
            ..ValidatingAdmissionPolicyBindingSpec::default()
        }),
    }
}

/// The binding of the non-team policy: every namespace but the exempt ones (the policy's match
/// condition leaves the team namespaces out) and those whose quota of 0 is in force: labelled
/// with `guarded`, the value of [`GUARD_LABEL`] now (see [`super::outside_teams`]).
pub fn non_team_binding(
    enforcement: Enforcement,
    guarded: Option<&str>,
) -> ValidatingAdmissionPolicyBinding {
    let not_in = |key: &str, value: &str| LabelSelectorRequirement {
        key: key.into(),
        operator: "NotIn".into(),
        values: Some(vec![value.into()]),
    };
    let mut requirements = vec![not_in(EXEMPT_LABEL, "true")];
    requirements.extend(guarded.map(|label| not_in(GUARD_LABEL, label)));
    ValidatingAdmissionPolicyBinding {
        metadata: meta(NON_TEAM_BINDING_NAME),
        spec: Some(ValidatingAdmissionPolicyBindingSpec {
            policy_name: Some(NON_TEAM_POLICY_NAME.into()),
            match_resources: Some(MatchResources {
                namespace_selector: Some(LabelSelector {
                    match_expressions: Some(requirements),
                    ..LabelSelector::default()
                }),
                ..MatchResources::default()
            }),
            validation_actions: Some(enforcement.validation_actions()),
            ..ValidatingAdmissionPolicyBindingSpec::default()
        }),
    }
}
