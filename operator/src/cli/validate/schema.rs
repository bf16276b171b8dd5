//! The OpenAPI checks of a CRD's structural schema, as the API server makes them on create:
//! types, `enum`, bounds, `pattern`, lengths and item counts, `required`, set lists. Messages
//! are the API server's own words. Pure.

use std::collections::HashMap;

use regex::Regex;
use serde_json::{Map, Value};

use super::FieldError;

/// The compiled `pattern`s of a schema, by their text.
#[derive(Debug, Default)]
pub struct Patterns(HashMap<String, Regex>);

impl Patterns {
    /// Every `pattern` below `schema`; one that does not compile is left out (and so not checked).
    pub fn of(schema: &Value) -> Patterns {
        let mut patterns = Patterns::default();
        patterns.collect(schema);
        patterns
    }

    fn collect(&mut self, schema: &Value) {
        match schema {
            Value::Object(map) => {
                if let Some(Value::String(p)) = map.get("pattern")
                    && let Ok(re) = Regex::new(p)
                {
                    self.0.insert(p.clone(), re);
                }
                map.values().for_each(|v| self.collect(v));
            }
            Value::Array(items) => items.iter().for_each(|v| self.collect(v)),
            _ => {}
        }
    }
}

/// The fields of `value` its schema does not declare, as `kubectl apply`'s strict field
/// validation refuses them (`unknown field "spec.wieght"`).
pub fn unknown_fields(schema: &Value, value: &Value, path: &str, out: &mut Vec<FieldError>) {
    match value {
        Value::Object(fields) => {
            let properties = schema.get("properties").and_then(Value::as_object);
            let extra = schema.get("additionalProperties").filter(|a| a.is_object());
            let preserve = schema["x-kubernetes-preserve-unknown-fields"] == true;
            for (name, child) in fields {
                let at = join(path, name);
                match (properties.and_then(|p| p.get(name)), extra) {
                    (Some(s), _) | (None, Some(s)) => unknown_fields(s, child, &at, out),
                    (None, None) if preserve || properties.is_none() => {}
                    (None, None) => out.push(FieldError::unknown(&at)),
                }
            }
        }
        Value::Array(items) => {
            if let Some(item) = schema.get("items") {
                for (i, child) in items.iter().enumerate() {
                    unknown_fields(item, child, &format!("{path}[{i}]"), out);
                }
            }
        }
        _ => {}
    }
}

/// The OpenAPI errors of `value` at `path` against `schema`. `null` object fields count as
/// absent: without `nullable` the API server drops them.
pub fn check(
    schema: &Value,
    value: &Value,
    path: &str,
    patterns: &Patterns,
    out: &mut Vec<FieldError>,
) {
    if let Some(expected) = schema.get("type").and_then(Value::as_str)
        && !has_type(value, expected)
    {
        let actual = type_name(value);
        out.push(FieldError::invalid(
            path,
            format!("\"{actual}\""),
            format!("{path} in body must be of type {expected}: \"{actual}\""),
        ));
        return;
    }
    if let Some(allowed) = schema.get("enum").and_then(Value::as_array)
        && !allowed.contains(value)
    {
        let supported: Vec<String> = allowed.iter().map(Value::to_string).collect();
        out.push(FieldError::new(
            path,
            format!(
                "Unsupported value: {value}: supported values: {}",
                supported.join(", ")
            ),
        ));
    }
    match value {
        Value::Number(n) => bounds(schema, n.as_f64().unwrap_or_default(), value, path, out),
        Value::String(s) => string(schema, s, path, patterns, out),
        Value::Array(items) => array(schema, items, path, patterns, out),
        Value::Object(fields) => object(schema, fields, path, patterns, out),
        _ => {}
    }
}

fn bounds(schema: &Value, n: f64, value: &Value, path: &str, out: &mut Vec<FieldError>) {
    let limits = [
        ("maximum", "exclusiveMaximum", "less"),
        ("minimum", "exclusiveMinimum", "greater"),
    ];
    for (key, exclusive_key, side) in limits {
        let Some(bound) = schema.get(key).and_then(Value::as_f64) else {
            continue;
        };
        let exclusive = schema[exclusive_key] == true;
        let outside = match (side, exclusive) {
            ("less", true) => n >= bound,
            ("less", false) => n > bound,
            (_, true) => n <= bound,
            (_, false) => n < bound,
        };
        if outside {
            let or_equal = if exclusive { "" } else { " or equal to" };
            let message = format!(
                "{path} in body should be {side} than{or_equal} {}",
                number(bound)
            );
            out.push(FieldError::invalid(path, value.to_string(), message));
        }
    }
}

fn string(schema: &Value, s: &str, path: &str, patterns: &Patterns, out: &mut Vec<FieldError>) {
    let quoted = Value::from(s).to_string();
    let too_long =
        |max| FieldError::new(path, format!("Too long: may not be more than {max} bytes"));
    let too_short = |min| {
        let message = format!("{path} in body should be at least {min} chars long");
        FieldError::invalid(path, quoted.clone(), message)
    };
    let length = s.chars().count() as u64;
    sizes(
        schema,
        length,
        ("maxLength", too_long),
        ("minLength", too_short),
        out,
    );
    if let Some(pattern) = schema.get("pattern").and_then(Value::as_str)
        && patterns.0.get(pattern).is_some_and(|re| !re.is_match(s))
    {
        let message = format!("{path} in body should match '{pattern}'");
        out.push(FieldError::invalid(path, quoted, message));
    }
}

