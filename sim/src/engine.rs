//! The discrete-event engine.
//!
//! Per simulated rank there is one **host thread** and one queue per device **stream**:
//! - the host walks the program in issue order; each op costs the host what the host model
//!   ([`crate::host_cost`]) charges its class: kernel and collective launches, plus the op's
//!   extra CPU operator events in validation mode; a host op ([`Stream::Host`]) first waits
//!   until its dependencies have finished on the device, then keeps the host busy for its
//!   duration plus, when it waited on any, the device -> host sync call;
//! - a device stream runs its ops one at a time in issue order; an op starts when the host has
//!   launched it, its stream is free and all its dependencies (on any stream) have finished. A
//!   stream therefore idles when the host falls behind;
//! - a device kernel on a side stream (not the compute stream) that starts while the compute
//!   stream runs a device op first waits for the cores that op's current kernel holds, when
//!   the profile's `device.side_stream_kernels` says they share cores ([`cores`]): its span,
//!   and its stream, stretch by the expected residual of that kernel;
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
//! Time is integer nanoseconds; events are ordered by `(time, sequence number)` in a monotone
//! radix heap ([`queue`]), so runs are deterministic and byte-identical.
//!
//! Layout for speed: the read-only per-op tables (reverse dependencies, memory effects,
//! collectives, stream queues) are shared by units of the same shape ([`statics`]), the
//! per-op runtime state is 40 bytes, pending rendezvous are looked up per communicator
//! without hashing ([`pending`]), and nothing is allocated per event except a collective
//! instance's arrival and phase lists.

use crate::cost::collective_phases;
use crate::error::SimError;
use crate::host_cost::HostCosts;
use crate::memory::MemoryTracker;
use crate::net::{Finish, Network};
use crate::profile::{HardwareProfile, SideStreamKernels};
use crate::result::{SimResult, UnitOutcome, assemble, critical_unit};
use crate::shape::GroupShape;
use crate::workload::Workload;
use hpfsdp_program::step::{CollectiveOp, Op, OpId, OpSpan, Payload, StepProgram, Stream};
use rustc_hash::FxHashMap as HashMap;
use std::cmp::Reverse;

mod compute_memo;
mod cores;
mod entry;
mod fork;
mod instances;
mod launches;
mod pending;
mod queue;
mod statics;
mod streams;
mod twins;

use compute_memo::ComputeMemo;
use instances::{Instance, Instances};
use launches::{HostRt, Launch};
use pending::Pending;
use queue::EventQueue;
use statics::{StaticsInterner, UnitStatics};
use std::sync::Arc;
use streams::{Positions, StreamPos};

pub use crate::sim_options::SimOptions;
pub use entry::{simulate, simulate_programs};

/// Simulates one step of `workload` on `profile`, every unit on its own from the first op
/// (the reference [`simulate`] is checked against).
pub fn simulate_unshared(
    workload: &Workload,
    profile: &HardwareProfile,
    options: &SimOptions,
) -> Result<SimResult, SimError> {
    let specs: Vec<UnitSpec<'_>> = workload
        .units
        .iter()
        .map(|u| UnitSpec {
            program: &u.program,
            base: 0,
            end: u.program.ops.len(),
        })
        .collect();
    let mut engine = Engine::new(&specs, &workload.rank_unit, workload, profile, options)?;
    engine.start();
    engine.drain()?;
    engine.check_finished()?;
    let events = engine.events;
    let ends: Vec<u64> = engine.units.iter().map(|u| last_end(&u.ops)).collect();
    let keep = kept_units(workload, &ends, options);
    let outcomes = engine.outcomes(&ends, &keep);
    Ok(assemble(workload, profile, options, outcomes, events))
}

/// Latest end over the spans of `ops` (0 when empty).
fn last_end(ops: &[OpRt]) -> u64 {
    ops.iter().map(|o| o.span.end_ns).max().unwrap_or(0)
}

/// A time of a [`SpanRt`] not known (yet): `None` in the [`OpSpan`] it becomes.
const UNSET: u64 = u64::MAX;

/// An op's times while the run lasts: an [`OpSpan`] without its op id (the program's op at
/// the unit's `base` plus the index) and with [`UNSET`] for an unknown time, 32 bytes per op
/// instead of 56 (every op of every simulated unit has one, in its [`OpRt`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct SpanRt {
    start_ns: u64,
    end_ns: u64,
    launched_ns: u64,
    transfer_start_ns: u64,
}

