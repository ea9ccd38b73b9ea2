//! The `rma_decode` target: RMA requests, replies and handles from
//! arbitrary bytes.

/// RMA requests, replies and handles (`crate::rma`) from arbitrary bytes:
/// mode 0 a request, 1 a reply, 2 a handle (postcard). What decodes
/// encodes back to the same bytes (one encoding per value); nothing
/// panics.
pub fn rma_decode(data: &[u8]) {
    use crate::rma::{RmaHandle, RmaReply, RmaRequest};
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    match mode % 3 {
        0 => {
            if let Ok(r) = RmaRequest::decode(rest) {
                assert_eq!(r.encode(), rest, "a request reads and writes back the same");
            }
        }
        1 => {
            if let Ok(r) = RmaReply::decode(rest) {
                assert_eq!(
                    &r.encode()[..],
                    rest,
                    "a reply reads and writes back the same"
                );
            }
        }
        _ => {
            if let Ok(h) = postcard::from_bytes::<RmaHandle>(rest) {
                let again = postcard::to_allocvec(&h).expect("a handle encodes");
                assert_eq!(postcard::from_bytes::<RmaHandle>(&again).ok(), Some(h));
            }
        }
    }
}
