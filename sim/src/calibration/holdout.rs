//! What a leave-one-out fold leaves out: a whole held-in experiment, or one measured run of
//! it. Bounds and measured constants say which runs their values come from, so a fold
//! blinds exactly what it must ([`super::params::FitParam::without`],
//! [`super::params::blind_profile`]).

use super::measured::MeasuredRun;

/// A whole experiment, or one run of it, left out of a fold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holdout {
    /// The experiment (`B`, `A mbs2`).
    pub experiment: String,
    /// The run of that experiment (`PyTorch FSDP2`, `validation mode`); `None`: all of them.
    pub run: Option<String>,
}

impl Holdout {
    /// Every run of `experiment`.
    pub fn whole(experiment: impl Into<String>) -> Holdout {
        Holdout {
            experiment: experiment.into(),
            run: None,
        }
    }

    /// One run of `experiment`.
    pub fn run(experiment: impl Into<String>, run: impl Into<String>) -> Holdout {
        Holdout {
            experiment: experiment.into(),
            run: Some(run.into()),
        }
    }

    /// Whether measured run `r` is left out.
    pub fn covers(&self, r: &MeasuredRun) -> bool {
        self.covers_row(&r.experiment, &r.label)
    }

    /// Whether a figure of experiment `experiment`, run `run` is left out.
    pub fn covers_row(&self, experiment: &str, run: &str) -> bool {
        experiment == self.experiment && self.run.as_deref().is_none_or(|r| r == run)
    }

    /// Whether a value taken from runs `runs` of experiment `experiment` (`runs` empty: from
    /// the experiment as a whole, or from several of its runs together) uses anything left
    /// out.
    pub fn touches(&self, experiment: &str, runs: &[String]) -> bool {
        experiment == self.experiment
            && match &self.run {
                None => true,
                Some(run) => runs.is_empty() || runs.contains(run),
            }
    }
}

impl std::fmt::Display for Holdout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.run {
            Some(run) => write!(f, "{} / {run}", self.experiment),
            None => f.write_str(&self.experiment),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_holdout_covers_that_run_only_and_names_it() {
        let whole = Holdout::whole("B");
        let one = Holdout::run("B", "PyTorch FSDP2");
        assert!(whole.covers_row("B", "PyTorch FSDP2"));
        assert!(whole.covers_row("B", "HyperParallel-FSDP"));
        assert!(one.covers_row("B", "PyTorch FSDP2"));
        assert!(!one.covers_row("B", "HyperParallel-FSDP"));
        assert!(!one.covers_row("A mbs2", "PyTorch FSDP2"));
        assert_eq!(whole.to_string(), "B");
        assert_eq!(one.to_string(), "B / PyTorch FSDP2");
    }

    /// A value from one run is touched by leaving out that run or its experiment, not by
    /// leaving out a sibling run; a value from the whole experiment by any of its runs.
    #[test]
    fn a_value_is_touched_by_its_own_runs_only() {
        let fsdp2 = Holdout::run("B", "PyTorch FSDP2");
        let hp = Holdout::run("B", "HyperParallel-FSDP");
        let fsdp2_run = ["PyTorch FSDP2".to_string()];
        assert!(fsdp2.touches("B", &fsdp2_run));
        assert!(!hp.touches("B", &fsdp2_run));
        assert!(hp.touches("B", &[]) && fsdp2.touches("B", &[]));
        assert!(Holdout::whole("B").touches("B", &fsdp2_run));
        assert!(!Holdout::whole("A mbs2").touches("B", &[]));
    }
}
