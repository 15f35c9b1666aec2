//! Hardware profiles: device peaks, the three network tiers and calibrated constants, read from
//! TOML files in `scenarios/hardware/`. Every key carries its unit in its name.

use crate::compute_spec::ComputeSpec;
use crate::gemm_table::GemmTable;
pub use crate::profile_values::ProfileError;
pub(crate) use crate::profile_values::{fraction, non_negative, positive};
use hpfsdp_plan::input_file::read_text;
use hpfsdp_plan::{Tier, Topology, limits};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// One accelerator (one simulated rank: an Ascend die, an NVIDIA GPU).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceSpec {
    /// Marketing name of the die or GPU.
    pub name: String,
    /// Dense BF16 peak, FLOP per second.
    pub bf16_flops_per_s: f64,
    /// HBM capacity in bytes.
    pub hbm_capacity_bytes: u64,
    /// HBM bandwidth in bytes per second.
    pub hbm_bandwidth_bytes_per_s: f64,
    /// Whether a kernel on a side stream (any stream but the compute stream) shares the
    /// device's cores with the compute stream's kernels ([`SideStreamKernels`]); profiles
    /// without the key run side kernels concurrently, as the simulator always did.
    #[serde(default)]
    pub side_stream_kernels: SideStreamKernels,
}

/// How a device kernel issued on a side stream (an all-gather, reduce-scatter, copy or
/// optimizer stream) shares the compute units with the compute stream's kernels. The engine
/// applies it in [`crate::engine`] (`engine/cores.rs`): a side kernel that becomes ready while
/// the compute stream runs a device op first waits for the cores that op's current kernel
/// holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SideStreamKernels {
    /// Side kernels run alongside the compute stream for free (no core contention).
    #[default]
    Concurrent,
    /// Every compute kernel holds all the cores a side kernel needs (one pool of cores: the
    /// SMs of a GPU, the AI Cores of a coupled-architecture NPU): a side kernel waits for the
    /// expected residual of the compute op's current kernel.
    WaitForCores,
    /// Ascend separation architecture (Atlas A2/A3: AI Cube and AI Vector cores are separate):
    /// side kernels are vector kernels, so they wait only while the compute stream's current
    /// kernel uses vector cores (memory-bound and fused-attention kernels), not behind a plain
    /// GEMM, which runs on the cube cores.
    WaitForVectorCores,
}

impl SideStreamKernels {
    /// The key's values as written in a profile.
    pub const NAMES: [&'static str; 3] = ["concurrent", "wait_for_cores", "wait_for_vector_cores"];
}

/// How ranks are packed into machines and supernodes (contiguous blocks).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TopologySpec {
    /// Ranks per machine.
    pub dies_per_machine: usize,
    /// Machines per supernode (1 when there is no scale-up domain beyond a machine).
    pub machines_per_supernode: usize,
}

/// Collective algorithm used for a flat collective inside one tier.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Algorithm {
    /// Ring: `p - 1` latency steps per pass.
    Ring,
    /// Full mesh / switched fabric: one latency step per pass, all peers at once.
    Mesh,
}

/// One network tier as seen by one rank.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TierSpec {
    /// Link technology name (`UB-L1`, `RoCE`, `NVLink4`).
    pub link: String,
    /// Nominal unidirectional injection bandwidth per rank, bytes per second.
    pub bandwidth_bytes_per_s: f64,
    /// Bandwidth of one peer-to-peer link on full-mesh fabrics; caps a `p`-rank group at
    /// `(p - 1) * per_peer`. Absent on switched fabrics.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_peer_bandwidth_bytes_per_s: Option<f64>,
    /// Per-step latency (alpha), microseconds.
    pub latency_us: f64,
    /// Calibrated fraction of the nominal bandwidth collectives achieve, in (0, 1].
    pub efficiency: f64,
    /// Algorithm for flat collectives on this tier.
    pub algorithm: Algorithm,
}

