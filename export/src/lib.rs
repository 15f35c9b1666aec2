//! hpfsdp-export: a scenario's step programs as Chakra execution traces (MLCommons Chakra
//! `et_def.proto`), one `<name>.<rank>.et` file per rank plus the communicator-group table
//! and ASTRA-sim's system, network and memory configurations, so the plan can be replayed by
//! other simulators such as ASTRA-sim.
//!
//! Checked against the public source of ASTRA-sim (astra-sim/astra-sim commit 518bd513,
//! 2026-03-26: `astra-sim/workload/Workload.cc`, `system/Sys.cc`, the ring collective), of
//! its Chakra fork's FeederV3 (astra-sim/chakra branch `stage`, f37c2bb5, 2025-04-17) and of
//! MLCommons Chakra (mlcommons/chakra commit 21585d8f, 2026-05-20: `schema/protobuf/
//! et_def.proto`, `src/feeder/et_feeder_node.cpp`, `src/generator/generator.py`).
//!
//! A crate of its own so that the protobuf dependency (prost) stays out of the crates every
//! command links; it reads programs from `hpfsdp-plan` and costs compute with `hpfsdp-sim`'s
//! cost model.

#![warn(missing_docs)]

pub mod astra_config;
pub mod chakra;
mod error;
pub mod et_def;
pub mod groups;
pub mod trace_file;

pub use error::ExportError;
use et_def::attribute_proto::Value;
use et_def::{AttributeProto, GlobalMetadata};
use groups::GroupTable;
use hpfsdp_program::strategy::{OptimizerStrategy, ProgramGenerator, StrategyKind};
use hpfsdp_sim::HardwareProfile;
use hpfsdp_sim::scenario_run::ScenarioPlans;
use std::path::{Path, PathBuf};

/// The Chakra schema version written into [`GlobalMetadata::version`].
pub const CHAKRA_SCHEMA_VERSION: &str = "0.0.4";

/// What an export wrote.
#[derive(Debug, Clone, PartialEq)]
pub struct ExportSummary {
    /// The trace files, one per rank, in rank order.
    pub traces: Vec<PathBuf>,
    /// The communicator-group JSON file.
    pub comm_groups: PathBuf,
    /// ASTRA-sim's system configuration (JSON).
    pub system: PathBuf,
    /// ASTRA-sim's analytical network configuration (YAML).
    pub network: PathBuf,
    /// ASTRA-sim's remote-memory configuration (JSON).
    pub memory: PathBuf,
    /// Nodes written over all ranks.
    pub nodes: usize,
    /// Distinct process groups.
    pub groups: usize,
}

/// Writes the Chakra traces of `strategy` (with `optimizer`, `None` = the scenario's default)
/// on `plans` into `dir`: `<scenario>.<rank>.et` per rank, `<scenario>.comm_groups.json` and
/// ASTRA-sim's `<scenario>.system.json`, `<scenario>.network.yml` and `<scenario>.memory.json`.
pub fn export_chakra(
    plans: &ScenarioPlans,
    strategy: &str,
    optimizer: Option<&str>,
    profile: &HardwareProfile,
    dir: &Path,
) -> Result<ExportSummary, ExportError> {
    let strat =
        |e: &dyn std::fmt::Display| ExportError::Strategy(format!("strategy '{strategy}': {e}"));
    let kind = StrategyKind::parse(strategy).map_err(|e| strat(&e))?;
    let opt = match optimizer {
        None => OptimizerStrategy::default_for(&plans.scenario, kind),
        Some(name) => OptimizerStrategy::parse(name).map_err(|e| strat(&e))?,
    };
    let generator =
        ProgramGenerator::with_optimizer(&plans.scenario, &plans.sharding, &plans.fsdp, kind, opt)
            .map_err(|e| strat(&e))?;
    let world = generator.world_size();
    let mut all_groups = Vec::new();
    for r in 0..world {
        all_groups.extend(
            generator
                .groups(r)
                .map_err(|e| strat(&e))?
                .into_iter()
                .map(|g| g.ranks),
        );
    }
    let table = GroupTable::new(all_groups);
    let io = |path: &Path, e: std::io::Error| ExportError::Io {
        path: path.display().to_string(),
        message: e.to_string(),
    };
    std::fs::create_dir_all(dir).map_err(|e| io(dir, e))?;
    let name = &plans.scenario.file.name;
    let topology = &plans.scenario.topology;
    if topology.world_size() != world {
        return Err(ExportError::Program(format!(
            "the programs have {world} ranks but the topology {}",
            topology.world_size()
        )));
    }
    let mut summary = ExportSummary {
        traces: Vec::with_capacity(world),
        comm_groups: dir.join(format!("{name}.comm_groups.json")),
        system: dir.join(format!("{name}.system.json")),
        network: dir.join(format!("{name}.network.yml")),
        memory: dir.join(format!("{name}.memory.json")),
        nodes: 0,
        groups: table.len(),
    };
    let job = chakra::JobContext {
        groups: &table,
        topology,
        profile,
    };
    for rank in 0..world {
        let program = generator.program(rank).map_err(|e| strat(&e))?;
        let nodes = chakra::program_nodes(&program, &job)?;
        let metadata = metadata(plans, strategy, opt.name(), profile, rank, world);
        let path = dir.join(format!("{name}.{rank}.et"));
        std::fs::write(&path, trace_file::encode_trace(&metadata, &nodes))
            .map_err(|e| io(&path, e))?;
        summary.nodes += nodes.len();
        summary.traces.push(path);
    }
    let dims = astra_config::network_dims(topology, profile);
    for (path, text) in [
        (&summary.comm_groups, table.to_json()),
        (&summary.system, astra_config::system_json(&dims, profile)),
        (&summary.network, astra_config::network_yml(&dims, profile)),
        (&summary.memory, astra_config::memory_json()),
    ] {
        std::fs::write(path, text).map_err(|e| io(path, e))?;
    }
    Ok(summary)
}

fn metadata(
    plans: &ScenarioPlans,
    strategy: &str,
    optimizer: &str,
    profile: &HardwareProfile,
    rank: usize,
    world: usize,
) -> GlobalMetadata {
    let s = |v: &str| Value::StringVal(v.to_string());
    GlobalMetadata {
        version: CHAKRA_SCHEMA_VERSION.to_string(),
        attr: vec![
            AttributeProto::new(
                "producer",
                s(&format!("hpfsdp {}", env!("CARGO_PKG_VERSION"))),
            ),
            AttributeProto::new("scenario", s(&plans.scenario.file.name)),
            AttributeProto::new("strategy", s(strategy)),
            AttributeProto::new("optimizer", s(optimizer)),
            AttributeProto::new("hardware", s(&profile.name)),
            AttributeProto::new("rank", Value::Uint64Val(rank as u64)),
            AttributeProto::new("world_size", Value::Uint64Val(world as u64)),
        ],
    }
}
