//! The numerics variants of the reference optimizers a scenario can select: the Newton-Schulz
//! rounding order ([`NsOpOrder`], `[optimizer.muon] ns_order`) and the element-wise kernel
//! form ([`ElementwiseNumerics`], `[optimizer.adamw] numerics` and `[optimizer.muon]
//! numerics`), with their scenario names and the check the scenario loader runs on them.
//!
//! Its own module because the scenario loader (which validates the keys) and the reference
//! executor (which implements the variants) both need the names, and the reference crate
//! depends on this one, not the other way round.

/// How one Newton-Schulz iteration's Gram polynomial and update are rounded to bf16 (it
/// changes the bits, and how close the result stays to exact Newton-Schulz).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NsOpOrder {
    /// HyperParallel: `B = b·A + c·(A·A)`, every operation rounded (`gram_squared_first`).
    GramSquaredFirst,
    /// Keller Jordan's eager form, Python precedence: `B = b·A + (c·A)·A`, every operation
    /// rounded (`eager`).
    ScaleThenMultiply,
    /// `torch.optim.Muon`'s operations: `B = addmm(A, A, A, beta=b, alpha=c)` and
    /// `X = addmm(X, B, X, beta=a)`: one bf16 rounding per `b·A + c·A·A` and per `a·X + B·X`,
    /// products summed in ascending order (`addmm`). Bitwise torch only where the
    /// summation order does not change a bf16 rounding; the two orders below are torch's.
    Addmm,
    /// The `addmm` operations with torch's native CPU bf16 GEMM kernels (ATen `cpublas`,
    /// AVX2 and AVX-512 builds): the orders torch takes on CPUs without AVX-512, with
    /// `torch.backends.mkldnn.enabled = False`, and for GEMMs of at most 4096 multiply-adds
    /// everywhere (`addmm_cpublas`).
    AddmmCpublas,
    /// torch's dispatch on an AVX-512 CPU: GEMMs of more than 4096 multiply-adds in oneDNN's
    /// bf16 order (products in pairs), the others as `addmm_cpublas` (`addmm_onednn`).
    AddmmOnednn,
}

impl NsOpOrder {
    /// Every order, in documentation order.
    pub const ALL: [NsOpOrder; 5] = [
        NsOpOrder::GramSquaredFirst,
        NsOpOrder::ScaleThenMultiply,
        NsOpOrder::Addmm,
        NsOpOrder::AddmmCpublas,
        NsOpOrder::AddmmOnednn,
    ];

    /// The scenario name (`[optimizer.muon] ns_order`).
    pub fn name(self) -> &'static str {
        match self {
            NsOpOrder::GramSquaredFirst => "gram_squared_first",
            NsOpOrder::ScaleThenMultiply => "eager",
            NsOpOrder::Addmm => "addmm",
            NsOpOrder::AddmmCpublas => "addmm_cpublas",
            NsOpOrder::AddmmOnednn => "addmm_onednn",
        }
    }

    /// Parses a scenario name (`None` for an unknown one).
    pub fn parse(name: &str) -> Option<NsOpOrder> {
        NsOpOrder::ALL.into_iter().find(|o| o.name() == name)
    }
}

/// The arithmetic form of an optimizer's element-wise update (same operation order, different
/// fusion): AdamW's moments, Muon's EMA momentum and its parameter update.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum ElementwiseNumerics {
    /// Every operation rounded separately (`unfused`, AdamW's default and every Muon preset's
    /// but `torch`'s): platform-independent, the form the verify goldens are recorded in.
    #[default]
    Unfused,
    /// torch's CPU kernels (`torch_cpu_fma`): `lerp_` as `fma(w, end − self, self)` (or
    /// `fma(w − 1, end − self, end)` for `|w| ≥ 0.5`), AdamW's `addcmul_` as
    /// `fma((1 − β2)·g, g, β2·v)`, Muon's `param.add_(update, alpha=−lr)` as
    /// `fma(−lr, update, param)`.
    TorchCpuFma,
}

impl ElementwiseNumerics {
    /// Every form, in documentation order.
    pub const ALL: [ElementwiseNumerics; 2] = [
        ElementwiseNumerics::Unfused,
        ElementwiseNumerics::TorchCpuFma,
    ];

