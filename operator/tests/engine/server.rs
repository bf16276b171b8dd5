//! A cluster and the API server in front of it, as the engine's tests need them: what teamgpu
//! applies is stored with the defaults the real server adds (so the differ must tolerate them),
//! every change gets a new resourceVersion and a no-op apply keeps it, statuses are stored as
//! written, and each watch says whether it saw a change since the engine last took it in. Also
//! the engine as the operator makes it, for the tests and `benches/engine.rs`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use kube::api::DynamicObject;
use serde_json::{Value, json};
use teamgpu::core::diff::{Kind, LiveView, ObjectKey, Write};
use teamgpu::core::effects::ReclaimDefaults;
use teamgpu::core::effects::{Effect, PolicyKind};
use teamgpu::core::engine::{Done, Engine, Input, Settings};
use teamgpu::core::plan::admission::{DEFAULT_OPERATOR_USER, Enforcement};
use teamgpu::core::plan::inventory::SliceView;
use teamgpu::core::plan::objects::is_managed;
use teamgpu::core::plan::outside_teams::GUARD_LABEL;
use teamgpu::core::plan::pending::PendingPodView;
use teamgpu::core::plan::usage::{ClaimView, Names};
use teamgpu::core::state::{ClusterState, NamespaceInfo, NamespaceView, Taken};
use teamgpu::dra_cel::DeviceReads;

/// One watch of the operator.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Watch {
    SharingPolicies,
    Teams,
    Namespaces,
    DeviceClasses,
    Slices,
    Claims,
    PendingPods,
    Owned(Kind),
}

#[derive(Default)]
pub struct Server {
    version: u64,
    pub sharing: BTreeMap<String, DynamicObject>,
    pub teams: BTreeMap<String, DynamicObject>,
    pub namespaces: BTreeMap<String, BTreeMap<String, String>>,
    pub classes: BTreeMap<String, DeviceClass>,
    pub slices: BTreeMap<String, ResourceSlice>,
    pub claims: BTreeMap<(String, String), ResourceClaim>,
    pub pending_pods: BTreeMap<(String, String), Pod>,
    /// Every object teamgpu owns but DeviceClasses.
    pub owned: BTreeMap<ObjectKey, DynamicObject>,
    /// The owned objects as the engine last took them in: their watches hand over what
    /// changed since, as the operator's do.
    handed: BTreeMap<ObjectKey, DynamicObject>,
    /// The namespaces as the engine last took them in (their watch hands over what changed).
    handed_namespaces: BTreeMap<String, BTreeMap<String, String>>,
    /// What the slices are projected to, as the operator's slice watch does.
    slice_reads: DeviceReads,
    envs: teamgpu::core::plan::inventory::SliceValues,
    names: Names,
    changed: BTreeSet<Watch>,
}

/// An engine with the operator's settings (enforcement on, reclaim off by default) that hands out
/// at most `writes_per_batch` object writes a pass.
pub fn engine_with(writes_per_batch: usize) -> Engine {
    Engine::new(Settings {
        operator_user: DEFAULT_OPERATOR_USER.into(),
        admin_groups: None,
        enforcement: Enforcement::Deny,
        reclaim: ReclaimDefaults {
            enabled: false,
            grace: std::time::Duration::from_secs(120),
            min_runtime: std::time::Duration::ZERO,
        },
        writes_per_batch,
    })
}

fn dynamic(value: Value) -> DynamicObject {
    serde_json::from_value(value).expect("a Kubernetes object")
}

impl Server {
    /// The built-in example's cluster (config/samples, six 8-GPU nodes, claims in use), as a
    /// real server holds it: every object with a uid and a resourceVersion.
    pub fn example() -> Self {
        Self::holding(teamgpu::cli::example::state().expect("the built-in example loads"))
    }

