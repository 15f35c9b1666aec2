//! The trace's process-group table: every distinct group of ranks in the job, numbered from 1
//! in sorted order, so every rank's trace names a group the same way and the table can be
//! written as ASTRA-sim's communicator-group JSON (`{"1": [0, 1, 2, 3], ...}`).

use std::collections::BTreeMap;

/// Distinct rank groups and their `pg_name`s.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GroupTable {
    names: BTreeMap<Vec<usize>, String>,
}

impl GroupTable {
    /// The table of `groups` (duplicates and order do not matter; rank lists are sorted).
    pub fn new<I: IntoIterator<Item = Vec<usize>>>(groups: I) -> Self {
        let mut sorted: Vec<Vec<usize>> = groups
            .into_iter()
            .map(|mut g| {
                g.sort_unstable();
                g
            })
            .collect();
        sorted.sort();
        sorted.dedup();
        Self {
            names: sorted
                .into_iter()
                .enumerate()
                .map(|(i, g)| (g, (i + 1).to_string()))
                .collect(),
        }
    }

    /// The `pg_name` of the group holding exactly `ranks` (any order).
    pub fn name_of(&self, ranks: &[usize]) -> Option<&str> {
        let mut key = ranks.to_vec();
        key.sort_unstable();
        self.names.get(&key).map(String::as_str)
    }

    /// Number of groups.
    pub fn len(&self) -> usize {
        self.names.len()
    }

    /// True when there is no group.
    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    /// The table as ASTRA-sim communicator-group JSON, groups by numeric name.
    pub fn to_json(&self) -> String {
        let mut by_name: Vec<(usize, &Vec<usize>)> = self
            .names
            .iter()
            .map(|(g, n)| (n.parse().unwrap_or(0), g))
            .collect();
        by_name.sort();
        let map: serde_json::Map<String, serde_json::Value> = by_name
            .into_iter()
            .map(|(n, g)| (n.to_string(), serde_json::json!(g)))
            .collect();
        serde_json::to_string_pretty(&serde_json::Value::Object(map)).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_distinct_groups_in_sorted_order() {
        let t = GroupTable::new([vec![2, 3], vec![0, 1], vec![1, 0], vec![0, 1, 2, 3]]);
        assert_eq!(t.len(), 3);
        assert_eq!(t.name_of(&[1, 0]), Some("1"));
        assert_eq!(t.name_of(&[0, 1, 2, 3]), Some("2"));
        assert_eq!(t.name_of(&[3, 2]), Some("3"));
        assert_eq!(t.name_of(&[0, 2]), None);
        assert!(t.to_json().contains("\"3\": [\n    2,\n    3\n  ]"));
    }
}
