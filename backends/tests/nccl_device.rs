//! The device-side entry points of the NCCL backend on the CPU stand-in (`tests/fake/`): the
//! device's name, the PTX spin kernel through the CUDA driver API, cuBLAS GEMMs, the
//! nccl-tests-style collbench whose timed regions hold only collective calls, and the device
//! replay walker. The stand-in proves the plumbing (symbols, arguments, order of calls), not
//! the vendor libraries.
#![cfg(feature = "nccl")]

#[path = "fake/mod.rs"]
mod fake;

use std::time::Duration;

use hpfsdp_backends::collbench::device::run_device_sweep;
use hpfsdp_backends::collbench::{BenchKind, BenchOptions};
use hpfsdp_backends::device::DeviceCollective;
use hpfsdp_backends::device::cuda_driver::CudaDriver;
use hpfsdp_backends::device::kernels::{GemmProblem, SPIN_BLOCK_THREADS, SPIN_PTX};
use hpfsdp_backends::nccl::NcclComm;
use hpfsdp_backends::replay::device::{DeviceWalker, run_device_rank};
use hpfsdp_backends::replay::{ComputeMode, FaultBoard, ReplayOptions, ReplayRank};
use hpfsdp_backends::{Buffer, CommError, DType, Group, bf16};
use hpfsdp_plan::kernel::KernelWork;
use hpfsdp_plan::{CollectiveKind as PlanKind, DType as PlanDType, Tier};
use hpfsdp_program::step::{
    Category, CollectiveOp, Group as PlanGroup, OpSpan, ProgramBuilder, StepProgram, Stream,
};

use fake::{
    env_of, fresh_dir, log_reset, log_take, on_threads, rank_env, spin_launches, timed_regions,
};

fn comm(rank: usize, n: usize, dir: &std::path::Path) -> NcclComm {
    NcclComm::from_lookup(&env_of(rank_env(rank, n, dir))).expect("nccl comm on the stand-in")
}

#[test]
fn the_device_name_comes_from_the_driver() {
    let dir = fresh_dir("dev-name");
    let c: Box<dyn DeviceCollective> = Box::new(comm(0, 1, &dir));
    assert_eq!(c.device_name().unwrap(), "NVIDIA H200");
}

#[test]
fn a_missing_driver_is_reported_by_the_calls_that_need_it() {
    let dir = fresh_dir("dev-no-driver");
    let mut env = rank_env(0, 1, &dir);
    env.retain(|(k, _)| k != "HPFSDP_CUDA_DRIVER_LIB");
    env.push((
        "HPFSDP_CUDA_DRIVER_LIB".into(),
        "/nonexistent/libcuda.so.1".into(),
    ));
    // Collectives work without the driver; the device name and kernels name what is missing.
    let c = NcclComm::from_lookup(&env_of(env)).expect("comm without the driver");
    let e = c.device_name().unwrap_err().to_string();
    assert!(
        e.contains("CUDA driver") && e.contains("HPFSDP_CUDA_DRIVER_LIB"),
        "{e}"
    );
    let e = c.load_kernels(false).err().expect("no kernels").to_string();
    assert!(e.contains("HPFSDP_CUDA_DRIVER_LIB"), "{e}");
}

#[test]
fn ptx_modules_load_and_bad_ones_name_the_call() {
    let lib = fake::fake_library().display().to_string();
    let lookup = env_of(vec![("HPFSDP_CUDA_DRIVER_LIB".into(), lib)]);
    let d = CudaDriver::load(&lookup).unwrap();
    d.make_current(0).unwrap();
    assert_eq!(d.sm_count(0).unwrap(), 4);
    let m = d.load_ptx(SPIN_PTX).unwrap();
    d.function(m, "hpfsdp_spin").unwrap();
    match d.function(m, "nope") {
        Err(CommError::DeviceCall { call, code, .. }) => {
            assert_eq!((call.as_str(), code), ("cuModuleGetFunction(nope)", 500));
        }
        other => panic!("expected a DeviceCall error, got {other:?}"),
    }
    match d.load_ptx("not ptx") {
        Err(CommError::DeviceCall { call, code, .. }) => {
            assert_eq!((call.as_str(), code), ("cuModuleLoadData(PTX)", 218));
        }
        other => panic!("expected a DeviceCall error, got {other:?}"),
    }
}

