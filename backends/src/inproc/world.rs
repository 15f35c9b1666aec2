//! `InProcWorld` (launches rank threads) and `InProcComm` (one rank's communicator).

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::rendezvous::{CollectiveWork, Contribution, RecvWork, Shared, Signature};
use crate::buffer::Buffer;
use crate::collective::{Collective, Handle};
use crate::error::{CommError, CommResult};
use crate::group::{Group, GroupId};
use crate::trace::TraceEvent;
use crate::types::{CollectiveKind, DType, ReduceOp};

/// Default bound on any single wait; generous because ranks may do heavy compute between calls.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

/// Stack size of each rank thread (model code keeps its tensors on the heap; this is headroom).
const RANK_STACK_BYTES: usize = 16 << 20;

/// A world of `world_size` ranks run as threads of this process.
#[derive(Debug, Clone)]
pub struct InProcWorld {
    world_size: usize,
    timeout: Duration,
}

/// What a world run returns: each rank's result and each rank's call trace, indexed by rank.
#[derive(Debug, Clone)]
pub struct WorldRun<R> {
    /// The closure's return value on each rank.
    pub results: Vec<R>,
    /// Each rank's communication calls in issue order.
    pub traces: Vec<Vec<TraceEvent>>,
}

impl InProcWorld {
    /// A world of `world_size` ranks (at least one).
    pub fn new(world_size: usize) -> CommResult<InProcWorld> {
        if world_size == 0 {
            return Err(CommError::InvalidWorld(
                "world size must be at least 1".into(),
            ));
        }
        Ok(InProcWorld {
            world_size,
            timeout: DEFAULT_TIMEOUT,
        })
    }

    /// Bound every wait by `timeout` (default 300 s) instead of hanging.
    pub fn with_timeout(mut self, timeout: Duration) -> InProcWorld {
        self.timeout = timeout;
        self
    }

    /// Number of ranks.
    pub fn world_size(&self) -> usize {
        self.world_size
    }

    /// Shorthand for `InProcWorld::new(world_size)?.launch(f)`.
    pub fn run<R, F>(world_size: usize, f: F) -> CommResult<WorldRun<R>>
    where
        R: Send,
        F: Fn(&InProcComm) -> R + Sync,
    {
        InProcWorld::new(world_size)?.launch(f)
    }

    /// Run `f` once per rank, each on its own thread, and collect results and traces.
    ///
    /// A rank that returns early (or panics) makes any call still waiting on it fail with
    /// [`CommError::PeerExited`] instead of hanging. If a rank panics, the lowest such rank is
    /// reported as [`CommError::RankPanicked`].
    pub fn launch<R, F>(&self, f: F) -> CommResult<WorldRun<R>>
    where
        R: Send,
        F: Fn(&InProcComm) -> R + Sync,
    {
        let shared = Arc::new(Shared::new(self.world_size, self.timeout));
        let f = &f;
        let joined: Vec<std::thread::Result<(R, Vec<TraceEvent>)>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..self.world_size)
                .map(|rank| {
                    let shared = Arc::clone(&shared);
                    let world_size = self.world_size;
                    std::thread::Builder::new()
                        .name(format!("inproc-rank-{rank}"))
                        .stack_size(RANK_STACK_BYTES)
                        .spawn_scoped(s, move || {
                            let comm = InProcComm::new(rank, world_size, shared);
                            let result = f(&comm);
                            let trace = comm.trace.take();
                            (result, trace)
                        })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| match h {
                    Ok(h) => h.join(),
                    Err(e) => Err(Box::new(format!("could not spawn rank thread: {e}"))
                        as Box<dyn std::any::Any + Send>),
                })
                .collect()
        });
        let mut results = Vec::with_capacity(self.world_size);
        let mut traces = Vec::with_capacity(self.world_size);
        for (rank, j) in joined.into_iter().enumerate() {
            match j {
                Ok((r, t)) => {
                    results.push(r);
                    traces.push(t);
                }
                Err(payload) => {
                    let message = payload
                        .downcast_ref::<&str>()
                        .map(|s| s.to_string())
                        .or_else(|| payload.downcast_ref::<String>().cloned())
                        .unwrap_or_else(|| "non-string panic payload".into());
                    return Err(CommError::RankPanicked { rank, message });
                }
            }
        }
        Ok(WorldRun { results, traces })
    }
}

/// One rank's communicator in an [`InProcWorld`]. Used only from its own rank thread.
pub struct InProcComm {
    rank: usize,
    world_size: usize,
    shared: Arc<Shared>,
    group_seq: RefCell<HashMap<GroupId, u64>>,
    send_seq: RefCell<HashMap<(usize, u64), u64>>,
    recv_seq: RefCell<HashMap<(usize, u64), u64>>,
    trace: RefCell<Vec<TraceEvent>>,
    _exit: ExitGuard,
}

/// Marks the rank as exited when its communicator is dropped (normal return or unwinding).
struct ExitGuard {
    rank: usize,
    shared: Arc<Shared>,
}

