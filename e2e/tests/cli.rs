//! The command line against a real cluster: `teamgpu plan --live`, `teamgpu top` and `teamgpu
//! why`, run as the built binary with the admin's kubeconfig, while the operator (in-process, as
//! its own ServiceAccount) keeps the cluster converged. Expected values are written here or read
//! from the server, never computed by teamgpu's planning code.
//!
//! Needs the `teamgpu` binary of this tree: `cargo build -p teamgpu` first.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Pod, ResourceQuota};
use kube::api::{Api, PostParams};
use serde_json::{Value, json};
use teamgpu::api::{GpuSharingPolicy, TeamGpuPolicy};
use teamgpu_e2e::TestCluster;
use teamgpu_e2e::sandbox::Sandbox;

/// The quota key of the `pcie` sharing policy's DeviceClass.
const PCIE_DEVICES: &str = "pcie.teamgpu.io.deviceclass.resource.k8s.io/devices";

use teamgpu_e2e::fixtures::{gpu_pod, teamgpu_binary};
use teamgpu_e2e::operator::Operator;

/// Runs the binary with the admin's kubeconfig; `stdin` is piped in when given.
struct Cli {
    binary: PathBuf,
    kubeconfig: PathBuf,
}

impl Cli {
    /// Blocking, on a thread of its own: the operator goes on running meanwhile.
    async fn run(&self, args: &[&str], stdin: Option<&str>) -> (String, String) {
        let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
        let stdin = stdin.map(str::to_owned);
        let (binary, kubeconfig) = (self.binary.clone(), self.kubeconfig.clone());
        tokio::task::spawn_blocking(move || {
            let mut child = Command::new(&binary)
                .args(&args)
                .env("KUBECONFIG", &kubeconfig)
                .env("RUST_BACKTRACE", "0")
                .stdin(if stdin.is_some() {
                    Stdio::piped()
                } else {
                    Stdio::null()
                })
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("teamgpu starts");
            if let Some(input) = stdin {
                use std::io::Write;
                let mut pipe = child.stdin.take().expect("piped");
                pipe.write_all(input.as_bytes()).expect("stdin");
            }
            let out = child.wait_with_output().expect("teamgpu runs");
            let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
            let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
            assert!(
                out.status.success(),
                "teamgpu {args:?} failed: {stderr}\n{stdout}"
            );
            (stdout, stderr)
        })
        .await
        .expect("the command's thread")
    }

    /// A run that must fail: its standard error.
    async fn failing(&self, args: &[&str]) -> String {
        let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
        let (binary, kubeconfig) = (self.binary.clone(), self.kubeconfig.clone());
        tokio::task::spawn_blocking(move || {
            let out = Command::new(&binary)
                .args(&args)
                .env("KUBECONFIG", &kubeconfig)
                .env("RUST_BACKTRACE", "0")
                .stdin(Stdio::null())
                .output()
                .expect("teamgpu runs");
            assert!(!out.status.success(), "teamgpu {args:?} succeeded");
            assert!(out.stdout.is_empty(), "teamgpu {args:?} printed to stdout");
            String::from_utf8_lossy(&out.stderr).into_owned()
        })
        .await
        .expect("the command's thread")
    }

    async fn json(&self, args: &[&str], stdin: Option<&str>) -> Value {
        let (stdout, _) = self.run(args, stdin).await;
        serde_json::from_str(&stdout)
            .unwrap_or_else(|e| panic!("{args:?}: not JSON ({e}): {stdout}"))
    }
}

