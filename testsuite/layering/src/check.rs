//! The rules, applied to a [`Tree`]: each module's `# Layers` list covers
//! exactly its children, and every `crate::` or `super::` path reaches
//! only what the layers allow.
//!
//! A path from module `a::b::x` that reaches `a::c::y` is ruled by their
//! nearest common ancestor `a`: in `a`'s list `c` must be in a lower layer
//! than `b`. A path into the module's own subtree, or to an item of one of
//! its ancestors' own files (the whole a child is a part of), crosses no
//! sibling line.

use crate::offence::{display_path, Kind, Offence};
use crate::paths;
use crate::source::line_of;
use crate::tree::{keyword_offsets, ModPath, Module, Tree};

/// How many `use` imports one name may be followed through (a guard
/// against an import chain that comes back to itself).
const MAX_IMPORT_HOPS: usize = 16;

/// What a path reaches: a module (or an item in it), or something outside
/// the crate.
#[derive(Debug, PartialEq)]
enum Target {
    /// The module, and whether the path ends at an item in it.
    Module(ModPath),
    /// Another crate (`std`, `bytes`, ...).
    External,
}

/// The offences in `tree` and how many paths were checked.
pub fn check_tree(tree: &Tree) -> (Vec<Offence>, usize) {
    let mut offences = Vec::new();
    let mut checked = 0;
    for (path, module) in &tree.modules {
        let at = |line| Offence {
            file: module.file.clone(),
            line,
            kind: Kind::MissingFile {
                module: display_path(path),
            },
        };
        if module.missing {
            offences.push(at(None));
            continue;
        }
        if module.excluded {
            continue;
        }
        offences.extend(declaration_offences(path, module));
        for (segments, line) in references(&module.code) {
            checked += 1;
            let offence = |kind| Offence {
                file: module.file.clone(),
                line: Some(line),
                kind,
            };
            match resolve(tree, path, &segments, 0) {
                Err(()) => offences.push(offence(Kind::Unresolved {
                    from: display_path(path),
                    path: segments.join("::"),
                })),
                Ok(Target::External) => {}
                Ok(Target::Module(to)) => {
                    if let Some(kind) = edge_offence(tree, path, &to) {
                        offences.push(offence(kind));
                    }
                }
            }
        }
    }
    (offences, checked)
}

/// The gaps in `module`'s own `# Layers` list.
fn declaration_offences(path: &[String], module: &Module) -> Vec<Offence> {
    let name = display_path(path);
    let offence = |kind| Offence {
        file: module.file.clone(),
        line: None,
        kind,
    };
    let Some(layers) = &module.layers else {
        return if module.children.len() >= 2 {
            vec![offence(Kind::Undeclared {
                module: name,
                children: module.children.clone(),
            })]
        } else {
            Vec::new()
        };
    };
    let mut found = Vec::new();
    for child in &module.children {
        if !layers.iter().flatten().any(|n| n == child) {
            found.push(offence(Kind::Unlisted {
                module: name.clone(),
                child: child.clone(),
            }));
        }
    }
    for listed in layers.iter().flatten() {
        if !module.children.contains(listed) {
            found.push(offence(Kind::NotAChild {
                module: name.clone(),
                name: listed.clone(),
            }));
        }
    }
    found
}

/// The offence, if any, of a path from module `from` reaching `to`.
fn edge_offence(tree: &Tree, from: &[String], to: &[String]) -> Option<Kind> {
    let common = from.iter().zip(to).take_while(|(a, b)| a == b).count();
    if common == from.len() || common == to.len() {
        return None;
    }
    let parent = &from[..common];
    let layers = tree.modules.get(parent)?.layers.as_ref()?;
    let layer_of = |name: &String| layers.iter().position(|l| l.contains(name));
    // An unlisted side is reported once, at the parent's list.
    let from_layer = layer_of(&from[common])?;
    let to_layer = layer_of(&to[common])?;
    (to_layer >= from_layer).then(|| Kind::Upward {
        from: display_path(from),
        to: display_path(to),
        parent: display_path(parent),
        from_layer: from_layer + 1,
        to_layer: to_layer + 1,
    })
}

