//! The ASTRA-sim inputs written beside the traces, derived from the hardware profile and the
//! scenario's topology: the analytical network (`<name>.network.yml`), the system
//! (`<name>.system.json`) and the remote memory (`<name>.memory.json`) configurations.
//!
//! Formats as ASTRA-sim reads them (astra-sim `Sys::initialize_sys`, the analytical backend's
//! `NetworkParser`, its `examples/`): one network dimension per topology level that has more
//! than one rank (dies of a machine, machines of a supernode, supernodes), `npus_count` their
//! sizes (the product is the world size), `bandwidth` in GB/s of 2^30 bytes (the backend's
//! `bw_GBps_to_Bpns`) and `latency` in nanoseconds. A mesh tier is a `FullyConnected`
//! dimension (one hop, the tier's alpha per message), a ring tier a `Ring`; the bandwidth is
//! the tier's effective per-rank rate (nominal x efficiency, capped by its per-peer links over
//! the dimension). Collectives use ASTRA-sim's `ring` on every dimension, chunked once, so its
//! figures compare with hpfsdp's alpha-beta ring; compute is replayed from the traces'
//! predicted durations (`roofline-enabled` 0), with the device's peak and HBM bandwidth given
//! for a user who turns the roofline on. `endpoint-delay` is 1 ns, the least ASTRA-sim runs
//! with: at 0 its analytical event queue aborts on an event at the current time
//! (`EventQueue.cpp`: `get_event_time() > current_time`).

use hpfsdp_plan::{Tier, Topology};
use hpfsdp_sim::HardwareProfile;
use hpfsdp_sim::profile::Algorithm;
use std::fmt::Write as _;

/// Bytes in ASTRA-sim's "GB" (its analytical backend converts GB/s with `1 << 30`).
pub const ASTRA_GB: f64 = (1u64 << 30) as f64;

/// One dimension of the analytical network.
#[derive(Debug, Clone, PartialEq)]
pub struct NetworkDim {
    /// The hpfsdp tier this dimension models.
    pub tier: Tier,
    /// `Ring` or `FullyConnected`.
    pub topology: &'static str,
    /// Ranks along the dimension.
    pub npus: usize,
    /// Effective per-rank bandwidth, GB/s of 2^30 bytes.
    pub bandwidth_gb_per_s: f64,
    /// Per-message latency, nanoseconds.
    pub latency_ns: f64,
}

/// The network dimensions of `topology` on `profile`, innermost first; a topology of one
/// rank gives one intra-machine dimension of one rank.
pub fn network_dims(topology: &Topology, profile: &HardwareProfile) -> Vec<NetworkDim> {
    let levels = [
        (Tier::IntraMachine, topology.dies_per_machine),
        (Tier::IntraSupernode, topology.machines_per_supernode),
        (Tier::InterSupernode, topology.supernodes),
    ];
    let mut dims: Vec<NetworkDim> = levels
        .iter()
        .filter(|(_, n)| *n > 1)
        .map(|&(tier, npus)| dim(tier, npus, profile))
        .collect();
    if dims.is_empty() {
        dims.push(dim(Tier::IntraMachine, 1, profile));
    }
    dims
}

fn dim(tier: Tier, npus: usize, profile: &HardwareProfile) -> NetworkDim {
    let spec = profile.tiers.get(tier);
    NetworkDim {
        tier,
        topology: match spec.algorithm {
            Algorithm::Ring => "Ring",
            Algorithm::Mesh => "FullyConnected",
        },
        npus,
        bandwidth_gb_per_s: spec.effective_bandwidth_bytes_per_s(npus) / ASTRA_GB,
        latency_ns: spec.latency_us * 1e3,
    }
}

