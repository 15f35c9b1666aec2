//! Pass 6: static lint. Every issue names the parameter, the boundary and the mesh axis it
//! concerns (where they apply) and says how to fix it.

use serde::{Deserialize, Serialize};

/// How bad a lint issue is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// Worth knowing; the plan is usable.
    Warning,
    /// The plan is wrong; `hpfsdp plan` exits non-zero.
    Error,
}

/// One lint finding.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LintIssue {
    /// Error or warning.
    pub severity: Severity,
    /// Stable kebab-case code (`indivisible-shard`, `uncovered-param`, ...).
    pub code: String,
    /// Parameter concerned, if any.
    pub param: Option<String>,
    /// Boundary (module FQN) concerned, if any.
    pub boundary: Option<String>,
    /// Mesh axis concerned, if any.
    pub axis: Option<String>,
    /// What is wrong.
    pub message: String,
    /// How to fix it.
    pub fix: String,
}

impl LintIssue {
    /// A new error.
    pub fn error(code: &str, message: impl Into<String>, fix: impl Into<String>) -> Self {
        Self {
            severity: Severity::Error,
            code: code.into(),
            param: None,
            boundary: None,
            axis: None,
            message: message.into(),
            fix: fix.into(),
        }
    }

    /// A new warning.
    pub fn warning(code: &str, message: impl Into<String>, fix: impl Into<String>) -> Self {
        Self {
            severity: Severity::Warning,
            ..Self::error(code, message, fix)
        }
    }

    /// Sets the parameter.
    pub fn param(mut self, p: &str) -> Self {
        self.param = Some(p.to_string());
        self
    }

    /// Sets the boundary.
    pub fn boundary(mut self, b: &str) -> Self {
        self.boundary = Some(b.to_string());
        self
    }

    /// Sets the axis.
    pub fn axis(mut self, a: &str) -> Self {
        self.axis = Some(a.to_string());
        self
    }
}

impl std::fmt::Display for LintIssue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let sev = match self.severity {
            Severity::Error => "error",
            Severity::Warning => "warning",
        };
        write!(f, "{sev}[{}]: {}", self.code, self.message)?;
        let mut ctx = Vec::new();
        if let Some(p) = &self.param {
            ctx.push(format!("param {p}"));
        }
        if let Some(b) = &self.boundary {
            ctx.push(format!("boundary {b}"));
        }
        if let Some(a) = &self.axis {
            ctx.push(format!("axis {a}"));
        }
        if !ctx.is_empty() {
            write!(f, " ({})", ctx.join(", "))?;
        }
        write!(f, "\n    fix: {}", self.fix)
    }
}
