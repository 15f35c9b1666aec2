//! What the calibration reads from a prepared run's rank-0 program that does not depend on
//! the hardware profile: launch and collective counts, host-model totals, and per op its
//! phase segment, stream and the figures its span feeds. Computed once per prepared workload
//! ([`super::compare::CalibrationSet`]) instead of on every one of the fit's thousands of
//! simulations; the figures that need the simulated timeline
//! ([`Rank0Facts::predicted_figures`]) then only walk rank 0's spans. The values are those of
//! [`super::phases::phase_device_s`], [`super::division_time::post_reduction_division_span_s`] and
//! [`super::compare::weighted_fsdp_bandwidth`], summed in the same order (a test checks them
//! equal on every paper run).

use super::division_time::post_reduction_division_s;
use super::figure::Figure;
use super::phases::{Phase, phase_of_ops};
use crate::host_cost::{HostCosts, HostTotals};
use crate::profile::HardwareProfile;
use crate::result::{LaunchCounts, SimResult};
use hpfsdp_plan::CollectiveKind;
use hpfsdp_program::step::{Category, OpSpan, Payload, StepProgram, Stream};
use hpfsdp_program::strategy::avg_division;
use std::collections::BTreeMap;

/// What one op of rank 0 contributes to the span-based figures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct OpFacts {
    /// Its phase and phase segment ([`phase_of_ops`]).
    phase: Phase,
    /// Index of its phase segment.
    segment: usize,
    /// It runs on the compute stream (the phases' device time counts only those).
    compute_stream: bool,
    /// A post-reduction division ([`avg_division::is_collective_stream_division`]).
    division: bool,
    /// For an FSDP collective: the larger of its send and receive buffers, bytes.
    fsdp_bytes: Option<u64>,
}

/// The profile-independent facts of one rank-0 program; see the module documentation.
#[derive(Debug, Clone, PartialEq)]
pub struct Rank0Facts {
    ops: Vec<OpFacts>,
    /// Launch counts of the program ([`LaunchCounts::of`]).
    pub launches: LaunchCounts,
    /// Host-model totals of the program ([`HostTotals::of`]).
    pub host_totals: HostTotals,
    all_gathers: u64,
    reduce_scatters: u64,
    all_gather_bytes: u64,
    reduce_scatter_bytes: u64,
}

impl Rank0Facts {
    /// Reads `rank0` once.
    pub fn of(rank0: &StepProgram) -> Self {
        let phases = phase_of_ops(rank0);
        let mut facts = Self {
            ops: Vec::with_capacity(phases.len()),
            launches: LaunchCounts::of(rank0),
            host_totals: HostTotals::of(rank0.ops.iter()),
            all_gathers: 0,
            reduce_scatters: 0,
            all_gather_bytes: 0,
            reduce_scatter_bytes: 0,
        };
        for (op, (phase, segment)) in rank0.ops.iter().zip(phases) {
            let mut fsdp_bytes = None;
            if let Payload::Collective(c) = &op.payload {
                match c.kind {
                    CollectiveKind::AllGather => {
                        facts.all_gathers += 1;
                        facts.all_gather_bytes += c.input_bytes;
                    }
                    CollectiveKind::ReduceScatter => {
                        facts.reduce_scatters += 1;
                        facts.reduce_scatter_bytes += c.output_bytes;
                    }
                    _ => {}
                }
                let fsdp = matches!(
                    op.category,
                    Category::FsdpAg | Category::FsdpRs | Category::FsdpAr
                );
                fsdp_bytes = fsdp.then(|| c.input_bytes.max(c.output_bytes));
            }
            facts.ops.push(OpFacts {
                phase,
                segment,
                compute_stream: op.stream == Stream::Compute,
                division: avg_division::is_collective_stream_division(op),
                fsdp_bytes,
            });
        }
        facts
    }

