//! Pass 1: parameter role classification by segment-aware name rules (first match wins).
//!
//! Rule sources in priority order: the per-architecture table, then the default table, then
//! `Skip`. Frozen parameters are always `Skip`. A pattern that contains a `.` is a raw
//! substring of the lower-cased FQN; a dot-less pattern is matched against single name
//! segments, either exactly or as a substring, as the rule says.

use crate::model::ModelFamily;
use serde::{Deserialize, Serialize};
use std::borrow::Cow;

/// What a parameter is, for sharding purposes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Role {
    /// Column-parallel linear (q/k/v/gate/up): TP Shard(0).
    Colwise,
    /// Row-parallel linear (o/down): TP Shard(1).
    Rowwise,
    /// Norm weight: replicated.
    Norm,
    /// Token embedding: TP Shard(0) on the vocab dim.
    Embed,
    /// Output head: TP Shard(0) on the vocab dim.
    LmHead,
    /// MoE router: replicated.
    MoeGate,
    /// Routed experts: EP Shard(0), TP colwise/rowwise on the expert TP axis.
    MoeExpert,
    /// Shared expert: EP replicated, TP colwise/rowwise.
    SharedExpert,
    /// Fused q/k/v projection: TP Shard(0).
    FusedQkv,
    /// Fused gate/up projection: TP Shard(0).
    FusedGateUp,
    /// Unmatched bias: replicated.
    Bias,
    /// Forced replicate on every axis (family rules only).
    Replicated,
    /// Needs a special handler (gated delta etc.).
    Special,
    /// Not matched, or frozen: not sharded by any boundary.
    Skip,
}

impl Role {
    /// Stable upper-case name, as in HyperParallel.
    pub fn name(self) -> &'static str {
        match self {
            Role::Colwise => "COLWISE",
            Role::Rowwise => "ROWWISE",
            Role::Norm => "NORM",
            Role::Embed => "EMBED",
            Role::LmHead => "LM_HEAD",
            Role::MoeGate => "MOE_GATE",
            Role::MoeExpert => "MOE_EXPERT",
            Role::SharedExpert => "SHARED_EXPERT",
            Role::FusedQkv => "FUSED_QKV",
            Role::FusedGateUp => "FUSED_GATE_UP",
            Role::Bias => "BIAS",
            Role::Replicated => "REPLICATED",
            Role::Special => "SPECIAL",
            Role::Skip => "SKIP",
        }
    }

    /// Roles that split the output dim of a linear (the "colwise" family of boundary inference).
    pub fn is_colwise_like(self) -> bool {
        matches!(self, Role::Colwise | Role::FusedQkv | Role::FusedGateUp)
    }
}

/// A set of roles as a bit mask (one bit per [`Role`] variant, iteration in `Role` order, as
/// a `BTreeSet<Role>` would give).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RoleSet(u16);

impl RoleSet {
    const ALL: [Role; 14] = [
        Role::Colwise,
        Role::Rowwise,
        Role::Norm,
        Role::Embed,
        Role::LmHead,
        Role::MoeGate,
        Role::MoeExpert,
        Role::SharedExpert,
        Role::FusedQkv,
        Role::FusedGateUp,
        Role::Bias,
        Role::Replicated,
        Role::Special,
        Role::Skip,
    ];

    /// Adds `role`.
    pub fn insert(&mut self, role: Role) {
        self.0 |= 1 << role as u16;
    }

    /// Adds every role of `other`.
    pub fn union_with(&mut self, other: RoleSet) {
        self.0 |= other.0;
    }

    /// Whether `role` is in the set.
    pub fn contains(self, role: Role) -> bool {
        self.0 & (1 << role as u16) != 0
    }

    /// Number of roles in the set.
    pub fn len(self) -> usize {
        self.0.count_ones() as usize
    }

    /// True for the empty set.
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The roles in `Role` order.
    pub fn iter(self) -> impl Iterator<Item = Role> {
        Self::ALL.into_iter().filter(move |&r| self.contains(r))
    }
}

