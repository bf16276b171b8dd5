//! list/watch semantics: resourceVersions, watch resumption, bookmarks, 410 Gone, selectors,
//! paging, and kube-runtime's watcher and reflector surviving dropped watches and 410s.

mod common;

use std::time::Duration;

use common::*;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::api::{Api, ListParams, Patch, PatchParams, WatchEvent, WatchParams};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use serde_json::json;
use teamgpu_e2e::{ClusterOptions, Faults, TestCluster};

async fn claims(c: &TestCluster, ns: &str, n: usize) -> Api<ResourceClaim> {
    let api: Api<ResourceClaim> = Api::namespaced(c.client(), ns);
    for i in 0..n {
        let mut cl = claim(&format!("c{i}"), "gpu.nvidia.com", 1);
        cl["metadata"]["labels"] =
            json!({"i": i.to_string(), "parity": if i % 2 == 0 { "even" } else { "odd" }});
        create(&api, cl).await;
    }
    api
}

#[tokio::test]
async fn resource_versions_are_global_and_monotonic() {
    let (c, ns) = cluster_ns().await;
    let api = claims(&c, &ns, 3).await;
    let list = api.list(&ListParams::default()).await.unwrap();
    let list_rv: u64 = list.metadata.resource_version.unwrap().parse().unwrap();
    let rvs: Vec<u64> = list
        .items
        .iter()
        .map(|o| {
            o.metadata
                .resource_version
                .clone()
                .unwrap()
                .parse()
                .unwrap()
        })
        .collect();
    assert!(rvs.windows(2).all(|w| w[0] < w[1]), "{rvs:?}");
    assert!(rvs.iter().all(|rv| *rv <= list_rv));
    assert_eq!(*rvs.last().unwrap(), list_rv);
    c.shutdown().await.unwrap();
}

#[tokio::test]
async fn watch_from_resource_version_sees_later_changes_only() {
    let (c, ns) = cluster_ns().await;
    let api = claims(&c, &ns, 2).await;
    let rv = api
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let mut stream = api
        .watch(&WatchParams::default(), &rv)
        .await
        .unwrap()
        .boxed();
    api.patch(
        "c0",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"x": "1"}}})),
    )
    .await
    .unwrap();
    create(&api, claim("c9", "gpu.nvidia.com", 1)).await;
    api.delete("c1", &Default::default()).await.unwrap();
    let mut seen = Vec::new();
    while seen.len() < 3 {
        match stream.try_next().await.unwrap().unwrap() {
            WatchEvent::Modified(o) => seen.push(format!("M {}", o.metadata.name.unwrap())),
            WatchEvent::Added(o) => seen.push(format!("A {}", o.metadata.name.unwrap())),
            WatchEvent::Deleted(o) => seen.push(format!("D {}", o.metadata.name.unwrap())),
            WatchEvent::Bookmark(_) => {}
            WatchEvent::Error(e) => panic!("{e:?}"),
        }
    }
    assert_eq!(seen, vec!["M c0", "A c9", "D c1"]);
    c.shutdown().await.unwrap();
}

#[tokio::test]
async fn watch_with_rv_zero_starts_with_synthetic_adds_and_bookmarks_arrive() {
    let opts = ClusterOptions {
        bookmark_interval: Duration::from_millis(50),
        ..Default::default()
    };
    let c = TestCluster::start_local(opts).await.unwrap();
    let ns = c.namespace("t-").await.unwrap();
    let api = claims(&c, &ns, 2).await;
    let mut stream = api
        .watch(
            &WatchParams {
                bookmarks: true,
                ..WatchParams::default()
            },
            "0",
        )
        .await
        .unwrap()
        .boxed();
    let mut added = 0;
    loop {
        match stream.try_next().await.unwrap().unwrap() {
            WatchEvent::Added(_) => added += 1,
            WatchEvent::Bookmark(b) => {
                assert_eq!(added, 2);
                assert!(!b.metadata.resource_version.is_empty());
                break;
            }
            other => panic!("{other:?}"),
        }
    }
    c.shutdown().await.unwrap();
}

