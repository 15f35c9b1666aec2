//! Invariants of the simulated HyperParallel Muon step on every Muon scenario:
//!
//! 1. **The simulator charges the NS kernel mixes.** On every simulated rank, the device time
//!    of its Newton-Schulz ops in the timeline equals what the simulator's own cost function
//!    ([`hpfsdp_sim::cost::compute_work_s`], whatever its per-class tables) gives for their
//!    kernel mixes, and every NS op carries a mix whose GEMMs hold all its matmul FLOPs.
//! 2. **Owners share the NS work.** The ranks that orthogonalize anything each carry about
//!    their share (total NS time / owners): no rank more than [`MAX_SHARE_FACTOR`] times the
//!    mean. Shares are not equal: HyperParallel's greedy runs per sub-batch (calibration
//!    README: "the simpler per-sub-batch greedy owner assignment"), so coordinate 0 takes the
//!    largest matrix of every sub-batch (2.2x the mean on the 30-layer Qwen3-14B, 3.7x on
//!    exp-c's TP-sharded 7BV2 with two replicas); a rank doing everything would be 16x.
//! 3. **Owners compute concurrently.** The optimizer range of every rank is at most
//!    [`MAX_RANGE_FACTOR`] times the largest owner's NS time plus that rank's optimizer
//!    communication and other optimizer kernels (AdamW, momentum, apply); communication
//!    counts data movement only, not the wait for a peer still computing. Every scenario
//!    sits at about 1.0. A plan that leaves one owner at work while the others wait (every
//!    matrix above the NS memory cap a batch of its own) gives 3.3 on the 30-layer Qwen3-14B
//!    comparison ([`one_owner_at_a_time_breaks_the_range_bound`]).

use hpfsdp_plan::scenario::Scenario;
use hpfsdp_program::step::{Category, Payload, StepProgram};
use hpfsdp_sim::cost::compute_work_s;
use hpfsdp_sim::scenario_run::{RunOptions, ScenarioPlans, prepare, run_prepared};
use hpfsdp_sim::{HardwareProfile, SimResult};
use std::path::PathBuf;

/// Largest NS time of one owner over the mean of the owners.
const MAX_SHARE_FACTOR: f64 = 4.0;
/// Largest optimizer range over (largest owner NS time + the rank's optimizer communication
/// and other optimizer kernels).
const MAX_RANGE_FACTOR: f64 = 2.0;

fn scenarios() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scenarios")
}

/// True for the op names of Newton-Schulz calls (`...ns<k>`).
fn is_ns(name: &str) -> bool {
    name.rsplit_once(".ns")
        .is_some_and(|(_, k)| !k.is_empty() && k.chars().all(|c| c.is_ascii_digit()))
}

/// The NS ops of a program (index and name).
fn ns_ops(p: &StepProgram) -> Vec<usize> {
    p.ops
        .iter()
        .enumerate()
        .filter(|(_, o)| {
            o.category == Category::Optimizer && is_ns(o.name.as_deref().unwrap_or(""))
        })
        .map(|(i, _)| i)
        .collect()
}

/// Figures of one simulated rank: NS time by the cost function and by the timeline, the
/// optimizer range and optimizer communication, and how many ranks it stands for.
struct RankNs {
    rank: usize,
    ns_cost_s: f64,
    ns_timeline_s: f64,
    range_s: f64,
    /// Data-movement time of its optimizer collectives (peer waits excluded).
    comm_s: f64,
    /// Device time of the rank's other optimizer kernels (AdamW, momentum, apply, unpack).
    other_s: f64,
    ranks: usize,
}

