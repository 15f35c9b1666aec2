//! [`Note`]: one grouping or override step of a parameter's plan, as `--explain` shows it.
//!
//! The text is shared: every parameter of a module's group gets the same step ("'m': leaf
//! segment 'experts' never forms a boundary; merged into '...'"), and on exp-d one such text
//! is shared by 1,152 per-expert weights. A note is a string in every other respect: it
//! derefs to `str`, prints, compares and serializes as one.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;
use std::ops::Deref;
use std::sync::Arc;

/// A note's text, shared between the parameters it applies to.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Note(Arc<str>);

impl Note {
    /// The text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Deref for Note {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for Note {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl From<String> for Note {
    fn from(s: String) -> Self {
        Note(Arc::from(s))
    }
}

impl From<&str> for Note {
    fn from(s: &str) -> Self {
        Note(Arc::from(s))
    }
}

impl PartialEq<str> for Note {
    fn eq(&self, other: &str) -> bool {
        &*self.0 == other
    }
}

impl PartialEq<&str> for Note {
    fn eq(&self, other: &&str) -> bool {
        &*self.0 == *other
    }
}

impl fmt::Display for Note {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Formats as the string does (`"text"`), so a plan's `Debug` output reads as before.
impl fmt::Debug for Note {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl Serialize for Note {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for Note {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d).map(Note::from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_prints_and_serializes_as_a_string() {
        let n = Note::from("boundary 'model.layers.0.mlp' is mlp: \"quoted\"");
        let shared = n.clone();
        assert!(Arc::ptr_eq(&n.0, &shared.0), "clones share the text");
        assert!(n.contains("is mlp"));
        assert_eq!(n.to_string(), n.as_str());
        assert_eq!(format!("{n:?}"), format!("{:?}", n.as_str()));
        let json = serde_json::to_string(&vec![n.clone()]).unwrap();
        assert_eq!(json, serde_json::to_string(&vec![n.as_str()]).unwrap());
        let back: Vec<Note> = serde_json::from_str(&json).unwrap();
        assert_eq!(back, [n]);
    }
}
