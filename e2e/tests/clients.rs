//! Client libraries teamgpu uses, against the stand-in: kube-lease-manager (leader election with
//! strategic merge and apply patches on a Lease) and kube-runtime's event Recorder
//! (events.k8s.io/v1 Events, created then patched as a series).

mod common;

use std::time::Duration;

use common::*;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ListParams};
use kube::runtime::events::{Event as RecordedEvent, EventType, Recorder, Reporter};

#[tokio::test]
async fn only_one_lease_manager_leads() {
    let (c, ns) = cluster_ns().await;
    let make = |id: &str| {
        kube_lease_manager::LeaseManagerBuilder::new(c.client(), "teamgpu-leader")
            .with_namespace(&ns)
            .with_identity(id)
            .with_field_manager("teamgpu")
            .with_duration(2)
            .with_grace(1)
            .build()
    };
    let a = make("a").await.unwrap();
    let b = make("b").await.unwrap();
    let a_leads = a.changed().await.unwrap();
    assert!(a_leads);
    let b_leads = tokio::time::timeout(Duration::from_millis(300), b.changed()).await;
    assert!(!matches!(b_leads, Ok(Ok(true))), "both lead: {b_leads:?}");
    let lease: Api<k8s_openapi::api::coordination::v1::Lease> = Api::namespaced(c.client(), &ns);
    let l = lease.get("teamgpu-leader").await.unwrap();
    assert_eq!(l.spec.unwrap().holder_identity.as_deref(), Some("a"));
    a.release().await.unwrap();
    let b_leads = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            if b.changed().await.unwrap() {
                return;
            }
        }
    })
    .await;
    assert!(b_leads.is_ok(), "b did not take over");
    c.shutdown().await.unwrap();
}

#[tokio::test]
async fn recorder_events_are_created_and_then_patched_as_a_series() {
    let (c, ns) = cluster_ns().await;
    let recorder = Recorder::new(
        c.client(),
        Reporter {
            controller: "teamgpu".into(),
            instance: Some("test".into()),
        },
    );
    let reference = k8s_openapi::api::core::v1::ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Namespace".into()),
        name: Some(ns.clone()),
        ..Default::default()
    };
    let ev = RecordedEvent {
        type_: EventType::Normal,
        reason: "Reclaimed".into(),
        note: Some("took 2 devices back".into()),
        action: "Reclaim".into(),
        secondary: None,
    };
    recorder.publish(&ev, &reference).await.unwrap();
    recorder.publish(&ev, &reference).await.unwrap();
    let events: Api<Event> = Api::all(c.client());
    let list = events.list(&ListParams::default()).await.unwrap();
    let mine: Vec<&Event> = list
        .items
        .iter()
        .filter(|e| e.reason.as_deref() == Some("Reclaimed"))
        .collect();
    assert_eq!(mine.len(), 1, "{list:?}");
    assert_eq!(mine[0].series.as_ref().map(|s| s.count), Some(2));
    let counters = c.counters().unwrap();
    assert_eq!(counters.get("create", "events.events.k8s.io"), 1);
    assert_eq!(counters.get("patch", "events.events.k8s.io"), 1);
    c.shutdown().await.unwrap();
}