fn per_rank(
    prepared: &hpfsdp_sim::scenario_run::PreparedRun,
    result: &SimResult,
    profile: &HardwareProfile,
) -> Vec<RankNs> {
    let timeline = result.timeline.as_ref().expect("timeline");
    let mut out = Vec::new();
    for unit in &prepared.workload.units {
        let p = &unit.program;
        let spans = &timeline.rank(p.rank).expect("rank timeline").spans;
        let mut cost = 0.0;
        let mut seen = 0.0;
        for i in ns_ops(p) {
            let Payload::Compute(w) = p.ops[i].payload else {
                panic!("NS op {i} is not a compute op");
            };
            let mix = w.mix.expect("NS ops carry a kernel mix");
            let gemm: u64 = p.kernel_mixes[&mix]
                .iter()
                .filter(|k| k.class.name() == "gemm")
                .map(|k| k.flops)
                .sum();
            assert!(gemm > 0 && gemm <= w.flops, "op {i}: GEMM FLOPs {gemm}");
            cost += compute_work_s(&w, &p.kernel_mixes, profile);
            let s = spans.iter().find(|s| s.op.index() == i).expect("span");
            seen += (s.end_ns - s.start_ns) as f64 * 1e-9;
        }
        let ns = ns_ops(p);
        let other: f64 = p
            .ops
            .iter()
            .enumerate()
            .filter(|(i, o)| {
                o.category == Category::Optimizer
                    && o.payload.as_collective().is_none()
                    && !ns.contains(i)
            })
            .filter_map(|(i, _)| spans.iter().find(|s| s.op.index() == i))
            .map(|s| (s.end_ns - s.start_ns) as f64 * 1e-9)
            .sum();
        // Optimizer collectives' data movement, from the moment all peers had arrived (the
        // wait for a peer still computing is not communication work).
        let transfer: f64 = p
            .ops
            .iter()
            .enumerate()
            .filter(|(_, o)| {
                o.category == Category::Optimizer && o.payload.as_collective().is_some()
            })
            .filter_map(|(i, _)| spans.iter().find(|s| s.op.index() == i))
            .map(|s| (s.end_ns - s.transfer_start_ns.unwrap_or(s.start_ns)) as f64 * 1e-9)
            .sum();
        let rr = result.rank(p.rank).expect("rank result");
        let opt = rr
            .breakdown
            .by_category
            .iter()
            .find(|c| c.category == Category::Optimizer);
        out.push(RankNs {
            rank: p.rank,
            ns_cost_s: cost,
            ns_timeline_s: seen,
            range_s: opt.map_or(0.0, |c| {
                c.last_end_ns.saturating_sub(c.first_start_ns) as f64 * 1e-9
            }),
            comm_s: transfer,
            other_s: other,
            ranks: unit.ranks.iter().map(|r| r.end - r.start).sum(),
        });
    }
    out
}

/// Simulates the scenario's HyperParallel Muon step; returns its per-rank NS figures.
fn simulate_ranks(plans: &ScenarioPlans, rel: &str) -> Vec<RankNs> {
    let profile =
        HardwareProfile::load_named(&plans.scenario.file.hardware, scenarios().join("hardware"))
            .unwrap();
    let prepared = prepare(plans, "hyperparallel", Some("hyperparallel"), true)
        .unwrap_or_else(|e| panic!("{rel}: {e}"));
    let options = RunOptions {
        fold: true,
        optimizer: Some("hyperparallel".to_string()),
        ..RunOptions::default()
    };
    let result = run_prepared(&prepared, &profile, &options)
        .unwrap_or_else(|e| panic!("{rel}: {e}"))
        .result;
    per_rank(&prepared, &result, &profile)
}

/// The largest range / (largest owner NS + comm + other) ratio over the ranks.
fn worst_range_ratio(ranks: &[RankNs]) -> f64 {
    let largest = ranks.iter().map(|r| r.ns_cost_s).fold(0.0, f64::max);
    ranks
        .iter()
        .map(|r| r.range_s / (largest + r.comm_s + r.other_s))
        .fold(0.0, f64::max)
}

