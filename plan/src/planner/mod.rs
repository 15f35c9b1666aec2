//! The sharding planner: six passes from a model and the plan axes to a linted,
//! serializable sharding plan.
//!
//! 1. role classification ([`roles`]);
//! 2. boundary grouping and 3. type inference ([`boundary`]);
//! 4. template instantiation ([`templates`]);
//! 5. override merging ([`overrides`]);
//! 6. static lint ([`lint`]).

pub mod boundary;
pub mod classifier;
pub mod lint;
pub mod module_tree;
pub mod note;
pub mod overrides;
pub mod roles;
pub mod templates;

use crate::glob::{glob_match, is_glob};
use crate::model::ModelIr;
use boundary::BoundaryType;
use indexmap::IndexMap;
use lint::{LintIssue, Severity};
use note::Note;
use overrides::{FieldOverride, PlanOverride, WhenGate};
use roles::{Role, RoleReason};
use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use templates::{AxisPlacements, BoundaryFlags, Contract, PlanAxes};

/// Everything the planner reads besides the model.
#[derive(Debug, Clone)]
pub struct PlannerInput {
    /// Plan axes (tp/cp/ep/etp sizes, SP and loss-parallel switches).
    pub axes: PlanAxes,
    /// Overrides in file order.
    pub overrides: Vec<PlanOverride>,
    /// Whether low-precision training is on (gates `when = "low_precision"`).
    pub low_precision: bool,
    /// Sequence length, for the context-parallel divisibility check.
    pub seq_len: u64,
    /// Downgrade uncovered trainable parameters from error to warning.
    pub allow_uncovered: bool,
}

/// How a boundary came to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BoundarySource {
    /// Derived by passes 2-4.
    Derived,
    /// Derived, then changed by an override.
    Overridden,
    /// Created by an override on a module without a derived boundary.
    Inserted,
}

/// One module boundary of the plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BoundarySpec {
    /// Module FQN.
    pub module: String,
    /// Boundary type (template).
    pub ty: BoundaryType,
    /// Why this type.
    pub reason: String,
    /// Derived, overridden or inserted.
    pub source: BoundarySource,
    /// Parameters it shards: full FQN → placement per plan axis.
    pub params: IndexMap<String, AxisPlacements>,
    /// Layout contracts (`None` = cleared by an override).
    pub in_src: Option<Contract>,
    /// Input destination contract.
    pub in_dst: Option<Contract>,
    /// Output source contract.
    pub out_src: Option<Contract>,
    /// Output destination contract.
    pub out_dst: Option<Contract>,
    /// Template flags.
    pub flags: BoundaryFlags,
    /// Overrides applied, by origin.
    pub overrides: Vec<String>,
}

/// The plan of one parameter.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ParamPlan {
    /// Full FQN.
    pub name: String,
    /// Global shape.
    pub shape: Vec<u64>,
    /// Trainable (frozen buffers are carried but never sharded).
    pub trainable: bool,
    /// Role from pass 1.
    pub role: Role,
    /// Why that role.
    pub role_reason: RoleReason,
    /// The boundary that shards it, if any.
    pub boundary: Option<String>,
    /// Placement per plan axis (empty = replicated on every plan axis).
    pub placements: AxisPlacements,
    /// For per-expert weights under expert parallelism: the `ep` coordinate holding the
    /// whole matrix (other EP ranks hold nothing).
    pub ep_owner: Option<usize>,
    /// Grouping and override steps, for `--explain`.
    pub notes: Vec<Note>,
}

/// The sharding plan: pure data, serializable, with a stable digest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardingPlan {
    /// HF architecture name.
    pub architecture: String,
    /// Plan axes.
    pub axes: PlanAxes,
    /// Boundaries in model order.
    pub boundaries: Vec<BoundarySpec>,
    /// Every parameter in model order.
    pub params: Vec<ParamPlan>,
    /// Lint findings.
    pub lints: Vec<LintIssue>,
}

impl ShardingPlan {
    /// True if any lint issue is an error.
    pub fn has_errors(&self) -> bool {
        self.lints.iter().any(|l| l.severity == Severity::Error)
    }

