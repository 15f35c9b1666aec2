//! The discrete-event engine.
//!
//! Per simulated rank there is one **host thread** and one queue per device **stream**:
//! - the host walks the program in issue order; launching a kernel or collective costs host
//!   time (profile `host_launch_us_*`, plus `validation_dispatch_us_per_op` in validation
//!   mode); a host op ([`Stream::Host`]) first waits until its dependencies have finished on
//!   the device, then keeps the host busy for its duration;
//! - a device stream runs its ops one at a time in issue order; an op starts when the host has
//!   launched it, its stream is free and all its dependencies (on any stream) have finished. A
//!   stream therefore idles when the host falls behind;
//! - a collective occupies its stream from the moment the rank reaches it; data moves only
//!   once every participant has reached it (**rendezvous**), then runs through the phases of
//!   [`crate::cost::collective_phases`], each a latency followed by a transfer whose
//!   bandwidth is shared on the tier links ([`crate::net`]); all participants finish together.
//!
//! The k-th collective a rank launches on a communicator matches the k-th collective every other
//! participant launches on it. A communicator is the group's label plus the set of simulated
//! units its ranks belong to: without folding that is the exact rank set; with folding a
//! representative rendezvouses with the representatives of the classes in its group,
//! assuming symmetric peers behave as it does.
//!
//! Time is integer nanoseconds; events are ordered by `(time, sequence number)` in a binary
//! heap, so runs are deterministic and byte-identical.

use crate::cost::{collective_phases, compute_work_s, copy_s};
use crate::error::SimError;
use crate::memory::MemoryTracker;
use crate::net::{Finish, Network};
use crate::profile::HardwareProfile;
use crate::result::{SimResult, UnitOutcome, assemble};
use crate::shape::GroupShape;
use crate::workload::Workload;
use hpfsdp_plan::Tier;
use hpfsdp_plan::program::{CollectiveOp, MemoryEffect, OpSpan, Payload, StepProgram, Stream};
use serde::{Deserialize, Serialize};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

/// Switches of one simulation run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SimOptions {
    /// Add the profile's validation-mode dispatch cost to every kernel and collective launch.
    pub validation_mode: bool,
    /// Keep per-op spans of every simulated rank in the result's timeline.
    pub record_timeline: bool,
    /// Keep the memory-over-time series of every simulated rank.
    pub record_memory_series: bool,
    /// Tokens processed per step by the whole job (gives tokens/s).
    pub tokens_per_step: Option<u64>,
    /// Model FLOPs per step of the whole job, recompute excluded (gives MFU).
    pub model_flops_per_step: Option<f64>,
}

impl Default for SimOptions {
    fn default() -> Self {
        Self {
            validation_mode: false,
            record_timeline: true,
            record_memory_series: true,
            tokens_per_step: None,
            model_flops_per_step: None,
        }
    }
}

/// Simulates one step of `workload` on `profile`.
pub fn simulate(
    workload: &Workload,
    profile: &HardwareProfile,
    options: &SimOptions,
) -> Result<SimResult, SimError> {
    let mut engine = Engine::new(workload, profile, options)?;
    engine.run()?;
    let events = engine.events;
    let outcomes = engine.outcomes();
    Ok(assemble(workload, profile, options, outcomes, events))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    HostDone { unit: u32, op: u32 },
    OpDone { unit: u32, op: u32 },
    Latency { inst: u32 },
    Transfer { inst: u32, version: u64 },
}

const HOST: u16 = u16::MAX;

#[derive(Debug, Clone, Copy)]
enum Exec {
    Device { duration_ns: u64 },
    Collective { slot: u32, c: CollectiveOp },
    Host { duration_ns: u64 },
}

/// Everything the engine touches per op, in one place for cache locality.
#[derive(Debug, Clone, Copy)]
struct OpRt {
    host_ns: u64,
    exec: Exec,
    deps_left: u32,
    /// Launch-order index of a collective on its communicator.
    seq: u32,
    stream: u16,
    /// Range of this op's memory effects in `UnitRt::memory`.
    mem_start: u32,
    mem_end: u32,
    launched: bool,
    done: bool,
}

