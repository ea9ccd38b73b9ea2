//! Generates the bindings from the system's <rdma/fabric.h> and friends (found
//! with pkg-config) and compiles bindgen's C wrappers for the static inline
//! functions (fi_domain, fi_endpoint, fi_send, fi_cq_read, ...): libfabric
//! dispatches through per-object ops tables in inline functions, which have no
//! symbol in libfabric.so and could not be called otherwise.
use std::env;
use std::path::PathBuf;

fn main() {
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let out = PathBuf::from(env::var("OUT_DIR").expect("OUT_DIR"));
    let header = manifest.join("wrapper.h");
    let wrappers = out.join("static_fns");
    println!("cargo:rerun-if-changed={}", header.display());

    let lib = pkg_config::Config::new()
        .atleast_version("1.17")
        .probe("libfabric")
        .unwrap_or_else(|e| {
            panic!(
                "libfabric >= 1.17 not found by pkg-config: {e}\n\
                 install it: apt-get install libfabric-dev libclang-dev"
            )
        });
    let clang_args: Vec<String> = lib
        .include_paths
        .iter()
        .map(|p| format!("-I{}", p.display()))
        .collect();

    let bindings = bindgen::Builder::default()
        .header(header.to_str().expect("utf-8 path"))
        .clang_args(&clang_args)
        .allowlist_function("fi_.*")
        .allowlist_type("fi_.*")
        .allowlist_var("FI_.*")
        .prepend_enum_name(false)
        .derive_default(true)
        .derive_debug(true)
        .impl_debug(false)
        .layout_tests(true)
        .wrap_static_fns(true)
        .wrap_static_fns_path(&wrappers)
        .parse_callbacks(Box::new(bindgen::CargoCallbacks::new()))
        .generate()
        .unwrap_or_else(|e| {
            panic!(
                "bindgen failed on <rdma/fabric.h>: {e}\n\
                 install the headers and libclang: apt-get install libfabric-dev libclang-dev"
            )
        });
    bindings
        .write_to_file(out.join("bindings.rs"))
        .expect("write bindings.rs");

    let mut build = cc::Build::new();
    build
        .file(wrappers.with_extension("c"))
        .include(&manifest)
        .flag_if_supported("-Wno-deprecated-declarations")
        .warnings(false);
    for p in &lib.include_paths {
        build.include(p);
    }
    build.compile("libfabric_sys_static_fns");
}
