//! Watch caches that keep a projection of each object instead of the object: the ResourceSlices
//! (40,000 devices are hundreds of MiB as typed objects, a few MiB as [`SliceView`]s) and the
//! ResourceClaims. A projection that depends on a parameter (what selectors read of a device)
//! is made again by listing every object again when the parameter changes: an object is never
//! read twice from different projections.
//!
//! [`SliceView`]: crate::core::plan::inventory::SliceView

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use futures::StreamExt;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Resource, ResourceExt};
use tokio::sync::watch;
use tokio::task::JoinSet;

use super::observe::{Wake, Watch};

/// The objects of one watch as projections `V`, made with parameter `P`.
#[derive(Debug)]
pub struct Projected<V, P> {
    inner: Arc<Mutex<Contents<V, P>>>,
    /// True once a first list is complete; closed when the watch task ends.
    synced: watch::Receiver<bool>,
}

impl<V, P> Clone for Projected<V, P> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            synced: self.synced.clone(),
        }
    }
}

#[derive(Debug)]
struct Contents<V, P> {
    objects: HashMap<String, Arc<V>, rustc_hash::FxBuildHasher>,
    /// The parameter every object was projected with; `None` until the first list is complete.
    params: Option<P>,
}

impl<V, P: Clone> Projected<V, P> {
    fn new() -> (Self, watch::Sender<bool>) {
        let (synced_tx, synced) = watch::channel(false);
        let store = Self {
            inner: Arc::new(Mutex::new(Contents {
                objects: HashMap::default(),
                params: None,
            })),
            synced,
        };
        (store, synced_tx)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Contents<V, P>> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Every object, with the parameter they were projected with; `None` until a first list
    /// is complete.
    pub fn state(&self) -> Option<(P, Vec<Arc<V>>)> {
        let contents = self.lock();
        let params = contents.params.clone()?;
        Some((params, contents.objects.values().cloned().collect()))
    }

    /// Waits until a first list is complete; false if the watch task ended before.
    pub async fn wait_until_ready(&self) -> bool {
        self.synced.clone().wait_for(|synced| *synced).await.is_ok()
    }
}

fn key<K: Resource>(obj: &K) -> String {
    match obj.meta().namespace.as_deref() {
        Some(ns) => format!("{ns}/{}", obj.name_any()),
        None => obj.name_any(),
    }
}

/// How the objects of a watch are projected.
pub trait Projector<K>: Send + 'static {
    type View: Send + Sync + 'static;
    type Params: Clone + Send + Sync + 'static;

    fn project(&mut self, obj: &K, params: &Self::Params) -> Self::View;

    /// After a complete list: forget what only the objects before it held.
    fn relisted(&mut self) {}
}

/// Watches `api` and keeps the projection of every object in the returned store. Nothing is
/// listed while `params` holds `None`; a new `Some` lists every object again and replaces the
/// store's contents once the list is complete.
pub fn spawn<K, R>(
    tasks: &mut JoinSet<()>,
    api: Api<K>,
    config: watcher::Config,
    mut params: watch::Receiver<Option<R::Params>>,
    mut projector: R,
    wake: Wake,
    watch: Watch,
) -> Projected<R::View, R::Params>
where
    K: Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + Sync + 'static,
    R: Projector<K>,
{
    let (store, synced) = Projected::new();
    let out = store.clone();
    tasks.spawn(async move {
        let mut closed = false;
        loop {
            let current = params.borrow_and_update().clone();
            let Some(current) = current else {
                if closed || params.changed().await.is_err() {
                    return;
                }
                continue;
            };
            let stream = watcher(api.clone(), config.clone()).default_backoff();
            futures::pin_mut!(stream);
            // The objects of a list in progress, swapped in when it is complete.
            let mut listing: Option<HashMap<String, Arc<R::View>, rustc_hash::FxBuildHasher>> =
                None;
            loop {
                let event = tokio::select! {
                    changed = params.changed(), if !closed => {
                        match changed {
                            Ok(()) => break,
                            // Nobody will change the parameter again: keep watching.
                            Err(_) => { closed = true; continue }
                        }
                    }
                    event = stream.next() => event,
                };
                let changed = match event {
                    None => return,
                    Some(Err(error)) => {
                        tracing::warn!(%error, watch = ?watch, "watch error, retrying");
                        false
                    }
                    Some(Ok(watcher::Event::Init)) => {
                        listing = Some(HashMap::default());
                        false
                    }
                    Some(Ok(watcher::Event::InitApply(obj))) => {
                        let listing = listing.get_or_insert_with(HashMap::default);
                        listing.insert(key(&obj), Arc::new(projector.project(&obj, &current)));
                        false
                    }
                    Some(Ok(watcher::Event::InitDone)) => {
                        let objects = listing.take().unwrap_or_default();
                        {
                            let mut contents = store.lock();
                            contents.objects = objects;
                            contents.params = Some(current.clone());
                        }
                        synced.send_replace(true);
                        projector.relisted();
                        true
                    }
                    Some(Ok(watcher::Event::Apply(obj))) => {
                        let view = Arc::new(projector.project(&obj, &current));
                        store.lock().objects.insert(key(&obj), view);
                        true
                    }
                    Some(Ok(watcher::Event::Delete(obj))) => {
                        store.lock().objects.remove(&key(&obj));
                        true
                    }
                };
                if changed {
                    wake.mark(watch);
                }
            }
        }
    });
    out
}
