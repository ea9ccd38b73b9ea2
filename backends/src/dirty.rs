//! The links of a transport with something to post.

use msgr_proto::LinkId;

/// Links with queued output, credits to return or control to send: marked
/// from wherever the work appears, drained once per flush, each link once
/// and in id order (so a flush is deterministic and fair across links).
#[derive(Debug, Default)]
pub(crate) struct DirtyLinks(Vec<LinkId>);

impl DirtyLinks {
    pub(crate) fn push(&mut self, id: LinkId) {
        self.0.push(id);
    }

    /// Every link marked since the last call, once each, in id order.
    pub(crate) fn take(&mut self) -> Vec<LinkId> {
        let mut ids = std::mem::take(&mut self.0);
        ids.sort_unstable();
        ids.dedup();
        ids
    }
}

impl Extend<LinkId> for DirtyLinks {
    fn extend<I: IntoIterator<Item = LinkId>>(&mut self, ids: I) {
        self.0.extend(ids);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_link_once_in_order() {
        let mut d = DirtyLinks::default();
        d.push(LinkId(3));
        d.extend([LinkId(1), LinkId(3), LinkId(2)]);
        assert_eq!(d.take(), vec![LinkId(1), LinkId(2), LinkId(3)]);
        assert!(d.take().is_empty());
    }
}
