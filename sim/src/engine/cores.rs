//! Device cores shared between streams ([`SideStreamKernels`]).
//!
//! A kernel launched on a side stream (the FSDP all-gather / reduce-scatter streams, a copy
//! or optimizer stream) needs free compute cores. When the compute stream is running a
//! segment of many kernels, the side kernel's blocks are dispatched only as the compute
//! stream's current kernel releases its cores, so the side kernel's span (and everything
//! queued behind it on its stream) stretches by the time that kernel still had to run.
//!
//! The engine knows a compute op as a list of kernels (its kernel mix) but not where inside
//! the op the side kernel arrives, so it charges the **expected** residual for an arrival
//! uniformly distributed over the op: a kernel of length `L_i` is hit with probability
//! `L_i / sum(L)` and then has `L_i / 2` left on average, so the wait is
//! `sum_{i holding the cores}(L_i^2) / (2 sum_i L_i)` (the length-biased residual), capped by
//! the op's remaining time. Kernels that do not hold the cores the side kernel needs (a GEMM
//! on the cube cores of an Ascend separation-architecture die, when the side kernel is a
//! vector kernel) count in the denominator only. Every quantity comes from the kernel costs
//! the simulator already has; there is no fitted constant, and the result is a pure function
//! of the op, so runs stay deterministic.
//!
//! Sources and assumptions:
//! - SOURCED (hiascend Ascend C guide, "basic architecture", CANN 8.x): Atlas A2 (910B) and
//!   Atlas A3 (910C) training products are the *separation* architecture: the AI Core is split
//!   into AI Cube (AIC) and AI Vector (AIV) cores, each with its own scalar unit; the older
//!   Atlas training products (910) are coupled.
//! - SOURCED (CANN `SetBlockDim`): in separation mode a vector-only operator starts `blockDim`
//!   AIV instances, a cube-only operator AIC instances, a mixed operator groups of both;
//!   `blockDim` is set to the physical core count (or a multiple) to use the whole die.
//! - SOURCED (torchair "AI Core and Vector Core core-count configuration", A2/A3): "in
//!   multi-stream scenarios all cores can be occupied by one stream, which lowers operator
//!   parallelism", hence its per-operator core limits; the example platform file lists 24
//!   cube and 48 vector cores.
//! - SOURCED (CUDA programming guide, concurrent kernel execution): kernels of different
//!   streams overlap only when the SMs have free resources.
//! - ASSUMPTION: which kernels use which cores: element-wise divisions, copies and the
//!   memory-bound kernels are AIV kernels, plain and grouped GEMMs AIC-only, fused attention
//!   mixed; a side kernel is dispatched (first-come) behind the compute kernel already holding
//!   the cores and gets them as that kernel's last blocks finish (no preemption, no
//!   per-stream priority); a side op waits once (the divisions are one kernel each); the
//!   reverse effect (a compute kernel slowed by a side kernel holding cores) and collectives
//!   expanded on AIV cores are not modelled.

use crate::compute_cost::kernel_s;
use crate::cost::compute_s;
use crate::profile::{HardwareProfile, SideStreamKernels};
use hpfsdp_plan::kernel::{KernelClass, KernelWork, MixId};
use hpfsdp_program::step::ComputeWork;
use std::collections::BTreeMap;

/// Whether a compute kernel of class `class` holds cores a side-stream kernel needs under
/// `policy`; `side_uses_cube` says whether the side op itself has cube work (a GEMM on the
/// optimizer stream) or is vector work only (element-wise divisions, copies).
pub(crate) fn holds_side_cores(
    class: &KernelClass,
    policy: SideStreamKernels,
    side_uses_cube: bool,
) -> bool {
    match policy {
        SideStreamKernels::Concurrent => false,
        SideStreamKernels::WaitForCores => true,
        // Separation architecture: plain and grouped GEMMs run on the AI Cube cores;
        // memory-bound kernels on the AI Vector cores; fused attention is a mixed (cube +
        // vector) kernel. A side op with cube work (and, conservatively, its vector work)
        // waits for every compute kernel.
        SideStreamKernels::WaitForVectorCores => {
            side_uses_cube
                || class.is_memory_bound()
                || matches!(class, KernelClass::Attention { .. })
        }
    }
}

/// Whether compute work `work` has kernels that run on cube cores (GEMMs, fused attention).
pub(crate) fn uses_cube_cores(
    work: &ComputeWork,
    mixes: &BTreeMap<MixId, Vec<KernelWork>>,
) -> bool {
    work.mix
        .and_then(|id| mixes.get(&id))
        .is_some_and(|kernels| kernels.iter().any(|k| !k.class.is_memory_bound()))
}

