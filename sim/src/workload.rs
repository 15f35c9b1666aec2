//! Workloads: the programs of one job, either one per rank or one per symmetry class.

use crate::error::SimError;
use crate::fold::{self, Classes, RankView, check_program};
use crate::fold_mesh::{self, GroupFamilyTable};
use crate::whatif::WhatIfModel;
use hpfsdp_plan::Topology;
use hpfsdp_plan::topology::Tier;
use hpfsdp_program::step::{Group, Op, Payload, RankRange, SharedOps, StepProgram};
use rayon::prelude::*;
use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

/// One simulated rank: a representative program standing for one or more identical ranks.
#[derive(Debug, Clone, PartialEq)]
pub struct SimUnit {
    /// The representative's program (its `rank` is the smallest rank of the class).
    pub program: StepProgram,
    /// Every rank the unit stands for, itself included.
    pub ranks: Vec<RankRange>,
}

/// The programs of one job on one topology, ready to simulate.
#[derive(Debug, Clone, PartialEq)]
pub struct Workload {
    /// Number of ranks in the job.
    pub world_size: usize,
    /// Where the ranks sit.
    pub topology: Topology,
    /// Simulated units, ascending by representative rank.
    pub units: Vec<SimUnit>,
    /// Unit index of every rank.
    pub rank_unit: Vec<u32>,
    /// True when some unit stands for more than one rank.
    pub folded: bool,
    /// What-if faults applied by the engine (`None` = none; see [`crate::whatif`]).
    pub whatif: Option<WhatIfModel>,
}

impl Workload {
    /// One unit per rank (folding disabled); `programs[r]` must be rank `r`'s program.
    pub fn unfolded(programs: Vec<StepProgram>, topology: Topology) -> Result<Self, SimError> {
        let world_size = programs.len();
        check_world(world_size, &topology)?;
        for (r, p) in programs.iter().enumerate() {
            check_program(p, r, world_size)?;
            check_tiers(p, &topology)?;
        }
        let classes = Classes::identity(world_size);
        Ok(Self::assemble_reps(world_size, topology, classes, programs))
    }

    /// Folds explicit per-rank programs into symmetry classes (see [`crate::fold`]).
    pub fn folded(programs: Vec<StepProgram>, topology: Topology) -> Result<Self, SimError> {
        let world_size = programs.len();
        check_world(world_size, &topology)?;
        let classes = fold::classes(world_size, &topology, |r| Ok(Cow::Borrowed(&programs[r])))?;
        let mut programs: Vec<Option<StepProgram>> = programs.into_iter().map(Some).collect();
        let reps = classes
            .members
            .iter()
            .map(|m| {
                // Classes are disjoint, so every representative's program is taken once.
                let p = programs[m[0]].take().ok_or_else(|| {
                    SimError::Workload(format!("rank {} represents two classes", m[0]))
                })?;
                check_tiers(&p, &topology)?;
                Ok(p)
            })
            .collect::<Result<Vec<_>, SimError>>()?;
        Ok(Self::assemble_reps(world_size, topology, classes, reps))
    }

    /// Folds a job whose programs come from a generator, never holding more than one
    /// non-representative program at a time; `program(rank)` is called once per rank and once
    /// more per representative. This is how 100,000-rank jobs are simulated.
    pub fn fold_with<F>(world_size: usize, topology: Topology, program: F) -> Result<Self, SimError>
    where
        F: Fn(usize) -> Result<StepProgram, SimError> + Sync,
    {
        check_world(world_size, &topology)?;
        let classes = fold::classes(world_size, &topology, |r| program(r).map(Cow::Owned))?;
        let reps = classes
            .members
            .iter()
            .map(|m| {
                let p = program(m[0])?;
                check_tiers(&p, &topology)?;
                Ok(p)
            })
            .collect::<Result<Vec<_>, SimError>>()?;
        Ok(Self::assemble_reps(world_size, topology, classes, reps))
    }

