//! Starts a real Kubernetes control plane with the node agent and keeps it running until
//! Ctrl-C / SIGTERM, so that a developer can use `kubectl` against it:
//!
//! ```sh
//! TEAMGPU_E2E_ASSETS=/work/shared/k8s/bin cargo run -p teamgpu-e2e --example control_plane
//! kubectl --kubeconfig /tmp/teamgpu-e2e-cp-.../admin.kubeconfig get nodes
//! ```

use std::process::ExitCode;
use std::time::Instant;

use teamgpu_e2e::control_plane::{self, ASSETS_ENV, ControlPlane};
use teamgpu_e2e::node_agent::{self, NodeSpec};
use tokio::signal::unix::{SignalKind, signal};

#[tokio::main]
async fn main() -> ExitCode {
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            // Display, not Debug: start-up errors carry a multi-line log tail.
            eprintln!("error: {error}");
            ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let Some(assets) = control_plane::assets_from_env() else {
        return Err(format!(
            "set {ASSETS_ENV} to a directory with etcd, kube-apiserver, kube-controller-manager, kube-scheduler of Kubernetes 1.34+"
        )
        .into());
    };
    let started = Instant::now();
    let mut plane = tokio::task::spawn_blocking(move || ControlPlane::start(&assets)).await??;
    let ready = started.elapsed();
    let config = plane.admin_config();
    let agent =
        tokio::task::spawn_blocking(move || node_agent::start(config, &NodeSpec::defaults()))
            .await??;
    println!(
        "control plane ready in {:.1} s at {} (Nodes {} registered after {:.1} s)",
        ready.as_secs_f64(),
        plane.url(),
        agent.node_names().join(", "),
        started.elapsed().as_secs_f64(),
    );
    let kubeconfig = plane.admin_kubeconfig();
    println!("logs in {}", kubeconfig.with_file_name("*.log").display());
    println!("kubectl --kubeconfig {} get nodes", kubeconfig.display());
    println!("Ctrl-C to stop");

    let mut terminate = signal(SignalKind::terminate())?;
    tokio::select! {
        result = tokio::signal::ctrl_c() => result?,
        _ = terminate.recv() => {}
    }
    println!("stopping");
    tokio::task::spawn_blocking(move || {
        drop(agent);
        plane.stop();
    })
    .await?;
    Ok(())
}
