//! `hpfsdp plan`: derive, lint and print the sharding, FSDP/HSDP and Muon plans.

use crate::table::Table;
use anyhow::Result;
use hpfsdp_plan::fsdp::{DataDomain, FsdpPlan, GroupSpec, ParamFsdp, build_fsdp_plan};
use hpfsdp_plan::muon::{MuonPlan, OptimizerRoute, build_muon_plan};
use hpfsdp_plan::planner::lint::Severity;
use hpfsdp_plan::planner::templates::{Contract, format_axis_placements};
use hpfsdp_plan::planner::{ShardingPlan, plan};
use hpfsdp_plan::scenario::Scenario;
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::Path;
use std::process::ExitCode;

/// Everything `plan` derives, as printed by `--json`.
#[derive(Serialize)]
pub struct PlanReport<'a> {
    /// Scenario name.
    pub scenario: &'a str,
    /// Digest of the sharding plan.
    pub sharding_digest: String,
    /// Digest of the sharding, FSDP and Muon plans together.
    pub digest: String,
    /// Model summary.
    pub model: ModelSummary,
    /// The sharding plan.
    pub sharding: &'a ShardingPlan,
    /// The FSDP/HSDP plan.
    pub fsdp: &'a FsdpPlan,
    /// The Muon plan.
    pub muon: &'a MuonPlan,
}

/// Model totals for reports.
#[derive(Serialize)]
pub struct ModelSummary {
    /// Model name.
    pub name: String,
    /// Architecture.
    pub architecture: String,
    /// Parameters (including non-trainable checkpoint buffers).
    pub total_params: u64,
    /// Parameters active per token.
    pub active_params: u64,
}

