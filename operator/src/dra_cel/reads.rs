//! What expressions read of a device: [`DeviceReads`] for the caches that keep devices, and the
//! AST analysis behind it ([`Footprint`]), which also decides whether an expression can be
//! evaluated against the few values it reads.

use std::collections::BTreeSet;
use std::sync::Arc;

use kube_cel::cel::common::ast::{EntryExpr, Expr, IdedEntryExpr, LiteralValue, operators};

use crate::intern::Interner;

/// Which parts of a device some expression reads, so that a device projected to them evaluates
/// every such expression as the whole device would. `device.driver` and
/// `device.allowMultipleAllocations` are always kept.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct DeviceReads {
    /// Some expression reads the device in a way that may touch any attribute (`device` itself,
    /// all domains, a computed key): nothing is left out.
    pub(super) everything: bool,
    /// Domains read as a whole: every attribute (capacity) of them is kept.
    pub(super) attribute_domains: BTreeSet<String>,
    pub(super) capacity_domains: BTreeSet<String>,
    /// Single attributes and capacities read, as (domain, id).
    pub(super) attributes: BTreeSet<(String, String)>,
    pub(super) capacities: BTreeSet<(String, String)>,
}

impl DeviceReads {
    /// Keeps everything (a whole device).
    pub fn everything() -> Self {
        Self {
            everything: true,
            ..Self::default()
        }
    }

    /// Adds what `other` reads.
    pub fn extend(&mut self, other: &DeviceReads) {
        self.everything |= other.everything;
        self.attribute_domains
            .extend(other.attribute_domains.iter().cloned());
        self.capacity_domains
            .extend(other.capacity_domains.iter().cloned());
        self.attributes.extend(other.attributes.iter().cloned());
        self.capacities.extend(other.capacities.iter().cloned());
    }

    /// Whether a device projected to `self` holds everything `other` reads.
    pub fn covers(&self, other: &DeviceReads) -> bool {
        if self.everything {
            return true;
        }
        if other.everything {
            return false;
        }
        other.attribute_domains.is_subset(&self.attribute_domains)
            && other.capacity_domains.is_subset(&self.capacity_domains)
            && other
                .attributes
                .iter()
                .all(|(d, i)| self.keeps(DeviceMap::Attributes, d, i))
            && other
                .capacities
                .iter()
                .all(|(d, i)| self.keeps(DeviceMap::Capacity, d, i))
    }

    /// Whether a device projected to `self` keeps the attribute (capacity) `id` of `domain`.
    pub(super) fn keeps(&self, map: DeviceMap, domain: &str, id: &str) -> bool {
        let (domains, leaves) = match map {
            DeviceMap::Attributes => (&self.attribute_domains, &self.attributes),
            DeviceMap::Capacity => (&self.capacity_domains, &self.capacities),
        };
        // Called for every attribute of every device a slice publishes: the few leaves are
        // scanned rather than a key allocated for the set's lookup.
        self.everything
            || domains.contains(domain)
            || leaves.iter().any(|(d, i)| d == domain && i == id)
    }

    /// A short description for logs, e.g. `gpu.nvidia.com/productName, capacity gpu.nvidia.com/memory`.
    pub fn describe(&self) -> String {
        if self.everything {
            return "every attribute and capacity".to_owned();
        }
        let mut parts: Vec<String> = Vec::new();
        parts.extend(self.attribute_domains.iter().map(|d| format!("{d}/*")));
        parts.extend(self.attributes.iter().map(|(d, i)| format!("{d}/{i}")));
        parts.extend(
            self.capacity_domains
                .iter()
                .map(|d| format!("capacity {d}/*")),
        );
        parts.extend(
            self.capacities
                .iter()
                .map(|(d, i)| format!("capacity {d}/{i}")),
        );
        if parts.is_empty() {
            "no attribute".to_owned()
        } else {
            parts.join(", ")
        }
    }

