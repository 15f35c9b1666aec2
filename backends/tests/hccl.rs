//! The HCCL backend without CANN: ABI layout and enum values against `hccl_types.h` (notes
//! §1.2), load failures, and the whole call path on the CPU stand-in library (`tests/fake/`):
//! root info per group through the rendezvous (HCCL never splits), `HcclAlltoAll(V)` with u64
//! counts, in-place broadcast, `HcclBatchSendRecv`, and average as sum + host division.
#![cfg(feature = "hccl")]

#[path = "fake/mod.rs"]
mod fake;

use std::mem::{align_of, offset_of, size_of};

use hpfsdp_backends::device::DeviceOp;
use hpfsdp_backends::hccl::abi::{
    HCCL_ROOT_INFO_BYTES, HcclDataType, HcclReduceOp, HcclRootInfo, HcclSendRecvItem,
    HcclSendRecvType, hccl_dtype, hccl_op,
};
use hpfsdp_backends::hccl::{HcclComm, HcclLibrary};
use hpfsdp_backends::{Buffer, Collective, CollectiveExt, CommError, DType, Group, ReduceOp};

use fake::{env_of, fake_library, fresh_dir, inproc_outputs, on_threads, rank_env, scenario};

#[test]
fn root_info_items_and_enums_match_hccl_types_h() {
    assert_eq!(HCCL_ROOT_INFO_BYTES, 4108);
    assert_eq!(size_of::<HcclRootInfo>(), 4108);
    assert_eq!(align_of::<HcclRootInfo>(), 1);
    // { int type; void *buf; uint64_t count; int dataType; uint32_t remoteRank; } on LP64.
    assert_eq!(size_of::<HcclSendRecvItem>(), 32);
    assert_eq!(align_of::<HcclSendRecvItem>(), 8);
    assert_eq!(offset_of!(HcclSendRecvItem, buf), 8);
    assert_eq!(offset_of!(HcclSendRecvItem, count), 16);
    assert_eq!(offset_of!(HcclSendRecvItem, data_type), 24);
    assert_eq!(offset_of!(HcclSendRecvItem, remote_rank), 28);
    let types = [
        (HcclDataType::Int8, 0),
        (HcclDataType::Int16, 1),
        (HcclDataType::Int32, 2),
        (HcclDataType::Fp16, 3),
        (HcclDataType::Fp32, 4),
        (HcclDataType::Int64, 5),
        (HcclDataType::Uint64, 6),
        (HcclDataType::Uint8, 7),
        (HcclDataType::Uint16, 8),
        (HcclDataType::Uint32, 9),
        (HcclDataType::Fp64, 10),
        (HcclDataType::Bfp16, 11),
    ];
    for (t, v) in types {
        assert_eq!(t as i32, v, "{t:?}");
    }
    let ops = [
        (HcclReduceOp::Sum, 0),
        (HcclReduceOp::Prod, 1),
        (HcclReduceOp::Max, 2),
        (HcclReduceOp::Min, 3),
    ];
    for (o, v) in ops {
        assert_eq!(o as i32, v, "{o:?}");
    }
    assert_eq!(
        (HcclSendRecvType::Send as i32, HcclSendRecvType::Recv as i32),
        (0, 1)
    );
    assert_eq!(hccl_dtype(DType::F32), HcclDataType::Fp32);
    assert_eq!(hccl_dtype(DType::Bf16), HcclDataType::Bfp16);
    assert_eq!(hccl_op(ReduceOp::Avg), None, "HCCL has no average");
    assert_eq!(hccl_op(ReduceOp::Max), Some(HcclReduceOp::Max));
    let bytes: Vec<u8> = (0..4108).map(|i| (i % 251) as u8).collect();
    assert_eq!(HcclRootInfo::from_bytes(&bytes).unwrap().to_bytes(), bytes);
    assert!(HcclRootInfo::from_bytes(&bytes[..128]).is_none());
}

fn load_error(pairs: Vec<(String, String)>) -> CommError {
    match HcclLibrary::load(&env_of(pairs)) {
        Ok(_) => panic!("loading should have failed"),
        Err(e) => e,
    }
}

#[test]
fn an_explicit_hccl_path_that_fails_is_reported_even_if_hcomm_would_load() {
    let missing = "/nonexistent/lib64/libhccl.so";
    let e = load_error(vec![
        ("HPFSDP_HCCL_LIB".into(), missing.into()),
        (
            "HPFSDP_HCOMM_LIB".into(),
            fake_library().display().to_string(),
        ),
    ]);
    let msg = e.to_string();
    assert!(
        msg.contains(missing) && msg.contains("HPFSDP_HCCL_LIB"),
        "{msg}"
    );
}

#[test]
fn without_any_hccl_every_candidate_and_variable_is_named() {
    match HcclLibrary::load(&env_of(vec![])) {
        Err(e) => {
            let msg = e.to_string();
            for needle in [
                "libhccl.so",
                "libhcomm.so",
                "HPFSDP_HCCL_LIB",
                "HPFSDP_HCOMM_LIB",
            ] {
                assert!(msg.contains(needle), "{needle} missing from: {msg}");
            }
        }
        // A machine with CANN installed: the real library must describe itself.
        Ok(lib) => {
            use hpfsdp_backends::device::CollLibrary;
            assert!(lib.describe().starts_with("HCCL ("), "{}", lib.describe());
        }
    }
}

