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

use crate::gemm_table::GemmTable;
use crate::profile::HardwareProfile;
use hpfsdp_plan::kernel::{KernelClass, KernelWork};
use serde::{Deserialize, Serialize};

/// `[compute]` of a hardware profile: per-class efficiency tables and the shape model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ComputeSpec {
    /// CSV of measured GEMM efficiencies next to the profile (`<profile>.gemm.csv`, columns
    /// `m,n,k,dtype,efficiency,source`); absent: the shape model alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gemm_table: Option<String>,
    /// Rows at which the shape model's row factor is one half.
    pub gemm_m_half: f64,
    /// Output columns at which the column factor is one half.
    pub gemm_n_half: f64,
    /// Reduction length at which the reduction factor is one half.
    pub gemm_k_half: f64,
    /// Fused attention's efficiency over the GEMM ceiling for long sequences, in (0, 1].
    pub attention_relative_efficiency: f64,
    /// Sequence length (tokens per sequence on the rank) at which attention runs at half that.
    pub attention_seq_half: f64,
    /// Bandwidth of `multi_tensor_apply` (`torch._foreach_*`) kernels over that of plain
    /// memory-bound kernels (`calibration.hbm_efficiency`), in (0, 1]; 1 when absent.
    #[serde(default = "unit_ratio")]
    pub foreach_relative_bandwidth: f64,
    /// Bandwidth of FSDP2's reduce-scatter copy-in (`chunk_cat` of the gradients into the
    /// reduce buffer) over that of plain device copies (`calibration.copy_efficiency`), in
    /// (0, 1]; 1 when absent.
    #[serde(default = "unit_ratio")]
    pub chunk_cat_relative_bandwidth: f64,
    /// Bandwidth of indexing and masking element-wise kernels (`masked_fill_`, gathers,
    /// broadcast multiplies over routed copies) over that of plain memory-bound kernels, in
    /// (0, 1]; 1 when absent.
    #[serde(default = "unit_ratio")]
    pub indexed_relative_bandwidth: f64,
    /// Bandwidth of strided element-wise kernels (broadcast, non-contiguous or bf16-to-f32
    /// operands: TensorIterator's non-vectorized path) over that of plain memory-bound
    /// kernels, in (0, 1]; 1 when absent.
    #[serde(default = "unit_ratio")]
    pub strided_relative_bandwidth: f64,
    /// How much faster GEMMs run inside a training step than the back-to-back benchmark that
    /// measured `gemm_table` (each shape alone for ~20 ms), in [1, 2]; 1 when absent. It
    /// scales table-based GEMM efficiency (capped at the datasheet peak), not grouped GEMMs.
    #[serde(default = "unit_ratio")]
    pub gemm_in_step_speedup: f64,
    /// Grouped expert GEMMs as one GEMM over every group's rows (`torch._grouped_mm`: one
    /// launch fills the device across experts) at this fraction of that GEMM's efficiency,
    /// in (0, 1]; absent: each group costed at its own rows (tokens per expert).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grouped_gemm_relative_efficiency: Option<f64>,
    /// The parsed `gemm_table` (filled when the profile is loaded).
    #[serde(skip)]
    pub table: Option<GemmTable>,
}

fn unit_ratio() -> f64 {
    1.0
}

impl Default for ComputeSpec {
    /// The documented defaults: half-saturation at 256 in every GEMM dimension, attention at
    /// 0.75 of the GEMM ceiling with half of it at 256-token sequences, no table.
    fn default() -> Self {
        Self {
            gemm_table: None,
            gemm_m_half: 256.0,
            gemm_n_half: 256.0,
            gemm_k_half: 256.0,
            attention_relative_efficiency: 0.75,
            attention_seq_half: 256.0,
            foreach_relative_bandwidth: 1.0,
            chunk_cat_relative_bandwidth: 1.0,
            indexed_relative_bandwidth: 1.0,
            strided_relative_bandwidth: 1.0,
            gemm_in_step_speedup: 1.0,
            grouped_gemm_relative_efficiency: None,
            table: None,
        }
    }
}

/// `x / (x + half)`: the saturation factor of one dimension.
fn saturation(x: f64, half: f64) -> f64 {
    if x <= 0.0 { 0.0 } else { x / (x + half) }
}

impl ComputeSpec {
    /// Checks every `[compute]` value; `(dotted key, message)` for the first bad one.
    pub(crate) fn validate(&self) -> Result<(), (String, String)> {
        use crate::profile::{fraction, positive};
        positive("compute.gemm_m_half", self.gemm_m_half)?;
        positive("compute.gemm_n_half", self.gemm_n_half)?;
        positive("compute.gemm_k_half", self.gemm_k_half)?;
        positive("compute.attention_seq_half", self.attention_seq_half)?;
        for (key, v) in [
            (
                "compute.attention_relative_efficiency",
                self.attention_relative_efficiency,
            ),
            (
                "compute.foreach_relative_bandwidth",
                self.foreach_relative_bandwidth,
            ),
            (
                "compute.chunk_cat_relative_bandwidth",
                self.chunk_cat_relative_bandwidth,
            ),
            (
                "compute.indexed_relative_bandwidth",
                self.indexed_relative_bandwidth,
            ),
            (
                "compute.strided_relative_bandwidth",
                self.strided_relative_bandwidth,
            ),
        ] {
            fraction(key, v)?;
        }
        if let Some(r) = self.grouped_gemm_relative_efficiency {
            fraction("compute.grouped_gemm_relative_efficiency", r)?;
        }
        let speedup = self.gemm_in_step_speedup;
        if !(1.0..=2.0).contains(&speedup) {
            return Err((
                "compute.gemm_in_step_speedup".into(),
                format!("{speedup} is not in [1, 2] (1: GEMMs run in a step as in the table)"),
            ));
        }
        Ok(())
    }

    /// The shape model without its ceiling: `s(m) s(n) s(k)`.
    pub fn shape_factor(&self, m: f64, n: f64, k: f64) -> f64 {
        saturation(m, self.gemm_m_half)
            * saturation(n, self.gemm_n_half)
            * saturation(k, self.gemm_k_half)
    }
}

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
        } => match profile.compute.grouped_gemm_relative_efficiency {
            Some(relative) => {
                relative * gemm_efficiency(groups.saturating_mul(tokens_per_group), n, k, profile)
            }
            None => gemm_efficiency(tokens_per_group, n, k, profile),
        },
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
    math.max(memory) + k.count as f64 * c.device_launch_us_per_kernel * 1e-6
}

#[cfg(test)]
mod tests {
    use super::*;

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
            },
            count: 1,
            flops: 2 * 128 * tpg * 1536 * 2048,
            hbm_bytes: 0,
        };
        assert!(per_flop(grouped(64)) > 1.5 * per_flop(grouped(2048)));
        let e = gemm_efficiency(1 << 20, 1 << 20, 1 << 20, &p);
        assert!(e < p.calibration.gemm_ceiling && e > 0.99 * p.calibration.gemm_ceiling);
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
