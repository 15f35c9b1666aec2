//! The layout rule table: for each operator, the output layout as a function of the input
//! layouts on the plan mesh (HyperParallel's `infer_layout`), and a cache keyed by
//! (op, input layouts).
//!
//! Activations are token-major `[tokens, features]`; parameters keep their HuggingFace shapes.
//! Rules follow the DTensor conventions of the notes (§3.2): a contracting dimension sharded
//! on an axis makes the output `Partial(sum)` on that axis; both operands of a contraction
//! must shard it identically ("Contracting dimensions must have same layout"); element-wise
//! ops need equal layouts; normalisations and softmaxes need complete (non-partial) values
//! that are not sharded along the normalised dimension.

use std::collections::HashMap;

use hpfsdp_plan::{DeviceMesh, Layout, Placement};

/// An operator of the reference model, with the static attributes its rule needs.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum OpKind {
    /// Row lookup: inputs `ids [T]`, `weight [V, H]`.
    Embedding,
    /// RMSNorm over the last dim: inputs `x [T, H]`, `weight [H]`.
    RmsNorm,
    /// Element-wise sum of two tensors.
    Add,
    /// GQA self-attention (projections, per-head norms, RoPE, causal core, output projection):
    /// inputs `x, q, k, v, o[, q_norm, k_norm]`.
    SelfAttention {
        /// Query heads (global).
        heads: usize,
        /// KV heads (global).
        kv_heads: usize,
    },
    /// Multi-head latent attention: input `x` then its weights (all replicated).
    Mla,
    /// SwiGLU MLP: inputs `x, gate, up, down`.
    SwiGlu,
    /// Mixture of experts on one rank: inputs `x, router, gate_up, down` (all replicated).
    Moe,
    /// Mixture of experts with experts sharded on dim 0 over the `ep` axis and a token
    /// all-to-all (a local-map region): inputs `x, router, gate_up, down`.
    MoeEp,
    /// `y = x · Wᵀ`: inputs `x [T, in]`, `weight [out, in]`.
    Linear,
    /// Mean cross-entropy of `logits [T, V]` (needs whole logits).
    CrossEntropy,
}

impl OpKind {
    /// Operator name for messages and counters.
    pub fn name(&self) -> &'static str {
        match self {
            OpKind::Embedding => "embedding",
            OpKind::RmsNorm => "rms_norm",
            OpKind::Add => "add",
            OpKind::SelfAttention { .. } => "self_attention",
            OpKind::Mla => "mla",
            OpKind::SwiGlu => "swiglu",
            OpKind::Moe => "moe",
            OpKind::MoeEp => "moe_ep",
            OpKind::Linear => "linear",
            OpKind::CrossEntropy => "cross_entropy",
        }
    }
}

fn axis_name(mesh: &DeviceMesh, a: usize) -> &str {
    &mesh.axes()[a].name
}

/// Placement of `l` on axis `a` of a tensor dim `d`: `Some(true)` sharded on `d`.
fn shards(l: &Layout, a: usize, d: usize) -> bool {
    l.placements[a].shard_dim() == Some(d)
}

fn complete(what: &str, l: &Layout, mesh: &DeviceMesh) -> Result<(), String> {
    match l.placements.iter().position(Placement::is_partial) {
        Some(a) => Err(format!(
            "{what} {l} is Partial on axis '{}'; it needs complete values (reduce it first)",
            axis_name(mesh, a)
        )),
        None => Ok(()),
    }
}

fn replicated(what: &str, l: &Layout, mesh: &DeviceMesh) -> Result<(), String> {
    match l.placements.iter().position(|p| !p.is_replicate()) {
        Some(a) => Err(format!(
            "{what} {l} must be Replicate on axis '{}', got {}",
            axis_name(mesh, a),
            l.placements[a]
        )),
        None => Ok(()),
    }
}

fn not_sharded_on(what: &str, l: &Layout, d: usize, mesh: &DeviceMesh) -> Result<(), String> {
    match (0..l.placements.len()).find(|&a| shards(l, a, d)) {
        Some(a) => Err(format!(
            "{what} {l} is sharded on dim {d} over axis '{}', which this op reduces or mixes",
            axis_name(mesh, a)
        )),
        None => Ok(()),
    }
}

fn rank_of(what: &str, l: &Layout, n: usize) -> Result<(), String> {
    if l.global_shape.len() == n {
        Ok(())
    } else {
        Err(format!("{what} {l} must be {n}-D"))
    }
}

