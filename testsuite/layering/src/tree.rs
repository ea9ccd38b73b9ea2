//! A crate's module tree as the checker sees it: each module's path, file,
//! readable code (its own part of the file only), declared layers, child
//! modules, items and `use` imports.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use crate::paths;
use crate::source::{
    blank_range, blank_test_modules, group_end, is_ident, strip_comments_and_strings,
};

/// A module path from the crate root: `[]` is the root, `["auth", "keys"]`
/// is `auth::keys`.
pub type ModPath = Vec<String>;

/// One module of the tree.
#[derive(Debug, Default)]
pub struct Module {
    /// The file it is in, relative to the crate's folder (`src/auth/keys.rs`).
    pub file: PathBuf,
    /// The file's text with comments, strings, test modules and every other
    /// module's part blanked out (offsets are the file's).
    pub code: String,
    /// Its child modules (file-backed and inline), in declaration order.
    pub children: Vec<String>,
    /// Where each child is declared (byte offset in `code`).
    pub child_at: BTreeMap<String, usize>,
    /// The layers its `# Layers` docs declare, bottom first, if any.
    pub layers: Option<Vec<Vec<String>>>,
    /// Names its items define (`fn`, `struct`, `macro_rules!`, ...).
    pub items: Vec<String>,
    /// Names of the `macro_rules!` macros it defines.
    pub macros: Vec<String>,
    /// Names its `use` lines bind, with the path each binds.
    pub imports: BTreeMap<String, paths::Path>,
    /// Its glob imports (`use x::*`), as the path before the `*`.
    pub globs: Vec<paths::Path>,
    /// Set when the caller excluded it: nothing in or under it is read.
    pub excluded: bool,
    /// Set when its file was not found.
    pub missing: bool,
}

/// The modules of one crate root, by path.
#[derive(Debug, Default)]
pub struct Tree {
    /// Every module reached from the root, the root (`[]`) included.
    pub modules: BTreeMap<ModPath, Module>,
}

impl Tree {
    /// The tree under the root file `root` (relative to `crate_dir`),
    /// `excluded` modules (`a::b` paths) left unread.
    pub fn read(crate_dir: &Path, root: &Path, excluded: &[&str]) -> Tree {
        let mut tree = Tree::default();
        let child_dir = root.parent().unwrap_or(Path::new("")).to_path_buf();
        tree.read_file(crate_dir, root, Vec::new(), child_dir, excluded);
        tree
    }

    fn read_file(
        &mut self,
        crate_dir: &Path,
        file: &Path,
        path: ModPath,
        child_dir: PathBuf,
        excluded: &[&str],
    ) {
        let Ok(raw) = fs::read_to_string(crate_dir.join(file)) else {
            self.modules.insert(
                path,
                Module {
                    file: file.to_path_buf(),
                    missing: true,
                    ..Module::default()
                },
            );
            return;
        };
        let code = blank_test_modules(&strip_comments_and_strings(&raw));
        self.read_module(
            crate_dir,
            file,
            &raw,
            code.clone(),
            0..code.len(),
            path,
            child_dir,
            excluded,
        );
    }

    /// One module: the part `body` of a file (all of it for a file-backed
    /// one), its inline children read in turn.
    #[allow(clippy::too_many_arguments)]
    fn read_module(
        &mut self,
        crate_dir: &Path,
        file: &Path,
        raw: &str,
        mut code: String,
        body: std::ops::Range<usize>,
        path: ModPath,
        child_dir: PathBuf,
        excluded: &[&str],
    ) {
        let name = path.join("::");
        if !path.is_empty() && excluded.contains(&name.as_str()) {
            self.modules.insert(
                path,
                Module {
                    file: file.to_path_buf(),
                    excluded: true,
                    ..Module::default()
                },
            );
            return;
        }
        let whole = code.clone();
        blank_range(&mut code, 0..body.start);
        let len = code.len();
        blank_range(&mut code, body.end..len);
        let inline = inline_modules(&code, body.clone());
        let mut docs = raw[body.clone()].to_string();
        for (_, _, inner) in inline.iter().rev() {
            docs.replace_range(inner.start - body.start..inner.end - body.start, "");
            blank_range(&mut code, inner.clone());
        }
        let mut module = Module {
            file: file.to_path_buf(),
            layers: declared_layers(&docs),
            items: items(&code),
            macros: macros(&code),
            ..Module::default()
        };
        for p in uses(&code) {
            match &p.binds {
                Some(name) => {
                    module.imports.entry(name.clone()).or_insert(p);
                }
                None => module.globs.push(p),
            }
        }
        let declared = declared_children(&code);
        for (child, at) in declared
            .iter()
            .map(|(n, at)| (n, at))
            .chain(inline.iter().map(|(n, at, _)| (n, at)))
        {
            if !module.child_at.contains_key(child) {
                module.children.push(child.clone());
                module.child_at.insert(child.clone(), *at);
            }
        }
        module.code = code;
        self.modules.insert(path.clone(), module);
        for (child, _) in declared {
            let mut child_path = path.clone();
            child_path.push(child.clone());
            let flat = child_dir.join(format!("{child}.rs"));
            let (child_file, grandchild_dir) = if crate_dir.join(&flat).is_file() {
                (flat, child_dir.join(&child))
            } else {
                let nested = child_dir.join(&child).join("mod.rs");
                (nested, child_dir.join(&child))
            };
            self.read_file(crate_dir, &child_file, child_path, grandchild_dir, excluded);
        }
        for (child, _, inner) in inline {
            let mut child_path = path.clone();
            child_path.push(child.clone());
            self.read_module(
                crate_dir,
                file,
                raw,
                whole.clone(),
                inner,
                child_path,
                child_dir.join(&child),
                excluded,
            );
        }
    }
}

