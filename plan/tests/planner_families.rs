//! Sharding planner on the real HF parameter names of all four families (Llama-3-8B,
//! Qwen3-14B, Qwen3-30B-A3B fused and per-expert, DeepSeek-V3 with its MTP layer): role,
//! boundary module and type, and TP/EP placement per parameter for representative layers,
//! cross-checked against torchtitan's TP plans (q/k/v colwise S(0), o rowwise S(1),
//! gate/up colwise, down rowwise, MLA `q_a_proj`/`kv_a_proj_with_mqa` replicated, experts
//! EP S(0) with expert TP S(1)/S(2), shared experts colwise/rowwise, routers and norms
//! replicated, embedding and head S(0)); full coverage of every trainable parameter; plan
//! determinism; and every lint the planner raises (indivisible shards, parameters claimed
//! twice, uncovered parameters, overrides matching nothing, EP/CP compatibility, fused
//! expert TP, `when` gating), each naming its parameter/boundary/axis and a fix.

use hpfsdp_plan::planner::boundary::BoundaryType;
use hpfsdp_plan::planner::lint::{LintIssue, Severity};
use hpfsdp_plan::planner::overrides::{PlanOverride, RawOverride};
use hpfsdp_plan::planner::roles::Role;
use hpfsdp_plan::planner::templates::{Contract, PlanAxes, format_axis_placements};
use hpfsdp_plan::planner::{BoundarySource, PlannerInput, ShardingPlan, plan};
use hpfsdp_plan::{ExpertLayout, ModelIr, ModelOptions};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::OnceLock;

// ---------------------------------------------------------------- helpers

fn load(file: &str, options: ModelOptions) -> ModelIr {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../scenarios/models")
        .join(file);
    ModelIr::load(&path, options).unwrap_or_else(|e| panic!("{file}: {e}"))
}

fn llama() -> &'static ModelIr {
    static M: OnceLock<ModelIr> = OnceLock::new();
    M.get_or_init(|| load("llama-3-8b.json", ModelOptions::default()))
}

fn qwen3_dense() -> &'static ModelIr {
    static M: OnceLock<ModelIr> = OnceLock::new();
    M.get_or_init(|| load("qwen3-14b.json", ModelOptions::default()))
}

fn qwen3_moe() -> &'static ModelIr {
    static M: OnceLock<ModelIr> = OnceLock::new();
    M.get_or_init(|| load("qwen3-30b-a3b.json", ModelOptions::default()))
}

fn qwen3_moe_per_expert() -> &'static ModelIr {
    static M: OnceLock<ModelIr> = OnceLock::new();
    M.get_or_init(|| {
        load(
            "qwen3-30b-a3b.json",
            ModelOptions {
                expert_layout: ExpertLayout::PerExpert,
                ..ModelOptions::default()
            },
        )
    })
}

/// DeepSeek-V3 with its MTP layer (`model.layers.61`) included.
fn deepseek() -> &'static ModelIr {
    static M: OnceLock<ModelIr> = OnceLock::new();
    M.get_or_init(|| {
        load(
            "deepseek-v3.json",
            ModelOptions {
                include_mtp: true,
                ..ModelOptions::default()
            },
        )
    })
}

fn axes(tp: usize, cp: usize, ep: usize, etp: usize) -> PlanAxes {
    PlanAxes {
        tp,
        cp,
        ep,
        etp,
        sequence_parallel: true,
        loss_parallel: false,
    }
}

fn input(axes: PlanAxes) -> PlannerInput {
    PlannerInput {
        axes,
        overrides: Vec::new(),
        low_precision: false,
        seq_len: 4096,
        allow_uncovered: false,
    }
}

fn with_overrides(axes: PlanAxes, overrides: Vec<PlanOverride>) -> PlannerInput {
    PlannerInput {
        overrides,
        ..input(axes)
    }
}

/// Parses one `[[plan.override]]` body as written in a scenario file.
fn ov(text: &str, origin: &str) -> PlanOverride {
    let raw: RawOverride = toml::from_str(text).unwrap_or_else(|e| panic!("{text}: {e}"));
    PlanOverride::parse(&raw, origin).unwrap_or_else(|e| panic!("{text}: {e}"))
}

/// Asserts role, owning boundary (module and type) and plan-axis placements of `name`.
fn expect(
    p: &ShardingPlan,
    name: &str,
    role: Role,
    boundary: &str,
    ty: BoundaryType,
    placements: &str,
) {
    let pp = p
        .param(name)
        .unwrap_or_else(|| panic!("no parameter {name}"));
    assert_eq!(pp.role, role, "{name}: role");
    assert_eq!(pp.boundary.as_deref(), Some(boundary), "{name}: boundary");
    let b = p
        .boundaries
        .iter()
        .find(|b| b.module == boundary)
        .unwrap_or_else(|| panic!("no boundary {boundary}"));
    assert_eq!(b.ty, ty, "{boundary}: type");
    assert!(
        b.params.contains_key(name),
        "{boundary} does not list {name}"
    );
    assert_eq!(
        format_axis_placements(&pp.placements),
        placements,
        "{name}: placements"
    );
}

fn local(p: &ShardingPlan, name: &str, coord: &[(&str, usize)]) -> Vec<u64> {
    let c: BTreeMap<String, usize> = coord.iter().map(|(a, i)| (a.to_string(), *i)).collect();
    p.local_shape(p.param(name).unwrap(), &c)
}

fn errors(p: &ShardingPlan) -> Vec<&LintIssue> {
    p.lints
        .iter()
        .filter(|l| l.severity == Severity::Error)
        .collect()
}

fn lints_with<'a>(p: &'a ShardingPlan, code: &str) -> Vec<&'a LintIssue> {
    p.lints.iter().filter(|l| l.code == code).collect()
}

fn assert_clean(p: &ShardingPlan, what: &str) {
    let errs: Vec<String> = errors(p).iter().map(|l| l.to_string()).collect();
    assert!(errs.is_empty(), "{what}: lint errors:\n{}", errs.join("\n"));
}

