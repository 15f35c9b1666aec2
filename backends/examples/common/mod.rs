//! The smoke test shared by `nccl_smoke` and `hccl_smoke`: every collective kind on host
//! buffers with its result checked, then repeated all-reduces on device-resident buffers, with
//! the device time of every call printed.

use std::process::ExitCode;

use hpfsdp_backends::device::{CollLibrary, DeviceComm, DeviceOp};
use hpfsdp_backends::{
    Buffer, Collective, CollectiveExt, CommError, CommResult, DType, Group, ReduceOp, bf16,
    wait_all,
};

/// Elements per rank of the large payloads (`HPFSDP_SMOKE_ELEMS`, default 1 Mi).
fn elems() -> usize {
    std::env::var("HPFSDP_SMOKE_ELEMS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1 << 20)
}

struct Checker<'a, L: CollLibrary> {
    comm: &'a DeviceComm<L>,
    failures: usize,
}

impl<L: CollLibrary> Checker<'_, L> {
    fn report(&mut self, what: &str, bytes: usize, ok: bool) {
        let us = self.comm.last_device_time_us().unwrap_or(f64::NAN);
        let status = if ok { "ok" } else { "WRONG" };
        println!(
            "rank {} {what:<28} {bytes:>12} B {us:>12.2} us device  {status}",
            self.comm.rank()
        );
        if !ok {
            self.failures += 1;
        }
    }
}

fn all_eq(v: &[f32], want: impl Fn(usize) -> f32) -> bool {
    v.iter().enumerate().all(|(i, &x)| x == want(i))
}

fn host_calls<L: CollLibrary>(ck: &mut Checker<'_, L>, k: usize) -> CommResult<()> {
    let c = ck.comm;
    let (n, r) = (c.world_size(), c.rank());
    let world = Group::world(n)?;
    let me = (r + 1) as f32;
    let tri = (n * (n + 1) / 2) as f32;

    let v = c.all_gather_vec(&world, vec![me; k])?;
    ck.report("all-gather f32", 4 * k, all_eq(&v, |i| (i / k + 1) as f32));
    let v = c.reduce_scatter_vec(&world, vec![me; k * n], ReduceOp::Sum)?;
    ck.report("reduce-scatter f32 sum", 4 * k * n, all_eq(&v, |_| tri));
    for (op, want) in [
        (ReduceOp::Sum, tri),
        (ReduceOp::Avg, tri / n as f32),
        (ReduceOp::Max, n as f32),
        (ReduceOp::Min, 1.0),
    ] {
        let v = c.all_reduce_vec(&world, vec![me; k], op)?;
        ck.report(&format!("all-reduce f32 {op}"), 4 * k, all_eq(&v, |_| want));
    }
    let v = c.all_reduce_vec(&world, vec![bf16::from_f32(me); k], ReduceOp::Sum)?;
    ck.report(
        "all-reduce bf16 sum",
        2 * k,
        v.iter().all(|x| x.to_f32() == tri),
    );
    let root = n - 1;
    let v = c.broadcast_vec(&world, vec![if r == root { 42.0 } else { 0.0 }; k], root)?;
    ck.report("broadcast f32", 4 * k, all_eq(&v, |_| 42.0));
    let chunk = k.div_ceil(n);
    let input: Vec<f32> = (0..chunk * n).map(|i| (r * n + i / chunk) as f32).collect();
    let v = c.all_to_all_vec(&world, input)?;
    ck.report(
        "all-to-all f32",
        4 * chunk * n,
        all_eq(&v, |i| (i / chunk * n + r) as f32),
    );
    let send: Vec<usize> = (0..n).map(|j| (r + j) % 3 + 1).collect();
    let recv: Vec<usize> = (0..n).map(|i| (i + r) % 3 + 1).collect();
    let v = c.all_to_all_v_vec(&world, vec![me; send.iter().sum()], &send, &recv)?;
    let want: Vec<f32> = (0..n).flat_map(|i| vec![(i + 1) as f32; recv[i]]).collect();
    ck.report(
        "all-to-all-v f32",
        4 * send.iter().sum::<usize>(),
        v == want,
    );
    let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
    let s = c.send(Buffer::from(vec![me; k]), next, 0)?;
    let rv = c.recv(prev, 0, DType::F32, k)?;
    let got = wait_all(vec![rv, s])?.swap_remove(0).into_vec::<f32>()?;
    ck.report(
        "send/recv ring f32",
        4 * k,
        all_eq(&got, |_| (prev + 1) as f32),
    );
    c.barrier_wait(&world)?;
    ck.report("barrier", 0, true);
    Ok(())
}

fn device_calls<L: CollLibrary>(ck: &mut Checker<'_, L>, k: usize) -> CommResult<()> {
    let c = ck.comm;
    let n = c.world_size();
    let world = Group::world(n)?;
    let x = c.upload(&Buffer::from(vec![1.0f32; k]))?;
    let y = c.alloc_device(DType::F32, k)?;
    let mut times = Vec::new();
    for _ in 0..5 {
        let w = c.issue_device(
            &world,
            DeviceOp::AllReduce {
                send: &x,
                recv: &y,
                op: ReduceOp::Sum,
            },
        )?;
        times.push(w.wait()?);
    }
    let ok = all_eq(&y.download()?.into_vec::<f32>()?, |_| n as f32);
    ck.report("device all-reduce f32 x5", 4 * k, ok);
    let best = times.iter().copied().fold(f64::INFINITY, f64::min);
    let algbw = (4 * k) as f64 / best / 1e3;
    let busbw = algbw * 2.0 * (n as f64 - 1.0) / n as f64;
    println!(
        "rank {} device all-reduce times (us): {times:.2?}; best {best:.2} us, algbw {algbw:.2} GB/s, busbw {busbw:.2} GB/s",
        c.rank()
    );
    Ok(())
}

/// Build the communicator with `make`, run the smoke calls, print the device times; exit 2 when
/// the backend is unavailable (the message names the libraries tried and the variables), 1 when
/// a result is wrong or a call fails.
pub fn run<L: CollLibrary>(make: impl FnOnce() -> CommResult<DeviceComm<L>>) -> ExitCode {
    let comm = match make() {
        Ok(c) => c,
        Err(e @ (CommError::LibraryLoad { .. } | CommError::Unavailable { .. })) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(1);
        }
    };
    println!("{}", comm.describe());
    let k = elems();
    let mut ck = Checker {
        comm: &comm,
        failures: 0,
    };
    let result = host_calls(&mut ck, k).and_then(|()| device_calls(&mut ck, k));
    let calls = comm.device_times().len();
    if let Err(e) = result {
        eprintln!("error: rank {}: {e}", comm.rank());
        return ExitCode::from(1);
    }
    let failures = ck.failures;
    drop(comm);
    println!("{calls} calls timed; {failures} wrong; communicator torn down");
    if failures == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}