#[tokio::test]
async fn watch_from_a_compacted_resource_version_gets_410_gone() {
    let (c, ns) = cluster_ns().await;
    let api = claims(&c, &ns, 1).await;
    let rv = api
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    create(&api, claim("later", "gpu.nvidia.com", 1)).await;
    c.compact();
    let mut stream = api
        .watch(&WatchParams::default(), &rv)
        .await
        .unwrap()
        .boxed();
    match stream.try_next().await.unwrap().unwrap() {
        WatchEvent::Error(e) => {
            assert_eq!(e.code, 410);
            assert_eq!(e.reason, "Expired");
            assert!(
                e.message.starts_with("too old resource version:"),
                "{}",
                e.message
            );
        }
        other => panic!("{other:?}"),
    }
    // A list at an exact, compacted resourceVersion is 410 too.
    let s = api_err(
        api.list(
            &ListParams::default()
                .at(&rv)
                .matching(kube::api::VersionMatch::Exact),
        )
        .await,
    );
    assert_eq!((s.code, s.reason.as_str()), (410, "Expired"));
    c.shutdown().await.unwrap();
}

#[tokio::test]
async fn label_selectors_support_every_operator() {
    let (c, ns) = cluster_ns().await;
    let api = claims(&c, &ns, 5).await;
    let names = |l: kube::core::ObjectList<ResourceClaim>| -> Vec<String> {
        l.items
            .into_iter()
            .map(|o| o.metadata.name.unwrap())
            .collect()
    };
    let q = |s: &str| ListParams::default().labels(s);
    assert_eq!(
        names(api.list(&q("parity=even")).await.unwrap()),
        vec!["c0", "c2", "c4"]
    );
    assert_eq!(
        names(api.list(&q("parity==odd")).await.unwrap()),
        vec!["c1", "c3"]
    );
    assert_eq!(
        names(api.list(&q("parity!=even")).await.unwrap()),
        vec!["c1", "c3"]
    );
    assert_eq!(
        names(api.list(&q("i in (1,4)")).await.unwrap()),
        vec!["c1", "c4"]
    );
    assert_eq!(
        names(api.list(&q("i notin (1,4),parity=even")).await.unwrap()),
        vec!["c0", "c2"]
    );
    assert_eq!(names(api.list(&q("i>2")).await.unwrap()), vec!["c3", "c4"]);
    assert_eq!(names(api.list(&q("i<1")).await.unwrap()), vec!["c0"]);
    assert_eq!(names(api.list(&q("i")).await.unwrap()).len(), 5);
    assert_eq!(names(api.list(&q("!i")).await.unwrap()).len(), 0);
    assert_eq!(api_err(api.list(&q("i in 1")).await).code, 400);
    c.shutdown().await.unwrap();
}

#[tokio::test]
async fn field_selectors_name_namespace_and_pod_phase() {
    let mut opts = ClusterOptions::default();
    opts.controllers.scheduler = false;
    let c = TestCluster::start_local(opts).await.unwrap();
    let ns = c.namespace("t-").await.unwrap();
    let api = claims(&c, &ns, 3).await;
    let l = api
        .list(&ListParams::default().fields("metadata.name=c1"))
        .await
        .unwrap();
    assert_eq!(l.items.len(), 1);
    let l = api
        .list(&ListParams::default().fields("metadata.name!=c1"))
        .await
        .unwrap();
    assert_eq!(l.items.len(), 2);
    let all: Api<ResourceClaim> = Api::all(c.client());
    let l = all
        .list(&ListParams::default().fields(&format!("metadata.namespace={ns}")))
        .await
        .unwrap();
    assert_eq!(l.items.len(), 3);
    let s = api_err(
        api.list(&ListParams::default().fields("spec.foo=bar"))
            .await,
    );
    assert_eq!(
        (s.code, s.message.as_str()),
        (400, "field label not supported: spec.foo")
    );
    let pods: Api<Pod> = Api::namespaced(c.client(), &ns);
    create(
        &pods,
        json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "i"}]}}),
    )
    .await;
    assert_eq!(
        pods.list(&ListParams::default().fields("status.phase=Pending"))
            .await
            .unwrap()
            .items
            .len(),
        1
    );
    assert_eq!(
        pods.list(&ListParams::default().fields("status.phase=Running"))
            .await
            .unwrap()
            .items
            .len(),
        0
    );
    c.shutdown().await.unwrap();
}

