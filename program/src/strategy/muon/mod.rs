//! Optimizer strategies: the optimizer part of a step program.
//!
//! [`OptimizerStrategy`] selects how the optimizer step is generated:
//!
//! | strategy | module | notes section |
//! |---|---|---|
//! | `adamw` | `strategy::optimizer` | placeholder AdamW on every local shard |
//! | `hyperparallel` | [`hyperparallel`] | `hyper-parallel.md` 6.4-6.7, 8.1; paper §6 |
//! | `naive` | [`naive`] | paper §6.1 "naive gather-then-compute on every rank" |
//! | `moonlight` | [`moonlight`] | `muon.md` 2.2 (ZeRO-1 distributed Muon) |
//! | `dmuon` | [`dmuon`] | `muon.md` 7.4; paper Table "design contrast" |
//! | `matrixfsdp` | [`matrixfsdp`] | `muon.md` 7.5; paper Table "design contrast" |
//! | `flexshard` | [`flexshard`] | `muon.md` 5.3, 7.3; paper §6.2 |
//!
//! Every Muon strategy routes parameters with the Muon plan ([`hpfsdp_plan::muon`]): AdamW-routed
//! parameters get one AdamW step per FSDP unit on their local shard (the chained optimizer
//! steps `adamw` first, notes 6.7), then the strategy's Muon pipeline runs. The rank's
//! optimizer ops are first built as a [`schedule::Schedule`] (hashable, so that template keys
//! follow owner-dependent differences) and then lowered into the program. Costs of the stages
//! are in [`ns_cost`].
//!
//! This module dispatches to the strategies' builders; what they share is below them:
//! `opt_ctx` (the rank-independent [`OptCtx`]), `common` (a rank's view, AdamW units, momentum,
//! apply and Newton-Schulz ops), `ns_call` (one Newton-Schulz call), `hp_pieces` (HyperParallel
//! Muon's shared pieces), `hp_shapes` (what a slot part reads of its parameters, interned)
//! and `hp_parts` (HyperParallel schedules as cached parts: a part per slot keyed by what the
//! slot takes from the rank).

mod common;
pub mod dmuon;
pub mod flexshard;
mod hp_parts;
mod hp_pieces;
mod hp_shapes;
pub mod hyperparallel;
pub mod matrixfsdp;
pub mod matrixfsdp_buffers;
pub mod moonlight;
pub mod naive;
mod ns_call;
pub mod ns_cost;
pub(crate) mod opt_ctx;
pub(crate) mod schedule;

pub(crate) use common::*;
pub(crate) use opt_ctx::OptParam;
pub use opt_ctx::{OptCtx, OptimizerStrategy};

use super::Ctx;
use opt_ctx::{Built, KEPT_SCHEDULES};
use schedule::Schedule;
use std::hash::{Hash, Hasher};

impl OptCtx {
    /// The rank's schedule digest, cached per optimizer coordinate. The schedule hashed is
    /// built anonymous (names are not hashed) and kept for the rank's unnamed program
    /// ([`OptCtx::take_built`]); a named program builds its own.
    pub(crate) fn digest(&self, ctx: &Ctx, rank: usize) -> u64 {
        let view = RankView::new(ctx, rank);
        let key = view.key(ctx);
        if let Ok(cache) = self.digests.lock()
            && let Some(&d) = cache.get(&key)
        {
            return d;
        }
        let (d, built) = if self.strategy == OptimizerStrategy::HyperParallelMuon {
            // From its parts, each built once per job (a digest of digests).
            let parts = hyperparallel::parts(ctx, &view, true, Some(&self.hp_pieces.parts));
            (parts.digest(), Built::Parts(parts))
        } else {
            let mut h = std::collections::hash_map::DefaultHasher::new();
            let anonymous = Schedule {
                anonymous: true,
                ..Schedule::default()
            };
            let mut schedule = build(ctx, &view, anonymous);
            schedule.hash_without_names(&mut h);
            if self.strategy.owner_placement() {
                placement_signature(ctx, &view).hash(&mut h);
            }
            // Kept at its length: a doubling vector holds up to twice its ops.
            schedule.ops.shrink_to_fit();
            (h.finish(), Built::Whole(schedule))
        };
        if let Ok(mut kept) = self.built.lock()
            && kept.len() < KEPT_SCHEDULES
            && !kept.contains_key(&d)
        {
            kept.insert(d, built);
        }
        if let Ok(mut cache) = self.digests.lock() {
            cache.insert(key, d);
        }
        d
    }

