//! Engine behaviour on small hand-checkable programs.

use hpfsdp_plan::{CollectiveKind, DType, Tier, Topology};
use hpfsdp_program::step::{
    Category, CollectiveOp, ComputeWork, Group, GroupId, MemTag, ProgramBuilder, StepProgram,
    Stream,
};
use hpfsdp_sim::cost::{collective_phases, compute_s};
use hpfsdp_sim::{
    GroupShape, HardwareProfile, SimError, SimOptions, SyntheticConfig, Workload, simulate,
    simulate_programs, synthetic_program,
};

fn a3() -> HardwareProfile {
    HardwareProfile::builtin("ascend-910c-a3").unwrap()
}

fn ns(s: f64) -> u64 {
    (s * 1e9).round() as u64
}

/// Host time of a one-kernel compute op without a host census: its launch, the unmodelled
/// host work per kernel, and its one production CPU operator event (the floor).
fn one_kernel_host_ns(p: &HardwareProfile) -> u64 {
    let c = hpfsdp_sim::host_cost::HostCosts::of(p, false);
    c.kernels_ns(1) + c.cpu_events_ns(1)
}

/// Duration of an aligned all-gather between ranks 0 and 1 (latency plus transfer of every
/// phase), `in_bytes` per rank in and `out_bytes` out, as the engine charges it.
fn two_rank_all_gather_ns(p: &HardwareProfile, in_bytes: u64, out_bytes: u64) -> u64 {
    let shape = GroupShape::of(&[0, 1], &p.topology_for(2));
    collective_phases(
        CollectiveKind::AllGather,
        &shape,
        in_bytes,
        out_bytes,
        true,
        p,
    )
    .iter()
    .map(|x| ns(x.cost.latency_s) + ns(x.cost.transfer_s))
    .sum()
}

fn work(flops: u64) -> ComputeWork {
    ComputeWork {
        flops,
        hbm_bytes: 0,
        kernels: 1,
        mix: None,
    }
}

fn ag(group: GroupId, p: u64, shard: u64) -> CollectiveOp {
    CollectiveOp {
        kind: CollectiveKind::AllGather,
        group,
        tier: Tier::IntraMachine,
        input_bytes: shard,
        output_bytes: shard * p,
        dtype: DType::Bf16,
        aligned_512: true,
    }
}

#[test]
fn compute_waits_for_host_launch() {
    let p = a3();
    let mut b = ProgramBuilder::new(0);
    b.compute(work(1_000_000_000_000), &[]);
    let r = simulate_programs(vec![b.build().unwrap()], &p, false, &SimOptions::default()).unwrap();
    let launch = one_kernel_host_ns(&p);
    let expected = launch + ns(compute_s(1_000_000_000_000, 0, 1, &p));
    assert_eq!(r.step_time_ns, expected);
    assert_eq!(r.breakdown.idle_ns, launch);
    assert_eq!(r.breakdown.host_busy_ns, launch);
}

/// Validation mode charges each op's extra CPU operator events and nothing else: ops
/// without events (backward, local regions) cost the same host time in both modes.
#[test]
fn host_bound_programs_idle_the_device_and_validation_mode_costs_more() {
    let p = a3();
    let mut b = ProgramBuilder::new(0);
    for i in 0..100 {
        let op = b.compute(work(1), &[]);
        if i < 50 {
            b.validation_events(op, 3);
        }
    }
    let prog = b.build().unwrap();
    let r = simulate_programs(vec![prog.clone()], &p, false, &SimOptions::default()).unwrap();
    let launch = one_kernel_host_ns(&p);
    let kernel = ns(compute_s(1, 0, 1, &p));
    assert!(launch > kernel, "the test needs launch-bound kernels");
    assert_eq!(r.step_time_ns, 100 * launch + kernel);
    let v = simulate_programs(
        vec![prog],
        &p,
        false,
        &SimOptions {
            validation_mode: true,
            ..SimOptions::default()
        },
    )
    .unwrap();
    let events = ns(3.0 * p.calibration.validation_us_per_cpu_event * 1e-6);
    assert!(events > 0);
    assert_eq!(v.step_time_ns, 100 * launch + 50 * events + kernel);
}

