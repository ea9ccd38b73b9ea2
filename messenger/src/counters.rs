//! Messenger-wide counters, readable from the API and as Prometheus text.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

macro_rules! counters {
    ($( $(#[doc = $doc:literal])* $(#[cfg($cfg:meta)])? $name:ident ),* $(,)?) => {
        /// Live counters of one messenger. Cheap to update (relaxed atomics).
        ///
        /// ```
        /// # use std::{sync::Arc, time::Duration};
        /// use msgr::{Counters, EntityName, Messenger, NullDispatcher};
        /// let m = Messenger::builder(EntityName::client(1)).without_env().start(Arc::new(NullDispatcher))?;
        /// let counters: &Counters = m.counters();
        /// assert_eq!(Counters::get(&counters.sessions_active), 0);
        /// # Ok::<(), Box<dyn std::error::Error>>(())
        /// ```
        #[derive(Debug, Default)]
        pub struct Counters {
            $( $(#[doc = $doc])* $(#[cfg($cfg)])? pub $name: AtomicU64, )*
        }

        impl Counters {
            /// Every counter's name, help text and current value.
            ///
            /// ```
            /// let counters = msgr::Counters::default();
            /// let all = counters.snapshot();
            /// assert!(all.iter().any(|&(name, _help, value)| name == "tx_messages" && value == 0));
            /// ```
            pub fn snapshot(&self) -> Vec<(&'static str, &'static str, u64)> {
                Vec::from([ $(
                    $(#[cfg($cfg)])?
                    (stringify!($name), concat!($($doc),*), self.$name.load(Ordering::Relaxed)),
                )* ])
            }
        }
    };
}

counters! {
    /// Messages handed to a transport (replays included).
    tx_messages,
    /// Payload bytes handed to a transport (replays included).
    tx_bytes,
    /// Batch frames handed to a transport (replays included): tx_messages per tx_batches is the messages per frame where all are small.
    tx_batches,
    /// Ack frames sent: acknowledgements no outgoing message carried, each a write of its own (an ack waits up to `ack_delay_us` for a message to carry it).
    tx_acks,
    /// Batch frames received (duplicates included): rx_messages per rx_batches is the peer's messages per frame where all are small.
    rx_batches,
    /// Messages delivered to the dispatcher (counted once the worker is done with the session's batch: after the `on_message` calls).
    rx_messages,
    /// Units (frames and batch frames) the workers took from their links: rx_frames per worker_turns is how many links' input one turn serves, rx_messages per worker_turns the messages it delivers.
    rx_frames,
    /// Worker loop turns that handled commands or what links reported (input, connections, failures): rx_frames and rx_messages per turn say how many links' batches one turn serves.
    worker_turns,
    /// Times a worker blocked in its poll (its spin window over, nothing due): each one's wake-up costs a context switch.
    worker_sleeps,
    /// Payload bytes delivered to the dispatcher (counted as `rx_messages`).
    rx_bytes,
    /// Sessions established by connecting.
    sessions_connected,
    /// Sessions established by accepting.
    sessions_accepted,
    /// Attempts to open a connection that failed before it was ever established (on_connect_failed).
    connect_failures,
    /// Sessions currently alive.
    sessions_active,
    /// Transport links currently open.
    links_active,
    /// Sessions resumed on a new link after a fault.
    reconnects,
    /// Dial attempts after a failed link or attempt, each after the session's backoff (doubling, with jitter; see Connection::status).
    redials,
    /// Messages sent again after a reconnect.
    replayed_messages,
    /// Received duplicates dropped.
    duplicates_dropped,
    /// Link faults of any kind.
    link_faults,
    /// Links closed for undecodable input (bad CRC, hostile length, bad banner).
    protocol_errors,
    /// Links closed because a frame's or banner's CRC32C did not match (data corrupted on the way; counted in protocol_errors too).
    checksum_failures,
    /// Links closed because authentication failed (unknown name, wrong key, a handshake message that did not verify, a name other than the one proved, a mode not allowed).
    auth_failures,
    /// Links closed because a frame on a secure link did not open (altered, truncated, replayed, reordered, or sent in the clear).
    sealed_frames_refused,
    /// Accepted links refused because they claimed a session whose peer had authenticated as someone else (the session was not touched).
    impostors_refused,
    /// Sessions that went on over another transport than their last link's (an address vector: a failover, or a move back).
    transport_changes,
    /// Replies that came after their call gave up (timed out, or its future was dropped): dropped.
    late_replies,
    /// One-sided reads of this messenger's exposed regions served (msgr::rma).
    rma_reads_served,
    /// One-sided writes into this messenger's exposed regions served.
    rma_writes_served,
    /// Bytes read from or written into exposed regions by peers.
    rma_bytes_served,
    /// Bytes the owner copied out of its regions to answer reads (none for a region exposed with `Messenger::expose_shared`: its reads are answered with slices of it).
    rma_bytes_copied,
    /// One-sided operations refused: revoked or unknown region, wrong capability or peer, out of range, not allowed, bad checksum, malformed.
    rma_refused,
    /// Keys of exposed regions handed to peers for native operations (the region registered on the link's endpoint).
    rma_keys_given,
    /// Reads of peers' regions done natively (fi_read by this messenger's worker, no CPU of the owner's in the way).
    rma_native_reads,
    /// Writes into peers' regions done natively (an RDMA WRITE by this messenger's worker, acknowledged by the owner's NIC).
    rma_native_writes,
    /// Native reads and writes that failed (link gone, region withdrawn, stale key) and were asked of the owner instead.
    rma_native_fallbacks,
    /// Links faulted because the peer fell silent.
    keepalive_timeouts,
    /// Sessions reset (on_reset).
    session_resets,
    /// Sessions reset by the peer (on_remote_reset).
    remote_resets,
    /// Queued messages dropped by resets and mark-downs.
    messages_dropped,
    /// Sends refused because a send queue was full.
    send_queue_full,
    /// Sends refused because the message was larger than the peer takes (SendError::TooLarge), and sessions ended because a message queued before the peer's limits were known was (FaultReason::TooLarge).
    messages_too_large,
    /// Times reading paused because the receive throttle was full.
    rx_throttle_pauses,
    /// Faults injected: by a fault plan, `Connection::inject_fault` or `Connection::simulate_fault` (cargo feature `fault-injection`).
    #[cfg(feature = "fault-injection")]
    injected_faults,
    /// Units the fault plan (`faults`, tests) corrupted on the wire (cargo feature `fault-injection`).
    #[cfg(feature = "fault-injection")]
    corruptions_injected,
    /// Accepted connections closed because too many handshakes were pending and none was idle: at once when no more could wait for a slot, or after waiting the handshake timeout.
    handshakes_refused,
    /// Accepted connections that waited, unread, for a handshake slot (too many were pending and none was idle): a burst from one address.
    handshakes_waited,
    /// Pending handshakes whose peer had not sent a banner, closed to make room for a new connection (handshake admission).
    handshakes_evicted,
    /// Times a worker confined to one CPU stopped spinning for a while because a yield handed a whole time slice to a busy thread sharing that CPU.
    spin_pauses,
    /// Dispatcher callbacks that panicked (each ended its connection, or aborted the process: `on_handler_panic`).
    handler_panics,
    /// Worker threads that died of a panic (a bug: their sessions are lost; sends to them fail).
    worker_deaths,
}

impl Counters {
    /// Reads one counter.
    ///
    /// ```
    /// let counters = msgr::Counters::default();
    /// assert_eq!(msgr::Counters::get(&counters.tx_messages), 0);
    /// ```
    pub fn get(c: &AtomicU64) -> u64 {
        c.load(Ordering::Relaxed)
    }

    /// Adds to one counter.
    pub(crate) fn add(c: &AtomicU64, n: u64) {
        if n != 0 {
            c.fetch_add(n, Ordering::Relaxed);
        }
    }

    /// The counters in Prometheus text exposition format, names prefixed `msgr_`.
    ///
    /// ```
    /// let text = msgr::Counters::default().prometheus();
    /// assert!(text.contains("msgr_tx_messages 0"));
    /// ```
    pub fn prometheus(&self) -> String {
        let mut out = String::new();
        for (name, help, value) in self.snapshot() {
            let kind = if name.ends_with("_active") {
                "gauge"
            } else {
                "counter"
            };
            let _ = writeln!(out, "# HELP msgr_{name} {}", help.trim());
            let _ = writeln!(out, "# TYPE msgr_{name} {kind}");
            let _ = writeln!(out, "msgr_{name} {value}");
        }
        out
    }

    /// Backends' own counters ([`crate::Messenger::transport_stats`]) in
    /// Prometheus text format: `msgr_transport_<name>{backend="verbs"} value`.
    ///
    /// ```
    /// use msgr::{Counters, TransportKind, TransportStats};
    /// let stats = [TransportStats { kind: TransportKind::Verbs, values: vec![("credit_stalls", 3)] }];
    /// let text = Counters::transport_prometheus(&stats);
    /// assert!(text.contains(r#"msgr_transport_credit_stalls{backend="verbs"} 3"#));
    /// ```
    pub fn transport_prometheus(stats: &[msgr_backends::TransportStats]) -> String {
        let mut out = String::new();
        for s in stats {
            for (name, value) in &s.values {
                let _ = writeln!(
                    out,
                    "msgr_transport_{name}{{backend=\"{}\"}} {value}",
                    s.kind.scheme()
                );
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prometheus_text_lists_every_counter_with_its_value() {
        let c = Counters::default();
        Counters::add(&c.rx_messages, 5);
        let text = c.prometheus();
        assert!(text.contains("msgr_rx_messages 5\n"), "{text}");
        assert!(text.contains("# TYPE msgr_sessions_active gauge"));
        assert_eq!(
            text.lines().filter(|l| !l.starts_with('#')).count(),
            c.snapshot().len()
        );
    }
}
