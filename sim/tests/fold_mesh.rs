//! Folding on the mesh ([`Workload::fold_on_mesh`]: group tables by arithmetic) against the
//! reference that lists every rank's groups ([`Workload::fold_templated_salted`]): on real
//! strategy programs (every FSDP strategy, AdamW and the Muon strategies) the generator's
//! arithmetic group families are exactly its programs' group tables, and both folds give the
//! same workload (classes, numbering and representative programs), whose representatives
//! (moved or relabelled from template programs) are the programs their ranks generate.

use hpfsdp_plan::scenario::Scenario;
use hpfsdp_program::strategy::{OptimizerStrategy, ProgramGenerator, StrategyKind};
use hpfsdp_sim::fold_mesh::GroupFamilyTable;
use hpfsdp_sim::scenario_run::ScenarioPlans;
use hpfsdp_sim::{SimError, Workload};
use std::path::PathBuf;

fn plans(fixture: &str) -> ScenarioPlans {
    let at = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../scenarios/fixtures")
        .join(fixture);
    ScenarioPlans::new(Scenario::load(&at).unwrap())
}

/// Every (strategy, optimizer) pair the generator accepts on the scenario.
fn generators(plans: &ScenarioPlans) -> Vec<(String, ProgramGenerator)> {
    let mut out = Vec::new();
    for kind in [
        StrategyKind::HyperParallel,
        StrategyKind::Fsdp2,
        StrategyKind::MegatronDdp,
    ] {
        for opt in [
            "adamw",
            "hyperparallel",
            "naive",
            "moonlight",
            "dmuon",
            "matrixfsdp",
            "flexshard",
        ] {
            let optimizer = OptimizerStrategy::parse(opt).unwrap();
            if let Ok(g) = ProgramGenerator::with_optimizer(
                &plans.scenario,
                &plans.sharding,
                &plans.fsdp,
                kind,
                optimizer,
            ) {
                out.push((format!("{} + {opt}", kind.name()), g));
            }
        }
    }
    out
}

fn check(fixture: &str) {
    let plans = plans(fixture);
    let topology = plans.scenario.topology;
    let gens = generators(&plans);
    assert!(gens.len() >= 4, "{fixture}: {} generators", gens.len());
    for (what, g) in gens {
        let world = g.world_size();
        let families = g.group_families();
        for rank in 0..world {
            let listed = g.groups(rank).unwrap();
            assert_eq!(listed.len(), families.len(), "{what} rank {rank}");
            for (group, (label, fam)) in listed.iter().zip(&families) {
                assert_eq!(&group.label, label, "{what} rank {rank}");
                assert_eq!(
                    group.ranks,
                    fam.group_of(rank),
                    "{what} rank {rank} {label}"
                );
            }
        }
        let program = |r: usize| {
            g.program_shared(r)
                .map_err(|e| SimError::Workload(e.to_string()))
        };
        let tables: Vec<GroupFamilyTable> = families
            .into_iter()
            .map(|(label, groups)| GroupFamilyTable { label, groups })
            .collect();
        let on_mesh = Workload::fold_on_mesh(
            world,
            topology,
            |r| g.template_key(r),
            &tables,
            program,
            |_| 0,
        )
        .unwrap();
        let listed = Workload::fold_templated_salted(
            world,
            topology,
            |r| g.template_key(r),
            |r| g.groups(r).map_err(|e| SimError::Workload(e.to_string())),
            program,
            |_| 0,
        )
        .unwrap();
        assert_eq!(on_mesh, listed, "{what}");
        assert!(on_mesh.units.len() < world, "{what}: nothing folded");
        // Representatives taken from another rank's template (relabelled) are the programs
        // their own rank generates.
        for unit in &on_mesh.units {
            let rep = unit.program.rank;
            assert_eq!(unit.program, program(rep).unwrap(), "{what} rank {rep}");
        }
        // With a straggler: the same classes again.
        let salt = |r: usize| u128::from(r == world / 2 + 1);
        let a = Workload::fold_on_mesh(
            world,
            topology,
            |r| g.template_key(r),
            &tables,
            program,
            salt,
        )
        .unwrap();
        let b = Workload::fold_templated_salted(
            world,
            topology,
            |r| g.template_key(r),
            |r| g.groups(r).map_err(|e| SimError::Workload(e.to_string())),
            program,
            salt,
        )
        .unwrap();
        assert_eq!(a, b, "{what} with a straggler");
        let straggler = a.rank_unit[world / 2 + 1];
        let alone = a.rank_unit.iter().filter(|&&u| u == straggler).count();
        assert_eq!(alone, 1, "{what}: the straggler folded with another rank");
    }
}

#[test]
fn mesh_folding_equals_listed_folding_on_mini_exp_d() {
    check("mini-exp-d.toml");
}

#[test]
fn mesh_folding_equals_listed_folding_on_hsdp_muon() {
    check("muon-hsdp-2x8.toml");
}
