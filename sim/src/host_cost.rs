//! The host model: what one op costs the host thread that issues it, per op class, in one
//! place. The engine ([`crate::engine`]) walks a rank's program in issue order and keeps the
//! host busy for [`HostCosts::op_ns`] per op; a device stream idles when the host falls
//! behind, which is how an eager step becomes host-bound.
//!
//! Classes and their profile constants (`[calibration]`, each documented with its source or
//! marked ASSUMPTION / FITTED in `scenarios/hardware/*.toml`):
//! - **production CPU operator events** (`host_us_per_cpu_event`, and for events the autograd
//!   engine dispatches ([`hpfsdp_program::step::HostDispatch`]) that times
//!   `host_backward_event_cost_ratio`): per profiler CPU operator
//!   event eager PyTorch records for the op in both modes
//!   ([`hpfsdp_program::step::Op::host_cpu_events`], counted by
//!   `hpfsdp_program::strategy::host_events` from probe-measured HF modules: aten ops including
//!   views and allocations, autograd engine nodes, `AccumulateGrad`); an op without a census
//!   (optimizer, FSDP copies, step tail) is charged one event per launched kernel, the floor.
//!   Absent from the profile, the cost is `validation_us_per_cpu_event` over
//!   `VALIDATION_OVER_PRODUCTION_EVENT_COST` (a validation event costs the host that many
//!   production events, measured like for like by `tools/host_census_probe.py`): the measured
//!   validation overhead of experiment A then pins the production host time, a structural
//!   check instead of a free constant;
//! - **kernel launch** (`host_launch_us_per_kernel`): per device kernel a compute or copy op
//!   stands for: the launch proper (torch_npu's task queue and the aclnn / driver submit).
//!   The framework's dispatch of the op that launches it is one of its CPU operator events,
//!   charged above, so the two do not count the same work twice;
//! - **unmodelled host work per kernel** (`host_unmodelled_us_per_kernel`): a residual per
//!   device kernel for host work no modelled op accounts for (Python model code, autograd
//!   bookkeeping, CPU-only operators between launches). Public measurements bound the launch
//!   itself (`sim/src/calibration/params.rs`); when a measured step is host-bound beyond what
//!   the modelled launches cost at that bound, the joint fit puts the rest here, named for
//!   what it is instead of inflating the launch cost;
//! - **`chunk_cat`'s block table** (`compute.chunk_cat_host_ps_per_element`): FSDP2's
//!   `chunk_cat` fills a table per 512 gradient elements on the host before it launches, so
//!   its host time grows with the elements it packs
//!   ([`hpfsdp_program::step::CopyWork::elements`]);
//! - **collective launch** (`host_launch_us_per_collective`): per collective call (the
//!   process-group API's host self time);
//! - **device -> host synchronisation** (`host_d2h_sync_us`): a host op with dependencies
//!   waits until they have finished on the device (the engine's drain), then pays the sync
//!   call itself (the blocking read-back, e.g. `.tolist()` of the all-to-all-v split sizes)
//!   on top of the op's own duration;
//! - **validation-mode CPU events** (`validation_us_per_cpu_event`): per extra CPU operator
//!   event the op causes in HyperParallel's validation mode
//!   ([`hpfsdp_program::step::Op::validation_cpu_events`], counted by
//!   `hpfsdp_program::strategy::validation`: DTensor dispatch of forward operators outside local
//!   regions, boundary contract checks); zero in production mode.

use crate::profile::HardwareProfile;
use hpfsdp_program::step::{CopyKind, HostDispatch, Op, Payload};
use hpfsdp_program::strategy::host_events::VALIDATION_OVER_PRODUCTION_EVENT_COST;

/// Production host CPU operator events of `op`: its census
/// ([`Op::host_cpu_events`]), or for a compute or copy op without one, one event per
/// launched kernel (the floor: every launch is at least one operator event); collectives
/// and host ops none (their host time is their own class).
pub fn production_events(op: &Op) -> u32 {
    if op.host_cpu_events > 0 {
        return op.host_cpu_events;
    }
    match &op.payload {
        Payload::Compute(w) => w.kernels,
        Payload::Copy(w) => w.kernels + w.memcpys,
        Payload::Collective(_) | Payload::Host { .. } => 0,
    }
}

/// Production CPU operator events of `op` the autograd engine dispatches (its
/// [`production_events`] when [`Op::host_dispatch`] says so, else 0).
pub fn autograd_events(op: &Op) -> u32 {
    match op.host_dispatch {
        HostDispatch::AutogradEngine => production_events(op),
        HostDispatch::Python => 0,
    }
}

