//! [`AddrVec`]: several addresses of one entity.

use std::fmt;
use std::str::FromStr;

use crate::addr::{EntityAddr, TransportKind};
use crate::error::AddrParseError;
use crate::parse::check_len;
use crate::{MAX_ADDRVEC_ENTRIES, MAX_ADDRVEC_LEN};

/// Several addresses of one entity, in preference order.
///
/// Use it to advertise or configure a peer that can be reached over more than
/// one transport (say `verbs://` first, `tcp://` as fallback), then
/// [`pick`](Self::pick) the first one the local side supports.
///
/// String form: `[a,b,…]`, or a single address without brackets (which is how
/// a one-element vector is printed); `[]` is the empty vector. No whitespace.
/// At most `MAX_ADDRVEC_ENTRIES` entries. Serde uses the string form.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct AddrVec(pub Vec<EntityAddr>);

impl AddrVec {
    /// An empty vector; [`push`](Self::push) addresses onto it.
    pub fn new() -> Self {
        AddrVec(Vec::new())
    }

    /// The addresses in preference order.
    pub fn iter(&self) -> std::slice::Iter<'_, EntityAddr> {
        self.0.iter()
    }

    /// The most preferred address, if any.
    pub fn first(&self) -> Option<&EntityAddr> {
        self.0.first()
    }

    /// Number of addresses.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there are no addresses.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Appends an address as the least preferred one.
    pub fn push(&mut self, addr: EntityAddr) {
        self.0.push(addr);
    }

    /// The most preferred address whose transport `usable` accepts. Use it
    /// when connecting: pass "is there a backend for this transport here".
    pub fn pick(&self, usable: impl Fn(&TransportKind) -> bool) -> Option<&EntityAddr> {
        self.0.iter().find(|a| usable(&a.transport))
    }

    /// Checks that this value can be written in the string syntax and parsed
    /// back to itself: at most `MAX_ADDRVEC_ENTRIES` entries, each passing
    /// [`EntityAddr::validate`]. Every parsed vector passes.
    pub fn validate(&self) -> Result<(), AddrParseError> {
        if self.0.len() > MAX_ADDRVEC_ENTRIES {
            return Err(AddrParseError::TooManyAddrs {
                count: self.0.len(),
                max: MAX_ADDRVEC_ENTRIES,
            });
        }
        self.0.iter().try_for_each(EntityAddr::validate)
    }
}

impl From<EntityAddr> for AddrVec {
    fn from(addr: EntityAddr) -> Self {
        AddrVec(vec![addr])
    }
}

impl From<Vec<EntityAddr>> for AddrVec {
    fn from(addrs: Vec<EntityAddr>) -> Self {
        AddrVec(addrs)
    }
}

impl FromIterator<EntityAddr> for AddrVec {
    fn from_iter<I: IntoIterator<Item = EntityAddr>>(iter: I) -> Self {
        AddrVec(iter.into_iter().collect())
    }
}

impl IntoIterator for AddrVec {
    type Item = EntityAddr;
    type IntoIter = std::vec::IntoIter<EntityAddr>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.into_iter()
    }
}

impl<'a> IntoIterator for &'a AddrVec {
    type Item = &'a EntityAddr;
    type IntoIter = std::slice::Iter<'a, EntityAddr>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

impl FromStr for AddrVec {
    type Err = AddrParseError;

    /// Parses `[a,b,…]`, `[]`, or a single address.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        check_len(s, MAX_ADDRVEC_LEN)?;
        let Some(inner) = s.strip_prefix('[') else {
            return Ok(AddrVec(vec![s.parse()?]));
        };
        let inner = inner
            .strip_suffix(']')
            .ok_or_else(|| AddrParseError::UnterminatedVector(s.to_owned()))?;
        if inner.is_empty() {
            return Ok(AddrVec::new());
        }
        let mut addrs = Vec::new();
        for (i, part) in inner.split(',').enumerate() {
            if i >= MAX_ADDRVEC_ENTRIES {
                return Err(AddrParseError::TooManyAddrs {
                    count: i + 1,
                    max: MAX_ADDRVEC_ENTRIES,
                });
            }
            if part.is_empty() {
                return Err(AddrParseError::EmptyVectorElement(s.to_owned()));
            }
            addrs.push(part.parse()?);
        }
        Ok(AddrVec(addrs))
    }
}

impl fmt::Display for AddrVec {
    /// One address: written bare. Otherwise `[a,b,…]` (`[]` when empty).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let [only] = self.0.as_slice() {
            return write!(f, "{only}");
        }
        f.write_str("[")?;
        for (i, addr) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{addr}")?;
        }
        f.write_str("]")
    }
}