/// Two ranks; rank 1 computes before its all-gather, so rank 0 waits at the rendezvous.
fn rendezvous_programs() -> (Vec<StepProgram>, u64) {
    let mut programs = Vec::new();
    for rank in 0..2 {
        let mut b = ProgramBuilder::new(rank);
        let g = b.group(Group::new("dp_shard", vec![0, 1]).unwrap());
        let mut deps = vec![];
        if rank == 1 {
            deps.push(b.compute(work(376_000_000_000), &[]));
        }
        let a = b.collective(
            Stream::AllGather,
            Category::FsdpAg,
            ag(g, 2, 1 << 24),
            &deps,
        );
        b.alloc(a, MemTag::Params, 2 << 24);
        let c = b.compute(work(1), &[a]);
        b.free(c, MemTag::Params, 2 << 24);
        programs.push(b.build().unwrap());
    }
    (programs, 376_000_000_000)
}

#[test]
fn collectives_rendezvous_and_finish_together() {
    let p = a3();
    let (programs, flops) = rendezvous_programs();
    let r = simulate_programs(programs, &p, false, &SimOptions::default()).unwrap();
    let t = r.timeline.as_ref().unwrap();
    let (s0, s1) = (&t.ranks[0].spans, &t.ranks[1].spans);
    // Rank 0's all-gather starts after one launch, rank 1's after its compute.
    let launch_k = one_kernel_host_ns(&p);
    let launch_c = ns(p.calibration.host_launch_us_per_collective * 1e-6);
    assert_eq!(s0[0].start_ns, launch_c);
    let arrive1 = launch_k + ns(compute_s(flops, 0, 1, &p));
    assert_eq!(s1[1].start_ns, arrive1);
    assert_eq!(s0[0].transfer_start_ns, Some(arrive1));
    let dur = two_rank_all_gather_ns(&p, 1 << 24, 2 << 24);
    assert_eq!(s0[0].end_ns, arrive1 + dur);
    assert_eq!(s1[1].end_ns, arrive1 + dur);
    // Rank 0's wait is exposed communication.
    let r0 = r.rank(0).unwrap();
    assert_eq!(r0.breakdown.comm_ns, arrive1 + dur - launch_c);
    assert!(r0.breakdown.exposed_comm_ns >= arrive1 - launch_c);
    assert_eq!(r0.memory.peak_bytes, 2 << 24);
    assert_eq!(r0.memory.end_bytes, 0);
    assert_eq!(r0.collectives[0].count, 1);
    assert_eq!(r0.collectives[0].output_bytes, 2 << 24);
}

#[test]
fn concurrent_transfers_share_the_link() {
    // One rank pair, two all-gathers on two communicators (labels) at once, on two streams:
    // each gets half the bandwidth, so both end after twice the transfer time.
    let p = a3();
    let bytes = 1u64 << 30;
    let mut programs = Vec::new();
    for rank in 0..2 {
        let mut b = ProgramBuilder::new(rank);
        let g1 = b.group(Group::new("a", vec![0, 1]).unwrap());
        let g2 = b.group(Group::new("b", vec![0, 1]).unwrap());
        b.collective(Stream::AllGather, Category::FsdpAg, ag(g1, 2, bytes), &[]);
        b.collective(Stream::Parallel, Category::Tp, ag(g2, 2, bytes), &[]);
        programs.push(b.build().unwrap());
    }
    let r = simulate_programs(programs, &p, false, &SimOptions::default()).unwrap();
    let shape = GroupShape::of(&[0, 1], &p.topology_for(2));
    let ph = collective_phases(
        CollectiveKind::AllGather,
        &shape,
        bytes,
        2 * bytes,
        true,
        &p,
    )[0];
    let (lat, xfer) = (ns(ph.cost.latency_s), ns(ph.cost.transfer_s));
    let t = &r.timeline.as_ref().unwrap().ranks[0].spans;
    let launch_c = ns(p.calibration.host_launch_us_per_collective * 1e-6);
    // First transfer runs alone for one launch interval, then both share.
    let start1 = launch_c + lat;
    let start2 = 2 * launch_c + lat;
    let alone = start2 - start1;
    let end1 = start2 + (xfer - alone) * 2;
    assert_eq!(t[0].end_ns, end1);
    // The second had `alone` ns of work left when the first finished... by symmetry it ends
    // `alone` later than the first, at full rate again.
    assert_eq!(t[1].end_ns, end1 + alone);
    assert!(r.breakdown.comm_ns > 2 * xfer - alone - 10);
}

