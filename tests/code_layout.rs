//! The house rules of the code layout (issue 23), checked on every workspace crate's sources:
//! no import circles between files, and no function longer than [`MAX_FN_LINES`] lines.
//!
//! The checker ([`layout`]) parses the sources with `syn`, so it needs no build of the crates
//! and runs in about a second. A failure names the circle (its files and, for each file, the
//! first path that names the next one) or the function (file, line, length). See
//! docs/code-layout.md for what counts as a use and how to break a circle.

mod layout;

use layout::circles::components;
use layout::functions::functions;
use layout::tree::Tree;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Longest function, in lines from `fn` to the closing brace (one screen and a half; the
/// house style aims at 80).
const MAX_FN_LINES: usize = 120;

/// Circles left on purpose: every file of such a circle matches one of the patterns (a path,
/// or a prefix ending in `*`); `HPFSDP_LAYOUT_ALL=1` reports them too. An exception none of whose files is in a circle any more fails
/// the test, so it is removed when its circle is broken.
const KNOWN_CIRCLES: &[(&[&str], &str)] = &[];

/// Functions left over the limit on purpose: `(file, name)` with the reason.
const KNOWN_LONG: &[(&str, &str, &str)] = &[];

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &Path) -> Option<String> {
    std::fs::read_to_string(root().join(path)).ok()
}

/// `(crate name, root file)` of every workspace crate: the members of Cargo.toml and the
/// `hpfsdp` binary.
fn crates() -> Vec<(String, String)> {
    let manifest: toml::Table = read(Path::new("Cargo.toml")).unwrap().parse().unwrap();
    let members = manifest["workspace"]["members"].as_array().unwrap();
    let mut out = vec![("hpfsdp".to_string(), "src/main.rs".to_string())];
    for m in members {
        let dir = m.as_str().unwrap();
        let own: toml::Table = read(&Path::new(dir).join("Cargo.toml"))
            .unwrap()
            .parse()
            .unwrap();
        let name = own["package"]["name"].as_str().unwrap().replace('-', "_");
        out.push((name, format!("{dir}/src/lib.rs")));
    }
    out
}

fn workspace_tree() -> Tree {
    let crates = crates();
    let refs: Vec<(&str, &str)> = crates
        .iter()
        .map(|(n, r)| (n.as_str(), r.as_str()))
        .collect();
    Tree::build(&refs, &read).unwrap_or_else(|e| panic!("{e}"))
}

fn matches(pattern: &str, file: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => file.starts_with(prefix),
        None => file == pattern,
    }
}

/// The circles of `tree`, each as its files and a line per file-to-file use inside it.
fn circles(tree: &Tree) -> Vec<(Vec<String>, String)> {
    let edges = tree.file_edges();
    let name = |f: usize| tree.files[f].display().to_string();
    components(&edges)
        .into_iter()
        .map(|comp| {
            let mut why = String::new();
            for &a in &comp {
                for (b, (line, path)) in &edges[a] {
                    if comp.contains(b) {
                        why.push_str(&format!(
                            "    {}:{line} names `{path}` ({})\n",
                            name(a),
                            name(*b)
                        ));
                    }
                }
            }
            (comp.iter().map(|&f| name(f)).collect(), why)
        })
        .collect()
}

#[test]
fn no_import_circles_between_files() {
    let tree = workspace_tree();
    assert!(
        tree.files.len() > 250,
        "only {} files found",
        tree.files.len()
    );
    let found = circles(&tree);
    let mut used = vec![false; KNOWN_CIRCLES.len()];
    let mut report = String::new();
    for (files, why) in &found {
        for (k, (pats, _)) in KNOWN_CIRCLES.iter().enumerate() {
            used[k] |= files.iter().any(|f| pats.iter().any(|p| matches(p, f)));
        }
        let known = KNOWN_CIRCLES
            .iter()
            .position(|(pats, _)| files.iter().all(|f| pats.iter().any(|p| matches(p, f))))
            .filter(|_| std::env::var_os("HPFSDP_LAYOUT_ALL").is_none());
        match known {
            Some(_) => {}
            None => report.push_str(&format!(
                "circle of {} files: {}\n{why}",
                files.len(),
                files.join(", ")
            )),
        }
    }
    for (k, (pats, reason)) in KNOWN_CIRCLES.iter().enumerate() {
        if !used[k] {
            report.push_str(&format!(
                "the known circle {pats:?} ({reason}) is gone: remove it from KNOWN_CIRCLES\n"
            ));
        }
    }
    assert!(
        report.is_empty(),
        "import circles between files (break each by moving the shared item to the lower \
         module or a new one; docs/code-layout.md):\n{report}"
    );
}

/// Every `.rs` file of the workspace (crates, their tests, examples and benches), sorted.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(root().join(dir))
        .unwrap()
        .map(|e| dir.join(e.unwrap().file_name()))
        .collect();
    entries.sort();
    for p in entries {
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        if name.starts_with('.') || name == "target" {
            continue;
        }
        if root().join(&p).is_dir() {
            rust_files(&p, out);
        } else if name.ends_with(".rs") {
            out.push(p);
        }
    }
}

