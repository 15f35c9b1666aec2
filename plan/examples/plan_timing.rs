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
#[cfg(unix)]
fn cpu_s() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the duration of the call.
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

/// Wall seconds since the first call, where the process CPU clock is not available.
#[cfg(not(unix))]
fn cpu_s() -> f64 {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    START
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_secs_f64()
}

/// Loads, plans and FSDP-plans `path` `reps` times; prints the CPU time of each stage (ms) in
/// the first repetition (a fresh heap, as in `hpfsdp bench-case`) and the least over all, and
/// the digests of the last plans.
fn time_one(path: &Path, reps: usize) -> Result<(), String> {
    let mut first = [0.0; 3];
    let mut best = [f64::MAX; 3];
    let mut digests = (String::new(), String::new());
    for rep in 0..reps {
        let t0 = cpu_s();
        let scenario = Scenario::load(path).map_err(|e| e.to_string())?;
        let t1 = cpu_s();
        if std::env::var_os("PLAN_RSS").is_some() {
            let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
            eprintln!("rss pages after load: {statm}");
        }
        let sharding = plan(&scenario.model, &scenario.planner_input());
        let t2 = cpu_s();
        if std::env::var_os("PLAN_RSS").is_some() {
            let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
            eprintln!("rss pages after sharding: {statm}");
        }
        let fsdp = build_fsdp_plan(&scenario, &sharding);
        let t3 = cpu_s();
        if std::env::var_os("PLAN_RSS").is_some() {
            let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
            eprintln!("rss pages after plans: {statm}");
        }
        let ms = [(t1 - t0) * 1e3, (t2 - t1) * 1e3, (t3 - t2) * 1e3];
        if rep == 0 {
            first = ms;
        }
        for (b, m) in best.iter_mut().zip(ms) {
            *b = b.min(m);
        }
        digests = (sharding.digest(), hpfsdp_plan::digest::digest_json(&fsdp));
    }
    println!(
        "{}: CPU ms load/plan/fsdp first {:.1}/{:.1}/{:.1} best {:.1}/{:.1}/{:.1}; sharding {} fsdp {}",
        path.display(),
        first[0],
        first[1],
        first[2],
        best[0],
        best[1],
        best[2],
        &digests.0[..16],
        &digests.1[..16]
    );
    Ok(())
}
