//! The NCCL backend without NCCL: ABI layout and enum values against `nccl.h` (notes §2.2),
//! load failures, and the whole call path on the CPU stand-in library (`tests/fake/`), whose
//! results must equal the in-process backend's bit for bit (the scenario's sums are exact).
#![cfg(feature = "nccl")]

#[path = "fake/mod.rs"]
mod fake;

use std::mem::{align_of, size_of};

use hpfsdp_backends::device::{
    DeviceCollective, DeviceOp, DeviceP2p, FileStore, StoreExchange, WorldSpec,
};
use hpfsdp_backends::nccl::abi::{
    NCCL_SPLIT_MIN_VERSION, NCCL_SPLIT_NOCOLOR, NCCL_UNIQUE_ID_BYTES, NcclDataType, NcclRedOp,
    NcclUniqueId, decode_version, nccl_dtype, nccl_op,
};
use hpfsdp_backends::nccl::{NCCL_SPEC, NcclComm, NcclLibrary};
use hpfsdp_backends::{
    Buffer, Collective, CollectiveExt, CollectiveKind, CommError, DType, Group, ReduceOp, bf16,
};

use fake::{env_of, fake_library, fresh_dir, inproc_outputs, on_threads, rank_env, scenario};

#[test]
fn unique_id_and_enums_match_nccl_h() {
    assert_eq!(NCCL_UNIQUE_ID_BYTES, 128);
    assert_eq!(size_of::<NcclUniqueId>(), 128);
    assert_eq!(align_of::<NcclUniqueId>(), 1);
    let values = [
        (NcclDataType::Int8, 0),
        (NcclDataType::Uint8, 1),
        (NcclDataType::Int32, 2),
        (NcclDataType::Uint32, 3),
        (NcclDataType::Int64, 4),
        (NcclDataType::Uint64, 5),
        (NcclDataType::Float16, 6),
        (NcclDataType::Float32, 7),
        (NcclDataType::Float64, 8),
        (NcclDataType::Bfloat16, 9),
        (NcclDataType::Float8e4m3, 10),
        (NcclDataType::Float8e5m2, 11),
    ];
    for (t, v) in values {
        assert_eq!(t as i32, v, "{t:?}");
    }
    let ops = [
        (NcclRedOp::Sum, 0),
        (NcclRedOp::Prod, 1),
        (NcclRedOp::Max, 2),
        (NcclRedOp::Min, 3),
        (NcclRedOp::Avg, 4),
    ];
    for (o, v) in ops {
        assert_eq!(o as i32, v, "{o:?}");
    }
    assert_eq!(nccl_dtype(DType::F32), NcclDataType::Float32);
    assert_eq!(nccl_dtype(DType::Bf16), NcclDataType::Bfloat16);
    assert_eq!(nccl_op(ReduceOp::Avg), NcclRedOp::Avg);
    assert_eq!(nccl_op(ReduceOp::Min), NcclRedOp::Min);
    assert_eq!(NCCL_SPLIT_NOCOLOR, -1);
    assert_eq!(decode_version(NCCL_SPLIT_MIN_VERSION), (2, 18, 0));
    assert_eq!(decode_version(23007), (2, 30, 7));
    assert_eq!(decode_version(2708), (2, 7, 8));
    let bytes: Vec<u8> = (0..128u8).collect();
    assert_eq!(NcclUniqueId::from_bytes(&bytes).unwrap().to_bytes(), bytes);
    assert!(NcclUniqueId::from_bytes(&bytes[..127]).is_none());
}

fn load_error(pairs: Vec<(String, String)>) -> CommError {
    match NcclLibrary::load(&env_of(pairs)) {
        Ok(_) => panic!("loading should have failed"),
        Err(e) => e,
    }
}

#[test]
fn a_missing_library_names_the_path_and_the_variable() {
    let missing = "/nonexistent/dir/libnccl.so.2";
    let e = load_error(vec![("HPFSDP_NCCL_LIB".into(), missing.into())]);
    assert!(matches!(e, CommError::LibraryLoad { .. }), "{e:?}");
    let msg = e.to_string();
    assert!(msg.contains(missing), "{msg}");
    assert!(msg.contains("HPFSDP_NCCL_LIB"), "{msg}");
}

