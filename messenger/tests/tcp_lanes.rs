//! Priority lanes over real sockets: a call at `Interactive` made while
//! 16 MiB messages of the default class stream on the same connection is
//! answered before the bulk is through; without lanes (one side
//! configured with `max_fragment_bytes = 0`) the same call waits behind
//! every bulk message queued before it, as one order requires.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::*;
use msgr::{Connection, Dispatcher, Message, MessengerConfig, Policy, Priority};

const BULK: u64 = 8;
const BULK_LEN: usize = 16 << 20;

/// Counts whole bulk messages (type 1) and answers calls (type 2) with
/// the count at the moment the call arrived.
#[derive(Default)]
struct Server {
    bulk: AtomicU64,
}

impl Dispatcher for Server {
    fn on_message(&self, conn: &Connection, msg: Message) {
        match msg.msg_type {
            1 => {
                assert_eq!(msg.data.len(), BULK_LEN, "a bulk message whole");
                self.bulk.fetch_add(1, Ordering::SeqCst);
            }
            2 => {
                let seen = self.bulk.load(Ordering::SeqCst);
                // The reply takes the call's class (`replying_to`).
                let reply = Message::new(3, seen.to_le_bytes().to_vec(), Vec::new());
                conn.reply(&msg, reply).expect("reply queued");
            }
            _ => {}
        }
    }
}

/// Streams `BULK` messages of 16 MiB, then calls at `Interactive`: the
/// bulk messages the server had whole when the call reached it, the
/// class the reply came in, and whether every bulk message arrived.
fn call_behind_bulk(server_cfg: MessengerConfig) -> (u64, Priority) {
    let d = Arc::new(Server::default());
    let srv = server(server_cfg, d.clone());
    let cli = client(fast_config(), Recorder::new());
    let conn = cli
        .connect_with(srv.addr().expect("bound"), Policy::LosslessClient)
        .unwrap();
    conn.wait_connected(Duration::from_secs(10)).unwrap();
    let payload = Bytes::from(vec![7u8; BULK_LEN]);
    for _ in 0..BULK {
        send(&conn, Message::new(1, Bytes::new(), payload.clone()));
    }
    let call = Message::new(2, &b"now?"[..], &b""[..]).with_class(Priority::Interactive);
    let reply = conn.call(call, Duration::from_secs(60)).expect("answered");
    let mut seen = [0u8; 8];
    seen.copy_from_slice(&reply.front[..8]);
    let all = wait_until(Duration::from_secs(60), || {
        d.bulk.load(Ordering::SeqCst) == BULK
    });
    assert!(all, "every bulk message arrived");
    (u64::from_le_bytes(seen), reply.class())
}

#[test]
fn an_interactive_call_overtakes_streaming_bulk() {
    let (seen, class) = call_behind_bulk(fast_config());
    assert!(
        seen < BULK,
        "the call waited for all {BULK} bulk messages ({seen} before it)"
    );
    assert_eq!(
        class,
        Priority::Interactive,
        "the reply in the call's class"
    );
}

#[test]
fn without_lanes_the_call_keeps_its_place_behind_the_bulk() {
    let mut cfg = fast_config();
    cfg.set("max_fragment_bytes", "0").unwrap();
    let (seen, _) = call_behind_bulk(cfg);
    assert_eq!(seen, BULK, "one order: the call after every bulk message");
}
