//! The fault proxy in front of the real API server of [`control_plane::shared`]: a pass-through
//! without faults, and each fault as a client sees it.
//!
//! Skipped (one line printed) when `TEAMGPU_E2E_ASSETS` is unset, except under `CI=true`.

use std::collections::BTreeMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures::StreamExt;
use http_body_util::BodyExt;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{DeleteParams, ListParams, ObjectMeta, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use teamgpu_e2e::proxy::{FaultProxy, Faults};

/// An admin client of the shared control plane and a fresh namespace in it, or None (after
/// printing why) when there is no control plane to test against.
async fn setup(test: &str) -> Option<(Client, String)> {
    let plane = teamgpu_e2e::cluster::control_plane_or_skip().await?;
    let admin = Client::try_from(plane.admin_config()).expect("admin client");
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    let ns = format!("proxy-{test}-{nanos}");
    let namespace = Namespace {
        metadata: ObjectMeta {
            name: Some(ns.clone()),
            ..Default::default()
        },
        ..Default::default()
    };
    Api::<Namespace>::all(admin.clone())
        .create(&PostParams::default(), &namespace)
        .await
        .expect("create the test namespace");
    Some((admin, ns))
}

/// Deletes the test namespace (best effort: the control plane dies with the test process).
async fn teardown(admin: Client, ns: &str) {
    let _ = Api::<Namespace>::all(admin)
        .delete(ns, &DeleteParams::default())
        .await;
}

fn config_map(name: &str, value: &str) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        data: Some(BTreeMap::from([("k".to_string(), value.to_string())])),
        ..Default::default()
    }
}

fn proxy_client(proxy: &FaultProxy) -> Client {
    Client::try_from(proxy.config()).expect("a client on the proxy")
}

