//! The rendezvous messages' bodies on the wire: descriptors, epilogues, grants, answers.

use msgr_fabric::{Exposed, Landing, RemoteWord, RmaOp, CHECK_LEN};
use msgr_proto::frame::MAX_SEGMENTS;
use msgr_proto::Frame;

use crate::split::INLINE_MAX;

/// Bytes of a rendezvous descriptor before its inline bytes: address,
/// length, key, id, check word, where the read lands among the inline
/// bytes, the address and key of a check word apart and whether there is
/// one ([`WORD_APART`]).
pub const DESC_LEN: usize = 8 + 8 + 8 + 4 + 8 + 4 + 8 + 8 + 4;
/// Descriptor flag: the check word lies apart ([`Exposed::word`]).
const WORD_APART: u32 = 1;
/// Descriptor flag: the unit is held for a write ([`Exposed::write`]): the
/// receiver grants a buffer ([`encode_grant`]) instead of reading.
pub(super) const WRITE_ME: u32 = 2;
/// Descriptor flag: the unit's epilogue (the last inline bytes) is zero
/// here and follows in a message of its own ([`encode_epilogue`]).
pub const LATE_EPILOGUE: u32 = 4;
/// Bytes of an epilogue at most (a CRC32C per segment).
pub const EPILOGUE_MAX: usize = 4 * MAX_SEGMENTS;
/// Bytes of the message carrying a late epilogue at most: the sender's id,
/// the epilogue's length, the epilogue.
pub const EPILOGUE_MSG_MAX: usize = 4 + 1 + EPILOGUE_MAX;
/// Bytes of a grant: the sender's id, then where to write and the key.
pub const GRANT_LEN: usize = 4 + 8 + 8;
/// The largest descriptor with its inline bytes.
pub const DESC_MAX: usize = DESC_LEN + INLINE_MAX;
/// Bytes of the answer to a descriptor: the sender's id.
pub const DONE_LEN: usize = 4;

/// Why a received descriptor is refused (the link fails).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DescError {
    /// Fewer bytes than a descriptor.
    #[error("short rendezvous descriptor ({0} bytes, want {DESC_LEN})")]
    Short(usize),
    /// A unit of 0 bytes (only its check word) is never sent by rendezvous.
    #[error("rendezvous of 0 bytes")]
    Empty,
    /// Larger than any frame this side accepts.
    #[error("rendezvous of {len} bytes (frame limit {max})")]
    TooLarge {
        /// Length in the descriptor.
        len: u64,
        /// The receiver's frame limit.
        max: u64,
    },
    /// A descriptor where a unit's next piece should be.
    #[error("rendezvous inside a multi-piece unit")]
    InsideUnit,
    /// A check word apart that is no check word (0), or unknown flags.
    #[error("rendezvous descriptor with a check word apart of 0 or flags {0:#x}")]
    BadWord(u32),
    /// The read would land outside the inline bytes, or after a check word.
    #[error("rendezvous read placed at {at} among {inline} inline bytes")]
    Placement {
        /// Where the read lands.
        at: u64,
        /// Inline bytes that came with the descriptor.
        inline: usize,
    },
    /// An answer for a unit this side has not exposed.
    #[error("rendezvous answer for nothing exposed ({0:?})")]
    UnknownDone(Option<u32>),
    /// A grant for a unit this side does not hold for a write, or holds
    /// and wrote already.
    #[error("rendezvous grant for nothing held ({0:?})")]
    UnknownGrant(Option<u32>),
    /// A "written" for no buffer granted to the peer.
    #[error("rendezvous write announced for nothing granted ({0:?})")]
    UnknownWritten(Option<u32>),
    /// A late epilogue that is no epilogue, does not fit where its unit's
    /// epilogue goes, or one more than units may be exposed.
    #[error("late epilogue refused: {0}")]
    BadEpilogue(&'static str),
    /// A descriptor of the operation this side's endpoints do not take
    /// part in.
    #[error("rendezvous by {offered:?} to an endpoint moving units by {ours:?}")]
    WrongOp {
        /// What the descriptor asks.
        offered: RmaOp,
        /// What this side's endpoints do.
        ours: Option<RmaOp>,
    },
}