#[test]
fn a_file_that_is_not_a_library_is_reported_with_the_loader_message() {
    let dir = fresh_dir("not-a-lib");
    let path = dir.join("libnccl.so.2");
    std::fs::write(&path, "this is not an ELF file\n").unwrap();
    let e = load_error(vec![("HPFSDP_NCCL_LIB".into(), path.display().to_string())]);
    let msg = e.to_string();
    assert!(msg.contains(&path.display().to_string()), "{msg}");
    assert!(msg.contains("HPFSDP_NCCL_LIB"), "{msg}");
    // The dynamic loader's own words follow the path (glibc: "invalid ELF header" / "too short").
    let after = msg.split(&path.display().to_string()).nth(1).unwrap_or("");
    assert!(after.trim_start_matches(':').trim().len() > 5, "{msg}");
}

#[test]
fn the_default_search_names_every_candidate() {
    match NcclLibrary::load(&env_of(vec![])) {
        Err(e) => {
            let msg = e.to_string();
            for c in NCCL_SPEC.candidates {
                assert!(msg.contains(c), "{msg}");
            }
            assert!(msg.contains("HPFSDP_NCCL_LIB"), "{msg}");
        }
        // A machine with NCCL and CUDA installed: the real library must describe itself.
        Ok(lib) => {
            use hpfsdp_backends::device::CollLibrary;
            assert!(lib.describe().starts_with("NCCL 2."), "{}", lib.describe());
        }
    }
}

#[test]
fn a_missing_cuda_runtime_names_its_own_variable() {
    let lib = fake_library().display().to_string();
    let e = load_error(vec![
        ("HPFSDP_NCCL_LIB".into(), lib),
        (
            "HPFSDP_CUDART_LIB".into(),
            "/nonexistent/libcudart.so".into(),
        ),
    ]);
    let msg = e.to_string();
    assert!(
        msg.contains("CUDA runtime") && msg.contains("HPFSDP_CUDART_LIB"),
        "{msg}"
    );
}

#[test]
fn a_device_index_beyond_the_visible_devices_is_a_clear_error() {
    let dir = fresh_dir("nccl-device");
    let mut env = rank_env(0, 1, &dir);
    env.push(("HPFSDP_DEVICE".into(), "9".into()));
    let e = NcclComm::from_lookup(&env_of(env))
        .err()
        .expect("device 9 of 8");
    let msg = e.to_string();
    assert!(
        msg.contains("device 9") && msg.contains("HPFSDP_DEVICE"),
        "{msg}"
    );
}

fn comm(rank: usize, n: usize, dir: &std::path::Path) -> NcclComm {
    NcclComm::from_lookup(&env_of(rank_env(rank, n, dir))).expect("nccl comm on the stand-in")
}

#[test]
fn one_rank_world_runs_every_call_and_logs_device_times() {
    let dir = fresh_dir("nccl-one");
    // Through the object-safe view a run-time backend factory would hand out.
    let c: Box<dyn DeviceCollective> = Box::new(comm(0, 1, &dir));
    assert_eq!(c.backend_name(), "nccl");
    assert!(c.describe().contains("NCCL 2.20.5"), "{}", c.describe());
    let got = scenario(c.as_ref(), true).expect("scenario");
    assert_eq!(got, inproc_outputs(1, true)[0]);
    let trace = c.trace();
    let mut times = c.device_times();
    assert_eq!(c.last_device_time_us(), times.last().map(|t| t.device_us));
    // Logged in completion order (the ring's receive was waited on before its send).
    times.sort_by_key(|t| t.index);
    assert_eq!(times.len(), trace.len(), "one device time per call");
    for (t, ev) in times.iter().zip(&trace) {
        assert!(t.device_us.is_finite() && t.device_us >= 0.0, "{t:?}");
        assert_eq!((t.kind, t.index), (ev.kind, ev.index));
    }
}

#[test]
fn four_ranks_match_inproc_bit_for_bit_with_lazy_groups() {
    let dir = fresh_dir("nccl-four-lazy");
    let want = inproc_outputs(4, true);
    let got = on_threads(4, |r| scenario(&comm(r, 4, &dir), true).expect("scenario"));
    assert_eq!(got, want);
}

