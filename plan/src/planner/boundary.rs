//! Passes 2 and 3: group parameters into boundaries by owning module (deepest first) and
//! infer each boundary's type.
//!
//! A module whose group has type `unknown` hands its parameters to its parent; groups still
//! unknown at the root stay on the parameter's own module (and are reported by lint as
//! uncovered unless every parameter in them is `REPLICATED`).

use super::roles::Role;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// The kind of module boundary, which selects a template.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BoundaryType {
    /// Token embedding.
    Embed,
    /// Output head.
    LmHead,
    /// Norm module.
    Norm,
    /// Stand-alone router module.
    MoeGate,
    /// Attention block (q/k/v/o or MLA projections).
    Attention,
    /// Dense MLP or shared expert.
    Mlp,
    /// MoE block (router + routed experts).
    MoeMlp,
    /// Only `REPLICATED` parameters: layout metadata, no I/O contract.
    Replicated,
    /// No template applies.
    Unknown,
}

impl BoundaryType {
    /// Stable snake-case name.
    pub fn name(self) -> &'static str {
        match self {
            BoundaryType::Embed => "embed",
            BoundaryType::LmHead => "lm_head",
            BoundaryType::Norm => "norm",
            BoundaryType::MoeGate => "moe_gate",
            BoundaryType::Attention => "attention",
            BoundaryType::Mlp => "mlp",
            BoundaryType::MoeMlp => "moe_mlp",
            BoundaryType::Replicated => "replicated",
            BoundaryType::Unknown => "unknown",
        }
    }
}

/// Last segments that never form a boundary on their own (HyperParallel's leaf guard).
const LEAF_GUARD: &[&str] = &[
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
    "qkv_proj",
    "fused_qkv",
    "linear_qkv",
    "gate_up_proj",
    "query_key_value",
    "experts",
    "gate",
    "linear",
    "proj",
    "fc1",
    "fc2",
    "w1",
    "w2",
    "w3",
    "w13",
    "dense",
    "dense_h_to_4h",
    "dense_4h_to_h",
];

/// Infers the type of a module's group from its FQN and the roles inside it, with the rule
/// that decided it.
pub fn infer_type(module: &str, roles: &BTreeSet<Role>) -> (BoundaryType, String) {
    let lower = module.to_lowercase();
    let last = lower.rsplit('.').next().unwrap_or("");
    for (pats, ty) in [
        (
            &[
                "embed_tokens",
                "wte",
                ".embed.",
                "tok_embeddings",
                "embed_in",
                "word_embeddings",
            ][..],
            BoundaryType::Embed,
        ),
        (
            &["lm_head", "embed_out", "output_layer"][..],
            BoundaryType::LmHead,
        ),
        (
            &["norm", "layernorm", "rmsnorm", "ln_"][..],
            BoundaryType::Norm,
        ),
    ] {
        if let Some(p) = pats.iter().find(|p| lower.contains(*p)) {
            return (ty, format!("module name contains '{p}'"));
        }
    }
    if last.contains("router") {
        return (
            BoundaryType::MoeGate,
            "last segment contains 'router'".into(),
        );
    }
    if LEAF_GUARD.contains(&last) || (!last.is_empty() && last.chars().all(|c| c.is_ascii_digit()))
    {
        return (
            BoundaryType::Unknown,
            format!("leaf segment '{last}' never forms a boundary"),
        );
    }
    if roles.contains(&Role::MoeExpert) {
        if ["mlp", "moe", "moe_block", "moe_layer"]
            .iter()
            .any(|p| last.contains(p))
        {
            return (
                BoundaryType::MoeMlp,
                format!("routed experts under '{last}'"),
            );
        }
        return (
            BoundaryType::Unknown,
            "routed experts outside an mlp/moe module".into(),
        );
    }
    if roles.contains(&Role::SharedExpert) {
        return (BoundaryType::Mlp, "shared expert".into());
    }
    let colwise = roles.iter().any(|r| r.is_colwise_like());
    let rowwise = roles.contains(&Role::Rowwise);
    let is_attn = ["attn", "attention"].iter().any(|p| lower.contains(p));
    let is_mlp = ["mlp", "ffn", "feed_forward"]
        .iter()
        .any(|p| lower.contains(p));
    if colwise && rowwise {
        return if is_attn {
            (
                BoundaryType::Attention,
                "column- and row-parallel linears in an attention module".into(),
            )
        } else if is_mlp {
            (
                BoundaryType::Mlp,
                "column- and row-parallel linears in an mlp module".into(),
            )
        } else {
            (
                BoundaryType::Attention,
                "column- and row-parallel linears (default: attention)".into(),
            )
        };
    }
    if colwise && is_mlp {
        return (
            BoundaryType::Mlp,
            "column-parallel linears in an mlp module".into(),
        );
    }
    // Extension over HyperParallel: a group made only of one head/embedding/norm role takes
    // that role's type (DeepSeek MTP `shared_head.head`).
    if roles.len() == 1 {
        let only = *roles.iter().next().unwrap_or(&Role::Skip);
        let by_role = match only {
            Role::Embed => Some(BoundaryType::Embed),
            Role::LmHead => Some(BoundaryType::LmHead),
            Role::Norm => Some(BoundaryType::Norm),
            _ => None,
        };
        if let Some(ty) = by_role {
            return (ty, format!("only {} parameters", only.name()));
        }
    }
    (BoundaryType::Unknown, "no boundary pattern matches".into())
}

