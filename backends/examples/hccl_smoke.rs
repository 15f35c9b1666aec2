//! HCCL smoke test on Ascend NPUs (or the CPU stand-in): init, every collective kind with its
//! result checked, device-resident all-reduces, per-call device times, teardown.
//!
//! One rank: `cargo run --release -p hpfsdp-backends --example hccl_smoke --features hccl`.
//! Several: one process per NPU with `RANK`, `WORLD_SIZE`, `LOCAL_RANK` and
//! `HPFSDP_RENDEZVOUS` set. `HPFSDP_HCCL_LIB`, `HPFSDP_HCOMM_LIB` and `HPFSDP_ACL_LIB` override
//! the library search; `HPFSDP_SMOKE_ELEMS` sets the payload.
//! Exit status: 0 all correct, 1 a wrong result or failed call, 2 backend unavailable.

mod common;

use hpfsdp_backends::hccl::HcclComm;

fn main() -> std::process::ExitCode {
    common::run(HcclComm::from_env)
}
