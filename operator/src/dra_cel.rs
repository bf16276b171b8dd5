//! Compile and evaluate DRA device selector expressions with kube-cel.
//!
//! The `device` variable mirrors the DRA CEL environment of Kubernetes
//! (`staging/src/k8s.io/dynamic-resource-allocation/cel/compile.go`, `DeviceMatches`):
//!
//! * `device.driver`: the driver name of the device's ResourceSlice;
//! * `device.attributes[domain][id]`: every attribute, grouped by domain. A name without a `/`
//!   belongs to the driver's domain, a qualified name `domain/id` is split at its first `/`
//!   (`parseQualifiedName`). Values are typed: string, int, bool, or a semver for `version`
//!   (parsed strictly, like `semver.Parse` of blang/semver; an unparsable version makes every
//!   evaluation on that device fail, as upstream builds the whole map before evaluating);
//! * `device.capacity[domain][id]`: every capacity as a `quantity`;
//! * `device.allowMultipleAllocations`: the device's field, `false` when unset (Kubernetes
//!   1.34+ with DRAConsumableCapacity, documented on `CELDeviceSelector.expression`).
//!
//! Upstream looks up an unknown domain (`device.attributes['other.example.com']`) as an empty map
//! (`newStringInterfaceMapWithDefault`), so only an unknown *attribute* errors. cel-rust has no
//! defaulting map, so every domain an expression names with a literal is inserted as an empty map
//! when the device has none. A domain computed at runtime cannot be defaulted; that lookup
//! errors here where Kubernetes would see an empty map.
//!
//! `cel.bind(var, init, body)` (enabled upstream through `ext.Bindings`) is provided as a lazy
//! function that evaluates `body` with `var` bound, since cel-rust 0.13 has no such macro.
//! Optional syntax (`m.?x`, `m[?k]`), on in the Kubernetes base environment, is enabled.
//!
//! Differences that remain (cel-rust is not cel-go): there is no type checker, so compile-time
//! checking ([`check_expression`]) rejects syntax errors, undeclared variables, expressions over
//! 10 Ki and results that are evidently not bool, and everything else surfaces at evaluation
//! (an unknown function, a type mismatch); there is no cost limit; cel-go only functions
//! (e.g. the `includes()` of the alpha DRAListTypeAttributes) are missing.
//!
//! Performance: cel-rust deep-copies maps when they are bound or selected, so evaluating an
//! expression against a whole device costs tens of µs. Most selectors only read a few fixed
//! attributes (`device.attributes['gpu.nvidia.com'].productName`). [`CompiledSelectors`]
//! therefore analyses the AST: when every use of `device` is such a fixed path, the result
//! is a pure function of those few values, so it evaluates (with kube-cel) against a device
//! holding only them, and memoises the result by those values. Devices of one model share one
//! evaluation. Fixed paths are `device.driver`, `device.allowMultipleAllocations`,
//! `device.attributes[<lit>].<id>` / `[<lit>]` / `[?<lit>]` / `.?<id>`, `has(...)` of those, and
//! `<lit> in device.attributes[<lit>]` (same for `capacity`). Expressions that use `device` in any
//! other way (iterating or sizing a domain, `cel.bind` over a domain map, a computed key, ...) are
//! evaluated against the full device every time.

use std::collections::{BTreeSet, HashMap};
use std::hash::{Hash, Hasher};

use rustc_hash::{FxBuildHasher, FxHasher};
use std::sync::{Arc, Mutex, OnceLock};

use k8s_openapi::api::resource::v1::{Device, DeviceAttribute};
use kube_cel::KubeCelExt;
use kube_cel::cel::common::ast::{EntryExpr, Expr, LiteralValue, operators};
use kube_cel::cel::objects::{Key, Map};
use kube_cel::cel::parser::{Expression, Parser};
use kube_cel::cel::{Context, ExecutionError, FunctionContext, Program, ResolveResult, Value};

/// Maximum length of a selector expression (`CELSelectorExpressionMaxLength`, 10 Ki).
pub const EXPRESSION_MAX_LENGTH: usize = 10 * 1024;

/// Entries kept per [`CompiledSelectors`] memo before it stops remembering new devices.
const MEMO_CAPACITY: usize = 16 * 1024;
/// Distinct version/quantity strings whose parsed CEL value is remembered process-wide.
const PARSE_MEMO_CAPACITY: usize = 16 * 1024;
/// Distinct names kept by the process-wide name interner.
const INTERN_CAPACITY: usize = 16 * 1024;

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SelectorError {
    /// The expression does not compile (or can never yield a bool).
    #[error("selector #{index} `{expression}` is invalid: {message}")]
    Invalid {
        index: usize,
        expression: String,
        message: String,
    },
    /// The expression compiled but failed on a device. Kubernetes aborts the allocation of a
    /// claim when this happens.
    #[error("selector #{index} `{expression}` failed: {message}")]
    Evaluation {
        index: usize,
        expression: String,
        message: String,
    },
    /// The device itself cannot be turned into a CEL value (e.g. an unparsable version).
    #[error("device attribute or capacity {name}: {message}")]
    Device { name: String, message: String },
}