#[test]
fn functions_fit_on_one_screen_and_a_half() {
    let mut files = Vec::new();
    rust_files(Path::new(""), &mut files);
    assert!(files.len() > 300, "only {} files found", files.len());
    let mut long = Vec::new();
    let mut known_seen = vec![false; KNOWN_LONG.len()];
    for file in &files {
        let text = read(file).unwrap();
        let parsed = syn::parse_file(&text)
            .unwrap_or_else(|e| panic!("{}:{}: {e}", file.display(), e.span().start().line));
        let shown = file.display().to_string();
        for f in functions(&parsed) {
            if f.lines <= MAX_FN_LINES {
                continue;
            }
            match KNOWN_LONG
                .iter()
                .position(|(kf, kn, _)| *kf == shown && *kn == f.name)
            {
                Some(k) => known_seen[k] = true,
                None => long.push(format!(
                    "    {shown}:{} {} ({} lines)",
                    f.line, f.name, f.lines
                )),
            }
        }
    }
    for (k, (file, name, _)) in KNOWN_LONG.iter().enumerate() {
        if !known_seen[k] {
            long.push(format!(
                "    {file} {name} is in KNOWN_LONG but no longer over {MAX_FN_LINES} lines: remove it"
            ));
        }
    }
    assert!(
        long.is_empty(),
        "functions over {MAX_FN_LINES} lines (split them where it reads better):\n{}",
        long.join("\n")
    );
}

/// A small crate held in memory, for the checker's own tests.
fn tree_of(files: &[(&str, &str)]) -> Tree {
    let map: BTreeMap<PathBuf, String> = files
        .iter()
        .map(|(p, t)| (PathBuf::from(p), t.to_string()))
        .collect();
    Tree::build(&[("demo", "src/lib.rs")], &|p: &Path| map.get(p).cloned())
        .unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn the_checker_finds_circles_through_uses_code_paths_and_reexports() {
    let tree = tree_of(&[
        ("src/lib.rs", "mod a; mod b; pub mod facade;"),
        (
            "src/a.rs",
            "pub struct A; pub fn f() -> crate::facade::B { todo!() }",
        ),
        ("src/b.rs", "use super::a::A; pub struct B(A);"),
        (
            "src/facade/mod.rs",
            "mod inner; pub use crate::b::B; pub use inner::*;",
        ),
        ("src/facade/inner.rs", "pub fn g() {}"),
    ]);
    let found = circles(&tree);
    assert_eq!(found.len(), 1, "{found:?}");
    // The facade re-exports B: a's path through it is a use of b, not of the facade.
    assert_eq!(found[0].0, ["src/a.rs", "src/b.rs"]);
    assert!(
        found[0]
            .1
            .contains("src/a.rs:1 names `crate::facade::B` (src/b.rs)"),
        "{}",
        found[0].1
    );
    assert!(
        found[0]
            .1
            .contains("src/b.rs:1 names `super::a::A` (src/a.rs)"),
        "{}",
        found[0].1
    );
}

#[test]
fn the_checker_leaves_out_tests_locals_macros_of_other_crates_and_declarations() {
    let tree = tree_of(&[
        (
            "src/lib.rs",
            "mod a; mod b;\n#[cfg(test)]\nmod tests { use crate::b::g; }\n",
        ),
        (
            "src/a.rs",
            "pub fn f() { let b = 1; let _ = b; other_crate::b::g(); }\n\
             #[test]\nfn t() { crate::b::g(); }\n\
             #[cfg(test)]\nmod tests { use super::super::b::*; }\n",
        ),
        (
            "src/b.rs",
            "pub fn g() { let _ = format!(\"{}\", crate::a::f()); }",
        ),
    ]);
    let edges = tree.file_edges();
    assert!(circles(&tree).is_empty(), "{edges:?}");
    // The one real use: b's macro argument names a's f.
    assert_eq!(edges[2].keys().copied().collect::<Vec<_>>(), [1]);
    assert!(edges[0].is_empty() && edges[1].is_empty(), "{edges:?}");
}

#[test]
fn the_finder_measures_functions_from_fn_to_closing_brace() {
    let text = "fn short() {}\n\nimpl S {\n    fn long(&self) {\n\n\n    }\n}\n\
                trait T { fn d() {\n} fn no_body(); }\n";
    let found = functions(&syn::parse_file(text).unwrap());
    let got: Vec<(String, usize, usize)> = found
        .into_iter()
        .map(|f| (f.name, f.line, f.lines))
        .collect();
    assert_eq!(
        got,
        [
            ("short".to_string(), 1, 1),
            ("S::long".to_string(), 4, 4),
            ("d".to_string(), 9, 2)
        ]
    );
}