    /// The plan of a parameter by FQN.
    pub fn param(&self, name: &str) -> Option<&ParamPlan> {
        self.params.iter().find(|p| p.name == name)
    }

    /// Stable hex digest (blake3 of the canonical JSON form).
    pub fn digest(&self) -> String {
        crate::digest::digest_json(self)
    }

    /// The plan-local shape of a parameter on the plan coordinates `coord` (axis → index):
    /// shape after TP/CP/EP sharding, before FSDP.
    pub fn local_shape(&self, p: &ParamPlan, coord: &BTreeMap<String, usize>) -> Vec<u64> {
        self.local_shape_at(p, |axis| coord.get(axis).copied().unwrap_or(0))
    }

    /// [`Self::local_shape`] with the coordinates as a function (axis → index).
    pub fn local_shape_at(&self, p: &ParamPlan, coord: impl Fn(&str) -> usize) -> Vec<u64> {
        let mut shape = p.shape.clone();
        if let Some(owner) = p.ep_owner
            && coord("ep") != owner
        {
            if let Some(first) = shape.first_mut() {
                *first = 0;
            }
            return shape;
        }
        for (axis, pl) in &p.placements {
            let size = self.axes.size(axis) as u64;
            let idx = coord(axis) as u64;
            if let Some(d) = pl.shard_dim()
                && d < shape.len()
            {
                let n = shape[d];
                let chunk = n.div_ceil(size);
                let start = (idx * chunk).min(n);
                shape[d] = (start + chunk).min(n) - start;
            }
        }
        shape
    }
}

/// The expert index of a per-expert parameter: the segment after the first `experts` segment.
fn expert_index(fqn: &str) -> Option<usize> {
    let mut segs = fqn.split('.');
    segs.find(|s| *s == "experts")?;
    segs.next()?.parse().ok()
}

/// Runs the six passes.
pub fn plan(model: &ModelIr, input: &PlannerInput) -> ShardingPlan {
    let axes = &input.axes;
    let mut lints = Vec::new();
    // Pass 1: roles.
    let mut params = classify_roles(model);
    // Passes 2-3: grouping.
    let mut to_group: Vec<(usize, &str, Role)> = Vec::with_capacity(params.len());
    to_group.extend(
        params
            .iter()
            .enumerate()
            .filter(|(_, p)| p.role != Role::Skip)
            .map(|(i, p)| (i, p.name.as_str(), p.role)),
    );
    let mut grouping = boundary::group(&to_group);
    for (p, notes) in params.iter_mut().zip(std::mem::take(&mut grouping.notes)) {
        if p.notes.is_empty() {
            p.notes = notes; // moved, not copied
        } else {
            p.notes.extend(notes);
        }
    }
    // Pass 4: templates.
    let mut boundaries = apply_templates(&grouping, &mut params, axes);
    // Pass 5: overrides, then claims resolved and placements assigned.
    override_pass(model, input, &mut boundaries, &mut params, &mut lints);
    // `params` is `model.params` in order. Names are unique in a model built from a config;
    // in any other the last of a repeated name wins, as it always has.
    let index_of: FxHashMap<&str, usize> = model
        .params
        .iter()
        .enumerate()
        .map(|(i, p)| (p.name.as_str(), i))
        .collect();
    assign_placements(model, &boundaries, &mut params, &index_of, axes);
    // Pass 6: lint.
    lint_params(model, &params, input, &mut lints);
    ShardingPlan {
        architecture: model.config.architecture.clone(),
        axes: axes.clone(),
        boundaries,
        params,
        lints,
    }
}

/// Pass 5 up to placements: applies the active overrides and resolves the parameters they
/// make several boundaries claim. Without overrides nothing is built: derived boundaries hold
/// disjoint parameters (grouping hands each parameter to exactly one group).
fn override_pass(
    model: &ModelIr,
    input: &PlannerInput,
    boundaries: &mut Vec<BoundarySpec>,
    params: &mut [ParamPlan],
    lints: &mut Vec<LintIssue>,
) {
    let overrides = active_overrides(input);
    if overrides.is_empty() {
        debug_assert!(claimed_twice(boundaries).is_empty());
        return;
    }
    let modules = model.modules();
    let param_names: BTreeSet<&str> = model.params.iter().map(|p| p.name.as_str()).collect();
    let explicit = merge_overrides(boundaries, &overrides, &modules, &param_names, lints);
    resolve_claims(boundaries, params, &explicit, lints);
}

