//! Resolving a path named in a module to the module that defines it, and the file graph
//! that results.

use super::tree::{RefKind, Tree};
use std::collections::BTreeMap;

/// What a path resolves to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// A module itself (`use super::compute;`).
    Module(usize),
    /// An item defined in (or, unknown, named as a member of) a module.
    Item(usize),
}

impl Target {
    fn module(self) -> usize {
        match self {
            Target::Module(m) | Target::Item(m) => m,
        }
    }
}

/// Most imports followed for one path (re-export chains are short; this only stops loops).
const MAX_DEPTH: u32 = 32;

impl Tree {
    /// Resolves `segs` as named in module `from`; `None` for a path outside the crate (another
    /// crate, the prelude, a local variable or a generic parameter).
    pub fn resolve(&self, from: usize, segs: &[String]) -> Option<Target> {
        self.resolve_at(from, segs, 0)
    }

    fn resolve_at(&self, from: usize, segs: &[String], depth: u32) -> Option<Target> {
        if depth > MAX_DEPTH || segs.is_empty() {
            return None;
        }
        let mut cur = from;
        let mut i = 0;
        match segs[0].as_str() {
            "crate" => {
                cur = self.modules[from].root;
                i = 1;
            }
            "self" | "super" => {
                while i < segs.len() && (segs[i] == "self" || segs[i] == "super") {
                    if segs[i] == "super" {
                        cur = self.modules[cur].parent?;
                    }
                    i += 1;
                }
            }
            _ => return self.lookup(from, segs, depth),
        }
        self.walk(cur, &segs[i..], depth)
    }

    /// The rest of a path below a known module: an unknown member (a macro-made item, an
    /// associated item) is attributed to that module.
    fn walk(&self, m: usize, rest: &[String], depth: u32) -> Option<Target> {
        if rest.is_empty() {
            return Some(Target::Module(m));
        }
        self.lookup(m, rest, depth).or(Some(Target::Item(m)))
    }

    /// `segs[0]` in module `m`'s scope: its items, child modules, imports, then globs.
    fn lookup(&self, m: usize, segs: &[String], depth: u32) -> Option<Target> {
        let md = &self.modules[m];
        let name = &segs[0];
        let child = md.children.get(name).copied();
        if md.items.contains(name) && (segs.len() == 1 || child.is_none()) {
            return Some(Target::Item(m));
        }
        if let Some(c) = child {
            return self.walk(c, &segs[1..], depth);
        }
        if let Some(imp) = md.imports.get(name) {
            let mut p = imp.path.clone();
            p.extend_from_slice(&segs[1..]);
            return self.resolve_at(m, &p, depth + 1);
        }
        for g in &md.globs {
            if let Some(Target::Module(gm)) = self.resolve_at(m, &g.path, depth + 1)
                && let Some(t) = self.lookup(gm, segs, depth + 1)
            {
                return Some(t);
            }
        }
        None
    }

    /// The file graph: `edges[a][b]` is the first place file `a` names something of file `b`
    /// (`(line, path)`), for every `a != b`.
    pub fn file_edges(&self) -> Vec<BTreeMap<usize, (usize, String)>> {
        let mut edges = vec![BTreeMap::new(); self.files.len()];
        for (m, module) in self.modules.iter().enumerate() {
            for r in &module.refs {
                let Some(t) = self.resolve(m, &r.segments) else {
                    continue;
                };
                // A single name in code is a use of an item, never of a module (a lone
                // module name there is a local variable that shares its name).
                if r.kind == RefKind::Code
                    && r.segments.len() == 1
                    && matches!(t, Target::Module(_))
                {
                    continue;
                }
                let to = self.modules[t.module()].file;
                if to != module.file {
                    edges[module.file]
                        .entry(to)
                        .or_insert_with(|| (r.line, r.segments.join("::")));
                }
            }
        }
        edges
    }
}
