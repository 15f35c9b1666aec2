//! The `Collective` trait every backend implements, its asynchronous handles, and typed
//! blocking helpers.
//!
//! Conventions shared by all backends:
//! - Groups are explicit ascending rank lists ([`Group`]); member `i` of a group is its `i`-th
//!   rank. Roots and peers are **global** ranks.
//! - Payloads are owned [`Buffer`]s: a call takes the input by value and the handle's
//!   [`Handle::wait`] returns the output, so no memory is shared with an in-flight operation.
//! - Calls on one group are matched by their order on that group: the `n`-th call a rank makes on
//!   a group meets the `n`-th call of every other member. Mismatched kinds, dtypes or sizes are
//!   reported as [`crate::CommError::Mismatch`] where the backend can detect them.
//! - Reductions combine contributions in ascending rank order (see [`crate::reduce`]), so results
//!   are bit-identical on every backend and every run; the run-time loaded `hccl` and `nccl`
//!   backends are the exception (the vendor library's own reduction, see [`crate::device`]).

use crate::buffer::Buffer;
use crate::buffer::Element;
use crate::error::CommResult;
use crate::group::Group;
use crate::trace::TraceEvent;
use crate::types::{CollectiveKind, DType, ReduceOp};

/// A pending operation. Backends implement this; users hold a [`Handle`].
pub trait Work: Send {
    /// Whether [`Work::wait`] would return without blocking.
    fn is_complete(&self) -> bool;
    /// Block until the operation finishes and return its output buffer.
    fn wait(self: Box<Self>) -> CommResult<Buffer>;
}

/// An operation that finished when it was issued.
struct Ready(CommResult<Buffer>);

impl Work for Ready {
    fn is_complete(&self) -> bool {
        true
    }
    fn wait(self: Box<Self>) -> CommResult<Buffer> {
        self.0
    }
}

/// The asynchronous handle returned by every [`Collective`] call.
#[must_use = "a collective's handle must be waited on to get its result"]
pub struct Handle {
    kind: CollectiveKind,
    work: Box<dyn Work>,
}

impl std::fmt::Debug for Handle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handle")
            .field("kind", &self.kind)
            .field("complete", &self.work.is_complete())
            .finish()
    }
}

impl Handle {
    /// Wrap a backend's pending work.
    pub fn new(kind: CollectiveKind, work: Box<dyn Work>) -> Handle {
        Handle { kind, work }
    }

    /// A handle that is already complete with `result`.
    pub fn ready(kind: CollectiveKind, result: CommResult<Buffer>) -> Handle {
        Handle {
            kind,
            work: Box::new(Ready(result)),
        }
    }

    /// What the handle is for.
    pub fn kind(&self) -> CollectiveKind {
        self.kind
    }

    /// Whether [`Handle::wait`] would return without blocking.
    pub fn is_complete(&self) -> bool {
        self.work.is_complete()
    }

    /// Block until the operation finishes; returns the output buffer.
    pub fn wait(self) -> CommResult<Buffer> {
        self.work.wait()
    }

    /// [`Handle::wait`], then unwrap the output as a typed vector.
    pub fn wait_vec<T: Element>(self) -> CommResult<Vec<T>> {
        self.wait()?.into_vec()
    }
}

/// Wait on several handles in the order given; stops at the first error.
pub fn wait_all(handles: Vec<Handle>) -> CommResult<Vec<Buffer>> {
    handles.into_iter().map(Handle::wait).collect()
}

/// A communicator for one rank: group collectives and point-to-point messages.
///
/// The trait is object safe, so a runner can hold a `Box<dyn Collective>` chosen at run time.
pub trait Collective {
    /// Backend name (`inproc`, `mpi`, `hccl`, `nccl`).
    fn backend_name(&self) -> &'static str;

    /// This rank's global index.
    fn rank(&self) -> usize;

    /// Number of ranks in the world.
    fn world_size(&self) -> usize;

    /// Every member contributes `n` elements; every member gets the `n * size` elements of all
    /// members concatenated in group order.
    fn all_gather(&self, group: &Group, input: Buffer) -> CommResult<Handle>;

    /// Every member contributes `n * size` elements; member `i` gets chunk `i` (length `n`) of the
    /// element-wise reduction.
    fn reduce_scatter(&self, group: &Group, input: Buffer, op: ReduceOp) -> CommResult<Handle>;

    /// Every member contributes `n` elements and gets the `n`-element reduction.
    fn all_reduce(&self, group: &Group, input: Buffer, op: ReduceOp) -> CommResult<Handle>;

    /// Every member passes a buffer of the same length; all get the contents of `root`'s buffer.
    /// `root` is a global rank that must be a member.
    fn broadcast(&self, group: &Group, buffer: Buffer, root: usize) -> CommResult<Handle>;