impl TierSpec {
    /// Achievable bandwidth for a phase over `group_ranks` ranks of this tier, bytes per second.
    pub fn effective_bandwidth_bytes_per_s(&self, group_ranks: usize) -> f64 {
        let mut bw = self.bandwidth_bytes_per_s;
        if let Some(peer) = self.per_peer_bandwidth_bytes_per_s {
            let peers = group_ranks.saturating_sub(1).max(1) as f64;
            bw = bw.min(peer * peers);
        }
        bw * self.efficiency
    }

    /// Latency per step in seconds.
    pub fn latency_s(&self) -> f64 {
        self.latency_us * 1e-6
    }
}

/// The three tiers of [`Tier`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TierSet {
    /// Inside one machine.
    pub intra_machine: TierSpec,
    /// Between machines of one supernode.
    pub intra_supernode: TierSpec,
    /// Between supernodes.
    pub inter_supernode: TierSpec,
}

impl TierSet {
    /// The spec of `tier`.
    pub fn get(&self, tier: Tier) -> &TierSpec {
        match tier {
            Tier::IntraMachine => &self.intra_machine,
            Tier::IntraSupernode => &self.intra_supernode,
            Tier::InterSupernode => &self.inter_supernode,
        }
    }
}

/// How collectives that span several machines or supernodes are decomposed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CollectiveSettings {
    /// Two-level (intra then inter) decomposition for groups with several ranks per domain;
    /// false runs flat collectives at the slowest tier's bandwidth.
    pub hierarchical: bool,
}

impl Default for CollectiveSettings {
    fn default() -> Self {
        Self { hierarchical: true }
    }
}

/// Constants fitted to measurements; each file names the figure it was (or will be) fitted to.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Calibration {
    /// Fraction of the BF16 peak that large square GEMMs approach (the shape model's ceiling,
    /// see [`crate::compute_cost`]; attention is costed relative to it), in (0, 1].
    pub gemm_ceiling: f64,
    /// Fraction of the HBM bandwidth that memory-bound kernels reach, in (0, 1].
    pub hbm_efficiency: f64,
    /// Fraction of the HBM bandwidth that device copies reach, in (0, 1].
    pub copy_efficiency: f64,
    /// Host time to launch one kernel, microseconds (see [`crate::host_cost`]).
    pub host_launch_us_per_kernel: f64,
    /// Host work per device kernel that no modelled op accounts for (Python model code,
    /// autograd bookkeeping, CPU-only operators between launches), microseconds: a residual
    /// the joint fit may set where a measured step is host-bound beyond the launches the
    /// model charges (see [`crate::host_cost`]); 0 when absent.
    #[serde(default)]
    pub host_unmodelled_us_per_kernel: f64,
    /// Host time to launch one collective, microseconds.
    pub host_launch_us_per_collective: f64,
    /// Host time of one device -> host synchronisation call after the device has drained
    /// the work it waits on (the blocking read-back itself), microseconds.
    pub host_d2h_sync_us: f64,
    /// Fixed device time per kernel, microseconds.
    pub device_launch_us_per_kernel: f64,
    /// Fixed device time per collective on top of the alpha terms, microseconds.
    pub collective_base_latency_us: f64,
    /// Bandwidth multiplier for buffers not aligned to 512 bytes, in (0, 1].
    pub unaligned_bandwidth_factor: f64,
    /// Host time per extra CPU operator event of HyperParallel's validation mode
    /// (`hpfsdp_program::step::Op::validation_cpu_events`), microseconds. Replaces
    /// `validation_dispatch_us_per_op`, which charged every kernel and collective launch.
    pub validation_us_per_cpu_event: f64,
    /// Host time per production CPU operator event
    /// (`hpfsdp_program::step::Op::host_cpu_events`: the eager framework's aten, autograd and
    /// `AccumulateGrad` events, in both modes), microseconds. Absent: the validation
    /// per-event cost over the probe-measured ratio
    /// `hpfsdp_program::strategy::host_events::VALIDATION_OVER_PRODUCTION_EVENT_COST` (see
    /// [`crate::host_cost`]), so experiment A's measured validation overhead pins it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_us_per_cpu_event: Option<f64>,
    /// Host time of a CPU operator event the autograd engine dispatches (a backward node's
    /// aten calls, `hpfsdp_program::step::HostDispatch::AutogradEngine`) over that of one
    /// dispatched from Python (`host_us_per_cpu_event`), in (0, 1]: the engine's C++ thread
    /// runs no module code between calls. 1 when absent (no difference charged).
    #[serde(default = "unit", skip_serializing_if = "is_unit")]
    pub host_backward_event_cost_ratio: f64,
}

