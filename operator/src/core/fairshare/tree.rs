//! Departments: teams grouped in a tree, each level sharing what its parent gets by the rules of
//! one pool (`docs/fair-sharing.md`, "Departments").
//!
//! The pool's capacity is divided top-down. At each level the parent's entitlement (the pool's
//! capacity at the top) is the capacity of a pool whose teams are the parent's children: a
//! department takes part with what its subtree requests, holds and waits for, and its entitlement
//! becomes the capacity of the level below. So a department's unused guarantee is lent inside it
//! first: while its members wait for devices, as many of its unused guaranteed devices as they
//! wait for stay in its entitlement (kept, like a lending limit keeps them) instead of being lent
//! to other departments, and `lendingLimit` caps what leaves it beyond that.
//!
//! Reclaim follows the tree: a level names which child gives back how many devices to which
//! other child, and those are taken, inside the giving department, from the members furthest
//! above their own guarantee, for the members of the receiving department that wait below theirs.
//! A level asks only when the receiving child as a whole waits below its guarantee, so the
//! highest level where a claimant is short (the borrower furthest from it) gives back first.

use std::collections::BTreeMap;

use super::apportion::{dhondt, water_fill};
use super::{
    LevelRules, NamespaceUsage, PoolInput, PoolShares, Reclaim, TeamInput, TeamShare,
    compute_level, to_u32,
};

/// Deepest chain of departments the engine follows; a longer one (or a cycle) is cut: the node
/// where it is found counts as having no parent. The planner allows 4 levels.
const MAX_DEPTH: usize = 16;

/// A department: a node of the tree of teams that owns no namespaces. Its children (teams or
/// departments naming it as `parent`) share what it gets.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct DepartmentInput {
    pub name: String,
    /// The department above it, if any.
    pub parent: Option<String>,
    /// As a team's: devices the department's members can always claim together.
    pub guaranteed: u32,
    /// The most its members may hold together.
    pub limit: u32,
    /// Its share of idle devices among its siblings.
    pub weight: u32,
    /// How many of its unused guaranteed devices may leave it (`None`: all).
    pub lending_limit: Option<u32>,
}

/// A node of the tree: a team (with its input) or a department.
enum Kind<'a> {
    Team(&'a TeamInput),
    Department(&'a DepartmentInput),
}

struct Node<'a> {
    name: &'a str,
    kind: Kind<'a>,
    parent: Option<usize>,
    /// Children, in name order.
    children: Vec<usize>,
    /// What the node's subtree requests, holds and waits for.
    used: Use,
}

/// What claims request and hold and Pods wait for, summed over namespaces.
#[derive(Clone, Copy, Default)]
struct Use {
    requested: u64,
    allocated: u64,
    pending: u64,
    /// Of `requested`, charged to claims that fit no node.
    unplaceable: u64,
}

impl Use {
    fn of(ns: &NamespaceUsage) -> Self {
        Self {
            requested: u64::from(ns.requested),
            allocated: u64::from(ns.allocated),
            pending: u64::from(ns.pending),
            unplaceable: u64::from(ns.unplaceable.min(ns.requested)),
        }
    }

    fn add(self, other: Self) -> Self {
        Self {
            requested: self.requested + other.requested,
            allocated: self.allocated + other.allocated,
            pending: self.pending + other.pending,
            unplaceable: self.unplaceable + other.unplaceable,
        }
    }
}

/// One level's answer: the children's shares, by node.
type Level = Vec<(usize, TeamShare)>;

/// Every level by its parent (`None`: the top): its shares and its reclaims between children.
type Levels = BTreeMap<Option<usize>, (Level, Vec<Reclaim>)>;

struct Tree<'a> {
    nodes: Vec<Node<'a>>,
    roots: Vec<usize>,
}

