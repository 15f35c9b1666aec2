//! Compute cost by kernel class: every [`KernelWork`] of a kernel mix is costed on its own,
//! `max(flops / (peak * efficiency), hbm_bytes / (hbm_bw * hbm_efficiency)) + count * launch`,
//! with the efficiency of its class and shape:
//!
//! - **GEMM** `Gemm{m, n, k, batch}` and **grouped GEMM** `GroupedGemm{tokens_per_group, n, k}`
//!   (rows = tokens per expert): from the profile's measured table (`[compute] gemm_table`,
//!   see [`crate::gemm_table`]) when it has one, else from the shape model
//!   `gemm_ceiling * s(m, m_half) * s(n, n_half) * s(k, k_half)` with `s(x, h) = x / (x + h)`:
//!   small dimensions leave most of the matrix units' tiles empty, large square GEMMs approach
//!   the fitted ceiling (`calibration.gemm_ceiling`). Outside a table's range the nearest table
//!   value is scaled by the shape model. Batched Newton-Schulz GEMMs (`batch > 1`) use the
//!   efficiency of one product of the batch.
//! - **Attention** `Attention{batch, seq, heads, head_dim}`: `gemm_ceiling *
//!   attention_relative_efficiency * s(seq, attention_seq_half)`: fused flash attention runs
//!   below the best GEMMs (FlashAttention-2 reaches 50-73% of A100 peak where tuned GEMMs reach
//!   80-90%, Dao 2023, section 1) and short sequences give each block little work.
//! - **Memory-bound** kernels: HBM bandwidth times `calibration.hbm_efficiency`.
//!
//! There is no single efficiency scalar for every op; the residual constants
//! (`gemm_ceiling`, `hbm_efficiency`) are fitted by calibration.

pub use crate::compute_spec::ComputeSpec;
use crate::compute_spec::saturation;
use crate::profile::HardwareProfile;
use hpfsdp_plan::kernel::{KernelClass, KernelWork};

/// Achieved fraction of the BF16 peak of one `[m, k] x [k, n]` GEMM.
pub fn gemm_efficiency(m: u64, n: u64, k: u64, profile: &HardwareProfile) -> f64 {
    let spec = &profile.compute;
    let (m, n, k) = (m.max(1) as f64, n.max(1) as f64, k.max(1) as f64);
    match spec.table.as_ref().and_then(|t| t.bf16()) {
        Some(grid) => {
            let (cm, cn, ck) = grid.clamp(m, n, k);
            let scale = spec.shape_factor(m, n, k) / spec.shape_factor(cm, cn, ck);
            (grid.interpolate(cm, cn, ck) * scale).min(1.0)
        }
        None => profile.calibration.gemm_ceiling * spec.shape_factor(m, n, k),
    }
}

/// Achieved fraction of the BF16 peak of a fused attention kernel over `seq`-token sequences.
pub fn attention_efficiency(seq: u64, profile: &HardwareProfile) -> f64 {
    let spec = &profile.compute;
    profile.calibration.gemm_ceiling
        * spec.attention_relative_efficiency
        * saturation(seq as f64, spec.attention_seq_half)
}

