//! PATCH semantics: JSON merge patch, JSON patch, strategic merge patch, and server-side apply
//! with managed fields.

mod common;

use common::*;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};

fn lease(extra: Value) -> Value {
    let mut l =
        json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": "l"}});
    json_patch::merge(&mut l, &extra);
    l
}

fn managers(l: &Lease) -> Vec<(String, String)> {
    l.metadata
        .managed_fields
        .iter()
        .flatten()
        .map(|m| (m.manager.clone().unwrap(), m.operation.clone().unwrap()))
        .collect()
}

fn apply(m: &str) -> PatchParams {
    PatchParams::apply(m)
}

#[tokio::test]
async fn merge_json_and_strategic_patches() {
    let (c, ns) = cluster_ns().await;
    let api: Api<Lease> = Api::namespaced(c.client(), &ns);
    create(
        &api,
        lease(
            json!({"metadata": {"labels": {"a": "1", "b": "2"}, "finalizers": ["x/a", "x/b"]},
        "spec": {"holderIdentity": "h"}}),
        ),
    )
    .await;
    // RFC 7386: null deletes.
    let l = api
        .patch(
            "l",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"a": null, "c": "3"}}})),
        )
        .await
        .unwrap();
    assert_eq!(
        l.metadata
            .labels
            .unwrap()
            .keys()
            .cloned()
            .collect::<Vec<_>>(),
        vec!["b", "c"]
    );
    // RFC 6902, including a failing test op (422).
    let p: json_patch::Patch = serde_json::from_value(
        json!([{"op": "replace", "path": "/spec/holderIdentity", "value": "j"}]),
    )
    .unwrap();
    let l = api
        .patch("l", &PatchParams::default(), &Patch::Json::<()>(p))
        .await
        .unwrap();
    assert_eq!(l.spec.unwrap().holder_identity.as_deref(), Some("j"));
    let p: json_patch::Patch = serde_json::from_value(
        json!([{"op": "test", "path": "/spec/holderIdentity", "value": "zzz"}]),
    )
    .unwrap();
    assert_eq!(
        api_err(
            api.patch("l", &PatchParams::default(), &Patch::Json::<()>(p))
                .await
        )
        .code,
        422
    );
    // Strategic merge: finalizers (a set with patch strategy merge) are unioned; ownerReferences
    // merge by uid and `$patch: delete` removes one; `$deleteFromPrimitiveList`.
    let l = api.patch("l", &PatchParams::default(), &Patch::Strategic(json!({"metadata": {
        "finalizers": ["x/c"],
        "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "p1", "uid": "u1"}, {"apiVersion": "v1", "kind": "Pod", "name": "p2", "uid": "u2"}]}}))).await.unwrap();
    assert_eq!(
        l.metadata.finalizers.clone().unwrap(),
        vec!["x/a", "x/b", "x/c"]
    );
    assert_eq!(l.metadata.owner_references.clone().unwrap().len(), 2);
    let l = api
        .patch(
            "l",
            &PatchParams::default(),
            &Patch::Strategic(json!({"metadata": {
        "$deleteFromPrimitiveList/finalizers": ["x/b"],
        "ownerReferences": [{"uid": "u1", "$patch": "delete"}, {"uid": "u2", "name": "p2b"}]}})),
        )
        .await
        .unwrap();
    assert_eq!(l.metadata.finalizers.unwrap(), vec!["x/a", "x/c"]);
    let refs = l.metadata.owner_references.unwrap();
    assert_eq!(refs.len(), 1);
    assert_eq!((refs[0].uid.as_str(), refs[0].name.as_str()), ("u2", "p2b"));
    // A merge patch carrying a stale resourceVersion is a conflict.
    let s = api_err(
        api.patch(
            "l",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"resourceVersion": "1", "labels": {"z": "1"}}})),
        )
        .await,
    );
    assert_eq!(s.code, 409);
    // Patching a missing object is 404.
    assert_eq!(
        api_err(
            api.patch("nope", &PatchParams::default(), &Patch::Merge(json!({})))
                .await
        )
        .code,
        404
    );
    c.shutdown().await.unwrap();
}

