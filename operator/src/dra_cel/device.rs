//! The CEL input of a device ([`DeviceEnv`]): its driver, typed attributes and capacities,
//! projected to what the expressions read, and shared between devices whose input is equal
//! ([`DeviceEnvs`]).

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use k8s_openapi::api::resource::v1::{Device, DeviceAttribute};
use kube_cel::cel::Value;
use kube_cel::cel::objects::{Key, Map};

use super::context::{ParseKind, parse_with_kube_cel};
use super::reads::{DeviceMap, DeviceReads, Footprint, Leaf, shared_name};
use super::{ExpressionError, parse_qualified_name};
use crate::intern::Interner;

/// A typed attribute value, as upstream `getAttributeValue` returns it.
#[derive(Debug, Clone)]
pub(crate) enum AttrValue {
    String(Arc<str>),
    Int(i64),
    Bool(bool),
    /// The raw version string and its kube-cel `semver` value.
    Version(Arc<str>, Value),
}

impl PartialEq for AttrValue {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Self::String(a), Self::String(b)) => a == b,
            (Self::Int(a), Self::Int(b)) => a == b,
            (Self::Bool(a), Self::Bool(b)) => a == b,
            (Self::Version(a, _), Self::Version(b, _)) => a == b,
            _ => false,
        }
    }
}

impl AttrValue {
    pub(super) fn hash_into<H: Hasher>(&self, h: &mut H) {
        match self {
            Self::String(s) => (0u8, &**s).hash(h),
            Self::Int(i) => (1u8, i).hash(h),
            Self::Bool(b) => (2u8, b).hash(h),
            Self::Version(s, _) => (3u8, &**s).hash(h),
        }
    }

    fn to_cel(&self) -> Value {
        match self {
            Self::String(s) => Value::String(Arc::new(s.to_string())),
            Self::Int(i) => Value::Int(*i),
            Self::Bool(b) => Value::Bool(*b),
            Self::Version(_, v) => v.clone(),
        }
    }

    /// Human-readable value, e.g. for reports.
    #[cfg(test)]
    pub(crate) fn display(&self) -> String {
        match self {
            Self::String(s) | Self::Version(s, _) => s.to_string(),
            Self::Int(i) => i.to_string(),
            Self::Bool(b) => b.to_string(),
        }
    }
}

/// A capacity: the raw quantity string and its kube-cel `quantity` value.
#[derive(Debug, Clone)]
pub(super) struct CapValue {
    pub(super) raw: Arc<str>,
    value: Value,
}

impl PartialEq for CapValue {
    fn eq(&self, other: &Self) -> bool {
        self.raw == other.raw
    }
}

/// `(domain, id, value)`, sorted by domain and id, names interned.
type Entries<T> = Vec<(Arc<str>, Arc<str>, T)>;

/// The CEL input of one device, built once per device and reused for every expression: its
/// driver, `allowMultipleAllocations`, and the typed attributes and capacities that expressions
/// read (all of them when they may read any). Whether it can be evaluated at all is decided on
/// every attribute and capacity, kept or not, as upstream builds the whole map before
/// evaluating.
#[derive(Debug, Clone)]
pub struct DeviceEnv {
    driver: Arc<str>,
    attributes: Entries<AttrValue>,
    capacity: Entries<CapValue>,
    allow_multiple_allocations: bool,
    /// First problem found while converting the device; every evaluation then fails.
    invalid: Option<ExpressionError>,
}

impl PartialEq for DeviceEnv {
    fn eq(&self, other: &Self) -> bool {
        fn entries_eq<T: PartialEq>(a: &Entries<T>, b: &Entries<T>) -> bool {
            a.len() == b.len()
                && a.iter()
                    .zip(b)
                    .all(|(x, y)| same(&x.0, &y.0) && same(&x.1, &y.1) && x.2 == y.2)
        }
        same(&self.driver, &other.driver)
            && self.allow_multiple_allocations == other.allow_multiple_allocations
            && self.invalid == other.invalid
            && entries_eq(&self.attributes, &other.attributes)
            && entries_eq(&self.capacity, &other.capacity)
    }
}