fn unit() -> f64 {
    1.0
}

fn is_unit(v: &f64) -> bool {
    *v == 1.0
}

/// Profile keys that were replaced, with the key that replaced them and why: a profile that
/// still sets one is refused with a message naming the new key (never silently ignored).
pub const REPLACED_KEYS: [(&str, &str, &str); 1] = [(
    "calibration.validation_dispatch_us_per_op",
    "calibration.validation_us_per_cpu_event",
    "validation mode no longer costs every kernel and collective launch: it costs each extra \
     CPU operator event of DTensor dispatch (forward operators outside local regions and \
     boundary contract checks); a per-launch value does not carry over, so refit it \
     (`hpfsdp calibrate --fit`) or start from 174 ms / 23,713 events = 7.34 us",
)];

/// A hardware profile: one TOML file in `scenarios/hardware/`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HardwareProfile {
    /// Profile name; equals the file stem.
    pub name: String,
    /// One-line description.
    #[serde(default)]
    pub description: String,
    /// The accelerator.
    pub device: DeviceSpec,
    /// Machine and supernode sizes.
    pub topology: TopologySpec,
    /// The network tiers.
    pub tiers: TierSet,
    /// Collective decomposition.
    #[serde(default)]
    pub collectives: CollectiveSettings,
    /// Per-kernel-class compute efficiency: GEMM table and shape model, attention.
    #[serde(default)]
    pub compute: ComputeSpec,
    /// Calibrated constants.
    pub calibration: Calibration,
}

/// The profiles shipped in `scenarios/hardware/`, compiled in so the simulator works with no
/// files around.
pub const BUILTIN_PROFILES: [(&str, &str); 6] = [
    (
        "ascend-910c-a3",
        include_str!("../../scenarios/hardware/ascend-910c-a3.toml"),
    ),
    (
        "ascend-910b",
        include_str!("../../scenarios/hardware/ascend-910b.toml"),
    ),
    (
        "nvidia-h100-hgx",
        include_str!("../../scenarios/hardware/nvidia-h100-hgx.toml"),
    ),
    (
        "nvidia-h200-hgx",
        include_str!("../../scenarios/hardware/nvidia-h200-hgx.toml"),
    ),
    (
        "nvidia-gb200-nvl72",
        include_str!("../../scenarios/hardware/nvidia-gb200-nvl72.toml"),
    ),
    (
        "cpu-mpi",
        include_str!("../../scenarios/hardware/cpu-mpi.toml"),
    ),
];

/// GEMM tables of the built-in profiles (file name, CSV text), compiled in like the profiles:
/// a profile's `[compute] gemm_table = "<file name>"` picks one. `nvidia-h200-hgx.gemm.csv` is
/// what `hpfsdp calibrate --hardware nvidia-h200-hgx --from
/// scenarios/hardware/measured/h200-gemm.csv` writes from the 1,000-shape bf16 sweep measured
/// on one H200 (a test regenerates it); a user's own table goes next to a profile file on disk.
pub const BUILTIN_GEMM_TABLES: [(&str, &str); 1] = [(
    "nvidia-h200-hgx.gemm.csv",
    include_str!("../../scenarios/hardware/nvidia-h200-hgx.gemm.csv"),
)];

