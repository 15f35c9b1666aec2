//! The few raw MPI calls the backend makes, each wrapped so that a failure becomes a
//! [`CommError`] with MPI's own error string, plus the request type polled against a deadline.
//!
//! Every communicator the backend uses has `MPI_ERRORS_RETURN` set, so MPI reports errors
//! (truncation, invalid counts) as return codes instead of aborting the job.

use std::os::raw::{c_int, c_void};
use std::time::{Duration, Instant};

use mpi::ffi;

use crate::error::{CommError, CommResult};

/// A raw communicator handle.
pub(crate) type RawComm = ffi::MPI_Comm;

/// The MPI datatype of raw bytes (`MPI_UINT8_T`).
pub(crate) fn byte_type() -> ffi::MPI_Datatype {
    // SAFETY: reading an extern constant initialised by the rsmpi C shim.
    unsafe { ffi::RSMPI_UINT8_T }
}

/// `MPI_FLOAT`.
pub(crate) fn f32_type() -> ffi::MPI_Datatype {
    // SAFETY: as in `byte_type`.
    unsafe { ffi::RSMPI_FLOAT }
}

/// `MPI_DOUBLE`.
pub(crate) fn f64_type() -> ffi::MPI_Datatype {
    // SAFETY: as in `byte_type`.
    unsafe { ffi::RSMPI_DOUBLE }
}

/// `MPI_UINT32_T`.
pub(crate) fn u32_type() -> ffi::MPI_Datatype {
    // SAFETY: as in `byte_type`.
    unsafe { ffi::RSMPI_UINT32_T }
}

/// MPI's text for an error code.
pub(crate) fn error_string(code: c_int) -> String {
    let mut buf = vec![0u8; 512];
    let mut len: c_int = 0;
    // SAFETY: the buffer is at least MPI_MAX_ERROR_STRING (256) bytes long.
    let rc = unsafe { ffi::MPI_Error_string(code, buf.as_mut_ptr().cast(), &mut len) };
    if rc != 0 {
        return format!("MPI error code {code}");
    }
    buf.truncate(len.max(0) as usize);
    String::from_utf8_lossy(&buf).into_owned()
}

/// Turn an MPI return code into a result naming the call.
pub(crate) fn check(rc: c_int, what: &str) -> CommResult<()> {
    if rc == 0 {
        Ok(())
    } else {
        Err(CommError::Unavailable {
            backend: "mpi".into(),
            reason: format!("{what} failed: {}", error_string(rc)),
        })
    }
}

/// A length as an MPI count, or an error naming the limit.
pub(crate) fn count(n: usize, what: &str) -> CommResult<c_int> {
    c_int::try_from(n).map_err(|_| CommError::Unavailable {
        backend: "mpi".into(),
        reason: format!("{what}: {n} exceeds MPI's 32-bit count limit; split the payload"),
    })
}

/// Make `comm` return error codes instead of aborting.
pub(crate) fn errors_return(comm: RawComm) -> CommResult<()> {
    // SAFETY: `comm` is a valid communicator; the handler is a predefined constant.
    check(
        unsafe { ffi::MPI_Comm_set_errhandler(comm, ffi::RSMPI_ERRORS_RETURN) },
        "MPI_Comm_set_errhandler",
    )
}

/// `MPI_Comm_dup` with errors returned.
pub(crate) fn dup(comm: RawComm) -> CommResult<RawComm> {
    // SAFETY: null placeholder overwritten by MPI_Comm_dup.
    let mut out: RawComm = unsafe { ffi::RSMPI_COMM_NULL };
    // SAFETY: valid communicator and out-pointer.
    check(unsafe { ffi::MPI_Comm_dup(comm, &mut out) }, "MPI_Comm_dup")?;
    errors_return(out)?;
    Ok(out)
}

/// The world communicator.
pub(crate) fn world() -> RawComm {
    // SAFETY: reading an extern constant.
    unsafe { ffi::RSMPI_COMM_WORLD }
}

/// The largest tag `comm` accepts (`MPI_TAG_UB`, at least 32767).
pub(crate) fn tag_ub(comm: RawComm) -> c_int {
    let mut value: *mut c_int = std::ptr::null_mut();
    let mut flag: c_int = 0;
    // SAFETY: MPI_TAG_UB's attribute value is a pointer to an int owned by MPI.
    let rc = unsafe {
        ffi::MPI_Comm_get_attr(
            comm,
            ffi::MPI_TAG_UB as c_int,
            (&mut value as *mut *mut c_int).cast::<c_void>(),
            &mut flag,
        )
    };
    if rc != 0 || flag == 0 || value.is_null() {
        return 32767;
    }
    // SAFETY: MPI guarantees the pointer is valid when flag is set.
    unsafe { *value }.max(32767)
}