/// https://kubernetes.io/docs/reference/using-api/server-side-apply/ ("Field management",
/// "Conflicts", "Merge strategy"): "If you remove a field from a manifest and apply that manifest,
/// Server-Side Apply checks if there are any other field managers that also own the field. If
/// the field is not owned by any other field managers, it is either deleted from the live object
/// or reset to its default value"; "If two or more appliers set a field to the same value, they
/// share ownership of that field. Any subsequent attempt to change the value of the shared field,
/// by any of the appliers, results in a conflict"; forcing transfers ownership.
#[tokio::test]
async fn server_side_apply_tracks_ownership_removes_fields_and_conflicts() {
    let (c, ns) = cluster_ns().await;
    let api: Api<Lease> = Api::namespaced(c.client(), &ns);
    let a1 = lease(
        json!({"metadata": {"labels": {"a": "1", "b": "2"}}, "spec": {"holderIdentity": "x"}}),
    );
    let l = api
        .patch("l", &apply("mgr-a"), &Patch::Apply(&a1))
        .await
        .unwrap();
    assert_eq!(l.metadata.generation, Some(1));
    assert_eq!(
        managers(&l),
        vec![("mgr-a".to_string(), "Apply".to_string())]
    );
    let fields = l.metadata.managed_fields.as_ref().unwrap()[0]
        .fields_v1
        .clone()
        .unwrap()
        .0;
    assert_eq!(
        fields,
        json!({"f:metadata": {"f:labels": {"f:a": {}, "f:b": {}}}, "f:spec": {"f:holderIdentity": {}}})
    );

    // A stops applying label b: it is removed.
    let a2 = lease(json!({"metadata": {"labels": {"a": "1"}}, "spec": {"holderIdentity": "x"}}));
    let l = api
        .patch("l", &apply("mgr-a"), &Patch::Apply(&a2))
        .await
        .unwrap();
    assert_eq!(
        l.metadata
            .labels
            .clone()
            .unwrap()
            .keys()
            .cloned()
            .collect::<Vec<_>>(),
        vec!["a"]
    );

    // B changing A's field conflicts (409) ...
    let b1 = lease(json!({"metadata": {"labels": {"a": "other"}}}));
    let s = api_err(api.patch("l", &apply("mgr-b"), &Patch::Apply(&b1)).await);
    assert_eq!((s.code, s.reason.as_str()), (409, "Conflict"));
    assert_eq!(
        s.message,
        "Apply failed with 1 conflict: conflict with \"mgr-a\": .metadata.labels.a"
    );
    // ... setting it to the same value shares it, and A dropping it then keeps it.
    let b2 = lease(json!({"metadata": {"labels": {"a": "1"}}}));
    api.patch("l", &apply("mgr-b"), &Patch::Apply(&b2))
        .await
        .unwrap();
    let a3 = lease(json!({"spec": {"holderIdentity": "x"}}));
    let l = api
        .patch("l", &apply("mgr-a"), &Patch::Apply(&a3))
        .await
        .unwrap();
    assert_eq!(l.metadata.labels.clone().unwrap()["a"], "1");

    // Force moves ownership; the former owner then conflicts.
    let b3 = lease(json!({"metadata": {"labels": {"a": "1"}}, "spec": {"holderIdentity": "y"}}));
    let l = api
        .patch("l", &apply("mgr-b").force(), &Patch::Apply(&b3))
        .await
        .unwrap();
    assert_eq!(l.spec.unwrap().holder_identity.as_deref(), Some("y"));
    let s = api_err(api.patch("l", &apply("mgr-a"), &Patch::Apply(&a3)).await);
    assert_eq!(
        s.message,
        "Apply failed with 1 conflict: conflict with \"mgr-b\": .spec.holderIdentity"
    );

    // A non-apply write takes ownership of what it changes ("Update" entry).
    let l = api
        .patch(
            "l",
            &PatchParams {
                field_manager: Some("mgr-c".into()),
                ..Default::default()
            },
            &Patch::Merge(json!({"spec": {"holderIdentity": "z"}})),
        )
        .await
        .unwrap();
    assert!(managers(&l).contains(&("mgr-c".to_string(), "Update".to_string())));
    let s = api_err(api.patch("l", &apply("mgr-b"), &Patch::Apply(&b3)).await);
    // An Update manager is printed with its apiVersion and time (printManager in
    // k8s.io/apiserver/pkg/endpoints/handlers/fieldmanager).
    let c_time = l
        .metadata
        .managed_fields
        .as_ref()
        .unwrap()
        .iter()
        .find(|m| m.manager.as_deref() == Some("mgr-c"))
        .unwrap()
        .time
        .clone()
        .unwrap();
    assert_eq!(
        s.message,
        format!(
            "Apply failed with 1 conflict: conflict with \"mgr-c\" using coordination.k8s.io/v1 at {}: .spec.holderIdentity",
            c_time.0.strftime("%Y-%m-%dT%H:%M:%SZ")
        )
    );
    // Apply without fieldManager is a 400.
    assert_eq!(
        api_err(
            api.patch("l", &PatchParams::default(), &Patch::Apply(&b3))
                .await
        )
        .code,
        400
    );
    c.shutdown().await.unwrap();
}

