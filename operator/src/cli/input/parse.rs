//! One file's text into documents: JSON (`.json` files, or text that starts as JSON) with
//! serde_json, YAML with serde-saphyr under a node budget that scales with `--max-yaml-nodes`.

use std::path::Path;

use serde_json::Value;
use serde_saphyr::budget::{Budget, BudgetBreach};

use super::InputError;

/// How large a YAML stream may be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// YAML nodes (mappings, sequences, scalars, alias expansions counted) in one file. The
    /// limit is what stops an alias bomb; a dump of a real cluster needs far fewer: a List of
    /// 5,000 8-GPU ResourceSlices has about 2.3 million.
    pub max_yaml_nodes: usize,
}

/// The environment variable that raises (or lowers) [`Limits::max_yaml_nodes`].
pub const MAX_YAML_NODES_ENV: &str = "TEAMGPU_MAX_YAML_NODES";

impl Limits {
    pub const DEFAULT_MAX_YAML_NODES: usize = 20_000_000;
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_yaml_nodes: Limits::DEFAULT_MAX_YAML_NODES,
        }
    }
}

/// The documents of one file's text; `path` names it in errors.
pub fn documents(path: &Path, text: &str, limits: &Limits) -> Result<Vec<Value>, InputError> {
    let is_json_file = path.extension().is_some_and(|e| e == "json");
    let looks_like_json = text.trim_start().starts_with(['{', '[']);
    if is_json_file || looks_like_json {
        match json_stream(text) {
            Ok(docs) => return Ok(docs),
            // A YAML flow mapping also starts with `{`: only a .json file must be JSON.
            Err(e) if is_json_file => {
                return Err(InputError::Json {
                    path: path.to_owned(),
                    message: e.to_string(),
                });
            }
            Err(_) => {}
        }
    }
    yaml_stream(path, text, limits)
}

/// One or more JSON values one after the other (as `kubectl get -o json` of several calls).
fn json_stream(text: &str) -> Result<Vec<Value>, serde_json::Error> {
    serde_json::Deserializer::from_str(text)
        .into_iter::<Value>()
        .collect()
}

fn yaml_stream(path: &Path, text: &str, limits: &Limits) -> Result<Vec<Value>, InputError> {
    let nodes = limits.max_yaml_nodes;
    let mut budget = Budget::default();
    budget.max_nodes = nodes;
    // Every node is one or two events, every document two more.
    budget.max_events = nodes.saturating_mul(4).max(budget.max_events);
    budget.max_documents = nodes.max(budget.max_documents);
    // Scalars hold at most the text itself, unless aliases repeat them.
    budget.max_total_scalar_bytes = text.len().max(budget.max_total_scalar_bytes);
    let options = serde_saphyr::options! { budget: Some(budget) };
    serde_saphyr::from_multiple_with_options(text, options).map_err(|e| match breach(&e) {
        Some(breach) => InputError::TooLarge {
            path: path.to_owned(),
            what: describe(breach, limits),
        },
        None => InputError::Yaml {
            path: path.to_owned(),
            message: e.to_string(),
        },
    })
}

fn breach(e: &serde_saphyr::Error) -> Option<&BudgetBreach> {
    match e {
        serde_saphyr::Error::Budget { breach, .. } => Some(breach),
        serde_saphyr::Error::AliasError { error, .. }
        | serde_saphyr::Error::WithSnippet { error, .. } => breach(error),
        _ => None,
    }
}

fn describe(breach: &BudgetBreach, limits: &Limits) -> String {
    let nodes = limits.max_yaml_nodes;
    match breach {
        BudgetBreach::Nodes { .. } | BudgetBreach::Events { .. } => format!(
            "more than {nodes} YAML nodes (raise the limit with --max-yaml-nodes or {MAX_YAML_NODES_ENV})"
        ),
        other => format!("{other:?} is over the YAML parser's limit"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_yaml_and_the_node_budget() {
        let json = "{\"kind\": \"A\"}\n{\"kind\": \"B\"}\n";
        let docs = documents(Path::new("x.json"), json, &Limits::default()).unwrap();
        assert_eq!(docs.len(), 2);
        let err = documents(Path::new("x.json"), "{\"kind\": ", &Limits::default()).unwrap_err();
        assert!(
            err.to_string().starts_with("x.json: not valid JSON"),
            "{err}"
        );
        // A YAML flow mapping is read as YAML.
        let docs = documents(Path::new("x.yaml"), "{kind: A}\n", &Limits::default()).unwrap();
        assert_eq!(docs[0]["kind"], "A");
        let small = Limits { max_yaml_nodes: 5 };
        let err = documents(Path::new("big.yaml"), "a: [1, 2, 3, 4, 5]\n", &small).unwrap_err();
        assert_eq!(
            err.to_string(),
            "big.yaml: too large: more than 5 YAML nodes (raise the limit with --max-yaml-nodes or TEAMGPU_MAX_YAML_NODES)"
        );
    }
}
