//! Passes 2 and 3: group parameters into boundaries by owning module (deepest first) and
//! infer each boundary's type.
//!
//! A module whose group has type `unknown` hands its parameters to its parent; groups still
//! unknown at the root stay on the parameter's own module (and are reported by lint as
//! uncovered unless every parameter in them is `REPLICATED`).

use super::module_tree::{ModuleTree, parent};
use super::note::Note;
use super::roles::{Role, RoleSet, lowercase};
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;

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
    infer_type_of_set(module, roles.iter().copied().collect())
}

/// [`infer_type`] on a [`RoleSet`].
pub fn infer_type_of_set(module: &str, roles: RoleSet) -> (BoundaryType, String) {
    let lower = lowercase(module);
    let lower = lower.as_ref();
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
            ["leaf segment '", last, "' never forms a boundary"].concat(),
        );
    }
    if roles.contains(Role::MoeExpert) {
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
    if roles.contains(Role::SharedExpert) {
        return (BoundaryType::Mlp, "shared expert".into());
    }
    let colwise = roles.iter().any(|r| r.is_colwise_like());
    let rowwise = roles.contains(Role::Rowwise);
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
        let only = roles.iter().next().unwrap_or(Role::Skip);
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
    /// The grouping steps each parameter went through, indexed by the caller's parameter
    /// index (empty for parameters not passed in).
    pub notes: Vec<Vec<Note>>,
}

/// "No member" in the member lists of [`group`].
const NONE: u32 = u32::MAX;

/// The members of every module as linked lists over input positions, so that handing a
/// group to its parent is O(1) and nothing is allocated per module.
struct MemberLists {
    head: Vec<u32>,
    tail: Vec<u32>,
    next: Vec<u32>,
    roles: Vec<RoleSet>,
}

impl MemberLists {
    /// Each input parameter in its owner's list, in input order.
    fn new(tree: &ModuleTree, params: &[(usize, &str, Role)]) -> Self {
        let mut lists = MemberLists {
            head: vec![NONE; tree.len()],
            tail: vec![NONE; tree.len()],
            next: vec![NONE; params.len()],
            roles: vec![RoleSet::default(); tree.len()],
        };
        for (pos, &(_, _, role)) in params.iter().enumerate() {
            let m = tree.owner(pos) as usize;
            match lists.tail[m] {
                NONE => lists.head[m] = pos as u32,
                t => lists.next[t as usize] = pos as u32,
            }
            lists.tail[m] = pos as u32;
            lists.roles[m].insert(role);
        }
        lists
    }

    /// The input positions in module `m`'s list.
    fn positions(&self, m: u32) -> impl Iterator<Item = usize> + '_ {
        let mut cur = self.head[m as usize];
        std::iter::from_fn(move || {
            (cur != NONE).then(|| {
                let pos = cur as usize;
                cur = self.next[pos];
                pos
            })
        })
    }

    /// Moves module `m`'s members (and roles) to the end of `parent`'s list.
    fn hand_to(&mut self, m: u32, parent: u32) {
        let (m, p) = (m as usize, parent as usize);
        match self.tail[p] {
            NONE => self.head[p] = self.head[m],
            t => self.next[t as usize] = self.head[m],
        }
        self.tail[p] = self.tail[m];
        let roles = self.roles[m];
        self.roles[p].union_with(roles);
        self.head[m] = NONE;
        self.tail[m] = NONE;
    }
}

/// Pushes `note` onto the notes of every parameter in `members` (one shared text).
fn note_all(notes: &mut [Vec<Note>], members: &[usize], note: Note) {
    if let Some((&last, rest)) = members.split_last() {
        for &i in rest {
            notes[i].push(note.clone());
        }
        notes[last].push(note);
    }
}

/// Groups `(fqn, role)` parameters (Skip already removed by the caller: pass only the
/// parameters to group) by owning module, deepest first.
pub fn group(params: &[(usize, &str, Role)]) -> Grouping {
    let slots = params.iter().map(|&(i, _, _)| i + 1).max().unwrap_or(0);
    let tree = ModuleTree::build(params.iter().map(|&(_, n, _)| n));
    let mut lists = MemberLists::new(&tree, params);
    let mut out = Grouping {
        boundaries: Vec::new(),
        notes: vec![Vec::new(); slots],
    };
    let mut members: Vec<usize> = Vec::new();
    for m in tree.deepest_first() {
        if lists.head[m as usize] == NONE {
            continue;
        }
        let module = tree.name(m);
        members.clear();
        members.extend(lists.positions(m).map(|pos| params[pos].0));
        members.sort_unstable();
        let (ty, reason) = infer_type_of_set(module, lists.roles[m as usize]);
        if ty != BoundaryType::Unknown {
            let note =
                Note::from(["boundary '", module, "' is ", ty.name(), ": ", &reason].concat());
            note_all(&mut out.notes, &members, note);
            out.boundaries.push(Grouped {
                module: module.to_string(),
                ty,
                reason,
                params: members.clone(),
            });
            continue;
        }
        match tree.parent(m) {
            Some(p) if !module.is_empty() => {
                let note = [
                    "'",
                    module,
                    "': ",
                    &reason,
                    "; merged into '",
                    tree.name(p),
                    "'",
                ]
                .concat();
                note_all(&mut out.notes, &members, Note::from(note));
                lists.hand_to(m, p);
            }
            _ => root_unknowns(params, &mut lists, m, &reason, &mut out),
        }
    }
    out.boundaries.sort_by_key(|b| b.params[0]);
    out
}

/// A group still unknown at the root: every parameter of module `m` is attributed to its
/// own module, a replicated boundary when its role is `REPLICATED`, an unknown one otherwise.
fn root_unknowns(
    params: &[(usize, &str, Role)],
    lists: &mut MemberLists,
    m: u32,
    reason: &str,
    out: &mut Grouping,
) {
    let mut members: Vec<(usize, &str, Role)> = lists.positions(m).map(|pos| params[pos]).collect();
    members.sort_unstable_by_key(|&(i, _, _)| i);
    lists.head[m as usize] = NONE;
    for (i, name, r) in members {
        let own = parent(name).unwrap_or("").to_string();
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
        out.notes[i].push(Note::from(format!("'{own}': {why}")));
        out.boundaries.push(Grouped {
            module: own,
            ty,
            reason: why,
            params: vec![i],
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

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
        assert!(g.notes[5][0].contains("merged into 'model.layers.0.mlp'"));
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