/// Pass 1: every parameter's role (family rules first, then the defaults), with the reason.
fn classify_roles(model: &ModelIr) -> Vec<ParamPlan> {
    let mut classifier = classifier::RoleClassifier::new(model.config.family);
    model
        .params
        .iter()
        .map(|p| {
            let (role, role_reason) = classifier.classify(&p.name, p.trainable);
            ParamPlan {
                name: p.name.clone(),
                shape: p.shape.clone(),
                trainable: p.trainable,
                role,
                role_reason,
                boundary: None,
                placements: AxisPlacements::new(),
                ep_owner: None,
                notes: Vec::new(),
            }
        })
        .collect()
}

/// Pass 4: one derived boundary per group with a template (contracts, flags and per-role
/// placements); groups without one leave a note on their parameters.
fn apply_templates(
    grouping: &boundary::Grouping,
    params: &mut [ParamPlan],
    axes: &PlanAxes,
) -> Vec<BoundarySpec> {
    let mut boundaries: Vec<BoundarySpec> = Vec::new();
    let mut placements = templates::PlacementCache::new(axes);
    for g in &grouping.boundaries {
        if g.ty == BoundaryType::Unknown {
            for &i in &g.params {
                params[i].notes.push(Note::from(format!(
                    "no template for '{}': not sharded by any boundary",
                    g.module
                )));
            }
            continue;
        }
        let (contracts, flags) = templates::template(g.ty, axes);
        let mut bparams = IndexMap::with_capacity(g.params.len());
        for &i in &g.params {
            let p = &params[i];
            bparams.insert(
                p.name.clone(),
                placements.get(p.role, &p.name, p.shape.len()),
            );
        }
        let has_contract = g.ty != BoundaryType::Replicated;
        boundaries.push(BoundarySpec {
            module: g.module.clone(),
            ty: g.ty,
            reason: g.reason.clone(),
            source: BoundarySource::Derived,
            params: bparams,
            in_src: has_contract.then(|| contracts.in_src.clone()),
            in_dst: has_contract.then(|| contracts.in_dst.clone()),
            out_src: has_contract.then(|| contracts.out_src.clone()),
            out_dst: has_contract.then(|| contracts.out_dst.clone()),
            flags,
            overrides: Vec::new(),
        });
    }
    boundaries
}

/// Resolves parameters claimed by several boundaries: a deeper explicit declaration wins over
/// derived ancestors (the parameter is dropped from them, with a note); two explicit claims are
/// an error.
fn resolve_claims(
    boundaries: &mut [BoundarySpec],
    params: &mut [ParamPlan],
    explicit: &BTreeSet<(usize, String)>,
    lints: &mut Vec<LintIssue>,
) {
    let claimed_twice = claimed_twice(boundaries);
    let mut drop: Vec<(usize, String)> = Vec::new();
    for (name, owners) in &claimed_twice {
        let explicit_owners: Vec<usize> = owners
            .iter()
            .copied()
            .filter(|b| explicit.contains(&(*b, name.clone())))
            .collect();
        if explicit_owners.len() == 1 {
            for &b in owners.iter().filter(|b| **b != explicit_owners[0]) {
                drop.push((b, name.clone()));
            }
        } else {
            let mods: Vec<&str> = owners
                .iter()
                .map(|&b| boundaries[b].module.as_str())
                .collect();
            lints.push(
                LintIssue::error(
                    "param-claimed-twice",
                    format!("param '{name}' is declared by {} boundaries: {}", mods.len(), mods.join(" and ")),
                    "each parameter must be sharded by exactly one boundary; remove it from all but one override's params",
                )
                .param(name)
                .boundary(mods[0]),
            );
        }
    }
    for (b, name) in drop {
        boundaries[b].params.shift_remove(&name);
        if let Some(p) = params.iter_mut().find(|p| p.name == name) {
            p.notes.push(Note::from(format!(
                "claimed by a nested override; dropped from derived boundary '{}'",
                boundaries[b].module
            )));
        }
    }
}

