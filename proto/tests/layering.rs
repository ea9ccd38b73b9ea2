//! The crate's modules import in one direction: each only from the layers
//! below its own, as the list under "Layers" in `src/lib.rs` declares
//! (bottom first). This reads every `src/**/*.rs` but the simulator
//! (`src/sim/`, a test harness on top of everything), finds each path that
//! starts with `crate::` or climbs out of a module with `super::` —
//! `use` lines, `use crate::{a, b::c}` groups and paths in code alike —
//! and names the file and line of any that reaches a module at or above
//! its own layer. Comments, strings and `#[cfg(test)]` modules are not
//! read: a unit test may build its input with a higher layer.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

/// One path out of a module: where it is and which top-level module it
/// reaches.
#[derive(Debug, PartialEq)]
struct Reference {
    line: usize,
    target: String,
}

/// The crate's layers (module names, bottom first) from lib.rs's docs.
fn declared_layers(lib_rs: &str) -> Vec<Vec<String>> {
    let mut in_section = false;
    let mut layers = Vec::new();
    for line in lib_rs.lines() {
        let Some(doc) = line.strip_prefix("//!") else {
            continue;
        };
        let doc = doc.trim();
        if doc.starts_with('#') {
            in_section = doc.trim_start_matches('#').trim() == "Layers";
            continue;
        }
        let Some((number, rest)) = doc.split_once(". ") else {
            continue;
        };
        if !in_section || number.parse::<usize>().is_err() {
            continue;
        }
        // The names are the backticked words before any explanation.
        let names = rest.split(':').next().unwrap_or_default();
        let layer: Vec<String> = names
            .split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_string)
            .collect();
        layers.push(layer);
    }
    layers
}

/// Modules lib.rs declares (`pub mod x;`, `mod x;`).
fn declared_modules(lib_code: &str) -> Vec<String> {
    lib_code
        .lines()
        .filter_map(|l| {
            let l = l.trim().strip_prefix("pub ").unwrap_or(l.trim());
            l.strip_prefix("mod ")?
                .strip_suffix(';')
                .map(str::to_string)
        })
        .collect()
}

/// Names lib.rs re-exports at the crate root, and the module each comes
/// from (`pub use frame::{Frame, Tag};` makes `crate::Tag` frame's).
fn root_reexports(lib_code: &str) -> BTreeMap<String, String> {
    let mut map = BTreeMap::new();
    let mut rest = lib_code;
    while let Some(at) = rest.find("pub use ") {
        rest = &rest[at + "pub use ".len()..];
        let end = rest.find(';').unwrap_or(rest.len());
        let stmt: String = rest[..end].split_whitespace().collect();
        rest = &rest[end..];
        let Some((module, items)) = stmt.split_once("::") else {
            continue;
        };
        let items = items.trim_start_matches('{').trim_end_matches('}');
        for item in top_level_items(items) {
            // `a::B` re-exports B; `B as C` names it C.
            let name = item.rsplit("::").next().unwrap_or_default();
            let name = name.rsplit(" as ").next().unwrap_or(name);
            map.insert(name.to_string(), module.to_string());
        }
    }
    map
}

/// The items of a `use` group's body, split at its top-level commas.
fn top_level_items(group: &str) -> Vec<String> {
    let (mut items, mut current, mut depth) = (Vec::new(), String::new(), 0usize);
    for c in group.chars() {
        match c {
            '{' => depth += 1,
            '}' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                items.push(std::mem::take(&mut current));
                continue;
            }
            _ => {}
        }
        current.push(c);
    }
    items.push(current);
    items
        .into_iter()
        .map(|i| i.trim().to_string())
        .filter(|i| !i.is_empty())
        .collect()
}