fn split_calls() -> i64 {
    // SAFETY: the stand-in's test hook `long fake_split_calls(void)`.
    unsafe {
        let f = fake::hooks()
            .get::<unsafe extern "C" fn() -> std::ffi::c_long>("fake_split_calls")
            .expect("hook");
        #[allow(clippy::useless_conversion)] // c_long is 32 bits on some targets
        i64::from(f())
    }
}

#[test]
fn four_ranks_with_split_groups_match_inproc() {
    let dir = fresh_dir("nccl-four-split");
    let want = inproc_outputs(4, true);
    let before = split_calls();
    let got = on_threads(4, |r| {
        let c = comm(r, 4, &dir);
        let mut groups = vec![Group::new("evens", vec![0, 2]).unwrap()];
        groups.extend((0..4).map(|k| Group::new(format!("alone{k}"), vec![k]).unwrap()));
        c.create_groups(&groups).expect("split");
        scenario(&c, true).expect("scenario")
    });
    assert_eq!(got, want);
    assert!(
        split_calls() >= before + 5,
        "ncclCommSplit was used for every group"
    );
}

#[test]
fn tcp_rendezvous_bootstraps_two_ranks() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let want = inproc_outputs(2, true);
    let dir = fresh_dir("nccl-tcp-unused");
    let got = on_threads(2, |r| {
        let mut env = rank_env(r, 2, &dir);
        env.retain(|(k, _)| k != "HPFSDP_RENDEZVOUS");
        env.push(("HPFSDP_RENDEZVOUS".into(), format!("tcp:127.0.0.1:{port}")));
        let c = NcclComm::from_lookup(&env_of(env)).expect("comm over tcp");
        scenario(&c, true).expect("scenario")
    });
    assert_eq!(got, want);
}

#[test]
fn device_buffers_run_without_host_copies_and_report_time() {
    let dir = fresh_dir("nccl-device-buffers");
    let results = on_threads(2, |r| {
        let world = WorldSpec::new(r, 2, r).unwrap();
        let store = FileStore::new(&dir).unwrap();
        let exchange = Box::new(StoreExchange::new(
            store,
            r,
            std::time::Duration::from_secs(60),
        ));
        let lib = NcclLibrary::load(&env_of(rank_env(r, 2, &dir))).unwrap();
        let c = NcclComm::new(lib, world, exchange).unwrap();
        let g = Group::world(2).unwrap();
        let x = c
            .upload(&Buffer::from(vec![bf16::from_f32(r as f32 + 1.0); 8]))
            .unwrap();
        let y = c.alloc_device(DType::Bf16, 16).unwrap();
        let mut times = Vec::new();
        for _ in 0..3 {
            let w = c
                .issue_device(
                    &g,
                    DeviceOp::AllReduce {
                        send: &x,
                        recv: &x,
                        op: ReduceOp::Sum,
                    },
                )
                .unwrap();
            times.push(w.wait().unwrap());
        }
        let w = c
            .issue_device(&g, DeviceOp::AllGather { send: &x, recv: &y })
            .unwrap();
        times.push(w.wait().unwrap());
        let too_small = c.alloc_device(DType::Bf16, 15).unwrap();
        let err = c
            .issue_device(
                &g,
                DeviceOp::AllGather {
                    send: &x,
                    recv: &too_small,
                },
            )
            .err()
            .expect("short output buffer");
        assert!(err.to_string().contains("16 bf16 elements"), "{err}");
        // A device-resident exchange with the other rank, as one batch.
        let mine = c.upload(&Buffer::from(vec![r as f32 + 5.0; 3])).unwrap();
        let theirs = c.alloc_device(DType::F32, 3).unwrap();
        let peer = 1 - r;
        let batch = [
            DeviceP2p::Send {
                buffer: &mine,
                peer,
            },
            DeviceP2p::Recv {
                buffer: &theirs,
                peer,
            },
        ];
        times.push(c.issue_device_p2p(&batch, 7).unwrap().wait().unwrap());
        assert_eq!(
            theirs.download().unwrap(),
            Buffer::from(vec![peer as f32 + 5.0; 3])
        );
        let kinds: Vec<_> = c
            .trace()
            .iter()
            .rev()
            .take(2)
            .map(|e| (e.kind, e.peer, e.tag))
            .collect();
        assert_eq!(
            kinds,
            [
                (CollectiveKind::Recv, Some(peer), Some(7)),
                (CollectiveKind::Send, Some(peer), Some(7))
            ]
        );
        (x.download().unwrap(), y.download().unwrap(), times)
    });
    for (x, y, times) in results {
        // In place three times: 1 + 2 = 3, then 6, then 12 on both ranks.
        assert_eq!(x, Buffer::from(vec![bf16::from_f32(12.0); 8]));
        assert_eq!(y, Buffer::from(vec![bf16::from_f32(12.0); 16]));
        assert!(
            times.iter().all(|t| t.is_finite() && *t >= 0.0),
            "{times:?}"
        );
    }
}

