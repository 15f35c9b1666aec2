//! What-if faults (`[whatif]`): parsing errors, and their effect on the simulated step.
//!
//! The job: a tiny dense model, HSDP 2 replicas x 8 shards over 4 machines of 4 dies in two
//! supernodes, so each shard group (ranks 0-7, 8-15) spans the two machines of one supernode
//! (intra-supernode tier) and each replica pair {r, r+8} crosses supernodes.

use hpfsdp_plan::overrides::{Override, apply_to_text};
use hpfsdp_plan::scenario::Scenario;
use hpfsdp_plan::{PlanError, Tier};
use hpfsdp_program::step::{Payload, StepProgram};
use hpfsdp_sim::HardwareProfile;
use hpfsdp_sim::result::SimResult;
use hpfsdp_sim::scenario_run::{
    PreparedRun, RunOptions, ScenarioPlans, hardware_dir_for, prepare, run_prepared,
};
use std::path::{Path, PathBuf};

fn scenario_path() -> PathBuf {
    // Inside scenarios/verify/ so the compact model path resolves.
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios/verify/whatif-test.toml")
}

const BASE: &str = r#"
name = "whatif-test"
hardware = "ascend-910c-a3"

[model]
compact = "models/tiny-dense.toml"
dtype = "f32"

[mesh]
dp_replicate = 2
dp_shard = 8
tp = 1
ep = 1

[topology]
dies_per_machine = 4
machines_per_supernode = 2
supernodes = 2

[train]
seq_len = 32
global_batch = 16
micro_batch = 1
recompute = "off"

[fsdp]
strategy = "hyperparallel"
reshard_after_forward = true
prefetch_depth = 1
param_dtype = "bf16"
reduce_dtype = "f32"

[optimizer]
kind = "adamw"
preset = "hyperparallel"
"#;

fn load(whatif: &str) -> Result<Scenario, PlanError> {
    Scenario::from_str_at(&format!("{BASE}\n[whatif]\n{whatif}\n"), &scenario_path())
}

fn profile() -> HardwareProfile {
    HardwareProfile::load_named("ascend-910c-a3", hardware_dir_for(&scenario_path())).unwrap()
}

fn prepared(scenario: Scenario, fold: bool) -> PreparedRun {
    prepare(&ScenarioPlans::new(scenario), "hyperparallel", None, fold).unwrap()
}

fn sim(p: &PreparedRun) -> SimResult {
    run_prepared(p, &profile(), &RunOptions::default())
        .unwrap()
        .result
}

fn run(whatif: &str, fold: bool) -> SimResult {
    sim(&prepared(load(whatif).unwrap(), fold))
}

fn baseline() -> SimResult {
    sim(&prepared(
        Scenario::from_str_at(BASE, &scenario_path()).unwrap(),
        true,
    ))
}

