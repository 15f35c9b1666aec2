//! Forking a shared-prefix run ([`crate::share`]): the blocks' prefix is simulated once, then
//! every block's state is copied into each of its units, which simulate their tails.
//!
//! The copy happens right after the event that fired a gate (time `T`), before any tail op
//! could have started. Per unit it carries the prefix ops still in flight (the ops before
//! the block's first unfinished op are done and left out), streams, host, collective
//! counters and memory (shifted to the unit's resident bytes); collective instances in
//! flight become one instance per unit communicator, with their network transfers at the
//! same progress; pending events are re-issued in their order. A host that had issued its
//! whole prefix before `T` then issues its tail up to `T` (launches cannot start a tail op
//! before `T`), and every stream is offered its next op at `T`, as the gate's completion
//! would have done.

use super::{
    Engine, Event, Gates, HOST, Instance, UnitRt, UnitSpec, kept_units, last_end, op_spans,
};
use crate::error::SimError;
use crate::memory::{join_series, resident_shift};
use crate::profile::HardwareProfile;
use crate::result::{SimResult, UnitOutcome, assemble};
use crate::share::SharePlan;
use crate::workload::Workload;
use std::cmp::Reverse;

use super::SimOptions;
use super::streams::StreamPos;

/// [`super::simulate`] with the prefix of `plan` simulated once per block.
pub(super) fn simulate_shared(
    workload: &Workload,
    plan: &SharePlan,
    profile: &HardwareProfile,
    options: &SimOptions,
) -> Result<SimResult, SimError> {
    let prefix = plan.prefix_len;
    let block_rank: Vec<u32> = workload
        .rank_unit
        .iter()
        .map(|&u| plan.block_of_unit[u as usize])
        .collect();
    let specs: Vec<UnitSpec<'_>> = plan
        .blocks
        .iter()
        .map(|b| UnitSpec {
            program: &workload.units[b[0] as usize].program,
            base: 0,
            end: prefix,
        })
        .collect();
    let mut merged = Engine::new(&specs, &block_rank, workload, profile, options)?;
    merged.gates = Some(Gates {
        gates: &plan.gates,
        free_root: &plan.free_root,
    });
    merged.start();
    merged.drain()?;
    let fork_ns = merged.now;

    // A block's first unfinished op: everything before it is done in every unit.
    let bases: Vec<usize> = merged
        .units
        .iter()
        .map(|u| u.ops.iter().position(|o| !o.done).unwrap_or(u.ops.len()))
        .collect();
    let specs: Vec<UnitSpec<'_>> = workload
        .units
        .iter()
        .enumerate()
        .map(|(c, unit)| UnitSpec {
            program: &unit.program,
            base: bases[plan.block_of_unit[c] as usize],
            end: unit.program.ops.len(),
        })
        .collect();
    let mut engine = Engine::new(&specs, &workload.rank_unit, workload, profile, options)?;
    transplant(&merged, &mut engine, plan, fork_ns)?;
    engine.drain()?;
    engine.check_finished()?;

    let events = merged.events + engine.events;
    // A unit's end: its own spans' or, when they are all done before the fork, the block's.
    let ends: Vec<u64> = engine
        .units
        .iter()
        .enumerate()
        .map(|(c, u)| {
            let block = &merged.units[plan.block_of_unit[c] as usize];
            last_end(&block.ops[..u.base]).max(last_end(&u.ops))
        })
        .collect();
    let keep = kept_units(workload, &ends, options);
    let outcomes = engine
        .units
        .into_iter()
        .enumerate()
        .map(|(c, u)| {
            let spans = if keep[c] {
                let block = &merged.units[plan.block_of_unit[c] as usize];
                let mut spans = op_spans(block.program, 0, &block.ops[..u.base]);
                spans.extend(op_spans(u.program, u.base, &u.ops));
                spans
            } else {
                Vec::new()
            };
            let mut memory = u.mem.report();
            if keep[c] || options.all_ranks {
                let block = &merged.units[plan.block_of_unit[c] as usize];
                let shift = resident_shift(&block.program.resident, &u.program.resident);
                memory.series = join_series(block.mem.series(), shift, &memory.series);
            }
            UnitOutcome {
                spans,
                end_ns: ends[c],
                host_busy_ns: u.host.busy_ns,
                memory,
            }
        })
        .collect();
    Ok(assemble(workload, profile, options, outcomes, events))
}

