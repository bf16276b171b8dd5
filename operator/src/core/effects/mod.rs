//! What a pass does to the cluster, as data: the differ's writes, statuses that differ from the
//! live ones, Events for findings nobody has been told of yet, and evictions for reclaim. Pure;
//! `controller::executor` performs the effects and is the only code that writes.
//!
//! Every decision is here, over plain data, so it can be tested without an API server:
//! [`applied_statuses`] (each policy's status as written), [`status_changes`] and
//! [`malformed_statuses`] (which statuses to write), [`event_transitions`]
//! and [`Published`] (which Events to publish), [`ReclaimTracker::evictions`] and
//! [`reclaim::victims`] (which workloads to evict, and when), [`eviction_events`] (what to say
//! of an eviction's outcome), [`Requeuer`] (which waiting Pods to wake when room appears),
//! [`Refusals`] (what the API server refused, for status and Events).

mod events;
mod guard_labels;
pub mod reclaim;
pub mod refusals;
mod requeue;
mod status;
mod waiting;
mod written;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::core::ApiResource;
use serde_json::Value;

use crate::api::{GpuSharingPolicy, TeamGpuPolicy};
use crate::core::diff::Write;
use crate::core::plan::ReclaimOrder;
pub use events::{EventKey, Published, event_transitions, in_team_namespaces};
pub use guard_labels::{GuardLabels, Label};
pub use reclaim::suspended::{Resume, SuspendedJobs};
pub use reclaim::workload::PodView;
pub use reclaim::{
    ReclaimDefaults, ReclaimInput, ReclaimTracker, Reclaimed, Taken, eviction_events,
};
pub use refusals::{FailedWrite, Failure, Refusals, RefusedByOwner};
pub use requeue::{REQUEUE_ANNOTATION, Requeue, Requeuer, WaitingPod, room};
pub use status::{
    Malformed, PolicyStatuses, applied_statuses, malformed_status, malformed_statuses,
    status_changes,
};
pub use waiting::waiting_events;
pub use written::WrittenStatuses;

/// One thing to do to the cluster.
#[derive(Clone, Debug, PartialEq)]
pub enum Effect {
    /// An object teamgpu owns applied, recreated or deleted, as the differ asked.
    Object(Write),
    /// A policy's status, applied to its status subresource.
    Status {
        kind: PolicyKind,
        name: String,
        status: Value,
        /// A person waits for it (a team's own use, conditions, namespaces or generation
        /// changed; see [`status_changes`]): written at once and before the others.
        urgent: bool,
    },
    /// An Event for a person to read. Boxed, as is an eviction: the other effects are a third of
    /// their size, and a first converge holds 10,000 of them.
    Event(Box<Event>),
    /// Evict a borrower's workload (all its Pods, or none) to give devices back.
    Evict(Box<Eviction>),
    /// Wake a Pod waiting for its claim: its annotation changes, and the resourceclaim
    /// controller tries a changed Pod again at once.
    Requeue(Requeue),
    /// Set or take off the guard label of a namespace outside teams.
    Label(Label),
    /// Resume a Job reclaim suspended, once its Pods and their claims are gone.
    Resume(Resume),
}

impl Effect {
    /// What the effect does to which object, one per object: the key a failure backs off by,
    /// and what the logs name.
    pub fn id(&self) -> String {
        match self {
            Effect::Object(write) => write.key().to_string(),
            Effect::Status { kind, name, .. } => format!("{} {name} status", kind.kind()),
            Effect::Event(event) => {
                let (object, reason, note) = event.key();
                format!("event {object} {reason}: {note}")
            }
            Effect::Evict(e) => format!("{} eviction", e.workload),
            Effect::Requeue(r) => format!("pod {}/{} requeue", r.namespace, r.pod),
            Effect::Label(l) => format!("namespace {} guard label", l.namespace),
            Effect::Resume(r) => format!("job {}/{} resume", r.namespace, r.job),
        }
    }