#[test]
fn the_spin_kernel_launches_one_block_per_sm_for_the_duration() {
    let dir = fresh_dir("dev-spin");
    let c = comm(0, 1, &dir);
    let k = c.load_kernels(false).unwrap().expect("CUDA kernels");
    assert!(!k.has_gemm());
    assert!(
        k.describe().contains("PTX spin kernel 4x128"),
        "{}",
        k.describe()
    );
    let stream = c.runtime().create_stream().unwrap();
    log_reset();
    k.spin(stream, 1_500_000).unwrap();
    let log = log_take();
    let spin = format!("cuLaunchKernel hpfsdp_spin grid=4 block={SPIN_BLOCK_THREADS} ns=1500000");
    assert!(log.contains(&spin), "{log:?}");
    let (n, _, grid, block) = spin_launches();
    assert!(n >= 1);
    assert_eq!((grid, block), (4, SPIN_BLOCK_THREADS));
    let e = k
        .gemm(
            stream,
            GemmProblem {
                m: 1,
                n: 1,
                k: 1,
                batch: 1,
                stride_a: 1,
                stride_b: 1,
                stride_c: 1,
            },
            c.alloc_device(DType::Bf16, 1).unwrap().ptr(),
            c.alloc_device(DType::Bf16, 1).unwrap().ptr(),
            c.alloc_device(DType::Bf16, 1).unwrap().ptr(),
        )
        .unwrap_err()
        .to_string();
    assert!(e.contains("cuBLAS"), "{e}");
}

/// Row-major `A[b] · B[b]` on the host.
fn host_gemm(a: &[f32], b: &[f32], p: &GemmProblem) -> Vec<f32> {
    let mut c = vec![0.0; p.stride_c * (p.batch - 1) + p.m * p.n];
    for q in 0..p.batch {
        for i in 0..p.m {
            for j in 0..p.n {
                c[q * p.stride_c + i * p.n + j] = (0..p.k)
                    .map(|l| a[q * p.stride_a + i * p.k + l] * b[q * p.stride_b + l * p.n + j])
                    .sum();
            }
        }
    }
    c
}

#[test]
fn cublas_gemms_compute_the_row_major_product() {
    let dir = fresh_dir("dev-gemm");
    let c = comm(0, 1, &dir);
    let k = c.load_kernels(true).unwrap().expect("CUDA kernels");
    assert!(
        k.has_gemm() && k.describe().contains("cuBLAS"),
        "{}",
        k.describe()
    );
    // Two products of [3, 5] · [5, 4]; the second B is shared (stride 0).
    let p = GemmProblem {
        m: 3,
        n: 4,
        k: 5,
        batch: 2,
        stride_a: 15,
        stride_b: 0,
        stride_c: 12,
    };
    let a: Vec<f32> = (0..30).map(|i| (i % 4) as f32).collect();
    let b: Vec<f32> = (0..20).map(|i| ((i * 3) % 5) as f32 - 1.0).collect();
    let to_bf16 =
        |v: &[f32]| Buffer::from(v.iter().map(|&x| bf16::from_f32(x)).collect::<Vec<_>>());
    let da = c.upload(&to_bf16(&a)).unwrap();
    let db = c.upload(&to_bf16(&b)).unwrap();
    let dc = c.alloc_device(DType::Bf16, 24).unwrap();
    let stream = c.runtime().create_stream().unwrap();
    k.gemm(stream, p, da.ptr(), db.ptr(), dc.ptr()).unwrap();
    c.runtime().synchronize_stream(stream).unwrap();
    assert_eq!(dc.download().unwrap(), to_bf16(&host_gemm(&a, &b, &p)));
}

