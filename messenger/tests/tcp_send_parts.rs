//! `Connection::send_parts` delivers what `send` delivers: the same
//! messages in the same order and class, and the same refusals.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use msgr::{Connection, Dispatcher, Message, Policy, Priority, SendError};

/// What a message arrived as: type, front, data, class.
type Seen = (u16, Vec<u8>, Vec<u8>, Priority);

/// Records every message in the order the dispatcher saw it.
#[derive(Default)]
struct Log(Mutex<Vec<Seen>>);

impl Dispatcher for Log {
    fn on_message(&self, _: &Connection, msg: Message) {
        let seen = (
            msg.msg_type,
            msg.front.to_vec(),
            msg.data.to_vec(),
            msg.class(),
        );
        self.0.lock().unwrap().push(seen);
    }
}

/// The `i`th message of the mix: small and large (past a batch's
/// quarter, so it goes whole), types of one and of more varint bytes,
/// data and interactive classes.
fn nth(i: u32) -> Seen {
    let len = match i % 7 {
        0 => 0,
        3 => 20 << 10,
        5 => 300,
        _ => 64,
    };
    let msg_type = if i.is_multiple_of(2) { 5 } else { 0x6d03 };
    let class = if i.is_multiple_of(5) {
        Priority::Interactive
    } else {
        Priority::Data
    };
    let front = i.to_le_bytes().to_vec();
    (msg_type, front, vec![i as u8; len], class)
}

/// Each message of the mix sent twice, by `send` and by `send_parts`
/// (in turn first), arrives twice, identical, in its class's order.
#[test]
fn send_parts_delivers_as_send_does() {
    let log = Arc::new(Log::default());
    let mut srv = server(fast_config(), log.clone());
    let mut cli = client(fast_config(), Arc::new(msgr::NullDispatcher));
    let conn = cli.connect(srv.addr().expect("bound")).unwrap();
    const N: u32 = 2000;
    for i in 0..N {
        let (msg_type, front, data, class) = nth(i);
        let owned = || Message::new(msg_type, front.clone(), data.clone()).with_class(class);
        let borrowed = || conn.send_parts_in(class, msg_type, &front, &data);
        if i.is_multiple_of(2) {
            send(&conn, owned());
            borrowed().expect("send_parts");
        } else {
            borrowed().expect("send_parts");
            send(&conn, owned());
        }
    }
    let total = 2 * N as usize;
    assert!(
        wait_until(Duration::from_secs(60), || log.0.lock().unwrap().len()
            == total),
        "delivered {} of {total}",
        log.0.lock().unwrap().len()
    );
    let seen = log.0.lock().unwrap().clone();
    for class in [Priority::Data, Priority::Interactive] {
        let expected: Vec<Seen> = (0..N)
            .map(nth)
            .filter(|m| m.3 == class)
            .flat_map(|m| [m.clone(), m])
            .collect();
        let got: Vec<Seen> = seen.iter().filter(|m| m.3 == class).cloned().collect();
        assert!(got == expected, "{class:?} messages differ from send's");
    }
    cli.shutdown(Duration::from_secs(5));
    srv.shutdown(Duration::from_secs(5));
}

/// Over the peer's limits, past the queue's bound and on a closed
/// connection, `send_parts` refuses as `send` does, and queues nothing.
#[test]
fn send_parts_refuses_as_send_does() {
    let mut cfg = fast_config();
    cfg.session.max_queued_messages = 4;
    cfg.session.limits.max_segment[2] = 1000;
    let mut cli = client(cfg, Arc::new(msgr::NullDispatcher));
    // A listener that never answers: what is queued stays queued.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = format!("tcp://{}", silent.local_addr().unwrap())
        .parse()
        .unwrap();
    let conn = cli.connect_with(&addr, Policy::LosslessClient).unwrap();
    let refusal = |r: Result<(), SendError>| r.expect_err("refused");
    let both = |front: &[u8], data: &[u8]| {
        let owned = conn.send(Message::new(1, front.to_vec(), data.to_vec()));
        (
            owned.map_err(SendError::from),
            conn.send_parts(1, front, data),
        )
    };

    let (owned, borrowed) = both(b"", &[0; 1001]);
    assert!(
        matches!(refusal(owned.clone()), SendError::TooLarge(_)),
        "{owned:?}"
    );
    assert_eq!(owned, borrowed, "over the peer's data limit");
    assert_eq!(conn.queued(), (0, 0));

    for _ in 0..2 {
        let (owned, borrowed) = both(b"f", b"dd");
        assert_eq!((owned, borrowed), (Ok(()), Ok(())));
    }
    assert_eq!(conn.queued(), (4, 12));
    let (owned, borrowed) = both(b"f", b"dd");
    assert!(
        matches!(refusal(owned.clone()), SendError::QueueFull { .. }),
        "{owned:?}"
    );
    assert_eq!(owned, borrowed, "past the queue's bound");
    // A class above data has room of its own beyond the bound, for both.
    let owned = conn.send(Message::new(1, &b"f"[..], &b"dd"[..]).with_class(Priority::Interactive));
    let borrowed = conn.send_parts_in(Priority::Interactive, 1, b"f", b"dd");
    assert_eq!((owned.map_err(SendError::from), borrowed), (Ok(()), Ok(())));
    assert_eq!(conn.queued(), (6, 18));

    conn.mark_down();
    assert!(wait_until(Duration::from_secs(10), || {
        conn.state() == msgr::ConnectionState::Closed
    }));
    let (owned, borrowed) = both(b"f", b"dd");
    assert_eq!(refusal(owned.clone()), SendError::Closed);
    assert_eq!(owned, borrowed, "on a closed connection");
    cli.shutdown(Duration::from_secs(5));
}
