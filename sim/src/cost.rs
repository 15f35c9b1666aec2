//! Cost models: alpha-beta collectives (flat ring/mesh, two-level hierarchical, pairwise
//! all-to-all, pipelined broadcast, send/recv), the unaligned-buffer penalty, copies at HBM
//! bandwidth, and the roofline of compute ops (each kernel of a mix costed by class in
//! [`crate::compute_cost`]). Pure functions of sizes and profile numbers.
//!
//! Notation (shared/reference/notes/backends-hardware.md section 6): `p` ranks, `n` bytes of
//! the *full* buffer per rank (all-gather output, reduce-scatter input, all-reduce buffer,
//! all-to-all send total), `alpha` the per-step latency and `B` the per-rank bandwidth of the
//! tier. Reduction arithmetic (gamma) is not charged: on the modelled hardware it runs on
//! otherwise idle vector units at far more than link bandwidth.

use crate::profile::{Algorithm, HardwareProfile, TierSpec};
use crate::shape::GroupShape;
use hpfsdp_plan::{CollectiveKind, Tier};
use hpfsdp_program::step::CopyKind;
use serde::{Deserialize, Serialize};

/// Alpha-beta parameters of one tier for one collective phase.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Link {
    /// Latency per step, seconds.
    pub alpha_s: f64,
    /// Per-rank bandwidth, bytes per second (efficiency and alignment already applied).
    pub bandwidth_bytes_per_s: f64,
    /// Ring (`p - 1` steps per pass) or mesh (one step per pass).
    pub algorithm: Algorithm,
}

impl Link {
    /// The link of `tier` for a phase over `p` ranks: effective bandwidth (tier efficiency,
    /// per-peer cap) times the unaligned factor when `aligned_512` is false.
    pub fn of(spec: &TierSpec, p: usize, aligned_512: bool, unaligned_factor: f64) -> Self {
        let bw = spec.effective_bandwidth_bytes_per_s(p);
        Self {
            alpha_s: spec.latency_s(),
            bandwidth_bytes_per_s: aligned_bandwidth(bw, aligned_512, unaligned_factor),
            algorithm: spec.algorithm,
        }
    }

    fn steps(&self, p: usize) -> f64 {
        match (self.algorithm, p) {
            (_, 0 | 1) => 0.0,
            (Algorithm::Ring, p) => (p - 1) as f64,
            (Algorithm::Mesh, _) => 1.0,
        }
    }

    fn seconds(&self, bytes: f64) -> f64 {
        bytes / self.bandwidth_bytes_per_s
    }
}

/// The bandwidth a buffer gets: `bw` when aligned to 512 bytes, `bw * factor` otherwise
/// (measured on A3: 51.13 / 101.96 GB/s).
pub fn aligned_bandwidth(bw_bytes_per_s: f64, aligned_512: bool, factor: f64) -> f64 {
    if aligned_512 {
        bw_bytes_per_s
    } else {
        bw_bytes_per_s * factor
    }
}

/// Cost of one phase: a latency part (not shared) then a transfer part that takes
/// `transfer_s` at the full bandwidth and stretches when the link is shared.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct PhaseCost {
    /// Latency (alpha) terms, seconds.
    pub latency_s: f64,
    /// Bandwidth (beta) terms at full bandwidth, seconds.
    pub transfer_s: f64,
}

impl PhaseCost {
    /// Latency plus transfer.
    pub fn total_s(&self) -> f64 {
        self.latency_s + self.transfer_s
    }
}

/// One phase of a collective on one tier.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Phase {
    /// The tier whose links carry the phase.
    pub tier: Tier,
    /// Its cost when alone on the link.
    pub cost: PhaseCost,
}

/// All-gather, `n` = output bytes: ring `(p-1) alpha + (p-1)/p n / B`; mesh `alpha + (p-1)/p n / B`.
pub fn all_gather(p: usize, n_bytes: f64, link: &Link) -> PhaseCost {
    PhaseCost {
        latency_s: link.steps(p) * link.alpha_s,
        transfer_s: frac(p) * link.seconds(n_bytes),
    }
}

/// Reduce-scatter, `n` = input bytes: same cost as an all-gather of `n`.
pub fn reduce_scatter(p: usize, n_bytes: f64, link: &Link) -> PhaseCost {
    all_gather(p, n_bytes, link)
}