/// Copies the merged engine's state at `at_ns` into the per-unit engine `e`.
fn transplant(
    m: &Engine<'_>,
    e: &mut Engine<'_>,
    plan: &SharePlan,
    at_ns: u64,
) -> Result<(), SimError> {
    for (b, members) in plan.blocks.iter().enumerate() {
        for &c in members {
            copy_unit(&m.units[b], &mut e.units[c as usize], plan.prefix_len)?;
        }
    }
    let derived = copy_instances(m, e, plan)?;
    copy_events(m, e, plan, &derived);
    e.now = at_ns;
    for (b, members) in plan.blocks.iter().enumerate() {
        for &c in members {
            let c = c as usize;
            if let Some(from) = m.units[b].host.stop_ns {
                catch_up(e, c, from, at_ns);
            }
            for s in 0..e.units[c].streams.len() {
                e.try_start(c, s as u16, at_ns)?;
            }
        }
    }
    Ok(())
}

/// One unit's copy of its block: in-flight prefix ops, tail dependency counts, streams,
/// host, collective counters and memory.
fn copy_unit(mu: &UnitRt<'_>, cu: &mut UnitRt<'_>, prefix: usize) -> Result<(), SimError> {
    let base = cu.base;
    for i in base..prefix {
        let (src, dst) = (mu.ops[i], &mut cu.ops[i - base]);
        dst.deps_left = src.deps_left;
        dst.set_seq(src.seq());
        dst.done = src.done;
        cu.finished += usize::from(src.done);
        dst.span = src.span;
    }
    for i in prefix..base + cu.ops.len() {
        let left = cu.program.ops[i]
            .deps
            .iter()
            .filter(|d| d.index() >= base && !cu.ops[d.index() - base].done)
            .count();
        cu.ops[i - base].deps_left = left as u32;
    }
    for (s, sid) in cu.stream_ids.iter().enumerate() {
        if let Some(ms) = mu.stream_ids.iter().position(|x| x == sid) {
            let src = mu.streams.get(ms as u16);
            let queue = mu.queue(ms as u16);
            let before = queue.iter().filter(|&&o| (o as usize) < base).count();
            cu.streams
                .set(s as u16, StreamPos::new(src.head() - before, src.busy()));
        }
    }
    cu.host.next = mu.host.next.checked_sub(base).ok_or_else(|| {
        SimError::Workload(format!(
            "internal: rank {} forks with its host behind its first unfinished op",
            cu.program.rank
        ))
    })?;
    cu.host.applied = cu.host.next;
    cu.host.busy = mu.host.busy;
    cu.host.busy_ns = mu.host.busy_ns;
    for g in 0..cu.group_slot.len().min(mu.group_slot.len()) {
        let (cs, ms) = (cu.group_slot[g] as usize, mu.group_slot[g] as usize);
        cu.seq[cs] = cu.seq[cs].max(mu.seq[ms]);
    }
    cu.mem = mu.mem.rebased(&mu.program.resident, &cu.program.resident);
    Ok(())
}