impl HardwareProfile {
    /// Reads and validates a profile file; its `[compute] gemm_table` is read relative to it.
    pub fn load(path: impl AsRef<Path>) -> Result<Self, ProfileError> {
        let path = path.as_ref();
        let file = path.display().to_string();
        let text = read_text(path, &limits::PROFILE_FILE).map_err(|e| ProfileError {
            file: file.clone(),
            line: 0,
            key: "-".into(),
            message: format!("cannot read the hardware profile: {}", e.reason),
        })?;
        let mut profile = Self::parse(&text, &file)?;
        if let Some(name) = profile.compute.gemm_table.clone() {
            let csv = path.parent().unwrap_or(Path::new(".")).join(&name);
            let table_text = read_text(&csv, &limits::TABLE_FILE).map_err(|e| ProfileError {
                file: file.clone(),
                line: line_of_key(&text, "compute.gemm_table"),
                key: "compute.gemm_table".into(),
                message: format!(
                    "cannot read the GEMM table {}: {}; put it next to the profile or remove the key",
                    csv.display(),
                    e.reason
                ),
            })?;
            profile.compute.table =
                Some(GemmTable::parse(&table_text, &csv.display().to_string())?);
        }
        Ok(profile)
    }

    /// Loads `DIR/NAME.toml`; falls back to the built-in copy when the file does not exist.
    pub fn load_named(name: &str, dir: impl AsRef<Path>) -> Result<Self, ProfileError> {
        let dir = dir.as_ref();
        let path = dir.join(format!("{name}.toml"));
        if path.exists() {
            let profile = Self::load(&path)?;
            if profile.name != name {
                return Err(ProfileError {
                    file: path.display().to_string(),
                    line: line_of_key(
                        &read_text(&path, &limits::PROFILE_FILE).unwrap_or_default(),
                        "name",
                    ),
                    key: "name".into(),
                    message: format!(
                        "profile is called '{}' but the file is '{name}.toml'; make them equal",
                        profile.name
                    ),
                });
            }
            return Ok(profile);
        }
        Self::builtin(name).map_err(|_| {
            let mut known: Vec<String> = std::fs::read_dir(dir)
                .into_iter()
                .flatten()
                .flatten()
                .filter_map(|e| {
                    let p = e.path();
                    (p.extension()? == "toml").then(|| p.file_stem()?.to_str().map(String::from))?
                })
                .chain(BUILTIN_PROFILES.iter().map(|(n, _)| n.to_string()))
                .collect();
            known.sort();
            known.dedup();
            ProfileError {
                file: path.display().to_string(),
                line: 0,
                key: "hardware".into(),
                message: format!(
                    "no hardware profile '{name}'; known profiles: {}",
                    known.join(", ")
                ),
            }
        })
    }