/// A host op that waits on device work is a device -> host synchronisation: the host stalls
/// until the work is done, then pays its duration plus the sync call (`host_d2h_sync_us`)
/// before launching on.
#[test]
fn host_ops_wait_for_the_device() {
    let p = a3();
    let mut b = ProgramBuilder::new(0);
    let c = b.compute(work(376_000_000_000), &[]);
    let h = b.host(Category::Host, 1_000, &[c]);
    b.compute(work(1), &[h]);
    let r = simulate_programs(vec![b.build().unwrap()], &p, false, &SimOptions::default()).unwrap();
    let s = &r.timeline.as_ref().unwrap().ranks[0].spans;
    assert_eq!(s[1].start_ns, s[0].end_ns);
    let sync = ns(p.calibration.host_d2h_sync_us * 1e-6);
    assert!(sync > 0, "the A3 profile charges the sync call");
    assert_eq!(s[1].end_ns, s[0].end_ns + 1_000 + sync);
    let launch = one_kernel_host_ns(&p);
    assert_eq!(s[2].start_ns, s[1].end_ns + launch);
}

#[test]
fn mismatched_and_missing_collectives_are_reported() {
    let p = a3();
    let mut programs = Vec::new();
    for rank in 0..2 {
        let mut b = ProgramBuilder::new(rank);
        let g = b.group(Group::new("dp_shard", vec![0, 1]).unwrap());
        let mut c = ag(g, 2, 512);
        if rank == 1 {
            c.kind = CollectiveKind::ReduceScatter;
            c.input_bytes = 1024;
            c.output_bytes = 512;
        }
        b.collective(Stream::AllGather, Category::FsdpAg, c, &[]);
        programs.push(b.build().unwrap());
    }
    let err = simulate_programs(programs, &p, false, &SimOptions::default()).unwrap_err();
    assert!(matches!(err, SimError::CollectiveMismatch { .. }), "{err}");
    assert!(err.to_string().contains("dp_shard"));

    let mut programs = Vec::new();
    for rank in 0..2 {
        let mut b = ProgramBuilder::new(rank);
        let g = b.group(Group::new("dp_shard", vec![0, 1]).unwrap());
        if rank == 0 {
            b.collective(Stream::AllGather, Category::FsdpAg, ag(g, 2, 512), &[]);
        } else {
            b.compute(work(1), &[]);
        }
        programs.push(b.build().unwrap());
    }
    let err = simulate_programs(programs, &p, false, &SimOptions::default()).unwrap_err();
    assert!(matches!(err, SimError::Deadlock(_)), "{err}");
    assert!(err.to_string().contains("rank 0"), "{err}");
}

#[test]
fn declared_tiers_must_match_the_topology() {
    let p = a3();
    let mut programs = Vec::new();
    for rank in 0..17 {
        let mut b = ProgramBuilder::new(rank);
        if rank == 0 || rank == 16 {
            let g = b.group(Group::new("x", vec![0, 16]).unwrap());
            b.collective(Stream::AllGather, Category::FsdpAg, ag(g, 2, 512), &[]);
        } else {
            b.compute(work(1), &[]);
        }
        programs.push(b.build().unwrap());
    }
    let err = simulate_programs(programs, &p, false, &SimOptions::default()).unwrap_err();
    assert!(err.to_string().contains("crosses intra-supernode"), "{err}");
}

fn small_cfg(straggler: Option<(usize, u64)>) -> SyntheticConfig {
    SyntheticConfig {
        straggler,
        layer_param_bytes: 64 << 20,
        layer_fwd_flops: 20_000_000_000,
        ..SyntheticConfig::qwen3_like("8 ranks", 2, 4, 4)
    }
}

fn run_small(cfg: &SyntheticConfig, fold: bool) -> hpfsdp_sim::SimResult {
    let mut p = a3();
    // Device-bound, so a straggler's slower compute shows in the step: the shipped A3
    // profile's unmodelled host work per kernel (fitted on exp A) would make these small
    // synthetic layers host-bound and hide it.
    p.calibration.host_unmodelled_us_per_kernel = 0.0;
    // 2 machines of 4 dies: shard groups inside a machine, replica groups across machines.
    let topology = Topology::new(4, 2, 1).unwrap();
    let make = |r| synthetic_program(cfg, &topology, r);
    // Unfolded, every rank is simulated on its own from its first op (no prefix sharing,
    // which would otherwise simulate the 8 identical ranks once, as folding does).
    if fold {
        let w = Workload::fold_with(8, topology, make).unwrap();
        simulate(&w, &p, &SimOptions::default()).unwrap()
    } else {
        let w = Workload::unfolded((0..8).map(|r| make(r).unwrap()).collect(), topology).unwrap();
        hpfsdp_sim::simulate_unshared(&w, &p, &SimOptions::default()).unwrap()
    }
}