#[derive(Debug, Clone, Default)]
struct StreamRt {
    queue: Vec<u32>,
    head: usize,
    busy: bool,
}

struct UnitRt<'a> {
    program: &'a StepProgram,
    ops: Vec<OpRt>,
    memory: Vec<MemoryEffect>,
    dep_offsets: Vec<usize>,
    dependents: Vec<u32>,
    spans: Vec<OpSpan>,
    streams: Vec<StreamRt>,
    host_next: usize,
    host_busy: bool,
    host_busy_ns: u64,
    /// Per local group: communicator key.
    group_key: Vec<u32>,
    /// Per local group: shape on the topology.
    group_shape: Vec<GroupShape>,
    seq: Vec<u32>,
    mem: MemoryTracker,
}

struct CommKey {
    label: String,
    units: Vec<u32>,
}

struct Instance {
    key: u32,
    arrivals: Vec<(u32, u32)>,
    max_in: u64,
    max_out: u64,
    aligned: bool,
    phases: Vec<(Tier, u64, u64)>,
    phase: usize,
}

struct Engine<'a> {
    profile: &'a HardwareProfile,
    /// What-if faults (crate::whatif), `None` when the run has none.
    whatif: Option<&'a crate::whatif::WhatIfModel>,
    units: Vec<UnitRt<'a>>,
    keys: Vec<CommKey>,
    pending: HashMap<(u32, u32), u32>,
    instances: Vec<Instance>,
    net: Network,
    heap: BinaryHeap<Reverse<(u64, u64, Event)>>,
    seq: u64,
    events: u64,
}

fn ns(seconds: f64) -> u64 {
    (seconds * 1e9).round().max(0.0) as u64
}