    /// A profile compiled into the binary (see [`BUILTIN_PROFILES`]).
    pub fn builtin(name: &str) -> Result<Self, ProfileError> {
        let (n, text) = BUILTIN_PROFILES
            .iter()
            .find(|(n, _)| *n == name)
            .ok_or_else(|| ProfileError {
                file: format!("<builtin {name}>"),
                line: 0,
                key: "hardware".into(),
                message: format!(
                    "no built-in hardware profile '{name}'; built-in profiles: {}",
                    BUILTIN_PROFILES
                        .iter()
                        .map(|(n, _)| *n)
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            })?;
        let file = format!("<builtin {n}>");
        let mut profile = Self::parse(text, &file)?;
        if let Some(table) = profile.compute.gemm_table.clone() {
            let (_, csv) = BUILTIN_GEMM_TABLES
                .iter()
                .find(|(t, _)| *t == table)
                .ok_or_else(|| ProfileError {
                    file: file.clone(),
                    line: line_of_key(text, "compute.gemm_table"),
                    key: "compute.gemm_table".into(),
                    message: format!("no built-in GEMM table '{table}'"),
                })?;
            profile.compute.table = Some(GemmTable::parse(csv, &format!("<builtin {table}>"))?);
        }
        Ok(profile)
    }

    /// Parses and validates profile text; `file` names it in errors.
    pub fn parse(text: &str, file: &str) -> Result<Self, ProfileError> {
        for (old, new, why) in REPLACED_KEYS {
            let line = line_of_key(text, old);
            if line > 0 {
                return Err(ProfileError {
                    file: file.to_string(),
                    line,
                    key: old.to_string(),
                    message: format!("'{old}' was replaced by '{new}': {why}"),
                });
            }
        }
        let profile: HardwareProfile = toml::from_str(text).map_err(|e| {
            let (line, key) = match e.span() {
                Some(span) => {
                    let before = text.get(..span.start).unwrap_or(text);
                    let line = before.matches('\n').count() + 1;
                    (line, key_at_line(text, line))
                }
                None => (0, "-".to_string()),
            };
            ProfileError {
                file: file.to_string(),
                line,
                key,
                message: e.message().trim().to_string(),
            }
        })?;
        profile.validate().map_err(|(key, message)| ProfileError {
            file: file.to_string(),
            line: line_of_key(text, &key),
            key,
            message,
        })?;
        Ok(profile)
    }

    /// Checks every number: positive finite rates, efficiencies in (0, 1], non-negative
    /// latencies and costs, non-zero counts. Returns the dotted key and the problem.
    pub fn validate(&self) -> Result<(), (String, String)> {
        if self.name.trim().is_empty() {
            return Err(("name".into(), "must not be empty".into()));
        }
        positive("device.bf16_flops_per_s", self.device.bf16_flops_per_s)?;
        positive(
            "device.hbm_bandwidth_bytes_per_s",
            self.device.hbm_bandwidth_bytes_per_s,
        )?;
        if self.device.hbm_capacity_bytes == 0 {
            return Err((
                "device.hbm_capacity_bytes".into(),
                "must be at least 1".into(),
            ));
        }
        if self.topology.dies_per_machine == 0 {
            return Err((
                "topology.dies_per_machine".into(),
                "must be at least 1".into(),
            ));
        }
        if self.topology.machines_per_supernode == 0 {
            return Err((
                "topology.machines_per_supernode".into(),
                "must be at least 1".into(),
            ));
        }
        for (name, t) in [
            ("intra_machine", &self.tiers.intra_machine),
            ("intra_supernode", &self.tiers.intra_supernode),
            ("inter_supernode", &self.tiers.inter_supernode),
        ] {
            positive(
                &format!("tiers.{name}.bandwidth_bytes_per_s"),
                t.bandwidth_bytes_per_s,
            )?;
            if let Some(p) = t.per_peer_bandwidth_bytes_per_s {
                positive(&format!("tiers.{name}.per_peer_bandwidth_bytes_per_s"), p)?;
            }
            non_negative(&format!("tiers.{name}.latency_us"), t.latency_us)?;
            fraction(&format!("tiers.{name}.efficiency"), t.efficiency)?;
        }
        let c = &self.calibration;
        fraction("calibration.gemm_ceiling", c.gemm_ceiling)?;
        self.compute.validate()?;
        fraction("calibration.hbm_efficiency", c.hbm_efficiency)?;
        fraction("calibration.copy_efficiency", c.copy_efficiency)?;
        fraction(
            "calibration.unaligned_bandwidth_factor",
            c.unaligned_bandwidth_factor,
        )?;
        for (key, v) in [
            (
                "calibration.host_launch_us_per_kernel",
                c.host_launch_us_per_kernel,
            ),
            (
                "calibration.host_unmodelled_us_per_kernel",
                c.host_unmodelled_us_per_kernel,
            ),
            (
                "calibration.host_launch_us_per_collective",
                c.host_launch_us_per_collective,
            ),
            (
                "calibration.device_launch_us_per_kernel",
                c.device_launch_us_per_kernel,
            ),
            (
                "calibration.collective_base_latency_us",
                c.collective_base_latency_us,
            ),
            ("calibration.host_d2h_sync_us", c.host_d2h_sync_us),
            (
                "calibration.validation_us_per_cpu_event",
                c.validation_us_per_cpu_event,
            ),
        ] {
            non_negative(key, v)?;
        }
        if let Some(v) = c.host_us_per_cpu_event {
            non_negative("calibration.host_us_per_cpu_event", v)?;
        }
        fraction(
            "calibration.host_backward_event_cost_ratio",
            c.host_backward_event_cost_ratio,
        )?;
        Ok(())
    }

    /// The smallest topology of this hardware that holds `world_size` ranks (whole supernodes;
    /// ranks beyond the job are never referenced).
    pub fn topology_for(&self, world_size: usize) -> Topology {
        let per_sn = self.topology.dies_per_machine * self.topology.machines_per_supernode;
        Topology {
            dies_per_machine: self.topology.dies_per_machine,
            machines_per_supernode: self.topology.machines_per_supernode,
            supernodes: world_size.div_ceil(per_sn).max(1),
        }
    }
}

/// Dotted key at a 1-based line: the enclosing `[table]` plus the key on that line.
fn key_at_line(text: &str, line: usize) -> String {
    let mut table = String::new();
    for (i, l) in text.lines().enumerate() {
        let t = l.trim();
        if let Some(h) = t.strip_prefix('[').and_then(|h| h.split(']').next()) {
            table = h.trim().to_string();
        }
        if i + 1 == line {
            let key = t.split('=').next().unwrap_or("").trim();
            return match (table.is_empty(), key.is_empty() || t.starts_with('[')) {
                (_, true) if !table.is_empty() => table,
                (true, _) => key.to_string(),
                (false, false) => format!("{table}.{key}"),
                _ => "-".into(),
            };
        }
    }
    "-".into()
}

/// 1-based line where the dotted `key` is assigned (0 when not found).
fn line_of_key(text: &str, key: &str) -> usize {
    let (table, leaf) = match key.rsplit_once('.') {
        Some((t, l)) => (t, l),
        None => ("", key),
    };
    let mut current = String::new();
    for (i, l) in text.lines().enumerate() {
        let t = l.trim();
        if let Some(h) = t.strip_prefix('[').and_then(|h| h.split(']').next()) {
            current = h.trim().to_string();
            continue;
        }
        if current == table && t.split('=').next().map(str::trim) == Some(leaf) && t.contains('=') {
            return i + 1;
        }
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_profiles_load_and_match_their_names() {
        for (name, _) in BUILTIN_PROFILES {
            let p = HardwareProfile::builtin(name).unwrap();
            assert_eq!(p.name, name);
        }
        let a3 = HardwareProfile::builtin("ascend-910c-a3").unwrap();
        assert_eq!(a3.topology.dies_per_machine, 16);
        assert_eq!(a3.topology.machines_per_supernode, 48);
        assert!((a3.calibration.unaligned_bandwidth_factor - 51.13 / 101.96).abs() < 1e-3);
        let ratio = a3.tiers.intra_supernode.bandwidth_bytes_per_s
            / a3.tiers.inter_supernode.bandwidth_bytes_per_s;
        assert!(ratio > 5.0, "RoCE must be much slower than UB");
        let t = a3.topology_for(16);
        assert_eq!(t.supernodes, 1);
        assert_eq!(a3.topology_for(769).supernodes, 2);
    }

    #[test]
    fn files_on_disk_load_by_name() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../scenarios/hardware");
        let p = HardwareProfile::load_named("nvidia-h200-hgx", dir).unwrap();
        assert_eq!(p.device.hbm_capacity_bytes, 141_000_000_000);
        let err = HardwareProfile::load_named("tpu-v9", dir).unwrap_err();
        assert!(err.message.contains("ascend-910c-a3"), "{err}");
    }

    #[test]
    fn unknown_key_error_names_line_and_key() {
        let text = BUILTIN_PROFILES[0]
            .1
            .replace("latency_us = 2.1 ", "latency_us = 2.1\nlatency_ms = 3 ");
        let err = HardwareProfile::parse(&text, "a3.toml").unwrap_err();
        let line = text
            .lines()
            .position(|l| l.starts_with("latency_ms"))
            .unwrap()
            + 1;
        assert_eq!(err.line, line, "{err}");
        assert_eq!(err.key, "tiers.intra_supernode.latency_ms", "{err}");
        assert!(err.to_string().starts_with(&format!("a3.toml:{line}:")));
        assert!(err.message.contains("unknown field"), "{err}");
    }

    #[test]
    fn invalid_values_are_rejected_with_their_key() {
        let text = BUILTIN_PROFILES[0].1.replace(
            "bandwidth_bytes_per_s = 25e9 ",
            "bandwidth_bytes_per_s = -25e9 ",
        );
        let err = HardwareProfile::parse(&text, "a3.toml").unwrap_err();
        assert_eq!(err.key, "tiers.inter_supernode.bandwidth_bytes_per_s");
        let line = text.lines().position(|l| l.contains("-25e9")).unwrap() + 1;
        assert_eq!(err.line, line);
        assert!(err.message.contains("positive"));

        let text = BUILTIN_PROFILES[0]
            .1
            .replace("gemm_ceiling = 0.", "gemm_ceiling = 1.7 # 0.");
        assert_ne!(
            text, BUILTIN_PROFILES[0].1,
            "the profile has a gemm_ceiling line"
        );
        let err = HardwareProfile::parse(&text, "a3.toml").unwrap_err();
        assert_eq!(err.key, "calibration.gemm_ceiling");
        assert!(err.line > 0);

        // The H200 profile's measured in-step GEMM speed-up and strided bandwidth.
        let h200 = BUILTIN_PROFILES
            .iter()
            .find(|(n, _)| *n == "nvidia-h200-hgx")
            .unwrap()
            .1;
        for (from, to, key) in [
            (
                "gemm_in_step_speedup = 1.109",
                "gemm_in_step_speedup = 0.5",
                "compute.gemm_in_step_speedup",
            ),
            (
                "strided_relative_bandwidth = 0.492",
                "strided_relative_bandwidth = 0.0",
                "compute.strided_relative_bandwidth",
            ),
        ] {
            assert!(h200.contains(from), "{from}");
            let err = HardwareProfile::parse(&h200.replace(from, to), "h200.toml").unwrap_err();
            assert_eq!(err.key, key, "{err}");
            assert!(err.message.contains("must be in"), "{err}");
        }
        // The host and chunk_cat constants the measured runs added.
        for (from, to, key, says) in [
            (
                "host_backward_event_cost_ratio = 0.68",
                "host_backward_event_cost_ratio = 1.5",
                "calibration.host_backward_event_cost_ratio",
                "must be in (0, 1]",
            ),
            (
                "chunk_cat_host_ps_per_element = 6.3",
                "chunk_cat_host_ps_per_element = -6.3",
                "compute.chunk_cat_host_ps_per_element",
                "zero or positive",
            ),
            (
                "chunk_cat_metadata_h2d_bytes_per_s = 53e9",
                "chunk_cat_metadata_h2d_bytes_per_s = 0.0",
                "compute.chunk_cat_metadata_h2d_bytes_per_s",
                "positive",
            ),
        ] {
            assert!(h200.contains(from), "{from}");
            let text = h200.replace(from, to);
            let err = HardwareProfile::parse(&text, "h200.toml").unwrap_err();
            assert_eq!(err.key, key, "{err}");
            assert!(err.message.contains(says), "{err}");
            let line = text.lines().position(|l| l.starts_with(to)).unwrap() + 1;
            assert_eq!(err.line, line, "{err}");
        }
    }

    #[test]
    fn a_replaced_key_is_refused_with_the_new_key_named() {
        let text = BUILTIN_PROFILES[0].1.replace(
            "validation_us_per_cpu_event =",
            "validation_dispatch_us_per_op = 63.31\nvalidation_us_per_cpu_event =",
        );
        let err = HardwareProfile::parse(&text, "a3.toml").unwrap_err();
        assert_eq!(
            err.key, "calibration.validation_dispatch_us_per_op",
            "{err}"
        );
        assert!(
            err.message
                .contains("calibration.validation_us_per_cpu_event"),
            "{err}"
        );
        let line = text
            .lines()
            .position(|l| l.starts_with("validation_dispatch_us_per_op"))
            .unwrap()
            + 1;
        assert_eq!(err.line, line);
    }

    #[test]
    fn per_peer_bandwidth_caps_small_mesh_groups() {
        let b = HardwareProfile::builtin("ascend-910b").unwrap();
        let t = &b.tiers.intra_machine;
        assert_eq!(t.effective_bandwidth_bytes_per_s(2), 56e9);
        assert_eq!(t.effective_bandwidth_bytes_per_s(8), 392e9);
    }
}
