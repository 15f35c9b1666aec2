//! Module trees: every module of a crate (file modules and inline `mod x { .. }` blocks), the
//! file it lives in, and what it declares (child modules, items, imports) and names (paths).

use proc_macro2::{TokenStream, TokenTree};
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use syn::visit::Visit;

/// One leaf of a `use` tree: the path as written (relative to its module).
#[derive(Debug, Clone)]
pub struct Import {
    /// Segments as written (`super`, `crate`, names); for `use a::{self}` the path of `a`.
    pub path: Vec<String>,
}

/// Where a path was named: a private `use` or code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefKind {
    /// A private `use` leaf (a dependency even when only its trait methods are called).
    PrivateUse,
    /// A path in code: a type, an expression, a pattern, a bound, a macro argument.
    Code,
}

/// One path a module names.
#[derive(Debug, Clone)]
pub struct PathRef {
    /// Its segments (generic arguments dropped).
    pub segments: Vec<String>,
    /// Its line in the module's file.
    pub line: usize,
    /// Use or code.
    pub kind: RefKind,
}

/// One module.
#[derive(Debug, Default)]
pub struct Module {
    /// `crate_name::a::b`, for messages.
    pub name: String,
    /// Index of its file in [`Tree::files`].
    pub file: usize,
    /// Its parent module; none for a crate root.
    pub parent: Option<usize>,
    /// Its crate's root module.
    pub root: usize,
    /// Child modules by name.
    pub children: HashMap<String, usize>,
    /// Names of the items it defines (functions, types, traits, constants, macros).
    pub items: HashSet<String>,
    /// Named imports by the name they bind.
    pub imports: HashMap<String, Import>,
    /// Glob imports (`use a::*`).
    pub globs: Vec<Import>,
    /// Every path it names outside test-only code.
    pub refs: Vec<PathRef>,
}

/// The module trees of a set of crates.
#[derive(Debug, Default)]
pub struct Tree {
    /// Source files, as given (paths relative to the workspace root).
    pub files: Vec<PathBuf>,
    /// Every module.
    pub modules: Vec<Module>,
}

/// Reads a source file's text; `None` when it does not exist.
pub type Reader<'a> = &'a dyn Fn(&Path) -> Option<String>;

impl Tree {
    /// Builds the trees of `crates` (`(name, root file)`, e.g. `("hpfsdp_sim",
    /// "sim/src/lib.rs")`), reading files with `read`. Errors name the file (a parse error, a
    /// declared module without a file).
    pub fn build(crates: &[(&str, &str)], read: Reader) -> Result<Tree, String> {
        let mut tree = Tree::default();
        for &(name, root) in crates {
            let file = PathBuf::from(root);
            let dir = file.parent().unwrap_or(Path::new("")).to_path_buf();
            let m = tree.add_module(name.to_string(), None, None, file.clone());
            let items = parse(&file, read)?;
            tree.add_items(m, &items, &dir, read)?;
        }
        Ok(tree)
    }

    fn add_module(
        &mut self,
        name: String,
        parent: Option<usize>,
        file: Option<usize>,
        path: PathBuf,
    ) -> usize {
        let file = file.unwrap_or_else(|| {
            self.files.push(path);
            self.files.len() - 1
        });
        let id = self.modules.len();
        let root = parent.map_or(id, |p| self.modules[p].root);
        self.modules.push(Module {
            name,
            file,
            parent,
            root,
            ..Module::default()
        });
        id
    }

    /// Adds module `m`'s items; `dir` is where its file-module children live.
    fn add_items(
        &mut self,
        m: usize,
        items: &[syn::Item],
        dir: &Path,
        read: Reader,
    ) -> Result<(), String> {
        for item in items {
            if test_only(item_attrs(item)) {
                continue;
            }
            match item {
                syn::Item::Mod(im) => self.add_child(m, im, dir, read)?,
                syn::Item::Use(u) => {
                    let public = !matches!(u.vis, syn::Visibility::Inherited);
                    let line = u.use_token.span.start().line;
                    add_use(&mut self.modules[m], &u.tree, Vec::new(), public, line);
                }
                _ => {
                    if let Some(name) = item_name(item) {
                        self.modules[m].items.insert(name);
                    }
                    let mut c = Collector::default();
                    c.visit_item(item);
                    let module = &mut self.modules[m];
                    module.refs.extend(c.refs);
                    for (tree, line) in c.uses {
                        add_use(module, &tree, Vec::new(), false, line);
                    }
                }
            }
        }
        Ok(())
    }

