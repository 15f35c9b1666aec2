//! The HCCL backend (feature `hccl`): HCCL and the ACL runtime loaded at run time with
//! `libloading`, never linked, so building needs no CANN toolkit.
//!
//! Search order: `libhccl.so` (override `HPFSDP_HCCL_LIB=/path`) and `libhcomm.so` (override
//! `HPFSDP_HCOMM_LIB=/path`; newer CANN moved communicator management there), symbols resolved
//! from the first then the second; ACL from `libascendcl.so` (override `HPFSDP_ACL_LIB=/path`).
//! A missing library is a [`crate::CommError::LibraryLoad`] naming every path tried and the
//! variables.
//!
//! Mapping onto HCCL: broadcast is in place (`HcclBroadcast`), all-to-all is `HcclAlltoAll`,
//! all-to-all-v is `HcclAlltoAllV` with `u64` counts and displacements in elements, send/recv
//! batches are `HcclBatchSendRecv`. HCCL has no average reduction: host-buffer calls sum and
//! divide once on the host after the copy back; device-buffer calls refuse it. Sub-communicators
//! get a root info of their own through the rendezvous (`HcclCreateSubCommConfig` would need
//! `HcclCommConfig`, whose layout changes between CANN releases). Reductions are HCCL's own:
//! not bitwise equal to `inproc`.

pub mod abi;
mod symbols;

use std::ffi::{CStr, c_void};
use std::sync::Arc;

use self::abi::{
    HCCL_ROOT_INFO_BYTES, HCCL_SUCCESS, HcclCommHandle, HcclResult, HcclRootInfo, HcclSendRecvItem,
    HcclSendRecvType, hccl_dtype, hccl_op,
};
use self::symbols::HcclFns;
use crate::device::acl::AclRuntime;
use crate::device::library::{AllToAllVLayout, Launch};
use crate::device::{
    CollLibrary, DevPtr, DeviceComm, DeviceRuntime, EnvLookup, IdExchange, LibrarySet, LibrarySpec,
    P2pDirection, P2pOp, RawComm, WorldSpec, exchange_from_lookup, process_env,
};
use crate::error::{CommError, CommResult};
use crate::types::{DType, ReduceOp};

/// Where HCCL is looked for first; `HPFSDP_HCCL_LIB` overrides it.
pub const HCCL_SPEC: LibrarySpec = LibrarySpec {
    backend: "hccl",
    library: "HCCL",
    env_var: "HPFSDP_HCCL_LIB",
    candidates: &["libhccl.so"],
};

/// Where HCCL's communicator management is looked for second (CANN >= 8.5);
/// `HPFSDP_HCOMM_LIB` overrides it.
pub const HCOMM_SPEC: LibrarySpec = LibrarySpec {
    backend: "hccl",
    library: "HCOMM",
    env_var: "HPFSDP_HCOMM_LIB",
    candidates: &["libhcomm.so"],
};

/// One rank's HCCL communicator: the [`crate::Collective`] trait plus device buffers and
/// per-call device times (see [`DeviceComm`]).
pub type HcclComm = DeviceComm<HcclLibrary>;

/// The loaded HCCL and ACL runtime.
pub struct HcclLibrary {
    fns: HcclFns,
    libs: LibrarySet,
    runtime: Arc<dyn DeviceRuntime>,
    acl_paths: Vec<String>,
}

impl HcclLibrary {
    /// Load HCCL ([`HCCL_SPEC`], then [`HCOMM_SPEC`]) and ACL, searching through `lookup` for
    /// the override variables.
    pub fn load(lookup: EnvLookup<'_>) -> CommResult<HcclLibrary> {
        let libs = LibrarySet::open_any("hccl", &[&HCCL_SPEC, &HCOMM_SPEC], lookup)?;
        let fns = HcclFns::resolve(&libs)?;
        let acl = AclRuntime::load(lookup)?;
        let acl_paths = acl.paths().iter().map(|p| p.to_string()).collect();
        Ok(HcclLibrary {
            fns,
            libs,
            runtime: Arc::new(acl),
            acl_paths,
        })
    }

    fn check(&self, code: HcclResult, call: &str) -> CommResult<()> {
        if code == HCCL_SUCCESS {
            return Ok(());
        }
        let message = match self.fns.get_error_string {
            // SAFETY: HcclGetErrorString returns a static string (or null).
            Some(f) => unsafe {
                let p = f(code);
                if p.is_null() {
                    String::new()
                } else {
                    CStr::from_ptr(p).to_string_lossy().into_owned()
                }
            },
            None => String::from("(HcclGetErrorString not available)"),
        };
        Err(CommError::DeviceCall {
            backend: "hccl".into(),
            call: call.to_string(),
            code: i64::from(code),
            message,
        })
    }