impl<'a> Engine<'a> {
    fn new(
        workload: &'a Workload,
        profile: &'a HardwareProfile,
        options: &SimOptions,
    ) -> Result<Self, SimError> {
        let cal = &profile.calibration;
        let validation_us = if options.validation_mode {
            cal.validation_dispatch_us_per_op
        } else {
            0.0
        };
        let kernel_host_us = cal.host_launch_us_per_kernel + validation_us;
        let coll_host_ns = ns((cal.host_launch_us_per_collective + validation_us) * 1e-6);
        let mut key_ids: HashMap<(String, usize, Vec<u32>), u32> = HashMap::new();
        let mut keys: Vec<CommKey> = Vec::new();
        let mut units = Vec::with_capacity(workload.units.len());
        for unit in &workload.units {
            let program = &unit.program;
            let n = program.ops.len();
            // Communicators of the local groups.
            let mut group_key = Vec::with_capacity(program.groups.len());
            let mut group_shape = Vec::with_capacity(program.groups.len());
            let mut group_slot = Vec::with_capacity(program.groups.len());
            let mut slot_keys: Vec<u32> = Vec::new();
            for g in &program.groups {
                let mut members: Vec<u32> =
                    g.ranks.iter().map(|&r| workload.rank_unit[r]).collect();
                members.sort_unstable();
                members.dedup();
                let k = (g.label.clone(), g.ranks.len(), members);
                let id = match key_ids.get(&k) {
                    Some(&id) => id,
                    None => {
                        let id = keys.len() as u32;
                        keys.push(CommKey {
                            label: k.0.clone(),
                            units: k.2.clone(),
                        });
                        key_ids.insert(k, id);
                        id
                    }
                };
                group_key.push(id);
                group_shape.push(GroupShape::of(&g.ranks, &workload.topology));
                let slot = match slot_keys.iter().position(|&s| s == id) {
                    Some(s) => s,
                    None => {
                        slot_keys.push(id);
                        slot_keys.len() - 1
                    }
                };
                group_slot.push(slot as u32);
            }
            // Streams, in order of first use.
            let mut stream_ids: Vec<Stream> = Vec::new();
            let mut streams: Vec<StreamRt> = Vec::new();
            let mut ops = Vec::with_capacity(n);
            let mut memory: Vec<MemoryEffect> = Vec::new();
            for op in &program.ops {
                let stream = if op.stream == Stream::Host {
                    HOST
                } else {
                    let s = match stream_ids.iter().position(|&s| s == op.stream) {
                        Some(s) => s,
                        None => {
                            stream_ids.push(op.stream);
                            streams.push(StreamRt::default());
                            stream_ids.len() - 1
                        }
                    };
                    streams[s].queue.push(op.id.0);
                    s as u16
                };
                let (host_ns, exec) = match &op.payload {
                    Payload::Compute(w) => (
                        ns(w.kernels as f64 * kernel_host_us * 1e-6),
                        Exec::Device {
                            duration_ns: ns(compute_work_s(w, &program.kernel_mixes, profile)
                                // what-if hook: slow rank x jitter (crate::whatif).
                                * workload.whatif.as_ref().map_or(1.0, |m| {
                                    m.compute_scale(program.rank, op.id.index())
                                })),
                        },
                    ),
                    Payload::Copy(w) => (
                        ns(w.kernels as f64 * kernel_host_us * 1e-6),
                        Exec::Device {
                            duration_ns: ns(copy_s(w.bytes, w.kernels, profile)),
                        },
                    ),
                    Payload::Collective(c) => (
                        coll_host_ns,
                        Exec::Collective {
                            slot: group_slot[c.group.index()],
                            c: *c,
                        },
                    ),
                    Payload::Host { duration_ns } => (
                        *duration_ns,
                        Exec::Host {
                            duration_ns: *duration_ns,
                        },
                    ),
                };
                ops.push(OpRt {
                    host_ns,
                    exec,
                    deps_left: op.deps.len() as u32,
                    seq: 0,
                    stream,
                    mem_start: memory.len() as u32,
                    mem_end: (memory.len() + op.memory.len()) as u32,
                    launched: false,
                    done: false,
                });
                memory.extend_from_slice(&op.memory);
            }
            if streams.len() >= HOST as usize {
                return Err(SimError::Workload(format!(
                    "rank {} uses {} streams; at most {} are supported",
                    program.rank,
                    streams.len(),
                    HOST
                )));
            }
            // Reverse dependency lists (CSR).
            let mut counts = vec![0usize; n + 1];
            for op in &program.ops {
                for d in &op.deps {
                    counts[d.index() + 1] += 1;
                }
            }
            for i in 0..n {
                counts[i + 1] += counts[i];
            }
            let mut fill = counts.clone();
            let mut dependents = vec![0u32; counts[n]];
            for op in &program.ops {
                for d in &op.deps {
                    dependents[fill[d.index()]] = op.id.0;
                    fill[d.index()] += 1;
                }
            }
            units.push(UnitRt {
                program,
                ops,
                memory,
                dep_offsets: counts,
                dependents,
                spans: program
                    .ops
                    .iter()
                    .map(|o| OpSpan {
                        op: o.id,
                        start_ns: 0,
                        end_ns: 0,
                        launched_ns: None,
                        transfer_start_ns: None,
                    })
                    .collect(),
                streams,
                host_next: 0,
                host_busy: false,
                host_busy_ns: 0,
                group_key,
                group_shape,
                seq: vec![0; slot_keys.len()],
                mem: MemoryTracker::new(&program.resident, options.record_memory_series),
            });
        }
        Ok(Self {
            profile,
            whatif: workload.whatif.as_ref(),
            net: Network::new(units.len()),
            units,
            keys,
            pending: HashMap::new(),
            instances: Vec::new(),
            heap: BinaryHeap::new(),
            seq: 0,
            events: 0,
        })
    }

    fn push(&mut self, time: u64, event: Event) {
        self.seq += 1;
        self.heap.push(Reverse((time, self.seq, event)));
    }