fn assert_same_per_rank(folded: &hpfsdp_sim::SimResult, flat: &hpfsdp_sim::SimResult) {
    assert_eq!(folded.step_time_ns, flat.step_time_ns);
    assert_eq!(folded.critical_rank, flat.critical_rank);
    assert_eq!(folded.breakdown, flat.breakdown);
    assert_eq!(folded.peak_memory_bytes, flat.peak_memory_bytes);
    let (ft, ut) = (
        folded.timeline.as_ref().unwrap(),
        flat.timeline.as_ref().unwrap(),
    );
    for rank in 0..8 {
        let (a, b) = (folded.rank(rank).unwrap(), flat.rank(rank).unwrap());
        assert_eq!(a.breakdown, b.breakdown, "rank {rank}");
        assert_eq!(a.memory, b.memory, "rank {rank}");
        assert_eq!(a.collectives, b.collectives, "rank {rank}");
        assert_eq!(
            ft.rank(rank).unwrap().spans,
            ut.rank(rank).unwrap().spans,
            "rank {rank}"
        );
    }
}

#[test]
fn folding_gives_identical_results_on_8_ranks() {
    let cfg = small_cfg(None);
    let folded = run_small(&cfg, true);
    let flat = run_small(&cfg, false);
    assert_eq!(folded.simulated_ranks, 1);
    assert!(folded.folded);
    assert_eq!(flat.simulated_ranks, 8);
    assert!(folded.events_processed < flat.events_processed);
    assert_same_per_rank(&folded, &flat);
    // Both tiers carry traffic.
    let tiers: Vec<Tier> = flat.traffic_per_tier().iter().map(|t| t.0).collect();
    assert_eq!(tiers, vec![Tier::IntraMachine, Tier::IntraSupernode]);
}

#[test]
fn folding_separates_ranks_that_share_a_group_with_a_straggler() {
    let cfg = small_cfg(Some((0, 3)));
    let folded = run_small(&cfg, true);
    let flat = run_small(&cfg, false);
    // Classes: {0}, {1,2,3} (share a shard group with 0), {4} (shares a replica group with 0),
    // {5,6,7}.
    assert_eq!(folded.simulated_ranks, 4);
    let reps: Vec<usize> = folded.ranks.iter().map(|r| r.rank).collect();
    assert_eq!(reps, vec![0, 1, 4, 5]);
    assert_same_per_rank(&folded, &flat);
    let symmetric = run_small(&small_cfg(None), true);
    assert!(folded.step_time_ns > symmetric.step_time_ns);
}

#[test]
fn results_are_byte_identical_across_runs() {
    let cfg = small_cfg(Some((5, 2)));
    let a = serde_json::to_string(&run_small(&cfg, false)).unwrap();
    let b = serde_json::to_string(&run_small(&cfg, false)).unwrap();
    assert_eq!(a, b);
    let c = serde_json::to_string(&run_small(&cfg, true)).unwrap();
    let d = serde_json::to_string(&run_small(&cfg, true)).unwrap();
    assert_eq!(c, d);
}

#[test]
fn synthetic_step_is_sane() {
    let r = run_small(&small_cfg(None), true);
    let b = &r.breakdown;
    assert!(b.compute_ns > 0 && b.comm_ns > 0);
    assert!(b.exposed_comm_ns <= b.comm_ns);
    assert!((0.0..=1.0).contains(&b.overlap_rate));
    let by_cat: u64 = b.by_category.iter().map(|c| c.exposed_comm_ns).sum();
    assert_eq!(by_cat, b.exposed_comm_ns);
    assert!(b.compute_ns + b.idle_ns <= r.step_time_ns + b.comm_ns);
    // Memory: resident shards + optimizer, plus gathered layers and activations at the peak.
    let m = &r.ranks[0].memory;
    assert!(m.peak_bytes > m.series[0].live_bytes);
    assert!(!m.series.is_empty());
}

