//! The per-process state of the MPI backend: the communicators (one per plan group, created on
//! first use), the calls in flight and their progression.
//!
//! A deterministic-mode call has two phases. At issue, its header goes to every other member
//! (`MPI_Isend`/`MPI_Irecv` on a header communicator, tag derived from the group id). When the
//! call (or a later call on the same group) is waited on, the headers are checked and the
//! payload is posted as an immediate collective on the group's communicator. Payloads of one
//! group are posted strictly in call order, as MPI requires, whatever order handles are
//! waited in. Every wait polls against the deadline, so nothing blocks forever.

use std::collections::{HashMap, VecDeque};
use std::os::raw::c_int;
use std::time::{Duration, Instant};

use mpi::ffi;

use super::header::{CallHeader, header_words, validate};
use super::payload::{Payload, PayloadCall, ReductionMode};
use super::raw::{self, RawComm, Request};
use super::watchdog;
use crate::buffer::Buffer;
use crate::error::{CommError, CommResult};
use crate::group::{Group, GroupId};
use crate::types::{CollectiveKind, DType};

/// Header exchange of one call.
struct HeaderPhase {
    mine: CallHeader,
    _send: Vec<u64>,
    recv: Vec<u64>,
    /// Receives first (one per other member, `recv_from[i]` = its group position), then sends.
    reqs: Vec<Request>,
    recv_from: Vec<usize>,
}

/// One group collective in flight.
struct CollectiveOp {
    group: Group,
    seq: u64,
    pos: usize,
    kind: CollectiveKind,
    call: PayloadCall,
    header: Option<HeaderPhase>,
    input: Option<Buffer>,
    payload: Option<Payload>,
    failed: Option<CommError>,
}

/// One point-to-point message in flight.
struct P2pOp {
    kind: CollectiveKind,
    peer: usize,
    tag: u64,
    seq: u64,
    req: Request,
    /// Send: header words + payload bytes; receive: room for them.
    buf: Vec<u8>,
    /// Send: the buffer handed back on completion.
    give_back: Option<Buffer>,
    dtype: DType,
    len: usize,
}

enum Op {
    Collective(Box<CollectiveOp>),
    P2p(Box<P2pOp>),
}

/// Words of a point-to-point message header: magic, dtype code, element count, full tag.
const P2P_HEADER_WORDS: usize = 4;
const P2P_MAGIC: u64 = 0x6870_6673_6470_7032;

/// The backend's process-wide state, behind one mutex (MPI runs MPI_THREAD_SERIALIZED).
pub(crate) struct Engine {
    pub rank: usize,
    pub mode: ReductionMode,
    pub timeout: Duration,
    hdr_comm: RawComm,
    p2p_comm: RawComm,
    tag_ub: c_int,
    comms: HashMap<GroupId, RawComm>,
    hdr_tags: HashMap<c_int, Group>,
    queues: HashMap<GroupId, VecDeque<u64>>,
    ops: HashMap<u64, Op>,
    next_id: u64,
}

// SAFETY: the raw handles are only used while the engine's mutex is held, and MPI is
// initialised with MPI_THREAD_SERIALIZED, so calls from different threads never overlap.
unsafe impl Send for Engine {}

