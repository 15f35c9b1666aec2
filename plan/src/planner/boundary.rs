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
use std::borrow::Cow;
use std::collections::BTreeSet;
use std::fmt;

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
    let (ty, reason) = infer_type_of_set(module, roles.iter().copied().collect());
    (ty, reason.to_string())
}

/// Why a group got its type ([`infer_type`]'s text), kept unwritten: grouping writes it
/// straight into the parameters' notes, without a string of its own per module.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TypeReason<'a> {
    /// Fixed text.
    Text(&'static str),
    /// `module name contains '{pattern}'`.
    NameContains(&'static str),
    /// `leaf segment '{segment}' never forms a boundary`.
    LeafSegment(Cow<'a, str>),
    /// `routed experts under '{segment}'`.
    RoutedUnder(Cow<'a, str>),
    /// `only {ROLE} parameters`.
    OnlyRole(Role),
}

impl TypeReason<'_> {
    /// Appends the text to `out`.
    pub fn write_to(&self, out: &mut String) {
        match self {
            TypeReason::Text(t) => out.push_str(t),
            TypeReason::NameContains(p) => out.extend(["module name contains '", p, "'"]),
            TypeReason::LeafSegment(s) => {
                out.extend(["leaf segment '", s, "' never forms a boundary"]);
            }
            TypeReason::RoutedUnder(s) => out.extend(["routed experts under '", s, "'"]),
            TypeReason::OnlyRole(r) => out.extend(["only ", r.name(), " parameters"]),
        }
    }
}

impl fmt::Display for TypeReason<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut s = String::new();
        self.write_to(&mut s);
        f.write_str(&s)
    }
}

/// [`infer_type`] on a [`RoleSet`], the reason unwritten.
pub fn infer_type_of_set(module: &str, roles: RoleSet) -> (BoundaryType, TypeReason<'_>) {
    let lower = lowercase(module);
    // The last segment as the reasons name it: borrowed from `module` when lower-casing
    // changed nothing.
    let last: Cow<'_, str> = match &lower {
        Cow::Borrowed(l) => Cow::Borrowed(l.rsplit('.').next().unwrap_or("")),
        Cow::Owned(l) => Cow::Owned(l.rsplit('.').next().unwrap_or("").to_string()),
    };
    let lower = lower.as_ref();
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
            return (ty, TypeReason::NameContains(p));
        }
    }
    if last.contains("router") {
        return (
            BoundaryType::MoeGate,
            TypeReason::Text("last segment contains 'router'"),
        );
    }
    if LEAF_GUARD.contains(&last.as_ref())
        || (!last.is_empty() && last.chars().all(|c| c.is_ascii_digit()))
    {
        return (BoundaryType::Unknown, TypeReason::LeafSegment(last));
    }
    if roles.contains(Role::MoeExpert) {
        if ["mlp", "moe", "moe_block", "moe_layer"]
            .iter()
            .any(|p| last.contains(p))
        {
            return (BoundaryType::MoeMlp, TypeReason::RoutedUnder(last));
        }
        return (
            BoundaryType::Unknown,
            TypeReason::Text("routed experts outside an mlp/moe module"),
        );
    }
    if roles.contains(Role::SharedExpert) {
        return (BoundaryType::Mlp, TypeReason::Text("shared expert"));
    }
    let colwise = roles.iter().any(|r| r.is_colwise_like());
    let rowwise = roles.contains(Role::Rowwise);
    let is_attn = ["attn", "attention"].iter().any(|p| lower.contains(p));
    let is_mlp = ["mlp", "ffn", "feed_forward"]
        .iter()
        .any(|p| lower.contains(p));
    if colwise && rowwise {
        let text = if is_attn {
            "column- and row-parallel linears in an attention module"
        } else if is_mlp {
            "column- and row-parallel linears in an mlp module"
        } else {
            "column- and row-parallel linears (default: attention)"
        };
        let ty = if !is_attn && is_mlp {
            BoundaryType::Mlp
        } else {
            BoundaryType::Attention
        };
        return (ty, TypeReason::Text(text));
    }
    if colwise && is_mlp {
        return (
            BoundaryType::Mlp,
            TypeReason::Text("column-parallel linears in an mlp module"),
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
            return (ty, TypeReason::OnlyRole(only));
        }
    }
    (
        BoundaryType::Unknown,
        TypeReason::Text("no boundary pattern matches"),
    )
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
    let mut text = String::new();
    for m in tree.deepest_first() {
        if lists.head[m as usize] == NONE {
            continue;
        }
        let module = tree.name(m);
        members.clear();
        members.extend(lists.positions(m).map(|pos| params[pos].0));
        members.sort_unstable();
        let (ty, reason) = infer_type_of_set(module, lists.roles[m as usize]);
        // Each note is written into `text` and copied once into its shared allocation.
        text.clear();
        if ty != BoundaryType::Unknown {
            text.extend(["boundary '", module, "' is ", ty.name(), ": "]);
            reason.write_to(&mut text);
            note_all(&mut out.notes, &members, Note::from(text.as_str()));
            out.boundaries.push(Grouped {
                module: module.to_string(),
                ty,
                reason: reason.to_string(),
                params: members.clone(),
            });
            continue;
        }
        match tree.parent(m) {
            Some(p) if !module.is_empty() => {
                text.extend(["'", module, "': "]);
                reason.write_to(&mut text);
                text.extend(["; merged into '", tree.name(p), "'"]);
                note_all(&mut out.notes, &members, Note::from(text.as_str()));
                lists.hand_to(m, p);
            }
            _ => root_unknowns(params, &mut lists, m, &reason.to_string(), &mut out),
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
        let (ty, why) = root_verdict(r, reason);
        out.notes[i].push(Note::from(format!("'{own}': {why}")));
        out.boundaries.push(Grouped {
            module: own,
            ty,
            reason: why,
            params: vec![i],
        });
    }
}

