//! Watch caches that keep a projection of each object instead of the object: the ResourceSlices
//! (40,000 devices are hundreds of MiB as typed objects, a few MiB as [`SliceView`]s) and the
//! ResourceClaims. A projection that depends on a parameter (what the class expressions read of a
//! device) is made again by listing every object again when the parameter changes: an object is
//! never read twice from different projections.
//!
//! An event whose projection equals the one kept changes nothing: the cache keeps its view and
//! wakes no pass. A list (the first, one after a new parameter, or the watcher's own after a
//! desync) is compared with what was kept, so it wakes a pass only for what differs. Caches
//! whose taker wants it also record what changed since the last [`Projected::take`], so that
//! one event costs the pool or namespace it touches, not the cluster.
//!
//! [`SliceView`]: crate::core::plan::inventory::SliceView

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use futures::StreamExt;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Resource, ResourceExt};
use tokio::sync::watch;
use tokio::task::JoinSet;

use super::changes::{Wake, Watch};
use crate::core::state::Taken;

type Objects<V> = HashMap<String, Arc<V>, rustc_hash::FxBuildHasher>;

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
    objects: Objects<V>,
    /// The parameter every object was projected with; `None` until the first list is complete.
    params: Option<P>,
    changes: Changes<V>,
}

/// What changed since the last [`Projected::take`].
#[derive(Debug)]
enum Changes<V> {
    /// Nobody takes changes from this cache: nothing is recorded.
    Untracked,
    /// The next take hands over every object (the first take, or one after
    /// [`Projected::take_all_next`]).
    All,
    /// By key: the new projection, or `None` with the last one for an object removed.
    Since(HashMap<String, (Option<Arc<V>>, Arc<V>)>),
}

impl<V, P> Contents<V, P> {
    fn new(track: bool) -> Self {
        Contents {
            objects: HashMap::default(),
            params: None,
            changes: if track {
                Changes::All
            } else {
                Changes::Untracked
            },
        }
    }

    fn record(&mut self, key: &str, now: Option<&Arc<V>>, last: &Arc<V>) {
        if let Changes::Since(changes) = &mut self.changes {
            changes.insert(key.to_owned(), (now.cloned(), last.clone()));
        }
    }

    /// Takes in `view` of the object `key`; false if it equals (`same`) the view kept, which
    /// is kept then.
    fn put(&mut self, key: String, view: V, same: impl Fn(&V, &V) -> bool) -> bool {
        if self.objects.get(&key).is_some_and(|kept| same(kept, &view)) {
            return false;
        }
        let view = Arc::new(view);
        self.record(&key, Some(&view), &view);
        self.objects.insert(key, view);
        true
    }

    /// Takes in the event of object `key`: its new `view`, or `None` when it is gone; whether
    /// that changed the cache, and whether the change starts a pass ([`Projector::wakes`]).
    fn apply<K, R: Projector<K, View = V>>(
        &mut self,
        key: String,
        view: Option<V>,
    ) -> (bool, bool) {
        let wakes = R::wakes(self.objects.get(&key).map(|v| &**v), view.as_ref());
        let changed = match view {
            Some(view) => self.put(key, view, R::same),
            None => self.remove(&key),
        };
        (changed, wakes)
    }

    /// Forgets the object `key`; false if it was not kept.
    fn remove(&mut self, key: &str) -> bool {
        let Some(last) = self.objects.remove(key) else {
            return false;
        };
        self.record(key, None, &last);
        true
    }

    /// Replaces every object with those of a complete list made with `params`, keeping the
    /// views of objects whose projection did not change; false if none changed.
    fn relisted(
        &mut self,
        mut listed: Objects<V>,
        params: P,
        same: impl Fn(&V, &V) -> bool,
    ) -> bool {
        let mut changed = false;
        for (key, view) in &mut listed {
            match self.objects.remove(key) {
                Some(kept) if same(&kept, view) => *view = kept,
                _ => {
                    changed = true;
                    self.record(key, Some(view), view);
                }
            }
        }
        // What is left was not listed: gone.
        for (key, last) in std::mem::take(&mut self.objects) {
            changed = true;
            self.record(&key, None, &last);
        }
        self.objects = listed;
        self.params = Some(params);
        changed
    }