    /// What the effect does, for logs.
    pub fn verb(&self) -> &'static str {
        match self {
            Effect::Object(write) => write.verb(),
            Effect::Status { .. } => "status",
            Effect::Event(_) => "publish",
            Effect::Evict(_) => "evict",
            Effect::Requeue(_) => "requeue",
            Effect::Label(_) => "label",
            Effect::Resume(_) => "resume",
        }
    }
}

/// The two custom resources teamgpu writes statuses of.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PolicyKind {
    GpuSharingPolicy,
    TeamGpuPolicy,
}

impl PolicyKind {
    pub fn api_resource(self) -> ApiResource {
        match self {
            PolicyKind::GpuSharingPolicy => ApiResource::erase::<GpuSharingPolicy>(&()),
            PolicyKind::TeamGpuPolicy => ApiResource::erase::<TeamGpuPolicy>(&()),
        }
    }

    /// The kind, as in an object's `kind`.
    pub fn kind(self) -> &'static str {
        match self {
            PolicyKind::GpuSharingPolicy => "GpuSharingPolicy",
            PolicyKind::TeamGpuPolicy => "TeamGpuPolicy",
        }
    }

    /// Lower-case name for metric labels.
    pub fn label(self) -> &'static str {
        match self {
            PolicyKind::GpuSharingPolicy => "gpusharingpolicy",
            PolicyKind::TeamGpuPolicy => "teamgpupolicy",
        }
    }
}

/// Whether an Event reports something normal or something a person should act on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventType {
    Normal,
    Warning,
}

/// An Event to publish about `regarding`.
#[derive(Clone, Debug, PartialEq)]
pub struct Event {
    pub regarding: ObjectReference,
    pub type_: EventType,
    pub reason: &'static str,
    /// What teamgpu did: `Plan` for findings of the plan, `Evict` for reclaim.
    pub action: &'static str,
    pub note: String,
}

/// Why a workload is evicted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EvictionWhy {
    /// Its team borrows devices that a team below its guarantee needs back.
    Reclaim,
    /// Its Pods have no node yet: they hold nothing, and go with a reclaim's evictions so as not
    /// to take the room made for the waiting team ([`reclaim::workload::queued`]).
    Queued,
    /// It goes to run again on another node, so that a waiting team's claim fits this one
    /// ([`reclaim::moves`]); `order.borrower` is its team, which keeps its share.
    Move,
}

impl EvictionWhy {
    /// The `reason` label of `teamgpu_evictions_total`.
    pub fn label(self) -> &'static str {
        match self {
            EvictionWhy::Reclaim => "reclaim",
            EvictionWhy::Queued => "queued",
            EvictionWhy::Move => "move",
        }
    }
}

/// One workload to evict, all its Pods or none, and whom to tell of the outcome.
#[derive(Clone, Debug, PartialEq)]
pub struct Eviction {
    /// The workload, as a person names it (`Job ml/train-3`).
    pub workload: String,
    /// Its Pods: (namespace, name).
    pub pods: Vec<(String, String)>,
    /// The `batch/v1` Job of its Pods (in their namespace), suspended for a moment instead of
    /// evicting them (see [`reclaim::workload::Workload::job`]).
    pub job: Option<String>,
    /// Devices of the pool it frees.
    pub devices: u64,
    /// Its priority, as a person reads it (`low (100)`).
    pub priority: String,
    /// Namespaces of other teams whose Pods carry the same workload label (and stay).
    pub also_labelled_in: Vec<String>,
    /// The borrower's devices of the pool and its effective guarantee, as the pass that chose
    /// the eviction saw them (`None` if the plan does not report the borrower's quota).
    pub borrower_held: Option<(u32, u32)>,
    /// Why it goes.
    pub why: EvictionWhy,
    /// The reclaim the eviction serves; `devices` is what the waiting team is short.
    pub order: ReclaimOrder,
    /// Where the outcome is told, each with the prefix of its note: the Pods, the borrowing
    /// team, and the quota in each namespace of both teams.
    pub notify: Vec<(ObjectReference, String)>,
}
