//! The HTTP front of the stand-in: routing of Kubernetes REST paths, discovery, watch streams,
//! fault injection and request counters, served with hyper over plain HTTP/1.1.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::mpsc;

use crate::core::{
    Core, DeleteOptions, FieldValidation, ListOptions, WriteOptions, Written, meta_str,
};
use crate::faults::{Counters, FaultState, Injected};
use crate::patch::PatchType;
use crate::resources::ResourceType;
use crate::selectors::{FieldSelector, LabelSelector};
use crate::status::ApiError;
use crate::store::EventType;

type Body = BoxBody<Bytes, Infallible>;

/// Settings of the HTTP front.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Interval of BOOKMARK events on watches that allow them (the API server: about a minute).
    pub bookmark_interval: Duration,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            bookmark_interval: Duration::from_secs(1),
        }
    }
}

/// Shared state of the server.
#[derive(Debug)]
pub struct Server {
    /// The API core.
    pub core: Arc<Core>,
    /// Injected faults.
    pub faults: FaultState,
    /// Request counters.
    pub counters: Counters,
    /// Settings.
    pub config: ServerConfig,
}

/// Errors starting the server.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// Binding the port failed.
    #[error("binding 127.0.0.1: {0}")]
    Bind(#[from] std::io::Error),
}