#[test]
fn bench_runs_on_a_small_case() {
    let p = a3();
    let cfg = SyntheticConfig::qwen3_like("test", 4, 16, 4);
    let folded = hpfsdp_sim::bench_synthetic(&cfg, &p, true).unwrap();
    let flat = hpfsdp_sim::bench_synthetic(&cfg, &p, false).unwrap();
    assert_eq!(folded.world_size, 64);
    assert_eq!(folded.simulated_ranks, 1);
    assert_eq!(flat.simulated_ranks, 64);
    assert_eq!(folded.step_time_s, flat.step_time_s);
    assert!(folded.events > 0 && folded.to_string().contains("64 ranks"));
}

#[test]
fn groups_spanning_machines_run_two_level_collectives() {
    let p = a3();
    let topology = Topology::new(4, 2, 1).unwrap();
    let ranks: Vec<usize> = (0..8).collect();
    let programs: Vec<StepProgram> = (0..8)
        .map(|rank| {
            let mut b = ProgramBuilder::new(rank);
            let g = b.group(Group::new("dp_shard", ranks.clone()).unwrap());
            let mut c = ag(g, 8, 1 << 26);
            c.tier = Tier::IntraSupernode;
            c.aligned_512 = false;
            b.collective(Stream::AllGather, Category::FsdpAg, c, &[]);
            b.build().unwrap()
        })
        .collect();
    let shape = GroupShape::of(&ranks, &topology);
    assert!(shape.split.is_some());
    let phases = collective_phases(
        CollectiveKind::AllGather,
        &shape,
        1 << 26,
        8 << 26,
        false,
        &p,
    );
    assert_eq!(
        phases.iter().map(|x| x.tier).collect::<Vec<_>>(),
        vec![Tier::IntraMachine, Tier::IntraSupernode]
    );
    let dur: u64 = phases
        .iter()
        .map(|x| ns(x.cost.latency_s) + ns(x.cost.transfer_s))
        .sum();
    let launch_c = ns(p.calibration.host_launch_us_per_collective * 1e-6);
    for fold in [false, true] {
        let w = if fold {
            Workload::folded(programs.clone(), topology).unwrap()
        } else {
            Workload::unfolded(programs.clone(), topology).unwrap()
        };
        let r = simulate(&w, &p, &SimOptions::default()).unwrap();
        assert_eq!(r.step_time_ns, launch_c + dur, "fold {fold}");
        assert_eq!(r.breakdown.exposed_comm_ns, dur);
        assert_eq!(r.breakdown.overlap_rate, 0.0);
    }
}

