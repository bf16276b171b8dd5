//! Lending limits (docs/fair-sharing.md: worked example "Lending limit", guarantee 8), duplicate
//! teams and extreme values.

use super::*;

#[test]
fn lending_limit_lends_only_part_of_an_unused_guarantee() {
    // alpha is idle but lends at most 2 of its 8 guaranteed devices; beta is busy. beta may
    // borrow those 2 plus the 4 devices nobody is guaranteed (16 - 8 - 4).
    let pool = |alpha_usage: NamespaceUsage, beta_in_use: u32| PoolInput {
        departments: Vec::new(),
        capacity: 16,
        teams: vec![
            lending(2, team("alpha", 8, 8, 1, vec![alpha_usage])),
            using("beta", 4, 16, 1, beta_in_use),
        ],
    };
    let out = compute_pool(&pool(ns("alpha-ns", 0, 0, 0), 4));
    assert_eq!((out.idle, out.lendable), (12, 6));
    assert_eq!(entitlements(&out), [("alpha", 8), ("beta", 10)]);
    let alpha = share(&out, "alpha");
    assert_eq!((alpha.lending_limit, alpha.reserved), (Some(2), 6));
    assert_eq!(
        alpha.namespaces[0].hard, 8,
        "the whole guarantee stays claimable"
    );
    assert_eq!(
        alpha.explanation.to_string(),
        "8 guaranteed; 6 of 8 unused kept unlent (lending limit 2)"
    );
    assert_eq!(share(&out, "beta").borrowed, 6);
    assert_eq!(
        share(&out, "beta").explanation.to_string(),
        "4 guaranteed + 6 borrowed of 6 lendable idle at weight 1/1"
    );

    // beta uses all it was lent; alpha's Pods now wait for its 8 devices. 6 of them were never
    // lent and are free; only the 2 alpha lent come back from beta.
    let out = compute_pool(&pool(ns("alpha-ns", 0, 0, 8), 10));
    assert_eq!(entitlements(&out), [("alpha", 8), ("beta", 10)]);
    assert_eq!(reclaims(&out), [("beta", 2, "alpha")]);

    // Without a lending limit beta borrows all 12 idle devices and gives 8 back.
    let mut unlimited = pool(ns("alpha-ns", 0, 0, 0), 4);
    unlimited.teams[0].lending_limit = None;
    let out = compute_pool(&unlimited);
    assert_eq!((out.idle, out.lendable), (12, 12));
    assert_eq!(entitlements(&out), [("alpha", 8), ("beta", 16)]);
    assert_eq!(share(&out, "alpha").reserved, 0);
    assert_eq!(share(&out, "alpha").explanation.to_string(), "8 guaranteed");
    let mut unlimited = pool(ns("alpha-ns", 0, 0, 8), 16);
    unlimited.teams[0].lending_limit = None;
    assert_eq!(reclaims(&compute_pool(&unlimited)), [("beta", 8, "alpha")]);
}

#[test]
fn lending_limit_zero_keeps_the_guarantee_and_needs_no_reclaim() {
    let pool = |alpha_usage: NamespaceUsage, beta_in_use: u32| PoolInput {
        departments: Vec::new(),
        capacity: 16,
        teams: vec![
            lending(0, team("alpha", 8, 8, 1, vec![alpha_usage])),
            using("beta", 4, 16, 1, beta_in_use),
        ],
    };
    let out = compute_pool(&pool(ns("alpha-ns", 0, 0, 0), 4));
    assert_eq!((out.idle, out.lendable), (12, 4));
    assert_eq!(entitlements(&out), [("alpha", 8), ("beta", 8)]);
    assert_eq!(share(&out, "alpha").reserved, 8);
    assert_eq!(
        share(&out, "alpha").explanation.to_string(),
        "8 guaranteed; 8 of 8 unused kept unlent (lending limit 0)"
    );
    assert_eq!(
        share(&out, "beta").explanation.to_string(),
        "4 guaranteed + 4 borrowed of 4 lendable idle at weight 1/1"
    );
    // beta uses its whole quota, alpha's Pods wait for 8: the 8 free devices are alpha's.
    let out = compute_pool(&pool(ns("alpha-ns", 0, 0, 8), 8));
    assert_eq!(entitlements(&out), [("alpha", 8), ("beta", 8)]);
    assert!(out.reclaims.is_empty(), "{:?}", out.reclaims);
    // Partly used: only the unused part is kept (8 - 3 in use).
    let out = compute_pool(&pool(ns("alpha-ns", 3, 3, 0), 4));
    assert_eq!((out.idle, out.lendable), (9, 4));
    assert_eq!(share(&out, "alpha").reserved, 5);
}

#[test]
fn nothing_to_borrow_when_lending_limits_keep_every_idle_device() {
    let out = compute_pool(&PoolInput {
        departments: Vec::new(),
        capacity: 8,
        teams: vec![
            using("guest", 0, 8, 1, 0),
            lending(0, using("owner", 8, 8, 1, 0)),
        ],
    });
    assert_eq!((out.idle, out.lendable), (8, 0));
    assert_eq!(entitlements(&out), [("guest", 0), ("owner", 8)]);
    assert_eq!(
        share(&out, "guest").explanation.to_string(),
        "0 guaranteed; no idle device to borrow: lending limits keep the 8 idle devices unlent"
    );
}

