//! A messenger built without a configuration reads its environment: the
//! `bind` key alone picks the backend and listens; a typo is an error at
//! start; `without_env` reads nothing. Alone in its test binary: it sets
//! process-wide environment variables.

use std::sync::Arc;
use std::time::Duration;

use msgr::{EntityName, Messenger, MessengerError, NullDispatcher, TransportKind};

#[test]
fn the_environment_alone_configures_a_messenger_and_typos_are_refused() {
    let start = || Messenger::builder(EntityName::server(1)).start(Arc::new(NullDispatcher));
    std::env::set_var("MSGR_BIND", "tcp://127.0.0.1:0");
    std::env::set_var("MSGR_WORKERS", "2");
    let mut m = start().expect("start from the environment");
    assert_eq!(m.addr().expect("bound").transport, TransportKind::Tcp);
    assert_ne!(
        m.addr().expect("bound").socket.port(),
        0,
        "listening: {}",
        m.addr().expect("bound")
    );
    m.shutdown(Duration::from_secs(1));

    let mut quiet = Messenger::builder(EntityName::client(1))
        .without_env()
        .start(Arc::new(NullDispatcher))
        .expect("start without the environment");
    assert_eq!(quiet.addr(), None, "not listening");
    quiet.shutdown(Duration::from_secs(1));

    std::env::set_var("MSGR_WOKRERS", "2");
    let e = start().err().expect("a typo is an error");
    assert!(
        matches!(&e, MessengerError::Config(_)) && e.to_string().contains("MSGR_WOKRERS"),
        "{e}"
    );
    std::env::remove_var("MSGR_WOKRERS");
    std::env::set_var("MSGR_HANDSHAKE_TIMEOUT_MS", "0");
    let e = start().err().expect("a zero timeout is an error");
    assert!(e.to_string().contains("must be 1..="), "{e}");
    for v in ["MSGR_BIND", "MSGR_WORKERS", "MSGR_HANDSHAKE_TIMEOUT_MS"] {
        std::env::remove_var(v);
    }
}

/// docs/CONFIG.md is generated from `CONFIG_KEYS` (the keys `set`
/// accepts, with their descriptions): it fails when they differ.
/// `MSGR_TEST_BLESS=1` writes it anew.
#[test]
fn config_doc_is_generated_from_the_keys() {
    let mut doc = String::from(
        "# Configuration keys\n\n\
         Generated from `msgr::CONFIG_KEYS` (messenger/src/config.rs): \
         `MSGR_TEST_BLESS=1 cargo test -p msgr --test config_env config_doc` \
         writes it again, and the test fails while they differ.\n\n\
         Each key can be set in code (`MessengerConfig::set`), in a TOML file of \
         flat `key = value` lines (`MessengerConfig::from_file`, or \
         `MSGR_CONFIG=path`), or as an environment variable `MSGR_<KEY>` \
         (`MSGR_WORKERS=2`). A messenger built without `.config(..)` reads \
         `MSGR_CONFIG` and `MSGR_*` itself (`.without_env()` opts out). Every \
         value is checked at start and refused with its allowed range; an \
         unknown key is an error, except the test harness's reserved prefixes \
         (`MSGR_IN_GUEST`, `MSGR_GUEST_`, `MSGR_STRESS_`, `MSGR_TEST_`).\n\n\
         | Key | Meaning (default) |\n|---|---|\n",
    );
    for (key, what) in msgr::CONFIG_KEYS {
        doc.push_str(&format!("| `{key}` | {} |\n", what.replace('|', "\\|")));
    }
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/CONFIG.md");
    if std::env::var_os("MSGR_TEST_BLESS").is_some() {
        std::fs::write(&path, &doc).unwrap();
    }
    let on_disk = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        on_disk == doc,
        "docs/CONFIG.md is not what CONFIG_KEYS says: run with MSGR_TEST_BLESS=1"
    );
}
