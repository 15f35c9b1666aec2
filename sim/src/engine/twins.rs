//! Units whose ops are the very same storage set up once.
//!
//! A folded Muon job's representatives are often relabelled copies of a template program:
//! another rank and group table, but the same op storage (`OpSeq::share_tail`; about 250 of
//! exp-d's 528 classes). Setting a unit up costs every op (host cost, compute cost through
//! its kernel mix, dependency count, stream, the shared tables); for a unit whose ops are
//! the same storage, over the same range, as an earlier unit's, and whose groups map to the
//! same launch-order slots, every one of those per-op results is the same, so they are
//! copied from the earlier unit instead. What is not copied is what depends on the rank:
//! communicators, group shapes, resident memory. What-if runs scale compute by rank and are
//! never copied.

use hpfsdp_program::step::StepProgram;

/// The identity of a unit's ops: the storage of its program's shared prefix and own tail,
/// and the simulated range. Equal identities mean equal ops.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct OpsIdentity {
    prefix: usize,
    tail: usize,
    tail_len: usize,
    base: usize,
    end: usize,
}

impl OpsIdentity {
    /// The identity of `program`'s ops `base..end`.
    pub(super) fn of(program: &StepProgram, base: usize, end: usize) -> Self {
        let ops = &program.ops;
        Self {
            prefix: ops
                .shared()
                .map_or(0, |p| std::sync::Arc::as_ptr(p) as usize),
            tail: ops.tail().as_ptr() as usize,
            tail_len: ops.tail().len(),
            base,
            end,
        }
    }
}
