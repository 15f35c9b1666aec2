//! Shared rendezvous state of an in-process world: collective slots and p2p mailboxes.

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::buffer::Buffer;
use crate::collective::Work;
use crate::error::{CommError, CommResult};
use crate::group::{Group, GroupId};
use crate::reduce::reduce_buffers_in_rank_order;
use crate::types::{CollectiveKind, DType, ReduceOp};

/// What a rank's call promises about its payload; must agree across members.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Signature {
    pub kind: CollectiveKind,
    pub dtype: DType,
    pub len: usize,
    pub op: Option<ReduceOp>,
    pub root: Option<usize>,
}

impl Signature {
    fn describe(&self) -> String {
        let mut s = format!("{}({}, {} elements", self.kind, self.dtype, self.len);
        if let Some(op) = self.op {
            s.push_str(&format!(", op={op}"));
        }
        if let Some(root) = self.root {
            s.push_str(&format!(", root={root}"));
        }
        s.push(')');
        s
    }

    /// Whether two members' calls can be combined (all-to-all-v lengths may differ).
    fn compatible(&self, other: &Signature) -> bool {
        self.kind == other.kind
            && self.dtype == other.dtype
            && self.op == other.op
            && self.root == other.root
            && (self.kind == CollectiveKind::AllToAllV || self.len == other.len)
    }
}

/// One member's contribution to a collective.
pub(crate) struct Contribution {
    pub rank: usize,
    pub sig: Signature,
    pub input: Buffer,
    pub send_counts: Vec<usize>,
    pub recv_counts: Vec<usize>,
}

/// One collective call being assembled.
struct Slot {
    group: Group,
    contributions: Vec<Option<Contribution>>,
    /// Per-member outputs (taken by each member's wait) or the error every member gets.
    outcome: Option<Result<Vec<Option<Buffer>>, CommError>>,
    taken: usize,
}

#[derive(Default)]
struct State {
    slots: HashMap<(GroupId, u64), Slot>,
    mailboxes: HashMap<(usize, usize, u64, u64), Buffer>,
    exited: Vec<bool>,
}

/// The state shared by all rank threads of one world.
pub(crate) struct Shared {
    timeout: Duration,
    state: Mutex<State>,
    cv: Condvar,
}

