//! A ValidatingAdmissionPolicy evaluator for the tests of the generated policies
//! (`tests/admission.rs`, `tests/namespace_admission.rs`): kube-cel judges each policy's
//! validations against one request. It only approximates the API server:
//! - kube-cel binds no `variables`, so each `variables.<name>` is inlined as its expression (the
//!   same result as Kubernetes' lazy, at-most-once evaluation; only the cost differs);
//! - kube-cel escapes names Kubernetes leaves alone, so the policies' text is rewritten before it
//!   is judged (see [`escaped_for_kube_cel`]);
//! - no cost budget, no type-check of the policy as a whole, no params lookup by reference.
//!
//! What the real API server accepts and refuses is shown by the e2e tests
//! (`e2e/tests/generated_objects.rs`, and the scenarios under `e2e/tests/scenarios/`).

use k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicy;
use teamgpu::core::plan::objects::{
    OWN_GPUS_ANNOTATION_PREFIX, QUOTA_CLASSES_ANNOTATION, QUOTA_TEAM_ANNOTATION,
    SLICE_ANNOTATION_PREFIX,
};
use teamgpu::core::plan::usage::DEVICES_PER_CLASS_SUFFIX;

/// `expr` as kube-cel needs it, which escapes every key of the values it binds where
/// Kubernetes 1.36 escapes only some schema property names:
/// - the quota annotation keys the policy looks up (`.` → `__dot__`, `-` → `__dash__`, `/` →
///   `__slash__`), also those it computes from a class name: Kubernetes never escapes the keys
///   of a map such as `annotations`;
/// - the property `namespace` (a member's, an object's), which kube-cel escapes as a CEL reserved
///   word (`__namespace__`) and Kubernetes does not (checked on the API server). kube-cel's own
///   `request.namespace` is not escaped.
fn escaped_for_kube_cel(expr: &str) -> String {
    let expr = [QUOTA_TEAM_ANNOTATION, QUOTA_CLASSES_ANNOTATION]
        .iter()
        .fold(expr.to_owned(), |expr, key| {
            expr.replace(&format!("'{key}'"), &format!("'{}'", escaped_key(key)))
        });
    // A key computed from a class (`'teamgpu.io/gpus-' + r.exactly.deviceClassName`): escaped
    // as kube-cel escaped the keys, by CEL string replacements.
    let expr = [OWN_GPUS_ANNOTATION_PREFIX, SLICE_ANNOTATION_PREFIX]
        .iter()
        .fold(expr, |expr, prefix| escape_computed_keys(expr, prefix));
    // The quota's hard of a class (`r.exactly.deviceClassName + '.deviceclass…/devices'`).
    let expr = escape_computed_suffix(expr, DEVICES_PER_CLASS_SUFFIX);
    replace_identifier(&expr, ".namespace", ".__namespace__")
        .replace("request.__namespace__", "request.namespace")
}

/// A map key as kube-cel escapes it.
fn escaped_key(key: &str) -> String {
    key.replace('.', "__dot__")
        .replace('-', "__dash__")
        .replace('/', "__slash__")
}

/// `expr` with every `'<prefix>' + <operand>` escaped as kube-cel escapes map keys.
fn escape_computed_keys(mut expr: String, prefix: &str) -> String {
    let escaped_prefix = format!("'{}' + ", escaped_key(prefix));
    let prefix = format!("'{prefix}' + ");
    while let Some(at) = expr.find(&prefix) {
        let operand_at = at + prefix.len();
        let operand_len = expr[operand_at..]
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '.' || c == '_'))
            .unwrap_or(expr.len() - operand_at);
        let operand = expr[operand_at..operand_at + operand_len].to_owned();
        let replaced =
            format!("{escaped_prefix}{operand}.replace('-', '__dash__').replace('.', '__dot__')");
        expr.replace_range(at..operand_at + operand_len, &replaced);
    }
    expr
}

/// `expr` with every `<operand> + '<suffix>'` escaped as kube-cel escapes map keys (the operand
/// a class name: no `/`).
fn escape_computed_suffix(mut expr: String, suffix: &str) -> String {
    let plain = format!(" + '{suffix}'");
    let done = format!(
        ".replace('-', '__dash__').replace('.', '__dot__') + '{}'",
        escaped_key(suffix)
    );
    while let Some(at) = expr.find(&plain) {
        expr.replace_range(at..at + plain.len(), &done);
    }
    expr
}

/// Why a policy could not be evaluated.
#[derive(Debug, thiserror::Error)]
pub enum EvaluationError {
    #[error("ValidatingAdmissionPolicy {0} has no spec")]
    NoSpec(String),
    #[error("variable {name} of ValidatingAdmissionPolicy {policy} references itself")]
    CyclicVariable { policy: String, name: String },
}