fn bytes_of_words(w: &[u64]) -> Vec<u8> {
    w.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn words_of_bytes(b: &[u8]) -> Vec<u64> {
    b.chunks_exact(8)
        .map(|c| {
            let mut a = [0u8; 8];
            a.copy_from_slice(c);
            u64::from_le_bytes(a)
        })
        .collect()
}

impl Engine {
    /// State over the world communicator (collective over the world: every rank calls it once).
    pub fn new(rank: usize, mode: ReductionMode, timeout: Duration) -> CommResult<Engine> {
        let world = raw::world();
        raw::errors_return(world)?;
        let hdr_comm = raw::dup(world)?;
        let p2p_comm = raw::dup(world)?;
        Ok(Engine {
            rank,
            mode,
            timeout,
            tag_ub: raw::tag_ub(hdr_comm),
            hdr_comm,
            p2p_comm,
            comms: HashMap::new(),
            hdr_tags: HashMap::new(),
            queues: HashMap::new(),
            ops: HashMap::new(),
            next_id: 0,
        })
    }

    fn add(&mut self, op: Op) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        self.ops.insert(id, op);
        id
    }

    /// The header tag of `group`; two groups this process uses may not share one.
    fn header_tag(&mut self, group: &Group) -> CommResult<c_int> {
        let tag = (group.id().0 % (self.tag_ub as u64 + 1)) as c_int;
        match self.hdr_tags.get(&tag) {
            Some(g) if g != group => Err(CommError::InvalidGroup {
                label: group.label().to_string(),
                reason: format!(
                    "its MPI header tag {tag} collides with group {g}'s; rename one of the groups"
                ),
            }),
            Some(_) => Ok(tag),
            None => {
                self.hdr_tags.insert(tag, group.clone());
                Ok(tag)
            }
        }
    }

    /// Creates the group's communicator now if it does not exist yet (see
    /// `Collective::prepare_groups`).
    pub fn ensure_comm(&mut self, group: &Group) -> CommResult<()> {
        self.comm_of(group, CollectiveKind::Barrier, 0).map(|_| ())
    }

    /// The group's communicator, created on first use (collective over the group's members
    /// only; a watchdog ends the process if a member never joins).
    fn comm_of(&mut self, group: &Group, kind: CollectiveKind, seq: u64) -> CommResult<RawComm> {
        if let Some(&c) = self.comms.get(&group.id()) {
            return Ok(c);
        }
        let tag = (group.id().0 % 32768) as c_int;
        let _guard = watchdog::arm(
            self.timeout,
            format!(
                "hpfsdp mpi rank {}: creating the communicator of group {group} for {kind} (call #{seq}) \
                 did not finish within {} s: a member never reached its first call on the group",
                self.rank,
                self.timeout.as_secs_f64()
            ),
        );
        let c = raw::create_group_comm(raw::world(), group.ranks(), tag)?;
        self.comms.insert(group.id(), c);
        Ok(c)
    }

    /// Issue a group collective; `header` is this member's call description.
    pub fn issue_collective(
        &mut self,
        group: &Group,
        pos: usize,
        header: CallHeader,
        input: Buffer,
        call: PayloadCall,
    ) -> CommResult<u64> {
        let (seq, kind) = (header.seq, header.kind);
        let mut op = CollectiveOp {
            group: group.clone(),
            seq,
            pos,
            kind,
            call,
            header: None,
            input: Some(input),
            payload: None,
            failed: None,
        };
        match self.mode {
            ReductionMode::Deterministic => {
                op.header = Some(self.post_header(group, pos, header)?);
            }
            ReductionMode::Native => {
                let comm = self.comm_of(group, kind, seq)?;
                let input = op.input.take().unwrap_or(Buffer::empty(DType::F32));
                op.payload = Some(Payload::post(&op.call, input, comm, group.size())?);
            }
        }
        let id = self.add(Op::Collective(Box::new(op)));
        self.queues.entry(group.id()).or_default().push_back(id);
        Ok(id)
    }

    fn post_header(
        &mut self,
        group: &Group,
        pos: usize,
        mine: CallHeader,
    ) -> CommResult<HeaderPhase> {
        let p = group.size();
        let words = header_words(p);
        let tag = self.header_tag(group)?;
        let send = mine.encode(p);
        let mut recv = vec![0u64; words * p];
        recv[pos * words..(pos + 1) * words].copy_from_slice(&send);
        let bt = raw::byte_type();
        let nb = raw::count(words * 8, "header bytes")?;
        let comm = self.hdr_comm;
        let mut reqs = Vec::new();
        let mut recv_from = Vec::new();
        for (j, &r) in group.ranks().iter().enumerate() {
            if j == pos {
                continue;
            }
            let slot = recv[j * words..].as_mut_ptr().cast();
            let src = raw::count(r, "rank")?;
            reqs.push(Request::post("MPI_Irecv (call header)", |q| unsafe {
                // SAFETY: `recv` is kept in the HeaderPhase until the request completes.
                ffi::MPI_Irecv(slot, nb, bt, src, tag, comm, q)
            })?);
            recv_from.push(j);
        }
        for (j, &r) in group.ranks().iter().enumerate() {
            if j == pos {
                continue;
            }
            let dst = raw::count(r, "rank")?;
            let sp = send.as_ptr().cast();
            reqs.push(Request::post("MPI_Isend (call header)", |q| unsafe {
                // SAFETY: `send` is kept in the HeaderPhase until the request completes.
                ffi::MPI_Isend(sp, nb, bt, dst, tag, comm, q)
            })?);
        }
        Ok(HeaderPhase {
            mine,
            _send: send,
            recv,
            reqs,
            recv_from,
        })
    }

    /// Non-blocking [`Engine::advance`]: posts `group`'s calls up to call `seq` in order while
    /// their header exchanges have completed; stops at the first call still waiting (errors
    /// are recorded on the call and reported by its `wait`).
    fn try_advance(&mut self, group: GroupId, seq: u64) {
        while let Some(&id) = self.queues.get(&group).and_then(|q| q.front()) {
            let ready = match self.ops.get_mut(&id) {
                Some(Op::Collective(op)) if op.seq <= seq => {
                    op.payload.is_some()
                        || op.failed.is_some()
                        || op
                            .header
                            .as_mut()
                            .is_none_or(|h| h.reqs.iter_mut().all(|r| r.test().unwrap_or(true)))
                }
                Some(Op::Collective(_)) => return,
                _ => true,
            };
            if !ready {
                return;
            }
            let this = match self.ops.get(&id) {
                Some(Op::Collective(op)) => op.seq,
                _ => seq,
            };
            if self.advance(group, this).is_err()
                || self.queues.get(&group).and_then(|q| q.front()) == Some(&id)
            {
                return;
            }
        }
    }

    /// Post the payloads of `group`'s calls up to and including call `seq`, in call order.
    fn advance(&mut self, group: GroupId, seq: u64) -> CommResult<()> {
        while let Some(&id) = self.queues.get(&group).and_then(|q| q.front()) {
            if let Some(Op::Collective(mut op)) = self.ops.remove(&id) {
                if op.seq > seq {
                    self.ops.insert(id, Op::Collective(op));
                    return Ok(());
                }
                let r = self.start_payload(&mut op);
                if let Err(e) = &r {
                    op.failed = Some(e.clone());
                }
                self.ops.insert(id, Op::Collective(op));
                if let Some(q) = self.queues.get_mut(&group) {
                    q.pop_front();
                }
                r?;
            } else if let Some(q) = self.queues.get_mut(&group) {
                q.pop_front();
            }
        }
        Ok(())
    }

    /// Finish the header phase of `op` (if any) and post its payload.
    fn start_payload(&mut self, op: &mut CollectiveOp) -> CommResult<()> {
        if op.payload.is_some() || op.failed.is_some() {
            return Ok(());
        }
        if let Some(mut h) = op.header.take() {
            let deadline = Instant::now() + self.timeout;
            if let Err(pending) = raw::wait_all(&mut h.reqs, deadline)? {
                let missing: Vec<usize> = pending
                    .iter()
                    .filter_map(|&i| h.recv_from.get(i).map(|&j| op.group.ranks()[j]))
                    .collect();
                return Err(CommError::Timeout {
                    kind: op.kind,
                    group: op.group.label().to_string(),
                    seq: op.seq,
                    timeout_ms: self.timeout.as_millis() as u64,
                    missing,
                });
            }
            let p = op.group.size();
            let words = header_words(p);
            let mut headers = Vec::with_capacity(p);
            for (j, w) in h.recv.chunks(words).enumerate() {
                let decoded = CallHeader::decode(w, p).map_err(|why| CommError::Mismatch {
                    group: op.group.label().to_string(),
                    seq: op.seq,
                    detail: format!("rank {}: {why}", op.group.ranks()[j]),
                });
                match decoded {
                    Ok(d) => headers.push(d),
                    Err(e) => {
                        op.failed = Some(e);
                        return Ok(());
                    }
                }
            }
            debug_assert_eq!(headers[op.pos], h.mine);
            if let Err(e) = validate(&op.group, op.seq, &headers) {
                op.failed = Some(e);
                return Ok(());
            }
        }
        let comm = self.comm_of(&op.group, op.kind, op.seq)?;
        let input = op.input.take().unwrap_or(Buffer::empty(DType::F32));
        op.payload = Some(Payload::post(&op.call, input, comm, op.group.size())?);
        Ok(())
    }

    /// Whether call `id` has finished. Never blocks; posts, in call order, the payloads of
    /// its group's earlier calls and its own whose header exchange has already completed, so
    /// a caller that only polls (replay issues asynchronously and polls) still makes progress.
    pub fn is_complete(&mut self, id: u64) -> bool {
        if let Some(Op::Collective(op)) = self.ops.get(&id)
            && op.payload.is_none()
            && op.failed.is_none()
        {
            let (group, seq) = (op.group.id(), op.seq);
            self.try_advance(group, seq);
        }
        match self.ops.get_mut(&id) {
            Some(Op::Collective(op)) => {
                op.failed.is_some()
                    || op
                        .payload
                        .as_mut()
                        .is_some_and(|p| p.req.as_mut().is_none_or(|r| r.test().unwrap_or(true)))
            }
            Some(Op::P2p(op)) => op.req.test().unwrap_or(true),
            None => true,
        }
    }

    /// Block (polling, bounded by the timeout) until call `id` finishes; its output.
    pub fn wait(&mut self, id: u64) -> CommResult<Buffer> {
        let (group, seq) = match self.ops.get(&id) {
            Some(Op::Collective(op)) => (Some(op.group.id()), op.seq),
            Some(Op::P2p(_)) => (None, 0),
            None => {
                return Err(CommError::InvalidWorld(format!(
                    "unknown MPI call #{id} (waited twice?)"
                )));
            }
        };
        if let Some(g) = group {
            self.advance(g, seq)?;
        }
        match self.ops.remove(&id) {
            Some(Op::Collective(op)) => self.wait_collective(*op),
            Some(Op::P2p(op)) => self.wait_p2p(*op),
            None => Err(CommError::InvalidWorld(format!("MPI call #{id} vanished"))),
        }
    }

    fn wait_collective(&mut self, mut op: CollectiveOp) -> CommResult<Buffer> {
        if let Some(e) = op.failed {
            return Err(e);
        }
        let Some(mut payload) = op.payload.take() else {
            return Err(CommError::InvalidWorld(format!(
                "{} on group {} (call #{}) was never posted",
                op.kind,
                op.group.label(),
                op.seq
            )));
        };
        if let Some(req) = payload.req.as_mut() {
            let deadline = Instant::now() + self.timeout;
            if raw::wait_all(std::slice::from_mut(req), deadline)?.is_err() {
                return Err(CommError::Timeout {
                    kind: op.kind,
                    group: op.group.label().to_string(),
                    seq: op.seq,
                    timeout_ms: self.timeout.as_millis() as u64,
                    missing: op
                        .group
                        .ranks()
                        .iter()
                        .copied()
                        .filter(|&r| r != self.rank)
                        .collect(),
                });
            }
        }
        payload.finish()
    }

    /// Issue a point-to-point send of `input` to `dst` (message `seq` on `(dst, tag)`).
    pub fn issue_send(&mut self, input: Buffer, dst: usize, tag: u64, seq: u64) -> CommResult<u64> {
        let head = [P2P_MAGIC, input.dtype().code(), input.len() as u64, tag];
        let mut buf = bytes_of_words(&head);
        buf.extend(input.to_le_bytes());
        let nb = raw::count(buf.len(), "message bytes")?;
        let mtag = (tag % (self.tag_ub as u64 + 1)) as c_int;
        let (bt, comm, d) = (raw::byte_type(), self.p2p_comm, raw::count(dst, "rank")?);
        let sp = buf.as_ptr().cast();
        let req = Request::post("MPI_Isend", |q| unsafe {
            // SAFETY: `buf` is kept in the op until the request completes.
            ffi::MPI_Isend(sp, nb, bt, d, mtag, comm, q)
        })?;
        let (dtype, len) = (input.dtype(), input.len());
        Ok(self.add(Op::P2p(Box::new(P2pOp {
            kind: CollectiveKind::Send,
            peer: dst,
            tag,
            seq,
            req,
            buf,
            give_back: Some(input),
            dtype,
            len,
        }))))
    }

    /// Issue a point-to-point receive of `len` elements of `dtype` from `src`.
    pub fn issue_recv(
        &mut self,
        src: usize,
        tag: u64,
        seq: u64,
        dtype: DType,
        len: usize,
    ) -> CommResult<u64> {
        let mut buf = vec![0u8; P2P_HEADER_WORDS * 8 + len * dtype.size_bytes()];
        let nb = raw::count(buf.len(), "message bytes")?;
        let mtag = (tag % (self.tag_ub as u64 + 1)) as c_int;
        let (bt, comm, s) = (raw::byte_type(), self.p2p_comm, raw::count(src, "rank")?);
        let rp = buf.as_mut_ptr().cast();
        let req = Request::post("MPI_Irecv", |q| unsafe {
            // SAFETY: `buf` is kept in the op until the request completes.
            ffi::MPI_Irecv(rp, nb, bt, s, mtag, comm, q)
        })?;
        Ok(self.add(Op::P2p(Box::new(P2pOp {
            kind: CollectiveKind::Recv,
            peer: src,
            tag,
            seq,
            req,
            buf,
            give_back: None,
            dtype,
            len,
        }))))
    }

    fn wait_p2p(&mut self, mut op: P2pOp) -> CommResult<Buffer> {
        let deadline = Instant::now() + self.timeout;
        let (sender, receiver) = match op.kind {
            CollectiveKind::Send => (self.rank, op.peer),
            _ => (op.peer, self.rank),
        };
        let mismatch = |detail: String| CommError::Mismatch {
            group: "p2p".into(),
            seq: op.seq,
            detail,
        };
        match raw::wait_all(std::slice::from_mut(&mut op.req), deadline) {
            Ok(Ok(())) => {}
            Ok(Err(_)) => {
                return Err(CommError::Timeout {
                    kind: op.kind,
                    group: "p2p".into(),
                    seq: op.seq,
                    timeout_ms: self.timeout.as_millis() as u64,
                    missing: vec![op.peer],
                });
            }
            Err(e) if op.kind == CollectiveKind::Recv => {
                return Err(mismatch(format!(
                    "rank {sender} sent a message with tag {} that does not fit the {} {} elements rank {receiver} expected ({e})",
                    op.tag, op.len, op.dtype
                )));
            }
            Err(e) => return Err(e),
        }
        if let Some(b) = op.give_back {
            return Ok(b);
        }
        let got = op
            .req
            .received_bytes
            .unwrap_or(op.buf.len())
            .min(op.buf.len());
        let head = words_of_bytes(&op.buf[..(P2P_HEADER_WORDS * 8).min(got)]);
        if head.len() < P2P_HEADER_WORDS || head[0] != P2P_MAGIC {
            return Err(mismatch(format!(
                "rank {sender} sent {got} bytes that are not an hpfsdp message"
            )));
        }
        let (dt, len, tag) = (DType::from_code(head[1]), head[2] as usize, head[3]);
        if dt != Some(op.dtype) || len != op.len || tag != op.tag {
            return Err(mismatch(format!(
                "rank {sender} sent {len} {} elements with tag {tag} but rank {receiver} expected {} {} with tag {}",
                dt.map_or("?", DType::name),
                op.len,
                op.dtype,
                op.tag
            )));
        }
        Buffer::from_le_bytes(op.dtype, &op.buf[P2P_HEADER_WORDS * 8..got])
    }
}
