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

use hpfsdp_plan::program::{Category, OpSpan, Payload, StepProgram};
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
    let classes: Vec<Class> = program
        .ops
        .iter()
        .map(|o| match o.payload {
            Payload::Compute(_) => Class::Compute,
            Payload::Copy(_) => Class::Copy,
            Payload::Collective(_) => Class::Comm,
            Payload::Host { .. } => Class::Host,
        })
        .collect();
    // One sweep over the start and end points gives the unions (the measure of the time a
    // class has at least one op running) and the exposed communication, charged to the
    // earliest-started active collective.
    // Points as (time, is_start, op), packed into one integer that sorts the same way.
    let point = |time: u64, is_start: bool, op: usize| {
        (u128::from(time) << 64) | (u128::from(is_start) << 32) | op as u128
    };
    let mut packed: Vec<u128> = Vec::with_capacity(2 * spans.len());
    for (i, s) in spans.iter().enumerate() {
        if classes[i] != Class::Host && s.end_ns > s.start_ns {
            packed.push(point(s.end_ns, false, i));
            packed.push(point(s.start_ns, true, i));
        }
    }
    packed.sort_unstable();
    let points: Vec<(u64, bool, usize)> = packed
        .iter()
        .map(|&p| {
            (
                (p >> 64) as u64,
                (p >> 32) & 1 == 1,
                (p & 0xFFFF_FFFF) as usize,
            )
        })
        .collect();
    let mut exposed_by_op_category = vec![0u64; Category::ALL.len()];
    let (mut compute_ns, mut copy_ns, mut comm_ns, mut device_ns) = (0u64, 0u64, 0u64, 0u64);
    let (mut computing, mut copying) = (0usize, 0usize);
    let mut active: BTreeSet<(u64, usize)> = BTreeSet::new();
    let mut k = 0;
    while k < points.len() {
        let t = points[k].0;
        while k < points.len() && points[k].0 == t {
            let (_, is_start, i) = points[k];
            match (classes[i], is_start) {
                (Class::Comm, true) => {
                    active.insert((spans[i].start_ns, i));
                }
                (Class::Comm, false) => {
                    active.remove(&(spans[i].start_ns, i));
                }
                (Class::Compute, true) => computing += 1,
                (Class::Compute, false) => computing -= 1,
                (_, true) => copying += 1,
                (_, false) => copying -= 1,
            }
            k += 1;
        }
        let Some(&(next, _, _)) = points.get(k) else {
            break;
        };
        let d = next - t;
        compute_ns += if computing > 0 { d } else { 0 };
        copy_ns += if copying > 0 { d } else { 0 };
        comm_ns += if active.is_empty() { 0 } else { d };
        let covered = computing + copying > 0;
        device_ns += if covered || !active.is_empty() { d } else { 0 };
        if let (false, Some(&(_, i))) = (covered, active.first()) {
            let cat = program.ops[i].category;
            exposed_by_op_category[category_index(cat)] += d;
        }
    }
    let exposed_comm_ns: u64 = exposed_by_op_category.iter().sum();

    // Ops per category in one pass (not one scan of all ops per category).
    let mut members_of: Vec<Vec<usize>> = vec![Vec::new(); Category::ALL.len()];
    for i in 0..spans.len() {
        members_of[category_index(program.ops[i].category)].push(i);
    }
    let by_category = Category::ALL
        .iter()
        .zip(&members_of)
        .enumerate()
        .filter(|(_, (_, members))| !members.is_empty())
        .map(|(ci, (&cat, members))| {
            let busy_ns = union_ns(
                members
                    .iter()
                    .map(|&i| (spans[i].start_ns, spans[i].end_ns))
                    .collect(),
            );
            let comm_busy_ns = union_ns(
                members
                    .iter()
                    .filter(|&&i| classes[i] == Class::Comm)
                    .map(|&i| (spans[i].start_ns, spans[i].end_ns))
                    .collect(),
            );
            CategoryTime {
                category: cat,
                ops: members.len() as u64,
                busy_ns,
                exposed_comm_ns: exposed_by_op_category[ci],
                comm_busy_ns,
                first_start_ns: members
                    .iter()
                    .map(|&i| spans[i].start_ns)
                    .min()
                    .unwrap_or(0),
                last_end_ns: members.iter().map(|&i| spans[i].end_ns).max().unwrap_or(0),
            }
        })
        .collect();

    Breakdown {
        compute_ns,
        copy_ns,
        comm_ns,
        exposed_comm_ns,
        overlap_rate: if comm_ns == 0 {
            1.0
        } else {
            1.0 - exposed_comm_ns as f64 / comm_ns as f64
        },
        idle_ns: step_ns.saturating_sub(device_ns),
        host_busy_ns,
        by_category,
    }
}

fn category_index(c: Category) -> usize {
    Category::ALL.iter().position(|&x| x == c).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use hpfsdp_plan::program::{CollectiveOp, ComputeWork, Group, OpId, ProgramBuilder, Stream};
    use hpfsdp_plan::{CollectiveKind, DType, Tier};

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
}
