//! A hardware profile's `[compute]` section ([`ComputeSpec`]): the GEMM shape model's
//! half-saturation sizes, the attention and memory-bound kernels' relative rates, and the
//! optional measured GEMM table. The cost model that uses it is [`crate::compute_cost`].

use crate::gemm_table::GemmTable;
use crate::profile_values::{fraction, non_negative, positive};
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
    /// Host time of FSDP2's `chunk_cat` per gradient element it packs, picoseconds: the CUDA
    /// implementation fills a block table on the host (one 8-byte entry per
    /// [`CHUNK_CAT_ELEMENTS_PER_BLOCK`] elements) before it launches; 0 when absent.
    #[serde(default, skip_serializing_if = "is_zero_f64")]
    pub chunk_cat_host_ps_per_element: f64,
    /// Bandwidth of the pinned host -> device copy of that block table (a `Memcpy HtoD
    /// (Pinned -> Device)` on the compute stream before the kernel), bytes per second;
    /// absent: the copy is not charged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chunk_cat_metadata_h2d_bytes_per_s: Option<f64>,
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

fn is_zero_f64(v: &f64) -> bool {
    *v == 0.0
}

/// Gradient elements per entry of `chunk_cat`'s host-built block table (8 bytes each):
/// the tables the H200 runs copy hold 645,210, 98,382 and 1,217,102 entries for 330.3 M,
/// 50.3 M and 623.1 M elements (`aten::_to_copy` of the `Memcpy HtoD` in
/// `shared/calibration/h200/profiles/ops-*.csv`), 512 elements each plus a few per chunk.
pub const CHUNK_CAT_ELEMENTS_PER_BLOCK: u64 = 512;

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
            chunk_cat_host_ps_per_element: 0.0,
            chunk_cat_metadata_h2d_bytes_per_s: None,
            indexed_relative_bandwidth: 1.0,
            strided_relative_bandwidth: 1.0,
            gemm_in_step_speedup: 1.0,
            grouped_gemm_relative_efficiency: None,
            table: None,
        }
    }
}

/// `x / (x + half)`: the saturation factor of one dimension.
pub(crate) fn saturation(x: f64, half: f64) -> f64 {
    if x <= 0.0 { 0.0 } else { x / (x + half) }
}

impl ComputeSpec {
    /// Checks every `[compute]` value; `(dotted key, message)` for the first bad one.
    pub(crate) fn validate(&self) -> Result<(), (String, String)> {
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
        non_negative(
            "compute.chunk_cat_host_ps_per_element",
            self.chunk_cat_host_ps_per_element,
        )?;
        if let Some(bw) = self.chunk_cat_metadata_h2d_bytes_per_s {
            positive("compute.chunk_cat_metadata_h2d_bytes_per_s", bw)?;
        }
        let speedup = self.gemm_in_step_speedup;
        if !(1.0..=2.0).contains(&speedup) {
            return Err((
                "compute.gemm_in_step_speedup".into(),
                format!(
                    "must be in [1, 2] (1: GEMMs run in a step as in the table), got {speedup}"
                ),
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
