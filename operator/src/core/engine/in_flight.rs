//! The effects handed to the executor whose batch has not settled yet. The executor runs off
//! the planning path, so passes go on while writes are on their way: a status, an Event or an
//! eviction still in flight is not handed out again unless what it writes changed. Objects'
//! writes are the differ's to hold back (it compares an object again only when a side
//! changes); here they are only remembered, so that one that did not happen is compared again.

use std::collections::HashMap;
use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};

use serde_json::Value;

use crate::core::diff::ObjectKey;
use crate::core::effects::Effect;

/// Which batch last handed out each effect in flight. An effect handed out again (its content
/// changed) belongs to the later batch: the end of that one decides.
#[derive(Debug, Default)]
pub(super) struct InFlight {
    next_batch: u64,
    /// Objects' writes, by object.
    objects: HashMap<ObjectKey, u64>,
    /// The other effects, by [`Effect::id`]: the batch, and what it writes.
    others: HashMap<String, (u64, u64)>,
}

/// What an effect writes, beyond its id. A status without its conditions' transition times:
/// while the status is in flight the live one is old, and a changed condition gets a new time
/// at every pass. A wake-up of waiting Pods by its annotation's value: the requeuer asks for
/// one only when it is due. The id of an Event or an eviction says it all.
fn content(effect: &Effect) -> u64 {
    let hasher = BuildHasherDefault::<DefaultHasher>::default();
    match effect {
        Effect::Status { status, .. } => {
            let mut status = status.clone();
            for condition in status["conditions"].as_array_mut().into_iter().flatten() {
                if let Value::Object(fields) = condition {
                    fields.remove("lastTransitionTime");
                }
            }
            hasher.hash_one(status.to_string())
        }
        Effect::Requeue(requeue) => hasher.hash_one(&requeue.value),
        Effect::Object(_) | Effect::Event(_) | Effect::Evict(_) => 0,
    }
}

impl InFlight {
    /// `effects` as one batch, less the ones in flight with the same content; returns the
    /// batch's number and what is to be performed, in the same order.
    pub(super) fn hand_out(&mut self, effects: Vec<Effect>) -> (u64, Vec<Effect>) {
        let batch = self.next_batch;
        self.next_batch += 1;
        let mut out = Vec::with_capacity(effects.len());
        for effect in effects {
            if let Effect::Object(write) = &effect {
                self.objects.insert(write.key().clone(), batch);
            } else {
                let (id, content) = (effect.id(), content(&effect));
                if self.others.get(&id).is_some_and(|(_, c)| *c == content) {
                    continue;
                }
                self.others.insert(id, (batch, content));
            }
            out.push(effect);
        }
        (batch, out)
    }

    /// `batch` was performed (the executor performs the batches in order, so every earlier one
    /// was too): its effects are no longer in flight. Returns the objects it wrote or tried to.
    pub(super) fn settle(&mut self, batch: u64) -> Vec<ObjectKey> {
        let mut objects = Vec::new();
        self.objects.retain(|key, b| {
            let settled = *b <= batch;
            if settled {
                objects.push(key.clone());
            }
            !settled
        });
        self.others.retain(|_, (b, _)| *b > batch);
        // A first converge's 10,000 writes are not kept in the tables' capacity.
        if self.objects.is_empty() {
            self.objects = HashMap::new();
        }
        if self.others.is_empty() {
            self.others = HashMap::new();
        }
        objects
    }
}
