//! The one error type of this crate.

/// Why a string is not a valid [`EntityAddr`](crate::EntityAddr),
/// [`AddrVec`](crate::AddrVec) or [`EntityName`](crate::EntityName), or why a
/// value cannot be written in the string syntax (see the `validate` methods).
///
/// Use it to report bad configuration or bad wire input. Every variant that
/// describes offending text carries that text (bounded by the input-length
/// limits), and its `Display` quotes it with Rust escaping so control
/// characters from the wire cannot corrupt a log line.
///
/// The enum is `#[non_exhaustive]`: match the variants you care about and keep
/// a catch-all arm.
#[derive(Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AddrParseError {
    /// The input was the empty string.
    #[error("empty input")]
    Empty,

    /// The input was longer than the parser accepts (see
    /// [`MAX_ADDR_LEN`](crate::MAX_ADDR_LEN) and friends); nothing else was
    /// looked at.
    #[error("input is {len} bytes long; at most {max} bytes are accepted")]
    TooLong {
        /// Length of the rejected input, in bytes.
        len: usize,
        /// The limit that applied, in bytes.
        max: usize,
    },

    /// The address had no `scheme://` prefix (or an empty scheme). Carries the
    /// whole address text.
    #[error("missing `scheme://` prefix in {0:?} (expected e.g. \"tcp://127.0.0.1:6800\")")]
    MissingScheme(String),

    /// The scheme is not one of `tcp`, `verbs`, `rdmacm`, `fabric+<provider>`.
    /// Schemes are case-sensitive (lower case only). Carries the scheme.
    #[error("unknown scheme {0:?} (expected tcp, verbs, rdmacm or fabric+<provider>)")]
    UnknownScheme(String),

    /// The libfabric provider name after `fabric+` is empty, too long, or not
    /// made of `;`-separated non-empty `[a-z0-9_]+` components. Carries the
    /// provider name.
    #[error(
        "bad libfabric provider name {0:?} (expected `;`-separated [a-z0-9_]+ components, \
         e.g. \"tcp\" or \"tcp;ofi_rxm\", at most 64 bytes)"
    )]
    BadFabricProvider(String),

    /// The part between `://` and the nonce/query is not an IP literal with a
    /// port (`1.2.3.4:6800`, `[::1]:6800`). Host names are never resolved.
    /// Carries that part.
    #[error(
        "bad socket address {0:?} (expected IPv4:port or [IPv6]:port; host names are not resolved)"
    )]
    BadSocketAddr(String),

    /// The text after `/` is not a canonical decimal `u64` (digits only, no
    /// sign, no leading zeros). Carries that text.
    #[error("bad nonce {0:?} (expected a decimal u64 without sign or leading zeros)")]
    BadNonce(String),

    /// A query item is empty or has no `=` (e.g. `?dev`, `?dev=x&`, `?`).
    /// Carries the item.
    #[error("malformed query item {0:?} (expected key=value)")]
    MalformedQuery(String),

    /// A query key other than `dev`, `port`, `gid`, `ep`. Carries the key.
    #[error("unknown query key {0:?} (known keys: dev, port, gid, ep)")]
    UnknownQueryKey(String),

    /// The same query key appeared twice. Carries the key.
    #[error("query key {0:?} given more than once")]
    DuplicateQueryKey(String),

    /// A known query key with a value it does not accept (also reported by
    /// `validate` for an unprintable device name).
    #[error("bad value {value:?} for query key {key:?}")]
    BadQuery {
        /// The key (`dev`, `port`, `gid` or `ep`).
        key: String,
        /// The rejected value.
        value: String,
    },

    /// A query key that the address's transport does not take: `dev`, `port`
    /// and `gid` only go with `verbs`, `rdmacm` and `fabric+verbs…`; `ep` only
    /// with `fabric+…`.
    #[error("query key {key:?} is not valid for scheme {scheme:?}")]
    OptionNotValidForTransport {
        /// The key.
        key: String,
        /// The scheme of the address, as written (e.g. `tcp`, `fabric+shm`).
        scheme: String,
    },

    /// An address vector such as `[a,,b]`, `[a,]` or `[,]` has an empty
    /// element. Carries the whole vector text.
    #[error("empty element in address vector {0:?}")]
    EmptyVectorElement(String),

    /// An address vector starts with `[` but does not end with `]`. Carries
    /// the whole vector text.
    #[error("address vector {0:?} is missing its closing `]`")]
    UnterminatedVector(String),

    /// An address vector holds more than
    /// [`MAX_ADDRVEC_ENTRIES`](crate::MAX_ADDRVEC_ENTRIES) addresses.
    #[error("address vector has {count} or more entries; at most {max} are accepted")]
    TooManyAddrs {
        /// How many entries were seen before giving up (at least `max + 1`).
        count: usize,
        /// The limit.
        max: usize,
    },

    /// An entity name without the `.` between kind and id. Carries the name.
    #[error("bad entity name {0:?} (expected <kind>.<id>, e.g. \"client.4123\")")]
    BadEntityName(String),

    /// An entity kind other than `client`, `server`, `peer`. Carries the kind.
    #[error("unknown entity kind {0:?} (expected client, server or peer)")]
    UnknownEntityKind(String),

    /// An entity id that is not a canonical decimal `u64`. Carries the id text.
    #[error("bad entity id {0:?} (expected a decimal u64 without sign or leading zeros)")]
    BadEntityId(String),

    /// Only from `validate`: an IPv6 socket address with a non-zero flow
    /// label, which the string syntax cannot express. Carries the flow info.
    #[error("IPv6 flow info {0} cannot be written in an address string (must be 0)")]
    UnrepresentableFlowInfo(u32),
}

crate::debug_is_display!(AddrParseError);
