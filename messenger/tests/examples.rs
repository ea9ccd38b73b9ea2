//! The examples run here, so they cannot rot; the README's example is
//! examples/kv.rs itself (checked below).

#[allow(dead_code)]
#[path = "../examples/async_rpc.rs"]
mod async_rpc;
#[path = "../examples/bulk.rs"]
mod bulk;
#[path = "../examples/kv.rs"]
mod kv;
#[path = "../examples/pubsub.rs"]
mod pubsub;

#[test]
fn kv_example_runs() {
    kv::main().expect("kv example");
}

#[test]
fn bulk_example_runs() {
    bulk::main().expect("bulk example");
}

#[test]
fn pubsub_example_runs() {
    pubsub::main().expect("pubsub example");
}

#[test]
fn async_rpc_example_runs_under_tokio() {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async_rpc::run())
        .expect("async_rpc example");
}

/// The README shows the kv example as it is in examples/kv.rs, and it is
/// short.
#[test]
fn the_readme_example_is_the_kv_example() {
    let kv = include_str!("../examples/kv.rs");
    let readme = include_str!("../../README.md");
    assert!(
        readme.contains(kv.trim()),
        "README.md must quote examples/kv.rs verbatim"
    );
    assert!(kv.lines().count() < 60, "the kv example is under 60 lines");
}