    /// What `fp` reads.
    pub(super) fn of(fp: &Footprint) -> Self {
        let mut reads = DeviceReads {
            everything: fp.everything,
            ..DeviceReads::default()
        };
        for (map, domain) in &fp.whole_domains {
            match map {
                DeviceMap::Attributes => reads.attribute_domains.insert(domain.to_string()),
                DeviceMap::Capacity => reads.capacity_domains.insert(domain.to_string()),
            };
        }
        for leaf in &fp.leaves {
            match leaf {
                Leaf::Attribute(d, i) => reads.attributes.insert((d.to_string(), i.to_string())),
                Leaf::Capacity(d, i) => reads.capacities.insert((d.to_string(), i.to_string())),
                Leaf::Driver | Leaf::AllowMultipleAllocations => false,
            };
        }
        reads
    }
}

/// Which map of a device: `device.attributes` or `device.capacity`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum DeviceMap {
    Attributes,
    Capacity,
}

/// One value of a device an expression reads.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Leaf {
    Driver,
    AllowMultipleAllocations,
    Attribute(Arc<str>, Arc<str>),
    Capacity(Arc<str>, Arc<str>),
}

/// What an expression reads from `device`.
#[derive(Debug, Clone, Default)]
pub(super) struct Footprint {
    pub(super) leaves: BTreeSet<Leaf>,
    pub(super) attribute_domains: BTreeSet<Arc<str>>,
    pub(super) capacity_domains: BTreeSet<Arc<str>>,
    /// `device` is used in some other way: the whole device is needed.
    pub(super) full: bool,
    /// Domains read as a whole (iterated, sized, bound to a variable).
    whole_domains: BTreeSet<(DeviceMap, Arc<str>)>,
    /// `device` itself, a field this module does not know, or all domains are read: nothing
    /// may be left out of the device.
    everything: bool,
}

impl Footprint {
    pub(super) fn of(expr: &Expr) -> Self {
        let mut fp = Footprint::default();
        fp.visit(expr);
        fp
    }

    pub(super) fn merge(&mut self, other: &Footprint) {
        self.leaves.extend(other.leaves.iter().cloned());
        self.attribute_domains
            .extend(other.attribute_domains.iter().cloned());
        self.capacity_domains
            .extend(other.capacity_domains.iter().cloned());
        self.full |= other.full;
        self.whole_domains
            .extend(other.whole_domains.iter().cloned());
        self.everything |= other.everything;
    }

    fn add_domain(&mut self, map: DeviceMap, domain: &str) {
        match map {
            DeviceMap::Attributes => self.attribute_domains.insert(Arc::from(domain)),
            DeviceMap::Capacity => self.capacity_domains.insert(Arc::from(domain)),
        };
    }

    fn add_leaf(&mut self, map: DeviceMap, domain: &str, id: &str) {
        self.add_domain(map, domain);
        self.leaves.insert(match map {
            DeviceMap::Attributes => Leaf::Attribute(shared_name(domain), shared_name(id)),
            DeviceMap::Capacity => Leaf::Capacity(shared_name(domain), shared_name(id)),
        });
    }

    fn visit(&mut self, expr: &Expr) {
        if let Some(path) = device_path(expr) {
            match path {
                Path::Leaf(map, domain, id) => self.add_leaf(map, domain, id),
                Path::Field("driver") => {
                    self.leaves.insert(Leaf::Driver);
                }
                Path::Field("allowMultipleAllocations") => {
                    self.leaves.insert(Leaf::AllowMultipleAllocations);
                }
                Path::Domain(map, domain) => {
                    self.add_domain(map, domain);
                    self.whole_domains.insert((map, Arc::from(domain)));
                    self.full = true;
                }
                Path::Device | Path::Field(_) | Path::Map(_) => {
                    self.full = true;
                    self.everything = true;
                }
            }
            return;
        }
        // `'id' in device.attributes['d']` reads only whether leaf `id` exists.
        if let Expr::Call(c) = expr
            && c.func_name == operators::IN
            && let [k, m] = c.args.as_slice()
            && let Some(id) = string_literal(&k.expr)
            && let Some(Path::Domain(map, domain)) = device_path(&m.expr)
        {
            self.add_leaf(map, domain, id);
            return;
        }
        match expr {
            Expr::Call(call) => {
                if let Some(t) = &call.target {
                    self.visit(&t.expr);
                }
                for a in &call.args {
                    self.visit(&a.expr);
                }
            }
            Expr::Comprehension(c) => {
                for e in [
                    &c.iter_range,
                    &c.accu_init,
                    &c.loop_cond,
                    &c.loop_step,
                    &c.result,
                ] {
                    self.visit(&e.expr);
                }
            }
            Expr::List(l) => l.elements.iter().for_each(|e| self.visit(&e.expr)),
            Expr::Map(m) => self.visit_entries(&m.entries),
            Expr::Struct(s) => self.visit_entries(&s.entries),
            Expr::Select(s) => self.visit(&s.operand.expr),
            Expr::Ident(_) | Expr::Literal(_) | Expr::Unspecified => {}
        }
    }

