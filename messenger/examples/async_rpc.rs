//! Request/response from async code (tokio here; msgr's futures need no
//! particular runtime): a server task answers requests from an inbox
//! stream, a client makes 100 calls at once and awaits them all.
use std::time::Duration;

use msgr::{ConnectionEvent, EntityName, Inbox, Message, Messenger, Policy};

pub async fn run() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let inbox = Inbox::new();
    let server = Messenger::builder(EntityName::server(1))
        .bind("tcp://127.0.0.1:0".parse()?)
        .start(inbox.dispatcher())?;
    // The server: answer every request with its payload doubled.
    let mut requests = inbox.messages();
    let serving = tokio::spawn(async move {
        let mut answered = 0u32;
        while let Some((conn, req)) = requests.next().await {
            let n = u32::from_le_bytes(req.front[..4].try_into().unwrap());
            let reply = Message::new(2, (2 * n).to_le_bytes().to_vec(), Vec::new());
            conn.send_async(reply.replying_to(&req)).await.unwrap();
            answered += 1;
        }
        answered // the stream ends when the server shuts down
    });

    let client_inbox = Inbox::new();
    let client = Messenger::builder(EntityName::client(1)).start(client_inbox.dispatcher())?;
    let conn = client.connect_with(server.addr().expect("bound"), Policy::LosslessClient)?;
    let mut events = client_inbox.events();
    let (_, first) = events.next().await.ok_or("no event")?;
    assert_eq!(first, ConnectionEvent::Connected);

    let calls: Vec<_> = (0..100u32)
        .map(|n| {
            conn.call_async(
                Message::new(1, n.to_le_bytes().to_vec(), Vec::new()),
                Duration::from_secs(5),
            )
        })
        .collect();
    for (n, call) in calls.into_iter().enumerate() {
        let reply = call.await?;
        assert_eq!(reply.front[..], (2 * n as u32).to_le_bytes());
    }
    println!("100 calls answered");
    client.shutdown_async(Duration::from_secs(1)).await;
    server.shutdown_async(Duration::from_secs(1)).await;
    assert_eq!(serving.await?, 100);
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    run().await
}