/// Every path in `code` anchored at `crate::` or `super::` (a `use` tree's
/// names one by one), with the line of its last segment.
fn references(code: &str) -> Vec<(Vec<String>, usize)> {
    let mut found = Vec::new();
    let mut anchors: Vec<usize> = keyword_offsets(code, "crate")
        .chain(keyword_offsets(code, "super"))
        .filter(|&at| code[at..].starts_with("crate::") || code[at..].starts_with("super::"))
        .collect();
    anchors.sort_unstable();
    let mut past = 0;
    for at in anchors {
        // `super::super::x` is one path, not two.
        if at < past {
            continue;
        }
        let (read, end) = paths::read(code, at);
        past = end;
        for p in read {
            found.push((p.segments, line_of(code, p.at)));
        }
    }
    found
}

/// The module `segments` (written in module `from`) reaches.
fn resolve(tree: &Tree, from: &[String], segments: &[String], hops: usize) -> Result<Target, ()> {
    if hops > MAX_IMPORT_HOPS {
        return Err(());
    }
    let Some(first) = segments.first() else {
        return Ok(Target::Module(from.to_vec()));
    };
    match first.as_str() {
        "crate" => walk(tree, Vec::new(), &segments[1..], hops),
        "super" => {
            let climbs = segments.iter().take_while(|s| *s == "super").count();
            if climbs > from.len() {
                return Err(());
            }
            walk(
                tree,
                from[..from.len() - climbs].to_vec(),
                &segments[climbs..],
                hops,
            )
        }
        "self" => walk(tree, from.to_vec(), &segments[1..], hops),
        // A bare `use` path: a child, a name in scope, or another crate.
        _ => match walk(tree, from.to_vec(), segments, hops) {
            Err(()) => Ok(Target::External),
            found => found,
        },
    }
}

/// Follows `rest` down from module `at`.
fn walk(tree: &Tree, mut at: ModPath, rest: &[String], hops: usize) -> Result<Target, ()> {
    for (i, segment) in rest.iter().enumerate() {
        let module = tree.modules.get(&at).ok_or(())?;
        if module.excluded || module.missing {
            return Ok(Target::Module(at));
        }
        if module.children.contains(segment) {
            at.push(segment.clone());
            continue;
        }
        if let Some(import) = module.imports.get(segment) {
            // `use super::keys;` then `keys::Key`: go on from what it names.
            return match resolve(tree, &at, &import.segments, hops + 1)? {
                Target::External => Ok(Target::External),
                Target::Module(to) if is_module_import(tree, &to, import) => {
                    walk(tree, to, &rest[i + 1..], hops + 1)
                }
                found => Ok(found),
            };
        }
        if module.items.contains(segment) {
            return Ok(Target::Module(at));
        }
        for glob in &module.globs {
            if let Ok(Target::Module(to)) = resolve(tree, &at, &glob.segments, hops + 1) {
                if let Ok(found) = walk(tree, to, &rest[i..], hops + 1) {
                    return Ok(found);
                }
            }
        }
        // A `#[macro_export]` macro is at the root whichever file has it.
        if at.is_empty() {
            let defines = |m: &Module| m.macros.contains(segment);
            if let Some((path, _)) = tree.modules.iter().find(|(_, m)| defines(m)) {
                return Ok(Target::Module(path.clone()));
            }
        }
        return Err(());
    }
    Ok(Target::Module(at))
}

/// Whether `import` names the module `to` itself (not an item in it).
fn is_module_import(tree: &Tree, to: &[String], import: &paths::Path) -> bool {
    tree.modules.contains_key(to) && to.last() == import.segments.last()
        || import
            .segments
            .last()
            .is_some_and(|s| s == "crate" || s == "super" || s == "self")
}