/// Polls `check` until it gives `Some`, or fails after 20 s with the last state.
async fn eventually<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    let started = Instant::now();
    loop {
        match check().await {
            Ok(value) => return value,
            Err(last) if started.elapsed() > Duration::from_secs(20) => {
                panic!("{what}: not within 20 s; last: {last}")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

fn team_policy(namespace: &str, guaranteed: u32, limit: u32) -> Value {
    json!({"apiVersion": "teamgpu.io/v1alpha1", "kind": "TeamGpuPolicy",
           "metadata": {"name": "cli"},
           "spec": {"namespaces": [namespace],
                    "quotas": [{"sharingPolicy": "pcie", "guaranteed": guaranteed, "limit": limit}]}})
}

/// A cluster of the example's devices, sharing policy `pcie` and a team in a namespace of its own.
struct PcieTeam {
    cli: Cli,
    sandbox: Sandbox,
    /// The team's namespace.
    ns: String,
    /// For the operator, which the test starts.
    operator_client: kube::Client,
}

/// Six 8-GPU nodes, two of them (16 GPUs) A100 PCIe 40GB, which sharing policy `pcie` selects;
/// namespace `namespace` (as the sandbox names it) and the team `team` makes of it.
async fn pcie_team(namespace: &str, team: impl FnOnce(&str) -> Value) -> Option<PcieTeam> {
    let cluster = TestCluster::start_or_skip().await?;
    let cli = Cli {
        binary: teamgpu_binary(),
        kubeconfig: cluster.kubeconfig().to_owned(),
    };
    let operator_client = kube::Client::try_from(cluster.operator_config().await.unwrap()).unwrap();
    let sandbox = Sandbox::start(cluster)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let client = sandbox.client();
    let example = teamgpu::cli::example::state().unwrap();
    sandbox
        .devices(&example.device_classes, &example.slices)
        .await
        .unwrap();
    let ns = sandbox.namespace(namespace, None).await.unwrap();
    let sharing: GpuSharingPolicy = serde_json::from_value(json!({
        "apiVersion": "teamgpu.io/v1alpha1", "kind": "GpuSharingPolicy",
        "metadata": {"name": "pcie"},
        "spec": {"selector": {"productNames": ["NVIDIA A100-PCIE-40GB"]}}}))
    .unwrap();
    Api::<GpuSharingPolicy>::all(client.clone())
        .create(&PostParams::default(), &sharing)
        .await
        .unwrap();
    let team: TeamGpuPolicy = serde_json::from_value(team(&ns)).unwrap();
    Api::<TeamGpuPolicy>::all(client)
        .create(&PostParams::default(), &team)
        .await
        .unwrap();
    Some(PcieTeam {
        cli,
        sandbox,
        ns,
        operator_client,
    })
}

/// The row of team `cli` and sharing policy `pcie`.
fn cli_row(rows: &Value) -> &Value {
    rows.as_array()
        .and_then(|rows| {
            rows.iter()
                .find(|r| r["team"] == "cli" && r["sharingPolicy"] == "pcie")
        })
        .unwrap_or_else(|| panic!("no row of cli/pcie in {rows}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plan_live_and_top_read_the_cluster() {
    let Some(PcieTeam {
        cli,
        sandbox,
        ns,
        operator_client,
    }) = pcie_team("cli", |ns| team_policy(ns, 4, 8)).await
    else {
        return;
    };
    let client = sandbox.client();

    let operator = Operator::start(operator_client, Operator::test_config());
    // The only team of 16 idle GPUs: its guarantee of 4, and 4 borrowed up to its limit of 8.
    let quotas: Api<ResourceQuota> = Api::namespaced(client.clone(), &ns);
    eventually("the quota of the team namespace", || async {
        let q = quotas.get_opt("teamgpu").await.map_err(|e| e.to_string())?;
        let hard = q
            .and_then(|q| q.spec)
            .and_then(|s| s.hard)
            .unwrap_or_default();
        match hard.get(PCIE_DEVICES) {
            Some(n) if n.0 == "8" => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    let tgp: Api<TeamGpuPolicy> = Api::all(client.clone());
    let status = eventually("the team's status", || async {
        let t = tgp.get("cli").await.map_err(|e| e.to_string())?;
        let status = t.status.ok_or("no status")?;
        let ready = status
            .conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True");
        match status.quotas.first() {
            Some(q) if ready && q.capacity == 16 && q.entitlement == 8 => Ok(q.clone()),
            other => Err(format!("ready {ready}, {other:?}")),
        }
    })
    .await;
    let gsp: Api<GpuSharingPolicy> = Api::all(client.clone());
    eventually("the sharing policy's status", || async {
        let p = gsp.get("pcie").await.map_err(|e| e.to_string())?;
        match p.status {
            Some(s) if s.devices == 16 => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;

    // Converged: nothing to write, and the numbers stay.
    let (table, _) = cli.run(&["plan", "--live"], None).await;
    assert!(table.starts_with("No object changes.\n"), "{table}");
    let what_if = cli.json(&["plan", "--live", "-o", "json"], None).await;
    assert_eq!(what_if["changes"], json!([]), "{what_if}");
    let unchanged = json!({"guaranteed": 4, "effectiveGuarantee": 4, "limit": 8,
                           "entitlement": 8, "borrowed": 4, "capacity": 16});
    let row = cli_row(&what_if["teams"]);
    assert_eq!((&row["before"], &row["after"]), (&unchanged, &unchanged));

    // A guarantee of 10 and a limit of 12: the team may use 12 of the 16 idle GPUs, so the
    // quota of its namespace goes from 8 to 12 devices; nothing else changes.
    let changed = serde_saphyr::to_string(&team_policy(&ns, 10, 12)).unwrap();
    let dir = std::env::temp_dir().join(format!("teamgpu-e2e-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("cli.yaml");
    std::fs::write(&file, &changed).unwrap();
    let what_if = cli
        .json(
            &["plan", "--live", "-f", file.to_str().unwrap(), "-o", "json"],
            None,
        )
        .await;
    let changes = what_if["changes"].as_array().unwrap();
    let listed: Vec<(&str, &str, &str, &str)> = changes
        .iter()
        .map(|c| {
            (
                c["action"].as_str().unwrap(),
                c["kind"].as_str().unwrap(),
                c["namespace"].as_str().unwrap_or(""),
                c["name"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        listed,
        [("update", "ResourceQuota", ns.as_str(), "teamgpu")]
    );
    assert_eq!(changes[0]["object"]["spec"]["hard"][PCIE_DEVICES], "12");
    let row = cli_row(&what_if["teams"]);
    assert_eq!(row["before"], unchanged);
    assert_eq!(
        row["after"],
        json!({"guaranteed": 10, "effectiveGuarantee": 10, "limit": 12,
               "entitlement": 12, "borrowed": 2, "capacity": 16})
    );
    // The same change piped in, shown as a table.
    let (table, _) = cli
        .run(&["plan", "--live", "-f", "-"], Some(&changed))
        .await;
    assert!(
        table.starts_with(&format!(
            "Object changes (1):\n  update resourcequota {ns}/teamgpu\n"
        )),
        "{table}"
    );
    let cells: Vec<&str> = table
        .lines()
        .find(|l| l.starts_with("cli "))
        .unwrap_or_else(|| panic!("no row of team cli: {table}"))
        .split("  ")
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .collect();
    assert_eq!(
        cells,
        [
            "cli", "pcie", "4 -> 10", "8 -> 12", "8 -> 12", "4 -> 2", "16", "*"
        ]
    );
    // Nothing was written: the quota is still the operator's 8.
    let hard = quotas
        .get("teamgpu")
        .await
        .unwrap()
        .spec
        .unwrap()
        .hard
        .unwrap();
    assert_eq!(hard[PCIE_DEVICES].0, "8");

    // `top` shows what the status says.
    let top = cli.json(&["top", "-o", "json"], None).await;
    let row = cli_row(&top["teams"]);
    assert_eq!(row["entitlement"], status.entitlement);
    assert_eq!(row["guaranteed"], status.guaranteed);
    assert_eq!(row["borrowed"], status.borrowed);
    assert_eq!(row["capacity"], status.capacity);
    assert_eq!(row["allocated"], 0);
    assert_eq!(
        top["sharingPolicies"],
        json!([{"name": "pcie", "deviceClass": "pcie.teamgpu.io", "devices": 16, "gpuEquivalentsPerDevice": "1", "usedOutsideTeams": 0}])
    );
    let (table, _) = cli.run(&["top"], None).await;
    let cells: Vec<&str> = table
        .lines()
        .find(|l| l.starts_with("cli "))
        .unwrap_or_else(|| panic!("no row of team cli: {table}"))
        .split_whitespace()
        .collect();
    // Team, sharing policy, guaranteed, entitlement, allocated, borrowed, pending, capacity,
    // then GPU-equivalents entitled and allocated (a whole device is 1).
    assert_eq!(
        cells,
        ["cli", "pcie", "4", "8", "0", "4", "0", "16", "8", "0"]
    );

    operator.stop().await;
    std::fs::remove_dir_all(&dir).ok();
}

/// A team of 2 devices (guarantee and limit) whose two Pods hold them: the next two Pods' claims
/// are refused by the namespace's quota, and `teamgpu why` says so, with their places in the
/// queue; a Pod that runs is not waiting, and a Pod that does not exist is an error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn why_says_a_pod_waits_for_quota_and_its_place_in_the_queue() {
    let Some(PcieTeam {
        cli,
        sandbox,
        ns,
        operator_client,
    }) = pcie_team("why", |ns| {
        let mut team = team_policy(ns, 2, 2);
        team["metadata"]["name"] = json!("why");
        team
    })
    .await
    else {
        return;
    };
    let client = sandbox.client();
    let operator = Operator::start(operator_client, Operator::test_config());

    let quotas: Api<ResourceQuota> = Api::namespaced(client.clone(), &ns);
    let devices = |which: &'static str| {
        let quotas = quotas.clone();
        async move {
            let q = quotas.get_opt("teamgpu").await.map_err(|e| e.to_string())?;
            let counts = q
                .and_then(|q| q.status)
                .and_then(|s| if which == "hard" { s.hard } else { s.used })
                .unwrap_or_default();
            match counts.get(PCIE_DEVICES) {
                Some(n) if n.0 == "2" => Ok(()),
                other => Err(format!("{which} {other:?}")),
            }
        }
    };
    eventually("the quota of the team namespace", || devices("hard")).await;
    let templates: Api<k8s_openapi::api::resource::v1::ResourceClaimTemplate> =
        Api::namespaced(client.clone(), &ns);
    eventually("the template pcie", || async {
        match templates.get_opt("pcie").await {
            Ok(Some(_)) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    for name in ["hold-0", "hold-1"] {
        pods.create(&PostParams::default(), &gpu_pod(name, "pcie"))
            .await
            .unwrap();
    }
    eventually("both devices in use", || devices("used")).await;
    // Creation timestamps have whole seconds: wait-1 is older than wait-2.
    pods.create(&PostParams::default(), &gpu_pod("wait-1", "pcie"))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1100)).await;
    pods.create(&PostParams::default(), &gpu_pod("wait-2", "pcie"))
        .await
        .unwrap();

    // The resourceclaim controller's refusal, as kube-controller-manager reports it.
    let why = eventually("the quota refusal of wait-2", || async {
        let why = cli
            .json(&["why", "pod/wait-2", "-n", &ns, "-o", "json"], None)
            .await;
        let refused = why["evidence"].as_array().is_some_and(|e| {
            e.iter().any(|e| {
                e["reason"] == "FailedResourceClaimCreation"
                    && e["message"]
                        .as_str()
                        .is_some_and(|m| m.contains("exceeded quota"))
            })
        });
        // The operator's status has counted the two claims.
        if why["verdict"] == "quota" && refused && why["entitlement"]["requested"] == 2 {
            Ok(why)
        } else {
            Err(why.to_string())
        }
    })
    .await;
    assert_eq!(why["waiting"], true, "{why}");
    assert_eq!(why["team"], "why", "{why}");
    assert_eq!(
        why["claims"],
        json!([{"name": "gpu", "template": "pcie", "state": "not-created",
                "deviceClass": "pcie.teamgpu.io", "sharingPolicy": "pcie", "devices": 1}])
    );
    assert_eq!(
        why["quota"],
        json!({"namespace": ns, "name": "teamgpu", "deviceClass": "pcie.teamgpu.io",
               "used": 2, "hard": 2, "needs": 1, "room": false})
    );
    assert_eq!(
        why["queue"],
        json!({"deviceClass": "pcie.teamgpu.io", "position": 2, "of": 2})
    );
    assert_eq!(why["entitlement"]["atEntitlement"], true, "{why}");
    let (yaml, _) = cli
        .run(&["why", "pod/wait-2", "-n", &ns, "-o", "yaml"], None)
        .await;
    let yaml: Value = serde_saphyr::from_str(&yaml).unwrap_or_else(|e| panic!("{e}: {yaml}"));
    assert_eq!(
        (&yaml["verdict"], &yaml["quota"], &yaml["queue"]),
        (&why["verdict"], &why["quota"], &why["queue"])
    );

    // The same as people read it, found by the namespace flag's long name.
    let (text, _) = cli.run(&["why", "wait-2", "--namespace", &ns], None).await;
    eprintln!("{text}");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], format!("pod {ns}/wait-2 waits: quota"), "{text}");
    assert_eq!(lines[1], "why:", "{text}");
    for expected in [
        format!("  team: why (namespace {ns})"),
        "  claim gpu: template pcie: 1 device of sharing policy pcie (pcie.teamgpu.io), not created".to_owned(),
        format!("  quota: ResourceQuota {ns}/teamgpu has no room: 2 of 2 pcie.teamgpu.io devices used, the pod needs 1"),
        "  queue: 2nd of 2 pods waiting for pcie.teamgpu.io in team why".to_owned(),
    ] {
        assert!(lines.contains(&expected.as_str()), "no line {expected:?} in:\n{text}");
    }
    assert!(
        lines.iter().any(|l| l.starts_with(
            "  entitlement: why is at its entitlement: requests 2 of 2 (guaranteed 2, limit 2)"
        )),
        "{text}"
    );
    let (text, _) = cli.run(&["why", "po/wait-1", "-n", &ns], None).await;
    assert!(
        text.contains("\n  queue: 1st of 2 pods waiting for pcie.teamgpu.io in team why\n"),
        "{text}"
    );

    // A Pod that holds its device is not waiting.
    let held = eventually("hold-0 runs", || async {
        let (text, _) = cli.run(&["why", "pods/hold-0", "-n", &ns], None).await;
        if text.contains("is not waiting: Running") {
            Ok(text)
        } else {
            Err(text)
        }
    })
    .await;
    assert!(
        held.starts_with(&format!("pod {ns}/hold-0 is not waiting: Running on node ")),
        "{held}"
    );

    // No such Pod: an error.
    let stderr = cli.failing(&["why", "pod/nope", "-n", &ns]).await;
    assert!(
        stderr.contains(&format!("pod {ns}/nope not found")),
        "{stderr}"
    );

    operator.stop().await;
}