impl SpanRt {
    /// Nothing known yet.
    const NEW: SpanRt = SpanRt {
        start_ns: 0,
        end_ns: 0,
        launched_ns: UNSET,
        transfer_start_ns: UNSET,
    };

    /// The span of op `op` with these times.
    fn span(self, op: OpId) -> OpSpan {
        let known = |t: u64| (t != UNSET).then_some(t);
        OpSpan {
            op,
            start_ns: self.start_ns,
            end_ns: self.end_ns,
            launched_ns: known(self.launched_ns),
            transfer_start_ns: known(self.transfer_start_ns),
        }
    }
}

/// The [`OpSpan`]s of `ops`, the times of `program`'s ops from `base` on.
fn op_spans(program: &StepProgram, base: usize, ops: &[OpRt]) -> Vec<OpSpan> {
    program
        .ops
        .iter_from(base)
        .zip(ops)
        .map(|(op, o)| o.span.span(op.id))
        .collect()
}

/// Which units' spans the result needs: all of them, or (see [`SimOptions::all_ranks`]) the
/// critical unit's and rank 0's.
fn kept_units(workload: &Workload, ends: &[u64], options: &SimOptions) -> Vec<bool> {
    if options.all_ranks {
        return vec![true; ends.len()];
    }
    let mut keep = vec![false; ends.len()];
    if let Some(c) = critical_unit(workload, ends) {
        keep[c] = true;
    }
    if let Some(&u) = workload.rank_unit.first() {
        keep[u as usize] = true;
    }
    keep
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
    Device {
        duration_ns: u64,
        /// Expected wait of a side-stream kernel that arrives while this op runs on the
        /// compute stream ([`cores::side_wait_s`] for vector side kernels); 0 for other ops
        /// and without core sharing.
        side_wait_ns: u32,
        /// The op has cube work ([`cores::uses_cube_cores`]): on a side stream it waits for
        /// every compute kernel, not only those holding vector cores.
        uses_cube: bool,
    },
    /// `coll`: index into the unit's [`UnitStatics::collective`] table (kept out of the
    /// per-op state so that it stays small); `slot`: the launch-order counter of its
    /// communicator; `seq`: its launch-order index there, set when the host launches it.
    Collective { slot: u32, coll: u32, seq: u32 },
    /// A host op: it keeps the host busy for its launch's host cost ([`Launch::host_ns`]).
    Host,
}

/// Everything the engine touches per op, in one place and one cache line: the engine
/// interleaves hundreds of units in time, so an event finds its unit's state out of cache,
/// and one line per op (its times included) is one miss instead of two.
#[derive(Debug, Clone, Copy)]
#[repr(align(64))]
struct OpRt {
    span: SpanRt,
    exec: Exec,
    deps_left: u32,
    stream: u16,
    done: bool,
}

impl OpRt {
    /// Launch-order index of a collective on its communicator (0 for other ops).
    fn seq(&self) -> u32 {
        match self.exec {
            Exec::Collective { seq, .. } => seq,
            _ => 0,
        }
    }

    /// Sets the launch-order index of a collective (nothing for other ops).
    fn set_seq(&mut self, to: u32) {
        if let Exec::Collective { seq, .. } = &mut self.exec {
            *seq = to;
        }
    }
}

/// Which ops of a program a unit simulates: `base..end` (all of them, except while a shared
/// prefix is simulated, or after a fork, when the ops before `base` are done).
#[derive(Debug, Clone, Copy)]
struct UnitSpec<'a> {
    program: &'a StepProgram,
    base: usize,
    end: usize,
}

/// One simulated unit. Op indices are local: local op `i` is program op `base + i`.
///
/// Laid out in declaration order from a cache-line boundary: the fields every event reads
/// (op state, stream positions, launch table, host) share the first three lines.
#[repr(C, align(64))]
struct UnitRt<'a> {
    ops: Vec<OpRt>,
    /// Device streams' positions (local stream index order).
    streams: Positions,
    /// Per local op: what its launch costs the host and where it goes ([`launches`]).
    launches: Vec<Launch>,
    /// The host thread: issue position, busy time, pending launches.
    host: HostRt,
    /// Local index of [`Stream::Compute`] in `streams` ([`HOST`] when the unit has none).
    compute_stream: u16,
    /// Ops finished (the unit is done when this reaches `ops.len()`).
    finished: usize,
    /// Reverse dependencies, memory effects, collectives and stream queues, shared by units
    /// of the same shape.
    statics: Arc<UnitStatics>,
    program: &'a StepProgram,
    base: usize,
    stream_ids: Vec<Stream>,
    /// Per local group: communicator key.
    group_key: Vec<u32>,
    /// Per local group: shape on the topology.
    group_shape: Vec<GroupShape>,
    /// Per local group: launch-order counter slot.
    group_slot: Vec<u32>,
    seq: Vec<u32>,
    mem: MemoryTracker,
}

