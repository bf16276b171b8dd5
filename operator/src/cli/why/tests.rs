//! The diagnosis of Pods shaped as the API server returns them; the expected text is written out.

use serde_json::json;

use super::render::ordinal;
use super::*;

mod fixtures;
use fixtures::*;

#[test]
fn the_argument_names_a_pod() {
    for arg in [
        "pod/train-3",
        "pods/train-3",
        "po/train-3",
        "Pod/train-3",
        "train-3",
    ] {
        assert_eq!(pod_name(arg), Ok("train-3"), "{arg}");
    }
    assert_eq!(
        pod_name("deploy/train").unwrap_err().to_string(),
        "`deploy/train` is not a Pod: give pod/NAME (also pods/NAME, po/NAME or NAME)"
    );
    assert!(matches!(pod_name("pod/"), Err(WhyError::NoName(_))));
    assert!(matches!(pod_name("pod/a/b"), Err(WhyError::NoName(_))));
}

/// ml-research is at its limit of 8 and its namespace's quota is full: the claim of train-3
/// (2 devices) was refused; two other pods of the team wait for the same class, one older.
fn quota_refused() -> Facts {
    let ml = team(
        "ml-research",
        &["ml", "ml-dev"],
        (4, 8, 8, 8, 8, 2),
        "4 guaranteed + 4 borrowed of 12 idle at weight 1/1; limit 8 reached",
        json!({"enabled": true}),
    );
    let inference = team(
        "inference",
        &["serve"],
        (12, 12, 12, 4, 4, 0),
        "12 guaranteed",
        json!(null),
    );
    Facts {
        pod: pod("ml", "train-3", "a100-x2", None, 60, 0),
        claims: vec![claim("ml", "train-1-gpu-8dk2q", "train-1", 8, true)],
        claims_of_every_team: false,
        templates: vec![template("ml", 1), template("ml", 2), template("ml-dev", 1)],
        quota: Some(quota("ml", 8, 8)),
        events: vec![event(
            "ml",
            "train-3",
            "FailedResourceClaimCreation",
            "resource_claim",
            REFUSED,
            4,
        )],
        teams: vec![inference, ml],
        sharing_policies: vec![sharing("a100")],
        team_pods: vec![
            pod("ml", "train-3", "a100-x2", None, 60, 0),
            pod("ml-dev", "sweep-0", "a100", None, 300, 0),
            pod("ml", "train-4", "a100-x2", None, 30, 0),
            // Waits for nothing of teamgpu's: not in the queue.
            from(
                json!({"metadata": {"name": "web", "namespace": "ml", "creationTimestamp": ago(900)},
                        "spec": {"containers": []}, "status": {"phase": "Pending"}}),
            ),
        ],
    }
}

#[test]
fn a_pod_whose_claim_quota_refused_waits_for_quota() {
    let why = diagnose(&quota_refused(), now());
    assert_eq!(why.verdict, Verdict::Quota);
    assert_eq!(
        text(&why),
        "pod ml/train-3 waits: quota\n\
         why:\n  \
         team: ml-research (namespace ml)\n  \
         claim gpu: template a100-x2: 2 devices of sharing policy a100 (a100.teamgpu.io), not created\n  \
         quota: ResourceQuota ml/teamgpu has no room: 8 of 8 a100.teamgpu.io devices used, the pod needs 2\n  \
         entitlement: ml-research is at its entitlement: requests 8 of 8 (guaranteed 4, limit 8); \
         4 guaranteed + 4 borrowed of 12 idle at weight 1/1; limit 8 reached\n  \
         who borrows: ml-research (this team) holds 8, 4 above its guarantee of 4\n  \
         reclaim: ml-research holds 8, not below min(guarantee, requested + pending) = 4: \
         reclaim does not act for it\n  \
         queue: 2nd of 3 pods waiting for a100.teamgpu.io in team ml-research\n  \
         event: FailedResourceClaimCreation from resource_claim, 4 times: "
            .to_owned()
            + REFUSED
            + "\n"
    );
}

