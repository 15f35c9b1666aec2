//! Device cores shared between streams (`[device] side_stream_kernels`): a kernel on a side
//! stream that becomes ready while the compute stream runs a device op waits for the
//! length-biased residual of that op's kernels holding its cores, capped by the op's
//! remaining time; the key's parsing and its errors.

use hpfsdp_plan::kernel::{KernelClass, KernelWork};
use hpfsdp_program::step::{Category, OpId, OpSpan, ProgramBuilder, StepProgram, Stream};
use hpfsdp_sim::compute_cost::kernel_s;
use hpfsdp_sim::profile::SideStreamKernels;
use hpfsdp_sim::{HardwareProfile, SimOptions, SimResult, simulate_programs};

fn a3(policy: SideStreamKernels) -> HardwareProfile {
    let mut p = HardwareProfile::builtin("ascend-910c-a3").unwrap();
    p.device.side_stream_kernels = policy;
    p
}

fn ns(s: f64) -> u64 {
    (s * 1e9).round() as u64
}

/// Two large GEMMs (cube cores) and four layer norms (vector cores) in one compute op.
fn segment() -> Vec<KernelWork> {
    vec![
        KernelWork {
            class: KernelClass::Gemm {
                m: 8192,
                n: 8192,
                k: 8192,
                batch: 1,
            },
            count: 2,
            flops: 2 * 2 * 8192u64.pow(3),
            hbm_bytes: 2 * 3 * 2 * 8192 * 8192,
        },
        KernelWork::memory_bound(4, 0, 4_000_000_000),
    ]
}

/// One division of a reduce-scatter output shard (one vector kernel).
fn division() -> Vec<KernelWork> {
    vec![KernelWork::memory_bound(1, 25_000_000, 100_000_000)]
}

fn span(r: &SimResult, op: OpId) -> OpSpan {
    let t = r.timeline.as_ref().unwrap().rank(0).unwrap();
    *t.spans.iter().find(|s| s.op == op).unwrap()
}

fn run(program: &StepProgram, p: &HardwareProfile) -> SimResult {
    simulate_programs(vec![program.clone()], p, false, &SimOptions::default()).unwrap()
}

/// The expected wait of a side kernel arriving during [`segment`] under `policy`, computed
/// here from the kernel costs: sum over the kernels holding the cores of `L^2` over twice the
/// op's length.
fn expected_wait_s(p: &HardwareProfile, gemms_hold: bool) -> f64 {
    let k = segment();
    let (g, n) = (kernel_s(&k[0], p), kernel_s(&k[1], p));
    let squares = if gemms_hold { g * g / 2.0 } else { 0.0 } + n * n / 4.0;
    squares / (2.0 * (g + n))
}

#[test]
fn a_side_kernel_waits_for_the_residual_of_the_compute_kernel_holding_its_cores() {
    let mut b = ProgramBuilder::new(0);
    let seg = b.compute_kernels(Stream::Compute, Category::Compute, &segment(), &[]);
    let div = b.compute_kernels(Stream::ReduceScatter, Category::FsdpRs, &division(), &[]);
    let program = b.build().unwrap();
    for (policy, wait_s) in [
        (SideStreamKernels::Concurrent, None),
        (SideStreamKernels::WaitForCores, Some(true)),
        (SideStreamKernels::WaitForVectorCores, Some(false)),
    ] {
        let p = a3(policy);
        let r = run(&program, &p);
        let (s, d) = (span(&r, seg), span(&r, div));
        let div_ns = ns(kernel_s(&division()[0], &p));
        assert!(
            d.start_ns > s.start_ns && d.start_ns < s.end_ns,
            "{policy:?}: the division must arrive while the segment runs"
        );
        let wait = wait_s.map_or(0, |gemms| ns(expected_wait_s(&p, gemms)));
        let expected_end = d.start_ns + wait.min(s.end_ns - d.start_ns) + div_ns;
        assert!(
            d.end_ns.abs_diff(expected_end) <= 1,
            "{policy:?}: division ends at {} ns, expected {expected_end} ns",
            d.end_ns
        );
        if wait_s.is_some() {
            assert!(wait > 0, "{policy:?}: the wait must be positive");
        }
    }
    // Behind GEMMs a vector kernel waits less than when every kernel holds every core.
    assert!(
        expected_wait_s(&a3(SideStreamKernels::WaitForCores), false)
            < expected_wait_s(&a3(SideStreamKernels::WaitForCores), true)
    );
}

/// A side op with cube work (a Newton-Schulz GEMM on the optimizer stream) needs the cube
/// cores the compute stream's GEMMs hold: under `wait_for_vector_cores` it waits for every
/// compute kernel, as under `wait_for_cores`.
#[test]
fn a_side_gemm_waits_for_every_compute_kernel() {
    let side_gemm = KernelWork {
        class: KernelClass::Gemm {
            m: 1024,
            n: 1024,
            k: 1024,
            batch: 1,
        },
        count: 1,
        flops: 2 * 1024u64.pow(3),
        hbm_bytes: 3 * 2 * 1024 * 1024,
    };
    let mut b = ProgramBuilder::new(0);
    let seg = b.compute_kernels(Stream::Compute, Category::Compute, &segment(), &[]);
    let ns_op = b.compute_kernels(Stream::Optimizer, Category::Optimizer, &[side_gemm], &[]);
    let program = b.build().unwrap();
    let p = a3(SideStreamKernels::WaitForVectorCores);
    let r = run(&program, &p);
    let (s, x) = (span(&r, seg), span(&r, ns_op));
    assert!(x.start_ns > s.start_ns && x.start_ns < s.end_ns);
    let wait = ns(expected_wait_s(&p, true)).min(s.end_ns - x.start_ns);
    let expected_end = x.start_ns + wait + ns(kernel_s(&side_gemm, &p));
    assert!(
        x.end_ns.abs_diff(expected_end) <= 1,
        "side GEMM ends at {} ns, expected {expected_end} ns",
        x.end_ns
    );
}