impl Eq for DeviceEnv {}

impl Hash for DeviceEnv {
    fn hash<H: Hasher>(&self, h: &mut H) {
        (&*self.driver, self.allow_multiple_allocations).hash(h);
        for (d, i, v) in &self.attributes {
            (&**d, &**i).hash(h);
            v.hash_into(h);
        }
        for (d, i, c) in &self.capacity {
            (&**d, &**i, &*c.raw).hash(h);
        }
        self.invalid.as_ref().map(ToString::to_string).hash(h);
    }
}

/// Builds the CEL input of devices and shares one [`DeviceEnv`] between the devices whose
/// input is equal: once projected to what the expressions read, the devices of one model are (the 8
/// GPUs of a node, the nodes of a pool), so a cluster of 40,000 devices holds a few dozen. The
/// names in them (driver, domains, ids, quantities) are shared too, so that equal inputs mostly
/// compare by pointer and a whole device (nothing projected away) holds no copy of a name.
#[derive(Debug, Default)]
pub struct DeviceEnvs {
    envs: Interner<DeviceEnv>,
    names: Interner<str>,
}

impl DeviceEnvs {
    /// The shared CEL input of `device`, published by `driver` (the slice's `spec.driver`),
    /// keeping only the attributes and capacities `reads` names.
    pub fn project(
        &mut self,
        driver: &str,
        device: &Device,
        reads: &DeviceReads,
    ) -> Arc<DeviceEnv> {
        let env = DeviceEnv::build(driver, device, reads, &mut self.names);
        self.envs.share(env)
    }

    /// Forgets the environments no device holds any more, and the names only they held.
    pub fn prune(&mut self) {
        self.envs.prune();
        self.names.prune();
    }

    /// How many distinct environments are shared.
    pub fn len(&self) -> usize {
        self.envs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.envs.is_empty()
    }
}

/// Sorted by (domain, id), the last entry of each key winning (as a map insert would).
fn last_of_each_key<T>(mut entries: Entries<T>) -> Entries<T> {
    entries.sort_by(|a, b| (&*a.0, &*a.1).cmp(&(&*b.0, &*b.1)));
    let mut out: Entries<T> = Vec::with_capacity(entries.len());
    for entry in entries {
        match out.last_mut() {
            Some(last) if *last.0 == *entry.0 && *last.1 == *entry.1 => *last = entry,
            _ => out.push(entry),
        }
    }
    out
}

/// The names of environments built by one [`DeviceEnvs`] are shared, so a pointer comparison
/// usually decides; equal text decides otherwise.
fn same(a: &Arc<str>, b: &Arc<str>) -> bool {
    Arc::ptr_eq(a, b) || **a == **b
}

/// The entry of an expression's leaf, whose names are shared with the devices' ([`shared_name`]).
fn find_leaf<'a, T>(entries: &'a Entries<T>, domain: &Arc<str>, id: &Arc<str>) -> Option<&'a T> {
    entries
        .iter()
        .find(|(d, i, _)| same(i, id) && same(d, domain))
        .map(|(_, _, v)| v)
}

/// The value of one [`Leaf`] on a device, as the memo compares it.
#[derive(Clone, Copy)]
pub(super) enum LeafValue<'a> {
    Driver(&'a str),
    Bool(bool),
    Attr(Option<&'a AttrValue>),
    Cap(Option<&'a CapValue>),
}

impl LeafValue<'_> {
    pub(super) fn hash_into<H: Hasher>(&self, h: &mut H) {
        match self {
            Self::Driver(s) => (0u8, *s).hash(h),
            Self::Bool(b) => (1u8, b).hash(h),
            Self::Attr(None) | Self::Cap(None) => 2u8.hash(h),
            Self::Attr(Some(v)) => {
                3u8.hash(h);
                v.hash_into(h);
            }
            Self::Cap(Some(c)) => (4u8, &*c.raw).hash(h),
        }
    }
}

#[cfg(test)]
fn find<'a, T>(entries: &'a Entries<T>, domain: &str, id: &str) -> Option<&'a T> {
    entries
        .iter()
        .find(|(d, i, _)| &**i == id && &**d == domain)
        .map(|(_, _, v)| v)
}

