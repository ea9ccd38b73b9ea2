//! One-sided RMA for users: expose a buffer, hand its handle to a peer in
//! any message, and let the peer read or write it.
//!
//! [`Messenger::expose`] takes a buffer and returns an [`RmaRegion`], the
//! owner: while it lives, whoever holds its [`RmaHandle`] (a small serde
//! value: region number, length, rights and a random capability) may
//! [`Connection::read`] or [`Connection::write`] a range of it over a
//! connection to the owner, as its rights say. Dropping or
//! [revoking](RmaRegion::revoke) the region ends that: later operations
//! fail with [`RmaError::Revoked`].
//!
//! # How an operation moves
//!
//! Where no NIC does the work, the owner's messenger serves the operation
//! (docs/PROTOCOL.md §6): the request is a call with the RMA bit, answered
//! by the owner's worker from the region — never by the dispatcher. So it
//! works over every backend and gets what messages get: frames checksummed
//! (and sealed in secure mode), and on a lossless connection each operation
//! lands exactly once across link faults, over the next address of an
//! address vector too (reads and writes in flight are replayed with the
//! session's messages); a lossy connection fails them with the fault
//! ([`RmaError::Call`] with [`CallError::Reset`]).
//!
//! # Any size
//!
//! An operation longer than `rma_part_bytes` (default 1 MiB), or than one
//! message carries (`max_data_bytes` of the side that receives the
//! bytes), moves in parts: each a request of its own as above (native
//! where it can be), `rma_parts_in_flight` of them at a time, the bytes
//! of a read put together in order. It completes when every part did; the
//! first part that fails fails it with [`RmaError::Part`], naming the
//! part; its timeout is the operation's.
//!
//! # Memory the application holds
//!
//! [`Messenger::expose_shared`] exposes `Bytes` the application already
//! holds, read-only, without a copy: each read is answered with a slice
//! of them (no lock: they are immutable), and [`SharedRegion::revoke`]
//! hands them back. [`Connection::read_many`] and
//! [`Connection::write_many`] (and their futures) move several ranges, of
//! one region or several, in one call with one completion.
//!
//! # Native operations
//!
//! Where the link's endpoints can, an operation moves with no CPU of the
//! owner's in the way: the first operation on a region over a link is
//! served as above and its reply brings the region's key on that link
//! (the owner's worker registers the region in place on the link's
//! endpoint, once, with the region's rights), and later operations on it
//! over that link are carried out by the requester's worker against the
//! owner's memory, many in flight:
//!
//! - `verbs` and `rdmacm`: reads and writes are RDMA READs and WRITEs on
//!   the link's RC queue pair; a write completes once the owner's NIC
//!   acknowledged it (its bytes are in the region).
//! - libfabric endpoints that read (`fabric+shm`, `fabric+verbs`; not
//!   `fabric+tcp` on libfabric 1.17, whose reads are withheld): reads are
//!   `fi_read`s. Writes are served by the owner: where the provider does
//!   not check keys (`shm`) a late write would land in memory the owner
//!   has taken back, and `tcp`'s completion does not say the bytes landed.
//!
//! A native operation that fails — the link went, the region was
//! withdrawn, the key is stale — is asked of the owner as above instead,
//! so it keeps the guarantees of the session (on a lossless connection it
//! completes once, over the next link; reads and writes are idempotent);
//! its counter is `rma_native_fallbacks`, and the region is not moved
//! natively over that link again. Over an RC queue pair an operation on a
//! withdrawn region fails the link itself (the NIC answers with a remote
//! access error, which ends the queue pair): a lossless session carries
//! on over the next link, a lossy one ends. Native operations are not
//! used in `secure` mode (a NIC moves bytes unsealed), nor with
//! [`RmaOptions::checksum`] (the owner's CPU computes the checksum): the
//! owner's messenger serves those. In `auth` mode the key goes only to
//! the peer that proved its name, over the authenticated session.
//!
//! # Memory safety
//!
//! The region owns its bytes. The worker serving an operation holds the
//! region (a reference count) and its lock while it copies; a revoked
//! region is out of the table first, so no operation starts on it, and
//! [`RmaRegion::revoke`] hands the buffer back only after an operation
//! being served has finished and every endpoint that registered it has
//! closed the registration (else, after a few seconds, it hands back a
//! copy and the memory is freed once they have). Bounds, rights, the
//! capability and (for [`Messenger::expose_to`]) the peer's name are
//! checked by the owner on every operation it serves, and before it hands
//! out a key; the requester checks bounds and rights too, before sending
//! anything. A native read is checked by the NIC: against the key, where
//! the provider checks keys, and where it does not (`shm`) by reading the
//! registration's check word after the range (zeroed when the region is
//! withdrawn). While the region is open to native reads, the owner's
//! [`RmaRegion::bytes_mut`] does not hold them off: a range read while
//! the owner writes it may mix old and new bytes.
//!
//! ```
//! use std::time::Duration;
//! use msgr::{Access, EntityName, Messenger, NullDispatcher};
//! # use std::sync::Arc;
//!
//! let owner = Messenger::builder(EntityName::server(1))
//!     .bind("tcp://127.0.0.1:0".parse().unwrap())
//!     .start(Arc::new(NullDispatcher))
//!     .unwrap();
//! let region = owner.expose(vec![7u8; 4096], Access::ReadWrite);
//! let handle = region.handle(); // travels in any message (serde)
//!
//! let peer = Messenger::builder(EntityName::client(1))
//!     .start(Arc::new(NullDispatcher))
//!     .unwrap();
//! let conn = peer.connect(owner.addr().expect("bound")).unwrap();
//! let t = Duration::from_secs(10);
//! conn.write(&handle, 100, &b"hello"[..], t).unwrap();
//! let back = conn.read(&handle, 98, 8, t).unwrap();
//! assert_eq!(&back[..], b"\x07\x07hello\x07");
//! assert_eq!(&region.bytes()[100..105], b"hello");
//! ```

use std::future::Future;
use std::ops::{Deref, DerefMut};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use bytes::Bytes;
use msgr_addr::EntityName;
use msgr_backends::RegionMemory;
use msgr_proto::checksum::crc32c;
use msgr_proto::priority::Priority;
/// What a region lets its peers do.
///
/// ```
/// use msgr::{Access, RmaOp};
/// assert!(Access::ReadWrite.allows(RmaOp::Write));
/// assert!(!Access::Read.allows(RmaOp::Write));
/// ```
pub use msgr_proto::rma::Access;
/// A region's name and rights, to send to the peers that may use it.
///
/// ```
/// # use std::sync::Arc;
/// use msgr::{Access, EntityName, Message, Messenger, NullDispatcher, RmaHandle};
/// let owner = Messenger::builder(EntityName::server(1)).without_env().start(Arc::new(NullDispatcher))?;
/// let region = owner.expose(vec![0u8; 4096], Access::Read);
/// let handle: RmaHandle = region.handle();
/// assert_eq!((handle.len, handle.access), (4096, Access::Read));
/// let carried = Message::encode(1, &handle)?; // in any message
/// assert_eq!(carried.decode::<RmaHandle>()?, handle);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub use msgr_proto::rma::RmaHandle;
/// A one-sided operation, as [`RmaError::Forbidden`] names it.
///
/// ```
/// use msgr::{Access, RmaOp};
/// assert!(Access::Write.allows(RmaOp::Write));
/// assert!(!Access::Write.allows(RmaOp::Read));
/// ```
pub use msgr_proto::rma::RmaOp;
use msgr_proto::rma::{RmaRequest, RmaStatus};
use msgr_proto::Message;

