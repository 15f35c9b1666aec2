//! Scaling a scenario down for a replay on fewer ranks or fewer layers.
//!
//! `--ranks N` keeps every model-parallel degree and the per-rank work, and shrinks data
//! parallelism:
//! - `tp x cp` must divide N (tensor and context parallel degrees are kept);
//! - the `N / (tp x cp)` data-parallel ranks keep `dp_replicate` (which must divide them) and
//!   `dp_shard` shrinks to the rest: dp_shard is shrunk first;
//! - the expert mesh keeps `ep x etp` (which must divide N) and `edp_replicate` (which must
//!   divide what is left); `edp_shard` shrinks;
//! - `global_batch` shrinks with the data-parallel degree, so every rank runs the same
//!   micro-batches as in the full job;
//! - the topology keeps as much of its shape as N allows ([`pack`]).
//!
//! When the prediction runs on another hardware profile than the scenario's (`cpu-mpi` for
//! the CPU backends), the ranks are placed as that profile packs them ([`place_on_profile`]):
//! a replay's ranks sit where the backend runs them, not where the scenario's cluster would.
//!
//! `--layers L` truncates `num_hidden_layers` to L (recompute ranges are clipped to it).
//! Every change is listed in the report.

use anyhow::{Context, Result, bail};
use hpfsdp_plan::ModelIr;
use hpfsdp_plan::scenario::Scenario;

/// A scaled scenario and what was changed.
pub struct Scaled {
    /// The scenario to replay and predict.
    pub scenario: Scenario,
    /// One line per change, for the report.
    pub notes: Vec<String>,
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 { a } else { gcd(b, a % b) }
}

/// Packs `n` ranks into machines of at most `dies` ranks and supernodes of at most `machines`
/// machines: a level takes `min(level size, what is left)` when that divides what is left,
/// else their greatest common divisor; the rest are supernodes.
pub fn pack(n: usize, dies: usize, machines: usize) -> (usize, usize, usize) {
    let level = |left: usize, size: usize| {
        let m = size.min(left).max(1);
        if left.is_multiple_of(m) {
            m
        } else {
            gcd(left, size).max(1)
        }
    };
    let d = level(n, dies);
    let m = level(n / d, machines);
    (d, m, n / d / m)
}

/// Places the scenario's ranks as `profile` packs them (see [`pack`]), noting the change.
pub fn place_on_profile(
    scenario: &mut Scenario,
    profile: &hpfsdp_sim::HardwareProfile,
    notes: &mut Vec<String>,
) -> Result<()> {
    let n = scenario.world_size();
    let (d, m, s) = pack(
        n,
        profile.topology.dies_per_machine,
        profile.topology.machines_per_supernode,
    );
    let t = &scenario.file.topology;
    if (t.dies_per_machine, t.machines_per_supernode, t.supernodes) == (d, m, s) {
        return Ok(());
    }
    notes.push(format!(
        "topology {}x{}x{} -> {d}x{m}x{s}: ranks placed as the {} profile packs them (dies per machine x machines per supernode x supernodes)",
        t.dies_per_machine, t.machines_per_supernode, t.supernodes, profile.name
    ));
    scenario.topology = hpfsdp_plan::Topology::new(d, m, s)?;
    scenario.file.topology.dies_per_machine = d;
    scenario.file.topology.machines_per_supernode = m;
    scenario.file.topology.supernodes = s;
    Ok(())
}

/// Applies `--ranks` and `--layers` to `scenario`.
pub fn scale(scenario: Scenario, ranks: Option<usize>, layers: Option<usize>) -> Result<Scaled> {
    let mut notes = Vec::new();
    let mut scenario = match ranks {
        Some(n) if n != scenario.world_size() => scale_ranks(scenario, n, &mut notes)?,
        _ => scenario,
    };
    if let Some(l) = layers {
        truncate_layers(&mut scenario, l, &mut notes)?;
    }
    Ok(Scaled { scenario, notes })
}

