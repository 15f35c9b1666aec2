//! The NCCL backend (feature `nccl`): `libnccl` and the CUDA runtime loaded at run time with
//! `libloading`, never linked, so building needs no CUDA toolkit.
//!
//! Search order: `libnccl.so.2`, `libnccl.so` (override: `HPFSDP_NCCL_LIB=/path`), and
//! `libcudart.so`, `.13`, `.12`, `.11.0` (override: `HPFSDP_CUDART_LIB=/path`). A missing
//! library is a [`crate::CommError::LibraryLoad`] naming every path tried and the variable.
//!
//! ```no_run
//! # #[cfg(feature = "nccl")] {
//! use hpfsdp_backends::{Collective, CollectiveExt, Group, ReduceOp};
//! use hpfsdp_backends::nccl::NcclComm;
//!
//! // RANK/WORLD_SIZE/LOCAL_RANK and HPFSDP_RENDEZVOUS=file:/shared/dir come from the launcher.
//! let comm = NcclComm::from_env()?;
//! let world = Group::world(comm.world_size())?;
//! let sum = comm.all_reduce_vec(&world, vec![1.0f32; 4], ReduceOp::Sum)?;
//! println!("{sum:?} in {:?} us", comm.last_device_time_us());
//! # }
//! # Ok::<(), hpfsdp_backends::CommError>(())
//! ```
//!
//! All-to-all and all-to-all-v are grouped `ncclSend`/`ncclRecv` inside
//! `ncclGroupStart/End` (works on every NCCL with send/recv, 2.7+); sub-communicators use
//! `ncclCommSplit` where the library has it (2.18+) and a fresh unique id otherwise.
//! Reductions are NCCL's own: not bitwise equal to `inproc`.

pub mod abi;
mod symbols;

use std::ffi::{CStr, c_int, c_void};
use std::sync::Arc;

use self::abi::{
    NCCL_SPLIT_MIN_VERSION, NCCL_SPLIT_NOCOLOR, NCCL_SUCCESS, NCCL_UNIQUE_ID_BYTES, NcclCommHandle,
    NcclUniqueId, decode_version, nccl_dtype, nccl_op,
};
use self::symbols::NcclFns;
use crate::device::cublas::{CUBLAS_SPEC, Cublas};
use crate::device::cuda::CudaRuntime;
use crate::device::cuda_driver::CudaDriver;
use crate::device::kernels::{CudaKernels, DeviceKernels};
use crate::device::library::{AllToAllVLayout, Launch};
use crate::device::{
    CollLibrary, DevPtr, DeviceComm, DeviceRuntime, EnvLookup, IdExchange, LibrarySet, LibrarySpec,
    P2pDirection, P2pOp, RawComm, WorldSpec, exchange_from_lookup, process_env,
};
use crate::error::{CommError, CommResult};
use crate::types::{DType, ReduceOp};

/// Where NCCL is looked for; `HPFSDP_NCCL_LIB` overrides the list.
pub const NCCL_SPEC: LibrarySpec = LibrarySpec {
    backend: "nccl",
    library: "NCCL",
    env_var: "HPFSDP_NCCL_LIB",
    candidates: &["libnccl.so.2", "libnccl.so"],
};

/// One rank's NCCL communicator: the [`crate::Collective`] trait plus device buffers and
/// per-call device times (see [`DeviceComm`]).
pub type NcclComm = DeviceComm<NcclLibrary>;

/// The loaded NCCL and CUDA runtime.
pub struct NcclLibrary {
    fns: NcclFns,
    libs: LibrarySet,
    runtime: Arc<dyn DeviceRuntime>,
    driver: CommResult<Arc<CudaDriver>>,
    cublas_override: Option<String>,
    cudart_paths: Vec<String>,
    version: c_int,
}

impl NcclLibrary {
    /// Load NCCL ([`NCCL_SPEC`]) and the CUDA runtime, searching through `lookup` for the
    /// override variables.
    pub fn load(lookup: EnvLookup<'_>) -> CommResult<NcclLibrary> {
        let libs = LibrarySet::open(&NCCL_SPEC, lookup)?;
        let fns = NcclFns::resolve(&libs)?;
        let cudart = CudaRuntime::load(lookup)?;
        let cudart_paths = cudart.paths().iter().map(|p| p.to_string()).collect();
        let driver = cudart.driver();
        let mut lib = NcclLibrary {
            fns,
            libs,
            runtime: Arc::new(cudart),
            driver,
            cublas_override: lookup(CUBLAS_SPEC.env_var),
            cudart_paths,
            version: 0,
        };
        let mut v: c_int = 0;
        // SAFETY: valid out-pointer.
        lib.check(
            unsafe { (lib.fns.get_version)(&mut v) },
            "ncclGetVersion",
            None,
        )?;
        lib.version = v;
        Ok(lib)
    }

