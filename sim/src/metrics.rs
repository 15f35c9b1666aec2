//! Time breakdown of one rank from its op spans.
//!
//! Definitions (all over the rank's device streams, time `[0, step_time)`):
//! - **compute time**: measure of the union of the intervals of compute ops (any stream);
//! - **copy time**: measure of the union of copy-op intervals;
//! - **communication time**: measure of the union of collective intervals, each from the
//!   moment the rank reaches the collective (waiting for peers included, as a profiler sees
//!   it) to its end;
//! - **exposed communication**: the part of the communication time during which no compute
//!   or copy op runs on any stream of the rank, i.e. `|comm \ (compute ∪ copy)|`. When several
//!   collectives are active at an exposed instant, the instant is charged to the one that
//!   started first (ties: lower op id), so the per-category figures add up to the total;
//! - **overlap rate**: `1 - exposed / communication time` (1 when there is no communication),
//!   the profiler's "communication overlap rate";
//! - **idle time**: `step_time - |compute ∪ copy ∪ comm|`, time no device stream does anything;
//! - **host busy time**: launch costs plus host ops on the host thread.

use hpfsdp_program::step::{Category, OpSpan, Payload, StepProgram, Stream};
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;

/// Time of one category on one rank.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CategoryTime {
    /// The category.
    pub category: Category,
    /// Number of ops of this category.
    pub ops: u64,
    /// Union of the category's device op intervals (host ops: their host time), nanoseconds.
    pub busy_ns: u64,
    /// Exposed communication charged to this category, nanoseconds.
    pub exposed_comm_ns: u64,
    /// Union of this category's collective intervals, nanoseconds.
    pub comm_busy_ns: u64,
    /// Start of the category's first op, nanoseconds from step start.
    pub first_start_ns: u64,
    /// End of the category's last op, nanoseconds from step start (`last_end - first_start`
    /// is the category's range, e.g. the optimizer range of the Muon comparison).
    pub last_end_ns: u64,
}

/// Time breakdown of one rank; see the module documentation for the definitions.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Breakdown {
    /// Union of compute-op intervals, nanoseconds.
    pub compute_ns: u64,
    /// Union of copy-op intervals, nanoseconds.
    pub copy_ns: u64,
    /// Union of collective intervals, nanoseconds.
    pub comm_ns: u64,
    /// Communication not overlapped by compute or copy, nanoseconds.
    pub exposed_comm_ns: u64,
    /// `1 - exposed / communication` (1 without communication).
    pub overlap_rate: f64,
    /// Step time minus the union of all device activity, nanoseconds.
    pub idle_ns: u64,
    /// Host thread busy time (launches and host ops), nanoseconds.
    pub host_busy_ns: u64,
    /// Per-category figures, in [`Category::ALL`] order, categories without ops omitted.
    pub by_category: Vec<CategoryTime>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    Compute,
    Copy,
    Comm,
    Host,
}

/// Measure of the union of half-open intervals.
pub fn union_ns(mut intervals: Vec<(u64, u64)>) -> u64 {
    intervals.retain(|(s, e)| e > s);
    intervals.sort_unstable();
    let mut total = 0;
    let mut current: Option<(u64, u64)> = None;
    for (s, e) in intervals {
        match current {
            Some((cs, ce)) if s <= ce => current = Some((cs, ce.max(e))),
            Some((cs, ce)) => {
                total += ce - cs;
                current = Some((s, e));
            }
            None => current = Some((s, e)),
        }
    }
    total + current.map_or(0, |(s, e)| e - s)
}

