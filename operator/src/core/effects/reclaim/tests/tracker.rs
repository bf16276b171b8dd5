//! The reclaim tracker over passes: grace periods, minimum runtimes, Events.

use super::*;
use crate::core::effects::reclaim::budgets::BudgetView;

/// Team `owner` (namespace `o`, guaranteed 8) waits for 2 devices of sharing policy `a`;
/// `borrower` (namespace `b`, guaranteed 4) holds 12 in 4-device Jobs.
/// Team `name` of one `namespace`, holding `allocated` devices of sharing policy `a` with an
/// effective guarantee of `effective_guarantee`.
pub(super) fn team_report(
    name: &str,
    namespace: &str,
    allocated: u32,
    effective_guarantee: u32,
) -> TeamReport {
    TeamReport {
        department: None,
        name: name.into(),
        namespaces: vec![namespace.into()].into(),
        quotas: vec![QuotaStatus {
            sharing_policy: "a".into(),
            allocated,
            effective_guarantee,
            weight: 1,
            ..QuotaStatus::default()
        }],
        ..TeamReport::default()
    }
}

pub(super) fn plan() -> Plan {
    let team = team_report;
    Plan {
        teams: vec![team("owner", "o", 6, 8), team("borrower", "b", 12, 4)],
        reclaims: vec![order()],
        ..Plan::default()
    }
}

pub(super) fn order() -> ReclaimOrder {
    ReclaimOrder {
        sharing_policy: "a".into(),
        borrower: "borrower".into(),
        devices: 2,
        for_team: "owner".into(),
    }
}

pub(super) fn team(name: &str, reclaim: Value) -> TeamGpuPolicy {
    serde_json::from_value(json!({
        "apiVersion": "teamgpu.io/v1alpha1", "kind": "TeamGpuPolicy",
        "metadata": {"name": name, "uid": format!("u-{name}")},
        "spec": {"reclaim": reclaim}
    }))
    .unwrap()
}

/// Three 4-device Jobs of one Pod each, started an hour apart (j3 newest, 10:00).
pub(super) fn cluster() -> (Vec<Arc<PodView>>, Vec<Arc<ClaimView>>) {
    three_jobs(("j3-0", 10))
}

/// [`cluster`] with j3's Pod named and started at the hour `j3` says.
fn three_jobs(j3: (&str, u32)) -> (Vec<Arc<PodView>>, Vec<Arc<ClaimView>>) {
    let started = |h: u32| json!({"status": {"startTime": format!("2026-06-01T{h:02}:00:00Z")}});
    let pods = views(&[
        pod("b", "j1-0", Some(("Job", "j1")), json!({}), started(8)),
        pod("b", "j2-0", Some(("Job", "j2")), json!({}), started(9)),
        pod("b", j3.0, Some(("Job", "j3")), json!({}), started(j3.1)),
    ]);
    let claims = vec![
        claim("b", "j1-0-gpu", 4, &["j1-0"]),
        claim("b", "j2-0-gpu", 4, &["j2-0"]),
        claim("b", &format!("{}-gpu", j3.0), 4, &[j3.0]),
    ];
    (pods, claims)
}

const OFF: ReclaimDefaults = ReclaimDefaults {
    enabled: false,
    grace: Duration::from_secs(120),
    min_runtime: Duration::ZERO,
};

/// A tracker for the waiting team, from `t0`.
pub(super) struct Waiting {
    pub(super) teams: Vec<TeamGpuPolicy>,
    defaults: ReclaimDefaults,
    pub(super) tracker: ReclaimTracker,
    pub(super) t0: Instant,
    pub(super) budgets: Vec<Arc<BudgetView>>,
}

impl Waiting {
    /// The team opted in with a grace period of 30 s.
    pub(super) fn new() -> Self {
        Self::with(json!({"enabled": true, "gracePeriodSeconds": 30}), OFF)
    }

    /// The team says nothing of reclaim, and the operator's default is off.
    pub(super) fn off() -> Self {
        Self::with(json!({}), OFF)
    }

    /// The team's `spec.reclaim` is `reclaim`; the operator's defaults are `defaults`.
    fn with(reclaim: Value, defaults: ReclaimDefaults) -> Self {
        Waiting {
            teams: vec![team("owner", reclaim), team("borrower", json!({}))],
            defaults,
            tracker: ReclaimTracker::default(),
            t0: Instant::now(),
            budgets: Vec::new(),
        }
    }

    /// What a pass of `plan` at `secs` after `t0` (and after 12:00 on the wall) asks for.
    pub(super) fn reclaimed(&mut self, plan: &Plan, secs: u64) -> Reclaimed {
        self.reclaimed_in(plan, secs, cluster())
    }

