//! The real teamgpu controller against the stand-in: it starts, plans from the samples in
//! `config/samples`, and every object it writes passes the stand-in's validation and admission.
//! (Scenarios with assertions on the operator's behaviour live elsewhere; this only proves the
//! harness serves what the operator needs.)

mod common;

use std::time::Duration;

use common::*;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
};
use serde_json::json;
use teamgpu_e2e::fixtures::yaml_documents;

#[tokio::test]
async fn the_operator_runs_against_the_stand_in() {
    let (c, _ns) = cluster_ns().await;
    install_nvidia(&c).await;
    let samples = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../config/samples"));
    let mut files: Vec<_> = std::fs::read_dir(samples)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    for f in files
        .iter()
        .filter(|f| f.extension().is_some_and(|x| x == "yaml"))
    {
        for d in yaml_documents(f).unwrap() {
            let kind = d["kind"].as_str().unwrap().to_string();
            if d["apiVersion"] != "teamgpu.io/v1alpha1" {
                continue;
            }
            let plural = format!("{}s", kind.to_lowercase()).replace("policys", "policies");
            let ar = ApiResource::from_gvk_with_plural(
                &GroupVersionKind::gvk("teamgpu.io", "v1alpha1", &kind),
                &plural,
            );
            let api: Api<DynamicObject> = Api::all_with(c.client(), &ar);
            let obj: DynamicObject = serde_json::from_value(d).unwrap();
            api.create(&PostParams::default(), &obj).await.unwrap();
        }
    }
    let nss: Api<Namespace> = Api::all(c.client());
    let team_ns = c.namespace("ml-").await.unwrap();
    nss.patch(
        &team_ns,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"teamgpu.io/team": "ml-research"}}})),
    )
    .await
    .unwrap();
    let counters = c.counters().unwrap();
    counters.reset();
    let config = teamgpu::controller::Config {
        metrics_addr: ([127, 0, 0, 1], 0).into(),
        debounce: Duration::from_millis(10),
        ..Default::default()
    };
    let result = teamgpu::controller::run(
        c.client(),
        config,
        tokio::time::sleep(Duration::from_millis(1000)),
    )
    .await;
    assert!(result.is_ok(), "{result:?}");
    let snapshot = counters.snapshot();
    assert!(counters.writes(None) > 0, "{snapshot:?}");
    // No request of the operator was refused (validation, admission, SSA conflicts, 404s).
    assert_eq!(
        counters.errors(),
        Vec::<String>::new(),
        "{:?}",
        counters.status_codes()
    );
    c.shutdown().await.unwrap();
}