/// Computes the breakdown of `program` from its spans (one per op, in op order).
pub fn breakdown(
    program: &StepProgram,
    spans: &[OpSpan],
    step_ns: u64,
    host_busy_ns: u64,
) -> Breakdown {
    let ops = program.ops.slice(0..spans.len().min(program.ops.len()));
    let classes: Vec<Class> = ops
        .iter()
        .map(|o| match o.payload {
            Payload::Compute(_) => Class::Compute,
            Payload::Copy(_) => Class::Copy,
            Payload::Collective(_) => Class::Comm,
            Payload::Host { .. } => Class::Host,
        })
        .collect();
    let cats: Vec<u8> = ops
        .iter()
        .map(|o| category_index(o.category) as u8)
        .collect();
    let mut seen: Vec<Stream> = Vec::new();
    let streams: Vec<u8> = ops
        .iter()
        .map(|o| match seen.iter().position(|&s| s == o.stream) {
            Some(k) => k as u8,
            None => {
                seen.push(o.stream);
                (seen.len() - 1) as u8
            }
        })
        .collect();
    let sweep = Sweep::run(&classes, (&cats, &streams), spans);
    let exposed_comm_ns: u64 = sweep.exposed_by_category.iter().sum();

    // Counts, first starts and last ends per category in one pass.
    let n_cat = Category::ALL.len();
    let mut count = vec![0u64; n_cat];
    let mut first_start = vec![u64::MAX; n_cat];
    let mut last_end = vec![0u64; n_cat];
    for (&c, s) in cats.iter().zip(spans) {
        let c = c as usize;
        count[c] += 1;
        first_start[c] = first_start[c].min(s.start_ns);
        last_end[c] = last_end[c].max(s.end_ns);
    }
    let by_category = Category::ALL
        .iter()
        .enumerate()
        .filter(|&(ci, _)| count[ci] > 0)
        .map(|(ci, &cat)| CategoryTime {
            category: cat,
            ops: count[ci],
            busy_ns: sweep.busy_by_category[ci],
            exposed_comm_ns: sweep.exposed_by_category[ci],
            comm_busy_ns: sweep.comm_by_category[ci],
            first_start_ns: first_start[ci],
            last_end_ns: last_end[ci],
        })
        .collect();

    Breakdown {
        compute_ns: sweep.compute_ns,
        copy_ns: sweep.copy_ns,
        comm_ns: sweep.comm_ns,
        exposed_comm_ns,
        overlap_rate: if sweep.comm_ns == 0 {
            1.0
        } else {
            1.0 - exposed_comm_ns as f64 / sweep.comm_ns as f64
        },
        idle_ns: step_ns.saturating_sub(sweep.device_ns),
        host_busy_ns,
        by_category,
    }
}

/// The figures of one sweep over the start and end points of a rank's op intervals: the
/// measure of the time each class (and each category) has at least one op running, and the
/// exposed communication, charged to the earliest-started active collective. One sort of the
/// points replaces a sort per class and per category.
struct Sweep {
    compute_ns: u64,
    copy_ns: u64,
    comm_ns: u64,
    device_ns: u64,
    /// Per category: union of its intervals, host ops included.
    busy_by_category: Vec<u64>,
    /// Per category: union of its collective intervals.
    comm_by_category: Vec<u64>,
    /// Per category: exposed communication charged to it.
    exposed_by_category: Vec<u64>,
}

impl Sweep {
    fn run(classes: &[Class], (cats, streams): (&[u8], &[u8]), spans: &[OpSpan]) -> Self {
        let points = sorted_points(classes.len(), streams, spans);
        let n_cat = Category::ALL.len();
        let mut out = Sweep {
            compute_ns: 0,
            copy_ns: 0,
            comm_ns: 0,
            device_ns: 0,
            busy_by_category: vec![0; n_cat],
            comm_by_category: vec![0; n_cat],
            exposed_by_category: vec![0; n_cat],
        };
        let (mut computing, mut copying) = (0usize, 0usize);
        let mut in_category = vec![0u32; n_cat];
        let mut comm_in_category = vec![0u32; n_cat];
        let mut active: BTreeSet<(u64, usize)> = BTreeSet::new();
        let mut k = 0;
        while k < points.len() {
            let t = (points[k] >> 64) as u64;
            while k < points.len() && (points[k] >> 64) as u64 == t {
                let (is_start, i) = (
                    (points[k] >> 32) & 1 == 1,
                    (points[k] & 0xFFFF_FFFF) as usize,
                );
                let c = cats[i] as usize;
                let step = |n: &mut u32| if is_start { *n += 1 } else { *n -= 1 };
                step(&mut in_category[c]);
                match (classes[i], is_start) {
                    (Class::Comm, true) => {
                        step(&mut comm_in_category[c]);
                        active.insert((spans[i].start_ns, i));
                    }
                    (Class::Comm, false) => {
                        step(&mut comm_in_category[c]);
                        active.remove(&(spans[i].start_ns, i));
                    }
                    (Class::Compute, true) => computing += 1,
                    (Class::Compute, false) => computing -= 1,
                    (Class::Copy, true) => copying += 1,
                    (Class::Copy, false) => copying -= 1,
                    (Class::Host, _) => {}
                }
                k += 1;
            }
            let Some(&next) = points.get(k) else {
                break;
            };
            let d = (next >> 64) as u64 - t;
            out.add_segment(d, computing, copying, &active, cats);
            for c in 0..n_cat {
                out.busy_by_category[c] += if in_category[c] > 0 { d } else { 0 };
                out.comm_by_category[c] += if comm_in_category[c] > 0 { d } else { 0 };
            }
        }
        out
    }

