//! Expert-parallel routing load: how many routed token copies the **busiest** expert-parallel
//! rank receives in one MoE layer, for all-to-all-v sizes and the busiest rank's expert GEMMs.
//!
//! Model. An EP group of `ep` ranks each brings `tokens` tokens; every token picks `top_k`
//! distinct experts uniformly at random out of `experts`; rank `r` hosts `g = experts / ep` of
//! them. The copies one token sends to rank `r` are hypergeometric (`top_k` draws, `g` of
//! `experts` marked): mean `top_k g / E`, variance `top_k (g/E)(1 - g/E)(E - top_k)/(E - 1)`.
//! Summed over the `N = ep * tokens` independent tokens, rank `r` receives `X_r` copies with
//! mean `mu = N top_k / ep` (= `tokens * top_k`, the load-balanced figure) and variance
//! `N` times the per-token one. The `X_r` are approximately normal and exchangeable with a
//! fixed sum, i.e. `X_r - mu = sigma sqrt(ep / (ep - 1)) (Z_r - mean(Z))` for independent
//! standard normals `Z_r`; since `E[max(Z_r - mean(Z))] = E[max Z_r]`, the busiest rank's
//! expected load is `mu + sigma sqrt(ep / (ep - 1)) e(ep)`, where `e(n)` is the expected
//! maximum of `n` independent standard normals (computed by numerical integration,
//! deterministic; checked against a seeded Monte-Carlo in the tests). The result is
//! multiplied by the scenario's
//! `[train] routing_skew` (>= 1.0) for routers that are less balanced than random, and capped
//! at the most a rank can receive (`N * min(top_k, g)`).
//!
//! With `ep = 1` there is one rank: its load is exactly `tokens * top_k` and the skew factor
//! does not apply (it describes imbalance between EP ranks).

/// Routed load of one MoE layer on the busiest expert-parallel rank.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RoutedLoad {
    /// Expected token copies (token x expert assignments) the busiest rank computes.
    pub busiest_copies: f64,
    /// The load-balanced figure, `tokens * top_k`.
    pub mean_copies: f64,
    /// Experts hosted per rank.
    pub local_experts: u64,
}

impl RoutedLoad {
    /// Busiest-rank copies over the balanced figure (>= 1).
    pub fn imbalance(&self) -> f64 {
        if self.mean_copies > 0.0 {
            self.busiest_copies / self.mean_copies
        } else {
            1.0
        }
    }

    /// Tokens per local expert on the busiest rank (rows of each grouped-GEMM product).
    pub fn tokens_per_expert(&self) -> f64 {
        self.busiest_copies / self.local_experts.max(1) as f64
    }
}

/// The busiest rank's routed load for `tokens` tokens per rank, `top_k` of `experts` experts,
/// `ep` expert-parallel ranks and a skew factor `skew >= 1`.
pub fn busiest_rank_load(tokens: f64, experts: u64, top_k: u64, ep: u64, skew: f64) -> RoutedLoad {
    let ep = ep.max(1);
    let e = experts.max(1) as f64;
    let k = (top_k.max(1) as f64).min(e);
    let local_experts = (experts / ep).max(1);
    let mean = tokens * k;
    if ep == 1 || experts <= 1 {
        return RoutedLoad {
            busiest_copies: mean,
            mean_copies: mean,
            local_experts,
        };
    }
    let share = local_experts as f64 / e;
    let per_token_var = if e > 1.0 {
        k * share * (1.0 - share) * (e - k) / (e - 1.0)
    } else {
        0.0
    };
    let n = tokens * ep as f64;
    let sigma = (n * per_token_var).sqrt();
    // Fixed-sum correction: the deviations of `ep` exchangeable ranks sum to zero.
    let sum_fixed = (ep as f64 / (ep as f64 - 1.0)).sqrt();
    let cap = n * k.min(local_experts as f64);
    let busiest =
        ((mean + sigma * sum_fixed * expected_max_std_normal(ep)) * skew.max(1.0)).min(cap);
    RoutedLoad {
        busiest_copies: busiest.max(mean.min(cap)),
        mean_copies: mean,
        local_experts,
    }
}