impl<'a> Tree<'a> {
    /// Departments first (a name given twice: the first in name order), then the teams not
    /// named like a department (a team named like one is not part of the tree: the planner never
    /// makes one; several entries of one team are merged by the pool, under the parent of the
    /// first). Parents that name no department, cycles and chains deeper than [`MAX_DEPTH`] are
    /// cut.
    fn build(input: &'a PoolInput) -> Self {
        let mut departments: Vec<&DepartmentInput> = input.departments.iter().collect();
        departments.sort_by(|a, b| a.name.cmp(&b.name));
        departments.dedup_by(|b, a| a.name == b.name);
        let mut nodes: Vec<Node<'a>> = departments
            .iter()
            .map(|d| Node::new(&d.name, Kind::Department(d)))
            .collect();
        let index: BTreeMap<&str, usize> = (nodes.iter().enumerate())
            .map(|(i, n)| (n.name, i))
            .collect();
        let mut teams: Vec<&TeamInput> = (input.teams.iter())
            .filter(|t| !index.contains_key(t.team.as_str()))
            .collect();
        teams.sort_by(|a, b| (&a.team, &a.parent).cmp(&(&b.team, &b.parent)));
        for team in teams {
            nodes.push(Node::new(&team.team, Kind::Team(team)));
        }
        let parent_of = |node: &Node<'_>| {
            let parent = match node.kind {
                Kind::Team(t) => t.parent.as_deref(),
                Kind::Department(d) => d.parent.as_deref(),
            };
            parent.and_then(|p| index.get(p).copied())
        };
        let mut parents: Vec<Option<usize>> = nodes.iter().map(parent_of).collect();
        // Departments in a cycle lose their parent first, so that what hangs below them stays.
        let in_cycle: Vec<bool> = (0..nodes.len()).map(|i| in_cycle(i, &parents)).collect();
        for (parent, cut) in parents.iter_mut().zip(in_cycle) {
            if cut {
                *parent = None;
            }
        }
        let mut roots = Vec::new();
        for i in 0..nodes.len() {
            let parent = parents[i].filter(|_| reaches_root(i, &parents));
            nodes[i].parent = parent;
            match parent {
                Some(p) => nodes[p].children.push(i),
                None => roots.push(i),
            }
        }
        let mut tree = Self { nodes, roots };
        tree.drop_empty_departments();
        tree.sort_children();
        for root in tree.roots.clone() {
            tree.add_up(root);
        }
        tree
    }

    /// Departments without a team under them take no part: they would only borrow.
    fn drop_empty_departments(&mut self) {
        let mut has_team = vec![false; self.nodes.len()];
        for i in 0..self.nodes.len() {
            if matches!(self.nodes[i].kind, Kind::Team(_)) {
                let mut at = Some(i);
                while let Some(node) = at.filter(|&n| !has_team[n]) {
                    has_team[node] = true;
                    at = self.nodes[node].parent;
                }
            }
        }
        self.roots.retain(|&r| has_team[r]);
        for node in &mut self.nodes {
            node.children.retain(|&c| has_team[c]);
        }
    }

    /// Children and roots in name order; a team given twice stays twice (the pool merges it).
    fn sort_children(&mut self) {
        let names: Vec<&str> = self.nodes.iter().map(|n| n.name).collect();
        let by_name = |a: &usize, b: &usize| names[*a].cmp(names[*b]).then(a.cmp(b));
        self.roots.sort_by(by_name);
        for node in &mut self.nodes {
            node.children.sort_by(by_name);
        }
    }

    /// Sums a subtree's use into its department (depth-first; the depth is bounded).
    fn add_up(&mut self, i: usize) -> Use {
        let sums = match self.nodes[i].kind {
            Kind::Team(t) => (t.namespaces.iter()).fold(Use::default(), |u, ns| u.add(Use::of(ns))),
            Kind::Department(_) => {
                let children = self.nodes[i].children.clone();
                (children.into_iter()).fold(Use::default(), |u, c| u.add(self.add_up(c)))
            }
        };
        self.nodes[i].used = sums;
        sums
    }

    /// The input of one level: `children` as teams of a pool of `capacity` devices, a
    /// department with what its members request, hold and wait for. Devices charged to claims
    /// that fit no node are reused at the `top` level only: below it, what a department reuses
    /// of them is already in its entitlement, the capacity its members divide.
    fn level_input(&self, children: &[usize], capacity: u32, top: bool) -> PoolInput {
        let teams = (children.iter())
            .map(|&c| {
                let node = &self.nodes[c];
                match node.kind {
                    Kind::Team(t) => {
                        let mut input = TeamInput {
                            parent: None,
                            ..t.clone()
                        };
                        if !top {
                            input.namespaces.iter_mut().for_each(|n| n.unplaceable = 0);
                        }
                        input
                    }
                    Kind::Department(d) => TeamInput {
                        team: d.name.clone(),
                        guaranteed: d.guaranteed,
                        limit: d.limit,
                        weight: d.weight,
                        lending_limit: d.lending_limit,
                        namespaces: vec![NamespaceUsage {
                            namespace: d.name.clone(),
                            requested: to_u32(node.used.requested),
                            allocated: to_u32(node.used.allocated),
                            pending: to_u32(node.used.pending),
                            unplaceable: if top {
                                to_u32(node.used.unplaceable)
                            } else {
                                0
                            },
                        }],
                        parent: None,
                    },
                }
            })
            .collect();
        PoolInput {
            capacity,
            teams,
            departments: Vec::new(),
        }
    }

    /// Computes the level below `parent` (the roots when `None`) with `capacity` devices, of
    /// which `withheld` are lent outside `parent` and not lent again inside it, and every level
    /// under it; the shares go to `out`, each department's level to `levels`.
    fn divide(
        &self,
        (parent, capacity, withheld): (Option<usize>, u32, u64),
        out: &mut PoolShares,
        levels: &mut Levels,
    ) -> PoolShares {
        let children = match parent {
            Some(p) => &self.nodes[p].children,
            None => &self.roots,
        };
        let input = self.level_input(children, capacity, parent.is_none());
        let rules = LevelRules {
            withheld,
            departments: (children.iter())
                .filter(|&&c| matches!(self.nodes[c].kind, Kind::Department(_)))
                .map(|&c| self.nodes[c].name)
                .collect(),
        };
        let mut shares = PoolShares::default();
        compute_level(&input, &rules, &mut shares);
        let lent_out = lent_out(&shares, u64::from(capacity).saturating_sub(withheld));
        // The pool merges a team given twice into one entry: match the entries by name.
        let mut level: Level = Vec::new();
        for (share, &withheld) in shares.teams.iter_mut().zip(&lent_out) {
            let Some(&child) = children.iter().find(|&&c| self.nodes[c].name == share.team) else {
                continue;
            };
            share.parent = parent.map(|p| self.nodes[p].name.to_owned());
            if let Kind::Department(_) = self.nodes[child].kind {
                // A department owns no namespace: its members do.
                share.namespaces.clear();
                self.divide((Some(child), share.entitlement, withheld), out, levels);
                out.departments.push(share.clone());
            } else {
                out.teams.push(share.clone());
            }
            level.push((child, share.clone()));
        }
        levels.insert(parent, (level, std::mem::take(&mut shares.reclaims)));
        shares
    }

    /// Who among `node`'s teams gives back `devices`: the node itself if it is a team, else its
    /// children furthest above their guarantee (per weight) first, down the tree. What a team
    /// gave at a higher level is no longer there to give.
    fn givers(&self, node: usize, devices: u64, levels: &Levels, ledger: &mut Ledger) {
        let Some((level, _)) = levels.get(&Some(node)) else {
            let devices =
                devices.min(u64::from(self.allocated(node)).saturating_sub(ledger.given[node]));
            ledger.give(self, node, devices);
            return;
        };
        let held = |c: usize, s: &TeamShare| u64::from(s.allocated).saturating_sub(ledger.given[c]);
        let weight = |s: &TeamShare| s.weight.max(1);
        // Above their guarantee first, per weight; then, when the members' guarantees add up to
        // more than the department holds, below it too.
        let excess: Vec<(u64, u32)> = (level.iter())
            .map(|&(c, ref s)| {
                let over = held(c, s).saturating_sub(u64::from(s.effective_guarantee));
                (over, weight(s))
            })
            .collect();
        let mut take = level_down(devices, &excess);
        let short = devices.saturating_sub(take.iter().sum::<u64>());
        if short > 0 {
            let rest: Vec<(u64, u32)> = (level.iter().zip(&take))
                .map(|(&(c, ref s), t)| (held(c, s) - t, weight(s)))
                .collect();
            for (t, more) in take.iter_mut().zip(level_down(short, &rest)) {
                *t += more;
            }
        }
        for ((child, _), take) in level.iter().zip(take) {
            if take > 0 {
                self.givers(*child, take, levels, ledger);
            }
        }
    }

    /// Who among `node`'s teams receives `devices`: the node itself if it is a team, else its
    /// children below their guarantee that wait, then the others that wait, in name order.
    fn receivers(&self, node: usize, devices: u64, levels: &Levels, ledger: &mut Ledger) {
        let Some((level, _)) = levels.get(&Some(node)) else {
            let waits = self.nodes[node].used.pending;
            let devices = devices.min(waits.saturating_sub(ledger.got[node]));
            ledger.receive(self, node, devices);
            return;
        };
        let mut left = devices;
        let mut given = vec![0u64; level.len()];
        for below_guarantee in [true, false] {
            for (i, &(c, ref s)) in level.iter().enumerate() {
                let waits = u64::from(s.pending).saturating_sub(ledger.got[c] + given[i]);
                let wants = if below_guarantee {
                    let short = s.effective_guarantee.saturating_sub(s.allocated);
                    waits.min(u64::from(short).saturating_sub(ledger.got[c]))
                } else {
                    waits
                };
                let take = wants.min(left);
                given[i] += take;
                left -= take;
            }
        }
        for ((child, _), given) in level.iter().zip(given) {
            if given > 0 {
                self.receivers(*child, given, levels, ledger);
            }
        }
    }

    fn allocated(&self, node: usize) -> u32 {
        to_u32(self.nodes[node].used.allocated)
    }

    /// How deep `node` is (a top-level node is 1).
    fn depth(&self, node: usize) -> usize {
        let mut depth = 1;
        let mut at = node;
        while let Some(p) = self.nodes[at].parent {
            depth += 1;
            at = p;
        }
        depth
    }
}