    /// What a pass of `plan` at `secs` asks for with these Pods and claims.
    pub(super) fn reclaimed_in(
        &mut self,
        plan: &Plan,
        secs: u64,
        (pods, claims): (Vec<Arc<PodView>>, Vec<Arc<ClaimView>>),
    ) -> Reclaimed {
        let now = self.t0 + Duration::from_secs(secs);
        let wall = Timestamp::from_second(at(NOW).as_second() + secs as i64).unwrap();
        let input = ReclaimInput {
            plan,
            teams: &self.teams,
            claims: &claims,
            pods: &pods,
            budgets: &self.budgets,
        };
        self.tracker.evictions(input, self.defaults, now, wall)
    }

    /// The workloads evicted in a pass of `plan` at `secs` after `t0`.
    fn pass(&mut self, plan: &Plan, secs: u64) -> Vec<String> {
        let reclaimed = self.reclaimed(plan, secs);
        reclaimed
            .evictions
            .iter()
            .map(|e| e.workload.clone())
            .collect()
    }

    pub(super) fn wakes_at(&self) -> Option<u64> {
        let at = self.tracker.next_attempt()?;
        Some(at.duration_since(self.t0).as_secs())
    }
}

#[test]
fn an_opted_in_team_evicts_once_its_grace_period_has_passed() {
    let mut waiting = Waiting::new();
    assert!(waiting.pass(&plan(), 0).is_empty());
    assert_eq!(waiting.wakes_at(), Some(30), "woken when the grace ends");
    assert!(waiting.pass(&plan(), 29).is_empty());
    // 2 short, every Job holds 4: the newest Job goes whole.
    assert_eq!(waiting.pass(&plan(), 30), ["Job b/j3"]);
    assert_eq!(waiting.wakes_at(), None);
}

/// A PodDisruptionBudget refuses the newest Job: the next pass, at once, takes the next one
/// instead; the refused one is tried again 10 s after its refusal, when it is the newest again.
#[test]
fn a_workload_whose_eviction_was_refused_is_passed_over_then_tried_again() {
    let mut waiting = Waiting::new();
    waiting.pass(&plan(), 0);
    assert_eq!(waiting.pass(&plan(), 30), ["Job b/j3"]);
    let refused_at = waiting.t0 + Duration::from_secs(31);
    (waiting.tracker).refused(vec![("b".into(), "j3-0".into())], refused_at);
    assert_eq!(
        waiting.wakes_at(),
        Some(31),
        "another workload is chosen at once"
    );
    assert_eq!(waiting.pass(&plan(), 31), ["Job b/j2"]);
    assert_eq!(waiting.wakes_at(), Some(41), "the refusal ends");
    // j2 is refused too; j1 is the last of the borrower's above its guarantee.
    let refused_at = waiting.t0 + Duration::from_secs(33);
    (waiting.tracker).refused(vec![("b".into(), "j2-0".into())], refused_at);
    assert_eq!(waiting.pass(&plan(), 33), ["Job b/j1"]);
    (waiting.tracker).refused(vec![("b".into(), "j1-0".into())], refused_at);
    assert!(
        waiting.pass(&plan(), 34).is_empty(),
        "all refused: nothing is asked"
    );
    assert_eq!(waiting.wakes_at(), Some(41));
    assert_eq!(waiting.pass(&plan(), 41), ["Job b/j3"]);
    waiting
        .tracker
        .clear_due(waiting.t0 + Duration::from_secs(43));
    assert_eq!(
        waiting.pass(&plan(), 43),
        ["Job b/j3"],
        "the newest of all again"
    );
}

#[test]
fn a_workload_just_evicted_counts_as_going_until_the_pod_cache_shows_it() {
    let mut waiting = Waiting::new();
    waiting.pass(&plan(), 0);
    assert_eq!(waiting.pass(&plan(), 30), ["Job b/j3"]);
    let evicted_at = waiting.t0 + Duration::from_secs(30);
    (waiting.tracker).evicted(("b".into(), "j3-0".into()), evicted_at);
    // The next pass still sees j3's Pod running and its claim allocated (the watch has not
    // brought the deletion yet): the 2 devices are on their way, nothing more is evicted.
    assert!(waiting.pass(&plan(), 31).is_empty());
    assert!(waiting.pass(&plan(), 89).is_empty());
    // A minute on, the Pod still runs: it was not evicted after all, and reclaim goes on.
    assert_eq!(waiting.pass(&plan(), 90), ["Job b/j3"]);
}

