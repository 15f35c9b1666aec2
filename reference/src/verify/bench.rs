//! The mode benchmark (the CPU analogue of the paper's experiment A): the same step in
//! production and validation mode at micro-batch 1 and 2, measured in one run; reports the
//! validation/production step-time ratio and the extra dispatch events per step.

use serde::Serialize;

use super::error::VerifyError;
use super::harness::run_distributed;
use super::setup::VerifySpec;
use crate::runtime::ExecMode;

/// One micro-batch size's measurement.
#[derive(Debug, Clone, Serialize)]
pub struct ModeBench {
    /// Sequences per micro-batch.
    pub micro_batch: usize,
    /// Best production step time over the repeats, seconds (slowest rank).
    pub production_s: f64,
    /// Best validation step time over the repeats, seconds (slowest rank).
    pub validation_s: f64,
    /// `validation_s / production_s`.
    pub ratio: f64,
    /// Dispatch events per step, all ranks, production.
    pub production_events: u64,
    /// Dispatch events per step, all ranks, validation.
    pub validation_events: u64,
    /// `validation_events - production_events`.
    pub extra_events: u64,
    /// Rule lookups answered by the cache, validation.
    pub rule_cache_hits: u64,
    /// Validation-only host time per rank (mean over ranks, best repeat), seconds.
    pub validation_host_s: f64,
    /// `validation_host_s / production_s`: the overhead share measured inside the step,
    /// less sensitive to thread scheduling than the end-to-end ratio.
    pub host_overhead: f64,
}

/// Measure both modes at micro-batch 1 and 2, `repeats` times each (best time kept).
pub fn bench_modes(spec: &VerifySpec, repeats: usize) -> Result<Vec<ModeBench>, VerifyError> {
    let mut out = Vec::new();
    for mb in [1usize, 2] {
        let mut s = spec.clone();
        s.micro_batch = mb;
        s.grad_accum = 1;
        // One step, the optimizer alone (no naive Muon baseline beside it).
        s.steps = 1;
        if let Some(m) = s.muon.as_mut() {
            m.naive = false;
        }
        let (mut tp, mut tv) = (f64::INFINITY, f64::INFINITY);
        let (mut ep, mut ev, mut hits) = (0, 0, 0);
        let mut host = f64::INFINITY;
        for _ in 0..repeats.max(1) {
            let p = run_distributed(&s, ExecMode::Production)?;
            let v = run_distributed(&s, ExecMode::Validation)?;
            tp = tp.min(p.step_seconds());
            tv = tv.min(v.step_seconds());
            ep = p.stats().total();
            ev = v.stats().total();
            hits = v.stats().rule_cache_hits;
            host =
                host.min(v.stats().validation_host_ns as f64 * 1e-9 / v.ranks.len().max(1) as f64);
        }
        out.push(ModeBench {
            micro_batch: mb,
            production_s: tp,
            validation_s: tv,
            ratio: tv / tp,
            production_events: ep,
            validation_events: ev,
            extra_events: ev.saturating_sub(ep),
            rule_cache_hits: hits,
            validation_host_s: host,
            host_overhead: host / tp,
        });
    }
    Ok(out)
}
