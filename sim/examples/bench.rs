//! Prints the simulator benchmark: `cargo run --release -p hpfsdp-sim --example bench`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let profile = hpfsdp_sim::HardwareProfile::builtin("ascend-910c-a3")?;
    print!("{}", hpfsdp_sim::bench_suite(&profile, None)?);
    Ok(())
}
