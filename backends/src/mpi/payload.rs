//! Posting one call's payload as an MPI-3 immediate collective, and turning the completed
//! receive buffer into the call's output.
//!
//! Payloads travel as bytes (`MPI_UINT8_T`) except MPI-side reductions (native mode), which
//! need a typed buffer: f32 and f64 go as they are, bf16 is widened to f32 and u8 to u32 (so
//! no user-defined MPI operation, and no libffi, is needed), and the result is rounded back once.
//! Deterministic-mode reductions gather every contribution and sum them here in ascending rank
//! order with [`crate::reduce`], so their bits equal the in-process backend's.

use std::os::raw::c_int;

use half::bf16;
use mpi::ffi;

use super::raw::{self, RawComm, Request};
use crate::buffer::Buffer;
use crate::error::CommResult;
use crate::reduce::reduce_buffers_in_rank_order;
use crate::types::{CollectiveKind, DType, ReduceOp};

/// Where reductions happen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReductionMode {
    /// Gather every member's contribution and reduce in ascending rank order here: bits equal
    /// the in-process backend's on every run (what the reference executor needs). Also
    /// exchanges a per-call header first, so mismatched calls are reported, never executed.
    #[default]
    Deterministic,
    /// MPI's own reduction (`MPI_Iallreduce`, `MPI_Ireduce_scatter_block`), bf16 widened to
    /// f32 and u8 to u32; the summation order is MPI's, so f32 bits may differ between runs
    /// and from the in-process backend. No per-call header: calls go straight to MPI.
    Native,
}

impl ReductionMode {
    /// Lower-case name (`deterministic`, `native`).
    pub fn name(self) -> &'static str {
        match self {
            ReductionMode::Deterministic => "deterministic",
            ReductionMode::Native => "native",
        }
    }
}

/// The member-local description of a payload to move.
pub(crate) struct PayloadCall {
    pub kind: CollectiveKind,
    pub op: Option<ReduceOp>,
    /// Broadcast root as a group position.
    pub root_pos: usize,
    pub send_counts: Vec<usize>,
    pub recv_counts: Vec<usize>,
    pub mode: ReductionMode,
}

/// How to turn the receive buffer into the output.
enum Finish {
    /// The received bytes are the output.
    Bytes(DType),
    /// `parts` contributions of equal length back to back: reduce them in rank order.
    RankOrder {
        dtype: DType,
        op: ReduceOp,
        parts: usize,
    },
    /// An MPI reduction over a widened type: narrow (and divide for `Avg` by `members`).
    Widened {
        dtype: DType,
        op: ReduceOp,
        members: usize,
    },
    /// The output is an empty buffer (barrier).
    Empty,
}

/// An in-flight payload: MPI reads and writes these buffers until `req` completes.
pub(crate) struct Payload {
    pub req: Option<Request>,
    _send: Vec<u8>,
    recv: Vec<u8>,
    _ints: Vec<Vec<c_int>>,
    finish: Finish,
}

fn mpi_op(op: ReduceOp) -> ffi::MPI_Op {
    // SAFETY: reading extern constants.
    unsafe {
        match op {
            ReduceOp::Sum | ReduceOp::Avg => ffi::RSMPI_SUM,
            ReduceOp::Max => ffi::RSMPI_MAX,
            ReduceOp::Min => ffi::RSMPI_MIN,
        }
    }
}

/// Widen a buffer to the type MPI reduces it in.
fn widen(input: &Buffer) -> (Vec<u8>, ffi::MPI_Datatype, usize) {
    match input {
        Buffer::F32(_) => (input.to_le_bytes(), raw::f32_type(), 4),
        Buffer::F64(_) => (input.to_le_bytes(), raw::f64_type(), 8),
        Buffer::Bf16(v) => (
            v.iter().flat_map(|x| x.to_f32().to_le_bytes()).collect(),
            raw::f32_type(),
            4,
        ),
        Buffer::U8(v) => (
            v.iter().flat_map(|&x| u32::from(x).to_le_bytes()).collect(),
            raw::u32_type(),
            4,
        ),
    }
}