/// The parameters that several boundaries claim, by name, with the claiming boundaries in
/// boundary order.
fn claimed_twice(boundaries: &[BoundarySpec]) -> BTreeMap<String, Vec<usize>> {
    let mut first: FxHashMap<&str, usize> = FxHashMap::default();
    first.reserve(boundaries.iter().map(|b| b.params.len()).sum());
    let mut twice: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    for (bi, b) in boundaries.iter().enumerate() {
        for name in b.params.keys() {
            match first.entry(name.as_str()) {
                std::collections::hash_map::Entry::Vacant(e) => {
                    e.insert(bi);
                }
                std::collections::hash_map::Entry::Occupied(e) => twice
                    .entry(name.clone())
                    .or_insert_with(|| vec![*e.get()])
                    .push(bi),
            }
        }
    }
    twice
}

/// Gives every parameter its boundary's placements, and per-expert weights under expert
/// parallelism their owning EP rank (experts split in contiguous chunks). `index_of` maps
/// parameter names to their index in `params`.
fn assign_placements(
    model: &ModelIr,
    boundaries: &[BoundarySpec],
    params: &mut [ParamPlan],
    index_of: &FxHashMap<&str, usize>,
    axes: &PlanAxes,
) {
    let num_experts = model
        .config
        .moe
        .as_ref()
        .map_or(0, |m| m.num_experts as usize);
    for b in boundaries {
        for (name, pl) in &b.params {
            if let Some(p) = index_of.get(name.as_str()).map(|&i| &mut params[i]) {
                p.boundary = Some(b.module.clone());
                p.placements = pl.clone();
                if p.role == Role::MoeExpert
                    && p.shape.len() == 2
                    && axes.ep > 1
                    && let Some(e) = expert_index(&p.name)
                {
                    let chunk = num_experts.div_ceil(axes.ep).max(1);
                    p.ep_owner = Some(e / chunk);
                }
            }
        }
    }
}

fn gate_active(gate: Option<WhenGate>, input: &PlannerInput) -> bool {
    match gate {
        None => true,
        Some(WhenGate::Cp) => input.axes.cp > 1,
        Some(WhenGate::Ep) => input.axes.ep > 1,
        Some(WhenGate::LowPrecision) => input.low_precision,
    }
}

/// Applies the active `overrides`; returns the explicit (boundary index, param) claims.
fn merge_overrides(
    boundaries: &mut Vec<BoundarySpec>,
    overrides: &[PlanOverride],
    modules: &[String],
    param_names: &BTreeSet<&str>,
    lints: &mut Vec<LintIssue>,
) -> BTreeSet<(usize, String)> {
    let mut explicit = BTreeSet::new();
    for ov in overrides {
        let (hits, unbound) = override_targets(ov, boundaries, modules);
        if hits.is_empty() && unbound.is_empty() {
            lints.push(matches_nothing(ov, param_names));
            continue;
        }
        for &bi in &hits {
            apply_fields(
                &mut boundaries[bi],
                ov,
                param_names,
                lints,
                &mut explicit,
                bi,
            );
        }
        if !unbound.is_empty() {
            insert_boundaries(boundaries, ov, &unbound, param_names, lints, &mut explicit);
        }
    }
    explicit
}

/// The overrides whose `when` gate is active, entries with the same match merged (later
/// wins field-wise), in first-seen order.
fn active_overrides(input: &PlannerInput) -> Vec<PlanOverride> {
    let mut merged: Vec<PlanOverride> = Vec::new();
    for ov in &input.overrides {
        if !gate_active(ov.when, input) {
            continue;
        }
        if let Some(prev) = merged.iter_mut().find(|m| m.pattern == ov.pattern) {
            prev.absorb(ov);
        } else {
            merged.push(ov.clone());
        }
    }
    merged
}

/// Whether an override pattern (a glob or an exact module name) matches `name`.
fn pattern_matches(pattern: &str, name: &str) -> bool {
    if is_glob(pattern) {
        glob_match(pattern, name)
    } else {
        name == pattern
    }
}