mod parts;

use parts::{Batch, Moved, Parts};

use crate::pending::RmaCall;
use crate::regions::{capability, Region, RegionTable, RMA_TYPE};
use crate::replies::{CallError, RmaAnswer};
use crate::state::Command;
use crate::state::{Shared, ThreadWaker};
use crate::{Connection, Messenger};

/// How long [`RmaRegion::revoke`] waits for the endpoints that registered
/// the region to close their registrations before it hands back a copy.
const REVOKE_WAIT: Duration = Duration::from_secs(5);

/// Why an RMA operation failed.
///
/// ```
/// # use std::{sync::Arc, time::Duration};
/// # use msgr::{EntityName, Inbox, Message, Messenger, NullDispatcher};
/// # let inbox = Inbox::new();
/// # let server = Messenger::builder(EntityName::server(1)).without_env()
/// #     .bind("tcp://127.0.0.1:0".parse()?).start(inbox.dispatcher())?;
/// # let client = Messenger::builder(EntityName::client(1)).without_env()
/// #     .start(Arc::new(NullDispatcher))?;
/// # let conn = client.connect(server.addr().expect("bound"))?;
/// use msgr::RmaError;
/// let region = server.expose(vec![0u8; 8], msgr::Access::Read);
/// let err = conn.read(&region.handle(), 4, 8, Duration::from_secs(10)).unwrap_err();
/// assert!(matches!(err, RmaError::OutOfRange { region_len: 8, .. }));
/// let err = conn.write(&region.handle(), 0, &b"no"[..], Duration::from_secs(10)).unwrap_err();
/// assert_eq!(err, RmaError::Forbidden(msgr::RmaOp::Write));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RmaError {
    /// The region was revoked or dropped by its owner (or never existed).
    #[error("the region was revoked by its owner")]
    Revoked,
    /// The owner never exposed a region of the handle's id (as it runs
    /// now): a handle from another process, or from before the owner
    /// restarted.
    #[error("the owner has no such region (never exposed there, or exposed before it restarted)")]
    UnknownRegion,
    /// A read larger than one message may carry: the owner's answer would
    /// be more than this side's `max_data_bytes` takes. Nothing was sent.
    /// (No longer returned: such an operation moves in parts, see
    /// [`RmaError::Part`]; kept for code that matches it.)
    #[error(
        "a read of {len} bytes is more than one message carries (max_data_bytes {max}): \
         read it in parts, or raise max_data_bytes on both sides"
    )]
    TooLarge {
        /// The length asked for.
        len: u64,
        /// This side's `max_data_bytes`.
        max: u64,
    },
    /// The owner refused the handle: its capability is not the region's, or
    /// the region was not exposed to this peer.
    #[error("the owner refused the handle (wrong capability, or not exposed to this peer)")]
    Denied,
    /// The range is not inside the region.
    #[error("bytes {offset}..{offset}+{len} are not inside the region ({region_len} bytes)")]
    OutOfRange {
        /// Where the operation started.
        offset: u64,
        /// Its length.
        len: u64,
        /// The region's length: as its owner says, where the owner refused
        /// the range (and its peer is recent enough to say it); else as the
        /// handle says.
        region_len: u64,
    },
    /// The region's rights do not allow the operation.
    #[error("the region does not allow {0:?}")]
    Forbidden(RmaOp),
    /// The bytes moved did not match their checksum
    /// ([`RmaOptions::checksum`]).
    #[error("the bytes moved did not match their checksum")]
    Corrupt,
    /// The owner's answer does not parse (or the request did not, for it).
    #[error("malformed RMA exchange: {0}")]
    Malformed(String),
    /// A part of an operation that moves in parts (longer than
    /// `rma_part_bytes`, or than one message carries), or one range of
    /// [`Connection::read_many`] or [`Connection::write_many`], failed:
    /// where it starts in the region, its length, and why. Parts before
    /// and after it may have moved (a write may have landed in part).
    #[error("the part at {offset} ({len} bytes) failed: {error}")]
    Part {
        /// Where the part starts in the region.
        offset: u64,
        /// Its length.
        len: u64,
        /// Why it failed.
        error: Box<RmaError>,
    },
    /// The request travels as a call: it was not sent, timed out, or the
    /// connection was reset first (on a lossless connection a link fault
    /// is no reset: the operation is replayed).
    #[error(transparent)]
    Call(#[from] CallError),
}

msgr_addr::debug_is_display!(RmaError);

/// How an operation runs: its timeout (sending included), whether a
/// CRC32C of the bytes moved travels with them, checked where they land
/// (end to end: from the owner's region to the reader's buffer, or from
/// the writer's bytes into the region), and the priority class its
/// request and answer travel in where the owner's messenger carries them
/// ([`Priority::Background`] by default: bulk below calls and messages;
/// operations the transport moves natively pass no lane). A `Duration`
/// converts into the options with that timeout, no checksum and the
/// default class.
///
/// ```
/// use std::time::Duration;
/// use msgr::{Priority, RmaOptions};
/// let o = RmaOptions::from(Duration::from_secs(1)).checksum();
/// assert!(o.checksum && o.timeout == Duration::from_secs(1));
/// assert_eq!(o.class, Priority::Background);
/// let urgent = o.class(Priority::Interactive);
/// assert_eq!(urgent.class, Priority::Interactive);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RmaOptions {
    /// At most this long, sending included.
    pub timeout: Duration,
    /// With an end-to-end CRC32C of the bytes moved.
    pub checksum: bool,
    /// The class the request and its answer travel in.
    pub class: Priority,
}

impl RmaOptions {
    /// These options with the end-to-end checksum.
    ///
    /// ```
    /// use std::time::Duration;
    /// use msgr::RmaOptions;
    /// let opts = RmaOptions::from(Duration::from_secs(1)).checksum();
    /// assert!(opts.checksum);
    /// ```
    pub fn checksum(mut self) -> Self {
        self.checksum = true;
        self
    }

    /// These options in priority class `class` (a small read that must
    /// not wait behind bulk: [`Priority::Interactive`]).
    ///
    /// ```
    /// use std::time::Duration;
    /// use msgr::{Priority, RmaOptions};
    /// let opts = RmaOptions::from(Duration::from_secs(1)).class(Priority::Interactive);
    /// assert_eq!(opts.class, Priority::Interactive);
    /// ```
    pub fn class(mut self, class: Priority) -> Self {
        self.class = class;
        self
    }
}

impl From<Duration> for RmaOptions {
    fn from(timeout: Duration) -> Self {
        RmaOptions {
            timeout,
            checksum: false,
            class: Priority::Background,
        }
    }
}