#[test]
fn a_claim_whose_pod_is_gone_counts_as_coming_back_for_a_minute() {
    let mut waiting = Waiting::new();
    waiting.pass(&plan(), 0);
    // j3's Pod is gone, its claim not yet freed: the plan still counts the borrower's 12.
    let (mut pods, claims) = cluster();
    pods.retain(|p| &*p.name != "j3-0");
    let mut pass = |secs: u64| -> Vec<String> {
        let input = ReclaimInput {
            plan: &plan(),
            teams: &waiting.teams,
            claims: &claims,
            pods: &pods,
            budgets: &[],
        };
        let now = waiting.t0 + Duration::from_secs(secs);
        let wall = Timestamp::from_second(at(NOW).as_second() + secs as i64).unwrap();
        let reclaimed = waiting
            .tracker
            .evictions(input, waiting.defaults, now, wall);
        reclaimed
            .evictions
            .iter()
            .map(|e| e.workload.clone())
            .collect()
    };
    assert!(pass(30).is_empty(), "j3's 4 devices cover the 2 short");
    assert!(pass(89).is_empty());
    // Still allocated a minute on: kept on purpose, not on its way back.
    assert_eq!(pass(90), ["Job b/j2"]);
}

#[test]
fn a_reclaim_no_longer_ordered_starts_its_grace_period_again() {
    let mut waiting = Waiting::new();
    waiting.pass(&plan(), 0);
    let settled = Plan {
        reclaims: Vec::new(),
        ..plan()
    };
    assert!(waiting.pass(&settled, 10).is_empty());
    assert_eq!(waiting.wakes_at(), None);
    assert!(
        waiting.pass(&plan(), 30).is_empty(),
        "the grace period starts again at 30 s"
    );
    assert_eq!(waiting.wakes_at(), Some(60));
}

#[test]
fn a_team_reclaims_only_when_it_or_the_operators_default_opts_in() {
    let evicted = |reclaim, defaults, secs| {
        let mut waiting = Waiting::with(reclaim, defaults);
        waiting.pass(&plan(), 0);
        waiting.pass(&plan(), secs)
    };
    let on = ReclaimDefaults {
        enabled: true,
        ..OFF
    };
    let none = Vec::<String>::new();
    assert_eq!(evicted(json!({}), OFF, 120), none);
    assert_eq!(evicted(json!({}), on, 120), ["Job b/j3"]);
    assert_eq!(evicted(json!({"enabled": false}), on, 120), none);
    assert_eq!(evicted(json!({"enabled": true}), OFF, 120), ["Job b/j3"]);
    // The operator's grace period (120 s) applies to a team that sets none.
    assert_eq!(evicted(json!({}), on, 119), none);
}

#[test]
fn a_minimum_runtime_spares_young_workloads_and_says_until_when() {
    // The Jobs started at 08:00, 09:00 and 10:00; it is 12:00. With 3.5 hours, only j1 may go.
    let mut waiting = Waiting::with(
        json!({"enabled": true, "gracePeriodSeconds": 0, "minRuntimeSeconds": 12600}),
        OFF,
    );
    assert_eq!(waiting.pass(&plan(), 0), ["Job b/j1"]);
    // With 5 hours, none may: the team is told when the first may go, and the loop wakes then.
    let mut waiting = Waiting::with(
        json!({"enabled": true, "gracePeriodSeconds": 0, "minRuntimeSeconds": 18000}),
        OFF,
    );
    let reclaimed = waiting.reclaimed(&plan(), 0);
    assert!(reclaimed.evictions.is_empty());
    assert_eq!(
        waiting.wakes_at(),
        Some(3600),
        "j1 reaches 5 hours at 13:00"
    );
    let notes: Vec<(&str, Option<&str>, &str)> = (reclaimed.events.iter())
        .map(|e| (e.reason, e.regarding.namespace.as_deref(), e.note.as_str()))
        .collect();
    let note = "2 devices of a are still short: the borrowers' workloads that could free them \
                have run less than the minimum runtime (18000 s); reclaim takes them from \
                2026-06-01T13:00:00Z";
    let copy = format!("TeamGpuPolicy owner: {note}");
    assert_eq!(
        notes,
        [
            ("ReclaimWaiting", Some("o"), copy.as_str()),
            ("ReclaimWaiting", None, note)
        ]
    );
    // The operator's default applies to a team that sets none.
    let mut waiting = Waiting::with(
        json!({"enabled": true, "gracePeriodSeconds": 0}),
        ReclaimDefaults {
            min_runtime: Duration::from_secs(12600),
            ..OFF
        },
    );
    assert_eq!(waiting.pass(&plan(), 0), ["Job b/j1"]);
}