/// A length or item count against the schema's maximum and minimum (by their keys), with the
/// error for each.
fn sizes(
    schema: &Value,
    size: u64,
    (max_key, over): (&str, impl Fn(u64) -> FieldError),
    (min_key, under): (&str, impl Fn(u64) -> FieldError),
    out: &mut Vec<FieldError>,
) {
    if let Some(max) = schema.get(max_key).and_then(Value::as_u64)
        && size > max
    {
        out.push(over(max));
    }
    if let Some(min) = schema.get(min_key).and_then(Value::as_u64)
        && size < min
    {
        out.push(under(min));
    }
}

fn array(
    schema: &Value,
    items: &[Value],
    path: &str,
    patterns: &Patterns,
    out: &mut Vec<FieldError>,
) {
    let count = items.len() as u64;
    let too_many = |max| {
        FieldError::new(
            path,
            format!("Too many: {count}: must have at most {max} items"),
        )
    };
    let too_few = |min| {
        let message = format!("{path} in body should have at least {min} items");
        FieldError::invalid(path, count.to_string(), message)
    };
    sizes(
        schema,
        count,
        ("maxItems", too_many),
        ("minItems", too_few),
        out,
    );
    if let Some(item) = schema.get("items") {
        for (i, child) in items.iter().enumerate() {
            check(item, child, &format!("{path}[{i}]"), patterns, out);
        }
    }
    if schema["x-kubernetes-list-type"] == "set" {
        for (i, child) in items.iter().enumerate() {
            if items[..i].contains(child) {
                out.push(FieldError::new(
                    &format!("{path}[{i}]"),
                    format!("Duplicate value: {child}"),
                ));
            }
        }
    }
}

fn object(
    schema: &Value,
    fields: &Map<String, Value>,
    path: &str,
    patterns: &Patterns,
    out: &mut Vec<FieldError>,
) {
    let properties = schema.get("properties").and_then(Value::as_object);
    let extra = schema.get("additionalProperties").filter(|a| a.is_object());
    for (name, child) in fields.iter().filter(|(_, v)| !v.is_null()) {
        if let Some(s) = properties.and_then(|p| p.get(name)).or(extra) {
            check(s, child, &join(path, name), patterns, out);
        }
    }
    for required in schema
        .get("required")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
    {
        if fields.get(required).is_none_or(Value::is_null) {
            out.push(FieldError::new(&join(path, required), "Required value"));
        }
    }
}

fn has_type(value: &Value, expected: &str) -> bool {
    match expected {
        "integer" => type_name(value) == "integer",
        "number" => value.is_number(),
        other => type_name(value) == other,
    }
}

/// The JSON type of a value as the API server names it; `3.0` is an integer.
fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(n) if n.as_f64().is_some_and(|f| f.fract() == 0.0) => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// A bound as the API server prints it: `1000`, not `1000.0`.
fn number(n: f64) -> String {
    if n.fract() == 0.0 && n.abs() < 1e15 {
        format!("{}", n as i64)
    } else {
        n.to_string()
    }
}

pub(super) fn join(path: &str, field: &str) -> String {
    if path.is_empty() {
        field.to_owned()
    } else {
        format!("{path}.{field}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn errors(schema: Value, value: Value) -> Vec<String> {
        let mut out = Vec::new();
        check(&schema, &value, "spec", &Patterns::of(&schema), &mut out);
        out.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn integers_bounds_and_floats() {
        let schema = json!({"type": "object", "properties": {"n": {"type": "integer", "minimum": 1.0, "maximum": 10.0}}});
        assert_eq!(
            errors(schema.clone(), json!({"n": 3.0})),
            Vec::<String>::new()
        );
        assert_eq!(
            errors(schema.clone(), json!({"n": 1.5})),
            [
                r#"spec.n: Invalid value: "number": spec.n in body must be of type integer: "number""#
            ]
        );
        assert_eq!(
            errors(schema, json!({"n": 0})),
            ["spec.n: Invalid value: 0: spec.n in body should be greater than or equal to 1"]
        );
    }

    #[test]
    fn unknown_fields_inside_maps_and_lists() {
        let schema = json!({"type": "object", "properties": {
            "labels": {"type": "object", "additionalProperties": {"type": "string"}},
            "items": {"type": "array", "items": {"type": "object", "properties": {"a": {"type": "string"}}}}
        }});
        let mut out = Vec::new();
        let value = json!({"labels": {"x": "y"}, "items": [{"a": "b"}, {"b": 1}], "c": 1});
        unknown_fields(&schema, &value, "spec", &mut out);
        let out: Vec<String> = out.iter().map(ToString::to_string).collect();
        assert_eq!(
            out,
            ["spec.c: unknown field", "spec.items[1].b: unknown field"]
        );
    }
}
