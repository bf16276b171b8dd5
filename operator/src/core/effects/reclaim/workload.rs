//! Workloads: the unit reclaim evicts. Evicting one Pod of a three-Pod training Job stops the
//! whole Job while the other two keep their devices, so a workload's Pods go together or not at
//! all. A workload is every Pod with the same controller, or the same `teamgpu.io/workload`
//! label; a Pod of a ReplicaSet or StatefulSet stands alone (its controller replaces Pods one by
//! one, and each is useful on its own).

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use k8s_openapi::jiff::Timestamp;
use rustc_hash::{FxHashMap, FxHashSet};

use super::budgets::BudgetedPod;
use crate::core::plan::inventory::DeviceId;
use crate::core::plan::usage::{ClaimView, Names};

/// The label that groups Pods into one workload explicitly, across the team's namespaces.
pub const WORKLOAD_LABEL: &str = "teamgpu.io/workload";
/// JobSet's label on every Pod of a JobSet (its Pods' controllers are its child Jobs).
const JOBSET_LABEL: &str = "jobset.sigs.k8s.io/jobset-name";
/// LeaderWorkerSet's labels: a group (a leader and its workers) is one workload; its Pods'
/// controllers are StatefulSets, which would make each Pod stand alone.
const LWS_NAME_LABEL: &str = "leaderworkerset.sigs.k8s.io/name";
const LWS_GROUP_LABEL: &str = "leaderworkerset.sigs.k8s.io/group-index";
const BATCH_V1: &str = "batch/v1";

/// Which workload a Pod belongs to.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum WorkloadKey {
    /// `teamgpu.io/workload=<name>`: the team's Pods with this label, in any of its namespaces.
    Labelled(Arc<str>),
    /// The Pods of one controller in one namespace: its kind and name (for a LeaderWorkerSet,
    /// `name/group`).
    Owner { kind: Arc<str>, name: Arc<str> },
    /// A Pod of its own.
    Alone,
}

/// What reclaim reads of a Pod that is not done yet. A few hundred bytes instead of the Pod.
#[derive(Clone, Debug, PartialEq)]
pub struct PodView {
    pub namespace: Arc<str>,
    pub name: Arc<str>,
    /// `spec.priority`, resolved from the PriorityClass at admission (0 without one).
    pub priority: i32,
    pub priority_class: Option<Arc<str>>,
    pub workload: WorkloadKey,
    /// `status.startTime` (when the kubelet took the Pod), else its creation.
    pub started: Option<Timestamp>,
    /// Being deleted: its devices are on their way back.
    pub terminating: bool,
    /// The devices its containers report unhealthy (almost always none).
    pub unhealthy: Box<[crate::core::plan::inventory::ExtraTaint]>,
    /// Whether the scheduler gave it a node (`spec.nodeName`).
    pub bound: bool,
    /// The claims it uses while it has no node: named in its spec, or made for it from a
    /// template (its status names them once made). Empty once it has a node.
    pub queued_claims: Box<[Arc<str>]>,
    /// What a PodDisruptionBudget reads of it (its labels, whether it asks its budget), for a
    /// Pod that uses claims; `None` for the others, which reclaim counts as covered by none.
    pub budgeted: Option<Box<BudgetedPod>>,
    /// Whether evicting it moves it rather than ends it: a controller makes it again, and no
    /// node selector or required node affinity ties it to some nodes (reclaim cannot tell
    /// which nodes those are, so it does not move such a Pod).
    pub movable: bool,
}

