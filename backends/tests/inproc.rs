//! The in-process backend against hand-computed results, determinism, traces and errors.

use std::time::Duration;

use hpfsdp_backends::{
    Buffer, Collective, CollectiveExt, CollectiveKind, CommError, DType, Group, InProcWorld,
    ReduceOp, bf16, wait_all,
};

fn world4() -> Group {
    Group::world(4).unwrap()
}

#[test]
fn all_gather_concatenates_in_group_order() {
    let run = InProcWorld::run(4, |c| {
        let r = c.rank() as f32;
        c.all_gather_vec(&world4(), vec![r, r + 0.5])
    })
    .unwrap();
    for res in run.results {
        assert_eq!(res.unwrap(), vec![0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5]);
    }
}

#[test]
fn reduce_scatter_sums_then_splits() {
    // rank r contributes [r*10 + j for j in 0..8]; chunk i (2 elements) goes to rank i.
    let run = InProcWorld::run(4, |c| {
        let r = c.rank() as f32;
        let input: Vec<f32> = (0..8).map(|j| r * 10.0 + j as f32).collect();
        c.reduce_scatter_vec(&world4(), input, ReduceOp::Sum)
    })
    .unwrap();
    for (rank, res) in run.results.into_iter().enumerate() {
        let j0 = (2 * rank) as f32;
        // sum over r of (10 r + j) = 60 + 4 j
        assert_eq!(res.unwrap(), vec![60.0 + 4.0 * j0, 60.0 + 4.0 * (j0 + 1.0)]);
    }
}

#[test]
fn all_reduce_every_op() {
    let run = InProcWorld::run(4, |c| {
        let r = c.rank() as f32;
        let g = world4();
        let v = vec![r, -r, 1.0];
        let sum = c.all_reduce_vec(&g, v.clone(), ReduceOp::Sum)?;
        let avg = c.all_reduce_vec(&g, v.clone(), ReduceOp::Avg)?;
        let max = c.all_reduce_vec(&g, v.clone(), ReduceOp::Max)?;
        let min = c.all_reduce_vec(&g, v, ReduceOp::Min)?;
        Ok::<_, CommError>((sum, avg, max, min))
    })
    .unwrap();
    for res in run.results {
        let (sum, avg, max, min) = res.unwrap();
        assert_eq!(sum, vec![6.0, -6.0, 4.0]);
        assert_eq!(avg, vec![1.5, -1.5, 1.0]);
        assert_eq!(max, vec![3.0, 0.0, 1.0]);
        assert_eq!(min, vec![0.0, -3.0, 1.0]);
    }
}

#[test]
fn broadcast_from_a_subgroup_root() {
    let run = InProcWorld::run(4, |c| {
        let g = Group::new("odd", vec![1, 3]).unwrap();
        if g.contains(c.rank()) {
            let mine = vec![c.rank() as f32; 3];
            Some(c.broadcast_vec(&g, mine, 3))
        } else {
            None
        }
    })
    .unwrap();
    assert!(run.results[0].is_none() && run.results[2].is_none());
    assert_eq!(run.results[1].clone().unwrap().unwrap(), vec![3.0; 3]);
    assert_eq!(run.results[3].clone().unwrap().unwrap(), vec![3.0; 3]);
}

#[test]
fn all_to_all_transposes_chunks() {
    // rank r sends [100 r + j] to rank j; rank i receives [100 r + i for r in 0..4].
    let run = InProcWorld::run(4, |c| {
        let r = c.rank() as f32;
        let input: Vec<f32> = (0..4).map(|j| 100.0 * r + j as f32).collect();
        c.all_to_all_vec(&world4(), input)
    })
    .unwrap();
    for (i, res) in run.results.into_iter().enumerate() {
        let want: Vec<f32> = (0..4).map(|r| 100.0 * r as f32 + i as f32).collect();
        assert_eq!(res.unwrap(), want);
    }
}