/// What an override matches: the indices of derived boundaries, and the modules without a
/// boundary (cloned names, in model order).
fn override_targets(
    ov: &PlanOverride,
    boundaries: &[BoundarySpec],
    modules: &[String],
) -> (Vec<usize>, Vec<String>) {
    let hits: Vec<usize> = boundaries
        .iter()
        .enumerate()
        .filter(|(_, b)| pattern_matches(&ov.pattern, &b.module))
        .map(|(i, _)| i)
        .collect();
    let unbound: Vec<String> = modules
        .iter()
        .filter(|m| pattern_matches(&ov.pattern, m))
        .filter(|m| !boundaries.iter().any(|b| &b.module == *m))
        .cloned()
        .collect();
    (hits, unbound)
}

/// The lint of an override that matches no module (naming a parameter when it does).
fn matches_nothing(ov: &PlanOverride, param_names: &BTreeSet<&str>) -> LintIssue {
    let what = if param_names.contains(ov.pattern.as_str()) {
        format!("'{}' is a parameter, not a module", ov.pattern)
    } else {
        format!("'{}' matches no module of the model", ov.pattern)
    };
    LintIssue::error(
        "override-matches-nothing",
        format!("override at {}: {what}", ov.origin),
        "check the spelling against `hpfsdp plan --json` module names; globs use `*` (spans dots), e.g. model.layers.*.mlp",
    )
    .boundary(&ov.pattern)
}

/// Inserts a replicated boundary, with the override's fields, at every module in `unbound`
/// (matched modules without a derived boundary); lints instead when the override declares
/// only merge-only fields or a `none` sentinel.
fn insert_boundaries(
    boundaries: &mut Vec<BoundarySpec>,
    ov: &PlanOverride,
    unbound: &[String],
    param_names: &BTreeSet<&str>,
    lints: &mut Vec<LintIssue>,
    explicit: &mut BTreeSet<(usize, String)>,
) {
    if !ov.has_concrete_field() {
        lints.push(
            LintIssue::error(
                "override-without-boundary",
                format!(
                    "override at {} matches {} module(s) without a derived boundary (e.g. '{}') but declares only \
                     merge-only fields (auto/none)",
                    ov.origin,
                    unbound.len(),
                    unbound[0]
                ),
                "declare concrete params or contracts to insert a boundary there, or match the enclosing boundary",
            )
            .boundary(&unbound[0]),
        );
        return;
    }
    if [&ov.params, &ov.in_src, &ov.in_dst, &ov.out_src, &ov.out_dst]
        .iter()
        .any(|f| matches!(f, FieldOverride::Clear))
    {
        lints.push(
            LintIssue::error(
                "sentinel-on-insert",
                format!(
                    "override at {}: 'none' is meaningless on '{}', which has no derived boundary",
                    ov.origin, unbound[0]
                ),
                "remove the 'none' field or give a concrete value",
            )
            .boundary(&unbound[0]),
        );
        return;
    }
    for m in unbound {
        boundaries.push(BoundarySpec {
            module: m.clone(),
            ty: BoundaryType::Replicated,
            reason: format!("inserted by override at {}", ov.origin),
            source: BoundarySource::Inserted,
            params: IndexMap::new(),
            in_src: None,
            in_dst: None,
            out_src: None,
            out_dst: None,
            flags: BoundaryFlags::default(),
            overrides: Vec::new(),
        });
        let bi = boundaries.len() - 1;
        apply_fields(&mut boundaries[bi], ov, param_names, lints, explicit, bi);
    }
}

