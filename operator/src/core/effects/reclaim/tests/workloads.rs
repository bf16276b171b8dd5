//! What a workload is, and which claims it frees.

use super::*;

#[test]
fn a_pod_belongs_to_its_controller_its_label_or_itself() {
    let labels = |pairs: Value| pairs;
    let pods = [
        pod("b", "train-0", Some(("Job", "train")), json!({}), json!({})),
        pod("b", "train-1", Some(("Job", "train")), json!({}), json!({})),
        pod(
            "b",
            "web-x",
            Some(("ReplicaSet", "web")),
            json!({}),
            json!({}),
        ),
        pod(
            "b",
            "db-0",
            Some(("StatefulSet", "db")),
            json!({}),
            json!({}),
        ),
        pod("b", "solo", None, json!({}), json!({})),
        pod(
            "b",
            "sweep-a",
            None,
            labels(json!({"teamgpu.io/workload": "sweep"})),
            json!({}),
        ),
        pod(
            "b2",
            "sweep-b",
            Some(("Job", "other")),
            labels(json!({"teamgpu.io/workload": "sweep"})),
            json!({}),
        ),
        pod(
            "b",
            "js-0",
            Some(("Job", "js-workers-0")),
            labels(json!({"jobset.sigs.k8s.io/jobset-name": "js"})),
            json!({}),
        ),
        pod(
            "b",
            "lws-0-1",
            Some(("StatefulSet", "lws-0")),
            labels(json!({"leaderworkerset.sigs.k8s.io/name": "lws",
                          "leaderworkerset.sigs.k8s.io/group-index": "0"})),
            json!({}),
        ),
    ];
    let keys: Vec<String> = views(&pods)
        .iter()
        .map(|p| match &p.workload {
            WorkloadKey::Labelled(l) => format!("label {l}"),
            WorkloadKey::Owner { kind, name } => format!("{kind} {name}"),
            WorkloadKey::Alone => "alone".into(),
        })
        .collect();
    assert_eq!(
        keys,
        [
            "Job train",
            "Job train",
            "alone",
            "alone",
            "alone",
            "label sweep",
            "label sweep",
            "JobSet js",
            "LeaderWorkerSet lws/0"
        ]
    );
}

/// Only a `batch/v1` Job is suspended instead of evicted: a JobSet manages its Jobs' `suspend`
/// itself, a labelled workload may span several Jobs, and another group's `Job` (Volcano's)
/// has no such field.
#[test]
fn only_the_pods_of_one_batch_job_are_taken_back_by_suspending_it() {
    let volcano = json!({"metadata": {"ownerReferences": [{"apiVersion": "batch.volcano.sh/v1alpha1",
        "kind": "Job", "name": "vc", "uid": "v", "controller": true}]}});
    let pods = views(&[
        pod("b", "train-0", Some(("Job", "train")), json!({}), json!({})),
        pod("b", "train-1", Some(("Job", "train")), json!({}), json!({})),
        pod("b", "vc-0", None, json!({}), volcano),
        pod(
            "b",
            "js-0",
            Some(("Job", "js-workers-0")),
            json!({"jobset.sigs.k8s.io/jobset-name": "js"}),
            json!({}),
        ),
        pod(
            "b",
            "sweep-0",
            Some(("Job", "sweep-0")),
            json!({"teamgpu.io/workload": "sweep"}),
            json!({}),
        ),
        pod("b", "solo", None, json!({}), json!({})),
    ]);
    let claims = [
        claim("b", "train-0-gpu", 2, &["train-0"]),
        claim("b", "train-1-gpu", 2, &["train-1"]),
        claim("b", "vc-0-gpu", 1, &["vc-0"]),
        claim("b", "js-0-gpu", 1, &["js-0"]),
        claim("b", "sweep-0-gpu", 1, &["sweep-0"]),
        claim("b", "solo-gpu", 1, &["solo"]),
    ];
    let team = ["b".to_owned()];
    let mut found: Vec<(String, Option<String>)> =
        workloads(&pods, &claims, &team, (CLASS, &|_| None))
            .into_iter()
            .map(|w| (w.name, w.job.as_deref().map(str::to_owned)))
            .collect();
    found.sort();
    assert_eq!(
        found,
        [
            ("Job b/train".to_owned(), Some("train".to_owned())),
            ("Job.batch.volcano.sh b/vc".to_owned(), None),
            ("JobSet b/js".to_owned(), None),
            ("Pod b/solo".to_owned(), None),
            ("workload sweep".to_owned(), None),
        ]
    );
}

