use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use std::collections::BTreeSet;

use super::*;
use crate::core::diff::{Kind, ObjectKey};
use crate::core::effects::{FailedWrite, Failure, Refusals, applied_statuses};
use crate::core::state::ClusterState;

/// The metrics of the built-in example's plan and of the statuses written from it, with
/// `refusals` of its objects.
fn exported(state: &ClusterState, refusals: &mut Refusals) -> String {
    observed(&Metrics::default(), state, refusals)
}

/// [`exported`], by `metrics` that may have observed other passes before.
fn observed(metrics: &Metrics, state: &ClusterState, refusals: &mut Refusals) -> String {
    let plan = crate::core::plan::plan(state);
    let refused = refusals.of_policies(&plan);
    let now = Time(Timestamp::from_second(1_000).unwrap());
    let statuses = applied_statuses(&plan, &state.sharing_policies, &state.teams, &refused, &now);
    metrics.observe(&plan, &statuses);
    metrics.encode()
}

#[test]
fn each_pass_shows_its_own_numbers_and_a_team_gone_loses_its_series() {
    let metrics = Metrics::default();
    let state = crate::cli::example::state().unwrap();
    let series = "teamgpu_team_guaranteed_devices{team=\"inference\",";
    let first = observed(&metrics, &state, &mut Refusals::default());
    assert!(first.contains(series), "{first}");
    // The same pass again: the same series, not none.
    let again = observed(&metrics, &state, &mut Refusals::default());
    assert_eq!(again, first);
    // One number moved: that series shows it, the others are as they were.
    let mut fewer = state.clone();
    for team in &mut fewer.teams {
        if team.metadata.name.as_deref() == Some("inference") {
            team.spec.quotas[0].guaranteed = crate::api::Amount::Devices(10);
        }
    }
    let moved = observed(&metrics, &fewer, &mut Refusals::default());
    let line = "teamgpu_team_guaranteed_devices{team=\"inference\",department=\"\",sharing_policy=\"a100-80gb\"}";
    assert!(has(&first, &format!("{line} 12")) && has(&moved, &format!("{line} 10")));
    assert_eq!(moved.lines().count(), first.lines().count());
    let mut without = state.clone();
    (without.teams).retain(|t| t.metadata.name.as_deref() != Some("inference"));
    let gone = observed(&metrics, &without, &mut Refusals::default());
    assert!(!gone.contains(series), "{gone}");
    assert!(gone.contains("team=\"ml-research\""), "{gone}");
    // Back as it was: the series of the first pass (a family's order is a hash map's).
    let back = observed(&metrics, &state, &mut Refusals::default());
    let sorted = |text: &str| text.lines().map(str::to_owned).collect::<BTreeSet<_>>();
    assert_eq!(sorted(&back), sorted(&first));
}

fn has(text: &str, line: &str) -> bool {
    text.lines().any(|l| l == line)
}

#[test]
fn a_plan_becomes_series_a_dashboard_and_alerts_can_read() {
    let state = crate::cli::example::state().unwrap();
    let text = exported(&state, &mut Refusals::default());
    for line in [
        "teamgpu_build_info{version=\"0.1.0\"} 1",
        "teamgpu_condition{kind=\"TeamGpuPolicy\",name=\"inference\",type=\"Ready\"} 1",
        "teamgpu_condition{kind=\"GpuSharingPolicy\",name=\"a100-80gb\",type=\"UsedOutsideTeams\"} 0",
        "teamgpu_sharing_policy_used_outside_teams_devices{sharing_policy=\"a100-80gb\"} 0",
        "teamgpu_team_effective_guarantee_devices{team=\"inference\",department=\"\",sharing_policy=\"a100-80gb\"} 12",
        "teamgpu_team_pending_devices{team=\"inference\",department=\"\",sharing_policy=\"a100-80gb\"} 0",
        // Whole GPUs: one GPU-equivalent each.
        "teamgpu_team_entitlement_gpu_equivalents{team=\"inference\",department=\"\",sharing_policy=\"a100-80gb\"} 16.0",
        "teamgpu_sharing_policy_capacity_gpu_equivalents{sharing_policy=\"a100-80gb\"} 32.0",
    ] {
        assert!(has(&text, line), "no {line:?} in\n{text}");
    }
}

#[test]
fn a_team_in_a_department_carries_it() {
    let mut state = crate::cli::example::state().unwrap();
    let department: crate::api::TeamGpuPolicy = serde_json::from_value(serde_json::json!({
        "apiVersion": "teamgpu.io/v1alpha1", "kind": "TeamGpuPolicy",
        "metadata": {"name": "research"},
        "spec": {"department": true,
                 "quotas": [{"sharingPolicy": "a100-80gb", "guaranteed": 16, "limit": 32}]}
    }))
    .unwrap();
    for team in &mut state.teams {
        if team.metadata.name.as_deref() == Some("ml-research") {
            team.spec.parent = Some("research".into());
        }
    }
    state.teams.push(department);
    let text = exported(&state, &mut Refusals::default());
    let series = "teamgpu_team_guaranteed_devices{team=\"ml-research\",department=\"research\",";
    assert!(text.lines().any(|l| l.starts_with(series)), "{text}");
}

#[test]
fn ready_is_0_while_a_write_of_the_team_is_refused_and_1_once_it_is_written() {
    let state = crate::cli::example::state().unwrap();
    let quota = ObjectKey {
        kind: Kind::ResourceQuota,
        namespace: Some("inference-prod".into()),
        name: "teamgpu".into(),
    };
    let mut refusals = Refusals::default();
    let denied = FailedWrite {
        key: quota.clone(),
        verb: "apply",
        message: "denied by a webhook".into(),
        failure: Failure::Refused,
    };
    refusals.record(&[denied], [], Timestamp::from_second(900).unwrap());
    let series = |team: &str, type_: &str| {
        format!("teamgpu_condition{{kind=\"TeamGpuPolicy\",name=\"{team}\",type=\"{type_}\"}}")
    };
    let refused = exported(&state, &mut refusals);
    for (line, why) in [
        (
            series("inference", "Ready") + " 0",
            "the refused team is not Ready",
        ),
        (
            series("inference", "Applied") + " 0",
            "its Applied condition is False",
        ),
        (
            series("ml-research", "Ready") + " 1",
            "another team is Ready",
        ),
    ] {
        assert!(has(&refused, &line), "{why}: no {line:?} in\n{refused}");
    }
    // The quota is written: Ready again, and no Applied condition to report.
    refusals.record(&[], [&quota], Timestamp::from_second(950).unwrap());
    let written = exported(&state, &mut refusals);
    let ready = series("inference", "Ready") + " 1";
    assert!(has(&written, &ready), "no {ready:?} in\n{written}");
    let applied = series("inference", "Applied");
    assert!(!written.contains(&applied), "{applied} in\n{written}");
}
