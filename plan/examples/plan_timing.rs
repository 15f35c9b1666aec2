//! Times the planning stages of scenarios (load, sharding planner, FSDP plan) and prints a
//! digest of each plan, so a change to the planner can be checked for speed and for
//! identical output in one run.
//!
//! `cargo run --release -p hpfsdp-plan --example plan_timing -- [--reps N] SCENARIO.toml...`

use hpfsdp_plan::fsdp::build_fsdp_plan;
use hpfsdp_plan::planner::plan;
use hpfsdp_plan::scenario::Scenario;
use std::path::Path;

fn main() {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let mut reps = 1usize;
    if let Some(i) = args.iter().position(|a| a == "--reps") {
        if i + 1 >= args.len() {
            eprintln!("--reps needs a count, e.g. --reps 5");
            std::process::exit(2);
        }
        reps = match args[i + 1].parse() {
            Ok(n) if n > 0 => n,
            _ => {
                eprintln!("--reps '{}': expected a positive integer", args[i + 1]);
                std::process::exit(2);
            }
        };
        args.drain(i..i + 2);
    }
    let mut failed = false;
    for path in &args {
        if let Err(e) = time_one(Path::new(path), reps) {
            println!("{path}: cannot load: {e}");
            failed = true;
        }
    }
    if failed {
        std::process::exit(1);
    }
}

/// CPU seconds this process has used (user + system, every thread).
fn cpu_s() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the duration of the call.
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

/// Loads, plans and FSDP-plans `path` `reps` times; prints the least CPU time of each stage
/// (ms) and the digests of the last plans.
fn time_one(path: &Path, reps: usize) -> Result<(), String> {
    let (mut load_ms, mut plan_ms, mut fsdp_ms) = (f64::MAX, f64::MAX, f64::MAX);
    let mut digests = (String::new(), String::new());
    for _ in 0..reps {
        let t = cpu_s();
        let scenario = Scenario::load(path).map_err(|e| e.to_string())?;
        load_ms = load_ms.min((cpu_s() - t) * 1e3);
        let t = cpu_s();
        let sharding = plan(&scenario.model, &scenario.planner_input());
        plan_ms = plan_ms.min((cpu_s() - t) * 1e3);
        let t = cpu_s();
        let fsdp = build_fsdp_plan(&scenario, &sharding);
        fsdp_ms = fsdp_ms.min((cpu_s() - t) * 1e3);
        digests = (sharding.digest(), hpfsdp_plan::digest::digest_json(&fsdp));
    }
    println!(
        "{}: CPU load {load_ms:.1} ms, plan {plan_ms:.1} ms, fsdp {fsdp_ms:.1} ms; sharding {} fsdp {}",
        path.display(),
        &digests.0[..16],
        &digests.1[..16]
    );
    Ok(())
}
