//! Priority classes: the few lanes a message can travel in.
//!
//! A class is named after what it carries, not a number: the session's own
//! control above everything, calls and heartbeats above data, bulk below
//! it. Within one class order and exactly-once hold; across classes no
//! order is promised (docs/PROTOCOL.md, "Fragment frames").
//!
//! Nothing sends by class yet: this is the type the lanes (queue, credit
//! and reassembly per class) are built on, and the mapping of the legacy
//! [`crate::Message::priority`] byte onto it.

/// The class a message travels in. Each class is to get its own queue at
/// every stage, its own credit and its own reassembly buffer, and a sender
/// drains the highest non-empty class first.
///
/// **Why four.** Zenoh gives every link 8 priorities, Ceph's msgr2 uses a
/// handful of named ones (`LOW`, `DEFAULT`, `HIGH`, `HIGHEST`). Each class
/// costs a queue at each stage, a credit and, on the receiver, a reassembly
/// buffer of up to the largest message ([`crate::fragment::Reassembler`]'s
/// memory bound is that times the classes), so classes nobody can tell
/// apart are paid for by every connection. Four separate what a server
/// needs kept apart: its own control, which must never wait behind data;
/// latency-bound traffic (calls, heartbeats); the default; and bulk that
/// may wait for everything else. Zenoh's eight fold onto them (its
/// `RealTime` and `Interactive*` on [`Priority::Interactive`], `Data*` on
/// [`Priority::Data`]). The wire carries the class in a byte, so more can
/// come without a new frame shape.
///
/// **Order.** `Ord` is drain order: `Control < Interactive < Data <
/// Background`, so `sort()`, a `BTreeMap` and [`Priority::ALL`] put the
/// most urgent class first, and [`Priority::index`] is a lane's slot in an
/// array of lanes. Ask "more urgent?" with [`Priority::is_above`].
///
/// ```
/// use msgr_proto::priority::Priority;
///
/// let mut lanes = vec![Priority::Background, Priority::Control, Priority::Data];
/// lanes.sort();
/// assert_eq!(lanes, [Priority::Control, Priority::Data, Priority::Background]);
/// assert!(Priority::Interactive.is_above(Priority::Data));
/// // Every message built today has priority 0: it travels as data.
/// assert_eq!(Priority::from_legacy(0), Priority::Data);
/// assert_eq!(Priority::default(), Priority::Data);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(u8)]
pub enum Priority {
    /// The session's own control (acks, keepalives, credits): above every
    /// class of application messages. No application message maps to it
    /// ([`Priority::from_legacy`] never returns it).
    Control = 0,
    /// Latency-bound messages: calls and their replies, heartbeats.
    Interactive = 1,
    /// The default: every message that asks for nothing else.
    #[default]
    Data = 2,
    /// Bulk transfers that may wait for every other class.
    Background = 3,
}

impl Priority {
    /// Every class, most urgent first (drain order; index order).
    pub const ALL: [Priority; 4] = [
        Priority::Control,
        Priority::Interactive,
        Priority::Data,
        Priority::Background,
    ];
    /// How many classes there are: the length of an array of lanes.
    pub const COUNT: usize = Priority::ALL.len();

    /// The class's slot in an array of lanes, 0 the most urgent; also its
    /// byte on the wire.
    pub fn index(self) -> usize {
        self as usize
    }

    /// The class of wire byte `b`, or `None` for a byte that names none.
    pub fn from_wire(b: u8) -> Option<Priority> {
        Priority::ALL.get(usize::from(b)).copied()
    }

    /// The class's byte on the wire (its [`Priority::index`]).
    pub fn to_wire(self) -> u8 {
        self as u8
    }

    /// Whether this class goes before `other` (is more urgent).
    pub fn is_above(self, other: Priority) -> bool {
        self < other
    }

    /// The class of a message whose [`crate::Message::priority`] byte is `b`
    /// (higher bytes are more urgent, as that field always said):
    ///
    /// | byte | class | why |
    /// |---|---|---|
    /// | 0 | `Data` | the value of every message that never set one |
    /// | 1..=95 | `Background` | explicitly low (Ceph's `LOW` is 64) |
    /// | 96..=191 | `Data` | around the middle (Ceph's `DEFAULT` is 127) |
    /// | 192..=255 | `Interactive` | high (Ceph's `HIGH` 196, `HIGHEST` 255) |
    ///
    /// `Control` is the session's: no byte maps to it, so an application
    /// cannot put its messages beside the session's acks and keepalives.
    pub fn from_legacy(b: u8) -> Priority {
        match b {
            0 => Priority::Data,
            1..=95 => Priority::Background,
            96..=191 => Priority::Data,
            192..=255 => Priority::Interactive,
        }
    }

    /// The [`crate::Message::priority`] byte that stands for this class:
    /// `Data` is 0 (a message given the default class is byte for byte the
    /// message it was), `Background` 64, `Interactive` 224. Each reads back
    /// as itself through [`Priority::from_legacy`]; `Control` has no byte of
    /// its own and gives 255, the most urgent byte, which reads back as
    /// `Interactive`.
    pub fn to_legacy(self) -> u8 {
        match self {
            Priority::Control => u8::MAX,
            Priority::Interactive => 224,
            Priority::Data => 0,
            Priority::Background => 64,
        }
    }

    /// The class's name, as in logs and configuration.
    pub fn name(self) -> &'static str {
        match self {
            Priority::Control => "control",
            Priority::Interactive => "interactive",
            Priority::Data => "data",
            Priority::Background => "background",
        }
    }
}

impl From<u8> for Priority {
    /// [`Priority::from_legacy`].
    fn from(b: u8) -> Priority {
        Priority::from_legacy(b)
    }
}

impl std::fmt::Display for Priority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_legacy_byte_has_a_class_and_the_mapping_is_monotone_above_zero() {
        let mut last = Priority::Background;
        for b in 1..=u8::MAX {
            let p = Priority::from_legacy(b);
            assert_ne!(p, Priority::Control, "byte {b}");
            assert!(!last.is_above(p), "byte {b}: {p} below {last}");
            last = p;
        }
        assert_eq!(Priority::from_legacy(0), Priority::Data);
        assert_eq!(Priority::from(200u8), Priority::Interactive);
    }

    #[test]
    fn application_classes_round_trip_through_their_byte() {
        for p in Priority::ALL {
            let back = Priority::from_legacy(p.to_legacy());
            let want = if p == Priority::Control {
                Priority::Interactive
            } else {
                p
            };
            assert_eq!(back, want, "{p}");
        }
        assert_eq!(Priority::Data.to_legacy(), 0, "the default byte stays 0");
    }

    #[test]
    fn wire_bytes_and_indices_are_drain_order() {
        for (i, p) in Priority::ALL.into_iter().enumerate() {
            assert_eq!(p.index(), i);
            assert_eq!(Priority::from_wire(p.to_wire()), Some(p));
        }
        for b in Priority::COUNT as u8..=u8::MAX {
            assert_eq!(Priority::from_wire(b), None);
        }
        let mut sorted = Priority::ALL;
        sorted.reverse();
        sorted.sort();
        assert_eq!(sorted, Priority::ALL);
        assert!(Priority::Control.is_above(Priority::Interactive));
        assert!(!Priority::Background.is_above(Priority::Background));
    }
}