    /// `state`'s cluster, as a real server holds it.
    pub fn holding(state: ClusterState) -> Self {
        let mut server = Server::default();
        for p in state.sharing_policies {
            let object = dynamic(json!(p));
            server.put_sharing(object);
        }
        for t in state.teams {
            let object = dynamic(json!(t));
            server.put_team(object);
        }
        for n in state.namespaces {
            server.label_namespace(&n.name, n.labels.clone());
        }
        for c in state.device_classes {
            server.put_class(c);
        }
        for s in state.slices {
            server.put_slice(s);
        }
        for c in state.claims {
            server.put_claim(c);
        }
        server
    }

    fn stamp(&mut self, meta: &mut k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) {
        self.version += 1;
        meta.resource_version = Some(self.version.to_string());
        let name = meta.name.clone().unwrap_or_default();
        meta.uid
            .get_or_insert_with(|| format!("uid-{name}-{}", self.version));
        meta.generation.get_or_insert(1);
    }

    pub fn put_sharing(&mut self, mut object: DynamicObject) {
        self.stamp(&mut object.metadata);
        let name = object.metadata.name.clone().unwrap_or_default();
        self.sharing.insert(name, object);
        self.changed.insert(Watch::SharingPolicies);
    }

    pub fn put_team(&mut self, mut object: DynamicObject) {
        self.stamp(&mut object.metadata);
        let name = object.metadata.name.clone().unwrap_or_default();
        self.teams.insert(name, object);
        self.changed.insert(Watch::Teams);
    }

    /// A spec change of a policy: a new generation.
    pub fn edit_team(&mut self, name: &str, edit: impl FnOnce(&mut Value)) {
        if let Some(mut team) = self.teams.get(name).cloned() {
            edit(&mut team.data["spec"]);
            *team.metadata.generation.get_or_insert(1) += 1;
            self.put_team(team);
        }
    }

    /// Edits the hard of teamgpu's quota in `namespace`, as a person with kubectl would.
    pub fn edit_owned_quota(
        &mut self,
        namespace: &str,
        edit: impl FnOnce(&mut serde_json::Map<String, Value>),
    ) {
        let key = ObjectKey {
            kind: Kind::ResourceQuota,
            namespace: Some(namespace.to_owned()),
            name: "teamgpu".into(),
        };
        let mut quota = self.owned[&key].clone();
        if let Some(hard) = quota.data["spec"]["hard"].as_object_mut() {
            edit(hard);
        }
        self.stamp(&mut quota.metadata);
        self.owned.insert(key, quota);
        self.changed.insert(Watch::Owned(Kind::ResourceQuota));
    }

    pub fn label_namespace(&mut self, name: &str, labels: BTreeMap<String, String>) {
        self.namespaces.insert(name.to_owned(), labels);
        self.changed.insert(Watch::Namespaces);
    }

    pub fn put_class(&mut self, mut class: DeviceClass) {
        self.stamp(&mut class.metadata);
        let name = class.metadata.name.clone().unwrap_or_default();
        self.classes.insert(name, class);
        self.changed.insert(Watch::DeviceClasses);
    }

    pub fn put_slice(&mut self, mut slice: ResourceSlice) {
        self.stamp(&mut slice.metadata);
        let name = slice.metadata.name.clone().unwrap_or_default();
        self.slices.insert(name, slice);
        self.changed.insert(Watch::Slices);
    }

    pub fn remove_slice(&mut self, name: &str) {
        self.slices.remove(name);
        self.changed.insert(Watch::Slices);
    }

    pub fn put_claim(&mut self, mut claim: ResourceClaim) {
        self.stamp(&mut claim.metadata);
        let key = (
            claim.metadata.namespace.clone().unwrap_or_default(),
            claim.metadata.name.clone().unwrap_or_default(),
        );
        self.claims.insert(key, claim);
        self.changed.insert(Watch::Claims);
    }

    pub fn remove_claim(&mut self, key: &(String, String)) {
        self.claims.remove(key);
        self.changed.insert(Watch::Claims);
    }

    pub fn put_pending_pod(&mut self, mut pod: Pod) {
        self.stamp(&mut pod.metadata);
        let key = (
            pod.metadata.namespace.clone().unwrap_or_default(),
            pod.metadata.name.clone().unwrap_or_default(),
        );
        self.pending_pods.insert(key, pod);
        self.changed.insert(Watch::PendingPods);
    }