/// A unit of ours exposed for the peer: what its descriptor carries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Described {
    /// The exposed buffer.
    pub x: Exposed,
    /// The unit's bytes around it (empty when the whole unit is exposed).
    pub inline: Vec<u8>,
    /// Where in `inline` the exposed bytes belong.
    pub at: usize,
    /// The exposed bytes are the application's, not a copy.
    pub in_place: bool,
    /// The frame whose epilogue follows the descriptor (the inline one is
    /// zero): [`LATE_EPILOGUE`].
    pub late: Option<Box<Frame>>,
}

/// A peer's descriptor: what to read, and the bytes to place around it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Offered<'a> {
    /// The peer's exposed buffer.
    pub x: Exposed,
    /// The unit's bytes around it.
    pub inline: &'a [u8],
    /// Where in `inline` the read lands.
    pub at: usize,
    /// The unit's epilogue follows in a message of its own
    /// ([`LATE_EPILOGUE`]).
    pub late: bool,
}

impl Offered<'_> {
    /// Bytes at the unit's end a late epilogue may take (the inline bytes
    /// after the read), if it has one.
    pub fn late_room(&self) -> Option<usize> {
        self.late.then(|| self.inline.len() - self.at)
    }
}

/// Writes `d`'s descriptor at the start of `buf` (at least [`DESC_LEN`]
/// bytes and its inline ones: [`expose`](super::expose) saw to that); returns its length.
pub fn encode(buf: &mut [u8], d: &Described) -> usize {
    let x = &d.x;
    buf[..8].copy_from_slice(&x.addr.to_le_bytes());
    buf[8..16].copy_from_slice(&x.len.to_le_bytes());
    buf[16..24].copy_from_slice(&x.key.to_le_bytes());
    buf[24..28].copy_from_slice(&x.id.to_le_bytes());
    buf[28..36].copy_from_slice(&x.check.to_le_bytes());
    buf[36..40].copy_from_slice(&(d.at as u32).to_le_bytes());
    let (word, mut flags) = match x.word {
        Some(w) => (w, WORD_APART),
        None => (RemoteWord { addr: 0, key: 0 }, 0),
    };
    if x.write {
        flags |= WRITE_ME;
    }
    if d.late.is_some() {
        flags |= LATE_EPILOGUE;
    }
    buf[40..48].copy_from_slice(&word.addr.to_le_bytes());
    buf[48..56].copy_from_slice(&word.key.to_le_bytes());
    buf[56..60].copy_from_slice(&flags.to_le_bytes());
    buf[DESC_LEN..DESC_LEN + d.inline.len()].copy_from_slice(&d.inline);
    DESC_LEN + d.inline.len()
}

/// The descriptor that is `body`, for a receiver whose frames are at most
/// `max_frame` bytes and whose reassembly is `mid_unit` or not.
pub fn decode(body: &[u8], max_frame: u64, mid_unit: bool) -> Result<Offered<'_>, DescError> {
    let b: &[u8; DESC_LEN] = body
        .get(..DESC_LEN)
        .and_then(|b| b.try_into().ok())
        .ok_or(DescError::Short(body.len()))?;
    let inline = &body[DESC_LEN..];
    let word = |at: usize| {
        let mut w = [0u8; 8];
        w.copy_from_slice(&b[at..at + 8]);
        u64::from_le_bytes(w)
    };
    let half = |at: usize| u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
    let flags = half(56);
    let x = Exposed {
        addr: word(0),
        len: word(8),
        key: word(16),
        id: half(24),
        check: word(28),
        word: (flags & WORD_APART != 0).then(|| RemoteWord {
            addr: word(40),
            key: word(48),
        }),
        write: flags & WRITE_ME != 0,
    };
    let at = u64::from(half(36));
    if mid_unit {
        return Err(DescError::InsideUnit);
    }
    // A unit held for a write names nothing to read and has no check word.
    let bad_write = x.write && (x.addr != 0 || x.key != 0 || x.check != 0 || x.word.is_some());
    // A check word at the end of the read ends the unit: nothing inline
    // may follow it, a late epilogue included.
    let word_at_end = x.check != 0 && x.word.is_none();
    let late = flags & LATE_EPILOGUE != 0;
    if flags & !(WORD_APART | WRITE_ME | LATE_EPILOGUE) != 0
        || (x.word.is_some() && x.check == 0)
        || bad_write
        || (late && word_at_end)
    {
        return Err(DescError::BadWord(flags));
    }
    let placed = if word_at_end {
        at == inline.len() as u64
    } else {
        at <= inline.len() as u64
    };
    if !placed {
        return Err(DescError::Placement {
            at,
            inline: inline.len(),
        });
    }
    let word_len = if word_at_end { CHECK_LEN as u64 } else { 0 };
    if x.len <= word_len {
        return Err(DescError::Empty);
    }
    let len = x.len.saturating_add(inline.len() as u64);
    if len > max_frame.saturating_add(word_len) {
        return Err(DescError::TooLarge {
            len,
            max: max_frame,
        });
    }
    Ok(Offered {
        x,
        inline,
        at: at as usize,
        late,
    })
}