/// Every trainable parameter is owned by exactly one boundary, and that boundary lists it.
fn assert_fully_covered(p: &ShardingPlan, what: &str) {
    assert!(
        lints_with(p, "uncovered-param").is_empty(),
        "{what}: uncovered params"
    );
    let mut owners: BTreeMap<&str, usize> = BTreeMap::new();
    for b in &p.boundaries {
        for name in b.params.keys() {
            *owners.entry(name.as_str()).or_default() += 1;
        }
    }
    for pp in &p.params {
        if pp.trainable {
            assert_eq!(
                owners.get(pp.name.as_str()),
                Some(&1),
                "{what}: {} is not owned by exactly one boundary",
                pp.name
            );
            assert!(pp.boundary.is_some(), "{what}: {} has no boundary", pp.name);
        } else {
            assert_eq!(
                pp.role,
                Role::Skip,
                "{what}: frozen {} must be SKIP",
                pp.name
            );
            assert!(
                pp.boundary.is_none(),
                "{what}: frozen {} is sharded",
                pp.name
            );
        }
    }
}

// ---------------------------------------------------------------- Llama-3-8B

#[test]
fn llama_tp4_matches_torchtitan_plan() {
    let p = plan(llama(), &input(axes(4, 1, 1, 1)));
    assert_clean(&p, "llama tp4");
    assert_eq!(p.architecture, "LlamaForCausalLM");
    let attn = "model.layers.0.self_attn";
    let mlp = "model.layers.0.mlp";
    use BoundaryType as B;
    expect(
        &p,
        "model.embed_tokens.weight",
        Role::Embed,
        "model.embed_tokens",
        B::Embed,
        "tp=S(0)",
    );
    for x in ["q_proj", "k_proj", "v_proj"] {
        expect(
            &p,
            &format!("{attn}.{x}.weight"),
            Role::Colwise,
            attn,
            B::Attention,
            "tp=S(0)",
        );
    }
    expect(
        &p,
        &format!("{attn}.o_proj.weight"),
        Role::Rowwise,
        attn,
        B::Attention,
        "tp=S(1)",
    );
    for x in ["gate_proj", "up_proj"] {
        expect(
            &p,
            &format!("{mlp}.{x}.weight"),
            Role::Colwise,
            mlp,
            B::Mlp,
            "tp=S(0)",
        );
    }
    expect(
        &p,
        &format!("{mlp}.down_proj.weight"),
        Role::Rowwise,
        mlp,
        B::Mlp,
        "tp=S(1)",
    );
    expect(
        &p,
        "model.layers.31.input_layernorm.weight",
        Role::Norm,
        "model.layers.31.input_layernorm",
        B::Norm,
        "R",
    );
    expect(
        &p,
        "model.norm.weight",
        Role::Norm,
        "model.norm",
        B::Norm,
        "R",
    );
    expect(
        &p,
        "lm_head.weight",
        Role::LmHead,
        "lm_head",
        B::LmHead,
        "tp=S(0)",
    );

    // Plan-local shapes on tp rank 1: q/o [4096,4096], k/v [1024,4096], gate [14336,4096].
    let l0 = |n: &str| local(&p, &format!("model.layers.0.{n}"), &[("tp", 1)]);
    assert_eq!(l0("self_attn.q_proj.weight"), [1024, 4096]);
    assert_eq!(l0("self_attn.k_proj.weight"), [256, 4096]);
    assert_eq!(l0("self_attn.o_proj.weight"), [4096, 1024]);
    assert_eq!(l0("mlp.gate_proj.weight"), [3584, 4096]);
    assert_eq!(l0("mlp.down_proj.weight"), [4096, 3584]);
    assert_eq!(local(&p, "lm_head.weight", &[("tp", 3)]), [32064, 4096]);
    assert_eq!(local(&p, "model.norm.weight", &[("tp", 2)]), [4096]);

    // Attention/MLP contracts with SP: sequence-sharded in, replicated inside, partial out.
    let b = p.boundaries.iter().find(|b| b.module == attn).unwrap();
    let c = |x: &Option<Contract>| format_axis_placements(&x.as_ref().unwrap()["hidden_states"]);
    assert_eq!(c(&b.in_src), "tp=S(1)");
    assert_eq!(c(&b.in_dst), "tp=R");
    assert_eq!(c(&b.out_src), "tp=P(sum)");
    assert_eq!(c(&b.out_dst), "tp=S(1)");
    assert_eq!(b.source, BoundarySource::Derived);
    // 32 layers x (attention, mlp, 2 norms) + embed + final norm + head.
    assert_eq!(p.boundaries.len(), 32 * 4 + 3);
}

#[test]
fn llama_tp1_covers_everything_without_sharding() {
    let p = plan(llama(), &input(axes(1, 1, 1, 1)));
    assert_clean(&p, "llama tp1");
    assert_fully_covered(&p, "llama tp1");
    assert!(p.params.iter().all(|pp| pp.placements.is_empty()));
    assert!(p.lints.is_empty(), "{:?}", p.lints);
}

// ---------------------------------------------------------------- Qwen3-14B