    fn run(&mut self) -> Result<(), SimError> {
        for u in 0..self.units.len() {
            self.host_advance(u, 0);
        }
        while let Some(Reverse((now, _, event))) = self.heap.pop() {
            match event {
                Event::HostDone { unit, op } => {
                    self.events += 1;
                    self.host_done(unit as usize, op as usize, now)?;
                }
                Event::OpDone { unit, op } => {
                    self.events += 1;
                    self.op_done(unit as usize, op as usize, now)?;
                }
                Event::Latency { inst } => {
                    self.events += 1;
                    self.start_transfer(inst, now)?;
                }
                Event::Transfer { inst, version } => {
                    if self.net.is_current(inst, version) {
                        self.events += 1;
                        let finishes = self.net.finish(inst, now);
                        self.schedule_transfers(finishes);
                        self.instances[inst as usize].phase += 1;
                        self.begin_phase(inst, now)?;
                    }
                }
            }
        }
        self.check_finished()
    }

    fn host_advance(&mut self, u: usize, now: u64) {
        let unit = &mut self.units[u];
        if unit.host_busy || unit.host_next >= unit.ops.len() {
            return;
        }
        let op = unit.host_next;
        let st = unit.ops[op];
        let end = match st.exec {
            Exec::Host { duration_ns } => {
                if unit.ops[op].deps_left > 0 {
                    return; // resumed by finish_op when the last dependency ends
                }
                unit.spans[op].start_ns = now;
                unit.mem.on_start(
                    now,
                    &unit.memory[st.mem_start as usize..st.mem_end as usize],
                );
                now + duration_ns
            }
            _ => now + st.host_ns,
        };
        unit.host_busy = true;
        unit.host_busy_ns += end - now;
        self.push(
            end,
            Event::HostDone {
                unit: u as u32,
                op: op as u32,
            },
        );
    }

    fn host_done(&mut self, u: usize, op: usize, now: u64) -> Result<(), SimError> {
        let unit = &mut self.units[u];
        unit.host_busy = false;
        unit.host_next += 1;
        unit.spans[op].launched_ns = Some(now);
        let st = unit.ops[op];
        if let Exec::Host { .. } = st.exec {
            unit.spans[op].end_ns = now;
            self.finish_op(u, op, now)?;
        } else {
            // A collective's place on its communicator is fixed by launch order, as in
            // NCCL/HCCL, not by when its stream reaches it.
            if let Exec::Collective { slot, .. } = st.exec {
                unit.ops[op].seq = unit.seq[slot as usize];
                unit.seq[slot as usize] += 1;
            }
            unit.ops[op].launched = true;
            self.try_start(u, st.stream, now)?;
        }
        self.host_advance(u, now);
        Ok(())
    }

    fn try_start(&mut self, u: usize, stream: u16, now: u64) -> Result<(), SimError> {
        let unit = &mut self.units[u];
        let s = &mut unit.streams[stream as usize];
        if s.busy || s.head >= s.queue.len() {
            return Ok(());
        }
        let op = s.queue[s.head] as usize;
        if !unit.ops[op].launched || unit.ops[op].deps_left > 0 {
            return Ok(());
        }
        s.busy = true;
        unit.spans[op].start_ns = now;
        let o = unit.ops[op];
        unit.mem
            .on_start(now, &unit.memory[o.mem_start as usize..o.mem_end as usize]);
        match unit.ops[op].exec {
            Exec::Device { duration_ns } => {
                self.push(
                    now + duration_ns,
                    Event::OpDone {
                        unit: u as u32,
                        op: op as u32,
                    },
                );
                Ok(())
            }
            Exec::Collective { c, .. } => self.arrive(u, op, c, now),
            Exec::Host { .. } => Ok(()),
        }
    }

    fn op_done(&mut self, u: usize, op: usize, now: u64) -> Result<(), SimError> {
        let unit = &mut self.units[u];
        unit.spans[op].end_ns = now;
        let stream = unit.ops[op].stream;
        let s = &mut unit.streams[stream as usize];
        s.busy = false;
        s.head += 1;
        self.finish_op(u, op, now)?;
        self.try_start(u, stream, now)
    }

