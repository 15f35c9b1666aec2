//! Stable digests of plan data: blake3 over the canonical JSON form (field order is the
//! declaration order and maps are insertion-ordered, so the bytes are deterministic).

use serde::Serialize;

/// Hex blake3 digest of `value`'s JSON serialization.
pub fn digest_json<T: Serialize>(value: &T) -> String {
    let bytes = serde_json::to_vec(value).unwrap_or_default();
    blake3::hash(&bytes).to_hex().to_string()
}
