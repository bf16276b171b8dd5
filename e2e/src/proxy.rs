//! A fault-injecting HTTP proxy in front of a real Kubernetes API server.
//!
//! Tests point the operator (or any kube client) at [`FaultProxy::config`] instead of the API
//! server itself. Every request is forwarded through an upstream [`kube::Client`] (which does
//! the TLS and authentication, so the proxy acts with that client's identity), except those the
//! current [`Faults`] pick to fail: the point is to see the operator survive the failures a real
//! cluster produces now and then (500s, throttling, dropped watch connections, compacted
//! resourceVersions) without having to provoke them in the real server.
//!
//! The proxy speaks plain HTTP/1.1 on `127.0.0.1`, streams response bodies through unbuffered
//! (a watch is one long chunked response) and counts what it did in [`Counters`].

use std::convert::Infallible;
use std::fmt;
use std::hash::{BuildHasher, RandomState};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::{Instant, Sleep};

use crate::recording::classify;

/// Faults to inject. Rates are probabilities in `[0, 1]`, rolled independently per request.
/// [`Faults::default`] injects nothing: the proxy is then a transparent pass-through.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Faults {
    /// Fraction of non-watch requests the proxy answers itself with `500 InternalError` (never
    /// forwarded, so nothing changes upstream). kube clients do not retry 500s, so the caller's
    /// own error handling is what gets exercised.
    pub rate_500: f64,
    /// Fraction of non-watch requests answered with `429 TooManyRequests` and a `Retry-After`
    /// header (as API Priority and Fairness does). kube's default client retries these itself.
    pub rate_429: f64,
    /// `Retry-After` seconds of injected 429 answers (also in the Status' `retryAfterSeconds`).
    pub retry_after_secs: u64,
    /// Cut every watch response this long after the request arrived: the body ends cleanly, as
    /// when the API server's `--min-request-timeout` or a load balancer ends a long connection.
    /// Watches must then resume from their last resourceVersion.
    pub watch_close_after: Option<Duration>,
    /// Fraction of watches that resume from a resourceVersion (non-empty, not `"0"`) answered
    /// the way the API server answers a compacted resourceVersion: one `ERROR` event with a
    /// `410 Expired` Status. Watchers must then relist.
    pub rate_watch_gone: f64,
}