/// Splits every collective instance in flight into one instance per unit communicator (with
/// its network transfer, when one is active); returns, per merged instance, the derived
/// instances and the versions of their transfers' finish events.
fn copy_instances(
    m: &Engine<'_>,
    e: &mut Engine<'_>,
    plan: &SharePlan,
) -> Result<Vec<Vec<(u32, u64)>>, SimError> {
    let mut derived: Vec<Vec<(u32, u64)>> = vec![Vec::new(); m.instances.len()];
    for (mi, inst) in m.instances.iter() {
        let Some(&(fb, fop)) = inst.arrivals.first() else {
            continue;
        };
        let Some(c) = inst.first else {
            return Err(SimError::Workload(
                "internal: a collective instance with arrivals but no first collective".into(),
            ));
        };
        let g = c.group.index();
        let seq = m.units[fb as usize].ops[fop as usize].seq();
        let pending = inst.arrivals.len() < m.keys[inst.key as usize].units.len();
        for &(b, op) in &inst.arrivals {
            for &cu in &plan.blocks[b as usize] {
                let unit = &e.units[cu as usize];
                let key = unit.group_key[g];
                let local = (op as usize - unit.base) as u32;
                let ci = match derived[mi]
                    .iter()
                    .find(|&&(ci, _)| e.instances[ci as usize].key == key)
                {
                    Some(&(ci, _)) => ci,
                    None => {
                        let ci = e.instances.push(Instance {
                            key,
                            arrivals: Default::default(),
                            max_in: inst.max_in,
                            max_out: inst.max_out,
                            aligned: inst.aligned,
                            first: inst.first,
                            transfer_start_ns: inst.transfer_start_ns,
                            phases: inst.phases.clone(),
                            phase: inst.phase,
                        });
                        if pending {
                            e.pending.insert((key, seq), ci);
                        }
                        derived[mi].push((ci, 0));
                        ci
                    }
                };
                e.instances[ci as usize].arrivals.push((cu, local));
            }
        }
        if let Some(progress) = m.net.progress(mi as u32) {
            for (ci, version) in derived[mi].iter_mut() {
                let units = &e.keys[e.instances[*ci as usize].key as usize].units;
                *version = e.net.restore(*ci, units, progress);
            }
        }
    }
    Ok(derived)
}

/// Re-issues the merged engine's pending events, in their order, for every unit and every
/// derived instance; stale transfer finishes are dropped.
fn copy_events(m: &Engine<'_>, e: &mut Engine<'_>, plan: &SharePlan, derived: &[Vec<(u32, u64)>]) {
    let mut events: Vec<(u64, u64, Event)> = m.heap.iter().map(|Reverse(x)| *x).collect();
    events.sort_unstable();
    for (time, _, event) in events {
        match event {
            Event::HostDone { unit, op } | Event::OpDone { unit, op } => {
                for &c in &plan.blocks[unit as usize] {
                    let local = op - e.units[c as usize].base as u32;
                    let ev = match event {
                        Event::HostDone { .. } => Event::HostDone { unit: c, op: local },
                        _ => Event::OpDone { unit: c, op: local },
                    };
                    e.push(time, ev);
                }
            }
            Event::Latency { inst } => {
                for &(ci, _) in &derived[inst as usize] {
                    e.push(time, Event::Latency { inst: ci });
                }
            }
            Event::Transfer { inst, version } => {
                if m.net.is_current(inst, version) {
                    for &(ci, v) in &derived[inst as usize] {
                        e.push(
                            time,
                            Event::Transfer {
                                inst: ci,
                                version: v,
                            },
                        );
                    }
                }
            }
        }
    }
}

/// Issues unit `u`'s tail from `from_ns` (when its host had issued its prefix) up to
/// `until_ns`: launches that end before `until_ns` are applied at once (no tail op can start
/// before then), the one in progress at `until_ns` is left as a pending event, and a host op
/// whose dependencies are done starts at `until_ns`.
fn catch_up(e: &mut Engine<'_>, u: usize, from_ns: u64, until_ns: u64) {
    let mut t = from_ns;
    loop {
        let unit = &mut e.units[u];
        if unit.host.busy || unit.host.next >= unit.ops.len() {
            return;
        }
        let op = unit.host.next;
        let launch = unit.launches[op];
        if launch.stream == HOST {
            if unit.ops[op].deps_left == 0 {
                e.host_advance(u, t.max(until_ns));
            }
            return;
        }
        let end = t + launch.host_ns;
        if end >= until_ns {
            e.host_advance(u, t);
            return;
        }
        unit.host.busy_ns += launch.host_ns;
        unit.host.next += 1;
        unit.launch(op, end);
        t = end;
    }
}