#[test]
fn a_failing_library_call_is_a_typed_error_naming_the_call() {
    let dir = fresh_dir("nccl-mismatch");
    let errs = on_threads(2, |r| {
        let c = comm(r, 2, &dir);
        let g = Group::world(2).unwrap();
        // Rank 1 expects 3 elements from rank 0, which sends 2: rank 1's receive fails.
        let (send, recv) = if r == 0 {
            (vec![1, 2], vec![1, 2])
        } else {
            (vec![2, 1], vec![3, 1])
        };
        let input = vec![0.0f32; send.iter().sum()];
        c.all_to_all_v_vec(&g, input, &send, &recv).err()
    });
    assert!(errs[0].is_none(), "{:?}", errs[0]);
    let e = errs[1].clone().expect("rank 1 fails");
    match &e {
        CommError::DeviceCall {
            backend,
            call,
            code,
            message,
        } => {
            assert_eq!(
                (backend.as_str(), call.as_str(), *code),
                ("nccl", "ncclGroupEnd", 4)
            );
            assert!(message.contains("invalid argument"), "{message}");
        }
        other => panic!("expected DeviceCall, got {other:?}"),
    }
}

#[test]
fn invalid_arguments_are_rejected_before_any_library_call() {
    let dir = fresh_dir("nccl-invalid");
    let c = comm(0, 1, &dir);
    let g = Group::world(1).unwrap();
    let outside = Group::new("outside", vec![1]).unwrap();
    assert!(matches!(
        c.all_reduce(&outside, Buffer::from(vec![1.0f32]), ReduceOp::Sum),
        Err(CommError::InvalidGroup { .. })
    ));
    assert!(matches!(
        c.broadcast(&g, Buffer::from(vec![1.0f32]), 3),
        Err(CommError::InvalidArgument {
            kind: CollectiveKind::Broadcast,
            ..
        })
    ));
    assert!(matches!(
        c.send(Buffer::from(vec![1.0f32]), 5, 0),
        Err(CommError::InvalidArgument {
            kind: CollectiveKind::Send,
            ..
        })
    ));
    assert!(c.trace().is_empty(), "rejected calls leave no trace");
}

#[test]
fn dropped_handles_release_their_work_and_later_calls_still_match() {
    let dir = fresh_dir("nccl-dropped");
    let c = comm(0, 1, &dir);
    let g = Group::world(1).unwrap();
    let h = c
        .all_reduce(&g, Buffer::from(vec![1.0f32; 4]), ReduceOp::Sum)
        .unwrap();
    // The stand-in finishes work inside the call, so the end event has completed.
    assert!(h.is_complete());
    drop(h);
    // A queued send whose handle is dropped before any flush is withdrawn, not issued.
    drop(c.send(Buffer::from(vec![2.0f32; 3]), 0, 1).unwrap());
    let s = c.send(Buffer::from(vec![3.0f32; 2]), 0, 1).unwrap();
    let r = c.recv(0, 1, DType::F32, 2).unwrap();
    assert!(!r.is_complete(), "queued until the first wait");
    assert_eq!(r.wait_vec::<f32>().unwrap(), vec![3.0, 3.0]);
    assert_eq!(
        s.wait_vec::<f32>().unwrap(),
        vec![3.0, 3.0],
        "a send hands its input back"
    );
    assert_eq!(
        c.all_reduce_vec(&g, vec![5.0f32], ReduceOp::Max).unwrap(),
        vec![5.0]
    );
}