/// The owner of an exposed buffer ([`Messenger::expose`]): while it lives,
/// holders of its [`RmaRegion::handle`] may read or write it as its rights
/// say. Dropping it revokes it (see [`RmaRegion::revoke`] to have the
/// buffer back). The owner itself reads and writes it through
/// [`RmaRegion::bytes`] and [`RmaRegion::bytes_mut`], which wait for an
/// operation being served and hold the next one off while they live.
///
/// ```
/// # use std::{sync::Arc, time::Duration};
/// # use msgr::{EntityName, Inbox, Message, Messenger, NullDispatcher};
/// # let inbox = Inbox::new();
/// # let server = Messenger::builder(EntityName::server(1)).without_env()
/// #     .bind("tcp://127.0.0.1:0".parse()?).start(inbox.dispatcher())?;
/// # let client = Messenger::builder(EntityName::client(1)).without_env()
/// #     .start(Arc::new(NullDispatcher))?;
/// # let conn = client.connect(server.addr().expect("bound"))?;
/// let region: msgr::RmaRegion = server.expose(vec![0u8; 32], msgr::Access::ReadWrite);
/// conn.write(&region.handle(), 0, &b"x"[..], Duration::from_secs(10))?;
/// assert_eq!(region.bytes()[0], b'x');
/// drop(region); // no longer reachable by peers
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct RmaRegion {
    region: Arc<Region>,
    table: Arc<RegionTable>,
    /// The messenger's workers, told to close the region's registrations.
    shared: Weak<Shared>,
    /// Unexposed already (by `revoke`, before the drop).
    gone: AtomicBool,
}

impl std::fmt::Debug for RmaRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RmaRegion")
            .field("region", &self.region.id)
            .field("len", &self.len())
            .field("access", &self.region.access)
            .finish()
    }
}

impl RmaRegion {
    /// The handle to give peers (inside any message: it is serde).
    ///
    /// ```
    /// # use std::{sync::Arc, time::Duration};
    /// # use msgr::{EntityName, Inbox, Message, Messenger, NullDispatcher};
    /// # let inbox = Inbox::new();
    /// # let server = Messenger::builder(EntityName::server(1)).without_env()
    /// #     .bind("tcp://127.0.0.1:0".parse()?).start(inbox.dispatcher())?;
    /// # let client = Messenger::builder(EntityName::client(1)).without_env()
    /// #     .start(Arc::new(NullDispatcher))?;
    /// # let conn = client.connect(server.addr().expect("bound"))?;
    /// let region = server.expose(vec![1u8; 64], msgr::Access::Read);
    /// let handle = region.handle();
    /// // The handle is a serde value: send it in any message.
    /// let wire = Message::encode(3, &handle)?;
    /// let back: msgr::RmaHandle = wire.decode()?;
    /// assert_eq!(back, handle);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn handle(&self) -> RmaHandle {
        RmaHandle {
            region: self.region.id,
            len: self.len() as u64,
            access: self.region.access,
            capability: self.region.capability,
        }
    }

    /// The region's length in bytes.
    ///
    /// ```
    /// # use std::{sync::Arc, time::Duration};
    /// # use msgr::{EntityName, Inbox, Message, Messenger, NullDispatcher};
    /// # let inbox = Inbox::new();
    /// # let server = Messenger::builder(EntityName::server(1)).without_env()
    /// #     .bind("tcp://127.0.0.1:0".parse()?).start(inbox.dispatcher())?;
    /// # let client = Messenger::builder(EntityName::client(1)).without_env()
    /// #     .start(Arc::new(NullDispatcher))?;
    /// # let conn = client.connect(server.addr().expect("bound"))?;
    /// let region = server.expose(vec![0u8; 64], msgr::Access::Read);
    /// assert_eq!(region.len(), 64);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn len(&self) -> usize {
        match &self.region.shared {
            Some(b) => b.len(),
            None => self.region.mem.len(),
        }
    }

    /// Whether the region is empty.
    ///
    /// ```
    /// # use std::{sync::Arc, time::Duration};
    /// # use msgr::{EntityName, Inbox, Message, Messenger, NullDispatcher};
    /// # let inbox = Inbox::new();
    /// # let server = Messenger::builder(EntityName::server(1)).without_env()
    /// #     .bind("tcp://127.0.0.1:0".parse()?).start(inbox.dispatcher())?;
    /// # let client = Messenger::builder(EntityName::client(1)).without_env()
    /// #     .start(Arc::new(NullDispatcher))?;
    /// # let conn = client.connect(server.addr().expect("bound"))?;
    /// assert!(server.expose(Vec::new(), msgr::Access::Read).is_empty());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The region's bytes, for the owner to read (peers' writes wait
    /// meanwhile, on the worker that serves them: hold it briefly).
    ///
    /// ```
    /// # use std::{sync::Arc, time::Duration};
    /// # use msgr::{EntityName, Inbox, Message, Messenger, NullDispatcher};
    /// # let inbox = Inbox::new();
    /// # let server = Messenger::builder(EntityName::server(1)).without_env()
    /// #     .bind("tcp://127.0.0.1:0".parse()?).start(inbox.dispatcher())?;
    /// # let client = Messenger::builder(EntityName::client(1)).without_env()
    /// #     .start(Arc::new(NullDispatcher))?;
    /// # let conn = client.connect(server.addr().expect("bound"))?;
    /// let region = server.expose(vec![0u8; 64], msgr::Access::ReadWrite);
    /// conn.write(&region.handle(), 0, &b"peer wrote"[..], Duration::from_secs(10))?;
    /// assert_eq!(&region.bytes()[..10], b"peer wrote");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn bytes(&self) -> impl Deref<Target = [u8]> + '_ {
        self.region.mem.read()
    }

    /// The region's bytes, for the owner to change. Peers' operations wait
    /// meanwhile — on the owner's worker that serves them, with its other
    /// sessions: hold it briefly. Native operations (see the module docs)
    /// are not held off.
    ///
    /// ```
    /// # use std::{sync::Arc, time::Duration};
    /// # use msgr::{EntityName, Inbox, Message, Messenger, NullDispatcher};
    /// # let inbox = Inbox::new();
    /// # let server = Messenger::builder(EntityName::server(1)).without_env()
    /// #     .bind("tcp://127.0.0.1:0".parse()?).start(inbox.dispatcher())?;
    /// # let client = Messenger::builder(EntityName::client(1)).without_env()
    /// #     .start(Arc::new(NullDispatcher))?;
    /// # let conn = client.connect(server.addr().expect("bound"))?;
    /// let region = server.expose(vec![0u8; 64], msgr::Access::Read);
    /// region.bytes_mut()[..5].copy_from_slice(b"fresh");
    /// let read = conn.read(&region.handle(), 0, 5, Duration::from_secs(10))?;
    /// assert_eq!(&read[..], b"fresh");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn bytes_mut(&self) -> impl DerefMut<Target = [u8]> + '_ {
        self.region.mem.write()
    }

    /// Ends the exposure and hands the buffer back: no operation starts on
    /// the region after this, one being served finishes first, and every
    /// registration of it for native reads is closed first. Later
    /// operations with its handle fail with [`RmaError::Revoked`]. Waits
    /// for the workers to close the registrations; one that does not
    /// within a few seconds (or a call from a dispatcher callback, whose
    /// own worker cannot meanwhile) gets a copy of the bytes back, and the
    /// memory is freed once the last registration is closed.
    ///
    /// ```
    /// # use std::{sync::Arc, time::Duration};
    /// # use msgr::{EntityName, Inbox, Message, Messenger, NullDispatcher};
    /// # let inbox = Inbox::new();
    /// # let server = Messenger::builder(EntityName::server(1)).without_env()
    /// #     .bind("tcp://127.0.0.1:0".parse()?).start(inbox.dispatcher())?;
    /// # let client = Messenger::builder(EntityName::client(1)).without_env()
    /// #     .start(Arc::new(NullDispatcher))?;
    /// # let conn = client.connect(server.addr().expect("bound"))?;
    /// let region = server.expose(vec![9u8; 64], msgr::Access::Read);
    /// let handle = region.handle();
    /// let buffer = region.revoke(); // the bytes come back
    /// assert_eq!(buffer, vec![9u8; 64]);
    /// let err = conn.read(&handle, 0, 1, Duration::from_secs(10)).unwrap_err();
    /// assert_eq!(err, msgr::RmaError::Revoked);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn revoke(self) -> Vec<u8> {
        self.unexpose();
        let region = self.region.clone();
        drop(self);
        let deadline = Instant::now() + REVOKE_WAIT;
        let mut region = region;
        let on_worker = crate::state::on_worker_thread();
        loop {
            match Arc::try_unwrap(region) {
                Ok(r) => match r.mem.into_vec() {
                    Ok(v) => return v,
                    Err(mem) => {
                        return wait_for_views(
                            mem,
                            if on_worker { Instant::now() } else { deadline },
                        )
                    }
                },
                Err(r) if Instant::now() < deadline && !on_worker => {
                    region = r;
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err(r) => return r.mem.read().to_vec(),
            }
        }
    }

    fn unexpose(&self) {
        if self.gone.swap(true, Ordering::AcqRel) {
            return;
        }
        self.table.regions.write().remove(&self.region.id);
        if let Some(shared) = self.shared.upgrade() {
            for w in &shared.workers {
                w.submit(Command::RmaRevoke {
                    region: self.region.id,
                });
            }
        }
    }
}

