//! Checks that a crate's modules import in one direction, nested modules
//! included.
//!
//! Any module file (`lib.rs`, `x/mod.rs`, `x.rs` beside a folder `x/`)
//! whose `//!` docs have a `# Layers` section declares the order of its
//! child modules, bottom first, one numbered line per layer:
//!
//! ```text
//! //! # Layers
//! //!
//! //! 1. `keys`, `record`: the leaves (anything after the colon is prose)
//! //! 2. `handshake`
//! ```
//!
//! Within a parent a child may use only siblings in lower layers; a path
//! that leaves the parent's subtree is ruled by the list of the ancestor
//! where it leaves. A module with two or more children and no list is an
//! offence itself, so coverage cannot shrink in silence; so is a list
//! that leaves out a child or names none. Every `crate::` and `super::`
//! path is read: `use` lines, `use crate::{a, b::c}` groups, paths in
//! code, names a parent imports or re-exports (followed to where they
//! are defined), and each name a glob import (`use super::*`) brings in
//! that the code uses as a word (not after `.` or `::`): a local of the
//! same name counts too, and is harmless unless the glob's name is a
//! higher sibling's. Comments, strings and `#[cfg(test)]` modules are not
//! read: a unit test may build its input with a higher layer. A module
//! the caller names in `excluded` (a test harness on top of the crate) is
//! not read, nor anything under it; it still needs its place in its
//! parent's list.
//!
//! Crate roots are `src/lib.rs`, `src/main.rs` and `src/bin/*.rs`.
//!
//! # Layers
//!
//! 1. `source`, `offence`: readable source text (comments, strings and
//!    test modules blanked); what is reported.
//! 2. `paths`: `use` trees and paths in code, read into flat paths.
//! 3. `tree`: a crate root's modules, with their lists, items and imports.
//! 4. `check`: the rules applied to a tree.

mod check;
mod offence;
mod paths;
mod source;
mod tree;

use std::path::{Path, PathBuf};

pub use offence::{Kind, Offence};

/// What [`check()`] found in a crate.
#[derive(Debug, Default)]
pub struct Report {
    /// Everything against the rules, by file.
    pub offences: Vec<Offence>,
    /// How many modules were read.
    pub modules: usize,
    /// How many `crate::`/`super::` paths were checked.
    pub paths: usize,
}

/// The offences in the crate at `crate_dir`, its `excluded` modules
/// (`a::b` paths) unread.
pub fn check_crate(crate_dir: &Path, excluded: &[&str]) -> Vec<Offence> {
    check(crate_dir, excluded).offences
}

/// [`check_crate`], with how much was read.
pub fn check(crate_dir: &Path, excluded: &[&str]) -> Report {
    let mut report = Report::default();
    let mut seen_excluded = Vec::new();
    for root in crate_roots(crate_dir) {
        let tree = tree::Tree::read(crate_dir, &root, excluded);
        let (offences, paths) = check::check_tree(&tree);
        report.offences.extend(offences);
        report.paths += paths;
        report.modules += tree.modules.values().filter(|m| !m.excluded).count();
        seen_excluded.extend(
            tree.modules
                .iter()
                .filter(|(_, m)| m.excluded)
                .map(|(p, _)| p.join("::")),
        );
    }
    for name in excluded {
        if !seen_excluded.iter().any(|s| s == name) {
            report.offences.push(Offence {
                file: PathBuf::from("src"),
                line: None,
                kind: Kind::UnknownExclusion {
                    module: name.to_string(),
                },
            });
        }
    }
    report
        .offences
        .sort_by_cached_key(|o| (o.file.clone(), o.line, o.to_string()));
    // Two names of one line over the same edge (`use crate::a::{B, C}`)
    // are one offence.
    report.offences.dedup();
    report
}

/// Panics, naming every offence, unless the crate at `crate_dir` has none.
/// For a crate's own test: `assert_layered(env!("CARGO_MANIFEST_DIR"), &[])`.
pub fn assert_layered(crate_dir: impl AsRef<Path>, excluded: &[&str]) {
    let crate_dir = crate_dir.as_ref();
    let report = check(crate_dir, excluded);
    assert!(
        report.offences.is_empty(),
        "{}: {} offence(s) against the declared module layers (each module's \
         `# Layers` docs; a module may use only siblings in lower layers):\n{}",
        crate_dir.display(),
        report.offences.len(),
        report
            .offences
            .iter()
            .map(|o| format!("  {o}"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    // Finding no path at all in a crate with modules means the reader
    // stopped reading, not that the crate is clean.
    assert!(
        report.modules <= 1 || report.paths > 0,
        "{}: {} modules but no `crate::`/`super::` path found",
        crate_dir.display(),
        report.modules
    );
}

/// The crate root files under `crate_dir/src`, relative to `crate_dir`.
fn crate_roots(crate_dir: &Path) -> Vec<PathBuf> {
    let mut roots: Vec<PathBuf> = ["src/lib.rs", "src/main.rs"]
        .iter()
        .map(PathBuf::from)
        .filter(|p| crate_dir.join(p).is_file())
        .collect();
    if let Ok(entries) = std::fs::read_dir(crate_dir.join("src/bin")) {
        let mut bins: Vec<PathBuf> = entries
            .filter_map(|e| e.ok())
            .map(|e| e.path())
            .filter_map(|p| {
                let name = p.file_name()?.to_os_string();
                let relative = Path::new("src/bin").join(name);
                if p.is_dir() {
                    let main = relative.join("main.rs");
                    crate_dir.join(&main).is_file().then_some(main)
                } else {
                    (p.extension()? == "rs").then_some(relative)
                }
            })
            .collect();
        bins.sort();
        roots.extend(bins);
    }
    roots
}

#[cfg(test)]
mod tests;