impl FromIterator<Role> for RoleSet {
    fn from_iter<I: IntoIterator<Item = Role>>(iter: I) -> Self {
        let mut set = RoleSet::default();
        for r in iter {
            set.insert(r);
        }
        set
    }
}

/// `s` lower-cased (`str::to_lowercase`), borrowed when it has no upper-case letter and is
/// ASCII (parameter and module names nearly always are).
pub fn lowercase(s: &str) -> Cow<'_, str> {
    if s.bytes().all(|b| b.is_ascii() && !b.is_ascii_uppercase()) {
        Cow::Borrowed(s)
    } else {
        Cow::Owned(s.to_lowercase())
    }
}

/// How a dot-less pattern is matched.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MatchMode {
    /// Raw substring of the whole lower-cased FQN (any pattern containing a dot).
    Substring,
    /// Must equal one whole `.`-segment.
    SegmentExact,
    /// Must be a substring of one `.`-segment.
    SegmentSubstring,
}

/// One name rule: any of `patterns` gives `role`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NameRule {
    /// Patterns, lower case.
    pub patterns: Vec<String>,
    /// Role assigned on a match.
    pub role: Role,
    /// Match mode for dot-less patterns.
    pub mode: MatchMode,
}

impl NameRule {
    fn new(patterns: &[&str], role: Role, mode: MatchMode) -> Self {
        Self {
            patterns: patterns.iter().map(|p| p.to_string()).collect(),
            role,
            mode,
        }
    }

    /// The first pattern of this rule that matches the lower-cased `fqn`.
    pub fn matching_pattern(&self, fqn: &str) -> Option<&str> {
        self.patterns
            .iter()
            .find(|p| pattern_matches(p, self.mode, fqn))
            .map(String::as_str)
    }
}

/// Segment-aware pattern match on a lower-cased FQN.
pub fn pattern_matches(pattern: &str, mode: MatchMode, fqn: &str) -> bool {
    if pattern.contains('.') || mode == MatchMode::Substring {
        return fqn.contains(pattern);
    }
    match mode {
        MatchMode::SegmentExact => fqn.split('.').any(|s| s == pattern),
        _ => fqn.split('.').any(|s| s.contains(pattern)),
    }
}

/// The default rules, in priority order (HyperParallel's later table).
pub fn default_rules() -> Vec<NameRule> {
    use MatchMode::*;
    vec![
        NameRule::new(
            &[
                "embed_tokens.weight",
                "wte.weight",
                "tok_embeddings.weight",
                "embed_in.weight",
                "word_embeddings.weight",
            ],
            Role::Embed,
            Substring,
        ),
        NameRule::new(
            &["lm_head.weight", "embed_out.weight", "output_layer.weight"],
            Role::LmHead,
            Substring,
        ),
        NameRule::new(
            &["shared_expert", "shared_experts"],
            Role::SharedExpert,
            SegmentExact,
        ),
        NameRule::new(&["experts"], Role::MoeExpert, SegmentSubstring),
        NameRule::new(
            &[".mlp.gate.", ".router.", "moe_gate", "mlp.router"],
            Role::MoeGate,
            SegmentSubstring,
        ),
        NameRule::new(
            &["fused_qkv", "linear_qkv", "qkv_proj", "query_key_value"],
            Role::FusedQkv,
            SegmentSubstring,
        ),
        NameRule::new(
            &["gate_up_proj", "fused_gate_up", ".w13."],
            Role::FusedGateUp,
            SegmentSubstring,
        ),
        NameRule::new(
            &["a_log", "dt_bias", "gated_delta"],
            Role::Special,
            SegmentSubstring,
        ),
        NameRule::new(
            &["norm", "layernorm", "rmsnorm", "ln_"],
            Role::Norm,
            SegmentSubstring,
        ),
        NameRule::new(
            &[
                "q_proj",
                "k_proj",
                "v_proj",
                "gate_proj",
                "up_proj",
                ".w1.",
                ".w3.",
            ],
            Role::Colwise,
            SegmentSubstring,
        ),
        NameRule::new(&[".bias"], Role::Bias, Substring),
        NameRule::new(
            &["o_proj", "down_proj", ".w2."],
            Role::Rowwise,
            SegmentSubstring,
        ),
    ]
}