    fn op_code(op: ReduceOp) -> CommResult<i32> {
        hccl_op(op)
            .map(|o| o as i32)
            .ok_or_else(|| CommError::Unavailable {
                backend: "hccl".into(),
                reason: format!("HCCL has no {op} reduction"),
            })
    }
}

fn u32_of(what: &str, v: usize) -> CommResult<u32> {
    u32::try_from(v).map_err(|_| CommError::Unavailable {
        backend: "hccl".into(),
        reason: format!("{what} {v} does not fit HCCL's uint32_t"),
    })
}

impl CollLibrary for HcclLibrary {
    const BACKEND: &'static str = "hccl";
    const ID_BYTES: usize = HCCL_ROOT_INFO_BYTES;

    fn runtime(&self) -> &Arc<dyn DeviceRuntime> {
        &self.runtime
    }

    fn describe(&self) -> String {
        format!(
            "HCCL ({}), ACL ({})",
            self.libs.paths().join(", "),
            self.acl_paths.join(", ")
        )
    }

    fn unique_id(&self) -> CommResult<Vec<u8>> {
        let mut info = HcclRootInfo {
            internal: [0; HCCL_ROOT_INFO_BYTES],
        };
        // SAFETY: valid out-pointer to a 4108-byte root info.
        self.check(
            unsafe { (self.fns.get_root_info)(&mut info) },
            "HcclGetRootInfo",
        )?;
        Ok(info.to_bytes())
    }

    fn init_rank(&self, id: &[u8], nranks: usize, rank: usize) -> CommResult<RawComm> {
        let info = HcclRootInfo::from_bytes(id).ok_or_else(|| CommError::Unavailable {
            backend: "hccl".into(),
            reason: format!(
                "a root info must be {HCCL_ROOT_INFO_BYTES} bytes, got {}",
                id.len()
            ),
        })?;
        let mut comm: HcclCommHandle = std::ptr::null_mut();
        let (n, r) = (u32_of("nranks", nranks)?, u32_of("rank", rank)?);
        // SAFETY: root info by pointer, out-parameter last, as hccl.h declares.
        let code = unsafe { (self.fns.comm_init_root_info)(n, &info, r, &mut comm) };
        self.check(
            code,
            &format!("HcclCommInitRootInfo(nRanks={nranks}, rank={rank})"),
        )?;
        Ok(RawComm(comm))
    }

    fn can_split(&self) -> bool {
        false
    }

    fn split(&self, _parent: RawComm, _member: bool, _key: usize) -> CommResult<Option<RawComm>> {
        Err(CommError::Unavailable {
            backend: "hccl".into(),
            reason: "splitting needs HcclCommConfig, whose layout is not stable; groups get a \
                     root info each instead"
                .into(),
        })
    }

    fn destroy(&self, comm: RawComm) -> CommResult<()> {
        // SAFETY: a communicator from init_rank, destroyed once.
        self.check(
            unsafe { (self.fns.comm_destroy)(comm.0) },
            "HcclCommDestroy",
        )
    }

