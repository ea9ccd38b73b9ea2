//! A doorbell between two processes on one host, for a provider without
//! wait objects (`shm`).
//!
//! Each sleeper owns a [`Doorbell`]: one shared page (a memfd) whose first
//! word says "asleep", and a Unix datagram socket in the abstract namespace
//! (named after the process id and the memfd's fd number, [`BellId`]) that
//! its owner's epoll watches. A peer that learnt the [`BellId`] (announced
//! at link set-up) maps the page read-only through `/proc/PID/fd/FD` and
//! sends a byte to the socket only when the word says asleep
//! ([`PeerBell::ring_if_asleep`]): under load the sleeper is awake, the word
//! is 0, and a send costs one load. The order is a futex's: the sleeper
//! sets the word, fences, and reads its queue once more before blocking;
//! the sender writes into the queue, fences, and reads the word — one of
//! the two sees the other. A ring lost anyway (a full socket buffer) is
//! harmless: the sleeper still wakes at its deadline.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::ptr::NonNull;
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};

/// Bytes of the shared page.
const PAGE: usize = 4096;
/// The seals of a doorbell's memfd: its size is fixed for good.
const SEALS: libc::c_int = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
/// The word at offset 8 of every doorbell page: a page mapped from a
/// (pid, fd) that is not a doorbell is refused.
const MAGIC: u64 = 0x6d73_6772_6265_6c6c; // "msgrbell"

/// What names a doorbell on its host: announced to peers at set-up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BellId {
    /// The owner's process id.
    pub pid: u32,
    /// The memfd's fd number in the owner.
    pub fd: u32,
}

impl BellId {
    /// Bytes of [`BellId::encode`].
    pub const LEN: usize = 8;

    /// Little-endian pid then fd.
    pub fn encode(&self) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        b[..4].copy_from_slice(&self.pid.to_le_bytes());
        b[4..].copy_from_slice(&self.fd.to_le_bytes());
        b
    }

    /// The id at the start of `b`, if there is one.
    pub fn decode(b: &[u8]) -> Option<BellId> {
        let b = b.get(..Self::LEN)?;
        Some(BellId {
            pid: u32::from_le_bytes(b[..4].try_into().ok()?),
            fd: u32::from_le_bytes(b[4..].try_into().ok()?),
        })
    }

    fn socket_addr(&self) -> io::Result<SocketAddr> {
        let name = format!("msgr-bell/{}/{}", self.pid, self.fd);
        SocketAddr::from_abstract_name(name.as_bytes())
    }
}

/// A shared page mapped into this process.
#[derive(Debug)]
struct Page(NonNull<u8>);

// SAFETY: the page is only accessed through atomics.
unsafe impl Send for Page {}
// SAFETY: as above.
unsafe impl Sync for Page {}

impl Page {
    fn map(fd: RawFd, writable: bool) -> io::Result<Page> {
        let prot = if writable {
            libc::PROT_READ | libc::PROT_WRITE
        } else {
            libc::PROT_READ
        };
        // SAFETY: a fresh shared mapping of PAGE bytes of an open file at
        // an address the kernel picks; checked for failure below.
        let p = unsafe { libc::mmap(std::ptr::null_mut(), PAGE, prot, libc::MAP_SHARED, fd, 0) };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        NonNull::new(p.cast())
            .map(Page)
            .ok_or_else(|| io::Error::other("mmap returned null"))
    }

    fn asleep(&self) -> &AtomicU32 {
        // SAFETY: the mapping is PAGE bytes, page-aligned, and lives as
        // long as `self`; the word is only accessed atomically.
        unsafe { &*self.0.as_ptr().cast::<AtomicU32>() }
    }

    fn magic(&self) -> &AtomicU64 {
        // SAFETY: as in `asleep`; offset 8 is 8-aligned and in the page.
        unsafe { &*self.0.as_ptr().add(8).cast::<AtomicU64>() }
    }
}

