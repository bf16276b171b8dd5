//! Fair-share engine benchmark, 1,000 teams and 100 sharing policies, read two ways:
//! - dense: every team has a quota on every policy (100 pools x 1,000 teams, 100,000 shares);
//! - sparse: every team has a quota on 5 of the 100 policies (about 50 teams per pool, 5,000
//!   shares).
//!
//! Both as a full recompute, plus the incremental update of one pool after one team's usage
//! changed, and the sparse case again with lending limits.
//!
//! Run with `cargo bench -p teamgpu --bench fairshare`.

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use teamgpu::core::fairshare::{
    NamespaceUsage, PoolInput, TeamInput, compute_pool, compute_pool_into,
};

const POOLS: usize = 100;
const TEAMS: usize = 1_000;

/// Small deterministic generator, so runs compare.
struct XorShift(u64);

impl XorShift {
    fn below(&mut self, bound: u32) -> u32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % u64::from(bound.max(1))) as u32
    }
}

/// A busy pool: guarantees near capacity, teams using and waiting for devices, 1-3 namespaces
/// each. Teams are listed sorted by name, as the planning core keeps them. `member` says which
/// of the 1,000 teams have a quota on this pool.
fn pool(seed: u64, member: impl Fn(usize) -> bool) -> PoolInput {
    let mut rng = XorShift(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let teams: Vec<TeamInput> = (0..TEAMS)
        .filter(|&i| member(i))
        .map(|i| {
            let guaranteed = rng.below(16);
            let namespaces = (0..1 + rng.below(3))
                .map(|j| {
                    let requested = rng.below(8);
                    NamespaceUsage {
                        namespace: format!("team-{i:04}-ns-{j}"),
                        requested,
                        allocated: requested - rng.below(requested + 1) / 2,
                        pending: rng.below(4),
                        unplaceable: 0,
                    }
                })
                .collect();
            TeamInput {
                team: format!("team-{i:04}"),
                guaranteed,
                limit: guaranteed + rng.below(24),
                weight: 1 + rng.below(10),
                namespaces,
                lending_limit: None,
                parent: None,
            }
        })
        .collect();
    let guaranteed: u32 = teams.iter().map(|t| t.guaranteed).sum();
    PoolInput {
        capacity: guaranteed * (80 + rng.below(60)) / 100,
        teams,
        departments: Vec::new(),
    }
}

fn bench(c: &mut Criterion) {
    let pools: Vec<PoolInput> = (0..POOLS as u64).map(|seed| pool(seed, |_| true)).collect();
    // Team i has quotas on pools i, i+20, i+40, i+60 and i+80 (mod 100).
    let sparse: Vec<PoolInput> = (0..POOLS)
        .map(|p| pool(p as u64, move |i| (i + POOLS - p).is_multiple_of(20)))
        .collect();
    assert_eq!(
        sparse.iter().map(|p| p.teams.len()).sum::<usize>(),
        5 * TEAMS
    );

    c.bench_function("full recompute, dense: 100 pools x 1000 teams", |b| {
        b.iter(|| {
            pools
                .iter()
                .map(|p| compute_pool(black_box(p)))
                .collect::<Vec<_>>()
        })
    });
    c.bench_function("full recompute, sparse: 1000 teams x 5 of 100 pools", |b| {
        b.iter(|| {
            sparse
                .iter()
                .map(|p| compute_pool(black_box(p)))
                .collect::<Vec<_>>()
        })
    });

    // The same sparse pools with lending limits: every third team lends nothing, every third
    // lends at most 2 devices, the others everything.
    let limited: Vec<PoolInput> = sparse
        .iter()
        .map(|p| {
            let mut p = p.clone();
            for (i, t) in p.teams.iter_mut().enumerate() {
                t.lending_limit = [Some(0), Some(2), None][i % 3];
            }
            p
        })
        .collect();
    c.bench_function(
        "full recompute, sparse, lending limits: 1000 teams x 5 of 100 pools",
        |b| {
            b.iter(|| {
                limited
                    .iter()
                    .map(|p| compute_pool(black_box(p)))
                    .collect::<Vec<_>>()
            })
        },
    );

    let shuffled: Vec<PoolInput> = pools
        .iter()
        .map(|p| {
            let mut p = p.clone();
            p.teams.reverse();
            p
        })
        .collect();
    c.bench_function(
        "full recompute, dense, unsorted input: 100 pools x 1000 teams",
        |b| {
            b.iter(|| {
                shuffled
                    .iter()
                    .map(|p| compute_pool(black_box(p)))
                    .collect::<Vec<_>>()
            })
        },
    );

    // Explanations are rendered on demand; this is what rendering all of one pool costs.
    let one = compute_pool(&pools[0]);
    c.bench_function("explanations: render one dense pool's 1000 lines", |b| {
        b.iter(|| {
            black_box(&one)
                .teams
                .iter()
                .map(|t| t.explanation.to_string())
                .collect::<Vec<_>>()
        })
    });

    // Incremental, as the planner's shares cache does it: one team's usage changes in one
    // pool, and only that pool (whose input changed) is computed again, into its previous
    // answer's buffers.
    let mut changed = pools[42].clone();
    let mut previous = compute_pool(&changed);
    let mut flip = false;
    c.bench_function(
        "incremental, dense: one team's usage changes in one pool",
        |b| {
            b.iter(|| {
                flip = !flip;
                changed.teams[7].namespaces[0].requested = u32::from(flip);
                compute_pool_into(black_box(&changed), &mut previous)
            })
        },
    );
}

criterion_group!(benches, bench);
criterion_main!(benches);