#[test]
fn the_structured_diagnosis_has_the_same_facts() {
    let why = diagnose(&quota_refused(), now());
    let value = serde_json::to_value(&why).unwrap();
    assert_eq!(value["verdict"], "quota");
    assert_eq!(value["waiting"], true);
    assert_eq!(value["team"], "ml-research");
    assert_eq!(
        value["claims"],
        json!([{"name": "gpu", "template": "a100-x2", "state": "not-created",
                "deviceClass": "a100.teamgpu.io", "sharingPolicy": "a100", "devices": 2}])
    );
    assert_eq!(
        value["quota"],
        json!({"namespace": "ml", "name": "teamgpu", "deviceClass": "a100.teamgpu.io",
               "used": 8, "hard": 8, "needs": 2, "room": false})
    );
    assert_eq!(
        value["queue"],
        json!({"deviceClass": "a100.teamgpu.io", "position": 2, "of": 3})
    );
    assert_eq!(value["entitlement"]["atEntitlement"], true);
    assert_eq!(value["reclaim"]["below"], false);
}

#[test]
fn priority_goes_before_age_in_the_queue() {
    let mut facts = quota_refused();
    facts.pod = pod("ml", "train-3", "a100-x2", None, 60, 1000);
    let why = diagnose(&facts, now());
    assert_eq!(
        why.queue,
        Some(QueuePlace {
            device_class: "a100.teamgpu.io".into(),
            position: 1,
            of: 3
        })
    );
}

/// inference waits below its guarantee (6 of 8 allocated, a claim of 1 device unallocated)
/// while ml-research holds 10 with a guarantee of 4; the pool's 16 devices are all allocated.
/// Every team's claims were read, so who holds what comes from them.
fn unallocated() -> Facts {
    let inference = team(
        "inference",
        &["serve"],
        (8, 8, 8, 7, 6, 1),
        "8 guaranteed",
        json!({"enabled": true, "gracePeriodSeconds": 30}),
    );
    let ml = team(
        "ml-research",
        &["ml"],
        (4, 12, 10, 10, 10, 0),
        "4 guaranteed + 6 borrowed, in use",
        json!(null),
    );
    let waiting = pod("serve", "infer-7", "a100", Some("infer-7-gpu-x7k2p"), 20, 0);
    Facts {
        pod: waiting.clone(),
        claims: vec![
            claim("serve", "infer-0-gpu-aaaaa", "infer-0", 6, true),
            claim("serve", "infer-7-gpu-x7k2p", "infer-7", 1, false),
            claim("ml", "train-0-gpu-bbbbb", "train-0", 8, true),
            claim("ml", "train-1-gpu-ccccc", "train-1", 2, true),
        ],
        claims_of_every_team: true,
        templates: vec![template("serve", 1)],
        quota: Some(quota("serve", 8, 7)),
        events: vec![event(
            "serve",
            "infer-7",
            "FailedScheduling",
            "default-scheduler",
            "0/2 nodes are available: 2 cannot allocate all claims. preemption: 0/2 nodes are \
             available: 2 Preemption is not helpful for scheduling.",
            3,
        )],
        teams: vec![inference, ml],
        sharing_policies: vec![sharing("a100")],
        team_pods: vec![waiting],
    }
}

#[test]
fn an_unallocated_claim_waits_for_capacity_and_names_the_borrower_and_reclaim() {
    let why = diagnose(&unallocated(), now());
    assert_eq!(why.verdict, Verdict::Capacity);
    assert_eq!(
        text(&why),
        "pod serve/infer-7 waits: capacity\n\
         why:\n  \
         team: inference (namespace serve)\n  \
         claim gpu: claim infer-7-gpu-x7k2p from template a100: 1 device of sharing policy a100 (a100.teamgpu.io), not allocated\n  \
         capacity: sharing policy a100 has 16 devices for teams, 16 allocated, 0 free\n  \
         entitlement: inference requests 7 of its entitlement 8 (guaranteed 8, limit 8); 8 guaranteed\n  \
         who borrows: ml-research holds 10, 6 above its guarantee of 4\n  \
         reclaim: inference holds 6, below 8; grace 30 s, the oldest waiting pod has waited 20 s: \
         reclaim may evict borrowers in about 10 s\n  \
         queue: 1st of 1 pod waiting for a100.teamgpu.io in team inference\n  \
         event: FailedScheduling from default-scheduler, 3 times: 0/2 nodes are available: 2 \
         cannot allocate all claims. preemption: 0/2 nodes are available: 2 Preemption is not \
         helpful for scheduling.\n"
    );
}

