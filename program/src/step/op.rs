//! The vocabulary of a step program: one [`Op`] (its stream, category, dependencies, memory
//! effects and payload: compute, copy or collective) and the ids and groups ops refer to.

use hpfsdp_plan::collective::CollectiveKind;
use hpfsdp_plan::kernel::MixId;
use hpfsdp_plan::model::DType;
use hpfsdp_plan::topology::Tier;
use serde::{Deserialize, Serialize};
use smallvec::SmallVec;

/// Index of an op inside its [`StepProgram`] (equal to its position in `ops`).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, Default,
)]
#[serde(transparent)]
pub struct OpId(pub u32);

impl OpId {
    /// The op's position in `StepProgram::ops`.
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl std::fmt::Display for OpId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "op#{}", self.0)
    }
}

/// Index of a process group in `StepProgram::groups`.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, Default,
)]
#[serde(transparent)]
pub struct GroupId(pub u32);

impl GroupId {
    /// The group's position in `StepProgram::groups`.
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// The queue an op executes on. Device streams run their ops one at a time in issue order;
/// [`Stream::Host`] is the rank's host thread.
///
/// PyTorch FSDP2 maps to: default stream = `Compute`, all-gather copy-in stream = `Copy`,
/// all-gather stream = `AllGather`, reduce-scatter stream = `ReduceScatter`, HSDP all-reduce
/// stream = `AllReduce`. HyperParallel-FSDP additionally uses `Parallel` for TP/EP/CP
/// collectives issued off the compute stream and `Optimizer` for the overlapped distributed
/// Muon pipeline. `Aux(n)` names any further stream a strategy needs.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, Default,
)]
#[serde(rename_all = "kebab-case")]
pub enum Stream {
    /// The main compute stream (PyTorch's default stream).
    #[default]
    Compute,
    /// A copy stream (FSDP2's all-gather copy-in stream, D2D/D2H copies).
    Copy,
    /// The FSDP all-gather stream.
    AllGather,
    /// The FSDP reduce-scatter stream.
    ReduceScatter,
    /// The HSDP cross-replica all-reduce stream.
    AllReduce,
    /// A stream for model-parallel collectives (TP, EP, CP, PP).
    Parallel,
    /// The optimizer stream (distributed Muon gathers, Newton-Schulz, scatters).
    Optimizer,
    /// Any additional device stream, numbered by the strategy.
    Aux(u8),
    /// The host thread: host-only work, no device stream.
    Host,
}

impl Stream {
    /// Short stable name used in tables and traces (`aux3` for `Aux(3)`).
    pub fn name(self) -> String {
        match self {
            Stream::Compute => "compute".into(),
            Stream::Copy => "copy".into(),
            Stream::AllGather => "all-gather".into(),
            Stream::ReduceScatter => "reduce-scatter".into(),
            Stream::AllReduce => "all-reduce".into(),
            Stream::Parallel => "parallel".into(),
            Stream::Optimizer => "optimizer".into(),
            Stream::Aux(n) => format!("aux{n}"),
            Stream::Host => "host".into(),
        }
    }
}

/// What an op is for; reports break time and traffic down by category.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Category {
    /// FSDP parameter all-gather.
    FsdpAg,
    /// FSDP gradient reduce-scatter.
    FsdpRs,
    /// HSDP cross-replica gradient all-reduce.
    FsdpAr,
    /// Tensor-parallel communication.
    Tp,
    /// Expert-parallel communication (dispatch/combine all-to-all).
    Ep,
    /// Context-parallel communication.
    Cp,
    /// Pipeline-parallel send/recv.
    Pp,
    /// Optimizer work and communication (distributed Muon, AdamW).
    Optimizer,
    /// Model compute (forward, backward, recompute).
    Compute,
    /// Device copies (FSDP2 copy-in/copy-out, casts, packing).
    Copy,
    /// Host-only work (Python/dispatcher overhead, validation checks, synchronization).
    Host,
}

impl Category {
    /// All categories, in a stable order.
    pub const ALL: [Category; 11] = [
        Category::FsdpAg,
        Category::FsdpRs,
        Category::FsdpAr,
        Category::Tp,
        Category::Ep,
        Category::Cp,
        Category::Pp,
        Category::Optimizer,
        Category::Compute,
        Category::Copy,
        Category::Host,
    ];

    /// Short stable name used in tables, CSV and JSON.
    pub fn name(self) -> &'static str {
        match self {
            Category::FsdpAg => "fsdp-ag",
            Category::FsdpRs => "fsdp-rs",
            Category::FsdpAr => "fsdp-ar",
            Category::Tp => "tp",
            Category::Ep => "ep",
            Category::Cp => "cp",
            Category::Pp => "pp",
            Category::Optimizer => "optimizer",
            Category::Compute => "compute",
            Category::Copy => "copy",
            Category::Host => "host",
        }
    }
}