#[test]
fn qwen3_dense_tp8_roles_and_shapes() {
    let p = plan(qwen3_dense(), &input(axes(8, 1, 1, 1)));
    assert_clean(&p, "qwen3-14b tp8");
    assert_fully_covered(&p, "qwen3-14b tp8");
    use BoundaryType as B;
    let attn = "model.layers.39.self_attn";
    expect(
        &p,
        &format!("{attn}.q_proj.weight"),
        Role::Colwise,
        attn,
        B::Attention,
        "tp=S(0)",
    );
    expect(
        &p,
        &format!("{attn}.v_proj.weight"),
        Role::Colwise,
        attn,
        B::Attention,
        "tp=S(0)",
    );
    expect(
        &p,
        &format!("{attn}.o_proj.weight"),
        Role::Rowwise,
        attn,
        B::Attention,
        "tp=S(1)",
    );
    // Per-head q/k norms are their own (replicated) norm boundaries.
    for n in ["q_norm", "k_norm"] {
        expect(
            &p,
            &format!("{attn}.{n}.weight"),
            Role::Norm,
            &format!("{attn}.{n}"),
            B::Norm,
            "R",
        );
    }
    expect(
        &p,
        "model.layers.39.mlp.up_proj.weight",
        Role::Colwise,
        "model.layers.39.mlp",
        B::Mlp,
        "tp=S(0)",
    );
    // q/o [5120,5120], k/v [1024,5120], gate/up [17408,5120], vocab 151936.
    assert_eq!(
        local(&p, &format!("{attn}.q_proj.weight"), &[("tp", 7)]),
        [640, 5120]
    );
    assert_eq!(
        local(&p, &format!("{attn}.k_proj.weight"), &[("tp", 7)]),
        [128, 5120]
    );
    assert_eq!(
        local(&p, "model.layers.39.mlp.down_proj.weight", &[("tp", 0)]),
        [5120, 2176]
    );
    assert_eq!(
        local(&p, "model.embed_tokens.weight", &[("tp", 5)]),
        [18992, 5120]
    );
}

// ---------------------------------------------------------------- Qwen3-30B-A3B

#[test]
fn qwen3_moe_fused_tp4_ep4() {
    let p = plan(qwen3_moe(), &input(axes(4, 1, 4, 1)));
    assert_clean(&p, "qwen3-30b tp4 ep4");
    assert_fully_covered(&p, "qwen3-30b tp4 ep4");
    use BoundaryType as B;
    let mlp = "model.layers.7.mlp";
    expect(
        &p,
        &format!("{mlp}.gate.weight"),
        Role::MoeGate,
        mlp,
        B::MoeMlp,
        "R",
    );
    expect(
        &p,
        &format!("{mlp}.experts.gate_up_proj"),
        Role::MoeExpert,
        mlp,
        B::MoeMlp,
        "ep=S(0)",
    );
    expect(
        &p,
        &format!("{mlp}.experts.down_proj"),
        Role::MoeExpert,
        mlp,
        B::MoeMlp,
        "ep=S(0)",
    );
    let attn = "model.layers.7.self_attn";
    expect(
        &p,
        &format!("{attn}.k_proj.weight"),
        Role::Colwise,
        attn,
        B::Attention,
        "tp=S(0)",
    );
    expect(
        &p,
        &format!("{attn}.o_proj.weight"),
        Role::Rowwise,
        attn,
        B::Attention,
        "tp=S(1)",
    );
    // [128,1536,2048] / ep 4 -> 32 experts per rank; k_proj [512,2048] / tp 4.
    assert_eq!(
        local(
            &p,
            &format!("{mlp}.experts.gate_up_proj"),
            &[("ep", 3), ("tp", 1)]
        ),
        [32, 1536, 2048]
    );
    assert_eq!(
        local(&p, &format!("{mlp}.experts.down_proj"), &[("ep", 0)]),
        [32, 2048, 768]
    );
    assert_eq!(
        local(&p, &format!("{attn}.k_proj.weight"), &[("tp", 2)]),
        [128, 2048]
    );
    // The MoE block runs as a local map; its router output is EP-sharded.
    let b = p.boundaries.iter().find(|b| b.module == mlp).unwrap();
    assert!(b.flags.use_local_map);
    assert_eq!(
        format_axis_placements(&b.in_dst.as_ref().unwrap()["hidden_states"]),
        "tp=R ep=R"
    );
    assert!(p.params.iter().all(|pp| pp.ep_owner.is_none()));
}

#[test]
fn qwen3_moe_expert_tp_on_fused_gate_up_is_an_error() {
    // Expert TP S(1) on [E,2I,H] and S(2) on [E,H,I], as torchtitan's ExpertTensorParallel,
    // but a fused gate/up split cuts across gate and up.
    let p = plan(qwen3_moe(), &input(axes(2, 1, 2, 2)));
    let gu = "model.layers.0.mlp.experts.gate_up_proj";
    let down = "model.layers.0.mlp.experts.down_proj";
    assert_eq!(
        format_axis_placements(&p.param(gu).unwrap().placements),
        "ep=S(0) etp=S(1)"
    );
    assert_eq!(
        format_axis_placements(&p.param(down).unwrap().placements),
        "ep=S(0) etp=S(2)"
    );
    assert_eq!(local(&p, down, &[("ep", 1), ("etp", 1)]), [64, 2048, 384]);
    let fused = lints_with(&p, "fused-expert-tp");
    assert_eq!(fused.len(), 48, "one per layer's gate_up_proj");
    let l = fused
        .iter()
        .find(|l| l.param.as_deref() == Some(gu))
        .expect("lint for layer 0");
    assert_eq!(l.severity, Severity::Error);
    assert_eq!(l.boundary.as_deref(), Some("model.layers.0.mlp"));
    assert_eq!(l.axis.as_deref(), Some("etp"));
    assert!(l.message.contains(gu), "{l}");
    assert!(
        l.fix.contains("per_expert") && l.fix.contains("ep > 1"),
        "{l}"
    );
    // down_proj is not fused: no lint for it.
    assert!(fused.iter().all(|l| l.param.as_deref() != Some(down)));
    // Expert TP without EP is the same error.
    let p = plan(qwen3_moe(), &input(axes(2, 1, 1, 2)));
    assert_eq!(lints_with(&p, "fused-expert-tp").len(), 48);
    // Dense TP alone (etp = 1) leaves the experts unsplit: no error.
    let p = plan(qwen3_moe(), &input(axes(4, 1, 1, 1)));
    assert_clean(&p, "qwen3-30b tp4");
    assert!(p.param(gu).unwrap().placements.is_empty());
}

