//! Sanity checks on the simulator's figures before they are printed: a figure that is not
//! finite, an MFU above 100% or a memory figure beyond any device means the inputs left the
//! range the cost models describe, and is reported as an error instead of as a prediction.

use crate::commands::sim_summary::StrategySummary;
use anyhow::{Result, bail};

/// Largest per-rank memory figure taken as real (1 PiB); beyond it a size wrapped or saturated.
const MAX_SANE_MEMORY_BYTES: u64 = 1 << 50;

/// Checks one strategy's summary; the error names the strategy, the figure and its value.
pub fn check_summary(s: &StrategySummary) -> Result<()> {
    let times = [
        ("step time", s.step_time_s),
        ("compute", s.compute_s),
        ("copy", s.copy_s),
        ("communication", s.comm_s),
        ("exposed communication", s.exposed_comm_total_s),
        ("idle", s.idle_s),
        ("host busy", s.host_s),
        ("overlap rate", s.overlap_rate),
    ];
    for (name, v) in times
        .into_iter()
        .chain(s.exposed_comm_s.iter().map(|(k, v)| (k.as_str(), *v)))
    {
        if !v.is_finite() || v < 0.0 {
            bail!(nonsense(s, &format!("{name} = {v}")));
        }
    }
    // NaN fails this check too (it is neither positive nor comparable).
    if s.step_time_s.is_nan() || s.step_time_s <= 0.0 {
        bail!(nonsense(s, &format!("step time = {} s", s.step_time_s)));
    }
    if let Some(t) = s.tokens_per_s
        && !(t.is_finite() && t >= 0.0)
    {
        bail!(nonsense(s, &format!("tokens/s = {t}")));
    }
    if let Some(mfu) = s.mfu
        && !(mfu.is_finite() && (0.0..=1.0).contains(&mfu))
    {
        bail!(nonsense(
            s,
            &format!("MFU = {:.1}% (above 100% is impossible)", mfu * 100.0)
        ));
    }
    if s.peak_memory_bytes > MAX_SANE_MEMORY_BYTES {
        bail!(nonsense(
            s,
            &format!("peak memory = {} bytes per rank", s.peak_memory_bytes)
        ));
    }
    Ok(())
}

fn nonsense(s: &StrategySummary, figure: &str) -> String {
    format!(
        "strategy '{}': the simulator produced {figure}, which no real run can show; the \
         scenario is outside what the cost models describe (check seq_len, batch sizes and \
         model dimensions against the limits of docs/scenario-format.md)",
        s.strategy
    )
}
