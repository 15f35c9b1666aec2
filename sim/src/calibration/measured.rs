//! A measured run as the calibration uses it: which experiment it belongs to, the scenario
//! and strategy that set it up, and its measured figures, each with its source and the rule
//! it is checked by. Runs are data: they are read from runs files ([`super::runs_file`]),
//! never written in Rust.

use super::figure::Figure;
use super::gates::FigureRule;
use std::path::PathBuf;

/// One measured figure of one run.
#[derive(Debug, Clone, PartialEq)]
pub struct MeasuredFigure {
    /// What was measured.
    pub figure: Figure,
    /// The measured value in the figure's base unit (seconds, bytes, a count, a fraction).
    pub value: f64,
    /// Where the value comes from (table, log, paper section).
    pub source: String,
    /// How it is fitted and checked: the figure's default rule
    /// ([`super::gates::FIGURE_RULES`]) with the runs file's overrides applied.
    pub rule: FigureRule,
}

/// A measured run: experiment, the scenario file that sets it up, how to simulate it, and its
/// figures.
#[derive(Debug, Clone, PartialEq)]
pub struct MeasuredRun {
    /// Experiment label (`B`, `A mbs2`): leave-one-out leaves experiments out as a whole.
    pub experiment: String,
    /// Run label, unique within its experiment (`PyTorch FSDP2`, `production mode`).
    pub label: String,
    /// Scenario file (resolved against the runs file's directory).
    pub scenario: PathBuf,
    /// Strategy simulated.
    pub strategy: String,
    /// Optimizer strategy of the simulated programs; `None`: the scenario's default.
    pub optimizer: Option<String>,
    /// Simulate with validation-mode dispatch costs.
    pub validation_mode: bool,
    /// The measured figures, in [`Figure`] order.
    pub figures: Vec<MeasuredFigure>,
    /// Device memory held through the measured steps by something the scenario does not
    /// run (another model, an earlier run's tensors a harness left allocated): added to the
    /// predicted peak memory before it is compared.
    pub resident: Option<ResidentMemory>,
    /// The runs file it was read from.
    pub file: PathBuf,
}

/// Memory allocated on the measured device for the whole of a run's measured steps that the
/// run's own step does not allocate, with where the figure comes from. A peak-memory
/// measurement includes it, the simulated step cannot: the comparison adds it to the
/// predicted `peak_allocated_bytes` and `peak_reserved_bytes`.
#[derive(Debug, Clone, PartialEq)]
pub struct ResidentMemory {
    /// Bytes held, per device.
    pub bytes: f64,
    /// How the figure was derived (what holds the memory, and why it stays allocated).
    pub source: String,
}

impl MeasuredRun {
    /// The measured value of `figure`, when the run has it.
    pub fn value(&self, figure: Figure) -> Option<f64> {
        self.figures
            .iter()
            .find(|m| m.figure == figure)
            .map(|m| m.value)
    }
}
