//! The Argo CD health checks of `config/argocd/argocd-cm-health.yaml`, run as Argo CD runs them:
//! the Lua of `resource.customizations.health.<group>_<Kind>` with the live object as the global
//! `obj` (numbers as floats, as gopher-lua decodes JSON), returning `{status=..., message=...}`.
//! The statuses below are written here in the shape the operator writes them (status
//! `observedGeneration`, conditions Ready, Conflict, Overcommitted, ... and for a policy it cannot
//! read only `Ready=False, reason Malformed`); the expected health is the documented one.

use std::path::PathBuf;

use mlua::Lua;
use serde_json::{Value, json};

const TEAM_KEY: &str = "resource.customizations.health.teamgpu.io_TeamGpuPolicy";
const SHARING_KEY: &str = "resource.customizations.health.teamgpu.io_GpuSharingPolicy";
const APPLICATION_KEY: &str = "resource.customizations.health.argoproj.io_Application";

fn config_map() -> Value {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../config/argocd/argocd-cm-health.yaml");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    serde_saphyr::from_str(&text).expect("argocd-cm-health.yaml is one YAML document")
}

fn script(key: &str) -> String {
    config_map()["data"][key]
        .as_str()
        .unwrap_or_else(|| panic!("argocd-cm-health.yaml has no data key {key}"))
        .to_owned()
}

/// A JSON value as Argo CD hands it to Lua: objects and arrays as tables, numbers as floats,
/// absent (null) fields as nil.
fn to_lua(lua: &Lua, value: &Value) -> mlua::Result<mlua::Value> {
    Ok(match value {
        Value::Null => mlua::Value::Nil,
        Value::Bool(b) => mlua::Value::Boolean(*b),
        Value::Number(n) => mlua::Value::Number(n.as_f64().expect("finite")),
        Value::String(s) => mlua::Value::String(lua.create_string(s)?),
        Value::Array(items) => {
            let table = lua.create_table()?;
            for (i, item) in items.iter().enumerate() {
                table.set(i + 1, to_lua(lua, item)?)?;
            }
            mlua::Value::Table(table)
        }
        Value::Object(map) => {
            let table = lua.create_table()?;
            for (k, v) in map {
                table.set(k.as_str(), to_lua(lua, v)?)?;
            }
            mlua::Value::Table(table)
        }
    })
}

/// (status, message) that the check under `key` returns for `obj`.
fn health(key: &str, obj: &Value) -> (String, Option<String>) {
    let lua = Lua::new();
    lua.globals()
        .set("obj", to_lua(&lua, obj).expect("the object converts"))
        .expect("obj is set");
    let hs: mlua::Table = lua
        .load(script(key))
        .set_name(key)
        .eval()
        .unwrap_or_else(|e| panic!("{key} failed on {obj}: {e}"));
    (
        hs.get("status").expect("the result has a string status"),
        hs.get("message").expect("the message is a string or nil"),
    )
}

fn team(generation: i64, status: Option<Value>) -> Value {
    let mut obj = json!({
        "apiVersion": "teamgpu.io/v1alpha1",
        "kind": "TeamGpuPolicy",
        "metadata": {"name": "ml-research", "generation": generation, "uid": "0c1d"},
        "spec": {
            "namespaceSelector": {"matchLabels": {"teamgpu.io/team": "ml-research"}},
            "weight": 2,
            "quotas": [{"sharingPolicy": "a100-80gb", "guaranteed": 8, "limit": 16}],
        },
    });
    if let Some(status) = status {
        obj["status"] = status;
    }
    obj
}

fn condition(type_: &str, status: &str, reason: &str, message: &str, generation: i64) -> Value {
    json!({
        "type": type_, "status": status, "reason": reason, "message": message,
        "observedGeneration": generation, "lastTransitionTime": "2026-11-30T10:00:00Z",
    })
}

/// A planned team's status: Ready as given, no conflict, guarantees that fit.
fn team_status(observed: i64, ready: Value) -> Value {
    json!({
        "observedGeneration": observed,
        "namespaces": ["ml-research-dev", "ml-research-train"],
        "quotas": [{
            "sharingPolicy": "a100-80gb", "guaranteed": 8, "effectiveGuarantee": 8, "limit": 16,
            "weight": 2, "capacity": 32, "entitlement": 15, "borrowed": 7, "requested": 12,
            "allocated": 12, "pending": 0, "reserved": 0,
            "explanation": "8 guaranteed + 7 borrowed",
        }],
        "conditions": [
            condition("Conflict", "False", "NoConflict", "no namespace is claimed by another team", observed),
            condition("Overcommitted", "False", "GuaranteesFit", "every guarantee fits its pool's capacity", observed),
            ready,
            condition("SharingPoliciesResolved", "True", "AllFound", "every quota names a ready GpuSharingPolicy", observed),
        ],
    })
}

