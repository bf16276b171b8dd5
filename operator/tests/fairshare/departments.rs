//! Departments: teams in a tree, each level sharing its parent's entitlement
//! (docs/fair-sharing.md, "Departments"). Worked examples with the figures written out, and
//! properties over random trees of up to three levels.

use proptest::prelude::*;
use teamgpu::core::fairshare::{DepartmentInput, PoolInput, PoolShares, TeamInput, compute_pool};

use super::{ns, pool_strategy, team};

fn department(name: &str, parent: Option<&str>, guaranteed: u32, limit: u32) -> DepartmentInput {
    DepartmentInput {
        name: name.to_owned(),
        parent: parent.map(str::to_owned),
        guaranteed,
        limit,
        weight: 1,
        lending_limit: None,
    }
}

/// A team of one namespace named after it, under `parent`.
fn member(
    name: &str,
    parent: &str,
    (guaranteed, limit): (u32, u32),
    (requested, pending): (u32, u32),
) -> TeamInput {
    TeamInput {
        parent: Some(parent.to_owned()),
        ..team(
            name,
            guaranteed,
            limit,
            1,
            vec![ns(name, requested, requested, pending)],
        )
    }
}

fn entitlement(shares: &PoolShares, name: &str) -> u32 {
    (shares.teams.iter().chain(&shares.departments))
        .find(|t| t.team == name)
        .unwrap_or_else(|| panic!("no share for {name}"))
        .entitlement
}

/// Research (vision, nlp) and production (serving) share 32 GPUs, 16 guaranteed each.
fn two_departments(vision_waits: u32, serving_waits: u32) -> PoolInput {
    PoolInput {
        capacity: 32,
        teams: vec![
            member("vision", "research", (8, 32), (8, vision_waits)),
            member("nlp", "research", (8, 32), (0, 0)),
            member("serving", "production", (16, 32), (16, serving_waits)),
        ],
        departments: vec![
            department("research", None, 16, 32),
            department("production", None, 16, 32),
        ],
    }
}

#[test]
fn a_departments_idle_guarantee_goes_to_its_waiting_member_before_other_departments() {
    // nlp's 8 unused GPUs are research's. vision waits for 4 of them: research keeps 4 and lends
    // the other 4 to production, whose serving waits for 8.
    let shares = compute_pool(&two_departments(4, 8));
    assert_eq!(entitlement(&shares, "research"), 16);
    assert_eq!(entitlement(&shares, "production"), 20);
    assert_eq!(entitlement(&shares, "serving"), 20);
    assert_eq!(
        entitlement(&shares, "nlp"),
        8,
        "its guarantee, claimable at once"
    );
    // Inside research only the 4 devices not lent out are lent: to vision.
    assert_eq!(entitlement(&shares, "vision"), 12);
    let research = shares.departments.iter().find(|d| d.team == "research");
    assert_eq!(
        research.unwrap().explanation.to_string(),
        "16 guaranteed; the idle devices went to teams whose Pods wait; 4 of 8 unused kept for its members who wait"
    );
    // Nobody inside waits: research lends all 8 out, and vision may borrow nothing of it.
    let shares = compute_pool(&two_departments(0, 8));
    assert_eq!(entitlement(&shares, "production"), 24);
    assert_eq!(entitlement(&shares, "vision"), 8);
}

#[test]
fn a_lending_limit_caps_what_leaves_a_department() {
    let mut pool = two_departments(0, 8);
    pool.departments[1].lending_limit = Some(0);
    pool.departments[0].lending_limit = Some(2);
    let shares = compute_pool(&pool);
    assert_eq!(entitlement(&shares, "production"), 18);
    // The 6 research keeps may go to its own members.
    assert_eq!(entitlement(&shares, "vision"), 14);
}

