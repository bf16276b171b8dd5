//! The health and metrics endpoints: `/healthz` (the process serves and its reconcile loop is
//! not wedged), `/readyz` (every watch cache has synced) and `/metrics`.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

use super::metrics::Metrics;

/// What the endpoints report.
#[derive(Debug, Clone)]
pub struct Health {
    pub ready: Arc<AtomicBool>,
    pub metrics: Arc<Metrics>,
    pub progress: Arc<LoopProgress>,
    /// How long work may wait for a finished pass before /healthz fails; zero: never.
    pub stall_bound: Duration,
}

/// The reconcile loop's progress, as /healthz judges it: since when work has waited (a wake-up
/// or a pass begun) that no finished pass has dealt with.
#[derive(Debug, Default)]
pub struct LoopProgress(Mutex<Option<Instant>>);

impl LoopProgress {
    /// Work arrived at `now` (the loop woke up to make a pass); the earliest unfinished one counts.
    pub fn work_arrived(&self, now: Instant) {
        if let Ok(mut since) = self.0.lock() {
            since.get_or_insert(now);
        }
    }

    /// A pass finished: everything that arrived before it started is dealt with.
    pub fn pass_finished(&self) {
        if let Ok(mut since) = self.0.lock() {
            *since = None;
        }
    }

    fn waiting_since(&self) -> Option<Instant> {
        self.0.lock().ok().and_then(|since| *since)
    }
}

/// Whether the loop is alive: `Err` with the reason once work has waited longer than `bound`
/// without a pass finishing (a wedged pass, or a loop that no longer runs). Idle is alive. Pure.
pub fn liveness(
    waiting_since: Option<Instant>,
    now: Instant,
    bound: Duration,
) -> Result<(), String> {
    match waiting_since {
        Some(since) if !bound.is_zero() && now.saturating_duration_since(since) > bound => {
            Err(format!(
                "the reconcile loop has not finished a pass for {}s while work waits (bound: \
                 --healthz-stall-seconds={})",
                now.saturating_duration_since(since).as_secs(),
                bound.as_secs()
            ))
        }
        _ => Ok(()),
    }
}

fn respond(health: &Health, req: &Request<Incoming>) -> Response<Full<Bytes>> {
    let live = || {
        liveness(
            health.progress.waiting_since(),
            Instant::now(),
            health.stall_bound,
        )
    };
    let (status, body, content_type) = match req.uri().path() {
        "/healthz" => match live() {
            Ok(()) => (StatusCode::OK, "ok".to_owned(), "text/plain"),
            Err(reason) => (StatusCode::SERVICE_UNAVAILABLE, reason, "text/plain"),
        },
        "/readyz" if health.ready.load(Ordering::Relaxed) => {
            (StatusCode::OK, "ok".to_owned(), "text/plain")
        }
        "/readyz" => (
            StatusCode::SERVICE_UNAVAILABLE,
            "watch caches not synced".to_owned(),
            "text/plain",
        ),
        "/metrics" => (
            StatusCode::OK,
            health.metrics.encode(),
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        ),
        _ => (StatusCode::NOT_FOUND, "not found".to_owned(), "text/plain"),
    };
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    if let Ok(value) = content_type.parse() {
        response
            .headers_mut()
            .insert(hyper::header::CONTENT_TYPE, value);
    }
    response
}

/// Serve on `addr` until the task is dropped. Returns the bound address (port 0 picks one).
pub async fn serve(
    addr: SocketAddr,
    health: Health,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    let task = tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let health = health.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req| {
                    let response = respond(&health, &req);
                    async move { Ok::<_, Infallible>(response) }
                });
                let conn = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service);
                if let Err(error) = conn.await {
                    tracing::debug!(%error, "health connection ended");
                }
            });
        }
    });
    Ok((bound, task))
}

#[cfg(test)]
mod tests {
    use super::*;

    const BOUND: Duration = Duration::from_secs(300);

    #[test]
    fn an_idle_loop_is_alive_however_long_it_idles() {
        let t0 = Instant::now();
        assert_eq!(
            liveness(None, t0 + Duration::from_secs(86_400), BOUND),
            Ok(())
        );
    }

    #[test]
    fn work_waiting_up_to_the_bound_is_alive_and_beyond_it_is_not() {
        let t0 = Instant::now();
        assert_eq!(
            liveness(Some(t0), t0 + Duration::from_secs(300), BOUND),
            Ok(())
        );
        assert_eq!(
            liveness(Some(t0), t0 + Duration::from_secs(301), BOUND),
            Err(
                "the reconcile loop has not finished a pass for 301s while work waits \
                 (bound: --healthz-stall-seconds=300)"
                    .to_owned()
            )
        );
        assert_eq!(
            liveness(Some(t0), t0 + Duration::from_secs(10_000), Duration::ZERO),
            Ok(()),
            "a zero bound never fails"
        );
    }

    #[test]
    fn the_oldest_waiting_work_counts_until_a_pass_finishes() {
        let t0 = Instant::now();
        let progress = LoopProgress::default();
        progress.work_arrived(t0);
        progress.work_arrived(t0 + Duration::from_secs(200));
        let at = t0 + Duration::from_secs(301);
        assert!(liveness(progress.waiting_since(), at, BOUND).is_err());
        progress.pass_finished();
        assert_eq!(liveness(progress.waiting_since(), at, BOUND), Ok(()));
        progress.work_arrived(at);
        assert_eq!(
            liveness(
                progress.waiting_since(),
                at + Duration::from_secs(300),
                BOUND
            ),
            Ok(())
        );
    }
}
