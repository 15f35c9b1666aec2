//! Where a key is written in a TOML text, for error messages that name a line (the scenario
//! loader, the what-if section, the verify harness).

/// 1-based line of `key` inside `[section]` (dotted sections allowed; `""` = top level),
/// or of the section header when the key is absent; 0 if neither is found.
pub fn find_key_line(text: &str, section: &str, key: &str) -> usize {
    let mut current = String::new();
    let mut header_line = 0;
    for (i, line) in text.lines().enumerate() {
        let t = line.trim();
        if let Some(h) = t.strip_prefix("[[").and_then(|s| s.split("]]").next()) {
            current = h.trim().to_string();
            if current == section && header_line == 0 {
                header_line = i + 1;
            }
            continue;
        }
        if let Some(h) = t.strip_prefix('[').and_then(|s| s.split(']').next()) {
            current = h.trim().to_string();
            if current == section {
                header_line = i + 1;
            }
            continue;
        }
        if current == section
            && let Some((k, _)) = t.split_once('=')
            && k.trim().trim_matches('"') == key
        {
            return i + 1;
        }
    }
    header_line
}
