//! What the class expressions of the policies match in the inventory, pool by pool
//! ([`match_pool`]): counted devices per expression set, overlaps, evaluation errors, and the
//! matching devices a taint keeps from claims.

use std::borrow::Borrow;
use std::collections::{BTreeMap, BTreeSet};

use super::{DeviceId, Pool};
use crate::dra_cel::{CompiledExpressions, ExpressionError};

/// Errors of one expression set, in device order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EvaluationErrors {
    pub devices: u32,
    /// The first few failures.
    pub first: Vec<(DeviceId, ExpressionError)>,
}

const ERRORS_KEPT: usize = 5;

/// How many counted devices each named expression set matches.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MatchReport {
    /// Every name, with 0 when nothing matches.
    pub counts: BTreeMap<String, u32>,
    /// Devices matched by two or more names.
    pub overlaps: Vec<(DeviceId, Vec<String>)>,
    /// Number of shared devices per pair of names (first < second).
    pub overlap_pairs: BTreeMap<(String, String), u32>,
    pub errors: BTreeMap<String, EvaluationErrors>,
    /// Per name, the matching devices of usable pools that a taint keeps from claims.
    pub tainted: BTreeMap<String, Tainted>,
}

/// Matching devices a taint keeps from claims (NoSchedule or NoExecute, as drivers mark
/// unhealthy devices: KEP-5055), and the first few taint keys.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Tainted {
    pub devices: u32,
    pub keys: BTreeSet<String>,
}

impl Tainted {
    fn add(&mut self, devices: u32, keys: impl IntoIterator<Item = String>) {
        self.devices += devices;
        for key in keys {
            if self.keys.len() < ERRORS_KEPT {
                self.keys.insert(key);
            }
        }
    }
}

impl MatchReport {
    /// Adds the report of the devices that follow this report's, as if matched in one pass.
    pub fn merge(&mut self, next: &MatchReport) {
        for (name, n) in &next.counts {
            match self.counts.get_mut(name) {
                Some(count) => *count += n,
                None => {
                    self.counts.insert(name.clone(), *n);
                }
            }
        }
        self.overlaps.extend(next.overlaps.iter().cloned());
        for (pair, n) in &next.overlap_pairs {
            *self.overlap_pairs.entry(pair.clone()).or_default() += n;
        }
        for (name, tainted) in &next.tainted {
            let mine = self.tainted.entry(name.clone()).or_default();
            mine.add(tainted.devices, tainted.keys.iter().cloned());
        }
        for (name, errors) in &next.errors {
            let mine = self.errors.entry(name.clone()).or_default();
            mine.devices += errors.devices;
            let room = ERRORS_KEPT.saturating_sub(mine.first.len());
            mine.first.extend(errors.first.iter().take(room).cloned());
        }
    }
}

/// One pool's devices against every named expression set. Only the names that match a device are
/// counted: a pool's report is kept per pool, and 5,000 pools of 20 mostly-zero counts would be
/// megabytes ([`Inventory::match_sets`] and [`MatchReport::merge`] give every name).
pub fn match_pool<S: Borrow<CompiledExpressions>>(
    pool: &Pool,
    sets: &BTreeMap<String, S>,
) -> MatchReport {
    let mut report = MatchReport::default();
    if pool.status.usable() {
        for device in pool.devices().filter(|d| d.tainted()) {
            for (name, set) in sets {
                if set.borrow().matches(device.env()) == Ok(true) {
                    let key = device.taint().unwrap_or_default().to_owned();
                    report
                        .tainted
                        .entry(name.clone())
                        .or_default()
                        .add(1, [key]);
                }
            }
        }
    }
    for device in pool.counted() {
        let mut names: Vec<&String> = Vec::new();
        for (name, set) in sets {
            match set.borrow().matches(device.env()) {
                Ok(true) => {
                    names.push(name);
                    match report.counts.get_mut(name) {
                        Some(c) => *c += 1,
                        None => {
                            report.counts.insert(name.clone(), 1);
                        }
                    }
                }
                Ok(false) => {}
                Err(e) => {
                    let errs = report.errors.entry(name.clone()).or_default();
                    errs.devices += 1;
                    if errs.first.len() < ERRORS_KEPT {
                        errs.first.push((device.id(), e));
                    }
                }
            }
        }
        if names.len() > 1 {
            for (i, a) in names.iter().enumerate() {
                for b in &names[i + 1..] {
                    *report
                        .overlap_pairs
                        .entry(((*a).clone(), (*b).clone()))
                        .or_default() += 1;
                }
            }
            report
                .overlaps
                .push((device.id(), names.into_iter().cloned().collect()));
        }
    }
    report
}
