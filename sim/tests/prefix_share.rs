//! Prefix sharing ([`hpfsdp_sim::share`]) changes how much is simulated, never the result:
//! [`simulate`] (shared prefix) equals [`simulate_unshared`] (every unit from its first op)
//! field for field, timeline and memory series included, on the verify miniatures, the
//! miniature exp-d and the paper's Muon comparison scenarios, folded and unfolded, with every
//! optimizer strategy; only the number of events processed differs.

use hpfsdp_plan::scenario::Scenario;
use hpfsdp_sim::engine::{SimOptions, simulate, simulate_unshared};
use hpfsdp_sim::scenario_run::{ScenarioPlans, prepare};
use hpfsdp_sim::share::SharePlan;
use hpfsdp_sim::{HardwareProfile, SimResult};
use std::path::PathBuf;

fn scenarios() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scenarios")
}

fn plans(rel: &str) -> ScenarioPlans {
    let at = scenarios().join(rel);
    ScenarioPlans::new(Scenario::load(&at).unwrap_or_else(|e| panic!("{rel}: {e}")))
}

fn profile(plans: &ScenarioPlans) -> HardwareProfile {
    HardwareProfile::load_named(&plans.scenario.file.hardware, scenarios().join("hardware"))
        .unwrap()
}

/// Simulates `optimizer` on `plans` both ways; returns (shared, unshared, whether a prefix
/// was shared).
fn both(plans: &ScenarioPlans, optimizer: &str, fold: bool) -> (SimResult, SimResult, bool) {
    let what = format!("{} {optimizer} fold {fold}", plans.scenario.path.display());
    let prepared = prepare(plans, "hyperparallel", Some(optimizer), fold)
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    let options = SimOptions {
        tokens_per_step: Some(prepared.tokens_per_step),
        model_flops_per_step: Some(prepared.model_flops_per_step),
        ..SimOptions::default()
    };
    let p = profile(plans);
    let shared =
        simulate(&prepared.workload, &p, &options).unwrap_or_else(|e| panic!("{what}: {e}"));
    let flat = simulate_unshared(&prepared.workload, &p, &options)
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    let used = SharePlan::of(&prepared.workload).is_some();
    (shared, flat, used)
}

fn assert_equal(mut shared: SimResult, flat: SimResult, what: &str) {
    assert!(
        shared.events_processed <= flat.events_processed,
        "{what}: sharing processed more events"
    );
    shared.events_processed = flat.events_processed;
    if shared != flat {
        assert_eq!(shared.step_time_ns, flat.step_time_ns, "{what}: step time");
        assert_eq!(
            shared.critical_rank, flat.critical_rank,
            "{what}: critical rank"
        );
        for (a, b) in shared.ranks.iter().zip(&flat.ranks) {
            assert_eq!(a.memory, b.memory, "{what}: memory of rank {}", a.rank);
            assert_eq!(
                a.breakdown, b.breakdown,
                "{what}: breakdown of rank {}",
                a.rank
            );
        }
        let (ta, tb) = (shared.timeline.unwrap(), flat.timeline.unwrap());
        for (a, b) in ta.ranks.iter().zip(&tb.ranks) {
            for (x, y) in a.spans.iter().zip(&b.spans) {
                assert_eq!(x, y, "{what}: rank {}", a.rank);
            }
        }
        panic!("{what}: results differ");
    }
}

const OPTIMIZERS: [&str; 7] = [
    "adamw",
    "hyperparallel",
    "naive",
    "moonlight",
    "dmuon",
    "matrixfsdp",
    "flexshard",
];

#[test]
fn sharing_the_prefix_does_not_change_mini_exp_d() {
    let p = plans("fixtures/mini-exp-d.toml");
    let mut shared_any = false;
    for optimizer in OPTIMIZERS {
        for fold in [true, false] {
            let (s, f, used) = both(&p, optimizer, fold);
            shared_any |= used;
            assert_equal(s, f, &format!("mini-exp-d {optimizer} fold {fold}"));
        }
    }
    assert!(shared_any, "no run of mini-exp-d shared a prefix");
}

#[test]
fn sharing_the_prefix_does_not_change_the_verify_miniatures() {
    for name in [
        "dense-fsdp4-muon",
        "dense-hsdp4x2-muon",
        "dense-tp2-fsdp2-muon",
        "mla-hsdp2x2-muon",
        "moe-ep2-fsdp2-muon",
        "uneven-fsdp3-muon",
        "dense-hsdp2x4",
        "moe-ep2-fsdp2",
    ] {
        let p = plans(&format!("verify/{name}.toml"));
        let optimizers: &[&str] = if name.ends_with("-muon") {
            &OPTIMIZERS
        } else {
            &["adamw"]
        };
        for optimizer in optimizers {
            for fold in [true, false] {
                let (s, f, _) = both(&p, optimizer, fold);
                assert_equal(s, f, &format!("{name} {optimizer} fold {fold}"));
            }
        }
    }
}

#[test]
fn sharing_the_prefix_does_not_change_muon_hsdp_2x8() {
    let p = plans("fixtures/muon-hsdp-2x8.toml");
    for optimizer in OPTIMIZERS {
        let (s, f, _) = both(&p, optimizer, true);
        assert_equal(s, f, &format!("muon-hsdp-2x8 {optimizer}"));
    }
}

/// exp-d itself (768 ranks): `cargo test --release -p hpfsdp-sim --test prefix_share --
/// --ignored`.
#[test]
#[ignore = "slow: simulates exp-d without sharing"]
fn sharing_the_prefix_does_not_change_exp_d() {
    let p = plans("paper/exp-d.toml");
    let (s, f, used) = both(&p, "hyperparallel", true);
    assert!(used, "exp-d shares no prefix");
    println!(
        "exp-d: {} events shared vs {} unshared",
        s.events_processed, f.events_processed
    );
    assert_equal(s, f, "exp-d hyperparallel");
}
