//! The engine's entry point: a workload whose units share program prefixes is simulated by
//! forking ([`super::fork`]), any other unit by unit.

use super::{SimOptions, fork, simulate_unshared};
use crate::error::SimError;
use crate::profile::HardwareProfile;
use crate::result::SimResult;
use crate::share::SharePlan;
use crate::workload::Workload;
use hpfsdp_program::step::StepProgram;

/// Simulates one step of `workload` on `profile`. Units that share a program prefix
/// ([`crate::share`]) are simulated together until their programs diverge; the result is the
/// one [`simulate_unshared`] gives, with fewer events processed.
pub fn simulate(
    workload: &Workload,
    profile: &HardwareProfile,
    options: &SimOptions,
) -> Result<SimResult, SimError> {
    // What-if faults give units with identical programs different durations, which a shared
    // prefix cannot represent: such runs are simulated unit by unit.
    if workload.whatif.is_some() {
        return simulate_unshared(workload, profile, options);
    }
    match SharePlan::of(workload) {
        Some(plan) => fork::simulate_shared(workload, &plan, profile, options),
        None => simulate_unshared(workload, profile, options),
    }
}

/// Simulates explicit per-rank programs, folding symmetric ranks when `fold` is true.
pub fn simulate_programs(
    programs: Vec<StepProgram>,
    profile: &HardwareProfile,
    fold: bool,
    options: &SimOptions,
) -> Result<SimResult, SimError> {
    let topology = profile.topology_for(programs.len());
    let workload = if fold {
        Workload::folded(programs, topology)?
    } else {
        Workload::unfolded(programs, topology)?
    };
    simulate(&workload, profile, options)
}
