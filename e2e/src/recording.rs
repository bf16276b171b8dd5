//! A client layer that counts the requests one client makes, by verb and resource, and its
//! answers by status: only that client's requests (the operator's, say), not the test's own or
//! the cluster's controllers'. The API server's own counts are
//! [`crate::TestCluster::server_request_counts`].

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};

use futures::FutureExt;
use futures::future::BoxFuture;

/// Requests by verb and resource, and answers by HTTP status.
#[derive(Debug, Default)]
pub struct Counters {
    counts: Mutex<BTreeMap<(String, String), u64>>,
    codes: Mutex<BTreeMap<u16, u64>>,
    errors: Mutex<Vec<String>>,
}

/// Error answers kept by [`Counters::errors`].
const KEPT_ERRORS: usize = 200;

/// Verbs that write.
pub const WRITE_VERBS: [&str; 5] = ["create", "update", "patch", "delete", "deletecollection"];

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Counters {
    /// Counts one request. `resource` is `plural` or `plural.group` (e.g.
    /// `resourceclaims.resource.k8s.io`), with `/subresource` appended for subresources.
    pub fn record(&self, verb: &str, resource: &str) {
        *lock(&self.counts)
            .entry((verb.to_owned(), resource.to_owned()))
            .or_default() += 1;
    }

    /// Requests with this verb and resource.
    pub fn get(&self, verb: &str, resource: &str) -> u64 {
        lock(&self.counts)
            .get(&(verb.to_owned(), resource.to_owned()))
            .copied()
            .unwrap_or(0)
    }

    /// Write requests (create, update, patch, delete, deletecollection) for a resource (all
    /// subresources included), or for every resource with `None`.
    pub fn writes(&self, resource: Option<&str>) -> u64 {
        lock(&self.counts)
            .iter()
            .filter(|((v, r), _)| {
                WRITE_VERBS.contains(&v.as_str())
                    && resource.is_none_or(|want| r == want || r.starts_with(&format!("{want}/")))
            })
            .map(|(_, n)| n)
            .sum()
    }

    /// The writes of an operator that store something: all but the SelfSubjectReview it
    /// creates at start to learn its user name (a question, stored nowhere).
    pub fn stored_writes(&self) -> u64 {
        self.writes(None) - self.get("create", "selfsubjectreviews.authentication.k8s.io")
    }

    /// Waits until a second passes without a stored write (a pass that wrote the last status
    /// may still be publishing its Events); returns the stored writes then. Panics after
    /// `timeout`.
    pub async fn settled(&self, timeout: std::time::Duration) -> u64 {
        crate::eventually("the operator settles", timeout, || async {
            let before = self.stored_writes();
            tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            let after = self.stored_writes();
            if after == before {
                Ok(after)
            } else {
                Err(format!("{before} -> {after} writes"))
            }
        })
        .await
    }

    /// All counts.
    pub fn snapshot(&self) -> BTreeMap<(String, String), u64> {
        lock(&self.counts).clone()
    }

    /// Counts one answer by HTTP status; keeps `what` of error answers.
    pub fn record_answer(&self, code: u16, what: impl FnOnce() -> String) {
        *lock(&self.codes).entry(code).or_default() += 1;
        if code >= 400 {
            let mut errors = lock(&self.errors);
            if errors.len() == KEPT_ERRORS {
                errors.remove(0);
            }
            errors.push(what());
        }
    }

    /// Answers by HTTP status code (watch streams count as their initial 200).
    pub fn status_codes(&self) -> BTreeMap<u16, u64> {
        lock(&self.codes).clone()
    }

    /// The last error answers (`<code> <METHOD> <path>`), oldest first.
    pub fn errors(&self) -> Vec<String> {
        lock(&self.errors).clone()
    }

    /// Resets all counts.
    pub fn reset(&self) {
        lock(&self.counts).clear();
        lock(&self.codes).clear();
        lock(&self.errors).clear();
    }
}

