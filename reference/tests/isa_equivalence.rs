//! Whole-model bits do not depend on the matmul kernel variant (hardware FMA vs software fma).
//! A separate test binary, because `Isa::force` is process-wide.

use hpfsdp_reference::matmul::Isa;
use hpfsdp_reference::{ModelConfig, MoeConfig, TinyModel};

#[test]
fn every_kernel_variant_gives_the_same_gradients() {
    let c = ModelConfig {
        moe: Some(MoeConfig {
            experts: 3,
            top_k: 2,
            intermediate: 16,
            norm_topk_prob: true,
            first_dense_layers: 1,
        }),
        ..ModelConfig::tiny()
    };
    let model = TinyModel::new(c).unwrap();
    let params = c.init_params::<f32>(5).unwrap();
    let ids: Vec<usize> = (0..16).map(|i| (i * 7 + 1) % c.vocab).collect();
    let targets: Vec<usize> = (0..16).map(|i| (i * 3 + 2) % c.vocab).collect();
    let mut results = Vec::new();
    for isa in [Isa::Avx512, Isa::Avx2Fma, Isa::Portable] {
        if Isa::force(Some(isa)).is_err() {
            continue;
        }
        let (loss, grads) = model.loss_and_grads(&params, &ids, &targets, 8).unwrap();
        results.push((isa, loss.to_bits(), grads));
    }
    Isa::force(None).unwrap();
    let (_, loss, grads) = &results[0];
    for (isa, l, g) in &results[1..] {
        assert_eq!(l, loss, "{isa:?} loss");
        assert!(g.bit_eq(grads), "{isa:?} gradients");
    }
    assert!(!results.is_empty());
}