fn act(shape0: u64, shape1: u64, placements: Vec<Placement>) -> Layout {
    Layout {
        global_shape: vec![shape0, shape1],
        placements,
    }
}

/// A "column then row" parallel pair (attention q/k/v → o, MLP gate/up → down): the input
/// projections must shard dim 0 identically, the output projection dim 1 the same way, and
/// the result is `Partial(sum)` wherever the pair is split.
fn col_row_pair(
    x: &Layout,
    cols: &[(&str, &Layout)],
    row: &Layout,
    mesh: &DeviceMesh,
    split_counts: &[(&str, usize)],
) -> Result<Layout, String> {
    rank_of("input", x, 2)?;
    complete("input", x, mesh)?;
    not_sharded_on("input", x, 1, mesh)?;
    not_sharded_on("input", x, 0, mesh)?;
    complete("output projection", row, mesh)?;
    not_sharded_on("output projection", row, 0, mesh)?;
    let mut out = Vec::with_capacity(mesh.ndim());
    for a in 0..mesh.ndim() {
        let (first_name, first) = cols[0];
        let split = shards(first, a, 0);
        for (name, w) in cols {
            complete(name, w, mesh)?;
            not_sharded_on(name, w, 1, mesh)?;
            if shards(w, a, 0) != split || !(w.placements[a].is_replicate() || shards(w, a, 0)) {
                return Err(format!(
                    "{name} {w} and {first_name} {first} shard their output dim differently on axis '{}'",
                    axis_name(mesh, a)
                ));
            }
        }
        if shards(row, a, 1) != split || !(row.placements[a].is_replicate() || shards(row, a, 1)) {
            return Err(format!(
                "Contracting dimensions must have same layout: output projection {row} vs \
                 {first_name} {first} on axis '{}'",
                axis_name(mesh, a)
            ));
        }
        if split {
            let size = mesh.axes()[a].size;
            for (what, n) in split_counts {
                if n % size != 0 {
                    return Err(format!(
                        "{n} {what} cannot be split over axis '{}' of size {size}",
                        axis_name(mesh, a)
                    ));
                }
            }
            out.push(Placement::partial_sum());
        } else {
            out.push(x.placements[a].clone());
        }
    }
    Ok(act(x.global_shape[0], row.global_shape[0], out))
}

/// The output layout of `op` on `inputs`, or why the inputs are refused.
pub fn infer(op: &OpKind, inputs: &[Layout], mesh: &DeviceMesh) -> Result<Layout, String> {
    let arity = match op {
        OpKind::CrossEntropy => 1,
        OpKind::Embedding | OpKind::RmsNorm | OpKind::Add | OpKind::Linear => 2,
        OpKind::Mla | OpKind::Moe => 2,
        OpKind::SwiGlu | OpKind::MoeEp => 4,
        OpKind::SelfAttention { .. } => 5,
    };
    if inputs.len() < arity {
        return Err(format!(
            "{} needs {arity} inputs, got {}",
            op.name(),
            inputs.len()
        ));
    }
    match op {
        OpKind::Embedding => embedding_rule(&inputs[0], &inputs[1], mesh),
        OpKind::RmsNorm => rms_norm_rule(&inputs[0], &inputs[1], mesh),
        OpKind::Add => {
            if inputs[0] != inputs[1] {
                return Err(format!(
                    "element-wise operands have different layouts: {} vs {}",
                    inputs[0], inputs[1]
                ));
            }
            Ok(inputs[0].clone())
        }
        OpKind::SelfAttention { heads, kv_heads } => {
            for (i, n) in inputs.iter().enumerate().skip(5) {
                replicated(if i == 5 { "q_norm" } else { "k_norm" }, n, mesh)?;
            }
            col_row_pair(
                &inputs[0],
                &[
                    ("q_proj", &inputs[1]),
                    ("k_proj", &inputs[2]),
                    ("v_proj", &inputs[3]),
                ],
                &inputs[4],
                mesh,
                &[("heads", *heads), ("kv heads", *kv_heads)],
            )
        }
        OpKind::SwiGlu => col_row_pair(
            &inputs[0],
            &[("gate_proj", &inputs[1]), ("up_proj", &inputs[2])],
            &inputs[3],
            mesh,
            &[],
        ),
        OpKind::Mla | OpKind::Moe => replicated_block_rule(&inputs[0], &inputs[1..], mesh),
        OpKind::MoeEp => moe_ep_rule(inputs, mesh),
        OpKind::Linear => linear_rule(&inputs[0], &inputs[1], mesh),
        OpKind::CrossEntropy => {
            rank_of("logits", &inputs[0], 2)?;
            replicated("logits", &inputs[0], mesh)?;
            Ok(Layout {
                global_shape: vec![],
                placements: vec![Placement::Replicate; mesh.ndim()],
            })
        }
    }
}

