//! What a provider offers and how the libfabric loaded behaves: `fi_getinfo`
//! with the hints every endpoint asks for, the rendezvous choice, and the
//! per-provider quirks known from sources and measurements, decided here once.

use crate::error::{strerror, FabricError};
use libfabric_sys as sys;
use std::ffi::{CStr, CString};
use std::net::SocketAddr;
use std::os::raw::c_int;
use std::ptr;

/// The libfabric API version requested.
pub const API_VERSION: u32 = sys::FI_VERSION_1_17;

/// The domain name of the first entry of an `fi_info` list.
///
/// # Safety
/// `info` must be a valid `fi_info` (from `fi_getinfo` or an EQ event).
pub(crate) unsafe fn domain_name(info: *const sys::fi_info) -> String {
    let attr = (*info).domain_attr;
    if attr.is_null() || (*attr).name.is_null() {
        return String::new();
    }
    CStr::from_ptr((*attr).name).to_string_lossy().into_owned()
}

/// Endpoint type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EpType {
    /// `FI_EP_MSG`, connected.
    Msg,
    /// `FI_EP_RDM`, reliable datagram.
    Rdm,
}

impl EpType {
    fn raw(self) -> sys::fi_ep_type {
        match self {
            EpType::Msg => sys::FI_EP_MSG,
            EpType::Rdm => sys::FI_EP_RDM,
        }
    }
    fn name(self) -> &'static str {
        match self {
            EpType::Msg => "msg",
            EpType::Rdm => "rdm",
        }
    }
}

/// An owned `fi_info` list (freed on drop).
pub(crate) struct Info(pub(crate) *mut sys::fi_info);

impl Drop for Info {
    fn drop(&mut self) {
        if !self.0.is_null() {
            // SAFETY: the list came from fi_getinfo/fi_eq_read and is freed once.
            unsafe { sys::fi_freeinfo(self.0) };
        }
    }
}

/// `rma`: also ask for `FI_RMA | FI_READ | FI_REMOTE_READ` (the `fi_read`
/// rendezvous).
pub(crate) fn getinfo(
    provider: &str,
    ep: EpType,
    addr: Option<SocketAddr>,
    source: bool,
    rma: Option<RmaOp>,
) -> Result<Info, FabricError> {
    getinfo_on(provider, ep, addr, source, rma, None)
}

/// [`getinfo`] restricted to the domain called `domain` when given.
pub(crate) fn getinfo_on(
    provider: &str,
    ep: EpType,
    addr: Option<SocketAddr>,
    source: bool,
    rma: Option<RmaOp>,
    domain: Option<&str>,
) -> Result<Info, FabricError> {
    getinfo_rma(provider, ep, addr, source, rma.as_slice(), true, domain)
}

/// [`getinfo_on`] asking for every one-sided operation in `rma` (the raw
/// RMA loop wants reads and writes on one endpoint), and for the message
/// ordering msgr's units need only when `ordered`.
pub(crate) fn getinfo_rma(
    provider: &str,
    ep: EpType,
    addr: Option<SocketAddr>,
    source: bool,
    rma: &[RmaOp],
    ordered: bool,
    domain: Option<&str>,
) -> Result<Info, FabricError> {
    let no_provider = |reason: String| FabricError::NoProvider {
        provider: provider.to_owned(),
        endpoint: ep.name(),
        reason,
    };
    let prov = CString::new(provider).map_err(|_| no_provider("bad name".into()))?;
    let domain = domain
        .map(CString::new)
        .transpose()
        .map_err(|_| no_provider("bad domain name".into()))?;
    let (node, service) = match addr {
        Some(a) => (
            Some(CString::new(a.ip().to_string()).expect("no NUL in an IP")),
            Some(CString::new(a.port().to_string()).expect("no NUL in a port")),
        ),
        None => (None, None),
    };
    // SAFETY: fi_allocinfo returns a zeroed fi_info with allocated attribute
    // structs, or null; every pointer written below points into it.
    let hints = Info(unsafe { sys::fi_allocinfo() });
    if hints.0.is_null() {
        return Err(no_provider("fi_allocinfo: out of memory".into()));
    }
    let mut out: *mut sys::fi_info = ptr::null_mut();
    // SAFETY: hints.0 and its attribute structs are valid (fi_allocinfo); the
    // provider name is strdup'ed because fi_freeinfo frees it.
    let rc = unsafe {
        let h = &mut *hints.0;
        h.caps = u64::from(sys::FI_MSG);
        for op in rma {
            h.caps |= u64::from(match op {
                RmaOp::Read => sys::FI_RMA | sys::FI_READ | sys::FI_REMOTE_READ,
                RmaOp::Write => sys::FI_RMA | sys::FI_WRITE | sys::FI_REMOTE_WRITE,
            });
        }
        h.mode = 0;
        (*h.ep_attr).type_ = ep.raw();
        if ordered && ep == EpType::Rdm {
            // Units are split into several messages: they must arrive in the
            // order they were sent (MSG endpoints are ordered streams anyway).
            (*h.tx_attr).msg_order = u64::from(sys::FI_ORDER_SAS);
            (*h.rx_attr).msg_order = u64::from(sys::FI_ORDER_SAS);
        }
        if ordered && rma.contains(&RmaOp::Write) {
            // The sender says "written" by a send posted right behind its
            // write: the send must not overtake the write.
            (*h.tx_attr).msg_order |= u64::from(sys::FI_ORDER_SAW);
            (*h.rx_attr).msg_order |= u64::from(sys::FI_ORDER_SAW);
        }
        (*h.domain_attr).mr_mode =
            (sys::FI_MR_LOCAL | sys::FI_MR_VIRT_ADDR | sys::FI_MR_ALLOCATED | sys::FI_MR_PROV_KEY)
                as c_int;
        (*h.domain_attr).threading = sys::FI_THREAD_DOMAIN;
        (*h.fabric_attr).prov_name = libc::strdup(prov.as_ptr());
        if let Some(d) = &domain {
            (*h.domain_attr).name = libc::strdup(d.as_ptr());
        }
        sys::fi_getinfo(
            API_VERSION,
            node.as_ref().map_or(ptr::null(), |n| n.as_ptr()),
            service.as_ref().map_or(ptr::null(), |s| s.as_ptr()),
            if source { sys::FI_SOURCE } else { 0 },
            hints.0,
            &mut out,
        )
    };
    if rc != 0 || out.is_null() {
        let code = -rc;
        return Err(no_provider(format!("fi_getinfo: {}", strerror(code))));
    }
    Ok(Info(out))
}