fn apply_fields(
    b: &mut BoundarySpec,
    ov: &PlanOverride,
    param_names: &BTreeSet<&str>,
    lints: &mut Vec<LintIssue>,
    explicit: &mut BTreeSet<(usize, String)>,
    bi: usize,
) {
    if b.source == BoundarySource::Derived {
        b.source = BoundarySource::Overridden;
    }
    b.overrides.push(ov.origin.clone());
    match &ov.params {
        FieldOverride::Auto => {}
        FieldOverride::Clear => b.params.clear(),
        FieldOverride::Set(rel) => {
            let mut new = IndexMap::new();
            for (name, pl) in rel {
                let full = format!("{}.{name}", b.module);
                if !param_names.contains(full.as_str()) {
                    lints.push(
                        LintIssue::error(
                            "override-unknown-param",
                            format!("override at {} names '{name}', but '{full}' is not a parameter", ov.origin),
                            "param keys are relative to the matched module, e.g. \"gate_proj.weight\" under model.layers.*.mlp",
                        )
                        .boundary(&b.module),
                    );
                    continue;
                }
                explicit.insert((bi, full.clone()));
                new.insert(full, pl.clone());
            }
            let dropped: Vec<&String> = b.params.keys().filter(|k| !new.contains_key(*k)).collect();
            if !dropped.is_empty() && b.source != BoundarySource::Inserted {
                lints.push(
                    LintIssue::warning(
                        "override-drops-params",
                        format!(
                            "override at {} replaces the params of '{}'; {} derived param(s) dropped: {}",
                            ov.origin,
                            b.module,
                            dropped.len(),
                            dropped.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ")
                        ),
                        "params replace the whole field (no per-key merge); list every parameter the boundary should keep",
                    )
                    .boundary(&b.module),
                );
            }
            b.params = new;
        }
    }
    for (field, slot) in [
        (&ov.in_src, &mut b.in_src),
        (&ov.in_dst, &mut b.in_dst),
        (&ov.out_src, &mut b.out_src),
        (&ov.out_dst, &mut b.out_dst),
    ] {
        match field {
            FieldOverride::Auto => {}
            FieldOverride::Clear => *slot = None,
            FieldOverride::Set(c) => *slot = Some(c.clone()),
        }
    }
}

/// Every parameter-level lint: coverage, shard divisibility, model compatibility.
fn lint_params(
    model: &ModelIr,
    params: &[ParamPlan],
    input: &PlannerInput,
    lints: &mut Vec<LintIssue>,
) {
    lint_coverage(params, input, lints);
    lint_shard_divisibility(params, input, lints);
    lint_model_compatibility(model, input, lints);
}

/// Trainable parameters no boundary shards: errors (warnings with `plan.allow_uncovered`).
fn lint_coverage(params: &[ParamPlan], input: &PlannerInput, lints: &mut Vec<LintIssue>) {
    for p in params
        .iter()
        .filter(|p| p.trainable && p.boundary.is_none())
    {
        let why = p
            .notes
            .last()
            .map_or_else(|| p.role_reason.source.clone(), Note::to_string);
        let issue = if input.allow_uncovered {
            LintIssue::warning
        } else {
            LintIssue::error
        };
        lints.push(
            issue(
                "uncovered-param",
                format!("trainable param '{}' (role {}) is not sharded by any boundary: {why}", p.name, p.role.name()),
                "add a [[plan.override]] whose params name it, or set plan.allow_uncovered = true to keep it replicated",
            )
            .param(&p.name),
        );
    }
}