/// All-reduce (reduce-scatter + all-gather): `2 (p-1) alpha + 2 (p-1)/p n / B` (ring).
pub fn all_reduce(p: usize, n_bytes: f64, link: &Link) -> PhaseCost {
    let half = all_gather(p, n_bytes, link);
    PhaseCost {
        latency_s: 2.0 * half.latency_s,
        transfer_s: 2.0 * half.transfer_s,
    }
}

/// Pairwise all-to-all, `n` = bytes each rank sends (own block included):
/// `(p-1) alpha + (p-1)/p n / B` (ring/pairwise; mesh pays one alpha).
pub fn all_to_all(p: usize, n_bytes: f64, link: &Link) -> PhaseCost {
    all_gather(p, n_bytes, link)
}

/// Broadcast of `n` bytes, per the collective library of the tier's algorithm.
///
/// - **Mesh tiers (HCCL inside an Ascend server): scatter, then all-gather**,
///   `2 alpha + 2 (p-1)/p n / B`: twice the bandwidth term of an all-gather of the same `n`.
///   Source facts: HCCL's broadcast selector for A3 (`BroadCastOperator::SelectAlgfor91093`,
///   `broadcast_operator.cc`) runs large broadcasts inside one server with
///   `BroadCastRingFor91093Executor`, whose `KernelRun` is "level0 scatter" (single or double
///   ring), the inter-server broadcast (skipped on one server), then "level0 allgather"
///   (`MultiRingAllGather`); its fallback `BroadCastComm` forces `NHR` on A3, whose broadcast
///   is also scatter + all-gather (HCCL docs, notes `backends-hardware.md` 6.3:
///   NHR/NB broadcast `2 ceil(lg p) alpha + 2 (p-1)/p n beta`; Mesh broadcast
///   `2 alpha + 2 n beta / p` per link). Both phases move `(p-1)/p n` through every rank's
///   links at the all-gather rate (the scatter's root sends `(p-1)/p n`, the all-gather every
///   rank), so an owner-to-all broadcast costs twice the all-gather of the same bytes, and an
///   all-to-one reduce the same (`CollReduceRingFor91093Executor`: level0 reduce-scatter,
///   then level0 gather to the root), which is why a reduce is costed as a broadcast.
/// - **Ring tiers (NCCL rings, MPI): pipelined chain** with `k` chunks,
///   `(p - 2 + k)(alpha + n / (k B))`, where `k = round(sqrt((p - 2) n / (B alpha)))` clamped
///   to `[1, 65536]` minimises the time (`k = 1` gives HCCL's unpipelined ring
///   `(p-1)(alpha + n/B)` for `p = 2`, large `k` approaches `n / B`: nccl-tests count a
///   broadcast's bus bandwidth with factor 1, notes 6.4, and NCCL's ring broadcast forwards
///   chunks down the ring, so a large broadcast runs at about the link rate, not half of it).
pub fn broadcast(p: usize, n_bytes: f64, link: &Link) -> PhaseCost {
    if p <= 1 {
        return PhaseCost::default();
    }
    match link.algorithm {
        Algorithm::Mesh => PhaseCost {
            latency_s: 2.0 * link.alpha_s,
            transfer_s: 2.0 * frac(p) * link.seconds(n_bytes),
        },
        Algorithm::Ring => {
            let hops = (p - 2) as f64;
            let k = if link.alpha_s > 0.0 {
                (hops * link.seconds(n_bytes) / link.alpha_s)
                    .sqrt()
                    .round()
                    .clamp(1.0, 65536.0)
            } else {
                65536.0
            };
            let rounds = hops + k;
            PhaseCost {
                latency_s: rounds * link.alpha_s,
                transfer_s: rounds / k * link.seconds(n_bytes),
            }
        }
    }
}

/// Send/recv of `n` bytes each way: `alpha + n / B` (links are full duplex).
pub fn send_recv(n_bytes: f64, link: &Link) -> PhaseCost {
    PhaseCost {
        latency_s: link.alpha_s,
        transfer_s: link.seconds(n_bytes),
    }
}

