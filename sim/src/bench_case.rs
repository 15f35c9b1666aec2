//! One benchmark case as data: what `hpfsdp bench` runs, serialisable so that each case can
//! run in a process of its own (the CLI re-executes itself with the case as JSON, so every
//! case's peak memory and CPU time are its own), and the standard list of cases.

use crate::bench::{
    BenchReport, SyntheticConfig, bench_scenario, bench_synthetic, scaled_scenario,
};
use crate::error::SimError;
use crate::profile::HardwareProfile;
use hpfsdp_plan::scenario::Scenario;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// What a case's figures feed besides its own row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CaseRole {
    /// Only its own row.
    Plain,
    /// exp-d with AdamW: the denominator of the Muon / AdamW ratios.
    ExpDAdamw,
    /// exp-d with its distributed Muon: the numerator of the ratios and the smallest point
    /// of the scaling fit.
    ExpDMuon,
    /// exp-d replicated with Muon: a point of the scaling fit (time against ranks).
    MuonScaling,
}

/// One benchmark case.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum BenchCase {
    /// The synthetic SPMD step ([`SyntheticConfig`]), folded or every rank on its own.
    Synthetic {
        /// The step's shape.
        config: SyntheticConfig,
        /// Fold identical ranks.
        fold: bool,
    },
    /// A scenario file, its plans derived, programs generated and folded, one step simulated.
    Scenario {
        /// Row name.
        name: String,
        /// The scenario file.
        path: PathBuf,
        /// FSDP strategy (`None`: the scenario's `fsdp.strategy`).
        strategy: Option<String>,
        /// Optimizer strategy (`None`: the scenario's default, distributed Muon on
        /// `muon+adamw` scenarios).
        optimizer: Option<String>,
        /// Replicate the job to about this many ranks first ([`scaled_scenario`]).
        scale_to_ranks: Option<usize>,
        /// What its figures feed.
        role: CaseRole,
    },
}

/// Row name of exp-d with AdamW.
pub const EXP_D_ADAMW: &str = "exp-d (AdamW)";
/// Row name of exp-d with its distributed Muon.
pub const EXP_D_MUON: &str = "exp-d (distributed Muon)";

impl BenchCase {
    /// The row name.
    pub fn name(&self) -> &str {
        match self {
            BenchCase::Synthetic { config, .. } => &config.name,
            BenchCase::Scenario { name, .. } => name,
        }
    }

    /// What its figures feed.
    pub fn role(&self) -> CaseRole {
        match self {
            BenchCase::Synthetic { .. } => CaseRole::Plain,
            BenchCase::Scenario { role, .. } => *role,
        }
    }

    /// The scenario file at `path` with its own strategy and optimizer, named by its stem.
    pub fn scenario_file(path: &Path) -> Self {
        let name = path.file_stem().map_or_else(
            || path.display().to_string(),
            |s| s.to_string_lossy().into(),
        );
        BenchCase::Scenario {
            name,
            path: path.to_path_buf(),
            strategy: None,
            optimizer: None,
            scale_to_ranks: None,
            role: CaseRole::Plain,
        }
    }

    /// Runs the case in this process. Errors name the scenario file that failed to load.
    pub fn run(&self, profile: &HardwareProfile) -> Result<BenchReport, SimError> {
        match self {
            BenchCase::Synthetic { config, fold } => bench_synthetic(config, profile, *fold),
            BenchCase::Scenario {
                name,
                path,
                strategy,
                optimizer,
                scale_to_ranks,
                ..
            } => {
                let scenario = Scenario::load(path).map_err(|e| {
                    SimError::Workload(format!("bench scenario {}: {e}", path.display()))
                })?;
                let scenario = match scale_to_ranks {
                    Some(ranks) => scaled_scenario(&scenario, *ranks)?,
                    None => scenario,
                };
                let strategy = strategy
                    .clone()
                    .unwrap_or_else(|| scenario.file.fsdp.strategy.clone());
                bench_scenario(name, scenario, &strategy, optimizer.as_deref(), profile)
            }
        }
    }
}

/// The synthetic cases: the 48-layer step on 768 ranks folded and unfolded and on 1,024
/// ranks unfolded (unfolded, every rank is simulated on its own: the engine's event rate).
pub fn synthetic_cases() -> Vec<BenchCase> {
    let flat_1024 = SyntheticConfig::qwen3_like("1,024 ranks (64 x 16), 48 layers", 64, 16, 48);
    vec![
        BenchCase::Synthetic {
            config: SyntheticConfig::ranks_768(),
            fold: true,
        },
        BenchCase::Synthetic {
            config: SyntheticConfig::ranks_768(),
            fold: false,
        },
        BenchCase::Synthetic {
            config: flat_1024,
            fold: false,
        },
    ]
}