/// Device time of one kernel-mix entry, seconds.
pub fn kernel_s(k: &KernelWork, profile: &HardwareProfile) -> f64 {
    let d = &profile.device;
    let c = &profile.calibration;
    let efficiency = match k.class {
        KernelClass::Gemm { m, n, k, .. } => {
            (gemm_efficiency(m, n, k, profile) * profile.compute.gemm_in_step_speedup).min(1.0)
        }
        KernelClass::GroupedGemm {
            groups,
            tokens_per_group,
            n,
            k,
            tiling,
        } => {
            let dense = match profile.compute.grouped_gemm_relative_efficiency {
                Some(relative) => {
                    relative
                        * gemm_efficiency(groups.saturating_mul(tokens_per_group), n, k, profile)
                }
                None => gemm_efficiency(tokens_per_group, n, k, profile),
            };
            dense * tokens_per_group as f64 / tiling.padded_rows(tokens_per_group)
        }
        KernelClass::Attention { seq, .. } => attention_efficiency(seq, profile),
        // Element-wise arithmetic is never the bound of these kernels; the ceiling keeps the
        // roofline defined.
        KernelClass::MemoryBound
        | KernelClass::MultiTensorApply
        | KernelClass::IndexedElementwise
        | KernelClass::StridedElementwise => c.gemm_ceiling,
    };
    let bandwidth = match k.class {
        KernelClass::MultiTensorApply => {
            c.hbm_efficiency * profile.compute.foreach_relative_bandwidth
        }
        KernelClass::IndexedElementwise => {
            c.hbm_efficiency * profile.compute.indexed_relative_bandwidth
        }
        KernelClass::StridedElementwise => {
            c.hbm_efficiency * profile.compute.strided_relative_bandwidth
        }
        _ => c.hbm_efficiency,
    };
    let math = k.flops as f64 / (d.bf16_flops_per_s * efficiency.max(1e-9));
    let memory = k.hbm_bytes as f64 / (d.hbm_bandwidth_bytes_per_s * bandwidth);
    let serial_epilogue = matches!(
        k.class,
        KernelClass::GroupedGemm { tiling, .. } if tiling.weight_grad
    );
    let busy = if serial_epilogue {
        math + memory
    } else {
        math.max(memory)
    };
    busy + k.count as f64 * c.device_launch_us_per_kernel * 1e-6
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gemm_table::GemmTable;

    fn a3() -> HardwareProfile {
        HardwareProfile::builtin("ascend-910c-a3").unwrap()
    }

    #[test]
    fn small_m_gemms_are_slower_per_flop_than_large_square_ones() {
        let p = a3();
        let per_flop = |k: KernelWork| kernel_s(&k, &p) / k.flops as f64;
        let square = per_flop(KernelWork::gemm(8192, 8192, 8192, 1, 2));
        let thin = per_flop(KernelWork::gemm(16, 8192, 8192, 1, 2));
        assert!(thin > 5.0 * square, "thin {thin} vs square {square}");
        // Grouped expert GEMMs with few tokens per expert are slower per FLOP than many.
        let grouped = |tpg: u64| KernelWork {
            class: KernelClass::GroupedGemm {
                groups: 128,
                tokens_per_group: tpg,
                n: 1536,
                k: 2048,
                tiling: Default::default(),
            },
            count: 1,
            flops: 2 * 128 * tpg * 1536 * 2048,
            hbm_bytes: 0,
        };
        assert!(per_flop(grouped(64)) > 1.5 * per_flop(grouped(2048)));
        let e = gemm_efficiency(1 << 20, 1 << 20, 1 << 20, &p);
        assert!(e < p.calibration.gemm_ceiling && e > 0.99 * p.calibration.gemm_ceiling);
    }

    /// `torch._grouped_mm`'s tiling: expert rows padded to the row tile cost their padded
    /// rows' math; a weight gradient adds its memory time to its math time.
    #[test]
    fn grouped_gemm_tiling_pads_rows_and_serialises_the_weight_gradient_epilogue() {
        use hpfsdp_plan::kernel::GroupedTiling;
        let p = HardwareProfile::builtin("nvidia-h200-hgx").unwrap();
        let launch = p.calibration.device_launch_us_per_kernel * 1e-6;
        let grouped = |tiling, hbm_bytes| KernelWork {
            class: KernelClass::GroupedGemm {
                groups: 128,
                tokens_per_group: 256,
                n: 1536,
                k: 2048,
                tiling,
            },
            count: 1,
            flops: 2 * 128 * 256 * 1536 * 2048,
            hbm_bytes,
        };
        let dense = kernel_s(&grouped(GroupedTiling::default(), 0), &p) - launch;
        let padded =
            kernel_s(&grouped(GroupedTiling::torch_sm90(256, 1536, false), 0), &p) - launch;
        assert!((padded / dense - (256.0 + 63.5) / 256.0).abs() < 1e-12);
        let bytes = 1_000_000_000;
        let memory =
            bytes as f64 / (p.device.hbm_bandwidth_bytes_per_s * p.calibration.hbm_efficiency);
        let overlapped = kernel_s(&grouped(GroupedTiling::default(), bytes), &p) - launch;
        let serial = kernel_s(
            &grouped(GroupedTiling::torch_sm90(256, 1536, true), bytes),
            &p,
        ) - launch;
        assert!((overlapped - dense.max(memory)).abs() < 1e-12);
        assert!((serial - (dense + memory)).abs() < 1e-12);
    }

    #[test]
    fn memory_bound_kernels_cost_their_bytes_and_launches() {
        let p = a3();
        let c = &p.calibration;
        let k = KernelWork::memory_bound(8, 1000, 1_600_000_000);
        let want = 1.6e9 / (1.6e12 * c.hbm_efficiency) + 8.0 * c.device_launch_us_per_kernel * 1e-6;
        assert!((kernel_s(&k, &p) - want).abs() < 1e-12);
    }

    #[test]
    fn attention_is_below_the_gemm_ceiling_and_short_sequences_are_slower() {
        let p = a3();
        assert!(attention_efficiency(4096, &p) < p.calibration.gemm_ceiling);
        assert!(attention_efficiency(256, &p) < attention_efficiency(4096, &p));
    }

    #[test]
    fn a_table_overrides_the_model_inside_its_range_and_scales_outside() {
        let mut p = a3();
        let csv = "m,n,k,dtype,efficiency,source\n\
            1024,1024,1024,bf16,0.5,test\n1024,1024,4096,bf16,0.6,test\n\
            1024,4096,1024,bf16,0.6,test\n1024,4096,4096,bf16,0.7,test\n\
            4096,1024,1024,bf16,0.6,test\n4096,1024,4096,bf16,0.7,test\n\
            4096,4096,1024,bf16,0.7,test\n4096,4096,4096,bf16,0.8,test\n";
        p.compute.table = Some(GemmTable::parse(csv, "t.csv").unwrap());
        assert_eq!(gemm_efficiency(4096, 4096, 4096, &p), 0.8);
        assert_eq!(gemm_efficiency(1024, 1024, 1024, &p), 0.5);
        let small = gemm_efficiency(128, 1024, 1024, &p);
        let spec = &p.compute;
        let want = 0.5 * spec.shape_factor(128.0, 1024.0, 1024.0)
            / spec.shape_factor(1024.0, 1024.0, 1024.0);
        assert!((small - want).abs() < 1e-12 && small < 0.5);
    }
}