/// Two-level all-gather over `a` ranks per domain and `b` domains (HCCL: intra then inter):
/// intra all-gather of `n / b`, then inter all-gather of `n` among `b` ranks.
pub fn hierarchical_all_gather(
    a: usize,
    b: usize,
    n_bytes: f64,
    inner: &Link,
    outer: &Link,
) -> [PhaseCost; 2] {
    [
        all_gather(a, n_bytes / b as f64, inner),
        all_gather(b, n_bytes, outer),
    ]
}

/// Two-level reduce-scatter (HCCL: inter then intra): inter reduce-scatter of `n` among `b`
/// ranks, then intra reduce-scatter of `n / b`.
pub fn hierarchical_reduce_scatter(
    a: usize,
    b: usize,
    n_bytes: f64,
    inner: &Link,
    outer: &Link,
) -> [PhaseCost; 2] {
    [
        reduce_scatter(b, n_bytes, outer),
        reduce_scatter(a, n_bytes / b as f64, inner),
    ]
}

/// Two-level all-reduce: intra reduce-scatter of `n`, inter all-reduce of `n / a`, intra
/// all-gather of `n`.
pub fn hierarchical_all_reduce(
    a: usize,
    b: usize,
    n_bytes: f64,
    inner: &Link,
    outer: &Link,
) -> [PhaseCost; 3] {
    [
        reduce_scatter(a, n_bytes, inner),
        all_reduce(b, n_bytes / a as f64, outer),
        all_gather(a, n_bytes, inner),
    ]
}

/// Two-level pairwise all-to-all: blocks of `n / p` go to the `a - 1` peers of the own domain
/// over the inner tier, then to the `p - a` others over the outer tier.
pub fn hierarchical_all_to_all(
    a: usize,
    b: usize,
    n_bytes: f64,
    inner: &Link,
    outer: &Link,
) -> [PhaseCost; 2] {
    let p = a * b;
    let block = n_bytes / p as f64;
    let outer_steps = match outer.algorithm {
        Algorithm::Ring => (p - a) as f64,
        Algorithm::Mesh => 1.0,
    };
    [
        all_to_all(a, block * a as f64, inner),
        PhaseCost {
            latency_s: outer_steps * outer.alpha_s,
            transfer_s: outer.seconds(block * (p - a) as f64),
        },
    ]
}

/// Two-level broadcast: inter broadcast among `b` domain leaders, then intra broadcast.
pub fn hierarchical_broadcast(
    a: usize,
    b: usize,
    n_bytes: f64,
    inner: &Link,
    outer: &Link,
) -> [PhaseCost; 2] {
    [broadcast(b, n_bytes, outer), broadcast(a, n_bytes, inner)]
}

fn frac(p: usize) -> f64 {
    if p <= 1 {
        0.0
    } else {
        (p - 1) as f64 / p as f64
    }
}

/// The bytes the cost formulas use for a collective (`n` in the module notation).
pub fn formula_bytes(kind: CollectiveKind, input_bytes: u64, output_bytes: u64) -> u64 {
    match kind {
        CollectiveKind::AllGather => output_bytes,
        CollectiveKind::ReduceScatter | CollectiveKind::AllReduce | CollectiveKind::Broadcast => {
            input_bytes
        }
        CollectiveKind::AllToAll | CollectiveKind::AllToAllV | CollectiveKind::SendRecv => {
            input_bytes.max(output_bytes)
        }
    }
}