#[test]
fn all_to_all_v_with_ragged_counts() {
    // rank r sends (r + j) % 3 copies of (10 r + j) to rank j.
    let counts = |r: usize, j: usize| (r + j) % 3;
    let run = InProcWorld::run(3, |c| {
        let r = c.rank();
        let g = Group::world(3).unwrap();
        let send: Vec<usize> = (0..3).map(|j| counts(r, j)).collect();
        let recv: Vec<usize> = (0..3).map(|i| counts(i, r)).collect();
        let input: Vec<f32> = (0..3)
            .flat_map(|j| std::iter::repeat_n((10 * r + j) as f32, counts(r, j)))
            .collect();
        c.all_to_all_v_vec(&g, input, &send, &recv)
    })
    .unwrap();
    for (me, res) in run.results.into_iter().enumerate() {
        let want: Vec<f32> = (0..3)
            .flat_map(|i| std::iter::repeat_n((10 * i + me) as f32, counts(i, me)))
            .collect();
        assert_eq!(res.unwrap(), want);
    }
}

#[test]
fn send_recv_in_order_and_async_handles() {
    let run = InProcWorld::run(2, |c| {
        if c.rank() == 0 {
            c.send_vec(vec![1.0f32, 2.0], 1, 7)?;
            c.send_vec(vec![3.0f32, 4.0], 1, 7)?;
            c.send_vec(vec![bf16::from_f32(5.0)], 1, 8)?;
            Ok(vec![])
        } else {
            // Post both receives first, wait in reverse order: matching is by post order.
            let h1 = c.recv(0, 7, DType::F32, 2)?;
            let h2 = c.recv(0, 7, DType::F32, 2)?;
            let b = c.recv_vec::<bf16>(0, 8, 1)?;
            let second = h2.wait_vec::<f32>()?;
            let first = h1.wait_vec::<f32>()?;
            Ok::<_, CommError>(vec![first, second, vec![b[0].to_f32()]])
        }
    })
    .unwrap();
    assert_eq!(
        run.results[1].clone().unwrap(),
        vec![vec![1.0, 2.0], vec![3.0, 4.0], vec![5.0]]
    );
}

#[test]
fn many_async_collectives_in_flight_on_two_groups() {
    let run = InProcWorld::run(4, |c| {
        let g = world4();
        let pair = Group::from_ranks(if c.rank() < 2 { vec![0, 1] } else { vec![2, 3] }).unwrap();
        let r = c.rank() as f32;
        let handles = vec![
            c.all_reduce(&g, Buffer::from(vec![r]), ReduceOp::Sum)?,
            c.all_gather(&pair, Buffer::from(vec![r]))?,
            c.all_reduce(&g, Buffer::from(vec![2.0 * r]), ReduceOp::Max)?,
            c.barrier(&g)?,
        ];
        let outs = wait_all(handles)?;
        outs.into_iter()
            .map(|b| b.into_vec::<f32>())
            .collect::<Result<Vec<_>, CommError>>()
    })
    .unwrap();
    for (rank, res) in run.results.into_iter().enumerate() {
        let res = res.unwrap();
        let base = (rank / 2 * 2) as f32;
        assert_eq!(res[0], vec![6.0]);
        assert_eq!(res[1], vec![base, base + 1.0]);
        assert_eq!(res[2], vec![6.0]);
        assert!(res[3].is_empty());
    }
}

#[test]
fn bf16_all_reduce_accumulates_in_f32_and_rounds_once() {
    // bf16 spacing at 1 is 2^-7. Rounding after every add would keep 1 + 2^-9 at 1.0 each time;
    // summing 1 + 3 * 2^-9 in f32 and rounding once gives 1 + 2^-7.
    let run = InProcWorld::run(4, |c| {
        let v = if c.rank() == 0 { 1.0 } else { 2f32.powi(-9) };
        c.all_reduce_vec(&world4(), vec![bf16::from_f32(v)], ReduceOp::Sum)
    })
    .unwrap();
    let want = bf16::from_f32(1.0 + 3.0 * 2f32.powi(-9));
    assert_eq!(want.to_f32(), 1.0 + 2f32.powi(-7));
    for res in run.results {
        assert_eq!(res.unwrap()[0].to_bits(), want.to_bits());
    }
}

