//! What reclaim says: the Events on a waiting team when reclaim cannot cover its shortfall
//! yet, and those that tell of an eviction's outcome. Pure.

use kube::Resource;

use super::budgets::Overdrawn;
use super::kept::kept_by_budgets;
use super::victims::Choice;
use super::{RETRY_REFUSED, workload};
use crate::api::TeamGpuPolicy;
use crate::core::effects::{Event, EventType, Eviction, EvictionWhy};

/// An Event on the waiting team when what reclaim may take now does not cover its shortfall,
/// saying why: workloads too young, workloads their PodDisruptionBudgets keep (`kept`), or none
/// that fits above the borrowers' guarantees.
pub(super) fn waiting_note(
    waiting: &TeamGpuPolicy,
    policy: &str,
    choice: &Choice,
    min_runtime: u64,
    kept: &[(String, Overdrawn)],
) -> Option<Event> {
    if choice.uncovered == 0 {
        return None;
    }
    let short = choice.uncovered;
    let budgets = match kept {
        [] => String::new(),
        kept => format!(
            "; {}; reclaim looks again every {} s",
            kept_by_budgets(kept),
            RETRY_REFUSED.as_secs()
        ),
    };
    let (reason, note) = match choice.eligible_at {
        Some(at) => (
            "ReclaimWaiting",
            format!(
                "{short} devices of {policy} are still short: the borrowers' workloads that \
                 could free them have run less than the minimum runtime ({min_runtime} s); \
                 reclaim takes them from {at}{budgets}"
            ),
        ),
        None if !kept.is_empty() => (
            "ReclaimBlocked",
            format!(
                "{short} devices of {policy} are still short and reclaim cannot free them \
                 now{budgets}"
            ),
        ),
        None => (
            "ReclaimBlocked",
            format!(
                "{short} devices of {policy} are still short and reclaim cannot free them: \
                 no borrower's workload fits in what it holds above its guarantee, or its \
                 devices are on their way back"
            ),
        ),
    };
    // Only when nothing is on its way back: devices in flight may cover the rest.
    (choice.in_flight == 0 || choice.eligible_at.is_some()).then(|| Event {
        regarding: waiting.object_ref(&()),
        type_: EventType::Normal,
        reason,
        action: "Evict",
        note,
    })
}

/// How a workload was taken back, as the executor did it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Taken {
    /// Its Pods were evicted.
    Evicted,
    /// teamgpu suspended its `batch/v1` Job, and resumes it once its Pods are gone.
    Suspended,
    /// Its Job was suspended already, not by teamgpu: its Pods are going, and it stays so.
    SuspendedAlready,
}

/// The Events that tell of an eviction's outcome: `Ok` with how the workload was taken, or
/// `Err` with why it was refused.
pub fn eviction_events(eviction: &Eviction, outcome: Result<Taken, &str>) -> Vec<Event> {
    let (e, order) = (eviction, &eviction.order);
    let pods = match e.pods.len() {
        1 => "1 Pod".to_owned(),
        n => format!("{n} Pods"),
    };
    let holds = if e.why == EvictionWhy::Queued {
        "waiting for "
    } else {
        ""
    };
    let what = format!(
        "{} ({pods}, {holds}{} devices of {}, priority {})",
        e.workload, e.devices, order.sharing_policy, e.priority
    );
    let elsewhere = if e.also_labelled_in.is_empty() {
        String::new()
    } else {
        format!(
            "; Pods labelled {} in {} belong to other teams and stay",
            workload::WORKLOAD_LABEL,
            e.also_labelled_in.join(", ")
        )
    };
    // What the borrower held as the pass saw it: a person can check the arithmetic.
    let held = match e.borrower_held {
        Some((held, guarantee)) => format!(
            "; it holds {held} of {}, guaranteed {guarantee}",
            order.sharing_policy
        ),
        None => String::new(),
    };
    // A Job is suspended rather than evicted where teamgpu may: the job controller then
    // counts no failure.
    let (evicting, resumed) = match outcome {
        Ok(Taken::Suspended) => (
            "suspending",
            "; teamgpu resumes the Job once its Pods are gone, and its new Pods wait for room \
             with no failure counted",
        ),
        Ok(Taken::SuspendedAlready) => (
            "taking back",
            "; its Job was suspended already, not by teamgpu, and stays suspended",
        ),
        Ok(Taken::Evicted) | Err(_) => ("evicting", ""),
    };
    let (reason, note) = match outcome {
        Ok(_) if e.why == EvictionWhy::Move => (
            "Moved",
            format!(
                "{evicting} {what} so that it runs again on another node: {} waits, within its \
                 guarantee, for {} devices in claims that no node has room for; this workload \
                 fits the free devices of other nodes, and its node then has room; {} keeps \
                 its share{resumed}{elsewhere}",
                order.for_team, order.devices, order.borrower
            ),
        ),
        Ok(_) if e.why == EvictionWhy::Queued => (
            "Dequeued",
            format!(
                "removing {what} before it starts: {} is charged for it beyond its guarantee \
                 while {} needs devices back ({} short{held}), and the scheduler would give this \
                 workload the room reclaim makes; no work is lost, its controller makes its Pods \
                 again and their claims wait for quota{resumed}{elsewhere}",
                order.borrower, order.for_team, order.devices
            ),
        ),
        Ok(_) => (
            "Reclaimed",
            format!(
                "{evicting} {what}: {} holds devices above its guarantee that {} needs back \
                 ({} short{held}){resumed}{elsewhere}",
                order.borrower, order.for_team, order.devices
            ),
        ),
        Err(refusal) => (
            "EvictionRefused",
            format!(
                "could not evict {what} to give devices back to {}: {refusal}; no Pod of it \
                 was evicted; retrying",
                order.for_team
            ),
        ),
    };
    e.notify
        .iter()
        .map(|(regarding, prefix)| Event {
            regarding: regarding.clone(),
            type_: EventType::Warning,
            reason,
            action: "Evict",
            note: format!("{prefix}{note}"),
        })
        .collect()
}
