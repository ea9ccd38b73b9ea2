//! What the checker reports: one [`Offence`] per edge against the declared
//! order, and per gap in the declarations themselves.

use std::fmt;
use std::path::PathBuf;

/// One thing wrong, at a file (and a line where there is one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Offence {
    /// The file, relative to the crate's folder (`src/auth/keys.rs`).
    pub file: PathBuf,
    /// The 1-based line, where the offence is at one.
    pub line: Option<usize>,
    /// What is wrong.
    pub kind: Kind,
}

/// What an [`Offence`] is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    /// `from` reaches `to`, and under their common parent `to`'s side is
    /// not in a lower layer than `from`'s.
    Upward {
        /// The module whose code has the path.
        from: String,
        /// The module the path reaches.
        to: String,
        /// Their nearest common ancestor, whose layers rule the edge.
        parent: String,
        /// `from`'s side's layer under `parent` (1 is the bottom).
        from_layer: usize,
        /// `to`'s side's layer under `parent`.
        to_layer: usize,
    },
    /// A module with two or more child modules declares no `# Layers`.
    Undeclared {
        /// The module.
        module: String,
        /// Its child modules.
        children: Vec<String>,
    },
    /// A child module missing from its parent's `# Layers` list.
    Unlisted {
        /// The parent.
        module: String,
        /// The child it leaves out.
        child: String,
    },
    /// A `# Layers` list names something that is no child module.
    NotAChild {
        /// The module whose list it is.
        module: String,
        /// The name.
        name: String,
    },
    /// A path the checker cannot follow: it must not pass by not knowing.
    Unresolved {
        /// The module whose code has the path.
        from: String,
        /// The path as written.
        path: String,
    },
    /// A `mod x;` with no file behind it.
    MissingFile {
        /// The module.
        module: String,
    },
    /// The caller excluded a module the crate does not have.
    UnknownExclusion {
        /// The name the caller gave.
        module: String,
    },
}

impl fmt::Display for Offence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file.display())?;
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
        }
        write!(f, ": ")?;
        match &self.kind {
            Kind::Upward {
                from,
                to,
                parent,
                from_layer,
                to_layer,
            } => write!(
                f,
                "`{from}` uses `{to}`, but in `{parent}`'s layers {} is {from_layer} and {} is {to_layer}: \
                 a module may use only lower layers",
                side(from, parent),
                side(to, parent),
            ),
            Kind::Undeclared { module, children } => write!(
                f,
                "`{module}` has child modules {} and no `# Layers` section ordering them",
                quoted(children)
            ),
            Kind::Unlisted { module, child } => {
                write!(f, "`{module}`'s `# Layers` leaves out its child module `{child}`")
            }
            Kind::NotAChild { module, name } => {
                write!(f, "`{module}`'s `# Layers` names `{name}`, which is no child module of it")
            }
            Kind::Unresolved { from, path } => write!(
                f,
                "`{from}` uses `{path}`, which names no module, item or import the checker can find"
            ),
            Kind::MissingFile { module } => write!(f, "module `{module}` has no file"),
            Kind::UnknownExclusion { module } => {
                write!(f, "excluded module `{module}` is no module of the crate")
            }
        }
    }
}

/// The display name of a module path (`crate` for the root).
pub fn display_path(path: &[String]) -> String {
    if path.is_empty() {
        "crate".to_string()
    } else {
        path.join("::")
    }
}

/// The child of `parent` on the way to `module` (both display paths).
fn side(module: &str, parent: &str) -> String {
    let below = if parent == "crate" {
        module
    } else {
        module
            .strip_prefix(parent)
            .and_then(|r| r.strip_prefix("::"))
            .unwrap_or(module)
    };
    format!("`{}`", below.split("::").next().unwrap_or(below))
}

fn quoted(names: &[String]) -> String {
    names
        .iter()
        .map(|n| format!("`{n}`"))
        .collect::<Vec<_>>()
        .join(", ")
}
