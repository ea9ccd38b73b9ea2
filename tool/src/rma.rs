//! One-sided RMA across processes: `msgr serve --expose SIZE` exposes a
//! region and prints its handle as text; `msgr rma ADDR --handle TEXT`
//! reads or writes a range of it, as `Connection::read` and
//! `Connection::write` do in a program (`--ranges N`: as `read_many` and
//! `write_many`; `serve --shared`: a region `expose_shared` offers).

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use msgr::{
    Codec, Connection, Dispatcher, FaultReason, Message, Messenger, MessengerConfig, Postcard,
    RmaHandle, RmaOptions, RmaRegion, SharedRegion,
};

use crate::error::ToolError;
use crate::net::{self, Target};

/// The region `serve --expose` fills: byte `i` is `i % 251`. A prime
/// period, so a range read from the wrong offset (by a power of two or
/// any other shift below 251) shows.
pub fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i % 251) as u8).collect()
}

/// The region `msgr serve --expose` offers until it stops.
pub enum ServedRegion {
    /// A buffer the messenger owns, read-write (`Messenger::expose`).
    Owned(RmaRegion),
    /// Bytes the program keeps, read-only, answered without a copy
    /// (`Messenger::expose_shared`).
    Shared(SharedRegion),
}

impl ServedRegion {
    /// Exposes `len` bytes of [`pattern`] on `m`; `shared`: as bytes the
    /// program keeps.
    pub fn expose(m: &Messenger, len: usize, shared: bool) -> Self {
        if shared {
            Self::Shared(m.expose_shared(bytes::Bytes::from(pattern(len))))
        } else {
            Self::Owned(m.expose(pattern(len), msgr::Access::ReadWrite))
        }
    }

    /// The handle peers use.
    pub fn handle(&self) -> RmaHandle {
        match self {
            Self::Owned(r) => r.handle(),
            Self::Shared(r) => r.handle(),
        }
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        match self {
            Self::Owned(r) => r.len(),
            Self::Shared(r) => r.bytes().len(),
        }
    }

    /// How it is exposed, for serve's banner.
    pub fn describe(&self) -> &'static str {
        match self {
            Self::Owned(_) => "read-write",
            Self::Shared(_) => "read-only, shared (reads answered from them, no copy)",
        }
    }
}

/// Why an argument of `msgr serve --expose` or `msgr rma` did not parse
/// (clap prints it beside the flag).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ArgError {
    /// Not digits with an optional K or M.
    #[error("`{0}` is not a size (e.g. 4096, 64K, 1M)")]
    NotASize(String),
    /// A size of 0 or above the largest allowed.
    #[error("`{text}` is outside 1 byte..={max} bytes")]
    SizeOutOfRange {
        /// What was given.
        text: String,
        /// The largest size allowed.
        max: u64,
    },
    /// Hex with a digit left over.
    #[error("`{0}`: an odd number of hex digits")]
    OddHex(String),
    /// Something other than hex digits at byte `at`.
    #[error("`{text}`: not hex digits at {at}")]
    NotHex {
        /// What was given.
        text: String,
        /// Where the first pair that is not hex starts.
        at: usize,
    },
    /// Hex whose bytes are not a region handle.
    #[error("not a region handle ({0}); pass the text after `region`")]
    NotAHandle(msgr::CodecError),
    /// Not `OFFSET:LEN`.
    #[error("`{0}`: expected OFFSET:LEN, e.g. 0:64")]
    NotARange(String),
}

/// `SIZE[K|M]`: bytes, KiB or MiB, from 1 byte to `max`.
pub fn parse_size(text: &str, max: u64) -> Result<usize, ArgError> {
    let t = text.trim();
    let (digits, unit) = match t.char_indices().last() {
        Some((i, 'K' | 'k')) => (&t[..i], 1u64 << 10),
        Some((i, 'M' | 'm')) => (&t[..i], 1u64 << 20),
        _ => (t, 1),
    };
    let n: u64 = digits
        .parse()
        .map_err(|_| ArgError::NotASize(text.into()))?;
    match n.checked_mul(unit) {
        Some(b) if (1..=max).contains(&b) => Ok(b as usize),
        _ => Err(ArgError::SizeOutOfRange {
            text: text.into(),
            max,
        }),
    }
}

/// Lowercase hex, two digits a byte.
pub fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Bytes from hex digits (either case, an even number of them).
pub fn from_hex(text: &str) -> Result<Vec<u8>, ArgError> {
    let t = text.trim();
    if !t.len().is_multiple_of(2) {
        return Err(ArgError::OddHex(t.into()));
    }
    (0..t.len())
        .step_by(2)
        .map(|i| {
            t.get(i..i + 2)
                .and_then(|pair| u8::from_str_radix(pair, 16).ok())
                .ok_or_else(|| ArgError::NotHex {
                    text: t.into(),
                    at: i,
                })
        })
        .collect()
}

