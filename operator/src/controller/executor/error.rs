//! Why a write failed, and what that means: a metric label, refused or transient, the API's own
//! words. No client.

use std::time::Duration;

use crate::core::effects::Failure;

/// Why a write failed.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    #[error(transparent)]
    Api(#[from] kube::Error),
    #[error("no answer within {0:?}")]
    TimedOut(Duration),
    /// Not asked: PodDisruptionBudgets would let only part of a workload go.
    #[error("{0}")]
    Overdrawn(String),
}

impl WriteError {
    /// A short, stable label of the error, for metrics and logs.
    pub fn metric_label(&self) -> &'static str {
        match self {
            WriteError::Api(kube::Error::Api(s)) => match s.code {
                409 => "conflict",
                422 => "invalid",
                429 => "too_many_requests",
                403 => "forbidden",
                404 => "not_found",
                code if code >= 500 => "server_error",
                _ => "api",
            },
            WriteError::Api(_) => "transport",
            WriteError::TimedOut(_) => "timeout",
            WriteError::Overdrawn(_) => "disruption_budget",
        }
    }

    /// The API server's status code, if it answered.
    pub(super) fn code(&self) -> Option<u16> {
        match self {
            WriteError::Api(kube::Error::Api(s)) => Some(s.code),
            _ => None,
        }
    }

    /// Whether the API server refused the write (4xx but a conflict, a request timeout or too
    /// many requests: the same write is refused again until a rule changes), or gave no verdict.
    pub(super) fn failure(&self) -> Failure {
        match self {
            WriteError::Api(kube::Error::Api(s))
                if (400..500).contains(&s.code) && ![408, 409, 429].contains(&s.code) =>
            {
                Failure::Refused
            }
            _ => Failure::Transient,
        }
    }

    /// The API's own words (`Status.message`), else the error's.
    pub(super) fn message(&self) -> String {
        match self {
            WriteError::Api(kube::Error::Api(s)) if !s.message.is_empty() => s.message.clone(),
            error => error.to_string(),
        }
    }

    /// Why an eviction did not happen, for the Event that says so.
    pub(super) fn refusal(&self) -> String {
        match self {
            WriteError::TimedOut(_) => {
                "not allowed yet: the API server kept answering 429 (a PodDisruptionBudget?)".into()
            }
            WriteError::Api(error) => error.to_string(),
            WriteError::Overdrawn(why) => why.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_have_stable_labels() {
        let api = |code| {
            WriteError::Api(kube::Error::Api(
                kube::core::Status::failure("no", "Reason")
                    .with_code(code)
                    .boxed(),
            ))
        };
        assert_eq!(api(409).metric_label(), "conflict");
        assert_eq!(api(503).metric_label(), "server_error");
        assert_eq!(api(400).metric_label(), "api");
        assert_eq!(
            WriteError::TimedOut(Duration::from_secs(5)).metric_label(),
            "timeout"
        );
    }

    #[test]
    fn a_write_the_api_server_judged_is_refused_and_one_without_verdict_is_transient() {
        let api = |code, message: &str| {
            WriteError::Api(kube::Error::Api(
                kube::core::Status::failure(message, "Reason")
                    .with_code(code)
                    .boxed(),
            ))
        };
        let denied = api(
            422,
            "resourcequotas \"teamgpu\" is forbidden: denied request: no",
        );
        assert_eq!(denied.failure(), Failure::Refused);
        assert_eq!(
            denied.message(),
            "resourcequotas \"teamgpu\" is forbidden: denied request: no"
        );
        assert_eq!(api(403, "forbidden").failure(), Failure::Refused);
        for code in [409, 429, 500, 503] {
            assert_eq!(api(code, "later").failure(), Failure::Transient, "{code}");
        }
        let timeout = WriteError::TimedOut(Duration::from_secs(30));
        assert_eq!(timeout.failure(), Failure::Transient);
        assert_eq!(timeout.message(), "no answer within 30s");
    }
}