/// Gradient elements FSDP2's `chunk_cat` packs in `op` (0 for every other op): what its
/// host-built block table grows with.
pub fn chunk_cat_elements(op: &Op) -> u64 {
    match &op.payload {
        Payload::Copy(w) if w.kind == CopyKind::ChunkCat => w.elements,
        _ => 0,
    }
}

/// Seconds to integer nanoseconds (rounded, never negative).
fn ns(seconds: f64) -> u64 {
    (seconds * 1e9).round().max(0.0) as u64
}

/// Per-class host costs of one simulation run (profile constants plus the run's mode).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HostCosts {
    /// Host time per device kernel launched, microseconds.
    pub kernel_launch_us: f64,
    /// Unmodelled host work per device kernel, microseconds (charged with each launch).
    pub kernel_unmodelled_us: f64,
    /// Host time per production CPU operator event, microseconds.
    pub cpu_event_us: f64,
    /// Host time per collective call, microseconds.
    pub collective_launch_us: f64,
    /// Host time of one device -> host synchronisation call after the drain, microseconds.
    pub d2h_sync_us: f64,
    /// Host time per extra validation-mode CPU operator event, microseconds (0 in
    /// production mode).
    pub validation_event_us: f64,
    /// Host time of an autograd-engine event over a Python-dispatched one.
    pub autograd_event_ratio: f64,
    /// Host time of `chunk_cat` per element it packs, picoseconds.
    pub chunk_cat_ps_per_element: f64,
}

impl HostCosts {
    /// The costs `profile` gives, with validation-mode events charged when `validation_mode`.
    pub fn of(profile: &HardwareProfile, validation_mode: bool) -> Self {
        let c = &profile.calibration;
        Self {
            kernel_launch_us: c.host_launch_us_per_kernel,
            kernel_unmodelled_us: c.host_unmodelled_us_per_kernel,
            cpu_event_us: c
                .host_us_per_cpu_event
                .unwrap_or(c.validation_us_per_cpu_event / VALIDATION_OVER_PRODUCTION_EVENT_COST),
            collective_launch_us: c.host_launch_us_per_collective,
            d2h_sync_us: c.host_d2h_sync_us,
            validation_event_us: if validation_mode {
                c.validation_us_per_cpu_event
            } else {
                0.0
            },
            autograd_event_ratio: c.host_backward_event_cost_ratio,
            chunk_cat_ps_per_element: profile.compute.chunk_cat_host_ps_per_element,
        }
    }

    /// Host time of launching `kernels` device kernels (the launches and the unmodelled
    /// host work that goes with each), nanoseconds.
    pub fn kernels_ns(&self, kernels: u32) -> u64 {
        ns(f64::from(kernels) * (self.kernel_launch_us + self.kernel_unmodelled_us) * 1e-6)
    }

    /// Host time of one collective call, nanoseconds.
    pub fn collective_ns(&self) -> u64 {
        ns(self.collective_launch_us * 1e-6)
    }

    /// Host time of a host op of `duration_ns` that waits on `deps` device ops: its duration
    /// plus, when it waits on any (a device -> host synchronisation), the sync call.
    pub fn host_op_ns(&self, duration_ns: u64, deps: usize) -> u64 {
        if deps == 0 {
            duration_ns
        } else {
            duration_ns + ns(self.d2h_sync_us * 1e-6)
        }
    }

    /// Host time of `events` production CPU operator events, nanoseconds.
    pub fn cpu_events_ns(&self, events: u32) -> u64 {
        ns(f64::from(events) * self.cpu_event_us * 1e-6)
    }

    /// Host time of `events` production CPU operator events of which `autograd` the
    /// autograd engine dispatches, nanoseconds ([`HostCosts::cpu_events_ns`] when none is).
    pub fn dispatched_events_ns(&self, events: u32, autograd: u32) -> u64 {
        if autograd == 0 {
            return self.cpu_events_ns(events);
        }
        let python = f64::from(events - autograd);
        let engine = f64::from(autograd) * self.autograd_event_ratio;
        ns((python + engine) * self.cpu_event_us * 1e-6)
    }

    /// Host time of `chunk_cat`'s block table for `elements` elements, nanoseconds.
    pub fn chunk_cat_ns(&self, elements: u64) -> u64 {
        ns(elements as f64 * self.chunk_cat_ps_per_element * 1e-12)
    }

    /// Host time of `events` validation-mode CPU operator events, nanoseconds.
    pub fn validation_ns(&self, events: u32) -> u64 {
        ns(f64::from(events) * self.validation_event_us * 1e-6)
    }