/// Records the first problem found while converting a device.
fn note_invalid(invalid: &mut Option<ExpressionError>, name: &str, message: String) {
    invalid.get_or_insert(ExpressionError::Device {
        name: name.to_owned(),
        message,
    });
}

impl DeviceEnv {
    /// The `device` variable of `device`, published by `driver`, keeping only the attributes
    /// and capacities `reads` names, its names shared through `names`. When two names denote
    /// the same domain and id (`memory` and `<driver>/memory`; API validation should prevent
    /// it), the later one in name order wins.
    fn build(
        driver: &str,
        device: &Device,
        reads: &DeviceReads,
        names: &mut Interner<str>,
    ) -> Self {
        let mut invalid = None;
        // Names come in name order (the API's maps are sorted); a stable sort by (domain, id)
        // followed by keeping the last of equal keys gives the same result as a map insert,
        // without a map's allocations (this runs once per device of the cluster).
        let mut attributes: Entries<AttrValue> = Vec::new();
        for (name, attr) in device.attributes.iter().flatten() {
            let (domain, id) = parse_qualified_name(name, driver);
            match attr_value(attr) {
                Ok(v) if reads.keeps(DeviceMap::Attributes, domain, id) => {
                    attributes.push((shared_name(domain), shared_name(id), v));
                }
                Ok(_) => {}
                Err(message) => note_invalid(&mut invalid, name, message),
            }
        }
        let mut capacity: Entries<CapValue> = Vec::new();
        for (name, cap) in device.capacity.iter().flatten() {
            let (domain, id) = parse_qualified_name(name, driver);
            match parse_with_kube_cel(ParseKind::Quantity, &cap.value.0) {
                Ok(value) if reads.keeps(DeviceMap::Capacity, domain, id) => {
                    let raw = names.intern(cap.value.0.as_str());
                    let (domain, id) = (shared_name(domain), shared_name(id));
                    capacity.push((domain, id, CapValue { raw, value }));
                }
                Ok(_) => {}
                Err(message) => note_invalid(&mut invalid, name, message),
            }
        }
        let mut attributes = last_of_each_key(attributes);
        let mut capacity = last_of_each_key(capacity);
        attributes.shrink_to_fit();
        capacity.shrink_to_fit();
        Self {
            driver: names.intern(driver),
            attributes,
            capacity,
            allow_multiple_allocations: device.allow_multiple_allocations.unwrap_or(false),
            invalid,
        }
    }

    /// The whole `device` variable of `device` (every attribute and capacity kept), unshared.
    #[cfg(test)]
    pub(crate) fn new(driver: &str, device: &Device) -> Self {
        Self::build(
            driver,
            device,
            &DeviceReads::everything(),
            &mut Interner::default(),
        )
    }

    /// The attribute `id` of `domain`.
    #[cfg(test)]
    pub(crate) fn attribute(&self, domain: &str, id: &str) -> Option<&AttrValue> {
        find(&self.attributes, domain, id)
    }

    /// The raw quantity string of capacity `id` of `domain`.
    #[cfg(test)]
    pub(crate) fn capacity(&self, domain: &str, id: &str) -> Option<&str> {
        find(&self.capacity, domain, id).map(|c| &*c.raw)
    }

    /// Why this device cannot be evaluated at all, if it cannot.
    pub(super) fn invalid(&self) -> Option<&ExpressionError> {
        self.invalid.as_ref()
    }

