//! bf16 rounding at the points a plan asks for: explicit round-to-nearest-even from f32.
//!
//! Only f32 → bf16 is offered: `half::bf16::from_f64` drops the f64's low bits before rounding
//! and so rounds some values wrongly (e.g. `1 + 2^-8 + 2^-52`); going through `as f32` first
//! double-rounds the same way. Widening bf16 → f32 is exact.

pub use half::bf16;

use crate::tensor::Tensor;

/// Round one f32 to bf16: nearest, ties to even; NaN stays NaN (quiet), overflow gives ±inf,
/// subnormals are kept (no flush to zero).
#[inline]
pub fn round_to_bf16(x: f32) -> bf16 {
    bf16::from_f32(x)
}

/// Round, then widen back: the f32 value a bf16 store-and-load would give.
#[inline]
pub fn quantize_bf16(x: f32) -> f32 {
    bf16::from_f32(x).to_f32()
}

/// Round a slice to bf16.
pub fn to_bf16_vec(xs: &[f32]) -> Vec<bf16> {
    xs.iter().map(|&x| bf16::from_f32(x)).collect()
}

/// Widen a bf16 slice to f32 (exact).
pub fn to_f32_vec(xs: &[bf16]) -> Vec<f32> {
    xs.iter().map(|x| x.to_f32()).collect()
}

/// Round every element of a slice through bf16 in place.
pub fn quantize_bf16_in_place(xs: &mut [f32]) {
    for x in xs {
        *x = quantize_bf16(*x);
    }
}

impl Tensor<f32> {
    /// A copy with every element rounded through bf16.
    pub fn quantize_bf16(&self) -> Tensor<f32> {
        self.map(quantize_bf16)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Independent RNE reference on the bit pattern (non-NaN inputs).
    fn reference(x: f32) -> u16 {
        let b = x.to_bits();
        ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) as u16
    }

    #[test]
    fn ties_go_to_even() {
        assert_eq!(round_to_bf16(f32::from_bits(0x3F80_8000)).to_bits(), 0x3F80);
        assert_eq!(round_to_bf16(f32::from_bits(0x3F81_8000)).to_bits(), 0x3F82);
        assert_eq!(round_to_bf16(f32::from_bits(0x3F80_8001)).to_bits(), 0x3F81);
    }

    #[test]
    fn edge_cases() {
        assert_eq!(round_to_bf16(f32::MAX).to_bits(), 0x7F80, "overflow to inf");
        assert_eq!(
            round_to_bf16(f32::from_bits(0x0000_8001)).to_bits(),
            0x0001,
            "subnormal kept"
        );
        assert!(round_to_bf16(f32::NAN).is_nan());
        assert_eq!(round_to_bf16(-0.0).to_bits(), 0x8000);
    }

    #[test]
    fn matches_bit_reference_on_a_sweep() {
        // Every 65,537th bit pattern plus neighbours of each tie point in one binade.
        let mut n = 0u64;
        let mut b: u32 = 0;
        loop {
            let x = f32::from_bits(b);
            if !x.is_nan() {
                assert_eq!(round_to_bf16(x).to_bits(), reference(x), "{b:#010x}");
                n += 1;
            }
            match b.checked_add(65_537) {
                Some(nb) => b = nb,
                None => break,
            }
        }
        for hi in 0x3F80u32..0x3F90 {
            for lo in [0x7FFFu32, 0x8000, 0x8001] {
                let x = f32::from_bits((hi << 16) | lo);
                assert_eq!(round_to_bf16(x).to_bits(), reference(x));
            }
        }
        assert!(n > 60_000);
    }

    #[test]
    fn the_f64_pitfall_is_real() {
        // Why this module only rounds from f32: the correctly rounded bf16 of 1 + 2^-8 + 2^-52
        // is 0x3F81, and `from_f64` gives 0x3F80.
        let x = 1.0 + 2f64.powi(-8) + 2f64.powi(-52);
        assert_eq!(half::bf16::from_f64(x).to_bits(), 0x3F80);
        assert_eq!(
            round_to_bf16(1.0 + 2f32.powi(-8) + 2f32.powi(-23)).to_bits(),
            0x3F81
        );
    }

    #[test]
    fn round_trip_is_identity_on_bf16_values() {
        for bits in (0u16..=0xFFFF).step_by(7) {
            let v = bf16::from_bits(bits);
            if !v.is_nan() {
                assert_eq!(round_to_bf16(v.to_f32()).to_bits(), bits);
            }
        }
        let mut xs = vec![1.0f32 + 2f32.powi(-10), 3.0];
        quantize_bf16_in_place(&mut xs);
        assert_eq!(xs, vec![1.0, 3.0]);
        assert_eq!(to_f32_vec(&to_bf16_vec(&[0.5, 2.0])), vec![0.5, 2.0]);
    }
}
