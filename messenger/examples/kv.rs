//! A key-value store as a typed service: a request type, a handler, a client.
use std::{collections::HashMap, sync::Arc, sync::Mutex, time::Duration};

use msgr::{EntityName, Messenger, NullDispatcher, ServiceClient};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
enum Request {
    Put(String, Vec<u8>),
    Get(String),
    Delete(String),
}

pub fn main() -> Result<(), Box<dyn std::error::Error>> {
    let store = Mutex::new(HashMap::new());
    let server = Messenger::builder(EntityName::server(1))
        .bind("tcp://127.0.0.1:0".parse()?)
        .start(msgr::serve(move |req: Request| {
            let mut map = store.lock().unwrap();
            match req {
                Request::Put(k, v) => map.insert(k, v),
                Request::Get(k) => map.get(&k).cloned(),
                Request::Delete(k) => map.remove(&k),
            } // the reply: the value there was, if any
        }))?;
    let client = Messenger::builder(EntityName::client(1)).start(Arc::new(NullDispatcher))?;
    let kv: ServiceClient<Request, Option<Vec<u8>>> =
        ServiceClient::new(client.connect(server.addr().expect("bound"))?);
    let t = Duration::from_secs(5); // each call's timeout
    let value = Some(b"42".to_vec());
    kv.call(&Request::Put("answer".into(), b"42".to_vec()), t)?;
    assert_eq!(kv.call(&Request::Get("answer".into()), t)?, value);
    assert_eq!(kv.call(&Request::Delete("answer".into()), t)?, value);
    Ok(()) // dropping a messenger shuts it down
}