/// A handle as a shell passes it on: hex of its postcard bytes (the
/// default codec, as a message would carry it).
pub fn handle_text(h: &RmaHandle) -> Result<String, ToolError> {
    let bytes = Postcard
        .encode(h)
        .map_err(|e| ToolError::Usage(format!("encoding the region's handle: {e}")))?;
    Ok(to_hex(&bytes))
}

/// `--handle`: the text `serve --expose` printed after `region`.
pub fn parse_handle(text: &str) -> Result<RmaHandle, ArgError> {
    let bytes = from_hex(text.trim_start_matches("region ").trim())?;
    Postcard.decode(&bytes).map_err(ArgError::NotAHandle)
}

/// `--read OFFSET:LEN`.
pub fn parse_range(text: &str) -> Result<(u64, u64), ArgError> {
    let bad = || ArgError::NotARange(text.into());
    let (o, l) = text.split_once(':').ok_or_else(bad)?;
    let offset = o.trim().parse().map_err(|_| bad())?;
    let len = l.trim().parse().map_err(|_| bad())?;
    Ok((offset, len))
}

/// What `msgr rma` does.
#[derive(Debug)]
pub enum RmaCommand {
    /// Read `len` bytes at `offset`; to `out` (raw) or printed as hex.
    Read {
        /// Where the range starts.
        offset: u64,
        /// Its length.
        len: u64,
        /// A file for the bytes, instead of hex on stdout.
        out: Option<PathBuf>,
    },
    /// Write `bytes` at `offset`.
    Write {
        /// Where they go.
        offset: u64,
        /// What.
        bytes: Vec<u8>,
    },
}

/// How `msgr rma` runs its command.
#[derive(Clone, Copy, Debug)]
pub struct RunOptions {
    /// A CRC32C of the bytes moved, checked where they land.
    pub checksum: bool,
    /// The operation this many times, then a rate on stderr.
    pub repeat: u64,
    /// Each operation as this many ranges with one completion.
    pub ranges: u64,
}

/// `len` bytes at `offset` cut into `n` ranges (fewer if `len` is
/// shorter), as equal as whole bytes allow, in order and adjoining.
pub fn split(offset: u64, len: u64, n: u64) -> Vec<(u64, u64)> {
    let n = n.clamp(1, len.max(1));
    let (base, extra) = (len / n, len % n);
    let mut at = offset;
    (0..n)
        .map(|i| {
            let l = base + u64::from(i < extra);
            at += l;
            (at - l, l)
        })
        .collect()
}

/// Keeps why the connection went, for the error a failed connect reports.
#[derive(Default)]
struct ResetReason(Mutex<Option<String>>);

impl Dispatcher for ResetReason {
    fn on_message(&self, _conn: &Connection, _msg: Message) {}

    fn on_reset(&self, _conn: &Connection, reason: &FaultReason) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = Some(reason.to_string());
    }
}