impl UnitRt<'_> {
    /// Local ops of device stream `s`, in issue order.
    #[inline]
    fn queue(&self, s: u16) -> &[u32] {
        &self.statics.queues()[s as usize]
    }

    /// How long a side-stream kernel that becomes ready at `now` waits for the cores the
    /// compute stream's running device op holds ([`cores::core_wait_ns`]); 0 when the
    /// compute stream is idle or runs a collective. `side_uses_cube`: the side op has cube
    /// work, so its expected wait is recomputed over every kernel of the compute op (rare:
    /// optimizer-stream GEMMs), with the op's what-if scale.
    fn core_wait_ns(
        &self,
        now: u64,
        side_uses_cube: bool,
        profile: &HardwareProfile,
        whatif: Option<&crate::whatif::WhatIfModel>,
    ) -> u64 {
        if self.compute_stream as usize >= self.streams.len() {
            return 0;
        }
        let s = self.streams.get(self.compute_stream);
        if !s.busy() || profile.device.side_stream_kernels == SideStreamKernels::Concurrent {
            return 0;
        }
        let op = self.queue(self.compute_stream)[s.head()] as usize;
        let Exec::Device {
            duration_ns,
            side_wait_ns,
            ..
        } = self.ops[op].exec
        else {
            return 0;
        };
        let wait_ns = match &self.program.ops[self.base + op].payload {
            Payload::Compute(w)
                if side_uses_cube
                    && profile.device.side_stream_kernels
                        == SideStreamKernels::WaitForVectorCores =>
            {
                let scale =
                    whatif.map_or(1.0, |m| m.compute_scale(self.program.rank, self.base + op));
                ns(cores::side_wait_s(w, &self.program.kernel_mixes, profile, true) * scale)
            }
            _ => u64::from(side_wait_ns),
        };
        cores::core_wait_ns(now, self.ops[op].span.start_ns, duration_ns, wait_ns)
    }
}

/// What a unit's set-up computes per op (the part [`twins`] copy).
struct OpTables {
    ops: Vec<OpRt>,
    launches: Vec<Launch>,
    statics: Arc<UnitStatics>,
    stream_ids: Vec<Stream>,
}

impl UnitRt<'_> {
    /// Whether `try_start` on `stream` starts an op right after op `op` (on that stream) was
    /// launched: the stream is free and its head is launched with every dependency done
    /// (a launch that starts nothing is left pending, [`launches`]).
    #[inline]
    fn launch_starts(&self, op: usize, stream: u16) -> bool {
        let s = self.streams.get(stream);
        if s.busy() {
            return false;
        }
        match self.queue(stream).get(s.head()) {
            Some(&head) if head as usize == op => self.ops[op].deps_left == 0,
            Some(&head) => {
                (head as usize) < self.host.next && self.ops[head as usize].deps_left == 0
            }
            None => false,
        }
    }

    /// Records the launch of op `op` at `at_ns` as pending ([`launches`]).
    #[inline]
    fn defer_launch(&mut self, op: usize, at_ns: u64) {
        self.host.defer(op, at_ns, self.launches[op].host_ns);
    }

    /// Writes the pending launches before op `upto` into their ops, in launch order.
    fn apply_launches(&mut self, upto: usize) {
        while let Some((op, t)) = self.host.next_pending(upto, &self.launches) {
            self.write_launch(op, t);
        }
    }

    /// Applies the launch of op `op` (the first not applied) at `at_ns`.
    #[inline]
    fn launch(&mut self, op: usize, at_ns: u64) {
        self.host.applied(op);
        self.write_launch(op, at_ns);
    }

    /// Writes a launch into op `op`'s state: its launch time and, for a collective, its
    /// launch-order index on its communicator.
    #[inline]
    fn write_launch(&mut self, op: usize, at_ns: u64) {
        let o = &mut self.ops[op];
        o.span.launched_ns = at_ns;
        if let Exec::Collective { slot, seq, .. } = &mut o.exec {
            *seq = self.seq[*slot as usize];
            self.seq[*slot as usize] += 1;
        }
    }

    /// Applies every pending launch.
    fn apply_all_launches(&mut self) {
        self.apply_launches(self.host.next);
    }
}