/// A typed attribute value, as upstream `getAttributeValue` returns it.
#[derive(Debug, Clone)]
pub enum AttrValue {
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
    fn hash_into<H: Hasher>(&self, h: &mut H) {
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
    pub fn display(&self) -> String {
        match self {
            Self::String(s) | Self::Version(s, _) => s.to_string(),
            Self::Int(i) => i.to_string(),
            Self::Bool(b) => b.to_string(),
        }
    }
}

/// A capacity: the raw quantity string and its kube-cel `quantity` value.
#[derive(Debug, Clone)]
pub struct CapValue {
    pub raw: Arc<str>,
    value: Value,
}

impl PartialEq for CapValue {
    fn eq(&self, other: &Self) -> bool {
        self.raw == other.raw
    }
}

/// `(domain, id, value)`, sorted by domain and id, names interned.
type Entries<T> = Vec<(Arc<str>, Arc<str>, T)>;

/// The CEL input of one device, built once per device and reused for every selector.
#[derive(Debug, Clone)]
pub struct DeviceEnv {
    driver: Arc<str>,
    attributes: Entries<AttrValue>,
    capacity: Entries<CapValue>,
    allow_multiple_allocations: bool,
    /// First problem found while converting the device; every evaluation then fails.
    invalid: Option<SelectorError>,
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

/// Shares one [`DeviceEnv`] between the devices whose CEL input is equal: once projected to
/// what selectors read, the devices of one model are (the 8 GPUs of a node, the nodes of a
/// pool), so a cluster of 40,000 devices holds a few dozen.
#[derive(Debug, Default)]
pub struct DeviceEnvs {
    envs: std::collections::HashSet<Arc<DeviceEnv>, FxBuildHasher>,
}

impl DeviceEnvs {
    /// The shared copy of `env`.
    pub fn share(&mut self, env: DeviceEnv) -> Arc<DeviceEnv> {
        if let Some(shared) = self.envs.get(&env) {
            return shared.clone();
        }
        let shared = Arc::new(env);
        self.envs.insert(shared.clone());
        shared
    }

    /// Forgets the environments no device holds any more.
    pub fn prune(&mut self) {
        self.envs.retain(|e| Arc::strong_count(e) > 1);
        self.envs.shrink_to_fit();
    }

    pub fn len(&self) -> usize {
        self.envs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.envs.is_empty()
    }
}

/// Which parts of a device some selector reads, so that a device projected to them evaluates
/// every such selector as the whole device would. `device.driver` and
/// `device.allowMultipleAllocations` are always kept.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct DeviceReads {
    /// Some selector reads the device in a way that may touch any attribute (`device` itself,
    /// all domains, a computed key): nothing is left out.
    pub everything: bool,
    /// Domains read as a whole: every attribute (capacity) of them is kept.
    pub attribute_domains: BTreeSet<String>,
    pub capacity_domains: BTreeSet<String>,
    /// Single attributes and capacities read, as (domain, id).
    pub attributes: BTreeSet<(String, String)>,
    pub capacities: BTreeSet<(String, String)>,
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
                .all(|(d, i)| self.keeps(Kind::Attributes, d, i))
            && other
                .capacities
                .iter()
                .all(|(d, i)| self.keeps(Kind::Capacity, d, i))
    }

    fn keeps(&self, kind: Kind, domain: &str, id: &str) -> bool {
        let (domains, leaves) = match kind {
            Kind::Attributes => (&self.attribute_domains, &self.attributes),
            Kind::Capacity => (&self.capacity_domains, &self.capacities),
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
}

/// Splits a qualified name at its first `/`; a name without one is in `default_domain`
/// (upstream `parseQualifiedName`).
pub fn parse_qualified_name<'a>(name: &'a str, default_domain: &'a str) -> (&'a str, &'a str) {
    match name.find('/') {
        Some(i) => (&name[..i], &name[i + 1..]),
        None => (default_domain, name),
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

/// Names are interned, so a pointer comparison usually decides; equal text decides otherwise.
fn same(a: &Arc<str>, b: &Arc<str>) -> bool {
    Arc::ptr_eq(a, b) || **a == **b
}

fn find<'a, T>(entries: &'a Entries<T>, domain: &Arc<str>, id: &Arc<str>) -> Option<&'a T> {
    entries
        .iter()
        .find(|(d, i, _)| same(i, id) && same(d, domain))
        .map(|(_, _, v)| v)
}

fn find_str<'a, T>(entries: &'a Entries<T>, domain: &str, id: &str) -> Option<&'a T> {
    entries
        .iter()
        .find(|(d, i, _)| &**i == id && &**d == domain)
        .map(|(_, _, v)| v)
}

impl DeviceEnv {
    /// Builds the `device` variable of `device`, published by `driver` (the slice's
    /// `spec.driver`). When two names denote the same domain and id (`memory` and
    /// `<driver>/memory`; API validation should prevent it), the later one in name order wins.
    pub fn new(driver: &str, device: &Device) -> Self {
        Self::projected(driver, device, &DeviceReads::everything())
    }

    /// [`DeviceEnv::new`] keeping only the attributes and capacities `reads` names. Whether the
    /// device can be evaluated at all is decided on all of them, as upstream builds the whole
    /// map before evaluating.
    pub fn projected(driver: &str, device: &Device, reads: &DeviceReads) -> Self {
        let mut invalid = None;
        // Names come in name order (the API's maps are sorted); a stable sort by (domain, id)
        // followed by keeping the last of equal keys gives the same result as a map insert,
        // without a map's allocations (this runs once per device of the cluster).
        let mut attributes: Entries<AttrValue> = Vec::new();
        for (name, attr) in device.attributes.iter().flatten() {
            let (domain, id) = parse_qualified_name(name, driver);
            match attr_value(attr) {
                Ok(v) if reads.keeps(Kind::Attributes, domain, id) => {
                    attributes.push((intern(domain), intern(id), v));
                }
                Ok(_) => {}
                Err(message) => {
                    invalid.get_or_insert(SelectorError::Device {
                        name: name.clone(),
                        message,
                    });
                }
            }
        }
        let mut capacity: Entries<CapValue> = Vec::new();
        for (name, cap) in device.capacity.iter().flatten() {
            let (domain, id) = parse_qualified_name(name, driver);
            match parse_with_kube_cel(ParseKind::Quantity, &cap.value.0) {
                Ok(value) if reads.keeps(Kind::Capacity, domain, id) => {
                    let raw = intern(cap.value.0.as_str());
                    capacity.push((intern(domain), intern(id), CapValue { raw, value }));
                }
                Ok(_) => {}
                Err(message) => {
                    invalid.get_or_insert(SelectorError::Device {
                        name: name.clone(),
                        message,
                    });
                }
            }
        }
        let mut attributes = last_of_each_key(attributes);
        let mut capacity = last_of_each_key(capacity);
        attributes.shrink_to_fit();
        capacity.shrink_to_fit();
        Self {
            driver: intern(driver),
            attributes,
            capacity,
            allow_multiple_allocations: device.allow_multiple_allocations.unwrap_or(false),
            invalid,
        }
    }