/// What reclaim has asked of each node so far (a team and every department above it): given
/// and received, and the teams each team gives to, in order.
struct Ledger {
    given: Vec<u64>,
    got: Vec<u64>,
    gives: Vec<(usize, u64)>,
    gets: Vec<(usize, u64)>,
}

impl Ledger {
    fn new(nodes: usize) -> Self {
        Self {
            given: vec![0; nodes],
            got: vec![0; nodes],
            gives: Vec::new(),
            gets: Vec::new(),
        }
    }

    fn give(&mut self, tree: &Tree<'_>, team: usize, devices: u64) {
        if devices > 0 {
            self.gives.push((team, devices));
            up_the_tree(tree, team, devices, &mut self.given);
        }
    }

    fn receive(&mut self, tree: &Tree<'_>, team: usize, devices: u64) {
        if devices > 0 {
            self.gets.push((team, devices));
            up_the_tree(tree, team, devices, &mut self.got);
        }
    }
}

/// Adds `devices` to `counts` of `team` and of every department above it.
fn up_the_tree(tree: &Tree<'_>, team: usize, devices: u64, counts: &mut [u64]) {
    let mut at = Some(team);
    while let Some(node) = at {
        counts[node] += devices;
        at = tree.nodes[node].parent;
    }
}

impl<'a> Node<'a> {
    fn new(name: &'a str, kind: Kind<'a>) -> Self {
        Self {
            name,
            kind,
            parent: None,
            children: Vec::new(),
            used: Use::default(),
        }
    }
}