#[test]
fn bad_whatif_input_names_file_line_and_fix() {
    let cases = [
        (r#"slow_ranks = { "16" = 1.3 }"#, "rank 16 does not exist"),
        (r#"slow_ranks = { "3" = -1.0 }"#, "must lie in"),
        (
            r#"degraded_links = [{ tier = "backbone", machines = [0], bandwidth_factor = 0.5 }]"#,
            "unknown tier 'backbone'",
        ),
        (
            r#"degraded_links = [{ tier = "intra-supernode", machines = [9], bandwidth_factor = 0.5 }]"#,
            "machine 9 does not exist",
        ),
        ("straggler_jitter_pct = 200", "straggler_jitter_pct = 200"),
    ];
    let whatif_line = BASE.lines().count() + 2;
    for (text, needle) in cases {
        let e = load(text).unwrap_err().to_string();
        assert!(e.contains("whatif-test.toml"), "{e}");
        assert!(e.contains(&format!(":{}:", whatif_line + 1)), "{text}: {e}");
        assert!(e.contains(needle), "{text}: {e}");
    }
    let e = load("slow_rank = 3").unwrap_err().to_string();
    assert!(e.contains("slow_rank"), "{e}");
}

#[test]
fn no_whatif_leaves_the_prediction_unchanged() {
    let base = baseline();
    // An empty section, and factors of exactly 1, perturb nothing and fold as before.
    for text in ["", r#"slow_ranks = { "3" = 1.0 }"#, "seed = 5"] {
        let r = run(text, true);
        assert_eq!(r, base, "[whatif] {text}");
    }
    assert!(base.folded);
}

#[test]
fn a_slow_rank_lengthens_the_step_and_becomes_critical() {
    let base = baseline();
    let slow = run(r#"slow_ranks = { "13" = 1.5 }"#, true);
    assert!(slow.step_time_ns > base.step_time_ns);
    assert_eq!(slow.critical_rank, 13);
    // The slow rank is simulated on its own, and folding still predicts what unfolded does.
    assert_eq!(slow.rank(13).unwrap().rank, 13);
    let unfolded = run(r#"slow_ranks = { "13" = 1.5 }"#, false);
    assert_eq!(slow.step_time_ns, unfolded.step_time_ns);
    assert_eq!(slow.critical_rank, unfolded.critical_rank);
    // Slower still costs more.
    let slower = run(r#"slow_ranks = { "13" = 2.0 }"#, true);
    assert!(slower.step_time_ns > slow.step_time_ns);
}

/// Sum over `rank`'s collectives on `tier` of their transfer time (rendezvous to end).
fn transfer_ns(p: &PreparedRun, r: &SimResult, rank: usize, tier: Tier) -> u64 {
    let unit = p.workload.rank_unit[rank] as usize;
    let program: &StepProgram = &p.workload.units[unit].program;
    let spans = &r.timeline.as_ref().unwrap().rank(rank).unwrap().spans;
    program
        .ops
        .iter()
        .zip(spans)
        .filter(|(op, _)| matches!(&op.payload, Payload::Collective(c) if c.tier == tier))
        .map(|(_, s)| s.end_ns - s.transfer_start_ns.unwrap())
        .sum()
}

#[test]
fn degraded_links_slow_only_collectives_touching_those_machines() {
    let base_p = prepared(Scenario::from_str_at(BASE, &scenario_path()).unwrap(), true);
    let base = sim(&base_p);
    let text = r#"degraded_links = [{ tier = "intra-supernode", machines = [1], bandwidth_factor = 0.25 }]"#;
    let p = prepared(load(text).unwrap(), true);
    let r = sim(&p);
    let t = Tier::IntraSupernode;
    // The tiny model's communication hides under compute: the step may not grow.
    assert!(r.step_time_ns >= base.step_time_ns);
    // Supernode 0's shard group (ranks 0-7) touches machine 1: slower transfers.
    for rank in [0, 5] {
        assert!(
            transfer_ns(&p, &r, rank, t) > transfer_ns(&base_p, &base, rank, t),
            "rank {rank}"
        );
    }
    // Supernode 1's shard group (ranks 8-15) does not: its transfers take what they took.
    for rank in [8, 15] {
        assert_eq!(
            transfer_ns(&p, &r, rank, t),
            transfer_ns(&base_p, &base, rank, t),
            "rank {rank}"
        );
    }
    // The inter-supernode replica transfers are untouched by an intra-supernode fault.
    assert_eq!(
        transfer_ns(&p, &r, 0, Tier::InterSupernode),
        transfer_ns(&base_p, &base, 0, Tier::InterSupernode)
    );
    let unfolded = run(text, false);
    assert_eq!(r.step_time_ns, unfolded.step_time_ns);
}

#[test]
fn jitter_is_deterministic_for_a_seed_and_differs_across_seeds() {
    let a = run("straggler_jitter_pct = 10\nseed = 1", true);
    let b = run("straggler_jitter_pct = 10\nseed = 1", true);
    let c = run("straggler_jitter_pct = 10\nseed = 2", true);
    assert_eq!(a, b);
    assert_ne!(a.step_time_ns, c.step_time_ns);
    assert_ne!(a.step_time_ns, baseline().step_time_ns);
    // Every rank draws its own noise, so none folds.
    assert_eq!(a.simulated_ranks, 16);
    assert_eq!(
        a.step_time_ns,
        run("straggler_jitter_pct = 10\nseed = 1", false).step_time_ns
    );
}

#[test]
fn whatif_keys_sweep_through_dotted_overrides() {
    let path = scenario_path();
    let file = path.display().to_string();
    let steps: Vec<u64> = ["0", "5", "10"]
        .iter()
        .map(|v| {
            let o = Override::parse(&format!("whatif.straggler_jitter_pct={v}")).unwrap();
            let text = apply_to_text(BASE, &file, &[o]).unwrap();
            sim(&prepared(
                Scenario::from_str_at(&text, &path).unwrap(),
                true,
            ))
            .step_time_ns
        })
        .collect();
    assert_eq!(steps[0], baseline().step_time_ns);
    assert_ne!(steps[1], steps[0]);
    assert_ne!(steps[2], steps[1]);
    // An override that breaks the section is a scenario error naming the key.
    let o = Override::parse("whatif.straggler_jitter_pct=120").unwrap();
    let text = apply_to_text(BASE, &file, &[o]).unwrap();
    let e = Scenario::from_str_at(&text, &path).unwrap_err().to_string();
    assert!(e.contains("straggler_jitter_pct"), "{e}");
}

#[test]
fn cost_table_has_baseline_each_fault_and_all() {
    use hpfsdp_sim::whatif_costs::whatif_costs;
    let scenario =
        load("slow_ranks = { \"13\" = 1.5 }\nstraggler_jitter_pct = 5\nseed = 3").unwrap();
    let plans = ScenarioPlans::new(scenario);
    let rows = whatif_costs(&plans, "hyperparallel", &profile(), &RunOptions::default()).unwrap();
    let labels: Vec<&str> = rows.iter().map(|r| r.fault.as_str()).collect();
    assert_eq!(
        labels,
        ["baseline", "slow_ranks", "straggler_jitter_pct", "all"]
    );
    assert_eq!(rows[0].step_time_s, baseline().step_time_s());
    assert_eq!(rows[0].delta_s, 0.0);
    assert!(rows[1].delta_s > 0.0 && rows[1].delta_pct > 0.0);
    assert_eq!(rows[1].critical_rank, 13);
    // The `all` row is the scenario as written.
    let all = run(
        "slow_ranks = { \"13\" = 1.5 }\nstraggler_jitter_pct = 5\nseed = 3",
        true,
    );
    assert_eq!(rows[3].step_time_s, all.step_time_s());
}