    fn finish_op(&mut self, u: usize, op: usize, now: u64) -> Result<(), SimError> {
        let unit = &mut self.units[u];
        unit.ops[op].done = true;
        let o = unit.ops[op];
        unit.mem
            .on_end(now, &unit.memory[o.mem_start as usize..o.mem_end as usize]);
        let (a, b) = (unit.dep_offsets[op], unit.dep_offsets[op + 1]);
        for i in a..b {
            let unit = &mut self.units[u];
            let d = unit.dependents[i] as usize;
            unit.ops[d].deps_left -= 1;
            if unit.ops[d].deps_left == 0 {
                let stream = unit.ops[d].stream;
                if stream == HOST {
                    if unit.host_next == d {
                        self.host_advance(u, now);
                    }
                } else {
                    self.try_start(u, stream, now)?;
                }
            }
        }
        Ok(())
    }

    fn collective_of(&self, u: usize, op: usize) -> Option<CollectiveOp> {
        match self.units[u].ops[op].exec {
            Exec::Collective { c, .. } => Some(c),
            _ => None,
        }
    }

    fn arrive(&mut self, u: usize, op: usize, c: CollectiveOp, now: u64) -> Result<(), SimError> {
        let unit = &mut self.units[u];
        let key = unit.group_key[c.group.index()];
        let seq = unit.ops[op].seq;
        let inst = match self.pending.get(&(key, seq)) {
            Some(&i) => i,
            None => {
                let i = self.instances.len() as u32;
                self.instances.push(Instance {
                    key,
                    arrivals: Vec::new(),
                    max_in: 0,
                    max_out: 0,
                    aligned: true,
                    phases: Vec::new(),
                    phase: 0,
                });
                self.pending.insert((key, seq), i);
                i
            }
        };
        let first_arrival = self.instances[inst as usize].arrivals.first().copied();
        if let Some((fu, fop)) = first_arrival
            && let Some(first) = self.collective_of(fu as usize, fop as usize)
            && (first.kind, first.dtype, first.tier) != (c.kind, c.dtype, c.tier)
        {
            let describe = |x: &CollectiveOp| format!("{} of {:?} on {}", x.kind, x.dtype, x.tier);
            return Err(SimError::CollectiveMismatch {
                label: self.keys[key as usize].label.clone(),
                rank: self.units[u].program.rank,
                op: self.units[u].program.ops[op].id,
                found: describe(&c),
                other_rank: self.units[fu as usize].program.rank,
                expected: describe(&first),
            });
        }
        let instance = &mut self.instances[inst as usize];
        instance.arrivals.push((u as u32, op as u32));
        instance.max_in = instance.max_in.max(c.input_bytes);
        instance.max_out = instance.max_out.max(c.output_bytes);
        instance.aligned &= c.aligned_512;
        if instance.arrivals.len() == self.keys[key as usize].units.len() {
            self.pending.remove(&(key, seq));
            // The first arrival's view of the group decides the shape (peers are symmetric).
            let (fu, fop) = instance.arrivals[0];
            let first = self.collective_of(fu as usize, fop as usize).unwrap_or(c);
            let shape = self.units[fu as usize].group_shape[first.group.index()];
            let phases = collective_phases(
                c.kind,
                &shape,
                self.instances[inst as usize].max_in,
                self.instances[inst as usize].max_out,
                self.instances[inst as usize].aligned,
                self.profile,
            );
            // what-if hook: degraded links slow the phase to its slowest member link.
            let ranks = &self.units[fu as usize].program.groups[first.group.index()].ranks;
            let slow = |t| self.whatif.map_or(1.0, |m| m.transfer_scale(t, ranks));
            let phases: Vec<_> = phases
                .iter()
                .map(|p| {
                    (
                        p.tier,
                        ns(p.cost.latency_s),
                        ns(p.cost.transfer_s * slow(p.tier)),
                    )
                })
                .collect();
            self.instances[inst as usize].phases = phases;
            let instance = &mut self.instances[inst as usize];
            for &(pu, pop) in &instance.arrivals {
                self.units[pu as usize].spans[pop as usize].transfer_start_ns = Some(now);
            }
            self.begin_phase(inst, now)?;
        }
        Ok(())
    }

    fn begin_phase(&mut self, inst: u32, now: u64) -> Result<(), SimError> {
        let instance = &self.instances[inst as usize];
        match instance.phases.get(instance.phase) {
            None => self.complete(inst, now),
            Some(&(_, latency, _)) if latency > 0 => {
                self.push(now + latency, Event::Latency { inst });
                Ok(())
            }
            Some(_) => self.start_transfer(inst, now),
        }
    }

