//! A step-time difference between two runs of one experiment (`run / baseline - 1`): a
//! runs file's `[[difference]]` entry. The measured difference is derived from the two runs'
//! measured step times; the predicted one from their simulated step times. A paper's headline
//! comparison is known better than either step time (device-speed errors cancel in it), so
//! it is fitted and checked on its own, tighter tolerance in percentage points.

/// One difference as a runs file declares it.
#[derive(Debug, Clone, PartialEq)]
pub struct Difference {
    /// Short name: the JSON output reports it as `<name>_diff_error_pp`.
    pub name: String,
    /// Human-readable name in the verdict (`experiment-B step-time difference`).
    pub label: String,
    /// The experiment both runs belong to.
    pub experiment: String,
    /// Label of the run compared.
    pub run: String,
    /// Label of the run it is compared with.
    pub baseline: String,
    /// Measured `run / baseline - 1` of the two measured step times.
    pub measured: f64,
    /// Largest allowed error of the predicted difference, percentage points.
    pub tolerance_pp: f64,
    /// Where the comparison comes from.
    pub source: String,
}

/// A difference with its prediction.
#[derive(Debug, Clone, PartialEq)]
pub struct DifferenceRow {
    /// The difference.
    pub difference: Difference,
    /// Predicted `run / baseline - 1`; NaN unless both runs were simulated.
    pub predicted: f64,
}

impl DifferenceRow {
    /// Predicted minus measured difference, percentage points; `None` when not predicted.
    pub fn error_pp(&self) -> Option<f64> {
        let d = (self.predicted - self.difference.measured) * 100.0;
        d.is_finite().then_some(d)
    }

    /// The fit's residual: the error over the tolerance (both as fractions); `None` when not
    /// predicted.
    pub fn residual(&self) -> Option<f64> {
        let r =
            (self.predicted - self.difference.measured) / (self.difference.tolerance_pp / 100.0);
        r.is_finite().then_some(r)
    }

    /// True when not predicted or within tolerance.
    pub fn passed(&self) -> bool {
        self.error_pp()
            .is_none_or(|d| d.abs() <= self.difference.tolerance_pp)
    }
}
