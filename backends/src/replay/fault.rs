//! Fault detection: what went wrong on which rank at which op, and the board on which ranks
//! of one process post their faults so the others stop instead of waiting for a dead peer.

use std::fmt;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

/// Why a rank stopped, most fundamental first (the order picks the primary fault).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum FaultCause {
    /// The rank panicked or failed (backend error, injected error).
    Died,
    /// The rank issued a collective its peers did not (kind, size, dtype, op or root).
    Mismatch,
    /// A collective did not complete within the timeout: a peer hangs.
    Timeout,
    /// A peer the rank waited on had already exited.
    PeerExited,
    /// The rank stopped because another rank faulted.
    Aborted,
}

impl FaultCause {
    /// Short name for messages.
    pub fn name(self) -> &'static str {
        match self {
            FaultCause::Died => "died",
            FaultCause::Mismatch => "collective mismatch",
            FaultCause::Timeout => "timeout",
            FaultCause::PeerExited => "peer exited",
            FaultCause::Aborted => "aborted",
        }
    }
}

/// The op a fault happened at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FaultOp {
    /// Index in the rank's step program.
    pub index: usize,
    /// The op's name (`op#N` when it has none).
    pub name: String,
    /// What it does: `compute`, `copy`, `host` or `<kind> on group <label>[ranks]`.
    pub what: String,
    /// The step (0-based, warm-up steps included) it happened in.
    pub step: usize,
}

/// One rank's fault.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RankFault {
    /// The rank that reports it.
    pub rank: usize,
    /// Why it stopped.
    pub cause: FaultCause,
    /// Where, when it was inside the step program.
    pub op: Option<FaultOp>,
    /// The details (backend error text, panic message...).
    pub message: String,
}

impl fmt::Display for RankFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "rank {}", self.rank)?;
        if let Some(op) = &self.op {
            write!(
                f,
                ", step {}, op #{} '{}' ({})",
                op.step, op.index, op.name, op.what
            )?;
        }
        write!(f, ": {}: {}", self.cause.name(), self.message)
    }
}

/// Faults posted by the ranks of one process; the first post aborts the others.
#[derive(Debug, Default)]
pub struct FaultBoard {
    aborted: AtomicBool,
    faults: Mutex<Vec<RankFault>>,
}

impl FaultBoard {
    /// An empty board.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records a fault and tells every rank to stop.
    pub fn post(&self, fault: RankFault) {
        self.faults
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(fault);
        self.aborted.store(true, Ordering::SeqCst);
    }

    /// Whether some rank has faulted.
    pub fn aborted(&self) -> bool {
        self.aborted.load(Ordering::SeqCst)
    }

    /// Every fault posted, in posting order.
    pub fn faults(&self) -> Vec<RankFault> {
        self.faults
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// Why a replay failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReplayError {
    /// The inputs cannot be replayed (wrong rank count, missing durations, bad injection).
    #[error("cannot replay: {0}")]
    Setup(String),
    /// One or more ranks faulted; the primary fault comes first.
    #[error("{}", describe_faults(.0))]
    Faults(Vec<RankFault>),
}

impl ReplayError {
    /// Faults sorted most fundamental cause first (then by rank), for reporting.
    pub fn from_faults(mut faults: Vec<RankFault>) -> Self {
        faults.sort_by_key(|f| (f.cause, f.rank));
        faults.dedup();
        ReplayError::Faults(faults)
    }

    /// The primary fault, when the replay faulted.
    pub fn primary(&self) -> Option<&RankFault> {
        match self {
            ReplayError::Faults(f) => f.first(),
            ReplayError::Setup(_) => None,
        }
    }
}

fn describe_faults(faults: &[RankFault]) -> String {
    let mut out = String::from("replay failed: ");
    match faults.first() {
        Some(first) => out.push_str(&first.to_string()),
        None => out.push_str("a rank failed without reporting why"),
    }
    for f in faults.iter().skip(1) {
        out.push_str("\n  then ");
        out.push_str(&f.to_string());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn primary_fault_is_the_most_fundamental() {
        let f = |rank, cause| RankFault {
            rank,
            cause,
            op: None,
            message: "x".into(),
        };
        let e = ReplayError::from_faults(vec![
            f(0, FaultCause::PeerExited),
            f(3, FaultCause::Aborted),
            f(2, FaultCause::Died),
        ]);
        assert_eq!(e.primary().unwrap().rank, 2);
        let text = e.to_string();
        assert!(text.starts_with("replay failed: rank 2: died"), "{text}");
        assert!(text.contains("then rank 0: peer exited"), "{text}");
    }
}