/// The phases of one collective on a group of the given shape: flat on the group's tier, or
/// two-level when the profile enables it and the group splits evenly. The profile's
/// `collective_base_latency_us` is added to the first phase. A group of one rank costs nothing.
pub fn collective_phases(
    kind: CollectiveKind,
    shape: &GroupShape,
    input_bytes: u64,
    output_bytes: u64,
    aligned_512: bool,
    profile: &HardwareProfile,
) -> Vec<Phase> {
    let p = shape.ranks;
    if p <= 1 {
        return Vec::new();
    }
    let n = formula_bytes(kind, input_bytes, output_bytes) as f64;
    let factor = profile.calibration.unaligned_bandwidth_factor;
    let link =
        |tier: Tier, ranks: usize| Link::of(profile.tiers.get(tier), ranks, aligned_512, factor);
    let mut phases: Vec<Phase> = match shape.split {
        Some(s) if profile.collectives.hierarchical && kind != CollectiveKind::SendRecv => {
            let (a, b) = (s.per_domain, s.domains);
            let inner = link(s.inner_tier, a);
            let outer = link(shape.tier, b);
            let (i, o) = (s.inner_tier, shape.tier);
            match kind {
                CollectiveKind::AllGather => {
                    zip(&[i, o], &hierarchical_all_gather(a, b, n, &inner, &outer))
                }
                CollectiveKind::ReduceScatter => zip(
                    &[o, i],
                    &hierarchical_reduce_scatter(a, b, n, &inner, &outer),
                ),
                CollectiveKind::AllReduce => zip(
                    &[i, o, i],
                    &hierarchical_all_reduce(a, b, n, &inner, &outer),
                ),
                CollectiveKind::Broadcast => {
                    zip(&[o, i], &hierarchical_broadcast(a, b, n, &inner, &outer))
                }
                CollectiveKind::AllToAll | CollectiveKind::AllToAllV | CollectiveKind::SendRecv => {
                    zip(&[i, o], &hierarchical_all_to_all(a, b, n, &inner, &outer))
                }
            }
        }
        _ => {
            let l = link(shape.tier, p);
            let cost = match kind {
                CollectiveKind::AllGather => all_gather(p, n, &l),
                CollectiveKind::ReduceScatter => reduce_scatter(p, n, &l),
                CollectiveKind::AllReduce => all_reduce(p, n, &l),
                CollectiveKind::Broadcast => broadcast(p, n, &l),
                CollectiveKind::AllToAll | CollectiveKind::AllToAllV => all_to_all(p, n, &l),
                CollectiveKind::SendRecv => send_recv(n, &l),
            };
            vec![Phase {
                tier: shape.tier,
                cost,
            }]
        }
    };
    if let Some(first) = phases.first_mut() {
        first.cost.latency_s += profile.calibration.collective_base_latency_us * 1e-6;
    }
    phases
}

fn zip(tiers: &[Tier], costs: &[PhaseCost]) -> Vec<Phase> {
    tiers
        .iter()
        .zip(costs)
        .map(|(&tier, &cost)| Phase { tier, cost })
        .collect()
}

/// Roofline time of kernel work with no kernel mix (memory-bound work: settle kernels,
/// optimizer element-wise kernels), seconds:
/// `max(flops / (peak * gemm_ceiling), bytes / (hbm_bw * hbm_eff)) + kernels * device_launch`.
pub fn compute_s(flops: u64, hbm_bytes: u64, kernels: u32, profile: &HardwareProfile) -> f64 {
    let c = &profile.calibration;
    let d = &profile.device;
    let math = flops as f64 / (d.bf16_flops_per_s * c.gemm_ceiling);
    let memory = hbm_bytes as f64 / (d.hbm_bandwidth_bytes_per_s * c.hbm_efficiency);
    math.max(memory) + kernels as f64 * c.device_launch_us_per_kernel * 1e-6
}

/// Device time of one compute op, seconds: each entry of its kernel mix costed on its own by
/// class ([`crate::compute_cost::kernel_s`]), or the op's totals as one memory-bound roofline
/// when it has no mix.
pub fn compute_work_s(
    work: &hpfsdp_program::step::ComputeWork,
    mixes: &std::collections::BTreeMap<
        hpfsdp_plan::kernel::MixId,
        Vec<hpfsdp_plan::kernel::KernelWork>,
    >,
    profile: &HardwareProfile,
) -> f64 {
    match work.mix.and_then(|id| mixes.get(&id)) {
        Some(kernels) => kernels
            .iter()
            .map(|k| crate::compute_cost::kernel_s(k, profile))
            .sum(),
        None => compute_s(work.flops, work.hbm_bytes, work.kernels, profile),
    }
}

/// Device copy of `bytes` (read once, written once) at HBM bandwidth, seconds:
/// `2 bytes / (hbm_bw * copy_eff) + kernels * device_launch`.
pub fn copy_s(bytes: u64, kernels: u32, profile: &HardwareProfile) -> f64 {
    copy_of_kind_s(bytes, kernels, CopyKind::Plain, profile)
}