impl Server {
    /// Binds 127.0.0.1 on a free port and serves in the background.
    pub async fn serve(
        self: &Arc<Self>,
    ) -> Result<(SocketAddr, tokio::task::JoinHandle<()>), ServeError> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let me = self.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let me = me.clone();
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |req| {
                        let me = me.clone();
                        async move { Ok::<_, Infallible>(me.handle(req).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        Ok((addr, task))
    }

    async fn handle(self: Arc<Self>, req: Request<Incoming>) -> Response<Body> {
        let latency = self.faults.get().latency;
        if !latency.is_zero() {
            tokio::time::sleep(latency).await;
        }
        let method = req.method().clone();
        let path = req.uri().path().to_string();
        match self.route(req).await {
            Ok(r) => {
                self.counters
                    .record_answer(r.status().as_u16(), String::new);
                r
            }
            Err(e) => {
                self.counters.record_answer(e.code, || {
                    format!("{} {method} {path}: {}", e.code, e.message)
                });
                error_response(&e)
            }
        }
    }

    async fn route(self: &Arc<Self>, req: Request<Incoming>) -> Result<Response<Body>, ApiError> {
        let path = req.uri().path().to_string();
        let query = parse_query(req.uri().query().unwrap_or(""));
        let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
        let method = req.method().clone();
        match segs.as_slice() {
            ["version"] => return Ok(json_response(StatusCode::OK, &version())),
            ["api"] => {
                return Ok(json_response(
                    StatusCode::OK,
                    &json!({"kind": "APIVersions", "versions": ["v1"],
                        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}]}),
                ));
            }
            ["apis"] => return Ok(json_response(StatusCode::OK, &self.group_list())),
            ["api", "v1"] => {
                return Ok(json_response(StatusCode::OK, &self.resource_list("", "v1")));
            }
            ["apis", g] => {
                let groups = self.group_list();
                let found = groups["groups"]
                    .as_array()
                    .and_then(|a| a.iter().find(|x| x["name"] == json!(g)).cloned());
                return match found {
                    Some(mut gr) => {
                        gr["kind"] = json!("APIGroup");
                        gr["apiVersion"] = json!("v1");
                        Ok(json_response(StatusCode::OK, &gr))
                    }
                    None => Err(ApiError::no_route(&path)),
                };
            }
            ["apis", g, v] => {
                if self
                    .core
                    .registry
                    .group_versions()
                    .contains(&(g.to_string(), v.to_string()))
                {
                    return Ok(json_response(StatusCode::OK, &self.resource_list(g, v)));
                }
                return Err(ApiError::no_route(&path));
            }
            _ => {}
        }
        let (group, version, rest) = match segs.as_slice() {
            ["api", "v1", rest @ ..] => ("", "v1", rest),
            ["apis", g, v, rest @ ..] => (*g, *v, rest),
            _ => return Err(ApiError::no_route(&path)),
        };
        let is_ns_plural = |p: &str| {
            self.core
                .registry
                .by_path(group, version, p)
                .is_some_and(|t| t.namespaced)
        };
        let (ns, plural, name, sub) = match rest {
            ["namespaces", ns, plural, tail @ ..] if is_ns_plural(plural) => (
                Some(ns.to_string()),
                *plural,
                tail.first().copied(),
                tail.get(1).copied(),
            ),
            [plural, tail @ ..] => (None, *plural, tail.first().copied(), tail.get(1).copied()),
            [] => return Err(ApiError::no_route(&path)),
        };
        let rt = self
            .core
            .registry
            .by_path(group, version, plural)
            .cloned()
            .ok_or_else(|| ApiError::no_route(&path))?;
        if !rt.namespaced && ns.is_some() {
            return Err(ApiError::no_route(&path));
        }
        if sub == Some("status") && !rt.status {
            return Err(ApiError::no_route(&path));
        }
        let resource_name = {
            let base = rt.gr().qualified();
            match sub {
                Some(s) => format!("{base}/{s}"),
                None => base,
            }
        };
        let verb = match (&method, name, sub) {
            (&Method::GET, None, _)
                if query.get("watch").is_some_and(|w| w == "true" || w == "1") =>
            {
                "watch"
            }
            (&Method::GET, None, _) => "list",
            (&Method::GET, Some(_), _) => "get",
            (&Method::POST, None, _) => "create",
            (&Method::POST, Some(_), Some(_)) => "create",
            (&Method::PUT, Some(_), _) => "update",
            (&Method::PATCH, Some(_), _) => "patch",
            (&Method::DELETE, Some(_), None) => "delete",
            (&Method::DELETE, None, _) => "deletecollection",
            _ => return Err(ApiError::method_not_allowed()),
        };
        self.counters.record(verb, &resource_name);
        {
            let is_write = !matches!(verb, "get" | "list" | "watch");
            if let Some(f) = self.faults.inject(&rt.plural, is_write) {
                let retry = self.faults.get().retry_after_secs;
                let mut e = match f {
                    Injected::InternalError => ApiError::new(
                        500,
                        "InternalError",
                        "Internal error occurred: injected fault",
                    ),
                    Injected::TooManyRequests => ApiError::new(
                        429,
                        "TooManyRequests",
                        "The request has been rejected: too many requests (injected fault)",
                    ),
                    Injected::Conflict => ApiError::conflict_msg(
                        rt.gr(),
                        name.unwrap_or(""),
                        "the object has been modified; please apply your changes to the latest version and try again",
                    ),
                };
                if f != Injected::Conflict {
                    e.retry_after = Some(retry);
                }
                return Err(e);
            }
        }
        let ns_str = ns.clone().unwrap_or_default();
        if rt.namespaced && ns.is_none() && !matches!(verb, "list" | "watch") {
            return Err(ApiError::no_route(&path));
        }
        let user_agent = req
            .headers()
            .get(http::header::USER_AGENT)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        // kube's metadata API (`Api<PartialObjectMeta<K>>`, `list_metadata`) asks for
        // meta.k8s.io/v1 PartialObjectMetadata through the Accept header.
        let meta_only = req
            .headers()
            .get(http::header::ACCEPT)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|a| a.contains("as=PartialObjectMetadata"));
        let content_type = req
            .headers()
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("application/json")
            .to_string();
        let write_opts = WriteOptions {
            field_manager: query.get("fieldManager").cloned(),
            force: query.get("force").is_some_and(|f| f == "true"),
            dry_run: query.get("dryRun").is_some_and(|d| d == "All"),
            field_validation: match query.get("fieldValidation").map(String::as_str) {
                Some("Strict") => FieldValidation::Strict,
                Some("Ignore") => FieldValidation::Ignore,
                _ => FieldValidation::Warn,
            },
            user_agent,
        };
        let list_opts = ListOptions {
            label_selector: query.get("labelSelector").cloned(),
            field_selector: query.get("fieldSelector").cloned(),
            limit: query.get("limit").and_then(|l| l.parse().ok()),
            continue_token: query.get("continue").cloned(),
            resource_version: query.get("resourceVersion").cloned(),
            resource_version_match: query.get("resourceVersionMatch").cloned(),
        };
        let body = read_body(req).await?;
        let core = &self.core;
        match verb {
            "watch" => self.watch(rt, ns, &query, meta_only).await,
            "list" => {
                let mut list = core.list(&rt, ns.as_deref(), &list_opts)?;
                if meta_only {
                    list["apiVersion"] = json!("meta.k8s.io/v1");
                    list["kind"] = json!("PartialObjectMetadataList");
                    if let Some(items) = list["items"].as_array_mut() {
                        for i in items {
                            *i = partial(i);
                        }
                    }
                }
                Ok(json_response(StatusCode::OK, &list))
            }
            "get" => {
                let name = name.expect("named");
                match sub {
                    None | Some("status") => {
                        let obj = core.get(&rt, &ns_str, name)?;
                        Ok(json_response(
                            StatusCode::OK,
                            &if meta_only { partial(&obj) } else { obj },
                        ))
                    }
                    _ => Err(ApiError::no_route(&path)),
                }
            }
            "create" => {
                let obj = parse_json(&body)?;
                match (name, sub) {
                    (None, _) => written(core.create(&rt, &ns_str, obj, &write_opts)?),
                    (Some(n), Some("eviction")) if rt.kind == "Pod" && rt.group.is_empty() => {
                        let r = crate::controllers::eviction::evict(core, &ns_str, n, &obj)?;
                        Ok(json_response(StatusCode::CREATED, &r))
                    }
                    (Some(n), Some("binding")) if rt.kind == "Pod" && rt.group.is_empty() => {
                        let node = obj
                            .pointer("/target/name")
                            .and_then(Value::as_str)
                            .unwrap_or("");
                        crate::controllers::scheduler::bind(core, &ns_str, n, node)?;
                        Ok(json_response(
                            StatusCode::CREATED,
                            &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}),
                        ))
                    }
                    _ => Err(ApiError::no_route(&path)),
                }
            }
            "update" => {
                let obj = parse_json(&body)?;
                let name = name.expect("named");
                match sub {
                    None | Some("status") => {
                        written(core.update(&rt, &ns_str, name, obj, sub, &write_opts)?)
                    }
                    Some("finalize") if rt.kind == "Namespace" && rt.group.is_empty() => {
                        written(crate::controllers::namespace::finalize(core, name, &obj)?)
                    }
                    _ => Err(ApiError::no_route(&path)),
                }
            }
            "patch" => {
                let name = name.expect("named");
                if !matches!(sub, None | Some("status")) {
                    return Err(ApiError::no_route(&path));
                }
                let pt = PatchType::from_content_type(&content_type).ok_or_else(|| {
                    ApiError::new(415, "UnsupportedMediaType", format!("the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml ({content_type})"))
                })?;
                let patch = if pt == PatchType::Apply {
                    parse_yaml(&body)?
                } else {
                    parse_json(&body)?
                };
                written(core.patch(&rt, &ns_str, name, pt, &patch, sub, &write_opts)?)
            }
            "delete" => {
                let opts = delete_options(&body, &query)?;
                let obj = core.delete(&rt, &ns_str, name.expect("named"), &opts)?;
                Ok(json_response(StatusCode::OK, &obj))
            }
            "deletecollection" => {
                let opts = delete_options(&body, &query)?;
                Ok(json_response(
                    StatusCode::OK,
                    &core.delete_collection(&rt, ns.as_deref(), &list_opts, &opts)?,
                ))
            }
            _ => Err(ApiError::method_not_allowed()),
        }
    }

    fn group_list(&self) -> Value {
        let mut groups: Vec<Value> = Vec::new();
        for (g, v) in self.core.registry.group_versions() {
            if g.is_empty() {
                continue;
            }
            let gv = json!({"groupVersion": format!("{g}/{v}"), "version": v});
            match groups.iter_mut().find(|x| x["name"] == json!(g)) {
                Some(x) => x["versions"].as_array_mut().expect("array").push(gv),
                None => groups
                    .push(json!({"name": g, "versions": [gv.clone()], "preferredVersion": gv})),
            }
        }
        json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
    }

    fn resource_list(&self, group: &str, version: &str) -> Value {
        let mut resources = Vec::new();
        for t in self
            .core
            .registry
            .types
            .iter()
            .filter(|t| t.group == group && t.version == version)
        {
            resources.push(
                json!({"name": t.plural, "singularName": t.singular, "namespaced": t.namespaced,
                "kind": t.kind, "verbs": t.verbs(), "shortNames": t.short_names}),
            );
            if t.status {
                resources.push(json!({"name": format!("{}/status", t.plural), "singularName": "",
                    "namespaced": t.namespaced, "kind": t.kind, "verbs": ["get", "patch", "update"]}));
            }
            if t.kind == "Pod" && group.is_empty() {
                resources.push(
                    json!({"name": "pods/eviction", "singularName": "", "namespaced": true,
                    "group": "policy", "version": "v1", "kind": "Eviction", "verbs": ["create"]}),
                );
                resources.push(
                    json!({"name": "pods/binding", "singularName": "", "namespaced": true,
                    "kind": "Binding", "verbs": ["create"]}),
                );
            }
            if t.kind == "Namespace" && group.is_empty() {
                resources.push(
                    json!({"name": "namespaces/finalize", "singularName": "", "namespaced": false,
                    "kind": "Namespace", "verbs": ["update"]}),
                );
            }
        }
        let gv = if group.is_empty() {
            version.to_string()
        } else {
            format!("{group}/{version}")
        };
        json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources})
    }

    async fn watch(
        self: &Arc<Self>,
        rt: ResourceType,
        ns: Option<String>,
        query: &HashMap<String, String>,
        meta_only: bool,
    ) -> Result<Response<Body>, ApiError> {
        let labels =
            LabelSelector::parse(query.get("labelSelector").map(String::as_str).unwrap_or(""))?;
        let fields = FieldSelector::parse(
            query.get("fieldSelector").map(String::as_str).unwrap_or(""),
            &rt.kind,
        )?;
        let bookmarks = query
            .get("allowWatchBookmarks")
            .is_some_and(|b| b == "true");
        let initial = query.get("sendInitialEvents").is_some_and(|b| b == "true");
        let timeout = query
            .get("timeoutSeconds")
            .and_then(|t| t.parse::<u64>().ok())
            .map(Duration::from_secs);
        let rv_param = query.get("resourceVersion").cloned().unwrap_or_default();
        let faults = self.faults.get();
        let gone_fault =
            !rv_param.is_empty() && rv_param != "0" && self.faults.watch_gone(&rt.plural);
        let (tx, rx) = mpsc::channel::<Bytes>(256);
        let core = self.core.clone();
        let bookmark_interval = self.config.bookmark_interval;
        let ns = if rt.namespaced { ns } else { None };
        let mut rv_rx = core.subscribe();
        tokio::spawn(async move {
            let send = |mut v: Value| {
                if meta_only && v["type"] != "ERROR" {
                    v["object"] = partial(&v["object"]);
                }
                let mut line = serde_json::to_vec(&v).unwrap_or_default();
                line.push(b'\n');
                tx.send(Bytes::from(line))
            };
            let matches = |o: &Value| {
                ns.as_deref().is_none_or(|n| meta_str(o, "namespace") == n)
                    && labels.matches_object(o)
                    && fields.matches(o)
            };
            let gone = |rv: &str, compacted: u64| {
                json!({"type": "ERROR", "object": ApiError::new(410, "Expired",
                    format!("too old resource version: {rv} ({compacted})")).to_status()})
            };
            let bookmark = |rv: u64, end: bool| {
                let mut meta = json!({"resourceVersion": rv.to_string()});
                if end {
                    meta["annotations"] = json!({"k8s.io/initial-events-end": "true"});
                }
                json!({"type": "BOOKMARK", "object": {"kind": rt.kind, "apiVersion": rt.api_version(), "metadata": meta}})
            };
            // Starting point.
            enum Start {
                Stop(Value),
                Initial(Vec<Value>, u64),
                From(u64),
            }
            let start = {
                let st = core.lock();
                if gone_fault {
                    Start::Stop(gone(&rv_param, st.compacted()))
                } else if initial || rv_param.is_empty() || rv_param == "0" {
                    Start::Initial(
                        st.objects
                            .iter()
                            .filter(|(k, o)| k.0 == rt.key() && matches(o))
                            .map(|(_, o)| o.clone())
                            .collect(),
                        st.rv,
                    )
                } else {
                    match rv_param.parse::<u64>() {
                        Err(_) => Start::Stop(json!({"type": "ERROR", "object":
                            ApiError::bad_request(format!("invalid resource version: {rv_param}")).to_status()})),
                        Ok(rv) if rv < st.compacted() => {
                            Start::Stop(gone(&rv_param, st.compacted()))
                        }
                        Ok(rv) => Start::From(rv),
                    }
                }
            };
            let mut cur: u64 = match start {
                Start::Stop(msg) => {
                    let _ = send(msg).await;
                    return;
                }
                Start::From(rv) => rv,
                Start::Initial(objs, rv) => {
                    for o in objs {
                        if send(json!({"type": "ADDED", "object": o})).await.is_err() {
                            return;
                        }
                    }
                    if initial && bookmarks && send(bookmark(rv, true)).await.is_err() {
                        return;
                    }
                    rv
                }
            };
            let started = tokio::time::Instant::now();
            let deadline = [timeout, faults.watch_close_after]
                .into_iter()
                .flatten()
                .min()
                .map(|d| started + d);
            let mut next_bookmark = tokio::time::Instant::now() + bookmark_interval;
            loop {
                let batch: Result<Vec<Value>, Value> = {
                    let st = core.lock();
                    match st.events_since(cur) {
                        None => Err(gone(&cur.to_string(), st.compacted())),
                        Some(events) => {
                            let mut out = Vec::new();
                            for e in events {
                                if e.key.0 != rt.key() {
                                    continue;
                                }
                                let now_match = e.kind != EventType::Deleted && matches(&e.object);
                                let was_match = e.prev.as_ref().is_some_and(&matches);
                                let ty = match (e.kind, was_match, now_match) {
                                    (EventType::Deleted, true, _) => "DELETED",
                                    (EventType::Added, _, true) => "ADDED",
                                    (EventType::Modified, true, true) => "MODIFIED",
                                    (EventType::Modified, false, true) => "ADDED",
                                    (EventType::Modified, true, false) => "DELETED",
                                    _ => continue,
                                };
                                out.push(json!({"type": ty, "object": e.object}));
                            }
                            cur = st.rv;
                            Ok(out)
                        }
                    }
                };
                match batch {
                    Err(msg) => {
                        let _ = send(msg).await;
                        return;
                    }
                    Ok(events) => {
                        for ev in events {
                            if send(ev).await.is_err() {
                                return;
                            }
                        }
                    }
                }
                let sleep_until = match deadline {
                    Some(d) => d.min(next_bookmark),
                    None => next_bookmark,
                };
                tokio::select! {
                    r = rv_rx.changed() => { if r.is_err() { return; } }
                    _ = tokio::time::sleep_until(sleep_until) => {}
                    _ = tx.closed() => { return; }
                }
                let now = tokio::time::Instant::now();
                if deadline.is_some_and(|d| now >= d) {
                    return;
                }
                if now >= next_bookmark {
                    next_bookmark = now + bookmark_interval;
                    if bookmarks {
                        // Bookmarks carry the revision the watch has caught up to.
                        if send(bookmark(cur, false)).await.is_err() {
                            return;
                        }
                    }
                }
            }
        });
        let stream = futures::stream::unfold(rx, |mut rx| async move {
            rx.recv()
                .await
                .map(|b| (Ok::<_, Infallible>(Frame::data(b)), rx))
        });
        let body = StreamBody::new(stream).boxed();
        Ok(Response::builder()
            .status(StatusCode::OK)
            .header(http::header::CONTENT_TYPE, "application/json")
            .header("Transfer-Encoding", "chunked")
            .body(body)
            .expect("response"))
    }
}