    /// The predicted value of every figure from one simulation of the program these facts
    /// were read from: [`super::compare::predicted_figures`]'s values.
    pub fn predicted_figures(
        &self,
        result: &SimResult,
        rank0: &StepProgram,
        profile: &HardwareProfile,
        validation_mode: bool,
    ) -> BTreeMap<Figure, f64> {
        let b = &result.breakdown;
        let spans = result
            .timeline
            .as_ref()
            .and_then(|t| t.rank(0))
            .map(|t| t.spans.as_slice());
        let mut out = BTreeMap::new();
        out.insert(Figure::StepTimeS, result.step_time_s());
        if let Some([forward, backward, optimizer]) = spans.map(|s| self.phase_device_s(s)) {
            out.insert(Figure::ForwardDeviceS, forward);
            out.insert(Figure::BackwardDeviceS, backward);
            out.insert(Figure::OptimizerDeviceS, optimizer);
        }
        out.insert(Figure::ExposedCommS, b.exposed_comm_ns as f64 * 1e-9);
        out.insert(Figure::OverlapRate, b.overlap_rate);
        out.insert(Figure::CopyS, b.copy_ns as f64 * 1e-9);
        out.insert(
            Figure::PostReductionDivisionS,
            spans.map_or_else(
                || post_reduction_division_s(rank0, profile),
                |s| self.division_span_s(s),
            ),
        );
        let collectives = self.launches.collectives;
        out.insert(Figure::DeviceKernels, self.launches.device_kernels as f64);
        out.insert(Figure::Collectives, collectives as f64);
        out.insert(Figure::AllGathers, self.all_gathers as f64);
        out.insert(Figure::ReduceScatters, self.reduce_scatters as f64);
        out.insert(Figure::AllGatherBytes, self.all_gather_bytes as f64);
        out.insert(Figure::ReduceScatterBytes, self.reduce_scatter_bytes as f64);
        // Host self time in collective APIs: the collective launch class of the host model.
        let host = HostCosts::of(profile, validation_mode);
        out.insert(
            Figure::HostCollectiveS,
            collectives as f64 * host.collective_launch_us * 1e-6,
        );
        out.insert(
            Figure::ValidationCpuEvents,
            self.host_totals.validation_events as f64,
        );
        out.insert(Figure::PeakAllocatedBytes, result.peak_memory_bytes as f64);
        out.insert(
            Figure::WeightedBandwidth,
            spans.map_or(0.0, |s| self.weighted_fsdp_bandwidth(s)),
        );
        out
    }

    /// [`super::phases::phase_device_s`] on rank 0's spans.
    fn phase_device_s(&self, spans: &[OpSpan]) -> [f64; 3] {
        // Per segment: (phase, first start, last end).
        let mut segments: Vec<(Phase, u64, u64)> = Vec::new();
        let mut last_segment = usize::MAX;
        for span in spans {
            let Some(op) = self.ops.get(span.op.index()) else {
                continue;
            };
            if !op.compute_stream {
                continue;
            }
            if op.segment != last_segment {
                segments.push((op.phase, span.start_ns, span.end_ns));
                last_segment = op.segment;
            } else if let Some(s) = segments.last_mut() {
                s.1 = s.1.min(span.start_ns);
                s.2 = s.2.max(span.end_ns);
            }
        }
        let mut out = [0.0; 3];
        for (phase, start, end) in segments {
            out[phase.index()] += end.saturating_sub(start) as f64 * 1e-9;
        }
        out
    }

    /// [`super::division_time::post_reduction_division_span_s`] on rank 0's spans.
    fn division_span_s(&self, spans: &[OpSpan]) -> f64 {
        let ns: u64 = spans
            .iter()
            .filter(|s| self.ops.get(s.op.index()).is_some_and(|o| o.division))
            .map(|s| s.end_ns.saturating_sub(s.start_ns))
            .sum();
        ns as f64 * 1e-9
    }

    /// [`super::compare::weighted_fsdp_bandwidth`] on rank 0's spans.
    fn weighted_fsdp_bandwidth(&self, spans: &[OpSpan]) -> f64 {
        let (mut bytes, mut ns) = (0u64, 0u64);
        for s in spans {
            let Some(b) = self.ops.get(s.op.index()).and_then(|o| o.fsdp_bytes) else {
                continue;
            };
            let start = s.transfer_start_ns.unwrap_or(s.start_ns);
            bytes += b;
            ns += s.end_ns.saturating_sub(start);
        }
        if ns == 0 {
            0.0
        } else {
            bytes as f64 / (ns as f64 * 1e-9)
        }
    }
}
