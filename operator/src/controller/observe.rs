//! Observe: watch caches of everything the planner reads and everything teamgpu owns. Needs a
//! client. Every change wakes the reconciler through one [`Notify`].

use std::sync::Arc;

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use kube::api::{DynamicObject, PartialObjectMeta};
use kube::core::ApiResource;
use kube::runtime::reflector::{self, Store, store::Writer};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource};
use tokio::sync::Notify;
use tokio::task::JoinSet;

use crate::api::{GpuSharingPolicy, TeamGpuPolicy};
use crate::plan::objects::{MANAGED_BY, MANAGED_BY_LABEL};
use crate::sync::Kind;

/// The watch caches.
#[derive(Clone)]
pub struct Stores {
    /// teamgpu's own kinds, kept dynamic so that one malformed object is reported, not fatal.
    pub sharing_policies: Store<DynamicObject>,
    pub teams: Store<DynamicObject>,
    /// Metadata only: the planner needs names and labels.
    pub namespaces: Store<PartialObjectMeta<Namespace>>,
    /// All DeviceClasses: foreign ones decide what is governed; teamgpu's are its own.
    pub device_classes: Store<DeviceClass>,
    pub slices: Store<ResourceSlice>,
    pub claims: Store<ResourceClaim>,
    /// Pending Pods only (field selector), for pending demand.
    pub pending_pods: Store<Pod>,
    /// Objects carrying teamgpu's managed-by label, per kind (DeviceClasses come from
    /// `device_classes`).
    pub owned: Vec<(Kind, Store<DynamicObject>)>,
}

impl std::fmt::Debug for Stores {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stores").finish_non_exhaustive()
    }
}

impl Stores {
    /// Wait until every cache holds a complete first list; false if a watch task ended.
    pub async fn wait_until_ready(&self) -> bool {
        let (a, b, c, d, e, f, g, owned) = futures::join!(
            self.sharing_policies.wait_until_ready(),
            self.teams.wait_until_ready(),
            self.namespaces.wait_until_ready(),
            self.device_classes.wait_until_ready(),
            self.slices.wait_until_ready(),
            self.claims.wait_until_ready(),
            self.pending_pods.wait_until_ready(),
            futures::future::join_all(self.owned.iter().map(|(_, s)| s.wait_until_ready())),
        );
        [a, b, c, d, e, f, g].iter().all(Result::is_ok) && owned.iter().all(Result::is_ok)
    }
}

/// Drop what no one reads: managed fields (large, one entry per manager) and kubectl's
/// last-applied annotation.
fn slim<K: Resource>(obj: &mut K) {
    obj.meta_mut().managed_fields = None;
    if let Some(a) = obj.meta_mut().annotations.as_mut() {
        a.remove("kubectl.kubernetes.io/last-applied-configuration");
    }
}

fn spawn<K, S>(
    tasks: &mut JoinSet<()>,
    writer: Writer<K>,
    stream: S,
    notify: Arc<Notify>,
    what: &'static str,
) where
    K: Resource + Clone + Send + Sync + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone + Send + Sync,
    S: Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static,
{
    tasks.spawn(async move {
        let stream = stream.modify(slim).default_backoff().reflect(writer);
        futures::pin_mut!(stream);
        while let Some(event) = stream.next().await {
            match event {
                Ok(_) => notify.notify_one(),
                // The watcher retries with backoff: one bad answer never ends the watch.
                Err(error) => tracing::warn!(%error, watch = what, "watch error, retrying"),
            }
        }
    });
}

/// Start every watch. The tasks run until dropped.
pub fn start(client: &Client, notify: Arc<Notify>, tasks: &mut JoinSet<()>) -> Stores {
    let cfg = watcher::Config::default;
    let owned_cfg = || cfg().labels(&format!("{MANAGED_BY_LABEL}={MANAGED_BY}"));

    let dynamic = |ar: ApiResource| -> (
        Api<DynamicObject>,
        Writer<DynamicObject>,
        Store<DynamicObject>,
    ) {
        let api = Api::all_with(client.clone(), &ar);
        let writer = Writer::new(ar);
        let store = writer.as_reader();
        (api, writer, store)
    };

    let (api, writer, sharing_policies) = dynamic(ApiResource::erase::<GpuSharingPolicy>(&()));
    spawn(
        tasks,
        writer,
        watcher(api, cfg()),
        notify.clone(),
        "gpusharingpolicies",
    );
    let (api, writer, teams) = dynamic(ApiResource::erase::<TeamGpuPolicy>(&()));
    spawn(
        tasks,
        writer,
        watcher(api, cfg()),
        notify.clone(),
        "teamgpupolicies",
    );

    let (namespaces, writer) = reflector::store();
    spawn(
        tasks,
        writer,
        watcher(
            Api::<PartialObjectMeta<Namespace>>::all(client.clone()),
            cfg(),
        ),
        notify.clone(),
        "namespaces",
    );
    let (device_classes, writer) = reflector::store();
    spawn(
        tasks,
        writer,
        watcher(Api::<DeviceClass>::all(client.clone()), cfg()),
        notify.clone(),
        "deviceclasses",
    );
    let (slices, writer) = reflector::store();
    spawn(
        tasks,
        writer,
        watcher(Api::<ResourceSlice>::all(client.clone()), cfg()),
        notify.clone(),
        "resourceslices",
    );
    let (claims, writer) = reflector::store();
    spawn(
        tasks,
        writer,
        watcher(Api::<ResourceClaim>::all(client.clone()), cfg()),
        notify.clone(),
        "resourceclaims",
    );
    let (pending_pods, writer) = reflector::store();
    let pods = watcher(
        Api::<Pod>::all(client.clone()),
        cfg().fields("status.phase=Pending"),
    );
    spawn(tasks, writer, pods, notify.clone(), "pods");

    let mut owned = Vec::new();
    for kind in Kind::ALL.into_iter().filter(|k| *k != Kind::DeviceClass) {
        let (api, writer, store) = dynamic(kind.api_resource());
        spawn(
            tasks,
            writer,
            watcher(api, owned_cfg()),
            notify.clone(),
            kind.label(),
        );
        owned.push((kind, store));
    }

    Stores {
        sharing_policies,
        teams,
        namespaces,
        device_classes,
        slices,
        claims,
        pending_pods,
        owned,
    }
}