/// `code` with comments, string and character literals blanked out
/// (newlines kept, so line numbers still hold).
fn strip_comments_and_strings(code: &str) -> String {
    let b = code.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let blank = |out: &mut Vec<u8>, bytes: &[u8]| {
        out.extend(bytes.iter().map(|&c| if c == b'\n' { b'\n' } else { b' ' }))
    };
    let mut i = 0;
    while i < b.len() {
        let end = if b[i..].starts_with(b"//") {
            i + b[i..]
                .iter()
                .position(|&c| c == b'\n')
                .unwrap_or(b.len() - i)
        } else if b[i..].starts_with(b"/*") {
            i + 2 + find(&b[i + 2..], b"*/").map_or(b.len() - i - 2, |at| at + 2)
        } else if b[i] == b'r' && (b.get(i + 1) == Some(&b'"') || b.get(i + 1) == Some(&b'#')) {
            // A raw string: r"..." or r#"..."#.
            let hashes = b[i + 1..].iter().take_while(|&&c| c == b'#').count();
            if b.get(i + 1 + hashes) != Some(&b'"') {
                out.push(b[i]);
                i += 1;
                continue;
            }
            let mut close = vec![b'#'; hashes + 1];
            close[0] = b'"';
            let body = i + 2 + hashes;
            body + find(&b[body..], &close).map_or(b.len() - body, |at| at + close.len())
        } else if b[i] == b'"' {
            let mut j = i + 1;
            while j < b.len() && b[j] != b'"' {
                j += if b[j] == b'\\' { 2 } else { 1 };
            }
            (j + 1).min(b.len())
        } else if b[i] == b'\'' && b.get(i + 1) == Some(&b'\\') {
            i + 2
                + b[i + 2..]
                    .iter()
                    .position(|&c| c == b'\'')
                    .map_or(0, |at| at + 1)
        } else if b[i] == b'\'' && b.get(i + 2) == Some(&b'\'') {
            i + 3
        } else {
            out.push(b[i]);
            i += 1;
            continue;
        };
        blank(&mut out, &b[i..end]);
        i = end;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// `code` (already stripped) without its `#[cfg(test)]` modules.
fn strip_test_modules(code: &str) -> String {
    let mut out = code.to_string();
    let mut from = 0;
    while let Some(at) = out[from..].find("#[cfg(test)]") {
        let start = from + at;
        let after = &out[start + "#[cfg(test)]".len()..];
        let is_mod = after.trim_start().starts_with("mod ");
        // `mod tests;` has no body here: only an inline module is skipped.
        let open = after
            .find(['{', ';'])
            .filter(|&at| after.as_bytes()[at] == b'{');
        let (true, Some(open)) = (is_mod, open) else {
            from = start + 1;
            continue;
        };
        let open = start + "#[cfg(test)]".len() + open;
        let mut depth = 0usize;
        let mut close = out.len();
        for (j, c) in out[open..].char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        close = open + j + 1;
                        break;
                    }
                }
                _ => {}
            }
        }
        let blanked: String = out[start..close]
            .chars()
            .map(|c| if c == '\n' { '\n' } else { ' ' })
            .collect();
        out.replace_range(start..close, &blanked);
        from = close;
    }
    out
}

fn is_ident(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

/// The leading identifier of `s` (after spaces).
fn leading_ident(s: &str) -> &str {
    let s = s.trim_start();
    let end = s.bytes().position(|c| !is_ident(c)).unwrap_or(s.len());
    &s[..end]
}

/// Every path in `code` (a file at module path `module_path`, e.g.
/// `["auth", "record"]`) that leaves its top-level module, with the
/// top-level module each reaches. A name that is neither a module nor a
/// root re-export is an error: the check must not pass by not knowing.
fn references(
    code: &str,
    module_path: &[String],
    modules: &[String],
    reexports: &BTreeMap<String, String>,
) -> Result<Vec<Reference>, String> {
    let code = strip_test_modules(&strip_comments_and_strings(code));
    let b = code.as_bytes();
    let mut found = Vec::new();
    let mut resolve = |name: &str, line: usize, strict: bool| -> Result<(), String> {
        if name.is_empty() || name == "self" {
            return Ok(());
        }
        let target = if modules.iter().any(|m| m == name) {
            name.to_string()
        } else if let Some(m) = reexports.get(name) {
            m.clone()
        } else if strict {
            return Err(format!(
                "line {line}: crate::{name} is neither a module nor a re-export in lib.rs"
            ));
        } else {
            return Ok(());
        };
        found.push(Reference { line, target });
        Ok(())
    };
    let mut i = 0;
    while i < b.len() {
        let starts_word = i == 0 || !is_ident(b[i - 1]);
        let line = || 1 + b[..i].iter().filter(|&&c| c == b'\n').count();
        if starts_word && b[i..].starts_with(b"crate::") {
            let line = line();
            i += "crate::".len();
            let rest = code[i..].trim_start();
            if let Some(group) = rest.strip_prefix('{') {
                let close = group_end(group);
                for item in top_level_items(&group[..close]) {
                    resolve(leading_ident(&item), line, true)?;
                }
            } else {
                resolve(leading_ident(rest), line, true)?;
            }
            continue;
        }
        if starts_word && b[i..].starts_with(b"super::") {
            let line = line();
            let mut climbs = 0;
            while b[i..].starts_with(b"super::") {
                climbs += 1;
                i += "super::".len();
            }
            // Below the file's depth it stays in its top-level module; at
            // or past it, it may reach the root (or only a `mod tests`
            // inside this file: then a root name is still what it names).
            if climbs >= module_path.len() {
                let rest = code[i..].trim_start();
                if let Some(group) = rest.strip_prefix('{') {
                    for item in top_level_items(&group[..group_end(group)]) {
                        resolve(leading_ident(&item), line, false)?;
                    }
                } else {
                    resolve(leading_ident(rest), line, false)?;
                }
            }
            continue;
        }
        i += 1;
    }
    Ok(found)
}

/// Where the `{` group whose body starts `group` closes.
fn group_end(group: &str) -> usize {
    let mut depth = 1usize;
    for (j, c) in group.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return j;
                }
            }
            _ => {}
        }
    }
    group.len()
}