/// Per sharded parameter: no partial placements, shard dims in range and dividing the axis
/// size, and no TP split of fused gate/up expert weights.
fn lint_shard_divisibility(params: &[ParamPlan], input: &PlannerInput, lints: &mut Vec<LintIssue>) {
    let axes = &input.axes;
    for p in params.iter().filter(|p| p.boundary.is_some()) {
        let b = p.boundary.as_deref().unwrap_or("");
        for (axis, pl) in &p.placements {
            if pl.is_partial() {
                lints.push(
                    LintIssue::error(
                        "partial-param",
                        format!(
                            "param '{}' is declared {pl} on {axis}; parameters are never partial",
                            p.name
                        ),
                        "use replicate or shard(N)",
                    )
                    .param(&p.name)
                    .boundary(b)
                    .axis(axis),
                );
                continue;
            }
            let Some(d) = pl.shard_dim() else { continue };
            let size = axes.size(axis) as u64;
            if d >= p.shape.len() {
                lints.push(
                    LintIssue::error(
                        "shard-dim-out-of-range",
                        format!("param '{}' has shape {:?} but boundary declares {axis}: {pl}; dim {d} is out of range", p.name, p.shape),
                        format!("use shard(N) with N < {}", p.shape.len()),
                    )
                    .param(&p.name)
                    .boundary(b)
                    .axis(axis),
                );
            } else if p.shape[d] % size != 0 {
                lints.push(
                    LintIssue::error(
                        "indivisible-shard",
                        format!(
                            "param '{}' shape[{d}]={} is not divisible by {axis} size {size} (it would produce uneven or empty shards)",
                            p.name, p.shape[d]
                        ),
                        format!("choose a {axis} size that divides {}, or override this parameter to replicate on {axis}", p.shape[d]),
                    )
                    .param(&p.name)
                    .boundary(b)
                    .axis(axis),
                );
            }
        }
        // Fused gate/up experts cannot be TP-split naively: the split cuts across gate and up.
        if p.role == Role::MoeExpert
            && p.name.ends_with("gate_up_proj")
            && p.placements.get("etp").is_some_and(|pl| pl.is_shard())
        {
            lints.push(
                LintIssue::error(
                    "fused-expert-tp",
                    format!("fused MoE expert weight '{}' (gate and up merged, chunk-split inside forward) is TP-sharded", p.name),
                    "use ep > 1 with etp = 1, override it to replicate on etp, or load per-expert weights (model.expert_layout = \"per_expert\")",
                )
                .param(&p.name)
                .boundary(b)
                .axis("etp"),
            );
        }
    }
}

/// The mesh against the model: heads divisible by TP, sequence by 2 x CP, experts by EP, EP
/// only with routed experts; a note on tied embeddings.
fn lint_model_compatibility(model: &ModelIr, input: &PlannerInput, lints: &mut Vec<LintIssue>) {
    let axes = &input.axes;
    let cfg = &model.config;
    let mut compat = |cond: bool, code: &str, axis: &str, msg: String, fix: String| {
        if cond {
            lints.push(LintIssue::error(code, msg, fix).axis(axis));
        }
    };
    let tp = axes.tp as u64;
    if cfg.mla.is_none() {
        compat(
            !cfg.num_attention_heads.is_multiple_of(tp),
            "heads-not-divisible",
            "tp",
            format!(
                "num_attention_heads {} is not divisible by tp {tp}",
                cfg.num_attention_heads
            ),
            "choose tp dividing the head count".into(),
        );
        compat(
            !cfg.num_key_value_heads.is_multiple_of(tp),
            "kv-heads-not-divisible",
            "tp",
            format!(
                "num_key_value_heads {} is not divisible by tp {tp}",
                cfg.num_key_value_heads
            ),
            format!("choose tp dividing {}", cfg.num_key_value_heads),
        );
    } else {
        compat(
            !cfg.num_attention_heads.is_multiple_of(tp),
            "heads-not-divisible",
            "tp",
            format!(
                "num_attention_heads {} is not divisible by tp {tp}",
                cfg.num_attention_heads
            ),
            "choose tp dividing the head count".into(),
        );
    }
    let cp = axes.cp as u64;
    compat(
        cp > 1 && !input.seq_len.is_multiple_of(2 * cp),
        "seq-not-divisible",
        "cp",
        format!(
            "seq_len {} is not divisible by 2*cp = {} (load-balanced causal CP)",
            input.seq_len,
            2 * cp
        ),
        "choose seq_len and cp so that seq_len % (2*cp) == 0".into(),
    );
    match &cfg.moe {
        None => compat(
            axes.ep > 1,
            "ep-without-moe",
            "ep",
            format!("ep = {} but the model has no routed experts", axes.ep),
            "set mesh.ep = 1 for dense models".into(),
        ),
        Some(m) => compat(
            m.num_experts % axes.ep as u64 != 0,
            "experts-not-divisible",
            "ep",
            format!(
                "num_experts {} is not divisible by ep {}",
                m.num_experts, axes.ep
            ),
            format!("choose ep dividing {}", m.num_experts),
        ),
    }
    if cfg.tie_word_embeddings {
        lints.push(LintIssue::warning(
            "tied-embeddings",
            "embed_tokens.weight and lm_head.weight are tied: the head reuses the embedding's placement",
            "nothing to do; gradients of both uses accumulate into one parameter",
        ));
    }
}
