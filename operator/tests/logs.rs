//! `teamgpu run`'s logs as a Deployment's log shows them: stdout is a pipe. The operator is
//! pointed at an API server that is not there (a closed port on the loopback), so it logs its
//! start-up retries; each run is stopped after a moment.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// What `teamgpu run args` prints on stdout against a closed port, with `RUST_LOG` as given
/// (`None`: unset): up to the first line containing `until` (waited for up to a minute, so a
/// loaded machine only makes the test slower), or, without `until`, in 1.5 s.
fn logs(args: &[&str], rust_log: Option<&str>, until: Option<&str>) -> String {
    // One kubeconfig per run: tests run in parallel, and a file rewritten while another
    // teamgpu reads it makes that one fail at start-up with nothing on stdout.
    static RUNS: AtomicUsize = AtomicUsize::new(0);
    let run = RUNS.fetch_add(1, Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("teamgpu-logs-{}-{run}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let kubeconfig = dir.join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        "apiVersion: v1\nkind: Config\ncurrent-context: gone\n\
         clusters: [{name: gone, cluster: {server: 'https://127.0.0.1:1'}}]\n\
         users: [{name: gone, user: {token: not-a-token}}]\n\
         contexts: [{name: gone, context: {cluster: gone, user: gone}}]\n",
    )
    .unwrap();
    let mut command = Command::new(env!("CARGO_BIN_EXE_teamgpu"));
    command
        .args([
            "run",
            "--metrics-addr",
            "127.0.0.1:0",
            "--health-addr",
            "127.0.0.1:0",
        ])
        .args(args)
        .env("KUBECONFIG", &kubeconfig)
        .env_remove("RUST_LOG")
        .env_remove("NO_COLOR")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    if let Some(filter) = rust_log {
        command.env("RUST_LOG", filter);
    }
    let mut child = command.spawn().expect("teamgpu runs");
    let stdout = child.stdout.take().expect("stdout is piped");
    let (lines, received) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if lines.send(line).is_err() {
                break;
            }
        }
    });
    let deadline = Instant::now()
        + match until {
            Some(_) => Duration::from_secs(60),
            None => Duration::from_millis(1500),
        };
    let mut text = String::new();
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
        match received.recv_timeout(left) {
            Ok(line) => {
                text.push_str(&line);
                text.push('\n');
                if until.is_some_and(|u| line.contains(u)) {
                    break;
                }
            }
            Err(_) => break,
        }
    }
    child.kill().expect("teamgpu is still running");
    child.wait().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    text
}

#[test]
fn text_logs_to_a_pipe_carry_no_colour_codes() {
    let text = logs(&[], None, Some("start-up request failed; retrying"));
    assert!(
        text.contains("start-up request failed; retrying"),
        "no retry logged:\n{text}"
    );
    assert!(
        !text.contains("\x1b["),
        "ANSI escapes in piped logs:\n{text:?}"
    );
}

#[test]
fn json_logs_are_one_object_a_line() {
    let text = logs(
        &["--log-format", "json"],
        None,
        Some("start-up request failed"),
    );
    let lines: Vec<&str> = text.lines().collect();
    assert!(!lines.is_empty(), "no logs");
    for line in lines {
        let event: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        assert!(
            event["level"].is_string() && event["timestamp"].is_string(),
            "{line}"
        );
        assert!(!line.contains("\x1b["), "{line:?}");
    }
}

#[test]
fn kube_client_request_errors_follow_the_log_filter() {
    // By default each failed request is told once, by teamgpu, with what it does about it.
    let default = logs(&[], None, Some("WARN teamgpu::controller"));
    assert!(default.contains("WARN teamgpu::controller"), "{default}");
    assert!(!default.contains("kube_client"), "{default}");
    // Asked for, kube-client's own lines are there.
    let asked = logs(
        &[],
        Some("info,kube_client=error"),
        Some("ERROR kube_client::client::builder"),
    );
    assert!(
        asked.contains("ERROR kube_client::client::builder"),
        "{asked}"
    );
    // And a filter that wants errors only hides teamgpu's warnings and kube-client's alike.
    let quiet = logs(&[], Some("error,kube_client=off"), None);
    assert!(quiet.trim().is_empty(), "{quiet}");
}
