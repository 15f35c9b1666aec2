//! Device time of rank 0's post-reduction divisions (the kernels
//! [`avg_division::is_collective_stream_division`] selects): as costed, and as a profiler
//! sees their spans. Read by the comparison and by [`super::rank0_facts`].

use crate::profile::HardwareProfile;
use crate::result::SimResult;
use hpfsdp_program::step::Payload;
use hpfsdp_program::strategy::avg_division;

/// Device time of rank 0's post-reduction divisions (the kernels
/// [`avg_division::is_collective_stream_division`] selects), seconds: each op's cost on the
/// device ([`crate::cost::compute_work_s`]), summed, whatever it overlaps with.
pub fn post_reduction_division_s(
    rank0: &hpfsdp_program::step::StepProgram,
    profile: &HardwareProfile,
) -> f64 {
    rank0
        .ops
        .iter()
        .filter(|op| avg_division::is_collective_stream_division(op))
        .filter_map(|op| match &op.payload {
            Payload::Compute(w) => {
                Some(crate::cost::compute_work_s(w, &rank0.kernel_mixes, profile))
            }
            _ => None,
        })
        .sum()
}

/// Device time of rank 0's post-reduction divisions as a profiler sees it: the sum of their
/// simulated spans (start to end on their stream, so a division that waited for cores
/// behind the compute stream counts its wait, as the kernel's measured duration does),
/// seconds; `None` without a timeline of rank 0.
pub fn post_reduction_division_span_s(
    result: &SimResult,
    rank0: &hpfsdp_program::step::StepProgram,
) -> Option<f64> {
    let t = result.timeline.as_ref().and_then(|t| t.rank(0))?;
    let ns: u64 = t
        .spans
        .iter()
        .filter(|s| {
            rank0
                .op(s.op)
                .is_some_and(avg_division::is_collective_stream_division)
        })
        .map(|s| s.end_ns.saturating_sub(s.start_ns))
        .sum();
    Some(ns as f64 * 1e-9)
}
