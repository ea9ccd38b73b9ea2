//! The application's side of a messenger: callbacks for messages and
//! connection life-cycle events.

use msgr_proto::{FaultReason, Message};

use crate::Connection;

/// Receives what a [`crate::Messenger`] delivers.
///
/// Callbacks run on the messenger's worker thread that owns the connection, in
/// order per connection. Keep them short: a slow callback delays every
/// connection of that worker. Sending from a callback is cheap (no wake-up).
///
/// ```
/// use msgr::{Connection, Dispatcher, Message};
/// struct Echo;
/// impl Dispatcher for Echo {
///     fn on_message(&self, conn: &Connection, msg: Message) {
///         let _ = conn.send(msg); // echo it back
///     }
/// }
/// ```
pub trait Dispatcher: Send + Sync + 'static {
    /// A message arrived (in order; exactly once on lossless connections).
    fn on_message(&self, conn: &Connection, msg: Message);

    /// A connection this side opened is established.
    fn on_connect(&self, conn: &Connection) {
        let _ = conn;
    }

    /// A connection from a peer is established.
    fn on_accept(&self, conn: &Connection) {
        let _ = conn;
    }

    /// The connection ended: lossy fault, peer close, mark-down, or a lossless
    /// server session whose peer never came back. Queued messages were dropped.
    fn on_reset(&self, conn: &Connection, reason: &FaultReason) {
        let _ = (conn, reason);
    }

    /// The peer lost the session (it restarted or reset it): unacknowledged
    /// messages were dropped, and the connection continues as a new session.
    fn on_remote_reset(&self, conn: &Connection) {
        let _ = conn;
    }
}

/// A dispatcher that drops everything (for send-only messengers).
#[derive(Debug, Default, Clone, Copy)]
pub struct NullDispatcher;

impl Dispatcher for NullDispatcher {
    fn on_message(&self, _conn: &Connection, _msg: Message) {}
}
