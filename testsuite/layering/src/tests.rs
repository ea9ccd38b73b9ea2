//! The checker against made-up crates written to temporary folders: each
//! test names the exact offences it must report.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use super::*;

/// A made-up crate in a temporary folder, removed on drop.
struct MadeUp(PathBuf);

impl MadeUp {
    fn new(files: &[(&str, &str)]) -> MadeUp {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "msgr-layering-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        for (path, text) in files {
            let path = dir.join(path);
            fs::create_dir_all(path.parent().expect("a file in a folder")).expect("mkdir");
            fs::write(path, text).expect("write");
        }
        MadeUp(dir)
    }

    fn offences(&self, excluded: &[&str]) -> Vec<String> {
        check_crate(&self.0, excluded)
            .iter()
            .map(ToString::to_string)
            .collect()
    }
}

impl Drop for MadeUp {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

const LIB_RS: &str = "\
//! A made-up crate.
//!
//! # Layers
//!
//! 1. [`checksum`], [`codec`]: the leaves
//! 2. `frame`: framing
//! 3. `auth`
//! 4. `session`

pub mod auth;
pub mod checksum;
pub mod codec;
pub mod frame;
pub mod session;
pub use session::{Policy, Session};
";

const AUTH_RS: &str = "\
//! # Layers
//!
//! 1. `keys`
//! 2. `handshake`

pub mod handshake;
pub mod keys;
pub use handshake::Noise;
use crate::frame::Frame;
";

/// A crate whose modules all import downwards, into which each test
/// writes one file over.
fn clean(replace: &[(&str, &str)]) -> MadeUp {
    let mut files = vec![
        ("src/lib.rs", LIB_RS),
        ("src/checksum.rs", "pub fn crc() {}\n"),
        ("src/codec.rs", "pub struct Postcard;\n"),
        (
            "src/frame.rs",
            "use crate::checksum::crc;\npub struct Frame;\npub enum Tag {}\n",
        ),
        ("src/auth/mod.rs", AUTH_RS),
        ("src/auth/keys.rs", "use crate::codec::Postcard;\npub struct Key;\n"),
        (
            "src/auth/handshake.rs",
            "use super::keys::Key;\nuse super::Frame;\npub struct Noise(Key);\n",
        ),
        ("src/session.rs", "use crate::auth::{Noise, keys::Key};\npub struct Session;\n#[derive(Default)]\npub struct Policy;\n"),
    ];
    for (path, text) in replace {
        files.retain(|(p, _)| p != path);
        files.push((path, text));
    }
    MadeUp::new(&files)
}

#[test]
fn a_crate_that_imports_downwards_has_no_offence() {
    let made_up = clean(&[]);
    assert_eq!(made_up.offences(&[]), Vec::<String>::new());
    let report = check(&made_up.0, &[]);
    assert_eq!(report.modules, 8);
    assert_eq!(report.paths, 7);
}

/// The upward edges of the top level as the old single-level test read
/// them: a `use` group, a path in code, a root re-export, `super::` from
/// a file at the root; comments, strings and test modules are not read.
#[test]
fn an_upward_import_at_the_top_level_is_reported() {
    let made_up = clean(&[
        (
            "src/checksum.rs",
            "use crate::{codec::Postcard,\n    frame::{Frame, Tag}};\n\
             // crate::session in a comment\nconst S: &str = \"crate::session\";\n\
             fn f() -> usize { crate::Policy::default() as usize }\n\
             #[cfg(test)]\nmod tests { use crate::session::Session; }\n\
             #[cfg(test)]\nmod more;\npub fn crc() {}\n",
        ),
        (
            "src/frame.rs",
            "use super::Session;\nuse crate::checksum::crc;\npub struct Frame;\npub enum Tag {}\n",
        ),
    ]);
    assert_eq!(
        made_up.offences(&[]),
        [
            "src/checksum.rs:1: `checksum` uses `codec`, but in `crate`'s layers `checksum` is 1 and `codec` is 1: a module may use only lower layers",
            "src/checksum.rs:2: `checksum` uses `frame`, but in `crate`'s layers `checksum` is 1 and `frame` is 2: a module may use only lower layers",
            "src/checksum.rs:2: `checksum` uses `frame`, but in `crate`'s layers `checksum` is 1 and `frame` is 2: a module may use only lower layers",
            "src/checksum.rs:5: `checksum` uses `session`, but in `crate`'s layers `checksum` is 1 and `session` is 4: a module may use only lower layers",
            "src/frame.rs:1: `frame` uses `session`, but in `crate`'s layers `frame` is 2 and `session` is 4: a module may use only lower layers",
        ]
    );
}

/// A circle between two nested modules: `keys` uses `handshake` (directly,
/// and through the name its parent re-exports) while `handshake` uses
/// `keys`.
#[test]
fn a_circle_between_nested_modules_fails() {
    let made_up = clean(&[(
        "src/auth/keys.rs",
        "pub struct Key;\nfn f() { let _ = super::handshake::Noise(Key); }\n\
         use super::Noise;\n",
    )]);
    assert_eq!(
        made_up.offences(&[]),
        [
            "src/auth/keys.rs:2: `auth::keys` uses `auth::handshake`, but in `auth`'s layers `keys` is 1 and `handshake` is 2: a module may use only lower layers",
            "src/auth/keys.rs:3: `auth::keys` uses `auth::handshake`, but in `auth`'s layers `keys` is 1 and `handshake` is 2: a module may use only lower layers",
        ]
    );
}

/// A nested module reaching out of its parent is ruled by the ancestor
/// where the path leaves: `auth::keys` may not use `session`, as `auth`
/// may not; a name `auth` re-exports is followed to `auth::handshake`.
#[test]
fn a_path_out_of_a_parent_is_ruled_by_the_common_ancestor() {
    let made_up = clean(&[
        (
            "src/auth/keys.rs",
            "pub struct Key(crate::session::Session);\n",
        ),
        ("src/frame.rs", "pub struct Frame(crate::auth::Noise);\n"),
    ]);
    assert_eq!(
        made_up.offences(&[]),
        [
            "src/auth/keys.rs:1: `auth::keys` uses `session`, but in `crate`'s layers `auth` is 3 and `session` is 4: a module may use only lower layers",
            "src/frame.rs:1: `frame` uses `auth::handshake`, but in `crate`'s layers `frame` is 2 and `auth` is 3: a module may use only lower layers",
        ]
    );
}

/// Coverage cannot shrink in silence: a parent of two modules with no
/// list, a list leaving out a child or naming none, a module with no
/// file, an exclusion naming no module, a path naming nothing.
#[test]
fn gaps_in_the_declarations_are_offences() {
    let made_up = clean(&[
        ("src/auth/mod.rs", "pub mod handshake;\npub mod keys;\npub use handshake::Noise;\nuse crate::frame::Frame;\n"),
        (
            "src/lib.rs",
            &LIB_RS
                .replace("//! 1. [`checksum`], [`codec`]: the leaves", "//! 1. `checksum`, `codecs`")
                .replace("pub mod session;", "pub mod session;\nmod gone;"),
        ),
        ("src/frame.rs", "pub struct Frame(crate::nowhere::X);\n"),
    ]);
    assert_eq!(
        made_up.offences(&["sim"]),
        [
            "src: excluded module `sim` is no module of the crate",
            "src/auth/mod.rs: `auth` has child modules `handshake`, `keys` and no `# Layers` section ordering them",
            "src/frame.rs:1: `frame` uses `crate::nowhere::X`, which names no module, item or import the checker can find",
            "src/gone/mod.rs: module `gone` has no file",
            "src/lib.rs: `crate`'s `# Layers` leaves out its child module `codec`",
            "src/lib.rs: `crate`'s `# Layers` leaves out its child module `gone`",
            "src/lib.rs: `crate`'s `# Layers` names `codecs`, which is no child module of it",
        ]
    );
}

/// An excluded module is not read, nor its children; it keeps its place
/// in its parent's list, and a path into it from below is still upward.
#[test]
fn an_excluded_module_is_not_read_but_still_placed() {
    let made_up = clean(&[
        (
            "src/lib.rs",
            &LIB_RS
                .replace(
                    "//! 4. `session`",
                    "//! 4. `session`\n//! 5. `sim`: a harness",
                )
                .replace("pub mod session;", "pub mod session;\npub mod sim;"),
        ),
        ("src/sim/mod.rs", "mod a;\nmod b;\nuse crate::x::y;\n"),
        (
            "src/session.rs",
            "pub struct Session(crate::sim::Harness);\npub struct Policy;\n",
        ),
    ]);
    assert_eq!(
        made_up.offences(&["sim"]),
        ["src/session.rs:1: `session` uses `sim`, but in `crate`'s layers `session` is 4 and `sim` is 5: a module may use only lower layers"]
    );
}

/// `x.rs` beside a folder `x/`, inline modules, `super::` chains and an
/// import followed through a chain of `use` lines.
#[test]
fn other_module_layouts_are_read() {
    let made_up = clean(&[
        ("src/session.rs", "//! # Layers\n//!\n//! 1. `state`\n//! 2. `handlers`\n\nmod handlers;\nmod state;\npub struct Session;\npub struct Policy;\n"),
        ("src/session/state.rs", "use super::handlers::Handler;\n"),
        (
            "src/session/handlers.rs",
            "pub struct Handler;\npub mod inner {\n    use super::super::state;\n    fn f() { super::super::super::codec::Postcard; }\n}\n",
        ),
        ("src/codec.rs", "pub struct Postcard;\nuse crate::session::Session as S;\n"),
    ]);
    assert_eq!(
        made_up.offences(&[]),
        [
            "src/codec.rs:2: `codec` uses `session`, but in `crate`'s layers `codec` is 1 and `session` is 4: a module may use only lower layers",
            "src/session/state.rs:1: `session::state` uses `session::handlers`, but in `session`'s layers `state` is 1 and `handlers` is 2: a module may use only lower layers",
        ]
    );
}

#[test]
fn this_crate_imports_downwards() {
    assert_layered(Path::new(env!("CARGO_MANIFEST_DIR")), &[]);
}