/// Whether following parents from `i` comes back to `i` (the chain is at most as long as the
/// nodes are many).
fn in_cycle(i: usize, parents: &[Option<usize>]) -> bool {
    let mut at = i;
    for _ in 0..parents.len() {
        match parents[at] {
            None => return false,
            Some(p) if p == i => return true,
            Some(p) => at = p,
        }
    }
    false
}

/// Whether following parents from `i` ends at a root within [`MAX_DEPTH`] steps, never
/// coming back to `i`.
fn reaches_root(i: usize, parents: &[Option<usize>]) -> bool {
    let mut at = i;
    for _ in 0..MAX_DEPTH {
        match parents[at] {
            None => return true,
            Some(p) if p == i => return false,
            Some(p) => at = p,
        }
    }
    false
}

/// Computes a pool whose teams form a tree under departments into `out`.
pub(super) fn compute(input: &PoolInput, out: &mut PoolShares) {
    let tree = Tree::build(input);
    out.teams.clear();
    out.departments.clear();
    let mut levels = Levels::new();
    let top = tree.divide((None, input.capacity, 0), out, &mut levels);
    out.capacity = top.capacity;
    out.idle = top.idle;
    out.lendable = top.lendable;
    out.overcommit = top.overcommit;
    out.teams.sort_by(|a, b| a.team.cmp(&b.team));
    out.departments.sort_by(|a, b| a.team.cmp(&b.team));
    out.reclaims = tree.reclaims(&levels);
}