/// Evaluate a ValidatingAdmissionPolicy's validations against one admission request with kube-cel
/// and return the messages of the validations that deny it (empty: admitted).
///
/// kube-cel's evaluator binds `object`, `oldObject`, `request` and `params` but not `variables`, so
/// each `variables.<name>` is inlined as its (parenthesised) expression first. Kubernetes evaluates
/// variables lazily and at most once, which gives the same result as inlining; only cost differs.
/// An expression that errors denies, as `failurePolicy: Fail` does.
pub fn evaluate(
    policy: &ValidatingAdmissionPolicy,
    object: &serde_json::Value,
    request: kube_cel::AdmissionRequest,
    params: Option<&serde_json::Value>,
) -> Result<Vec<String>, EvaluationError> {
    evaluate_change(policy, object, None, request, params)
}

/// [`evaluate`] for an update from `old_object` (`None`: a create). The policy's
/// `matchConditions` are evaluated first, as the API server does: when one is false, the policy
/// does not apply and nothing is denied.
pub fn evaluate_change(
    policy: &ValidatingAdmissionPolicy,
    object: &serde_json::Value,
    old_object: Option<&serde_json::Value>,
    request: kube_cel::AdmissionRequest,
    params: Option<&serde_json::Value>,
) -> Result<Vec<String>, EvaluationError> {
    let name = policy.metadata.name.clone().unwrap_or_default();
    let spec = policy
        .spec
        .as_ref()
        .ok_or_else(|| EvaluationError::NoSpec(name.clone()))?;
    let variables: Vec<(&str, &str)> = spec
        .variables
        .iter()
        .flatten()
        .map(|v| (v.name.as_str(), v.expression.as_str()))
        .collect();
    let inline = |expr: &str| {
        inline_variables(&variables, expr)
            .map(|e| escaped_for_kube_cel(&e))
            .ok_or_else(|| EvaluationError::CyclicVariable {
                policy: name.clone(),
                name: expr.to_owned(),
            })
    };
    let conditions: Vec<kube_cel::VapExpression> = spec
        .match_conditions
        .iter()
        .flatten()
        .map(|c| kube_cel::VapExpression {
            expression: c.expression.clone(),
            message: Some(c.name.clone()),
            message_expression: None,
        })
        .collect();
    let mut expressions = Vec::new();
    for v in spec.validations.iter().flatten() {
        expressions.push(kube_cel::VapExpression {
            expression: inline(&v.expression)?,
            message: v.message.clone(),
            message_expression: v.message_expression.as_deref().map(inline).transpose()?,
        });
    }
    let mut evaluator = kube_cel::VapEvaluator::builder()
        .object(object.clone())
        .request(request);
    if let Some(params) = params {
        evaluator = evaluator.params(params.clone());
    }
    if let Some(old) = old_object {
        evaluator = evaluator.old_object(old.clone());
    }
    let evaluator = evaluator.build();
    if evaluator.evaluate(&conditions).iter().any(|r| !r.passed) {
        return Ok(Vec::new());
    }
    Ok(evaluator
        .evaluate(&expressions)
        .into_iter()
        .filter(|r| !r.passed)
        .map(|r| r.message.unwrap_or_default())
        .collect())
}

/// `expr` with every `variables.<name>` replaced by that variable's (parenthesised) expression,
/// recursively; `None` when variables refer to each other in a cycle. Kubernetes evaluates a
/// variable lazily and at most once, which gives the same result as inlining (only the cost
/// differs), so an evaluator without `variables` (kube-cel's) can run such a policy.
pub fn inline_variables(variables: &[(&str, &str)], expr: &str) -> Option<String> {
    let mut out = expr.to_owned();
    // Each pass resolves one level of variables referring to earlier ones.
    for _ in 0..=variables.len() {
        if !out.contains("variables.") {
            return Some(out);
        }
        for (var, body) in variables {
            out = replace_identifier(&out, &format!("variables.{var}"), &format!("({body})"));
        }
    }
    None
}

/// Replace `ident` in `text` where it is a whole identifier path (not followed by an identifier
/// character, so `variables.spec` leaves `variables.specs` alone).
fn replace_identifier(text: &str, ident: &str, with: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(pos) = rest.find(ident) {
        let after = &rest[pos + ident.len()..];
        let whole = !after.starts_with(|c: char| c.is_ascii_alphanumeric() || c == '_');
        out.push_str(&rest[..pos]);
        out.push_str(if whole { with } else { ident });
        rest = after;
    }
    out.push_str(rest);
    out
}