/// Rules for multi-token-prediction layers, shared by every family: the MTP projection
/// `eh_proj` is replicated and `shared_head.head` is an output head.
fn mtp_rules() -> Vec<NameRule> {
    vec![
        NameRule::new(&["eh_proj"], Role::Replicated, MatchMode::SegmentExact),
        NameRule::new(
            &["shared_head.head.weight"],
            Role::LmHead,
            MatchMode::Substring,
        ),
    ]
}

/// The per-architecture rules that extend the defaults (checked first).
///
/// DeepSeek-V3 MLA follows torchtitan's plan: the low-rank down projections `q_a_proj` and
/// `kv_a_proj_with_mqa` are replicated (`NoParallel`), `q_b_proj` and `kv_b_proj` are
/// column-parallel. Every family also gets the MTP rules.
pub fn family_rules(family: ModelFamily) -> Vec<NameRule> {
    use MatchMode::*;
    let mut rules = match family {
        ModelFamily::DeepseekV3 => vec![
            NameRule::new(
                &["q_a_proj", "kv_a_proj_with_mqa"],
                Role::Replicated,
                SegmentExact,
            ),
            NameRule::new(&["q_b_proj", "kv_b_proj"], Role::Colwise, SegmentExact),
        ],
        ModelFamily::Llama | ModelFamily::Qwen3 | ModelFamily::Qwen3Moe => Vec::new(),
    };
    rules.extend(mtp_rules());
    rules
}

/// Where a role came from, for `--explain`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RoleReason {
    /// `family rule`, `default rule #N`, `frozen`, `unmatched`.
    pub source: String,
    /// The pattern that matched, if any.
    pub pattern: Option<String>,
}

