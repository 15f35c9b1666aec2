//! NCCL smoke test on real GPUs (or the CPU stand-in): init, every collective kind with its
//! result checked, device-resident all-reduces, per-call device times, teardown.
//!
//! One rank: `cargo run --release -p hpfsdp-backends --example nccl_smoke --features nccl`.
//! Several: launch one process per GPU with `RANK`, `WORLD_SIZE`, `LOCAL_RANK` and
//! `HPFSDP_RENDEZVOUS=file:/shared/dir` (or `tcp:host:port`) set. `HPFSDP_NCCL_LIB` and
//! `HPFSDP_CUDART_LIB` override the library search; `HPFSDP_SMOKE_ELEMS` sets the payload.
//! Exit status: 0 all correct, 1 a wrong result or failed call, 2 backend unavailable.

mod common;

use hpfsdp_backends::nccl::NcclComm;

fn main() -> std::process::ExitCode {
    common::run(NcclComm::from_env)
}
