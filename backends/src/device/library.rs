//! The interface a vendor collective library (NCCL, HCCL) implements for [`super::DeviceComm`].
//!
//! Implementations translate our element types and reductions into the vendor's enum values,
//! call the C function and turn a non-success code into [`crate::CommError::DeviceCall`] naming
//! the function. Counts are in elements; ranks and roots are positions inside the
//! communicator (group-local), never global ranks.

use std::ffi::c_void;
use std::sync::Arc;

use super::kernels::DeviceKernels;
use super::runtime::{DevPtr, DeviceRuntime, Stream};
use crate::error::CommResult;
use crate::types::{DType, ReduceOp};

/// A vendor communicator handle (`ncclComm_t`, `HcclComm`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawComm(pub *mut c_void);

// SAFETY: an opaque handle; the vendor libraries allow issuing on a communicator from any one
// thread at a time, and `DeviceComm` issues from its owner only.
unsafe impl Send for RawComm {}
// SAFETY: as above.
unsafe impl Sync for RawComm {}

/// Where an operation is enqueued: a communicator and a stream.
#[derive(Debug, Clone, Copy)]
pub struct Launch {
    /// The communicator.
    pub comm: RawComm,
    /// The stream.
    pub stream: Stream,
}

/// Which half of a point-to-point transfer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum P2pDirection {
    /// Send `count` elements from `ptr` to `peer`.
    Send,
    /// Receive `count` elements from `peer` into `ptr`.
    Recv,
}

/// One point-to-point operation of a batch.
#[derive(Debug, Clone, Copy)]
pub struct P2pOp {
    /// Send or receive.
    pub direction: P2pDirection,
    /// Device buffer.
    pub ptr: DevPtr,
    /// Elements.
    pub count: usize,
    /// Element type.
    pub dtype: DType,
    /// Peer's rank in the communicator.
    pub peer: usize,
}

impl P2pOp {
    /// The trace kind of this half.
    pub fn kind(&self) -> crate::types::CollectiveKind {
        match self.direction {
            P2pDirection::Send => crate::types::CollectiveKind::Send,
            P2pDirection::Recv => crate::types::CollectiveKind::Recv,
        }
    }
}

/// Per-peer element counts and displacements of an all-to-all-v (all in elements).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllToAllVLayout {
    /// Elements sent to each peer.
    pub send_counts: Vec<usize>,
    /// Offset of each peer's chunk in the send buffer.
    pub send_displs: Vec<usize>,
    /// Elements received from each peer.
    pub recv_counts: Vec<usize>,
    /// Offset of each peer's chunk in the receive buffer.
    pub recv_displs: Vec<usize>,
}

impl AllToAllVLayout {
    /// Packed layout (chunks back to back, in peer order) from the counts.
    pub fn packed(send_counts: &[usize], recv_counts: &[usize]) -> AllToAllVLayout {
        let displs = |counts: &[usize]| {
            counts
                .iter()
                .scan(0usize, |acc, &c| {
                    let d = *acc;
                    *acc += c;
                    Some(d)
                })
                .collect()
        };
        AllToAllVLayout {
            send_counts: send_counts.to_vec(),
            send_displs: displs(send_counts),
            recv_counts: recv_counts.to_vec(),
            recv_displs: displs(recv_counts),
        }
    }
}

/// A vendor collective library loaded at run time.
pub trait CollLibrary: Send + Sync + 'static {
    /// Backend name (`nccl`, `hccl`).
    const BACKEND: &'static str;
    /// Size of the bootstrap blob (NCCL unique id 128 B, HCCL root info 4108 B).
    const ID_BYTES: usize;

    /// The accelerator runtime that goes with the library.
    fn runtime(&self) -> &Arc<dyn DeviceRuntime>;
    /// Library version and the files loaded, for reports.
    fn describe(&self) -> String;
    /// Create a new bootstrap blob (on the rank that will be the communicator's root).
    fn unique_id(&self) -> CommResult<Vec<u8>>;
    /// Join a communicator of `nranks` as `rank` using a blob from [`CollLibrary::unique_id`].
    fn init_rank(&self, id: &[u8], nranks: usize, rank: usize) -> CommResult<RawComm>;
    /// Whether [`CollLibrary::split`] is available (NCCL >= 2.18).
    fn can_split(&self) -> bool;
    /// Collective over `parent`: members get a new communicator ordered by `key`, non-members
    /// get `None`.
    fn split(&self, parent: RawComm, member: bool, key: usize) -> CommResult<Option<RawComm>>;
    /// Destroy a communicator.
    fn destroy(&self, comm: RawComm) -> CommResult<()>;
    /// Whether the library reduces with `op` natively.
    fn supports(&self, op: ReduceOp) -> bool;
    /// Device-side compute for replay on device `device_index` (with GEMMs when `gemm`), or
    /// `None` when the runtime cannot run kernels loaded at run time (ACL).
    fn kernels(
        &self,
        device_index: usize,
        gemm: bool,
    ) -> CommResult<Option<Box<dyn DeviceKernels>>> {
        let _ = (device_index, gemm);
        Ok(None)
    }

    /// All-gather `count` elements per rank from `send` into `recv`.
    fn all_gather(
        &self,
        send: DevPtr,
        recv: DevPtr,
        count: usize,
        dtype: DType,
        at: Launch,
    ) -> CommResult<()>;
    /// Reduce-scatter; `recv_count` elements land on each rank.
    fn reduce_scatter(
        &self,
        send: DevPtr,
        recv: DevPtr,
        recv_count: usize,
        dtype: DType,
        op: ReduceOp,
        at: Launch,
    ) -> CommResult<()>;
    /// All-reduce `count` elements.
    fn all_reduce(
        &self,
        send: DevPtr,
        recv: DevPtr,
        count: usize,
        dtype: DType,
        op: ReduceOp,
        at: Launch,
    ) -> CommResult<()>;
    /// Broadcast `count` elements of `buf` from communicator rank `root`, in place.
    fn broadcast(
        &self,
        buf: DevPtr,
        count: usize,
        dtype: DType,
        root: usize,
        at: Launch,
    ) -> CommResult<()>;
    /// All-to-all with `count` elements per peer.
    fn all_to_all(
        &self,
        send: DevPtr,
        recv: DevPtr,
        count: usize,
        nranks: usize,
        dtype: DType,
        at: Launch,
    ) -> CommResult<()>;
    /// All-to-all with per-peer counts and displacements.
    fn all_to_all_v(
        &self,
        send: DevPtr,
        recv: DevPtr,
        layout: &AllToAllVLayout,
        dtype: DType,
        at: Launch,
    ) -> CommResult<()>;
    /// A batch of sends and receives issued together (so pairs cannot deadlock).
    fn p2p_batch(&self, ops: &[P2pOp], at: Launch) -> CommResult<()>;
}