/// The `mod x;` declarations in `code` and where each is.
fn declared_children(code: &str) -> Vec<(String, usize)> {
    mod_keywords(code)
        .filter_map(|(at, name, after)| {
            (code.as_bytes().get(after) == Some(&b';')).then_some((name, at))
        })
        .collect()
}

/// The inline `mod x { ... }` modules directly in `body` of `code`: name,
/// where declared, and the range of their body (inside the braces).
fn inline_modules(
    code: &str,
    body: std::ops::Range<usize>,
) -> Vec<(String, usize, std::ops::Range<usize>)> {
    let mut found: Vec<(String, usize, std::ops::Range<usize>)> = Vec::new();
    for (at, name, after) in mod_keywords(code) {
        if !body.contains(&at) || found.iter().any(|(_, _, r)| r.contains(&at)) {
            continue;
        }
        if code.as_bytes().get(after) != Some(&b'{') {
            continue;
        }
        let start = after + 1;
        let end = start + group_end(&code[start..]);
        found.push((name, at, start..end));
    }
    found
}

/// Each `mod` keyword in `code`: its offset, the module's name, and the
/// offset of the first non-space byte after the name.
fn mod_keywords(code: &str) -> impl Iterator<Item = (usize, String, usize)> + '_ {
    let b = code.as_bytes();
    keyword_offsets(code, "mod").filter_map(move |at| {
        let rest = &code[at + 3..];
        let name_from = at + 3 + (rest.len() - rest.trim_start().len());
        let name_len = b[name_from..].iter().take_while(|&&c| is_ident(c)).count();
        if name_len == 0 || name_from == at + 3 {
            return None;
        }
        let name = code[name_from..name_from + name_len].to_string();
        let after_name = &code[name_from + name_len..];
        let after = name_from + name_len + (after_name.len() - after_name.trim_start().len());
        Some((at, name, after))
    })
}

/// Offsets of `word` in `code` where it stands as a whole word.
pub fn keyword_offsets<'a>(code: &'a str, word: &'a str) -> impl Iterator<Item = usize> + 'a {
    let b = code.as_bytes();
    code.match_indices(word)
        .map(|(at, _)| at)
        .filter(move |&at| {
            (at == 0 || !is_ident(b[at - 1]) && b[at - 1] != b'#' && b[at - 1] != b'$')
                && !b.get(at + word.len()).is_some_and(|&c| is_ident(c))
        })
}

/// Every path each `use` line in `code` binds.
fn uses(code: &str) -> Vec<paths::Path> {
    keyword_offsets(code, "use")
        .flat_map(|at| paths::read(code, at + 3).0)
        .collect()
}

/// Names the items in `code` define (wherever they are: a name an `impl`
/// defines inside is harmless, the checker only needs to know a name).
fn items(code: &str) -> Vec<String> {
    let mut names = Vec::new();
    for keyword in [
        "fn", "struct", "enum", "trait", "type", "const", "static", "union",
    ] {
        names.extend(names_after(code, keyword));
    }
    names.extend(macros(code));
    names
}

/// Names of the `macro_rules!` macros `code` defines.
fn macros(code: &str) -> Vec<String> {
    names_after(code, "macro_rules")
}

/// The name after each `keyword` in `code` (`fn x` gives `x`; `static mut
/// x` too; `macro_rules! x` too).
fn names_after(code: &str, keyword: &str) -> Vec<String> {
    let mut names = Vec::new();
    for at in keyword_offsets(code, keyword) {
        let rest = code[at + keyword.len()..].trim_start();
        let rest = rest.strip_prefix('!').unwrap_or(rest).trim_start();
        let rest = rest.strip_prefix("mut ").unwrap_or(rest).trim_start();
        let len = rest.bytes().take_while(|&c| is_ident(c)).count();
        if len > 0 {
            names.push(rest[..len].to_string());
        }
    }
    names
}

/// The layers under a `# Layers` heading in `docs`' `//!` lines: each
/// numbered line's backticked names before its first `:`, bottom first.
pub fn declared_layers(docs: &str) -> Option<Vec<Vec<String>>> {
    let mut in_section = false;
    let mut layers: Option<Vec<Vec<String>>> = None;
    for line in docs.lines() {
        let Some(doc) = line.trim_start().strip_prefix("//!") else {
            continue;
        };
        let doc = doc.trim();
        if doc.starts_with('#') {
            in_section = doc.trim_start_matches('#').trim() == "Layers";
            if in_section {
                layers.get_or_insert_with(Vec::new);
            }
            continue;
        }
        let Some((number, rest)) = doc.split_once(". ") else {
            continue;
        };
        if !in_section || number.parse::<usize>().is_err() {
            continue;
        }
        let names = rest.split(':').next().unwrap_or_default();
        let layer: Vec<String> = names
            .split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_string)
            .collect();
        layers.get_or_insert_with(Vec::new).push(layer);
    }
    layers
}