/// A grouped boundary: a module, its type and the parameters it owns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grouped {
    /// Module FQN.
    pub module: String,
    /// Inferred type.
    pub ty: BoundaryType,
    /// Why this type.
    pub reason: String,
    /// Indices into the caller's parameter list, in model order.
    pub params: Vec<usize>,
}

/// Result of grouping: boundaries, plus per-parameter notes on how it got there.
#[derive(Debug, Clone, Default)]
pub struct Grouping {
    /// Boundaries in model order of their first parameter.
    pub boundaries: Vec<Grouped>,
    /// For each parameter index, the grouping steps it went through.
    pub notes: BTreeMap<usize, Vec<String>>,
}

fn parent(module: &str) -> Option<&str> {
    module.rsplit_once('.').map(|(p, _)| p)
}

/// Groups `(fqn, role)` parameters (Skip already removed by the caller: pass only the
/// parameters to group) by owning module, deepest first.
pub fn group(params: &[(usize, &str, Role)]) -> Grouping {
    // module -> param indices; depth ordering with model-order tie-break. Modules are
    // prefixes of the parameter names, borrowed, not copied: on exp-d's 55k per-expert
    // parameters this walk was most of planning.
    let mut groups: HashMap<&str, Vec<usize>> = HashMap::with_capacity(params.len());
    let mut first_seen: HashMap<&str, usize> = HashMap::with_capacity(params.len());
    // Parameter indices are positions in the model's list: dense, looked up by position.
    let slots = params.iter().map(|&(i, _, _)| i + 1).max().unwrap_or(0);
    let mut by_index: Vec<Option<(Role, &str)>> = vec![None; slots];
    for &(i, n, r) in params {
        by_index[i] = Some((r, n));
    }
    let role_of = |i: usize| by_index[i].map_or(Role::Replicated, |(r, _)| r);
    let name_of = |i: usize| by_index[i].map_or("", |(_, n)| n);
    for (order, &(idx, fqn, _)) in params.iter().enumerate() {
        let owner = parent(fqn).unwrap_or("");
        groups.entry(owner).or_default().push(idx);
        let mut m = Some(owner);
        while let Some(cur) = m {
            if first_seen.contains_key(cur) {
                break; // its ancestors were seen no later
            }
            first_seen.insert(cur, order);
            m = parent(cur);
        }
    }
    // (depth, first parameter) is distinct per module: a parameter has one ancestor per
    // depth, so the order does not depend on the maps' order.
    let mut modules: Vec<(std::cmp::Reverse<usize>, usize, &str)> = first_seen
        .iter()
        .map(|(&m, &first)| {
            let depth = m.matches('.').count() + usize::from(!m.is_empty());
            (std::cmp::Reverse(depth), first, m)
        })
        .collect();
    modules.sort_unstable();

    let mut out = Grouping::default();
    for (_, _, name) in modules {
        let Some(mut members) = groups.remove(name) else {
            continue;
        };
        let module = name.to_string();
        members.sort_unstable();
        let roles: BTreeSet<Role> = members.iter().map(|&i| role_of(i)).collect();
        let (ty, reason) = infer_type(&module, &roles);
        if ty != BoundaryType::Unknown {
            for &i in &members {
                out.notes
                    .entry(i)
                    .or_default()
                    .push(format!("boundary '{module}' is {}: {reason}", ty.name()));
            }
            out.boundaries.push(Grouped {
                module,
                ty,
                reason,
                params: members,
            });
            continue;
        }
        match parent(name) {
            Some(p) if !module.is_empty() => {
                for &i in &members {
                    out.notes
                        .entry(i)
                        .or_default()
                        .push(format!("'{module}': {reason}; merged into '{p}'"));
                }
                groups.entry(p).or_default().extend(members);
            }
            _ => {
                // Unknown at the root: attribute every parameter to its own module.
                for &i in &members {
                    let own = parent(name_of(i)).unwrap_or("").to_string();
                    let r = role_of(i);
                    let (ty, why) = if r == Role::Replicated {
                        (
                            BoundaryType::Replicated,
                            "only REPLICATED parameters: layout only, no contract".to_string(),
                        )
                    } else {
                        (
                            BoundaryType::Unknown,
                            format!("still unknown at the root ({reason})"),
                        )
                    };
                    out.notes
                        .entry(i)
                        .or_default()
                        .push(format!("'{own}': {why}"));
                    out.boundaries.push(Grouped {
                        module: own,
                        ty,
                        reason: why,
                        params: vec![i],
                    });
                }
            }
        }
    }
    out.boundaries.sort_by_key(|b| b.params[0]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qwen3_moe_layer_groups() {
        let names = [
            ("model.layers.0.self_attn.q_proj.weight", Role::Colwise),
            ("model.layers.0.self_attn.k_proj.weight", Role::Colwise),
            ("model.layers.0.self_attn.o_proj.weight", Role::Rowwise),
            ("model.layers.0.self_attn.q_norm.weight", Role::Norm),
            ("model.layers.0.mlp.gate.weight", Role::MoeGate),
            ("model.layers.0.mlp.experts.gate_up_proj", Role::MoeExpert),
            ("model.layers.0.mlp.experts.down_proj", Role::MoeExpert),
            ("model.layers.0.input_layernorm.weight", Role::Norm),
        ];
        let params: Vec<(usize, &str, Role)> = names
            .iter()
            .enumerate()
            .map(|(i, (n, r))| (i, *n, *r))
            .collect();
        let g = group(&params);
        let by_module: BTreeMap<&str, (BoundaryType, Vec<usize>)> = g
            .boundaries
            .iter()
            .map(|b| (b.module.as_str(), (b.ty, b.params.clone())))
            .collect();
        assert_eq!(
            by_module["model.layers.0.self_attn"],
            (BoundaryType::Attention, vec![0, 1, 2])
        );
        assert_eq!(
            by_module["model.layers.0.self_attn.q_norm"].0,
            BoundaryType::Norm
        );
        assert_eq!(
            by_module["model.layers.0.mlp"],
            (BoundaryType::MoeMlp, vec![4, 5, 6])
        );
        assert_eq!(
            by_module["model.layers.0.input_layernorm"].0,
            BoundaryType::Norm
        );
        assert!(g.notes[&5][0].contains("merged into 'model.layers.0.mlp'"));
    }

    #[test]
    fn replicated_only_at_root_and_unknowns() {
        let params = [
            (0, "model.layers.61.eh_proj.weight", Role::Replicated),
            (1, "model.weird.thing.weight", Role::Bias),
        ];
        let g = group(&params);
        assert_eq!(g.boundaries[0].ty, BoundaryType::Replicated);
        assert_eq!(g.boundaries[0].module, "model.layers.61.eh_proj");
        assert_eq!(g.boundaries[1].ty, BoundaryType::Unknown);
    }
}
