//! A watch reflected into a store: the one task every full-object watch runs (`observe` for
//! teamgpu's own kinds and policies, `pods` for the Pods that wait), waking the reconciler on
//! each change that matters.

use futures::{Stream, StreamExt};
use kube::runtime::reflector::store::Writer;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Resource, ResourceExt};
use tokio::task::JoinSet;

use super::changes::{Wake, Watch};

/// Drop what no one reads: managed fields (large, one entry per manager) and kubectl's
/// last-applied annotation.
fn slim<K: Resource>(obj: &mut K) {
    obj.meta_mut().managed_fields = None;
    if let Some(a) = obj.meta_mut().annotations.as_mut() {
        a.remove("kubectl.kubernetes.io/last-applied-configuration");
    }
}

/// What of a policy, besides its status, the planner reads in a way its generation may not
/// show: labels and whether it is being deleted.
fn spec_identity<K: Resource>(obj: &K) -> (Option<i64>, bool, u64) {
    use std::hash::{Hash, Hasher};
    let meta = obj.meta();
    let mut hasher = std::hash::DefaultHasher::new();
    meta.labels.hash(&mut hasher);
    (
        meta.generation,
        meta.deletion_timestamp.is_some(),
        hasher.finish(),
    )
}

pub(super) fn spawn<K, S>(
    tasks: &mut JoinSet<()>,
    writer: Writer<K>,
    stream: S,
    wake: Wake,
    watch: Watch,
    what: &'static str,
) where
    K: Resource + Clone + Send + Sync + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone + Send + Sync,
    S: Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static,
{
    // A change of a policy's status alone (the operator's own status writes, mostly) is taken
    // in at the next pass but starts none: a pass after each status write would find nothing
    // to do, and delay the reaction to the next real change.
    let quiet_status = matches!(watch, Watch::SharingPolicies | Watch::Teams);
    tasks.spawn(async move {
        let mut seen: std::collections::HashMap<String, (Option<i64>, bool, u64)> =
            std::collections::HashMap::new();
        let stream = stream.modify(slim).default_backoff().reflect(writer);
        futures::pin_mut!(stream);
        while let Some(event) = stream.next().await {
            match event {
                Ok(event) => {
                    let status_only = match &event {
                        watcher::Event::Apply(obj) if quiet_status => {
                            let identity = spec_identity(obj);
                            seen.insert(obj.name_any(), identity) == Some(identity)
                        }
                        watcher::Event::InitApply(obj) if quiet_status => {
                            seen.insert(obj.name_any(), spec_identity(obj));
                            false
                        }
                        watcher::Event::Delete(obj) => {
                            seen.remove(&obj.name_any());
                            false
                        }
                        _ => false,
                    };
                    if status_only {
                        wake.changes.mark(watch);
                    } else {
                        wake.mark(watch, true);
                    }
                }
                // The watcher retries with backoff: one bad answer never ends the watch.
                Err(error) => tracing::warn!(%error, watch = what, "watch error, retrying"),
            }
        }
    });
}
