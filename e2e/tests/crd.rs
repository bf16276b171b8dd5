//! Custom resources from `crds/`: structural-schema validation, defaulting, `x-kubernetes-
//! validations` evaluated with kube-cel, the status subresource and generation.

mod common;

use common::*;
use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
};
use serde_json::{Value, json};

fn team_api(c: &teamgpu_e2e::TestCluster) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("teamgpu.io", "v1alpha1", "TeamGpuPolicy");
    Api::all_with(
        c.client(),
        &ApiResource::from_gvk_with_plural(&gvk, "teamgpupolicies"),
    )
}

fn team(name: &str, spec: Value) -> DynamicObject {
    serde_json::from_value(json!({"apiVersion": "teamgpu.io/v1alpha1", "kind": "TeamGpuPolicy", "metadata": {"name": name}, "spec": spec})).unwrap()
}

#[tokio::test]
async fn crd_objects_are_defaulted_and_validated_with_cel() {
    let (c, _ns) = cluster_ns().await;
    let api = team_api(&c);
    let ok = api
        .create(&PostParams::default(), &team("team-a", json!({"namespaces": ["team-a"], "quotas": [{"sharingPolicy": "full-gpu", "limit": 4}]})))
        .await
        .unwrap();
    // Schema defaults are applied (weight: 1, guaranteed: 0).
    assert_eq!(ok.data["spec"]["weight"], json!(1));
    assert_eq!(ok.data["spec"]["quotas"][0]["guaranteed"], json!(0));
    assert_eq!(ok.metadata.generation, Some(1));

    // A CEL rule (x-kubernetes-validations) fails: 422 with the rule's message and path.
    let s = api_err(
        api.create(
            &PostParams::default(),
            &team(
                "team-b",
                json!({"namespaces": ["team-b"],
        "quotas": [{"sharingPolicy": "full-gpu", "guaranteed": 5, "limit": 4}]}),
            ),
        )
        .await,
    );
    assert_eq!((s.code, s.reason.as_str()), (422, "Invalid"));
    assert!(
        s.message
            .starts_with("TeamGpuPolicy.teamgpu.io \"team-b\" is invalid:"),
        "{}",
        s.message
    );
    assert!(
        s.message.contains("limit must be at least guaranteed"),
        "{}",
        s.message
    );
    let s = api_err(
        api.create(
            &PostParams::default(),
            &team("team-c", json!({"namespaces": ["kube-system"]})),
        )
        .await,
    );
    assert!(
        s.message.contains(
            "system namespaces (kube-system, kube-public, kube-node-lease) cannot belong to a team"
        ),
        "{}",
        s.message
    );
    let s = api_err(
        api.create(
            &PostParams::default(),
            &team("team-d", json!({"weight": 1})),
        )
        .await,
    );
    assert!(
        s.message
            .contains("at least one of namespaceSelector or namespaces must be set"),
        "{}",
        s.message
    );
    // Structural schema: type, minimum, pattern.
    let s = api_err(
        api.create(
            &PostParams::default(),
            &team("team-e", json!({"namespaces": ["Bad_NS"], "weight": 0})),
        )
        .await,
    );
    assert!(s.message.contains("spec.weight: Invalid value: 0: spec.weight in body should be greater than or equal to 1"), "{}", s.message);
    assert!(
        s.message
            .contains("spec.namespaces[0]: Invalid value: \"Bad_NS\""),
        "{}",
        s.message
    );
    // CRDs do not support strategic merge patch (415).
    let s = api_err(
        api.patch(
            "team-a",
            &PatchParams::default(),
            &Patch::Strategic(json!({"spec": {"weight": 2}})),
        )
        .await,
    );
    assert_eq!(s.code, 415);
    c.shutdown().await.unwrap();
}

#[tokio::test]
async fn crd_status_subresource_and_generation() {
    let (c, _ns) = cluster_ns().await;
    let api = team_api(&c);
    api.create(
        &PostParams::default(),
        &team("team-a", json!({"namespaces": ["team-a"]})),
    )
    .await
    .unwrap();
    // Status written on the main resource is ignored.
    let o = api
        .patch(
            "team-a",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"namespaces": 3}})),
        )
        .await
        .unwrap();
    assert!(o.data.get("status").is_none());
    assert_eq!(o.metadata.generation, Some(1));
    let o = api
        .patch_status(
            "team-a",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"status": {"conditions": [{"type": "Ready", "status": "True",
        "reason": "Ok", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}}),
            ),
        )
        .await
        .unwrap();
    assert_eq!(o.data["status"]["conditions"][0]["type"], "Ready");
    assert_eq!(o.metadata.generation, Some(1));
    // The status subresource ignores spec.
    let o = api
        .patch_status(
            "team-a",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"weight": 9}})),
        )
        .await
        .unwrap();
    assert_eq!(o.data["spec"]["weight"], json!(1));
    // Status is validated too.
    let s = api_err(
        api.patch_status(
            "team-a",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"conditions": [{"type": "Ready"}]}})),
        )
        .await,
    );
    assert_eq!(s.code, 422);
    // Spec changes bump the generation.
    let o = api
        .patch(
            "team-a",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"weight": 3}})),
        )
        .await
        .unwrap();
    assert_eq!(o.metadata.generation, Some(2));
    // Updates of custom resources need a resourceVersion.
    let mut unconditional = o.clone();
    unconditional.metadata.resource_version = None;
    let s = api_err(
        api.replace("team-a", &PostParams::default(), &unconditional)
            .await,
    );
    assert_eq!(s.code, 422);
    c.shutdown().await.unwrap();
}