/// Narrow MPI's widened result back to `dtype`, dividing once for `Avg`.
fn narrow(bytes: &[u8], dtype: DType, op: ReduceOp, members: usize) -> Buffer {
    let avg = op == ReduceOp::Avg;
    let f32s = || {
        bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
    };
    let f32_avg = |x: f32| if avg { x / members as f32 } else { x };
    match dtype {
        DType::F32 => Buffer::F32(f32s().map(f32_avg).collect()),
        DType::Bf16 => Buffer::Bf16(f32s().map(|x| bf16::from_f32(f32_avg(x))).collect()),
        DType::F64 => Buffer::F64(
            bytes
                .chunks_exact(8)
                .map(|c| {
                    let mut a = [0u8; 8];
                    a.copy_from_slice(c);
                    let x = f64::from_le_bytes(a);
                    if avg { x / members as f64 } else { x }
                })
                .collect(),
        ),
        DType::U8 => Buffer::U8(
            bytes
                .chunks_exact(4)
                .map(|c| {
                    let s = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                    (if avg { s / members as u32 } else { s }) as u8
                })
                .collect(),
        ),
    }
}

fn byte_offsets(counts: &[usize], size: usize) -> CommResult<(Vec<c_int>, Vec<c_int>)> {
    let mut c = Vec::with_capacity(counts.len());
    let mut d = Vec::with_capacity(counts.len());
    let mut at = 0usize;
    for &n in counts {
        c.push(raw::count(n * size, "all-to-all-v count")?);
        d.push(raw::count(at, "all-to-all-v displacement")?);
        at += n * size;
    }
    Ok((c, d))
}

impl Payload {
    /// Post `input` for `call` on `comm` (a group of `p` members) and return the in-flight
    /// payload. Sizes were agreed beforehand (header exchange) or are the caller's promise.
    pub(crate) fn post(
        call: &PayloadCall,
        input: Buffer,
        comm: RawComm,
        p: usize,
    ) -> CommResult<Payload> {
        let dtype = input.dtype();
        let size = dtype.size_bytes();
        let native_reduce = call.mode == ReductionMode::Native
            && matches!(
                call.kind,
                CollectiveKind::AllReduce | CollectiveKind::ReduceScatter
            );
        if native_reduce {
            return Self::post_native_reduce(call, &input, comm, p);
        }
        let mut send = input.to_le_bytes();
        let n = send.len();
        // Distinct allocations even when empty: MPI rejects equal send and receive pointers.
        send.reserve(1);
        let bt = raw::byte_type();
        let mut ints = Vec::new();
        let (recv_len, finish) = match call.kind {
            CollectiveKind::AllGather => (n * p, Finish::Bytes(dtype)),
            CollectiveKind::AllReduce => (
                n * p,
                Finish::RankOrder {
                    dtype,
                    op: call.op.unwrap_or(ReduceOp::Sum),
                    parts: p,
                },
            ),
            CollectiveKind::ReduceScatter => (
                n,
                Finish::RankOrder {
                    dtype,
                    op: call.op.unwrap_or(ReduceOp::Sum),
                    parts: p,
                },
            ),
            CollectiveKind::Broadcast | CollectiveKind::AllToAll => (n, Finish::Bytes(dtype)),
            CollectiveKind::AllToAllV => (
                call.recv_counts.iter().sum::<usize>() * size,
                Finish::Bytes(dtype),
            ),
            CollectiveKind::Barrier | CollectiveKind::Send | CollectiveKind::Recv => {
                (0, Finish::Empty)
            }
        };
        let mut recv = vec![0u8; recv_len];
        recv.reserve(1);
        if call.kind == CollectiveKind::Broadcast {
            recv.copy_from_slice(&send);
        }
        let sp = send.as_ptr().cast();
        let rp = recv.as_mut_ptr().cast();
        let chunk = raw::count(n / p.max(1), "chunk bytes")?;
        let nb = raw::count(n, "payload bytes")?;
        let req = match call.kind {
            CollectiveKind::AllGather | CollectiveKind::AllReduce => {
                Some(Request::post("MPI_Iallgather", |r| unsafe {
                    // SAFETY: `send`/`recv` are owned by the returned Payload until the request completes.
                    ffi::MPI_Iallgather(sp, nb, bt, rp, nb, bt, comm, r)
                })?)
            }
            CollectiveKind::ReduceScatter | CollectiveKind::AllToAll => {
                Some(Request::post("MPI_Ialltoall", |r| unsafe {
                    // SAFETY: as above.
                    ffi::MPI_Ialltoall(sp, chunk, bt, rp, chunk, bt, comm, r)
                })?)
            }
            CollectiveKind::Broadcast => {
                let root = raw::count(call.root_pos, "root")?;
                Some(Request::post("MPI_Ibcast", |r| unsafe {
                    // SAFETY: as above; every member's `recv` holds its own copy of the buffer.
                    ffi::MPI_Ibcast(rp, nb, bt, root, comm, r)
                })?)
            }
            CollectiveKind::AllToAllV => {
                let (sc, sd) = byte_offsets(&call.send_counts, size)?;
                let (rc, rd) = byte_offsets(&call.recv_counts, size)?;
                let req = Request::post("MPI_Ialltoallv", |r| unsafe {
                    // SAFETY: as above; the count arrays are kept in `ints` until completion.
                    ffi::MPI_Ialltoallv(
                        sp,
                        sc.as_ptr(),
                        sd.as_ptr(),
                        bt,
                        rp,
                        rc.as_ptr(),
                        rd.as_ptr(),
                        bt,
                        comm,
                        r,
                    )
                })?;
                ints = vec![sc, sd, rc, rd];
                Some(req)
            }
            CollectiveKind::Barrier => match call.mode {
                // The header exchange already synchronised every member.
                ReductionMode::Deterministic => None,
                ReductionMode::Native => Some(Request::post("MPI_Ibarrier", |r| unsafe {
                    // SAFETY: no buffers.
                    ffi::MPI_Ibarrier(comm, r)
                })?),
            },
            CollectiveKind::Send | CollectiveKind::Recv => None,
        };
        Ok(Payload {
            req,
            _send: send,
            recv,
            _ints: ints,
            finish,
        })
    }

