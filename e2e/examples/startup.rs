//! Measures the stand-in's start-up: `cargo run -p teamgpu-e2e --example startup`.
//! Prints the cold start (first in the process: CRDs read, OpenAPI documents loading in the
//! background), the first write (waits for the documents), and a warm start.

use std::time::Instant;

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, PostParams};

#[tokio::main]
async fn main() {
    let t = Instant::now();
    let c = teamgpu_e2e::TestCluster::start().await.unwrap();
    let cold = t.elapsed();
    let t = Instant::now();
    let api: Api<Namespace> = Api::all(c.client());
    let ns: Namespace =
        serde_json::from_value(serde_json::json!({"metadata": {"name": "x"}})).unwrap();
    api.create(&PostParams::default(), &ns).await.unwrap();
    let first_write = t.elapsed();
    let t = Instant::now();
    let d = teamgpu_e2e::TestCluster::start().await.unwrap();
    let warm = t.elapsed();
    println!("cold start {cold:?}, first write {first_write:?}, warm start {warm:?}");
    drop((c, d));
}