/// The per-op runtime state stays one cache line: it is touched on every event.
const _: () = assert!(std::mem::size_of::<OpRt>() == 64);

struct CommKey {
    label: String,
    units: Vec<u32>,
}

/// The fork triggers of a shared-prefix run ([`crate::share::SharePlan`]).
struct Gates<'a> {
    gates: &'a [Vec<bool>],
    free_root: &'a [bool],
}

struct Engine<'a> {
    profile: &'a HardwareProfile,
    /// What-if faults (crate::whatif), `None` when the run has none.
    whatif: Option<&'a crate::whatif::WhatIfModel>,
    units: Vec<UnitRt<'a>>,
    keys: Vec<CommKey>,
    /// Per communicator: its number of units (dense, read on every arrival).
    key_members: Vec<u32>,
    pending: Pending,
    instances: Instances,
    /// Reused buffer of new transfer finish times ([`Network::start_into`]).
    finishes: Vec<Finish>,
    net: Network,
    heap: EventQueue<Event>,
    seq: u64,
    events: u64,
    /// Time of the last event processed.
    now: u64,
    gates: Option<Gates<'a>>,
    /// Set when a gate fires: [`Engine::drain`] stops after the current event.
    fork: bool,
}

fn ns(seconds: f64) -> u64 {
    (seconds * 1e9).round().max(0.0) as u64
}

/// Communicator keys of a unit's groups: (label, size, units of its ranks) interned.
struct KeyTable {
    ids: HashMap<(String, usize, Vec<u32>), u32>,
    keys: Vec<CommKey>,
}

impl KeyTable {
    fn id(&mut self, label: &str, size: usize, members: Vec<u32>) -> u32 {
        let k = (label.to_string(), size, members);
        if let Some(&id) = self.ids.get(&k) {
            return id;
        }
        let id = self.keys.len() as u32;
        self.keys.push(CommKey {
            label: k.0.clone(),
            units: k.2.clone(),
        });
        self.ids.insert(k, id);
        id
    }
}

/// Communicators of a unit's groups ([`unit_groups`]).
struct UnitGroups {
    /// Per local group: communicator key.
    key: Vec<u32>,
    /// Per local group: shape on the topology.
    shape: Vec<GroupShape>,
    /// Per local group: launch-order counter slot (groups on one communicator share one).
    slot: Vec<u32>,
    /// Number of slots.
    slots: usize,
}

/// The communicators of `program`'s groups: (label, size, units of its ranks) interned in
/// `table`.
fn unit_groups(
    program: &StepProgram,
    rank_unit: &[u32],
    workload: &Workload,
    table: &mut KeyTable,
) -> UnitGroups {
    let n = program.groups.len();
    let (mut key, mut shape, mut slot) = (
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
    );
    let mut slot_keys: Vec<u32> = Vec::new();
    for g in &program.groups {
        let mut members: Vec<u32> = g.ranks.iter().map(|&r| rank_unit[r]).collect();
        members.sort_unstable();
        members.dedup();
        let id = table.id(&g.label, g.ranks.len(), members);
        key.push(id);
        shape.push(GroupShape::of(&g.ranks, &workload.topology));
        let s = match slot_keys.iter().position(|&s| s == id) {
            Some(s) => s,
            None => {
                slot_keys.push(id);
                slot_keys.len() - 1
            }
        };
        slot.push(s as u32);
    }
    UnitGroups {
        key,
        shape,
        slot,
        slots: slot_keys.len(),
    }
}

/// Where an op sits, for [`op_exec`]: its program, its index in it, the launch-order slot of
/// each group, and the count of collectives before it (advanced for a collective).
struct OpPlace<'p> {
    program: &'p StepProgram,
    index: usize,
    group_slot: &'p [u32],
    collectives: &'p mut u32,
    /// Compute costs already worked out in this engine's set-up.
    memo: &'p mut ComputeMemo,
}

