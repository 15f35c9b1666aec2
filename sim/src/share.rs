//! Prefix sharing: simulated units whose programs start with the same ops are simulated as
//! one until their programs diverge.
//!
//! Under a distributed Muon optimizer, symmetric ranks no longer fold into one class (each
//! rank orthogonalizes and owns different matrices), yet every class issues the same forward,
//! backward and gradient-reduction ops before its optimizer tail: the prefix. The engine
//! ([`crate::engine`]) simulates the prefix once per **block** of units that behave alike in
//! it, then forks every block into its units (copying the block's state) before the first
//! tail op of any unit could start, and simulates the tails unit by unit.
//!
//! A [`SharePlan`] decides the prefix length, the blocks and the fork gates:
//! - the prefix is the longest run of leading ops every unit has in common (ops compared with
//!   names left out; collectives refer to the same group slot);
//! - blocks are found by colour refinement over the groups the prefix uses, as folding does
//!   ([`crate::fold`]) but on units and on the **set** of blocks in a group, which is what
//!   the engine's communicators see: units of one block have the same group labels, sizes
//!   and shapes, and in every prefix group the same set of blocks;
//! - a prefix op is a **gate** when some tail op depends on it; the engine forks as soon as a
//!   gate finishes, or when a block's host has issued its whole prefix and some tail op of
//!   the block depends on nothing at all. Until then no tail op can start, so the block's
//!   timeline is every member's timeline.
//!
//! Resident memory may differ between the units of a block (optimizer state); the block is
//! simulated with its first unit's and every unit's tracker is shifted by the difference at
//! the fork ([`crate::memory::MemoryTracker::rebased`]). Tags the prefix frees must have equal
//! resident bytes within a block (a free is clamped at zero, which a shift would not honour).

use crate::shape::GroupShape;
use crate::workload::Workload;
use hpfsdp_program::step::{MemTag, Op, SharedOps, StepProgram};
use std::collections::HashMap;
use std::sync::Arc;

/// How a workload's units share their prefix (see the module documentation).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharePlan {
    /// Ops every unit's program starts with.
    pub prefix_len: usize,
    /// Block of every unit.
    pub block_of_unit: Vec<u32>,
    /// Units of every block, ascending; the first one's program stands for the block.
    pub blocks: Vec<Vec<u32>>,
    /// Per block, per prefix op: some tail op of a unit of the block depends on it.
    pub gates: Vec<Vec<bool>>,
    /// Per block: some tail op of a unit of the block has no dependency at all.
    pub free_root: Vec<bool>,
}

/// Equal as far as the engine can tell: everything but the name.
fn same_op(a: &Op, b: &Op) -> bool {
    a.stream == b.stream
        && a.category == b.category
        && a.deps == b.deps
        && a.payload == b.payload
        && a.memory == b.memory
        && a.validation_cpu_events == b.validation_cpu_events
        && a.host_cpu_events == b.host_cpu_events
}

/// Number of leading ops `a` and `b` have in common from op `start` on (ops before `start`
/// are known to agree).
fn common_from(a: &StepProgram, b: &StepProgram, start: usize) -> usize {
    start
        + a.ops
            .iter_from(start)
            .zip(b.ops.iter_from(start))
            .take_while(|(x, y)| same_op(x, y))
            .count()
}

/// Common-prefix lengths of `first` with each of `programs`. A shared op prefix
/// ([`hpfsdp_program::step::OpSeq`]) is compared with `first` once, however many programs
/// are built on it; each program then compares only its own ops.
fn common_prefixes<'a>(
    first: &StepProgram,
    programs: impl Iterator<Item = &'a StepProgram>,
) -> Vec<usize> {
    let mut by_prefix: HashMap<*const SharedOps, usize> = HashMap::new();
    // Programs with the very same op storage have the same common prefix.
    let mut by_ops: HashMap<(usize, usize, usize), usize> = HashMap::new();
    programs
        .map(|p| {
            let id = ops_identity(p);
            if let Some(&n) = by_ops.get(&id) {
                return n;
            }
            let n = common_prefix(first, p, &mut by_prefix);
            by_ops.insert(id, n);
            n
        })
        .collect()
}

/// Common-prefix length of `first` with `p`, the comparison of `p`'s shared prefix with
/// `first` looked up in (or added to) `by_prefix`.
fn common_prefix(
    first: &StepProgram,
    p: &StepProgram,
    by_prefix: &mut HashMap<*const SharedOps, usize>,
) -> usize {
    match p.ops.shared() {
        Some(shared) => {
            let len = shared.ops.len();
            let known = *by_prefix.entry(Arc::as_ptr(shared)).or_insert_with(|| {
                first
                    .ops
                    .iter()
                    .zip(&shared.ops)
                    .take_while(|(x, y)| same_op(x, y))
                    .count()
            });
            if known < len {
                known
            } else {
                common_from(first, p, len)
            }
        }
        None => common_from(first, p, 0),
    }
}

/// The storage of a program's ops: (shared prefix address, own tail address, tail length).
/// Programs alive at once with equal identities have equal ops (an empty tail adds none).
fn ops_identity(program: &StepProgram) -> (usize, usize, usize) {
    let tail = program.ops.tail();
    (
        program.ops.shared().map_or(0, |s| Arc::as_ptr(s) as usize),
        tail.as_ptr() as usize,
        tail.len(),
    )
}

/// Dense ids for keys, in order of first appearance.
fn intern<K: std::hash::Hash + Eq>(ids: &mut HashMap<K, u32>, key: K) -> u32 {
    let next = ids.len() as u32;
    *ids.entry(key).or_insert(next)
}

