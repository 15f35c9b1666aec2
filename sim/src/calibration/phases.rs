//! Forward, backward and optimizer device time as a training loop measures them: CUDA (or
//! NPU) events recorded on the compute stream around the forward call, `loss.backward()` and
//! `optimizer.step()` + `zero_grad()`. The prediction is, per phase, the span from the start
//! of its first op to the end of its last op on rank 0's compute stream in the simulated
//! timeline, summed over the phase's segments (one forward and one backward per micro-batch,
//! as the harness sums its per-micro-batch events).
//!
//! Step programs carry no phase tag, so the phase of an op is derived from its place in the
//! host issue order ([`phase_of_ops`]): an op of category `Optimizer` starts the optimizer
//! phase, an op whose name ends in `.bwd` (a stage's backward pass, the loss backward) or
//! `.recompute` (activation recomputation, which runs inside `loss.backward()`) starts a
//! backward segment, and an op whose name ends in `.fwd` after a backward starts the next
//! micro-batch's forward. Everything issued in between belongs to the current phase: FSDP
//! copy-ins, copy-outs and reductions of a pass, and the trainer's own work after the last
//! backward (HyperParallel's loss read-backs and gradient clipping count to the backward until
//! programs tag their phases).

use crate::result::SimResult;
use hpfsdp_program::step::{Category, Op, StepProgram, Stream};

/// The phase of a training step an op belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// The forward pass (loss included).
    Forward,
    /// The backward pass.
    Backward,
    /// `optimizer.step()` and `zero_grad()`.
    Optimizer,
}

impl Phase {
    /// The phases in step order.
    pub const ALL: [Phase; 3] = [Phase::Forward, Phase::Backward, Phase::Optimizer];

    /// Position in step order (the slot of per-phase arrays).
    pub fn index(self) -> usize {
        match self {
            Phase::Forward => 0,
            Phase::Backward => 1,
            Phase::Optimizer => 2,
        }
    }

    /// `forward`, `backward` or `optimizer`.
    pub fn name(self) -> &'static str {
        match self {
            Phase::Forward => "forward",
            Phase::Backward => "backward",
            Phase::Optimizer => "optimizer",
        }
    }
}

/// Per op of `program`, in op order: its phase and the index of its segment (a new segment
/// starts at every phase change), derived from the issue order as the module documentation
/// describes.
pub fn phase_of_ops(program: &StepProgram) -> Vec<(Phase, usize)> {
    let ends_with = |op: &Op, suffix: &str| op.name.as_deref().is_some_and(|n| n.ends_with(suffix));
    let mut phase = Phase::Forward;
    let mut segment = 0;
    let mut out = Vec::with_capacity(program.ops.len());
    for op in &program.ops {
        let next = if op.category == Category::Optimizer {
            Phase::Optimizer
        } else if phase == Phase::Forward && (ends_with(op, ".bwd") || ends_with(op, ".recompute"))
        {
            Phase::Backward
        } else if phase == Phase::Backward && ends_with(op, ".fwd") {
            Phase::Forward
        } else {
            phase
        };
        if next != phase {
            phase = next;
            segment += 1;
        }
        out.push((phase, segment));
    }
    out
}

/// Predicted device time of the forward, backward and optimizer phases, seconds, in that
/// order: per segment the span from its first op's start to its last op's end on rank 0's
/// compute stream, summed per phase; `None` without rank 0's timeline. A phase with no
/// compute-stream op takes 0.
pub fn phase_device_s(result: &SimResult, rank0: &StepProgram) -> Option<[f64; 3]> {
    let timeline = result.timeline.as_ref().and_then(|t| t.rank(0))?;
    let phases = phase_of_ops(rank0);
    // Per segment: (phase, first start, last end).
    let mut segments: Vec<(Phase, u64, u64)> = Vec::new();
    let mut last_segment = usize::MAX;
    for span in &timeline.spans {
        let Some(op) = rank0.op(span.op) else {
            continue;
        };
        if op.stream != Stream::Compute {
            continue;
        }
        let (phase, segment) = phases[span.op.index()];
        if segment != last_segment {
            segments.push((phase, span.start_ns, span.end_ns));
            last_segment = segment;
        } else if let Some(s) = segments.last_mut() {
            s.1 = s.1.min(span.start_ns);
            s.2 = s.2.max(span.end_ns);
        }
    }
    let mut out = [0.0; 3];
    for (phase, start, end) in segments {
        out[phase.index()] += end.saturating_sub(start) as f64 * 1e-9;
    }
    Some(out)
}