/// Expected maximum of `n` independent standard normal variables:
/// `integral x n phi(x) Phi(x)^(n-1) dx`, by Simpson's rule on [-12, 12] (4,800 intervals).
pub fn expected_max_std_normal(n: u64) -> f64 {
    if n <= 1 {
        return 0.0;
    }
    let steps = 4800usize;
    let (lo, hi) = (-12.0f64, 12.0f64);
    let h = (hi - lo) / steps as f64;
    let f = |x: f64| x * n as f64 * std_normal_pdf(x) * std_normal_cdf(x).powi(n as i32 - 1);
    let mut sum = f(lo) + f(hi);
    for i in 1..steps {
        let x = lo + i as f64 * h;
        sum += if i % 2 == 1 { 4.0 } else { 2.0 } * f(x);
    }
    sum * h / 3.0
}

fn std_normal_pdf(x: f64) -> f64 {
    (-0.5 * x * x).exp() / (2.0 * std::f64::consts::PI).sqrt()
}

/// Standard normal CDF through `erfc` (Abramowitz & Stegun 7.1.26, absolute error < 1.5e-7).
fn std_normal_cdf(x: f64) -> f64 {
    let z = x / std::f64::consts::SQRT_2;
    let t = 1.0 / (1.0 + 0.327_591_1 * z.abs());
    let poly = t
        * (0.254_829_592
            + t * (-0.284_496_736
                + t * (1.421_413_741 + t * (-1.453_152_027 + t * 1.061_405_429))));
    let erfc_abs = poly * (-z * z).exp();
    if z >= 0.0 {
        1.0 - 0.5 * erfc_abs
    } else {
        0.5 * erfc_abs
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expected_max_of_normals_matches_known_values() {
        // Tabulated: E[max] of 2, 4, 8, 16 standard normals.
        for (n, want) in [(2, 0.5642), (4, 1.0294), (8, 1.4236), (16, 1.7660)] {
            let got = expected_max_std_normal(n);
            assert!((got - want).abs() < 2e-3, "n = {n}: {got} vs {want}");
        }
        assert_eq!(expected_max_std_normal(1), 0.0);
    }

    /// Seeded xorshift for the Monte-Carlo check (test only).
    struct Rng(u64);
    impl Rng {
        fn below(&mut self, n: u64) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0 % n
        }
    }

    fn monte_carlo(tokens: u64, experts: u64, top_k: u64, ep: u64, trials: u32) -> f64 {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let g = experts / ep;
        let mut total = 0.0;
        for _ in 0..trials {
            let mut per_rank = vec![0u64; ep as usize];
            for _ in 0..tokens * ep {
                let mut picked: Vec<u64> = Vec::with_capacity(top_k as usize);
                while picked.len() < top_k as usize {
                    let x = rng.below(experts);
                    if !picked.contains(&x) {
                        picked.push(x);
                    }
                }
                for x in picked {
                    per_rank[(x / g) as usize] += 1;
                }
            }
            total += *per_rank.iter().max().unwrap() as f64;
        }
        total / trials as f64
    }

    #[test]
    fn busiest_rank_matches_a_seeded_monte_carlo() {
        for (tokens, experts, top_k, ep) in [(512, 128, 8, 4), (256, 64, 6, 8), (64, 16, 2, 2)] {
            let model = busiest_rank_load(tokens as f64, experts, top_k, ep, 1.0).busiest_copies;
            let mc = monte_carlo(tokens, experts, top_k, ep, 200);
            let mean = (tokens * top_k) as f64;
            assert!(mc > mean, "routing is never perfectly balanced");
            // The excess over the mean agrees within 10% (normal approximation; the Monte-Carlo
            // mean of 200 trials has a standard error of a few percent of the excess).
            let (em, ec) = (model - mean, mc - mean);
            assert!(
                (em - ec).abs() <= 0.10 * ec,
                "{tokens} tokens, {experts} experts, top-{top_k}, ep {ep}: model {model}, MC {mc}"
            );
        }
    }

    #[test]
    fn skew_scales_and_single_rank_is_balanced() {
        let a = busiest_rank_load(4096.0, 128, 8, 4, 1.0);
        let b = busiest_rank_load(4096.0, 128, 8, 4, 1.5);
        assert!((b.busiest_copies - 1.5 * a.busiest_copies).abs() < 1e-6);
        assert!(a.imbalance() > 1.0 && a.imbalance() < 1.05);
        let one = busiest_rank_load(4096.0, 128, 8, 1, 2.0);
        assert_eq!(one.busiest_copies, 4096.0 * 8.0);
        assert_eq!(one.tokens_per_expert(), 4096.0 * 8.0 / 128.0);
        // The cap: a rank cannot receive more than all copies aimed at its experts.
        let capped = busiest_rank_load(10.0, 4, 2, 2, 100.0);
        assert!(capped.busiest_copies <= 20.0 * 2.0);
    }
}
