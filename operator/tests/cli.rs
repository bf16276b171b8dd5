//! The `teamgpu` binary as a user runs it.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

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

/// `teamgpu args` with `input` on its standard input.
fn teamgpu_with_stdin(args: &[&str], input: &str) -> (bool, String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_teamgpu"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("teamgpu runs");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

/// A fresh temporary folder for one test.
fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("teamgpu-cli-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Whether kubectl is on the PATH; without it a test that needs it is skipped with a note,
/// unless CI=true, where it fails.
fn kubectl_available(test: &str) -> bool {
    let found = Command::new("kubectl")
        .args(["version", "--client"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !found {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "{test}: kubectl is not installed (CI=true)"
        );
        eprintln!("skipped {test}: kubectl is not installed");
    }
    found
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// `kind namespace/name` of each object, in order.
fn keys(docs: &[serde_json::Value]) -> Vec<String> {
    docs.iter()
        .map(|d| {
            format!(
                "{} {}/{}",
                d["kind"].as_str().unwrap_or_default(),
                d["metadata"]["namespace"].as_str().unwrap_or_default(),
                d["metadata"]["name"].as_str().unwrap_or_default()
            )
        })
        .collect()
}

fn documents(yaml: &str) -> Vec<serde_json::Value> {
    let docs: Vec<serde_json::Value> = serde_saphyr::from_multiple(yaml).unwrap();
    docs.into_iter().filter(|d| !d.is_null()).collect()
}

#[test]
fn manifests_are_the_objects_of_kubectl_kustomize_config_default() {
    if !kubectl_available("manifests_are_the_objects_of_kubectl_kustomize_config_default") {
        return;
    }
    let out = Command::new("kubectl")
        .args(["kustomize", "config/default"])
        .current_dir(repo_root())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let expected = documents(&String::from_utf8_lossy(&out.stdout));
    let (ok, stdout, stderr) = teamgpu(&["manifests"]);
    assert!(ok, "{stderr}");
    let actual = documents(&stdout);
    assert_eq!(
        keys(&actual),
        keys(&expected),
        "the same objects in the same order"
    );
    for (a, e) in actual.iter().zip(&expected) {
        // Objects as large as a CRD: name the object, and show the two on a failure only.
        if a != e {
            panic!(
                "{} differs:\nteamgpu manifests: {a}\nkubectl kustomize: {e}",
                keys(std::slice::from_ref(e))[0]
            );
        }
    }
}

#[test]
fn manifests_hold_the_install_and_run_the_image_asked_for() {
    let (ok, stdout, stderr) = teamgpu(&["manifests"]);
    assert!(ok, "{stderr}");
    let docs = documents(&stdout);
    let kinds: Vec<&str> = docs.iter().filter_map(|d| d["kind"].as_str()).collect();
    assert_eq!(
        kinds,
        [
            "Namespace",
            "CustomResourceDefinition",
            "CustomResourceDefinition",
            "ServiceAccount",
            "Role",
            "ClusterRole",
            "ClusterRole",
            "ClusterRole",
            "ClusterRole",
            "RoleBinding",
            "ClusterRoleBinding",
            "Service",
            "Deployment",
            "NetworkPolicy"
        ]
    );
    let image = |docs: &[serde_json::Value]| {
        docs.iter()
            .find(|d| d["kind"] == "Deployment")
            .map(|d| d["spec"]["template"]["spec"]["containers"][0]["image"].clone())
            .unwrap()
    };
    assert_eq!(image(&docs), "ghcr.io/teamgpu/teamgpu:v0.1.0");
    let (ok, stdout, _) = teamgpu(&[
        "install",
        "--image",
        "registry.local:5000/teamgpu@sha256:0a",
    ]);
    assert!(ok);
    assert_eq!(
        image(&documents(&stdout)),
        "registry.local:5000/teamgpu@sha256:0a"
    );
}

#[test]
fn completion_scripts_know_the_subcommands() {
    for shell in ["bash", "zsh", "fish"] {
        let (ok, stdout, stderr) = teamgpu(&["completion", shell]);
        assert!(ok, "{shell}: {stderr}");
        for sub in [
            "plan",
            "top",
            "why",
            "manifests",
            "completion",
            "run",
            "crd",
        ] {
            assert!(stdout.contains(sub), "{shell} completion lacks {sub}");
        }
        assert!(
            stdout.contains("--live"),
            "{shell} completion lacks plan --live"
        );
    }
    let (ok, _, stderr) = teamgpu(&["completion", "tcsh"]);
    assert!(!ok);
    assert!(stderr.contains("invalid value 'tcsh'"), "{stderr}");
}

#[test]
fn installed_as_kubectl_teamgpu_it_is_a_kubectl_plugin() {
    if !kubectl_available("installed_as_kubectl_teamgpu_it_is_a_kubectl_plugin") {
        return;
    }
    let dir = temp_dir("plugin");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_teamgpu"), dir.join("kubectl-teamgpu")).unwrap();
    let path = format!(
        "{}:{}",
        dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let kubectl = |args: &[&str]| {
        let out = Command::new("kubectl")
            .args(args)
            .env("PATH", &path)
            // kubectl finds the plugin before it reads any kubeconfig.
            .env("KUBECONFIG", dir.join("none"))
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (ok, stdout, stderr) = kubectl(&["teamgpu", "--help"]);
    assert!(ok, "{stderr}");
    assert!(
        stdout.contains("Usage: kubectl teamgpu <COMMAND>"),
        "{stdout}"
    );
    let (ok, stdout, stderr) = kubectl(&["teamgpu", "plan"]);
    assert!(ok, "{stderr}");
    assert!(stdout.contains("ml-research   a100-80gb"), "{stdout}");
    let (ok, _, stderr) = kubectl(&["teamgpu", "plan", "--bogus"]);
    assert!(!ok);
    assert!(
        stderr.contains("Usage: kubectl teamgpu plan [OPTIONS]"),
        "{stderr}"
    );
    let (ok, _, stderr) = kubectl(&["teamgpu", "why", "--bogus"]);
    assert!(!ok);
    assert!(
        stderr.contains("Usage: kubectl teamgpu why [OPTIONS] <POD>"),
        "{stderr}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn plan_reads_stdin_for_dash() {
    let team = "apiVersion: teamgpu.io/v1alpha1\nkind: TeamGpuPolicy\nmetadata: {name: piped}\n\
                spec: {namespaces: [piped-ns], quotas: [{sharingPolicy: a100-80gb, guaranteed: 3}]}\n";
    let samples = concat!(env!("CARGO_MANIFEST_DIR"), "/../config/samples");
    let (ok, stdout, stderr) = teamgpu_with_stdin(&["plan", "-f", samples, "-f", "-"], team);
    assert!(ok, "{stderr}");
    let row: Vec<&str> = stdout
        .lines()
        .find(|l| l.starts_with("piped "))
        .unwrap_or_else(|| panic!("no row of the piped team: {stdout}"))
        .split_whitespace()
        .collect();
    // Team, sharing policy, guarantee and limit as piped in.
    assert_eq!(row[..4], ["piped", "a100-80gb", "3", "3"], "{stdout}");
    let (ok, _, stderr) = teamgpu_with_stdin(&["plan", "-f", "-"], "kind: [\n");
    assert!(!ok);
    assert!(stderr.contains("<stdin>: not valid YAML"), "{stderr}");
}

#[test]
fn plan_json_is_a_list_of_every_object_to_apply() {
    let (ok, stdout, _) = teamgpu(&["plan", "-o", "json"]);
    assert!(ok);
    let list: serde_json::Value = serde_json::from_str(&stdout).expect("valid JSON");
    assert_eq!(list["kind"], "List");
    let items = list["items"].as_array().unwrap();
    let (_, yaml, _) = teamgpu(&["plan", "-o", "yaml"]);
    assert!(
        items == &documents(&yaml),
        "-o json lists other objects than -o yaml"
    );
}

#[test]
fn commands_that_need_a_cluster_say_so_without_one() {
    let dir = temp_dir("no-cluster");
    for args in [&["top"][..], &["plan", "--live"], &["top", "-o", "json"]] {
        let out = Command::new(env!("CARGO_BIN_EXE_teamgpu"))
            .args(args)
            .env("KUBECONFIG", dir.join("missing-kubeconfig"))
            .env("HOME", &dir)
            .env_remove("KUBERNETES_SERVICE_HOST")
            .env("RUST_BACKTRACE", "0")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(
            stderr
                .starts_with("Error: connecting to the cluster of the current kubeconfig context"),
            "{args:?}: {stderr}"
        );
        assert!(!stderr.contains("panicked"), "{stderr}");
        assert!(out.stdout.is_empty());
    }
    // Refused connections: the request that failed is named.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let kubeconfig = dir.join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: c\nclusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:{port}\n    insecure-skip-tls-verify: true\nusers:\n- name: u\n  user:\n    token: t\ncontexts:\n- name: c\n  context:\n    cluster: c\n    user: u\n"
        ),
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_teamgpu"))
        .args(["top"])
        .env("KUBECONFIG", &kubeconfig)
        .env("RUST_BACKTRACE", "0")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.starts_with("Error: listing GpuSharingPolicies"),
        "{stderr}"
    );
    // A file that cannot be read fails before the cluster is asked.
    let (ok, _, stderr) = teamgpu(&["plan", "--live", "-f", "/nonexistent/policy.yaml"]);
    assert!(!ok);
    assert!(
        stderr.contains("reading /nonexistent/policy.yaml"),
        "{stderr}"
    );
    let (ok, _, stderr) = teamgpu(&["plan", "--operator-user", "x"]);
    assert!(!ok, "--operator-user needs --live");
    assert!(stderr.contains("--live"), "{stderr}");
    std::fs::remove_dir_all(&dir).ok();
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
            "ClusterRole",
            "ClusterRoleBinding",
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

#[test]
fn an_unknown_output_format_is_refused_with_the_ones_there_are() {
    for args in [
        &["plan", "-o", "xml"][..],
        &["top", "-o", "xml"],
        &["plan", "--live", "-o", "xml"],
        &["why", "pod/train-3", "-o", "xml"],
    ] {
        let (ok, stdout, stderr) = teamgpu(args);
        assert!(!ok, "{args:?}");
        assert!(stdout.is_empty(), "{args:?}: {stdout}");
        assert!(
            stderr.contains("invalid value 'xml'") && stderr.contains("table, yaml, json"),
            "{args:?}: {stderr}"
        );
    }
}

/// A kubeconfig whose cluster refuses connections, its context in `namespace` if given.
fn refusing_kubeconfig(dir: &Path, namespace: Option<&str>) -> PathBuf {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let namespace = namespace
        .map(|ns| format!("\n    namespace: {ns}"))
        .unwrap_or_default();
    let kubeconfig = dir.join(format!("kubeconfig-{port}"));
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: c\nclusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:{port}\n    insecure-skip-tls-verify: true\nusers:\n- name: u\n  user:\n    token: t\ncontexts:\n- name: c\n  context:\n    cluster: c\n    user: u{namespace}\n"
        ),
    )
    .unwrap();
    kubeconfig
}

#[test]
fn why_takes_a_pod_in_the_namespace_of_the_context_or_of_n() {
    let dir = temp_dir("why");
    let why = |args: &[&str], kubeconfig: &Path| {
        let out = Command::new(env!("CARGO_BIN_EXE_teamgpu"))
            .arg("why")
            .args(args)
            .env("KUBECONFIG", kubeconfig)
            .env("HOME", &dir)
            .env_remove("KUBERNETES_SERVICE_HOST")
            .env("RUST_BACKTRACE", "0")
            .output()
            .unwrap();
        assert!(out.stdout.is_empty(), "{args:?}");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    // What is not a Pod is refused before any cluster is asked.
    let (code, stderr) = why(&["deploy/train", "-n", "ml"], &dir.join("missing"));
    assert_eq!(code, Some(1), "{stderr}");
    assert_eq!(
        stderr,
        "Error: `deploy/train` is not a Pod: give pod/NAME (also pods/NAME, po/NAME or NAME)\n"
    );
    let (code, stderr) = why(&[], &dir.join("missing"));
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("<POD>"), "{stderr}");
    let (code, stderr) = why(&["pod/train-3"], &dir.join("missing"));
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.starts_with("Error: connecting to the cluster of the current kubeconfig context"),
        "{stderr}"
    );
    // The Pod is looked for in the context's namespace, `default` without one, or that of -n.
    let in_context = refusing_kubeconfig(&dir, Some("ml-dev"));
    let without = refusing_kubeconfig(&dir, None);
    for (args, kubeconfig, expected) in [
        (&["pod/train-3"][..], &in_context, "ml-dev/train-3"),
        (&["pods/train-3"], &without, "default/train-3"),
        (&["po/train-3", "-n", "ml"], &in_context, "ml/train-3"),
        (
            &["train-3", "--namespace", "ml", "-o", "json"],
            &without,
            "ml/train-3",
        ),
    ] {
        let (code, stderr) = why(args, kubeconfig);
        assert_eq!(code, Some(1), "{args:?}: {stderr}");
        assert!(
            stderr.starts_with(&format!("Error: reading pod {expected}: ")),
            "{args:?}: {stderr}"
        );
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
    std::fs::remove_dir_all(&dir).ok();
}