/// The exp-d cases from its scenario file: AdamW, distributed Muon, and Muon with 4x and
/// 131x the replicas (3,072 and 100,608 ranks).
pub fn exp_d_cases(exp_d: &Path) -> Vec<BenchCase> {
    let case =
        |name: &str, optimizer: Option<&str>, scale: Option<usize>, role| BenchCase::Scenario {
            name: name.into(),
            path: exp_d.to_path_buf(),
            strategy: Some("hyperparallel".into()),
            optimizer: optimizer.map(str::to_string),
            scale_to_ranks: scale,
            role,
        };
    vec![
        case(EXP_D_ADAMW, Some("adamw"), None, CaseRole::ExpDAdamw),
        case(EXP_D_MUON, None, None, CaseRole::ExpDMuon),
        case(
            "exp-d x4 replicas (distributed Muon)",
            None,
            Some(3_072),
            CaseRole::MuonScaling,
        ),
        case(
            "exp-d x131 replicas (distributed Muon)",
            None,
            Some(100_000),
            CaseRole::MuonScaling,
        ),
    ]
}

/// A scenario file of exp-d replicated with Muon (the ~1M-rank job), as a scaling point.
pub fn muon_scaling_file(path: &Path) -> BenchCase {
    let mut case = BenchCase::scenario_file(path);
    if let BenchCase::Scenario { role, .. } = &mut case {
        *role = CaseRole::MuonScaling;
    }
    case
}

/// What the suite's ratios and fit read from one case's run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CaseFigures {
    /// The case's role.
    pub role: CaseRole,
    /// Ranks in the job.
    pub ranks: usize,
    /// Wall seconds.
    pub wall_s: f64,
    /// CPU seconds (user + system).
    pub cpu_s: f64,
    /// Peak resident memory, bytes.
    pub peak_rss_bytes: u64,
}

/// The figures drawn from a suite's cases.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct SuiteFigures {
    /// exp-d with Muon over exp-d with AdamW: (wall, CPU, peak RSS) ratios.
    pub muon_over_adamw: Option<(f64, f64, f64)>,
    /// Exponent `b` of `wall = a * ranks^b` over exp-d with Muon and its scaled copies.
    pub scaling_exponent: Option<f64>,
    /// The same on CPU seconds.
    pub cpu_scaling_exponent: Option<f64>,
}

/// The ratios and the scaling fits of `cases` ([`CaseRole`] says which feed what).
pub fn suite_figures(cases: &[CaseFigures]) -> SuiteFigures {
    let of = |role| cases.iter().find(|c| c.role == role);
    let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { f64::NAN };
    let muon_over_adamw = of(CaseRole::ExpDMuon)
        .zip(of(CaseRole::ExpDAdamw))
        .map(|(m, a)| {
            (
                ratio(m.wall_s, a.wall_s),
                ratio(m.cpu_s, a.cpu_s),
                ratio(m.peak_rss_bytes as f64, a.peak_rss_bytes as f64),
            )
        });
    let muon: Vec<&CaseFigures> = cases
        .iter()
        .filter(|c| matches!(c.role, CaseRole::ExpDMuon | CaseRole::MuonScaling))
        .collect();
    let points = |f: fn(&CaseFigures) -> f64| -> Vec<(f64, f64)> {
        muon.iter().map(|c| (c.ranks as f64, f(c))).collect()
    };
    SuiteFigures {
        muon_over_adamw,
        scaling_exponent: crate::bench::log_log_slope(&points(|c| c.wall_s)),
        cpu_scaling_exponent: crate::bench::log_log_slope(&points(|c| c.cpu_s)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A case survives the JSON trip the CLI sends it through to its child process.
    #[test]
    fn cases_round_trip_through_json() {
        let mut cases = synthetic_cases();
        cases.extend(exp_d_cases(Path::new("scenarios/paper/exp-d.toml")));
        cases.push(muon_scaling_file(Path::new("x/exp-d-1m-muon.toml")));
        for case in &cases {
            let text = serde_json::to_string(case).unwrap();
            let back: BenchCase = serde_json::from_str(&text).unwrap();
            assert_eq!(&back, case);
        }
        assert_eq!(cases.last().unwrap().name(), "exp-d-1m-muon");
        assert_eq!(cases.last().unwrap().role(), CaseRole::MuonScaling);
    }

    /// The ratios read the two exp-d cases; the fit reads every Muon point and nothing else.
    #[test]
    fn suite_figures_read_the_roles() {
        let case = |role, ranks: usize, cpu_s: f64| CaseFigures {
            role,
            ranks,
            wall_s: cpu_s / 2.0,
            cpu_s,
            peak_rss_bytes: (cpu_s * 1e6) as u64,
        };
        let figures = suite_figures(&[
            case(CaseRole::Plain, 10, 100.0),
            case(CaseRole::ExpDAdamw, 768, 1.0),
            case(CaseRole::ExpDMuon, 768, 2.0),
            case(CaseRole::MuonScaling, 768 * 16, 8.0),
        ]);
        let (wall, cpu, rss) = figures.muon_over_adamw.unwrap();
        assert_eq!((wall, cpu, rss), (2.0, 2.0, 2.0));
        assert!((figures.cpu_scaling_exponent.unwrap() - 0.5).abs() < 1e-12);
        assert!((figures.scaling_exponent.unwrap() - 0.5).abs() < 1e-12);
        let alone = suite_figures(&[case(CaseRole::Plain, 10, 1.0)]);
        assert_eq!(alone, SuiteFigures::default());
    }
}
