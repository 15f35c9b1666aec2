//! Dotted-key overrides of a scenario file (`mesh.dp_shard=16`, `fsdp.prefetch_depth=2`).
//!
//! `hpfsdp sweep --vary KEY=V1,V2,...` and any other command that varies a scenario apply
//! overrides to the parsed TOML document *before* the scenario is built, so every override
//! goes through the same validation (unknown keys, wrong types, meshes that do not multiply)
//! as a hand-written file. An override never invents a section inside an array of tables and
//! never replaces a table by a value: those are errors that name the key and the fix.

use thiserror::Error;

/// Errors of parsing or applying an override; each names the key at fault and the fix.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum OverrideError {
    /// The text is not `KEY=VALUE` / `KEY=V1,V2,...`.
    #[error("'{text}' is not KEY=VALUE (e.g. mesh.dp_shard=16 or fsdp.prefetch_depth=0,1,2)")]
    Syntax {
        /// The text as given.
        text: String,
    },
    /// A key with an empty segment (`mesh..tp`, `.tp`, `tp.`).
    #[error("key '{key}' has an empty segment; write dotted keys like mesh.dp_shard")]
    EmptySegment {
        /// The key as given.
        key: String,
    },
    /// A `--vary` key with no values (`mesh.tp=`).
    #[error("key '{key}' has no values; list them after '=' separated by commas")]
    NoValues {
        /// The key as given.
        key: String,
    },
    /// The scenario text is not TOML.
    #[error("{file}: not a TOML document: {message}")]
    Document {
        /// The scenario file.
        file: String,
        /// The parser's message.
        message: String,
    },
    /// A key whose path crosses a value that is not a table.
    #[error(
        "{file}: key '{key}': '{prefix}' is {found}, not a table; override a key inside a \
         table (e.g. mesh.dp_shard) or the whole value '{prefix}'"
    )]
    NotATable {
        /// The scenario file.
        file: String,
        /// The full key.
        key: String,
        /// The part of the key that is not a table.
        prefix: String,
        /// What it is instead (`an integer`, `an array`, ...).
        found: String,
    },
    /// An override that would replace a whole table by a scalar.
    #[error(
        "{file}: key '{key}' is a table; override one of its keys ({keys}) instead of the \
         whole table"
    )]
    ReplacesTable {
        /// The scenario file.
        file: String,
        /// The full key.
        key: String,
        /// The table's keys, comma-separated.
        keys: String,
    },
}

/// One `KEY=VALUE` override: a dotted key and a TOML value.
#[derive(Debug, Clone, PartialEq)]
pub struct Override {
    /// Dotted key, e.g. `mesh.dp_shard`.
    pub key: String,
    /// The value to write at the key.
    pub value: toml::Value,
}

impl Override {
    /// Parses `KEY=VALUE` (the value as in [`parse_value`]).
    pub fn parse(text: &str) -> Result<Self, OverrideError> {
        let (key, value) = split_key(text)?;
        Ok(Self {
            key,
            value: parse_value(value.trim()),
        })
    }

    /// `key=value` as written back for reports (strings unquoted).
    pub fn label(&self) -> String {
        format!("{}={}", self.key, value_label(&self.value))
    }
}

/// Parses `KEY=V1,V2,...` (top-level commas split values; commas inside quotes, `[...]` or
/// `{...}` do not) into the key and its values.
pub fn parse_vary(text: &str) -> Result<(String, Vec<toml::Value>), OverrideError> {
    let (key, values) = split_key(text)?;
    let parts = split_top_level(values);
    if parts.iter().all(|p| p.trim().is_empty()) {
        return Err(OverrideError::NoValues { key });
    }
    Ok((key, parts.iter().map(|p| parse_value(p.trim())).collect()))
}

/// A value as TOML (`16`, `1.5`, `true`, `"bf16"`, `[1, 2]`, `{ mode = "full" }`); text that is
/// not a TOML value is taken as a bare string (`bf16`, `fsdp2`).
pub fn parse_value(text: &str) -> toml::Value {
    toml::from_str::<toml::Table>(&format!("v = {text}"))
        .ok()
        .and_then(|mut t| t.remove("v"))
        .unwrap_or_else(|| toml::Value::String(text.to_string()))
}