#[test]
fn reclaim_that_is_off_or_left_to_the_operator_says_so() {
    let mut facts = unallocated();
    facts.teams[0].spec.reclaim = Some(from(json!({"enabled": false})));
    let why = diagnose(&facts, now());
    assert!(
        text(&why).contains(
            "\n  reclaim: inference holds 6, below 8, but reclaim is off for this team: it waits \
             until borrowers finish\n"
        ),
        "{}",
        text(&why)
    );
    facts.teams[0].spec.reclaim = None;
    let why = diagnose(&facts, now());
    assert!(
        text(&why).contains(
            "\n  reclaim: inference holds 6, below 8; the team sets no spec.reclaim.enabled, so \
             the operator's default (--reclaim) decides; if on, grace 120 s unless the \
             operator's --reclaim-grace-seconds says otherwise, the oldest waiting pod has \
             waited 20 s: reclaim may evict borrowers in about 100 s\n"
        ),
        "{}",
        text(&why)
    );
}

/// Without every team's claims, who holds what comes from the status.
#[test]
fn without_the_other_teams_claims_the_status_says_who_borrows() {
    let mut facts = unallocated();
    facts.claims_of_every_team = false;
    facts
        .claims
        .retain(|c| c.metadata.namespace.as_deref() == Some("serve"));
    // The status of ml-research says 10 allocated, as its claims did.
    let why = diagnose(&facts, now());
    assert_eq!(
        why.borrowers,
        [Borrower {
            team: "ml-research".into(),
            allocated: 10,
            effective_guarantee: 4,
            above: 6
        }]
    );
    assert_eq!(why.capacity.unwrap().allocated, 16);
}

#[test]
fn a_running_pod_is_not_waiting() {
    let mut facts = unallocated();
    let pod = &mut facts.pod;
    pod.spec.as_mut().unwrap().node_name = Some("gpu-node-1".into());
    pod.status.as_mut().unwrap().phase = Some("Running".into());
    facts.claims[1] = claim("serve", "infer-7-gpu-x7k2p", "infer-7", 1, true);
    let why = diagnose(&facts, now());
    assert_eq!((why.verdict, why.waiting), (Verdict::NotWaiting, false));
    assert_eq!(
        text(&why),
        "pod serve/infer-7 is not waiting: Running on node gpu-node-1\n"
    );
    let json = serde_json::to_value(&why).unwrap();
    assert_eq!(json["verdict"], "not-waiting");
    assert_eq!(json["node"], "gpu-node-1");
}

#[test]
fn a_pod_without_teamgpu_claims_does_not_wait_for_teamgpu() {
    let facts = Facts {
        pod: from(json!({"metadata": {"name": "web-0", "namespace": "ml"},
                         "spec": {"containers": []}, "status": {"phase": "Pending"}})),
        ..quota_refused()
    };
    let why = diagnose(&facts, now());
    assert_eq!(why.verdict, Verdict::NoTeamgpuClass);
    assert_eq!(
        text(&why),
        "pod ml/web-0 does not wait for teamgpu: it asks for no teamgpu DeviceClass\n"
    );
}

#[test]
fn a_pod_in_a_namespace_of_no_team_is_told_so() {
    let facts = Facts {
        pod: pod("scratch", "notebook", "a100", None, 5, 0),
        claims: Vec::new(),
        templates: Vec::new(),
        quota: None,
        events: vec![event(
            "scratch",
            "notebook",
            "FailedResourceClaimCreation",
            "resource_claim",
            "PodResourceClaim gpu: resource claim template \"a100\": resourceclaimtemplate.resource.k8s.io \"a100\" not found",
            1,
        )],
        ..quota_refused()
    };
    let why = diagnose(&facts, now());
    assert_eq!((why.verdict, why.waiting), (Verdict::NoTeam, true));
    assert_eq!(
        text(&why),
        "pod scratch/notebook waits: no team\n\
         why:\n  \
         team: namespace scratch belongs to no TeamGpuPolicy: teamgpu refuses claims of its \
         DeviceClasses here (ResourceQuota teamgpu-outside-teams, or its admission policy); \
         a platform admin can add the namespace to a team\n  \
         claim gpu: template a100: 1 device of sharing policy a100 (a100.teamgpu.io), missing\n  \
         event: FailedResourceClaimCreation from resource_claim: PodResourceClaim gpu: \
         resource claim template \"a100\": resourceclaimtemplate.resource.k8s.io \"a100\" not found\n"
    );
}