    pub(super) fn leaf(&self, leaf: &Leaf) -> LeafValue<'_> {
        match leaf {
            Leaf::Driver => LeafValue::Driver(&self.driver),
            Leaf::AllowMultipleAllocations => LeafValue::Bool(self.allow_multiple_allocations),
            Leaf::Attribute(d, n) => LeafValue::Attr(find_leaf(&self.attributes, d, n)),
            Leaf::Capacity(d, n) => LeafValue::Cap(find_leaf(&self.capacity, d, n)),
        }
    }

    /// The CEL value of `device`: everything, or only `fp`'s leaves; plus an empty map for
    /// every domain `fp` names that the device lacks.
    pub(super) fn to_cel(&self, fp: &Footprint) -> Value {
        let mut attributes: HashMap<Key, HashMap<Key, Value>> = HashMap::new();
        let mut capacity: HashMap<Key, HashMap<Key, Value>> = HashMap::new();
        for d in &fp.attribute_domains {
            attributes.entry(key(d)).or_default();
        }
        for d in &fp.capacity_domains {
            capacity.entry(key(d)).or_default();
        }
        let mut put = |map: DeviceMap, d: &str, n: &str, v: Value| {
            let m = match map {
                DeviceMap::Attributes => &mut attributes,
                DeviceMap::Capacity => &mut capacity,
            };
            m.entry(key(d)).or_default().insert(key(n), v);
        };
        if fp.full {
            for (d, n, v) in &self.attributes {
                put(DeviceMap::Attributes, d, n, v.to_cel());
            }
            for (d, n, v) in &self.capacity {
                put(DeviceMap::Capacity, d, n, v.value.clone());
            }
        } else {
            for leaf in &fp.leaves {
                match leaf {
                    Leaf::Attribute(d, n) => {
                        if let Some(v) = find_leaf(&self.attributes, d, n) {
                            put(DeviceMap::Attributes, d, n, v.to_cel());
                        }
                    }
                    Leaf::Capacity(d, n) => {
                        if let Some(v) = find_leaf(&self.capacity, d, n) {
                            put(DeviceMap::Capacity, d, n, v.value.clone());
                        }
                    }
                    Leaf::Driver | Leaf::AllowMultipleAllocations => {}
                }
            }
        }
        let nest = |m: HashMap<Key, HashMap<Key, Value>>| -> Value {
            let inner: HashMap<Key, Value> = m
                .into_iter()
                .map(|(k, v)| (k, Value::Map(Map::from(v))))
                .collect();
            Value::Map(Map::from(inner))
        };
        let mut device: HashMap<Key, Value> = HashMap::new();
        device.insert(
            key("driver"),
            Value::String(Arc::new(self.driver.to_string())),
        );
        device.insert(key("attributes"), nest(attributes));
        device.insert(key("capacity"), nest(capacity));
        device.insert(
            key("allowMultipleAllocations"),
            Value::Bool(self.allow_multiple_allocations),
        );
        Value::Map(Map::from(device))
    }
}

fn key(s: &str) -> Key {
    Key::String(Arc::new(s.to_owned()))
}

/// Upstream `getAttributeValue`: the first set of int, bool, string, version.
fn attr_value(attr: &DeviceAttribute) -> Result<AttrValue, String> {
    if let Some(i) = attr.int {
        Ok(AttrValue::Int(i))
    } else if let Some(b) = attr.bool {
        Ok(AttrValue::Bool(b))
    } else if let Some(s) = &attr.string {
        Ok(AttrValue::String(Arc::from(s.as_str())))
    } else if let Some(v) = &attr.version {
        let value = parse_with_kube_cel(ParseKind::Semver, v)
            .map_err(|e| format!("parse semantic version: {e}"))?;
        Ok(AttrValue::Version(Arc::from(v.as_str()), value))
    } else {
        Err("unsupported attribute value".to_owned())
    }
}