/// A value for labels and CSV cells: strings without quotes, everything else as TOML.
pub fn value_label(value: &toml::Value) -> String {
    match value {
        toml::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Applies `overrides` in order to scenario `text` (read from `file`, named in errors) and
/// returns the new document as TOML text. Missing tables on the way are created; the scenario
/// parser then rejects keys the format does not know.
pub fn apply_to_text(
    text: &str,
    file: &str,
    overrides: &[Override],
) -> Result<String, OverrideError> {
    let mut doc: toml::Table = toml::from_str(text).map_err(|e| OverrideError::Document {
        file: file.to_string(),
        message: e.message().to_string(),
    })?;
    for o in overrides {
        apply(&mut doc, file, &o.key, o.value.clone())?;
    }
    Ok(toml::to_string(&doc).unwrap_or_else(|_| unreachable!("a parsed table serializes")))
}

/// Writes `value` at dotted `key` of `doc` (`file` names the document in errors).
pub fn apply(
    doc: &mut toml::Table,
    file: &str,
    key: &str,
    value: toml::Value,
) -> Result<(), OverrideError> {
    let segments: Vec<&str> = key.split('.').collect();
    if segments.iter().any(|s| s.trim().is_empty()) {
        return Err(OverrideError::EmptySegment { key: key.into() });
    }
    let (last, parents) = segments
        .split_last()
        .unwrap_or_else(|| unreachable!("split always yields one segment"));
    let mut table = doc;
    for (i, seg) in parents.iter().enumerate() {
        let entry = table
            .entry(seg.trim().to_string())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        table = match entry {
            toml::Value::Table(t) => t,
            other => {
                return Err(OverrideError::NotATable {
                    file: file.into(),
                    key: key.into(),
                    prefix: segments[..=i].join("."),
                    found: describe(other),
                });
            }
        };
    }
    if let Some(toml::Value::Table(existing)) = table.get(last.trim())
        && !value.is_table()
    {
        return Err(OverrideError::ReplacesTable {
            file: file.into(),
            key: key.into(),
            keys: existing.keys().cloned().collect::<Vec<_>>().join(", "),
        });
    }
    table.insert(last.trim().to_string(), value);
    Ok(())
}

fn split_key(text: &str) -> Result<(String, &str), OverrideError> {
    let (key, value) = text.split_once('=').ok_or_else(|| OverrideError::Syntax {
        text: text.to_string(),
    })?;
    let key = key.trim();
    if key.is_empty() {
        return Err(OverrideError::Syntax {
            text: text.to_string(),
        });
    }
    if key.split('.').any(|s| s.trim().is_empty()) {
        return Err(OverrideError::EmptySegment { key: key.into() });
    }
    Ok((key.to_string(), value))
}

/// Splits at commas outside quotes and brackets.
fn split_top_level(text: &str) -> Vec<&str> {
    let (mut parts, mut depth, mut quote, mut start) = (Vec::new(), 0i32, None, 0);
    for (i, c) in text.char_indices() {
        match (quote, c) {
            (Some(q), _) if c == q => quote = None,
            (Some(_), _) => {}
            (None, '"' | '\'') => quote = Some(c),
            (None, '[' | '{') => depth += 1,
            (None, ']' | '}') => depth -= 1,
            (None, ',') if depth == 0 => {
                parts.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&text[start..]);
    parts
}

fn describe(value: &toml::Value) -> String {
    match value {
        toml::Value::String(_) => "a string",
        toml::Value::Integer(_) => "an integer",
        toml::Value::Float(_) => "a float",
        toml::Value::Boolean(_) => "a boolean",
        toml::Value::Datetime(_) => "a date-time",
        toml::Value::Array(_) => "an array",
        toml::Value::Table(_) => "a table",
    }
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOC: &str = "name = \"x\"\n[mesh]\ndp_shard = 4\ntp = 2\n[train]\nrecompute = \"off\"\n";

    #[test]
    fn sets_an_existing_key_and_creates_a_missing_table() {
        let o = [
            Override::parse("mesh.dp_shard=16").unwrap(),
            Override::parse("fsdp.prefetch_depth=2").unwrap(),
        ];
        let out: toml::Table = toml::from_str(&apply_to_text(DOC, "f.toml", &o).unwrap()).unwrap();
        assert_eq!(out["mesh"]["dp_shard"].as_integer(), Some(16));
        assert_eq!(out["mesh"]["tp"].as_integer(), Some(2));
        assert_eq!(out["fsdp"]["prefetch_depth"].as_integer(), Some(2));
    }

    #[test]
    fn values_are_toml_or_bare_strings_and_commas_split_only_at_top_level() {
        let (key, values) =
            parse_vary("train.recompute=off,{ mode = \"full\", layers = \"0..2\" },\"a,b\"")
                .unwrap();
        assert_eq!(key, "train.recompute");
        assert_eq!(values.len(), 3);
        assert_eq!(values[0].as_str(), Some("off"));
        assert!(values[1].is_table());
        assert_eq!(values[2].as_str(), Some("a,b"));
        assert_eq!(parse_value("1.5").as_float(), Some(1.5));
        assert_eq!(parse_value("true").as_bool(), Some(true));
    }

    #[test]
    fn bad_keys_name_the_key_and_the_fix() {
        let e = Override::parse("mesh.dp_shard.x=1").unwrap();
        let err = apply_to_text(DOC, "f.toml", &[e]).unwrap_err().to_string();
        assert!(err.contains("'mesh.dp_shard' is an integer"), "{err}");
        let err = apply_to_text(DOC, "f.toml", &[Override::parse("mesh=1").unwrap()])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("key 'mesh' is a table") && err.contains("dp_shard"),
            "{err}"
        );
        assert!(matches!(
            parse_vary("mesh..tp=1"),
            Err(OverrideError::EmptySegment { .. })
        ));
        assert!(matches!(
            parse_vary("mesh.tp="),
            Err(OverrideError::NoValues { .. })
        ));
        assert!(matches!(
            parse_vary("mesh.tp"),
            Err(OverrideError::Syntax { .. })
        ));
    }
}