/// Embedding lookup: a row-sharded table gives partial sums, a column-sharded one column
/// shards, a replicated one follows the ids.
fn embedding_rule(ids: &Layout, w: &Layout, mesh: &DeviceMesh) -> Result<Layout, String> {
    rank_of("weight", w, 2)?;
    complete("weight", w, mesh)?;
    let mut out = Vec::new();
    for a in 0..mesh.ndim() {
        out.push(match &w.placements[a] {
            Placement::Shard { dim: 0 } => Placement::partial_sum(),
            Placement::Shard { dim: 1 } => Placement::shard(1),
            Placement::Replicate => ids.placements[a].clone(),
            other => return Err(format!("weight placement {other} is not supported")),
        });
    }
    Ok(act(ids.global_shape[0], w.global_shape[1], out))
}

/// RMSNorm: the normalized (last) dimension must be whole and the weight replicated; the
/// output keeps the input's layout.
fn rms_norm_rule(x: &Layout, w: &Layout, mesh: &DeviceMesh) -> Result<Layout, String> {
    rank_of("input", x, 2)?;
    complete("input", x, mesh)?;
    not_sharded_on("input", x, 1, mesh)?;
    replicated("weight", w, mesh)?;
    if w.global_shape.last() != x.global_shape.last() {
        return Err(format!("weight {w} does not match the rows of input {x}"));
    }
    Ok(x.clone())
}

/// Blocks run whole on every rank (MLA attention, MoE without expert parallelism): tokens
/// unsharded, every weight replicated.
fn replicated_block_rule(
    x: &Layout,
    weights: &[Layout],
    mesh: &DeviceMesh,
) -> Result<Layout, String> {
    rank_of("input", x, 2)?;
    complete("input", x, mesh)?;
    not_sharded_on("input", x, 1, mesh)?;
    not_sharded_on("input", x, 0, mesh)?;
    for w in weights {
        replicated("weight", w, mesh)?;
    }
    Ok(x.clone())
}

/// MoE with expert parallelism (a local-map region): tokens Replicate on `ep`, the router
/// replicated, expert weights S(0) on `ep` and Replicate elsewhere.
fn moe_ep_rule(inputs: &[Layout], mesh: &DeviceMesh) -> Result<Layout, String> {
    let x = &inputs[0];
    rank_of("input", x, 2)?;
    complete("input", x, mesh)?;
    not_sharded_on("input", x, 1, mesh)?;
    replicated("router", &inputs[1], mesh)?;
    let ep = mesh
        .axis_index("ep")
        .ok_or_else(|| "the plan mesh has no 'ep' axis".to_string())?;
    if !x.placements[ep].is_replicate() {
        return Err(format!(
            "tokens {x} must be Replicate on 'ep' (local-map region)"
        ));
    }
    for (name, w) in [("gate_up_proj", &inputs[2]), ("down_proj", &inputs[3])] {
        for a in 0..mesh.ndim() {
            let ok = if a == ep {
                shards(w, a, 0)
            } else {
                w.placements[a].is_replicate()
            };
            if !ok {
                return Err(format!(
                    "expert weight {name} {w} must be S(0) on 'ep' and Replicate elsewhere \
                     (axis '{}' has {})",
                    axis_name(mesh, a),
                    w.placements[a]
                ));
            }
        }
    }
    Ok(x.clone())
}

/// `x @ w^T` per mesh axis: both sharded on the contracting dimension gives partial sums, a
/// row-sharded weight column-shards the output, otherwise the input's placement carries over.
fn linear_rule(x: &Layout, w: &Layout, mesh: &DeviceMesh) -> Result<Layout, String> {
    rank_of("input", x, 2)?;
    rank_of("weight", w, 2)?;
    complete("input", x, mesh)?;
    complete("weight", w, mesh)?;
    let mut out = Vec::new();
    for a in 0..mesh.ndim() {
        let (xc, wc) = (shards(x, a, 1), shards(w, a, 1));
        if xc != wc {
            return Err(format!(
                "Contracting dimensions must have same layout: input {x} vs weight {w} on axis '{}'",
                axis_name(mesh, a)
            ));
        }
        out.push(if xc {
            Placement::partial_sum()
        } else if shards(w, a, 0) {
            if shards(x, a, 0) {
                return Err(format!(
                    "input {x} and weight {w} both shard on axis '{}'",
                    axis_name(mesh, a)
                ));
            }
            Placement::shard(1)
        } else {
            x.placements[a].clone()
        });
    }
    Ok(act(x.global_shape[0], w.global_shape[0], out))
}

