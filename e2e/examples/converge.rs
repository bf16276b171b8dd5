//! How long the operator takes to converge a synthetic cluster on a real control plane, how many
//! requests it makes, and what one namespace label change costs afterwards:
//! `TEAMGPU_E2E_ASSETS=/path/to/bin cargo run --release -p teamgpu-e2e --example converge --
//! [teams] [namespaces-per-team] [nodes]` (defaults 20 5 50: 100 team namespaces, 5 sharing
//! policies, 400 devices). With `TEAMGPU_E2E_KUBECONFIG` it fills that (throwaway) cluster.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Namespace, ResourceQuota};
use kube::api::{Api, ListParams, Patch, PatchParams};
use teamgpu_synthetic::{Scale, synthetic};

async fn quotas(client: &kube::Client) -> usize {
    let lp = ListParams::default().labels("app.kubernetes.io/managed-by=teamgpu");
    Api::<ResourceQuota>::all(client.clone())
        .list(&lp)
        .await
        .map(|l| l.items.len())
        .unwrap_or(0)
}

fn by_verb(counts: &BTreeMap<(String, String), u64>) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for ((verb, _), n) in counts {
        *out.entry(verb.clone()).or_insert(0) += n;
    }
    out
}

fn minus(a: &BTreeMap<String, u64>, b: &BTreeMap<String, u64>) -> BTreeMap<String, u64> {
    a.iter()
        .map(|(k, v)| (k.clone(), v - b.get(k).copied().unwrap_or(0)))
        .filter(|(_, v)| *v > 0)
        .collect()
}

#[tokio::main]
async fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let scale = Scale {
        teams: args.first().copied().unwrap_or(20),
        namespaces_per_team: args.get(1).copied().unwrap_or(5),
        sharing_policies: 5,
        nodes: args.get(2).copied().unwrap_or(50),
        claims: 0,
        counter_sets: false,
        departments: 0,
    };
    let state = synthetic(scale).expect("synthetic cluster");
    let cluster = teamgpu_e2e::TestCluster::start()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let client = cluster.client();
    teamgpu_e2e::operator::fill(&client, &state)
        .await
        .expect("fill the cluster");
    // The operator runs as its ServiceAccount; only its own requests are counted.
    let (operator_client, counters) = cluster.operator_client().await.expect("operator token");
    let before = by_verb(&counters.snapshot());

    let started = Instant::now();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let config = teamgpu::controller::Config {
        metrics_addr: ([127, 0, 0, 1], 0).into(),
        ..Default::default()
    };
    let operator = tokio::spawn(teamgpu::controller::run(operator_client, config, async {
        let _ = stopped.await;
    }));
    let want = state.namespaces.len();
    while quotas(&client).await < want {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let quotas_in = started.elapsed();
    // Converged: no write for a second.
    let mut last = counters.writes(None);
    let mut last_change = Instant::now();
    while last_change.elapsed() < Duration::from_secs(1) {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let now = counters.writes(None);
        if now != last {
            (last, last_change) = (now, Instant::now());
        }
    }
    let converged = last_change - started;
    let after = by_verb(&counters.snapshot());
    println!(
        "{} team namespaces, {} teams, {} policies, {} devices: quotas everywhere after {quotas_in:?}, last write after {converged:?}",
        want,
        state.teams.len(),
        state.sharing_policies.len(),
        state.slices.len() * 8
    );
    println!(
        "the operator's requests to converge: {:?}",
        minus(&after, &before)
    );

    // One namespace leaves its team: precise writes.
    let ns = &state.namespaces[0].name;
    let patch = serde_json::json!({"metadata": {"labels": {"teamgpu.io/team": null}}});
    let t = Instant::now();
    Api::<Namespace>::all(client.clone())
        .patch(ns, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    while quotas(&client).await >= want {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let reacted = t.elapsed();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let later = by_verb(&counters.snapshot());
    println!(
        "a namespace leaving its team: its quota gone after {reacted:?}; requests {:?}",
        minus(&later, &after)
    );
    let _ = stop.send(());
    let _ = operator.await;
}
