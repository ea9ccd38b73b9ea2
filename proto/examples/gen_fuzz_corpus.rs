//! Writes the seed corpus of every fuzz target to `fuzz/corpus/<target>/`,
//! from valid encodings (see `msgr_proto::sim::fuzz::seed_corpus`).
//!
//! ```text
//! cargo run -p msgr-proto --features sim --example gen_fuzz_corpus
//! ```

use std::path::PathBuf;

fn main() -> std::io::Result<()> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus");
    let mut n = 0;
    for (target, name, bytes) in msgr_proto::sim::fuzz::seed_corpus() {
        let dir = root.join(target);
        std::fs::create_dir_all(&dir)?;
        std::fs::write(dir.join(format!("seed-{name}")), bytes)?;
        n += 1;
    }
    println!("wrote {n} seeds under {}", root.display());
    Ok(())
}