    /// Everything `op` costs the host: its launches (or, for a host op, its duration and
    /// sync), its production CPU operator events ([`production_events`]) and its
    /// validation-mode events, nanoseconds.
    pub fn op_ns(&self, op: &Op) -> u64 {
        let base = match &op.payload {
            Payload::Compute(w) => self.kernels_ns(w.kernels),
            Payload::Copy(w) => self.kernels_ns(w.kernels + w.memcpys),
            Payload::Collective(_) => self.collective_ns(),
            Payload::Host { duration_ns } => self.host_op_ns(*duration_ns, op.deps.len()),
        };
        base + self.dispatched_events_ns(production_events(op), autograd_events(op))
            + self.chunk_cat_ns(chunk_cat_elements(op))
            + self.validation_ns(op.validation_cpu_events)
    }
}

/// Host-time totals of one rank's program by class (what [`HostCosts::op_ns`] sums to), for
/// reports and the calibration's host figures.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct HostTotals {
    /// Device kernels launched.
    pub kernels: u64,
    /// Collective calls.
    pub collectives: u64,
    /// Device -> host synchronisations (host ops with dependencies).
    pub d2h_syncs: u64,
    /// Production CPU operator events ([`production_events`]).
    pub cpu_events: u64,
    /// Of those, events of ops without a census (charged one per launched kernel).
    pub floor_events: u64,
    /// Extra validation-mode CPU operator events (counted in both modes; charged only in
    /// validation mode).
    pub validation_events: u64,
    /// Of the production events, those the autograd engine dispatches ([`autograd_events`]).
    pub autograd_events: u64,
    /// Gradient elements packed by `chunk_cat` ([`chunk_cat_elements`]).
    pub chunk_cat_elements: u64,
}

