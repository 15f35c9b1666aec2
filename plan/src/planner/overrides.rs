//! Pass 5 input: plan overrides from the scenario file (`[[plan.override]]`), parsed into
//! typed field overrides. Merging happens in the planner; this module only parses and checks
//! the entries themselves.
//!
//! ```toml
//! [[plan.override]]
//! match = "model.layers.*.mlp"            # FQN or glob (`*` spans dots)
//! when = "ep"                              # optional: cp | ep | low_precision
//! params = { "gate_proj.weight" = { tp = "shard(0)" } }
//! in_src = "auto"                          # sentinels: auto (inherit), none (clear)
//! out_dst = { tp = "replicate" }           # out_* shorthand for { output = {...} }
//! ```

use super::templates::{AxisPlacements, Contract};
use crate::placement::Placement;
use serde::{Deserialize, Serialize};

/// One override entry as written in the scenario file (before parsing placements).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawOverride {
    /// FQN or glob of the module(s) the entry applies to.
    #[serde(rename = "match")]
    pub pattern: String,
    /// Gate: `cp`, `ep` or `low_precision`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub when: Option<String>,
    /// Parameter placements, relative names → `{axis = "placement"}`, or a sentinel.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub params: Option<toml::Value>,
    /// Input source contract.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_src: Option<toml::Value>,
    /// Input destination contract.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_dst: Option<toml::Value>,
    /// Output source contract.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub out_src: Option<toml::Value>,
    /// Output destination contract.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub out_dst: Option<toml::Value>,
}

/// When an override is active.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WhenGate {
    /// Active when cp > 1.
    Cp,
    /// Active when ep > 1.
    Ep,
    /// Active when low-precision training is enabled.
    LowPrecision,
}

/// One contract or params field of an override.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FieldOverride {
    /// Not given, or `"auto"`: inherit the derived value.
    #[default]
    Auto,
    /// `"none"`: clear the field.
    Clear,
    /// A concrete value (an empty table counts: "no sharding / no contract").
    Set(Contract),
}

impl FieldOverride {
    /// True unless the field inherits.
    pub fn is_declared(&self) -> bool {
        !matches!(self, FieldOverride::Auto)
    }
}

/// A parsed override entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanOverride {
    /// FQN or glob.
    pub pattern: String,
    /// Optional gate.
    pub when: Option<WhenGate>,
    /// Parameter placements (relative names).
    pub params: FieldOverride,
    /// Input source contract.
    pub in_src: FieldOverride,
    /// Input destination contract.
    pub in_dst: FieldOverride,
    /// Output source contract.
    pub out_src: FieldOverride,
    /// Output destination contract.
    pub out_dst: FieldOverride,
    /// Where it was written: `file:line` (or `<inline>`), for error messages.
    pub origin: String,
}

/// Axis names legal in overrides (the plan coordinate system).
pub const PLAN_AXES: &[&str] = &["tp", "cp", "ep", "etp"];
/// Data-parallel axis names, which overrides may never name.
pub const DP_AXES: &[&str] = &[
    "dp",
    "dp_replicate",
    "dp_shard",
    "dp_cp",
    "dp_shard_cp",
    "edp_shard",
    "edp_replicate",
    "ep_shard",
];

fn parse_axis_map(v: &toml::Value, ctx: &str) -> Result<AxisPlacements, String> {
    let table = v.as_table().ok_or_else(|| {
        format!(
            "{ctx}: expected a table {{axis = \"placement\"}}, found {}",
            v.type_str()
        )
    })?;
    let mut out = AxisPlacements::new();
    for (axis, p) in table {
        if DP_AXES.contains(&axis.as_str()) {
            return Err(format!(
                "{ctx}.{axis}: declaring a DP placement is not allowed; the plan's coordinate system is a single \
                 data-parallel slice (axes {}); FSDP/HSDP sharding comes from [mesh] and [fsdp]",
                PLAN_AXES.join(", ")
            ));
        }
        if !PLAN_AXES.contains(&axis.as_str()) {
            return Err(format!(
                "{ctx}: unknown axis '{axis}' (suspected typo); legal axes are {}",
                PLAN_AXES.join(", ")
            ));
        }
        let text = p.as_str().ok_or_else(|| {
            format!(
                "{ctx}.{axis}: expected a placement string, found {}",
                p.type_str()
            )
        })?;
        let placement = Placement::parse(text).map_err(|e| format!("{ctx}.{axis}: {e}"))?;
        out.insert(axis.clone(), placement);
    }
    Ok(out)
}

fn parse_field(
    v: &Option<toml::Value>,
    field: &str,
    scalar_shorthand: bool,
) -> Result<FieldOverride, String> {
    let Some(v) = v else {
        return Ok(FieldOverride::Auto);
    };
    if let Some(s) = v.as_str() {
        return match s.trim().to_lowercase().as_str() {
            "auto" => Ok(FieldOverride::Auto),
            "none" => Ok(FieldOverride::Clear),
            _ => Err(format!(
                "{field} = \"{s}\": a string here only accepts the sentinels 'auto' (inherit the derived value) \
                 and 'none' (clear it); give a table to set a value"
            )),
        };
    }
    let table = v
        .as_table()
        .ok_or_else(|| format!("{field}: expected a table or a sentinel string"))?;
    // Scalar shorthand for out_*: {axis = "placement"} means {output = {axis = ...}}.
    if scalar_shorthand && !table.is_empty() && table.values().all(|x| x.is_str()) {
        let mut c = Contract::new();
        c.insert("output".into(), parse_axis_map(v, field)?);
        return Ok(FieldOverride::Set(c));
    }
    let mut c = Contract::new();
    for (name, inner) in table {
        c.insert(
            name.clone(),
            parse_axis_map(inner, &format!("{field}.\"{name}\""))?,
        );
    }
    Ok(FieldOverride::Set(c))
}