impl SharePlan {
    /// The sharing plan of `workload`, or `None` when nothing would be shared (one unit, no
    /// common prefix, or every block a single unit).
    pub fn of(workload: &Workload) -> Option<Self> {
        let units = &workload.units;
        if units.len() < 2 {
            return None;
        }
        let first = &units[0].program;
        let prefix_len = common_prefixes(first, units.iter().map(|u| &u.program))
            .into_iter()
            .min()?;
        if prefix_len == 0 {
            return None;
        }
        let prefix = || first.ops.iter().take(prefix_len);
        // Group slots the prefix uses, and tags it frees.
        let mut used: Vec<usize> = prefix()
            .filter_map(|o| o.payload.as_collective().map(|c| c.group.index()))
            .collect();
        used.sort_unstable();
        used.dedup();
        let mut freed = [false; MemTag::ALL.len()];
        for o in prefix() {
            for m in o.memory.iter().filter(|m| m.free_bytes > 0) {
                freed[m.tag.index()] = true;
            }
        }
        let colour = initial_colours(workload, &used, &freed)?;
        let colour = refine(workload, &used, colour);
        let nblocks = colour.iter().copied().max().map_or(0, |c| c as usize + 1);
        if nblocks == units.len() {
            return None;
        }
        let mut blocks = vec![Vec::new(); nblocks];
        for (u, &c) in colour.iter().enumerate() {
            blocks[c as usize].push(u as u32);
        }
        if !communicators_agree(workload, &used, &colour) {
            return None;
        }
        let mut gates = vec![vec![false; prefix_len]; nblocks];
        let mut free_root = vec![false; nblocks];
        // A program whose ops are the same storage as an earlier one's in the same block
        // (a relabelled copy) adds no gate of its own.
        let mut seen = std::collections::HashSet::new();
        for (u, unit) in units.iter().enumerate() {
            let b = colour[u] as usize;
            if !seen.insert((b, ops_identity(&unit.program))) {
                continue;
            }
            for op in unit.program.ops.iter_from(prefix_len) {
                if op.deps.is_empty() {
                    free_root[b] = true;
                }
                for d in op.deps.iter().filter(|d| d.index() < prefix_len) {
                    gates[b][d.index()] = true;
                }
            }
        }
        Some(Self {
            prefix_len,
            block_of_unit: colour,
            blocks,
            gates,
            free_root,
        })
    }
}

/// Colours from what a unit's prefix looks like on its own: label, size and shape of every
/// group the prefix uses, and resident bytes of the tags the prefix frees. `None` when a
/// program lacks a group the prefix uses.
fn initial_colours(workload: &Workload, used: &[usize], freed: &[bool]) -> Option<Vec<u32>> {
    type Look = (Vec<(String, usize, GroupShape)>, Vec<u64>);
    let mut ids: HashMap<Look, u32> = HashMap::new();
    let mut out = Vec::with_capacity(workload.units.len());
    for unit in &workload.units {
        let p = &unit.program;
        let mut groups = Vec::with_capacity(used.len());
        for &g in used {
            let g = p.groups.get(g)?;
            groups.push((
                g.label.clone(),
                g.ranks.len(),
                GroupShape::of(&g.ranks, &workload.topology),
            ));
        }
        let mut resident = vec![0u64; MemTag::ALL.len()];
        for r in &p.resident {
            if freed[r.tag.index()] {
                resident[r.tag.index()] += r.bytes;
            }
        }
        out.push(intern(&mut ids, (groups, resident)));
    }
    Some(out)
}

/// Blocks present in group `g` of unit `u`'s program, sorted and deduplicated.
fn blocks_in(workload: &Workload, u: usize, g: usize, colour: &[u32]) -> Vec<u32> {
    let mut bs: Vec<u32> = workload.units[u].program.groups[g]
        .ranks
        .iter()
        .map(|&r| colour[workload.rank_unit[r] as usize])
        .collect();
    bs.sort_unstable();
    bs.dedup();
    bs
}

/// Refines `colour` by the set of colours in each prefix group until it is stable.
fn refine(workload: &Workload, used: &[usize], mut colour: Vec<u32>) -> Vec<u32> {
    let mut count = colour.iter().copied().max().map_or(0, |c| c as usize + 1);
    loop {
        let mut ids: HashMap<(u32, Vec<Vec<u32>>), u32> = HashMap::new();
        let next: Vec<u32> = (0..workload.units.len())
            .map(|u| {
                let sets = used
                    .iter()
                    .map(|&g| blocks_in(workload, u, g, &colour))
                    .collect();
                intern(&mut ids, (colour[u], sets))
            })
            .collect();
        colour = next;
        if ids.len() == count {
            return colour;
        }
        count = ids.len();
    }
}

/// Within every unit, two prefix groups are one communicator of units exactly when they are
/// one communicator of blocks; otherwise the block's collective numbering would not be its
/// units'.
fn communicators_agree(workload: &Workload, used: &[usize], colour: &[u32]) -> bool {
    for (u, unit) in workload.units.iter().enumerate() {
        let groups = &unit.program.groups;
        let keys: Vec<(Vec<u32>, Vec<u32>)> = used
            .iter()
            .map(|&g| {
                let mut us: Vec<u32> = groups[g]
                    .ranks
                    .iter()
                    .map(|&r| workload.rank_unit[r])
                    .collect();
                us.sort_unstable();
                us.dedup();
                (us, blocks_in(workload, u, g, colour))
            })
            .collect();
        for i in 0..used.len() {
            for j in i + 1..used.len() {
                let (gi, gj) = (&groups[used[i]], &groups[used[j]]);
                if gi.label != gj.label || gi.ranks.len() != gj.ranks.len() {
                    continue;
                }
                if (keys[i].0 == keys[j].0) != (keys[i].1 == keys[j].1) {
                    return false;
                }
            }
        }
    }
    true
}