fn scale_ranks(scenario: Scenario, n: usize, notes: &mut Vec<String>) -> Result<Scenario> {
    let world = scenario.world_size();
    if n == 0 || n > world {
        bail!(
            "--ranks {n}: replay scales a scenario down only; {} has {world} ranks, choose 1..={world}",
            scenario.path.display()
        );
    }
    let mut file = scenario.file.clone();
    let m = file.mesh.clone();
    let mp = m.tp * m.cp;
    if !n.is_multiple_of(mp) {
        bail!(
            "--ranks {n}: tp x cp = {mp} must divide it (tensor and context parallel degrees are kept); choose a multiple of {mp}"
        );
    }
    let dp_new = n / mp;
    if !dp_new.is_multiple_of(m.dp_replicate) {
        bail!(
            "--ranks {n} leaves {dp_new} data-parallel ranks, which dp_replicate = {} does not divide (dp_shard is shrunk, dp_replicate kept); choose a multiple of tp x cp x dp_replicate = {}",
            m.dp_replicate,
            mp * m.dp_replicate
        );
    }
    let expert_block = m.ep * m.etp;
    if !n.is_multiple_of(expert_block) {
        bail!(
            "--ranks {n}: ep x etp = {expert_block} must divide it (expert degrees are kept); choose a multiple of {expert_block}"
        );
    }
    let edp = n / expert_block;
    let edp_rep = scenario.expert_mesh.axis_size("edp_replicate");
    if !edp.is_multiple_of(edp_rep) {
        bail!(
            "--ranks {n} leaves {edp} expert data-parallel ranks, which edp_replicate = {edp_rep} does not divide; choose a multiple of ep x etp x edp_replicate = {}",
            expert_block * edp_rep
        );
    }
    file.mesh.dp_shard = dp_new / m.dp_replicate;
    file.mesh.edp_replicate = Some(edp_rep);
    file.mesh.edp_shard = Some(edp / edp_rep);
    notes.push(format!(
        "ranks {world} -> {n}: dp_shard {} -> {}, edp_shard {} -> {} (dp_replicate {}, tp {}, cp {}, ep {}, etp {} kept)",
        m.dp_shard,
        file.mesh.dp_shard,
        scenario.expert_mesh.axis_size("edp_shard"),
        edp / edp_rep,
        m.dp_replicate,
        m.tp,
        m.cp,
        m.ep,
        m.etp
    ));
    let dp_old = (m.dp_replicate * m.dp_shard) as u64;
    let gb = file.train.global_batch;
    file.train.global_batch = gb * dp_new as u64 / dp_old;
    notes.push(format!(
        "global_batch {gb} -> {} (each rank runs the same micro-batches as in the full job)",
        file.train.global_batch
    ));
    let t = file.topology.clone();
    let (dies, machines, supernodes) = pack(n, t.dies_per_machine, t.machines_per_supernode);
    file.topology.dies_per_machine = dies;
    file.topology.machines_per_supernode = machines;
    file.topology.supernodes = supernodes;
    notes.push(format!(
        "topology {}x{}x{} -> {dies}x{machines}x{} (dies per machine x machines per supernode x supernodes)",
        t.dies_per_machine, t.machines_per_supernode, t.supernodes, file.topology.supernodes
    ));
    let text = toml::to_string(&file).context("re-serialising the scaled scenario")?;
    Scenario::from_str_at(&text, &scenario.path)
        .with_context(|| format!("scaling {} to {n} ranks", scenario.path.display()))
}

fn truncate_layers(scenario: &mut Scenario, layers: usize, notes: &mut Vec<String>) -> Result<()> {
    let old = scenario.model.config.num_hidden_layers;
    if layers == 0 || layers > old {
        bail!("--layers {layers}: the model has {old} layers; choose 1..={old}");
    }
    if layers == old {
        return Ok(());
    }
    let mut config = scenario.model.config.clone();
    config.num_hidden_layers = layers;
    let model = ModelIr::from_config(
        scenario.model.name.clone(),
        config,
        scenario.model.options.clone(),
    )
    .with_context(|| format!("--layers {layers}: truncating the model"))?;
    scenario.model = model;
    let r = scenario.recompute.layers.clone();
    scenario.recompute.layers = r.start.min(layers)..r.end.min(layers);
    notes.push(format!("num_hidden_layers {old} -> {layers}"));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packing_keeps_the_shape_where_it_can() {
        assert_eq!(pack(3, 4, 1), (3, 1, 1));
        assert_eq!(pack(8, 4, 2), (4, 2, 1));
        assert_eq!(pack(16, 4, 2), (4, 2, 2));
        assert_eq!(pack(96, 64, 1), (32, 1, 3));
        assert_eq!(pack(4, 64, 1), (4, 1, 1));
    }
}
