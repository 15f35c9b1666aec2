//! Fixed colours for categories, strategies and tiers, so every chart and every run uses the
//! same colour for the same thing.

use plotters::style::RGBColor;

/// Colour of time no device stream is busy.
pub const IDLE: RGBColor = RGBColor(0xcc, 0xcc, 0xcc);

/// A qualitative palette (Tableau 10) for strategies, tiers and unknown categories.
const QUALITATIVE: [RGBColor; 10] = [
    RGBColor(0x4e, 0x79, 0xa7),
    RGBColor(0xf2, 0x8e, 0x2b),
    RGBColor(0xe1, 0x57, 0x59),
    RGBColor(0x76, 0xb7, 0xb2),
    RGBColor(0x59, 0xa1, 0x4f),
    RGBColor(0xed, 0xc9, 0x48),
    RGBColor(0xb0, 0x7a, 0xa1),
    RGBColor(0xff, 0x9d, 0xa7),
    RGBColor(0x9c, 0x75, 0x5f),
    RGBColor(0xba, 0xb0, 0xac),
];

/// Colour of a category name; unknown names get a colour derived from a hash of the name.
pub fn category(name: &str) -> RGBColor {
    match name {
        "compute" => RGBColor(0x4e, 0x79, 0xa7),
        "copy" => RGBColor(0x76, 0xb7, 0xb2),
        "fsdp-ag" => RGBColor(0xf2, 0x8e, 0x2b),
        "fsdp-rs" => RGBColor(0xe1, 0x57, 0x59),
        "fsdp-ar" => RGBColor(0xb0, 0x7a, 0xa1),
        "tp" => RGBColor(0x59, 0xa1, 0x4f),
        "ep" => RGBColor(0xed, 0xc9, 0x48),
        "cp" => RGBColor(0x9c, 0x75, 0x5f),
        "pp" => RGBColor(0xff, 0x9d, 0xa7),
        "optimizer" => RGBColor(0x8c, 0x61, 0x9b),
        "host" => RGBColor(0x79, 0x70, 0x6e),
        "idle" => IDLE,
        other => QUALITATIVE[(fnv1a(other) % QUALITATIVE.len() as u64) as usize],
    }
}

/// Colour of the `index`-th series (strategy or tier), cycling through the palette.
pub fn series(index: usize) -> RGBColor {
    QUALITATIVE[index % QUALITATIVE.len()]
}

/// FNV-1a: a stable hash (unlike `DefaultHasher`, fixed across Rust versions).
fn fnv1a(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stable_colours() {
        assert_eq!(category("compute"), RGBColor(0x4e, 0x79, 0xa7));
        assert_eq!(category("something-new"), category("something-new"));
        assert_eq!(series(10), series(0));
    }
}