#[test]
fn qwen3_moe_per_expert_names_get_ep_owners() {
    let p = plan(qwen3_moe_per_expert(), &input(axes(2, 1, 4, 2)));
    assert_clean(&p, "qwen3-30b per-expert tp2 ep4 etp2");
    assert_fully_covered(&p, "qwen3-30b per-expert");
    use BoundaryType as B;
    let mlp = "model.layers.5.mlp";
    let e = |i: u32, w: &str| format!("{mlp}.experts.{i}.{w}.weight");
    // 128 experts over ep 4: 32 per coordinate; expert TP colwise S(0) / rowwise S(1) on 2-D.
    expect(
        &p,
        &e(37, "gate_proj"),
        Role::MoeExpert,
        mlp,
        B::MoeMlp,
        "etp=S(0)",
    );
    expect(
        &p,
        &e(37, "up_proj"),
        Role::MoeExpert,
        mlp,
        B::MoeMlp,
        "etp=S(0)",
    );
    expect(
        &p,
        &e(37, "down_proj"),
        Role::MoeExpert,
        mlp,
        B::MoeMlp,
        "etp=S(1)",
    );
    for (i, owner) in [(0, 0), (31, 0), (32, 1), (37, 1), (64, 2), (127, 3)] {
        assert_eq!(
            p.param(&e(i, "down_proj")).unwrap().ep_owner,
            Some(owner),
            "expert {i}"
        );
    }
    // The owner holds the whole expert (then split by etp); other EP ranks hold nothing.
    assert_eq!(
        local(&p, &e(37, "gate_proj"), &[("ep", 1), ("etp", 1)]),
        [384, 2048]
    );
    assert_eq!(local(&p, &e(37, "down_proj"), &[("ep", 1)]), [2048, 384]);
    assert_eq!(local(&p, &e(37, "gate_proj"), &[("ep", 0)]), [0, 2048]);
    // Per-expert weights are never the fused-expert TP hazard.
    assert!(lints_with(&p, "fused-expert-tp").is_empty());
    // Without EP there is no owner.
    let p = plan(qwen3_moe_per_expert(), &input(axes(1, 1, 1, 1)));
    assert!(p.params.iter().all(|pp| pp.ep_owner.is_none()));
    assert_fully_covered(&p, "qwen3-30b per-expert tp1");
}

// ---------------------------------------------------------------- DeepSeek-V3

#[test]
fn deepseek_v3_mla_dense_and_moe_layers() {
    let p = plan(deepseek(), &input(axes(8, 1, 8, 1)));
    assert_clean(&p, "deepseek tp8 ep8");
    assert_fully_covered(&p, "deepseek tp8 ep8");
    deepseek_mla_attention(&p);
    deepseek_dense_and_moe_mlp(&p);
    use BoundaryType as B;
    expect(
        &p,
        "model.embed_tokens.weight",
        Role::Embed,
        "model.embed_tokens",
        B::Embed,
        "tp=S(0)",
    );
    expect(
        &p,
        "lm_head.weight",
        Role::LmHead,
        "lm_head",
        B::LmHead,
        "tp=S(0)",
    );
    assert_eq!(local(&p, "lm_head.weight", &[("tp", 0)]), [16160, 7168]);
}

/// DeepSeek-V3's MLA attention on tp 8 as torchtitan shards it.
fn deepseek_mla_attention(p: &ShardingPlan) {
    use BoundaryType as B;
    let attn = "model.layers.0.self_attn";
    // torchtitan: wq_a/wkv_a NoParallel, wq_b/wkv_b colwise, wo rowwise, q/kv norms replicated.
    expect(
        p,
        &format!("{attn}.q_a_proj.weight"),
        Role::Replicated,
        attn,
        B::Attention,
        "R",
    );
    expect(
        p,
        &format!("{attn}.kv_a_proj_with_mqa.weight"),
        Role::Replicated,
        attn,
        B::Attention,
        "R",
    );
    expect(
        p,
        &format!("{attn}.q_b_proj.weight"),
        Role::Colwise,
        attn,
        B::Attention,
        "tp=S(0)",
    );
    expect(
        p,
        &format!("{attn}.kv_b_proj.weight"),
        Role::Colwise,
        attn,
        B::Attention,
        "tp=S(0)",
    );
    expect(
        p,
        &format!("{attn}.o_proj.weight"),
        Role::Rowwise,
        attn,
        B::Attention,
        "tp=S(1)",
    );
    for n in ["q_a_layernorm", "kv_a_layernorm"] {
        expect(
            p,
            &format!("{attn}.{n}.weight"),
            Role::Norm,
            &format!("{attn}.{n}"),
            B::Norm,
            "R",
        );
    }
    // Shapes: q_b [24576,1536], kv_b [32768,512], o [7168,16384]; q_a/kv_a unsplit.
    let l = |n: &str, c: &[(&str, usize)]| local(p, &format!("{attn}.{n}.weight"), c);
    assert_eq!(l("q_b_proj", &[("tp", 7)]), [3072, 1536]);
    assert_eq!(l("kv_b_proj", &[("tp", 7)]), [4096, 512]);
    assert_eq!(l("o_proj", &[("tp", 7)]), [7168, 2048]);
    assert_eq!(l("q_a_proj", &[("tp", 7)]), [1536, 7168]);
    assert_eq!(l("kv_a_proj_with_mqa", &[("tp", 7)]), [576, 7168]);
}