/// Rule results cached by (op, input layouts), as DTensor dispatch caches sharding
/// propagation.
#[derive(Debug, Default)]
pub struct RuleTable {
    cache: HashMap<(OpKind, Vec<Layout>), Result<Layout, String>>,
}

impl RuleTable {
    /// An empty table.
    pub fn new() -> RuleTable {
        RuleTable::default()
    }

    /// The output layout of `op` on `inputs`, and whether the cache answered.
    pub fn lookup(
        &mut self,
        op: &OpKind,
        inputs: &[Layout],
        mesh: &DeviceMesh,
    ) -> (Result<Layout, String>, bool) {
        let key = (op.clone(), inputs.to_vec());
        if let Some(hit) = self.cache.get(&key) {
            return (hit.clone(), true);
        }
        let r = infer(op, inputs, mesh);
        self.cache.insert(key, r.clone());
        (r, false)
    }

    /// Number of cached entries.
    pub fn len(&self) -> usize {
        self.cache.len()
    }

    /// Whether nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.cache.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mesh() -> DeviceMesh {
        DeviceMesh::new([("tp", 2), ("cp", 1), ("ep", 2), ("etp", 1)]).unwrap()
    }

    fn l(shape: &[u64], tp: Placement, ep: Placement) -> Layout {
        Layout {
            global_shape: shape.to_vec(),
            placements: vec![tp, Placement::Replicate, ep, Placement::Replicate],
        }
    }

    const R: Placement = Placement::Replicate;

    #[test]
    fn column_row_pair_gives_partial_and_rejects_mismatches() {
        let m = mesh();
        let x = l(&[8, 16], R, R);
        let col = l(&[32, 16], Placement::shard(0), R);
        let row = l(&[16, 32], Placement::shard(1), R);
        let out = infer(
            &OpKind::SwiGlu,
            &[x.clone(), col.clone(), col.clone(), row.clone()],
            &m,
        )
        .unwrap();
        assert_eq!(out.placements[0], Placement::partial_sum());
        let bad_row = l(&[16, 32], R, R);
        let err = infer(&OpKind::SwiGlu, &[x.clone(), col.clone(), col, bad_row], &m).unwrap_err();
        assert!(err.contains("Contracting dimensions"), "{err}");
        let rep = l(&[32, 16], R, R);
        let ok = infer(
            &OpKind::SwiGlu,
            &[x.clone(), rep.clone(), rep, l(&[16, 32], R, R)],
            &m,
        )
        .unwrap();
        assert_eq!(ok, x);
    }

    #[test]
    fn norms_need_complete_inputs_and_replicated_weights() {
        let m = mesh();
        let p = l(&[8, 16], Placement::partial_sum(), R);
        assert!(
            infer(&OpKind::RmsNorm, &[p, l(&[16], R, R)], &m)
                .unwrap_err()
                .contains("Partial")
        );
        let x = l(&[8, 16], R, R);
        let w = l(&[16], Placement::shard(0), R);
        assert!(
            infer(&OpKind::RmsNorm, &[x, w], &m)
                .unwrap_err()
                .contains("Replicate")
        );
    }

    #[test]
    fn linear_and_embedding_rules() {
        let m = mesh();
        let x = l(&[8, 16], R, R);
        let head = l(&[64, 16], Placement::shard(0), R);
        let out = infer(&OpKind::Linear, &[x.clone(), head], &m).unwrap();
        assert_eq!(out.placements[0], Placement::shard(1));
        let ids = Layout {
            global_shape: vec![8],
            placements: vec![R; 4],
        };
        let emb = l(&[64, 16], Placement::shard(0), R);
        let out = infer(&OpKind::Embedding, &[ids, emb], &m).unwrap();
        assert_eq!(out.placements[0], Placement::partial_sum());
        assert!(
            infer(
                &OpKind::CrossEntropy,
                &[l(&[8, 64], Placement::shard(1), R)],
                &m
            )
            .is_err()
        );
    }

    #[test]
    fn the_cache_answers_repeated_lookups() {
        let m = mesh();
        let mut t = RuleTable::new();
        let ins = [l(&[8, 16], R, R), l(&[8, 16], R, R)];
        assert!(!t.lookup(&OpKind::Add, &ins, &m).1);
        assert!(t.lookup(&OpKind::Add, &ins, &m).1);
        assert_eq!(t.len(), 1);
    }
}