/// The buffer of `mem` once no registration holds it, or a copy of it at
/// `deadline`.
fn wait_for_views(mut mem: Arc<RegionMemory>, deadline: Instant) -> Vec<u8> {
    loop {
        match mem.into_vec() {
            Ok(v) => return v,
            Err(m) if Instant::now() < deadline => {
                mem = m;
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(m) => {
                tracing::warn!(
                    len = m.len(),
                    "an RMA region revoked while still registered: a copy handed back"
                );
                return m.read().to_vec();
            }
        }
    }
}

/// Bytes the application holds, exposed read-only without a copy
/// ([`Messenger::expose_shared`]): while it lives, holders of its
/// [`SharedRegion::handle`] may read them; dropping it (or
/// [`SharedRegion::revoke`]) ends that, as for an [`RmaRegion`].
///
/// ```
/// # use std::{sync::Arc, time::Duration};
/// # use msgr::{EntityName, Inbox, Message, Messenger, NullDispatcher};
/// # let inbox = Inbox::new();
/// # let server = Messenger::builder(EntityName::server(1)).without_env()
/// #     .bind("tcp://127.0.0.1:0".parse()?).start(inbox.dispatcher())?;
/// # let client = Messenger::builder(EntityName::client(1)).without_env()
/// #     .start(Arc::new(NullDispatcher))?;
/// # let conn = client.connect(server.addr().expect("bound"))?;
/// use msgr::{Bytes, SharedRegion};
/// let region: SharedRegion = server.expose_shared(Bytes::from_static(b"read me"));
/// let h = region.handle();
/// assert_eq!(&conn.read(&h, 5, 2, Duration::from_secs(10))?[..], b"me");
/// drop(region);
/// assert_eq!(conn.read(&h, 0, 1, Duration::from_secs(10)), Err(msgr::RmaError::Revoked));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct SharedRegion {
    region: RmaRegion,
    bytes: Bytes,
}

impl SharedRegion {
    /// The handle to give peers (see [`RmaRegion::handle`]); its access
    /// is [`Access::Read`].
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use msgr::{EntityName, Messenger, NullDispatcher};
    /// # let owner = Messenger::builder(EntityName::server(1)).without_env().start(Arc::new(NullDispatcher))?;
    /// use msgr::{Access, Bytes};
    /// let region = owner.expose_shared(Bytes::from(vec![0u8; 64]));
    /// let h = region.handle();
    /// assert_eq!((h.len, h.access), (64, Access::Read));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn handle(&self) -> RmaHandle {
        self.region.handle()
    }

    /// The bytes exposed (a reference, no copy).
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use msgr::{EntityName, Messenger, NullDispatcher};
    /// # let owner = Messenger::builder(EntityName::server(1)).without_env().start(Arc::new(NullDispatcher))?;
    /// use msgr::Bytes;
    /// let region = owner.expose_shared(Bytes::from_static(b"abc"));
    /// assert_eq!(&region.bytes()[..], b"abc");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn bytes(&self) -> &Bytes {
        &self.bytes
    }

    /// Ends peers' access (later reads fail with [`RmaError::Revoked`])
    /// and gives the bytes back. A read being answered holds its own
    /// slice of them meanwhile: they are immutable, so nothing waits.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use msgr::{EntityName, Messenger, NullDispatcher};
    /// # let owner = Messenger::builder(EntityName::server(1)).without_env().start(Arc::new(NullDispatcher))?;
    /// use msgr::Bytes;
    /// let region = owner.expose_shared(Bytes::from(vec![1u8, 2, 3]));
    /// let back: Bytes = region.revoke();
    /// assert_eq!(&back[..], &[1, 2, 3]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn revoke(self) -> Bytes {
        self.region.unexpose();
        self.bytes
    }
}

impl Drop for RmaRegion {
    fn drop(&mut self) {
        self.unexpose();
    }
}