    /// Every member passes `n * size` elements; chunk `j` goes to member `j`; the output is the
    /// chunks received, in source-member order.
    fn all_to_all(&self, group: &Group, input: Buffer) -> CommResult<Handle>;

    /// All-to-all with explicit per-member counts: the input is `send_counts[j]` elements for each
    /// member `j` back to back; the output is `recv_counts[i]` elements from each member `i` back
    /// to back. `recv_counts[i]` here must equal `send_counts[me]` on member `i`.
    fn all_to_all_v(
        &self,
        group: &Group,
        input: Buffer,
        send_counts: &[usize],
        recv_counts: &[usize],
    ) -> CommResult<Handle>;

    /// Synchronise the members of a group; the handle yields an empty f32 buffer.
    fn barrier(&self, group: &Group) -> CommResult<Handle>;

    /// Send `input` to global rank `dst` with `tag`; the handle gives the buffer back once the
    /// send buffer may be reused. Messages between a pair with one tag arrive in issue order.
    fn send(&self, input: Buffer, dst: usize, tag: u64) -> CommResult<Handle>;

    /// Receive `len` elements of `dtype` from global rank `src` with `tag`.
    fn recv(&self, src: usize, tag: u64, dtype: DType, len: usize) -> CommResult<Handle>;

    /// This rank's calls so far, in issue order.
    fn trace(&self) -> Vec<TraceEvent>;

    /// Creates the communicators of `groups` (the groups of this rank's program) up front.
    /// Backends that create a group's communicator lazily with a call that is collective over
    /// its members (MPI's `MPI_Comm_create_group`) deadlock when two ranks first use two shared
    /// groups in different orders, which an asynchronous runner such as replay does; creating
    /// them here, in an order every rank agrees on, avoids that. The default does nothing.
    fn prepare_groups(&self, groups: &[Group]) -> CommResult<()> {
        let _ = groups;
        Ok(())
    }
}

/// Blocking, typed forms of the [`Collective`] calls (issue, then wait).
pub trait CollectiveExt: Collective {
    /// Blocking typed [`Collective::all_gather`].
    fn all_gather_vec<T: Element>(&self, group: &Group, input: Vec<T>) -> CommResult<Vec<T>> {
        self.all_gather(group, T::into_buffer(input))?.wait_vec()
    }

    /// Blocking typed [`Collective::reduce_scatter`].
    fn reduce_scatter_vec<T: Element>(
        &self,
        group: &Group,
        input: Vec<T>,
        op: ReduceOp,
    ) -> CommResult<Vec<T>> {
        self.reduce_scatter(group, T::into_buffer(input), op)?
            .wait_vec()
    }

    /// Blocking typed [`Collective::all_reduce`].
    fn all_reduce_vec<T: Element>(
        &self,
        group: &Group,
        input: Vec<T>,
        op: ReduceOp,
    ) -> CommResult<Vec<T>> {
        self.all_reduce(group, T::into_buffer(input), op)?
            .wait_vec()
    }

    /// Blocking typed [`Collective::broadcast`].
    fn broadcast_vec<T: Element>(
        &self,
        group: &Group,
        buffer: Vec<T>,
        root: usize,
    ) -> CommResult<Vec<T>> {
        self.broadcast(group, T::into_buffer(buffer), root)?
            .wait_vec()
    }

    /// Blocking typed [`Collective::all_to_all`].
    fn all_to_all_vec<T: Element>(&self, group: &Group, input: Vec<T>) -> CommResult<Vec<T>> {
        self.all_to_all(group, T::into_buffer(input))?.wait_vec()
    }

    /// Blocking typed [`Collective::all_to_all_v`].
    fn all_to_all_v_vec<T: Element>(
        &self,
        group: &Group,
        input: Vec<T>,
        send_counts: &[usize],
        recv_counts: &[usize],
    ) -> CommResult<Vec<T>> {
        self.all_to_all_v(group, T::into_buffer(input), send_counts, recv_counts)?
            .wait_vec()
    }

    /// Blocking [`Collective::barrier`].
    fn barrier_wait(&self, group: &Group) -> CommResult<()> {
        self.barrier(group)?.wait().map(|_| ())
    }

    /// Blocking typed [`Collective::send`] (the buffer is dropped once sent).
    fn send_vec<T: Element>(&self, input: Vec<T>, dst: usize, tag: u64) -> CommResult<()> {
        self.send(T::into_buffer(input), dst, tag)?
            .wait()
            .map(|_| ())
    }

    /// Blocking typed [`Collective::recv`].
    fn recv_vec<T: Element>(&self, src: usize, tag: u64, len: usize) -> CommResult<Vec<T>> {
        self.recv(src, tag, T::DTYPE, len)?.wait_vec()
    }
}

impl<C: Collective + ?Sized> CollectiveExt for C {}
