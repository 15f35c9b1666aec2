//! Counter-based random numbers keyed by `(seed, stream, global element index)`.
//!
//! Element `i` of a stream is a pure function of `(seed, stream, i)`: a ChaCha8 key built from
//! the seed, the stream as the ChaCha nonce, and the word position set from `i`. So a rank that
//! owns elements `[a, b)` of a tensor generates exactly the values the full tensor has there,
//! under any sharding — initialization and dropout do not depend on the layout.
//!
//! - uniform: word `i` → `(w >> 8) · 2^-24` in `[0, 1)` (exact in f32);
//! - normal: words `2i, 2i+1` → Box–Muller in f64 with `libm` (`sqrt(-2 ln u1) · cos(2π u2)`,
//!   `u1` in `(0, 1]`), rounded once to f32.

use rand_chacha::ChaCha8Rng;
use rand_core::{Rng, SeedableRng};

/// A keyed random stream: the same `(seed, stream)` gives the same values everywhere.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KeyedRng {
    seed: u64,
    stream: u64,
}

/// FNV-1a over a name: a stable stream id for a parameter (e.g. `model.layers.0.mlp.up_proj.weight`).
pub fn stream_id(name: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in name.as_bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

const TWO_POW_MINUS_24: f64 = 1.0 / 16_777_216.0;

impl KeyedRng {
    /// The stream `stream` of the generator keyed by `seed`.
    pub fn new(seed: u64, stream: u64) -> KeyedRng {
        KeyedRng { seed, stream }
    }

    /// The stream named `name` (stream id = [`stream_id`] of the name).
    pub fn named(seed: u64, name: &str) -> KeyedRng {
        KeyedRng::new(seed, stream_id(name))
    }

    /// The seed.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// The stream id.
    pub fn stream(&self) -> u64 {
        self.stream
    }

    fn chacha_at(&self, word: u128) -> ChaCha8Rng {
        let mut key = [0u8; 32];
        key[..8].copy_from_slice(&self.seed.to_le_bytes());
        key[8..16].copy_from_slice(b"hpfsdp-r");
        let mut rng = ChaCha8Rng::from_seed(key);
        rng.set_stream(self.stream);
        rng.set_word_pos(word);
        rng
    }

    /// Fill `out` with the raw 32-bit words starting at word `first`.
    fn words(&self, first: u128, out: &mut [u32]) {
        let mut rng = self.chacha_at(first);
        for w in out {
            *w = rng.next_u32();
        }
    }

    /// Uniform value of element `index`, in `[0, 1)`.
    pub fn uniform(&self, index: u64) -> f32 {
        let mut w = [0u32; 1];
        self.words(u128::from(index), &mut w);
        word_to_unit(w[0]) as f32
    }

    /// Uniform values of elements `[start, end)` (empty if `end <= start`).
    pub fn uniform_range(&self, start: u64, end: u64) -> Vec<f32> {
        let n = end.saturating_sub(start) as usize;
        let mut w = vec![0u32; n];
        self.words(u128::from(start), &mut w);
        w.into_iter().map(|x| word_to_unit(x) as f32).collect()
    }

    /// Standard-normal value of element `index`.
    pub fn normal(&self, index: u64) -> f32 {
        let mut w = [0u32; 2];
        self.words(2 * u128::from(index), &mut w);
        box_muller(w[0], w[1])
    }

    /// Standard-normal values of elements `[start, end)`.
    pub fn normal_range(&self, start: u64, end: u64) -> Vec<f32> {
        let n = end.saturating_sub(start) as usize;
        let mut w = vec![0u32; 2 * n];
        self.words(2 * u128::from(start), &mut w);
        w.chunks_exact(2).map(|p| box_muller(p[0], p[1])).collect()
    }

    /// Whether element `index` is kept by dropout with keep probability `keep` (`u < keep`).
    pub fn keep(&self, index: u64, keep: f32) -> bool {
        self.uniform(index) < keep
    }
}

/// `(w >> 8) · 2^-24`: 24 random bits, exact in f32, in `[0, 1)`.
#[inline]
fn word_to_unit(w: u32) -> f64 {
    f64::from(w >> 8) * TWO_POW_MINUS_24
}

#[inline]
fn box_muller(w1: u32, w2: u32) -> f32 {
    let u1 = (f64::from(w1 >> 8) + 1.0) * TWO_POW_MINUS_24; // (0, 1]
    let u2 = word_to_unit(w2);
    let r = libm::sqrt(-2.0 * libm::log(u1));
    (r * libm::cos(2.0 * std::f64::consts::PI * u2)) as f32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_equal_the_slice_of_the_whole() {
        let rng = KeyedRng::named(42, "model.embed_tokens.weight");
        let whole_u = rng.uniform_range(0, 1000);
        let whole_n = rng.normal_range(0, 1000);
        for (a, b) in [
            (0, 1),
            (3, 17),
            (15, 16),
            (16, 33),
            (500, 1000),
            (999, 1000),
            (7, 7),
        ] {
            assert_eq!(rng.uniform_range(a, b), whole_u[a as usize..b as usize]);
            assert_eq!(rng.normal_range(a, b), whole_n[a as usize..b as usize]);
        }
        for i in [0u64, 1, 15, 16, 17, 998] {
            assert_eq!(rng.uniform(i), whole_u[i as usize]);
            assert_eq!(rng.normal(i).to_bits(), whole_n[i as usize].to_bits());
        }
    }

    #[test]
    fn any_sharding_reassembles_the_same_tensor() {
        let rng = KeyedRng::new(7, 3);
        let n = 103u64;
        let whole = rng.normal_range(0, n);
        for shards in [2u64, 3, 4, 8] {
            let chunk = n.div_ceil(shards);
            let mut joined = Vec::new();
            for s in 0..shards {
                joined.extend(rng.normal_range((s * chunk).min(n), ((s + 1) * chunk).min(n)));
            }
            assert_eq!(joined, whole);
        }
    }

    #[test]
    fn streams_and_seeds_differ_and_values_are_pinned() {
        let a = KeyedRng::new(1, 0).uniform_range(0, 8);
        let b = KeyedRng::new(1, 1).uniform_range(0, 8);
        let c = KeyedRng::new(2, 0).uniform_range(0, 8);
        assert_ne!(a, b);
        assert_ne!(a, c);
        assert!(a.iter().all(|&x| (0.0..1.0).contains(&x)));
        assert_ne!(stream_id("a"), stream_id("b"));
    }

    #[test]
    fn normal_moments_are_plausible() {
        let v = KeyedRng::new(5, 9).normal_range(0, 20_000);
        let mean: f64 = v.iter().map(|&x| f64::from(x)).sum::<f64>() / v.len() as f64;
        let var: f64 = v
            .iter()
            .map(|&x| (f64::from(x) - mean).powi(2))
            .sum::<f64>()
            / v.len() as f64;
        assert!(mean.abs() < 0.03, "{mean}");
        assert!((var - 1.0).abs() < 0.05, "{var}");
        assert!(v.iter().all(|x| x.is_finite()));
    }
}
