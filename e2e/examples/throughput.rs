//! Rough throughput of the stand-in: `cargo run -p teamgpu-e2e --example throughput`.
//! Creates N ResourceClaims (with a ResourceQuota and the controllers running), lists and
//! watches them, and prints the timings.

use std::time::Instant;

use k8s_openapi::api::core::v1::ResourceQuota;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::api::{Api, ListParams, PostParams};
use serde_json::json;

#[tokio::main]
async fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(500);
    let c = teamgpu_e2e::TestCluster::start_local(Default::default())
        .await
        .unwrap();
    let ns = c.namespace("bench-").await.unwrap();
    let quotas: Api<ResourceQuota> = Api::namespaced(c.client(), &ns);
    let q: ResourceQuota = serde_json::from_value(json!({"metadata": {"name": "q"},
        "spec": {"hard": {"gpu.example.com.deviceclass.resource.k8s.io/devices": "100000"}}}))
    .unwrap();
    quotas.create(&PostParams::default(), &q).await.unwrap();
    let api: Api<ResourceClaim> = Api::namespaced(c.client(), &ns);
    let t = Instant::now();
    for i in 0..n {
        let claim: ResourceClaim = serde_json::from_value(json!({"metadata": {"name": format!("c{i}")},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.example.com", "count": 1}}]}}}))
        .unwrap();
        api.create(&PostParams::default(), &claim).await.unwrap();
    }
    let create = t.elapsed();
    let t = Instant::now();
    let l = api.list(&ListParams::default()).await.unwrap();
    let list = t.elapsed();
    println!(
        "{n} creates: {create:?} ({:?}/create); list of {}: {list:?}",
        create / n as u32,
        l.items.len()
    );
    c.shutdown().await.unwrap();
}