/// DeepSeek-V3's dense MLP layers (0-2) and its first MoE layer (3) on tp 8, ep 8.
fn deepseek_dense_and_moe_mlp(p: &ShardingPlan) {
    use BoundaryType as B;
    // Layers 0-2 are dense (first_k_dense_replace = 3).
    let mlp2 = "model.layers.2.mlp";
    expect(
        p,
        &format!("{mlp2}.gate_proj.weight"),
        Role::Colwise,
        mlp2,
        B::Mlp,
        "tp=S(0)",
    );
    expect(
        p,
        &format!("{mlp2}.down_proj.weight"),
        Role::Rowwise,
        mlp2,
        B::Mlp,
        "tp=S(1)",
    );

    // Layer 3 is MoE: routed experts EP S(0), router replicated, its correction bias frozen,
    // shared experts a colwise/rowwise mlp boundary of their own.
    let mlp = "model.layers.3.mlp";
    let shared = "model.layers.3.mlp.shared_experts";
    expect(
        p,
        &format!("{mlp}.experts.gate_up_proj"),
        Role::MoeExpert,
        mlp,
        B::MoeMlp,
        "ep=S(0)",
    );
    expect(
        p,
        &format!("{mlp}.experts.down_proj"),
        Role::MoeExpert,
        mlp,
        B::MoeMlp,
        "ep=S(0)",
    );
    expect(
        p,
        &format!("{mlp}.gate.weight"),
        Role::MoeGate,
        mlp,
        B::MoeMlp,
        "R",
    );
    let bias = p
        .param(&format!("{mlp}.gate.e_score_correction_bias"))
        .unwrap();
    assert!(!bias.trainable);
    assert_eq!(bias.role, Role::Skip);
    assert_eq!(bias.boundary, None);
    for (w, pl, role_dim) in [("gate_proj", "tp=S(0)", 256), ("up_proj", "tp=S(0)", 256)] {
        expect(
            p,
            &format!("{shared}.{w}.weight"),
            Role::SharedExpert,
            shared,
            B::Mlp,
            pl,
        );
        assert_eq!(
            local(p, &format!("{shared}.{w}.weight"), &[("tp", 1)]),
            [role_dim, 7168]
        );
    }
    expect(
        p,
        &format!("{shared}.down_proj.weight"),
        Role::SharedExpert,
        shared,
        B::Mlp,
        "tp=S(1)",
    );
    assert_eq!(
        local(p, &format!("{mlp}.experts.gate_up_proj"), &[("ep", 7)]),
        [32, 4096, 7168]
    );
}

#[test]
fn deepseek_v3_mtp_layer_is_fully_covered() {
    let p = plan(deepseek(), &input(axes(8, 1, 8, 1)));
    use BoundaryType as B;
    let m = "model.layers.61";
    expect(
        &p,
        &format!("{m}.embed_tokens.weight"),
        Role::Embed,
        &format!("{m}.embed_tokens"),
        B::Embed,
        "tp=S(0)",
    );
    for n in ["enorm", "hnorm", "shared_head.norm"] {
        expect(
            &p,
            &format!("{m}.{n}.weight"),
            Role::Norm,
            &format!("{m}.{n}"),
            B::Norm,
            "R",
        );
    }
    expect(
        &p,
        &format!("{m}.eh_proj.weight"),
        Role::Replicated,
        &format!("{m}.eh_proj"),
        B::Replicated,
        "R",
    );
    expect(
        &p,
        &format!("{m}.shared_head.head.weight"),
        Role::LmHead,
        &format!("{m}.shared_head.head"),
        B::LmHead,
        "tp=S(0)",
    );
    // The MTP decoder body is a full MoE layer.
    expect(
        &p,
        &format!("{m}.self_attn.q_b_proj.weight"),
        Role::Colwise,
        &format!("{m}.self_attn"),
        B::Attention,
        "tp=S(0)",
    );
    expect(
        &p,
        &format!("{m}.mlp.experts.down_proj"),
        Role::MoeExpert,
        &format!("{m}.mlp"),
        B::MoeMlp,
        "ep=S(0)",
    );
    let mtp: Vec<_> = p
        .params
        .iter()
        .filter(|pp| pp.name.starts_with("model.layers.61."))
        .collect();
    assert!(mtp.len() > 15, "{}", mtp.len());
    assert!(
        mtp.iter()
            .filter(|pp| pp.trainable)
            .all(|pp| pp.boundary.is_some())
    );
    assert!(
        p.lints.iter().all(|l| !l
            .param
            .as_deref()
            .unwrap_or("")
            .starts_with("model.layers.61.")),
        "{:?}",
        p.lints
    );
    assert_clean(&p, "deepseek mtp");
}

#[test]
fn deepseek_v3_per_expert_with_mtp() {
    let ir = load(
        "deepseek-v3.json",
        ModelOptions {
            expert_layout: ExpertLayout::PerExpert,
            include_mtp: true,
            ..ModelOptions::default()
        },
    );
    let p = plan(&ir, &input(axes(4, 1, 32, 4)));
    assert_clean(&p, "deepseek per-expert");
    assert_fully_covered(&p, "deepseek per-expert");
    let n = "model.layers.61.mlp.experts.255.down_proj.weight";
    let pp = p.param(n).unwrap();
    assert_eq!(pp.role, Role::MoeExpert);
    assert_eq!(pp.boundary.as_deref(), Some("model.layers.61.mlp"));
    assert_eq!(pp.ep_owner, Some(31));
    assert_eq!(format_axis_placements(&pp.placements), "etp=S(1)");
    assert_eq!(local(&p, n, &[("ep", 31), ("etp", 3)]), [7168, 512]);
}

// ---------------------------------------------------------------- coverage on every family

#[test]
fn every_family_is_fully_covered_at_tp1_and_tp_gt_1() {
    let cases: [(&str, &ModelIr, PlanAxes); 9] = [
        ("llama tp1", llama(), axes(1, 1, 1, 1)),
        ("llama tp8 cp2", llama(), axes(8, 2, 1, 1)),
        ("qwen3-14b tp1", qwen3_dense(), axes(1, 1, 1, 1)),
        ("qwen3-14b tp4", qwen3_dense(), axes(4, 1, 1, 1)),
        ("qwen3-30b tp1", qwen3_moe(), axes(1, 1, 1, 1)),
        ("qwen3-30b tp4 ep8", qwen3_moe(), axes(4, 1, 8, 1)),
        (
            "qwen3-30b per-expert tp2 ep2",
            qwen3_moe_per_expert(),
            axes(2, 1, 2, 1),
        ),
        ("deepseek tp1", deepseek(), axes(1, 1, 1, 1)),
        ("deepseek tp16 ep16", deepseek(), axes(16, 1, 16, 1)),
    ];
    for (what, ir, ax) in cases {
        let p = plan(ir, &input(ax));
        assert_clean(&p, what);
        assert_fully_covered(&p, what);
        assert_eq!(p.params.len(), ir.params.len(), "{what}");
        let names: Vec<&str> = p.params.iter().map(|x| x.name.as_str()).collect();
        let model_names: Vec<&str> = ir.params.iter().map(|x| x.name.as_str()).collect();
        assert_eq!(names, model_names, "{what}: model order kept");
        // Roles never fall through to SKIP for trainable parameters.
        assert!(
            p.params
                .iter()
                .all(|x| !x.trainable || x.role != Role::Skip),
            "{what}"
        );
    }
}