/// Regression: the network reuses a collective's transfer id for each phase, and a finish
/// event of phase 1 whose plan was superseded (a concurrent transfer ended, so phase 1 sped
/// up) once ended phase 2 early when phase 2 had been re-planned as often as phase 1 had
/// been by then. Here the all-gather X over 2 machines x 2 dies shares phase 1 (intra-machine)
/// with a short all-gather Y, and phase 2 (intra-supernode) with an all-gather Z that starts
/// after a compute: X may not end sooner than its phases take alone, and folding (the four
/// ranks are one class) changes nothing.
#[test]
fn a_stale_finish_event_of_phase_one_does_not_end_phase_two() {
    let p = a3();
    let topology = Topology::new(2, 2, 1).unwrap();
    let x_bytes = 1u64 << 26; // X: 256 MiB gathered over 4 ranks
    let phases = collective_phases(
        CollectiveKind::AllGather,
        &GroupShape::of(&[0, 1, 2, 3], &topology),
        x_bytes,
        4 * x_bytes,
        true,
        &p,
    );
    assert_eq!(phases.len(), 2);
    // The compute before Z lasts phase 1 of X plus a quarter of phase 2 (from the profile, so
    // Z lands in phase 2 whatever the calibrated rates are).
    let compute_s = phases[0].cost.total_s() + 0.25 * phases[1].cost.total_s();
    let compute_flops = (compute_s * p.device.bf16_flops_per_s * p.calibration.gemm_ceiling) as u64;
    let programs: Vec<StepProgram> = (0..4)
        .map(|rank| {
            let mut b = ProgramBuilder::new(rank);
            let gx = b.group(Group::new("x", vec![0, 1, 2, 3]).unwrap());
            let machine = rank / 2 * 2;
            let gy = b.group(Group::new("y", vec![machine, machine + 1]).unwrap());
            let gz = b.group(Group::new("z", vec![rank % 2, rank % 2 + 2]).unwrap());
            let mut x = ag(gx, 4, x_bytes);
            x.tier = Tier::IntraSupernode;
            b.collective(Stream::AllGather, Category::FsdpAg, x, &[]);
            b.collective(Stream::Parallel, Category::Tp, ag(gy, 2, 1 << 22), &[]);
            let c = b.compute(work(compute_flops), &[]);
            let mut z = ag(gz, 2, 1 << 24);
            z.tier = Tier::IntraSupernode;
            b.collective(Stream::Aux(0), Category::Tp, z, &[c]);
            b.build().unwrap()
        })
        .collect();
    let alone: u64 = phases
        .iter()
        .map(|x| ns(x.cost.latency_s) + ns(x.cost.transfer_s))
        .sum();
    let mut ends = Vec::new();
    for fold in [false, true] {
        let w = if fold {
            Workload::folded(programs.clone(), topology).unwrap()
        } else {
            Workload::unfolded(programs.clone(), topology).unwrap()
        };
        assert_eq!(w.units.len(), if fold { 1 } else { 4 });
        let r = simulate(&w, &p, &SimOptions::default()).unwrap();
        let t = r.timeline.as_ref().unwrap();
        for rank in 0..4 {
            let spans = &t.rank(rank).unwrap().spans;
            let (x, y, z) = (&spans[0], &spans[1], &spans[3]);
            let start = x.transfer_start_ns.unwrap();
            // The scenario: Y overlaps phase 1 of X, Z overlaps phase 2.
            assert!(
                y.end_ns < start + ns(phases[0].cost.total_s()) * 2,
                "fold {fold}"
            );
            assert!(z.transfer_start_ns.unwrap() > start + ns(phases[0].cost.total_s()));
            assert!(z.transfer_start_ns.unwrap() < x.end_ns, "fold {fold}");
            assert!(
                x.end_ns >= start + alone,
                "fold {fold} rank {rank}: X took {} ns, alone it takes {alone} ns",
                x.end_ns - start
            );
        }
        ends.push((r.step_time_ns, spans_of(&r)));
    }
    assert_eq!(ends[0], ends[1]);
}

fn spans_of(r: &hpfsdp_sim::SimResult) -> Vec<Vec<hpfsdp_program::step::OpSpan>> {
    let t = r.timeline.as_ref().unwrap();
    (0..r.world_size)
        .map(|rank| t.rank(rank).unwrap().spans.clone())
        .collect()
}

/// Launches that start nothing (the host runs ahead of a stream whose head waits) are
/// recorded later in one pass (`engine/launches.rs`): their launch times must still be the
/// host's chain of launch costs, and every collective must match its peers' in launch order.
#[test]
fn launches_queued_behind_a_waiting_stream_keep_their_times() {
    let p = a3();
    let flops = 376_000_000_000;
    let mut programs = Vec::new();
    for rank in 0..2 {
        let mut b = ProgramBuilder::new(rank);
        let g = b.group(Group::new("dp_shard", vec![0, 1]).unwrap());
        let c = b.compute(work(flops), &[]);
        let gathers: Vec<_> = (0..6)
            .map(|_| b.collective(Stream::AllGather, Category::FsdpAg, ag(g, 2, 1 << 20), &[c]))
            .collect();
        b.compute(work(1), &gathers);
        programs.push(b.build().unwrap());
    }
    let r = simulate_programs(programs, &p, false, &SimOptions::default()).unwrap();
    let launch_k = one_kernel_host_ns(&p);
    let launch_c = ns(p.calibration.host_launch_us_per_collective * 1e-6);
    let compute_end = launch_k + ns(compute_s(flops, 0, 1, &p));
    let dur = two_rank_all_gather_ns(&p, 1 << 20, 2 << 20);
    assert!(
        compute_end > launch_k + 6 * launch_c,
        "the launches must run ahead"
    );
    for spans in spans_of(&r) {
        assert_eq!(spans[0].launched_ns, Some(launch_k));
        for k in 0..6u64 {
            let s = &spans[1 + k as usize];
            assert_eq!(s.launched_ns, Some(launch_k + (k + 1) * launch_c));
            assert_eq!(s.start_ns, compute_end + k * dur);
            assert_eq!(s.transfer_start_ns, Some(compute_end + k * dur));
            assert_eq!(s.end_ns, compute_end + (k + 1) * dur);
        }
    }
}