/// Classifies one parameter. Frozen parameters are `Skip`.
pub fn classify(
    fqn: &str,
    trainable: bool,
    family_rules: &[NameRule],
    defaults: &[NameRule],
) -> (Role, RoleReason) {
    if !trainable {
        return (
            Role::Skip,
            RoleReason {
                source: "frozen (not trainable)".into(),
                pattern: None,
            },
        );
    }
    let lower = lowercase(fqn);
    for (source, rules) in [("family rule", family_rules), ("default rule", defaults)] {
        for (i, rule) in rules.iter().enumerate() {
            if let Some(p) = rule.matching_pattern(&lower) {
                return (
                    rule.role,
                    RoleReason {
                        source: format!("{source} #{}", i + 1),
                        pattern: Some(p.to_string()),
                    },
                );
            }
        }
    }
    (
        Role::Skip,
        RoleReason {
            source: "unmatched by every rule".into(),
            pattern: None,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn role(fqn: &str, family: ModelFamily) -> Role {
        classify(fqn, true, &family_rules(family), &default_rules()).0
    }

    #[test]
    fn default_rules_on_real_names() {
        let f = ModelFamily::Qwen3Moe;
        assert_eq!(role("model.embed_tokens.weight", f), Role::Embed);
        assert_eq!(role("lm_head.weight", f), Role::LmHead);
        assert_eq!(
            role("model.layers.0.self_attn.q_proj.weight", f),
            Role::Colwise
        );
        assert_eq!(
            role("model.layers.0.self_attn.o_proj.weight", f),
            Role::Rowwise
        );
        assert_eq!(
            role("model.layers.0.self_attn.q_norm.weight", f),
            Role::Norm
        );
        assert_eq!(role("model.layers.0.input_layernorm.weight", f), Role::Norm);
        assert_eq!(role("model.layers.0.mlp.gate.weight", f), Role::MoeGate);
        assert_eq!(
            role("model.layers.0.mlp.experts.gate_up_proj", f),
            Role::MoeExpert
        );
        assert_eq!(
            role("model.layers.0.mlp.experts.7.down_proj.weight", f),
            Role::MoeExpert
        );
        assert_eq!(
            role("model.layers.0.mlp.gate_proj.weight", f),
            Role::Colwise
        );
        assert_eq!(
            role("model.layers.0.mlp.down_proj.weight", f),
            Role::Rowwise
        );
        assert_eq!(
            role("model.layers.0.self_attn.q_proj.bias", f),
            Role::Colwise
        );
        assert_eq!(role("model.layers.0.mlp.fc.bias", f), Role::Bias);
    }

    #[test]
    fn segment_modes() {
        // `shared_experts` is exact-segment: a module called `my_shared_experts_x` is not.
        let f = ModelFamily::DeepseekV3;
        assert_eq!(
            role("model.layers.3.mlp.shared_experts.up_proj.weight", f),
            Role::SharedExpert
        );
        assert_eq!(
            role("model.layers.3.mlp.shared_experts_x.up_proj.weight", f),
            Role::MoeExpert
        );
        // `.mlp.gate.` needs the dots: gate_proj is not the router.
        assert_eq!(
            role("model.layers.0.mlp.gate_proj.weight", f),
            Role::Colwise
        );
    }

    #[test]
    fn deepseek_family_rules() {
        let f = ModelFamily::DeepseekV3;
        assert_eq!(
            role("model.layers.0.self_attn.q_a_proj.weight", f),
            Role::Replicated
        );
        assert_eq!(
            role("model.layers.0.self_attn.kv_a_proj_with_mqa.weight", f),
            Role::Replicated
        );
        assert_eq!(
            role("model.layers.0.self_attn.q_b_proj.weight", f),
            Role::Colwise
        );
        assert_eq!(
            role("model.layers.0.self_attn.kv_b_proj.weight", f),
            Role::Colwise
        );
        assert_eq!(
            role("model.layers.0.self_attn.q_a_layernorm.weight", f),
            Role::Norm
        );
        assert_eq!(
            role("model.layers.61.shared_head.head.weight", f),
            Role::LmHead
        );
        assert_eq!(role("model.layers.61.eh_proj.weight", f), Role::Replicated);
        // Without the family table, MLA projections are unmatched.
        assert_eq!(
            classify(
                "model.layers.0.self_attn.q_a_proj.weight",
                true,
                &[],
                &default_rules()
            )
            .0,
            Role::Skip
        );
    }

    #[test]
    fn role_set_iterates_in_role_order() {
        let all: RoleSet = RoleSet::ALL.into_iter().collect();
        assert_eq!(all.len(), RoleSet::ALL.len());
        let mut sorted = RoleSet::ALL.to_vec();
        sorted.sort();
        assert_eq!(
            sorted,
            RoleSet::ALL,
            "ALL lists the roles in their Ord order"
        );
        let set: RoleSet = [Role::Skip, Role::Colwise, Role::Norm]
            .into_iter()
            .collect();
        let v: Vec<Role> = set.iter().collect();
        assert_eq!(v, [Role::Colwise, Role::Norm, Role::Skip]);
        assert!(set.contains(Role::Norm) && !set.contains(Role::Bias));
        assert!(RoleSet::default().is_empty());
    }

    #[test]
    fn lowercase_borrows_plain_names() {
        assert!(matches!(
            lowercase("model.layers.0.q_proj"),
            Cow::Borrowed(_)
        ));
        assert_eq!(lowercase("Model.LM_Head"), "model.lm_head");
        // Non-ASCII goes through `to_lowercase` (the Kelvin sign lower-cases to ASCII 'k').
        assert_eq!(lowercase("\u{212A}_proj"), "k_proj");
    }

    #[test]
    fn frozen_is_skip() {
        let (r, why) = classify(
            "model.layers.3.mlp.gate.e_score_correction_bias",
            false,
            &[],
            &default_rules(),
        );
        assert_eq!(r, Role::Skip);
        assert!(why.source.contains("frozen"));
    }
}
