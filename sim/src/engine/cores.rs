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

use crate::compute_cost::kernel_s;
use crate::cost::compute_s;
use crate::profile::{HardwareProfile, SideStreamKernels};
use hpfsdp_plan::kernel::{KernelClass, KernelWork, MixId};
use hpfsdp_plan::program::ComputeWork;
use std::collections::BTreeMap;

/// Whether a compute kernel of class `class` holds the cores a side-stream kernel needs
/// under `policy` (side kernels are element-wise divisions and copies: vector work).
pub(crate) fn holds_side_cores(class: &KernelClass, policy: SideStreamKernels) -> bool {
    match policy {
        SideStreamKernels::Concurrent => false,
        SideStreamKernels::WaitForCores => true,
        // Separation architecture: plain and grouped GEMMs run on the AI Cube cores;
        // memory-bound kernels on the AI Vector cores; fused attention is a mixed (cube +
        // vector) kernel.
        SideStreamKernels::WaitForVectorCores => {
            matches!(
                class,
                KernelClass::MemoryBound | KernelClass::Attention { .. }
            )
        }
    }
}

/// Expected wait, seconds, of a side-stream kernel that arrives at a uniformly random time
/// while the compute stream runs an op of `work` (see the module doc): the length-biased
/// residual of the op's kernels that hold the side kernel's cores. 0 under
/// [`SideStreamKernels::Concurrent`].
pub(crate) fn side_wait_s(
    work: &ComputeWork,
    mixes: &BTreeMap<MixId, Vec<KernelWork>>,
    profile: &HardwareProfile,
) -> f64 {
    let policy = profile.device.side_stream_kernels;
    if policy == SideStreamKernels::Concurrent {
        return 0.0;
    }
    let (mut squares_s2, mut total_s) = (0.0, 0.0);
    match work.mix.and_then(|id| mixes.get(&id)) {
        Some(kernels) => {
            for k in kernels {
                let entry_s = kernel_s(k, profile);
                total_s += entry_s;
                if holds_side_cores(&k.class, policy) {
                    // `count` kernels of `entry_s / count` each: sum of squares.
                    squares_s2 += entry_s * entry_s / f64::from(k.count.max(1));
                }
            }
        }
        None => {
            // `kernels` equal memory-bound launches.
            let entry_s = compute_s(work.flops, work.hbm_bytes, work.kernels, profile);
            total_s = entry_s;
            if holds_side_cores(&KernelClass::MemoryBound, policy) {
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
        let wait = side_wait_s(&work, &BTreeMap::new(), &p);
        // sum(L^2) / (2 sum L) with ten kernels of op_s / 10: half a kernel.
        assert!(
            (wait - op_s / 20.0).abs() < 1e-12 * op_s,
            "{wait} vs {op_s}"
        );
        let concurrent = profile(SideStreamKernels::Concurrent);
        assert_eq!(side_wait_s(&work, &BTreeMap::new(), &concurrent), 0.0);
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
        let got_all = side_wait_s(&work, &mixes, &all);
        let got_vector = side_wait_s(&work, &mixes, &vector);
        assert!(
            (got_all - expect_all).abs() < 1e-12,
            "{got_all} vs {expect_all}"
        );
        assert!(
            (got_vector - expect_vector).abs() < 1e-12,
            "{got_vector} vs {expect_vector}"
        );
        assert!(got_vector < got_all);
    }
}