/// Values whose f32 sum depends on the order of addition.
fn order_sensitive(rank: usize, i: usize) -> f32 {
    let x = ((rank * 7919 + i * 104_729) % 1000) as f32;
    (x - 500.0) * 10f32.powi((rank % 4) as i32 * 3 - 4) + 1e-3 * i as f32
}

#[test]
fn reductions_are_bit_identical_across_runs_and_match_rank_order() {
    let world = 6;
    let n = 257;
    let mut first: Option<Vec<u32>> = None;
    for _ in 0..20 {
        let run = InProcWorld::run(world, |c| {
            // Jitter the arrival order.
            std::thread::sleep(Duration::from_micros(((c.rank() * 37) % 5) as u64 * 50));
            let v: Vec<f32> = (0..n).map(|i| order_sensitive(c.rank(), i)).collect();
            c.all_reduce_vec(&Group::world(world).unwrap(), v, ReduceOp::Sum)
        })
        .unwrap();
        let bits: Vec<u32> = run.results[0]
            .as_ref()
            .unwrap()
            .iter()
            .map(|x| x.to_bits())
            .collect();
        for r in &run.results {
            let rb: Vec<u32> = r.as_ref().unwrap().iter().map(|x| x.to_bits()).collect();
            assert_eq!(rb, bits);
        }
        match &first {
            None => first = Some(bits),
            Some(f) => assert_eq!(f, &bits),
        }
    }
    // And the result equals a left fold in ascending rank order.
    let want: Vec<u32> = (0..n)
        .map(|i| {
            let mut acc = order_sensitive(0, i);
            for r in 1..world {
                acc += order_sensitive(r, i);
            }
            acc.to_bits()
        })
        .collect();
    assert_eq!(first.unwrap(), want);
    // The data really is order-sensitive (descending order gives other bits somewhere).
    let descending_differs = (0..n).any(|i| {
        let mut acc = order_sensitive(world - 1, i);
        for r in (0..world - 1).rev() {
            acc += order_sensitive(r, i);
        }
        acc.to_bits() != want[i]
    });
    assert!(descending_differs);
}

#[test]
fn trace_records_every_call_in_order() {
    let run = InProcWorld::run(2, |c| {
        let g = Group::new("dp", vec![0, 1]).unwrap();
        c.all_gather_vec(&g, vec![1.0f32; 3])?;
        c.reduce_scatter_vec(&g, vec![bf16::ONE; 4], ReduceOp::Avg)?;
        c.broadcast_vec(&g, vec![0.0f32; 5], 1)?;
        if c.rank() == 0 {
            c.send_vec(vec![1.0f32; 2], 1, 3)?;
        } else {
            c.recv_vec::<f32>(0, 3, 2)?;
        }
        c.all_reduce_vec(&g, vec![1.0f32; 2], ReduceOp::Sum)?;
        Ok::<_, CommError>(())
    })
    .unwrap();
    let t0 = &run.traces[0];
    let kinds: Vec<CollectiveKind> = t0.iter().map(|e| e.kind).collect();
    assert_eq!(
        kinds,
        vec![
            CollectiveKind::AllGather,
            CollectiveKind::ReduceScatter,
            CollectiveKind::Broadcast,
            CollectiveKind::Send,
            CollectiveKind::AllReduce
        ]
    );
    assert_eq!(
        t0.iter().map(|e| e.index).collect::<Vec<_>>(),
        vec![0, 1, 2, 3, 4]
    );
    assert_eq!(t0[0].group_label, "dp");
    assert_eq!(t0[0].ranks, vec![0, 1]);
    assert_eq!(
        (t0[0].input_bytes, t0[0].output_bytes, t0[0].dtype),
        (12, 24, DType::F32)
    );
    assert_eq!(
        (t0[1].input_bytes, t0[1].output_bytes, t0[1].dtype, t0[1].op),
        (8, 4, DType::Bf16, Some(ReduceOp::Avg))
    );
    assert_eq!(t0[2].root, Some(1));
    assert_eq!(
        (t0[3].peer, t0[3].tag, t0[3].input_bytes),
        (Some(1), Some(3), 8)
    );
    assert_eq!(t0[4].seq, 3, "fourth call on group dp");
    let t1 = &run.traces[1];
    assert_eq!(t1[3].kind, CollectiveKind::Recv);
    assert_eq!((t1[3].peer, t1[3].output_bytes), (Some(0), 8));
    assert_eq!(
        t0[0].group_id,
        Some(Group::new("dp", vec![0, 1]).unwrap().id())
    );
    assert!(
        t0[1]
            .to_string()
            .contains("reduce-scatter dp[0, 1] seq=1 bf16")
    );
}