impl Messenger {
    /// Exposes `buffer` to one-sided reads and writes by peers that hold
    /// the returned region's [`RmaRegion::handle`], as `access` allows.
    /// See the [`rma`](crate::rma) module.
    ///
    /// ```
    /// # use std::{sync::Arc, time::Duration};
    /// # use msgr::{EntityName, Inbox, Message, Messenger, NullDispatcher};
    /// # let inbox = Inbox::new();
    /// # let server = Messenger::builder(EntityName::server(1)).without_env()
    /// #     .bind("tcp://127.0.0.1:0".parse()?).start(inbox.dispatcher())?;
    /// # let client = Messenger::builder(EntityName::client(1)).without_env()
    /// #     .start(Arc::new(NullDispatcher))?;
    /// # let conn = client.connect(server.addr().expect("bound"))?;
    /// let region = server.expose(b"readable".to_vec(), msgr::Access::Read);
    /// let bytes = conn.read(&region.handle(), 0, 8, Duration::from_secs(10))?;
    /// assert_eq!(&bytes[..], b"readable");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn expose(&self, buffer: impl Into<Vec<u8>>, access: Access) -> RmaRegion {
        self.expose_region((buffer.into(), None), access, None)
    }

    /// [`Messenger::expose`], usable only by the peers named: an operation
    /// from any other fails with [`RmaError::Denied`] even with the handle.
    /// (The name is the one the peer proved in `auth` and `secure` modes;
    /// in `crc` mode, the one it claims.)
    ///
    /// ```
    /// # use std::{sync::Arc, time::Duration};
    /// # use msgr::{EntityName, Inbox, Message, Messenger, NullDispatcher};
    /// # let inbox = Inbox::new();
    /// # let server = Messenger::builder(EntityName::server(1)).without_env()
    /// #     .bind("tcp://127.0.0.1:0".parse()?).start(inbox.dispatcher())?;
    /// # let client = Messenger::builder(EntityName::client(1)).without_env()
    /// #     .start(Arc::new(NullDispatcher))?;
    /// # let conn = client.connect(server.addr().expect("bound"))?;
    /// // Only client 2 may use it: client 1 is refused even with the handle.
    /// let region = server.expose_to(vec![0u8; 8], msgr::Access::Read, &[EntityName::client(2)]);
    /// let err = conn.read(&region.handle(), 0, 8, Duration::from_secs(10)).unwrap_err();
    /// assert_eq!(err, msgr::RmaError::Denied);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn expose_to(
        &self,
        buffer: impl Into<Vec<u8>>,
        access: Access,
        peers: &[EntityName],
    ) -> RmaRegion {
        self.expose_region((buffer.into(), None), access, Some(peers.to_vec()))
    }

    /// Exposes `bytes` the application already holds to one-sided reads,
    /// without a copy: the region keeps a reference to them (they are
    /// immutable, so peers and the application read them at once, no
    /// lock), and each read a peer makes is answered with a slice of them
    /// (the owner copies nothing: `rma_bytes_copied` stays 0; over tcp the
    /// kernel's socket copy is the only one). Read-only
    /// ([`Access::Read`]); served by the owner's messenger over every
    /// backend, not moved natively. [`SharedRegion::revoke`] gives the
    /// bytes back.
    ///
    /// ```
    /// # use std::{sync::Arc, time::Duration};
    /// # use msgr::{EntityName, Inbox, Message, Messenger, NullDispatcher};
    /// # let inbox = Inbox::new();
    /// # let server = Messenger::builder(EntityName::server(1)).without_env()
    /// #     .bind("tcp://127.0.0.1:0".parse()?).start(inbox.dispatcher())?;
    /// # let client = Messenger::builder(EntityName::client(1)).without_env()
    /// #     .start(Arc::new(NullDispatcher))?;
    /// # let conn = client.connect(server.addr().expect("bound"))?;
    /// use msgr::Bytes;
    /// let table = Bytes::from(vec![9u8; 1 << 20]); // the application's own
    /// let region = server.expose_shared(table.clone());
    /// let part = conn.read(&region.handle(), 1000, 16, Duration::from_secs(10))?;
    /// assert_eq!(&part[..], &table[1000..1016]);
    /// assert_eq!(server.counters().rma_bytes_copied.load(std::sync::atomic::Ordering::Relaxed), 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn expose_shared(&self, bytes: impl Into<Bytes>) -> SharedRegion {
        let bytes = bytes.into();
        let memory = (Vec::new(), Some(bytes.clone()));
        let region = self.expose_region(memory, Access::Read, None);
        SharedRegion { region, bytes }
    }

    fn expose_region(
        &self,
        (buffer, shared): (Vec<u8>, Option<Bytes>),
        access: Access,
        peers: Option<Vec<EntityName>>,
    ) -> RmaRegion {
        let table = self.shared.regions.clone();
        let id = table.next.fetch_add(1, Ordering::Relaxed) + 1;
        let region = Arc::new(Region {
            id,
            access,
            capability: capability(),
            peers,
            mem: RegionMemory::new(buffer),
            shared,
        });
        table.regions.write().insert(id, region.clone());
        RmaRegion {
            region,
            table,
            shared: Arc::downgrade(&self.shared),
            gone: AtomicBool::new(false),
        }
    }
}

/// Checks an operation against what the handle says, before sending.
fn check_local(h: &RmaHandle, op: RmaOp, offset: u64, len: u64) -> Result<(), RmaError> {
    if !h.access.allows(op) {
        return Err(RmaError::Forbidden(op));
    }
    if offset.checked_add(len).is_none_or(|end| end > h.len) {
        return Err(RmaError::OutOfRange {
            offset,
            len,
            region_len: h.len,
        });
    }
    Ok(())
}

fn request(h: &RmaHandle, op: RmaOp, offset: u64, len: u64, checksum: Option<u32>) -> RmaRequest {
    RmaRequest {
        op,
        region: h.region,
        capability: h.capability,
        offset,
        len,
        checksum,
        // An operation the worker may move natively (see the module docs).
        want_key: checksum.is_none(),
    }
}

/// `req` encoded in the message to the owner, with `data` (a write's
/// bytes), in `class` (the owner's answer inherits it), and kept as it is
/// for the worker's native path.
fn rma_call(req: RmaRequest, data: Bytes, class: Priority) -> RmaCall {
    let msg = Message::new(RMA_TYPE, req.encode(), data).with_class(class);
    RmaCall { request: req, msg }
}