/// A source file's module path: `auth/record.rs` is `["auth", "record"]`,
/// `session/mod.rs` is `["session"]`.
fn module_path(relative: &Path) -> Vec<String> {
    let mut parts: Vec<String> = relative
        .iter()
        .map(|p| p.to_string_lossy().trim_end_matches(".rs").to_string())
        .collect();
    if parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    parts
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("a directory entry").path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Each reference in `files` (path relative to src/, contents) from a
/// module to one at or above its layer, as `file:line: ...` lines.
fn violations(lib_rs: &str, files: &[(PathBuf, String)]) -> Result<(Vec<String>, usize), String> {
    let layers = declared_layers(lib_rs);
    let lib_code = strip_comments_and_strings(lib_rs);
    let modules = declared_modules(&lib_code);
    let reexports = root_reexports(&lib_code);
    let layer_of = |m: &str| layers.iter().position(|l| l.iter().any(|n| n == m));
    for m in &modules {
        if layer_of(m).is_none() {
            return Err(format!("module `{m}` is in no layer of lib.rs's list"));
        }
    }
    for name in layers.iter().flatten() {
        if !modules.contains(name) {
            return Err(format!("lib.rs's layers name `{name}`, which is no module"));
        }
    }
    let (mut bad, mut checked) = (Vec::new(), 0);
    for (relative, code) in files {
        let path = module_path(relative);
        let Some(own) = path.first() else { continue };
        let Some(own_layer) = layer_of(own) else {
            return Err(format!(
                "{}: module `{own}` is in no layer",
                relative.display()
            ));
        };
        let refs = references(code, &path, &modules, &reexports)
            .map_err(|e| format!("{}: {e}", relative.display()))?;
        for r in refs {
            checked += 1;
            let target_layer = layer_of(&r.target).unwrap_or(usize::MAX);
            if r.target != *own && target_layer >= own_layer {
                bad.push(format!(
                    "src/{}:{}: `{own}` (layer {}) uses `{}` (layer {})",
                    relative.display(),
                    r.line,
                    own_layer + 1,
                    r.target,
                    target_layer.saturating_add(1),
                ));
            }
        }
    }
    Ok((bad, checked))
}

#[test]
fn modules_import_only_from_layers_below() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let lib_rs = fs::read_to_string(src.join("lib.rs")).expect("src/lib.rs");
    let mut paths = Vec::new();
    rust_files(&src, &mut paths);
    let files: Vec<(PathBuf, String)> = paths
        .into_iter()
        .map(|p| p.strip_prefix(&src).expect("under src").to_path_buf())
        .filter(|p| p != Path::new("lib.rs") && !p.starts_with("sim"))
        .map(|p| {
            let code = fs::read_to_string(src.join(&p)).expect("a source file");
            (p, code)
        })
        .collect();
    assert!(
        declared_layers(&lib_rs).len() >= 2,
        "lib.rs declares no layers under a `# Layers` heading"
    );
    let (bad, checked) = violations(&lib_rs, &files).unwrap_or_else(|e| panic!("{e}"));
    assert!(
        bad.is_empty(),
        "imports against the layer order (src/lib.rs, \"Layers\"):\n{}",
        bad.join("\n")
    );
    // The session alone reaches into every lower layer: finding fewer
    // paths than files means the scanner stopped reading.
    assert!(checked > files.len(), "only {checked} paths found");
}

/// The check fails where it should: an upward `use` group, an upward
/// path in code, an upward root re-export and `super::` from a file at
/// the root are each reported; comments, strings and test modules are not.
#[test]
fn an_upward_import_is_reported() {
    let lib_rs = "\
//! # Layers
//!
//! 1. `checksum`, `codec`
//! 2. `frame`: framing
//! 3. `session`

pub mod checksum;
pub mod codec;
pub mod frame;
pub mod session;
pub use session::{Policy, Session};
";
    let file = |path: &str, code: &str| (PathBuf::from(path), code.to_string());
    let files = [
        file(
            "checksum.rs",
            "use crate::{codec::Postcard,\n    frame::{Frame, Tag}};\n\
             // crate::session in a comment\nconst S: &str = \"crate::session\";\n\
             fn f() -> usize { crate::Policy::default() as usize }\n\
             #[cfg(test)]\nmod tests { use crate::session::Session; }\n",
        ),
        file(
            "frame.rs",
            "use super::Session;\nuse crate::checksum::crc;\n",
        ),
        file(
            "session/outbox.rs",
            "use super::Policy;\nuse crate::frame::Frame;\n",
        ),
    ];
    let (bad, checked) = violations(lib_rs, &files).expect("a known layout");
    assert_eq!(
        bad,
        [
            "src/checksum.rs:1: `checksum` (layer 1) uses `codec` (layer 1)",
            "src/checksum.rs:1: `checksum` (layer 1) uses `frame` (layer 2)",
            "src/checksum.rs:5: `checksum` (layer 1) uses `session` (layer 3)",
            "src/frame.rs:1: `frame` (layer 2) uses `session` (layer 3)",
        ]
    );
    assert_eq!(checked, 6, "the lower imports are read too");
    let unknown = [file("frame.rs", "use crate::nowhere::X;\n")];
    assert!(violations(lib_rs, &unknown).is_err());
    let unlisted = lib_rs.replace("//! 3. `session`\n", "");
    assert!(violations(&unlisted, &[]).is_err());
}