#[tokio::test]
async fn paging_with_limit_and_continue_is_a_consistent_snapshot() {
    let (c, ns) = cluster_ns().await;
    let api = claims(&c, &ns, 5).await;
    let p1 = api.list(&ListParams::default().limit(2)).await.unwrap();
    assert_eq!(p1.items.len(), 2);
    assert_eq!(p1.metadata.remaining_item_count, Some(3));
    let token = p1.metadata.continue_.clone().unwrap();
    // Changes after the first page are not visible in later pages (same resourceVersion).
    api.delete("c3", &Default::default()).await.unwrap();
    create(&api, claim("c5", "gpu.nvidia.com", 1)).await;
    let p2 = api
        .list(&ListParams::default().limit(2).continue_token(&token))
        .await
        .unwrap();
    assert_eq!(p2.metadata.resource_version, p1.metadata.resource_version);
    let t2 = p2.metadata.continue_.clone().unwrap();
    let p3 = api
        .list(&ListParams::default().limit(2).continue_token(&t2))
        .await
        .unwrap();
    assert!(p3.metadata.continue_.is_none() || p3.metadata.continue_.as_deref() == Some(""));
    let names: Vec<String> = [p1, p2, p3]
        .into_iter()
        .flat_map(|p| p.items)
        .map(|o| o.metadata.name.unwrap())
        .collect();
    assert_eq!(names, vec!["c0", "c1", "c2", "c3", "c4"]);
    // An expired continue token is 410.
    c.compact();
    create(&api, claim("c6", "gpu.nvidia.com", 1)).await;
    let s = api_err(
        api.list(&ListParams::default().limit(2).continue_token(&token))
            .await,
    );
    assert_eq!((s.code, s.reason.as_str()), (410, "Expired"));
    c.shutdown().await.unwrap();
}

#[tokio::test]
async fn watch_with_selector_turns_transitions_into_added_and_deleted() {
    let (c, ns) = cluster_ns().await;
    let api = claims(&c, &ns, 1).await;
    let rv = api
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let mut stream = api
        .watch(&WatchParams::default().labels("x=1"), &rv)
        .await
        .unwrap()
        .boxed();
    api.patch(
        "c0",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"x": "1"}}})),
    )
    .await
    .unwrap();
    api.patch(
        "c0",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"x": "2"}}})),
    )
    .await
    .unwrap();
    assert!(matches!(
        stream.try_next().await.unwrap().unwrap(),
        WatchEvent::Added(_)
    ));
    assert!(matches!(
        stream.try_next().await.unwrap().unwrap(),
        WatchEvent::Deleted(_)
    ));
    c.shutdown().await.unwrap();
}

#[tokio::test]
async fn kube_runtime_reflector_survives_dropped_watches_and_410s() {
    let (c, ns) = cluster_ns().await;
    let api = claims(&c, &ns, 2).await;
    // Every watch stream is closed after 100 ms and every resume gets 410 Gone half the time.
    c.set_faults(Faults {
        watch_close_after: Some(Duration::from_millis(100)),
        rate_watch_gone: 0.5,
        ..Faults::default()
    });
    let (reader, writer) = reflector::store::<ResourceClaim>();
    let stream = reflector(writer, watcher(api.clone(), watcher::Config::default()))
        .default_backoff()
        .applied_objects();
    let task = tokio::spawn(async move {
        futures::pin_mut!(stream);
        while let Some(r) = stream.next().await {
            let _ = r;
        }
    });
    for i in 10..20 {
        create(&api, claim(&format!("c{i}"), "gpu.nvidia.com", 1)).await;
        if i == 15 {
            c.compact();
        }
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    api.delete("c0", &Default::default()).await.unwrap();
    eventually(10, || {
        let reader = reader.clone();
        async move {
            let mut names: Vec<String> = reader
                .state()
                .iter()
                .map(|o| o.metadata.name.clone().unwrap())
                .collect();
            names.sort();
            (names.len() == 11 && !names.contains(&"c0".to_string())).then_some(())
        }
    })
    .await;
    let counters = c.counters().unwrap();
    let watches = counters.get("watch", "resourceclaims.resource.k8s.io");
    let lists = counters.get("list", "resourceclaims.resource.k8s.io");
    // At least one reconnect after a closed stream and one relist after a 410.
    assert!(
        watches >= 2 && lists >= 2,
        "watches {watches}, lists {lists}"
    );
    task.abort();
    c.shutdown().await.unwrap();
}

#[tokio::test]
async fn streaming_list_sends_initial_events_and_end_bookmark() {
    let (c, ns) = cluster_ns().await;
    let api = claims(&c, &ns, 3).await;
    let cfg = watcher::Config::default().streaming_lists();
    let events: Vec<watcher::Event<ResourceClaim>> =
        watcher(api, cfg).take(5).try_collect().await.unwrap();
    assert!(matches!(events[0], watcher::Event::Init));
    assert!(matches!(events[4], watcher::Event::InitDone));
    c.shutdown().await.unwrap();
}