    /// A watch saw an event that changed nothing teamgpu reads (a resync of the cache, a
    /// label nobody selects on).
    pub fn touch(&mut self, watch: Watch) {
        self.changed.insert(watch);
    }

    /// What the engine must take in: the caches whose watch saw a change, whole (owned
    /// objects: what changed since the engine last took them in).
    pub fn changes(&mut self) -> Vec<Input> {
        let changed = std::mem::take(&mut self.changed);
        changed.into_iter().map(|w| self.input(w, false)).collect()
    }

    /// Every cache, as a fresh engine (a restarted operator) takes them in.
    pub fn everything(&mut self) -> Vec<Input> {
        self.changed.clear();
        let owned = Kind::ALL.into_iter().filter(|k| *k != Kind::DeviceClass);
        [
            Watch::SharingPolicies,
            Watch::Teams,
            Watch::Namespaces,
            Watch::DeviceClasses,
            Watch::Slices,
            Watch::Claims,
            Watch::PendingPods,
        ]
        .into_iter()
        .chain(owned.map(Watch::Owned))
        .map(|w| self.input(w, true))
        .collect()
    }

    /// The slice watch lists again with `reads`.
    pub fn list_slices(&mut self, reads: DeviceReads) {
        self.slice_reads = reads;
        self.changed.insert(Watch::Slices);
    }

    /// The cache of `watch`; the owned objects all of them when `whole`, else what changed.
    fn input(&mut self, watch: Watch, whole: bool) -> Input {
        let arcs = |objects: &BTreeMap<String, DynamicObject>| {
            objects.values().cloned().map(Arc::new).collect()
        };
        match watch {
            Watch::SharingPolicies => Input::SharingPolicies(arcs(&self.sharing)),
            Watch::Teams => Input::Teams(arcs(&self.teams)),
            Watch::Namespaces => Input::Namespaces(self.namespaces_since_handed(whole)),
            Watch::DeviceClasses => {
                Input::DeviceClasses(self.classes.values().cloned().map(Arc::new).collect())
            }
            Watch::Slices => {
                let (reads, envs) = (&self.slice_reads, &mut self.envs);
                let project = |s: &ResourceSlice| Arc::new(SliceView::project(s, reads, envs));
                Input::Slices {
                    // Whole, as after a resync: the planner's own property test feeds deltas.
                    slices: Taken::All(self.slices.values().map(project).collect()),
                    reads: Arc::new(self.slice_reads.clone()),
                }
            }
            Watch::Claims => Input::Claims(Taken::All(
                (self.claims.values())
                    .map(|c| Arc::new(ClaimView::project(c, &mut self.names)))
                    .collect(),
            )),
            Watch::PendingPods => Input::PendingPods(Taken::All(
                (self.pending_pods.values())
                    .map(|p| Arc::new(PendingPodView::project(p)))
                    .collect(),
            )),
            Watch::Owned(kind) => Input::Owned {
                kind,
                objects: self.owned_since_handed(kind, whole),
            },
        }
    }

    /// The namespaces: every one (`whole`), or those new, relabelled or gone since the engine
    /// last took them in.
    fn namespaces_since_handed(&mut self, whole: bool) -> Taken<NamespaceView> {
        let view = |name: &String, labels: &BTreeMap<String, String>| {
            let info = NamespaceInfo {
                name: name.clone(),
                labels: labels.clone(),
            };
            Arc::new(NamespaceView {
                info: Arc::new(info),
                terminating: false,
            })
        };
        let taken = if whole {
            Taken::All(self.namespaces.iter().map(|(n, l)| view(n, l)).collect())
        } else {
            let upserted = (self.namespaces.iter())
                .filter(|(n, l)| self.handed_namespaces.get(*n) != Some(*l))
                .map(|(n, l)| view(n, l))
                .collect();
            let removed = (self.handed_namespaces.iter())
                .filter(|(n, _)| !self.namespaces.contains_key(*n))
                .map(|(n, l)| view(n, l))
                .collect();
            Taken::Changed { upserted, removed }
        };
        self.handed_namespaces = self.namespaces.clone();
        taken
    }