/// The boundary type and reason of a parameter whose module is still unknown at the root:
/// a replicated parameter needs a layout only; anything else stays unknown.
fn root_verdict(role: Role, reason: &str) -> (BoundaryType, String) {
    if role == Role::Replicated {
        (
            BoundaryType::Replicated,
            "only REPLICATED parameters: layout only, no contract".to_string(),
        )
    } else {
        (
            BoundaryType::Unknown,
            format!("still unknown at the root ({reason})"),
        )
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

    /// The grouping as first written (string-keyed maps, one note string per parameter), kept
    /// as the reference the interned version must reproduce exactly.
    fn reference_group(
        params: &[(usize, &str, Role)],
    ) -> (Vec<Grouped>, BTreeMap<usize, Vec<String>>) {
        use std::collections::HashMap;
        let mut groups: HashMap<&str, Vec<usize>> = HashMap::new();
        let mut first_seen: HashMap<&str, usize> = HashMap::new();
        let by_index: BTreeMap<usize, (Role, &str)> =
            params.iter().map(|&(i, n, r)| (i, (r, n))).collect();
        for (order, &(idx, fqn, _)) in params.iter().enumerate() {
            let owner = parent(fqn).unwrap_or("");
            groups.entry(owner).or_default().push(idx);
            let mut m = Some(owner);
            while let Some(cur) = m {
                if first_seen.contains_key(cur) {
                    break;
                }
                first_seen.insert(cur, order);
                m = parent(cur);
            }
        }
        let mut modules: Vec<(std::cmp::Reverse<usize>, usize, &str)> = first_seen
            .iter()
            .map(|(&m, &first)| {
                let depth = m.matches('.').count() + usize::from(!m.is_empty());
                (std::cmp::Reverse(depth), first, m)
            })
            .collect();
        modules.sort_unstable();
        let (mut out, mut notes) = (Vec::new(), BTreeMap::<usize, Vec<String>>::new());
        for (_, _, name) in modules {
            let Some(mut members) = groups.remove(name) else {
                continue;
            };
            members.sort_unstable();
            let roles: BTreeSet<Role> = members.iter().map(|i| by_index[i].0).collect();
            let (ty, reason) = infer_type(name, &roles);
            if ty != BoundaryType::Unknown {
                for &i in &members {
                    let note = format!("boundary '{name}' is {}: {reason}", ty.name());
                    notes.entry(i).or_default().push(note);
                }
                out.push(Grouped {
                    module: name.to_string(),
                    ty,
                    reason,
                    params: members,
                });
                continue;
            }
            match parent(name) {
                Some(p) if !name.is_empty() => {
                    for &i in &members {
                        let note = format!("'{name}': {reason}; merged into '{p}'");
                        notes.entry(i).or_default().push(note);
                    }
                    groups.entry(p).or_default().extend(members);
                }
                _ => {
                    for &i in &members {
                        let (r, n) = by_index[&i];
                        let own = parent(n).unwrap_or("").to_string();
                        let (ty, why) = root_verdict(r, &reason);
                        notes.entry(i).or_default().push(format!("'{own}': {why}"));
                        out.push(Grouped {
                            module: own,
                            ty,
                            reason: why,
                            params: vec![i],
                        });
                    }
                }
            }
        }
        out.sort_by_key(|b| b.params[0]);
        (out, notes)
    }

    fn assert_same_as_reference(params: &[(usize, &str, Role)]) {
        let g = group(params);
        let (boundaries, notes) = reference_group(params);
        assert_eq!(g.boundaries, boundaries);
        for (i, got) in g.notes.iter().enumerate() {
            let want = notes.get(&i).cloned().unwrap_or_default();
            let got: Vec<String> = got.iter().map(|n| n.to_string()).collect();
            assert_eq!(got, want, "notes of parameter {i}");
        }
    }

    #[test]
    fn interned_grouping_matches_the_reference() {
        // Per-expert MoE layers, attention, norms, router and a shared expert, with gaps in
        // the indices (skipped parameters), as the planner passes them.
        let mut names: Vec<(String, Role)> =
            vec![("model.embed_tokens.weight".into(), Role::Embed)];
        for l in 0..3 {
            let layer = format!("model.layers.{l}");
            for (n, r) in [
                ("self_attn.q_proj.weight", Role::Colwise),
                ("self_attn.kv_a_proj_with_mqa.weight", Role::Replicated),
                ("self_attn.o_proj.weight", Role::Rowwise),
                ("self_attn.q_a_layernorm.weight", Role::Norm),
                ("input_layernorm.weight", Role::Norm),
                ("mlp.gate.weight", Role::MoeGate),
                ("mlp.shared_experts.up_proj.weight", Role::SharedExpert),
                ("mlp.shared_experts.down_proj.weight", Role::SharedExpert),
            ] {
                names.push((format!("{layer}.{n}"), r));
            }
            for e in 0..5 {
                for proj in ["gate_proj", "up_proj", "down_proj"] {
                    names.push((
                        format!("{layer}.mlp.experts.{e}.{proj}.weight"),
                        Role::MoeExpert,
                    ));
                }
            }
        }
        names.push(("model.norm.weight".into(), Role::Norm));
        names.push(("lm_head.weight".into(), Role::LmHead));
        let params: Vec<(usize, &str, Role)> = names
            .iter()
            .enumerate()
            .map(|(i, (n, r))| (2 * i + 1, n.as_str(), *r))
            .collect();
        assert_same_as_reference(&params);
    }

    #[test]
    fn interned_grouping_matches_the_reference_on_odd_trees() {
        // Modules revisited after others, dot-less names, upper case, unknowns and
        // replicated parameters at the root, digit leaves.
        let params = [
            (0, "a.mlp.up_proj.weight", Role::Colwise),
            (1, "a.attn.q_proj.weight", Role::Colwise),
            (2, "a.mlp.down_proj.weight", Role::Rowwise),
            (3, "a.attn.o_proj.weight", Role::Rowwise),
            (4, "toplevel", Role::Bias),
            (5, "Model.Layers.7.MLP.Experts.3.W1.weight", Role::MoeExpert),
            (6, "weird.x", Role::Replicated),
            (7, "eh_proj.weight", Role::Replicated),
            (8, "model.layers.9.router.weight", Role::MoeGate),
            (9, "model.blocks.2.fc1.weight", Role::Colwise),
            (10, "a.mlp.gate.weight", Role::MoeGate),
            (11, "loose", Role::Replicated),
        ];
        assert_same_as_reference(&params);
        assert_same_as_reference(&params[..0]);
        assert_same_as_reference(&params[4..5]);
    }
}
