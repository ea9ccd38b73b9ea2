//! Bulk data by one-sided RMA, the Mercury pattern: a client exposes a
//! buffer to read and one to write, sends their handles in a call, and the
//! server pulls the input, works on it and pushes the result, then replies.
//! The bytes never pass through either side's dispatcher.
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use msgr::{Access, Connection, Dispatcher, EntityName, Message, Messenger, RmaHandle, RmaOptions};
use msgr::{NullDispatcher, TypedMessage};
use serde::{Deserialize, Serialize};

/// "Read `len` bytes from `input`, write them reversed into `output`."
#[derive(Serialize, Deserialize)]
struct Job {
    input: RmaHandle,
    output: RmaHandle,
    len: u64,
}
impl TypedMessage for Job {
    const TYPE: u16 = 1;
}

/// Hands jobs to a thread of the server's own: RMA waits for the peer, so
/// it does not run on the worker that delivers its answers.
struct Jobs(Mutex<mpsc::Sender<(Connection, Message)>>);
impl Dispatcher for Jobs {
    fn on_message(&self, conn: &Connection, req: Message) {
        let _ = self.0.lock().unwrap().send((conn.clone(), req));
    }
}

fn serve(jobs: mpsc::Receiver<(Connection, Message)>) {
    let checked = RmaOptions::from(Duration::from_secs(5)).checksum();
    for (conn, req) in jobs {
        let Ok(job) = req.decode_typed::<Job>() else {
            continue;
        };
        let done = conn
            .read(&job.input, 0, job.len, checked)
            .and_then(|bytes| {
                let reversed: Vec<u8> = bytes.iter().rev().copied().collect();
                conn.write(&job.output, 0, reversed, checked)
            });
        let _ = conn.reply(
            &req,
            Message::new(2, format!("{done:?}").into_bytes(), &b""[..]),
        );
    }
}

pub fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (tx, rx) = mpsc::channel();
    let mut server = Messenger::builder(EntityName::server(1))
        .bind("tcp://127.0.0.1:0".parse()?)
        .start(Arc::new(Jobs(Mutex::new(tx))))?;
    std::thread::spawn(move || serve(rx));
    let mut client = Messenger::builder(EntityName::client(1)).start(Arc::new(NullDispatcher))?;

    let data: Vec<u8> = (0..1_000_000u32).map(|i| (i % 251) as u8).collect();
    let input = client.expose(data.clone(), Access::Read);
    let output = client.expose(vec![0u8; data.len()], Access::Write);
    let conn = client.connect(server.addr().expect("bound"))?;
    let job = Job {
        input: input.handle(),
        output: output.handle(),
        len: data.len() as u64,
    };
    let reply = conn.call(Message::typed(&job)?, Duration::from_secs(10))?;
    assert_eq!(&reply.front[..], b"Ok(())");
    assert!(
        output.bytes().iter().eq(data.iter().rev()),
        "the result is in place"
    );

    client.shutdown(Duration::from_secs(5));
    server.shutdown(Duration::from_secs(5));
    Ok(())
}
