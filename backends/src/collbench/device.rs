//! collbench on an accelerator backend, as nccl-tests runs: device-resident send and receive
//! buffers allocated once per size, and a timed region that holds only the collective calls,
//! back to back on the communication stream between two device events
//! ([`DeviceCollective::time_calls`]). Inputs are uploaded before it and results downloaded
//! and checked after it; nothing is copied between host and device inside it.
//!
//! Each size is timed twice, as nccl-tests' two blocks:
//! - **out-of-place**: separate send and receive buffers (broadcast: its in-place call, the
//!   only form the libraries' broadcast has here);
//! - **in-place**: all-reduce with send = receive, all-gather with the input as this
//!   member's chunk of the output, reduce-scatter with the output as this member's chunk of
//!   the input (all-to-all and broadcast have none).
//!
//! An in-place call overwrites its input, so after its timed calls the input is uploaded
//! again and one more call is made and checked.

use crate::buffer::Buffer;
use crate::collbench::check;
use crate::collbench::spec::BenchKind;
use crate::collbench::{BenchOptions, BenchRow, Timing, reduce_over_world, sweep_sizes};
use crate::device::{DeviceBuffer, DeviceCollective, DeviceOp};
use crate::error::CommResult;
use crate::group::Group;
use crate::types::ReduceOp;

/// One member's buffers and expected results for one size.
struct Sized<'c> {
    comm: &'c dyn DeviceCollective,
    group: &'c Group,
    kind: BenchKind,
    pos: usize,
    input: Buffer,
    send: DeviceBuffer,
    recv: DeviceBuffer,
    want: Vec<f32>,
}

impl Sized<'_> {
    fn out_of_place(&self) -> DeviceOp<'_> {
        let (send, recv) = (&self.send, &self.recv);
        match self.kind {
            BenchKind::AllGather => DeviceOp::AllGather { send, recv },
            BenchKind::ReduceScatter => DeviceOp::ReduceScatter {
                send,
                recv,
                op: ReduceOp::Sum,
            },
            BenchKind::AllReduce => DeviceOp::AllReduce {
                send,
                recv,
                op: ReduceOp::Sum,
            },
            BenchKind::Broadcast => DeviceOp::Broadcast {
                buffer: send,
                root: self.group.ranks()[0],
            },
            BenchKind::AllToAll => DeviceOp::AllToAll { send, recv },
        }
    }

    /// The in-place call on `buffer`, where the kind has one.
    fn in_place<'b>(&self, buffer: &'b DeviceBuffer) -> Option<DeviceOp<'b>> {
        match self.kind {
            BenchKind::AllGather => Some(DeviceOp::AllGatherInPlace { buffer }),
            BenchKind::ReduceScatter => Some(DeviceOp::ReduceScatterInPlace {
                buffer,
                op: ReduceOp::Sum,
            }),
            BenchKind::AllReduce => Some(DeviceOp::AllReduce {
                send: buffer,
                recv: buffer,
                op: ReduceOp::Sum,
            }),
            BenchKind::Broadcast | BenchKind::AllToAll => None,
        }
    }

    /// Wrong elements of the out-of-place output (every call computes the same result from
    /// the unchanged input, so the last one is checked).
    fn check_out_of_place(&self) -> CommResult<u64> {
        let got = match self.kind {
            BenchKind::Broadcast => self.send.download()?,
            _ => self.recv.download()?,
        };
        Ok(check::count_wrong(&got, &self.want))
    }

    /// Restore the in-place input, run one more call and count its wrong elements.
    fn check_in_place(&self, buffer: &DeviceBuffer, op: DeviceOp<'_>, n: usize) -> CommResult<u64> {
        let me = self.comm.rank();
        let len = self.input.len();
        buffer.upload(&check::in_place_input(
            self.kind,
            me,
            self.pos,
            n,
            len,
            self.input.dtype(),
        ))?;
        self.comm.time_calls(self.group, op, 1)?;
        let got = buffer.download()?;
        let got = match self.kind {
            BenchKind::ReduceScatter => check::chunk(&got, self.pos * (len / n), len / n),
            _ => got,
        };
        Ok(check::count_wrong(&got, &self.want))
    }
}

/// Output elements of `kind` for an input of `len` on `n` ranks.
fn output_len(kind: BenchKind, len: usize, n: usize) -> usize {
    match kind {
        BenchKind::AllGather => len * n,
        BenchKind::ReduceScatter => len / n,
        _ => len,
    }
}

