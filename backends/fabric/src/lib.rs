//! A thin safe layer over libfabric for msgr's `fabric` backend: the only
//! place besides `libfabric-sys` (the `msgr-libfabric-sys` package) that
//! contains `unsafe`. One module a concept, as in the verbs layer
//! (`msgr-rdma`):
//!
//! - `error`: [`FabricError`] and the check of every call's return code
//!   ([`is_again`]: the provider's queue is full, retry later).
//! - `info`: `fi_getinfo` and what it tells ([`probe`], [`version`]), the
//!   rendezvous operation ([`RmaChoice`]) and per-provider quirks
//!   ([`rma_withheld`], [`eager_limit`], [`writes_sound`]).
//! - [`Net`] (`net`): one provider opened for one worker — `fi_getinfo` with
//!   hints (provider name, endpoint type, `FI_MSG`), fabric, domain, one event
//!   queue (connection management) and one completion queue shared by all of
//!   the worker's endpoints, with wait fds for a mio Poll: the EQ's one fd
//!   (`FI_WAIT_FD`), the CQ's the provider's list (`FI_WAIT_POLLFD`,
//!   [`Net::cq_wait_fds`]) where it offers one, else one fd.
//! - [`PassiveEp`] (`msg`): `fi_listen` on a socket address; `FI_CONNREQ`
//!   events come out of [`Net::read_eq`], and each request is either accepted
//!   ([`Net::accept`]) or refused ([`PassiveEp::reject`]): a request that is
//!   merely dropped stays pending in the provider (`fi_freeinfo` does not
//!   release its handle), and its connector waits for its own timeout.
//! - [`Ep`] (`msg`): an active `FI_EP_MSG` endpoint that owns its fixed-size
//!   transmit and receive buffers (registered when the provider's `mr_mode`
//!   asks for `FI_MR_LOCAL`), so a buffer can never be freed while the provider
//!   may still touch it: the endpoint is closed before its buffers go. The
//!   slots and their posting (`slots`) serve [`RdmEp`] too.
//! - [`RdmEp`] (`rdm`): an `FI_EP_RDM` endpoint with its own address vector,
//!   transmit slots and a receive pool that grows by blocks (shared by every
//!   peer of the endpoint, as an SRQ is); peers are [`PeerAddr`]s from
//!   [`RdmEp::insert`].
//! - [`RmaBuffers`] (`rma`): an endpoint's memory registered for the
//!   rendezvous, read by peers ([`Exposed`]) or written by them ([`Landing`]),
//!   and [`ReadRegion`]s, registrations the caller keeps for the next send.
//! - [`RawRmaLoop`] (`raw_rma`): a bare `fi_read` / `fi_write` loop between
//!   two RDM endpoints of this process, outside any [`Net`]: the reference
//!   `msgr bench --rma` measures msgr's RMA against.
//!
//! Everything opened from a [`Net`] — endpoints, listeners, kept
//! registrations — holds the Net's fabric, domain and queues open until it
//! is closed itself, so they may be dropped in any order: libfabric objects
//! are closed only after everything opened on them (a domain closed under
//! an endpoint with receives posted crashed the provider).
//!
//! `shm` endpoints are never closed: libfabric 1.17's `shm` keeps a raw
//! pointer to the shared-memory region of every endpoint *of this process*
//! a peer talked to (`smr_map_to_region` looks the name up in its list of
//! local endpoints) and dereferences it after that endpoint is closed —
//! a crash as soon as two endpoints of one process talk and one goes first.
//! So a dropped `shm` [`RdmEp`] (and its [`Net`]) is leaked with its buffers
//! instead; the memory goes with the process (only touched pages cost RAM).
//!
//! Providers without wait objects (`shm` in libfabric 1.17 refuses
//! `FI_WAIT_FD` with `-FI_ENOSYS`) get a CQ with `FI_WAIT_NONE`:
//! [`Net::cq_polled`] is then true and the caller must poll.
//!
//! Operation contexts are plain `u64`s chosen by the caller (not pointers):
//! hints ask for no `FI_CONTEXT` mode, so the provider never writes through them.
//!
//! # Layers
//!
//! Each module imports only from the layers below its own
//! (`tests/layering.rs`). Bottom first:
//!
//! 1. `error`, `bell`: the leaves — call results; doorbells (no libfabric).
//! 2. `info`: `fi_getinfo`, providers' quirks.
//! 3. `landing`: what a Net's endpoints share of the rendezvous.
//! 4. `net`: one provider opened for a worker, its queues and events.
//! 5. `slots`, `rma`: send and receive slots; the rendezvous buffers.
//! 6. `msg`, `rdm`: the two endpoint kinds.
//! 7. `raw_rma`: the bare RMA loop `msgr bench --rma` compares against.

#![warn(missing_docs)]

mod bell;
mod error;
mod info;
mod landing;
mod msg;
mod net;
mod raw_rma;
mod rdm;
mod rma;
mod slots;

pub use bell::{drain_rings, listener_bell, ring_listener, BellId, Doorbell, PeerBell};
pub use error::{is_again, FabricError, OtherDomain, Site};
pub use info::{eager_limit, probe, rma_withheld, version, writes_sound};
pub use info::{EpType, RmaChoice, RmaOp, API_VERSION};
pub use msg::{Ep, PassiveEp};
pub use net::{CmEvent, Completion, ConnReq, CqWait, Net, WaitFd};
pub use raw_rma::{RawFigures, RawRmaLoop};
pub use rdm::{PeerAddr, RdmEp, MAX_NAME_LEN};
pub use rma::{Exposed, Landing, ReadDone, ReadRegion, RemoteWord, RmaBuffers, CHECK_LEN};
pub use slots::SendSlots;
