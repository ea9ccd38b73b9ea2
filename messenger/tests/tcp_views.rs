//! Messages handed over as views of their batch (`Dispatcher::on_batch`)
//! and as owned messages (`on_message`) over real loopback TCP: the same
//! messages, with the same content, in the same order, once each.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use msgr::{Connection, Dispatcher, Message, MessageRef, MessageRefs};

/// How many of a batch's messages the dispatcher takes in `on_batch` (the
/// rest come to `on_message`).
#[derive(Clone, Copy, Debug)]
enum Take {
    None,
    All,
    /// The first `n` of each call, then it returns.
    First(usize),
}

/// What a message said: seq, type, flags, front, data.
type Seen = (u64, u16, u8, Vec<u8>, Vec<u8>);

/// What a message said, but its seq.
fn content(s: &Seen) -> (u16, u8, &[u8], &[u8]) {
    (s.1, s.2, &s.3, &s.4)
}

/// Records every message, whichever way it came.
struct Log {
    take: Take,
    seen: Mutex<Vec<Seen>>,
    /// Messages taken as views.
    viewed: AtomicU64,
}

impl Log {
    fn new(take: Take) -> Arc<Log> {
        Arc::new(Log {
            take,
            seen: Mutex::default(),
            viewed: AtomicU64::new(0),
        })
    }

    /// A message taken as a view.
    fn record(&self, m: MessageRef<'_>) {
        self.viewed.fetch_add(1, Ordering::Relaxed);
        self.push((m.seq, m.msg_type, m.flags), m.front, m.data);
    }

    fn push(&self, (seq, ty, flags): (u64, u16, u8), front: &[u8], data: &[u8]) {
        let seen = (seq, ty, flags, front.to_vec(), data.to_vec());
        self.seen.lock().unwrap().push(seen);
    }

    fn count(&self) -> usize {
        self.seen.lock().unwrap().len()
    }
}

impl Dispatcher for Log {
    fn on_message(&self, _: &Connection, m: Message) {
        self.push((m.seq, m.msg_type, m.flags), &m.front, &m.data);
    }

    fn on_batch(&self, _: &Connection, messages: &mut MessageRefs<'_>) {
        match self.take {
            Take::None => {}
            Take::All => messages.for_each(|m| self.record(m)),
            Take::First(n) => messages.take(n).for_each(|m| self.record(m)),
        }
    }
}

/// Messages of every head width: types of one to three varint bytes,
/// flags, fronts or none, and sizes from empty to fragmented (2 MiB, over
/// a lane's 1 MiB fragments) or alone in a frame (past a batch's bound).
fn messages() -> Vec<Message> {
    let types = [1u16, 0x7f, 0x80, 0x6d03, 0xffff];
    (0..3000u64)
        .map(|i| {
            let len = match i % 500 {
                7 => 2 << 20,
                13 => 100 << 10,
                _ => (i as usize * 37) % 200,
            };
            let front = if i % 3 == 0 { vec![i as u8; 5] } else { vec![] };
            let mut m = Message::new(types[i as usize % types.len()], front, pattern(1, i, len));
            m.flags = (i % 7) as u8;
            m
        })
        .collect()
}

/// What `take` saw of [`messages`], sent in chunks (so they travel in
/// batches), and how many it took as views.
fn delivered(take: Take) -> (Vec<Seen>, u64) {
    let log = Log::new(take);
    let mut srv = server(fast_config(), log.clone());
    let mut cli = client(fast_config(), Arc::new(msgr::NullDispatcher));
    let conn = cli.connect(srv.addr().expect("bound")).unwrap();
    let all = messages();
    for chunk in all.chunks(100) {
        conn.send_batch(chunk.to_vec()).expect("queued");
        assert!(
            wait_until(Duration::from_secs(60), || conn.queued().0 < 1000),
            "the queue drains"
        );
    }
    assert!(
        wait_until(Duration::from_secs(60), || log.count() >= all.len()),
        "{take:?}: delivered {} of {}",
        log.count(),
        all.len()
    );
    // Nothing more comes (a message delivered twice would).
    std::thread::sleep(Duration::from_millis(50));
    cli.shutdown(Duration::from_secs(5));
    srv.shutdown(Duration::from_secs(5));
    let seen = std::mem::take(&mut *log.seen.lock().unwrap());
    (seen, log.viewed.load(Ordering::Relaxed))
}

