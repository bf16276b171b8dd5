//! The planning core: from the cluster's state as plain data to every object teamgpu must make
//! exist and the status of every policy. Pure and deterministic: the same state gives the same
//! plan, byte for byte. Needs no client.
//!
//! Phases, top to bottom in [`Planner::plan`], one module each: policies (class expressions
//! compiled) -> capacity (devices matched, used outside teams, governed classes) -> membership ->
//! shares -> desired objects -> status. Each phase keeps what it computed in a [`cache::Cache`], so
//! the rules read without the bookkeeping. What a plan is lives in `types.rs` and, for templates
//! and quotas, beside their builders in [`objects`].

pub mod admission;
mod budgets;
mod cache;
mod capacity;
pub mod cel;
mod claims;
pub mod conditions;
pub mod consumable;
pub mod counters;
mod demand;
pub mod department_admission;
mod desired;
pub mod equivalents;
mod identity;
pub mod inventory;
pub mod membership;
pub mod namespace_admission;
pub mod objects;
pub mod outside_teams;
pub mod pending;
pub mod placement;
mod policies;
pub mod rbac;
pub mod shared_counters;
mod shares;
mod status;
pub mod taints;
pub mod team_gpus;
mod types;
pub mod usage;

use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};

use crate::api::TeamGpuPolicy;
use crate::core::state::{ClusterState, Delta};
use crate::dra_cel::{self, CompiledExpressions};
use cache::Cache;
use identity::{identity, name_of};
use inventory::Inventory;
use objects::is_teamgpu_class;
pub use objects::{NamespacedQuota, NamespacedTemplate};
use types::clamp;
pub use types::{DesiredObjects, Plan, ReclaimOrder, SharingPolicyReport, TeamReport};

/// Compute the plan.
pub fn plan(state: &ClusterState) -> Plan {
    let mut planner = Planner::single();
    planner.update_slices(&state.slices);
    planner.update_claims(&state.claims);
    planner.plan(state)
}

/// What the class expressions of `state` read of a device: those of every sharing policy and of
/// every DeviceClass not teamgpu's (which decide what is governed). The slices the planner counts
/// must keep at least this ([`inventory::SliceView::project`]). Expressions that do not compile
/// read nothing.
pub fn device_reads(state: &ClusterState) -> dra_cel::DeviceReads {
    let mut reads = dra_cel::DeviceReads::default();
    for policy in &state.sharing_policies {
        let expressions = cel::class_expressions(&policy.spec);
        if let Ok(compiled) = CompiledExpressions::compile(&expressions) {
            reads.extend(&compiled.reads());
        }
    }
    for class in &state.device_classes {
        if !is_teamgpu_class(&name_of(class))
            && let Ok(compiled) = inventory::compile_class(class)
        {
            reads.extend(&compiled.reads());
        }
    }
    reads
}

/// What the policies can hold of devices whose capacity is shared (those drawing on counter
/// sets and those many claims share: see [`counters`], [`consumable`]), kept until the inventory,
/// the policies or the devices the claims hold change; and the per-pool caches it is made from.
#[derive(Debug, Default)]
struct SharedDevices {
    fits: counters::Fits,
    consumables: consumable::ConsumableMatches,
    /// For (inventory version, expressions, allocation version, slicing).
    last: Cache<(), (u64, u64, u64, u64), Arc<shared_counters::SharedCounters>>,
}

impl SharedDevices {
    fn new(keep: bool) -> Self {
        Self {
            fits: counters::Fits::new(keep),
            consumables: Cache::new(keep),
            last: Cache::new(keep),
        }
    }

    fn of(
        &mut self,
        (inventory, matching): (&Inventory, &capacity::Matching),
        claims: &claims::Claims,
        (sets, expressions): (&BTreeMap<String, &CompiledExpressions>, u64),
        slicing: &policies::Slicing,
    ) -> Arc<shared_counters::SharedCounters> {
        let mut hasher = std::hash::DefaultHasher::new();
        slicing.hash(&mut hasher);
        let input = (
            inventory.version(),
            expressions,
            claims.allocation_version(),
            hasher.finish(),
        );
        let Self {
            fits,
            consumables,
            last,
        } = self;
        last.get((), input, |_| {
            let with = (sets, expressions);
            let mut shared = counters::shared_counters((matching, fits), inventory, with, claims);
            let all = claims.all().map(|c| &**c);
            consumable::add_consumable(&mut shared, consumables, inventory, with, slicing, all);
            Arc::new(shared)
        })
        .clone()
    }
}

