//! Replay: run a rank's step program for real on a backend and record a measured timeline.
//!
//! Every rank walks **its own step program** (the one the simulator times) with real buffers
//! of the planned sizes and dtypes: collectives are issued on the backend asynchronously in
//! program order per process group, honouring the program's dependencies and per-stream
//! order ([`walker`]); compute and copy ops are calibrated busy work or real GEMMs and copies
//! ([`work`]); host ops last their planned duration. On accelerator backends (features `nccl`,
//! `hccl`) the device walker (`device`) launches every op onto device streams instead, as a
//! training framework does: device-resident collectives, device compute (`device_work`: a PTX
//! spin kernel or cuBLAS GEMMs and device copies), event-based dependencies. After `warmup` unmeasured steps, `steps`
//! measured steps are recorded and gathered on rank 0 ([`gather`]), and the median step
//! becomes a measured [`Timeline`](hpfsdp_program::step::Timeline) ([`runner`]).
//!
//! Faults ([`fault`]): a rank that panics or fails, hangs past the timeout, or issues a
//! different collective from its peers ends the replay with an error naming the rank, the op
//! index and name, and the group; nothing waits forever.

#[cfg(any(feature = "hccl", feature = "nccl"))]
pub mod device;
#[cfg(any(feature = "hccl", feature = "nccl"))]
pub mod device_work;
pub mod fault;
pub mod gather;
pub mod issue;
pub mod options;
pub mod pool;
pub mod runner;
pub mod walker;
pub mod work;

pub use fault::{FaultBoard, FaultCause, FaultOp, RankFault, ReplayError};
pub use gather::{RankMeasurement, gather_measurements};
pub use options::{ComputeMode, FaultInjection, FaultKind, ReplayOptions};
pub use runner::{
    MeasuredSteps, ReplayRank, buffer_bytes_estimate, check_injection, dependency_violations,
    measured_timeline, replay_inproc, run_rank,
};