impl PodView {
    pub fn project(pod: &Pod, names: &mut Names) -> Self {
        let labels = pod.metadata.labels.as_ref();
        let label = |key: &str| labels.and_then(|l| l.get(key)).map(String::as_str);
        let controller =
            (pod.metadata.owner_references.iter().flatten()).find(|o| o.controller == Some(true));
        let workload = if let Some(name) = label(WORKLOAD_LABEL) {
            WorkloadKey::Labelled(names.intern(name))
        } else if let Some(name) = label(JOBSET_LABEL) {
            WorkloadKey::Owner {
                kind: names.intern("JobSet"),
                name: names.intern(name),
            }
        } else if let (Some(name), Some(group)) = (label(LWS_NAME_LABEL), label(LWS_GROUP_LABEL)) {
            WorkloadKey::Owner {
                kind: names.intern("LeaderWorkerSet"),
                name: names.intern(&format!("{name}/{group}")),
            }
        } else {
            match controller {
                Some(owner) if !matches!(owner.kind.as_str(), "ReplicaSet" | "StatefulSet") => {
                    WorkloadKey::Owner {
                        kind: names.intern(&owner_kind(owner)),
                        name: names.intern(&owner.name),
                    }
                }
                _ => WorkloadKey::Alone,
            }
        };
        let spec = pod.spec.as_ref();
        let bound = spec.is_some_and(|s| s.node_name.is_some());
        let tied_to_nodes = spec.is_some_and(|s| {
            s.node_selector.as_ref().is_some_and(|n| !n.is_empty())
                || (s.affinity.as_ref().and_then(|a| a.node_affinity.as_ref())).is_some_and(|n| {
                    n.required_during_scheduling_ignored_during_execution
                        .is_some()
                })
        });
        let uses_claims = spec.is_some_and(|s| s.resource_claims.iter().flatten().next().is_some())
            || (pod.status.as_ref()).is_some_and(|s| s.extended_resource_claim_status.is_some());
        let queued_claims = (crate::core::plan::pending::pod_claims(pod))
            .filter(|_| !bound)
            .filter_map(|(_, claim)| claim.map(|name| names.intern(name)))
            .collect();
        PodView {
            namespace: names.intern(pod.metadata.namespace.as_deref().unwrap_or_default()),
            name: Arc::from(pod.metadata.name.as_deref().unwrap_or_default()),
            priority: spec.and_then(|s| s.priority).unwrap_or(0),
            priority_class: spec
                .and_then(|s| s.priority_class_name.as_deref())
                .map(|c| names.intern(c)),
            workload,
            started: (pod.status.as_ref().and_then(|s| s.start_time.as_ref()))
                .or(pod.metadata.creation_timestamp.as_ref())
                .map(|t| t.0),
            terminating: pod.metadata.deletion_timestamp.is_some(),
            unhealthy: crate::core::plan::taints::unhealthy(pod).into(),
            bound,
            queued_claims,
            budgeted: uses_claims.then(|| Box::new(BudgetedPod::project(pod))),
            movable: controller.is_some() && !tied_to_nodes,
        }
    }
}

/// A controller's kind as a workload names it: `Job` only for a `batch/v1` Job, which reclaim
/// suspends; another group's `Job` (Volcano's, say) is `Job.batch.volcano.sh`.
fn owner_kind(owner: &OwnerReference) -> String {
    match owner.kind.as_str() {
        "Job" if owner.api_version != BATCH_V1 => {
            let group = owner.api_version.split('/').next().unwrap_or_default();
            format!("Job.{group}")
        }
        kind => kind.to_owned(),
    }
}

/// One workload of a team, as reclaim weighs it.
#[derive(Clone, Debug, PartialEq)]
pub struct Workload {
    /// How a person names it: `Job ml/train-3`, `workload llm-sweep`, `Pod ml/notebook`.
    pub name: String,
    /// Its `teamgpu.io/workload` label, if that is what groups it.
    pub label: Option<Arc<str>>,
    /// Its Pods (namespace, name), sorted.
    pub pods: Vec<(Arc<str>, Arc<str>)>,
    /// Devices of the class that come free when all its Pods are gone: the claims reserved by
    /// its Pods and by no other Pod.
    pub devices: u64,
    /// Those devices per node (`None`: devices of pools without a node), sorted.
    pub nodes: Vec<(Option<Arc<str>>, u64)>,
    /// The highest priority among its Pods: a workload is as important as its most important
    /// Pod.
    pub priority: i32,
    /// The PriorityClass of that Pod, for messages.
    pub priority_class: Option<Arc<str>>,
    /// When its first Pod started.
    pub started: Option<Timestamp>,
    /// Every Pod is being deleted already.
    pub terminating: bool,
    /// Every Pod is [`PodView::movable`]: evicted, the workload runs again wherever there is
    /// room.
    pub movable: bool,
    /// How many times teamgpu evicted it lately (`ReclaimTracker` remembers): a Job's
    /// controller makes its Pods again after a delay that doubles with each failure it counts,
    /// an eviction included (10 s, 20 s, 40 s, ... up to 6 minutes).
    pub evicted_before: u32,
    /// The `batch/v1` Job that controls its Pods (in their namespace). Reclaim suspends it
    /// for a moment instead of evicting them: the job controller counts an evicted Pod as a
    /// failure, which delays the Job's next Pods (10 s, doubling per failure) and spends its
    /// `backoffLimit`, so one eviction of a Job with more Pods than that would fail it for good.
    pub job: Option<Arc<str>>,
}

