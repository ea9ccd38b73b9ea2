//! The `addr_parse` target: entity addresses and address vectors parsed
//! from arbitrary text.

use std::str::FromStr;

use msgr_addr::{AddrVec, EntityAddr, EntityName};

use crate::codec::{Codec, Postcard};

/// `addr_parse`: the string parsers of `msgr-addr` and the serde (postcard)
/// form of an address. Whatever parses must print back to a string that
/// parses to the same value.
pub fn addr_parse(data: &[u8]) {
    if let Ok(s) = std::str::from_utf8(data) {
        if let Ok(a) = EntityAddr::from_str(s) {
            assert_eq!(
                a.to_string().parse::<EntityAddr>().as_ref(),
                Ok(&a),
                "{s:?}"
            );
            assert!(a.validate().is_ok());
        }
        if let Ok(v) = AddrVec::from_str(s) {
            assert_eq!(v.to_string().parse::<AddrVec>().as_ref(), Ok(&v), "{s:?}");
        }
        if let Ok(n) = EntityName::from_str(s) {
            assert_eq!(
                n.to_string().parse::<EntityName>().as_ref(),
                Ok(&n),
                "{s:?}"
            );
        }
    }
    if let Ok(a) = Postcard.decode::<EntityAddr>(data) {
        let e = Postcard.encode(&a).expect("address encodes");
        assert_eq!(Postcard.decode::<EntityAddr>(&e).as_ref(), Ok(&a));
    }
}