impl Shared {
    pub fn new(world_size: usize, timeout: Duration) -> Shared {
        Shared {
            timeout,
            state: Mutex::new(State {
                exited: vec![false; world_size],
                ..State::default()
            }),
            cv: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panicking rank never holds the lock across user code, so the data stays consistent.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Mark a rank as finished (normally or by panic) and wake every waiter.
    pub fn mark_exited(&self, rank: usize) {
        let mut st = self.lock();
        if let Some(e) = st.exited.get_mut(rank) {
            *e = true;
        }
        drop(st);
        self.cv.notify_all();
    }

    /// Add a member's contribution to call `seq` on `group`; complete the call if it is the last.
    pub fn deposit(&self, group: &Group, seq: u64, pos: usize, c: Contribution) {
        let mut st = self.lock();
        let slot = st.slots.entry((group.id(), seq)).or_insert_with(|| Slot {
            group: group.clone(),
            contributions: (0..group.size()).map(|_| None).collect(),
            outcome: None,
            taken: 0,
        });
        if slot.outcome.is_none() {
            if slot.group.ranks() != group.ranks() {
                slot.outcome = Some(Err(CommError::Mismatch {
                    group: group.label().to_string(),
                    seq,
                    detail: format!(
                        "rank {} called with ranks {:?} but the group has ranks {:?}",
                        c.rank,
                        group.ranks(),
                        slot.group.ranks()
                    ),
                }));
            } else if let Some(other) = slot.contributions.iter().flatten().next()
                && !other.sig.compatible(&c.sig)
            {
                slot.outcome = Some(Err(CommError::Mismatch {
                    group: group.label().to_string(),
                    seq,
                    detail: format!(
                        "rank {} called {} but rank {} called {}",
                        other.rank,
                        other.sig.describe(),
                        c.rank,
                        c.sig.describe()
                    ),
                }));
            }
        }
        slot.contributions[pos] = Some(c);
        if slot.outcome.is_none() && slot.contributions.iter().all(Option::is_some) {
            let contributions: Vec<&Contribution> = slot.contributions.iter().flatten().collect();
            slot.outcome = Some(complete(group, seq, &contributions));
        }
        drop(st);
        self.cv.notify_all();
    }

    /// Block until call `seq` on `group` completes; return member `pos`'s output. The wait
    /// is bounded by the world's timeout counted from `issued` (when this member issued the
    /// call), so a handle waited on late gets no extra time.
    pub fn wait_collective(
        &self,
        group: &Group,
        seq: u64,
        pos: usize,
        kind: CollectiveKind,
        issued: Instant,
    ) -> CommResult<Buffer> {
        let key = (group.id(), seq);
        let deadline = issued + self.timeout;
        let mut st = self.lock();
        loop {
            let State { slots, exited, .. } = &mut *st;
            let Some(slot) = slots.get_mut(&key) else {
                // Only reachable if the handle was waited twice, which `Box<Self>` forbids.
                return Err(CommError::InvalidArgument {
                    kind,
                    reason: "collective slot vanished before completion".into(),
                });
            };
            if let Some(outcome) = &mut slot.outcome {
                let result = match outcome {
                    Ok(outputs) => Ok(outputs[pos].take().unwrap_or(Buffer::empty(DType::F32))),
                    Err(e) => Err(e.clone()),
                };
                slot.taken += 1;
                if slot.taken == slot.group.size() {
                    slots.remove(&key);
                }
                return result;
            }
            let missing: Vec<usize> = slot
                .group
                .ranks()
                .iter()
                .zip(&slot.contributions)
                .filter(|(_, c)| c.is_none())
                .map(|(&r, _)| r)
                .collect();
            let gone: Vec<usize> = missing.iter().copied().filter(|&r| exited[r]).collect();
            if !gone.is_empty() {
                return Err(CommError::PeerExited {
                    kind,
                    group: group.label().to_string(),
                    seq,
                    missing: gone,
                });
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(CommError::Timeout {
                    kind,
                    group: group.label().to_string(),
                    seq,
                    timeout_ms: self.timeout.as_millis() as u64,
                    missing,
                });
            }
            st = self
                .cv
                .wait_timeout(st, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Post a message (buffered send).
    pub fn post(&self, key: (usize, usize, u64, u64), buf: Buffer) {
        let mut st = self.lock();
        st.mailboxes.insert(key, buf);
        drop(st);
        self.cv.notify_all();
    }

    /// Whether a wait on call `seq` on `group` (issued at `issued`) would return at once:
    /// the call completed (or failed), a member it still needs has exited, or its deadline
    /// passed. A poller (the replay runner) relies on this to never spin on a dead call.
    pub fn is_complete(&self, group: &Group, seq: u64, issued: Instant) -> bool {
        if issued.elapsed() >= self.timeout {
            return true;
        }
        let st = self.lock();
        st.slots.get(&(group.id(), seq)).is_some_and(|s| {
            s.outcome.is_some()
                || s.group
                    .ranks()
                    .iter()
                    .zip(&s.contributions)
                    .any(|(&r, c)| c.is_none() && st.exited[r])
        })
    }

    /// Whether a wait on the message under `key` (a receive issued at `issued`) would return
    /// at once: the message arrived, its sender exited, or the deadline passed.
    pub fn recv_ready(&self, key: &(usize, usize, u64, u64), issued: Instant) -> bool {
        if issued.elapsed() >= self.timeout {
            return true;
        }
        let st = self.lock();
        st.mailboxes.contains_key(key) || st.exited[key.0]
    }

    /// Block until the message under `key` arrives; check its dtype and length.
    pub fn take_message(
        &self,
        key: (usize, usize, u64, u64),
        dtype: DType,
        len: usize,
        issued: Instant,
    ) -> CommResult<Buffer> {
        let (src, dst, tag, seq) = key;
        let deadline = issued + self.timeout;
        let mut st = self.lock();
        loop {
            if let Some(buf) = st.mailboxes.remove(&key) {
                if buf.dtype() != dtype || buf.len() != len {
                    return Err(CommError::Mismatch {
                        group: "p2p".into(),
                        seq,
                        detail: format!(
                            "rank {src} sent {} {} elements with tag {tag} but rank {dst} expected {len} {dtype}",
                            buf.len(),
                            buf.dtype()
                        ),
                    });
                }
                return Ok(buf);
            }
            if st.exited[src] {
                return Err(CommError::PeerExited {
                    kind: CollectiveKind::Recv,
                    group: "p2p".into(),
                    seq,
                    missing: vec![src],
                });
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(CommError::Timeout {
                    kind: CollectiveKind::Recv,
                    group: "p2p".into(),
                    seq,
                    timeout_ms: self.timeout.as_millis() as u64,
                    missing: vec![src],
                });
            }
            st = self
                .cv
                .wait_timeout(st, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

/// Compute every member's output once all contributions (in group order) are present.
fn complete(
    group: &Group,
    seq: u64,
    cs: &[&Contribution],
) -> Result<Vec<Option<Buffer>>, CommError> {
    let p = cs.len();
    let sig = &cs[0].sig;
    let dtype = sig.dtype;
    let inputs: Vec<&Buffer> = cs.iter().map(|c| &c.input).collect();
    let outputs: Vec<Buffer> = match sig.kind {
        CollectiveKind::AllGather => {
            let all = Buffer::concat(dtype, &inputs);
            vec![all; p]
        }
        CollectiveKind::AllReduce => {
            let red = reduce_buffers_in_rank_order(sig.op.unwrap_or(ReduceOp::Sum), &inputs);
            vec![red; p]
        }
        CollectiveKind::ReduceScatter => {
            let red = reduce_buffers_in_rank_order(sig.op.unwrap_or(ReduceOp::Sum), &inputs);
            let n = sig.len / p;
            (0..p).map(|i| red.slice(i * n, (i + 1) * n)).collect()
        }
        CollectiveKind::Broadcast => {
            let root = sig.root.and_then(|r| group.position(r)).unwrap_or(0);
            vec![cs[root].input.clone(); p]
        }
        CollectiveKind::AllToAll => {
            let n = sig.len / p;
            (0..p)
                .map(|i| {
                    let parts: Vec<Buffer> = cs
                        .iter()
                        .map(|c| c.input.slice(i * n, (i + 1) * n))
                        .collect();
                    Buffer::concat(dtype, &parts.iter().collect::<Vec<_>>())
                })
                .collect()
        }
        CollectiveKind::AllToAllV => {
            for (i, ci) in cs.iter().enumerate() {
                for (j, cj) in cs.iter().enumerate() {
                    if ci.recv_counts[j] != cj.send_counts[i] {
                        return Err(CommError::Mismatch {
                            group: group.label().to_string(),
                            seq,
                            detail: format!(
                                "all-to-all-v: rank {} expects {} elements from rank {} which sends {}",
                                ci.rank, ci.recv_counts[j], cj.rank, cj.send_counts[i]
                            ),
                        });
                    }
                }
            }
            let offsets: Vec<Vec<usize>> = cs
                .iter()
                .map(|c| {
                    let mut acc = 0;
                    c.send_counts
                        .iter()
                        .map(|&n| {
                            let o = acc;
                            acc += n;
                            o
                        })
                        .collect()
                })
                .collect();
            (0..p)
                .map(|i| {
                    let parts: Vec<Buffer> = cs
                        .iter()
                        .enumerate()
                        .map(|(j, c)| {
                            let o = offsets[j][i];
                            c.input.slice(o, o + c.send_counts[i])
                        })
                        .collect();
                    Buffer::concat(dtype, &parts.iter().collect::<Vec<_>>())
                })
                .collect()
        }
        CollectiveKind::Barrier | CollectiveKind::Send | CollectiveKind::Recv => {
            vec![Buffer::empty(dtype); p]
        }
    };
    Ok(outputs.into_iter().map(Some).collect())
}

/// A pending in-process collective.
pub(crate) struct CollectiveWork {
    pub shared: Arc<Shared>,
    pub group: Group,
    pub seq: u64,
    pub pos: usize,
    pub kind: CollectiveKind,
    /// When this member issued the call; its deadline counts from here.
    pub issued: Instant,
}

impl Work for CollectiveWork {
    fn is_complete(&self) -> bool {
        self.shared.is_complete(&self.group, self.seq, self.issued)
    }

    fn wait(self: Box<Self>) -> CommResult<Buffer> {
        self.shared
            .wait_collective(&self.group, self.seq, self.pos, self.kind, self.issued)
    }
}

/// A pending in-process receive.
pub(crate) struct RecvWork {
    pub shared: Arc<Shared>,
    pub key: (usize, usize, u64, u64),
    pub dtype: DType,
    pub len: usize,
    /// When the receive was issued; its deadline counts from here.
    pub issued: Instant,
}

impl Work for RecvWork {
    fn is_complete(&self) -> bool {
        self.shared.recv_ready(&self.key, self.issued)
    }

    fn wait(self: Box<Self>) -> CommResult<Buffer> {
        self.shared
            .take_message(self.key, self.dtype, self.len, self.issued)
    }
}