/// Device time of one copy op, seconds: [`copy_of_kind_s`] of its bytes and launches, plus,
/// for FSDP2's `chunk_cat` on a profile that gives
/// `compute.chunk_cat_metadata_h2d_bytes_per_s`, the pinned host -> device copy of its block
/// table (8 bytes per [`crate::compute_spec::CHUNK_CAT_ELEMENTS_PER_BLOCK`] elements) and that
/// copy's own launch.
pub fn copy_work_s(work: &hpfsdp_program::step::CopyWork, profile: &HardwareProfile) -> f64 {
    let copy = copy_of_kind_s(work.bytes, work.kernels + work.memcpys, work.kind, profile);
    match (
        work.kind,
        profile.compute.chunk_cat_metadata_h2d_bytes_per_s,
    ) {
        (CopyKind::ChunkCat, Some(h2d)) if work.elements > 0 => {
            let blocks = work
                .elements
                .div_ceil(crate::compute_spec::CHUNK_CAT_ELEMENTS_PER_BLOCK);
            copy + (blocks * 8) as f64 / h2d
                + profile.calibration.device_launch_us_per_kernel * 1e-6
        }
        _ => copy,
    }
}

/// [`copy_s`] for a copy kernel of `kind`: FSDP2's `chunk_cat` at
/// `compute.chunk_cat_relative_bandwidth` of a plain copy's bandwidth.
pub fn copy_of_kind_s(bytes: u64, kernels: u32, kind: CopyKind, profile: &HardwareProfile) -> f64 {
    let c = &profile.calibration;
    let relative = match kind {
        CopyKind::Plain => 1.0,
        CopyKind::ChunkCat => profile.compute.chunk_cat_relative_bandwidth,
    };
    2.0 * bytes as f64 / (profile.device.hbm_bandwidth_bytes_per_s * c.copy_efficiency * relative)
        + kernels as f64 * c.device_launch_us_per_kernel * 1e-6
}

#[cfg(test)]
mod tests {
    use super::*;
    use hpfsdp_plan::Topology;

    fn close(a: f64, b: f64) {
        assert!((a - b).abs() <= 1e-12 + 1e-9 * b.abs(), "{a} != {b}");
    }

    const RING: Link = Link {
        alpha_s: 2e-6,
        bandwidth_bytes_per_s: 100e9,
        algorithm: Algorithm::Ring,
    };
    const MESH: Link = Link {
        alpha_s: 2e-6,
        bandwidth_bytes_per_s: 100e9,
        algorithm: Algorithm::Mesh,
    };

    #[test]
    fn flat_ring_formulas() {
        // p = 8, n = 800 MB, alpha = 2 us, B = 100 GB/s.
        let c = all_gather(8, 800e6, &RING);
        close(c.latency_s, 7.0 * 2e-6);
        close(c.transfer_s, 7.0 / 8.0 * 800e6 / 100e9); // 7 ms
        close(reduce_scatter(8, 800e6, &RING).total_s(), c.total_s());
        let ar = all_reduce(8, 800e6, &RING);
        close(ar.latency_s, 28e-6);
        close(ar.transfer_s, 14e-3);
        let a2a = all_to_all(4, 400e6, &RING);
        close(a2a.total_s(), 3.0 * 2e-6 + 0.75 * 4e-3);
        close(send_recv(1e9, &RING).total_s(), 2e-6 + 10e-3);
        assert_eq!(all_gather(1, 1e9, &RING), PhaseCost::default());
    }

    #[test]
    fn mesh_pays_one_alpha_per_pass() {
        close(all_gather(16, 1.6e9, &MESH).latency_s, 2e-6);
        close(all_gather(16, 1.6e9, &MESH).transfer_s, 15.0 / 16.0 * 16e-3);
        close(all_reduce(16, 1.6e9, &MESH).latency_s, 4e-6);
        let b = broadcast(4, 1e9, &MESH);
        close(b.total_s(), 2.0 * 2e-6 + 2.0 * 0.75 * 10e-3);
    }

    #[test]
    fn pipelined_broadcast() {
        // p = 2: k* = 0 -> 1 chunk: alpha + n/B.
        close(broadcast(2, 1e9, &RING).total_s(), 2e-6 + 10e-3);
        // p = 10, n = 1 GB: n/B = 10 ms, k* = sqrt(8 * 0.01 / 2e-6) = 200.
        let c = broadcast(10, 1e9, &RING);
        close(c.latency_s, 208.0 * 2e-6);
        close(c.transfer_s, 208.0 / 200.0 * 10e-3);
        // Small message: one chunk, HCCL ring (p - 1)(alpha + n/B).
        let c = broadcast(4, 1.0, &RING);
        close(c.total_s(), 3.0 * (2e-6 + 1.0 / 100e9));
    }

