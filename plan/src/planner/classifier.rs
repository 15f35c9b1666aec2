//! Pass 1 over a whole model: [`roles::classify`] with each family's rules built once and the
//! result remembered per name *shape*, the lower-cased name with every all-digit segment
//! replaced by `#` (`model.layers.#.mlp.experts.#.down_proj.weight`). exp-d's 55k per-expert
//! parameters have a few dozen shapes, so the rules run a few dozen times, not 55k.
//!
//! Why the shape decides the role: a pattern can only match text of an all-digit segment
//! with a run of its own dot-free characters that is all digits. When no such run exists in
//! any pattern (every `.`-separated piece of a pattern that holds a digit also holds a
//! non-digit, as in `.w1.` or `w13`) and no pattern holds `#`, no occurrence of a pattern
//! touches an all-digit segment or its `#`, so a pattern matches the name exactly when it
//! matches its shape, in every match mode. The classifier checks this on its rules and
//! classifies every name directly when it does not hold.

use super::roles::{self, NameRule, Role, RoleReason, lowercase};
use crate::model::ModelFamily;
use rustc_hash::FxHashMap;

/// Classifies parameter names by the family rules, then the default rules.
#[derive(Debug, Clone)]
pub struct RoleClassifier {
    family: Vec<NameRule>,
    defaults: Vec<NameRule>,
    /// Results by name shape; `None` when a rule's pattern could see digits (no memo).
    memo: Option<FxHashMap<String, (Role, RoleReason)>>,
    /// Scratch buffer for the shape of the name being classified.
    shape: String,
}

impl RoleClassifier {
    /// The classifier of `family` (its rules, then the defaults).
    pub fn new(family: ModelFamily) -> Self {
        Self::with_rules(roles::family_rules(family), roles::default_rules())
    }

    /// A classifier over explicit rule tables.
    pub fn with_rules(family: Vec<NameRule>, defaults: Vec<NameRule>) -> Self {
        let digit_blind = family
            .iter()
            .chain(&defaults)
            .flat_map(|r| &r.patterns)
            .all(|p| digit_blind(p));
        RoleClassifier {
            family,
            defaults,
            memo: digit_blind.then(FxHashMap::default),
            shape: String::new(),
        }
    }

    /// The role of the parameter `fqn`, with the reason: what [`roles::classify`] gives.
    pub fn classify(&mut self, fqn: &str, trainable: bool) -> (Role, RoleReason) {
        let Some(memo) = self.memo.as_mut().filter(|_| trainable) else {
            return roles::classify(fqn, trainable, &self.family, &self.defaults);
        };
        name_shape(&lowercase(fqn), &mut self.shape);
        if let Some(hit) = memo.get(self.shape.as_str()) {
            return hit.clone();
        }
        let got = roles::classify(fqn, trainable, &self.family, &self.defaults);
        memo.insert(self.shape.clone(), got.clone());
        got
    }
}

/// Whether `pattern` cannot tell one all-digit segment from another: no `#`, and every
/// `.`-separated piece that holds an ASCII digit also holds another character.
fn digit_blind(pattern: &str) -> bool {
    !pattern.contains('#')
        && pattern.split('.').all(|piece| {
            !piece.bytes().any(|b| b.is_ascii_digit()) || piece.bytes().any(|b| !b.is_ascii_digit())
        })
}

/// Writes `lower` into `out` with every non-empty all-ASCII-digit segment replaced by `#`.
fn name_shape(lower: &str, out: &mut String) {
    out.clear();
    for (i, seg) in lower.split('.').enumerate() {
        if i > 0 {
            out.push('.');
        }
        if !seg.is_empty() && seg.bytes().all(|b| b.is_ascii_digit()) {
            out.push('#');
        } else {
            out.push_str(seg);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::planner::roles::MatchMode;

    #[test]
    fn shapes_replace_digit_segments_only() {
        let mut s = String::new();
        name_shape("model.layers.12.mlp.experts.7.w13.weight", &mut s);
        assert_eq!(s, "model.layers.#.mlp.experts.#.w13.weight");
        name_shape("a..1x.0", &mut s);
        assert_eq!(s, "a..1x.#");
    }

    #[test]
    fn digit_blind_patterns() {
        for p in [".w1.", "w13", "experts", ".mlp.gate.", "ln_", ""] {
            assert!(digit_blind(p), "{p}");
        }
        for p in ["1", "layers.3", ".0.", "a#b"] {
            assert!(!digit_blind(p), "{p}");
        }
    }

    /// The memo gives what the rules give, on every family and on names that differ only in
    /// their digit segments (expert and layer indices).
    #[test]
    fn memo_agrees_with_the_rules() {
        let names = [
            "model.layers.0.self_attn.q_a_proj.weight",
            "model.layers.1.mlp.experts.7.down_proj.weight",
            "model.layers.2.mlp.experts.7.down_proj.weight",
            "model.layers.1.mlp.experts.17.w1.weight",
            "model.layers.1.mlp.experts.17.w13.weight",
            "model.layers.3.mlp.shared_experts.up_proj.weight",
            "model.layers.3.mlp.gate.weight",
            "model.layers.61.shared_head.head.weight",
            "Model.Layers.4.Input_LayerNorm.weight",
            "model.embed_tokens.weight",
            "lm_head.weight",
            "model.layers.9.mlp.fc.bias",
            "model.layers.9.unmatched.thing",
        ];
        for family in [
            ModelFamily::Llama,
            ModelFamily::Qwen3,
            ModelFamily::Qwen3Moe,
            ModelFamily::DeepseekV3,
        ] {
            let mut c = RoleClassifier::new(family);
            assert!(c.memo.is_some());
            let (f, d) = (roles::family_rules(family), roles::default_rules());
            for _ in 0..2 {
                for n in names {
                    for trainable in [true, false] {
                        assert_eq!(
                            c.classify(n, trainable),
                            roles::classify(n, trainable, &f, &d),
                            "{n} {family:?}"
                        );
                    }
                }
            }
        }
    }

    /// A rule that can see a digit segment turns the memo off (and the answers stay right).
    #[test]
    fn digit_patterns_disable_the_memo() {
        let rule = NameRule {
            patterns: vec!["layers.1".into()],
            role: Role::Replicated,
            mode: MatchMode::Substring,
        };
        let mut c = RoleClassifier::with_rules(vec![rule], roles::default_rules());
        assert!(c.memo.is_none());
        let a = c.classify("model.layers.1.mlp.gate_proj.weight", true).0;
        let b = c.classify("model.layers.2.mlp.gate_proj.weight", true).0;
        assert_eq!((a, b), (Role::Replicated, Role::Colwise));
    }
}
