//! The crate's modules import in one direction, nested modules included:
//! each module's `# Layers` docs list its children bottom first, and a
//! module uses only siblings in lower layers (`msgr-layering`).

#[test]
fn modules_import_in_one_direction() {
    msgr_layering::assert_layered(env!("CARGO_MANIFEST_DIR"), &[]);
}
