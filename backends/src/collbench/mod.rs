//! `collbench`: the nccl-tests / hccl_test sweep on any backend.
//!
//! For each collective and each size from `min_bytes` to `max_bytes` (times `factor`), every
//! group runs `warmup` untimed then `iters` timed calls back to back on known inputs; the time
//! of a size is the slowest rank's average per call, and (with `check`) the result is
//! compared with the exact expected output outside the timed loop. Each row is handed to a
//! callback as soon as it is measured.
//!
//! Two paths: [`run_sweep`] on host buffers (every backend; each call issued and waited on)
//! and, on accelerator backends, `device::run_device_sweep` as nccl-tests runs: device-resident
//! buffers allocated once per size, only the collective calls between two device events in
//! the timed region, and nccl-tests' out-of-place and in-place columns.
//!
//! Sizes follow nccl-tests: `size` is the per-rank buffer nccl-tests reports (all-gather: the
//! gathered output; reduce-scatter: the input; all-reduce, broadcast: the buffer; all-to-all:
//! the send buffer) and `count` its element count per rank chunk (all-gather, reduce-scatter
//! and all-to-all: `size / (n x element)`; the others: `size / element`). Sizes are rounded
//! down to whole chunks (at least one element per chunk); sizes that round to one already
//! measured are skipped. `algbw = size / time`, `busbw = algbw x factor` with nccl-tests'
//! factors ([`BenchKind::busbw_factor`]), in GB/s (1e9 bytes per second).

pub mod check;
#[cfg(any(feature = "hccl", feature = "nccl"))]
pub mod device;
pub mod spec;

use std::time::Instant;

use crate::buffer::Buffer;
use crate::collective::{Collective, Handle};
use crate::error::{CommError, CommResult};
use crate::group::Group;
use crate::types::{DType, ReduceOp};
pub use spec::{BenchKind, parse_bytes, parse_groups, parse_kinds};

/// What to sweep.
#[derive(Debug, Clone, PartialEq)]
pub struct BenchOptions {
    /// Collectives, in order.
    pub kinds: Vec<BenchKind>,
    /// Smallest size, bytes.
    pub min_bytes: u64,
    /// Largest size, bytes.
    pub max_bytes: u64,
    /// Size multiplier between steps (at least 2).
    pub factor: u64,
    /// Timed calls per size.
    pub iters: usize,
    /// Untimed calls per size before them.
    pub warmup: usize,
    /// Element type.
    pub dtype: DType,
    /// The groups run concurrently (a rank in none only takes part in the timing).
    pub groups: Vec<Group>,
    /// Also time, after each size, a twin whose per-rank buffer is one element longer and so
    /// not a multiple of 512 bytes: the rows `hpfsdp calibrate --from` fits HCCL's
    /// unaligned-buffer factor from.
    pub unaligned_twins: bool,
    /// Check every result against the exact expected output (nccl-tests' `-c 1`); without
    /// it `#wrong` is unknown (`N/A`).
    pub check: bool,
}

/// One timed column of a row (nccl-tests' out-of-place or in-place block).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Timing {
    /// Slowest rank's average time per call, microseconds.
    pub time_us: f64,
    /// `size / time`, GB/s.
    pub algbw_gbps: f64,
    /// `algbw x factor`, GB/s.
    pub busbw_gbps: f64,
    /// Output elements that differ from the expected result, summed over ranks (`None`:
    /// not checked).
    pub wrong: Option<u64>,
}

impl Timing {
    /// The timing of `size` bytes in `time_us` per call on groups of `n` ranks.
    pub fn of(kind: BenchKind, size: u64, n: usize, time_us: f64, wrong: Option<u64>) -> Timing {
        let algbw = if time_us > 0.0 {
            size as f64 / (time_us * 1e-6) / 1e9
        } else {
            0.0
        };
        Timing {
            time_us,
            algbw_gbps: algbw,
            busbw_gbps: algbw * kind.busbw_factor(n),
            wrong,
        }
    }
}

/// One line of the sweep (the CSV row without the tier, which needs the hardware topology).
#[derive(Debug, Clone, PartialEq)]
pub struct BenchRow {
    /// The collective.
    pub kind: BenchKind,
    /// nccl-tests' size, bytes.
    pub size_bytes: u64,
    /// nccl-tests' count, elements.
    pub count: u64,
    /// Element type.
    pub dtype: DType,
    /// `sum` for reductions, `none` otherwise.
    pub redop: &'static str,
    /// Root (group-local 0) for broadcast, -1 otherwise.
    pub root: i64,
    /// Separate send and receive buffers (broadcast: its one, in-place, call). The CSV's
    /// columns.
    pub out_of_place: Timing,
    /// Receive buffer = send buffer, as nccl-tests' in-place block (device backends;
    /// `None` where the call has no in-place form or the backend takes host buffers).
    pub in_place: Option<Timing>,
    /// Ranks per group (the largest group).
    pub group_ranks: usize,
}