/// Writes the late epilogue `words` of the sender's unit `id` at the start
/// of `buf` ([`EPILOGUE_MSG_MAX`] bytes at least); returns its length.
pub fn encode_epilogue(buf: &mut [u8], id: u32, words: &[u8]) -> usize {
    buf[..4].copy_from_slice(&id.to_le_bytes());
    buf[4] = words.len() as u8;
    buf[5..5 + words.len()].copy_from_slice(words);
    5 + words.len()
}

/// The sender's id and the epilogue of a late epilogue's body.
pub fn decode_epilogue(body: &[u8]) -> Result<(u32, &[u8]), DescError> {
    let [a, b, c, d, len, rest @ ..] = body else {
        return Err(DescError::BadEpilogue("short"));
    };
    let len = usize::from(*len);
    if len == 0 || len > EPILOGUE_MAX || len % 4 != 0 || rest.len() < len {
        return Err(DescError::BadEpilogue("not a CRC per segment"));
    }
    Ok((u32::from_le_bytes([*a, *b, *c, *d]), &rest[..len]))
}

/// Writes the grant of a buffer (`landing`) for the sender's unit `id` at
/// the start of `buf` ([`GRANT_LEN`] bytes); returns its length.
pub fn encode_grant(buf: &mut [u8], id: u32, landing: Landing) -> usize {
    buf[..4].copy_from_slice(&id.to_le_bytes());
    buf[4..12].copy_from_slice(&landing.addr.to_le_bytes());
    buf[12..20].copy_from_slice(&landing.key.to_le_bytes());
    GRANT_LEN
}

/// The sender's id and the buffer of a grant's body.
pub fn decode_grant(body: &[u8]) -> Option<(u32, Landing)> {
    let b = body.get(..GRANT_LEN)?;
    let word = |at: usize| {
        let mut w = [0u8; 8];
        w.copy_from_slice(&b[at..at + 8]);
        u64::from_le_bytes(w)
    };
    let id = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    Some((
        id,
        Landing {
            addr: word(4),
            key: word(12),
        },
    ))
}