fn bench_options(n: usize) -> BenchOptions {
    BenchOptions {
        kinds: BenchKind::ALL.to_vec(),
        min_bytes: 64,
        max_bytes: 4096,
        factor: 8,
        iters: 3,
        warmup: 1,
        dtype: DType::Bf16,
        groups: vec![Group::world(n).unwrap()],
        unaligned_twins: false,
        check: true,
    }
}

#[test]
fn device_collbench_times_only_collective_calls_and_checks_both_columns() {
    let dir = fresh_dir("dev-collbench");
    let results = on_threads(2, |r| {
        let c = comm(r, 2, &dir);
        log_reset();
        let mut seen = 0;
        let rows = run_device_sweep(&c, &bench_options(2), &mut |_| seen += 1).unwrap();
        (rows, seen, log_take())
    });
    for (rows, seen, log) in results {
        assert_eq!(
            rows.len(),
            seen,
            "every row is handed out as it is measured"
        );
        assert_eq!(rows.len(), 5 * 3);
        for row in &rows {
            assert_eq!(row.wrong(), Some(0), "{row:?}");
            let ip = matches!(
                row.kind,
                BenchKind::AllGather | BenchKind::ReduceScatter | BenchKind::AllReduce
            );
            assert_eq!(row.in_place.is_some(), ip, "{row:?}");
        }
        let regions = timed_regions(&log);
        // The timed calls of one size: three all-gathers back to back and nothing else.
        assert!(
            regions
                .iter()
                .any(|r| r.len() == 3 && r.iter().all(|c| c.starts_with("ncclAllGather"))),
            "{regions:?}"
        );
        // Results are checked after the timed regions (device-to-host copies exist).
        assert!(
            log.iter().any(|c| c.starts_with("cudaMemcpy D2H")),
            "{log:?}"
        );
    }
}

/// Two ranks' programs: compute, an all-gather on its own stream that the next compute waits
/// on, a reduce-scatter after it, a copy, a GEMM-mix compute, and a host op at the end.
fn programs() -> Vec<StepProgram> {
    (0..2)
        .map(|rank| {
            let mut b = ProgramBuilder::new(rank);
            let g = b.group(PlanGroup::new("dp", vec![0, 1]).unwrap());
            let coll = |kind, input_bytes, output_bytes| CollectiveOp {
                kind,
                group: g,
                tier: Tier::IntraMachine,
                input_bytes,
                output_bytes,
                dtype: PlanDType::Bf16,
                aligned_512: false,
            };
            let mix = [
                KernelWork::gemm(8, 4, 6, 1, 2),
                KernelWork::memory_bound(2, 0, 256),
            ];
            let c0 = b.compute_kernels(Stream::Compute, Category::Compute, &mix, &[]);
            let ag = b.collective(
                Stream::AllGather,
                Category::FsdpAg,
                coll(PlanKind::AllGather, 64, 128),
                &[],
            );
            let c1 = b.compute_kernels(Stream::Compute, Category::Compute, &mix, &[ag]);
            let rs = b.collective(
                Stream::ReduceScatter,
                Category::FsdpRs,
                coll(PlanKind::ReduceScatter, 128, 64),
                &[c1],
            );
            let cp = b.copy(Stream::Copy, 4096, &[c0]);
            b.host(Category::Host, 200_000, &[rs, cp]);
            b.build().unwrap()
        })
        .collect()
}

fn rank(p: &StepProgram) -> ReplayRank {
    let op_ns = p
        .ops
        .iter()
        .map(|op| match op.payload {
            hpfsdp_program::step::Payload::Compute(_) => 1_000_000,
            hpfsdp_program::step::Payload::Copy(_) => 300_000,
            hpfsdp_program::step::Payload::Host { duration_ns } => duration_ns,
            hpfsdp_program::step::Payload::Collective(_) => 0,
        })
        .collect();
    ReplayRank {
        program: p.clone(),
        launch_ns: vec![5_000; p.ops.len()],
        op_ns,
    }
}

