//! What one claim costs the operator's engine at 10,000 namespaces (100 teams of 100, 20
//! sharing policies, 5,000 8-GPU ResourceSlices, 20,000 claims): its whole pass, as the
//! reconciler runs it after a claim's event (the plan, every policy's status, the objects
//! compared, Events), once the cluster converged; a claim deleted, then created again, in turn,
//! each pass's effects performed by the engine tests' stand-in for the API server
//! (`tests/engine/server.rs`) and settled. `plan` measures the planner and differ alone; this is
//! what a claim's reaction waits for in the operator, with the allocator the operator binary
//! uses. Prints the median, p90 and max of the claims' passes and of the passes their own
//! writes coming back wake, and how long the converge's first pass took.
//!
//! `cargo bench -p teamgpu --bench engine` (docs/operator.md); another scale with
//! `cargo bench -p teamgpu --bench engine -- TEAMS NAMESPACES-PER-TEAM CLAIMS ROUNDS`.

#[allow(dead_code)]
#[path = "../tests/engine/server.rs"]
mod server;

use std::time::{Duration, Instant};

use k8s_openapi::jiff::Timestamp;
use server::Server;
use teamgpu::core::effects::Effect;
use teamgpu::core::engine::{Engine, Now, Pass, Role};
use teamgpu_synthetic::{Scale, synthetic};

// As in the operator binary (operator/src/main.rs).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    let args: Vec<usize> = (std::env::args().skip(1))
        .filter_map(|a| a.parse().ok())
        .collect();
    let [teams, per_team, claims, rounds] = match args[..] {
        [a, b, c, d] => [a, b, c, d],
        _ => [100, 100, 20_000, 30],
    };
    let scale = Scale {
        teams,
        namespaces_per_team: per_team,
        sharing_policies: 20,
        nodes: 5_000,
        claims,
        counter_sets: false,
        departments: 0,
    };
    let state = synthetic(scale).expect("synthetic cluster");
    let claims = state.claims.clone();
    let mut server = Server::holding(state);
    // The whole converge in one batch: what is measured comes after it.
    let mut engine = server::engine_with(usize::MAX);
    let mut clock = Clock::new();
    let started = Instant::now();
    // The converge, then passes until nothing is left to do (the guard labels, statuses).
    let mut converge = 0;
    let mut first_pass = None;
    while converge < 10 {
        converge += 1;
        let (effects, took) = pass(&mut engine, &mut server, clock.tick(2_000));
        first_pass.get_or_insert(took);
        if effects.is_empty() && converge > 1 {
            break;
        }
        let done = server.perform(&effects);
        engine.settle(done, clock.now().wall);
    }
    println!(
        "{} teams, {} namespaces, {} claims: converged in {converge} passes, {:.1?} (the first pass {:.1?})",
        scale.teams,
        scale.teams * scale.namespaces_per_team,
        claims.len(),
        started.elapsed(),
        first_pass.unwrap_or_default()
    );

    let mut times = Vec::new();
    let mut echoes = Vec::new();
    for round in 0..rounds {
        let claim = &claims[(round * 197) % claims.len()];
        let key = (
            claim.metadata.namespace.clone().unwrap_or_default(),
            claim.metadata.name.clone().unwrap_or_default(),
        );
        for deleted in [true, false] {
            if deleted {
                server.remove_claim(&key);
            } else {
                server.put_claim(claim.clone());
            }
            let (effects, took) = pass(&mut engine, &mut server, clock.tick(2_000));
            assert!(
                !effects.is_empty(),
                "a claim's pass writes its team's status"
            );
            times.push(took);
            let done = server.perform(&effects);
            engine.settle(done, clock.now().wall);
            // The pass that its own writes coming back wake.
            let (echo, took) = pass(&mut engine, &mut server, clock.tick(50));
            echoes.push(took);
            let done = server.perform(&echo);
            engine.settle(done, clock.now().wall);
        }
    }
    for (what, mut times) in [
        ("a claim deleted or created, its pass", times),
        ("the pass its writes coming back wake", echoes),
    ] {
        times.sort();
        let at = |q: f64| times[((times.len() - 1) as f64 * q).round() as usize];
        println!(
            "{what}, {} passes: median {:.1?}, p90 {:.1?}, max {:.1?}",
            times.len(),
            at(0.5),
            at(0.9),
            at(1.0)
        );
    }
}

/// One pass over what changed on `server` (listing the slices when the engine asks), and how
/// long the engine's pass itself took (taking in is per event in the operator, and the
/// stand-in hands claims over whole).
fn pass(engine: &mut Engine, server: &mut Server, now: Now) -> (Vec<Effect>, Duration) {
    for _ in 0..3 {
        for input in server.changes() {
            engine.take_in(input);
        }
        let started = Instant::now();
        match engine.pass(now, Role::Leader) {
            Pass::ListSlices(reads) => server.list_slices(reads),
            Pass::AwaitSlices => panic!("the list asked for was brought: nothing to wait for"),
            Pass::Planned(planned) => {
                let took = started.elapsed();
                return (planned.effects, took);
            }
        }
    }
    panic!("the slices were listed with what the engine asked, and it asked again");
}

/// Both clocks of a pass, moved on by hand.
struct Clock {
    start: Instant,
    ms: u64,
}

impl Clock {
    fn new() -> Self {
        Self {
            start: Instant::now(),
            ms: 0,
        }
    }

    fn now(&self) -> Now {
        Now {
            instant: self.start + Duration::from_millis(self.ms),
            wall: Timestamp::from_millisecond(1_780_000_000_000 + self.ms as i64)
                .expect("a time in range"),
        }
    }

    fn tick(&mut self, ms: u64) -> Now {
        self.ms += ms;
        self.now()
    }
}
