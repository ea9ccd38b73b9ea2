//! Generates the bindings from the system's <infiniband/verbs.h> and
//! <rdma/rdma_cma.h> and compiles bindgen's C wrappers for the static inline
//! functions (ibv_post_send, ibv_poll_cq, ibv_req_notify_cq, ...), which have
//! no symbol in libibverbs and could not be called otherwise.
use std::env;
use std::path::PathBuf;

fn main() {
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let out = PathBuf::from(env::var("OUT_DIR").expect("OUT_DIR"));
    let header = manifest.join("wrapper.h");
    let wrappers = out.join("static_fns");
    println!("cargo:rerun-if-changed={}", header.display());

    let bindings = bindgen::Builder::default()
        .header(header.to_str().expect("utf-8 path"))
        .allowlist_function("_*ibv_.*")
        .allowlist_function("rdma_.*")
        .allowlist_type("ibv_.*")
        .allowlist_type("rdma_.*")
        .allowlist_var("IBV_.*")
        .allowlist_var("RDMA_.*")
        // Enum constants as plain consts named like the C enumerators
        // (IBV_QPS_RTS, IBV_WC_SUCCESS, RDMA_CM_EVENT_ESTABLISHED...).
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
                "bindgen failed on <infiniband/verbs.h> + <rdma/rdma_cma.h>: {e}\n\
                 install the headers and libclang: apt-get install libibverbs-dev librdmacm-dev libclang-dev"
            )
        });
    bindings
        .write_to_file(out.join("bindings.rs"))
        .expect("write bindings.rs");

    cc::Build::new()
        .file(wrappers.with_extension("c"))
        .include(&manifest)
        .warnings(false)
        .compile("rdma_cm_sys_static_fns");

    println!("cargo:rustc-link-lib=ibverbs");
    println!("cargo:rustc-link-lib=rdmacm");
}