/// An op's host cost ([`HostCosts::op_ns`]) and what it does on the device, in nanoseconds.
fn op_exec(
    op: &Op,
    place: OpPlace<'_>,
    workload: &Workload,
    profile: &HardwareProfile,
    costs: &HostCosts,
) -> (u64, Exec) {
    let program = place.program;
    let host_ns = costs.op_ns(op);
    let exec = match &op.payload {
        Payload::Compute(w) => {
            // what-if hook: slow rank x jitter (crate::whatif), keyed by the op's index in
            // the whole program.
            let scale = workload
                .whatif
                .as_ref()
                .map_or(1.0, |m| m.compute_scale(program.rank, place.index));
            let on_compute = op.stream == Stream::Compute;
            let cost = place
                .memo
                .cost(w, on_compute, &program.kernel_mixes, profile);
            Exec::Device {
                duration_ns: ns(cost.work_s * scale),
                side_wait_ns: u32::try_from(ns(cost.side_wait_s * scale)).unwrap_or(u32::MAX),
                uses_cube: cost.uses_cube,
            }
        }
        Payload::Copy(w) => Exec::Device {
            duration_ns: ns(crate::cost::copy_work_s(w, profile)),
            side_wait_ns: 0,
            uses_cube: false,
        },
        Payload::Collective(c) => {
            *place.collectives += 1;
            Exec::Collective {
                slot: place.group_slot[c.group.index()],
                coll: *place.collectives - 1,
                seq: 0,
            }
        }
        // The host is busy for the whole host cost (duration, sync call, validation events).
        Payload::Host { .. } => Exec::Host,
    };
    (host_ns, exec)
}

impl<'a> Engine<'a> {
    fn new(
        specs: &[UnitSpec<'a>],
        rank_unit: &[u32],
        workload: &'a Workload,
        profile: &'a HardwareProfile,
        options: &SimOptions,
    ) -> Result<Self, SimError> {
        let costs = HostCosts::of(profile, options.validation_mode);
        let mut table = KeyTable {
            ids: HashMap::default(),
            keys: Vec::new(),
        };
        let mut interner = StaticsInterner::default();
        let mut memo = ComputeMemo::default();
        // Units set up so far by the identity of their ops ([`twins`]).
        let mut seen: HashMap<twins::OpsIdentity, usize> = HashMap::default();
        let mut units: Vec<UnitRt<'a>> = Vec::with_capacity(specs.len());
        for spec in specs {
            let id = twins::OpsIdentity::of(spec.program, spec.base, spec.end);
            let twin = match workload.whatif {
                None => seen.get(&id).map(|&u| &units[u]),
                Some(_) => None,
            };
            let unit = Self::unit(
                (*spec, twin),
                rank_unit,
                workload,
                (&mut table, &mut interner, &mut memo),
                profile,
                &costs,
                options,
            )?;
            seen.entry(id).or_insert(units.len());
            units.push(unit);
        }
        let keys_len = table.keys.len();
        Ok(Self {
            profile,
            whatif: workload.whatif.as_ref(),
            net: Network::new(units.len()),
            units,
            key_members: table.keys.iter().map(|k| k.units.len() as u32).collect(),
            keys: table.keys,
            pending: Pending::new(keys_len),
            instances: Instances::default(),
            finishes: Vec::new(),
            heap: EventQueue::new(),
            seq: 0,
            events: 0,
            now: 0,
            gates: None,
            fork: false,
        })
    }

    /// The runtime state of one unit at the start of the step; its per-op tables are copied
    /// from `twin`, an earlier unit with the same ops ([`twins`]), when its groups map to
    /// the same launch-order slots.
    fn unit(
        (spec, twin): (UnitSpec<'a>, Option<&UnitRt<'a>>),
        rank_unit: &[u32],
        workload: &Workload,
        (table, interner, memo): (&mut KeyTable, &mut StaticsInterner, &mut ComputeMemo),
        profile: &HardwareProfile,
        costs: &HostCosts,
        options: &SimOptions,
    ) -> Result<UnitRt<'a>, SimError> {
        let (program, base) = (spec.program, spec.base);
        let UnitGroups {
            key: group_key,
            shape: group_shape,
            slot: group_slot,
            slots,
        } = unit_groups(program, rank_unit, workload, table);
        let tables = match twin.filter(|t| t.group_slot == group_slot) {
            Some(t) => OpTables {
                ops: t.ops.clone(),
                launches: t.launches.clone(),
                statics: Arc::clone(&t.statics),
                stream_ids: t.stream_ids.clone(),
            },
            None => Self::op_tables(
                spec,
                &group_slot,
                (interner, memo),
                workload,
                profile,
                costs,
            )?,
        };
        let OpTables {
            ops,
            launches,
            statics,
            stream_ids,
        } = tables;
        let streams = Positions::new(statics.queues().len());
        Ok(UnitRt {
            program,
            base,
            ops,
            statics,
            launches,
            compute_stream: stream_ids
                .iter()
                .position(|&s| s == Stream::Compute)
                .map_or(HOST, |s| s as u16),
            stream_ids,
            streams,
            host: HostRt::default(),
            finished: 0,
            group_key,
            group_shape,
            group_slot,
            seq: vec![0; slots],
            mem: MemoryTracker::new(&program.resident, options.record_memory_series),
        })
    }