#[test]
fn an_eviction_is_told_on_the_pods_the_borrower_and_in_both_teams_namespaces() {
    let mut waiting = Waiting::with(json!({"enabled": true, "gracePeriodSeconds": 0}), OFF);
    let reclaimed = waiting.reclaimed(&plan(), 0);
    let [eviction] = &reclaimed.evictions[..] else {
        panic!("one eviction: {reclaimed:?}")
    };
    assert_eq!(eviction.pods, [("b".to_owned(), "j3-0".to_owned())]);
    // A batch/v1 Job is suspended, not its Pods evicted: the job controller counts no failure.
    assert_eq!(eviction.job.as_deref(), Some("j3"));
    let reference =
        |api_version: &str, kind: &str, namespace: Option<&str>, name: &str| ObjectReference {
            api_version: Some(api_version.into()),
            kind: Some(kind.into()),
            namespace: namespace.map(Into::into),
            name: Some(name.into()),
            ..Default::default()
        };
    let borrower = ObjectReference {
        uid: Some("u-borrower".into()),
        ..reference("teamgpu.io/v1alpha1", "TeamGpuPolicy", None, "borrower")
    };
    let told = |reason: &'static str, note: &str| -> Vec<Event> {
        [
            (reference("v1", "Pod", Some("b"), "j3-0"), String::new()),
            (borrower.clone(), String::new()),
            (
                reference("v1", "ResourceQuota", Some("b"), "teamgpu"),
                "TeamGpuPolicy borrower: ".to_owned(),
            ),
            (
                reference("v1", "ResourceQuota", Some("o"), "teamgpu"),
                "TeamGpuPolicy owner: ".to_owned(),
            ),
        ]
        .into_iter()
        .map(|(regarding, prefix)| Event {
            regarding,
            type_: EventType::Warning,
            reason,
            action: "Evict",
            note: format!("{prefix}{note}"),
        })
        .collect()
    };
    assert_eq!(
        eviction_events(eviction, Ok(Taken::Suspended)),
        told(
            "Reclaimed",
            "suspending Job b/j3 (1 Pod, 4 devices of a, priority 0): borrower holds devices \
             above its guarantee that owner needs back (2 short; it holds 12 of a, guaranteed 4); \
             teamgpu resumes the Job once its Pods are gone, and its new Pods wait for room with \
             no failure counted"
        )
    );
    // A Job whose `suspend` another controller sets (Kueue, a JobSet) has its Pods evicted, and
    // the Events say so: nothing is resumed.
    assert_eq!(
        eviction_events(eviction, Ok(Taken::Evicted)),
        told(
            "Reclaimed",
            "evicting Job b/j3 (1 Pod, 4 devices of a, priority 0): borrower holds devices \
             above its guarantee that owner needs back (2 short; it holds 12 of a, guaranteed 4)"
        )
    );
    assert_eq!(
        eviction_events(eviction, Ok(Taken::SuspendedAlready)),
        told(
            "Reclaimed",
            "taking back Job b/j3 (1 Pod, 4 devices of a, priority 0): borrower holds devices \
             above its guarantee that owner needs back (2 short; it holds 12 of a, guaranteed 4); \
             its Job was suspended already, not by teamgpu, and stays suspended"
        )
    );
    assert_eq!(
        eviction_events(eviction, Err("a PodDisruptionBudget")),
        told(
            "EvictionRefused",
            "could not evict Job b/j3 (1 Pod, 4 devices of a, priority 0) to give devices back \
             to owner: a PodDisruptionBudget; no Pod of it was evicted; retrying"
        )
    );
}

/// A workload taken back before goes after equal ones that were not: when the Job's Pod made
/// again is the newest, an equal workload taken fewer times goes instead; once it is
/// forgotten, the newest again. What another team's workload of the same name went through
/// does not count.
#[test]
fn a_workload_evicted_before_goes_after_equal_ones_that_were_not() {
    let mut waiting = Waiting::new();
    waiting.pass(&plan(), 0);
    let evicted_at = waiting.t0 + Duration::from_secs(30);
    (waiting.tracker).workload_evicted(("owner".into(), "Job b/j3".into()), evicted_at);
    assert_eq!(waiting.pass(&plan(), 30), ["Job b/j3"]);
    (waiting.tracker).workload_evicted(("borrower".into(), "Job b/j3".into()), evicted_at);
    // j3's Pod made again, started at 11:00: the newest, and as large as the others.
    let made_again = || three_jobs(("j3-1", 11));
    let chosen = |reclaimed: Reclaimed| -> Vec<String> {
        reclaimed
            .evictions
            .into_iter()
            .map(|e| e.workload)
            .collect()
    };
    assert_eq!(
        chosen(waiting.reclaimed_in(&plan(), 60, made_again())),
        ["Job b/j2"]
    );
    assert_eq!(
        chosen(waiting.reclaimed_in(&plan(), 30 + 600, made_again())),
        ["Job b/j3"],
        "ten minutes on, the eviction is forgotten"
    );
}
