//! The code-layout checker of tests/code_layout.rs: it reads every workspace crate's source
//! files with `syn`, builds each crate's module tree from its `mod` declarations, resolves
//! every path a file names (`use` items, paths in code and in macro arguments) to the file that
//! defines it, and finds the strongly connected components of that file graph (import
//! circles). It also measures every function's length in lines.
//!
//! What counts as "file A uses file B": a private `use` that resolves into B, or a path in A's
//! code (types, expressions, patterns, trait bounds, macro and attribute arguments) that resolves into B.
//! Re-exports (`pub use`, `pub(crate) use`) are followed to the file that defines the item, so
//! a facade module that re-exports its children is not itself a dependency. Test-only code
//! (`#[cfg(test)]` items and modules, `#[test]` functions) is left out: a circle through a
//! unit test is not a circle of the code. The `mod` declaration of a child is not a use.

pub mod circles;
pub mod functions;
pub mod resolve;
pub mod tree;
