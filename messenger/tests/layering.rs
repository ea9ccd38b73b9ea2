//! The crate's modules import in one direction, nested modules included:
//! the `# Layers` docs of `src/lib.rs` and of every module with two or more
//! submodules declare their order, bottom first, and a module uses only
//! siblings in lower layers. msgr-layering reads every `crate::` and
//! `super::` path in `src/`; comments, strings and `#[cfg(test)]` modules
//! are not read.

#[test]
fn modules_import_only_from_layers_below() {
    msgr_layering::assert_layered(env!("CARGO_MANIFEST_DIR"), &[]);
}