/// Whether `provider` offers `ep` endpoints with `FI_MSG` (and, for RDM,
/// send-after-send ordering) here; the error says why not.
pub fn probe(provider: &str, ep: EpType) -> Result<(), FabricError> {
    getinfo(provider, ep, None, false, None).map(drop)
}

/// Whether endpoints of `provider` must outlive the process (crate docs).
pub(crate) fn leaks_on_drop(provider: &str) -> bool {
    provider.split(';').next() == Some("shm")
}

/// Whether `provider`'s target looks the key of every read up and fails a
/// read of a withdrawn registration: `tcp` (in software), `verbs` (in the
/// device). Only then may memory be exposed without a check word
/// ([`RmaBuffers::expose_in_place`](crate::RmaBuffers::expose_in_place)); providers not known to do so get the
/// word (see [`CHECK_LEN`](crate::CHECK_LEN): `shm` does not look keys up), apart from memory
/// exposed in place.
pub(crate) fn checks_keys(provider: &str) -> bool {
    matches!(provider.split(';').next(), Some("tcp" | "verbs"))
}

/// The one-sided operation a [`Net`](crate::Net)'s endpoints move rendezvous units
/// with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RmaOp {
    /// The receiver `fi_read`s the sender's exposed buffer
    /// (`FI_RMA | FI_READ | FI_REMOTE_READ`).
    Read,
    /// The receiver grants a buffer of its own and the sender `fi_write`s
    /// into it (`FI_RMA | FI_WRITE | FI_REMOTE_WRITE`, with sends ordered
    /// after writes: `FI_ORDER_SAW`).
    Write,
}

/// Which one-sided operation a [`Net`](crate::Net)'s endpoints get for the
/// rendezvous ([`RmaOp`]), if any.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RmaChoice {
    /// Reads where the provider offers them and this libfabric has no
    /// known bug in them ([`rma_withheld`]); else writes where the provider
    /// offers them and checks keys at the target ([`writes_sound`]).
    #[default]
    IfSound,
    /// Never: every message goes through send/receive slots.
    Never,
    /// Reads where the provider offers them, known bugs or not (for a
    /// libfabric patched past [`rma_withheld`]'s reason, and for tests of
    /// the reads themselves).
    Always,
    /// Writes where the provider offers them and checks keys
    /// ([`writes_sound`]), even where reads would do.
    Writes,
}