const PLANNED: &str = "quotas and templates planned in 2 namespaces";

/// The health both teamgpu kinds' checks give `obj` (they must agree: the kinds share the check).
fn teamgpu_health(obj: &Value) -> (String, Option<String>) {
    let team = health(TEAM_KEY, obj);
    assert_eq!(
        team,
        health(SHARING_KEY, obj),
        "the two kinds' checks disagree"
    );
    team
}

#[test]
fn the_patch_is_argo_cds_config_map_and_names_both_kinds() {
    let cm = config_map();
    assert_eq!(cm["apiVersion"], "v1");
    assert_eq!(cm["kind"], "ConfigMap");
    assert_eq!(cm["metadata"]["name"], "argocd-cm");
    assert_eq!(cm["metadata"]["namespace"], "argocd");
    for key in [TEAM_KEY, SHARING_KEY, APPLICATION_KEY] {
        assert!(cm["data"][key].is_string(), "missing {key}");
    }
}

#[test]
fn a_planned_ready_policy_is_healthy() {
    let ready = condition("Ready", "True", "Planned", PLANNED, 2);
    let obj = team(2, Some(team_status(2, ready)));
    assert_eq!(
        teamgpu_health(&obj),
        ("Healthy".to_owned(), Some(PLANNED.to_owned())),
    );
}

#[test]
fn a_policy_without_status_is_progressing() {
    let obj = team(1, None);
    let (status, message) = teamgpu_health(&obj);
    assert_eq!(status, "Progressing");
    assert!(message.is_some_and(|m| !m.is_empty()));
}

#[test]
fn a_status_of_an_older_generation_is_progressing_even_when_it_was_ready() {
    let ready = condition("Ready", "True", "Planned", PLANNED, 2);
    let obj = team(3, Some(team_status(2, ready)));
    assert_eq!(
        teamgpu_health(&obj),
        (
            "Progressing".to_owned(),
            Some("Waiting for teamgpu to plan generation 3 (status is of generation 2)".into())
        ),
    );
}

#[test]
fn a_conflict_is_degraded_with_its_message_even_while_ready() {
    let message = "namespace shared-ns is also claimed by inference (it belongs to no team until \
                   the overlap is resolved)";
    let ready = condition("Ready", "True", "Planned", PLANNED, 4);
    let mut status = team_status(4, ready);
    status["conditions"][0] = condition("Conflict", "True", "NamespaceClaimedTwice", message, 4);
    let obj = team(4, Some(status));
    assert_eq!(
        teamgpu_health(&obj),
        ("Degraded".to_owned(), Some(message.to_owned())),
    );
}

#[test]
fn a_conflict_reported_for_an_older_generation_waits_for_the_new_plan() {
    // The spec changed (perhaps to resolve the conflict): not Degraded until the operator says so.
    let ready = condition("Ready", "True", "Planned", PLANNED, 4);
    let mut status = team_status(4, ready);
    status["conditions"][0] = condition("Conflict", "True", "NamespaceClaimedTwice", "x", 4);
    let obj = team(5, Some(status));
    assert_eq!(health(TEAM_KEY, &obj).0, "Progressing");
}

#[test]
fn a_malformed_policy_is_degraded_with_the_operators_message() {
    // What the operator writes for a policy it cannot deserialize: only Ready, stamped with the
    // generation it read, and no status.observedGeneration.
    let message = "spec.quotas[0].guaranteed: invalid type: string \"eight\", expected u32";
    let status = json!({"conditions": [condition("Ready", "False", "Malformed", message, 7)]});
    let obj = team(7, Some(status));
    assert_eq!(
        teamgpu_health(&obj),
        ("Degraded".to_owned(), Some(message.to_owned())),
    );
}

#[test]
fn a_fixed_malformed_policy_is_progressing_until_the_operator_reads_it() {
    let status = json!({"conditions": [condition("Ready", "False", "Malformed", "bad", 7)]});
    let obj = team(8, Some(status));
    assert_eq!(teamgpu_health(&obj).0, "Progressing");
}

