//! Object storage: objects as JSON keyed by (resource, namespace, name), a global
//! resourceVersion counter, and a bounded event log from which watches resume.
//!
//! Like etcd, every write increments the global revision; an object's `resourceVersion` is the
//! revision of its last write; a list's `resourceVersion` is the current revision. The log keeps
//! the last `capacity` events; a watch or a continue token older than the oldest retained event
//! gets `410 Gone` (reason `Expired`), like a compacted etcd.

use std::collections::{BTreeMap, VecDeque};

use serde_json::Value;

/// (resource key `group/plural`, namespace or "", name).
pub type ObjKey = (String, String, String);

/// Type of a watch event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    /// Created.
    Added,
    /// Updated.
    Modified,
    /// Removed.
    Deleted,
}

impl EventType {
    /// Wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }
}

/// One write, as seen by watches.
#[derive(Debug, Clone)]
pub struct Event {
    /// Revision of the write.
    pub rv: u64,
    /// Object key.
    pub key: ObjKey,
    /// Type.
    pub kind: EventType,
    /// The object after the write (for Deleted: the last state, with the deletion's revision).
    pub object: Value,
    /// The object before the write (None for Added).
    pub prev: Option<Value>,
}

/// The store.
#[derive(Debug)]
pub struct Store {
    /// Current revision.
    pub rv: u64,
    /// Live objects.
    pub objects: BTreeMap<ObjKey, Value>,
    log: VecDeque<Event>,
    capacity: usize,
    /// Watches from a revision below this one get 410 Gone.
    compacted: u64,
}

/// Default number of retained events.
pub const DEFAULT_LOG_CAPACITY: usize = 10_000;

impl Store {
    /// An empty store starting at revision `start`.
    pub fn new(start: u64, capacity: usize) -> Store {
        Store {
            rv: start,
            objects: BTreeMap::new(),
            log: VecDeque::new(),
            capacity: capacity.max(1),
            compacted: start,
        }
    }

    /// Writes (creates or replaces) an object; sets its resourceVersion. Returns the stored object.
    pub fn put(&mut self, key: ObjKey, mut object: Value) -> Value {
        self.rv += 1;
        object["metadata"]["resourceVersion"] = Value::String(self.rv.to_string());
        let prev = self.objects.insert(key.clone(), object.clone());
        let kind = if prev.is_some() {
            EventType::Modified
        } else {
            EventType::Added
        };
        self.record(Event {
            rv: self.rv,
            key,
            kind,
            object: object.clone(),
            prev,
        });
        object
    }

    /// Removes an object. Returns its last state (with the deletion's resourceVersion).
    pub fn remove(&mut self, key: &ObjKey) -> Option<Value> {
        let prev = self.objects.remove(key)?;
        self.rv += 1;
        let mut object = prev.clone();
        object["metadata"]["resourceVersion"] = Value::String(self.rv.to_string());
        self.record(Event {
            rv: self.rv,
            key: key.clone(),
            kind: EventType::Deleted,
            object: object.clone(),
            prev: Some(prev),
        });
        Some(object)
    }

    fn record(&mut self, e: Event) {
        self.log.push_back(e);
        while self.log.len() > self.capacity {
            if let Some(old) = self.log.pop_front() {
                self.compacted = old.rv;
            }
        }
    }

    /// Drops every retained event (as an etcd compaction at the current revision would): every
    /// older watch resume or continue token then gets 410 Gone.
    pub fn compact(&mut self) {
        self.log.clear();
        self.compacted = self.rv;
    }

    /// The oldest revision a watch may resume from.
    pub fn compacted(&self) -> u64 {
        self.compacted
    }

    /// Events after `rv` (None if `rv` is older than the retained log).
    pub fn events_since(&self, rv: u64) -> Option<impl Iterator<Item = &Event>> {
        if rv < self.compacted {
            return None;
        }
        let start = self.log.partition_point(|e| e.rv <= rv);
        Some(self.log.range(start..))
    }

    /// The objects of one resource (in one namespace or all) as they were at revision `rv`,
    /// reconstructed by undoing later events; None if `rv` is older than the retained log.
    pub fn snapshot(
        &self,
        resource: &str,
        namespace: Option<&str>,
        rv: u64,
    ) -> Option<BTreeMap<ObjKey, Value>> {
        let in_scope = |k: &ObjKey| k.0 == resource && namespace.is_none_or(|ns| k.1 == ns);
        let mut objs: BTreeMap<ObjKey, Value> = self
            .objects
            .iter()
            .filter(|(k, _)| in_scope(k))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        if rv >= self.rv {
            return Some(objs);
        }
        if rv < self.compacted {
            return None;
        }
        for e in self.log.iter().rev().take_while(|e| e.rv > rv) {
            if !in_scope(&e.key) {
                continue;
            }
            match &e.prev {
                Some(p) => {
                    objs.insert(e.key.clone(), p.clone());
                }
                None => {
                    objs.remove(&e.key);
                }
            }
        }
        Some(objs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn key(n: &str) -> ObjKey {
        ("r".into(), "ns".into(), n.into())
    }

    #[test]
    fn snapshots_undo_later_writes_and_compaction_expires_them() {
        let mut s = Store::new(1, 100);
        s.put(key("a"), json!({"metadata": {"name": "a"}, "v": 1}));
        let rv = s.rv;
        s.put(key("a"), json!({"metadata": {"name": "a"}, "v": 2}));
        s.put(key("b"), json!({"metadata": {"name": "b"}}));
        s.remove(&key("a"));
        let snap = s.snapshot("r", None, rv).unwrap();
        assert_eq!(snap.len(), 1);
        assert_eq!(snap[&key("a")]["v"], 1);
        assert_eq!(s.events_since(rv).unwrap().count(), 3);
        s.compact();
        assert!(s.snapshot("r", None, rv).is_none());
        assert!(s.events_since(rv).is_none());
        assert_eq!(s.events_since(s.rv).unwrap().count(), 0);
    }

    #[test]
    fn a_bounded_log_compacts_the_oldest_events() {
        let mut s = Store::new(1, 2);
        for i in 0..5 {
            s.put(key(&i.to_string()), json!({"metadata": {}}));
        }
        assert!(s.events_since(2).is_none());
        assert_eq!(s.events_since(4).unwrap().count(), 2);
    }
}