impl RmaChoice {
    /// The known bug in `provider`'s reads this choice steers around here
    /// ([`rma_withheld`]); `None` under [`RmaChoice::Always`], which
    /// ignores them. A Net withholds its own reads for it (unless
    /// [`RmaChoice::Never`] withholds them anyway), and a provider that
    /// reads large sends itself ([`eager_limit`]) must be kept below that.
    pub fn steers_around(self, provider: &str) -> Option<&'static str> {
        match self {
            RmaChoice::Always => None,
            RmaChoice::IfSound | RmaChoice::Never | RmaChoice::Writes => rma_withheld(provider),
        }
    }

    /// The operations to try for `provider`, in order of preference.
    pub(crate) fn wanted(self, provider: &str) -> &'static [RmaOp] {
        let reads = self.steers_around(provider).is_none();
        let writes = writes_sound(provider);
        match self {
            RmaChoice::Never => &[],
            RmaChoice::Always => &[RmaOp::Read],
            RmaChoice::Writes if writes => &[RmaOp::Write],
            RmaChoice::Writes => &[],
            RmaChoice::IfSound if reads && writes => &[RmaOp::Read, RmaOp::Write],
            RmaChoice::IfSound if reads => &[RmaOp::Read],
            RmaChoice::IfSound if writes => &[RmaOp::Write],
            RmaChoice::IfSound => &[],
        }
    }
}

/// Whether the write rendezvous is sound on `provider`: its target must
/// look up the key of every incoming write (`checks_keys`), so that a
/// buffer granted to a peer and withdrawn is never written into once it is
/// freed.
pub fn writes_sound(provider: &str) -> bool {
    checks_keys(provider)
}

/// libfabric's run-time version as (major, minor).
pub fn version() -> (u32, u32) {
    // SAFETY: fi_version takes nothing and returns a number.
    let v = unsafe { sys::fi_version() };
    (v >> 16, v & 0xffff)
}

/// Why `provider`'s endpoints get no `fi_read` in the libfabric loaded,
/// if they get none under [`RmaChoice::IfSound`].
///
/// libfabric before 1.18, `tcp` (`ofi_rxm` over it passes reads down): an
/// endpoint disabled while the response to one of its reads is arriving —
/// closed by us, or by the peer — completes that read twice and frees its
/// transfer entry twice; the pool then hands the one entry to two
/// operations and the heap is corrupted (the stress suite's `malloc():
/// unsorted double linked list corrupted`). Fixed upstream in 1.18
/// (`prov/tcp: Suspicion of bug where RX entry is freed twice`). The test
/// `tcp_read_flushed_mid_response_completes_once_unless_withheld` pins it.
pub fn rma_withheld(provider: &str) -> Option<&'static str> {
    let tcp = provider.split(';').next() == Some("tcp");
    (tcp && version() < (1, 18)).then_some(
        "libfabric before 1.18: the tcp provider frees a read's entry twice when its endpoint \
         closes mid-response (heap corruption); fixed in 1.18",
    )
}

/// The largest message `provider` sends eagerly, if it sends larger ones
/// by a rendezvous of its own — the receiver `fi_read`ing them with the
/// core provider's reads, where [`rma_withheld`]'s bug strikes too:
/// `ofi_rxm`, whose limit is its bounce buffer size (`FI_OFI_RXM_BUFFER_SIZE`,
/// 16 KiB by default; the reported inject size is the core's, 64 over `tcp`).
pub fn eager_limit(provider: &str) -> Option<usize> {
    if !provider.split(';').any(|layer| layer == "ofi_rxm") {
        return None;
    }
    let set = std::env::var("FI_OFI_RXM_BUFFER_SIZE").ok();
    Some(set.and_then(|v| v.trim().parse().ok()).unwrap_or(16 << 10))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_provider_is_named() {
        let e = probe("nosuchprovider", EpType::Msg).unwrap_err();
        assert!(e.to_string().contains("nosuchprovider"), "{e}");
    }
}

/// What a domain asks of memory registrations: its `mr_mode` bits that
/// matter here, and whether its keys are checked.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct MrMode {
    /// `FI_MR_LOCAL`: the local side of an operation is registered too.
    pub(crate) local: bool,
    /// `FI_MR_VIRT_ADDR`: remote addresses are virtual addresses, not
    /// offsets into the registration.
    pub(crate) virt_addr: bool,
    /// `FI_MR_PROV_KEY`: the provider picks keys.
    pub(crate) prov_key: bool,
    /// Reads of withdrawn registrations fail at the target ([`checks_keys`]).
    pub(crate) keys_checked: bool,
}

impl MrMode {
    /// From a domain's `mr_mode` and [`checks_keys`] of its provider.
    pub(crate) fn new(mr_mode: u32, keys_checked: bool) -> Self {
        MrMode {
            local: mr_mode & sys::FI_MR_LOCAL != 0,
            virt_addr: mr_mode & sys::FI_MR_VIRT_ADDR != 0,
            prov_key: mr_mode & sys::FI_MR_PROV_KEY != 0,
            keys_checked,
        }
    }
}