impl std::fmt::Display for Category {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// What a memory effect's bytes hold; peak memory is also reported per tag.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum MemTag {
    /// Parameters: sharded masters and gathered (unsharded) copies.
    Params,
    /// Gradients: unsharded, reduce-scatter outputs, replica buffers.
    Grads,
    /// Saved activations.
    Activations,
    /// Communication and staging buffers (copy-in/out, padding, fused buffers).
    Buffers,
    /// Optimizer state (moments, momentum, Newton-Schulz workspace).
    Optimizer,
    /// Anything else (temporary workspaces).
    Other,
}

impl MemTag {
    /// All tags, in a stable order.
    pub const ALL: [MemTag; 6] = [
        MemTag::Params,
        MemTag::Grads,
        MemTag::Activations,
        MemTag::Buffers,
        MemTag::Optimizer,
        MemTag::Other,
    ];

    /// Position in [`MemTag::ALL`] (for per-tag arrays).
    pub fn index(self) -> usize {
        self as usize
    }

    /// Short stable name.
    pub fn name(self) -> &'static str {
        match self {
            MemTag::Params => "params",
            MemTag::Grads => "grads",
            MemTag::Activations => "activations",
            MemTag::Buffers => "buffers",
            MemTag::Optimizer => "optimizer",
            MemTag::Other => "other",
        }
    }
}

/// Device memory an op allocates when it starts and frees when it ends. The freed bytes need
/// not be the ones this op allocated: a compute op that reshards frees the gathered parameters
/// its all-gather allocated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct MemoryEffect {
    /// What the bytes hold.
    pub tag: MemTag,
    /// Bytes allocated when the op starts.
    #[serde(default)]
    pub alloc_bytes: u64,
    /// Bytes freed when the op ends.
    #[serde(default)]
    pub free_bytes: u64,
}

/// Bytes of one tag resident on the device when the step starts (sharded parameters,
/// optimizer state...).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ResidentMemory {
    /// What the bytes hold.
    pub tag: MemTag,
    /// Resident bytes.
    pub bytes: u64,
}

/// Kernel work of one compute op: totals (for MFU and reports) and, when known, the op's
/// kernel mix (see [`hpfsdp_plan::kernel`]), which the simulator costs kernel class by kernel class.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
pub struct ComputeWork {
    /// Floating-point operations (multiply and add counted separately: 2 per MAC).
    pub flops: u64,
    /// Bytes read plus bytes written in HBM.
    pub hbm_bytes: u64,
    /// Number of device kernels this op stands for (each costs a host launch); at least 1.
    pub kernels: u32,
    /// The op's kernel mix in [`StepProgram::kernel_mixes`]; `None` means the totals describe
    /// `kernels` memory-bound launches (element-wise work with no GEMM inside).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mix: Option<MixId>,
}

impl ComputeWork {
    /// Work of `kernels` memory-bound launches (no mix): settle kernels, optimizer foreach
    /// kernels, casts.
    pub fn memory_bound(flops: u64, hbm_bytes: u64, kernels: u32) -> Self {
        Self {
            flops,
            hbm_bytes,
            kernels,
            mix: None,
        }
    }
}

/// A device-to-device copy of `bytes` bytes (read `bytes`, write `bytes`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
pub struct CopyWork {
    /// Bytes copied (each is read once and written once).
    pub bytes: u64,
    /// Number of device kernels this op stands for (each costs a host launch); at least 1
    /// unless the op is made of driver copies only (`memcpys > 0`).
    pub kernels: u32,
    /// Driver copy calls (`cudaMemcpyAsync` device to device) this op stands for: each costs
    /// a host call like a launch, but a profiler lists it as a memcpy, not as a kernel (for
    /// example NCCL's single-rank out-of-place collectives and `split_with_sizes_copy` of
    /// contiguous rows).
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub memcpys: u32,
    /// What kind of copy kernel it is (a plain copy or FSDP2's `chunk_cat`), which sets the
    /// bandwidth it reaches.
    #[serde(default, skip_serializing_if = "CopyKind::is_plain")]
    pub kind: CopyKind,
    /// Elements the copy moves where its cost depends on them beyond its bytes (FSDP2's
    /// `chunk_cat` builds per-block metadata on the host and copies it to the device); 0
    /// when not given.
    #[serde(default, skip_serializing_if = "is_zero_u64")]
    pub elements: u64,
}

/// The kernel of a [`CopyWork`]: plain copies and casts, or kernels that reach a bandwidth of
/// their own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum CopyKind {
    /// `copy_`, casts, `split_with_sizes_copy`, driver memcpys.
    #[default]
    Plain,
    /// `torch._chunk_cat` (FSDP2's reduce-scatter copy-in): interleaves every gradient's
    /// chunks into the reduce buffer, at a fraction of a plain copy's bandwidth.
    ChunkCat,
}

impl CopyKind {
    /// Whether this is a plain copy (the default, left out of serialized programs).
    pub fn is_plain(&self) -> bool {
        *self == CopyKind::Plain
    }
}

fn is_zero_u32(n: &u32) -> bool {
    *n == 0
}

