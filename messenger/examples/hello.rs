//! Two messengers on loopback exchange one typed message, and the client
//! prints its counters (the Prometheus text of `Messenger::counters`).
//!
//! msgr logs through `tracing`; this example installs no subscriber, so it
//! needs nothing but msgr. To see the logs, install one (README, "Logging").
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use msgr::{Connection, Dispatcher, EntityName, Message, Messenger, NullDispatcher};

struct Inbox(Mutex<mpsc::Sender<String>>);
impl Dispatcher for Inbox {
    fn on_message(&self, _c: &Connection, msg: Message) {
        let text: String = msg.decode().unwrap_or_default();
        let _ = self.0.lock().map(|tx| tx.send(text));
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (tx, rx) = mpsc::channel();
    let mut server = Messenger::builder(EntityName::server(1))
        .bind("tcp://127.0.0.1:0".parse()?)
        .start(Arc::new(Inbox(Mutex::new(tx))))?;
    let mut client = Messenger::builder(EntityName::client(1)).start(Arc::new(NullDispatcher))?;
    let conn = client.connect(server.addr().expect("bound"))?;
    conn.send(Message::encode(1, &"hello".to_string())?)?;
    let got = rx.recv_timeout(Duration::from_secs(5))?;
    println!("received {got:?}");
    println!("{}", client.counters().prometheus());
    client.shutdown(Duration::from_secs(1));
    server.shutdown(Duration::from_secs(1));
    Ok(())
}
