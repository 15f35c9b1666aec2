//! Minimal fnmatch-style globs for FQN overrides: `*` matches any run of characters
//! (dots included, as in HyperParallel's `fnmatch`), `?` matches one character.

/// True if `pattern` contains a glob metacharacter.
pub fn is_glob(pattern: &str) -> bool {
    pattern.contains(['*', '?'])
}

/// Matches `text` against `pattern` (`*` spans dots). Iterative with backtracking to the
/// last star, so it is linear in practice.
pub fn glob_match(pattern: &str, text: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let t: Vec<char> = text.chars().collect();
    let (mut pi, mut ti) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == t[ti]) {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some((pi, ti));
            pi += 1;
        } else if let Some((sp, st)) = star {
            pi = sp + 1;
            ti = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stars_span_dots() {
        assert!(glob_match("model.layers.*.mlp", "model.layers.3.mlp"));
        assert!(glob_match("model.layers.*.mlp", "model.layers.3.x.mlp"));
        assert!(!glob_match("model.layers.*.mlp", "model.layers.3.mlp.gate"));
        assert!(glob_match("*norm", "model.norm"));
        assert!(glob_match("model.layers.?.mlp", "model.layers.7.mlp"));
        assert!(!glob_match("model.layers.?.mlp", "model.layers.17.mlp"));
        assert!(is_glob("a.*") && !is_glob("a.b"));
    }
}