/// Two teams of one pool: alpha borrows 4 above its guarantee of 8, beta waits below its
/// guarantee with a claim not yet created although its quota has room (the controller retries).
#[test]
fn two_teams_where_one_borrows() {
    let alpha = team(
        "alpha",
        &["alpha"],
        (8, 16, 12, 12, 12, 0),
        "8 guaranteed + 4 borrowed, in use",
        json!(null),
    );
    let beta = team(
        "beta",
        &["beta"],
        (8, 8, 8, 2, 2, 1),
        "8 guaranteed",
        json!(null),
    );
    let waiting = pod("beta", "job-1", "a100", None, 45, 0);
    let facts = Facts {
        pod: waiting.clone(),
        claims: vec![
            claim("alpha", "a-0", "a-0", 8, true),
            claim("alpha", "a-1", "a-1", 4, true),
            claim("beta", "b-0", "b-0", 2, true),
        ],
        claims_of_every_team: true,
        templates: vec![template("beta", 1)],
        quota: Some(quota("beta", 8, 2)),
        events: Vec::new(),
        teams: vec![alpha, beta],
        sharing_policies: vec![sharing("a100")],
        team_pods: vec![waiting],
    };
    let why = diagnose(&facts, now());
    assert_eq!(why.verdict, Verdict::ClaimNotCreated);
    assert_eq!(
        why.borrowers,
        [Borrower {
            team: "alpha".into(),
            allocated: 12,
            effective_guarantee: 8,
            above: 4
        }]
    );
    let text = text(&why);
    assert!(
        text.contains("\n  quota: ResourceQuota beta/teamgpu has room now (the resourceclaim controller retries): 2 of 8 a100.teamgpu.io devices used, the pod needs 1\n"),
        "{text}"
    );
    assert!(
        text.contains("\n  who borrows: alpha holds 12, 4 above its guarantee of 8\n"),
        "{text}"
    );
    // min(8, 2 + 1) = 3 > 2 allocated: owed; the operator's default decides, grace 120 s.
    assert!(
        text.contains("reclaim may evict borrowers in about 75 s\n"),
        "{text}"
    );
}

#[test]
fn a_namespace_without_its_quota_is_not_held_back_by_quota() {
    let mut facts = quota_refused();
    facts.quota = None;
    facts.events.clear();
    let why = diagnose(&facts, now());
    assert_eq!(why.verdict, Verdict::ClaimNotCreated);
    assert!(
        text(&why).contains(
            "\n  quota: ResourceQuota ml/teamgpu does not limit a100.teamgpu.io (not written by \
             the operator yet?), the pod needs 2\n"
        ),
        "{}",
        text(&why)
    );
}

#[test]
fn a_missing_template_is_named() {
    let mut facts = quota_refused();
    facts.templates.clear();
    let why = diagnose(&facts, now());
    assert_eq!(why.verdict, Verdict::ClaimMissing);
    assert!(
        text(&why).contains("\n  claim gpu: template a100-x2: 2 devices of sharing policy a100 (a100.teamgpu.io), missing\n"),
        "{}",
        text(&why)
    );
}

#[test]
fn ordinals_read_as_english() {
    let words: Vec<String> = [1, 2, 3, 4, 11, 12, 13, 21, 22, 101, 111]
        .into_iter()
        .map(ordinal)
        .collect();
    assert_eq!(
        words,
        [
            "1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "21st", "22nd", "101st", "111th"
        ]
    );
}

#[test]
fn a_pending_pod_with_its_devices_allocated_does_not_wait_for_gpus() {
    let mut facts = unallocated();
    facts.claims[1] = claim("serve", "infer-7-gpu-x7k2p", "infer-7", 1, true);
    facts.events.clear();
    let why = diagnose(&facts, now());
    assert_eq!((why.verdict, why.waiting), (Verdict::Allocated, false));
    assert_eq!(
        text(&why),
        "pod serve/infer-7 does not wait for GPUs: its devices are allocated, the scheduler places it\n\
         why:\n  \
         team: inference (namespace serve)\n  \
         claim gpu: claim infer-7-gpu-x7k2p from template a100: 1 device of sharing policy a100 (a100.teamgpu.io), allocated\n"
    );
}

#[test]
fn a_team_without_quota_for_the_sharing_policy_has_no_entitlement() {
    let mut facts = unallocated();
    let status = facts.teams[0].status.as_mut().unwrap();
    status.quotas[0].sharing_policy = "h100".into();
    let why = diagnose(&facts, now());
    assert_eq!((why.verdict, why.waiting), (Verdict::NoEntitlement, true));
    assert!(
        text(&why).starts_with("pod serve/infer-7 waits: no entitlement\n"),
        "{}",
        text(&why)
    );
    assert!(
        text(&why).contains(
            "\n  entitlement: team inference has no quota for this sharing policy: teamgpu's \
             admission refuses its claims\n"
        ),
        "{}",
        text(&why)
    );
}