    fn take(&mut self) -> Taken<V> {
        let changes = match &mut self.changes {
            Changes::Untracked => None,
            Changes::All => {
                self.changes = Changes::Since(HashMap::new());
                None
            }
            Changes::Since(changes) => Some(std::mem::take(changes)),
        };
        match changes {
            None => Taken::All(self.objects.values().cloned().collect()),
            Some(changes) => {
                let (mut upserted, mut removed) = (Vec::new(), Vec::new());
                for (now, last) in changes.into_values() {
                    match now {
                        Some(view) => upserted.push(view),
                        None => removed.push(last),
                    }
                }
                Taken::Changed { upserted, removed }
            }
        }
    }
}

impl<V, P: Clone> Projected<V, P> {
    fn new(track: bool) -> (Self, watch::Sender<bool>) {
        let (synced_tx, synced) = watch::channel(false);
        let store = Self {
            inner: Arc::new(Mutex::new(Contents::new(track))),
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

    /// What changed since the last take (every object at the first), with the parameter the
    /// objects were projected with; `None` until a first list is complete. One taker per
    /// cache: a second would miss what the first took.
    pub fn take(&self) -> Option<(P, Taken<V>)> {
        let mut contents = self.lock();
        let params = contents.params.clone()?;
        Some((params, contents.take()))
    }

    /// The next [`Projected::take`] hands over every object (a resync compares everything).
    pub fn take_all_next(&self) {
        let mut contents = self.lock();
        if !matches!(contents.changes, Changes::Untracked) {
            contents.changes = Changes::All;
        }
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
    /// Whether the cache records what changed for [`Projected::take`].
    const TRACKED: bool = false;

    fn project(&mut self, obj: &K, params: &Self::Params) -> Self::View;

    /// Whether `new` holds what `kept` holds for every reader of the cache: then the event
    /// changed nothing, and wakes no pass.
    fn same(kept: &Self::View, new: &Self::View) -> bool;

    /// Whether a change from `kept` to `new` (`None`: no such object) starts a pass; else it
    /// is read by the next pass that runs anyway.
    fn wakes(_kept: Option<&Self::View>, _new: Option<&Self::View>) -> bool {
        true
    }

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
    let (store, synced) = Projected::new(R::TRACKED);
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
            // The reader waits for the list of a new parameter, changed or not.
            let mut new_params = true;
            let stream = watcher(api.clone(), config.clone()).default_backoff();
            futures::pin_mut!(stream);
            // The objects of a list in progress, swapped in when it is complete.
            let mut listing: Option<Objects<R::View>> = None;
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
                // (the cache changed, that starts a pass)
                let (changed, wakes) = match event {
                    None => return,
                    Some(Err(error)) => {
                        tracing::warn!(%error, watch = ?watch, "watch error, retrying");
                        (false, false)
                    }
                    Some(Ok(watcher::Event::Init)) => {
                        listing = Some(HashMap::default());
                        (false, false)
                    }
                    Some(Ok(watcher::Event::InitApply(obj))) => {
                        let listing = listing.get_or_insert_with(HashMap::default);
                        listing.insert(key(&obj), Arc::new(projector.project(&obj, &current)));
                        (false, false)
                    }
                    Some(Ok(watcher::Event::InitDone)) => {
                        let listed = listing.take().unwrap_or_default();
                        let changed =
                            store.lock().relisted(listed, current.clone(), R::same) || new_params;
                        new_params = false;
                        synced.send_replace(true);
                        projector.relisted();
                        (changed, true)
                    }
                    Some(Ok(watcher::Event::Apply(obj))) => {
                        let view = projector.project(&obj, &current);
                        store.lock().apply::<K, R>(key(&obj), Some(view))
                    }
                    Some(Ok(watcher::Event::Delete(obj))) => {
                        store.lock().apply::<K, R>(key(&obj), None)
                    }
                };
                if changed {
                    wake.mark(watch, wakes);
                }
            }
        }
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A projection: a name and what readers read; `version` is what they do not.
    #[derive(Debug, Clone, PartialEq)]
    struct View {
        read: u32,
        version: u32,
    }

    fn same(a: &View, b: &View) -> bool {
        a.read == b.read
    }

    fn view(read: u32, version: u32) -> View {
        View { read, version }
    }

    /// What a take handed over, as (key-less) sorted `read`s.
    fn reads(taken: &Taken<View>) -> (Vec<u32>, Vec<u32>) {
        let sorted = |views: &[Arc<View>]| {
            let mut r: Vec<u32> = views.iter().map(|v| v.read).collect();
            r.sort_unstable();
            r
        };
        match taken {
            Taken::All(all) => (sorted(all), Vec::new()),
            Taken::Changed { upserted, removed } => (sorted(upserted), sorted(removed)),
        }
    }

    fn listed(views: &[(&str, View)]) -> Objects<View> {
        (views.iter())
            .map(|(k, v)| ((*k).to_owned(), Arc::new(v.clone())))
            .collect()
    }

    #[test]
    fn an_event_whose_projection_is_unchanged_changes_nothing() {
        let mut contents: Contents<View, ()> = Contents::new(true);
        assert!(contents.relisted(listed(&[("a", view(1, 1))]), (), same));
        assert!(matches!(contents.take(), Taken::All(all) if all.len() == 1));
        // A status update the projection does not keep: no change, the kept view stays.
        assert!(!contents.put("a".into(), view(1, 2), same));
        assert_eq!(contents.objects["a"].version, 1);
        assert_eq!(reads(&contents.take()), (vec![], vec![]));
        // One it keeps.
        assert!(contents.put("a".into(), view(7, 3), same));
        assert_eq!(reads(&contents.take()), (vec![7], vec![]));
        // Removing what is not kept changes nothing.
        assert!(!contents.remove("b"));
        assert!(contents.remove("a"));
        assert_eq!(reads(&contents.take()), (vec![], vec![7]));
    }

    #[test]
    fn a_take_hands_over_only_what_changed_since_the_last() {
        let mut contents: Contents<View, ()> = Contents::new(true);
        contents.relisted(listed(&[("a", view(1, 1)), ("b", view(2, 1))]), (), same);
        assert_eq!(reads(&contents.take()), (vec![1, 2], vec![]));
        contents.put("c".into(), view(3, 1), same);
        contents.put("a".into(), view(4, 2), same);
        contents.put("a".into(), view(5, 3), same);
        contents.remove("b");
        // `a` once, as it is now; `b` as it was.
        assert_eq!(reads(&contents.take()), (vec![3, 5], vec![2]));
        assert_eq!(reads(&contents.take()), (vec![], vec![]));
        // Added and gone before a take: handed over as removed, which its taker never had.
        contents.put("d".into(), view(6, 1), same);
        contents.remove("d");
        assert_eq!(reads(&contents.take()), (vec![], vec![6]));
        // After a resync asked for everything.
        contents.changes = Changes::All;
        assert_eq!(reads(&contents.take()), (vec![3, 5], vec![]));
    }

    #[test]
    fn a_list_again_changes_only_what_differs() {
        let mut contents: Contents<View, ()> = Contents::new(true);
        contents.relisted(listed(&[("a", view(1, 1)), ("b", view(2, 1))]), (), same);
        contents.take();
        // A watch restart that missed nothing: the same projections, new versions.
        let again = listed(&[("a", view(1, 5)), ("b", view(2, 5))]);
        assert!(!contents.relisted(again, (), same));
        assert_eq!(contents.objects["a"].version, 1, "the kept view stays");
        assert_eq!(reads(&contents.take()), (vec![], vec![]));
        // One that missed a change of `a` and the deletion of `b`, and the creation of `c`.
        let drifted = listed(&[("a", view(8, 6)), ("c", view(3, 6))]);
        assert!(contents.relisted(drifted, (), same));
        assert_eq!(reads(&contents.take()), (vec![3, 8], vec![2]));
    }

    #[test]
    fn an_untracked_cache_records_nothing_and_always_hands_over_everything() {
        let mut contents: Contents<View, ()> = Contents::new(false);
        contents.relisted(listed(&[("a", view(1, 1))]), (), same);
        contents.put("b".into(), view(2, 1), same);
        assert!(matches!(contents.changes, Changes::Untracked));
        assert_eq!(reads(&contents.take()), (vec![1, 2], vec![]));
        assert_eq!(reads(&contents.take()), (vec![1, 2], vec![]));
    }
}