    /// `(major, minor, patch)` of the loaded NCCL.
    pub fn version(&self) -> (u32, u32, u32) {
        decode_version(self.version)
    }

    fn check(&self, code: c_int, call: &str, comm: Option<NcclCommHandle>) -> CommResult<()> {
        if code == NCCL_SUCCESS {
            return Ok(());
        }
        // SAFETY: ncclGetErrorString returns a static string for any code.
        let mut message = unsafe { cstr((self.fns.get_error_string)(code)) };
        if let (Some(last), Some(c)) = (self.fns.get_last_error, comm) {
            // SAFETY: ncclGetLastError returns the thread's last error text (or null).
            let detail = unsafe { cstr(last(c)) };
            if !detail.is_empty() {
                message = format!("{message}: {detail}");
            }
        }
        Err(CommError::DeviceCall {
            backend: "nccl".into(),
            call: call.to_string(),
            code: i64::from(code),
            message,
        })
    }

    /// Run `body` between `ncclGroupStart` and `ncclGroupEnd` (the end is always called).
    fn grouped(&self, body: impl FnOnce() -> CommResult<()>) -> CommResult<()> {
        // SAFETY: no arguments.
        self.check(unsafe { (self.fns.group_start)() }, "ncclGroupStart", None)?;
        let r = body();
        // SAFETY: no arguments; closes the group opened above.
        let end = self.check(unsafe { (self.fns.group_end)() }, "ncclGroupEnd", None);
        r.and(end)
    }

    fn send(
        &self,
        ptr: DevPtr,
        count: usize,
        dtype: DType,
        peer: usize,
        at: Launch,
    ) -> CommResult<()> {
        // SAFETY: `ptr` holds `count` elements of `dtype` (sized by the caller); live handles.
        let code = unsafe {
            (self.fns.send)(
                ptr.0,
                count,
                nccl_dtype(dtype) as c_int,
                peer as c_int,
                at.comm.0,
                at.stream.0,
            )
        };
        self.check(
            code,
            &format!("ncclSend({count} x {dtype} to {peer})"),
            Some(at.comm.0),
        )
    }

    fn recv(
        &self,
        ptr: DevPtr,
        count: usize,
        dtype: DType,
        peer: usize,
        at: Launch,
    ) -> CommResult<()> {
        // SAFETY: as for send.
        let code = unsafe {
            (self.fns.recv)(
                ptr.0,
                count,
                nccl_dtype(dtype) as c_int,
                peer as c_int,
                at.comm.0,
                at.stream.0,
            )
        };
        self.check(
            code,
            &format!("ncclRecv({count} x {dtype} from {peer})"),
            Some(at.comm.0),
        )
    }
}