fn options(compute: ComputeMode) -> ReplayOptions {
    ReplayOptions {
        steps: 2,
        warmup: 1,
        compute,
        timeout: Duration::from_secs(60),
        fault: None,
    }
}

fn assert_deps_respected(p: &StepProgram, spans: &[OpSpan]) {
    assert_eq!(spans.len(), p.ops.len());
    for op in &p.ops {
        let s = &spans[op.id.index()];
        assert!(s.end_ns >= s.start_ns, "{s:?}");
        for d in &op.deps {
            assert!(
                s.start_ns >= spans[d.index()].end_ns,
                "op {} started before its dependency {} ended: {spans:?}",
                op.id.index(),
                d.index()
            );
        }
    }
}

#[test]
fn device_replay_runs_every_op_on_the_device_in_busy_mode() {
    let dir = fresh_dir("dev-replay-busy");
    let programs = programs();
    let (before, before_ns, _, _) = spin_launches();
    let results = on_threads(2, |r| {
        let c = comm(r, 2, &dir);
        let board = FaultBoard::new();
        run_device_rank(&c, &rank(&programs[r]), &options(ComputeMode::Busy), &board).unwrap()
    });
    let all = results[0].measurements.clone().expect("rank 0 gathers");
    assert!(results[1].measurements.is_none());
    assert!(
        results[0].compute.contains("PTX spin kernel"),
        "{}",
        results[0].compute
    );
    for m in &all {
        assert_eq!(m.steps.len(), 2, "warm-up steps are not kept");
        for spans in &m.steps {
            assert_deps_respected(&programs[m.rank], spans);
            // The host op waited for the device's work; its 0.2 ms is measured on the host.
            let host = spans.last().unwrap();
            assert!(host.end_ns - host.start_ns >= 200_000, "{host:?}");
        }
    }
    // Three device compute/copy ops per rank per step, 3 steps, 2 ranks: one spin each of its
    // predicted duration (other tests of this binary may launch spins too).
    let (after, after_ns, _, _) = spin_launches();
    assert!(after - before >= 18, "{before} -> {after}");
    assert!(
        after_ns - before_ns >= 6 * (2 * 1_000_000 + 300_000),
        "{before_ns} -> {after_ns}"
    );
}

#[test]
fn a_device_step_allocates_nothing_and_copies_nothing_to_or_from_the_host() {
    let dir = fresh_dir("dev-replay-real");
    let programs = programs();
    let logs = on_threads(2, |r| {
        let c = comm(r, 2, &dir);
        let board = FaultBoard::new();
        let rr = rank(&programs[r]);
        let opts = options(ComputeMode::Real);
        let mut w = DeviceWalker::new(&c, &rr, &opts, &board).unwrap();
        log_reset();
        let spans = w.walk(0).unwrap();
        assert_deps_respected(&rr.program, &spans);
        log_take()
    });
    for log in logs {
        for call in &log {
            assert!(
                !(call.starts_with("cudaMemcpy ")
                    || call.starts_with("cudaMalloc")
                    || call.starts_with("cudaFree")),
                "a step holds {call}: {log:?}"
            );
        }
        let has = |p: &str| log.iter().filter(|c| c.starts_with(p)).count();
        // Real mode: the mix's GEMM (twice) and memory-bound copies, the copy op, the
        // collectives on device buffers, and a device-side wait for the all-gather.
        assert_eq!(
            has("cublasGemmStridedBatchedEx m=4 n=8 k=6 batch=1"),
            2,
            "{log:?}"
        );
        assert!(has("cudaMemcpyAsync D2D") >= 5, "{log:?}");
        assert_eq!(has("cuLaunchKernel"), 0, "{log:?}");
        assert_eq!(has("ncclAllGather"), 1, "{log:?}");
        assert_eq!(has("ncclReduceScatter"), 1, "{log:?}");
        assert!(has("cudaStreamWaitEvent") >= 2, "{log:?}");
    }
}