    #[test]
    fn hierarchical_formulas() {
        let outer = Link {
            alpha_s: 5e-6,
            bandwidth_bytes_per_s: 10e9,
            algorithm: Algorithm::Ring,
        };
        // a = 4, b = 2, n = 800 MB.
        let [i, o] = hierarchical_all_gather(4, 2, 800e6, &RING, &outer);
        close(i.total_s(), 3.0 * 2e-6 + 0.75 * 400e6 / 100e9);
        close(o.total_s(), 5e-6 + 0.5 * 800e6 / 10e9);
        let [o2, i2] = hierarchical_reduce_scatter(4, 2, 800e6, &RING, &outer);
        close(o2.total_s(), o.total_s());
        close(i2.total_s(), i.total_s());
        let [rs, ar, ag] = hierarchical_all_reduce(4, 2, 800e6, &RING, &outer);
        close(rs.total_s(), 3.0 * 2e-6 + 0.75 * 8e-3);
        close(ar.total_s(), 2.0 * 5e-6 + 2.0 * 0.5 * 200e6 / 10e9);
        close(ag.total_s(), rs.total_s());
        let [i, o] = hierarchical_all_to_all(4, 2, 800e6, &RING, &outer);
        close(i.total_s(), 3.0 * 2e-6 + 300e6 / 100e9);
        close(o.total_s(), 4.0 * 5e-6 + 400e6 / 10e9);
    }

    #[test]
    fn alignment_and_compute() {
        close(aligned_bandwidth(100e9, false, 0.5), 50e9);
        close(aligned_bandwidth(100e9, true, 0.5), 100e9);
        let p = HardwareProfile::builtin("ascend-910c-a3").unwrap();
        let c = &p.calibration;
        // Math-bound: 1e15 FLOPs.
        let t = compute_s(1_000_000_000_000_000, 0, 1, &p);
        close(
            t,
            1e15 / (376e12 * c.gemm_ceiling) + c.device_launch_us_per_kernel * 1e-6,
        );
        // Memory-bound: 1.6e12 bytes.
        let t = compute_s(1, 1_600_000_000_000, 3, &p);
        close(
            t,
            1.0 / c.hbm_efficiency + 3.0 * c.device_launch_us_per_kernel * 1e-6,
        );
        close(
            copy_s(800_000_000_000, 1, &p),
            1.0 / c.copy_efficiency + c.device_launch_us_per_kernel * 1e-6,
        );
    }

    #[test]
    fn chunk_cat_adds_its_block_table_copy_where_the_profile_gives_its_bandwidth() {
        let mut p = HardwareProfile::builtin("nvidia-h200-hgx").unwrap();
        let work = hpfsdp_program::step::CopyWork {
            bytes: 3_000_000_000,
            kernels: 1,
            memcpys: 0,
            kind: CopyKind::ChunkCat,
            elements: 1_000_000_000,
        };
        let kernel = copy_of_kind_s(work.bytes, 1, CopyKind::ChunkCat, &p);
        p.compute.chunk_cat_metadata_h2d_bytes_per_s = Some(50e9);
        // 1e9 / 512 blocks (rounded up) of 8 bytes at 50 GB/s, plus the copy's launch.
        let table_s = 1_953_125.0 * 8.0 / 50e9 + p.calibration.device_launch_us_per_kernel * 1e-6;
        close(copy_work_s(&work, &p), kernel + table_s);
        // Without the bandwidth, or for a plain copy, nothing is added.
        let plain = hpfsdp_program::step::CopyWork {
            kind: CopyKind::Plain,
            ..work
        };
        close(
            copy_work_s(&plain, &p),
            copy_of_kind_s(work.bytes, 1, CopyKind::Plain, &p),
        );
        p.compute.chunk_cat_metadata_h2d_bytes_per_s = None;
        close(copy_work_s(&work, &p), kernel);
    }

