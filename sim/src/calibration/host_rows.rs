//! The host model's view of each measured run: rank 0's launches by class, the host seconds
//! each class costs at the profile's constants, and the host's busy time against the step
//! (a host busy for most of the step makes the step host-bound). `calibrate` prints them next
//! to the figure table, so whether a run is host- or device-bound in the model is visible.

use crate::host_cost::{HostCosts, HostTotals};
use crate::result::SimResult;
use hpfsdp_program::step::StepProgram;

/// One run's host figures.
#[derive(Debug, Clone, PartialEq)]
pub struct HostRow {
    /// Experiment label.
    pub experiment: String,
    /// Run label.
    pub run: String,
    /// Rank 0's launches by class.
    pub totals: HostTotals,
    /// The host costs the run was simulated with.
    pub costs: HostCosts,
    /// Host busy time of the critical rank, seconds.
    pub host_busy_s: f64,
    /// Step time, seconds.
    pub step_s: f64,
}

impl HostRow {
    /// The host figures of one simulated run.
    pub fn of(
        (experiment, run): (&str, &str),
        result: &SimResult,
        rank0: &StepProgram,
        costs: HostCosts,
    ) -> Self {
        Self::with_totals(
            (experiment, run),
            result,
            HostTotals::of(rank0.ops.iter()),
            costs,
        )
    }

    /// [`HostRow::of`] with rank 0's totals counted already ([`HostTotals::of`]).
    pub fn with_totals(
        (experiment, run): (&str, &str),
        result: &SimResult,
        totals: HostTotals,
        costs: HostCosts,
    ) -> Self {
        Self {
            experiment: experiment.to_string(),
            run: run.to_string(),
            totals,
            costs,
            host_busy_s: result.breakdown.host_busy_ns as f64 * 1e-9,
            step_s: result.step_time_s(),
        }
    }

    /// Host seconds by class: kernel launches, unmodelled host work per kernel, production
    /// CPU operator events, collective launches, device -> host sync calls, validation-mode
    /// events (zero in production mode).
    pub fn class_s(&self) -> [f64; 6] {
        let t = &self.totals;
        let c = &self.costs;
        [
            t.kernels as f64 * c.kernel_launch_us * 1e-6,
            t.kernels as f64 * c.kernel_unmodelled_us * 1e-6,
            t.cpu_events as f64 * c.cpu_event_us * 1e-6,
            t.collectives as f64 * c.collective_launch_us * 1e-6,
            t.d2h_syncs as f64 * c.d2h_sync_us * 1e-6,
            t.validation_events as f64 * c.validation_event_us * 1e-6,
        ]
    }
}