impl Tree<'_> {
    /// Every level's reclaims, from teams to teams: each giving child's teams furthest above
    /// their guarantee, for the receiving child's teams that wait.
    fn reclaims(&self, levels: &Levels) -> Vec<Reclaim> {
        // The top level first, then deeper ones: the borrower furthest from a claimant gives
        // first, and what it gave is not asked again below.
        let mut order: Vec<_> = levels.iter().collect();
        order.sort_by_key(|(parent, _)| parent.map_or(0, |p: usize| self.depth(p)));
        let mut ledger = Ledger::new(self.nodes.len());
        let mut pairs: BTreeMap<(usize, usize), u64> = BTreeMap::new();
        for (_, (level, reclaims)) in order {
            let node = |name: &str| {
                (level.iter())
                    .map(|(c, _)| *c)
                    .find(|&c| self.nodes[c].name == name)
            };
            for reclaim in reclaims {
                let (Some(from), Some(to)) = (node(&reclaim.borrower), node(&reclaim.for_team))
                else {
                    continue;
                };
                let devices = u64::from(reclaim.devices);
                ledger.gives.clear();
                ledger.gets.clear();
                self.givers(from, devices, levels, &mut ledger);
                self.receivers(to, devices, levels, &mut ledger);
                pair_up(&ledger.gives, &ledger.gets, &mut pairs);
            }
        }
        let mut out: Vec<Reclaim> = (pairs.into_iter())
            .map(|((giver, receiver), devices)| Reclaim {
                borrower: self.nodes[giver].name.to_owned(),
                devices: to_u32(devices),
                for_team: self.nodes[receiver].name.to_owned(),
            })
            .collect();
        out.sort_by(|a, b| (&a.for_team, &a.borrower).cmp(&(&b.for_team, &b.borrower)));
        out
    }
}

/// How many of each team's unused guarantee a level lent to the others (`lendable` devices
/// could be lent there): what was borrowed comes from the devices nobody holds first, then from
/// the unused guarantees that may be lent, in proportion to them (D'Hondt, ties by name).
fn lent_out(shares: &PoolShares, lendable: u64) -> Vec<u64> {
    let base = |t: &TeamShare| t.effective_guarantee.max(t.requested);
    // What a team reuses of its own claims that fit no node is nobody else's.
    let borrowed: u64 = (shares.teams.iter())
        .map(|t| u64::from(t.entitlement.saturating_sub(base(t) + t.reused)))
        .sum();
    let held: u64 = shares.teams.iter().map(|t| u64::from(base(t))).sum();
    let nobodys = lendable.saturating_sub(held);
    let from_guarantees = borrowed.saturating_sub(nobodys);
    let lenders: Vec<u64> = (shares.teams.iter())
        .map(|t| u64::from((base(t) - t.requested).saturating_sub(t.reserved)))
        .collect();
    let total: u64 = lenders.iter().sum();
    dhondt(from_guarantees.min(total), &lenders)
}

/// Takes `devices` from `holds` (what each holds, its weight), the most per weight first: keeps
/// the lowest levels. Takes at most what they hold.
fn level_down(devices: u64, holds: &[(u64, u32)]) -> Vec<u64> {
    let total: u64 = holds.iter().map(|h| h.0).sum();
    let keep = water_fill(total.saturating_sub(devices), holds);
    holds.iter().zip(keep).map(|(h, k)| h.0 - k).collect()
}

/// Matches what givers give with what receivers get, in their order, into `pairs`.
fn pair_up(
    givers: &[(usize, u64)],
    receivers: &[(usize, u64)],
    pairs: &mut BTreeMap<(usize, usize), u64>,
) {
    let mut receivers = receivers.iter().copied().peekable();
    let mut wanted = receivers.peek().map_or(0, |r| r.1);
    for &(giver, mut gives) in givers {
        while gives > 0 {
            let Some(&(receiver, _)) = receivers.peek() else {
                return;
            };
            let n = gives.min(wanted);
            *pairs.entry((giver, receiver)).or_default() += n;
            gives -= n;
            wanted -= n;
            if wanted == 0 {
                receivers.next();
                wanted = receivers.peek().map_or(0, |r| r.1);
            }
        }
    }
}
