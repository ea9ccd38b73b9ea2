//! Publish/subscribe: subscribers connect to a publisher, which
//! broadcasts each update to every connection (one payload, shared).
use std::time::Duration;

use msgr::{EntityName, Inbox, Message, Messenger, Policy};

pub fn main() -> Result<(), Box<dyn std::error::Error>> {
    let publisher_inbox = Inbox::new();
    let mut publisher = Messenger::builder(EntityName::server(1))
        .bind("tcp://127.0.0.1:0".parse()?)
        .start(publisher_inbox.dispatcher())?;
    // Three subscribers, each with an inbox of its own.
    let mut subscribers = Vec::new();
    for id in 1..=3 {
        let inbox = Inbox::new();
        let m = Messenger::builder(EntityName::client(id)).start(inbox.dispatcher())?;
        let conn = m.connect_with(publisher.addr().expect("bound"), Policy::LosslessClient)?;
        conn.wait_connected(Duration::from_secs(5))?;
        subscribers.push((m, inbox));
    }
    // The publisher knows its peers once their sessions are open.
    while publisher.connections().len() < 3 {
        publisher_inbox
            .next_event_timeout(Duration::from_secs(5))
            .ok_or("no subscriber")?;
    }
    for c in publisher.connections() {
        let peer = c.peer().ok_or("peer unknown")?;
        println!("subscriber {} at {}", peer.name, peer.addr);
    }
    for n in 0..10u32 {
        let sent = publisher.broadcast(Message::new(7, n.to_le_bytes().to_vec(), Vec::new()));
        assert_eq!((sent.sent, sent.refused.len()), (3, 0));
    }
    for (m, inbox) in &mut subscribers {
        for n in 0..10u32 {
            let (_, msg) = inbox
                .recv_timeout(Duration::from_secs(5))
                .ok_or("update lost")?;
            assert_eq!(msg.front[..], n.to_le_bytes());
        }
        println!("{} got all 10 updates", m.name());
        m.shutdown(Duration::from_secs(1));
    }
    publisher.shutdown(Duration::from_secs(1));
    Ok(())
}
