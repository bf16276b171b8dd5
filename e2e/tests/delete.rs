//! Deletion: finalizers, preconditions, background cascading deletion by ownerReferences
//! (including cluster-scoped owners of namespaced dependents), orphaning, namespace deletion.

mod common;

use common::*;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use serde_json::{Value, json};

fn lease(name: &str, meta: Value) -> Value {
    let mut l = json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": name}});
    json_patch::merge(&mut l["metadata"], &meta);
    l
}

fn owner(kind: &str, api_version: &str, name: &str, uid: &str) -> Value {
    json!({"apiVersion": api_version, "kind": kind, "name": name, "uid": uid})
}

/// https://kubernetes.io/docs/concepts/overview/working-with-objects/finalizers/: deleting an
/// object with finalizers sets `metadata.deletionTimestamp` and keeps the object until its
/// finalizers are removed; no new finalizers can be added while it is being deleted.
#[tokio::test]
async fn finalizers_delay_deletion_until_removed() {
    let (c, ns) = cluster_ns().await;
    let api: Api<Lease> = Api::namespaced(c.client(), &ns);
    let l = create(&api, lease("l", json!({"finalizers": ["example.com/f"]}))).await;
    let r = api.delete("l", &DeleteParams::default()).await.unwrap();
    let marked = r.left().unwrap();
    assert!(marked.metadata.deletion_timestamp.is_some());
    assert_eq!(
        marked.metadata.generation,
        Some(l.metadata.generation.unwrap() + 1)
    );
    assert!(api.get("l").await.is_ok());
    let s = api_err(
        api.patch(
            "l",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": ["example.com/f", "example.com/g"]}})),
        )
        .await,
    );
    assert_eq!(s.code, 422);
    assert!(
        s.message
            .contains("no new finalizers can be added if the object is being deleted"),
        "{}",
        s.message
    );
    api.patch(
        "l",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    assert_eq!(api_err(api.get("l").await).code, 404);
    c.shutdown().await.unwrap();
}

#[tokio::test]
async fn delete_preconditions_conflict() {
    let (c, ns) = cluster_ns().await;
    let api: Api<Lease> = Api::namespaced(c.client(), &ns);
    create(&api, lease("l", json!({}))).await;
    let dp = DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some("wrong".into()),
            resource_version: None,
        }),
        ..Default::default()
    };
    let s = api_err(api.delete("l", &dp).await);
    assert_eq!((s.code, s.reason.as_str()), (409, "Conflict"));
    assert!(
        s.message
            .contains("Precondition failed: UID in precondition: wrong"),
        "{}",
        s.message
    );
    c.shutdown().await.unwrap();
}

/// https://kubernetes.io/docs/concepts/architecture/garbage-collection/: in background cascading
/// deletion the owner is deleted immediately and the garbage collector deletes the dependents;
/// "Namespaced dependents can specify cluster-scoped or namespaced owners."
#[tokio::test]
async fn background_cascading_deletion_by_owner_references() {
    let (c, ns) = cluster_ns().await;
    let leases: Api<Lease> = Api::namespaced(c.client(), &ns);
    let o = create(&leases, lease("owner", json!({}))).await;
    let uid = o.metadata.uid.unwrap();
    create(
        &leases,
        lease(
            "dep",
            json!({"ownerReferences": [owner("Lease", "coordination.k8s.io/v1", "owner", &uid)]}),
        ),
    )
    .await;
    // A cluster-scoped owner (DeviceClass) of a namespaced dependent (ResourceClaim).
    let classes: Api<DeviceClass> = Api::all(c.client());
    let dc = create(
        &classes,
        json!({"metadata": {"name": format!("{ns}.example.com")}, "spec": {}}),
    )
    .await;
    let claims: Api<ResourceClaim> = Api::namespaced(c.client(), &ns);
    let mut cl = claim("owned", "x", 1);
    cl["metadata"]["ownerReferences"] = json!([owner(
        "DeviceClass",
        "resource.k8s.io/v1",
        &dc.metadata.name.clone().unwrap(),
        &dc.metadata.uid.clone().unwrap()
    )]);
    create(&claims, cl).await;

    leases
        .delete("owner", &DeleteParams::background())
        .await
        .unwrap();
    classes
        .delete(&dc.metadata.name.unwrap(), &DeleteParams::default())
        .await
        .unwrap();
    eventually(5, || async {
        (leases.get("dep").await.is_err() && claims.get("owned").await.is_err()).then_some(())
    })
    .await;
    c.shutdown().await.unwrap();
}

#[tokio::test]
async fn dangling_references_beside_a_live_owner_are_removed_and_orphan_keeps_dependents() {
    let (c, ns) = cluster_ns().await;
    let leases: Api<Lease> = Api::namespaced(c.client(), &ns);
    let a = create(&leases, lease("a", json!({})))
        .await
        .metadata
        .uid
        .unwrap();
    let b = create(&leases, lease("b", json!({})))
        .await
        .metadata
        .uid
        .unwrap();
    create(&leases, lease("dep", json!({"ownerReferences": [owner("Lease", "coordination.k8s.io/v1", "a", &a), owner("Lease", "coordination.k8s.io/v1", "b", &b)]}))).await;
    leases.delete("a", &DeleteParams::default()).await.unwrap();
    eventually(5, || async {
        let d = leases.get("dep").await.ok()?;
        (d.metadata.owner_references.as_ref()?.len() == 1).then_some(())
    })
    .await;
    // Orphan: the dependent stays and loses the reference.
    leases.delete("b", &DeleteParams::orphan()).await.unwrap();
    let d = leases.get("dep").await.unwrap();
    assert!(d.metadata.owner_references.unwrap_or_default().is_empty());
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    assert!(leases.get("dep").await.is_ok());
    c.shutdown().await.unwrap();
}