/// Average device microseconds per call of `warmup` untimed and `iters` timed calls of `op`
/// (a world barrier between them lines the ranks up).
fn time_op(
    comm: &dyn DeviceCollective,
    group: &Group,
    world: &Group,
    op: DeviceOp<'_>,
    o: &BenchOptions,
) -> CommResult<f64> {
    if o.warmup > 0 {
        comm.time_calls(group, op, o.warmup)?;
    }
    comm.barrier(world)?.wait()?;
    let iters = o.iters.max(1);
    Ok(comm.time_calls(group, op, iters)? / iters as f64)
}

/// Runs the sweep on this rank with device-resident buffers (see the module doc); every rank
/// gets the rows and `on_row` sees each as it is measured.
pub fn run_device_sweep(
    comm: &dyn DeviceCollective,
    o: &BenchOptions,
    on_row: &mut dyn FnMut(&BenchRow),
) -> CommResult<Vec<BenchRow>> {
    let world = Group::world(comm.world_size())?;
    let me = comm.rank();
    let mine = o.groups.iter().find(|g| g.contains(me));
    let n = o.groups.iter().map(Group::size).max().unwrap_or(1);
    let mut rows = Vec::new();
    for &kind in &o.kinds {
        for (size, count, len) in sweep_sizes(kind, o, n) {
            let (mut oop, mut ip): (Measured, Option<Measured>) = ((0.0, 0), None);
            match mine {
                Some(g) => {
                    let (a, b) = measure_size(comm, g, &world, kind, len, o)?;
                    oop = a;
                    ip = b;
                }
                None => {
                    comm.barrier(&world)?.wait()?;
                    if has_in_place(kind) {
                        comm.barrier(&world)?.wait()?;
                    }
                }
            }
            let (t, w) = reduce_over_world(comm, &world, oop.0, oop.1)?;
            let out_of_place = Timing::of(kind, size, n, t, o.check.then_some(w));
            let in_place = if has_in_place(kind) {
                let (mine_us, mine_wrong) = ip.unwrap_or((0.0, 0));
                let (t, w) = reduce_over_world(comm, &world, mine_us, mine_wrong)?;
                Some(Timing::of(kind, size, n, t, o.check.then_some(w)))
            } else {
                None
            };
            let row = BenchRow::new(kind, (size, count), o, n, out_of_place, in_place);
            on_row(&row);
            rows.push(row);
        }
    }
    Ok(rows)
}

/// Whether nccl-tests' in-place block exists for `kind` here.
fn has_in_place(kind: BenchKind) -> bool {
    !matches!(kind, BenchKind::Broadcast | BenchKind::AllToAll)
}

/// One member's `(device microseconds per call, wrong elements)` of a column.
type Measured = (f64, u64);

/// The out-of-place column and, where the kind has one, the in-place column.
fn measure_size(
    comm: &dyn DeviceCollective,
    g: &Group,
    world: &Group,
    kind: BenchKind,
    len: usize,
    o: &BenchOptions,
) -> CommResult<(Measured, Option<Measured>)> {
    let me = comm.rank();
    let n = g.size();
    let pos = g.position(me).unwrap_or(0);
    let input = check::input(me, len, o.dtype);
    let sized = Sized {
        comm,
        group: g,
        kind,
        pos,
        send: comm.upload(&input)?,
        recv: comm.alloc_device(o.dtype, output_len(kind, len, n).max(1))?,
        input,
        want: if o.check {
            check::expected(kind, g.ranks(), pos, len)
        } else {
            Vec::new()
        },
    };
    let t = time_op(comm, g, world, sized.out_of_place(), o)?;
    let wrong = if o.check {
        sized.check_out_of_place()?
    } else {
        0
    };
    if !has_in_place(kind) {
        return Ok(((t, wrong), None));
    }
    let buffer = comm.upload(&check::in_place_input(kind, me, pos, n, len, o.dtype))?;
    let Some(op) = sized.in_place(&buffer) else {
        return Ok(((t, wrong), None));
    };
    let t_ip = time_op(comm, g, world, op, o)?;
    let wrong_ip = if o.check {
        sized.check_in_place(&buffer, op, n)?
    } else {
        0
    };
    Ok(((t, wrong), Some((t_ip, wrong_ip))))
}
