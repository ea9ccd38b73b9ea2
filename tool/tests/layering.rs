//! The tool's modules import in one direction, nested modules included:
//! the `# Layers` docs of `src/main.rs` and of every module with two or
//! more submodules declare their order, bottom first, and a module uses
//! only siblings in lower layers (msgr-layering reads every `crate::` and
//! `super::` path in `src/`).

#[test]
fn modules_import_only_from_layers_below() {
    msgr_layering::assert_layered(env!("CARGO_MANIFEST_DIR"), &[]);
}
