//! [`CompiledExpressions`]: a list of expressions that must all be true, evaluated with
//! kube-cel on a device, or answered from a memo keyed by the few values the list reads.

use std::collections::HashMap;
use std::hash::Hasher;
use std::sync::{Arc, Mutex};

use kube_cel::cel::parser::Expression;
use kube_cel::cel::{ExecutionError, Value};
use rustc_hash::{FxBuildHasher, FxHasher};

use super::ExpressionError;
use super::compile::compile_one;
use super::context::root_context;
use super::device::{AttrValue, DeviceEnv, LeafValue};
use super::reads::{DeviceReads, Footprint, Leaf};

/// Entries kept per [`CompiledExpressions`] memo before it stops remembering new devices.
const MEMO_CAPACITY: usize = 16 * 1024;

#[derive(Debug)]
struct CompiledExpr {
    source: String,
    expr: Expression,
}

type Memo = HashMap<u64, Vec<(Vec<LeafKey>, Result<bool, ExpressionError>)>, FxBuildHasher>;

/// A list of expressions that must all be true (a DeviceClass's or a request's `selectors`).
#[derive(Debug)]
pub struct CompiledExpressions {
    exprs: Vec<CompiledExpr>,
    pub(super) footprint: Footprint,
    leaves: Vec<Leaf>,
    memo: Mutex<Memo>,
}

impl CompiledExpressions {
    /// Compiles `expressions`; the first invalid one is reported with its index.
    pub fn compile(expressions: &[String]) -> Result<Self, ExpressionError> {
        let mut exprs = Vec::with_capacity(expressions.len());
        let mut footprint = Footprint::default();
        for (index, source) in expressions.iter().enumerate() {
            let (expr, fp) = compile_one(index, source)?;
            footprint.merge(&fp);
            exprs.push(CompiledExpr {
                source: source.clone(),
                expr,
            });
        }
        let leaves = footprint.leaves.iter().cloned().collect();
        Ok(Self {
            exprs,
            footprint,
            leaves,
            memo: Mutex::new(Memo::default()),
        })
    }

    /// What these expressions read of a device.
    pub fn reads(&self) -> DeviceReads {
        DeviceReads::of(&self.footprint)
    }

    /// Whether every expression is true for `device`, evaluated in order like the Kubernetes
    /// allocator does (`selectorsMatch`): the first false stops with false, the first error
    /// stops with that error. An empty list matches every device.
    pub fn matches(&self, device: &DeviceEnv) -> Result<bool, ExpressionError> {
        if let Some(e) = device.invalid()
            && !self.exprs.is_empty()
        {
            return Err(e.clone());
        }
        if self.footprint.full {
            return self.evaluate(device);
        }
        // The leaves' values, on the stack for the usual handful of leaves.
        let mut stack = [LeafValue::Bool(false); 16];
        let heap: Vec<LeafValue<'_>>;
        let values: &[LeafValue<'_>] = if self.leaves.len() <= stack.len() {
            for (slot, leaf) in stack.iter_mut().zip(&self.leaves) {
                *slot = device.leaf(leaf);
            }
            &stack[..self.leaves.len()]
        } else {
            heap = self.leaves.iter().map(|l| device.leaf(l)).collect();
            &heap
        };
        let mut h = FxHasher::default();
        for v in values {
            v.hash_into(&mut h);
        }
        let hash = h.finish();
        if let Ok(memo) = self.memo.lock()
            && let Some(bucket) = memo.get(&hash)
        {
            for (k, result) in bucket {
                if k.len() == values.len() && values.iter().zip(k).all(|(v, k)| k.matches(v)) {
                    return result.clone();
                }
            }
        }
        let result = self.evaluate(device);
        if let Ok(mut memo) = self.memo.lock()
            && memo.len() < MEMO_CAPACITY
        {
            let k = values.iter().map(|v| LeafKey::of(*v)).collect();
            memo.entry(hash).or_default().push((k, result.clone()));
        }
        result
    }

    /// Every expression evaluated with kube-cel on `device`, as far as it reads it.
    pub(super) fn evaluate(&self, device: &DeviceEnv) -> Result<bool, ExpressionError> {
        if self.exprs.is_empty() {
            return Ok(true);
        }
        let mut scope = root_context().new_inner_scope();
        scope.add_variable_from_value("device", device.to_cel(&self.footprint));
        for (index, e) in self.exprs.iter().enumerate() {
            let err = |message: String| ExpressionError::Evaluation {
                index,
                expression: e.source.clone(),
                message,
            };
            match Value::resolve(&e.expr, &scope) {
                Ok(Value::Bool(true)) => {}
                Ok(Value::Bool(false)) => return Ok(false),
                Ok(other) => {
                    return Err(err(format!(
                        "CEL result of type {} is not a bool",
                        other.type_of()
                    )));
                }
                Err(e) => return Err(err(execution_message(&e))),
            }
        }
        Ok(true)
    }
}

fn execution_message(e: &ExecutionError) -> String {
    e.to_string()
}

/// A [`LeafValue`] as the memo keeps it.
#[derive(Debug, Clone)]
enum LeafKey {
    Driver(Arc<str>),
    Bool(bool),
    Attr(Option<AttrValue>),
    Cap(Option<Arc<str>>),
}

impl LeafKey {
    /// What the memo keeps of `value`.
    fn of(value: LeafValue<'_>) -> Self {
        match value {
            LeafValue::Driver(s) => Self::Driver(Arc::from(s)),
            LeafValue::Bool(b) => Self::Bool(b),
            LeafValue::Attr(v) => Self::Attr(v.cloned()),
            LeafValue::Cap(c) => Self::Cap(c.map(|c| c.raw.clone())),
        }
    }

    /// Whether `value` is the value this key was made of.
    fn matches(&self, value: &LeafValue<'_>) -> bool {
        match (value, self) {
            (LeafValue::Driver(a), Self::Driver(b)) => *a == &**b,
            (LeafValue::Bool(a), Self::Bool(b)) => a == b,
            (LeafValue::Attr(a), Self::Attr(b)) => *a == b.as_ref(),
            (LeafValue::Cap(a), Self::Cap(b)) => a.map(|c| &*c.raw) == b.as_deref(),
            _ => false,
        }
    }
}
