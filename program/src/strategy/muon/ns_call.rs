//! One Newton-Schulz call ([`NsCall`]), below the schedule builders and the schedule parts
//! that record them.

/// One NS call: `matrices` matrices of one core shape orthogonalized by one batched launch
/// sequence (GEMM batch = `matrices`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct NsCall {
    /// Core matrix shape.
    pub core: (u64, u64),
    /// Matrices in the call.
    pub matrices: u64,
}
