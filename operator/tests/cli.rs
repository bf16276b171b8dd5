//! The `teamgpu` binary as a user runs it.

use std::process::Command;

fn teamgpu(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_teamgpu"))
        .args(args)
        .output()
        .expect("teamgpu runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

#[test]
fn plan_without_files_shows_the_built_in_example() {
    let (ok, stdout, _) = teamgpu(&["plan"]);
    assert!(ok);
    assert!(stdout.starts_with("TEAM "), "{stdout}");
    assert!(stdout.contains("ml-research   a100-80gb"), "{stdout}");
    assert!(
        stdout.contains("a100-80gb -> DeviceClass a100-80gb.teamgpu.io: 32 devices, Ready"),
        "{stdout}"
    );
}

#[test]
fn plan_yaml_is_a_stream_of_every_object_to_apply() {
    let (ok, stdout, _) = teamgpu(&["plan", "-o", "yaml"]);
    assert!(ok);
    let docs: Vec<serde_json::Value> = serde_saphyr::from_multiple(&stdout).unwrap();
    let kinds: std::collections::BTreeSet<_> =
        docs.iter().filter_map(|d| d["kind"].as_str()).collect();
    assert_eq!(
        kinds.into_iter().collect::<Vec<_>>(),
        [
            "DeviceClass",
            "ResourceClaimTemplate",
            "ResourceQuota",
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding"
        ]
    );
    assert!(
        docs.iter()
            .all(|d| d["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "teamgpu")
    );
}

#[test]
fn plan_reads_files_and_folders_and_notes_what_it_skips() {
    let dir = std::env::temp_dir().join(format!("teamgpu-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("cluster.yaml"),
        "apiVersion: v1\nkind: Namespace\nmetadata: {name: ml-dev, labels: {teamgpu.io/team: ml-research}}\n---\n\
         apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web}\n",
    )
    .unwrap();
    let samples = concat!(env!("CARGO_MANIFEST_DIR"), "/../config/samples");
    let (ok, stdout, stderr) = teamgpu(&["plan", "-f", samples, "-f", dir.to_str().unwrap()]);
    assert!(ok, "{stderr}");
    assert!(
        stderr.contains("document 1: skipped Deployment"),
        "{stderr}"
    );
    assert!(stdout.contains("ml-dev"), "{stdout}");
    // No ResourceSlices given: every policy matches nothing, and the plan says so.
    assert!(
        stdout.contains("GpuSharingPolicy a100-80gb matches no device"),
        "{stdout}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn bad_yaml_names_the_file_and_document_and_fails() {
    let dir = std::env::temp_dir().join(format!("teamgpu-cli-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("bad.yaml");
    std::fs::write(
        &file,
        "apiVersion: v1\nkind: Namespace\nmetadata: {name: a}\n---\n\
         apiVersion: teamgpu.io/v1alpha1\nkind: TeamGpuPolicy\nmetadata: {name: t}\nspec: {weight: many}\n",
    )
    .unwrap();
    let (ok, _, stderr) = teamgpu(&["plan", "-f", file.to_str().unwrap()]);
    assert!(!ok);
    assert!(
        stderr.contains("bad.yaml, document 1: TeamGpuPolicy"),
        "{stderr}"
    );
    let (ok, _, stderr) = teamgpu(&["plan", "-f", "/nonexistent/teamgpu.yaml"]);
    assert!(!ok);
    assert!(
        stderr.contains("reading /nonexistent/teamgpu.yaml"),
        "{stderr}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn crd_prints_both_crds() {
    let (ok, stdout, _) = teamgpu(&["crd"]);
    assert!(ok);
    let docs: Vec<serde_json::Value> = serde_saphyr::from_multiple(&stdout).unwrap();
    let names: Vec<_> = docs
        .iter()
        .filter_map(|d| d["metadata"]["name"].as_str())
        .collect();
    assert_eq!(
        names,
        [
            "gpusharingpolicies.teamgpu.io",
            "teamgpupolicies.teamgpu.io"
        ]
    );
}

#[test]
fn crd_reference_prints_the_api_reference_as_markdown() {
    let (ok, stdout, _) = teamgpu(&["crd", "--reference"]);
    assert!(ok);
    assert!(stdout.contains("\n# API reference\n"), "{stdout}");
    assert!(
        stdout.contains("| `spec.quotas[].guaranteed` |"),
        "{stdout}"
    );
    let (ok, _, stderr) = teamgpu(&["crd", "--reference", "--output-dir", "crds"]);
    assert!(!ok, "--reference and --output-dir cannot be combined");
    assert!(stderr.contains("cannot be used with"), "{stderr}");
}

/// `teamgpu run` stops within the Deployment's grace period (10 s) when it gets SIGTERM, even
/// while its API server never answers (here: a listener that accepts connections and says
/// nothing, as a hung or partitioned API server does).
#[test]
fn sigterm_stops_run_within_the_grace_period_while_the_api_server_does_not_answer() {
    use std::time::{Duration, Instant};
    let black_hole = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = black_hole.local_addr().unwrap().port();
    let dir = std::env::temp_dir().join(format!("teamgpu-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let kubeconfig = dir.join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: c\nclusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:{port}\n    insecure-skip-tls-verify: true\nusers:\n- name: u\n  user:\n    token: t\ncontexts:\n- name: c\n  context:\n    cluster: c\n    user: u\n"
        ),
    )
    .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_teamgpu"))
        .args([
            "run",
            "--metrics-addr",
            "127.0.0.1:0",
            "--health-addr",
            "127.0.0.1:0",
        ])
        .env("KUBECONFIG", &kubeconfig)
        .env("HOME", &dir)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(2));
    assert!(
        child.try_wait().unwrap().is_none(),
        "run waits for its API server"
    );
    let signalled = Instant::now();
    let sent = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if signalled.elapsed() > Duration::from_secs(10) {
            let _ = child.kill();
            panic!("teamgpu run ignored SIGTERM for 10 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    eprintln!("stopped {:?} after SIGTERM: {status}", signalled.elapsed());
    assert!(
        status.success(),
        "a graceful stop, not death by signal: {status}"
    );
    drop(black_hole);
    let _ = std::fs::remove_dir_all(&dir);
}
