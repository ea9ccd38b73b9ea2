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