#[test]
fn a_department_short_of_its_guarantee_gets_devices_back_from_the_furthest_borrower_first() {
    // production holds 4 of research's guarantee (20 of its 16); inside research, vision holds
    // 4 of nlp's (12 of its 8). nlp now waits for its 8. research as a whole is 4 short of its
    // 16: production, the borrower furthest from nlp, gives those back first; nlp is 8 short of
    // its own 8, so vision gives the other 4.
    let pool = PoolInput {
        capacity: 32,
        teams: vec![
            member("vision", "research", (8, 32), (12, 0)),
            member("nlp", "research", (8, 32), (0, 8)),
            member("serving", "production", (16, 32), (20, 0)),
        ],
        departments: vec![
            department("research", None, 16, 32),
            department("production", None, 16, 32),
        ],
    };
    let shares = compute_pool(&pool);
    let reclaims: Vec<(&str, u32, &str)> = (shares.reclaims.iter())
        .map(|r| (r.borrower.as_str(), r.devices, r.for_team.as_str()))
        .collect();
    assert_eq!(reclaims, [("serving", 4, "nlp"), ("vision", 4, "nlp")]);
}

#[test]
fn a_cycle_or_a_missing_parent_counts_as_no_parent() {
    let pool = PoolInput {
        capacity: 8,
        teams: vec![
            member("a", "loop-1", (2, 8), (0, 0)),
            member("b", "nowhere", (2, 8), (0, 0)),
        ],
        departments: vec![
            department("loop-1", Some("loop-2"), 4, 8),
            department("loop-2", Some("loop-1"), 4, 8),
        ],
    };
    let shares = compute_pool(&pool);
    let a = shares.teams.iter().find(|t| t.team == "a").unwrap();
    assert_eq!(a.parent.as_deref(), Some("loop-1"));
    let b = shares.teams.iter().find(|t| t.team == "b").unwrap();
    assert_eq!(b.parent, None);
    // loop-1 is cut from loop-2 (and loop-2 has no team): loop-1 is a top-level department.
    let names: Vec<(&str, Option<&str>)> = (shares.departments.iter())
        .map(|d| (d.team.as_str(), d.parent.as_deref()))
        .collect();
    assert_eq!(names, [("loop-1", None)]);
}

/// A random tree: the flat pool's teams spread over up to 4 departments, each at the top or
/// under another department that sorts before it (so no cycles), guarantees and limits drawn.
fn tree_strategy() -> impl Strategy<Value = PoolInput> {
    (
        pool_strategy(20),
        prop::collection::vec((0u32..=40, 0u32..=60, 1u32..=5, any::<Option<u8>>()), 0..=4),
        prop::collection::vec(any::<u8>(), 20),
    )
        .prop_map(|(mut pool, departments, picks)| {
            let n = departments.len();
            pool.departments = (departments.iter().enumerate())
                .map(|(i, &(g, extra, weight, up))| DepartmentInput {
                    name: format!("dept-{i}"),
                    parent: up
                        .filter(|_| i > 0)
                        .map(|u| format!("dept-{}", usize::from(u) % i)),
                    guaranteed: g,
                    limit: g + extra,
                    weight,
                    lending_limit: (extra % 3 == 0).then_some(g / 2),
                })
                .collect();
            for (team, pick) in pool.teams.iter_mut().zip(picks) {
                let pick = usize::from(pick);
                team.parent = (n > 0 && pick % 5 != 0).then(|| format!("dept-{}", pick % n));
            }
            pool
        })
}

