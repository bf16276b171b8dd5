//! Label selectors (k8s.io/apimachinery/pkg/labels, every operator of the string syntax) and the
//! field selectors the stand-in supports.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::status::ApiError;

/// One requirement of a label selector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Requirement {
    /// `k=v`, `k==v`, `k in (a,b)`.
    In(String, Vec<String>),
    /// `k!=v`, `k notin (a,b)` (also matches objects without the label).
    NotIn(String, Vec<String>),
    /// `k`.
    Exists(String),
    /// `!k`.
    DoesNotExist(String),
    /// `k>n` (integer comparison; objects whose value is not an integer do not match).
    Gt(String, i64),
    /// `k<n`.
    Lt(String, i64),
}

/// A parsed label selector (requirements are ANDed).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelSelector(pub Vec<Requirement>);

fn split_top(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut depth = 0;
    let mut start = 0;
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out
}

fn bad(sel: &str, why: &str) -> ApiError {
    ApiError::bad_request(format!(
        "unable to parse requirement: {why} in selector {sel:?}"
    ))
}

fn set_values(sel: &str, rest: &str) -> Result<Vec<String>, ApiError> {
    let rest = rest.trim();
    let inner = rest
        .strip_prefix('(')
        .and_then(|r| r.strip_suffix(')'))
        .ok_or_else(|| bad(sel, "found '', expected: '('"))?;
    Ok(inner
        .split(',')
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
        .collect())
}

impl LabelSelector {
    /// Parses the `labelSelector` query syntax.
    pub fn parse(sel: &str) -> Result<LabelSelector, ApiError> {
        let mut reqs = Vec::new();
        if sel.trim().is_empty() {
            return Ok(LabelSelector(reqs));
        }
        for part in split_top(sel) {
            let p = part.trim();
            if p.is_empty() {
                return Err(bad(sel, "empty requirement"));
            }
            let req = if let Some(k) = p.strip_prefix('!') {
                Requirement::DoesNotExist(k.trim().to_string())
            } else if let Some((k, v)) = p.split_once("!=") {
                Requirement::NotIn(k.trim().into(), vec![v.trim().into()])
            } else if let Some((k, v)) = p.split_once("==") {
                Requirement::In(k.trim().into(), vec![v.trim().into()])
            } else if let Some((k, v)) = p.split_once('=') {
                Requirement::In(k.trim().into(), vec![v.trim().into()])
            } else if let Some((k, v)) = p.split_once('>') {
                let n = v.trim().parse().map_err(|_| {
                    bad(
                        sel,
                        "for 'gt', 'lt' operators, the value must be an integer",
                    )
                })?;
                Requirement::Gt(k.trim().into(), n)
            } else if let Some((k, v)) = p.split_once('<') {
                let n = v.trim().parse().map_err(|_| {
                    bad(
                        sel,
                        "for 'gt', 'lt' operators, the value must be an integer",
                    )
                })?;
                Requirement::Lt(k.trim().into(), n)
            } else if let Some((k, v)) = p.split_once(" notin ") {
                Requirement::NotIn(k.trim().into(), set_values(sel, v)?)
            } else if let Some((k, v)) = p.split_once(" in ") {
                Requirement::In(k.trim().into(), set_values(sel, v)?)
            } else if p.contains(' ') || p.contains('(') {
                return Err(bad(sel, "unexpected token"));
            } else {
                Requirement::Exists(p.to_string())
            };
            reqs.push(req);
        }
        Ok(LabelSelector(reqs))
    }

    /// Converts a `metav1.LabelSelector` object (matchLabels + matchExpressions).
    pub fn from_object(sel: &Value) -> Result<LabelSelector, String> {
        let mut reqs = Vec::new();
        if let Some(m) = sel.get("matchLabels").and_then(Value::as_object) {
            for (k, v) in m {
                reqs.push(Requirement::In(
                    k.clone(),
                    vec![v.as_str().unwrap_or("").to_string()],
                ));
            }
        }
        if let Some(exprs) = sel.get("matchExpressions").and_then(Value::as_array) {
            for e in exprs {
                let key = e["key"].as_str().unwrap_or("").to_string();
                let values: Vec<String> = e["values"]
                    .as_array()
                    .map(|a| {
                        a.iter()
                            .filter_map(|v| v.as_str().map(String::from))
                            .collect()
                    })
                    .unwrap_or_default();
                reqs.push(match e["operator"].as_str() {
                    Some("In") => Requirement::In(key, values),
                    Some("NotIn") => Requirement::NotIn(key, values),
                    Some("Exists") => Requirement::Exists(key),
                    Some("DoesNotExist") => Requirement::DoesNotExist(key),
                    other => {
                        return Err(format!("{other:?} is not a valid label selector operator"));
                    }
                });
            }
        }
        Ok(LabelSelector(reqs))
    }