/// One collective call as seen by one rank.
///
/// Byte counts are **per rank**: `input_bytes` is the size of this rank's send buffer and
/// `output_bytes` the size of its receive buffer, both in bytes of `dtype`. For a group of `p`
/// ranks:
/// - all-gather: `output_bytes = p * input_bytes` (padded shards included);
/// - reduce-scatter: `input_bytes = p * output_bytes`;
/// - all-reduce and broadcast: `input_bytes = output_bytes` (the whole buffer);
/// - all-to-all: `input_bytes = output_bytes` = everything this rank sends (own chunk included);
/// - all-to-all-v: the largest per-rank send and receive totals over the group (the
///   convention of [`hpfsdp_plan::collective`]; a rank's own totals also work, since the simulator
///   takes the maximum over participants);
/// - send/recv: group of two ranks, bytes sent and bytes received.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct CollectiveOp {
    /// Which collective.
    pub kind: CollectiveKind,
    /// The process group, an index into `StepProgram::groups`.
    pub group: GroupId,
    /// The slowest link the group crosses (from the topology).
    pub tier: Tier,
    /// This rank's send-buffer bytes.
    pub input_bytes: u64,
    /// This rank's receive-buffer bytes.
    pub output_bytes: u64,
    /// Element type on the wire.
    pub dtype: DType,
    /// True when every buffer's length is a multiple of 512 bytes (HCCL's fast path).
    pub aligned_512: bool,
}

/// What an op does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Payload {
    /// Device kernels costed by roofline.
    Compute(ComputeWork),
    /// A device copy costed at HBM bandwidth.
    Copy(CopyWork),
    /// A collective costed by the network model.
    Collective(CollectiveOp),
    /// Host-only work of a fixed duration, on [`Stream::Host`].
    Host {
        /// Host time in nanoseconds.
        duration_ns: u64,
    },
}

impl Payload {
    /// The collective, when this is one.
    pub fn as_collective(&self) -> Option<&CollectiveOp> {
        match self {
            Payload::Collective(c) => Some(c),
            _ => None,
        }
    }
}

/// Dependencies of one op, stored inline up to four ids (the common case), so that building
/// and dropping a program of millions of ops does not make one heap allocation per op.
/// Serialises, compares and hashes exactly as the `Vec<OpId>` it replaces (a sequence).
pub type OpDeps = SmallVec<[OpId; 4]>;

/// Memory effects of one op, stored inline up to two (an alloc and a free), for the same reason
/// as [`OpDeps`]; serialises, compares and hashes as a `Vec<MemoryEffect>`.
pub type OpMemory = SmallVec<[MemoryEffect; 2]>;

/// One op of a step program.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Op {
    /// Equal to the op's index in `StepProgram::ops`.
    pub id: OpId,
    /// Optional human-readable name (`layers.3.fwd`, `layers.3.ag`...), for reports.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The stream the op executes on.
    pub stream: Stream,
    /// What the op is for.
    pub category: Category,
    /// Ids of earlier ops that must finish before this one starts.
    #[serde(default, skip_serializing_if = "SmallVec::is_empty")]
    pub deps: OpDeps,
    /// What the op does.
    pub payload: Payload,
    /// Memory allocated at start / freed at end.
    #[serde(default, skip_serializing_if = "SmallVec::is_empty")]
    pub memory: OpMemory,
    /// Extra host CPU operator events this op causes in HyperParallel's validation mode
    /// (DTensor dispatch of its forward operators, boundary contract checks); 0 for work that
    /// runs on plain local tensors in both modes. Counted by
    /// [`crate::strategy::validation`]; the simulator charges them only in validation mode.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub validation_cpu_events: u32,
    /// Host CPU operator events eager PyTorch records for this op in both modes (aten ops
    /// including views and allocations, autograd engine nodes, `AccumulateGrad`), counted by
    /// [`crate::strategy::host_events`] for model-path compute ops; 0 where no census is
    /// known (the simulator then charges one event per launched kernel, the floor).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub host_cpu_events: u32,
    /// Which host thread dispatches [`Op::host_cpu_events`] (the simulator charges an
    /// autograd-engine event at the profile's `host_backward_event_cost_ratio` of a Python
    /// one).
    #[serde(default, skip_serializing_if = "HostDispatch::is_python")]
    pub host_dispatch: HostDispatch,
}

/// Which host thread dispatches an op's CPU operator events, and so what each costs: eager
/// PyTorch runs the forward from Python (module code and hooks between every aten call), while
/// `loss.backward()` hands the graph to the autograd engine, whose C++ thread calls each
/// node's aten ops back to back.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
#[serde(rename_all = "kebab-case")]
pub enum HostDispatch {
    /// Python on the training loop's thread (forward, FSDP hooks, the optimizer step): the
    /// default.
    #[default]
    Python,
    /// The autograd engine's nodes of a backward pass (their aten calls and
    /// `AccumulateGrad`).
    AutogradEngine,
}

impl HostDispatch {
    /// True for [`HostDispatch::Python`] (serde: such an op serialises as before the field).
    pub fn is_python(&self) -> bool {
        *self == HostDispatch::Python
    }
}

/// True for 0 (serde: a copy without an element count serialises as before the field).
fn is_zero_u64(v: &u64) -> bool {
    *v == 0
}

/// True for 0 (serde: an op without validation events serialises as before the field).
fn is_zero(v: &u32) -> bool {
    *v == 0
}