#[test]
fn mismatched_kinds_sizes_dtypes_and_ops_are_errors_on_every_rank() {
    type Case = fn(&hpfsdp_backends::InProcComm) -> Result<(), CommError>;
    let cases: [(Case, &str); 5] = [
        (
            |c| {
                let g = Group::world(2).unwrap();
                if c.rank() == 0 {
                    c.all_reduce_vec(&g, vec![1.0f32; 4], ReduceOp::Sum)
                        .map(|_| ())
                } else {
                    c.all_gather_vec(&g, vec![1.0f32; 4]).map(|_| ())
                }
            },
            "all-gather",
        ),
        (
            |c| {
                let n = 3 + c.rank();
                c.all_reduce_vec(&Group::world(2).unwrap(), vec![1.0f32; n], ReduceOp::Sum)
                    .map(|_| ())
            },
            "4 elements",
        ),
        (
            |c| {
                let g = Group::world(2).unwrap();
                if c.rank() == 0 {
                    c.all_gather_vec(&g, vec![1.0f32; 2]).map(|_| ())
                } else {
                    c.all_gather_vec(&g, vec![bf16::ONE; 2]).map(|_| ())
                }
            },
            "bf16",
        ),
        (
            |c| {
                let op = if c.rank() == 0 {
                    ReduceOp::Sum
                } else {
                    ReduceOp::Max
                };
                c.all_reduce_vec(&Group::world(2).unwrap(), vec![1.0f32], op)
                    .map(|_| ())
            },
            "op=max",
        ),
        (
            |c| {
                // rank 0 expects 2 from rank 1, rank 1 sends 1.
                let g = Group::world(2).unwrap();
                if c.rank() == 0 {
                    c.all_to_all_v_vec(&g, vec![0.0f32; 2], &[1, 1], &[1, 2])
                        .map(|_| ())
                } else {
                    c.all_to_all_v_vec(&g, vec![0.0f32; 2], &[1, 1], &[1, 1])
                        .map(|_| ())
                }
            },
            "expects 2 elements",
        ),
    ];
    for (case, needle) in cases {
        let run = InProcWorld::new(2)
            .unwrap()
            .with_timeout(Duration::from_secs(20))
            .launch(case)
            .unwrap();
        for r in run.results {
            match r {
                Err(CommError::Mismatch { detail, .. }) => {
                    assert!(detail.contains(needle), "{detail:?} lacks {needle:?}")
                }
                other => panic!("expected a mismatch error, got {other:?}"),
            }
        }
    }
}

#[test]
fn p2p_size_mismatch_is_an_error() {
    let run = InProcWorld::run(2, |c| {
        if c.rank() == 0 {
            c.send_vec(vec![1.0f32; 3], 1, 0).map(|_| Vec::new())
        } else {
            c.recv_vec::<f32>(0, 0, 4)
        }
    })
    .unwrap();
    assert!(matches!(run.results[1], Err(CommError::Mismatch { .. })));
}

#[test]
fn a_rank_that_exits_early_fails_its_peers_instead_of_hanging() {
    let run = InProcWorld::run(3, |c| {
        if c.rank() == 2 {
            return Ok(vec![]);
        }
        c.all_reduce_vec(&Group::world(3).unwrap(), vec![1.0f32], ReduceOp::Sum)
    })
    .unwrap();
    for r in &run.results[..2] {
        match r {
            Err(CommError::PeerExited { missing, kind, .. }) => {
                assert_eq!(missing, &vec![2]);
                assert_eq!(*kind, CollectiveKind::AllReduce);
            }
            other => panic!("expected PeerExited, got {other:?}"),
        }
    }
    let run = InProcWorld::run(2, |c| {
        if c.rank() == 0 {
            c.recv_vec::<f32>(1, 0, 1)
        } else {
            Ok(vec![])
        }
    })
    .unwrap();
    assert!(matches!(run.results[0], Err(CommError::PeerExited { .. })));
}