// ---------------------------------------------------------------- determinism

#[test]
fn plans_are_deterministic_and_digests_track_overrides() {
    let ax = axes(4, 1, 4, 1);
    let a = plan(qwen3_moe(), &input(ax.clone()));
    let b = plan(qwen3_moe(), &input(ax.clone()));
    assert_eq!(a, b);
    assert_eq!(a.digest(), b.digest());
    assert_eq!(a.digest().len(), 64);

    let o1 = ov(
        "match = \"model.layers.*.mlp\"\nout_dst = { tp = \"replicate\" }",
        "t.toml:1",
    );
    let o2 = ov(
        "match = \"model.layers.*.mlp\"\nout_dst = { tp = \"shard(1)\" }",
        "t.toml:1",
    );
    let with1 = plan(qwen3_moe(), &with_overrides(ax.clone(), vec![o1.clone()]));
    let with1_again = plan(qwen3_moe(), &with_overrides(ax.clone(), vec![o1]));
    let with2 = plan(qwen3_moe(), &with_overrides(ax.clone(), vec![o2]));
    assert_eq!(with1.digest(), with1_again.digest());
    assert_ne!(with1.digest(), a.digest());
    assert_ne!(with1.digest(), with2.digest());
    let b = with1
        .boundaries
        .iter()
        .find(|b| b.module == "model.layers.0.mlp")
        .unwrap();
    assert_eq!(b.source, BoundarySource::Overridden);
    assert_eq!(b.overrides, ["t.toml:1"]);
    assert_eq!(
        format_axis_placements(&b.out_dst.as_ref().unwrap()["output"]),
        "tp=R"
    );
    // A different plan axis changes the digest too.
    assert_ne!(
        plan(qwen3_moe(), &input(axes(2, 1, 4, 1))).digest(),
        a.digest()
    );
}

// ---------------------------------------------------------------- lint errors

#[test]
fn indivisible_tp_names_param_boundary_axis_and_fix() {
    let p = plan(llama(), &input(axes(3, 1, 1, 1)));
    assert!(p.has_errors());
    let q = "model.layers.0.self_attn.q_proj.weight";
    let l = lints_with(&p, "indivisible-shard")
        .into_iter()
        .find(|l| l.param.as_deref() == Some(q))
        .expect("q_proj is 4096 rows, not divisible by 3");
    assert_eq!(l.severity, Severity::Error);
    assert_eq!(l.boundary.as_deref(), Some("model.layers.0.self_attn"));
    assert_eq!(l.axis.as_deref(), Some("tp"));
    assert!(
        l.message.contains(q) && l.message.contains("shape[0]=4096"),
        "{l}"
    );
    assert!(l.message.contains("tp size 3"), "{l}");
    assert!(l.fix.contains("tp") && l.fix.contains("4096"), "{l}");
    // o_proj is split on dim 1.
    let o = "model.layers.0.self_attn.o_proj.weight";
    let l = lints_with(&p, "indivisible-shard")
        .into_iter()
        .find(|l| l.param.as_deref() == Some(o))
        .unwrap();
    assert!(l.message.contains("shape[1]=4096"), "{l}");
    // The vocab divides (128256 = 3 x 42752): no lint for the embedding.
    assert!(
        lints_with(&p, "indivisible-shard")
            .iter()
            .all(|l| l.param.as_deref() != Some("model.embed_tokens.weight"))
    );
    let heads = lints_with(&p, "heads-not-divisible");
    assert_eq!(heads.len(), 1);
    assert_eq!(heads[0].axis.as_deref(), Some("tp"));
    assert!(
        heads[0].message.contains("32") && heads[0].message.contains("tp 3"),
        "{}",
        heads[0]
    );
    assert!(!heads[0].fix.is_empty());
    assert_eq!(lints_with(&p, "kv-heads-not-divisible").len(), 1);
    // The rendered form carries the context and the fix.
    let text = lints_with(&p, "indivisible-shard")[0].to_string();
    assert!(text.starts_with("error[indivisible-shard]: "), "{text}");
    assert!(text.contains("(param ") && text.contains("boundary ") && text.contains("axis tp"));
    assert!(text.contains("\n    fix: "), "{text}");
}

