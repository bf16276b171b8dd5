//! A client layer that counts the requests one client makes, by verb and resource, in the
//! stand-in's [`Counters`]: the same counts on the stand-in and on a real cluster (whose server
//! counters a test cannot read), and only that client's requests (not the test's own).

use std::sync::Arc;
use std::task::{Context, Poll};

use crate::faults::Counters;

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

impl<S, B> tower::Service<http::Request<B>> for Recorded<S>
where
    S: tower::Service<http::Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

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
        self.inner.call(req)
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
