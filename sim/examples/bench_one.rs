//! Profiling helper: one benchmark case, chosen by the first argument (`100k`, `768`,
//! `768-flat`, `expd` (exp-d with its distributed Muon), `expd-x4` (3,072 ranks), `expd-x131`);
//! the second argument is the number of repetitions (default 3). Run from the repository root.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let profile = hpfsdp_sim::HardwareProfile::builtin("ascend-910c-a3")?;
    let which = std::env::args().nth(1).unwrap_or_else(|| "100k".into());
    let reps: usize = std::env::args()
        .nth(2)
        .map_or(Ok(3), |s| s.parse())
        .map_err(|e| format!("repetitions: {e}"))?;
    let exp_d = || {
        hpfsdp_plan::scenario::Scenario::load(std::path::Path::new("scenarios/paper/exp-d.toml"))
    };
    let scenario = match which.as_str() {
        "expd" => Some(exp_d()?),
        "expd-x4" => Some(hpfsdp_sim::bench::scaled_scenario(&exp_d()?, 3_072)?),
        "expd-x131" => Some(hpfsdp_sim::bench::scaled_scenario(&exp_d()?, 100_000)?),
        _ => None,
    };
    if let Some(s) = scenario {
        if std::env::var_os("BENCH_ONE_SHARE").is_some() {
            print_sharing(s.clone())?;
        }
        for _ in 0..reps {
            let r = hpfsdp_sim::bench::bench_scenario(
                &which,
                s.clone(),
                "hyperparallel",
                None,
                &profile,
            )?;
            println!("{r}");
        }
        return Ok(());
    }
    let (cfg, fold) = match which.as_str() {
        "768" => (hpfsdp_sim::SyntheticConfig::ranks_768(), true),
        "768-flat" => (hpfsdp_sim::SyntheticConfig::ranks_768(), false),
        _ => (hpfsdp_sim::SyntheticConfig::ranks_100k(), true),
    };
    for _ in 0..reps {
        println!("{}", hpfsdp_sim::bench_synthetic(&cfg, &profile, fold)?);
    }
    Ok(())
}

/// How the folded classes of `scenario` (hyperparallel, default optimizer) share their
/// prefix: prefix length, blocks, tail ops per class and in all.
fn print_sharing(
    scenario: hpfsdp_plan::scenario::Scenario,
) -> Result<(), Box<dyn std::error::Error>> {
    let plans = hpfsdp_sim::scenario_run::ScenarioPlans::new(scenario);
    let prepared = hpfsdp_sim::scenario_run::prepare(&plans, "hyperparallel", None, true)?;
    let w = &prepared.workload;
    let ops: usize = w.simulated_ops();
    match hpfsdp_sim::share::SharePlan::of(w) {
        Some(sp) => {
            let tails: usize = w
                .units
                .iter()
                .map(|u| u.program.ops.len() - sp.prefix_len)
                .sum();
            println!(
                "{} classes, {} ops in all; prefix {} ops in {} blocks; tails {} ops in all ({:.0} per class)",
                w.units.len(),
                ops,
                sp.prefix_len,
                sp.blocks.len(),
                tails,
                tails as f64 / w.units.len() as f64
            );
        }
        None => println!(
            "{} classes, {} ops in all; no prefix sharing",
            w.units.len(),
            ops
        ),
    }
    let count = |pat: &str| {
        w.units[0]
            .program
            .ops
            .iter()
            .filter(|o| o.name.as_deref().is_some_and(|n| n.contains(pat)))
            .count()
    };
    println!(
        "rank 0: {} ops; staging around model-parallel collectives {} (stage_in) + {} (stage_out); Muon gather pack {}, unpack {}, slice {}",
        w.units[0].program.ops.len(),
        count(".stage_in"),
        count(".stage_out"),
        count(".pack."),
        count(".unpack."),
        count(".slice")
    );
    Ok(())
}
