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