    fn add_child(
        &mut self,
        m: usize,
        im: &syn::ItemMod,
        dir: &Path,
        read: Reader,
    ) -> Result<(), String> {
        let name = im.ident.to_string();
        let full = format!("{}::{name}", self.modules[m].name);
        let file = self.modules[m].file;
        let child = if let Some((_, items)) = &im.content {
            let c = self.add_module(full, Some(m), Some(file), PathBuf::new());
            self.add_items(c, items, &dir.join(&name), read)?;
            c
        } else {
            if im.attrs.iter().any(|a| a.path().is_ident("path")) {
                return Err(format!(
                    "{}: `#[path]` on `mod {name}` is not supported by the layout checker",
                    self.files[file].display()
                ));
            }
            let flat = dir.join(format!("{name}.rs"));
            let nested = dir.join(&name).join("mod.rs");
            let (path, text) = match (read(&flat), read(&nested)) {
                (Some(t), _) => (flat, t),
                (None, Some(t)) => (nested, t),
                (None, None) => {
                    return Err(format!(
                        "{}: `mod {name};` has neither {} nor {}",
                        self.files[file].display(),
                        flat.display(),
                        nested.display()
                    ));
                }
            };
            let items = parse_text(&path, &text)?;
            let c = self.add_module(full, Some(m), None, path);
            self.add_items(c, &items, &dir.join(&name), read)?;
            c
        };
        self.modules[m].children.insert(name, child);
        Ok(())
    }
}

fn parse(path: &Path, read: Reader) -> Result<Vec<syn::Item>, String> {
    let text = read(path).ok_or_else(|| format!("{}: cannot read it", path.display()))?;
    parse_text(path, &text)
}

fn parse_text(path: &Path, text: &str) -> Result<Vec<syn::Item>, String> {
    syn::parse_file(text)
        .map(|f| f.items)
        .map_err(|e| format!("{}:{}: {e}", path.display(), e.span().start().line))
}

/// Adds the leaves of a `use` tree to `m`: imports (or globs) and, when private, refs.
fn add_use(m: &mut Module, tree: &syn::UseTree, prefix: Vec<String>, public: bool, line: usize) {
    let with = |s: &str| {
        let mut p = prefix.clone();
        p.push(s.to_string());
        p
    };
    let bind = |m: &mut Module, name: String, path: Vec<String>| {
        if !public {
            m.refs.push(PathRef {
                segments: path.clone(),
                line,
                kind: RefKind::PrivateUse,
            });
        }
        if name != "_" {
            m.imports.insert(name, Import { path });
        }
    };
    match tree {
        syn::UseTree::Path(p) => add_use(m, &p.tree, with(&p.ident.to_string()), public, line),
        syn::UseTree::Name(n) if n.ident == "self" => {
            let name = prefix.last().cloned().unwrap_or_default();
            bind(m, name, prefix.clone());
        }
        syn::UseTree::Name(n) => bind(m, n.ident.to_string(), with(&n.ident.to_string())),
        syn::UseTree::Rename(r) => {
            let path = if r.ident == "self" {
                prefix.clone()
            } else {
                with(&r.ident.to_string())
            };
            bind(m, r.rename.to_string(), path);
        }
        syn::UseTree::Glob(_) => m.globs.push(Import {
            path: prefix.clone(),
        }),
        syn::UseTree::Group(g) => {
            for t in &g.items {
                add_use(m, t, prefix.clone(), public, line);
            }
        }
    }
}

/// True for test-only code: `#[test]`, `#[cfg(test)]`, `#[cfg(all(test, ...))]`.
pub fn test_only(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        if a.path().is_ident("test") {
            return true;
        }
        if !a.path().is_ident("cfg") {
            return false;
        }
        let Ok(list) = a.meta.require_list() else {
            return false;
        };
        let s = list.tokens.to_string();
        let words: Vec<&str> = s
            .split(|c: char| !c.is_alphanumeric() && c != '_')
            .filter(|w| !w.is_empty())
            .collect();
        words == ["test"]
            || (words.first() == Some(&"all") && words.contains(&"test") && !words.contains(&"not"))
    })
}

