//! The standard benchmark run in one process ([`bench_suite`]): the cases of
//! [`crate::bench_case`], each run by [`crate::bench`], and the figures drawn from them
//! (exp-d's Muon/AdamW ratios, the scaling exponents). `hpfsdp bench` runs the same cases
//! each in a process of its own.

use crate::bench::{BenchReport, SyntheticConfig};
use crate::bench_case::{BenchCase, CaseFigures, exp_d_cases, suite_figures, synthetic_cases};
use crate::error::SimError;
use crate::profile::HardwareProfile;
use serde::{Deserialize, Serialize};
use std::path::Path;

/// What [`bench_suite`] measured: the runs, then the figures drawn from them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchSuite {
    /// Every run, in the order run.
    pub reports: Vec<BenchReport>,
    /// exp-d with distributed Muon over exp-d with AdamW: (wall, CPU, peak RSS) ratios.
    pub muon_over_adamw: Option<(f64, f64, f64)>,
    /// Exponent `b` of the least-squares fit `wall = a * ranks^b` over the Muon runs of exp-d
    /// and its scaled copies (1 = linear in ranks, 0 = independent of them).
    pub scaling_exponent: Option<f64>,
    /// The same fit on CPU seconds (meaningful on a machine shared with other work).
    #[serde(default)]
    pub cpu_scaling_exponent: Option<f64>,
}

impl std::fmt::Display for BenchSuite {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for r in &self.reports {
            writeln!(f, "{r}")?;
        }
        if let Some((wall, cpu, rss)) = self.muon_over_adamw {
            writeln!(
                f,
                "exp-d Muon / AdamW: wall {wall:.2}x, CPU {cpu:.2}x, peak RSS {rss:.2}x"
            )?;
        }
        if let Some(b) = self.scaling_exponent {
            writeln!(
                f,
                "scaling with Muon: wall ~ ranks^{b:.2} (least squares over the Muon runs)"
            )?;
        }
        if let Some(b) = self.cpu_scaling_exponent {
            writeln!(f, "scaling with Muon: CPU ~ ranks^{b:.2}")?;
        }
        Ok(())
    }
}

/// Number of runs [`bench_suite`] makes, with and without exp-d.
pub fn suite_runs(with_exp_d: bool) -> usize {
    if with_exp_d { 3 + 4 } else { 3 + 1 }
}

/// The standard benchmark in this process: the synthetic cases
/// ([`crate::bench_case::synthetic_cases`]), then, when `exp_d` (its scenario file) is given,
/// the exp-d cases ([`crate::bench_case::exp_d_cases`]); the Muon/AdamW ratios and the scaling
/// exponent close it. Without `exp_d`, the synthetic step at 100,608 ranks. `hpfsdp bench`
/// runs the same cases each in a process of its own.
pub fn bench_suite(
    profile: &HardwareProfile,
    exp_d: Option<&Path>,
) -> Result<BenchSuite, SimError> {
    bench_suite_with(profile, exp_d, &mut |_| {})
}

/// [`bench_suite`], calling `on_run` with each report as soon as its run ends (for progress;
/// [`suite_runs`] says how many there are).
pub fn bench_suite_with(
    profile: &HardwareProfile,
    exp_d: Option<&Path>,
    on_run: &mut dyn FnMut(&BenchReport),
) -> Result<BenchSuite, SimError> {
    let mut cases = synthetic_cases();
    match exp_d {
        Some(path) => cases.extend(exp_d_cases(path)),
        None => cases.push(BenchCase::Synthetic {
            config: SyntheticConfig::ranks_100k(),
            fold: true,
        }),
    }
    let mut reports = Vec::new();
    let mut figures = Vec::new();
    for case in &cases {
        let r = case.run(profile)?;
        on_run(&r);
        figures.push(CaseFigures {
            role: case.role(),
            ranks: r.world_size,
            wall_s: r.wall_s(),
            cpu_s: r.cpu_s,
            peak_rss_bytes: r.peak_rss_bytes,
        });
        reports.push(r);
    }
    let f = suite_figures(&figures);
    Ok(BenchSuite {
        reports,
        muon_over_adamw: f.muon_over_adamw,
        scaling_exponent: f.scaling_exponent,
        cpu_scaling_exponent: f.cpu_scaling_exponent,
    })
}