    /// Adds a segment of `d` ns during which `computing` compute ops, `copying` copy ops and
    /// the collectives `active` run.
    fn add_segment(
        &mut self,
        d: u64,
        computing: usize,
        copying: usize,
        active: &BTreeSet<(u64, usize)>,
        cats: &[u8],
    ) {
        self.compute_ns += if computing > 0 { d } else { 0 };
        self.copy_ns += if copying > 0 { d } else { 0 };
        self.comm_ns += if active.is_empty() { 0 } else { d };
        let covered = computing + copying > 0;
        self.device_ns += if covered || !active.is_empty() { d } else { 0 };
        if let (false, Some(&(_, i))) = (covered, active.first()) {
            self.exposed_by_category[cats[i] as usize] += d;
        }
    }
}

/// The start and end points of the ops' spans (zero-length spans left out) as
/// `(time, is_start, op)` packed into one integer that sorts the same way, sorted. They are
/// laid out stream by stream, each stream's in op order: a stream runs its ops one after
/// another, so each stream's points are already sorted and the (stable, run-detecting) sort
/// merges a few runs instead of sorting from scratch. Every key is distinct (the op index is
/// in it), so the order is the same as any sort's.
fn sorted_points(n_ops: usize, streams: &[u8], spans: &[OpSpan]) -> Vec<u128> {
    let live = |i: usize| spans[i].end_ns > spans[i].start_ns;
    let n = n_ops.min(spans.len());
    let n_streams = streams[..n]
        .iter()
        .map(|&s| s as usize + 1)
        .max()
        .unwrap_or(0);
    let mut offset = vec![0usize; n_streams + 1];
    for i in (0..n).filter(|&i| live(i)) {
        offset[streams[i] as usize + 1] += 2;
    }
    for k in 1..offset.len() {
        offset[k] += offset[k - 1];
    }
    let mut points = vec![0u128; offset[n_streams]];
    let at = |time: u64, is_start: bool, i: usize| {
        (u128::from(time) << 64) | (u128::from(is_start) << 32) | i as u128
    };
    for i in (0..n).filter(|&i| live(i)) {
        let next = &mut offset[streams[i] as usize];
        points[*next] = at(spans[i].start_ns, true, i);
        points[*next + 1] = at(spans[i].end_ns, false, i);
        *next += 2;
    }
    points.sort();
    points
}