/// The id at the start of an answer's body (a "done", or a "written").
pub fn decode_done(body: &[u8]) -> Option<u32> {
    let b = body.get(..DONE_LEN)?;
    Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    use super::super::tests::{big_frame, exposed};

    fn with_word(mut x: Exposed) -> Exposed {
        x.word = Some(RemoteWord {
            addr: 0x2000,
            key: 43,
        });
        x
    }

    fn described(len: u64, check: u64, inline: &[u8], at: usize) -> Vec<u8> {
        describe(exposed(len, check), inline, at)
    }

    fn describe(x: Exposed, inline: &[u8], at: usize) -> Vec<u8> {
        let mut b = vec![0u8; DESC_MAX];
        let d = Described {
            x,
            inline: inline.to_vec(),
            at,
            in_place: false,
            late: None,
        };
        let n = encode(&mut b, &d);
        b.truncate(n);
        b
    }

    /// A descriptor's body of `len` bytes, at a fixture's address and key
    /// (never registered anywhere) with check word 0x5eed.
    pub(crate) fn desc(len: u64) -> Vec<u8> {
        described(len, 0x5eed, &[], 0)
    }

    #[test]
    fn descriptor_round_trips() {
        let b = desc(100_000);
        let d = decode(&b, 1 << 20, false).unwrap();
        assert_eq!(
            d,
            Offered {
                x: exposed(100_000, 0x5eed),
                inline: &[],
                at: 0,
                late: false,
            }
        );
        let b = described(100_000, 0, b"headtail", 4);
        let d = decode(&b, 1 << 20, false).unwrap();
        assert_eq!(
            d,
            Offered {
                x: exposed(100_000, 0),
                inline: b"headtail",
                at: 4,
                late: false,
            }
        );
        // A check word apart: the read may land among the inline bytes.
        let x = with_word(exposed(100_000, 0x5eed));
        let b = describe(x, b"headtail", 4);
        let d = decode(&b, 1 << 20, false).unwrap();
        assert_eq!(
            d,
            Offered {
                x,
                inline: b"headtail",
                at: 4,
                late: false,
            }
        );
        assert_eq!(decode_done(&7u32.to_le_bytes()), Some(7));
    }

    /// A unit held for a write: its descriptor names nothing to read and
    /// round-trips with the flag; one that names an address, a key or a
    /// check word anyway is refused. A grant round-trips too.
    #[test]
    fn write_descriptors_and_grants_round_trip() {
        let held = Exposed {
            addr: 0,
            key: 0,
            write: true,
            ..exposed(100_000, 0)
        };
        let b = describe(held, b"headtail", 4);
        let d = decode(&b, 1 << 20, false).unwrap();
        assert_eq!(
            d,
            Offered {
                x: held,
                inline: b"headtail",
                at: 4,
                late: false,
            }
        );
        for bad in [
            Exposed { addr: 1, ..held },
            Exposed { key: 1, ..held },
            Exposed { check: 9, ..held },
        ] {
            let b = describe(bad, b"headtail", 4);
            assert_eq!(
                decode(&b, 1 << 20, false),
                Err(DescError::BadWord(WRITE_ME))
            );
        }
        let landing = Landing {
            addr: 0xdead_beef,
            key: 77,
        };
        let mut g = [0u8; GRANT_LEN];
        assert_eq!(encode_grant(&mut g, 5, landing), GRANT_LEN);
        assert_eq!(decode_grant(&g), Some((5, landing)));
        assert_eq!(decode_grant(&g[..GRANT_LEN - 1]), None);
    }

    #[test]
    fn check_words_apart_are_checked() {
        // Apart, yet no word to compare.
        let b = describe(with_word(exposed(100, 0)), b"ab", 1);
        assert_eq!(decode(&b, 1 << 20, false), Err(DescError::BadWord(1)));
        // Flags this side does not know.
        let mut b = desc(100);
        b[56] = 2;
        assert_eq!(decode(&b, 1 << 20, false), Err(DescError::BadWord(2)));
        // The word is not part of the read: a frame of the limit and no
        // more, and a read of 8 bytes is not just a word.
        let limit = with_word(exposed(1 << 20, 9));
        assert!(decode(&describe(limit, &[], 0), 1 << 20, false).is_ok());
        let over = with_word(exposed((1 << 20) + 1, 9));
        assert_eq!(
            decode(&describe(over, &[], 0), 1 << 20, false),
            Err(DescError::TooLarge {
                len: (1 << 20) + 1,
                max: 1 << 20
            })
        );
        let eight = with_word(exposed(CHECK_LEN as u64, 9));
        assert!(decode(&describe(eight, &[], 0), 1 << 20, false).is_ok());
    }

    #[test]
    fn misplaced_reads_are_typed_errors() {
        // Past the inline bytes.
        assert_eq!(
            decode(&described(100, 0, b"ab", 3), 1 << 20, false),
            Err(DescError::Placement { at: 3, inline: 2 })
        );
        // Inline bytes after a check word.
        assert_eq!(
            decode(&described(100, 9, b"ab", 1), 1 << 20, false),
            Err(DescError::Placement { at: 1, inline: 2 })
        );
        // The frame is the read and the inline bytes together.
        assert_eq!(
            decode(&described(1 << 20, 0, b"ab", 0), 1 << 20, false),
            Err(DescError::TooLarge {
                len: (1 << 20) + 2,
                max: 1 << 20
            })
        );
        assert_eq!(
            decode(&described(0, 0, b"ab", 0), 1 << 20, false),
            Err(DescError::Empty)
        );
    }

    /// The flag round-trips and says where the epilogue may go; a unit
    /// whose check word ends it has no room for one. The epilogue's own
    /// message is checked before anything is taken from it.
    #[test]
    fn late_descriptors_and_epilogues_round_trip() {
        let mut b = vec![0u8; DESC_MAX];
        let d = Described {
            x: with_word(exposed(100_000, 0x5eed)),
            inline: b"headtail".to_vec(),
            at: 4,
            in_place: true,
            late: Some(Box::new(big_frame(10, 0))),
        };
        let n = encode(&mut b, &d);
        let got = decode(&b[..n], 1 << 20, false).unwrap();
        assert!(got.late);
        assert_eq!(got.late_room(), Some(4));
        let plain = desc(100_000);
        assert_eq!(decode(&plain, 1 << 20, false).unwrap().late_room(), None);
        // A check word at the end of the read, and a late epilogue.
        let at_end = Described {
            x: exposed(100_000, 0x5eed),
            inline: Vec::new(),
            at: 0,
            ..d
        };
        let n = encode(&mut b, &at_end);
        assert_eq!(
            decode(&b[..n], 1 << 20, false),
            Err(DescError::BadWord(LATE_EPILOGUE))
        );

        let mut m = [0u8; EPILOGUE_MSG_MAX];
        let n = encode_epilogue(&mut m, 9, &[1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(
            decode_epilogue(&m[..n]),
            Ok((9, &[1, 2, 3, 4, 5, 6, 7, 8][..]))
        );
        let bad = DescError::BadEpilogue("not a CRC per segment");
        for (body, why) in [
            (&[9, 0, 0][..], DescError::BadEpilogue("short")),
            (&[9, 0, 0, 0, 0], bad.clone()),
            (&[9, 0, 0, 0, 3, 1, 2, 3], bad.clone()),
            (&[9, 0, 0, 0, 20], bad.clone()),
            (&[9, 0, 0, 0, 8, 1, 2, 3, 4], bad),
        ] {
            assert_eq!(decode_epilogue(body), Err(why), "{body:?}");
        }
    }

    #[test]
    fn bad_descriptors_are_typed_errors() {
        for n in 0..DESC_LEN {
            assert_eq!(
                decode(&desc(100)[..n], 1 << 20, false),
                Err(DescError::Short(n))
            );
        }
        assert_eq!(decode(&desc(0), 1 << 20, false), Err(DescError::Empty));
        assert_eq!(
            decode(&desc(CHECK_LEN as u64), 1 << 20, false),
            Err(DescError::Empty),
            "a check word and nothing else"
        );
        // A frame of the limit with its check word is fine; one more is not.
        assert!(decode(&desc((1 << 20) + CHECK_LEN as u64), 1 << 20, false).is_ok());
        assert_eq!(
            decode(&desc((1 << 20) + CHECK_LEN as u64 + 1), 1 << 20, false),
            Err(DescError::TooLarge {
                len: (1 << 20) + CHECK_LEN as u64 + 1,
                max: 1 << 20
            })
        );
        assert_eq!(
            decode(&desc(u64::MAX), 1 << 20, false),
            Err(DescError::TooLarge {
                len: u64::MAX,
                max: 1 << 20
            })
        );
        assert_eq!(
            decode(&desc(100), 1 << 20, true),
            Err(DescError::InsideUnit)
        );
        assert_eq!(decode_done(&[1, 2, 3]), None);
    }
}
