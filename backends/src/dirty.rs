//! The links of a transport with something to post.

use msgr_proto::LinkId;

/// Links with queued output, credits to return or control to send: marked
/// from wherever the work appears, drained once per flush, each link once
/// and in id order (so a flush is deterministic and fair across links).
/// The drained vector comes back ([`DirtyLinks::recycle`]) so a flush
/// allocates nothing.
#[derive(Debug, Default)]
pub(crate) struct DirtyLinks {
    marked: Vec<LinkId>,
    spare: Vec<LinkId>,
}

impl DirtyLinks {
    pub(crate) fn push(&mut self, id: LinkId) {
        self.marked.push(id);
    }

    /// Whether no link is marked (a flush with nothing to do returns at once).
    pub(crate) fn is_empty(&self) -> bool {
        self.marked.is_empty()
    }

    /// Unmarks `id` (its link is gone).
    pub(crate) fn remove(&mut self, id: LinkId) {
        self.marked.retain(|l| *l != id);
    }

    /// Every link marked since the last call, once each, in id order.
    /// Links marked while the caller works through them wait for the next
    /// call.
    pub(crate) fn take(&mut self) -> Vec<LinkId> {
        let mut ids = std::mem::replace(&mut self.marked, std::mem::take(&mut self.spare));
        ids.sort_unstable();
        ids.dedup();
        ids
    }

    /// Hands back a vector [`DirtyLinks::take`] returned, for its memory.
    pub(crate) fn recycle(&mut self, mut ids: Vec<LinkId>) {
        ids.clear();
        if ids.capacity() > self.spare.capacity() {
            self.spare = ids;
        }
    }
}

impl DirtyLinks {
    /// Calls `each` for every link of `owner` marked since the last call,
    /// once each and in id order ([`DirtyLinks::take`]), reusing the memory
    /// ([`DirtyLinks::recycle`]): a transport's flush. `dirty` finds the
    /// marks in `owner`, which `each` may change (links marked meanwhile
    /// wait for the next call).
    pub(crate) fn flush_each<T>(
        owner: &mut T,
        dirty: impl Fn(&mut T) -> &mut DirtyLinks,
        mut each: impl FnMut(&mut T, LinkId),
    ) {
        if dirty(owner).is_empty() {
            return;
        }
        let ids = dirty(owner).take();
        for &id in &ids {
            each(owner, id);
        }
        dirty(owner).recycle(ids);
    }
}

impl Extend<LinkId> for DirtyLinks {
    fn extend<I: IntoIterator<Item = LinkId>>(&mut self, ids: I) {
        self.marked.extend(ids);
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
        let ids = d.take();
        assert_eq!(ids, vec![LinkId(1), LinkId(2), LinkId(3)]);
        d.push(LinkId(5));
        d.recycle(ids);
        assert_eq!(d.take(), vec![LinkId(5)]);
        assert!(d.take().is_empty());
    }
}