/// A C string returned by a library, or an empty string for null.
///
/// # Safety
/// `p` is null or points to a NUL-terminated string that outlives the call.
unsafe fn cstr(p: *const std::ffi::c_char) -> String {
    if p.is_null() {
        String::new()
    } else {
        // SAFETY: forwarded to the caller.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}

impl CollLibrary for NcclLibrary {
    const BACKEND: &'static str = "nccl";
    const ID_BYTES: usize = NCCL_UNIQUE_ID_BYTES;

    fn runtime(&self) -> &Arc<dyn DeviceRuntime> {
        &self.runtime
    }

    fn describe(&self) -> String {
        let (a, b, c) = self.version();
        format!(
            "NCCL {a}.{b}.{c} ({}), CUDA runtime ({})",
            self.libs.paths().join(", "),
            self.cudart_paths.join(", ")
        )
    }

    fn unique_id(&self) -> CommResult<Vec<u8>> {
        let mut id = NcclUniqueId {
            internal: [0; NCCL_UNIQUE_ID_BYTES],
        };
        // SAFETY: valid out-pointer to a 128-byte id.
        self.check(
            unsafe { (self.fns.get_unique_id)(&mut id) },
            "ncclGetUniqueId",
            None,
        )?;
        Ok(id.to_bytes())
    }

    fn init_rank(&self, id: &[u8], nranks: usize, rank: usize) -> CommResult<RawComm> {
        let id = NcclUniqueId::from_bytes(id).ok_or_else(|| CommError::Unavailable {
            backend: "nccl".into(),
            reason: format!(
                "a unique id must be {NCCL_UNIQUE_ID_BYTES} bytes, got {}",
                id.len()
            ),
        })?;
        let mut comm: NcclCommHandle = std::ptr::null_mut();
        // SAFETY: valid out-pointer; the id is passed by value as the header declares.
        let code =
            unsafe { (self.fns.comm_init_rank)(&mut comm, nranks as c_int, id, rank as c_int) };
        self.check(
            code,
            &format!("ncclCommInitRank(nranks={nranks}, rank={rank})"),
            None,
        )?;
        Ok(RawComm(comm))
    }

    fn can_split(&self) -> bool {
        self.fns.comm_split.is_some() && self.version >= NCCL_SPLIT_MIN_VERSION
    }

    fn split(&self, parent: RawComm, member: bool, key: usize) -> CommResult<Option<RawComm>> {
        let Some(split) = self.fns.comm_split.filter(|_| self.can_split()) else {
            return Err(CommError::Unavailable {
                backend: "nccl".into(),
                reason: "ncclCommSplit needs NCCL 2.18 or newer".into(),
            });
        };
        let color = if member { 0 } else { NCCL_SPLIT_NOCOLOR };
        let mut comm: NcclCommHandle = std::ptr::null_mut();
        // SAFETY: live parent, valid out-pointer, null config (library defaults).
        let code = unsafe {
            split(
                parent.0,
                color,
                key as c_int,
                &mut comm,
                std::ptr::null_mut::<c_void>(),
            )
        };
        self.check(
            code,
            &format!("ncclCommSplit(color={color}, key={key})"),
            Some(parent.0),
        )?;
        Ok((member && !comm.is_null()).then_some(RawComm(comm)))
    }

    fn destroy(&self, comm: RawComm) -> CommResult<()> {
        // SAFETY: a communicator from init_rank/split, destroyed once.
        self.check(
            unsafe { (self.fns.comm_destroy)(comm.0) },
            "ncclCommDestroy",
            None,
        )
    }

    fn supports(&self, _op: ReduceOp) -> bool {
        true
    }

    fn kernels(
        &self,
        device_index: usize,
        gemm: bool,
    ) -> CommResult<Option<Box<dyn DeviceKernels>>> {
        let driver = self.driver.clone()?;
        let cublas = if gemm {
            let forced = self.cublas_override.clone();
            let lookup = move |k: &str| (k == CUBLAS_SPEC.env_var).then(|| forced.clone())?;
            driver.make_current(device_index)?;
            Some(Cublas::load(&lookup)?)
        } else {
            None
        };
        Ok(Some(Box::new(CudaKernels::new(
            driver,
            device_index,
            cublas,
        )?)))
    }

    fn all_gather(
        &self,
        send: DevPtr,
        recv: DevPtr,
        count: usize,
        dtype: DType,
        at: Launch,
    ) -> CommResult<()> {
        // SAFETY: buffers sized by the caller for `count` per rank; live handles.
        let code = unsafe {
            (self.fns.all_gather)(
                send.0,
                recv.0,
                count,
                nccl_dtype(dtype) as c_int,
                at.comm.0,
                at.stream.0,
            )
        };
        self.check(
            code,
            &format!("ncclAllGather({count} x {dtype})"),
            Some(at.comm.0),
        )
    }

    fn reduce_scatter(
        &self,
        send: DevPtr,
        recv: DevPtr,
        recv_count: usize,
        dtype: DType,
        op: ReduceOp,
        at: Launch,
    ) -> CommResult<()> {
        // SAFETY: as above.
        let code = unsafe {
            (self.fns.reduce_scatter)(
                send.0,
                recv.0,
                recv_count,
                nccl_dtype(dtype) as c_int,
                nccl_op(op) as c_int,
                at.comm.0,
                at.stream.0,
            )
        };
        self.check(
            code,
            &format!("ncclReduceScatter({recv_count} x {dtype}, {op})"),
            Some(at.comm.0),
        )
    }

    fn all_reduce(
        &self,
        send: DevPtr,
        recv: DevPtr,
        count: usize,
        dtype: DType,
        op: ReduceOp,
        at: Launch,
    ) -> CommResult<()> {
        // SAFETY: as above.
        let code = unsafe {
            (self.fns.all_reduce)(
                send.0,
                recv.0,
                count,
                nccl_dtype(dtype) as c_int,
                nccl_op(op) as c_int,
                at.comm.0,
                at.stream.0,
            )
        };
        self.check(
            code,
            &format!("ncclAllReduce({count} x {dtype}, {op})"),
            Some(at.comm.0),
        )
    }

    fn broadcast(
        &self,
        buf: DevPtr,
        count: usize,
        dtype: DType,
        root: usize,
        at: Launch,
    ) -> CommResult<()> {
        // SAFETY: in place (sendbuff == recvbuff), as ncclBcast does.
        let code = unsafe {
            (self.fns.broadcast)(
                buf.0,
                buf.0,
                count,
                nccl_dtype(dtype) as c_int,
                root as c_int,
                at.comm.0,
                at.stream.0,
            )
        };
        self.check(
            code,
            &format!("ncclBroadcast({count} x {dtype}, root={root})"),
            Some(at.comm.0),
        )
    }

    fn all_to_all(
        &self,
        send: DevPtr,
        recv: DevPtr,
        count: usize,
        nranks: usize,
        dtype: DType,
        at: Launch,
    ) -> CommResult<()> {
        let counts = vec![count; nranks];
        self.all_to_all_v(
            send,
            recv,
            &AllToAllVLayout::packed(&counts, &counts),
            dtype,
            at,
        )
    }

    fn all_to_all_v(
        &self,
        send: DevPtr,
        recv: DevPtr,
        layout: &AllToAllVLayout,
        dtype: DType,
        at: Launch,
    ) -> CommResult<()> {
        let esz = dtype.size_bytes();
        self.grouped(|| {
            for peer in 0..layout.send_counts.len() {
                let (sc, rc) = (layout.send_counts[peer], layout.recv_counts[peer]);
                if sc > 0 {
                    self.send(
                        send.offset(layout.send_displs[peer] * esz),
                        sc,
                        dtype,
                        peer,
                        at,
                    )?;
                }
                if rc > 0 {
                    self.recv(
                        recv.offset(layout.recv_displs[peer] * esz),
                        rc,
                        dtype,
                        peer,
                        at,
                    )?;
                }
            }
            Ok(())
        })
    }

    fn p2p_batch(&self, ops: &[P2pOp], at: Launch) -> CommResult<()> {
        self.grouped(|| {
            for op in ops {
                match op.direction {
                    P2pDirection::Send => self.send(op.ptr, op.count, op.dtype, op.peer, at)?,
                    P2pDirection::Recv => self.recv(op.ptr, op.count, op.dtype, op.peer, at)?,
                }
            }
            Ok(())
        })
    }
}

impl DeviceComm<NcclLibrary> {
    /// Everything from the process environment: the libraries (`HPFSDP_NCCL_LIB`,
    /// `HPFSDP_CUDART_LIB`), rank and world (`RANK`/`WORLD_SIZE`, `OMPI_COMM_WORLD_*`, ...),
    /// device (`HPFSDP_DEVICE`/`LOCAL_RANK`) and rendezvous (`HPFSDP_RENDEZVOUS`).
    pub fn from_env() -> CommResult<NcclComm> {
        NcclComm::from_lookup(&process_env)
    }

    /// [`NcclComm::from_env`] with every variable read through `lookup`.
    pub fn from_lookup(lookup: EnvLookup<'_>) -> CommResult<NcclComm> {
        let world = WorldSpec::from_lookup(lookup)?;
        let lib = NcclLibrary::load(lookup)?;
        let exchange = exchange_from_lookup(&world, lookup)?;
        DeviceComm::new(lib, world, exchange)
    }

    /// Libraries from the process environment; rank, world and id exchange given (e.g. the MPI
    /// backend's broadcast).
    pub fn with_exchange(world: WorldSpec, exchange: Box<dyn IdExchange>) -> CommResult<NcclComm> {
        let lib = NcclLibrary::load(&process_env)?;
        DeviceComm::new(lib, world, exchange)
    }
}