fn item_attrs(item: &syn::Item) -> &[syn::Attribute] {
    match item {
        syn::Item::Const(i) => &i.attrs,
        syn::Item::Enum(i) => &i.attrs,
        syn::Item::ExternCrate(i) => &i.attrs,
        syn::Item::Fn(i) => &i.attrs,
        syn::Item::ForeignMod(i) => &i.attrs,
        syn::Item::Impl(i) => &i.attrs,
        syn::Item::Macro(i) => &i.attrs,
        syn::Item::Mod(i) => &i.attrs,
        syn::Item::Static(i) => &i.attrs,
        syn::Item::Struct(i) => &i.attrs,
        syn::Item::Trait(i) => &i.attrs,
        syn::Item::TraitAlias(i) => &i.attrs,
        syn::Item::Type(i) => &i.attrs,
        syn::Item::Union(i) => &i.attrs,
        syn::Item::Use(i) => &i.attrs,
        _ => &[],
    }
}

fn item_name(item: &syn::Item) -> Option<String> {
    let ident = match item {
        syn::Item::Const(i) => &i.ident,
        syn::Item::Enum(i) => &i.ident,
        syn::Item::Fn(i) => &i.sig.ident,
        syn::Item::Macro(i) => i.ident.as_ref()?,
        syn::Item::Static(i) => &i.ident,
        syn::Item::Struct(i) => &i.ident,
        syn::Item::Trait(i) => &i.ident,
        syn::Item::TraitAlias(i) => &i.ident,
        syn::Item::Type(i) => &i.ident,
        syn::Item::Union(i) => &i.ident,
        _ => return None,
    };
    Some(ident.to_string())
}

/// Collects the paths of one item (and the `use` items inside its function bodies), leaving
/// out test-only code.
#[derive(Default)]
struct Collector {
    refs: Vec<PathRef>,
    uses: Vec<(syn::UseTree, usize)>,
}

impl Collector {
    fn push(&mut self, segments: Vec<String>, line: usize) {
        self.refs.push(PathRef {
            segments,
            line,
            kind: RefKind::Code,
        });
    }

    fn flush(&mut self, run: &mut Vec<String>, line: usize) {
        if run.len() >= 2 {
            self.push(std::mem::take(run), line);
        }
        run.clear();
    }

    /// Paths written inside a macro's arguments (`a::b::c` token runs of two or more
    /// segments; single names there are mostly local variables).
    fn scan_tokens(&mut self, tokens: TokenStream) {
        let mut run: Vec<String> = Vec::new();
        let mut line = 0;
        let mut colons = 0;
        for tt in tokens {
            match tt {
                TokenTree::Ident(id) => {
                    if run.is_empty() || colons != 2 {
                        self.flush(&mut run, line);
                        line = id.span().start().line;
                    }
                    run.push(id.to_string());
                    colons = 0;
                }
                TokenTree::Punct(p) if p.as_char() == ':' && !run.is_empty() && colons < 2 => {
                    colons += 1;
                }
                TokenTree::Group(g) => {
                    self.flush(&mut run, line);
                    colons = 0;
                    self.scan_tokens(g.stream());
                }
                _ => {
                    self.flush(&mut run, line);
                    colons = 0;
                }
            }
        }
        self.flush(&mut run, line);
    }
}

impl<'ast> Visit<'ast> for Collector {
    /// Paths in attribute arguments are code too (`#[arg(value_parser = crate::parse_x)]`
    /// is a call the derive writes); doc comments and `cfg`s hold none.
    fn visit_attribute(&mut self, a: &'ast syn::Attribute) {
        match &a.meta {
            syn::Meta::List(l) => self.scan_tokens(l.tokens.clone()),
            syn::Meta::NameValue(nv) => self.visit_expr(&nv.value),
            syn::Meta::Path(_) => {}
        }
    }

    fn visit_item(&mut self, i: &'ast syn::Item) {
        if !test_only(item_attrs(i)) {
            syn::visit::visit_item(self, i);
        }
    }

    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        self.uses
            .push((u.tree.clone(), u.use_token.span.start().line));
    }

    fn visit_item_mod(&mut self, _: &'ast syn::ItemMod) {}

    fn visit_impl_item_fn(&mut self, f: &'ast syn::ImplItemFn) {
        if !test_only(&f.attrs) {
            syn::visit::visit_impl_item_fn(self, f);
        }
    }

    fn visit_path(&mut self, p: &'ast syn::Path) {
        if p.leading_colon.is_none() {
            let segments = p.segments.iter().map(|s| s.ident.to_string()).collect();
            self.push(segments, p.segments[0].ident.span().start().line);
        }
        syn::visit::visit_path(self, p);
    }

    fn visit_macro(&mut self, m: &'ast syn::Macro) {
        syn::visit::visit_macro(self, m);
        self.scan_tokens(m.tokens.clone());
    }
}