    /// The owned objects of `kind`: every one (`whole`), or those new, changed or gone since
    /// the engine last took them in.
    fn owned_since_handed(&mut self, kind: Kind, whole: bool) -> Taken<LiveView> {
        let view = |o: &DynamicObject| Arc::new(LiveView::new(kind, o));
        let version = |o: &DynamicObject| o.metadata.resource_version.clone();
        let now: BTreeMap<&ObjectKey, &DynamicObject> = (self.owned.iter())
            .filter(|(k, _)| k.kind == kind)
            .collect();
        let taken = if whole {
            Taken::All(now.values().map(|o| view(o)).collect())
        } else {
            let upserted = (now.iter())
                .filter(|(k, o)| self.handed.get(**k).map(version) != Some(version(o)))
                .map(|(_, o)| view(o))
                .collect();
            let removed = (self.handed.iter())
                .filter(|(k, _)| k.kind == kind && !now.contains_key(k))
                .map(|(_, o)| view(o))
                .collect();
            Taken::Changed { upserted, removed }
        };
        let handed = (now.into_iter()).map(|(k, o)| (k.clone(), o.clone()));
        let handed: Vec<_> = handed.collect();
        self.handed.retain(|k, _| k.kind != kind);
        self.handed.extend(handed);
        taken
    }

    /// Performs `effects` as the executor would, every one of them accepted.
    pub fn perform(&mut self, effects: &[Effect]) -> Done {
        let mut done = Done::default();
        for effect in effects {
            match effect {
                Effect::Object(Write::Apply { key, object }) => {
                    let version = self.apply(key, object.to_value());
                    done.applied.push((key.clone(), Some(version)));
                }
                Effect::Object(Write::Recreate { key, object }) => {
                    self.delete(key);
                    self.apply(key, object.to_value());
                    done.applied.push((key.clone(), None));
                }
                Effect::Object(Write::Delete { key }) => self.delete(key),
                Effect::Status {
                    kind, name, status, ..
                } => {
                    self.write_status(*kind, name, status);
                    done.statuses.push((*kind, name.clone()));
                }
                Effect::Event(event) => done.published.push(event.key()),
                Effect::Requeue(r) => {
                    let key = (r.namespace.clone(), r.pod.clone());
                    if let Some(mut pod) = self.pending_pods.get(&key).cloned() {
                        pod.metadata.annotations.get_or_insert_default().insert(
                            teamgpu::core::effects::REQUEUE_ANNOTATION.into(),
                            r.value.clone(),
                        );
                        self.stamp(&mut pod.metadata);
                        self.pending_pods.insert(key, pod);
                        self.changed.insert(Watch::PendingPods);
                    }
                }
                Effect::Evict(e) => {
                    for pod in &e.pods {
                        self.pending_pods.remove(pod);
                    }
                }
                Effect::Resume(r) => done.resumed.push((r.namespace.clone(), r.job.clone())),
                Effect::Label(label) => {
                    if let Some(labels) = self.namespaces.get_mut(&label.namespace) {
                        let key = GUARD_LABEL.to_owned();
                        match &label.value {
                            Some(value) => labels.insert(key, value.clone()),
                            None => labels.remove(&key),
                        };
                        self.changed.insert(Watch::Namespaces);
                    }
                    done.labelled.push(label.clone());
                }
            }
        }
        done
    }