#[test]
fn a_team_not_ready_for_a_reason_that_waits_for_a_person_is_degraded_with_its_message() {
    // Each Ready=False reason of a team with the message the operator writes for it: none
    // changes until someone edits a policy or labels a namespace.
    for (reason, message) in [
        (
            "InvalidNamespaceSelector",
            "namespaceSelector: matchExpressions[0]: operator Exists takes no values",
        ),
        (
            "SharingPolicyNotReady",
            "no devices for a100-80gb: the GpuSharingPolicies are missing or not ready",
        ),
        (
            "NoNamespaces",
            "no namespace belongs to the team; listed namespaces not found: ml-research-dev",
        ),
        ("NoMembers", "no team names the department as its parent"),
        (
            "InvalidQuota",
            "quota for h100: 80Gi is an amount of memory, but sharing policy h100 does not cut memory slices: give a number of devices: these entries get no devices (a hard of 0; what runs keeps running)",
        ),
    ] {
        let ready = condition("Ready", "False", reason, message, 2);
        let obj = team(2, Some(team_status(2, ready)));
        assert_eq!(
            teamgpu_health(&obj),
            ("Degraded".to_owned(), Some(message.to_owned())),
            "{reason}"
        );
    }
}

#[test]
fn a_reason_that_waits_for_a_person_reported_for_an_older_generation_is_progressing() {
    // The spec changed (perhaps to name the right sharing policy): the new plan decides.
    let ready = condition(
        "Ready",
        "False",
        "SharingPolicyNotReady",
        "no devices for x",
        2,
    );
    let obj = team(3, Some(team_status(2, ready)));
    assert_eq!(teamgpu_health(&obj).0, "Progressing");
}

#[test]
fn a_policy_not_ready_for_any_other_reason_is_progressing_with_the_ready_message() {
    // A reason this check does not know (a later operator's, say) is not taken for final.
    let ready = condition(
        "Ready",
        "False",
        "Reconciling",
        "waiting for the first pass",
        2,
    );
    let obj = team(2, Some(team_status(2, ready)));
    assert_eq!(
        teamgpu_health(&obj),
        (
            "Progressing".to_owned(),
            Some("waiting for the first pass".into())
        )
    );
}

/// What the operator's `Applied` condition says of a quota the API server refuses.
const QUOTA_REFUSED: &str = "ResourceQuota ml-research-dev/teamgpu (apply) refused 3 times since \
                             2026-11-30T10:00:00Z: admission webhook \"quota.example.com\" \
                             denied the request: quotas are set by hand here";

/// `status` with the conditions the operator writes while the API server refuses a write of
/// the policy's objects, for generation `observed`: `Applied` (False, WriteRefused, `refused`)
/// and `Ready` False.
fn with_refused_write(mut status: Value, observed: i64, refused: &str) -> Value {
    let not_ready = "the API server refuses writes of this policy's objects: see condition Applied";
    let conditions = status["conditions"].as_array_mut().expect("conditions");
    conditions.retain(|c| c["type"] != "Ready");
    conditions.push(condition(
        "Applied",
        "False",
        "WriteRefused",
        refused,
        observed,
    ));
    conditions.push(condition(
        "Ready",
        "False",
        "WriteRefused",
        not_ready,
        observed,
    ));
    status
}

#[test]
fn a_team_whose_write_is_refused_is_degraded_with_the_applied_message() {
    let ready = condition("Ready", "True", "Planned", PLANNED, 2);
    let obj = team(
        2,
        Some(with_refused_write(team_status(2, ready), 2, QUOTA_REFUSED)),
    );
    assert_eq!(
        teamgpu_health(&obj),
        ("Degraded".to_owned(), Some(QUOTA_REFUSED.to_owned()))
    );
}

#[test]
fn a_refused_write_reported_for_an_older_generation_is_progressing() {
    // The spec changed (perhaps so that the object is no longer refused): the new plan decides.
    let ready = condition("Ready", "True", "Planned", PLANNED, 2);
    let obj = team(
        3,
        Some(with_refused_write(team_status(2, ready), 2, QUOTA_REFUSED)),
    );
    assert_eq!(teamgpu_health(&obj).0, "Progressing");
}

/// A planned sharing policy of generation 1 whose Ready is as given (the other conditions say
/// nothing is wrong).
fn sharing_policy(ready: Value) -> Value {
    json!({
        "apiVersion": "teamgpu.io/v1alpha1",
        "kind": "GpuSharingPolicy",
        "metadata": {"name": "a100-80gb", "generation": 1},
        "spec": {"selector": {"deviceType": "gpu"}, "sharing": {"strategy": "TimeSlicing"}},
        "status": {
            "observedGeneration": 1,
            "deviceClassName": "a100-80gb.teamgpu.io",
            "devices": 32, "allocated": 0, "usedOutsideTeams": 0,
            "conditions": [
                condition("DeviceClassConflict", "False", "Managed", "DeviceClass a100-80gb.teamgpu.io is managed by teamgpu", 1),
                ready,
            ],
        },
    })
}