impl Workload {
    /// Whether its Pods are `pods` (namespace, name), in order: an eviction's or a refusal's.
    pub fn has_pods(&self, pods: &[(String, String)]) -> bool {
        pods.len() == self.pods.len()
            && (pods.iter().zip(&self.pods)).all(|((a, b), (c, d))| a == &**c && b == &**d)
    }
}

/// Where a workload's Pods belong together: a label across the team, else one namespace.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Scope {
    Team(Arc<str>),
    Namespace(Arc<str>, WorkloadKey),
    Pod(Arc<str>, Arc<str>),
}

fn scope_of(pod: &PodView) -> Scope {
    match &pod.workload {
        WorkloadKey::Labelled(name) => Scope::Team(name.clone()),
        WorkloadKey::Alone => Scope::Pod(pod.namespace.clone(), pod.name.clone()),
        key => Scope::Namespace(pod.namespace.clone(), key.clone()),
    }
}

fn describe(scope: &Scope) -> String {
    match scope {
        Scope::Team(name) => format!("workload {name}"),
        Scope::Namespace(ns, WorkloadKey::Owner { kind, name }) => format!("{kind} {ns}/{name}"),
        Scope::Namespace(ns, _) => format!("workload in {ns}"),
        Scope::Pod(ns, name) => format!("Pod {ns}/{name}"),
    }
}

/// Which node a device is on (`None`: reached from any node, or not known).
pub type NodeOf<'a> = &'a dyn Fn(&DeviceId) -> Option<Arc<str>>;

/// The workloads in `namespaces` (one team's) that hold devices of `class`, from the Pods not
/// done yet and the claims, each device on the node `node_of` says. A claim counts for a
/// workload when every Pod holding it is one of the workload's; a claim held by Pods of two
/// workloads frees nothing when only one goes.
pub fn workloads(
    pods: &[Arc<PodView>],
    claims: &[Arc<ClaimView>],
    namespaces: &[String],
    (class, node_of): (&str, NodeOf),
) -> Vec<Workload> {
    let in_team = in_namespaces(namespaces);
    let by_scope = by_scope(pods, &in_team);
    let scope_of_pod: FxHashMap<(&str, &str), &Scope> = (by_scope.iter())
        .flat_map(|(scope, pods)| pods.iter().map(move |p| ((&*p.namespace, &*p.name), scope)))
        .collect();
    let mut devices: FxHashMap<&Scope, BTreeMap<Option<Arc<str>>, u64>> = FxHashMap::default();
    let mut released = Vec::new();
    for claim in claims.iter().filter(|c| in_team(&c.namespace)) {
        let held: Vec<&DeviceId> = (claim.devices.iter())
            .filter(|d| d.class.as_deref() == Some(class) && !d.admin_access)
            .map(|d| &d.id)
            .collect();
        let mut holders = (claim.reserved_for_pods.iter())
            .map(|pod| scope_of_pod.get(&(&*claim.namespace, &**pod)));
        if !held.is_empty() && holders.clone().all(|s| s.is_none()) {
            released.push(released_claim(claim, &held, node_of));
            continue;
        }
        let Some(Some(&first)) = holders.next() else {
            continue;
        };
        if !held.is_empty() && holders.all(|s| s == Some(&first)) {
            let nodes = devices.entry(first).or_default();
            for id in held {
                *nodes.entry(node_of(id)).or_default() += 1;
            }
        }
    }
    by_scope
        .iter()
        .filter_map(|(scope, pods)| {
            let nodes = devices.get(scope)?;
            let mut w = assemble(scope, pods)?;
            w.devices = nodes.values().sum();
            w.nodes = nodes.iter().map(|(n, d)| (n.clone(), *d)).collect();
            w.started = pods.iter().filter_map(|p| p.started).min();
            w.terminating = pods.iter().all(|p| p.terminating);
            Some(w)
        })
        .chain(released)
        .collect()
}

/// The Pods of `namespaces` (one team's) by the workload they belong to.
fn by_scope<'p>(
    pods: &'p [Arc<PodView>],
    in_team: &dyn Fn(&str) -> bool,
) -> BTreeMap<Scope, Vec<&'p PodView>> {
    let mut out: BTreeMap<Scope, Vec<&PodView>> = BTreeMap::new();
    for pod in pods.iter().filter(|p| in_team(&p.namespace)) {
        out.entry(scope_of(pod)).or_default().push(pod);
    }
    out
}

