//! The loads the `hol` and `mixed` parts put on one connection at once:
//! bulk messages sent from one application thread, 64 B calls of a chosen
//! priority timed from another.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::sync::{mpsc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use msgr::{
    Connection, Dispatcher, EntityAddr, EntityName, FaultReason, Message, Messenger,
    MessengerConfig,
};

use crate::error::ToolError;
use crate::net::{self, Totals};
use crate::stats::StreamResult;

/// The highest priority the API can say today (`Message::priority` is a
/// `u8`, informative only until priority lanes exist): the urgent traffic
/// is sent with it, so the same bench shows what lanes gain once they do.
pub const HIGHEST: u8 = u8::MAX;
/// The priority of a message made with `Message::new`: the bulk's.
pub const DEFAULT: u8 = 0;

/// How often a waiting loop looks again.
const POLL: Duration = Duration::from_micros(200);

/// A load client's dispatcher: passes on the responder's answer to a
/// stream's end marker, keeps why the connection went.
struct LoadClient {
    done: Mutex<mpsc::Sender<Totals>>,
    reset: Mutex<Option<String>>,
}

impl LoadClient {
    fn fail(&self, why: String) {
        *self.reset.lock().unwrap_or_else(|p| p.into_inner()) = Some(why);
    }
}

impl Dispatcher for LoadClient {
    fn on_message(&self, _conn: &Connection, msg: Message) {
        if msg.msg_type == net::STREAM_DONE {
            let totals = msg.decode().unwrap_or_default();
            let _ = self
                .done
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .send(totals);
        }
    }

    fn on_reset(&self, _conn: &Connection, reason: &FaultReason) {
        self.fail(reason.to_string());
    }

    fn on_remote_reset(&self, _conn: &Connection) {
        self.fail("the server lost the session".into());
    }
}

/// When a series of calls ends.
#[derive(Clone, Copy, Debug)]
pub struct Calls {
    /// Untimed calls first.
    pub warmup: u64,
    /// Timed calls at most.
    pub max: u64,
    /// Timed calls at least (each bounded by the call timeout), so that a
    /// load making every call slow still yields a percentile...
    pub min: u64,
    /// ...unless this long has passed (and one is done).
    pub cap: Duration,
    /// No new call once this long has passed (and `min` are done).
    pub window: Duration,
    /// From the start of one call to the next; `None`: back to back.
    pub pace: Option<Duration>,
}

impl Calls {
    /// `count` timed calls after `warmup` untimed ones, `pace` apart.
    pub fn counted(warmup: u64, count: u64, pace: Option<Duration>) -> Calls {
        Calls {
            warmup,
            max: count,
            min: count,
            cap: Duration::MAX,
            window: Duration::MAX,
            pace,
        }
    }

    /// Calls `pace` apart until told to stop.
    pub fn until_stopped(pace: Option<Duration>) -> Calls {
        Calls {
            max: u64::MAX,
            min: 0,
            ..Calls::counted(0, 0, pace)
        }
    }
}

/// One client messenger with its one connection to the bench's server (a
/// session is one per pair of peers: each load client is a messenger).
pub struct LoadConn {
    messenger: Messenger,
    conn: Connection,
    client: Arc<LoadClient>,
    done: Mutex<mpsc::Receiver<Totals>>,
    target: String,
    timeout: Duration,
}

impl LoadConn {
    /// Starts `name`'s messenger of `cfg` and connects it to `target`;
    /// `timeout` bounds the connect and, later, every call and bulk run.
    pub fn open(
        name: EntityName,
        cfg: &MessengerConfig,
        target: &EntityAddr,
        (connect_timeout, timeout): (Duration, Duration),
    ) -> Result<LoadConn, ToolError> {
        let (tx, rx) = mpsc::channel();
        let client = Arc::new(LoadClient {
            done: Mutex::new(tx),
            reset: Mutex::new(None),
        });
        let mut messenger = Messenger::builder(name)
            .config(cfg.clone())
            .start(client.clone())?;
        let conn = messenger.connect(target)?;
        if let Err(e) = conn.wait_connected(connect_timeout) {
            messenger.shutdown(Duration::from_secs(1));
            return Err(ToolError::Timeout {
                what: format!("connecting to {target}: {e}"),
                after: connect_timeout,
            });
        }
        Ok(LoadConn {
            messenger,
            conn,
            client,
            done: Mutex::new(rx),
            target: target.to_string(),
            timeout,
        })
    }

    fn reset(&self) -> Option<ToolError> {
        let reason = self
            .client
            .reset
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()?;
        Some(ToolError::Reset {
            peer: self.target.clone(),
            reason,
        })
    }