    /// A copy of the anonymous schedule [`OptCtx::digest`] built for `view`'s digest, if it
    /// was kept (several templates may share one schedule: their class signature or group
    /// tiers differ). Any rank with that digest may use it: the template key already relies
    /// on equal digests meaning schedules equal up to names, and anonymous schedules have
    /// none; so the result does not depend on which rank's digest was computed first (keys
    /// are computed in parallel).
    pub(crate) fn take_built(&self, ctx: &Ctx, view: &RankView) -> Option<Built> {
        let d = *self.digests.lock().ok()?.get(&view.key(ctx))?;
        self.built.lock().ok()?.get(&d).cloned()
    }
}

/// Which placed matrices the rank owns (owner placement changes its FSDP ops and memory).
fn placement_signature(ctx: &Ctx, view: &RankView) -> Vec<bool> {
    ctx.opt
        .placed
        .iter()
        .zip(&ctx.opt.params)
        .filter_map(|(o, p)| {
            o.map(|o| p.held_by(view.class) && o == view.fsdp_pos[Ctx::domain_index(p.domain)])
        })
        .collect()
}

/// The optimizer schedule of `rank` (empty for the placeholder AdamW), with op names when
/// `named`. An unnamed schedule reuses the one [`OptCtx::digest`] built for the rank's
/// optimizer coordinate, if any (one build per coordinate on folded jobs), else, for
/// HyperParallel Muon, is assembled from the job's cached parts.
pub(crate) fn schedule(ctx: &Ctx, rank: usize, named: bool) -> Schedule {
    if named {
        let view = RankView::new(ctx, rank);
        return build(ctx, &view, Schedule::default());
    }
    match unnamed(ctx, rank) {
        Built::Whole(s) => s,
        Built::Parts(p) => p.assemble(Schedule {
            anonymous: true,
            ..Schedule::default()
        }),
    }
}

/// The unnamed schedule of `rank` ([`schedule`]) as kept: whole, or as its HyperParallel
/// parts, which lower without being assembled ([`Built::layout`]).
pub(crate) fn unnamed(ctx: &Ctx, rank: usize) -> Built {
    let view = RankView::new(ctx, rank);
    match ctx.opt.take_built(ctx, &view) {
        Some(b) => b,
        // Anonymous HyperParallel parts come from the job's part cache.
        None if ctx.opt.strategy == OptimizerStrategy::HyperParallelMuon => Built::Parts(
            hyperparallel::parts(ctx, &view, true, Some(&ctx.opt.hp_pieces.parts)),
        ),
        None => {
            let empty = Schedule {
                anonymous: true,
                ..Schedule::default()
            };
            Built::Whole(build(ctx, &view, empty))
        }
    }
}

/// Appends the strategy's ops for `view` to `s` (empty, possibly anonymous).
fn build(ctx: &Ctx, view: &RankView, s: Schedule) -> Schedule {
    match ctx.opt.strategy {
        OptimizerStrategy::AdamW => s,
        OptimizerStrategy::HyperParallelMuon => hyperparallel::schedule(ctx, view, s),
        OptimizerStrategy::Naive => naive::schedule(ctx, view, s),
        OptimizerStrategy::Moonlight => moonlight::schedule(ctx, view, s),
        OptimizerStrategy::DMuon => dmuon::schedule(ctx, view, s),
        OptimizerStrategy::MatrixFsdp => matrixfsdp::schedule(ctx, view, s),
        OptimizerStrategy::FlexShard => flexshard::schedule(ctx, view, s),
    }
}

/// Hash of the rank's optimizer schedule (0 for the placeholder AdamW, whose ops do not
/// depend on the rank beyond its class).
pub(crate) fn template_digest(ctx: &Ctx, rank: usize) -> u64 {
    if !ctx.opt.strategy.is_muon() {
        return 0;
    }
    ctx.opt.digest(ctx, rank)
}
