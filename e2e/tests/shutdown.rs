//! SIGTERM stops `teamgpu run` within the Deployment's grace period (10 s) while it is busy: in
//! the middle of its first pass over a few hundred namespaces, on a real control plane. (Stopping
//! while the API server does not answer is `operator/tests/cli.rs`.) A control plane of its own:
//! this binary fills it.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ResourceQuota;
use kube::api::{Api, ListParams};
use teamgpu_e2e::TestCluster;
use teamgpu_e2e::fixtures::{operator_process, teamgpu_binary};
use teamgpu_synthetic::{Scale, synthetic};

/// terminationGracePeriodSeconds of config/manager: the kubelet's SIGKILL comes after it.
const GRACE: Duration = Duration::from_secs(10);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_mid_pass_stops_the_operator_within_the_grace_period() {
    let Some(cluster) = TestCluster::start_or_skip().await else {
        return;
    };
    let client = cluster.client();
    // 300 team namespaces, so the first pass takes a while.
    let state = synthetic(Scale {
        teams: 60,
        namespaces_per_team: 5,
        sharing_policies: 5,
        nodes: 40,
        claims: 0,
        counter_sets: false,
        departments: 0,
    })
    .unwrap();
    teamgpu_e2e::operator::fill(&client, &state).await.unwrap();

    let dir = std::env::temp_dir().join(format!("teamgpu-shutdown-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let kubeconfig = cluster.operator_kubeconfig(&dir).await.unwrap();
    let mut operator = operator_process(&teamgpu_binary(), &kubeconfig)
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();

    // Mid-pass: some quotas are in place, not all.
    let quotas = Api::<ResourceQuota>::all(client.clone());
    let managed = ListParams::default().labels("app.kubernetes.io/managed-by=teamgpu");
    let started = Instant::now();
    let in_place = loop {
        let n = quotas.list_metadata(&managed).await.unwrap().items.len();
        if n > 0 {
            break n;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the operator wrote no quota within a minute"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(
        in_place < state.namespaces.len(),
        "the pass was over before the signal ({in_place} quotas)"
    );
    let signalled = Instant::now();
    Command::new("kill")
        .args(["-TERM", &operator.id().to_string()])
        .status()
        .unwrap();
    let status = loop {
        if let Some(status) = operator.try_wait().unwrap() {
            break status;
        }
        if signalled.elapsed() > GRACE {
            let _ = operator.kill();
            panic!("still running {GRACE:?} after SIGTERM (mid-pass, {in_place} quotas in place)");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let stopped_in = signalled.elapsed();
    eprintln!(
        "SIGTERM after {in_place} of {} quotas: stopped in {stopped_in:?} ({status})",
        state.namespaces.len()
    );
    assert!(status.success(), "a graceful stop exits 0: {status}");
    let _ = std::fs::remove_dir_all(dir);
}