#[test]
fn param_claimed_by_two_boundaries() {
    let overrides = vec![
        ov(
            "match = \"model.layers.0.mlp\"\nparams = { \"gate_proj.weight\" = { tp = \"shard(0)\" } }",
            "s.toml:10",
        ),
        ov(
            "match = \"model.layers.0.mlp.gate_proj\"\nparams = { weight = { tp = \"shard(0)\" } }",
            "s.toml:14",
        ),
    ];
    let p = plan(llama(), &with_overrides(axes(2, 1, 1, 1), overrides));
    let name = "model.layers.0.mlp.gate_proj.weight";
    let twice = lints_with(&p, "param-claimed-twice");
    assert_eq!(twice.len(), 1, "{:?}", p.lints);
    let l = twice[0];
    assert_eq!(l.severity, Severity::Error);
    assert_eq!(l.param.as_deref(), Some(name));
    assert!(l.boundary.is_some());
    assert!(l.message.contains(name), "{l}");
    assert!(
        l.message
            .contains("2 boundaries: model.layers.0.mlp and model.layers.0.mlp.gate_proj"),
        "{l}"
    );
    assert!(l.fix.contains("exactly one boundary"), "{l}");
    // The inserted boundary exists; the mlp override dropped up/down (warning), which are
    // then uncovered.
    let ins = p
        .boundaries
        .iter()
        .find(|b| b.module == "model.layers.0.mlp.gate_proj")
        .unwrap();
    assert_eq!(ins.source, BoundarySource::Inserted);
    let drops = lints_with(&p, "override-drops-params");
    assert_eq!(drops.len(), 1);
    assert_eq!(drops[0].severity, Severity::Warning);
    assert!(drops[0].message.contains("up_proj.weight") && drops[0].message.contains("s.toml:10"));
    let uncovered: Vec<_> = lints_with(&p, "uncovered-param")
        .iter()
        .filter_map(|l| l.param.clone())
        .collect();
    assert_eq!(
        uncovered,
        [
            "model.layers.0.mlp.up_proj.weight",
            "model.layers.0.mlp.down_proj.weight"
        ]
    );
}

#[test]
fn nested_override_wins_over_derived_ancestor() {
    // A single explicit claim on a nested module moves the param there (no error).
    let overrides = vec![ov(
        "match = \"model.layers.0.mlp.down_proj\"\nparams = { weight = { tp = \"replicate\" } }",
        "s.toml:3",
    )];
    let p = plan(llama(), &with_overrides(axes(2, 1, 1, 1), overrides));
    assert_clean(&p, "nested override");
    assert_fully_covered(&p, "nested override");
    let d = p.param("model.layers.0.mlp.down_proj.weight").unwrap();
    assert_eq!(d.boundary.as_deref(), Some("model.layers.0.mlp.down_proj"));
    assert_eq!(format_axis_placements(&d.placements), "tp=R");
    assert!(
        d.notes
            .iter()
            .any(|n| n.contains("dropped from derived boundary"))
    );
    let mlp = p
        .boundaries
        .iter()
        .find(|b| b.module == "model.layers.0.mlp")
        .unwrap();
    assert_eq!(mlp.params.len(), 2);
}

#[test]
fn uncovered_trainable_param_after_clearing_attention() {
    let overrides = vec![ov(
        "match = \"model.layers.0.self_attn\"\nparams = \"none\"",
        "s.toml:7",
    )];
    let p = plan(
        llama(),
        &with_overrides(axes(2, 1, 1, 1), overrides.clone()),
    );
    let unc = lints_with(&p, "uncovered-param");
    let names: Vec<&str> = unc.iter().filter_map(|l| l.param.as_deref()).collect();
    assert_eq!(
        names,
        ["q_proj", "k_proj", "v_proj", "o_proj"]
            .map(|x| format!("model.layers.0.self_attn.{x}.weight"))
    );
    for l in &unc {
        assert_eq!(l.severity, Severity::Error);
        assert!(l.message.contains(l.param.as_deref().unwrap()), "{l}");
        assert!(l.message.contains("not sharded by any boundary"), "{l}");
        assert!(
            l.fix.contains("[[plan.override]]") && l.fix.contains("allow_uncovered"),
            "{l}"
        );
    }
    assert!(
        p.param("model.layers.0.self_attn.q_proj.weight")
            .unwrap()
            .boundary
            .is_none()
    );
    assert!(
        p.param("model.layers.1.self_attn.q_proj.weight")
            .unwrap()
            .boundary
            .is_some()
    );
    // allow_uncovered downgrades them to warnings.
    let mut i = with_overrides(axes(2, 1, 1, 1), overrides);
    i.allow_uncovered = true;
    let p = plan(llama(), &i);
    assert!(!p.has_errors());
    assert_eq!(lints_with(&p, "uncovered-param").len(), 4);
    assert!(
        lints_with(&p, "uncovered-param")
            .iter()
            .all(|l| l.severity == Severity::Warning)
    );
}

#[test]
fn unknown_and_dp_axes_in_overrides_are_parse_errors() {
    let raw = |t: &str| -> RawOverride { toml::from_str(t).unwrap() };
    let e = PlanOverride::parse(
        &raw("match = \"model.layers.*.mlp\"\nparams = { \"gate_proj.weight\" = { tq = \"shard(0)\" } }"),
        "s.toml:5",
    )
    .unwrap_err();
    assert!(
        e.contains("unknown axis 'tq'") && e.contains("gate_proj.weight"),
        "{e}"
    );
    assert!(e.contains("tp, cp, ep, etp"), "{e}");
    for dp in ["dp_shard", "dp_replicate", "edp_shard", "dp"] {
        let e = PlanOverride::parse(
            &raw(&format!(
                "match = \"model.layers.*.mlp\"\nout_dst = {{ {dp} = \"shard(1)\" }}"
            )),
            "s.toml:5",
        )
        .unwrap_err();
        assert!(e.contains("DP placement") && e.contains(dp), "{dp}: {e}");
    }
    // Unknown fields of an entry are serde errors.
    assert!(toml::from_str::<RawOverride>("match = \"a\"\nparmas = {}").is_err());
}

#[test]
fn override_that_matches_nothing() {
    let overrides = vec![
        ov(
            "match = \"model.layers.0.self_atn\"\nout_dst = { tp = \"replicate\" }",
            "s.toml:3",
        ),
        ov(
            "match = \"model.layers.0.self_attn.q_proj.weight\"\nout_dst = { tp = \"replicate\" }",
            "s.toml:7",
        ),
        ov("match = \"model.blocks.*.attn\"\nparams = {}", "s.toml:11"),
    ];
    let p = plan(llama(), &with_overrides(axes(2, 1, 1, 1), overrides));
    let none = lints_with(&p, "override-matches-nothing");
    assert_eq!(none.len(), 3, "{:?}", p.lints);
    for l in &none {
        assert_eq!(l.severity, Severity::Error);
        assert!(l.fix.contains("--json") && l.fix.contains("glob"), "{l}");
    }
    assert_eq!(none[0].boundary.as_deref(), Some("model.layers.0.self_atn"));
    assert!(
        none[0].message.contains("s.toml:3") && none[0].message.contains("matches no module"),
        "{}",
        none[0]
    );
    assert!(
        none[1].message.contains("is a parameter, not a module")
            && none[1].message.contains("s.toml:7"),
        "{}",
        none[1]
    );
    assert_eq!(none[2].boundary.as_deref(), Some("model.blocks.*.attn"));
    // Nothing else changed.
    assert!(
        p.boundaries
            .iter()
            .all(|b| b.source == BoundarySource::Derived)
    );
}