/// The workload of `pods` (one scope's), holding nothing yet.
fn assemble(scope: &Scope, pods: &[&PodView]) -> Option<Workload> {
    let top = pods.iter().max_by_key(|p| p.priority)?;
    let mut names: Vec<_> = (pods.iter())
        .map(|p| (p.namespace.clone(), p.name.clone()))
        .collect();
    names.sort();
    Some(Workload {
        name: describe(scope),
        label: match scope {
            Scope::Team(label) => Some(label.clone()),
            _ => None,
        },
        pods: names,
        devices: 0,
        nodes: Vec::new(),
        priority: top.priority,
        priority_class: top.priority_class.clone(),
        started: None,
        terminating: false,
        movable: pods.iter().all(|p| p.movable),
        evicted_before: 0,
        job: match scope {
            Scope::Namespace(_, WorkloadKey::Owner { kind, name }) if &**kind == "Job" => {
                Some(name.clone())
            }
            _ => None,
        },
    })
}

/// The workloads in `namespaces` (one team's) queued for room: none of their Pods has a node,
/// and quota charged their claims for devices of `class` that are not allocated yet. They
/// hold no device, but the scheduler may give them the room an eviction makes for another team;
/// removing them loses no work. `devices` is what they are charged.
pub fn queued(
    pods: &[Arc<PodView>],
    claims: &[Arc<ClaimView>],
    namespaces: &[String],
    class: &str,
) -> Vec<Workload> {
    let in_team = in_namespaces(namespaces);
    let charged: BTreeMap<(&str, &str), u64> = (claims.iter())
        .filter(|c| in_team(&c.namespace) && !c.allocated)
        .filter_map(|c| {
            let (_, n) = c.charge.iter().find(|(k, _)| **k == *class)?;
            Some(((&*c.namespace, &*c.name), *n))
        })
        .collect();
    (by_scope(pods, &in_team).iter())
        .filter(|(_, pods)| pods.iter().all(|p| !p.bound && !p.terminating))
        .filter_map(|(scope, pods)| {
            let devices: u64 = (pods.iter())
                .flat_map(|p| p.queued_claims.iter().map(move |c| (&*p.namespace, &**c)))
                .filter_map(|key| charged.get(&key))
                .sum();
            let w = assemble(scope, pods).filter(|_| devices > 0)?;
            Some(Workload { devices, ..w })
        })
        .collect()
}

/// A claim still allocated that no Pod not done yet holds (its Pods were evicted, or are done):
/// its devices are on their way back (the claim controller frees them), so it counts as a
/// workload being deleted. [`super::ReclaimTracker`] stops counting it after a minute.
fn released_claim(claim: &ClaimView, held: &[&DeviceId], node_of: NodeOf) -> Workload {
    let mut nodes: BTreeMap<Option<Arc<str>>, u64> = BTreeMap::new();
    for id in held {
        *nodes.entry(node_of(id)).or_default() += 1;
    }
    Workload {
        name: format!("claim {}/{}", claim.namespace, claim.name),
        label: None,
        pods: Vec::new(),
        devices: held.len() as u64,
        nodes: nodes.into_iter().collect(),
        priority: 0,
        priority_class: None,
        started: None,
        terminating: true,
        movable: false,
        evicted_before: 0,
        job: None,
    }
}

/// The namespaces outside `namespaces` (one team's) whose Pods carry the workload label
/// `label` too: the label is read per team, so those Pods are not part of the team's workload.
pub fn label_elsewhere(pods: &[Arc<PodView>], namespaces: &[String], label: &str) -> Vec<String> {
    let in_team = in_namespaces(namespaces);
    let mut out: Vec<String> = (pods.iter())
        .filter(|p| matches!(&p.workload, WorkloadKey::Labelled(l) if **l == *label))
        .filter(|p| !in_team(&p.namespace))
        .map(|p| p.namespace.to_string())
        .collect();
    out.sort();
    out.dedup();
    out
}

/// Whether a namespace is one of `namespaces` (a team's, up to thousands): looked up, not
/// searched, as it is asked for every Pod and claim of the cluster.
fn in_namespaces(namespaces: &[String]) -> impl Fn(&str) -> bool + '_ {
    let set: FxHashSet<&str> = namespaces.iter().map(String::as_str).collect();
    move |ns| set.contains(ns)
}