    /// The per-op tables of unit `spec` whose groups use launch-order slots `group_slot`.
    fn op_tables(
        spec: UnitSpec<'a>,
        group_slot: &[u32],
        (interner, memo): (&mut StaticsInterner, &mut ComputeMemo),
        workload: &Workload,
        profile: &HardwareProfile,
        costs: &HostCosts,
    ) -> Result<OpTables, SimError> {
        let program = spec.program;
        let (base, end) = (spec.base, spec.end);
        let ops_of = program.ops.slice(base..end);
        // Streams, in order of first use.
        let mut stream_ids: Vec<Stream> = Vec::new();
        let mut queues: Vec<Vec<u32>> = Vec::new();
        let mut ops = Vec::with_capacity(ops_of.len());
        let mut launches = Vec::with_capacity(ops_of.len());
        let mut collectives = 0u32;
        for (i, op) in ops_of.iter().enumerate() {
            let stream = if op.stream == Stream::Host {
                HOST
            } else {
                let s = match stream_ids.iter().position(|&s| s == op.stream) {
                    Some(s) => s,
                    None => {
                        stream_ids.push(op.stream);
                        queues.push(Vec::new());
                        stream_ids.len() - 1
                    }
                };
                queues[s].push(i as u32);
                s as u16
            };
            let (host_ns, exec) = op_exec(
                op,
                OpPlace {
                    program,
                    index: base + i,
                    group_slot,
                    collectives: &mut collectives,
                    memo,
                },
                workload,
                profile,
                costs,
            );
            ops.push(OpRt {
                span: SpanRt::NEW,
                exec,
                deps_left: op.deps.iter().filter(|d| d.index() >= base).count() as u32,
                stream,
                done: false,
            });
            launches.push(Launch { host_ns, stream });
        }
        if queues.len() >= HOST as usize {
            return Err(SimError::Workload(format!(
                "rank {} uses {} streams; at most {} are supported",
                program.rank,
                queues.len(),
                HOST
            )));
        }
        let statics = interner.intern(UnitStatics::of(ops_of, base, queues));
        Ok(OpTables {
            ops,
            launches,
            statics,
            stream_ids,
        })
    }

    #[inline]
    fn push(&mut self, time: u64, event: Event) {
        self.seq += 1;
        self.heap.push(Reverse((time, self.seq, event)));
    }

    /// Every unit's host starts issuing at time 0.
    fn start(&mut self) {
        for u in 0..self.units.len() {
            self.host_advance(u, 0);
        }
    }