impl Drop for Page {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map`, unmapped once; no reference
        // into it outlives `self`.
        unsafe { libc::munmap(self.0.as_ptr().cast(), PAGE) };
    }
}

/// This process's side of a doorbell: the page it says "asleep" in and
/// the socket a peer rings.
#[derive(Debug)]
pub struct Doorbell {
    page: Page,
    socket: UnixDatagram,
    id: BellId,
    /// Kept open: peers map the page through its number.
    _memfd: OwnedFd,
}

impl Doorbell {
    /// Creates the page and binds the socket.
    pub fn open() -> io::Result<Doorbell> {
        // SAFETY: a NUL-terminated name and valid flags; the result is
        // checked.
        let flags = libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING;
        let fd = unsafe { libc::memfd_create(c"msgr-bell".as_ptr(), flags) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a new fd owned by nothing else.
        let memfd = unsafe { OwnedFd::from_raw_fd(fd) };
        File::from(memfd.try_clone()?).set_len(PAGE as u64)?;
        // Sealed at its size: a peer that maps it can trust that no access
        // to the page faults (SIGBUS) because the file shrank.
        // SAFETY: fcntl on an fd we own, with an int argument.
        let sealed = unsafe { libc::fcntl(memfd.as_raw_fd(), libc::F_ADD_SEALS, SEALS) };
        if sealed < 0 {
            return Err(io::Error::last_os_error());
        }
        let page = Page::map(memfd.as_raw_fd(), true)?;
        page.magic().store(MAGIC, Ordering::Release);
        let id = BellId {
            pid: std::process::id(),
            fd: u32::try_from(memfd.as_raw_fd()).map_err(io::Error::other)?,
        };
        let socket = UnixDatagram::bind_addr(&id.socket_addr()?)?;
        socket.set_nonblocking(true)?;
        Ok(Doorbell {
            page,
            socket,
            id,
            _memfd: memfd,
        })
    }

    /// What peers need to ring it.
    pub fn id(&self) -> BellId {
        self.id
    }

    /// The socket to watch for rings (readable when rung).
    pub fn fd(&self) -> RawFd {
        self.socket.as_raw_fd()
    }

    /// Says "asleep": from now on peers that send ring. The caller reads
    /// its queue once more after this and before it blocks.
    pub fn sleep(&self) {
        self.page.asleep().store(1, Ordering::Relaxed);
        fence(Ordering::SeqCst);
    }

    /// Says "awake": peers stop ringing.
    pub fn wake(&self) {
        self.page.asleep().store(0, Ordering::Relaxed);
    }

    /// Reads the rings waiting on the socket; returns how many there were.
    pub fn drain(&self) -> u64 {
        drain_rings(&self.socket)
    }
}

/// A peer's doorbell as the sender sees it: its page mapped read-only and
/// its socket's address.
#[derive(Debug)]
pub struct PeerBell {
    page: Page,
    addr: SocketAddr,
}

impl PeerBell {
    /// Maps the page of the doorbell `id` (the peer is on this host: `shm`).
    /// Fails where `/proc/PID/fd` cannot be opened (another user, a process
    /// gone) or the file there is not a doorbell's page: a regular file
    /// of one page sealed at that size (a peer could otherwise shrink it
    /// under the mapping, and a load would fault), with the magic word. Opened
    /// without blocking (the number could name a FIFO).
    pub fn open(id: BellId) -> io::Result<PeerBell> {
        use std::os::unix::fs::OpenOptionsExt;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open(format!("/proc/{}/fd/{}", id.pid, id.fd))?;
        let meta = file.metadata()?;
        // SAFETY: fcntl on an fd we own, without an argument.
        let seals = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GET_SEALS) };
        if !meta.is_file() || meta.len() != PAGE as u64 || seals < 0 || seals & SEALS != SEALS {
            return Err(io::Error::other("not a doorbell page"));
        }
        let page = Page::map(file.as_raw_fd(), false)?;
        if page.magic().load(Ordering::Acquire) != MAGIC {
            return Err(io::Error::other("not a doorbell page"));
        }
        Ok(PeerBell {
            page,
            addr: id.socket_addr()?,
        })
    }

    /// Whether the peer said it sleeps. The caller posted its messages
    /// before asking (the fence orders the two).
    pub fn asleep(&self) -> bool {
        fence(Ordering::SeqCst);
        self.page.asleep().load(Ordering::Relaxed) != 0
    }

    /// Rings the peer if it sleeps, from `from` (any unbound datagram
    /// socket of this process). Returns whether a ring was sent.
    pub fn ring_if_asleep(&self, from: &UnixDatagram) -> bool {
        // A full socket buffer (-EAGAIN) means rings are waiting already.
        self.asleep() && from.send_to_addr(&[1], &self.addr).is_ok()
    }
}

/// The name a listener at `listen` is rung by before a link has told its
/// doorbell: a connector rings it after its HELLO, as the listener's worker
/// may sleep with no link whose peer would ring it.
fn listener_addr(listen: std::net::SocketAddr) -> io::Result<SocketAddr> {
    SocketAddr::from_abstract_name(format!("msgr-bell/listen/{listen}").as_bytes())
}

/// Binds the socket a listener at `listen` is rung by (non-blocking; the
/// caller watches it with its doorbell's). The listener holds `listen`'s
/// port on this host, so the name is its alone.
pub fn listener_bell(listen: std::net::SocketAddr) -> io::Result<UnixDatagram> {
    let socket = UnixDatagram::bind_addr(&listener_addr(listen)?)?;
    socket.set_nonblocking(true)?;
    Ok(socket)
}

/// Rings the listener at `listen` from `from`, asleep or not (a HELLO is
/// rare). Returns whether a ring was sent (false: no such listener bell,
/// or rings are waiting already).
pub fn ring_listener(from: &UnixDatagram, listen: std::net::SocketAddr) -> bool {
    listener_addr(listen).is_ok_and(|a| from.send_to_addr(&[1], &a).is_ok())
}

/// Reads the rings waiting on `socket` (a [`Doorbell`]'s or a
/// [`listener_bell`]); returns how many there were.
pub fn drain_rings(socket: &UnixDatagram) -> u64 {
    let mut buf = [0u8; 16];
    let mut n = 0;
    while socket.recv(&mut buf).is_ok() {
        n += 1;
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tempfile_page() -> File {
        // SAFETY: a NUL-terminated name; the fd is checked and owned.
        let fd = unsafe { libc::memfd_create(c"not-a-bell".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(fd >= 0);
        // SAFETY: a new fd owned by nothing else.
        let f = unsafe { File::from_raw_fd(fd) };
        f.set_len(PAGE as u64).unwrap();
        f
    }

    /// A ring reaches a sleeper and only a sleeper; a (pid, fd) that is not
    /// a doorbell is refused.
    #[test]
    fn rings_only_a_sleeper() {
        let bell = Doorbell::open().unwrap();
        let peer = PeerBell::open(BellId::decode(&bell.id().encode()).unwrap()).unwrap();
        let from = UnixDatagram::unbound().unwrap();
        from.set_nonblocking(true).unwrap();
        assert!(!peer.ring_if_asleep(&from));
        assert_eq!(bell.drain(), 0);
        bell.sleep();
        assert!(peer.ring_if_asleep(&from));
        assert_eq!(bell.drain(), 1);
        bell.wake();
        assert!(!peer.ring_if_asleep(&from));
        let not_a_bell = BellId {
            pid: std::process::id(),
            fd: from.as_raw_fd() as u32,
        };
        assert!(PeerBell::open(not_a_bell).is_err());
        // A page-sized file that is not sealed is refused too.
        let f = tempfile_page();
        let unsealed = BellId {
            pid: std::process::id(),
            fd: f.as_raw_fd() as u32,
        };
        assert!(PeerBell::open(unsealed).is_err());
        let listen = "127.0.0.1:1".parse().unwrap();
        assert!(!ring_listener(&from, listen));
        let listener = listener_bell(listen).unwrap();
        assert!(ring_listener(&from, listen));
        assert_eq!(drain_rings(&listener), 1);
    }
}
