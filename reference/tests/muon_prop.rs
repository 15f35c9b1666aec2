//! Property test: on random small meshes (HSDP replicas, FSDP shards, TP), random model dims
//! (uneven splits included), random presets and replica subgroup sizes, the deduplicated
//! distributed Muon equals naive distributed Muon and single-device Muon bit for bit, and
//! replicas hold identical bits.

use std::path::PathBuf;

use hpfsdp_plan::scenario::Scenario;
use hpfsdp_reference::muon::{AdapterRules, MuonSetup};
use proptest::prelude::*;

fn temp_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("hpfsdp-muon-prop-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[allow(clippy::too_many_arguments)]
fn scenario_text(
    rep: usize,
    shard: usize,
    tp: usize,
    dpm: usize,
    preset: &str,
    replica_count: Option<usize>,
) -> String {
    let world = rep * shard * tp;
    let rc = replica_count.map_or(String::new(), |c| {
        format!("[optimizer.muon]\nreplica_count = {c}\n")
    });
    format!(
        r#"name = "prop"
hardware = "ascend-910c-a3"
[model]
compact = "model.toml"
dtype = "f32"
[mesh]
dp_replicate = {rep}
dp_shard = {shard}
tp = {tp}
[topology]
dies_per_machine = {dpm}
machines_per_supernode = {m}
supernodes = 1
[train]
seq_len = 8
global_batch = {gb}
micro_batch = 1
[optimizer]
kind = "muon+adamw"
preset = "{preset}"
{rc}"#,
        m = world / dpm,
        gb = rep * shard,
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, max_global_rejects: 200, ..ProptestConfig::default() })]

    #[test]
    fn dedup_equals_naive_and_single_on_random_meshes(
        rep in 1usize..=3,
        shard in 1usize..=4,
        tp in 1usize..=2,
        dpm_pick in 0usize..4,
        preset in prop::sample::select(vec!["hyperparallel", "keller-jordan", "torch", "moonlight"]),
        heads in prop::sample::select(vec![2usize, 4]),
        head_dim in prop::sample::select(vec![4usize, 6]),
        hidden in prop::sample::select(vec![10usize, 16, 24]),
        inter in prop::sample::select(vec![12usize, 20, 33]),
        rc_pick in 0usize..3,
        seed in 0u64..1000,
    ) {
        let world = rep * shard * tp;
        prop_assume!((2..=12).contains(&world));
        let divisors: Vec<usize> = (1..=world).filter(|d| world.is_multiple_of(*d)).collect();
        let dpm = divisors[dpm_pick % divisors.len()];
        let rep_divisors: Vec<usize> = (1..=rep).filter(|d| rep.is_multiple_of(*d)).collect();
        let replica_count = (rc_pick > 0 && rep > 1).then(|| rep_divisors[rc_pick % rep_divisors.len()]);
        let dir = temp_dir();
        std::fs::write(
            dir.join("model.toml"),
            format!(
                "name = \"prop\"\nfamily = \"llama\"\nhidden_size = {hidden}\nnum_hidden_layers = 1\n\
                 num_attention_heads = {heads}\nnum_key_value_heads = 2\nhead_dim = {head_dim}\n\
                 vocab_size = 40\nintermediate_size = {inter}\n"
            ),
        )
        .unwrap();
        let text = scenario_text(rep, shard, tp, dpm, preset, replica_count);
        let scenario = Scenario::from_str_at(&text, &dir.join("prop.toml"));
        prop_assume!(scenario.is_ok());
        let setup = MuonSetup::from_scenario(&scenario.unwrap(), &AdapterRules::none());
        prop_assume!(setup.is_ok());
        let setup = setup.unwrap();
        let params = setup.random_set(seed, 0.02).unwrap();
        let grads: Vec<_> = (0..2).map(|s| setup.random_set(seed + 17 + s, 1.0).unwrap()).collect();
        let (single, _) = setup.run_single(&params, &grads).unwrap();
        let dedup = setup.run_distributed(&params, &grads, false).unwrap();
        let naive = setup.run_distributed(&params, &grads, true).unwrap();
        for (rank, (d, n)) in dedup.locals.iter().zip(&naive.locals).enumerate() {
            prop_assert!(d.bit_eq(n), "rank {} dedup != naive ({})", rank, text);
        }
        // gather_set fails if replicas disagree in any bit.
        let gathered = setup.gather_set(&dedup.locals).unwrap();
        prop_assert!(gathered.bit_eq(&single), "distributed != single ({})", text);
        prop_assert!(!gathered.bit_eq(&params));
    }
}