    fn post_native_reduce(
        call: &PayloadCall,
        input: &Buffer,
        comm: RawComm,
        p: usize,
    ) -> CommResult<Payload> {
        let op = call.op.unwrap_or(ReduceOp::Sum);
        let (mut send, ty, wide) = widen(input);
        send.reserve(1);
        let elems = input.len();
        let out_elems = if call.kind == CollectiveKind::ReduceScatter {
            elems / p.max(1)
        } else {
            elems
        };
        let mut recv = vec![0u8; out_elems * wide];
        recv.reserve(1);
        let sp = send.as_ptr().cast();
        let rp = recv.as_mut_ptr().cast();
        let mop = mpi_op(op);
        let req = if call.kind == CollectiveKind::ReduceScatter {
            let c = raw::count(out_elems, "reduce-scatter block")?;
            Request::post("MPI_Ireduce_scatter_block", |r| unsafe {
                // SAFETY: buffers are owned by the returned Payload until completion.
                ffi::MPI_Ireduce_scatter_block(sp, rp, c, ty, mop, comm, r)
            })?
        } else {
            let c = raw::count(elems, "all-reduce count")?;
            Request::post("MPI_Iallreduce", |r| unsafe {
                // SAFETY: as above.
                ffi::MPI_Iallreduce(sp, rp, c, ty, mop, comm, r)
            })?
        };
        Ok(Payload {
            req: Some(req),
            _send: send,
            recv,
            _ints: Vec::new(),
            finish: Finish::Widened {
                dtype: input.dtype(),
                op,
                members: p,
            },
        })
    }

    /// The output, once `req` has completed.
    pub(crate) fn finish(self) -> CommResult<Buffer> {
        match self.finish {
            Finish::Bytes(dtype) => Buffer::from_le_bytes(dtype, &self.recv),
            Finish::Empty => Ok(Buffer::empty(DType::F32)),
            Finish::Widened { dtype, op, members } => Ok(narrow(&self.recv, dtype, op, members)),
            Finish::RankOrder { dtype, op, parts } => {
                let each = self.recv.len() / parts.max(1);
                let bufs = self
                    .recv
                    .chunks(each.max(1))
                    .take(parts)
                    .map(|c| Buffer::from_le_bytes(dtype, c))
                    .collect::<CommResult<Vec<_>>>()?;
                if each == 0 {
                    return Ok(Buffer::empty(dtype));
                }
                let refs: Vec<&Buffer> = bufs.iter().collect();
                Ok(reduce_buffers_in_rank_order(op, &refs))
            }
        }
    }
}