    /// Processes events until none is left or a fork gate fires.
    fn drain(&mut self) -> Result<(), SimError> {
        while !self.fork {
            let Some(Reverse((now, _, event))) = self.heap.pop() else {
                break;
            };
            self.now = now;
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
                        let mut finishes = std::mem::take(&mut self.finishes);
                        self.net.finish_into(inst, now, &mut finishes);
                        self.schedule_transfers(finishes);
                        self.instances[inst as usize].phase += 1;
                        self.begin_phase(inst, now)?;
                    }
                }
            }
        }
        for unit in &mut self.units {
            unit.apply_all_launches();
        }
        Ok(())
    }

    fn host_advance(&mut self, u: usize, now: u64) {
        let unit = &mut self.units[u];
        if unit.host.busy {
            return;
        }
        if unit.host.next >= unit.ops.len() {
            if unit.host.stop_ns.is_none() {
                unit.host.stop_ns = Some(now);
                if self.gates.as_ref().is_some_and(|g| g.free_root[u]) {
                    self.fork = true;
                }
            }
            return;
        }
        let op = unit.host.next;
        let launch = unit.launches[op];
        if launch.stream == HOST {
            // A host op runs for its whole host cost once its dependencies are done.
            if unit.ops[op].deps_left > 0 {
                return; // resumed by finish_op when the last dependency ends
            }
            unit.ops[op].span.start_ns = now;
            unit.mem.alloc(now, unit.statics.allocs(op));
        }
        let end = now + launch.host_ns;
        unit.host.busy = true;
        unit.host.busy_ns += launch.host_ns;
        self.push(
            end,
            Event::HostDone {
                unit: u as u32,
                op: op as u32,
            },
        );
    }

    /// The host finished launching op `op` (or running host op `op`). A launch that starts
    /// nothing is left pending ([`launches`]).
    fn host_done(&mut self, u: usize, op: usize, now: u64) -> Result<(), SimError> {
        let unit = &mut self.units[u];
        unit.host.busy = false;
        unit.host.next += 1;
        let stream = unit.launches[op].stream;
        if stream == HOST {
            unit.apply_launches(op);
            unit.launch(op, now);
            unit.ops[op].span.end_ns = now;
            self.finish_op(u, op, now)?;
        } else if unit.launch_starts(op, stream) {
            // A collective's place on its communicator is fixed by launch order, as in
            // NCCL/HCCL, not by when its stream reaches it.
            unit.apply_launches(op);
            unit.launch(op, now);
            self.try_start(u, stream, now)?;
        } else {
            unit.defer_launch(op, now);
        }
        self.host_advance(u, now);
        Ok(())
    }

    fn try_start(&mut self, u: usize, stream: u16, now: u64) -> Result<(), SimError> {
        let unit = &mut self.units[u];
        let s = unit.streams.get(stream);
        let Some(&op) = unit.queue(stream).get(s.head()).filter(|_| !s.busy()) else {
            return Ok(());
        };
        let op = op as usize;
        if op >= unit.host.next || unit.ops[op].deps_left > 0 {
            return Ok(());
        }
        unit.streams.set(stream, StreamPos::new(s.head(), true));
        unit.ops[op].span.start_ns = now;
        unit.mem.alloc(now, unit.statics.allocs(op));
        match unit.ops[op].exec {
            Exec::Device {
                duration_ns,
                uses_cube,
                ..
            } => {
                let wait_ns = if stream == unit.compute_stream {
                    0
                } else {
                    unit.core_wait_ns(now, uses_cube, self.profile, self.whatif)
                };
                self.push(
                    now + wait_ns + duration_ns,
                    Event::OpDone {
                        unit: u as u32,
                        op: op as u32,
                    },
                );
                Ok(())
            }
            Exec::Collective { coll, .. } => {
                // Its launch-order index is read on arrival.
                unit.apply_launches(op + 1);
                let c = *unit.statics.collective(coll);
                self.arrive(u, op, c, now)
            }
            Exec::Host => Ok(()),
        }
    }

    fn op_done(&mut self, u: usize, op: usize, now: u64) -> Result<(), SimError> {
        let unit = &mut self.units[u];
        unit.ops[op].span.end_ns = now;
        let stream = unit.ops[op].stream;
        let head = unit.streams.get(stream).head();
        unit.streams.set(stream, StreamPos::new(head + 1, false));
        self.finish_op(u, op, now)?;
        self.try_start(u, stream, now)
    }

    fn finish_op(&mut self, u: usize, op: usize, now: u64) -> Result<(), SimError> {
        let unit = &mut self.units[u];
        unit.ops[op].done = true;
        unit.finished += 1;
        unit.mem.free(now, unit.statics.frees(op));
        if let Some(g) = &self.gates
            && g.gates[u][unit.base + op]
        {
            self.fork = true;
        }
        // Indexed, not iterated: the loop body needs `self` mutably.
        for j in 0..unit.statics.dependents(op).len() {
            let unit = &mut self.units[u];
            let d = unit.statics.dependents(op)[j] as usize;
            unit.ops[d].deps_left -= 1;
            if unit.ops[d].deps_left == 0 {
                let stream = unit.ops[d].stream;
                if stream == HOST {
                    if unit.host.next == d {
                        self.host_advance(u, now);
                    }
                } else {
                    self.try_start(u, stream, now)?;
                }
            }
        }
        Ok(())
    }

    fn arrive(&mut self, u: usize, op: usize, c: CollectiveOp, now: u64) -> Result<(), SimError> {
        let unit = &mut self.units[u];
        let key = unit.group_key[c.group.index()];
        let seq = unit.ops[op].seq();
        let inst = match self.pending.get(&(key, seq)) {
            Some(&i) => i,
            None => {
                let i = self.instances.push(Instance::new(key));
                self.pending.insert((key, seq), i);
                i
            }
        };
        let instance = &self.instances[inst as usize];
        if let (Some(first), Some(&(fu, _))) = (instance.first, instance.arrivals.first())
            && (first.kind, first.dtype, first.tier) != (c.kind, c.dtype, c.tier)
        {
            let describe = |x: &CollectiveOp| format!("{} of {:?} on {}", x.kind, x.dtype, x.tier);
            let (unit, other) = (&self.units[u], &self.units[fu as usize]);
            return Err(SimError::CollectiveMismatch {
                label: self.keys[key as usize].label.clone(),
                rank: unit.program.rank,
                op: unit.program.ops[unit.base + op].id,
                found: describe(&c),
                other_rank: other.program.rank,
                expected: describe(&first),
            });
        }
        let instance = &mut self.instances[inst as usize];
        instance.first.get_or_insert(c);
        instance.arrivals.push((u as u32, op as u32));
        instance.max_in = instance.max_in.max(c.input_bytes);
        instance.max_out = instance.max_out.max(c.output_bytes);
        instance.aligned &= c.aligned_512;
        if instance.arrivals.len() == self.key_members[key as usize] as usize {
            self.pending.remove(&(key, seq));
            // The first arrival's view of the group decides the shape (peers are symmetric).
            let fu = instance.arrivals[0].0;
            let first = instance.first.unwrap_or(c);
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
            let phases: instances::Phases = phases
                .iter()
                .map(|p| {
                    (
                        p.tier,
                        ns(p.cost.latency_s),
                        ns(p.cost.transfer_s * slow(p.tier)),
                    )
                })
                .collect();
            let instance = &mut self.instances[inst as usize];
            instance.phases = phases;
            // Written into the members' spans when the collective completes.
            instance.transfer_start_ns = Some(now);
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
        let mut finishes = std::mem::take(&mut self.finishes);
        self.net
            .start_into(inst, &self.keys[key].units, tier, work, now, &mut finishes);
        self.schedule_transfers(finishes);
        Ok(())
    }

    /// Queues the finish events of `finishes` (then kept, empty, for reuse).
    fn schedule_transfers(&mut self, mut finishes: Vec<Finish>) {
        for f in finishes.drain(..) {
            self.push(
                f.time_ns,
                Event::Transfer {
                    inst: f.id,
                    version: f.version,
                },
            );
        }
        self.finishes = finishes;
    }

    fn complete(&mut self, inst: u32, now: u64) -> Result<(), SimError> {
        // Nothing refers to a completed instance any more but stale transfer finishes,
        // which the network no longer knows: both are released.
        let (arrivals, transfer_start_ns) = self
            .instances
            .release(inst)
            .map(|i| (i.arrivals, i.transfer_start_ns))
            .unwrap_or_default();
        self.net.release(inst);
        for &(u, op) in &arrivals {
            let (u, op) = (u as usize, op as usize);
            if let Some(t) = transfer_start_ns {
                self.units[u].ops[op].span.transfer_start_ns = t;
            }
            self.op_done(u, op, now)?;
        }
        Ok(())
    }

    fn check_finished(&self) -> Result<(), SimError> {
        let mut stuck = Vec::new();
        for unit in &self.units {
            if unit.finished == unit.ops.len() {
                continue;
            }
            let rank = unit.program.rank;
            let mut why = Vec::new();
            if unit.host.next < unit.ops.len() {
                let op = unit.host.next;
                why.push(format!(
                    "host waits at {} for {}",
                    unit.program.ops[unit.base + op].id,
                    self.waiting_deps(unit, op)
                ));
            }
            for s in 0..unit.streams.len() as u16 {
                if let Some(&op) = unit.queue(s).get(unit.streams.get(s).head()) {
                    why.push(self.stream_stuck(unit, op as usize));
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

    /// Why local op `op`, at the head of its stream, never ran.
    fn stream_stuck(&self, unit: &UnitRt<'_>, op: usize) -> String {
        let o = &unit.program.ops[unit.base + op];
        let reason = if op >= unit.host.next {
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
        format!("stream {} at {}: {}", o.stream.name(), o.id, reason)
    }

    fn waiting_deps(&self, unit: &UnitRt<'_>, op: usize) -> String {
        let deps: Vec<String> = unit.program.ops[unit.base + op]
            .deps
            .iter()
            .filter(|d| d.index() >= unit.base && !unit.ops[d.index() - unit.base].done)
            .map(|d| d.to_string())
            .collect();
        if deps.is_empty() {
            "nothing".into()
        } else {
            deps.join(", ")
        }
    }

    fn outcomes(self, ends: &[u64], keep: &[bool]) -> Vec<UnitOutcome> {
        self.units
            .into_iter()
            .zip(ends.iter().zip(keep))
            .map(|(u, (&end_ns, &keep))| UnitOutcome {
                spans: if keep {
                    op_spans(u.program, u.base, &u.ops)
                } else {
                    Vec::new()
                },
                end_ns,
                host_busy_ns: u.host.busy_ns,
                memory: u.mem.report(),
            })
            .collect()
    }
}