#[test]
fn ep_without_moe_and_experts_not_divisible() {
    let p = plan(llama(), &input(axes(1, 1, 2, 1)));
    let l = lints_with(&p, "ep-without-moe");
    assert_eq!(l.len(), 1);
    assert_eq!(l[0].severity, Severity::Error);
    assert_eq!(l[0].axis.as_deref(), Some("ep"));
    assert!(
        l[0].message.contains("ep = 2") && l[0].fix.contains("ep = 1"),
        "{}",
        l[0]
    );

    let p = plan(qwen3_moe(), &input(axes(1, 1, 3, 1)));
    let l = lints_with(&p, "experts-not-divisible");
    assert_eq!(l.len(), 1);
    assert_eq!(l[0].axis.as_deref(), Some("ep"));
    assert!(
        l[0].message.contains("128") && l[0].message.contains("ep 3"),
        "{}",
        l[0]
    );
    assert!(l[0].fix.contains("128"));
    // The fused expert tensors are flagged individually as well.
    let gu = "model.layers.0.mlp.experts.gate_up_proj";
    let ind = lints_with(&p, "indivisible-shard");
    let i = ind.iter().find(|l| l.param.as_deref() == Some(gu)).unwrap();
    assert_eq!(i.axis.as_deref(), Some("ep"));
    assert_eq!(i.boundary.as_deref(), Some("model.layers.0.mlp"));
    assert!(i.message.contains("shape[0]=128"), "{i}");
    assert_eq!(ind.len(), 96, "gate_up and down of 48 layers");
}

#[test]
fn seq_len_must_divide_by_twice_cp() {
    let mut i = input(axes(1, 2, 1, 1));
    i.seq_len = 4098;
    let p = plan(llama(), &i);
    let l = lints_with(&p, "seq-not-divisible");
    assert_eq!(l.len(), 1);
    assert_eq!(l[0].axis.as_deref(), Some("cp"));
    assert!(
        l[0].message.contains("4098") && l[0].message.contains("2*cp = 4"),
        "{}",
        l[0]
    );
    assert!(!l[0].fix.is_empty());
    i.seq_len = 4096;
    assert!(lints_with(&plan(llama(), &i), "seq-not-divisible").is_empty());
    // Attention boundaries get the CP wrapper flag only with cp > 1.
    let p = plan(llama(), &i);
    let a = p
        .boundaries
        .iter()
        .find(|b| b.module == "model.layers.0.self_attn")
        .unwrap();
    assert!(a.flags.needs_cp_attn);
}

#[test]
fn when_gate_applies_only_with_its_axis() {
    let entry = ov(
        "match = \"model.layers.*.self_attn\"\nwhen = \"cp\"\nout_dst = { tp = \"replicate\" }",
        "s.toml:20",
    );
    let attn = |p: &ShardingPlan| {
        p.boundaries
            .iter()
            .find(|b| b.module == "model.layers.3.self_attn")
            .cloned()
            .unwrap()
    };
    // cp = 1: ignored entirely.
    let off = plan(
        llama(),
        &with_overrides(axes(2, 1, 1, 1), vec![entry.clone()]),
    );
    assert_clean(&off, "when cp, cp=1");
    assert_eq!(off, plan(llama(), &input(axes(2, 1, 1, 1))));
    let b = attn(&off);
    assert_eq!(b.source, BoundarySource::Derived);
    assert!(b.overrides.is_empty());
    assert_eq!(
        format_axis_placements(&b.out_dst.unwrap()["hidden_states"]),
        "tp=S(1)"
    );
    // cp = 2: applied to every attention boundary.
    let on = plan(llama(), &with_overrides(axes(2, 2, 1, 1), vec![entry]));
    assert_clean(&on, "when cp, cp=2");
    let b = attn(&on);
    assert_eq!(b.source, BoundarySource::Overridden);
    assert_eq!(b.overrides, ["s.toml:20"]);
    let out = b.out_dst.unwrap();
    assert_eq!(out.len(), 1);
    assert_eq!(format_axis_placements(&out["output"]), "tp=R");
    assert_eq!(
        on.boundaries
            .iter()
            .filter(|b| b.source == BoundarySource::Overridden)
            .count(),
        32
    );
}

#[test]
fn same_match_entries_merge_fieldwise_later_wins() {
    let overrides = vec![
        ov(
            "match = \"model.layers.0.mlp\"\nin_src = { hidden_states = { tp = \"replicate\" } }\nout_dst = { tp = \"replicate\" }",
            "s.toml:1",
        ),
        ov(
            "match = \"model.layers.0.mlp\"\nout_dst = \"none\"",
            "s.toml:5",
        ),
    ];
    let p = plan(llama(), &with_overrides(axes(2, 1, 1, 1), overrides));
    assert_clean(&p, "merged");
    let b = p
        .boundaries
        .iter()
        .find(|b| b.module == "model.layers.0.mlp")
        .unwrap();
    assert_eq!(b.out_dst, None);
    assert_eq!(
        format_axis_placements(&b.in_src.as_ref().unwrap()["hidden_states"]),
        "tp=R"
    );
    assert_eq!(b.overrides, ["s.toml:1 + s.toml:5"]);
    // Params were not declared: the derived ones are kept.
    assert_eq!(b.params.len(), 3);
}