impl BenchRow {
    /// nccl-tests' type name (`float`, `bfloat16`).
    pub fn type_name(&self) -> &'static str {
        match self.dtype {
            DType::F32 => "float",
            DType::Bf16 => "bfloat16",
            DType::F64 => "double",
            DType::U8 => "uint8",
        }
    }

    /// Wrong elements over both columns (`None`: not checked).
    pub fn wrong(&self) -> Option<u64> {
        let ip = self.in_place.map_or(Some(0), |t| t.wrong);
        Some(self.out_of_place.wrong? + ip?)
    }

    /// A row of `kind` at `(size, count)` with its columns.
    pub fn new(
        kind: BenchKind,
        (size, count): (u64, u64),
        o: &BenchOptions,
        n: usize,
        out_of_place: Timing,
        in_place: Option<Timing>,
    ) -> BenchRow {
        BenchRow {
            kind,
            size_bytes: size,
            count,
            dtype: o.dtype,
            redop: match kind {
                BenchKind::AllReduce | BenchKind::ReduceScatter => "sum",
                _ => "none",
            },
            root: if kind == BenchKind::Broadcast { 0 } else { -1 },
            out_of_place,
            in_place,
            group_ranks: n,
        }
    }
}

/// The distinct sizes of the sweep for `kind` on groups of `n` ranks: `(size, count, input
/// elements per rank)`.
pub fn sweep_sizes(kind: BenchKind, o: &BenchOptions, n: usize) -> Vec<(u64, u64, usize)> {
    let es = o.dtype.size_bytes() as u64;
    let mut out: Vec<(u64, u64, usize)> = Vec::new();
    let mut s = o.min_bytes.max(1);
    while s <= o.max_bytes {
        let (size, count, input) = if kind.chunked() {
            let chunk = (s / (es * n as u64)).max(1);
            let input = match kind {
                BenchKind::AllGather => chunk,
                _ => chunk * n as u64,
            };
            (chunk * n as u64 * es, chunk, input as usize)
        } else {
            let c = (s / es).max(1);
            (c * es, c, c as usize)
        };
        if out.last().is_none_or(|l| l.0 != size) {
            out.push((size, count, input));
            if o.unaligned_twins {
                out.push(unaligned_twin(kind, es, n as u64, count));
            }
        }
        match s.checked_mul(o.factor.max(2)) {
            Some(next) => s = next,
            None => break,
        }
    }
    out
}

/// The `(size, count, input elements)` of a sweep row whose per-rank buffer is `count + k`
/// elements, with `k >= 1` the smallest that leaves it off a multiple of 512 bytes.
fn unaligned_twin(kind: BenchKind, es: u64, n: u64, count: u64) -> (u64, u64, usize) {
    let mut c = count + 1;
    while (c * es).is_multiple_of(512) {
        c += 1;
    }
    if kind.chunked() {
        let input = match kind {
            BenchKind::AllGather => c,
            _ => c * n,
        };
        (c * n * es, c, input as usize)
    } else {
        (c * es, c, c as usize)
    }
}

fn issue<C: Collective + ?Sized>(
    comm: &C,
    kind: BenchKind,
    g: &Group,
    input: Buffer,
) -> CommResult<Handle> {
    match kind {
        BenchKind::AllGather => comm.all_gather(g, input),
        BenchKind::ReduceScatter => comm.reduce_scatter(g, input, ReduceOp::Sum),
        BenchKind::AllReduce => comm.all_reduce(g, input, ReduceOp::Sum),
        BenchKind::Broadcast => comm.broadcast(g, input, g.ranks()[0]),
        BenchKind::AllToAll => comm.all_to_all(g, input),
    }
}

/// Runs the sweep on this rank with host buffers (every backend); every rank gets the rows
/// (times and `#wrong` are reduced over the world) and `on_row` sees each as it is measured.
/// The timed loop holds the calls (issue, then wait) and the copy of the input each call
/// takes by value; inputs are made and the last output checked outside it. Accelerator backends time device-resident buffers instead
/// ([`device::run_device_sweep`]).
pub fn run_sweep<C: Collective + ?Sized>(
    comm: &C,
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
            let mut wrong = 0u64;
            let mut elapsed_s = 0.0;
            if let Some(g) = mine {
                let pos = g.position(me).unwrap_or(0);
                let want = o.check.then(|| check::expected(kind, g.ranks(), pos, len));
                let input = check::input(me, len, o.dtype);
                for _ in 0..o.warmup {
                    issue(comm, kind, g, input.clone())?.wait()?;
                }
                comm.barrier(&world)?.wait()?;
                let mut last = None;
                let mut inputs = (0..o.iters.max(1)).map(|_| input.clone());
                let t0 = Instant::now();
                for next in &mut inputs {
                    last = Some(issue(comm, kind, g, next)?.wait()?);
                }
                elapsed_s = t0.elapsed().as_secs_f64();
                if let (Some(want), Some(out)) = (&want, &last) {
                    wrong += check::count_wrong(out, want);
                }
            } else {
                comm.barrier(&world)?.wait()?;
            }
            let mine_us = elapsed_s * 1e6 / o.iters.max(1) as f64;
            let (time_us, wrong) = reduce_over_world(comm, &world, mine_us, wrong)?;
            let wrong = o.check.then_some(wrong);
            let oop = Timing::of(kind, size, n, time_us, wrong);
            let row = BenchRow::new(kind, (size, count), o, n, oop, None);
            on_row(&row);
            rows.push(row);
        }
    }
    Ok(rows)
}