/// Connects to the owner at `target` (within `timeout`) and runs `cmd` on
/// the region `handle` names, the operation bounded by the same timeout.
/// Returns the bytes read (empty for a write).
pub fn run(
    cfg: &MessengerConfig,
    target: &Target,
    handle: &RmaHandle,
    cmd: &RmaCommand,
    RunOptions {
        checksum,
        repeat,
        ranges,
    }: RunOptions,
    timeout: Duration,
) -> Result<bytes::Bytes, ToolError> {
    let watch = Arc::new(ResetReason::default());
    let (mut m, conn) = net::connect(cfg, target, watch.clone(), timeout, &watch.0)?;
    let opts = RmaOptions::from(timeout);
    let opts = if checksum { opts.checksum() } else { opts };
    // Reads land in one buffer, reused by each repeat (a fresh one per
    // read is paged in about as fast as loopback moves the bytes).
    let mut landing = match cmd {
        RmaCommand::Read { len, .. } => vec![0u8; *len as usize],
        RmaCommand::Write { .. } => Vec::new(),
    };
    // The data written, once: each write (or range of it) a slice.
    let written = match cmd {
        RmaCommand::Write { bytes, .. } => bytes::Bytes::from(bytes.clone()),
        RmaCommand::Read { .. } => bytes::Bytes::new(),
    };
    let once = |landing: &mut Vec<u8>| match cmd {
        RmaCommand::Read { offset, len, .. } if ranges > 1 => {
            let parts = split(*offset, *len, ranges);
            let got = conn.read_many(parts.iter().map(|&(o, l)| (handle, o, l)), opts);
            got.map(|got| {
                let mut at = 0;
                for b in got {
                    landing[at..at + b.len()].copy_from_slice(&b);
                    at += b.len();
                }
            })
            .map_err(|source| ToolError::Rma {
                what: format!(
                    "reading bytes {offset}..{offset}+{len} in {ranges} ranges at {target}"
                ),
                source,
            })
        }
        RmaCommand::Read { offset, len, .. } => conn
            .read_into(handle, *offset, landing, opts)
            .map_err(|source| ToolError::Rma {
                what: format!("reading bytes {offset}..{offset}+{len} at {target}"),
                source,
            }),
        RmaCommand::Write { offset, .. } if ranges > 1 => {
            let len = written.len() as u64;
            let parts = split(*offset, len, ranges);
            let writes = parts.iter().map(|&(o, l)| {
                let from = (o - offset) as usize;
                (handle, o, written.slice(from..from + l as usize))
            });
            conn.write_many(writes, opts)
                .map_err(|source| ToolError::Rma {
                    what: format!(
                        "writing bytes {offset}..{offset}+{len} in {ranges} ranges at {target}"
                    ),
                    source,
                })
        }
        RmaCommand::Write { offset, .. } => {
            let len = written.len();
            conn.write(handle, *offset, written.clone(), opts)
                .map_err(|source| ToolError::Rma {
                    what: format!("writing bytes {offset}..{offset}+{len} at {target}"),
                    source,
                })
        }
    };
    let t0 = std::time::Instant::now();
    let mut result = once(&mut landing);
    for _ in 1..repeat {
        if result.is_err() {
            break;
        }
        result = once(&mut landing);
    }
    let result = result.map(|()| bytes::Bytes::from(landing));
    if repeat > 1 && result.is_ok() {
        let secs = t0.elapsed().as_secs_f64();
        let len = match cmd {
            RmaCommand::Read { len, .. } => *len,
            RmaCommand::Write { bytes, .. } => bytes.len() as u64,
        };
        let c = m.counters();
        let native = c
            .rma_native_reads
            .load(std::sync::atomic::Ordering::Relaxed)
            + c.rma_native_writes
                .load(std::sync::atomic::Ordering::Relaxed);
        eprintln!(
            "{repeat} operations of {len} bytes in {secs:.3} s: {:.0} ops/s, {:.1} MiB/s; {native} native",
            repeat as f64 / secs,
            (repeat * len) as f64 / secs / f64::from(1 << 20),
        );
    }
    m.shutdown(Duration::from_secs(1));
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_hex_and_ranges_parse_or_say_why() {
        assert_eq!(parse_size("4096", 1 << 30), Ok(4096));
        assert_eq!(parse_size("64K", 1 << 30), Ok(64 << 10));
        assert_eq!(parse_size("2m", 1 << 30), Ok(2 << 20));
        for bad in ["", "K", "0", "-1", "1.5M", "2G", "2048M"] {
            assert!(parse_size(bad, 1 << 30).is_err(), "{bad}");
        }
        assert_eq!(from_hex("00ff7A"), Ok(vec![0, 255, 0x7a]));
        assert_eq!(to_hex(&[0, 255, 0x7a]), "00ff7a");
        for bad in ["0", "zz", "é"] {
            assert!(from_hex(bad).is_err(), "{bad}");
        }
        assert_eq!(parse_range("16:32"), Ok((16, 32)));
        for bad in ["16", "a:1", "1:", "1:2:3"] {
            assert!(parse_range(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_range_splits_into_adjoining_ranges_that_cover_it() {
        assert_eq!(split(10, 10, 3), [(10, 4), (14, 3), (17, 3)]);
        assert_eq!(split(0, 2, 5), [(0, 1), (1, 1)]);
        assert_eq!(split(7, 0, 4), [(7, 0)]);
        for (offset, len, n) in [(0, 1 << 20, 7), (5, 4095, 64), (1, 3, 3)] {
            let parts = split(offset, len, n);
            assert_eq!(parts.len() as u64, n.min(len));
            assert_eq!(parts.iter().map(|p| p.1).sum::<u64>(), len);
            assert!(parts.windows(2).all(|w| w[0].0 + w[0].1 == w[1].0));
            assert_eq!(parts[0].0, offset);
        }
    }

    #[test]
    fn a_handle_goes_through_its_text_and_back() {
        let h = RmaHandle {
            region: 3,
            len: 1 << 20,
            access: msgr::Access::ReadWrite,
            capability: [0xc5; 16],
        };
        let text = handle_text(&h).expect("encodes");
        assert_eq!(parse_handle(&text).as_ref(), Ok(&h));
        assert_eq!(parse_handle(&format!("region {text}")), Ok(h));
        assert!(parse_handle(&text[..text.len() - 2]).is_err());
        assert!(parse_handle(&format!("{text}00")).is_err());
    }
}