fn category_index(c: Category) -> usize {
    Category::ALL.iter().position(|&x| x == c).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use hpfsdp_plan::{CollectiveKind, DType, Tier};
    use hpfsdp_program::step::{CollectiveOp, ComputeWork, Group, OpId, ProgramBuilder, Stream};

    #[test]
    fn union_merges_overlaps() {
        assert_eq!(
            union_ns(vec![(0, 10), (5, 15), (20, 25), (25, 30), (3, 3)]),
            25
        );
        assert_eq!(union_ns(vec![]), 0);
    }

    #[test]
    fn exposed_comm_by_hand() {
        // compute [0,100) and [150,200); fsdp-ag [50,170); fsdp-rs [120,260).
        // comm union [50,260) = 210. Exposed: [100,150) -> ag started first (50);
        // [200,260) -> only rs active. Total 110; ag 50, rs 60.
        let mut b = ProgramBuilder::new(0);
        let g = b.group(Group::new("dp", vec![0, 1]).unwrap());
        let w = ComputeWork {
            flops: 1,
            hbm_bytes: 1,
            kernels: 1,
            mix: None,
        };
        let c = |kind| CollectiveOp {
            kind,
            group: g,
            tier: Tier::IntraMachine,
            input_bytes: 8,
            output_bytes: if kind == CollectiveKind::AllGather {
                16
            } else {
                4
            },
            dtype: DType::Bf16,
            aligned_512: true,
        };
        b.compute(w, &[]);
        b.collective(
            Stream::AllGather,
            Category::FsdpAg,
            c(CollectiveKind::AllGather),
            &[],
        );
        b.collective(
            Stream::ReduceScatter,
            Category::FsdpRs,
            c(CollectiveKind::ReduceScatter),
            &[],
        );
        b.compute(w, &[]);
        let p = b.build().unwrap();
        let span = |op, s, e| OpSpan {
            op: OpId(op),
            start_ns: s,
            end_ns: e,
            launched_ns: None,
            transfer_start_ns: None,
        };
        let spans = [
            span(0, 0, 100),
            span(1, 50, 170),
            span(2, 120, 260),
            span(3, 150, 200),
        ];
        let bd = breakdown(&p, &spans, 300, 7);
        assert_eq!(bd.compute_ns, 150);
        assert_eq!(bd.comm_ns, 210);
        assert_eq!(bd.exposed_comm_ns, 110);
        assert_eq!(bd.idle_ns, 40);
        assert_eq!(bd.host_busy_ns, 7);
        assert!((bd.overlap_rate - (1.0 - 110.0 / 210.0)).abs() < 1e-12);
        let ag = bd
            .by_category
            .iter()
            .find(|c| c.category == Category::FsdpAg)
            .unwrap();
        let rs = bd
            .by_category
            .iter()
            .find(|c| c.category == Category::FsdpRs)
            .unwrap();
        assert_eq!((ag.exposed_comm_ns, rs.exposed_comm_ns), (50, 60));
        assert_eq!((ag.busy_ns, rs.busy_ns), (120, 140));
    }

    /// Every figure against a nanosecond-by-nanosecond count on random spans (host ops,
    /// zero-length ops and ties included).
    #[test]
    fn sweep_matches_a_brute_force_count() {
        let mut b = ProgramBuilder::new(0);
        let g = b.group(Group::new("dp", vec![0, 1]).unwrap());
        let w = ComputeWork {
            flops: 1,
            hbm_bytes: 1,
            kernels: 1,
            mix: None,
        };
        let coll = CollectiveOp {
            kind: CollectiveKind::AllReduce,
            group: g,
            tier: Tier::IntraMachine,
            input_bytes: 8,
            output_bytes: 8,
            dtype: DType::Bf16,
            aligned_512: true,
        };
        let comm_cats = [Category::FsdpAg, Category::FsdpRs, Category::Optimizer];
        for i in 0..60 {
            match i % 5 {
                0 | 1 => {
                    b.compute_on(Stream::Compute, Category::ALL[i % 4], w, &[]);
                }
                2 => {
                    b.copy(Stream::Copy, 64, &[]);
                }
                3 => {
                    b.collective(Stream::AllGather, comm_cats[i % 3], coll, &[]);
                }
                _ => {
                    b.host(Category::Host, 5, &[]);
                }
            }
        }
        let p = b.build().unwrap();
        let mut state = 0x2545_F491_4F6C_DD1Du64;
        let mut rand = move |n: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % n
        };
        for _ in 0..20 {
            let spans: Vec<OpSpan> = (0..p.ops.len())
                .map(|i| {
                    let start = rand(200);
                    OpSpan {
                        op: OpId(i as u32),
                        start_ns: start,
                        end_ns: start + rand(4) * rand(30),
                        launched_ns: None,
                        transfer_start_ns: None,
                    }
                })
                .collect();
            let bd = breakdown(&p, &spans, 300, 0);
            let class = |i: usize| match p.ops[i].payload {
                Payload::Compute(_) => Class::Compute,
                Payload::Copy(_) => Class::Copy,
                Payload::Collective(_) => Class::Comm,
                Payload::Host { .. } => Class::Host,
            };
            let runs = |i: usize, t: u64| spans[i].start_ns <= t && t < spans[i].end_ns;
            let count = |want: &dyn Fn(usize) -> bool| {
                (0..300u64)
                    .filter(|&t| (0..spans.len()).any(|i| want(i) && runs(i, t)))
                    .count() as u64
            };
            assert_eq!(bd.compute_ns, count(&|i| class(i) == Class::Compute));
            assert_eq!(bd.copy_ns, count(&|i| class(i) == Class::Copy));
            assert_eq!(bd.comm_ns, count(&|i| class(i) == Class::Comm));
            let device = count(&|i| class(i) != Class::Host);
            assert_eq!(bd.idle_ns, 300 - device);
            let mut exposed = vec![0u64; Category::ALL.len()];
            for t in 0..300u64 {
                let covered = (0..spans.len())
                    .any(|i| matches!(class(i), Class::Compute | Class::Copy) && runs(i, t));
                let first = (0..spans.len())
                    .filter(|&i| class(i) == Class::Comm && runs(i, t))
                    .min_by_key(|&i| (spans[i].start_ns, i));
                if let (false, Some(i)) = (covered, first) {
                    exposed[category_index(p.ops[i].category)] += 1;
                }
            }
            assert_eq!(bd.exposed_comm_ns, exposed.iter().sum::<u64>());
            for ct in &bd.by_category {
                let c = ct.category;
                let members: Vec<usize> = (0..spans.len())
                    .filter(|&i| p.ops[i].category == c)
                    .collect();
                assert_eq!(ct.ops, members.len() as u64);
                assert_eq!(ct.busy_ns, count(&|i| p.ops[i].category == c), "{c:?}");
                let comm = count(&|i| p.ops[i].category == c && class(i) == Class::Comm);
                assert_eq!(ct.comm_busy_ns, comm, "{c:?}");
                assert_eq!(ct.exposed_comm_ns, exposed[category_index(c)], "{c:?}");
                let first = members.iter().map(|&i| spans[i].start_ns).min();
                let last = members.iter().map(|&i| spans[i].end_ns).max();
                assert_eq!(
                    (Some(ct.first_start_ns), Some(ct.last_end_ns)),
                    (first, last)
                );
            }
            let listed = bd.by_category.len();
            let present = Category::ALL
                .iter()
                .filter(|&&c| p.ops.iter().any(|o| o.category == c))
                .count();
            assert_eq!(listed, present);
        }
    }
}