    fn visit_entries(&mut self, entries: &[IdedEntryExpr]) {
        for e in entries {
            match &e.expr {
                EntryExpr::MapEntry(m) => {
                    self.visit(&m.key.expr);
                    self.visit(&m.value.expr);
                }
                EntryExpr::StructField(f) => self.visit(&f.value.expr),
            }
        }
    }
}

/// A fixed path below `device`.
#[derive(Debug)]
pub(super) enum Path<'a> {
    Device,
    Field(&'a str),
    Map(DeviceMap),
    Domain(DeviceMap, &'a str),
    Leaf(DeviceMap, &'a str, &'a str),
}

fn string_literal(e: &Expr) -> Option<&str> {
    match e {
        Expr::Literal(LiteralValue::String(s)) => Some(s.inner()),
        _ => None,
    }
}

/// `expr` as a fixed path below `device`, if it is one.
pub(super) fn device_path(expr: &Expr) -> Option<Path<'_>> {
    fn child<'a>(parent: Path<'a>, name: &'a str, optional: bool) -> Option<Path<'a>> {
        match parent {
            Path::Device if !optional => Some(match name {
                "attributes" => Path::Map(DeviceMap::Attributes),
                "capacity" => Path::Map(DeviceMap::Capacity),
                other => Path::Field(other),
            }),
            Path::Map(map) if !optional => Some(Path::Domain(map, name)),
            // `m[id]`, `m.id`, `m[?id]`, `m.?id`: the value (or its absence) of one leaf.
            Path::Domain(map, domain) => Some(Path::Leaf(map, domain, name)),
            _ => None,
        }
    }
    match expr {
        Expr::Ident(name) if name == "device" => Some(Path::Device),
        Expr::Select(s) => {
            let parent = device_path(&s.operand.expr)?;
            if s.test {
                // `has(m.id)` reads only whether leaf `id` exists.
                match parent {
                    Path::Domain(map, domain) => Some(Path::Leaf(map, domain, &s.field)),
                    _ => None,
                }
            } else {
                child(parent, &s.field, false)
            }
        }
        Expr::Call(c) if c.target.is_none() && c.args.len() == 2 => {
            let optional = match c.func_name.as_str() {
                operators::INDEX => false,
                operators::OPT_INDEX | operators::OPT_SELECT => true,
                _ => return None,
            };
            let name = string_literal(&c.args[1].expr)?;
            let parent = device_path(&c.args[0].expr)?;
            child(parent, name, optional)
        }
        _ => None,
    }
}

/// The one shared copy of an attribute or capacity name (a domain or an id), for every device
/// input and every compiled expression: an expression then finds a device's attribute by pointer.
/// Drivers publish a fixed set of names; past `KEPT` distinct names a name is not shared (and
/// found by its text).
pub(super) fn shared_name(name: &str) -> Arc<str> {
    const KEPT: usize = 1 << 16;
    static NAMES: std::sync::OnceLock<std::sync::Mutex<Interner<str>>> = std::sync::OnceLock::new();
    let mut names = NAMES
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if names.len() >= KEPT {
        return Arc::from(name);
    }
    names.intern(name)
}