/// "The same rule applies to associative list or map items": items of a `map` list (by key) and a
/// `set` list that the manager stops applying are removed.
#[tokio::test]
async fn server_side_apply_removes_associative_list_items() {
    let (c, ns) = cluster_ns().await;
    let api: Api<Lease> = Api::namespaced(c.client(), &ns);
    let refs = |uids: &[&str]| -> Value {
        json!(uids.iter().map(|u| json!({"apiVersion": "v1", "kind": "Pod", "name": format!("p-{u}"), "uid": u})).collect::<Vec<_>>())
    };
    let a1 = lease(
        json!({"metadata": {"ownerReferences": refs(&["u1", "u2"]), "finalizers": ["x/a", "x/b"]}}),
    );
    api.patch("l", &apply("mgr-a"), &Patch::Apply(&a1))
        .await
        .unwrap();
    // Another manager adds its own owner reference.
    let b1 = lease(json!({"metadata": {"ownerReferences": refs(&["u3"])}}));
    api.patch("l", &apply("mgr-b"), &Patch::Apply(&b1))
        .await
        .unwrap();
    let a2 = lease(json!({"metadata": {"ownerReferences": refs(&["u1"]), "finalizers": ["x/a"]}}));
    let l = api
        .patch("l", &apply("mgr-a"), &Patch::Apply(&a2))
        .await
        .unwrap();
    let uids: Vec<String> = l
        .metadata
        .owner_references
        .unwrap()
        .into_iter()
        .map(|r| r.uid)
        .collect();
    assert_eq!(uids, vec!["u1", "u3"]);
    assert_eq!(l.metadata.finalizers.unwrap(), vec!["x/a"]);
    let mf = serde_json::to_value(&l.metadata.managed_fields).unwrap();
    let a = mf
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["manager"] == "mgr-a")
        .unwrap();
    // OwnerReference is an atomic struct: the item is a leaf (`{}`), as in real managedFields.
    assert_eq!(
        a["fieldsV1"]["f:metadata"]["f:ownerReferences"]["k:{\"uid\":\"u1\"}"],
        json!({}),
        "{a}"
    );
    assert_eq!(
        a["fieldsV1"]["f:metadata"]["f:finalizers"]["v:\"x/a\""],
        json!({}),
        "{a}"
    );
    c.shutdown().await.unwrap();
}

/// An item a manager stops applying leaves a list-map whole, key fields and all, as
/// structured-merge-diff does: the operator's TeamGpuPolicy `status.quotas` shrinks this way.
#[tokio::test]
async fn apply_removes_a_list_map_item_no_longer_applied() {
    let (c, _) = cluster_ns().await;
    let api: Api<teamgpu::api::TeamGpuPolicy> = Api::all(c.client());
    let team = json!({"apiVersion": "teamgpu.io/v1alpha1", "kind": "TeamGpuPolicy",
                      "metadata": {"name": "t"}, "spec": {"namespaces": ["a"]}});
    api.patch("t", &apply("m"), &Patch::Apply(team))
        .await
        .unwrap();
    let status = |policies: &[&str]| {
        let quotas: Vec<Value> = policies
            .iter()
            .map(|p| {
                json!({"sharingPolicy": p, "guaranteed": 1, "effectiveGuarantee": 1,
                "limit": 1, "weight": 1, "capacity": 1, "entitlement": 1, "borrowed": 0,
                "requested": 0, "allocated": 0, "pending": 0})
            })
            .collect();
        json!({"apiVersion": "teamgpu.io/v1alpha1", "kind": "TeamGpuPolicy",
               "status": {"quotas": quotas}})
    };
    let force = apply("teamgpu").force();
    api.patch_status("t", &force, &Patch::Apply(status(&["x", "y"])))
        .await
        .unwrap();
    let t = api
        .patch_status("t", &force, &Patch::Apply(status(&["x"])))
        .await
        .unwrap();
    let left: Vec<String> = t
        .status
        .unwrap()
        .quotas
        .into_iter()
        .map(|q| q.sharing_policy)
        .collect();
    assert_eq!(left, ["x"]);
}
