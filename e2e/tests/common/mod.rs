//! Shared helpers of the stand-in's tests.
#![allow(dead_code)]

use std::time::Duration;

use kube::api::{Api, PostParams};
use serde::de::DeserializeOwned;
use serde_json::Value;
use teamgpu_e2e::TestCluster;

/// Starts the stand-in (always the in-process one: these are tests of the stand-in itself) and
/// makes a fresh namespace.
pub async fn cluster_ns() -> (TestCluster, String) {
    let c = TestCluster::start_local(Default::default())
        .await
        .expect("start");
    let ns = c.namespace("t-").await.expect("namespace");
    (c, ns)
}

/// Creates an object from JSON through a typed Api.
pub async fn create<K>(api: &Api<K>, v: Value) -> K
where
    K: kube::Resource + Clone + DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let obj: K = serde_json::from_value(v).expect("typed");
    api.create(&PostParams::default(), &obj)
        .await
        .expect("create")
}

/// The API error of a failed call.
pub fn api_err<T: std::fmt::Debug>(r: Result<T, kube::Error>) -> kube::core::Status {
    match r {
        Err(kube::Error::Api(s)) => *s,
        other => panic!("expected an API error, got {other:?}"),
    }
}

/// Polls `f` until it returns Some, or panics after `secs`.
pub async fn eventually<T, F, Fut>(secs: u64, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = f().await {
            return v;
        }
        if tokio::time::Instant::now() > deadline {
            panic!("condition not met within {secs}s");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A ResourceClaim requesting `count` devices of `class`.
pub fn claim(name: &str, class: &str, count: u32) -> Value {
    serde_json::json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": class, "count": count}}]}}
    })
}

/// The NVIDIA driver's DeviceClasses and its 8-GPU node ResourceSlice, from the fixtures.
pub async fn install_nvidia(c: &TestCluster) {
    let dir = teamgpu_e2e::fixtures::upstream_dir().join("nvidia-dra-driver-gpu");
    let classes: Api<k8s_openapi::api::resource::v1::DeviceClass> = Api::all(c.client());
    for d in
        teamgpu_e2e::fixtures::yaml_documents(&dir.join("deviceclasses.rendered-v1.yaml")).unwrap()
    {
        create(&classes, d).await;
    }
    let slices: Api<k8s_openapi::api::resource::v1::ResourceSlice> = Api::all(c.client());
    for d in teamgpu_e2e::fixtures::yaml_documents(
        &dir.join("resourceslice/resourceslice-8gpu-node.assembled.yaml"),
    )
    .unwrap()
    {
        create(&slices, d).await;
    }
}