    pub fn driver(&self) -> &str {
        &self.driver
    }

    /// The attribute `id` of `domain`.
    pub fn attribute(&self, domain: &str, id: &str) -> Option<&AttrValue> {
        find_str(&self.attributes, domain, id)
    }

    /// The raw quantity string of capacity `id` of `domain`.
    pub fn capacity(&self, domain: &str, id: &str) -> Option<&str> {
        find_str(&self.capacity, domain, id).map(|c| &*c.raw)
    }

    /// Why this device cannot be evaluated at all, if it cannot.
    pub fn invalid(&self) -> Option<&SelectorError> {
        self.invalid.as_ref()
    }

    fn leaf(&self, leaf: &Leaf) -> LeafValue<'_> {
        match leaf {
            Leaf::Driver => LeafValue::Driver(&self.driver),
            Leaf::AllowMultipleAllocations => LeafValue::Bool(self.allow_multiple_allocations),
            Leaf::Attribute(d, n) => LeafValue::Attr(find(&self.attributes, d, n)),
            Leaf::Capacity(d, n) => LeafValue::Cap(find(&self.capacity, d, n)),
        }
    }

    /// The CEL value of `device`: everything, or only `fp`'s leaves; plus an empty map for
    /// every domain `fp` names that the device lacks.
    fn to_cel(&self, fp: &Footprint) -> Value {
        let mut attributes: HashMap<Key, HashMap<Key, Value>> = HashMap::new();
        let mut capacity: HashMap<Key, HashMap<Key, Value>> = HashMap::new();
        for d in &fp.attribute_domains {
            attributes.entry(key(d)).or_default();
        }
        for d in &fp.capacity_domains {
            capacity.entry(key(d)).or_default();
        }
        if fp.full {
            for (d, n, v) in &self.attributes {
                attributes
                    .entry(key(d))
                    .or_default()
                    .insert(key(n), v.to_cel());
            }
            for (d, n, v) in &self.capacity {
                capacity
                    .entry(key(d))
                    .or_default()
                    .insert(key(n), v.value.clone());
            }
        } else {
            for leaf in &fp.leaves {
                match leaf {
                    Leaf::Attribute(d, n) => {
                        if let Some(v) = find(&self.attributes, d, n) {
                            attributes
                                .entry(key(d))
                                .or_default()
                                .insert(key(n), v.to_cel());
                        }
                    }
                    Leaf::Capacity(d, n) => {
                        if let Some(v) = find(&self.capacity, d, n) {
                            capacity
                                .entry(key(d))
                                .or_default()
                                .insert(key(n), v.value.clone());
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

/// Shares the `Arc<str>` of driver, domain and attribute names (few distinct ones, repeated on
/// every device) per thread: no lock on the hot path of building an inventory.
fn intern(s: &str) -> Arc<str> {
    thread_local! {
        static POOL: std::cell::RefCell<std::collections::HashSet<Arc<str>>> = Default::default();
    }
    POOL.with_borrow_mut(|pool| {
        if let Some(a) = pool.get(s) {
            return a.clone();
        }
        let a: Arc<str> = Arc::from(s);
        if pool.len() < INTERN_CAPACITY {
            pool.insert(a.clone());
        }
        a
    })
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

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum ParseKind {
    Semver,
    Quantity,
}

/// Parses a version (`semver(s)`, strict) or quantity (`quantity(s)`) through kube-cel,
/// remembering the few distinct strings a cluster has.
fn parse_with_kube_cel(kind: ParseKind, s: &str) -> Result<Value, String> {
    type Memo = Mutex<HashMap<ParseKind, HashMap<String, Result<Value, String>>>>;
    static MEMO: OnceLock<Memo> = OnceLock::new();
    static PROGRAMS: OnceLock<Result<(Program, Program), String>> = OnceLock::new();
    let memo = MEMO.get_or_init(Default::default);
    if let Ok(m) = memo.lock()
        && let Some(r) = m.get(&kind).and_then(|m| m.get(s))
    {
        return r.clone();
    }
    let programs = PROGRAMS.get_or_init(|| {
        let semver = Program::compile("semver(s)").map_err(|e| e.to_string())?;
        let quantity = Program::compile("quantity(s)").map_err(|e| e.to_string())?;
        Ok((semver, quantity))
    });
    let result = match programs {
        Ok((semver, quantity)) => {
            let program = match kind {
                ParseKind::Semver => semver,
                ParseKind::Quantity => quantity,
            };
            let mut ctx = root_context().new_inner_scope();
            ctx.add_variable_from_value("s", Value::String(Arc::new(s.to_owned())));
            program.execute(&ctx).map_err(|e| e.to_string())
        }
        Err(e) => Err(e.clone()),
    };
    if let Ok(mut m) = memo.lock() {
        let m = m.entry(kind).or_default();
        if m.len() < PARSE_MEMO_CAPACITY {
            m.insert(s.to_owned(), result.clone());
        }
    }
    result
}

/// The shared root context: cel-rust's standard functions plus all kube-cel libraries and
/// `cel.bind`. Built once; evaluations use child scopes holding only `device`.
fn root_context() -> &'static Context<'static> {
    static ROOT: OnceLock<Context<'static>> = OnceLock::new();
    ROOT.get_or_init(|| {
        let mut ctx = Context::default();
        ctx.register_all();
        ctx.add_function("cel.bind", cel_bind);
        ctx
    })
}

/// `cel.bind(name, init, body)`: `body` evaluated with `name` bound to `init`
/// (cel-go `ext.Bindings`, enabled in the DRA environment).
fn cel_bind(ftx: &FunctionContext) -> ResolveResult {
    let [name, init, body] = ftx.args else {
        return Err(ftx.error("cel.bind expects 3 arguments"));
    };
    let Expr::Ident(name) = &name.expr else {
        return Err(ftx.error("cel.bind: the first argument must be a simple identifier"));
    };
    let init = Value::resolve(init, ftx.ptx)?;
    let mut scope = ftx.ptx.new_inner_scope();
    scope.add_variable_from_value(name.clone(), init);
    Value::resolve(body, &scope)
}

// ---------------------------------------------------------------------------------------------
// Static analysis: which parts of `device` an expression reads.
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Leaf {
    Driver,
    AllowMultipleAllocations,
    Attribute(Arc<str>, Arc<str>),
    Capacity(Arc<str>, Arc<str>),
}

#[derive(Clone, Copy)]
enum LeafValue<'a> {
    Driver(&'a str),
    Bool(bool),
    Attr(Option<&'a AttrValue>),
    Cap(Option<&'a CapValue>),
}

impl LeafValue<'_> {
    fn hash_into<H: Hasher>(&self, h: &mut H) {
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

    fn memo_key(self) -> LeafKey {
        match self {
            Self::Driver(s) => LeafKey::Driver(Arc::from(s)),
            Self::Bool(b) => LeafKey::Bool(b),
            Self::Attr(v) => LeafKey::Attr(v.cloned()),
            Self::Cap(c) => LeafKey::Cap(c.map(|c| c.raw.clone())),
        }
    }

    fn matches_key(&self, k: &LeafKey) -> bool {
        match (self, k) {
            (Self::Driver(a), LeafKey::Driver(b)) => *a == &**b,
            (Self::Bool(a), LeafKey::Bool(b)) => a == b,
            (Self::Attr(a), LeafKey::Attr(b)) => *a == b.as_ref(),
            (Self::Cap(a), LeafKey::Cap(b)) => a.map(|c| &*c.raw) == b.as_deref(),
            _ => false,
        }
    }
}

#[derive(Debug, Clone)]
enum LeafKey {
    Driver(Arc<str>),
    Bool(bool),
    Attr(Option<AttrValue>),
    Cap(Option<Arc<str>>),
}

/// What an expression reads from `device`.
#[derive(Debug, Clone, Default)]
struct Footprint {
    leaves: BTreeSet<Leaf>,
    attribute_domains: BTreeSet<Arc<str>>,
    capacity_domains: BTreeSet<Arc<str>>,
    /// `device` is used in some other way: the whole device is needed.
    full: bool,
    /// Domains read as a whole (iterated, sized, bound to a variable).
    whole_domains: BTreeSet<(Kind, Arc<str>)>,
    /// `device` itself, a field this module does not know, or all domains are read: nothing
    /// may be left out of the device.
    everything: bool,
}

impl Footprint {
    fn of(expr: &Expr) -> Self {
        let mut fp = Footprint::default();
        fp.visit(expr);
        fp
    }

    fn merge(&mut self, other: &Footprint) {
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

    fn add_domain(&mut self, kind: Kind, domain: &str) {
        match kind {
            Kind::Attributes => self.attribute_domains.insert(Arc::from(domain)),
            Kind::Capacity => self.capacity_domains.insert(Arc::from(domain)),
        };
    }

    fn add_leaf(&mut self, kind: Kind, domain: &str, id: &str) {
        self.add_domain(kind, domain);
        self.leaves.insert(match kind {
            Kind::Attributes => Leaf::Attribute(intern(domain), intern(id)),
            Kind::Capacity => Leaf::Capacity(intern(domain), intern(id)),
        });
    }

    fn visit(&mut self, expr: &Expr) {
        if let Some(path) = device_path(expr) {
            match path {
                Path::Leaf(kind, domain, id) => self.add_leaf(kind, domain, id),
                Path::Field("driver") => {
                    self.leaves.insert(Leaf::Driver);
                }
                Path::Field("allowMultipleAllocations") => {
                    self.leaves.insert(Leaf::AllowMultipleAllocations);
                }
                Path::Domain(kind, domain) => {
                    self.add_domain(kind, domain);
                    self.whole_domains.insert((kind, intern(domain)));
                    self.full = true;
                }
                Path::Device | Path::Field(_) | Path::Kind(_) => {
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
            && let Some(Path::Domain(kind, domain)) = device_path(&m.expr)
        {
            self.add_leaf(kind, domain, id);
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
            Expr::Map(m) => visit_entries(self, &m.entries),
            Expr::Struct(s) => visit_entries(self, &s.entries),
            Expr::Select(s) => self.visit(&s.operand.expr),
            Expr::Ident(_) | Expr::Literal(_) | Expr::Unspecified => {}
        }
    }
}

fn visit_entries(fp: &mut Footprint, entries: &[kube_cel::cel::common::ast::IdedEntryExpr]) {
    for e in entries {
        match &e.expr {
            EntryExpr::MapEntry(m) => {
                fp.visit(&m.key.expr);
                fp.visit(&m.value.expr);
            }
            EntryExpr::StructField(f) => fp.visit(&f.value.expr),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Attributes,
    Capacity,
}

#[derive(Debug)]
enum Path<'a> {
    Device,
    Field(&'a str),
    Kind(Kind),
    Domain(Kind, &'a str),
    Leaf(Kind, &'a str, &'a str),
}

fn string_literal(e: &Expr) -> Option<&str> {
    match e {
        Expr::Literal(LiteralValue::String(s)) => Some(s.inner()),
        _ => None,
    }
}

/// `expr` as a fixed path below `device`, if it is one.
fn device_path(expr: &Expr) -> Option<Path<'_>> {
    fn child<'a>(parent: Path<'a>, name: &'a str, optional: bool) -> Option<Path<'a>> {
        match parent {
            Path::Device if !optional => Some(match name {
                "attributes" => Path::Kind(Kind::Attributes),
                "capacity" => Path::Kind(Kind::Capacity),
                other => Path::Field(other),
            }),
            Path::Kind(kind) if !optional => Some(Path::Domain(kind, name)),
            // `m[id]`, `m.id`, `m[?id]`, `m.?id`: the value (or its absence) of one leaf.
            Path::Domain(kind, domain) => Some(Path::Leaf(kind, domain, name)),
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
                    Path::Domain(kind, domain) => Some(Path::Leaf(kind, domain, &s.field)),
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

// ---------------------------------------------------------------------------------------------
// Compilation and evaluation.
// ---------------------------------------------------------------------------------------------

#[derive(Debug)]
struct CompiledExpr {
    source: String,
    expr: Expression,
}

type Memo = HashMap<u64, Vec<(Vec<LeafKey>, Result<bool, SelectorError>)>, FxBuildHasher>;

/// A list of selector expressions that must all be true (DeviceClass or request selectors).
#[derive(Debug)]
pub struct CompiledSelectors {
    exprs: Vec<CompiledExpr>,
    footprint: Footprint,
    leaves: Vec<Leaf>,
    memo: Mutex<Memo>,
}

impl CompiledSelectors {
    /// Compiles `expressions`; the first invalid one is reported with its index.
    pub fn compile(expressions: &[String]) -> Result<Self, SelectorError> {
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

    pub fn len(&self) -> usize {
        self.exprs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.exprs.is_empty()
    }

    /// What these selectors read of a device.
    pub fn reads(&self) -> DeviceReads {
        let fp = &self.footprint;
        let mut reads = DeviceReads {
            everything: fp.everything,
            ..DeviceReads::default()
        };
        for (kind, domain) in &fp.whole_domains {
            match kind {
                Kind::Attributes => reads.attribute_domains.insert(domain.to_string()),
                Kind::Capacity => reads.capacity_domains.insert(domain.to_string()),
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

    pub fn expressions(&self) -> impl Iterator<Item = &str> {
        self.exprs.iter().map(|e| e.source.as_str())
    }

    /// Whether every expression is true for `device`, evaluated in order like the Kubernetes
    /// allocator does (`selectorsMatch`): the first false stops with false, the first error
    /// stops with that error. An empty list matches every device.
    pub fn matches(&self, device: &DeviceEnv) -> Result<bool, SelectorError> {
        if let Some(e) = &device.invalid
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
                if k.len() == values.len() && values.iter().zip(k).all(|(v, k)| v.matches_key(k)) {
                    return result.clone();
                }
            }
        }
        let result = self.evaluate(device);
        if let Ok(mut memo) = self.memo.lock()
            && memo.len() < MEMO_CAPACITY
        {
            let k = values.iter().map(|v| v.memo_key()).collect();
            memo.entry(hash).or_default().push((k, result.clone()));
        }
        result
    }

    fn evaluate(&self, device: &DeviceEnv) -> Result<bool, SelectorError> {
        if self.exprs.is_empty() {
            return Ok(true);
        }
        let mut scope = root_context().new_inner_scope();
        scope.add_variable_from_value("device", device.to_cel(&self.footprint));
        for (index, e) in self.exprs.iter().enumerate() {
            let err = |message: String| SelectorError::Evaluation {
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

/// Compile-checks one raw selector expression, e.g. to report it in a status.
pub fn check_expression(expression: &str) -> Result<(), SelectorError> {
    compile_one(0, expression).map(|_| ())
}

fn compile_one(index: usize, source: &str) -> Result<(Expression, Footprint), SelectorError> {
    let invalid = |message: String| SelectorError::Invalid {
        index,
        expression: source.to_owned(),
        message,
    };
    if source.len() > EXPRESSION_MAX_LENGTH {
        return Err(invalid(format!(
            "longer than {EXPRESSION_MAX_LENGTH} bytes"
        )));
    }
    // Optional syntax (`m.?x`, `m[?k]`) is on in the Kubernetes CEL base environment.
    let program = Parser::default()
        .enable_optional_syntax(true)
        .parse(source)
        .map_err(|e| invalid(format!("compilation failed: {e}")))?;
    let root = &program.expr;
    let mut bound = vec![];
    check_identifiers(root, &mut bound).map_err(invalid)?;
    if let Some(t) = non_bool_type(root) {
        return Err(invalid(format!("must evaluate to bool, not {t}")));
    }
    let fp = Footprint::of(root);
    Ok((program, fp))
}

/// Kubernetes' type checker rejects references to undeclared variables; the only variable of
/// the DRA environment is `device` (plus comprehension and `cel.bind` variables).
fn check_identifiers<'a>(expr: &'a Expr, bound: &mut Vec<&'a str>) -> Result<(), String> {
    match expr {
        Expr::Ident(name) => {
            if name == "device" || bound.contains(&name.as_str()) {
                Ok(())
            } else {
                Err(format!("undeclared reference to '{name}'"))
            }
        }
        Expr::Call(c) => {
            let is_bind = c.func_name == "bind"
                && matches!(c.target.as_deref().map(|t| &t.expr), Some(Expr::Ident(n)) if n == "cel");
            if is_bind {
                let [var, init, body] = c.args.as_slice() else {
                    return Err("cel.bind expects 3 arguments".to_owned());
                };
                let Expr::Ident(var) = &var.expr else {
                    return Err(
                        "cel.bind: the first argument must be a simple identifier".to_owned()
                    );
                };
                check_identifiers(&init.expr, bound)?;
                bound.push(var);
                let r = check_identifiers(&body.expr, bound);
                bound.pop();
                return r;
            }
            if let Some(t) = &c.target {
                // A namespaced function such as `optional.of` or `math.greatest` parses as a
                // call with an identifier target.
                let namespaced = matches!(&t.expr, Expr::Ident(n) if n == "optional" || n == "math" || n == "sets" || n == "strings" || n == "base64");
                if !namespaced {
                    check_identifiers(&t.expr, bound)?;
                }
            }
            c.args
                .iter()
                .try_for_each(|a| check_identifiers(&a.expr, bound))
        }
        Expr::Comprehension(c) => {
            check_identifiers(&c.iter_range.expr, bound)?;
            check_identifiers(&c.accu_init.expr, bound)?;
            let n = bound.len();
            bound.push(&c.iter_var);
            if let Some(v) = &c.iter_var2 {
                bound.push(v);
            }
            bound.push(&c.accu_var);
            let r = [&c.loop_cond, &c.loop_step, &c.result]
                .into_iter()
                .try_for_each(|e| check_identifiers(&e.expr, bound));
            bound.truncate(n);
            r
        }
        Expr::List(l) => l
            .elements
            .iter()
            .try_for_each(|e| check_identifiers(&e.expr, bound)),
        Expr::Map(m) => m.entries.iter().try_for_each(|e| match &e.expr {
            EntryExpr::MapEntry(m) => {
                check_identifiers(&m.key.expr, bound)?;
                check_identifiers(&m.value.expr, bound)
            }
            EntryExpr::StructField(f) => check_identifiers(&f.value.expr, bound),
        }),
        Expr::Struct(_) => {
            Err("message construction is not supported in the DRA environment".to_owned())
        }
        Expr::Select(s) => check_identifiers(&s.operand.expr, bound),
        Expr::Literal(_) | Expr::Unspecified => Ok(()),
    }
}

/// The result type of `expr` when it is certainly not bool (cel-rust has no type checker, so
/// only shapes whose type is evident are caught; the rest fails at evaluation).
fn non_bool_type(expr: &Expr) -> Option<&'static str> {
    if let Some(path) = device_path(expr) {
        return match path {
            Path::Device => Some("kubernetes.DRADevice"),
            Path::Kind(_) | Path::Domain(..) => Some("map"),
            Path::Field("driver") => Some("string"),
            Path::Field(_) | Path::Leaf(..) => None,
        };
    }
    match expr {
        Expr::Literal(l) => match l {
            LiteralValue::Boolean(_) => None,
            LiteralValue::Bytes(_) => Some("bytes"),
            LiteralValue::Double(_) => Some("double"),
            LiteralValue::Int(_) => Some("int"),
            LiteralValue::Null => Some("null_type"),
            LiteralValue::String(_) => Some("string"),
            LiteralValue::UInt(_) => Some("uint"),
        },
        Expr::List(_) => Some("list"),
        Expr::Map(_) => Some("map"),
        Expr::Struct(_) => Some("message"),
        Expr::Call(c) => match c.func_name.as_str() {
            operators::ADD
            | operators::SUBSTRACT
            | operators::MULTIPLY
            | operators::DIVIDE
            | operators::MODULO => Some("a number, string or list"),
            operators::NEGATE => Some("a number"),
            "size" | "int" | "uint" | "double" | "compareTo" | "indexOf" | "lastIndexOf"
            | "sign" | "asInteger" | "major" | "minor" | "patch" => Some("a number"),
            "string" | "lowerAscii" | "upperAscii" | "trim" | "replace" | "substring"
            | "charAt" | "format" | "join" | "find" => Some("string"),
            "quantity" | "semver" | "add" | "sub" => Some("an opaque value"),
            "split" | "findAll" | "sort" | "reverse" => Some("list"),
            operators::CONDITIONAL => {
                let [_, a, b] = c.args.as_slice() else {
                    return None;
                };
                non_bool_type(&a.expr).and(non_bool_type(&b.expr))
            }
            _ => None,
        },
        Expr::Comprehension(_) | Expr::Ident(_) | Expr::Select(_) | Expr::Unspecified => None,
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use k8s_openapi::api::resource::v1::ResourceSlice;
    use std::collections::BTreeMap;

    /// A test fixture of `operator/testdata/` (each file names its upstream source). The 8-GPU
    /// node slice and the NVIDIA DeviceClasses are the built-in example's own copies.
    pub(crate) fn fixture(rel: &str) -> String {
        match rel {
            "nvidia-dra-driver-gpu/resourceslice/resourceslice-8gpu-node.assembled.yaml" => {
                crate::example::NODE_SLICE_YAML.to_owned()
            }
            "nvidia-dra-driver-gpu/deviceclasses.rendered-v1.yaml" => {
                crate::example::NVIDIA_CLASSES_YAML.to_owned()
            }
            _ => {
                let path = format!("{}/testdata/{rel}", env!("CARGO_MANIFEST_DIR"));
                std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {path}: {e}"))
            }
        }
    }

    fn devices(rel: &str) -> Vec<Device> {
        serde_saphyr::from_str(&fixture(rel)).expect("device list")
    }

    fn node_slice() -> ResourceSlice {
        serde_saphyr::from_str(&fixture(
            "nvidia-dra-driver-gpu/resourceslice/resourceslice-8gpu-node.assembled.yaml",
        ))
        .expect("slice")
    }

    fn env(rel: &str) -> DeviceEnv {
        DeviceEnv::new("gpu.nvidia.com", &devices(rel)[0])
    }

    fn sel(exprs: &[&str]) -> CompiledSelectors {
        CompiledSelectors::compile(&exprs.iter().map(|s| s.to_string()).collect::<Vec<_>>())
            .expect("compiles")
    }

    const GPU: &str = "nvidia-dra-driver-gpu/resourceslice/device-entry-gpu.from-docs.yaml";
    const MIG: &str = "nvidia-dra-driver-gpu/resourceslice/device-entry-mig.from-docs.yaml";
    const VFIO: &str = "nvidia-dra-driver-gpu/resourceslice/device-entry-vfio.from-docs.yaml";

    #[test]
    fn reads_name_exactly_what_a_selector_reads_of_a_device() {
        let reads = |e: &str| sel(&[e]).reads();
        let leaves = reads(
            "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].productName == 'A100' \
             && device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('40Gi')) >= 0",
        );
        assert!(!leaves.everything);
        assert_eq!(
            leaves.attributes,
            BTreeSet::from([("gpu.nvidia.com".to_owned(), "productName".to_owned())])
        );
        assert_eq!(
            leaves.capacities,
            BTreeSet::from([("gpu.nvidia.com".to_owned(), "memory".to_owned())])
        );
        let domain = reads("device.attributes['gpu.nvidia.com'].exists(k, k == 'mig')");
        assert_eq!(
            domain.attribute_domains,
            BTreeSet::from(["gpu.nvidia.com".to_owned()])
        );
        assert!(!domain.everything);
        assert!(reads("device.attributes.exists(d, d == 'x')").everything);
        assert!(reads("cel.bind(d, device, d.driver == 'x')").everything);

        assert!(domain.covers(&reads("device.attributes['gpu.nvidia.com'].uuid == 'x'")));
        assert!(!leaves.covers(&reads("device.attributes['gpu.nvidia.com'].uuid == 'x'")));
        assert!(!leaves.covers(&domain));
        assert!(DeviceReads::everything().covers(&domain));
        assert!(!domain.covers(&DeviceReads::everything()));
        let mut both = leaves.clone();
        both.extend(&domain);
        assert!(both.covers(&leaves) && both.covers(&domain));
        assert!(DeviceReads::default().covers(&reads("device.driver == 'x'")));
    }

    #[test]
    fn nvidia_classes_select_their_device_kind() {
        let gpu = sel(&[
            "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'",
        ]);
        let mig = sel(&[
            "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig'",
        ]);
        let vfio = sel(&[
            "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'vfio'",
        ]);
        let (g, m, v) = (env(GPU), env(MIG), env(VFIO));
        assert_eq!(gpu.matches(&g), Ok(true));
        assert_eq!(gpu.matches(&m), Ok(false));
        assert_eq!(gpu.matches(&v), Ok(false));
        assert_eq!(mig.matches(&m), Ok(true));
        assert_eq!(vfio.matches(&v), Ok(true));
        assert_eq!(vfio.matches(&g), Ok(false));
    }

    #[test]
    fn typed_attributes_capacity_and_qualified_names() {
        let g = env(GPU);
        assert!(
            matches!(g.attribute("gpu.nvidia.com", "cudaComputeCapability"), Some(AttrValue::Version(v, _)) if &**v == "8.0.0")
        );
        assert_eq!(
            g.attribute("resource.kubernetes.io", "pciBusID")
                .map(AttrValue::display)
                .as_deref(),
            Some("0000:65:00.0")
        );
        assert_eq!(g.capacity("gpu.nvidia.com", "memory"), Some("40Gi"));
        let s = sel(&[
            "device.attributes['gpu.nvidia.com'].cudaComputeCapability.compareTo(semver('8.0.0')) >= 0",
            "device.attributes['gpu.nvidia.com'].cudaComputeCapability.isLessThan(semver('9.0.0'))",
            "device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('40Gi')) >= 0",
            "device.capacity['gpu.nvidia.com'].memory.isLessThan(quantity('80Gi'))",
            "device.attributes['resource.kubernetes.io'].pcieRoot == 'pci0000:64'",
            "device.attributes['gpu.nvidia.com'].productName.lowerAscii().matches('^.*a100.*$')",
        ]);
        assert_eq!(s.matches(&g), Ok(true));
        let v = env(VFIO);
        let s = sel(&[
            "device.attributes['gpu.nvidia.com'].numa == 0 && device.attributes['gpu.nvidia.com'].iommuFDEnabled",
        ]);
        assert_eq!(s.matches(&v), Ok(true));
    }

    #[test]
    fn unknown_domain_is_empty_map_but_unknown_attribute_errors() {
        let g = env(GPU);
        // Upstream: unknown domain -> empty map, so has() is false and no error.
        assert_eq!(
            sel(&["!has(device.attributes['other.example.com'].x)"]).matches(&g),
            Ok(true)
        );
        assert_eq!(
            sel(&["size(device.attributes['other.example.com']) == 0"]).matches(&g),
            Ok(true)
        );
        // Missing attribute in a known domain errors (quickstart gpu-test6 `index`, see README).
        let err = sel(&["device.attributes['gpu.nvidia.com'].index == 0"]).matches(&g);
        assert!(
            matches!(err, Err(SelectorError::Evaluation { index: 0, .. })),
            "{err:?}"
        );
        // In order: a false selector stops before the failing one, like the allocator.
        assert_eq!(
            sel(&[
                "device.attributes['gpu.nvidia.com'].type == 'mig'",
                "device.attributes['gpu.nvidia.com'].index == 0"
            ])
            .matches(&g),
            Ok(false)
        );
    }

    #[test]
    fn full_device_expressions_work() {
        let g = env(GPU);
        let s = sel(&[
            "device.attributes['gpu.nvidia.com'].exists(k, k == 'uuid')",
            "'brand' in device.attributes['gpu.nvidia.com']",
            "cel.bind(dra, device.attributes['gpu.nvidia.com'], dra.brand == 'Nvidia' && dra.type == 'gpu')",
            "device.allowMultipleAllocations == false",
        ]);
        assert!(s.footprint.full);
        assert_eq!(s.matches(&g), Ok(true));
    }

    #[test]
    fn compile_errors_are_reported_with_index() {
        let bad = [
            "device.driver == 'x'".to_owned(),
            "device.attributes[".to_owned(),
        ];
        let e = CompiledSelectors::compile(&bad).unwrap_err();
        assert!(
            matches!(&e, SelectorError::Invalid { index: 1, expression, .. } if expression == "device.attributes[")
        );
        assert!(e.to_string().contains("#1"));
        for not_bool in [
            "1 + 2",
            "'gpu'",
            "device.driver",
            "device.attributes['gpu.nvidia.com']",
            "size(device.attributes)",
        ] {
            assert!(check_expression(not_bool).is_err(), "{not_bool}");
        }
        assert!(check_expression("request.name == 'x'").is_err());
        assert!(check_expression(&"true && ".repeat(2000)).is_err());
        for ok in [
            "true",
            "device.driver == 'gpu.nvidia.com'",
            "[1, 2].exists(x, x == 2)",
            "cel.bind(d, device.attributes['a.b'], has(d.x))",
        ] {
            assert_eq!(check_expression(ok), Ok(()), "{ok}");
        }
    }

    #[test]
    fn non_bool_result_is_an_evaluation_error() {
        let g = env(GPU);
        let s = sel(&["device.attributes['gpu.nvidia.com'].brand"]);
        assert!(matches!(
            s.matches(&g),
            Err(SelectorError::Evaluation { .. })
        ));
    }

    #[test]
    fn invalid_version_fails_every_evaluation() {
        let mut d = devices(GPU).remove(0);
        if let Some(a) = d.attributes.as_mut() {
            a.insert(
                "driverVersion".into(),
                DeviceAttribute {
                    version: Some("580.1".into()),
                    ..Default::default()
                },
            );
        }
        let e = DeviceEnv::new("gpu.nvidia.com", &d);
        assert!(e.invalid().is_some());
        assert!(matches!(
            sel(&["device.driver == 'gpu.nvidia.com'"]).matches(&e),
            Err(SelectorError::Device { .. })
        ));
        assert_eq!(sel(&[]).matches(&e), Ok(true));
    }

    #[test]
    fn memo_distinguishes_devices() {
        let slice = node_slice();
        let envs: Vec<_> = slice
            .spec
            .devices
            .iter()
            .flatten()
            .map(|d| DeviceEnv::new(&slice.spec.driver, d))
            .collect();
        assert_eq!(envs.len(), 8);
        let s = sel(&[
            "device.attributes['gpu.nvidia.com'].uuid == 'GPU-00000000-0000-0000-0000-000000000003'",
        ]);
        let hits = envs.iter().filter(|e| s.matches(e) == Ok(true)).count();
        assert_eq!(hits, 1);
        // Same again, now from the memo.
        assert_eq!(envs.iter().filter(|e| s.matches(e) == Ok(true)).count(), 1);
    }

    #[test]
    fn projection_agrees_with_full_device() {
        let exprs = [
            "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA A100-PCIE-40GB'",
            "has(device.attributes['gpu.nvidia.com'].profile)",
            "'profile' in device.attributes['gpu.nvidia.com']",
            "device.attributes['gpu.nvidia.com']['type'] in ['mig', 'vfio']",
            "has(device.attributes['x.example.com'].y) || device.driver == 'gpu.nvidia.com'",
            "device.capacity['gpu.nvidia.com'].memory.isGreaterThan(quantity('20Gi'))",
            "has(device.capacity['gpu.nvidia.com'].multiprocessors) && device.capacity['gpu.nvidia.com'].multiprocessors.asInteger() > 10",
            "device.attributes['resource.kubernetes.io'].pciBusID.startsWith('0000:65')",
            "device.attributes['gpu.nvidia.com'].?profile.orValue('none') == '1g.5gb'",
            "device.attributes['gpu.nvidia.com'].architecture == 'Ampere'",
            "device.attributes['gpu.nvidia.com'].numa == 0",
            "device.allowMultipleAllocations",
        ];
        let envs = [env(GPU), env(MIG), env(VFIO)];
        for e in exprs {
            let projected = sel(&[e]);
            assert!(!projected.footprint.full, "{e} should be projectable");
            let mut full = sel(&[e]);
            full.footprint.full = true;
            for d in &envs {
                let a = projected.matches(d);
                let b = full.matches(d);
                assert_eq!(a.is_ok(), b.is_ok(), "{e}: {a:?} vs {b:?}");
                if let (Ok(a), Ok(b)) = (a, b) {
                    assert_eq!(a, b, "{e}");
                }
                // Second time from the memo.
                assert_eq!(projected.matches(d).ok(), full.matches(d).ok(), "{e}");
            }
        }
    }

    /// Per-match cost on a realistic policy. Run with
    /// `cargo test --release -- --ignored --nocapture bench_match`.
    #[test]
    #[ignore]
    fn bench_match() {
        let slice = node_slice();
        let base = slice.spec.devices.clone().unwrap_or_default();
        let mut envs = Vec::new();
        for i in 0..40_000 {
            let mut d = base[i % base.len()].clone();
            if let Some(a) = d.attributes.as_mut() {
                a.insert(
                    "uuid".into(),
                    DeviceAttribute {
                        string: Some(format!("GPU-{i}")),
                        ..Default::default()
                    },
                );
            }
            envs.push(DeviceEnv::new("gpu.nvidia.com", &d));
        }
        let policy = crate::core::plan::selector::tests::sample_policy_exprs();
        let sets: Vec<_> = (0..20)
            .map(|_| CompiledSelectors::compile(&policy).expect("compiles"))
            .collect();
        let start = std::time::Instant::now();
        let mut n = 0usize;
        for s in &sets {
            for e in &envs {
                n += usize::from(s.matches(e) == Ok(true));
            }
        }
        let el = start.elapsed();
        println!(
            "memoised, policy-outer: {} matches ({} true) in {:?} = {:.3} µs/match",
            20 * envs.len(),
            n,
            el,
            el.as_secs_f64() * 1e6 / (20.0 * envs.len() as f64)
        );
        let named: BTreeMap<String, CompiledSelectors> = (0..20)
            .map(|i| {
                (
                    format!("p{i:02}"),
                    CompiledSelectors::compile(&policy).expect("compiles"),
                )
            })
            .collect();
        let start = std::time::Instant::now();
        let mut n = 0usize;
        for e in &envs {
            for s in named.values() {
                n += usize::from(s.matches(e) == Ok(true));
            }
        }
        let el = start.elapsed();
        println!(
            "memoised, device-outer (as Inventory::match_sets): {n} true in {el:?} = {:.3} µs/match",
            el.as_secs_f64() * 1e6 / (20.0 * envs.len() as f64)
        );
        let full = sel(&[
            "device.attributes['gpu.nvidia.com'].exists(k, k == 'productName') && device.attributes['gpu.nvidia.com'].type == 'gpu'",
        ]);
        let start = std::time::Instant::now();
        for e in envs.iter().take(2000) {
            let _ = full.matches(e);
        }
        let el = start.elapsed();
        println!(
            "full-device fallback: {:.3} µs/match",
            el.as_secs_f64() * 1e6 / 2000.0
        );
        let start = std::time::Instant::now();
        for e in envs.iter().take(2000) {
            let _ = sets[0].evaluate(e);
        }
        let el = start.elapsed();
        println!(
            "uncached projected evaluation: {:.3} µs/match",
            el.as_secs_f64() * 1e6 / 2000.0
        );
        let start = std::time::Instant::now();
        let built: Vec<_> = base
            .iter()
            .cycle()
            .take(40_000)
            .map(|d| DeviceEnv::new("gpu.nvidia.com", d))
            .collect();
        println!(
            "DeviceEnv::new: {:.3} µs/device ({})",
            start.elapsed().as_secs_f64() * 1e6 / 40_000.0,
            built.len()
        );
    }
}