impl PlanOverride {
    /// Parses a raw entry; the error text names the field and the fix (the caller adds file
    /// and line).
    pub fn parse(raw: &RawOverride, origin: &str) -> Result<Self, String> {
        if raw.pattern.trim().is_empty() {
            return Err(
                "match is empty; give a module FQN or glob such as \"model.layers.*.mlp\"".into(),
            );
        }
        let when = match raw.when.as_deref() {
            None => None,
            Some("cp") => Some(WhenGate::Cp),
            Some("ep") => Some(WhenGate::Ep),
            Some("low_precision") => Some(WhenGate::LowPrecision),
            Some(other) => {
                return Err(format!(
                    "when = \"{other}\" is invalid; expected one of 'cp', 'ep', 'low_precision'"
                ));
            }
        };
        let ov = PlanOverride {
            pattern: raw.pattern.clone(),
            when,
            params: parse_field(&raw.params, "params", false)?,
            in_src: parse_field(&raw.in_src, "in_src", false)?,
            in_dst: parse_field(&raw.in_dst, "in_dst", false)?,
            out_src: parse_field(&raw.out_src, "out_src", true)?,
            out_dst: parse_field(&raw.out_dst, "out_dst", true)?,
            origin: origin.to_string(),
        };
        if !ov.declares_anything() {
            return Err(format!(
                "override for '{}' declares nothing; set params, in_src, in_dst, out_src or out_dst",
                raw.pattern
            ));
        }
        Ok(ov)
    }

    /// True if any field is declared (not `auto`).
    pub fn declares_anything(&self) -> bool {
        [
            &self.params,
            &self.in_src,
            &self.in_dst,
            &self.out_src,
            &self.out_dst,
        ]
        .iter()
        .any(|f| f.is_declared())
    }

    /// True if some field carries a concrete value (needed to insert a new boundary).
    pub fn has_concrete_field(&self) -> bool {
        [
            &self.params,
            &self.in_src,
            &self.in_dst,
            &self.out_src,
            &self.out_dst,
        ]
        .iter()
        .any(|f| matches!(f, FieldOverride::Set(_)))
    }

    /// Merges a later entry with the same `match` into this one: later declared fields win.
    pub fn absorb(&mut self, later: &PlanOverride) {
        for (mine, theirs) in [
            (&mut self.params, &later.params),
            (&mut self.in_src, &later.in_src),
            (&mut self.in_dst, &later.in_dst),
            (&mut self.out_src, &later.out_src),
            (&mut self.out_dst, &later.out_dst),
        ] {
            if theirs.is_declared() {
                *mine = theirs.clone();
            }
        }
        self.origin = format!("{} + {}", self.origin, later.origin);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(text: &str) -> RawOverride {
        toml::from_str(text).unwrap()
    }

    #[test]
    fn parses_fields_and_sentinels() {
        let ov = PlanOverride::parse(
            &raw(r#"
                match = "model.layers.*.mlp"
                params = { "gate_proj.weight" = { tp = "shard(0)" }, "down_proj.weight" = { tp = "Shard( 1 )" } }
                in_src = "auto"
                out_dst = { tp = "replicate" }
                out_src = "none"
            "#),
            "s.toml:3",
        )
        .unwrap();
        let FieldOverride::Set(p) = &ov.params else {
            panic!()
        };
        assert_eq!(p["down_proj.weight"]["tp"], Placement::shard(1));
        assert_eq!(ov.in_src, FieldOverride::Auto);
        assert_eq!(ov.out_src, FieldOverride::Clear);
        let FieldOverride::Set(o) = &ov.out_dst else {
            panic!()
        };
        assert!(o.contains_key("output"));
    }

    #[test]
    fn bad_entries_name_the_problem() {
        let e = PlanOverride::parse(
            &raw("match = \"a\"\nparams = { w = { dp_shard = \"shard(0)\" } }"),
            "x",
        )
        .unwrap_err();
        assert!(e.contains("DP placement"), "{e}");
        let e = PlanOverride::parse(
            &raw("match = \"a\"\nparams = { w = { tq = \"shard(0)\" } }"),
            "x",
        )
        .unwrap_err();
        assert!(
            e.contains("unknown axis 'tq'") && e.contains("tp, cp, ep, etp"),
            "{e}"
        );
        let e = PlanOverride::parse(
            &raw("match = \"a\"\nparams = { w = { tp = \"split(0)\" } }"),
            "x",
        )
        .unwrap_err();
        assert!(
            e.contains("params.\"w\".tp") && e.contains("split(0)"),
            "{e}"
        );
        let e = PlanOverride::parse(&raw("match = \"a\"\nwhen = \"pp\"\nin_src = \"none\""), "x")
            .unwrap_err();
        assert!(e.contains("when = \"pp\""), "{e}");
        let e = PlanOverride::parse(&raw("match = \"a\"\nin_src = \"maybe\""), "x").unwrap_err();
        assert!(e.contains("sentinels"), "{e}");
        let e = PlanOverride::parse(&raw("match = \"a\""), "x").unwrap_err();
        assert!(e.contains("declares nothing"), "{e}");
    }
}
