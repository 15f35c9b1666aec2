//! Profiling helper: one benchmark case, chosen by the first argument (`100k`, `768`, `768-flat`).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let profile = hpfsdp_sim::HardwareProfile::builtin("ascend-910c-a3")?;
    let which = std::env::args().nth(1).unwrap_or_else(|| "100k".into());
    let (cfg, fold) = match which.as_str() {
        "768" => (hpfsdp_sim::SyntheticConfig::ranks_768(), true),
        "768-flat" => (hpfsdp_sim::SyntheticConfig::ranks_768(), false),
        _ => (hpfsdp_sim::SyntheticConfig::ranks_100k(), true),
    };
    for _ in 0..3 {
        println!("{}", hpfsdp_sim::bench_synthetic(&cfg, &profile, fold)?);
    }
    Ok(())
}