    /// Folds a job whose ranks share a few program **templates**: two ranks with equal
    /// `template_key(rank)` must have programs that are identical except for the ranks inside
    /// their groups and op names (different keys may still turn out identical: templates
    /// whose programs are equal fold together), and `groups(rank)` is the group table of
    /// `rank`'s program. One program per template is generated, and reused as its class's
    /// representative where it is one, so a 100,000-rank job costs group tables, not
    /// programs. The classes are the same as [`Workload::fold_with`] finds when the key is
    /// honest; a test checks this. Op names are kept on rank 0's program only (reports name
    /// spans from it).
    pub fn fold_templated<K, G, P>(
        world_size: usize,
        topology: Topology,
        template_key: K,
        groups: G,
        program: P,
    ) -> Result<Self, SimError>
    where
        K: Fn(usize) -> u64 + Sync,
        G: Fn(usize) -> Result<Vec<Group>, SimError> + Sync,
        P: Fn(usize) -> Result<StepProgram, SimError> + Sync,
    {
        Self::fold_templated_salted(world_size, topology, template_key, groups, program, |_| 0)
    }

    /// [`Workload::fold_templated`] where `salt(rank)` is XORed into the rank's program
    /// digest: ranks with different salts never fold together (what-if factors, see
    /// [`WhatIfModel::fold_salt`]); a salt of 0 everywhere folds exactly as without it.
    pub fn fold_templated_salted<K, G, P, S>(
        world_size: usize,
        topology: Topology,
        template_key: K,
        groups: G,
        program: P,
        salt: S,
    ) -> Result<Self, SimError>
    where
        K: Fn(usize) -> u64 + Sync,
        G: Fn(usize) -> Result<Vec<Group>, SimError> + Sync,
        P: Fn(usize) -> Result<StepProgram, SimError> + Sync,
        S: Fn(usize) -> u128 + Sync,
    {
        check_world(world_size, &topology)?;
        let (keys, templates) = generate_templates(world_size, &template_key, &program)?;
        let classes = fold::classes_of_views(world_size, &topology, |rank| {
            Ok(RankView {
                ops_digest: templates[&keys[rank]].0 ^ salt(rank),
                groups: Cow::Owned(groups(rank)?),
            })
        })?;
        let reps = take_reps(&classes, &keys, templates, &topology, &program, &groups)?;
        Ok(Self::assemble_reps(world_size, topology, classes, reps))
    }

    /// [`Workload::fold_templated_salted`] with every rank's group table given by arithmetic
    /// on the mesh (`families`, one entry per table position, see [`crate::fold_mesh`])
    /// instead of listed per rank: the same classes, in time linear in the ranks.
    pub fn fold_on_mesh<K, P, S>(
        world_size: usize,
        topology: Topology,
        template_key: K,
        families: &[GroupFamilyTable],
        program: P,
        salt: S,
    ) -> Result<Self, SimError>
    where
        K: Fn(usize) -> u64 + Sync,
        P: Fn(usize) -> Result<StepProgram, SimError> + Sync,
        S: Fn(usize) -> u128 + Sync,
    {
        check_world(world_size, &topology)?;
        let (keys, templates) = generate_templates(world_size, &template_key, &program)?;
        let local: Vec<u128> = (0..world_size)
            .into_par_iter()
            .with_min_len(4096)
            .map(|r| templates[&keys[r]].0 ^ salt(r))
            .collect();
        let classes = fold_mesh::classes_on_mesh(world_size, &topology, &local, families)?;
        drop(local);
        let groups = |r: usize| {
            families
                .iter()
                .map(|f| {
                    Group::new(f.label.clone(), f.groups.group_of(r))
                        .map_err(|e| SimError::Workload(format!("rank {r}: {e}")))
                })
                .collect()
        };
        let reps = take_reps(&classes, &keys, templates, &topology, &program, &groups)?;
        Ok(Self::assemble_reps(world_size, topology, classes, reps))
    }

    fn assemble_reps(
        world_size: usize,
        topology: Topology,
        classes: Classes,
        reps: Vec<StepProgram>,
    ) -> Self {
        let folded = classes.members.iter().any(|m| m.len() > 1);
        let units = reps
            .into_iter()
            .zip(&classes.members)
            .map(|(program, m)| SimUnit {
                program,
                ranks: RankRange::compress(m),
            })
            .collect();
        Self {
            world_size,
            topology,
            units,
            rank_unit: classes.rank_class,
            folded,
            whatif: None,
        }
    }

    /// Total number of ops over the simulated units.
    pub fn simulated_ops(&self) -> usize {
        self.units.iter().map(|u| u.program.ops.len()).sum()
    }
}

/// Template programs by template key: (digest of the program's ops, its first rank, the
/// program until it is taken as a representative).
type Templates = HashMap<u64, (u128, usize, Option<StepProgram>)>;

