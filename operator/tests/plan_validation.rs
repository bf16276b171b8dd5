//! `teamgpu plan -f` as the pre-merge check: it refuses what the API server refuses, with the
//! file, document, List item, object, field and the API server's words (the expected messages
//! are those a Kubernetes 1.36 API server gave for the same objects on
//! `kubectl apply --dry-run=server`), fails on warnings when asked, and reads real dumps.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{Value, json};

/// A fresh folder for one test.
fn temp_dir(name: &str) -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("teamgpu-validation-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Write `text` to `dir/name`.
fn put(dir: &Path, name: &str, text: impl AsRef<[u8]>) {
    std::fs::write(dir.join(name), text).unwrap();
}

struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

/// `teamgpu args` in folder `dir` (so that messages name files as the arguments do).
fn teamgpu(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Run {
    let out = Command::new(env!("CARGO_BIN_EXE_teamgpu"))
        .current_dir(dir)
        .args(args)
        .envs(env.iter().copied())
        .env("RUST_BACKTRACE", "0")
        .output()
        .expect("teamgpu runs");
    Run {
        code: out.status.code().expect("an exit code"),
        stdout: String::from_utf8_lossy(&out.stdout).into(),
        stderr: String::from_utf8_lossy(&out.stderr).into(),
    }
}

/// `teamgpu plan -f FILE` of `text` written to `name` in a fresh folder, plus `args`.
fn plan_text(test: &str, name: &str, text: &str, args: &[&str]) -> Run {
    let dir = temp_dir(test);
    put(&dir, name, text);
    let mut all = vec!["plan", "-f", name];
    all.extend_from_slice(args);
    let run = teamgpu(&dir, &all, &[]);
    std::fs::remove_dir_all(&dir).ok();
    run
}

/// The `error:` lines of standard error.
fn errors(run: &Run) -> Vec<&str> {
    run.stderr
        .lines()
        .filter_map(|l| l.strip_prefix("error: "))
        .collect()
}

/// What the API server adds when the OpenAPI checks fail: the CEL rules did not run.
const NOT_CHECKED: &str = "some validation rules were not checked because the object was invalid; correct the existing errors to complete validation";

const TEAM: &str =
    "apiVersion: teamgpu.io/v1alpha1\nkind: TeamGpuPolicy\nmetadata: {name: research}\n";
const SHARING: &str =
    "apiVersion: teamgpu.io/v1alpha1\nkind: GpuSharingPolicy\nmetadata: {name: a100}\n";

/// A TeamGpuPolicy `research` with `spec` is refused with exactly `expected` (file
/// `team.yaml`, document 0), exit 1, and nothing planned from it.
#[track_caller]
fn team_refused(test: &str, spec: &str, expected: &[&str]) {
    refused(
        test,
        &format!("{TEAM}spec:\n{spec}"),
        "TeamGpuPolicy/research",
        expected,
    );
}

#[track_caller]
fn sharing_refused(test: &str, spec: &str, expected: &[&str]) {
    refused(
        test,
        &format!("{SHARING}spec:\n{spec}"),
        "GpuSharingPolicy/a100",
        expected,
    );
}

#[track_caller]
fn refused(test: &str, text: &str, object: &str, expected: &[&str]) {
    let run = plan_text(test, "policy.yaml", text, &["-o", "yaml"]);
    assert_eq!(run.code, 1, "{}", run.stderr);
    let want: Vec<String> = expected
        .iter()
        .map(|e| format!("policy.yaml, document 0: {object}: {e}"))
        .collect();
    assert_eq!(errors(&run), want, "{}", run.stderr);
    assert!(
        run.stderr.contains("left out of the plan"),
        "{}",
        run.stderr
    );
    // Nothing to apply: a pipe into `kubectl apply` applies nothing.
    assert_eq!(run.stdout, "", "an invalid input prints no objects");
}

// ---------------------------------------------------------------------------------------------
// What the API server refuses

#[test]
fn a_limit_below_the_guarantee_is_refused_not_raised() {
    team_refused(
        "limit",
        "  namespaces: [ns]\n  quotas: [{sharingPolicy: a100, guaranteed: 4, limit: 2}]\n",
        &["spec.quotas[0]: Invalid value: limit must be at least guaranteed"],
    );
}

#[test]
fn a_lending_limit_above_the_guarantee_is_refused() {
    team_refused(
        "lending",
        "  namespaces: [ns]\n  quotas: [{sharingPolicy: a100, guaranteed: 4, lendingLimit: 6}]\n",
        &[
            "spec.quotas[0]: Invalid value: lendingLimit must be at most guaranteed: it says how much of the guarantee may be lent",
        ],
    );
}

#[test]
fn a_weight_above_1000_is_refused() {
    team_refused(
        "weight",
        "  namespaces: [ns]\n  weight: 5000\n",
        &[
            "spec.weight: Invalid value: 5000: spec.weight in body should be less than or equal to 1000",
            NOT_CHECKED,
        ],
    );
}

#[test]
fn the_same_sharing_policy_twice_is_refused() {
    team_refused(
        "twice",
        "  namespaces: [ns]\n  quotas: [{sharingPolicy: a100, guaranteed: 4}, {sharingPolicy: a100, guaranteed: 1}]\n",
        &["spec.quotas: Invalid value: each sharingPolicy may appear only once in quotas"],
    );
}

#[test]
fn kube_system_in_namespaces_is_refused() {
    team_refused(
        "kube-system",
        "  namespaces: [kube-system]\n",
        &[
            "spec.namespaces: Invalid value: system namespaces (kube-system, kube-public, kube-node-lease) cannot belong to a team",
        ],
    );
}

#[test]
fn an_empty_namespace_selector_is_refused() {
    team_refused(
        "empty-selector",
        "  namespaceSelector: {}\n",
        &[
            "spec.namespaceSelector: Invalid value: namespaceSelector must not be empty: an empty selector would claim every namespace",
        ],
    );
}

#[test]
fn vfio_with_time_slicing_is_refused() {
    sharing_refused(
        "vfio",
        "  selector: {deviceType: vfio}\n  sharing: {strategy: TimeSlicing}\n",
        &[
            "spec: Invalid value: vfio devices are passed through whole: sharing.strategy must be Exclusive",
        ],
    );
}

#[test]
fn min_memory_that_is_no_quantity_is_refused_and_no_device_class_is_printed() {
    sharing_refused(
        "min-memory",
        "  selector: {minMemory: lots}\n",
        &[
            "spec.selector.minMemory: Invalid value: minMemory must be a positive quantity such as 40Gi",
        ],
    );
}

#[test]
fn a_name_over_the_length_limit_is_refused() {
    let name = "a".repeat(47);
    refused(
        "long-name",
        &format!(
            "apiVersion: teamgpu.io/v1alpha1\nkind: GpuSharingPolicy\nmetadata: {{name: {name}}}\nspec: {{}}\n"
        ),
        &format!("GpuSharingPolicy/{name}"),
        &[
            "Invalid value: metadata.name must be at most 46 characters: it is part of the teamgpu.io/owner label of generated objects",
        ],
    );
    let name = "b".repeat(254);
    refused(
        "longer-name",
        &format!(
            "{}metadata: {{name: {name}}}\nspec: {{namespaces: [ns]}}\n",
            &TEAM[..TEAM.find("metadata").unwrap()]
        ),
        &format!("TeamGpuPolicy/{name}"),
        &[
            &format!(
                "metadata.name: Invalid value: \"{name}\": must be no more than 253 characters"
            ),
            NOT_CHECKED,
        ],
    );
}

#[test]
fn a_name_that_is_no_dns_subdomain_is_refused() {
    refused(
        "bad-name",
        "apiVersion: teamgpu.io/v1alpha1\nkind: TeamGpuPolicy\nmetadata: {name: Research_1}\nspec: {namespaces: [ns]}\n",
        "TeamGpuPolicy/Research_1",
        &[
            "metadata.name: Invalid value: \"Research_1\": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')",
            NOT_CHECKED,
        ],
    );
}

#[test]
fn misspelt_fields_are_refused_as_strict_field_validation_does() {
    team_refused(
        "misspelt",
        "  namespaces: [ns]\n  wieght: 3\n  quota: [{sharingPolicy: a100, guaranteed: 1}]\n",
        &["spec.quota: unknown field", "spec.wieght: unknown field"],
    );
}

#[test]
fn a_type_error_names_the_object_and_the_field() {
    team_refused(
        "type",
        "  namespaces: [ns]\n  weight: many\n",
        &[
            "spec.weight: Invalid value: \"string\": spec.weight in body must be of type integer: \"string\"",
            NOT_CHECKED,
        ],
    );
}

#[test]
fn every_item_of_a_list_and_every_file_is_reported() {
    let dir = temp_dir("list");
    let slice = |name: &str, device: Value| {
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": name},
               "spec": {"driver": "gpu.nvidia.com", "nodeName": name,
                        "pool": {"name": name, "generation": 1, "resourceSliceCount": 1},
                        "devices": [device]}})
    };
    let list = json!({"apiVersion": "v1", "kind": "List", "items": [
        slice("node-0", json!({"name": "gpu-0"})),
        slice("node-1", json!({"name": ["gpu-0"]})),
        slice("node-2", json!({"name": "gpu-0"})),
        {"apiVersion": "teamgpu.io/v1alpha1", "kind": "TeamGpuPolicy", "metadata": {"name": "t"},
         "spec": {"namespaces": ["ns"], "quotas": [{"sharingPolicy": "a100", "guaranteed": 2, "limit": 1}]}},
    ]});
    put(
        &dir,
        "cluster.yaml",
        serde_saphyr::to_string(&list).unwrap(),
    );
    put(&dir, "team.json", json!({"apiVersion": "teamgpu.io/v1alpha1", "kind": "TeamGpuPolicy", "metadata": {"name": "u"},
               "spec": {"namespaceSelector": {}}})
        .to_string());
    let run = teamgpu(&dir, &["plan", "-f", "."], &[]);
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert_eq!(
        errors(&run),
        [
            "./cluster.yaml, document 0, item 1: ResourceSlice/node-1: spec.devices[0].name: invalid type: sequence, expected a string",
            "./cluster.yaml, document 0, item 3: TeamGpuPolicy/t: spec.quotas[0]: Invalid value: limit must be at least guaranteed",
            "./team.json, document 0: TeamGpuPolicy/u: spec.namespaceSelector: Invalid value: namespaceSelector must not be empty: an empty selector would claim every namespace",
        ],
        "{}",
        run.stderr
    );
    assert!(
        run.stderr.contains("Error: 3 inputs are invalid"),
        "{}",
        run.stderr
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn valid_policies_plan_and_exit_0() {
    let text = format!(
        "{SHARING}spec: {{selector: {{minMemory: 40Gi}}}}\n---\n{TEAM}spec: {{namespaces: [ns], weight: 1000, quotas: [{{sharingPolicy: a100, guaranteed: 4, limit: 6, lendingLimit: 4}}]}}\n"
    );
    let run = plan_text("valid", "ok.yaml", &text, &[]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(errors(&run).is_empty(), "{}", run.stderr);
    assert!(
        run.stdout
            .contains("research  a100            4           6      1000"),
        "{}",
        run.stdout
    );
}

// ---------------------------------------------------------------------------------------------
// Warnings, conditions, duplicates

/// Two teams that claim the same namespace, a quota naming a missing policy, a guarantee above
/// the capacity, and a policy that matches nothing.
fn warned_inputs() -> String {
    let node = node_slice("gpu-node-1");
    format!(
        "{SHARING}spec: {{selector: {{productNames: [\"NVIDIA A100-PCIE-40GB\"]}}}}\n---\n\
         apiVersion: teamgpu.io/v1alpha1\nkind: GpuSharingPolicy\nmetadata: {{name: h100}}\nspec: {{selector: {{productNames: [H100]}}}}\n---\n\
         {TEAM}spec: {{namespaces: [shared], quotas: [{{sharingPolicy: a100, guaranteed: 12}}, {{sharingPolicy: missing, guaranteed: 1}}]}}\n---\n\
         apiVersion: teamgpu.io/v1alpha1\nkind: TeamGpuPolicy\nmetadata: {{name: vision}}\nspec: {{namespaces: [shared]}}\n---\n\
         apiVersion: v1\nkind: Namespace\nmetadata: {{name: shared}}\n---\n\
         {}",
        serde_saphyr::to_string(&node).unwrap()
    )
}

#[test]
fn fail_on_warnings_fails_on_each_kind_of_warning() {
    let text = warned_inputs();
    let run = plan_text("warned", "in.yaml", &text, &[]);
    assert_eq!(run.code, 0, "warnings alone pass: {}", run.stderr);
    let run = plan_text("warned-ci", "in.yaml", &text, &["--fail-on-warnings"]);
    assert_eq!(run.code, 1, "{}", run.stderr);
    let warnings: Vec<&str> = run
        .stderr
        .lines()
        .filter_map(|l| l.strip_prefix("warning: "))
        .collect();
    assert_eq!(
        warnings,
        [
            "GpuSharingPolicy h100 matches no device",
            "TeamGpuPolicy research names GpuSharingPolicy missing, which does not exist",
            "namespace shared is claimed by TeamGpuPolicies research, vision: it belongs to none of them",
            "sharing policy a100: guarantees add up to 12 devices but the pool has 8 (4 too many): effective guarantees scaled down in proportion",
        ],
        "{}",
        run.stderr
    );
    assert!(
        run.stderr
            .contains("Error: 4 warnings, and --fail-on-warnings was given"),
        "{}",
        run.stderr
    );
}

#[test]
fn a_selector_that_does_not_compile_is_a_warning_with_the_expression_and_the_error() {
    let text = format!(
        "{SHARING}spec:\n  selector:\n    cel: [\"device.attributes['gpu.nvidia.com'].productName == \"]\n"
    );
    let run = plan_text("cel", "cel.yaml", &text, &[]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let expected = "GpuSharingPolicy a100: selector #2 `device.attributes['gpu.nvidia.com'].productName == ` is invalid: compilation failed:";
    assert!(
        run.stdout.contains(&format!("  - {expected}")),
        "{}",
        run.stdout
    );
    // The condition the operator would set, in the table.
    let condition = run
        .stdout
        .lines()
        .find(|l| l.contains("GpuSharingPolicy/a100") && l.contains("SelectorValid"))
        .unwrap_or_else(|| panic!("no SelectorValid condition: {}", run.stdout));
    let cells: Vec<&str> = condition.split_whitespace().collect();
    assert_eq!(
        cells[..4],
        [
            "GpuSharingPolicy/a100",
            "SelectorValid",
            "False",
            "InvalidSelector"
        ]
    );
    assert!(
        condition.contains("productName == ` is invalid"),
        "{condition}"
    );
    let run = plan_text("cel-ci", "cel.yaml", &text, &["--fail-on-warnings"]);
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert!(
        run.stderr.contains(&format!("warning: {expected}")),
        "{}",
        run.stderr
    );
}

#[test]
fn the_table_shows_the_conditions_the_operator_would_set() {
    let run = plan_text("conditions", "in.yaml", &warned_inputs(), &[]);
    let rows: Vec<Vec<&str>> = run
        .stdout
        .lines()
        .skip_while(|l| *l != "Conditions:")
        .skip(2)
        .take_while(|l| !l.is_empty())
        .map(|l| l.split_whitespace().take(4).collect())
        .collect();
    for row in [
        ["GpuSharingPolicy/a100", "Ready", "True", "Planned"],
        [
            "GpuSharingPolicy/h100",
            "DevicesFound",
            "False",
            "NoMatchingDevices",
        ],
        [
            "TeamGpuPolicy/research",
            "Conflict",
            "True",
            "NamespaceClaimedTwice",
        ],
        [
            "TeamGpuPolicy/research",
            "Overcommitted",
            "True",
            "GuaranteesScaledDown",
        ],
        [
            "TeamGpuPolicy/research",
            "SharingPoliciesResolved",
            "False",
            "SharingPolicyNotReady",
        ],
    ] {
        assert!(
            rows.iter().any(|r| r[..] == row),
            "no {row:?} in {}",
            run.stdout
        );
    }
}

#[test]
fn the_same_object_twice_keeps_the_later_with_a_note() {
    let dir = temp_dir("duplicate");
    put(
        &dir,
        "a.yaml",
        format!(
            "{TEAM}spec: {{namespaces: [ns], quotas: [{{sharingPolicy: a100, guaranteed: 1}}]}}\n"
        ),
    );
    put(
        &dir,
        "b.yaml",
        format!(
            "{TEAM}spec: {{namespaces: [ns], quotas: [{{sharingPolicy: a100, guaranteed: 3}}]}}\n"
        ),
    );
    let run = teamgpu(&dir, &["plan", "-f", "."], &[]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(
        run.stderr.contains(
            "note: ./b.yaml, document 0: TeamGpuPolicy/research replaces the one read at ./a.yaml, document 0"
        ),
        "{}",
        run.stderr
    );
    let rows: Vec<&str> = run
        .stdout
        .lines()
        .filter(|l| l.starts_with("research "))
        .collect();
    assert_eq!(rows.len(), 1, "{}", run.stdout);
    assert!(
        rows[0].starts_with("research  a100            3"),
        "{}",
        run.stdout
    );
    std::fs::remove_dir_all(&dir).ok();
}

// ---------------------------------------------------------------------------------------------
// Real dumps

/// The NVIDIA driver's 8-GPU node slice (the built-in example's), for node `node`.
fn node_slice(node: &str) -> Value {
    let fixture = include_str!("../src/cli/example/resourceslice-8gpu-node.yaml");
    let mut slice: Value = serde_saphyr::from_str(fixture).unwrap();
    slice["metadata"] = json!({"name": format!("{node}-gpu.nvidia.com-x")});
    slice["spec"]["nodeName"] = node.into();
    slice["spec"]["pool"]["name"] = node.into();
    for device in slice["spec"]["devices"].as_array_mut().unwrap() {
        let uuid = format!("GPU-{node}-{}", device["name"].as_str().unwrap());
        device["attributes"]["uuid"]["string"] = uuid.into();
    }
    slice
}

/// `kubectl get resourceslices -o yaml` of `nodes` 8-GPU nodes.
fn dump(nodes: usize) -> Value {
    let items: Vec<Value> = (0..nodes)
        .map(|i| node_slice(&format!("gpu-{i:05}")))
        .collect();
    json!({"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": ""}, "items": items})
}

fn samples() -> String {
    concat!(env!("CARGO_MANIFEST_DIR"), "/../config/samples").to_owned()
}

/// The row of team data-science on a100-shared (the samples' time-sliced A100 PCIe pool).
fn data_science_shared(stdout: &str) -> Vec<String> {
    stdout
        .lines()
        .find(|l| l.starts_with("data-science  a100-shared"))
        .unwrap_or_else(|| panic!("no data-science row: {stdout}"))
        .split_whitespace()
        .map(str::to_owned)
        .collect()
}

#[test]
fn a_list_of_5000_resource_slices_plans_as_yaml_and_as_json() {
    let dir = temp_dir("dump");
    let list = dump(5_000);
    put(
        &dir,
        "cluster.yaml",
        serde_saphyr::to_string(&list).unwrap(),
    );
    put(
        &dir,
        "cluster.json",
        serde_json::to_string_pretty(&list).unwrap(),
    );
    drop(list);
    for file in ["cluster.yaml", "cluster.json"] {
        let run = teamgpu(&dir, &["plan", "-f", &samples(), "-f", file], &[]);
        assert_eq!(run.code, 0, "{file}: {}", run.stderr);
        let row = data_science_shared(&run.stdout);
        // 5,000 nodes of 8 GPUs each; guarantee 4, limit 8, weight 1, capacity 40,000.
        assert_eq!(
            row[2..6],
            ["4", "8", "1", "40000"],
            "{file}: {}",
            run.stdout
        );
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_file_over_the_yaml_budget_is_too_large_with_the_limit_and_how_to_raise_it() {
    let dir = temp_dir("budget");
    put(
        &dir,
        "cluster.yaml",
        serde_saphyr::to_string(&dump(3)).unwrap(),
    );
    let args = ["plan", "-f", "cluster.yaml"];
    let run = teamgpu(&dir, &args, &[("TEAMGPU_MAX_YAML_NODES", "1000")]);
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert_eq!(
        errors(&run),
        [
            "cluster.yaml: too large: more than 1000 YAML nodes (raise the limit with --max-yaml-nodes or TEAMGPU_MAX_YAML_NODES)"
        ]
    );
    let raised = [&args[..], &["--max-yaml-nodes", "2000"]].concat();
    let run = teamgpu(&dir, &raised, &[("TEAMGPU_MAX_YAML_NODES", "1000")]);
    assert_eq!(run.code, 0, "the flag raises the limit: {}", run.stderr);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn json_files_in_folders_are_read() {
    let dir = temp_dir("json");
    std::fs::create_dir_all(dir.join("nodes")).unwrap();
    put(&dir, "nodes/gpu-1.json", node_slice("gpu-1").to_string());
    put(
        &dir,
        "nodes/gpu-2.json",
        serde_json::to_string_pretty(&node_slice("gpu-2")).unwrap(),
    );
    let run = teamgpu(&dir, &["plan", "-f", &samples(), "-f", "."], &[]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(data_science_shared(&run.stdout)[5], "16", "{}", run.stdout);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn symlink_loops_are_reported_and_a_folder_reached_twice_is_read_once() {
    let dir = temp_dir("loops");
    let nodes = dir.join("nodes");
    std::fs::create_dir_all(&nodes).unwrap();
    put(&nodes, "gpu-1.json", node_slice("gpu-1").to_string());
    std::os::unix::fs::symlink(&dir, nodes.join("up")).unwrap();
    std::os::unix::fs::symlink(&nodes, nodes.join("here")).unwrap();
    std::os::unix::fs::symlink(&nodes, dir.join("same-nodes")).unwrap();
    let started = std::time::Instant::now();
    let run = teamgpu(&dir, &["plan", "-f", &samples(), "-f", "."], &[]);
    assert!(
        started.elapsed() < std::time::Duration::from_secs(30),
        "it must not hang"
    );
    assert_eq!(run.code, 0, "{}", run.stderr);
    let real = |p: &Path| p.canonicalize().unwrap().display().to_string();
    for (link, target) in [("./nodes/here", &nodes), ("./nodes/up", &dir)] {
        let note = format!(
            "note: {link}: skipped, a symlink loop back to {}",
            real(target)
        );
        assert!(run.stderr.contains(&note), "no {note:?} in {}", run.stderr);
    }
    assert!(
        run.stderr.contains("note: ./same-nodes: folder read once"),
        "{}",
        run.stderr
    );
    // The one node's 8 GPUs, counted once.
    assert_eq!(data_science_shared(&run.stdout)[5], "8", "{}", run.stdout);
    std::fs::remove_dir_all(&dir).ok();
}