/// `<name>.network.yml`: the analytical (congestion-unaware or -aware) network.
pub fn network_yml(dims: &[NetworkDim], profile: &HardwareProfile) -> String {
    let list =
        |f: &dyn Fn(&NetworkDim) -> String| dims.iter().map(f).collect::<Vec<_>>().join(", ");
    let mut out = format!(
        "# ASTRA-sim analytical network of hardware profile '{}', written by hpfsdp export.\n# Dimensions innermost first: {}.\n",
        profile.name,
        list(&|d| format!("{} ({} ranks)", d.tier, d.npus))
    );
    let _ = writeln!(out, "topology: [ {} ]", list(&|d| d.topology.to_string()));
    let _ = writeln!(out, "npus_count: [ {} ]", list(&|d| d.npus.to_string()));
    let _ = writeln!(
        out,
        "bandwidth: [ {} ]  # GB/s (2^30 bytes), effective per rank",
        list(&|d| format!("{:.3}", d.bandwidth_gb_per_s))
    );
    let _ = writeln!(
        out,
        "latency: [ {} ]  # ns per message",
        list(&|d| format!("{:.1}", d.latency_ns))
    );
    out
}

/// `<name>.system.json`: ring collectives on every dimension, replayed compute.
pub fn system_json(dims: &[NetworkDim], profile: &HardwareProfile) -> String {
    let ring: Vec<&str> = dims.iter().map(|_| "ring").collect();
    let value = serde_json::json!({
        "scheduling-policy": "LIFO",
        "endpoint-delay": 1,
        "active-chunks-per-dimension": 1,
        "preferred-dataset-splits": 1,
        "all-reduce-implementation": ring,
        "all-gather-implementation": ring,
        "reduce-scatter-implementation": ring,
        "all-to-all-implementation": ring,
        "collective-optimization": "baseline",
        "local-mem-bw": profile.device.hbm_bandwidth_bytes_per_s / 1e9,
        "peak-perf": profile.device.bf16_flops_per_s / 1e12,
        "roofline-enabled": 0,
        "boost-mode": 0
    });
    let mut text = serde_json::to_string_pretty(&value).unwrap_or_default();
    text.push('\n');
    text
}

/// `<name>.memory.json`: no remote memory (the traces have no memory load/store nodes).
pub fn memory_json() -> String {
    "{\n  \"memory-type\": \"NO_MEMORY_EXPANSION\"\n}\n".to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a3_dims_follow_the_topology_and_tiers() {
        let profile = HardwareProfile::load_named("ascend-910c-a3", "../scenarios/hardware")
            .expect("the shipped profile loads");
        let t = Topology::new(16, 4, 2).unwrap();
        let dims = network_dims(&t, &profile);
        assert_eq!(dims.iter().map(|d| d.npus).collect::<Vec<_>>(), [16, 4, 2]);
        assert_eq!(dims[0].topology, "FullyConnected");
        assert_eq!(dims[2].topology, "Ring");
        // 196e9 B/s x 0.5509 efficiency in GiB/s; 1.3 us.
        assert!((dims[0].bandwidth_gb_per_s - 196e9 * 0.5509 / ASTRA_GB).abs() < 1e-9);
        assert!((dims[0].latency_ns - 1300.0).abs() < 1e-9);
        let yml = network_yml(&dims, &profile);
        assert!(yml.contains("npus_count: [ 16, 4, 2 ]"), "{yml}");
        assert!(yml.contains("topology: [ FullyConnected, FullyConnected, Ring ]"));
        let sys: serde_json::Value = serde_json::from_str(&system_json(&dims, &profile)).unwrap();
        assert_eq!(
            sys["all-gather-implementation"].as_array().unwrap().len(),
            3
        );
        assert_eq!(sys["local-mem-bw"], 1600.0);
        assert_eq!(sys["endpoint-delay"], 1, "0 aborts ASTRA-sim's event queue");
        let one = network_dims(&Topology::new(1, 1, 1).unwrap(), &profile);
        assert_eq!(one.len(), 1);
        assert_eq!(one[0].npus, 1);
    }
}