/// The planner the operator keeps between events. It gives the same plan as [`plan`], but
/// recomputes only what changed inputs feed: a changed ResourceSlice rebuilds and rematches its
/// pool's devices only, a changed claim recounts its namespace's usage, the fair shares of a
/// sharing policy are recomputed only when their input changed, and a namespace's claim
/// templates are rebuilt only when its team or the templates' shapes changed. Each phase keeps
/// what it computed in a [`cache::Cache`].
///
/// Objects are told apart by uid and resourceVersion (which the API server changes on every
/// write), or by content when they have no resourceVersion.
#[derive(Debug, Default)]
pub struct Planner {
    inventory: Inventory,
    /// What the slices of the inventory were projected to.
    slice_reads: Option<dra_cel::DeviceReads>,
    /// The last [`Planner::device_reads`], for the identity of its input.
    reads: Cache<(), u64, dra_cel::DeviceReads>,
    /// The claims of the last updates, by namespace.
    claims: claims::Claims,
    /// Usage per namespace, for the identity of the claims it was counted from.
    usage: Cache<String, u64, usage::Usage>,
    classes: policies::CompiledClasses,
    matching: capacity::Matching,
    shared: SharedDevices,
    governed: capacity::Governed,
    shares: shares::Shares,
    membership: membership::KeptMembership,
    objects: desired::Kept,
}

impl Planner {
    /// A planner for one plan: it computes everything and compares no input.
    pub fn single() -> Self {
        Self {
            inventory: Inventory::default(),
            slice_reads: None,
            claims: claims::Claims::default(),
            reads: Cache::new(false),
            usage: Cache::new(false),
            classes: Cache::new(false),
            matching: capacity::Matching::new(false),
            shared: SharedDevices::new(false),
            governed: Cache::new(false),
            shares: Cache::new(false),
            membership: membership::KeptMembership::default(),
            objects: desired::Kept::new(false),
        }
    }

