//! Compute costs memoised for one engine's set-up. The ops of a folded job's units repeat the
//! same work many times over (the Newton-Schulz kernels of every memory batch, the same tail
//! kernels on hundreds of classes), and costing one walks its kernel mix through the
//! roofline and core-sharing models. A kernel mix's id is the digest of its kernels, so equal
//! [`ComputeWork`] means equal costs in any program of the job; what-if scales are applied
//! to the memoised seconds afterwards, as before, so every duration is unchanged.

use super::cores;
use crate::cost::compute_work_s;
use crate::profile::HardwareProfile;
use hpfsdp_plan::kernel::{KernelWork, MixId};
use hpfsdp_program::step::ComputeWork;
use rustc_hash::FxHashMap;
use std::collections::BTreeMap;

/// The costs of one compute op, in seconds, before any what-if scale.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct ComputeCost {
    /// Device time of the op ([`compute_work_s`]).
    pub(super) work_s: f64,
    /// Expected wait of a side-stream kernel arriving while it runs on the compute stream
    /// ([`cores::side_wait_s`]); 0 for an op on another stream.
    pub(super) side_wait_s: f64,
    /// The op has cube work ([`cores::uses_cube_cores`]).
    pub(super) uses_cube: bool,
}

/// [`ComputeCost`]s by work and whether the op runs on the compute stream.
#[derive(Debug, Default)]
pub(super) struct ComputeMemo {
    /// Hashed with FxHash: the keys are a few integers, looked up once per compute op of
    /// every unit set up.
    costs: FxHashMap<(ComputeWork, bool), ComputeCost>,
}

impl ComputeMemo {
    /// The costs of `work` (its mix in `mixes`) on `profile`; `on_compute`: the op runs on
    /// the compute stream.
    pub(super) fn cost(
        &mut self,
        work: &ComputeWork,
        on_compute: bool,
        mixes: &BTreeMap<MixId, Vec<KernelWork>>,
        profile: &HardwareProfile,
    ) -> ComputeCost {
        *self
            .costs
            .entry((*work, on_compute))
            .or_insert_with(|| ComputeCost {
                work_s: compute_work_s(work, mixes, profile),
                side_wait_s: if on_compute {
                    cores::side_wait_s(work, mixes, profile, false)
                } else {
                    0.0
                },
                uses_cube: cores::uses_cube_cores(work, mixes),
            })
    }
}
