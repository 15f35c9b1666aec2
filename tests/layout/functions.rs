//! Function lengths: every `fn` with a body (free functions, methods, trait defaults, and
//! functions nested in them), from its `fn` line to its closing brace.

use syn::visit::Visit;

/// One function and its length.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Function {
    /// Its name (`Type::name` for a method, when the type is a plain path).
    pub name: String,
    /// Line of its `fn` keyword.
    pub line: usize,
    /// Lines from the `fn` keyword to the closing brace, both included.
    pub lines: usize,
}

/// Every function of a parsed file.
pub fn functions(file: &syn::File) -> Vec<Function> {
    let mut v = Finder::default();
    v.visit_file(file);
    v.out
}

#[derive(Default)]
struct Finder {
    out: Vec<Function>,
    self_ty: Vec<String>,
}

impl Finder {
    fn push(&mut self, sig: &syn::Signature, block: &syn::Block) {
        let line = sig.fn_token.span.start().line;
        let end = block.brace_token.span.close().end().line;
        let name = match self.self_ty.last() {
            Some(t) => format!("{t}::{}", sig.ident),
            None => sig.ident.to_string(),
        };
        self.out.push(Function {
            name,
            line,
            lines: end + 1 - line,
        });
    }
}

impl<'ast> Visit<'ast> for Finder {
    fn visit_item_fn(&mut self, f: &'ast syn::ItemFn) {
        self.push(&f.sig, &f.block);
        syn::visit::visit_item_fn(self, f);
    }

    fn visit_impl_item_fn(&mut self, f: &'ast syn::ImplItemFn) {
        self.push(&f.sig, &f.block);
        syn::visit::visit_impl_item_fn(self, f);
    }

    fn visit_trait_item_fn(&mut self, f: &'ast syn::TraitItemFn) {
        if let Some(block) = &f.default {
            self.push(&f.sig, block);
        }
        syn::visit::visit_trait_item_fn(self, f);
    }

    fn visit_item_impl(&mut self, i: &'ast syn::ItemImpl) {
        let name = match &*i.self_ty {
            syn::Type::Path(p) => p
                .path
                .segments
                .last()
                .map_or_else(|| "?".into(), |s| s.ident.to_string()),
            _ => "?".into(),
        };
        self.self_ty.push(name);
        syn::visit::visit_item_impl(self, i);
        self.self_ty.pop();
    }
}
