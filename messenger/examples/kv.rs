//! A key-value store over calls: typed requests, typed replies.
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use msgr::{Connection, Dispatcher, EntityName, Message, Messenger, NullDispatcher};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
enum Request {
    Put(String, Vec<u8>),
    Get(String),
    Delete(String),
}
#[derive(Serialize, Deserialize, Debug, PartialEq)]
struct Value(Option<Vec<u8>>);
msgr::typed_messages!(Request = 1, Value = 2);

#[derive(Default)]
struct Store(Mutex<HashMap<String, Vec<u8>>>);

impl Dispatcher for Store {
    fn on_message(&self, conn: &Connection, req: Message) {
        let mut map = self.0.lock().unwrap();
        let value = match req.decode_typed::<Request>() {
            Ok(Request::Put(k, v)) => map.insert(k, v),
            Ok(Request::Get(k)) => map.get(&k).cloned(),
            Ok(Request::Delete(k)) => map.remove(&k),
            Err(_) => return,
        };
        let _ = conn.reply_typed(&req, &Value(value));
    }
}

pub fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut server = Messenger::builder(EntityName::server(1))
        .bind("tcp://127.0.0.1:0".parse()?)
        .start(Arc::new(Store::default()))?;
    let mut client = Messenger::builder(EntityName::client(1)).start(Arc::new(NullDispatcher))?;
    let kv = client.connect(server.addr().expect("bound"))?;
    let t = Duration::from_secs(5); // each call's timeout
    let _: Value = kv.call_typed(&Request::Put("answer".into(), b"42".to_vec()), t)?;
    let got: Value = kv.call_typed(&Request::Get("answer".into()), t)?;
    assert_eq!(got, Value(Some(b"42".to_vec())));
    let gone: Value = kv.call_typed(&Request::Delete("answer".into()), t)?;
    assert_eq!(gone, Value(Some(b"42".to_vec())));
    client.shutdown(t);
    server.shutdown(t);
    Ok(())
}