/// A side kernel that becomes ready near the end of the compute op waits only until that op
/// ends, and one that becomes ready while the compute stream is idle does not wait.
#[test]
fn the_wait_is_capped_by_the_compute_ops_end_and_zero_on_an_idle_compute_stream() {
    let p = a3(SideStreamKernels::WaitForCores);
    // One memory-bound kernel of length D: expected residual D / 2.
    let big = KernelWork::memory_bound(1, 0, 8_000_000_000);
    let d_s = kernel_s(&big, &p);
    // A side kernel of 0.9 D, launched before the compute op: the compute stream is idle.
    let lead = KernelWork::memory_bound(1, 0, 7_200_000_000);
    let mut b = ProgramBuilder::new(0);
    let first = b.compute_kernels(Stream::ReduceScatter, Category::FsdpRs, &[lead], &[]);
    let seg = b.compute_kernels(Stream::Compute, Category::Compute, &[big], &[]);
    let second = b.compute_kernels(Stream::ReduceScatter, Category::FsdpRs, &division(), &[]);
    let program = b.build().unwrap();
    let r = run(&program, &p);
    let (f, s, x) = (span(&r, first), span(&r, seg), span(&r, second));
    assert_eq!(
        f.end_ns - f.start_ns,
        ns(kernel_s(&lead, &p)),
        "no wait when idle"
    );
    assert_eq!(
        s.end_ns - s.start_ns,
        ns(d_s),
        "the compute op is never delayed"
    );
    // The second side kernel becomes ready when the first ends, less than D / 2 before the
    // compute op ends: it waits for that end, no longer.
    assert_eq!(x.start_ns, f.end_ns);
    assert!(s.end_ns - x.start_ns < ns(d_s / 2.0));
    assert_eq!(x.end_ns, s.end_ns + ns(kernel_s(&division()[0], &p)));
}

/// Same program, same profile: byte-identical results.
#[test]
fn runs_are_deterministic() {
    let mut b = ProgramBuilder::new(0);
    let mut prev = None;
    for _ in 0..20 {
        let deps: Vec<OpId> = prev.into_iter().collect();
        let seg = b.compute_kernels(Stream::Compute, Category::Compute, &segment(), &deps);
        b.compute_kernels(Stream::ReduceScatter, Category::FsdpRs, &division(), &[seg]);
        b.copy(Stream::AllGather, 50_000_000, &[]);
        prev = Some(seg);
    }
    let program = b.build().unwrap();
    let p = a3(SideStreamKernels::WaitForVectorCores);
    let (x, y) = (run(&program, &p), run(&program, &p));
    assert_eq!(x, y);
    assert_eq!(
        serde_json::to_string(&x).unwrap(),
        serde_json::to_string(&y).unwrap()
    );
}

fn with_key(line: &str) -> String {
    let (_, text) = hpfsdp_sim::profile::BUILTIN_PROFILES
        .iter()
        .find(|(n, _)| *n == "ascend-910c-a3")
        .unwrap();
    text.replacen("side_stream_kernels = \"wait_for_vector_cores\"", line, 1)
}

#[test]
fn the_key_parses_its_three_values_and_defaults_to_concurrent() {
    for (value, policy) in [
        ("concurrent", SideStreamKernels::Concurrent),
        ("wait_for_cores", SideStreamKernels::WaitForCores),
        (
            "wait_for_vector_cores",
            SideStreamKernels::WaitForVectorCores,
        ),
    ] {
        let text = with_key(&format!("side_stream_kernels = \"{value}\""));
        let p = HardwareProfile::parse(&text, "a3.toml").unwrap();
        assert_eq!(p.device.side_stream_kernels, policy);
    }
    let without = with_key("");
    let p = HardwareProfile::parse(&without, "a3.toml").unwrap();
    assert_eq!(p.device.side_stream_kernels, SideStreamKernels::Concurrent);
    assert_eq!(
        HardwareProfile::builtin("ascend-910c-a3")
            .unwrap()
            .device
            .side_stream_kernels,
        SideStreamKernels::WaitForVectorCores
    );
}

#[test]
fn a_bad_value_names_the_file_line_key_and_the_allowed_values() {
    let text = with_key("side_stream_kernels = \"shared\"");
    let line = text
        .lines()
        .position(|l| l.starts_with("side_stream_kernels"))
        .unwrap()
        + 1;
    let e = HardwareProfile::parse(&text, "a3.toml").unwrap_err();
    assert_eq!(e.file, "a3.toml");
    assert_eq!(e.line, line);
    assert!(e.key.contains("side_stream_kernels"), "{e}");
    for allowed in SideStreamKernels::NAMES {
        assert!(e.to_string().contains(allowed), "{e}");
    }
}