#[test]
fn a_missing_acl_names_its_own_variable() {
    let e = load_error(vec![
        (
            "HPFSDP_HCCL_LIB".into(),
            fake_library().display().to_string(),
        ),
        (
            "HPFSDP_ACL_LIB".into(),
            "/nonexistent/libascendcl.so".into(),
        ),
    ]);
    let msg = e.to_string();
    assert!(
        msg.contains("ACL runtime") && msg.contains("HPFSDP_ACL_LIB"),
        "{msg}"
    );
}

fn comm(rank: usize, n: usize, dir: &std::path::Path) -> HcclComm {
    HcclComm::from_lookup(&env_of(rank_env(rank, n, dir))).expect("hccl comm on the stand-in")
}

#[test]
fn three_ranks_match_inproc_with_a_root_info_per_group() {
    let dir = fresh_dir("hccl-three");
    let want = inproc_outputs(3, true);
    let got = on_threads(3, |r| {
        let c = comm(r, 3, &dir);
        assert_eq!(c.backend_name(), "hccl");
        scenario(&c, true).expect("scenario")
    });
    assert_eq!(got, want);
    // One root info file per group communicator: world, evens [0,2], alone0..alone2.
    let ids = std::fs::read_dir(&dir).unwrap().count();
    assert_eq!(ids, 5, "rendezvous files in {}", dir.display());
}

#[test]
fn one_rank_world_logs_a_device_time_per_call() {
    let dir = fresh_dir("hccl-one");
    let c = comm(0, 1, &dir);
    assert_eq!(
        scenario(&c, true).expect("scenario"),
        inproc_outputs(1, true)[0]
    );
    assert_eq!(c.device_times().len(), c.trace().len());
}

#[test]
fn average_is_refused_on_device_buffers_where_hccl_has_none() {
    let dir = fresh_dir("hccl-avg");
    let c = comm(0, 1, &dir);
    let g = Group::world(1).unwrap();
    let x = c.upload(&Buffer::from(vec![2.0f32; 4])).unwrap();
    let e = c
        .issue_device(
            &g,
            DeviceOp::AllReduce {
                send: &x,
                recv: &x,
                op: ReduceOp::Avg,
            },
        )
        .err()
        .expect("avg on device buffers");
    assert!(e.to_string().contains("avg"), "{e}");
    // The host path sums natively and divides once on the host.
    assert_eq!(
        c.all_reduce_vec(&g, vec![2.0f32, 4.0], ReduceOp::Avg)
            .unwrap(),
        vec![2.0, 4.0]
    );
    let w = c
        .issue_device(
            &g,
            DeviceOp::Broadcast {
                buffer: &x,
                root: 0,
            },
        )
        .expect("in-place broadcast");
    assert!(w.wait().unwrap() >= 0.0);
}

#[test]
fn the_soc_name_and_device_sweep_work_without_device_kernels() {
    use hpfsdp_backends::collbench::device::run_device_sweep;
    use hpfsdp_backends::collbench::{BenchKind, BenchOptions};
    use hpfsdp_backends::device::DeviceCollective;
    let dir = fresh_dir("hccl-device-sweep");
    let results = on_threads(2, |r| {
        let c = HcclComm::from_lookup(&env_of(rank_env(r, 2, &dir))).unwrap();
        assert_eq!(c.device_name().unwrap(), "Ascend910B2");
        assert!(
            c.load_kernels(false).unwrap().is_none(),
            "ACL loads no kernels"
        );
        let o = BenchOptions {
            kinds: BenchKind::ALL.to_vec(),
            min_bytes: 512,
            max_bytes: 2048,
            factor: 4,
            iters: 2,
            warmup: 1,
            dtype: DType::F32,
            groups: vec![Group::world(2).unwrap()],
            unaligned_twins: false,
            check: true,
        };
        let dc: &dyn DeviceCollective = &c;
        run_device_sweep(dc, &o, &mut |_| {}).unwrap()
    });
    for rows in results {
        assert_eq!(rows.len(), 5 * 2);
        assert!(rows.iter().all(|r| r.wrong() == Some(0)), "{rows:?}");
    }
}

#[test]
fn device_replay_on_hccl_refuses_real_compute_and_runs_busy_compute_on_the_host() {
    use hpfsdp_backends::replay::device::DeviceWalker;
    use hpfsdp_backends::replay::{ComputeMode, FaultBoard, ReplayOptions};
    use hpfsdp_program::step::{ComputeWork, ProgramBuilder, Stream};
    let mut b = ProgramBuilder::new(0);
    let c0 = b.compute(ComputeWork::memory_bound(0, 1024, 1), &[]);
    b.copy(Stream::Copy, 1024, &[c0]);
    let rank = hpfsdp_backends::replay::ReplayRank {
        program: b.build().unwrap(),
        op_ns: vec![300_000, 100_000],
        launch_ns: vec![0, 0],
    };
    let dir = fresh_dir("hccl-device-replay");
    let c = HcclComm::from_lookup(&env_of(rank_env(0, 1, &dir))).unwrap();
    let board = FaultBoard::new();
    let mut o = ReplayOptions {
        compute: ComputeMode::Real,
        ..ReplayOptions::default()
    };
    let e = DeviceWalker::new(&c, &rank, &o, &board)
        .err()
        .expect("no device GEMMs on ACL");
    assert!(
        e.contains("--compute real") && e.contains("--compute busy"),
        "{e}"
    );
    o.compute = ComputeMode::Busy;
    let mut w = DeviceWalker::new(&c, &rank, &o, &board).unwrap();
    assert!(w.compute_description().contains("host spin"));
    let spans = w.walk(0).unwrap();
    assert!(spans[0].end_ns - spans[0].start_ns >= 300_000, "{spans:?}");
    assert!(spans[1].start_ns >= spans[0].end_ns, "{spans:?}");
}