/// Runs the command; exit status 1 on lint errors.
pub fn run(path: &Path, json: bool, explain: Option<&str>, all: bool) -> Result<ExitCode> {
    let scenario = Scenario::load(path)?;
    let sharding = plan(&scenario.model, &scenario.planner_input());
    let fsdp = build_fsdp_plan(&scenario, &sharding);
    let muon = build_muon_plan(&scenario, &sharding, &fsdp);
    let report = PlanReport {
        scenario: &scenario.file.name,
        sharding_digest: sharding.digest(),
        digest: hpfsdp_plan::digest::digest_json(&(&sharding, &fsdp, &muon)),
        model: ModelSummary {
            name: scenario.model.name.clone(),
            architecture: scenario.model.config.architecture.clone(),
            total_params: scenario.model.total_params(),
            active_params: scenario.model.active_params(),
        },
        sharding: &sharding,
        fsdp: &fsdp,
        muon: &muon,
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else if let Some(name) = explain {
        match explain_param(&scenario, &sharding, &fsdp, &muon, name) {
            Some(text) => print!("{text}"),
            None => {
                let close: Vec<&str> = sharding
                    .params
                    .iter()
                    .map(|p| p.name.as_str())
                    .filter(|n| n.ends_with(name.rsplit('.').next().unwrap_or(name)))
                    .take(5)
                    .collect();
                anyhow::bail!(
                    "no parameter named '{name}' in {}; use a full FQN such as {}",
                    scenario.model.name,
                    close
                        .first()
                        .copied()
                        .unwrap_or("model.embed_tokens.weight")
                );
            }
        }
    } else {
        print!("{}", render(&scenario, &report, all));
    }
    Ok(if sharding.has_errors() {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

/// Replaces layer and expert indices with placeholders, returning the folded name and the
/// layer index.
fn fold_name(name: &str) -> (String, Option<usize>) {
    let mut layer = None;
    let mut out = Vec::new();
    let segs: Vec<&str> = name.split('.').collect();
    for (i, s) in segs.iter().enumerate() {
        if i > 0 && s.chars().all(|c| c.is_ascii_digit()) && !s.is_empty() {
            if segs[i - 1] == "layers" {
                layer = s.parse().ok();
                out.push("{L}".to_string());
                continue;
            }
            if segs[i - 1] == "experts" {
                out.push("{E}".to_string());
                continue;
            }
        }
        out.push(s.to_string());
    }
    (out.join("."), layer)
}

fn ranges(mut v: Vec<usize>) -> String {
    v.sort_unstable();
    v.dedup();
    let mut parts = Vec::new();
    let mut i = 0;
    while i < v.len() {
        let mut j = i;
        while j + 1 < v.len() && v[j + 1] == v[j] + 1 {
            j += 1;
        }
        parts.push(if i == j {
            v[i].to_string()
        } else {
            format!("{}-{}", v[i], v[j])
        });
        i = j + 1;
    }
    parts.join(",")
}

fn shape(s: &[u64]) -> String {
    format!(
        "[{}]",
        s.iter().map(u64::to_string).collect::<Vec<_>>().join(",")
    )
}

fn full_placements(scenario: &Scenario, fp: Option<&ParamFsdp>, plan_pl: &str) -> String {
    let Some(f) = fp else {
        return plan_pl.to_string();
    };
    let m = &scenario.file.mesh;
    let mut parts = Vec::new();
    let (rep, shard, rep_size, shard_size) = match f.domain {
        DataDomain::Dense => (
            "dp_replicate",
            "dp_shard",
            m.dp_replicate,
            m.dp_shard * m.cp,
        ),
        DataDomain::Expert => (
            "edp_replicate",
            "edp_shard",
            scenario.expert_mesh.axis_size("edp_replicate"),
            scenario.expert_mesh.axis_size("edp_shard"),
        ),
    };
    if rep_size > 1 {
        parts.push(format!("{rep}=R"));
    }
    if shard_size > 1 {
        let label = if f.domain == DataDomain::Dense && m.cp > 1 {
            "dp_shard*cp"
        } else {
            shard
        };
        parts.push(format!("{label}=S({})", f.shard_dim));
    }
    if plan_pl != "R" {
        parts.push(plan_pl.to_string());
    }
    if parts.is_empty() {
        "R".into()
    } else {
        parts.join(" ")
    }
}

fn contract(c: &Option<Contract>) -> String {
    match c {
        None => "-".into(),
        Some(c) if c.is_empty() => "{}".into(),
        Some(c) => c
            .values()
            .map(format_axis_placements)
            .collect::<Vec<_>>()
            .join(";"),
    }
}

/// The whole `plan` text: header, parameter table, boundary contracts, communication groups
/// and lint, each from its own function.
fn render(scenario: &Scenario, r: &PlanReport, all: bool) -> String {
    let mut out = render_header(scenario, r);
    out.push_str("PARAMETERS\n");
    out.push_str(&parameter_table(scenario, r, all).render());
    out.push_str("\nBOUNDARY CONTRACTS (plan axes; absent = replicate)\n");
    out.push_str(&boundary_table(r.sharding).render());
    out.push_str("\nCOMMUNICATION GROUPS\n");
    out.push_str(&group_table(scenario, r.fsdp).render());
    out.push_str(&lint_section(r));
    out
}

/// Rows folded over layers: rows equal in every column but the layer column (index 1) become
/// one row whose layer column lists the layer ranges.
#[derive(Default)]
struct FoldedRows {
    rows: Vec<(Vec<String>, Vec<usize>)>,
    index: BTreeMap<Vec<String>, usize>,
}

impl FoldedRows {
    /// Adds `row` (its column 1 is filled in by [`FoldedRows::into_table`]) seen at `layer`.
    fn add(&mut self, row: Vec<String>, layer: Option<usize>) {
        let key: Vec<String> = row
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != 1)
            .map(|(_, c)| c.clone())
            .collect();
        match self.index.get(&key) {
            Some(&i) => self.rows[i].1.extend(layer),
            None => {
                self.index.insert(key, self.rows.len());
                self.rows.push((row, layer.into_iter().collect()));
            }
        }
    }

    /// The rows in first-seen order with their layer ranges, into `table`.
    fn into_table(self, mut table: Table) -> Table {
        for (mut row, layers) in self.rows {
            row[1] = if layers.is_empty() {
                "-".into()
            } else {
                ranges(layers)
            };
            table.row(row);
        }
        table
    }
}

/// Scenario, model, ranks, meshes, FSDP and optimizer summary lines and the plan digest.
fn render_header(scenario: &Scenario, r: &PlanReport) -> String {
    let (f, m) = (r.fsdp, r.muon);
    let mesh = |mesh: &hpfsdp_plan::DeviceMesh| {
        mesh.axes()
            .iter()
            .map(|a| format!("{}={}", a.name, a.size))
            .collect::<Vec<_>>()
            .join(" x ")
    };
    let t = &scenario.topology;
    let mut out = format!(
        "scenario   {} — {}\n",
        scenario.file.name, scenario.file.description
    );
    out.push_str(&format!(
        "model      {} ({}): {} params, {} active per token\n",
        r.model.name, r.model.architecture, r.model.total_params, r.model.active_params
    ));
    out.push_str(&format!(
        "ranks      {} on {} supernode(s) x {} machine(s) x {} dies\n",
        scenario.world_size(),
        t.supernodes,
        t.machines_per_supernode,
        t.dies_per_machine
    ));
    out.push_str(&format!("dense mesh {}\n", mesh(&scenario.dense_mesh)));
    if scenario.file.mesh.ep > 1 {
        out.push_str(&format!("expert mesh {}\n", mesh(&scenario.expert_mesh)));
    }
    let (ag, rs, ar) = f.collective_counts();
    out.push_str(&format!(
        "fsdp       {} units; per micro-batch {ag} all-gathers, {rs} reduce-scatters, {ar} fused all-reduces; {} of {} params zero-copy\n",
        f.units.len(),
        f.params.iter().filter(|p| p.zero_copy).count(),
        f.params.len()
    ));
    let muon_n = m
        .params
        .iter()
        .filter(|p| p.route == OptimizerRoute::Muon)
        .count();
    out.push_str(&format!(
        "optimizer  {} Muon / {} AdamW params; {} Muon batches; replica subgroups {}\n",
        muon_n,
        m.params.len() - muon_n,
        m.batches.len(),
        m.replica_subgroup_summary()
    ));
    out.push_str(&format!("digest     {}\n\n", r.sharding_digest));
    out
}

/// One row per parameter (folded over layers and experts unless `all`): role, boundary,
/// placement, rank 0's local shape, FSDP unit, optimizer route and whether Muon gathers it.
fn parameter_table(scenario: &Scenario, r: &PlanReport, all: bool) -> Table {
    let (s, f, m) = (r.sharding, r.fsdp, r.muon);
    let fsdp_by_name: BTreeMap<&str, usize> = f
        .params
        .iter()
        .enumerate()
        .map(|(i, p)| (p.name.as_str(), i))
        .collect();
    let muon_by_name: BTreeMap<&str, usize> = m
        .params
        .iter()
        .enumerate()
        .map(|(i, p)| (p.name.as_str(), i))
        .collect();
    let mut folded = FoldedRows::default();
    for p in &s.params {
        let (fname, layer) = if all {
            (p.name.clone(), None)
        } else {
            fold_name(&p.name)
        };
        let fp = fsdp_by_name.get(p.name.as_str()).map(|&i| &f.params[i]);
        let mp = muon_by_name.get(p.name.as_str()).map(|&i| &m.params[i]);
        let pl = format_axis_placements(&p.placements);
        let owner = p
            .ep_owner
            .map(|o| format!(" ep=owner({o})"))
            .unwrap_or_default();
        let row = vec![
            fname,
            String::new(),
            p.role.name().to_string(),
            p.boundary.as_deref().map_or("-".into(), |b| fold_name(b).0),
            if p.trainable {
                format!("{}{owner}", full_placements(scenario, fp, &pl))
            } else {
                "frozen".into()
            },
            fp.map_or(shape(&p.shape), |x| shape(&x.local_shape)),
            fp.map_or("-".into(), |x| fold_name(&f.units[x.unit].name).0),
            mp.map_or("-".into(), |x| match x.route {
                OptimizerRoute::Muon => "muon".into(),
                OptimizerRoute::Adamw => "adamw".into(),
            }),
            mp.map_or("-".into(), |x| {
                if x.needs_gather { "yes" } else { "no" }.into()
            }),
        ];
        folded.add(row, layer);
    }
    folded.into_table(Table::new(&[
        "parameter",
        "layers",
        "role",
        "boundary",
        "placement",
        "local shape (rank 0)",
        "unit",
        "optimizer",
        "gather",
    ]))
}

/// Boundary contracts (input and output placements at each module boundary), folded over layers.
fn boundary_table(s: &ShardingPlan) -> Table {
    let mut folded = FoldedRows::default();
    for b in &s.boundaries {
        let (name, layer) = fold_name(&b.module);
        let row = vec![
            name,
            String::new(),
            b.ty.name().to_string(),
            format!("{:?}", b.source).to_lowercase(),
            b.params.len().to_string(),
            format!("{} -> {}", contract(&b.in_src), contract(&b.in_dst)),
            format!("{} -> {}", contract(&b.out_src), contract(&b.out_dst)),
        ];
        folded.add(row, layer);
    }
    folded.into_table(Table::new(&[
        "boundary",
        "layers",
        "type",
        "source",
        "params",
        "in_src -> in_dst",
        "out_src -> out_dst",
    ]))
}

/// Communication groups with more than one rank: FSDP groups, then TP/CP on the dense mesh and
/// EP/ETP on the expert mesh, each with its tier and rank 0's members.
fn group_table(scenario: &Scenario, f: &FsdpPlan) -> Table {
    let mut gt = Table::new(&["group", "axes", "ranks/group", "tier", "rank 0's group"]);
    let mut add = |label: &str, g: &GroupSpec| {
        if g.size > 1 {
            let shown: Vec<String> = g.rank0_group.iter().take(8).map(usize::to_string).collect();
            let more = if g.rank0_group.len() > 8 { ",..." } else { "" };
            gt.row(vec![
                label.into(),
                g.axes.join("x"),
                g.size.to_string(),
                g.tier.to_string(),
                format!("[{}{more}]", shown.join(",")),
            ]);
        }
    };
    for (k, g) in &f.groups {
        add(&format!("fsdp {k}"), g);
    }
    let topo = &scenario.topology;
    for axis in ["tp", "cp"] {
        add(axis, &GroupSpec::along(&scenario.dense_mesh, topo, &[axis]));
    }
    for axis in ["ep", "etp"] {
        add(
            axis,
            &GroupSpec::along(&scenario.expert_mesh, topo, &[axis]),
        );
    }
    gt
}

/// The lint section: the sharding plan's findings, then the Muon plan's (replica subgroups on
/// the slow tier), with the error and warning counts.
fn lint_section(r: &PlanReport) -> String {
    let lints: Vec<_> = r.sharding.lints.iter().chain(&r.muon.lints).collect();
    let errors = lints
        .iter()
        .filter(|l| l.severity == Severity::Error)
        .count();
    let mut out = format!(
        "\nLINT: {errors} error(s), {} warning(s)\n",
        lints.len() - errors
    );
    for l in lints {
        out.push_str(&format!("{l}\n"));
    }
    out
}

/// The `--explain` text of parameter `name` (None when the model has no such parameter):
/// role, grouping, boundary, placement, FSDP and optimizer sections.
fn explain_param(
    scenario: &Scenario,
    s: &ShardingPlan,
    f: &FsdpPlan,
    m: &MuonPlan,
    name: &str,
) -> Option<String> {
    let p = s.param(name)?;
    let mut out = explain_role(s, p);
    let pl = format_axis_placements(&p.placements);
    out.push_str(&format!(
        "placement  plan axes: {pl}; full mesh: {}\n",
        full_placements(scenario, f.param(name), &pl)
    ));
    if let Some(o) = p.ep_owner {
        out.push_str(&format!("ep owner   whole matrix on ep coordinate {o}\n"));
    }
    if let Some(fp) = f.param(name) {
        out.push_str(&explain_fsdp(f, fp));
    }
    if let Some((mi, mp)) = m.params.iter().enumerate().find(|(_, x)| x.name == name) {
        out.push_str(&explain_optimizer(m, mi, mp));
    }
    Some(out)
}

/// Header, role, grouping notes and boundary lines of a parameter's explanation.
fn explain_role(s: &ShardingPlan, p: &hpfsdp_plan::planner::ParamPlan) -> String {
    let mut out = format!(
        "{}  shape {}  {}\n",
        p.name,
        shape(&p.shape),
        if p.trainable { "trainable" } else { "frozen" }
    );
    out.push_str(&format!(
        "role       {} — {}{}\n",
        p.role.name(),
        p.role_reason.source,
        p.role_reason
            .pattern
            .as_deref()
            .map(|x| format!(" (pattern '{x}')"))
            .unwrap_or_default()
    ));
    for n in &p.notes {
        out.push_str(&format!("grouping   {n}\n"));
    }
    if let Some(b) = p
        .boundary
        .as_deref()
        .and_then(|b| s.boundaries.iter().find(|x| x.module == b))
    {
        out.push_str(&format!(
            "boundary   {} ({}, {:?}): {}\n",
            b.module,
            b.ty.name(),
            b.source,
            b.reason
        ));
        for o in &b.overrides {
            out.push_str(&format!("override   applied from {o}\n"));
        }
    }
    out
}

/// The FSDP lines of a parameter's explanation: unit, shard layout and collective sizes.
fn explain_fsdp(f: &FsdpPlan, fp: &ParamFsdp) -> String {
    let key = if fp.domain == DataDomain::Dense {
        "dense"
    } else {
        "expert"
    };
    let g = &f.groups[&format!("{key}.shard")];
    let mut out = format!(
        "fsdp       unit {}; shard dim {} over {} ({} ranks, {}); plan-local {} -> local {} (padded {} elems)\n",
        f.units[fp.unit].name,
        fp.shard_dim,
        g.axes.join("x"),
        g.size,
        g.tier,
        shape(&fp.plan_local_shape),
        shape(&fp.local_shape),
        fp.padded_shard_numel
    );
    out.push_str(&format!(
        "           all-gather {} B in / {} B out{}; reduce-scatter {} B in / {} B out; {}\n",
        fp.all_gather.bytes_in_per_rank,
        fp.all_gather.bytes_out_per_rank,
        if fp.all_gather.aligned_512 {
            ""
        } else {
            " (not 512-B aligned)"
        },
        fp.reduce_scatter.bytes_in_per_rank,
        fp.reduce_scatter.bytes_out_per_rank,
        fp.copy_reason
            .clone()
            .map_or("zero-copy".into(), |r| format!("copy: {r}"))
    ));
    out
}

/// The optimizer lines of a parameter's explanation (Muon plan entry `mi`): route, and for
/// Muon the core shape, shard axes and memory batch.
fn explain_optimizer(m: &MuonPlan, mi: usize, mp: &hpfsdp_plan::muon::MuonParam) -> String {
    let mut out = format!("optimizer  {:?} — {}\n", mp.route, mp.route_reason);
    if mp.route != OptimizerRoute::Muon {
        return out;
    }
    let axes: Vec<String> = mp
        .shard_axes
        .iter()
        .map(|a| format!("{}(dim {})", a.axis, a.tensor_dim))
        .collect();
    out.push_str(&format!(
        "muon       core shape {:?} x {} matrices; shard axes [{}]; {}\n",
        mp.core_shape.unwrap_or((0, 0)),
        mp.matrices,
        axes.join(", "),
        if mp.needs_gather {
            "a shard axis cuts the matrix plane: gathered, orthogonalized on one owner"
        } else {
            "matrix plane not sharded: Newton-Schulz runs locally"
        }
    ));
    if let Some((bi, b)) = m
        .batches
        .iter()
        .enumerate()
        .find(|(_, b)| b.params.contains(&mi))
    {
        out.push_str(&format!(
            "           batch {bi} ({} params); shard owner {:?}; replica owner {:?}\n",
            b.params.len(),
            b.shard_owner.get(&mi),
            b.replica_owner.get(&mi)
        ));
    }
    out
}