impl Drop for ExitGuard {
    fn drop(&mut self) {
        self.shared.mark_exited(self.rank);
    }
}

impl InProcComm {
    fn new(rank: usize, world_size: usize, shared: Arc<Shared>) -> InProcComm {
        InProcComm {
            rank,
            world_size,
            _exit: ExitGuard {
                rank,
                shared: Arc::clone(&shared),
            },
            shared,
            group_seq: RefCell::default(),
            send_seq: RefCell::default(),
            recv_seq: RefCell::default(),
            trace: RefCell::default(),
        }
    }

    fn member_position(&self, kind: CollectiveKind, group: &Group) -> CommResult<usize> {
        crate::args::position(kind, group, self.rank, self.world_size)
    }

    fn check_peer(&self, kind: CollectiveKind, peer: usize) -> CommResult<()> {
        if peer < self.world_size {
            Ok(())
        } else {
            Err(CommError::InvalidArgument {
                kind,
                reason: format!("peer rank {peer} outside a world of {}", self.world_size),
            })
        }
    }

    /// Validated issue of a group collective: record the trace, deposit, return the handle.
    #[allow(clippy::too_many_arguments)]
    fn issue(
        &self,
        group: &Group,
        pos: usize,
        sig: Signature,
        input: Buffer,
        send_counts: Vec<usize>,
        recv_counts: Vec<usize>,
        output_elements: usize,
    ) -> Handle {
        let seq = {
            let mut seqs = self.group_seq.borrow_mut();
            let s = seqs.entry(group.id()).or_insert(0);
            let seq = *s;
            *s += 1;
            seq
        };
        let kind = sig.kind;
        let mut ev = TraceEvent::collective(self.trace.borrow().len(), kind, group, seq);
        ev.dtype = sig.dtype;
        ev.input_elements = input.len();
        ev.input_bytes = input.bytes();
        ev.output_bytes = output_elements * sig.dtype.size_bytes();
        ev.op = sig.op;
        ev.root = sig.root;
        self.trace.borrow_mut().push(ev);
        self.shared.deposit(
            group,
            seq,
            pos,
            Contribution {
                rank: self.rank,
                sig,
                input,
                send_counts,
                recv_counts,
            },
        );
        Handle::new(
            kind,
            Box::new(CollectiveWork {
                shared: Arc::clone(&self.shared),
                group: group.clone(),
                seq,
                pos,
                kind,
                issued: Instant::now(),
            }),
        )
    }

    fn simple(
        &self,
        kind: CollectiveKind,
        group: &Group,
        input: Buffer,
        op: Option<ReduceOp>,
        root: Option<usize>,
        output_elements: usize,
    ) -> CommResult<Handle> {
        let pos = self.member_position(kind, group)?;
        let sig = Signature {
            kind,
            dtype: input.dtype(),
            len: input.len(),
            op,
            root,
        };
        Ok(self.issue(
            group,
            pos,
            sig,
            input,
            Vec::new(),
            Vec::new(),
            output_elements,
        ))
    }

    fn divisible(kind: CollectiveKind, input: &Buffer, group: &Group) -> CommResult<()> {
        crate::args::chunk_len(kind, input.len(), group).map(|_| ())
    }
}