#[test]
fn free_devices_serve_what_was_never_lent_first() {
    // guest borrowed alpha's 8 devices (beta lends none) and uses them; then both owners' Pods
    // wait for 8 devices. The 8 free devices are beta's, never lent: guest gives 8 back to alpha.
    let pool = |beta_lends: Option<u32>| PoolInput {
        departments: Vec::new(),
        capacity: 16,
        teams: vec![
            team("alpha", 8, 8, 1, vec![ns("alpha-ns", 0, 0, 8)]),
            TeamInput {
                lending_limit: beta_lends,
                ..team("beta", 8, 8, 1, vec![ns("beta-ns", 0, 0, 8)])
            },
            using("guest", 0, 16, 1, 8),
        ],
    };
    let out = compute_pool(&pool(Some(0)));
    assert_eq!(reclaims(&out), [("guest", 8, "alpha")]);
    // Without lending limits nobody knows whose devices guest holds: free devices serve the
    // owners in name order, as before.
    let out = compute_pool(&pool(None));
    assert_eq!(reclaims(&out), [("guest", 8, "beta")]);
}

#[test]
fn duplicate_lending_limits_merge_to_the_largest() {
    let merged = |a: Option<u32>, b: Option<u32>| {
        let out = compute_pool(&PoolInput {
            departments: Vec::new(),
            capacity: 10,
            teams: vec![
                TeamInput {
                    lending_limit: a,
                    ..using("alpha", 8, 8, 1, 0)
                },
                TeamInput {
                    lending_limit: b,
                    ..using("alpha", 8, 8, 1, 0)
                },
            ],
        });
        (out.teams[0].lending_limit, out.teams[0].reserved)
    };
    assert_eq!(merged(Some(2), Some(5)), (Some(5), 3));
    assert_eq!(merged(Some(5), Some(2)), (Some(5), 3));
    assert_eq!(merged(Some(2), None), (None, 0));
    assert_eq!(merged(None, Some(0)), (None, 0));
}

#[test]
fn duplicate_teams_are_merged() {
    let a = compute_pool(&PoolInput {
        departments: Vec::new(),
        capacity: 10,
        teams: vec![
            team("alpha", 2, 3, 1, vec![ns("x", 1, 1, 0)]),
            team("alpha", 4, 1, 5, vec![ns("x", 1, 0, 1), ns("y", 2, 2, 0)]),
        ],
    });
    let b = compute_pool(&PoolInput {
        departments: Vec::new(),
        capacity: 10,
        teams: vec![team(
            "alpha",
            4,
            4,
            5,
            vec![ns("y", 2, 2, 0), ns("x", 2, 1, 1)],
        )],
    });
    assert_eq!(a, b);
    assert_eq!(a.teams.len(), 1);
}

#[test]
fn extreme_values_do_not_panic() {
    let huge = ns("n", u32::MAX, u32::MAX, u32::MAX);
    let out = compute_pool(&PoolInput {
        departments: Vec::new(),
        capacity: u32::MAX,
        teams: vec![
            team(
                "a",
                u32::MAX,
                u32::MAX,
                u32::MAX,
                vec![huge.clone(), ns("m", u32::MAX, 0, 0)],
            ),
            team("b", u32::MAX, 0, 0, vec![huge.clone()]),
            team("c", 0, u32::MAX, 1, vec![]),
        ],
    });
    assert_eq!(out.teams.len(), 3);
    assert!(compute_pool(&PoolInput::default()).teams.is_empty());
}

#[test]
fn a_teams_quota_holds_while_its_claims_are_on_their_way_to_free_devices() {
    // research (8 guaranteed) starts 16 one-GPU Pods; production (8 guaranteed) is idle and
    // lends at most 4 of its 8. research may hold its 8 and production's 4: 12. Its claims are
    // created faster than the scheduler allocates them, so it is below its guarantee in
    // allocated devices while its Pods wait; but its claims are charged and the free devices
    // cover them, so nothing waits on a borrower. Its quota must stay at 12 throughout: every
    // change of a ResourceQuota's hard makes kube-controller-manager recount its use from a
    // cache that lags the burst, and admission then lets a claim past the hard.
    let pool = |requested, allocated, pending| PoolInput {
        departments: Vec::new(),
        capacity: 16,
        teams: vec![
            team(
                "research",
                8,
                16,
                1,
                vec![ns("research", requested, allocated, pending)],
            ),
            lending(4, team("production", 8, 16, 1, vec![])),
        ],
    };
    // (requested, allocated, pending) as the burst goes on; the last is when it has all.
    for usage in [
        (4, 4, 12),
        (4, 0, 12),
        (9, 4, 6),
        (11, 3, 8),
        (12, 7, 9),
        (12, 12, 4),
    ] {
        let out = compute_pool(&pool(usage.0, usage.1, usage.2));
        let research = share(&out, "research");
        assert_eq!(
            research.entitlement, 12,
            "{usage:?}: {}",
            research.explanation
        );
        assert!(out.reclaims.is_empty(), "{usage:?}");
    }
    // production's own Pods then wait for 2 while research holds its 12, 4 of them production's:
    // the 4 production kept unlent are free and cover them, nobody gives back.
    let out = compute_pool(&PoolInput {
        teams: vec![
            team("research", 8, 16, 1, vec![ns("research", 12, 12, 4)]),
            lending(
                4,
                team("production", 8, 16, 1, vec![ns("production", 0, 0, 2)]),
            ),
        ],
        ..pool(0, 0, 0)
    });
    assert_eq!(share(&out, "research").entitlement, 12);
    assert!(out.reclaims.is_empty());
}