/// The tower layer: wrap a kube client's service with [`Record`] (see
/// [`crate::TestCluster::recorded_client`]).
#[derive(Clone, Debug)]
pub struct Record(pub Arc<Counters>);

/// The service [`Record`] makes.
#[derive(Clone, Debug)]
pub struct Recorded<S> {
    inner: S,
    counters: Arc<Counters>,
}

impl<S> tower::Layer<S> for Record {
    type Service = Recorded<S>;
    fn layer(&self, inner: S) -> Self::Service {
        Recorded {
            inner,
            counters: self.0.clone(),
        }
    }
}

/// The verb and resource of a request as [`Counters`] keys them (and RBAC names them):
/// `POST /api/v1/namespaces/ns/pods/name/eviction` is ("create", "pods/eviction"),
/// `PATCH /apis/resource.k8s.io/v1/deviceclasses/x` is ("patch", "deviceclasses.resource.k8s.io").
/// None for discovery and other non-resource paths.
pub fn classify(method: &str, path: &str, query: &str) -> Option<(&'static str, String)> {
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, rest) = match parts.as_slice() {
        ["api", _version, rest @ ..] => ("", rest),
        ["apis", group, _version, rest @ ..] => (*group, rest),
        _ => return None,
    };
    let rest = match rest {
        ["namespaces", _ns, tail @ ..] if !tail.is_empty() => tail,
        other => other,
    };
    let (plural, named, sub) = match rest {
        [plural] => (*plural, false, None),
        [plural, _name] => (*plural, true, None),
        [plural, _name, sub] => (*plural, true, Some(*sub)),
        _ => return None,
    };
    let watch = query
        .split('&')
        .any(|q| q == "watch=true" || q == "watch=1");
    let verb = match (method, named) {
        ("GET", true) => "get",
        ("GET", false) if watch => "watch",
        ("GET", false) => "list",
        ("POST", _) => "create",
        ("PUT", _) => "update",
        ("PATCH", _) => "patch",
        ("DELETE", true) => "delete",
        ("DELETE", false) => "deletecollection",
        _ => return None,
    };
    let mut resource = plural.to_owned();
    if !group.is_empty() {
        resource = format!("{resource}.{group}");
    }
    if let Some(sub) = sub {
        resource = format!("{resource}/{sub}");
    }
    Some((verb, resource))
}

impl<S, B, R> tower::Service<http::Request<B>> for Recorded<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<R>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<S::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let uri = req.uri();
        if let Some((verb, resource)) =
            classify(req.method().as_str(), uri.path(), uri.query().unwrap_or(""))
        {
            self.counters.record(verb, &resource);
        }
        let what = format!("{} {}", req.method(), uri.path());
        let counters = self.counters.clone();
        self.inner
            .call(req)
            .map(move |answer| {
                if let Ok(response) = &answer {
                    let code = response.status().as_u16();
                    counters.record_answer(code, || format!("{code} {what}"));
                }
                answer
            })
            .boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::classify;

    #[test]
    fn requests_are_keyed_like_the_servers_counters() {
        let c = classify;
        assert_eq!(
            c("POST", "/api/v1/namespaces/a/pods/p/eviction", ""),
            Some(("create", "pods/eviction".into()))
        );
        assert_eq!(
            c(
                "GET",
                "/apis/resource.k8s.io/v1/resourceclaims",
                "watch=true&x=1"
            ),
            Some(("watch", "resourceclaims.resource.k8s.io".into()))
        );
        assert_eq!(
            c(
                "PATCH",
                "/apis/teamgpu.io/v1alpha1/teamgpupolicies/t/status",
                ""
            ),
            Some(("patch", "teamgpupolicies.teamgpu.io/status".into()))
        );
        assert_eq!(
            c("DELETE", "/api/v1/namespaces/a/resourcequotas", ""),
            Some(("deletecollection", "resourcequotas".into()))
        );
        assert_eq!(c("GET", "/apis/teamgpu.io/v1alpha1", ""), None);
    }
}
