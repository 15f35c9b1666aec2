//! The shape of one batched GEMM that a device backend runs ([`super::kernels`] enqueues it,
//! cuBLAS computes it on nccl).

/// One row-major batched GEMM problem (elements; the layout is described in
/// [`super::kernels`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GemmProblem {
    /// Rows of `A` and `C`.
    pub m: usize,
    /// Columns of `B` and `C`.
    pub n: usize,
    /// Columns of `A`, rows of `B`.
    pub k: usize,
    /// Products.
    pub batch: usize,
    /// Elements between consecutive `A` operands (0: one `A` for every product).
    pub stride_a: usize,
    /// Elements between consecutive `B` operands.
    pub stride_b: usize,
    /// Elements between consecutive outputs.
    pub stride_c: usize,
}
