//! The checker holds itself to its own rule: its modules import in one
//! direction, as the `# Layers` list of `src/lib.rs` declares.

#[test]
fn modules_import_only_from_layers_below() {
    msgr_layering::assert_layered(env!("CARGO_MANIFEST_DIR"), &[]);
}