impl HostTotals {
    /// Counts the ops of one program.
    pub fn of<'a>(ops: impl IntoIterator<Item = &'a Op>) -> Self {
        let mut t = Self::default();
        for op in ops {
            match &op.payload {
                Payload::Compute(w) => t.kernels += u64::from(w.kernels),
                Payload::Copy(w) => t.kernels += u64::from(w.kernels + w.memcpys),
                Payload::Collective(_) => t.collectives += 1,
                Payload::Host { .. } => t.d2h_syncs += u64::from(!op.deps.is_empty()),
            }
            t.validation_events += u64::from(op.validation_cpu_events);
            let events = u64::from(production_events(op));
            t.cpu_events += events;
            if op.host_cpu_events == 0 {
                t.floor_events += events;
            }
            t.autograd_events += u64::from(autograd_events(op));
            t.chunk_cat_elements += chunk_cat_elements(op);
        }
        t
    }

    /// Host seconds these counts cost at `costs` (no host-op durations included).
    pub fn host_s(&self, costs: &HostCosts) -> f64 {
        (self.kernels as f64 * (costs.kernel_launch_us + costs.kernel_unmodelled_us)
            + self.collectives as f64 * costs.collective_launch_us
            + self.d2h_syncs as f64 * costs.d2h_sync_us
            + self.charged_cpu_events(costs) * costs.cpu_event_us
            + self.validation_events as f64 * costs.validation_event_us)
            * 1e-6
            + self.chunk_cat_elements as f64 * costs.chunk_cat_ps_per_element * 1e-12
    }

    /// Production events in Python-event units: the autograd engine's at
    /// [`HostCosts::autograd_event_ratio`].
    pub fn charged_cpu_events(&self, costs: &HostCosts) -> f64 {
        (self.cpu_events - self.autograd_events) as f64
            + self.autograd_events as f64 * costs.autograd_event_ratio
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hpfsdp_program::step::{Category, ComputeWork, ProgramBuilder, Stream};

    #[test]
    fn each_class_costs_its_own_constant_and_validation_events_only_in_validation_mode() {
        let mut p = HardwareProfile::builtin("ascend-910c-a3").unwrap();
        p.calibration.host_launch_us_per_kernel = 4.0;
        p.calibration.host_unmodelled_us_per_kernel = 1.0;
        p.calibration.host_launch_us_per_collective = 50.0;
        p.calibration.host_d2h_sync_us = 20.0;
        p.calibration.validation_us_per_cpu_event = 7.0;
        p.calibration.host_us_per_cpu_event = Some(2.0);
        let mut b = ProgramBuilder::new(0);
        let k = b.compute(ComputeWork::memory_bound(0, 0, 3), &[]);
        b.validation_events(k, 10);
        let free = b.host(Category::Host, 1_000, &[]);
        let sync = b.host(Category::Host, 1_000, &[k]);
        let prog = b.build().unwrap();
        let prod = HostCosts::of(&p, false);
        let val = HostCosts::of(&p, true);
        // Three kernels at 4 us launch + 1 us unmodelled host work each, and (no census on
        // the op) one production event per kernel at 2 us.
        assert_eq!(prod.op_ns(&prog.ops[k.index()]), 21_000);
        assert_eq!(val.op_ns(&prog.ops[k.index()]), 21_000 + 70_000);
        assert_eq!(prod.op_ns(&prog.ops[free.index()]), 1_000);
        assert_eq!(prod.op_ns(&prog.ops[sync.index()]), 21_000);
        let t = HostTotals::of(prog.ops.iter());
        assert_eq!(
            (t.kernels, t.collectives, t.d2h_syncs, t.validation_events),
            (3, 0, 1, 10)
        );
        assert_eq!((t.cpu_events, t.floor_events), (3, 3));
        assert!((t.host_s(&val) - (15.0 + 6.0 + 20.0 + 70.0) * 1e-6).abs() < 1e-12);
    }

    #[test]
    fn census_events_replace_the_floor_and_the_default_cost_follows_validation_events() {
        let mut p = HardwareProfile::builtin("ascend-910c-a3").unwrap();
        p.calibration.host_launch_us_per_kernel = 4.0;
        p.calibration.host_unmodelled_us_per_kernel = 0.0;
        p.calibration.validation_us_per_cpu_event = 7.0;
        p.calibration.host_us_per_cpu_event = None;
        let mut b = ProgramBuilder::new(0);
        let k = b.compute(ComputeWork::memory_bound(0, 0, 2), &[]);
        b.host_events(k, 50);
        let prog = b.build().unwrap();
        let costs = HostCosts::of(&p, false);
        let per_event = 7.0 / VALIDATION_OVER_PRODUCTION_EVENT_COST;
        assert!((costs.cpu_event_us - per_event).abs() < 1e-12);
        assert_eq!(production_events(&prog.ops[k.index()]), 50);
        let want = 2.0 * 4_000.0 + 50.0 * per_event * 1e3;
        assert_eq!(costs.op_ns(&prog.ops[k.index()]), want.round() as u64);
        let t = HostTotals::of(prog.ops.iter());
        assert_eq!((t.cpu_events, t.floor_events), (50, 0));
    }

    #[test]
    fn autograd_engine_events_cost_the_ratio_and_chunk_cat_pays_per_element() {
        let mut p = HardwareProfile::builtin("nvidia-h200-hgx").unwrap();
        p.calibration.host_launch_us_per_kernel = 2.0;
        p.calibration.host_unmodelled_us_per_kernel = 0.0;
        p.calibration.host_us_per_cpu_event = Some(10.0);
        p.calibration.host_backward_event_cost_ratio = 0.5;
        p.compute.chunk_cat_host_ps_per_element = 6.0;
        let mut b = ProgramBuilder::new(0);
        let fwd = b.compute(ComputeWork::memory_bound(0, 0, 1), &[]);
        b.host_events(fwd, 100);
        let bwd = b.compute(ComputeWork::memory_bound(0, 0, 1), &[fwd]);
        b.host_events(bwd, 100)
            .host_dispatch(bwd, HostDispatch::AutogradEngine);
        let cat = b.push(
            Stream::Compute,
            Category::Copy,
            Payload::Copy(hpfsdp_program::step::CopyWork {
                bytes: 3_000_000,
                kernels: 1,
                memcpys: 0,
                kind: CopyKind::ChunkCat,
                elements: 1_000_000,
            }),
            &[bwd],
        );
        let prog = b.build().unwrap();
        let costs = HostCosts::of(&p, false);
        // 1 launch at 2 us plus 100 events at 10 us (Python) or 5 us (the engine).
        assert_eq!(costs.op_ns(&prog.ops[fwd.index()]), 1_002_000);
        assert_eq!(costs.op_ns(&prog.ops[bwd.index()]), 502_000);
        // chunk_cat: its launch, its one floor event, 1 M elements at 6 ps.
        assert_eq!(costs.op_ns(&prog.ops[cat.index()]), 2_000 + 10_000 + 6_000);
        let t = HostTotals::of(prog.ops.iter());
        assert_eq!((t.cpu_events, t.autograd_events), (201, 100));
        assert_eq!(t.chunk_cat_elements, 1_000_000);
        let want = (3.0 * 2.0 + 101.0 * 10.0 + 100.0 * 5.0) * 1e-6 + 6e-6;
        assert!((t.host_s(&costs) - want).abs() < 1e-12);
        // Ratio 1 (every profile that does not set it) charges the engine like Python.
        p.calibration.host_backward_event_cost_ratio = 1.0;
        let even = HostCosts::of(&p, false);
        assert_eq!(even.op_ns(&prog.ops[bwd.index()]), 1_002_000);
    }
}
