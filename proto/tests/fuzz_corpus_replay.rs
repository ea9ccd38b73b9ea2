//! Replays every committed fuzz input — `fuzz/corpus/<target>/*` (seeds) and
//! `fuzz/regressions/<target>/*` (inputs that once found a bug) — through the
//! target bodies in `msgr_proto::sim::fuzz`, without a fuzzer. Fails if the
//! corpus is missing or empty, so it cannot pass vacuously.
#![cfg(feature = "sim")]

use std::path::{Path, PathBuf};

use msgr_proto::sim::fuzz::{run, TARGETS};

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz")
}

/// Files directly under `dir`, sorted; empty if `dir` does not exist.
fn files(dir: &Path) -> Vec<PathBuf> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut v: Vec<PathBuf> = rd
        .map(|e| e.expect("readable directory entry").path())
        .filter(|p| p.is_file())
        .collect();
    v.sort();
    v
}

fn replay(target: &str, paths: &[PathBuf]) {
    for p in paths {
        let data = std::fs::read(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        let r = std::panic::catch_unwind(|| assert!(run(target, &data)));
        assert!(r.is_ok(), "fuzz target {target} fails on {}", p.display());
    }
}

#[test]
fn every_target_has_a_seed_corpus_and_it_replays_clean() {
    let mut total = 0;
    for target in TARGETS {
        let dir = fuzz_dir().join("corpus").join(target);
        let seeds = files(&dir);
        assert!(
            !seeds.is_empty(),
            "no seed corpus in {} (run `cargo run -p msgr-proto --features sim --example gen_fuzz_corpus`)",
            dir.display()
        );
        replay(target, &seeds);
        total += seeds.len();
    }
    assert!(total >= TARGETS.len());
}

#[test]
fn every_regression_input_replays_clean() {
    let root = fuzz_dir().join("regressions");
    assert!(root.is_dir(), "{} is missing", root.display());
    let mut total = 0;
    for target in TARGETS {
        let inputs = files(&root.join(target));
        replay(target, &inputs);
        total += inputs.len();
    }
    // Directories of unknown targets would never be replayed: refuse them.
    for d in std::fs::read_dir(&root).expect("regressions dir").flatten() {
        let name = d.file_name().to_string_lossy().into_owned();
        assert!(
            !d.path().is_dir() || TARGETS.contains(&name.as_str()),
            "fuzz/regressions/{name} names no fuzz target"
        );
    }
    eprintln!("replayed {total} regression inputs");
}

#[test]
fn the_fuzz_crate_lists_exactly_the_replayed_targets() {
    let manifest = std::fs::read_to_string(fuzz_dir().join("Cargo.toml")).expect("fuzz/Cargo.toml");
    for target in TARGETS {
        assert!(
            manifest.contains(&format!("name = \"{target}\"")),
            "fuzz/Cargo.toml has no [[bin]] {target}"
        );
        let src = fuzz_dir().join("fuzz_targets").join(format!("{target}.rs"));
        let body = std::fs::read_to_string(&src).expect("fuzz target source");
        assert!(
            body.contains(&format!("msgr_proto::sim::fuzz::{target}(")),
            "{} does not call the replayed body",
            src.display()
        );
    }
    assert_eq!(manifest.matches("[[bin]]").count(), TARGETS.len());
}