    /// Whether labels match every requirement.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.0.iter().all(|r| match r {
            Requirement::In(k, vs) => labels.get(k).is_some_and(|v| vs.contains(v)),
            Requirement::NotIn(k, vs) => labels.get(k).is_none_or(|v| !vs.contains(v)),
            Requirement::Exists(k) => labels.contains_key(k),
            Requirement::DoesNotExist(k) => !labels.contains_key(k),
            Requirement::Gt(k, n) => labels
                .get(k)
                .and_then(|v| v.parse::<i64>().ok())
                .is_some_and(|v| v > *n),
            Requirement::Lt(k, n) => labels
                .get(k)
                .and_then(|v| v.parse::<i64>().ok())
                .is_some_and(|v| v < *n),
        })
    }

    /// Matches an object's `metadata.labels`.
    pub fn matches_object(&self, obj: &Value) -> bool {
        self.matches(&labels_of(obj))
    }
}

/// `metadata.labels` as a map.
pub fn labels_of(obj: &Value) -> BTreeMap<String, String> {
    obj.pointer("/metadata/labels")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_string()))
                .collect()
        })
        .unwrap_or_default()
}

/// A parsed field selector: (field, equals?, value) terms, ANDed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldSelector(pub Vec<(String, bool, String)>);

impl FieldSelector {
    /// Parses `fieldSelector`. Every kind supports `metadata.name` and `metadata.namespace`;
    /// Pods also `status.phase`, `spec.nodeName`. Other fields are rejected with 400 BadRequest
    /// (`field label not supported: <field>`), as the API server does.
    pub fn parse(sel: &str, kind: &str) -> Result<FieldSelector, ApiError> {
        let mut terms = Vec::new();
        if sel.trim().is_empty() {
            return Ok(FieldSelector(terms));
        }
        for part in sel.split(',') {
            let (field, eq, value) = if let Some((f, v)) = part.split_once("!=") {
                (f, false, v)
            } else if let Some((f, v)) = part.split_once("==") {
                (f, true, v)
            } else if let Some((f, v)) = part.split_once('=') {
                (f, true, v)
            } else {
                return Err(ApiError::bad_request(format!(
                    "invalid selector: '{sel}'; can't understand '{part}'"
                )));
            };
            let field = field.trim();
            let supported = matches!(field, "metadata.name" | "metadata.namespace")
                || (kind == "Pod" && matches!(field, "status.phase" | "spec.nodeName"));
            if !supported {
                return Err(ApiError::bad_request(format!(
                    "field label not supported: {field}"
                )));
            }
            terms.push((field.to_string(), eq, value.trim().to_string()));
        }
        Ok(FieldSelector(terms))
    }

    /// Whether the object matches every term.
    pub fn matches(&self, obj: &Value) -> bool {
        self.0.iter().all(|(field, eq, value)| {
            let pointer = format!("/{}", field.replace('.', "/"));
            let actual = obj.pointer(&pointer).and_then(Value::as_str).unwrap_or("");
            (actual == value) == *eq
        })
    }

    /// The `metadata.name` an equality term pins, if any (used by watches of one object).
    pub fn name(&self) -> Option<&str> {
        self.0
            .iter()
            .find(|(f, eq, _)| f == "metadata.name" && *eq)
            .map(|(_, _, v)| v.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn parses_and_matches_every_operator() {
        let l = labels(&[("app", "x"), ("tier", "gpu"), ("n", "5")]);
        for (sel, want) in [
            ("app=x", true),
            ("app==x", true),
            ("app!=x", false),
            ("missing!=x", true),
            ("tier in (gpu, cpu)", true),
            ("tier notin (gpu)", false),
            ("app", true),
            ("!app", false),
            ("n>4,n<6", true),
            ("n>5", false),
            ("app=x,tier in (cpu)", false),
        ] {
            assert_eq!(
                LabelSelector::parse(sel).unwrap().matches(&l),
                want,
                "{sel}"
            );
        }
        assert!(LabelSelector::parse("n>x").is_err());
        assert!(LabelSelector::parse("a in b").is_err());
    }

    #[test]
    fn field_selectors_reject_unsupported_fields() {
        assert!(FieldSelector::parse("status.phase=Running", "Pod").is_ok());
        let e = FieldSelector::parse("status.phase=Running", "ResourceClaim").unwrap_err();
        assert_eq!(e.message, "field label not supported: status.phase");
    }
}