    fn supports(&self, op: ReduceOp) -> bool {
        hccl_op(op).is_some()
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
                count as u64,
                hccl_dtype(dtype) as i32,
                at.comm.0,
                at.stream.0,
            )
        };
        self.check(code, &format!("HcclAllGather({count} x {dtype})"))
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
        let op_code = Self::op_code(op)?;
        // SAFETY: as above.
        let code = unsafe {
            (self.fns.reduce_scatter)(
                send.0,
                recv.0,
                recv_count as u64,
                hccl_dtype(dtype) as i32,
                op_code,
                at.comm.0,
                at.stream.0,
            )
        };
        self.check(
            code,
            &format!("HcclReduceScatter({recv_count} x {dtype}, {op})"),
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
        let op_code = Self::op_code(op)?;
        // SAFETY: as above.
        let code = unsafe {
            (self.fns.all_reduce)(
                send.0,
                recv.0,
                count as u64,
                hccl_dtype(dtype) as i32,
                op_code,
                at.comm.0,
                at.stream.0,
            )
        };
        self.check(code, &format!("HcclAllReduce({count} x {dtype}, {op})"))
    }

    fn broadcast(
        &self,
        buf: DevPtr,
        count: usize,
        dtype: DType,
        root: usize,
        at: Launch,
    ) -> CommResult<()> {
        let root32 = u32_of("root", root)?;
        // SAFETY: in place, as HcclBroadcast requires.
        let code = unsafe {
            (self.fns.broadcast)(
                buf.0,
                count as u64,
                hccl_dtype(dtype) as i32,
                root32,
                at.comm.0,
                at.stream.0,
            )
        };
        self.check(
            code,
            &format!("HcclBroadcast({count} x {dtype}, root={root})"),
        )
    }

    fn all_to_all(
        &self,
        send: DevPtr,
        recv: DevPtr,
        count: usize,
        _nranks: usize,
        dtype: DType,
        at: Launch,
    ) -> CommResult<()> {
        let dt = hccl_dtype(dtype) as i32;
        // SAFETY: buffers hold `count * nranks` elements each; live handles.
        let code = unsafe {
            (self.fns.all_to_all)(
                send.0,
                count as u64,
                dt,
                recv.0,
                count as u64,
                dt,
                at.comm.0,
                at.stream.0,
            )
        };
        self.check(code, &format!("HcclAlltoAll({count} x {dtype} per rank)"))
    }

    fn all_to_all_v(
        &self,
        send: DevPtr,
        recv: DevPtr,
        layout: &AllToAllVLayout,
        dtype: DType,
        at: Launch,
    ) -> CommResult<()> {
        let u64s = |v: &[usize]| v.iter().map(|&x| x as u64).collect::<Vec<u64>>();
        let (sc, sd) = (u64s(&layout.send_counts), u64s(&layout.send_displs));
        let (rc, rd) = (u64s(&layout.recv_counts), u64s(&layout.recv_displs));
        let dt = hccl_dtype(dtype) as i32;
        // SAFETY: host arrays of one u64 per rank, alive for the call; device buffers sized by
        // the caller from the same counts.
        let code = unsafe {
            (self.fns.all_to_all_v)(
                send.0,
                sc.as_ptr().cast::<c_void>(),
                sd.as_ptr().cast::<c_void>(),
                dt,
                recv.0,
                rc.as_ptr().cast::<c_void>(),
                rd.as_ptr().cast::<c_void>(),
                dt,
                at.comm.0,
                at.stream.0,
            )
        };
        self.check(
            code,
            &format!(
                "HcclAlltoAllV({dtype}, send counts {:?})",
                layout.send_counts
            ),
        )
    }

    fn p2p_batch(&self, ops: &[P2pOp], at: Launch) -> CommResult<()> {
        let mut items = ops
            .iter()
            .map(|op| {
                Ok(HcclSendRecvItem {
                    send_recv_type: match op.direction {
                        P2pDirection::Send => HcclSendRecvType::Send,
                        P2pDirection::Recv => HcclSendRecvType::Recv,
                    },
                    buf: op.ptr.0,
                    count: op.count as u64,
                    data_type: hccl_dtype(op.dtype),
                    remote_rank: u32_of("peer", op.peer)?,
                })
            })
            .collect::<CommResult<Vec<_>>>()?;
        let n = u32_of("batch size", items.len())?;
        // SAFETY: `items` is a live array of `n` items whose buffers are sized by the caller.
        let code =
            unsafe { (self.fns.batch_send_recv)(items.as_mut_ptr(), n, at.comm.0, at.stream.0) };
        self.check(code, &format!("HcclBatchSendRecv({n} items)"))
    }
}

impl DeviceComm<HcclLibrary> {
    /// Everything from the process environment: the libraries (`HPFSDP_HCCL_LIB`,
    /// `HPFSDP_HCOMM_LIB`, `HPFSDP_ACL_LIB`), rank and world (`RANK`/`WORLD_SIZE`,
    /// `OMPI_COMM_WORLD_*`, ...), device (`HPFSDP_DEVICE`/`LOCAL_RANK`) and rendezvous
    /// (`HPFSDP_RENDEZVOUS`).
    pub fn from_env() -> CommResult<HcclComm> {
        HcclComm::from_lookup(&process_env)
    }

    /// [`HcclComm::from_env`] with every variable read through `lookup`.
    pub fn from_lookup(lookup: EnvLookup<'_>) -> CommResult<HcclComm> {
        let world = WorldSpec::from_lookup(lookup)?;
        let lib = HcclLibrary::load(lookup)?;
        let exchange = exchange_from_lookup(&world, lookup)?;
        DeviceComm::new(lib, world, exchange)
    }

    /// Libraries from the process environment; rank, world and id exchange given (e.g. the MPI
    /// backend's broadcast).
    pub fn with_exchange(world: WorldSpec, exchange: Box<dyn IdExchange>) -> CommResult<HcclComm> {
        let lib = HcclLibrary::load(&process_env)?;
        DeviceComm::new(lib, world, exchange)
    }
}