/// A communicator over the global `ranks` (ascending) of world, created collectively by those
/// ranks only (`MPI_Comm_create_group`); member `i` of the result is `ranks[i]`.
pub(crate) fn create_group_comm(
    parent: RawComm,
    ranks: &[usize],
    tag: c_int,
) -> CommResult<RawComm> {
    let ranks_c: Vec<c_int> = ranks
        .iter()
        .map(|&r| count(r, "rank"))
        .collect::<CommResult<_>>()?;
    // SAFETY: out-pointers are written by MPI; `ranks_c` outlives the calls.
    unsafe {
        let mut world_group: ffi::MPI_Group = ffi::RSMPI_GROUP_NULL;
        check(
            ffi::MPI_Comm_group(parent, &mut world_group),
            "MPI_Comm_group",
        )?;
        let mut sub: ffi::MPI_Group = ffi::RSMPI_GROUP_NULL;
        let rc = ffi::MPI_Group_incl(
            world_group,
            count(ranks.len(), "group size")?,
            ranks_c.as_ptr(),
            &mut sub,
        );
        ffi::MPI_Group_free(&mut world_group);
        check(rc, "MPI_Group_incl")?;
        let mut out: RawComm = ffi::RSMPI_COMM_NULL;
        let rc = ffi::MPI_Comm_create_group(parent, sub, tag, &mut out);
        ffi::MPI_Group_free(&mut sub);
        check(rc, "MPI_Comm_create_group")?;
        errors_return(out)?;
        Ok(out)
    }
}

/// `MPI_Abort` on the world communicator: ends every process of the job.
pub(crate) fn abort(code: i32) -> ! {
    // SAFETY: MPI is initialised while a communicator exists; MPI_Abort does not return.
    unsafe {
        ffi::MPI_Abort(world(), code);
    }
    std::process::exit(code)
}

/// One outstanding non-blocking operation.
pub(crate) struct Request {
    raw: ffi::MPI_Request,
    done: bool,
    /// Bytes received (receives only), filled in when the request completes.
    pub received_bytes: Option<usize>,
}

// SAFETY: a request is a plain handle; the backend serialises every MPI call behind one mutex
// and initialises MPI with MPI_THREAD_SERIALIZED.
unsafe impl Send for Request {}

impl Request {
    /// Start an operation with `post`, which writes the request handle.
    pub(crate) fn post(
        what: &str,
        post: impl FnOnce(*mut ffi::MPI_Request) -> c_int,
    ) -> CommResult<Request> {
        // SAFETY: reading an extern constant.
        let mut raw = unsafe { ffi::RSMPI_REQUEST_NULL };
        check(post(&mut raw), what)?;
        Ok(Request {
            raw,
            done: false,
            received_bytes: None,
        })
    }

    /// Whether the operation finished (at most one `MPI_Test`).
    pub(crate) fn test(&mut self) -> CommResult<bool> {
        if self.done {
            return Ok(true);
        }
        let mut flag: c_int = 0;
        // SAFETY: zeroed status is a valid out-parameter.
        let mut status: ffi::MPI_Status = unsafe { std::mem::zeroed() };
        // SAFETY: `raw` is an active request owned by us.
        let rc = unsafe { ffi::MPI_Test(&mut self.raw, &mut flag, &mut status) };
        check(rc, "MPI_Test")?;
        if flag != 0 {
            self.done = true;
            let mut n: c_int = 0;
            // SAFETY: status was filled by the completed request.
            if unsafe { ffi::MPI_Get_count(&status, byte_type(), &mut n) } == 0 && n >= 0 {
                self.received_bytes = Some(n as usize);
            }
            check(status.MPI_ERROR, "the completed request")?;
        }
        Ok(self.done)
    }
}

/// How long a waiting loop spins on `MPI_Test` before it starts sleeping between tests.
const SPIN_TESTS: u32 = 200;
/// Sleep between tests once spinning is over (keeps oversubscribed ranks from starving peers).
const POLL_SLEEP: Duration = Duration::from_micros(50);

/// Poll `reqs` until all complete or `deadline` passes; on expiry returns which are pending.
pub(crate) fn wait_all(
    reqs: &mut [Request],
    deadline: Instant,
) -> CommResult<Result<(), Vec<usize>>> {
    let mut tests = 0u32;
    loop {
        let mut pending = Vec::new();
        for (i, r) in reqs.iter_mut().enumerate() {
            if !r.test()? {
                pending.push(i);
            }
        }
        if pending.is_empty() {
            return Ok(Ok(()));
        }
        if Instant::now() >= deadline {
            return Ok(Err(pending));
        }
        tests += 1;
        if tests > SPIN_TESTS {
            std::thread::sleep(POLL_SLEEP);
        } else {
            std::hint::spin_loop();
        }
    }
}