    /// The scenario name (`[optimizer.adamw] numerics`, `[optimizer.muon] numerics`).
    pub fn name(self) -> &'static str {
        match self {
            ElementwiseNumerics::Unfused => "unfused",
            ElementwiseNumerics::TorchCpuFma => "torch_cpu_fma",
        }
    }

    /// Parses a scenario name (`None` for an unknown one).
    pub fn parse(name: &str) -> Option<ElementwiseNumerics> {
        ElementwiseNumerics::ALL
            .into_iter()
            .find(|o| o.name() == name)
    }
}

/// A rejected numerics key: its section, key and the message naming the accepted values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NumericsKeyError {
    /// TOML section (`optimizer.muon`, `optimizer.adamw`).
    pub section: &'static str,
    /// Key within the section.
    pub key: &'static str,
    /// What is wrong and what to write instead.
    pub message: String,
}

/// The numerics keys of a scenario's `[optimizer]` section, as written (absent: `None`).
#[derive(Debug, Clone, Copy, Default)]
pub struct NumericsKeys<'a> {
    /// `[optimizer.muon] ns_order`.
    pub ns_order: Option<&'a str>,
    /// `[optimizer.adamw] numerics`.
    pub adamw_numerics: Option<&'a str>,
    /// `[optimizer.muon] numerics`.
    pub muon_numerics: Option<&'a str>,
}

/// Checks `[optimizer.muon] ns_order` and `[optimizer.adamw] numerics` (absent keys are fine).
pub fn check_numerics_keys(o: &NumericsKeys) -> Result<(), NumericsKeyError> {
    if let Some(order) = o.ns_order
        && NsOpOrder::parse(order).is_none()
    {
        let names: Vec<&str> = NsOpOrder::ALL.iter().map(|v| v.name()).collect();
        return Err(NumericsKeyError {
            section: "optimizer.muon",
            key: "ns_order",
            message: format!(
                "[optimizer.muon] ns_order = \"{order}\"; use one of {} (or remove the key to \
                 keep the preset's order)",
                names.join(", ")
            ),
        });
    }
    for (section, form) in [
        ("optimizer.adamw", o.adamw_numerics),
        ("optimizer.muon", o.muon_numerics),
    ] {
        if let Some(form) = form
            && ElementwiseNumerics::parse(form).is_none()
        {
            let names: Vec<&str> = ElementwiseNumerics::ALL.iter().map(|v| v.name()).collect();
            return Err(NumericsKeyError {
                section,
                key: "numerics",
                message: format!(
                    "[{section}] numerics = \"{form}\"; use one of {}",
                    names.join(", ")
                ),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for o in NsOpOrder::ALL {
            assert_eq!(NsOpOrder::parse(o.name()), Some(o));
        }
        for a in ElementwiseNumerics::ALL {
            assert_eq!(ElementwiseNumerics::parse(a.name()), Some(a));
        }
        assert_eq!(NsOpOrder::parse("Addmm"), None);
        assert_eq!(ElementwiseNumerics::default(), ElementwiseNumerics::Unfused);
    }

    /// The keys of a scenario's optimizer section (what the scenario loader passes).
    fn check(o: &crate::scenario::OptimizerSection) -> Result<(), NumericsKeyError> {
        check_numerics_keys(&NumericsKeys {
            ns_order: o.muon.ns_order.as_deref(),
            adamw_numerics: o.adamw.numerics.as_deref(),
            muon_numerics: o.muon.numerics.as_deref(),
        })
    }

    #[test]
    fn unknown_names_are_rejected_with_the_choices() {
        let mut o = crate::scenario::OptimizerSection::default();
        assert_eq!(check(&o), Ok(()));
        o.muon.ns_order = Some("fused".into());
        let e = check(&o).unwrap_err();
        assert_eq!((e.section, e.key), ("optimizer.muon", "ns_order"));
        assert!(
            e.message.contains("gram_squared_first, eager, addmm"),
            "{}",
            e.message
        );
        o.muon.ns_order = Some("addmm".into());
        o.adamw.numerics = Some("fma".into());
        let e = check(&o).unwrap_err();
        assert_eq!((e.section, e.key), ("optimizer.adamw", "numerics"));
        assert!(
            e.message.contains("unfused, torch_cpu_fma"),
            "{}",
            e.message
        );
        o.adamw.numerics = Some("torch_cpu_fma".into());
        o.muon.numerics = Some("fused".into());
        let e = check(&o).unwrap_err();
        assert_eq!((e.section, e.key), ("optimizer.muon", "numerics"));
        o.muon.numerics = Some("unfused".into());
        assert_eq!(check(&o), Ok(()));
    }
}