fn check(rel: &str) {
    let plans = ScenarioPlans::new(Scenario::load(&scenarios().join(rel)).unwrap());
    let ranks = simulate_ranks(&plans, rel);
    // 1. The timeline charges exactly the cost function's time for the kernel mixes.
    for r in &ranks {
        assert!(
            (r.ns_timeline_s - r.ns_cost_s).abs() <= 1e-6 + 1e-6 * r.ns_cost_s,
            "{rel} rank {}: NS {:.6} s in the timeline, {:.6} s by the cost function",
            r.rank,
            r.ns_timeline_s,
            r.ns_cost_s
        );
    }
    // 2. Owners carry about their share.
    let owners: Vec<&RankNs> = ranks.iter().filter(|r| r.ns_cost_s > 0.0).collect();
    assert!(!owners.is_empty(), "{rel}: no rank orthogonalizes anything");
    let owner_ranks: usize = owners.iter().map(|r| r.ranks).sum();
    let total: f64 = owners.iter().map(|r| r.ns_cost_s * r.ranks as f64).sum();
    let mean = total / owner_ranks as f64;
    let largest = owners.iter().map(|r| r.ns_cost_s).fold(0.0, f64::max);
    println!(
        "{rel}: NS {total:.3} s over {owner_ranks} owner ranks (mean {:.1} ms, largest {:.1} ms)",
        mean * 1e3,
        largest * 1e3
    );
    assert!(
        largest <= MAX_SHARE_FACTOR * mean,
        "{rel}: one owner has {:.1} ms of NS, {:.2}x the mean {:.1} ms",
        largest * 1e3,
        largest / mean,
        mean * 1e3
    );
    // 3. The optimizer range is a small factor above the owner work plus communication and
    //    the rank's other optimizer kernels.
    for r in &ranks {
        let work = largest + r.comm_s + r.other_s;
        println!(
            "  rank {:>3} (x{}): NS {:.1} ms, optimizer range {:.1} ms, comm {:.1} ms, other \
             {:.1} ms, range / (largest NS + comm + other) = {:.2}",
            r.rank,
            r.ranks,
            r.ns_cost_s * 1e3,
            r.range_s * 1e3,
            r.comm_s * 1e3,
            r.other_s * 1e3,
            r.range_s / work
        );
        assert!(
            r.range_s <= MAX_RANGE_FACTOR * work,
            "{rel} rank {}: optimizer range {:.1} ms over {MAX_RANGE_FACTOR} x (largest owner \
             NS {:.1} ms + optimizer comm {:.1} ms + other optimizer kernels {:.1} ms): owners \
             do not compute concurrently",
            r.rank,
            r.range_s * 1e3,
            largest * 1e3,
            r.comm_s * 1e3,
            r.other_s * 1e3
        );
    }
}

#[test]
fn muon_comparison_scenarios() {
    for rel in [
        "paper/muon-vs-dmuon.toml",
        "paper/muon-vs-matrixfsdp.toml",
        "paper/muon-vs-flexshard.toml",
        "fixtures/muon-hsdp-2x8.toml",
    ] {
        check(rel);
    }
}

#[test]
fn experiment_scenarios() {
    for rel in [
        "paper/exp-a-mbs1.toml",
        "paper/exp-a-mbs2.toml",
        "paper/exp-b.toml",
        "paper/exp-c.toml",
    ] {
        check(rel);
    }
}

/// exp-d (768 ranks; its 32-rank miniature fixture is host-launch bound, its optimizer range
/// set by launches rather than by NS): `cargo test --release -p hpfsdp-sim --test muon_invariants -- --ignored`.
#[test]
#[ignore = "slow: exp-d programs for 768 ranks"]
fn exp_d() {
    check("paper/exp-d.toml");
}

/// The defect the range invariant exists for: the 30-layer Qwen3-14B comparison planned with
/// every matrix above the 2^29 / 16 cap in an NS batch of its own (the revision without
/// `min_batch_size = S`) leaves one owner computing at a time: range / (largest owner NS +
/// comm + other) is 3.3, over the bound; the current plan stays at 1.0.
#[test]
fn one_owner_at_a_time_breaks_the_range_bound() {
    let path = scenarios().join("paper/muon-vs-dmuon.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    let serial = text.replace("ns_steps = 5", "ns_steps = 5\nns_batch_fill_owners = false");
    assert_ne!(serial, text);
    let plans = ScenarioPlans::new(Scenario::from_str_at(&serial, &path).unwrap());
    let bad = worst_range_ratio(&simulate_ranks(&plans, "serial muon-vs-dmuon"));
    let plans = ScenarioPlans::new(Scenario::load(&path).unwrap());
    let good = worst_range_ratio(&simulate_ranks(&plans, "muon-vs-dmuon"));
    println!("range / (largest NS + comm + other): {bad:.2} serial, {good:.2} filled");
    assert!(bad > MAX_RANGE_FACTOR, "{bad:.2}");
    assert!(good <= MAX_RANGE_FACTOR, "{good:.2}");
}
