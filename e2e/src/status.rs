//! API errors rendered as `Status` objects with the reasons and codes Kubernetes uses
//! (k8s.io/apimachinery/pkg/api/errors/errors.go).

use serde_json::{Value, json};

/// A failed API request, as the API server reports it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code} {reason}: {message}")]
pub struct ApiError {
    /// HTTP status code.
    pub code: u16,
    /// `Status.reason` (NotFound, AlreadyExists, Conflict, Invalid, Forbidden, ...).
    pub reason: String,
    /// `Status.message`.
    pub message: String,
    /// `Status.details` (name, group, kind, causes), if any.
    pub details: Option<Value>,
    /// Seconds for a `Retry-After` header (429, 500 from fault injection).
    pub retry_after: Option<u64>,
}

/// Group and resource of a failure (`resourceclaims.resource.k8s.io`).
#[derive(Debug, Clone, Copy)]
pub struct Gr<'a> {
    /// API group ("" for core).
    pub group: &'a str,
    /// Plural resource name.
    pub resource: &'a str,
}

impl Gr<'_> {
    /// `resource.group` or `resource` for the core group.
    pub fn qualified(&self) -> String {
        if self.group.is_empty() {
            self.resource.to_string()
        } else {
            format!("{}.{}", self.resource, self.group)
        }
    }

    fn details(&self, name: &str) -> Value {
        json!({"name": name, "group": self.group, "kind": self.resource})
    }
}

impl ApiError {
    /// A bare error.
    pub fn new(code: u16, reason: &str, message: impl Into<String>) -> ApiError {
        ApiError {
            code,
            reason: reason.to_string(),
            message: message.into(),
            details: None,
            retry_after: None,
        }
    }

    /// `404 NotFound`: `resourceclaims.resource.k8s.io "x" not found`.
    pub fn not_found(gr: Gr<'_>, name: &str) -> ApiError {
        ApiError {
            details: Some(gr.details(name)),
            ..ApiError::new(
                404,
                "NotFound",
                format!("{} \"{name}\" not found", gr.qualified()),
            )
        }
    }

    /// `409 AlreadyExists`.
    pub fn already_exists(gr: Gr<'_>, name: &str) -> ApiError {
        ApiError {
            details: Some(gr.details(name)),
            ..ApiError::new(
                409,
                "AlreadyExists",
                format!("{} \"{name}\" already exists", gr.qualified()),
            )
        }
    }

    /// `409 Conflict` for a stale resourceVersion (the storage layer's wording).
    pub fn conflict(gr: Gr<'_>, name: &str) -> ApiError {
        ApiError::conflict_msg(
            gr,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }

    /// `409 Conflict` with a custom cause.
    pub fn conflict_msg(gr: Gr<'_>, name: &str, msg: &str) -> ApiError {
        ApiError {
            details: Some(gr.details(name)),
            ..ApiError::new(
                409,
                "Conflict",
                format!(
                    "Operation cannot be fulfilled on {} \"{name}\": {msg}",
                    gr.qualified()
                ),
            )
        }
    }

    /// `422 Invalid` with field causes (`field: message` strings).
    pub fn invalid(gr: Gr<'_>, kind: &str, name: &str, causes: &[String]) -> ApiError {
        let mut details = gr.details(name);
        details["kind"] = json!(kind);
        details["causes"] = Value::Array(
            causes
                .iter()
                .map(|c| {
                    let (field, msg) = c.split_once(": ").unwrap_or(("", c.as_str()));
                    json!({"reason": "FieldValueInvalid", "message": msg, "field": field})
                })
                .collect(),
        );
        let group_kind = if gr.group.is_empty() {
            kind.to_string()
        } else {
            format!("{kind}.{}", gr.group)
        };
        let list = if causes.len() == 1 {
            causes[0].clone()
        } else {
            format!("[{}]", causes.join(", "))
        };
        ApiError {
            details: Some(details),
            ..ApiError::new(
                422,
                "Invalid",
                format!("{group_kind} \"{name}\" is invalid: {list}"),
            )
        }
    }

    /// `403 Forbidden`.
    pub fn forbidden(gr: Gr<'_>, name: &str, msg: &str) -> ApiError {
        let what = if name.is_empty() {
            gr.qualified()
        } else {
            format!("{} \"{name}\"", gr.qualified())
        };
        ApiError {
            details: Some(gr.details(name)),
            ..ApiError::new(403, "Forbidden", format!("{what} is forbidden: {msg}"))
        }
    }

    /// `400 BadRequest`.
    pub fn bad_request(msg: impl Into<String>) -> ApiError {
        ApiError::new(400, "BadRequest", msg)
    }

    /// `410 Gone` / `Expired` for a too-old resourceVersion.
    pub fn expired(msg: impl Into<String>) -> ApiError {
        ApiError::new(410, "Expired", msg)
    }

    /// `405 MethodNotAllowed`.
    pub fn method_not_allowed() -> ApiError {
        ApiError::new(
            405,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource",
        )
    }

    /// `404 NotFound` for an unknown path.
    pub fn no_route(path: &str) -> ApiError {
        ApiError::new(
            404,
            "NotFound",
            format!("the server could not find the requested resource ({path})"),
        )
    }

    /// The `Status` object.
    pub fn to_status(&self) -> Value {
        let mut s = json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {},
            "status": "Failure", "message": self.message, "reason": self.reason, "code": self.code,
        });
        if let Some(d) = &self.details {
            s["details"] = d.clone();
        }
        if let Some(secs) = self.retry_after {
            let d = s
                .as_object_mut()
                .expect("object")
                .entry("details")
                .or_insert_with(|| json!({}));
            d["retryAfterSeconds"] = json!(secs);
        }
        s
    }
}

/// JSON of a value, shortened for messages.
pub fn short_json(v: &Value) -> String {
    truncate(&v.to_string(), 200)
}

/// `s`, cut to at most `max` characters with "..." when longer.
pub fn truncate(s: &str, max: usize) -> String {
    if s.chars().count() > max {
        let mut t: String = s.chars().take(max.saturating_sub(3)).collect();
        t.push_str("...");
        t
    } else {
        s.to_string()
    }
}
