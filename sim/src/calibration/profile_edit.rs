//! Writes fitted values into a copy of a profile's TOML text, keeping its comments and
//! layout: each changed key gets its new value and a trailing comment saying where it came
//! from. Never edits a shipped profile in place (the caller writes the result elsewhere).

use super::error::CalibrationError;
use toml_edit::{DocumentMut, Item, Table, Value};

/// One edit: dotted key, new value, and the comment to put after it.
#[derive(Debug, Clone, PartialEq)]
pub struct Edit {
    /// Dotted key (`tiers.intra_machine.efficiency`, `compute.gemm_table`).
    pub key: String,
    /// The new value.
    pub value: EditValue,
    /// Trailing comment (without `#`).
    pub comment: String,
}

/// A value to write.
#[derive(Debug, Clone, PartialEq)]
pub enum EditValue {
    /// A number (written with 4 significant decimals past the point at most).
    Number(f64),
    /// A string.
    Text(String),
}

fn round4(v: f64) -> f64 {
    let scale = 10f64.powi(4 - v.abs().log10().floor().max(0.0) as i32);
    (v * scale).round() / scale
}

/// Applies `edits` to the profile text `text` (named `file` in errors); missing tables are
/// created.
pub fn apply_edits(text: &str, file: &str, edits: &[Edit]) -> Result<String, CalibrationError> {
    let mut doc: DocumentMut =
        text.parse()
            .map_err(|e: toml_edit::TomlError| CalibrationError::Table {
                file: file.to_string(),
                line: 0,
                column: "-".into(),
                message: format!("not valid TOML: {e}"),
            })?;
    for edit in edits {
        let parts: Vec<&str> = edit.key.split('.').collect();
        let (last, tables) = parts
            .split_last()
            .ok_or_else(|| CalibrationError::UnknownKey {
                key: edit.key.clone(),
            })?;
        let mut table: &mut Table = doc.as_table_mut();
        for name in tables {
            if !table.contains_key(name) {
                table.insert(name, Item::Table(Table::new()));
            }
            table = table[*name]
                .as_table_mut()
                .ok_or_else(|| CalibrationError::Table {
                    file: file.to_string(),
                    line: 0,
                    column: edit.key.clone(),
                    message: format!("'{name}' is not a table; cannot set '{}'", edit.key),
                })?;
        }
        let mut value = match &edit.value {
            EditValue::Number(v) => Value::from(round4(*v)),
            EditValue::Text(s) => Value::from(s.as_str()),
        };
        value.decor_mut().set_prefix(" ");
        value
            .decor_mut()
            .set_suffix(format!("  # {}", edit.comment.replace('\n', " ")));
        // Replace the value in place when the key exists, so the key's own decor (the
        // comment lines above it) is kept.
        match table.get_mut(last) {
            Some(item) => *item = Item::Value(value),
            None => {
                table.insert(last, Item::Value(value));
            }
        }
    }
    Ok(doc.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn edits_keep_comments_and_create_missing_tables() {
        let text = "# header comment\nname = \"x\"\n[tiers.intra_machine]\n# above efficiency\nefficiency = 0.5 # old\nlatency_us = 1.0\n";
        let out = apply_edits(
            text,
            "x.toml",
            &[
                Edit {
                    key: "tiers.intra_machine.efficiency".into(),
                    value: EditValue::Number(0.612345678),
                    comment: "FITTED".into(),
                },
                Edit {
                    key: "compute.gemm_table".into(),
                    value: EditValue::Text("x.gemm.csv".into()),
                    comment: "MEASURED".into(),
                },
            ],
        )
        .unwrap();
        assert!(out.contains("# header comment"), "{out}");
        assert!(out.contains("# above efficiency\nefficiency"), "{out}");
        assert!(out.contains("efficiency = 0.6123  # FITTED"), "{out}");
        assert!(out.contains("latency_us = 1.0"), "{out}");
        assert!(out.contains("[compute]") && out.contains("gemm_table = \"x.gemm.csv\""));
    }
}