/// An object as meta.k8s.io/v1 PartialObjectMetadata.
fn partial(obj: &Value) -> Value {
    json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
        "metadata": obj.get("metadata").cloned().unwrap_or(json!({}))})
}

fn version() -> Value {
    json!({"major": "1", "minor": "36", "emulationMajor": "1", "emulationMinor": "36",
        "gitVersion": "v1.36.2-teamgpu-e2e", "gitCommit": "", "gitTreeState": "clean",
        "buildDate": "2026-01-01T00:00:00Z", "goVersion": "go1.25", "compiler": "gc", "platform": "linux/amd64"})
}

fn written(w: Written) -> Result<Response<Body>, ApiError> {
    let code = if w.created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    let mut r = json_response(code, &w.object);
    for warning in w.warnings {
        let v = format!("299 - \"{}\"", warning.replace('"', "\\\""));
        if let Ok(h) = http::HeaderValue::from_str(&v) {
            r.headers_mut().append("Warning", h);
        }
    }
    Ok(r)
}

fn delete_options(
    body: &Bytes,
    query: &HashMap<String, String>,
) -> Result<DeleteOptions, ApiError> {
    let v = if body.is_empty() {
        json!({})
    } else {
        parse_json(body)?
    };
    let mut opts = DeleteOptions::from_body(&v);
    if let Some(g) = query.get("gracePeriodSeconds").and_then(|g| g.parse().ok()) {
        opts.grace_period = Some(g);
    }
    if let Some(p) = query.get("propagationPolicy") {
        opts.propagation = Some(p.clone());
    }
    if query.get("dryRun").is_some_and(|d| d == "All") {
        opts.dry_run = true;
    }
    Ok(opts)
}