#[test]
fn a_sharing_policy_not_ready_for_a_reason_that_waits_for_a_person_is_degraded() {
    for (reason, message) in [
        (
            "InvalidSelector",
            "the selector is invalid; the last applied DeviceClass is kept",
        ),
        (
            "SharingUnsupported",
            "sharing strategy TimeSlicing is only configured for driver gpu.nvidia.com",
        ),
        (
            "DeviceClassConflict",
            "DeviceClass a100-80gb.teamgpu.io belongs to someone else",
        ),
    ] {
        let obj = sharing_policy(condition("Ready", "False", reason, message, 1));
        assert_eq!(
            teamgpu_health(&obj),
            ("Degraded".to_owned(), Some(message.to_owned())),
            "{reason}"
        );
    }
    let planned = "DeviceClass a100-80gb.teamgpu.io selects 32 devices";
    let obj = sharing_policy(condition("Ready", "True", "Planned", planned, 1));
    assert_eq!(
        teamgpu_health(&obj),
        ("Healthy".to_owned(), Some(planned.to_owned()))
    );
}

#[test]
fn a_sharing_policy_whose_device_class_write_is_refused_is_degraded_with_the_applied_message() {
    let refused = "DeviceClass a100-80gb.teamgpu.io (apply) refused once since \
                   2026-11-30T10:00:00Z: deviceclasses.resource.k8s.io \"a100-80gb.teamgpu.io\" \
                   is forbidden: ValidatingAdmissionPolicy 'freeze' denied request";
    let planned = "DeviceClass a100-80gb.teamgpu.io selects 32 devices";
    let mut obj = sharing_policy(condition("Ready", "True", "Planned", planned, 1));
    obj["status"] = with_refused_write(obj["status"].take(), 1, refused);
    assert_eq!(
        health(SHARING_KEY, &obj),
        ("Degraded".to_owned(), Some(refused.to_owned()))
    );
}

#[test]
fn a_sharing_policy_whose_device_class_belongs_to_someone_else_is_degraded() {
    let message = "DeviceClass a100-80gb.teamgpu.io exists and is not managed by teamgpu; it is \
                   left alone";
    let obj = json!({
        "apiVersion": "teamgpu.io/v1alpha1",
        "kind": "GpuSharingPolicy",
        "metadata": {"name": "a100-80gb", "generation": 1},
        "spec": {"selector": {"deviceType": "gpu"}, "sharing": {"strategy": "Exclusive"}},
        "status": {
            "observedGeneration": 1,
            "deviceClassName": "a100-80gb.teamgpu.io",
            "conditions": [
                condition("DeviceClassConflict", "True", "NotManaged", message, 1),
                condition("DevicesFound", "True", "DevicesMatched", "32 devices match", 1),
                condition("Overlapping", "False", "NoOverlap", "no other GpuSharingPolicy matches the same devices", 1),
                condition("Ready", "False", "DeviceClassConflict", "DeviceClass a100-80gb.teamgpu.io belongs to someone else", 1),
                condition("SelectorValid", "True", "Compiled", "all selector expressions compile", 1),
            ],
        },
    });
    assert_eq!(
        health(SHARING_KEY, &obj),
        ("Degraded".to_owned(), Some(message.to_owned()))
    );
}

#[test]
fn an_application_reports_its_own_health_so_sync_waves_wait_for_it() {
    let synced = json!({
        "metadata": {"name": "teamgpu", "namespace": "argocd"},
        "status": {"health": {"status": "Healthy"}, "sync": {"status": "Synced"}},
    });
    assert_eq!(health(APPLICATION_KEY, &synced).0, "Healthy");
    let degraded = json!({
        "metadata": {"name": "teamgpu"},
        "status": {"health": {"status": "Degraded", "message": "Deployment teamgpu failed"}},
    });
    assert_eq!(
        health(APPLICATION_KEY, &degraded),
        (
            "Degraded".to_owned(),
            Some("Deployment teamgpu failed".into())
        )
    );
    let new = json!({"metadata": {"name": "teamgpu"}});
    assert_eq!(health(APPLICATION_KEY, &new).0, "Progressing");
}