    /// Brings the device inventory up to date with the cluster's ResourceSlices, kept whole;
    /// returns the pools that changed.
    pub fn update_slices<'a>(
        &mut self,
        slices: impl IntoIterator<Item = &'a ResourceSlice>,
    ) -> Vec<inventory::PoolKey> {
        let mut envs = inventory::SliceValues::default();
        let everything = dra_cel::DeviceReads::everything();
        let views: Vec<Arc<inventory::SliceView>> = slices
            .into_iter()
            .map(|s| Arc::new(inventory::SliceView::project(s, &everything, &mut envs)))
            .collect();
        self.update_slice_views(Delta::All(&views), &everything)
    }

    /// Brings the device inventory up to date with the cluster's ResourceSlices as projected to
    /// `reads` (see [`device_reads`]), all of them or what changed since the last update;
    /// returns the pools that changed. The plan is only right when `reads` covers what its
    /// class expressions read: see [`Planner::reads_cover`].
    pub fn update_slice_views(
        &mut self,
        slices: Delta<'_, inventory::SliceView>,
        reads: &dra_cel::DeviceReads,
    ) -> Vec<inventory::PoolKey> {
        if self.slice_reads.as_ref() != Some(reads) {
            self.slice_reads = Some(reads.clone());
        }
        self.inventory.update(slices)
    }

    /// [`device_reads`] of `state`, computed again only when a policy's hardware selector
    /// or a DeviceClass changed.
    pub fn device_reads(&mut self, state: &ClusterState) -> dra_cel::DeviceReads {
        let mut parts: Vec<u64> = state
            .sharing_policies
            .iter()
            .map(|p| {
                let mut hasher = std::hash::DefaultHasher::new();
                (name_of(p), cel::class_expressions(&p.spec)).hash(&mut hasher);
                hasher.finish()
            })
            .chain(state.device_classes.iter().map(|c| {
                let mut hasher = std::hash::DefaultHasher::new();
                identity(c, &mut hasher);
                hasher.finish()
            }))
            .collect();
        // The caches list objects in no particular order.
        parts.sort_unstable();
        let mut hasher = std::hash::DefaultHasher::new();
        parts.hash(&mut hasher);
        self.reads
            .get((), hasher.finish(), |_| device_reads(state))
            .clone()
    }

    /// Whether the slices of the last update hold every attribute `state`'s class expressions read.
    pub fn reads_cover(&self, reads: &dra_cel::DeviceReads) -> bool {
        self.slice_reads.as_ref().is_some_and(|r| r.covers(reads))
    }

    /// Brings the usage up to date with the cluster's ResourceClaims; returns the namespaces
    /// whose usage was recounted.
    pub fn update_claims<'a>(
        &mut self,
        claims: impl IntoIterator<Item = &'a ResourceClaim>,
    ) -> Vec<String> {
        let mut names = usage::Names::default();
        let views: Vec<Arc<usage::ClaimView>> = claims
            .into_iter()
            .map(|c| Arc::new(usage::ClaimView::project(c, &mut names)))
            .collect();
        self.update_claim_views(Delta::All(&views))
    }

    /// [`Planner::update_claims`] from claims already projected, all of them or what changed
    /// since the last update: only the namespaces of the claims that changed are recounted.
    pub fn update_claim_views(&mut self, claims: Delta<'_, usage::ClaimView>) -> Vec<String> {
        let mut changed = Vec::new();
        for namespace in self.claims.update(claims) {
            let Some(claims) = self.claims.of(&namespace) else {
                if self.usage.remove(&*namespace).is_some() {
                    changed.push(namespace.to_string());
                }
                continue;
            };
            let mut hasher = std::hash::DefaultHasher::new();
            for c in claims.values() {
                (&*c.name, c.identity).hash(&mut hasher);
            }
            self.usage.get(namespace.to_string(), hasher.finish(), |_| {
                changed.push(namespace.to_string());
                usage::Usage::from_views(claims.values().map(|c| &**c))
            });
        }
        changed
    }

    /// The inventory the plans count from.
    pub fn inventory(&self) -> &Inventory {
        &self.inventory
    }

    /// Every claim of the last updates, shared with the caches (for reclaim, which reads them
    /// only when a reclaim is ordered).
    pub fn claim_views(&self) -> Vec<Arc<usage::ClaimView>> {
        self.claims.all().cloned().collect()
    }

    /// The claim `name` of `namespace`, of the last updates.
    pub fn claim(&self, namespace: &str, name: &str) -> Option<&usage::ClaimView> {
        self.claims.of(namespace)?.get(name).map(|c| &**c)
    }

    /// The claims of `namespace`, of the last updates.
    pub fn claims_in(&self, namespace: &str) -> impl Iterator<Item = &usage::ClaimView> {
        self.claims
            .of(namespace)
            .into_iter()
            .flat_map(|c| c.values().map(|c| &**c))
    }

    /// The plan for `state`, with the slices and claims of the last `update_slices` and
    /// `update_claims` (`state.slices` and `state.claims` are not read).
    pub fn plan(&mut self, state: &ClusterState) -> Plan {
        let mut out = Plan::default();
        self.inventory.set_extra_taints(&state.device_taints);
        let live_classes: BTreeMap<String, &DeviceClass> = state
            .device_classes
            .iter()
            .map(|c| (name_of(c), c))
            .collect();

        // 1. Policies, their class expressions compiled.
        let policies = policies::compile(&mut self.classes, &state.sharing_policies, &live_classes);
        let sets = policies::expression_sets(&self.classes);
        let expressions = policies::expressions_identity(&policies);

        // 2. Capacity: what each policy matches (matching again only the pools that changed, all of
        // them when a policy's expressions changed), what of it is used outside teams, and which
        // other classes select governed devices.
        let inventory = &self.inventory;
        self.matching.update(inventory, expressions, &sets);
        let matches = self.matching.total();
        out.warnings
            .extend(capacity::incomplete_pool_warnings(inventory));
        let outside =
            capacity::used_outside_teams(self.usage.values().map(|(_, u)| u), inventory, &sets);
        let slicing = policies::Slicing::of(&policies);
        let shared = (self.shared).of(
            (inventory, &self.matching),
            &self.claims,
            (&sets, expressions),
            &slicing,
        );
        let per_device = equivalents::per_policy(&policies, &shared);
        let available = |name: &str| capacity::available(name, matches, &shared, &outside);
        let governed_foreign = capacity::governed_foreign(
            &mut self.governed,
            &state.device_classes,
            &policies,
            inventory,
            (&sets, expressions),
        );

        // 3. Membership: which namespaces belong to which team.
        let mut teams: Vec<&TeamGpuPolicy> = state.teams.iter().collect();
        teams.sort_by_key(|t| name_of(*t));
        let membership = &*self.membership.resolve(&state.teams, &state.namespaces);

        // 4. Fair shares of every pool, from the usage and pending demand of each namespace.
        let demand = demand::Demand::new(&self.usage, &state.pending);
        let rooms = |policy: &str| {
            let usage = self.usage.values().map(|(_, u)| u);
            let counts = self.matching.pool_counts(policy, &sets);
            placement::rooms(policy, counts, usage, outside.get(policy), inventory)
        };
        let budgets = budgets::budgets(&teams, &policies, membership, &demand, &per_device);
        let findings = shares::fair_shares(
            &mut self.shares,
            &policies,
            &teams,
            membership,
            (&demand, &available, &rooms, &shared),
            &budgets,
        );
        out.reclaims = findings.reclaims;
        out.placements = findings.placements;
        out.warnings.extend(findings.warnings);
        let shares = shares::by_policy(&self.shares);
        let team_gpus = team_gpus::of_policies(&shared, &shares, membership);

        // 5. The objects.
        let inputs = desired::Inputs {
            state,
            policies: &policies,
            live_classes: &live_classes,
            governed_foreign: &governed_foreign,
            teams: &teams,
            membership,
            shares: &shares,
            team_gpus: &team_gpus,
        };
        out.objects = desired::objects(&inputs, &mut self.objects);

        // 6. Status.
        let inputs = status::Inputs {
            policies: &policies,
            teams: &teams,
            membership,
            shares: &shares,
            demand: &demand,
            matches,
            outside: &outside,
            inventory,
            shared: &shared,
            allotted: &findings.allotted,
            per_device: &per_device,
            budgets: &budgets,
            team_gpus: &team_gpus,
        };
        status::reports(&inputs, &mut out);
        out
    }
}