#[tokio::test]
async fn without_faults_requests_pass_through_and_are_counted() {
    let Some((admin, ns)) = setup("passthrough").await else {
        return;
    };
    let proxy = FaultProxy::start(admin.clone(), Faults::default())
        .await
        .unwrap();
    assert!(proxy.url().starts_with("http://127.0.0.1:"));
    let api = Api::<ConfigMap>::namespaced(proxy_client(&proxy), &ns);

    let created = api
        .create(&PostParams::default(), &config_map("a", "1"))
        .await
        .unwrap();
    assert!(
        created.metadata.uid.is_some(),
        "the real API server made it"
    );
    let got = api.get("a").await.unwrap();
    assert_eq!(got.data.unwrap()["k"], "1");
    let list = api.list(&ListParams::default()).await.unwrap();
    assert!(
        list.items
            .iter()
            .any(|cm| cm.metadata.name.as_deref() == Some("a"))
    );
    // Written upstream, not in the proxy: the admin client sees it directly.
    Api::<ConfigMap>::namespaced(admin.clone(), &ns)
        .get("a")
        .await
        .unwrap();

    let counters = proxy.counters();
    assert_eq!(counters.forwarded(), 3);
    assert_eq!(counters.get("create", "configmaps"), 1);
    assert_eq!(counters.get("get", "configmaps"), 1);
    assert_eq!(counters.get("list", "configmaps"), 1);
    assert_eq!(counters.writes(None), 1);
    assert_eq!(
        counters.status_codes(),
        BTreeMap::from([(200, 2), (201, 1)])
    );
    assert_eq!(counters.injected_500() + counters.injected_429(), 0);
    counters.reset();
    assert_eq!(counters.forwarded(), 0);

    // Dropping the proxy stops it: its port stops accepting connections.
    let addr = proxy.addr();
    drop(proxy);
    let deadline = Instant::now() + Duration::from_secs(30);
    while tokio::net::TcpStream::connect(addr).await.is_ok() {
        assert!(
            Instant::now() < deadline,
            "the proxy still accepts after drop"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    teardown(admin, &ns).await;
}

#[tokio::test]
async fn injected_500s_and_429s_are_kubernetes_statuses_and_are_not_forwarded() {
    let Some((admin, ns)) = setup("errors").await else {
        return;
    };
    Api::<ConfigMap>::namespaced(admin.clone(), &ns)
        .create(&PostParams::default(), &config_map("a", "1"))
        .await
        .unwrap();
    let faults = Faults {
        rate_500: 1.0,
        ..Faults::default()
    };
    let proxy = FaultProxy::start(admin.clone(), faults).await.unwrap();
    // kube's default client retries 429/503/504, not 500: the 500 reaches the caller.
    let api = Api::<ConfigMap>::namespaced(proxy_client(&proxy), &ns);
    match api.get("a").await {
        Err(kube::Error::Api(status)) => {
            assert_eq!(status.code, 500, "{status:?}");
            assert_eq!(status.reason, "InternalError", "{status:?}");
        }
        other => panic!("expected a 500 Status, got {other:?}"),
    }
    let counters = proxy.counters();
    assert_eq!(counters.injected_500(), 1);
    assert_eq!(counters.forwarded(), 0, "an injected 500 is not forwarded");
    assert_eq!(counters.get("get", "configmaps"), 1);

    // 429 with Retry-After, seen raw by a client without kube's default retries (which would
    // retry it 15 times, honouring Retry-After; `Client::send` included).
    proxy.set_faults(Faults {
        rate_429: 1.0,
        retry_after_secs: 7,
        ..Faults::default()
    });
    let mut config = proxy.config();
    config.default_retry = false;
    let raw = Client::try_from(config).unwrap();
    let request = http::Request::get(format!("/api/v1/namespaces/{ns}/configmaps/a"))
        .body(kube::client::Body::empty())
        .unwrap();
    let response = raw.send(request).await.unwrap();
    assert_eq!(response.status(), 429);
    assert_eq!(response.headers()["retry-after"], "7");
    let body = response.into_body().collect().await.unwrap().to_bytes();
    let status: kube::core::Status = serde_json::from_slice(&body).unwrap();
    assert_eq!(status.code, 429);
    assert_eq!(status.reason, "TooManyRequests");
    assert_eq!(counters.injected_429(), 1);
    assert_eq!(counters.forwarded(), 0);

    // Faults off again: the same request is forwarded and succeeds.
    proxy.set_faults(Faults::default());
    assert_eq!(api.get("a").await.unwrap().data.unwrap()["k"], "1");
    assert_eq!(counters.forwarded(), 1);
    assert_eq!(counters.get("get", "configmaps"), 3);
    assert_eq!(
        counters.status_codes(),
        BTreeMap::from([(200, 1), (429, 1), (500, 1)])
    );
    teardown(admin, &ns).await;
}

#[tokio::test]
async fn watches_are_streamed_and_cut_after_watch_close_after() {
    let Some((admin, ns)) = setup("cut").await else {
        return;
    };
    let faults = Faults {
        // Long enough that a loaded machine cannot blur streamed and buffered apart.
        watch_close_after: Some(Duration::from_secs(5)),
        ..Faults::default()
    };
    let proxy = FaultProxy::start(admin.clone(), faults).await.unwrap();
    let client = proxy_client(&proxy);
    let api = Api::<ConfigMap>::namespaced(client.clone(), &ns);
    let rv = api
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    // Made after the list's resourceVersion: the watch replays it at once.
    api.create(&PostParams::default(), &config_map("w", "1"))
        .await
        .unwrap();

    let start = Instant::now();
    let request = http::Request::get(format!(
        "/api/v1/namespaces/{ns}/configmaps?watch=true&resourceVersion={rv}"
    ))
    .body(kube::client::Body::empty())
    .unwrap();
    let response = client.send(request).await.unwrap();
    assert_eq!(response.status(), 200);
    let mut body = response.into_body();
    let mut received = Vec::new();
    let mut first_data_at = None;
    // A generous timeout (a shared 2-core machine), not the figure under test.
    let ended_at = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(frame) = body.frame().await {
            if let Ok(data) = frame.expect("the body ends cleanly").into_data() {
                first_data_at.get_or_insert(start.elapsed());
                received.extend_from_slice(&data);
            }
        }
        start.elapsed()
    })
    .await
    .expect("the watch is cut within 30 s");
    let text = String::from_utf8(received).unwrap();
    assert!(
        text.contains(r#""type":"ADDED""#) && text.contains(r#""name":"w""#),
        "{text}"
    );
    // Streamed, not buffered until the end: the event came before the cut could happen.
    let first_data_at = first_data_at.unwrap();
    // Buffered, it would arrive with the end; streamed, it comes about the cut's 5 s before.
    assert!(
        first_data_at + Duration::from_secs(2) <= ended_at,
        "{first_data_at:?}, cut at {ended_at:?}"
    );
    // Cut by the proxy after its 5 s, not before (how much later depends on the machine).
    assert!(
        ended_at >= Duration::from_millis(4900),
        "cut after {ended_at:?}"
    );
    eprintln!("first event after {first_data_at:?}, cut after {ended_at:?}");
    assert_eq!(proxy.counters().watches_cut(), 1);
    assert_eq!(proxy.counters().get("watch", "configmaps"), 1);
    teardown(admin, &ns).await;
}

#[tokio::test]
async fn a_watcher_relists_after_injected_410s_and_still_sees_new_objects() {
    let Some((admin, ns)) = setup("gone").await else {
        return;
    };
    let faults = Faults {
        rate_watch_gone: 1.0,
        ..Faults::default()
    };
    let proxy = FaultProxy::start(admin.clone(), faults).await.unwrap();
    let api = Api::<ConfigMap>::namespaced(proxy_client(&proxy), &ns);
    let (seen_tx, mut seen_rx) = tokio::sync::mpsc::unbounded_channel();
    let watch = tokio::spawn(async move {
        let mut stream = watcher(api, watcher::Config::default())
            .default_backoff()
            .boxed();
        while let Some(event) = stream.next().await {
            let seen = match event {
                Ok(watcher::Event::Apply(cm) | watcher::Event::InitApply(cm)) => {
                    Ok(cm.metadata.name.unwrap_or_default())
                }
                Ok(_) => continue,
                Err(watcher::Error::WatchError(status)) => Err(status.code),
                Err(e) => panic!("unexpected watcher error: {e}"),
            };
            if seen_tx.send(seen).is_err() {
                return;
            }
        }
    });

    let counters = proxy.counters().clone();
    let deadline = Instant::now() + Duration::from_secs(30);
    while counters.watches_gone() == 0 {
        assert!(
            Instant::now() < deadline,
            "no 410 sent to the watcher within 30 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Created once the watcher has been told its resourceVersion is gone: it can only learn of
    // it from a relist.
    Api::<ConfigMap>::namespaced(admin.clone(), &ns)
        .create(&PostParams::default(), &config_map("late", "1"))
        .await
        .unwrap();

    let mut gone_errors = 0;
    tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            match seen_rx.recv().await.expect("the watcher runs") {
                Ok(name) if name == "late" => break,
                Ok(_) => {}
                Err(code) => {
                    assert_eq!(code, 410);
                    gone_errors += 1;
                }
            }
        }
    })
    .await
    .expect("the new ConfigMap is seen within 30 s");
    watch.abort();

    assert!(gone_errors >= 1, "the watcher saw the 410 event");
    assert!(counters.watches_gone() >= 1);
    assert!(
        counters.get("list", "configmaps") >= 2,
        "relisted: {:?}",
        counters.snapshot()
    );
    assert_eq!(counters.injected_500() + counters.injected_429(), 0);
    teardown(admin, &ns).await;
}