/// The slowest rank's time and the world's total of wrong elements (host all-reduces, never
/// inside a timed region).
pub(crate) fn reduce_over_world<C: Collective + ?Sized>(
    comm: &C,
    world: &Group,
    mine_us: f64,
    wrong: u64,
) -> CommResult<(f64, u64)> {
    let red = comm
        .all_reduce(world, Buffer::F32(vec![mine_us as f32]), ReduceOp::Max)?
        .wait_vec::<f32>()?;
    let bad = comm
        .all_reduce(world, Buffer::F32(vec![wrong as f32]), ReduceOp::Sum)?
        .wait_vec::<f32>()?;
    Ok((
        f64::from(red.first().copied().unwrap_or(0.0)),
        bad.first().copied().unwrap_or(0.0) as u64,
    ))
}

/// Checks the options before a sweep: sizes ordered, factor at least 2, groups non-empty.
pub fn validate(o: &BenchOptions) -> Result<(), CommError> {
    let bad = |reason: String| Err(CommError::InvalidWorld(reason));
    if o.min_bytes == 0 || o.min_bytes > o.max_bytes {
        return bad(format!(
            "--min-bytes {} must be at least 1 and at most --max-bytes {}",
            o.min_bytes, o.max_bytes
        ));
    }
    if o.factor < 2 {
        return bad(format!("--factor {} must be at least 2", o.factor));
    }
    if o.groups.is_empty() || o.kinds.is_empty() {
        return bad("no group or no collective to benchmark".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inproc::InProcWorld;

    /// With twins, every size is followed by one whose per-rank buffer is not a multiple of
    /// 512 bytes, and the sweep still checks out correct on every row.
    #[test]
    fn unaligned_twins_follow_each_size_and_are_correct() {
        let o = BenchOptions {
            kinds: BenchKind::ALL.to_vec(),
            min_bytes: 4096,
            max_bytes: 16384,
            factor: 4,
            iters: 1,
            warmup: 0,
            dtype: DType::Bf16,
            groups: vec![Group::world(4).unwrap()],
            unaligned_twins: true,
            check: true,
        };
        for kind in BenchKind::ALL {
            let sizes = sweep_sizes(kind, &o, 4);
            assert_eq!(sizes.len(), 4, "{kind:?}");
            for pair in sizes.chunks(2) {
                let per_rank = |(_, count, _): (u64, u64, usize)| count * 2;
                assert_eq!(per_rank(pair[0]) % 512, 0, "{kind:?} {pair:?}");
                assert_ne!(per_rank(pair[1]) % 512, 0, "{kind:?} {pair:?}");
                assert!(pair[1].0 > pair[0].0);
            }
        }
        let run = InProcWorld::run(4, |c| run_sweep(c, &o, &mut |_| {})).unwrap();
        let rows = run.results[0].clone().unwrap();
        assert_eq!(rows.len(), 4 * BenchKind::ALL.len());
        assert!(rows.iter().all(|r| r.wrong() == Some(0)), "{rows:?}");
    }

    #[test]
    fn sweep_on_inproc_is_correct_and_sized_like_nccl_tests() {
        let o = BenchOptions {
            kinds: BenchKind::ALL.to_vec(),
            min_bytes: 8,
            max_bytes: 256,
            factor: 4,
            iters: 2,
            warmup: 1,
            dtype: DType::F32,
            groups: vec![Group::world(4).unwrap()],
            unaligned_twins: false,
            check: true,
        };
        validate(&o).unwrap();
        let sizes = sweep_sizes(BenchKind::AllGather, &o, 4);
        // 8 B rounds up to one f32 per rank chunk (16 B); 32, 128 stay.
        assert_eq!(
            sizes.iter().map(|s| s.0).collect::<Vec<_>>(),
            vec![16, 32, 128]
        );
        assert_eq!(sizes[2], (128, 8, 8));
        let rs = sweep_sizes(BenchKind::ReduceScatter, &o, 4);
        assert_eq!(rs[2], (128, 8, 32));
        let run = InProcWorld::run(4, |c| run_sweep(c, &o, &mut |_| {})).unwrap();
        let rows = run.results[0].clone().unwrap();
        assert_eq!(rows.len(), 3 + 3 + 3 + 3 + 3);
        assert!(rows.iter().all(|r| r.wrong() == Some(0)), "{rows:?}");
        assert_eq!(run.results[1].clone().unwrap().len(), rows.len());
    }
}