impl Connection {
    /// Reads `len` bytes at `offset` of the region `handle` names, from
    /// its owner at the other end of this connection; blocks at most the
    /// options' timeout (a `Duration` will do). Not from a dispatcher
    /// callback (use [`Connection::read_async`]).
    ///
    /// ```
    /// # use std::{sync::Arc, time::Duration};
    /// # use msgr::{EntityName, Inbox, Message, Messenger, NullDispatcher};
    /// # let inbox = Inbox::new();
    /// # let server = Messenger::builder(EntityName::server(1)).without_env()
    /// #     .bind("tcp://127.0.0.1:0".parse()?).start(inbox.dispatcher())?;
    /// # let client = Messenger::builder(EntityName::client(1)).without_env()
    /// #     .start(Arc::new(NullDispatcher))?;
    /// # let conn = client.connect(server.addr().expect("bound"))?;
    /// let region = server.expose(b"0123456789".to_vec(), msgr::Access::Read);
    /// let bytes = conn.read(&region.handle(), 2, 3, Duration::from_secs(10))?;
    /// assert_eq!(&bytes[..], b"234");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn read(
        &self,
        handle: &RmaHandle,
        offset: u64,
        len: u64,
        options: impl Into<RmaOptions>,
    ) -> Result<Bytes, RmaError> {
        let o = options.into();
        if len > self.part_len(RmaOp::Read) {
            check_local(handle, RmaOp::Read, offset, len)?;
            let parts = Parts::new(self, handle, (offset, len), o, Moved::read());
            return self.wait_parts(parts).map(|m| m.into_read());
        }
        let (o, req) = self.read_request(handle, offset, len, o)?;
        let answer = self.call_answered(req, o.timeout)?;
        read_outcome(answer, handle, (offset, len), o.checksum)
    }

    /// [`Connection::read`] into `buf` (its length is the length read).
    ///
    /// ```
    /// # use std::{sync::Arc, time::Duration};
    /// # use msgr::{EntityName, Inbox, Message, Messenger, NullDispatcher};
    /// # let inbox = Inbox::new();
    /// # let server = Messenger::builder(EntityName::server(1)).without_env()
    /// #     .bind("tcp://127.0.0.1:0".parse()?).start(inbox.dispatcher())?;
    /// # let client = Messenger::builder(EntityName::client(1)).without_env()
    /// #     .start(Arc::new(NullDispatcher))?;
    /// # let conn = client.connect(server.addr().expect("bound"))?;
    /// let region = server.expose(b"0123456789".to_vec(), msgr::Access::Read);
    /// let mut buf = [0u8; 4];
    /// conn.read_into(&region.handle(), 6, &mut buf, Duration::from_secs(10))?;
    /// assert_eq!(&buf, b"6789");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn read_into(
        &self,
        handle: &RmaHandle,
        offset: u64,
        buf: &mut [u8],
        options: impl Into<RmaOptions>,
    ) -> Result<(), RmaError> {
        let (o, len) = (options.into(), buf.len() as u64);
        if len > self.part_len(RmaOp::Read) {
            // Each part straight into its place: no buffer of the whole
            // length besides `buf` (whose pages the caller may reuse).
            check_local(handle, RmaOp::Read, offset, len)?;
            let parts = Parts::new(self, handle, (offset, len), o, Moved::Into(buf));
            return self.wait_parts(parts).map(drop);
        }
        let bytes = self.read(handle, offset, len, o)?;
        buf.copy_from_slice(&bytes);
        Ok(())
    }

    /// Writes `bytes` at `offset` of the region `handle` names, at its
    /// owner at the other end of this connection; returns once the owner
    /// has them in the region. Blocks as [`Connection::read`] does.
    ///
    /// ```
    /// # use std::{sync::Arc, time::Duration};
    /// # use msgr::{EntityName, Inbox, Message, Messenger, NullDispatcher};
    /// # let inbox = Inbox::new();
    /// # let server = Messenger::builder(EntityName::server(1)).without_env()
    /// #     .bind("tcp://127.0.0.1:0".parse()?).start(inbox.dispatcher())?;
    /// # let client = Messenger::builder(EntityName::client(1)).without_env()
    /// #     .start(Arc::new(NullDispatcher))?;
    /// # let conn = client.connect(server.addr().expect("bound"))?;
    /// use msgr::RmaOptions;
    /// let region = server.expose(vec![0u8; 16], msgr::Access::ReadWrite);
    /// let opts = RmaOptions::from(Duration::from_secs(10)).checksum();
    /// conn.write(&region.handle(), 4, &b"data"[..], opts)?;
    /// assert_eq!(&region.bytes()[4..8], b"data");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn write(
        &self,
        handle: &RmaHandle,
        offset: u64,
        bytes: impl Into<Bytes>,
        options: impl Into<RmaOptions>,
    ) -> Result<(), RmaError> {
        let bytes = bytes.into();
        let len = bytes.len() as u64;
        let o = options.into();
        if len > self.part_len(RmaOp::Write) {
            check_local(handle, RmaOp::Write, offset, len)?;
            let parts = Parts::new(self, handle, (offset, len), o, Moved::Write(bytes));
            return self.wait_parts(parts).map(drop);
        }
        let (o, req) = self.write_request(handle, offset, bytes, o)?;
        let answer = self.call_answered(req, o.timeout)?;
        write_outcome(answer, handle, (offset, len))
    }

    /// [`Connection::read`] as a future, for async code on any executor
    /// (the timeout kept by the connection's worker).
    ///
    /// ```
    /// # use std::{sync::Arc, time::Duration};
    /// # use msgr::{EntityName, Inbox, Message, Messenger, NullDispatcher};
    /// # let inbox = Inbox::new();
    /// # let server = Messenger::builder(EntityName::server(1)).without_env()
    /// #     .bind("tcp://127.0.0.1:0".parse()?).start(inbox.dispatcher())?;
    /// # let client = Messenger::builder(EntityName::client(1)).without_env()
    /// #     .start(Arc::new(NullDispatcher))?;
    /// # let conn = client.connect(server.addr().expect("bound"))?;
    /// let region = server.expose(b"async".to_vec(), msgr::Access::Read);
    /// let read = conn.read_async(&region.handle(), 0, 5, Duration::from_secs(10));
    /// let bytes = tokio::runtime::Runtime::new()?.block_on(read)?;
    /// assert_eq!(&bytes[..], b"async");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn read_async(
        &self,
        handle: &RmaHandle,
        offset: u64,
        len: u64,
        options: impl Into<RmaOptions>,
    ) -> RmaFuture<Bytes> {
        let o = options.into();
        if len > self.part_len(RmaOp::Read) {
            let parts = check_local(handle, RmaOp::Read, offset, len)
                .map(|()| Parts::new(self, handle, (offset, len), o, Moved::read()));
            return RmaFuture::new(async move { parts?.await.map(Moved::into_read) });
        }
        let call = self
            .read_request(handle, offset, len, o)
            .map(|(_, req)| self.call_async_answered(req, o.timeout));
        let (h, checksum) = (handle.clone(), o.checksum);
        RmaFuture::new(async move {
            let answer = call?.await?;
            read_outcome(answer, &h, (offset, len), checksum)
        })
    }

    /// [`Connection::write`] as a future, for async code on any executor.
    ///
    /// ```
    /// # use std::{sync::Arc, time::Duration};
    /// # use msgr::{EntityName, Inbox, Message, Messenger, NullDispatcher};
    /// # let inbox = Inbox::new();
    /// # let server = Messenger::builder(EntityName::server(1)).without_env()
    /// #     .bind("tcp://127.0.0.1:0".parse()?).start(inbox.dispatcher())?;
    /// # let client = Messenger::builder(EntityName::client(1)).without_env()
    /// #     .start(Arc::new(NullDispatcher))?;
    /// # let conn = client.connect(server.addr().expect("bound"))?;
    /// let region = server.expose(vec![0u8; 8], msgr::Access::Write);
    /// let write = conn.write_async(&region.handle(), 0, &b"async"[..], Duration::from_secs(10));
    /// tokio::runtime::Runtime::new()?.block_on(write)?;
    /// assert_eq!(&region.bytes()[..5], b"async");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn write_async(
        &self,
        handle: &RmaHandle,
        offset: u64,
        bytes: impl Into<Bytes>,
        options: impl Into<RmaOptions>,
    ) -> RmaFuture<()> {
        let o = options.into();
        let bytes = bytes.into();
        let range = (offset, bytes.len() as u64);
        if range.1 > self.part_len(RmaOp::Write) {
            let parts = check_local(handle, RmaOp::Write, offset, range.1)
                .map(|()| Parts::new(self, handle, range, o, Moved::Write(bytes)));
            return RmaFuture::new(async move { parts?.await.map(drop) });
        }
        let call = self
            .write_request(handle, offset, bytes, o)
            .map(|(_, req)| self.call_async_answered(req, o.timeout));
        let h = handle.clone();
        RmaFuture::new(async move {
            let answer = call?.await?;
            write_outcome(answer, &h, range)
        })
    }

    /// The most bytes one request of `op` moves: the configured part
    /// size, and what one message may carry to the side that receives the
    /// bytes (this side's `max_data_bytes` for a read's answer, the peer's
    /// for a write, as the handshake told it).
    fn part_len(&self, op: RmaOp) -> u64 {
        let cfg = &self.inner.shared.cfg;
        let carried = match op {
            RmaOp::Read => cfg.session.limits.max_segment[2],
            RmaOp::Write => self.inner.send_limits[1].load(Ordering::Relaxed),
        };
        (cfg.rma_part_bytes as u64).min(u64::from(carried)).max(1)
    }

    /// Waits for an operation in parts on this thread (see
    /// [`Connection::read`]).
    fn wait_parts<'a>(&self, parts: Parts<'a>) -> Result<Moved<'a>, RmaError> {
        let deadline = parts.deadline;
        self.wait(parts, deadline)
    }

    /// Waits on this thread for `op`, which ends by `deadline` (its
    /// requests' deadlines are kept by the worker, or by `op` itself).
    fn wait<T>(
        &self,
        mut op: impl Future<Output = Result<T, RmaError>> + Unpin,
        deadline: Instant,
    ) -> Result<T, RmaError> {
        if self.inner.on_owning_worker() {
            return Err(CallError::WouldDeadlock.into());
        }
        let waker = Waker::from(Arc::new(ThreadWaker(std::thread::current())));
        let mut cx = Context::from_waker(&waker);
        loop {
            if let Poll::Ready(done) = Pin::new(&mut op).poll(&mut cx) {
                return done;
            }
            // Woken by an outcome (or a deadline, kept by the worker);
            // looked at again at the deadline whatever happens.
            let left = deadline.saturating_duration_since(Instant::now());
            std::thread::park_timeout(left.max(Duration::from_millis(1)));
        }
    }

    /// Several reads at once, one completion: each `(handle, offset, len)`
    /// a read as [`Connection::read`] makes it (of any region of the
    /// owner's, and of any length), all in flight together; their bytes in
    /// the order asked. Scatter-gather: several ranges of a region, or of
    /// several, in one call. The first that fails fails the whole with
    /// [`RmaError::Part`] naming its range; the timeout is the whole's.
    ///
    /// ```
    /// # use std::{sync::Arc, time::Duration};
    /// # use msgr::{EntityName, Inbox, Message, Messenger, NullDispatcher};
    /// # let inbox = Inbox::new();
    /// # let server = Messenger::builder(EntityName::server(1)).without_env()
    /// #     .bind("tcp://127.0.0.1:0".parse()?).start(inbox.dispatcher())?;
    /// # let client = Messenger::builder(EntityName::client(1)).without_env()
    /// #     .start(Arc::new(NullDispatcher))?;
    /// # let conn = client.connect(server.addr().expect("bound"))?;
    /// let a = server.expose(b"0123456789".to_vec(), msgr::Access::Read);
    /// let b = server.expose(b"abcdef".to_vec(), msgr::Access::Read);
    /// let (ha, hb) = (a.handle(), b.handle());
    /// let got = conn.read_many([(&ha, 0, 2), (&ha, 8, 2), (&hb, 3, 3)], Duration::from_secs(10))?;
    /// assert_eq!(got, [&b"01"[..], b"89", b"def"]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn read_many<'h>(
        &self,
        ranges: impl IntoIterator<Item = (&'h RmaHandle, u64, u64)>,
        options: impl Into<RmaOptions>,
    ) -> Result<Vec<Bytes>, RmaError> {
        let o = options.into();
        let deadline = Instant::now() + o.timeout;
        self.wait(self.read_many_async(ranges, o), deadline)
    }

    /// [`Connection::read_many`] as a future, for async code on any
    /// executor.
    ///
    /// ```
    /// # use std::{sync::Arc, time::Duration};
    /// # use msgr::{EntityName, Inbox, Message, Messenger, NullDispatcher};
    /// # let inbox = Inbox::new();
    /// # let server = Messenger::builder(EntityName::server(1)).without_env()
    /// #     .bind("tcp://127.0.0.1:0".parse()?).start(inbox.dispatcher())?;
    /// # let client = Messenger::builder(EntityName::client(1)).without_env()
    /// #     .start(Arc::new(NullDispatcher))?;
    /// # let conn = client.connect(server.addr().expect("bound"))?;
    /// let region = server.expose(vec![5u8; 4096], msgr::Access::Read);
    /// let h = region.handle();
    /// let reads = conn.read_many_async((0..8).map(|i| (&h, i * 512, 512)), Duration::from_secs(10));
    /// let got = tokio::runtime::Runtime::new()?.block_on(reads)?;
    /// assert!(got.iter().all(|b| b[..] == [5u8; 512]));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn read_many_async<'h>(
        &self,
        ranges: impl IntoIterator<Item = (&'h RmaHandle, u64, u64)>,
        options: impl Into<RmaOptions>,
    ) -> RmaFuture<Vec<Bytes>> {
        let o = options.into();
        let ops = ranges
            .into_iter()
            .map(|(h, offset, len)| ((offset, len), self.read_async(h, offset, len, o)))
            .collect();
        RmaFuture::new(Batch::new(ops))
    }

    /// Several writes at once, one completion: each `(handle, offset,
    /// bytes)` a write as [`Connection::write`] makes it, all in flight
    /// together (gather: several ranges, of one region or several). Done
    /// when every write is; the first that fails fails the whole with
    /// [`RmaError::Part`] naming its range (others may have landed).
    ///
    /// ```
    /// # use std::{sync::Arc, time::Duration};
    /// # use msgr::{EntityName, Inbox, Message, Messenger, NullDispatcher};
    /// # let inbox = Inbox::new();
    /// # let server = Messenger::builder(EntityName::server(1)).without_env()
    /// #     .bind("tcp://127.0.0.1:0".parse()?).start(inbox.dispatcher())?;
    /// # let client = Messenger::builder(EntityName::client(1)).without_env()
    /// #     .start(Arc::new(NullDispatcher))?;
    /// # let conn = client.connect(server.addr().expect("bound"))?;
    /// use msgr::Bytes;
    /// let region = server.expose(vec![0u8; 8], msgr::Access::Write);
    /// let h = region.handle();
    /// let writes = [(&h, 0, Bytes::from_static(b"ab")), (&h, 6, Bytes::from_static(b"yz"))];
    /// conn.write_many(writes, Duration::from_secs(10))?;
    /// assert_eq!(&region.bytes()[..], b"ab\0\0\0\0yz");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn write_many<'h>(
        &self,
        writes: impl IntoIterator<Item = (&'h RmaHandle, u64, Bytes)>,
        options: impl Into<RmaOptions>,
    ) -> Result<(), RmaError> {
        let o = options.into();
        let deadline = Instant::now() + o.timeout;
        self.wait(self.write_many_async(writes, o), deadline)
    }

    /// [`Connection::write_many`] as a future, for async code on any
    /// executor.
    ///
    /// ```
    /// # use std::{sync::Arc, time::Duration};
    /// # use msgr::{EntityName, Inbox, Message, Messenger, NullDispatcher};
    /// # let inbox = Inbox::new();
    /// # let server = Messenger::builder(EntityName::server(1)).without_env()
    /// #     .bind("tcp://127.0.0.1:0".parse()?).start(inbox.dispatcher())?;
    /// # let client = Messenger::builder(EntityName::client(1)).without_env()
    /// #     .start(Arc::new(NullDispatcher))?;
    /// # let conn = client.connect(server.addr().expect("bound"))?;
    /// use msgr::Bytes;
    /// let region = server.expose(vec![0u8; 4], msgr::Access::Write);
    /// let h = region.handle();
    /// let writes = (0..4).map(|i| (&h, i, Bytes::from(vec![i as u8 + 1])));
    /// tokio::runtime::Runtime::new()?.block_on(conn.write_many_async(writes, Duration::from_secs(10)))?;
    /// assert_eq!(&region.bytes()[..], &[1, 2, 3, 4]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn write_many_async<'h>(
        &self,
        writes: impl IntoIterator<Item = (&'h RmaHandle, u64, Bytes)>,
        options: impl Into<RmaOptions>,
    ) -> RmaFuture<()> {
        let o = options.into();
        let ops = writes
            .into_iter()
            .map(|(h, offset, bytes)| {
                let range = (offset, bytes.len() as u64);
                (range, self.write_async(h, offset, bytes, o))
            })
            .collect();
        RmaFuture::new(async move { Batch::new(ops).await.map(drop) })
    }

    fn read_request(
        &self,
        h: &RmaHandle,
        offset: u64,
        len: u64,
        o: RmaOptions,
    ) -> Result<(RmaOptions, RmaCall), RmaError> {
        check_local(h, RmaOp::Read, offset, len)?;
        let req = request(h, RmaOp::Read, offset, len, o.checksum.then_some(0));
        Ok((o, rma_call(req, Bytes::new(), o.class)))
    }

    fn write_request(
        &self,
        h: &RmaHandle,
        offset: u64,
        bytes: Bytes,
        o: RmaOptions,
    ) -> Result<(RmaOptions, RmaCall), RmaError> {
        let len = bytes.len() as u64;
        check_local(h, RmaOp::Write, offset, len)?;
        let crc = o.checksum.then(|| crc32c(&bytes));
        let req = request(h, RmaOp::Write, offset, len, crc);
        Ok((o, rma_call(req, bytes, o.class)))
    }
}