    /// 64 B calls (echoed by the responder) of `priority` as `plan` says,
    /// until then or until `stop`: their round trips, ns, and the seconds
    /// the timed ones took.
    pub fn calls(
        &self,
        priority: u8,
        plan: &Calls,
        stop: &AtomicBool,
    ) -> Result<(Vec<u64>, f64), ToolError> {
        let mut ping = Message::new(net::PING, Bytes::new(), vec![0xa5u8; 64]);
        ping.priority = priority;
        let mut rtt_ns = Vec::new();
        let mut started = Instant::now();
        for i in 0.. {
            let timed = i >= plan.warmup;
            let n = rtt_ns.len() as u64;
            if i == plan.warmup {
                started = Instant::now();
            }
            let elapsed = started.elapsed();
            if timed
                && (n >= plan.max
                    || (n >= plan.min && (elapsed >= plan.window || stop.load(Ordering::Relaxed)))
                    || (n >= 1 && elapsed >= plan.cap))
            {
                break;
            }
            if let Some(pace) = plan.pace {
                let due = started + pace * n as u32;
                std::thread::sleep(due.saturating_duration_since(Instant::now()));
            }
            let t0 = Instant::now();
            self.conn
                .call(ping.clone(), self.timeout)
                .map_err(|e| ToolError::BadReply {
                    peer: self.target.clone(),
                    what: format!("call: {e}"),
                })?;
            if timed {
                rtt_ns.push(t0.elapsed().as_nanos() as u64);
            }
        }
        Ok((rtt_ns, started.elapsed().as_secs_f64()))
    }

    /// Streams `size`-byte messages at the default priority until `stop`,
    /// as fast as the send queue takes them, or keeping at most `window`
    /// bytes unacknowledged; then the end marker. The clock stops at the
    /// responder's answer to it, which comes after every message: all were
    /// delivered, and are checked counted.
    pub fn bulk(
        &self,
        size: usize,
        window: Option<usize>,
        stop: &AtomicBool,
    ) -> Result<StreamResult, ToolError> {
        let msg = Message::new(net::STREAM, Bytes::new(), vec![0xa5u8; size]);
        let start = Instant::now();
        let deadline = start + self.timeout;
        let timed_out = |what: &str| ToolError::Timeout {
            what: format!("{what} to {}", self.target),
            after: self.timeout,
        };
        let mut sent = 0u64;
        while !stop.load(Ordering::Relaxed) {
            if let Some(e) = self.reset() {
                return Err(e);
            }
            if let Some(w) = window {
                if self.conn.queued().1 as usize + size > w {
                    if Instant::now() >= deadline {
                        return Err(timed_out("bulk messages unacknowledged"));
                    }
                    std::thread::sleep(POLL);
                    continue;
                }
            }
            let left = deadline.saturating_duration_since(Instant::now());
            self.conn.send_timeout(msg.clone(), left)?;
            sent += 1;
        }
        let end = Message::new(net::STREAM_END, Bytes::new(), Bytes::new());
        let left = deadline.saturating_duration_since(Instant::now());
        self.conn.send_timeout(end, left)?;
        let done = self.done.lock().unwrap_or_else(|p| p.into_inner());
        let totals = loop {
            if let Ok(t) = done.recv_timeout(Duration::from_millis(50)) {
                break t;
            }
            if let Some(e) = self.reset() {
                return Err(e);
            }
            if Instant::now() >= deadline {
                return Err(timed_out("bulk stream's end"));
            }
        };
        let elapsed = start.elapsed().as_secs_f64();
        if totals.this_stream != sent {
            return Err(ToolError::Incomplete {
                peer: self.target.clone(),
                sent,
                delivered: totals.this_stream,
            });
        }
        Ok(StreamResult::new(size, sent, elapsed))
    }

    /// Bytes queued and not yet acknowledged on the connection.
    pub fn queued_bytes(&self) -> u64 {
        self.conn.queued().1
    }

    /// Closes the connection and stops the messenger.
    pub fn close(mut self) {
        drop(self.conn);
        self.messenger.shutdown(Duration::from_secs(2));
    }
}

/// Runs `f` with a flag that is set as soon as it fails, so that the
/// loads beside it end too.
pub fn stopping_on_error<T>(
    stop: &AtomicBool,
    f: impl FnOnce() -> Result<T, ToolError>,
) -> Result<T, ToolError> {
    let r = f();
    if r.is_err() {
        stop.store(true, Ordering::Relaxed);
    }
    r
}