/// Every rank's template key, and one program per template, generated from its first rank.
/// The programs are kept, since the first rank of a template is the smallest rank of its
/// class unless the class merges templates whose programs turn out equal.
fn generate_templates<K, P>(
    world_size: usize,
    template_key: &K,
    program: &P,
) -> Result<(Vec<u64>, Templates), SimError>
where
    K: Fn(usize) -> u64 + Sync,
    P: Fn(usize) -> Result<StepProgram, SimError> + Sync,
{
    // One program per template, from its first rank; kept, since the first rank of a
    // template is the smallest rank of its class unless the class merges templates whose
    // programs turn out equal.
    // In parallel (the Muon keys build one optimizer schedule per coordinate, which the
    // template's program then reuses whichever rank built it); collected in rank order.
    let keys: Vec<u64> = (0..world_size)
        .into_par_iter()
        .with_min_len(1024)
        .map(template_key)
        .collect();
    let mut firsts: Vec<usize> = Vec::new();
    let mut seen: HashSet<u64> = HashSet::new();
    for (rank, &key) in keys.iter().enumerate() {
        if seen.insert(key) {
            firsts.push(rank);
        }
    }
    // Generated in parallel, kept in rank order; the first failing template (in rank
    // order) is the error, whatever the number of threads.
    // Programs built on a shared prefix hash it once (and validate it once, see
    // `StepProgram::validate`).
    let prefixes = fold::PrefixDigests::default();
    let generated: Vec<Result<(u128, StepProgram), SimError>> = firsts
        .par_iter()
        .map(|&rank| {
            let mut p = program(rank)?;
            check_program(&p, rank, world_size)?;
            if rank != 0 {
                strip_names(&mut p);
            }
            Ok((fold::ops_digest_with(&p, Some(&prefixes)), p))
        })
        .collect();
    drop(prefixes);
    let mut templates = Templates::new();
    for (rank, g) in firsts.into_iter().zip(generated) {
        let (digest, p) = g?;
        templates.insert(keys[rank], (digest, rank, Some(p)));
    }
    Ok((keys, templates))
}

/// The representative program of every class: its template's program, moved to its last
/// class and copied for the others (the copies share its ops:
/// [`OpSeq::share_tail`](hpfsdp_program::step::OpSeq::share_tail)); a class whose smallest rank did not generate it gets
/// the copy relabelled ([`relabel`]: the template key promises equal programs up to group
/// ranks and names), or its program generated again when the template's group table does
/// not match. Each checked against the topology.
fn take_reps<P, G>(
    classes: &Classes,
    keys: &[u64],
    mut templates: Templates,
    topology: &Topology,
    program: &P,
    groups: &G,
) -> Result<Vec<StepProgram>, SimError>
where
    P: Fn(usize) -> Result<StepProgram, SimError> + Sync,
    G: Fn(usize) -> Result<Vec<Group>, SimError> + Sync,
{
    let world_size = keys.len();
    let mut users: HashMap<u64, usize> = HashMap::new();
    for m in &classes.members {
        *users.entry(keys[m[0]]).or_default() += 1;
    }
    let mut tier_checks = TierChecks::default();
    classes
        .members
        .iter()
        .map(|m| {
            let rep = m[0];
            let key = keys[rep];
            let left = users.get_mut(&key).map(|n| {
                *n -= 1;
                *n
            });
            let template = match templates.get_mut(&key) {
                Some((_, first, p)) if left == Some(0) => p.take().map(|p| (*first, p)),
                Some((_, first, Some(p))) => {
                    // Copies share the template's ops (only the rank and groups change).
                    p.ops.share_tail();
                    Some((*first, p.clone()))
                }
                _ => None,
            };
            let p = match template {
                Some((first, p)) if first == rep => p,
                Some((_, p)) => match relabel(p, rep, groups(rep)?) {
                    Some(p) => {
                        check_program(&p, rep, world_size)?;
                        p
                    }
                    None => regenerate(program, rep, world_size)?,
                },
                None => regenerate(program, rep, world_size)?,
            };
            tier_checks.check(&p, topology)?;
            Ok(p)
        })
        .collect::<Result<Vec<_>, SimError>>()
}