/// Expected wait, seconds, of a side-stream kernel that arrives at a uniformly random time
/// while the compute stream runs an op of `work` (see the module doc): the length-biased
/// residual of the op's kernels that hold the side kernel's cores (`side_uses_cube`: see
/// [`holds_side_cores`]). 0 under [`SideStreamKernels::Concurrent`].
pub(crate) fn side_wait_s(
    work: &ComputeWork,
    mixes: &BTreeMap<MixId, Vec<KernelWork>>,
    profile: &HardwareProfile,
    side_uses_cube: bool,
) -> f64 {
    let policy = profile.device.side_stream_kernels;
    if policy == SideStreamKernels::Concurrent {
        return 0.0;
    }
    let holds = |class: &KernelClass| holds_side_cores(class, policy, side_uses_cube);
    let (mut squares_s2, mut total_s) = (0.0, 0.0);
    match work.mix.and_then(|id| mixes.get(&id)) {
        Some(kernels) => {
            for k in kernels {
                let entry_s = kernel_s(k, profile);
                total_s += entry_s;
                if holds(&k.class) {
                    // `count` kernels of `entry_s / count` each: sum of squares.
                    squares_s2 += entry_s * entry_s / f64::from(k.count.max(1));
                }
            }
        }
        None => {
            // `kernels` equal memory-bound launches.
            let entry_s = compute_s(work.flops, work.hbm_bytes, work.kernels, profile);
            total_s = entry_s;
            if holds(&KernelClass::MemoryBound) {
                squares_s2 = entry_s * entry_s / f64::from(work.kernels.max(1));
            }
        }
    }
    if total_s > 0.0 {
        squares_s2 / (2.0 * total_s)
    } else {
        0.0
    }
}

/// How long a side-stream kernel that becomes ready at `now_ns` waits for cores, given the
/// compute stream's running device op (started at `start_ns`, lasting `duration_ns`, with
/// expected residual `wait_ns` from [`side_wait_s`]): the residual, capped by what is left
/// of the op; 0 once the op has ended.
pub(crate) fn core_wait_ns(now_ns: u64, start_ns: u64, duration_ns: u64, wait_ns: u64) -> u64 {
    let end_ns = start_ns.saturating_add(duration_ns);
    wait_ns.min(end_ns.saturating_sub(now_ns))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn profile(policy: SideStreamKernels) -> HardwareProfile {
        let mut p = HardwareProfile::builtin("ascend-910c-a3").expect("builtin");
        p.device.side_stream_kernels = policy;
        p
    }

    #[test]
    fn the_wait_is_capped_by_the_ops_remaining_time() {
        assert_eq!(core_wait_ns(100, 0, 1_000, 300), 300);
        assert_eq!(core_wait_ns(900, 0, 1_000, 300), 100);
        assert_eq!(core_wait_ns(1_200, 0, 1_000, 300), 0);
    }

    #[test]
    fn equal_memory_bound_kernels_wait_half_a_kernel() {
        let p = profile(SideStreamKernels::WaitForCores);
        let work = ComputeWork::memory_bound(0, 4_000_000_000, 10);
        let op_s = compute_s(0, 4_000_000_000, 10, &p);
        let wait = side_wait_s(&work, &BTreeMap::new(), &p, false);
        // sum(L^2) / (2 sum L) with ten kernels of op_s / 10: half a kernel.
        assert!(
            (wait - op_s / 20.0).abs() < 1e-12 * op_s,
            "{wait} vs {op_s}"
        );
        let concurrent = profile(SideStreamKernels::Concurrent);
        assert_eq!(
            side_wait_s(&work, &BTreeMap::new(), &concurrent, false),
            0.0
        );
    }

    #[test]
    fn vector_side_kernels_do_not_wait_behind_gemms() {
        let gemm = KernelWork {
            class: KernelClass::Gemm {
                m: 4096,
                n: 4096,
                k: 4096,
                batch: 1,
            },
            count: 2,
            flops: 2 * 2 * 4096u64.pow(3),
            hbm_bytes: 2 * 3 * 2 * 4096 * 4096,
        };
        let norm = KernelWork::memory_bound(4, 0, 400_000_000);
        let mix = MixId(7);
        let mixes = BTreeMap::from([(mix, vec![gemm, norm])]);
        let work = ComputeWork {
            flops: gemm.flops,
            hbm_bytes: gemm.hbm_bytes + norm.hbm_bytes,
            kernels: 6,
            mix: Some(mix),
        };
        let all = profile(SideStreamKernels::WaitForCores);
        let vector = profile(SideStreamKernels::WaitForVectorCores);
        let (g, n) = (kernel_s(&gemm, &all), kernel_s(&norm, &all));
        let expect_all = (g * g / 2.0 + n * n / 4.0) / (2.0 * (g + n));
        let expect_vector = (n * n / 4.0) / (2.0 * (g + n));
        let got_all = side_wait_s(&work, &mixes, &all, false);
        let got_vector = side_wait_s(&work, &mixes, &vector, false);
        assert!(
            (got_all - expect_all).abs() < 1e-12,
            "{got_all} vs {expect_all}"
        );
        assert!(
            (got_vector - expect_vector).abs() < 1e-12,
            "{got_vector} vs {expect_vector}"
        );
        assert!(got_vector < got_all);
        // A side op with cube work waits for every compute kernel.
        assert_eq!(side_wait_s(&work, &mixes, &vector, true), got_all);
        assert!(uses_cube_cores(&work, &mixes));
        assert!(!uses_cube_cores(
            &ComputeWork::memory_bound(0, 1, 1),
            &mixes
        ));
    }
}