impl Collective for InProcComm {
    fn backend_name(&self) -> &'static str {
        "inproc"
    }

    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.world_size
    }

    fn all_gather(&self, group: &Group, input: Buffer) -> CommResult<Handle> {
        let out = input.len() * group.size();
        self.simple(CollectiveKind::AllGather, group, input, None, None, out)
    }

    fn reduce_scatter(&self, group: &Group, input: Buffer, op: ReduceOp) -> CommResult<Handle> {
        let kind = CollectiveKind::ReduceScatter;
        Self::divisible(kind, &input, group)?;
        let out = input.len() / group.size();
        self.simple(kind, group, input, Some(op), None, out)
    }

    fn all_reduce(&self, group: &Group, input: Buffer, op: ReduceOp) -> CommResult<Handle> {
        let out = input.len();
        self.simple(CollectiveKind::AllReduce, group, input, Some(op), None, out)
    }

    fn broadcast(&self, group: &Group, buffer: Buffer, root: usize) -> CommResult<Handle> {
        let kind = CollectiveKind::Broadcast;
        self.member_position(kind, group)?;
        crate::args::root_position(kind, group, root)?;
        let out = buffer.len();
        self.simple(kind, group, buffer, None, Some(root), out)
    }

    fn all_to_all(&self, group: &Group, input: Buffer) -> CommResult<Handle> {
        let kind = CollectiveKind::AllToAll;
        Self::divisible(kind, &input, group)?;
        let out = input.len();
        self.simple(kind, group, input, None, None, out)
    }

    fn all_to_all_v(
        &self,
        group: &Group,
        input: Buffer,
        send_counts: &[usize],
        recv_counts: &[usize],
    ) -> CommResult<Handle> {
        let kind = CollectiveKind::AllToAllV;
        let pos = self.member_position(kind, group)?;
        crate::args::check_counts(group, input.len(), send_counts, recv_counts)?;
        let sig = Signature {
            kind,
            dtype: input.dtype(),
            len: input.len(),
            op: None,
            root: None,
        };
        let out = recv_counts.iter().sum();
        Ok(self.issue(
            group,
            pos,
            sig,
            input,
            send_counts.to_vec(),
            recv_counts.to_vec(),
            out,
        ))
    }

    fn barrier(&self, group: &Group) -> CommResult<Handle> {
        self.simple(
            CollectiveKind::Barrier,
            group,
            Buffer::empty(DType::F32),
            None,
            None,
            0,
        )
    }

    fn send(&self, input: Buffer, dst: usize, tag: u64) -> CommResult<Handle> {
        let kind = CollectiveKind::Send;
        self.check_peer(kind, dst)?;
        let seq = {
            let mut seqs = self.send_seq.borrow_mut();
            let s = seqs.entry((dst, tag)).or_insert(0);
            let seq = *s;
            *s += 1;
            seq
        };
        self.record_p2p(kind, dst, tag, seq, &input, 0);
        self.shared.post((self.rank, dst, tag, seq), input.clone());
        Ok(Handle::ready(kind, Ok(input)))
    }

    fn recv(&self, src: usize, tag: u64, dtype: DType, len: usize) -> CommResult<Handle> {
        let kind = CollectiveKind::Recv;
        self.check_peer(kind, src)?;
        let seq = {
            let mut seqs = self.recv_seq.borrow_mut();
            let s = seqs.entry((src, tag)).or_insert(0);
            let seq = *s;
            *s += 1;
            seq
        };
        self.record_p2p(kind, src, tag, seq, &Buffer::empty(dtype), len);
        Ok(Handle::new(
            kind,
            Box::new(RecvWork {
                shared: Arc::clone(&self.shared),
                key: (src, self.rank, tag, seq),
                dtype,
                len,
                issued: Instant::now(),
            }),
        ))
    }

    fn trace(&self) -> Vec<TraceEvent> {
        self.trace.borrow().clone()
    }
}

impl InProcComm {
    fn record_p2p(
        &self,
        kind: CollectiveKind,
        peer: usize,
        tag: u64,
        seq: u64,
        input: &Buffer,
        output_elements: usize,
    ) {
        let mut ranks = vec![self.rank.min(peer), self.rank.max(peer)];
        ranks.dedup();
        let ev = TraceEvent {
            index: self.trace.borrow().len(),
            kind,
            group_label: "p2p".into(),
            group_id: None,
            ranks,
            seq,
            dtype: input.dtype(),
            input_elements: input.len(),
            input_bytes: input.bytes(),
            output_bytes: output_elements * input.dtype().size_bytes(),
            op: None,
            root: None,
            peer: Some(peer),
            tag: Some(tag),
        };
        self.trace.borrow_mut().push(ev);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A poller must see a call whose peer exited as complete (its wait fails at once), and
    /// a wait's deadline counts from the issue, not from the wait.
    #[test]
    fn handles_report_dead_calls_and_deadlines_count_from_issue() {
        let world = InProcWorld::new(2)
            .unwrap()
            .with_timeout(Duration::from_secs(60));
        let run = world
            .launch(|c| {
                let g = Group::world(2)?;
                if c.rank() == 1 {
                    return Ok(());
                }
                // Rank 1 returns without joining: the handle turns "complete" (dead) long
                // before the 60 s timeout, and its wait fails naming rank 1.
                let h = c.all_reduce(&g, Buffer::zeros(DType::F32, 4), ReduceOp::Sum)?;
                while !h.is_complete() {
                    std::thread::yield_now();
                }
                match h.wait() {
                    Err(CommError::PeerExited { missing, .. }) => assert_eq!(missing, vec![1]),
                    other => panic!("expected PeerExited, got {other:?}"),
                }
                Ok::<_, CommError>(())
            })
            .unwrap();
        for r in run.results {
            r.unwrap();
        }

        // A handle waited on after its deadline passed is complete and fails with Timeout.
        let world = InProcWorld::new(2)
            .unwrap()
            .with_timeout(Duration::from_millis(50));
        let run = world
            .launch(|c| {
                let g = Group::world(2)?;
                if c.rank() == 1 {
                    // Alive (not exited) but never joining until rank 0 is done.
                    std::thread::sleep(Duration::from_millis(300));
                    return Ok(());
                }
                let h = c.all_gather(&g, Buffer::zeros(DType::F32, 1))?;
                std::thread::sleep(Duration::from_millis(100));
                assert!(
                    h.is_complete(),
                    "past its deadline the handle must not block"
                );
                match h.wait() {
                    Err(CommError::Timeout { missing, .. }) => assert_eq!(missing, vec![1]),
                    other => panic!("expected Timeout, got {other:?}"),
                }
                Ok::<_, CommError>(())
            })
            .unwrap();
        for r in run.results {
            r.unwrap();
        }
    }
}