/// The error an owner's status stands for (`Ok` is none).
fn status_error(
    status: RmaStatus,
    h: &RmaHandle,
    (offset, len): (u64, u64),
    op: RmaOp,
) -> Option<RmaError> {
    Some(match status {
        RmaStatus::Ok => return None,
        RmaStatus::Revoked => RmaError::Revoked,
        RmaStatus::Denied => RmaError::Denied,
        RmaStatus::OutOfRange => RmaError::OutOfRange {
            offset,
            len,
            region_len: h.len,
        },
        RmaStatus::OutOfRegion { region_len } => RmaError::OutOfRange {
            offset,
            len,
            region_len,
        },
        RmaStatus::UnknownRegion => RmaError::UnknownRegion,
        RmaStatus::Forbidden => RmaError::Forbidden(op),
        RmaStatus::Corrupt => RmaError::Corrupt,
        other => RmaError::Malformed(format!("the owner answered {other:?}")),
    })
}

/// The owner's reply decoded, checked against its status: a read's bytes
/// and checksum. A native completion has neither status nor checksum.
fn served(
    answer: RmaAnswer,
    h: &RmaHandle,
    range: (u64, u64),
    op: RmaOp,
) -> Result<(Bytes, Option<u32>), RmaError> {
    match answer {
        RmaAnswer::Native(bytes) => Ok((bytes, None)),
        RmaAnswer::Owner(reply, data) => {
            let r = reply.map_err(|e| RmaError::Malformed(e.to_string()))?;
            match status_error(r.status, h, range, op) {
                Some(e) => Err(e),
                None => Ok((data, Some(r.checksum))),
            }
        }
    }
}