/// `rank`'s program generated and checked.
fn regenerate<P>(program: &P, rank: usize, world_size: usize) -> Result<StepProgram, SimError>
where
    P: Fn(usize) -> Result<StepProgram, SimError>,
{
    let p = program(rank)?;
    check_program(&p, rank, world_size)?;
    Ok(p)
}

/// Another rank's program of the same template as `rank`'s: its rank set, its group table
/// replaced by `groups` (`rank`'s own), and its op names dropped (only rank 0 keeps names).
/// `None` when `groups` does not have the template's labels and sizes, position by position.
fn relabel(mut p: StepProgram, rank: usize, groups: Vec<Group>) -> Option<StepProgram> {
    let same_shape = p.groups.len() == groups.len()
        && p.groups
            .iter()
            .zip(&groups)
            .all(|(a, b)| a.label == b.label && a.ranks.len() == b.ranks.len());
    if !same_shape {
        return None;
    }
    if rank != 0 {
        strip_names(&mut p);
    }
    p.rank = rank;
    p.groups = groups;
    Some(p)
}

/// Drops a program's op names: labels for reports, which name spans from rank 0's program
/// only; on a job of hundreds of templates they are the bulk of its small allocations. A
/// program without names is left as it is (a shared op prefix stays shared).
fn strip_names(p: &mut StepProgram) {
    if p.ops.iter().all(|op| op.name.is_none()) {
        return;
    }
    for op in &mut p.ops {
        op.name = None;
    }
}

/// [`check_tiers`] that checks a shared op prefix once per group-tier table: the prefix's
/// collectives agree with a program's topology tiers whenever they agreed for another
/// program on the same prefix with the same tier per group.
#[derive(Default)]
struct TierChecks {
    passed: HashSet<(usize, Vec<Tier>)>,
    /// Prefixes seen, kept alive so that their addresses stay unique.
    prefixes: Vec<Arc<SharedOps>>,
}

impl TierChecks {
    fn check(&mut self, program: &StepProgram, topology: &Topology) -> Result<(), SimError> {
        let Some(shared) = program.ops.shared() else {
            return check_tiers(program, topology);
        };
        let tiers: Vec<Tier> = program
            .groups
            .iter()
            .map(|g| topology.tier_of(&g.ranks))
            .collect();
        let key = (Arc::as_ptr(shared) as usize, tiers);
        if !self.passed.contains(&key) {
            // The whole program: a fault in the prefix is reported as without sharing.
            check_tiers(program, topology)?;
            self.prefixes.push(shared.clone());
            self.passed.insert(key);
            return Ok(());
        }
        check_ops_tiers(
            program,
            program.ops.iter_from(program.ops.prefix_len()),
            &key.1,
        )
    }
}

fn check_world(world_size: usize, topology: &Topology) -> Result<(), SimError> {
    if world_size == 0 {
        return Err(SimError::Workload("the job has no ranks".into()));
    }
    if world_size > topology.world_size() {
        return Err(SimError::Workload(format!(
            "the job has {world_size} ranks but the topology holds only {} ({} per machine x {} machines per supernode x {} supernodes)",
            topology.world_size(),
            topology.dies_per_machine,
            topology.machines_per_supernode,
            topology.supernodes
        )));
    }
    Ok(())
}

/// Every collective's declared tier must be the tier its group crosses on this topology.
fn check_tiers(program: &StepProgram, topology: &Topology) -> Result<(), SimError> {
    let tiers: Vec<_> = program
        .groups
        .iter()
        .map(|g| topology.tier_of(&g.ranks))
        .collect();
    check_ops_tiers(program, program.ops.iter(), &tiers)
}

/// [`check_tiers`] on the ops `ops` of `program`, with the tier of every group.
fn check_ops_tiers<'a>(
    program: &StepProgram,
    ops: impl Iterator<Item = &'a Op>,
    tiers: &[Tier],
) -> Result<(), SimError> {
    for op in ops {
        if let Payload::Collective(c) = &op.payload {
            let actual = tiers[c.group.index()];
            if c.tier != actual {
                let g = &program.groups[c.group.index()];
                return Err(SimError::Workload(format!(
                    "rank {}: {} declares tier {} but group '{}' ({} ranks) crosses {} on this topology",
                    program.rank,
                    op.id,
                    c.tier,
                    g.label,
                    g.ranks.len(),
                    actual
                )));
            }
        }
    }
    Ok(())
}
