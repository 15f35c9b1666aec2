//! Import circles: the strongly connected components of more than one file in the file graph
//! ([`Tree::file_edges`](super::tree::Tree)), found with Tarjan's algorithm.

use std::collections::BTreeMap;

/// Strongly connected components of more than one node of the graph `edges` (node `a` has an
/// edge to every key of `edges[a]`), each sorted, in order of their smallest node.
pub fn components<V>(edges: &[BTreeMap<usize, V>]) -> Vec<Vec<usize>> {
    let mut t = Tarjan {
        edges,
        index: vec![None; edges.len()],
        low: vec![0; edges.len()],
        on_stack: vec![false; edges.len()],
        stack: Vec::new(),
        next: 0,
        out: Vec::new(),
    };
    for v in 0..edges.len() {
        if t.index[v].is_none() {
            t.visit(v);
        }
    }
    let mut out: Vec<Vec<usize>> = t.out.into_iter().filter(|c| c.len() > 1).collect();
    for c in &mut out {
        c.sort_unstable();
    }
    out.sort();
    out
}

struct Tarjan<'a, V> {
    edges: &'a [BTreeMap<usize, V>],
    index: Vec<Option<usize>>,
    low: Vec<usize>,
    on_stack: Vec<bool>,
    stack: Vec<usize>,
    next: usize,
    out: Vec<Vec<usize>>,
}

impl<V> Tarjan<'_, V> {
    fn visit(&mut self, v: usize) {
        self.index[v] = Some(self.next);
        self.low[v] = self.next;
        self.next += 1;
        self.stack.push(v);
        self.on_stack[v] = true;
        for &w in self.edges[v].keys() {
            match self.index[w] {
                None => {
                    self.visit(w);
                    self.low[v] = self.low[v].min(self.low[w]);
                }
                Some(iw) if self.on_stack[w] => self.low[v] = self.low[v].min(iw),
                Some(_) => {}
            }
        }
        if Some(self.low[v]) == self.index[v] {
            let mut comp = Vec::new();
            while let Some(w) = self.stack.pop() {
                self.on_stack[w] = false;
                comp.push(w);
                if w == v {
                    break;
                }
            }
            self.out.push(comp);
        }
    }
}
