//! Deferred launches: the host's launch of an op that starts nothing is written into the op's
//! state later, in order, instead of on its event.
//!
//! A host runs far ahead of its device in a Muon optimizer tail: of exp-d's 1.73 M launch
//! events (`Event::HostDone`) in the forked tails, about 99% launch an op onto a stream that
//! is busy or whose head waits for its dependencies, so `try_start` does nothing. Such an
//! event still has to be processed (it pushes the next launch, whose sequence number breaks
//! ties), but what it writes into the launched op (its `launched_ns`, a collective's
//! launch-order index on its communicator) is read by nobody until the op can start. The
//! engine therefore keeps the unit's launches `applied..next` **pending** and writes them in
//! one pass (`UnitRt::apply_launches`) when they are needed: before a launch that starts
//! something, before a collective at a stream's head arrives (its launch-order index), and
//! when `Engine::drain` returns. The event itself touches only the unit's host state
//! and its small launch table ([`Launch`]), not the op's cache line.
//!
//! Why the result is the same, bit for bit:
//! - every event is still queued, popped and counted in the same order with the same
//!   sequence numbers: only what a launch event writes moves, never an event;
//! - a launch is deferred only when `try_start` on its stream would do nothing at that moment
//!   (`UnitRt::launch_starts` is that test, evaluated after the launch), so nothing else
//!   happens on its event;
//! - whether an op is launched is `op < next` (the host launches in op order), so `try_start`
//!   sees a pending launch as launched, as before;
//! - pending launches form one chain: each was pushed by the previous one's event at that
//!   event's time plus its own host cost (a host op, whose start waits for dependencies,
//!   is never deferred and breaks the chain), so launch `j`'s time is the first pending
//!   launch's time plus the host costs of `applied + 1..=j`;
//! - collective launch-order indices are per-communicator counters advanced in launch order,
//!   and pending launches are applied in launch order, always before any index is read.

/// What the host needs of an op to launch it, apart from the op's runtime state: read on
/// every launch event, kept apart so that a launch touches 16 bytes, not the op's line.
#[derive(Debug, Clone, Copy)]
pub(super) struct Launch {
    /// Host cost of the launch ([`crate::host_cost::HostCosts::op_ns`]); for a host op, its
    /// whole duration.
    pub(super) host_ns: u64,
    /// Local stream index (`HOST` for a host op).
    pub(super) stream: u16,
}

/// A unit's host thread: where it is in issue order and which launches are pending.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct HostRt {
    /// Ops launched (the next op to launch, in issue order).
    pub(super) next: usize,
    /// Busy launching op `next` (its launch event is queued) or running a host op.
    pub(super) busy: bool,
    /// Host time spent so far.
    pub(super) busy_ns: u64,
    /// When the host had issued every op of the unit and was free (`None` while it has not).
    pub(super) stop_ns: Option<u64>,
    /// Launches `applied..next` are pending (not yet written into their ops).
    pub(super) applied: usize,
    /// Time of launch `applied` while launches are pending.
    pub(super) applied_ns: u64,
    /// Time of launch `next - 1` while launches are pending (checks the chain).
    pub(super) last_ns: u64,
}

impl HostRt {
    /// Records the launch of op `op` at `at_ns` as pending (see the module documentation);
    /// `host_ns`: its launch cost (checks the chain).
    #[inline]
    pub(super) fn defer(&mut self, op: usize, at_ns: u64, host_ns: u64) {
        if self.applied == op {
            self.applied_ns = at_ns;
        } else {
            debug_assert_eq!(
                self.last_ns + host_ns,
                at_ns,
                "pending launches form one chain"
            );
        }
        self.last_ns = at_ns;
    }

    /// The first pending launch before op `upto` and its time, now applied; `None` when
    /// there is none. `launches`: the unit's launch table (the chain's costs).
    #[inline]
    pub(super) fn next_pending(
        &mut self,
        upto: usize,
        launches: &[Launch],
    ) -> Option<(usize, u64)> {
        if self.applied >= upto.min(self.next) {
            return None;
        }
        let (op, t) = (self.applied, self.applied_ns);
        self.applied = op + 1;
        if op + 1 < self.next {
            self.applied_ns = t + launches[op + 1].host_ns;
        }
        Some((op, t))
    }

    /// Marks op `op`, the first launch not applied, as applied (written by the caller).
    #[inline]
    pub(super) fn applied(&mut self, op: usize) {
        debug_assert_eq!(self.applied, op, "launches are applied in order");
        self.applied = op + 1;
    }
}