proptest! {
    #[test]
    fn every_team_gets_its_guarantee_at_once_and_its_namespaces_add_up(pool in tree_strategy()) {
        let shares = compute_pool(&pool);
        for t in &shares.teams {
            prop_assert!(t.entitlement >= t.effective_guarantee, "{t:?}");
            prop_assert!(t.entitlement >= t.requested, "{t:?}");
            prop_assert!(t.entitlement <= t.limit.max(t.requested), "{t:?}");
            let hards: u64 = t.namespaces.iter().map(|n| u64::from(n.hard)).sum();
            if !t.namespaces.is_empty() {
                prop_assert_eq!(hards, u64::from(t.entitlement));
            }
        }
        // Every team of the input comes out once.
        let mut names: Vec<&str> = pool.teams.iter().map(|t| t.team.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        let out: Vec<&str> = shares.teams.iter().map(|t| t.team.as_str()).collect();
        prop_assert_eq!(out, names);
    }

    #[test]
    fn teams_borrow_only_idle_devices_and_their_departments_unused_guarantees(pool in tree_strategy()) {
        // What the teams may claim beyond what they hold or are guaranteed, together, fits the
        // devices nobody's claims are charged for plus what their departments are guaranteed
        // and do not use (a department's members borrow its guarantee first).
        let shares = compute_pool(&pool);
        let requested: u64 = shares.teams.iter().map(|t| u64::from(t.requested)).sum();
        let unused = |t: &teamgpu::core::fairshare::TeamShare| {
            u64::from(t.effective_guarantee.saturating_sub(t.requested))
        };
        let lent: u64 = (shares.teams.iter())
            .map(|t| u64::from(t.entitlement - t.effective_guarantee.max(t.requested)))
            .sum();
        let departments: u64 = shares.departments.iter().map(unused).sum();
        // Besides, what a team or department at the top reuses of the devices charged to its
        // own claims that fit no node (its members divide what a department reuses).
        let reused: u64 = (shares.teams.iter().chain(&shares.departments))
            .map(|t| u64::from(t.reused))
            .sum();
        let idle = u64::from(pool.capacity).saturating_sub(requested);
        prop_assert!(
            lent <= idle + departments + reused,
            "lent {lent}, idle {idle}, departments' unused guarantees {departments}, reused \
             {reused}"
        );
    }

    #[test]
    fn a_department_holding_the_whole_pool_divides_it_as_a_flat_pool(pool in pool_strategy(20)) {
        // Not with claims that fit no node: in the flat pool their own team reuses their
        // devices; in the tree the department does, and its members divide them.
        let mut pool = pool;
        for n in pool.teams.iter_mut().flat_map(|t| &mut t.namespaces) {
            n.unplaceable = 0;
        }
        let requested: u32 = (pool.teams.iter())
            .flat_map(|t| t.namespaces.iter().map(|n| n.requested))
            .sum();
        prop_assume!(requested <= pool.capacity);
        let tree = PoolInput {
            departments: vec![department("all", None, pool.capacity, pool.capacity)],
            teams: (pool.teams.iter())
                .map(|t| TeamInput { parent: Some("all".into()), ..t.clone() })
                .collect(),
            capacity: pool.capacity,
        };
        let mut tree_shares = compute_pool(&tree);
        for t in &mut tree_shares.teams {
            t.parent = None;
        }
        prop_assert_eq!(tree_shares.teams, compute_pool(&pool).teams);
    }

    #[test]
    fn reclaims_name_teams_and_never_more_than_they_hold_or_wait_for(pool in tree_strategy()) {
        let shares = compute_pool(&pool);
        for r in &shares.reclaims {
            let giver = shares.teams.iter().find(|t| t.team == r.borrower);
            let taker = shares.teams.iter().find(|t| t.team == r.for_team);
            prop_assert!(giver.is_some() && taker.is_some(), "{r:?}");
        }
        for t in &shares.teams {
            let given: u64 = (shares.reclaims.iter())
                .filter(|r| r.borrower == t.team)
                .map(|r| u64::from(r.devices))
                .sum();
            let got: u64 = (shares.reclaims.iter())
                .filter(|r| r.for_team == t.team)
                .map(|r| u64::from(r.devices))
                .sum();
            prop_assert!(given <= u64::from(t.allocated), "{} gives {given}", t.team);
            prop_assert!(got <= u64::from(t.pending), "{} gets {got}", t.team);
        }
    }

    #[test]
    fn the_order_of_teams_and_departments_does_not_matter(pool in tree_strategy(), seed in any::<u64>()) {
        let mut shuffled = pool.clone();
        let n = shuffled.teams.len().max(1);
        shuffled.teams.rotate_left(usize::try_from(seed).unwrap_or(0) % n);
        shuffled.departments.reverse();
        prop_assert_eq!(compute_pool(&shuffled), compute_pool(&pool));
    }
}