#[test]
fn timeout_bounds_a_wait() {
    let run = InProcWorld::new(2)
        .unwrap()
        .with_timeout(Duration::from_millis(100))
        .launch(|c| {
            if c.rank() == 1 {
                // Join late: long after rank 0 gave up.
                std::thread::sleep(Duration::from_millis(400));
                return Ok(());
            }
            c.barrier_wait(&Group::world(2).unwrap())
        })
        .unwrap();
    assert!(matches!(
        run.results[0],
        Err(CommError::Timeout { ref missing, .. }) if missing == &vec![1]
    ));
}

#[test]
fn local_argument_errors() {
    let run = InProcWorld::run(2, |c| {
        let g = Group::world(2).unwrap();
        let solo = Group::new("solo", vec![1]).unwrap();
        let big = Group::new("big", vec![0, 5]).unwrap();
        let e1 = c
            .reduce_scatter_vec(&g, vec![1.0f32; 3], ReduceOp::Sum)
            .unwrap_err();
        let e2 = c.broadcast_vec(&solo, vec![1.0f32], 0).unwrap_err();
        let e3 = c.all_gather_vec(&big, vec![1.0f32]).unwrap_err();
        let e4 = c
            .all_to_all_v_vec(&g, vec![1.0f32; 3], &[1, 1], &[1, 1])
            .unwrap_err();
        let e5 = c.send_vec(vec![1.0f32], 9, 0).unwrap_err();
        (e1, e2, e3, e4, e5)
    })
    .unwrap();
    let (e1, e2, e3, e4, e5) = &run.results[0];
    assert!(matches!(e1, CommError::InvalidArgument { .. }));
    assert!(matches!(e2, CommError::NotInGroup { rank: 0, .. }));
    assert!(matches!(e3, CommError::InvalidGroup { .. }));
    assert!(matches!(e4, CommError::InvalidArgument { .. }));
    assert!(matches!(e5, CommError::InvalidArgument { .. }));
    // Failed calls are not traced and do not consume a sequence number.
    assert!(run.traces[0].is_empty());
    assert!(matches!(
        InProcWorld::new(0),
        Err(CommError::InvalidWorld(_))
    ));
}

#[test]
fn a_panicking_rank_is_reported_and_its_peers_are_released() {
    let err = InProcWorld::run(2, |c| {
        if c.rank() == 1 {
            panic!("boom");
        }
        c.barrier_wait(&Group::world(2).unwrap())
    })
    .unwrap_err();
    assert_eq!(
        err,
        CommError::RankPanicked {
            rank: 1,
            message: "boom".into()
        }
    );
}

#[test]
fn f64_and_u8_payloads_gather_and_reduce() {
    let run = InProcWorld::run(3, |c| {
        let g = Group::world(3)?;
        let r = c.rank();
        let f = c.all_reduce_vec(&g, vec![0.1f64 * r as f64, 1e308], ReduceOp::Sum)?;
        let b = c.all_gather_vec(&g, vec![r as u8, 250])?;
        let s = c.reduce_scatter_vec(&g, vec![200u8, 100, 1], ReduceOp::Sum)?;
        Ok::<_, CommError>((f, b, s))
    })
    .unwrap();
    for (rank, res) in run.results.into_iter().enumerate() {
        let (f, b, s) = res.unwrap();
        // Ascending rank order in f64: (0 + 0.1) + 0.2.
        assert_eq!(f[0].to_bits(), (0.0f64 + 0.1 + 0.2).to_bits());
        assert_eq!(f[1], f64::INFINITY);
        assert_eq!(b, vec![0, 250, 1, 250, 2, 250]);
        // 3 x 200 = 600 wraps to 88; 3 x 100 = 300 wraps to 44; 3 x 1 = 3.
        assert_eq!(s, vec![[88u8, 44, 3][rank]]);
    }
}
