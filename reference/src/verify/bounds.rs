//! Error bounds of updated parameters that the AdamW ([`super::report`]) and Muon
//! ([`super::muon_report`]) checks share.

/// Bound on TP updated parameters, in units of the learning rate: AdamW's first step moves
/// each element by `lr · g / (|g| + eps)`, so a gradient component near zero whose sign
/// differs between the two summation orders can move its parameter by up to `2·lr`; any
/// other difference is far smaller. A sharding bug moves parameters by about `lr` in
/// uncorrelated directions and is caught by the gradient bound.
pub const PARAM_ABS_BOUND_LR: f64 = 2.0;

/// Bound on how far one step of distributed Muon in an order-changing (TP) run may move a
/// Muon-routed parameter away from the single device, in units of `lr · s` (`s`: the
/// parameter's update scale, see
/// [`super::muon_spec::MuonVerify::update_scale`]). Row-parallel TP changes the
/// first step's gradients only by about 1e-6 of `max |g|` (bounded by
/// [`super::report::GRAD_REL_BOUND`]), but Newton-Schulz runs in bf16: such a difference flips
/// bf16 roundings of its input, and the quintic iteration amplifies differences along small
/// singular values (slope `a^5` near 0), so the update of an element differs by up to a few
/// percent of `lr · s` — measured on `dense-tp2-fsdp2-muon`: 0.012 after step 1 and 0.067
/// after 3 steps (0.02 per step as the runs drift apart: later gradients are taken at parameters
/// that already differ). 0.1 per step leaves a margin of 4-8; a broken update (wrong sign, no
/// orthogonalization) moves elements by `lr · s · |O_ij|`, tenths of `lr · s`. The optimizer
/// itself is checked bit for bit on the run's own gradients.
pub const MUON_STEP_BOUND: f64 = 0.1;