fn read_outcome(
    answer: RmaAnswer,
    h: &RmaHandle,
    range: (u64, u64),
    checksum: bool,
) -> Result<Bytes, RmaError> {
    let (data, crc) = served(answer, h, range, RmaOp::Read)?;
    if data.len() as u64 != range.1 {
        return Err(RmaError::Malformed(format!(
            "{} bytes read for {} asked",
            data.len(),
            range.1
        )));
    }
    // (A checked read is never native: the owner computes its checksum.)
    if checksum && crc.is_none_or(|c| crc32c(&data) != c) {
        return Err(RmaError::Corrupt);
    }
    Ok(data)
}

fn write_outcome(answer: RmaAnswer, h: &RmaHandle, range: (u64, u64)) -> Result<(), RmaError> {
    served(answer, h, range, RmaOp::Write).map(drop)
}

/// The future of [`Connection::read_async`] and [`Connection::write_async`].
///
/// ```
/// # use std::{sync::Arc, time::Duration};
/// # use msgr::{EntityName, Inbox, Message, Messenger, NullDispatcher};
/// # let inbox = Inbox::new();
/// # let server = Messenger::builder(EntityName::server(1)).without_env()
/// #     .bind("tcp://127.0.0.1:0".parse()?).start(inbox.dispatcher())?;
/// # let client = Messenger::builder(EntityName::client(1)).without_env()
/// #     .start(Arc::new(NullDispatcher))?;
/// # let conn = client.connect(server.addr().expect("bound"))?;
/// let region = server.expose(b"future".to_vec(), msgr::Access::Read);
/// let fut: msgr::RmaFuture<msgr::Bytes> = conn.read_async(&region.handle(), 0, 6, Duration::from_secs(10));
/// assert_eq!(&tokio::runtime::Runtime::new()?.block_on(fut)?[..], b"future");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct RmaFuture<T> {
    /// The operation; `None` once it completed.
    op: Option<Operation<T>>,
}

/// An operation under way, of whichever shape (one request, or parts).
type Operation<T> = Pin<Box<dyn Future<Output = Result<T, RmaError>> + Send>>;

impl<T> RmaFuture<T> {
    fn new(op: impl Future<Output = Result<T, RmaError>> + Send + 'static) -> Self {
        RmaFuture {
            op: Some(Box::pin(op)),
        }
    }
}

impl<T> Future for RmaFuture<T> {
    type Output = Result<T, RmaError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let Some(op) = &mut self.op else {
            return Poll::Ready(Err(CallError::Finished.into()));
        };
        let done = std::task::ready!(op.as_mut().poll(cx));
        self.op = None;
        Poll::Ready(done)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An operation's request goes in its options' class, bulk by default.
    #[test]
    fn a_request_travels_in_its_options_class() {
        let h = RmaHandle {
            region: 1,
            len: 64,
            access: Access::ReadWrite,
            capability: [0; 16],
        };
        let conn_less = |o: RmaOptions| {
            let req = request(&h, RmaOp::Read, 0, 8, None);
            rma_call(req, Bytes::new(), o.class).msg.class()
        };
        let o = RmaOptions::from(Duration::from_secs(1));
        assert_eq!(conn_less(o), Priority::Background);
        assert_eq!(
            conn_less(o.class(Priority::Interactive)),
            Priority::Interactive
        );
    }
}
