//! The documented limits of every count a user gives to `replay` and `collbench`.
//!
//! Each limit is checked by the argument parser (clap), so a value outside it ends the run
//! with exit status 2 and a message naming the flag and the range (`invalid value '1000000000'
//! for '--steps <N>': 1000000000 is not in 1..=1000`) before anything is allocated or looped
//! over. Limits that depend on the run (the scenario's layers, the span log's size, the
//! machine's memory) are checked right after the scenario is loaded, with the same kind of
//! message.

use clap::builder::{RangedU64ValueParser, TypedValueParser};

/// Most measured steps of one replay.
pub const REPLAY_MAX_STEPS: u64 = 1000;
/// Most warm-up steps of one replay.
pub const REPLAY_MAX_WARMUP: u64 = 1000;
/// Most ranks a replay scales to (`--ranks`; it only ever scales a scenario down).
pub const REPLAY_MAX_RANKS: u64 = 4096;
/// Most decoder layers a replay keeps (`--layers`; at most the model's own count).
pub const REPLAY_MAX_LAYERS: u64 = 10_000;
/// Most ranks run as threads of one process by the `inproc` backend (replay and collbench):
/// every collective is a rendezvous of all of them on this machine's cores.
pub const INPROC_MAX_RANKS: u64 = 64;
/// Most bytes of measured spans a replay keeps (steps x ops x ranks x span size).
pub const REPLAY_MAX_SPAN_BYTES: u64 = 1 << 30;
/// Most timed calls per size of collbench (`-n`).
pub const COLLBENCH_MAX_ITERS: u64 = 10_000;
/// Most warm-up calls per size of collbench (`-w`).
pub const COLLBENCH_MAX_WARMUP: u64 = 10_000;
/// Largest size collbench sweeps to (`-e`), bytes: 16 GiB.
pub const COLLBENCH_MAX_BYTES: u64 = 16 << 30;

/// Longest `--timeout-s` of replay and collbench: one day.
pub const MAX_TIMEOUT_S: f64 = 86_400.0;

/// Checks a `--timeout-s` value: a positive number of seconds up to [`MAX_TIMEOUT_S`].
pub fn check_timeout_s(t: f64) -> anyhow::Result<()> {
    if t.is_finite() && t > 0.0 && t <= MAX_TIMEOUT_S {
        return Ok(());
    }
    let shown = if t.abs() >= 1e9 {
        format!("{t:e}")
    } else {
        t.to_string()
    };
    anyhow::bail!(
        "--timeout-s {shown}: give a positive number of seconds up to {MAX_TIMEOUT_S} (one day)"
    )
}

/// A parser for a `usize` flag whose value must lie in `min..=max`.
pub fn count_in(min: u64, max: u64) -> impl TypedValueParser<Value = usize> {
    RangedU64ValueParser::<usize>::new().range(min..=max)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Probe {
        #[arg(long, value_parser = count_in(1, REPLAY_MAX_STEPS))]
        steps: usize,
    }

    #[test]
    fn timeouts_are_bounded() {
        assert!(check_timeout_s(60.0).is_ok());
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY, 1e300] {
            let e = check_timeout_s(bad).unwrap_err().to_string();
            assert!(e.contains("--timeout-s") && e.contains("86400"), "{e}");
        }
    }

    #[test]
    fn counts_outside_their_range_name_the_flag_and_the_limit() {
        assert_eq!(Probe::parse_from(["p", "--steps", "1000"]).steps, 1000);
        for bad in ["0", "1001", "1000000000", "18446744073709551615", "-1"] {
            let e = Probe::try_parse_from(["p", "--steps", bad])
                .err()
                .expect(bad)
                .to_string();
            assert!(e.contains("--steps"), "{bad}: {e}");
            if bad != "-1" {
                assert!(e.contains("1..=1000"), "{bad}: {e}");
            }
        }
    }
}
