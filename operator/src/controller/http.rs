//! The health and metrics endpoints: `/healthz` (the process serves), `/readyz` (every watch
//! cache has synced) and `/metrics`.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

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
}

fn respond(health: &Health, req: &Request<Incoming>) -> Response<Full<Bytes>> {
    let (status, body, content_type) = match req.uri().path() {
        "/healthz" => (StatusCode::OK, "ok".to_owned(), "text/plain"),
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