#[test]
fn views_and_owned_messages_deliver_the_same_in_the_same_order() {
    let want: Vec<Seen> = messages()
        .into_iter()
        .map(|m| (0, m.msg_type, m.flags, m.front.to_vec(), m.data.to_vec()))
        .collect();
    let (owned, viewed) = delivered(Take::None);
    assert_eq!(viewed, 0);
    // What was sent, in order (a message's seq is where its session
    // numbered it: fragments take numbers too).
    assert_eq!(owned.len(), want.len(), "owned: count");
    for (i, (s, w)) in owned.iter().zip(&want).enumerate() {
        assert!(
            content(s) == content(w),
            "owned: message {i} is not the one sent"
        );
    }
    for take in [Take::All, Take::First(3)] {
        let (seen, viewed) = delivered(take);
        assert_eq!(seen.len(), owned.len(), "{take:?}: count");
        for (i, (s, o)) in seen.iter().zip(&owned).enumerate() {
            assert!(
                s == o,
                "{take:?}: message {i} differs (seq {} vs {})",
                s.0,
                o.0
            );
        }
        assert!(
            viewed > 100,
            "{take:?}: only {viewed} messages came as views"
        );
        assert!(
            viewed < want.len() as u64,
            "{take:?}: large messages come owned"
        );
    }
}

/// The server answers each call after a plain message of its own; the
/// client takes those as views, with the replies among them going to
/// their calls.
#[test]
fn replies_between_views_go_to_their_calls() {
    struct Answer(AtomicU64);
    impl Dispatcher for Answer {
        fn on_message(&self, _: &Connection, _: Message) {}
        fn on_batch(&self, conn: &Connection, messages: &mut MessageRefs<'_>) {
            for m in messages {
                let n = self.0.fetch_add(1, Ordering::Relaxed) + 1;
                let _ = conn.send(Message::new(2, n.to_le_bytes().to_vec(), vec![]));
                let reply = Message::new(3, m.front.to_vec(), vec![]);
                let _ = conn.reply(&m.to_message(), reply);
            }
        }
    }
    let log = Log::new(Take::All);
    let mut srv = server(fast_config(), Arc::new(Answer(AtomicU64::new(0))));
    let mut cli = client(fast_config(), log.clone());
    let conn = cli.connect(srv.addr().expect("bound")).unwrap();
    let (threads, calls) = (4u64, 50u64);
    std::thread::scope(|s| {
        for t in 0..threads {
            let conn = conn.clone();
            s.spawn(move || {
                for i in 0..calls {
                    let id = (t << 32 | i).to_le_bytes().to_vec();
                    let req = Message::new(1, id.clone(), vec![]);
                    let rep = conn.call(req, Duration::from_secs(30)).expect("answered");
                    assert_eq!(&rep.front[..], &id[..]);
                }
            });
        }
    });
    let n = threads * calls;
    assert!(
        wait_until(Duration::from_secs(30), || log.count() as u64 >= n),
        "{} of {n} plain messages",
        log.count()
    );
    let numbers: Vec<u64> = log
        .seen
        .lock()
        .unwrap()
        .iter()
        .map(|s| u64::from_le_bytes(s.3[..8].try_into().unwrap()))
        .collect();
    assert_eq!(numbers, (1..=n).collect::<Vec<_>>(), "in order, once each");
    cli.shutdown(Duration::from_secs(5));
    srv.shutdown(Duration::from_secs(5));
}