    fn start_transfer(&mut self, inst: u32, now: u64) -> Result<(), SimError> {
        let instance = &mut self.instances[inst as usize];
        let Some(&(tier, _, work)) = instance.phases.get(instance.phase) else {
            return self.complete(inst, now);
        };
        if work == 0 {
            instance.phase += 1;
            return self.begin_phase(inst, now);
        }
        let key = instance.key as usize;
        let finishes = self.net.start(inst, &self.keys[key].units, tier, work, now);
        self.schedule_transfers(finishes);
        Ok(())
    }

    fn schedule_transfers(&mut self, finishes: Vec<Finish>) {
        for f in finishes {
            self.push(
                f.time_ns,
                Event::Transfer {
                    inst: f.id,
                    version: f.version,
                },
            );
        }
    }

    fn complete(&mut self, inst: u32, now: u64) -> Result<(), SimError> {
        let arrivals = std::mem::take(&mut self.instances[inst as usize].arrivals);
        self.instances[inst as usize].phases = Vec::new();
        for (u, op) in arrivals {
            self.op_done(u as usize, op as usize, now)?;
        }
        Ok(())
    }

    fn check_finished(&self) -> Result<(), SimError> {
        let mut stuck = Vec::new();
        for unit in &self.units {
            if unit.ops.iter().all(|o| o.done) {
                continue;
            }
            let rank = unit.program.rank;
            let mut why = Vec::new();
            if unit.host_next < unit.ops.len() {
                let op = unit.host_next;
                why.push(format!(
                    "host waits at {} for {}",
                    unit.program.ops[op].id,
                    self.waiting_deps(unit, op)
                ));
            }
            for s in &unit.streams {
                if let Some(&op) = s.queue.get(s.head) {
                    let op = op as usize;
                    let o = &unit.program.ops[op];
                    let reason = if !unit.ops[op].launched {
                        "not launched yet".to_string()
                    } else if unit.ops[op].deps_left > 0 {
                        format!("waiting for {}", self.waiting_deps(unit, op))
                    } else if let Payload::Collective(c) = &o.payload {
                        let g = &unit.program.groups[c.group.index()];
                        format!(
                            "{} on '{}' waiting for peers (ranks {:?}...) that never issue the matching call",
                            c.kind,
                            g.label,
                            g.ranks.iter().take(8).collect::<Vec<_>>()
                        )
                    } else {
                        "running".to_string()
                    };
                    why.push(format!(
                        "stream {} at {}: {}",
                        o.stream.name(),
                        o.id,
                        reason
                    ));
                }
            }
            stuck.push(format!("rank {rank}: {}", why.join("; ")));
            if stuck.len() == 4 {
                break;
            }
        }
        if stuck.is_empty() {
            Ok(())
        } else {
            Err(SimError::Deadlock(stuck.join(" | ")))
        }
    }

    fn waiting_deps(&self, unit: &UnitRt<'_>, op: usize) -> String {
        let deps: Vec<String> = unit.program.ops[op]
            .deps
            .iter()
            .filter(|d| !unit.ops[d.index()].done)
            .map(|d| d.to_string())
            .collect();
        if deps.is_empty() {
            "nothing".into()
        } else {
            deps.join(", ")
        }
    }

    fn outcomes(self) -> Vec<UnitOutcome> {
        self.units
            .into_iter()
            .map(|u| UnitOutcome {
                spans: u.spans,
                host_busy_ns: u.host_busy_ns,
                memory: u.mem.report(),
            })
            .collect()
    }
}

/// Simulates explicit per-rank programs, folding symmetric ranks when `fold` is true.
pub fn simulate_programs(
    programs: Vec<StepProgram>,
    profile: &HardwareProfile,
    fold: bool,
    options: &SimOptions,
) -> Result<SimResult, SimError> {
    let topology = profile.topology_for(programs.len());
    let workload = if fold {
        Workload::folded(programs, topology)?
    } else {
        Workload::unfolded(programs, topology)?
    };
    simulate(&workload, profile, options)
}