async fn read_body(req: Request<Incoming>) -> Result<Bytes, ApiError> {
    req.into_body()
        .collect()
        .await
        .map(|c| c.to_bytes())
        .map_err(|e| ApiError::bad_request(format!("reading the body: {e}")))
}

fn parse_json(body: &Bytes) -> Result<Value, ApiError> {
    serde_json::from_slice(body).map_err(|e| {
        ApiError::bad_request(format!("the body of the request is not valid JSON: {e}"))
    })
}

fn parse_yaml(body: &Bytes) -> Result<Value, ApiError> {
    if let Ok(v) = serde_json::from_slice::<Value>(body) {
        return Ok(v);
    }
    let text = std::str::from_utf8(body).map_err(|e| ApiError::bad_request(e.to_string()))?;
    serde_saphyr::from_str::<Value>(text)
        .map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")))
}

fn json_response(code: StatusCode, v: &Value) -> Response<Body> {
    Response::builder()
        .status(code)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(serde_json::to_vec(v).unwrap_or_default())).boxed())
        .expect("response")
}

fn error_response(e: &ApiError) -> Response<Body> {
    let code = StatusCode::from_u16(e.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut r = json_response(code, &e.to_status());
    if let Some(s) = e.retry_after
        && let Ok(h) = http::HeaderValue::from_str(&s.to_string())
    {
        r.headers_mut().insert(http::header::RETRY_AFTER, h);
    }
    r
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                match u8::from_str_radix(
                    std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("zz"),
                    16,
                ) {
                    Ok(b) => {
                        out.push(b);
                        i += 2;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn parse_query(q: &str) -> HashMap<String, String> {
    q.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (percent_decode(k), percent_decode(v))
        })
        .collect()
}
