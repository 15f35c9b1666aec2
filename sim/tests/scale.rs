//! How the simulator scales without changing its answers: results do not depend on the number
//! of threads generating programs, and a summary-only run ([`SimOptions::all_ranks`] off)
//! reports the same figures as a full one for the ranks it keeps.

use hpfsdp_plan::scenario::Scenario;
use hpfsdp_sim::engine::{SimOptions, simulate};
use hpfsdp_sim::scenario_run::{ScenarioPlans, prepare};
use hpfsdp_sim::{HardwareProfile, SimResult};
use std::path::PathBuf;

fn scenarios() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scenarios")
}

fn mini_exp_d() -> ScenarioPlans {
    let at = scenarios().join("fixtures/mini-exp-d.toml");
    ScenarioPlans::new(Scenario::load(&at).unwrap())
}

fn run(plans: &ScenarioPlans, optimizer: &str, fold: bool, all_ranks: bool) -> SimResult {
    let prepared = prepare(plans, "hyperparallel", Some(optimizer), fold).unwrap();
    let profile =
        HardwareProfile::load_named(&plans.scenario.file.hardware, scenarios().join("hardware"))
            .unwrap();
    let options = SimOptions {
        all_ranks,
        ..SimOptions::default()
    };
    simulate(&prepared.workload, &profile, &options).unwrap()
}

/// Program generation runs on rayon; one thread and two give the same workload and result.
#[test]
fn results_do_not_depend_on_the_thread_count() {
    let plans = mini_exp_d();
    for fold in [true, false] {
        let pool = |n| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(n)
                .build()
                .unwrap()
        };
        let one = pool(1).install(|| {
            let w = prepare(&plans, "hyperparallel", Some("hyperparallel"), fold).unwrap();
            (w.workload, run(&plans, "hyperparallel", fold, true))
        });
        let two = pool(2).install(|| {
            let w = prepare(&plans, "hyperparallel", Some("hyperparallel"), fold).unwrap();
            (w.workload, run(&plans, "hyperparallel", fold, true))
        });
        assert!(one.0 == two.0, "fold {fold}: workloads differ");
        assert!(one.1 == two.1, "fold {fold}: results differ");
    }
}

/// Off, `all_ranks` keeps the critical rank's breakdown, rank 0's timeline and memory series
/// and every rank's memory peaks; the job-level figures are unchanged.
#[test]
fn summary_only_results_keep_what_a_summary_reports() {
    let plans = mini_exp_d();
    for optimizer in ["hyperparallel", "adamw"] {
        let full = run(&plans, optimizer, true, true);
        let lean = run(&plans, optimizer, true, false);
        assert_eq!(full.step_time_ns, lean.step_time_ns, "{optimizer}");
        assert_eq!(full.critical_rank, lean.critical_rank, "{optimizer}");
        assert_eq!(full.breakdown, lean.breakdown, "{optimizer}");
        assert_eq!(
            full.peak_memory_bytes, lean.peak_memory_bytes,
            "{optimizer}"
        );
        assert_eq!(full.ranks.len(), lean.ranks.len(), "{optimizer}");
        for (a, b) in full.ranks.iter().zip(&lean.ranks) {
            assert_eq!(a.end_ns, b.end_ns, "{optimizer} rank {}", a.rank);
            assert_eq!(a.memory.peak_bytes, b.memory.peak_bytes, "{optimizer}");
            assert_eq!(a.memory.at_peak, b.memory.at_peak, "{optimizer}");
            assert_eq!(a.collectives, b.collectives, "{optimizer}");
        }
        let (ft, lt) = (
            full.timeline.clone().unwrap(),
            lean.timeline.clone().unwrap(),
        );
        assert_eq!(ft.rank(0), lt.rank(0), "{optimizer}: rank 0's timeline");
        assert_eq!(
            full.rank(0).unwrap().memory,
            lean.rank(0).unwrap().memory,
            "{optimizer}: rank 0's memory"
        );
        assert!(
            lt.ranks.len() <= 2,
            "{optimizer}: {} timelines kept",
            lt.ranks.len()
        );
        if full.simulated_ranks > 2 {
            assert!(lt.ranks.len() < ft.ranks.len(), "{optimizer}");
        }
    }
}