/// Why [`FaultProxy::start`] failed.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    /// Could not listen on `127.0.0.1:0`.
    #[error("cannot listen on 127.0.0.1: {0}")]
    Bind(#[source] std::io::Error),
    /// Could not learn the port the listener got.
    #[error("cannot read the proxy's listening address: {0}")]
    LocalAddr(#[source] std::io::Error),
}

/// What one proxy did: its requests by verb and resource and answers by status (a
/// [`crate::recording::Counters`], which it dereferences to), and the faults it injected. Shared
/// with the proxy's connections, so it stays readable while they run.
#[derive(Debug, Default)]
pub struct Counters {
    requests: crate::recording::Counters,
    forwarded: AtomicU64,
    injected_500: AtomicU64,
    injected_429: AtomicU64,
    watches_cut: AtomicU64,
    watches_gone: AtomicU64,
}

impl std::ops::Deref for Counters {
    type Target = crate::recording::Counters;
    fn deref(&self) -> &Self::Target {
        &self.requests
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic elsewhere while counting must not hide the counts from the test.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Counters {
    /// Requests forwarded to the API server (all paths, discovery included).
    pub fn forwarded(&self) -> u64 {
        self.forwarded.load(Ordering::Relaxed)
    }

    /// Requests answered with an injected 500.
    pub fn injected_500(&self) -> u64 {
        self.injected_500.load(Ordering::Relaxed)
    }

    /// Requests answered with an injected 429.
    pub fn injected_429(&self) -> u64 {
        self.injected_429.load(Ordering::Relaxed)
    }

    /// Watch responses cut by [`Faults::watch_close_after`] (those that had not ended by then).
    pub fn watches_cut(&self) -> u64 {
        self.watches_cut.load(Ordering::Relaxed)
    }

    /// Watches answered with an injected `410 Expired` event ([`Faults::rate_watch_gone`]).
    pub fn watches_gone(&self) -> u64 {
        self.watches_gone.load(Ordering::Relaxed)
    }

    /// Resets every count.
    pub fn reset(&self) {
        self.requests.reset();
        for n in [
            &self.forwarded,
            &self.injected_500,
            &self.injected_429,
            &self.watches_cut,
            &self.watches_gone,
        ] {
            n.store(0, Ordering::Relaxed);
        }
    }
}

/// A running proxy. It serves on the caller's tokio runtime and stops when dropped (its
/// accept loop and every open connection are aborted, so clients see their connections close).
pub struct FaultProxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept: JoinHandle<()>,
}

impl fmt::Debug for FaultProxy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FaultProxy")
            .field("addr", &self.addr)
            .field("faults", &*lock(&self.shared.faults))
            .field("counters", &self.shared.counters)
            .finish_non_exhaustive()
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// State the connections share with the [`FaultProxy`] handle.
struct Shared {
    upstream: kube::Client,
    faults: Mutex<Faults>,
    counters: Arc<Counters>,
}

impl FaultProxy {
    /// Listens on `127.0.0.1:0` and forwards to `upstream`, injecting `faults`.
    ///
    /// `upstream`'s own retry policy applies to forwarded requests: with kube's default client,
    /// a 429 from the real API server is retried inside the proxy before the caller sees it.
    pub async fn start(upstream: kube::Client, faults: Faults) -> Result<FaultProxy, ProxyError> {
        let listener = TcpListener::bind(("127.0.0.1", 0))
            .await
            .map_err(ProxyError::Bind)?;
        let addr = listener.local_addr().map_err(ProxyError::LocalAddr)?;
        let shared = Arc::new(Shared {
            upstream,
            faults: Mutex::new(faults),
            counters: Arc::new(Counters::default()),
        });
        let accept = tokio::spawn(accept_loop(listener, shared.clone()));
        Ok(FaultProxy {
            addr,
            shared,
            accept,
        })
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The address the proxy listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// A kube config for the proxy: plain HTTP, no credentials (the proxy authenticates
    /// upstream), namespace `default`, 5 s to connect and 30 s to send a request. No read
    /// timeout: watches are long responses (kube's watcher has its own idle timeout).
    pub fn config(&self) -> kube::Config {
        let url: http::Uri = self
            .url()
            .parse()
            .expect("http://127.0.0.1:PORT is a valid URI");
        let mut config = kube::Config::new(url);
        config.connect_timeout = Some(Duration::from_secs(5));
        config.write_timeout = Some(Duration::from_secs(30));
        config.read_timeout = None;
        config
    }

    /// Replaces the faults; applies to requests that arrive from now on (watches already
    /// streaming keep the cut time they got).
    pub fn set_faults(&self, faults: Faults) {
        *lock(&self.shared.faults) = faults;
    }

    /// What the proxy did so far.
    pub fn counters(&self) -> &Arc<Counters> {
        &self.shared.counters
    }
}

impl Shared {
    /// True with probability `rate`. Each `RandomState` is freshly keyed: random enough here.
    fn roll(&self, rate: f64) -> bool {
        let x = RandomState::new().hash_one(0u8) >> 11;
        rate > 0.0 && (x as f64 / (1u64 << 53) as f64) < rate
    }
}

/// Accepts connections until aborted. Connections live in a [`JoinSet`] owned by this task, so
/// aborting it (dropping the set) aborts them too.
async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let shared = shared.clone();
                    connections.spawn(async move {
                        let service = service_fn(move |req| handle(shared.clone(), req));
                        if let Err(e) = http1::Builder::new()
                            .timer(TokioTimer::new())
                            .serve_connection(TokioIo::new(stream), service)
                            .await
                        {
                            tracing::debug!("fault proxy connection ended: {e}");
                        }
                    });
                }
                Err(e) => {
                    // E.g. out of file descriptors: wait instead of spinning.
                    tracing::warn!("fault proxy cannot accept: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

/// What the proxy needs to know about a request's query.
#[derive(Debug, Default)]
struct Query<'a> {
    watch: bool,
    resource_version: Option<&'a str>,
    send_initial_events: bool,
}

fn parse_query(query: &str) -> Query<'_> {
    let mut q = Query::default();
    for pair in query.split('&') {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        match k {
            "watch" => q.watch = v == "true" || v == "1",
            "resourceVersion" => q.resource_version = Some(v),
            "sendInitialEvents" => q.send_initial_events = v == "true" || v == "1",
            _ => {}
        }
    }
    q
}

/// Headers that belong to one hop (RFC 9110 section 7.6.1) and must not be forwarded, plus
/// `host` and `content-length` (the next hop's client sets them), and `accept-encoding`: a
/// compressed upstream answer would pass through with its `content-encoding` intact, but kube
/// clients here are built without gzip support, so keep answers plain.
fn is_hop_header(name: &HeaderName) -> bool {
    [
        header::CONNECTION,
        header::TE,
        header::TRAILER,
        header::TRANSFER_ENCODING,
        header::UPGRADE,
        header::PROXY_AUTHORIZATION,
        header::PROXY_AUTHENTICATE,
        header::HOST,
        header::CONTENT_LENGTH,
        header::ACCEPT_ENCODING,
    ]
    .contains(name)
        || name.as_str() == "keep-alive"
        || name.as_str() == "proxy-connection"
}

fn copy_headers(from: &HeaderMap, to: &mut HeaderMap) {
    for (name, value) in from {
        if !is_hop_header(name) {
            to.append(name.clone(), value.clone());
        }
    }
}

/// A Kubernetes `Status` failure body, with the fields in the order the API server writes them.
fn status_json(code: u16, reason: &str, message: &str, retry_after: Option<u64>) -> String {
    let message = serde_json::to_string(message).expect("a string serializes");
    let details = retry_after
        .map(|secs| format!(r#","details":{{"retryAfterSeconds":{secs}}}"#))
        .unwrap_or_default();
    format!(
        r#"{{"kind":"Status","apiVersion":"v1","metadata":{{}},"status":"Failure","message":{message},"reason":"{reason}"{details},"code":{code}}}"#
    )
}

fn json_response(status: StatusCode, body: impl Into<Vec<u8>>) -> Response<ProxyBody> {
    let mut res = Response::new(ProxyBody::full(body.into()));
    *res.status_mut() = status;
    res.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    res
}

/// The watch event kube-apiserver sends for a resourceVersion older than its watch cache holds
/// (the requested one, then the oldest it could serve from).
///
/// The watch cache fails such a watch with
/// `errors.NewResourceExpired(fmt.Sprintf("too old resource version: %d (%d)", resourceVersion,
/// oldest-1))` (kubernetes/kubernetes, `staging/src/k8s.io/apiserver/pkg/storage/cacher/
/// watch_cache.go`, `getAllEventsSinceLocked`), and the cacher turns that error into a watcher
/// with a single `ERROR` event carrying the Status (`newErrWatcher` in `cacher.go`), so the
/// client gets HTTP 200 and that one event. Observed on kube-apiserver 1.36.2 (restarted, then
/// watched with `resourceVersion=1`):
///
/// ```text
/// HTTP/1.1 200 OK
/// Content-Type: application/json
/// Transfer-Encoding: chunked
///
/// {"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"too old resource version: 1 (222)","reason":"Expired","code":410}}
/// ```
fn gone_event(resource_version: &str) -> String {
    let oldest = resource_version
        .parse::<u64>()
        .map(|rv| rv.saturating_add(1).to_string())
        .unwrap_or_else(|_| "0".into());
    let status = status_json(
        410,
        "Expired",
        &format!("too old resource version: {resource_version} ({oldest})"),
        None,
    );
    format!("{{\"type\":\"ERROR\",\"object\":{status}}}\n")
}

/// Serves one request: a fault, or the upstream answer.
async fn handle(
    shared: Arc<Shared>,
    req: Request<Incoming>,
) -> Result<Response<ProxyBody>, Infallible> {
    let arrived = Instant::now();
    let method = req.method().clone();
    let path_and_query = req
        .uri()
        .path_and_query()
        .map(|pq| pq.as_str().to_owned())
        .unwrap_or_else(|| "/".into());
    let path = req.uri().path().to_owned();
    let query = req.uri().query().unwrap_or("").to_owned();
    let q = parse_query(&query);
    let is_watch = method == http::Method::GET && q.watch;
    let counters = &shared.counters;
    if let Some((verb, resource)) = classify(method.as_str(), &path, &query) {
        counters.record(verb, &resource);
    }
    let what = |code: u16, note: &str| format!("{code} {method} {path_and_query}{note}");
    let faults = lock(&shared.faults).clone();

    if !is_watch {
        let injected = if shared.roll(faults.rate_500) {
            counters.injected_500.fetch_add(1, Ordering::Relaxed);
            Some((
                StatusCode::INTERNAL_SERVER_ERROR,
                "InternalError",
                "Internal error occurred: injected by the fault proxy",
                None,
            ))
        } else if shared.roll(faults.rate_429) {
            counters.injected_429.fetch_add(1, Ordering::Relaxed);
            Some((
                StatusCode::TOO_MANY_REQUESTS,
                "TooManyRequests",
                "Too many requests, please try again later.",
                Some(faults.retry_after_secs),
            ))
        } else {
            None
        };
        if let Some((status, reason, message, retry_after)) = injected {
            let code = status.as_u16();
            counters.record_answer(code, || what(code, " (injected)"));
            let mut res = json_response(status, status_json(code, reason, message, retry_after));
            if let Some(secs) = retry_after {
                res.headers_mut().insert(header::RETRY_AFTER, secs.into());
            }
            return Ok(res);
        }
    } else if let Some(rv) = q.resource_version
        // Only a watch that resumes can be too old: "" and "0" start from the current state,
        // and a streaming list (sendInitialEvents) is served from the cache's current state.
        && !rv.is_empty()
        && rv != "0"
        && !q.send_initial_events
        && shared.roll(faults.rate_watch_gone)
    {
        counters.watches_gone.fetch_add(1, Ordering::Relaxed);
        counters.record_answer(200, String::new);
        return Ok(json_response(StatusCode::OK, gone_event(rv)));
    }

    // Forward. The request body is small (an object), so it is read whole: that also lets
    // kube's retry layer in `upstream` replay it.
    let (parts, body) = req.into_parts();
    let body = match body.collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => {
            // The client went away or sent a broken body: nothing useful to answer.
            let msg = format!("cannot read the request body: {e}");
            counters.record_answer(400, || what(400, &format!(": {msg}")));
            return Ok(json_response(
                StatusCode::BAD_REQUEST,
                status_json(400, "BadRequest", &msg, None),
            ));
        }
    };
    let mut builder = Request::builder()
        .method(parts.method.clone())
        .uri(path_and_query.as_str());
    if let Some(headers) = builder.headers_mut() {
        copy_headers(&parts.headers, headers);
    }
    let upstream_req = builder
        .body(kube::client::Body::from(body))
        .expect("parts of a valid request make a valid request");

    // A watch's deadline counts from its arrival: the API server sends a watch's response
    // head only with its first event, so the cut may come before any upstream answer.
    let deadline = if is_watch {
        faults.watch_close_after.map(|d| arrived + d)
    } else {
        None
    };
    counters.forwarded.fetch_add(1, Ordering::Relaxed);
    let sent = shared.upstream.send(upstream_req);
    let answer = match deadline {
        Some(deadline) => match tokio::time::timeout_at(deadline, sent).await {
            Ok(answer) => answer,
            Err(_elapsed) => {
                // Cut before the head arrived: an empty, complete watch body.
                counters.watches_cut.fetch_add(1, Ordering::Relaxed);
                counters.record_answer(200, String::new);
                return Ok(json_response(StatusCode::OK, Vec::new()));
            }
        },
        None => sent.await,
    };
    let upstream_res = match answer {
        Ok(res) => res,
        Err(e) => {
            let msg = format!("the fault proxy cannot reach the API server: {e}");
            counters.record_answer(502, || what(502, &format!(": {msg}")));
            return Ok(json_response(
                StatusCode::BAD_GATEWAY,
                status_json(502, "ServiceUnavailable", &msg, None),
            ));
        }
    };
    let (parts, body) = upstream_res.into_parts();
    counters.record_answer(parts.status.as_u16(), || what(parts.status.as_u16(), ""));
    let mut res = Response::new(ProxyBody::Upstream {
        body,
        cut: deadline.map(|d| Box::pin(tokio::time::sleep_until(d))),
        counters: counters.clone(),
    });
    *res.status_mut() = parts.status;
    copy_headers(&parts.headers, res.headers_mut());
    Ok(res)
}

/// A response body: the proxy's own (small, whole) or the API server's, streamed frame by
/// frame and optionally cut at a deadline.
enum ProxyBody {
    Full(Option<Bytes>),
    Upstream {
        body: kube::client::Body,
        /// When to end the body early (watches with [`Faults::watch_close_after`]).
        cut: Option<Pin<Box<Sleep>>>,
        counters: Arc<Counters>,
    },
}

impl ProxyBody {
    fn full(bytes: Vec<u8>) -> Self {
        ProxyBody::Full((!bytes.is_empty()).then(|| Bytes::from(bytes)))
    }
}

impl Body for ProxyBody {
    type Data = Bytes;
    type Error = kube::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, kube::Error>>> {
        match self.get_mut() {
            ProxyBody::Full(bytes) => Poll::Ready(bytes.take().map(|b| Ok(Frame::data(b)))),
            ProxyBody::Upstream {
                body,
                cut,
                counters,
            } => {
                if let Some(sleep) = cut
                    && sleep.as_mut().poll(cx).is_ready()
                {
                    *cut = None;
                    counters.watches_cut.fetch_add(1, Ordering::Relaxed);
                    // Dropping the upstream body closes the upstream connection too.
                    *body = kube::client::Body::empty();
                    return Poll::Ready(None);
                }
                Pin::new(body).poll_frame(cx)
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            ProxyBody::Full(bytes) => bytes.is_none(),
            ProxyBody::Upstream { body, .. } => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            ProxyBody::Full(Some(b)) => SizeHint::with_exact(b.len() as u64),
            ProxyBody::Full(None) => SizeHint::with_exact(0),
            // A body that may be cut has no exact size: let hyper use chunked encoding.
            ProxyBody::Upstream { cut: Some(_), .. } => SizeHint::default(),
            ProxyBody::Upstream { body, .. } => body.size_hint(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watch_queries_are_recognised() {
        let q = parse_query("watch=1&resourceVersion=42&allowWatchBookmarks=true");
        assert!(q.watch);
        assert_eq!(q.resource_version, Some("42"));
        assert!(!q.send_initial_events);
        let q = parse_query("watch=false&sendInitialEvents=true");
        assert!(!q.watch);
        assert!(q.send_initial_events);
        assert!(!parse_query("").watch);
    }

    #[test]
    fn the_gone_event_is_what_the_api_server_sends() {
        assert_eq!(
            gone_event("1"),
            concat!(
                r#"{"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","metadata":{},"#,
                r#""status":"Failure","message":"too old resource version: 1 (2)","#,
                r#""reason":"Expired","code":410}}"#,
                "\n"
            )
        );
    }
}