    #[test]
    fn phases_follow_the_shape() {
        let p = HardwareProfile::builtin("ascend-910c-a3").unwrap();
        let topo = p.topology_for(1536);
        // 16 ranks of one machine: flat mesh on the intra-machine tier.
        let shape = GroupShape::of(&(0..16).collect::<Vec<_>>(), &topo);
        let ph = collective_phases(
            CollectiveKind::AllGather,
            &shape,
            1 << 20,
            16 << 20,
            true,
            &p,
        );
        assert_eq!(ph.len(), 1);
        let bw = 196e9 * p.tiers.intra_machine.efficiency;
        close(
            ph[0].cost.transfer_s,
            15.0 / 16.0 * (16u64 << 20) as f64 / bw,
        );
        close(ph[0].cost.latency_s, 1.3e-6);
        // Unaligned: slower by the factor.
        let un = collective_phases(
            CollectiveKind::AllGather,
            &shape,
            1 << 20,
            16 << 20,
            false,
            &p,
        );
        close(
            un[0].cost.transfer_s,
            ph[0].cost.transfer_s / p.calibration.unaligned_bandwidth_factor,
        );
        // Two supernodes, 768 ranks each: inter then intra for reduce-scatter.
        let shape = GroupShape::of(&(0..1536).collect::<Vec<_>>(), &topo);
        let ph = collective_phases(CollectiveKind::ReduceScatter, &shape, 1536, 1, true, &p);
        assert_eq!(
            ph.iter().map(|x| x.tier).collect::<Vec<_>>(),
            vec![Tier::InterSupernode, Tier::IntraSupernode]
        );
        let t = Topology::new(16, 48, 1).unwrap();
        assert!(
            collective_phases(
                CollectiveKind::AllReduce,
                &GroupShape::of(&[3], &t),
                8,
                8,
                true,
                &p
            )
            .is_empty()
        );
    }

    /// HCCL on A3 (mesh tier inside one machine): a broadcast is a scatter then an all-gather
    /// (`BroadCastRingFor91093Executor`), so its transfer is twice an all-gather's of the same
    /// bytes, and two alphas; a pipelined-chain broadcast there would halve the Muon relay and
    /// owner-publication costs.
    #[test]
    fn a3_broadcast_is_scatter_plus_all_gather() {
        let p = HardwareProfile::builtin("ascend-910c-a3").unwrap();
        let topo = p.topology_for(16);
        let shape = GroupShape::of(&(0..16).collect::<Vec<_>>(), &topo);
        let n: u64 = 996 << 20;
        let bc = collective_phases(CollectiveKind::Broadcast, &shape, n, n, true, &p);
        let ag = collective_phases(CollectiveKind::AllGather, &shape, n / 16, n, true, &p);
        assert_eq!((bc.len(), ag.len()), (1, 1));
        close(bc[0].cost.transfer_s, 2.0 * ag[0].cost.transfer_s);
        close(bc[0].cost.latency_s, 2.0 * ag[0].cost.latency_s);
        // The owner's bytes leave at the all-gather rate, twice: 2 (p-1)/p n / B_eff.
        let bw = p.tiers.intra_machine.effective_bandwidth_bytes_per_s(16);
        close(bc[0].cost.transfer_s, 2.0 * 15.0 / 16.0 * n as f64 / bw);
    }

    /// NCCL on an NVSwitch node (ring tier): a large broadcast is a pipelined chain that
    /// approaches `n / B`: between the all-gather of the same bytes times p/(p-1) = 8/7 and
    /// 1.5x it (the chain's fill, `(p-2)/k`, with the latency-optimal chunk count), well
    /// below the 2x of HCCL's scatter + all-gather.
    #[test]
    fn nccl_ring_broadcast_is_pipelined() {
        let p = HardwareProfile::builtin("nvidia-h100-hgx").unwrap();
        let topo = p.topology_for(8);
        let shape = GroupShape::of(&(0..8).collect::<Vec<_>>(), &topo);
        let n: u64 = 1 << 30;
        let bc = collective_phases(CollectiveKind::Broadcast, &shape, n, n, true, &p);
        let ag = collective_phases(CollectiveKind::AllGather, &shape, n / 8, n, true, &p);
        let ratio = bc[0].cost.transfer_s / ag[0].cost.transfer_s;
        assert!(
            ratio > 8.0 / 7.0 && ratio < 1.5,
            "broadcast / all-gather = {ratio}"
        );
    }
}