    /// Stores `object` as the API server does; returns its resourceVersion (the same when the
    /// apply changed nothing).
    fn apply(&mut self, key: &ObjectKey, object: Value) -> String {
        let mut stored = dynamic(with_server_defaults(key.kind, object));
        let watch = match key.kind {
            Kind::DeviceClass => Watch::DeviceClasses,
            kind => Watch::Owned(kind),
        };
        let live = match key.kind {
            Kind::DeviceClass => (self.classes.get(&key.name)).map(|c| dynamic(json!(c))),
            _ => self.owned.get(key).cloned(),
        };
        if let Some(live) = &live {
            let (mut a, mut b) = (json!(live), json!(stored));
            for side in [&mut a, &mut b] {
                for field in ["resourceVersion", "uid", "generation"] {
                    side["metadata"].as_object_mut().map(|m| m.remove(field));
                }
            }
            if a == b {
                return live.metadata.resource_version.clone().unwrap_or_default();
            }
            stored.metadata.uid.clone_from(&live.metadata.uid);
        }
        self.stamp(&mut stored.metadata);
        let version = stored.metadata.resource_version.clone().unwrap_or_default();
        match key.kind {
            Kind::DeviceClass => {
                let class: DeviceClass = serde_json::from_value(json!(stored)).unwrap();
                assert!(is_managed(&class), "teamgpu applies only its own classes");
                self.classes.insert(key.name.clone(), class);
            }
            _ => {
                self.owned.insert(key.clone(), stored);
            }
        }
        self.changed.insert(watch);
        version
    }

    fn delete(&mut self, key: &ObjectKey) {
        match key.kind {
            Kind::DeviceClass => {
                self.classes.remove(&key.name);
                self.changed.insert(Watch::DeviceClasses);
            }
            kind => {
                self.owned.remove(key);
                self.changed.insert(Watch::Owned(kind));
            }
        }
    }

    fn write_status(&mut self, kind: PolicyKind, name: &str, status: &Value) {
        let policies = match kind {
            PolicyKind::GpuSharingPolicy => &self.sharing,
            PolicyKind::TeamGpuPolicy => &self.teams,
        };
        let Some(mut policy) = policies.get(name).cloned() else {
            return;
        };
        policy.data["status"] = status.clone();
        match kind {
            PolicyKind::GpuSharingPolicy => self.put_sharing(policy),
            PolicyKind::TeamGpuPolicy => self.put_team(policy),
        }
    }
}

/// Sets `value[field]` to `default` when it has no such field.
fn default_field(value: &mut Value, field: &str, default: Value) {
    if let Some(object) = value.as_object_mut() {
        object.entry(field).or_insert(default);
    }
}

/// What the API server adds to an object it stores (the fields of `k8s.io/api`'s defaulters
/// that teamgpu's objects leave out), and a quota's status from the quota controller.
fn with_server_defaults(kind: Kind, mut object: Value) -> Value {
    default_field(
        &mut object["metadata"],
        "creationTimestamp",
        json!("2026-01-01T00:00:00Z"),
    );
    let match_defaults = |resources: &mut Value| {
        default_field(resources, "matchPolicy", json!("Equivalent"));
        default_field(resources, "namespaceSelector", json!({}));
        default_field(resources, "objectSelector", json!({}));
        for rule in resources["resourceRules"]
            .as_array_mut()
            .into_iter()
            .flatten()
        {
            default_field(rule, "scope", json!("*"));
        }
    };
    match kind {
        Kind::ResourceClaimTemplate => {
            default_field(&mut object["spec"], "metadata", json!({}));
            let requests = &mut object["spec"]["spec"]["devices"]["requests"];
            for request in requests.as_array_mut().into_iter().flatten() {
                let exactly = &mut request["exactly"];
                if exactly.is_object() {
                    default_field(exactly, "allocationMode", json!("ExactCount"));
                    if exactly["allocationMode"] == "ExactCount" {
                        default_field(exactly, "count", json!(1));
                    }
                }
            }
        }
        Kind::ValidatingAdmissionPolicy => {
            default_field(&mut object["spec"], "failurePolicy", json!("Fail"));
            match_defaults(&mut object["spec"]["matchConstraints"]);
        }
        Kind::ValidatingAdmissionPolicyBinding => {
            if object["spec"]["matchResources"].is_object() {
                match_defaults(&mut object["spec"]["matchResources"]);
            }
        }
        Kind::ResourceQuota => {
            let hard = object["spec"]["hard"].clone();
            object["status"] = json!({"hard": hard, "used": {}});
        }
        Kind::DeviceClass | Kind::ClusterRole | Kind::ClusterRoleBinding => {}
    }
    object
}