/// https://kubernetes.io/docs/concepts/overview/working-with-objects/namespaces/: deleting a
/// namespace deletes everything in it; the namespace stays `Terminating` until its contents are
/// gone, and new objects cannot be created in it meanwhile.
#[tokio::test]
async fn namespace_deletion_removes_its_contents() {
    let (c, ns) = cluster_ns().await;
    let leases: Api<Lease> = Api::namespaced(c.client(), &ns);
    create(&leases, lease("plain", json!({}))).await;
    create(
        &leases,
        lease("held", json!({"finalizers": ["example.com/hold"]})),
    )
    .await;
    let claims: Api<ResourceClaim> = Api::namespaced(c.client(), &ns);
    create(&claims, claim("c", "x", 1)).await;
    let nss: Api<Namespace> = Api::all(c.client());
    let n = nss.get(&ns).await.unwrap();
    assert_eq!(n.spec.unwrap().finalizers.unwrap(), vec!["kubernetes"]);
    assert_eq!(
        n.metadata.labels.unwrap()["kubernetes.io/metadata.name"],
        ns
    );
    nss.delete(&ns, &DeleteParams::default()).await.unwrap();
    eventually(5, || async {
        let n = nss.get(&ns).await.ok()?;
        (n.status?.phase.as_deref() == Some("Terminating")
            && leases.get("plain").await.is_err()
            && claims.get("c").await.is_err())
        .then_some(())
    })
    .await;
    // While the namespace waits for the finalizer, the controllers write nothing.
    let rv = c.core().unwrap().revision();
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    assert_eq!(c.core().unwrap().revision(), rv);
    let s = api_err(
        leases
            .create(
                &PostParams::default(),
                &serde_json::from_value(lease("new", json!({}))).unwrap(),
            )
            .await,
    );
    assert_eq!((s.code, s.reason.as_str()), (403, "Forbidden"));
    assert!(
        s.message.ends_with(&format!(
            "unable to create new content in namespace {ns} because it is being terminated"
        )),
        "{}",
        s.message
    );
    leases
        .patch(
            "held",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .unwrap();
    eventually(5, || async { nss.get(&ns).await.is_err().then_some(()) }).await;
    c.shutdown().await.unwrap();
}

/// https://kubernetes.io/docs/concepts/workloads/pods/pod-lifecycle/#pod-termination: a deleted
/// Pod on a node is Terminating for its grace period (`deletionTimestamp` = now + grace) until
/// the kubelet has stopped it; `gracePeriodSeconds: 0` deletes it at once.
#[tokio::test]
async fn bound_pods_terminate_gracefully() {
    let mut opts = teamgpu_e2e::ClusterOptions::default();
    opts.controllers.pod_termination = std::time::Duration::from_millis(300);
    let c = teamgpu_e2e::TestCluster::start_local(opts).await.unwrap();
    let ns = c.namespace("t-").await.unwrap();
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(c.client(), &ns);
    for p in ["a", "b"] {
        create(
            &pods,
            json!({"metadata": {"name": p}, "spec": {"containers": [{"name": "c", "image": "i"}]}}),
        )
        .await;
    }
    for p in ["a", "b"] {
        eventually(5, || async {
            pods.get(p).await.ok()?.spec?.node_name.map(|_| ())
        })
        .await;
    }
    let marked = pods
        .delete("a", &DeleteParams::default())
        .await
        .unwrap()
        .left()
        .unwrap();
    assert!(marked.metadata.deletion_timestamp.is_some());
    assert_eq!(marked.metadata.deletion_grace_period_seconds, Some(30));
    assert!(pods.get("a").await.is_ok());
    eventually(5, || async { pods.get("a").await.is_err().then_some(()) }).await;
    let gone = pods
        .delete(
            "b",
            &DeleteParams {
                grace_period_seconds: Some(0),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert!(gone.left().unwrap().metadata.deletion_timestamp.is_none());
    assert_eq!(api_err(pods.get("b").await).code, 404);
    c.shutdown().await.unwrap();
}

/// https://kubernetes.io/docs/concepts/architecture/garbage-collection/#foreground-deletion: the
/// owner enters "deletion in progress" (deletionTimestamp, `foregroundDeletion` finalizer) and is
/// deleted after the garbage collector has deleted its dependents.
#[tokio::test]
async fn foreground_cascading_deletion() {
    let (c, ns) = cluster_ns().await;
    let leases: Api<Lease> = Api::namespaced(c.client(), &ns);
    let o = create(&leases, lease("owner", json!({}))).await;
    let uid = o.metadata.uid.unwrap();
    for d in ["d1", "d2"] {
        create(&leases, lease(d, json!({"ownerReferences": [owner("Lease", "coordination.k8s.io/v1", "owner", &uid)]}))).await;
    }
    let marked = leases
        .delete("owner", &DeleteParams::foreground())
        .await
        .unwrap()
        .left()
        .unwrap();
    assert!(marked.metadata.deletion_timestamp.is_some());
    assert_eq!(
        marked.metadata.finalizers.unwrap(),
        vec!["foregroundDeletion"]
    );
    eventually(5, || async {
        (leases.get("d1").await.is_err()
            && leases.get("d2").await.is_err()
            && leases.get("owner").await.is_err())
        .then_some(())
    })
    .await;
    c.shutdown().await.unwrap();
}