#[test]
fn a_workload_frees_the_claims_only_its_pods_hold() {
    let pods = views(&[
        pod("b", "train-0", Some(("Job", "train")), json!({}), json!({})),
        pod("b", "train-1", Some(("Job", "train")), json!({}), json!({})),
        // A launcher Pod without GPUs goes with its Job.
        pod(
            "b",
            "train-launcher",
            Some(("Job", "train")),
            json!({}),
            json!({}),
        ),
        pod("b", "solo", None, json!({}), json!({})),
        pod("b", "helper", None, json!({}), json!({})),
        pod(
            "b",
            "sweep-a",
            None,
            json!({"teamgpu.io/workload": "sweep"}),
            json!({}),
        ),
        pod(
            "b2",
            "sweep-b",
            None,
            json!({"teamgpu.io/workload": "sweep"}),
            json!({}),
        ),
        // Another team's Pod with the same label is not part of it.
        pod(
            "o",
            "sweep-c",
            None,
            json!({"teamgpu.io/workload": "sweep"}),
            json!({}),
        ),
    ]);
    let claims = [
        claim("b", "train-0-gpu", 4, &["train-0"]),
        claim("b", "train-1-gpu", 4, &["train-1"]),
        // Shared with a Pod of another workload: evicting one of them frees nothing.
        claim("b", "shared", 2, &["solo", "helper"]),
        claim("b", "solo-gpu", 1, &["solo"]),
        claim("b", "sweep-a-gpu", 2, &["sweep-a"]),
        claim("b2", "sweep-b-gpu", 2, &["sweep-b"]),
        claim("o", "sweep-c-gpu", 8, &["sweep-c"]),
    ];
    let team = ["b".to_owned(), "b2".to_owned()];
    let found: Vec<(String, u64, usize)> = workloads(&pods, &claims, &team, (CLASS, &|_| None))
        .into_iter()
        .map(|w| (w.name, w.devices, w.pods.len()))
        .collect();
    assert_eq!(
        found,
        [
            ("workload sweep".to_owned(), 4, 2),
            ("Job b/train".to_owned(), 8, 3),
            ("Pod b/solo".to_owned(), 1, 1),
        ]
    );
    assert_eq!(label_elsewhere(&pods, &team, "sweep"), ["o"]);
    assert!(workloads(&pods, &claims, &team, ("other.teamgpu.io", &|_| None)).is_empty());
}

#[test]
fn a_pod_moves_only_if_a_controller_makes_it_again_and_nothing_ties_it_to_nodes() {
    let pods = views(&[
        pod("b", "job-0", Some(("Job", "job")), json!({}), json!({})),
        pod(
            "b",
            "web-x",
            Some(("ReplicaSet", "web")),
            json!({}),
            json!({}),
        ),
        pod("b", "bare", None, json!({}), json!({})),
        pod(
            "b",
            "selected",
            Some(("Job", "selected")),
            json!({}),
            json!({"spec": {"nodeSelector": {"pool": "a100"}}}),
        ),
        pod(
            "b",
            "affine",
            Some(("Job", "affine")),
            json!({}),
            json!({"spec": {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]}}}}}),
        ),
    ]);
    let movable: Vec<(&str, bool)> = pods.iter().map(|p| (&*p.name, p.movable)).collect();
    assert_eq!(
        movable,
        [
            ("job-0", true),
            ("web-x", true),
            ("bare", false),
            ("selected", false),
            ("affine", false)
        ]
    );
}
