//! What completes on the verbs transport's CQ: sends done, receives
//! (units handed up in order, held while reading is paused), credits and
//! receive slots returned, and rendezvous reads started, pumped and done.

use super::*;

impl RdmaTransport {
    pub(super) fn on_completion(&mut self, wc: &WorkCompletion, events: &mut Vec<TransportEvent>) {
        let (id, kind, index) = wr::parts(wc.wr_id());
        if kind == WrKind::Recv {
            let link = self.qpn_links.get(&wc.qp_num()).copied();
            if !wc.is_success() || wc.opcode() != WcOpcode::Recv {
                // A shared receive flushed or failed on a QP in error: the
                // chunk goes back to the queue; the QP's link has failed.
                self.repost(index);
                if let Some(link) = link {
                    self.counters.failed_completions += 1;
                    let why = LinkFailure::Completion {
                        status: wc.status() as i32,
                        detail: format!("verbs receive: {}", wc.status_str()),
                    };
                    self.fail(link, why, events);
                }
                return;
            }
            match link {
                Some(link) if self.links.contains_key(&link) => {
                    if let Err(e) = self.on_recv(link, index, wc.byte_len() as usize, events) {
                        match e {
                            RecvError::Corrupt(fe) => {
                                self.drop_link(link);
                                events
                                    .push(TransportEvent::Corrupt(link, ProtocolError::Frame(fe)));
                            }
                            RecvError::Fail(why) => self.fail(link, why, events),
                        }
                    }
                }
                // A message for a link released meanwhile.
                _ => self.repost(index),
            }
            return;
        }
        if !self.links.contains_key(&id) {
            if self.closing.contains_key(&id) {
                self.on_closing_completion(id, wc);
            }
            // Else a completion of a link already released: its chunks went
            // back then.
            return;
        }
        if !wc.is_success() {
            self.counters.failed_completions += 1;
            let why = match wc.ok() {
                Err(e) => e.to_string(),
                Ok(_) => "work completion failed".into(),
            };
            let why = LinkFailure::Completion {
                status: wc.status() as i32,
                detail: format!("verbs: {why}"),
            };
            self.fail(id, why, events);
            return;
        }
        match kind {
            WrKind::Send => self.on_send_done(id, index),
            WrKind::Read => self.on_read_done(id, index, events),
            WrKind::Recv => {}
        }
    }

    /// Posts the receive chunks the application let go of again, and gives
    /// their credits back to their links' peers.
    pub(super) fn take_returns(&mut self) -> bool {
        let back = self.loans.returns.take();
        if back.is_empty() {
            return false;
        }
        self.loans.lent -= back.len() as u64;
        for (link, chunk) in back {
            self.repost(chunk);
            if let Some(l) = self.links.get_mut(&link) {
                l.lent -= 1;
                l.grant_one();
                if l.should_return_credits() {
                    self.backlog.dirty.push(link);
                }
            } else if let Some((l, _)) = self.closing.get_mut(&link) {
                // Its release returns the slot with the rest of its share.
                l.lent -= 1;
            } else if let Some(dev) = self.dev.as_mut() {
                // The link is gone; its release kept this slot back.
                dev.return_share(1);
            }
        }
        true
    }

    /// Gives receive chunk `c` back to the shared receive queue.
    pub(super) fn repost(&mut self, c: u32) {
        if let Some(dev) = self.dev.as_mut() {
            if let Err(e) = dev.post_recv(c) {
                // The queue is one slot short from now on; shares still fit
                // (RNR retry covers the gap) but say so.
                tracing::error!(error = %e, chunk = c, "reposting a receive failed");
                dev.rx.put(c);
            }
        }
    }

    pub(super) fn on_send_done(&mut self, id: LinkId, chunk: u32) {
        let dev = self.dev.as_mut().expect("device");
        let Some(l) = self.links.get_mut(&id) else {
            return;
        };
        if let Some(pos) = l.send.inflight.iter().position(|&c| c == chunk) {
            l.send.inflight.swap_remove(pos);
            dev.tx.put(chunk);
        }
        if l.flow.credit_chunk == Some(chunk) {
            l.flow.credit_chunk = None;
        }
        // A send completion frees a chunk and a send-queue slot: this link
        // may go on, and so may the links that found the pool empty.
        if !l.send.queue.is_empty() || l.flow.to_grant > 0 {
            self.backlog.dirty.push(id);
        }
        self.backlog.dirty.extend(self.backlog.tx_waiting.drain(..));
    }

    pub(super) fn on_recv(
        &mut self,
        id: LinkId,
        chunk: u32,
        len: usize,
        events: &mut Vec<TransportEvent>,
    ) -> Result<(), RecvError> {
        self.counters.recvs += 1;
        let l = self.links.get_mut(&id).expect("caller checked");
        if !l.up {
            // An acceptor whose QP is ready may see the connector's first send
            // before the ready byte / Established event.
            if !l.outgoing && (Self::oob_may_accept_on_recv(l) || Self::cm_may_accept_on_recv(l)) {
                self.mark_up(id, events);
            } else {
                self.repost(chunk);
                return Err(RecvError::protocol("RDMA: data before the link was set up"));
            }
        }
        let dev = self.dev.as_mut().expect("device");
        let limits = self.params.limits;
        let l = self.links.get_mut(&id).expect("caller checked");
        if l.hold_tx {
            // iWARP: the connector has spoken; we may send now.
            l.hold_tx = false;
            self.backlog.dirty.push(id);
        }
        if len < HDR {
            self.repost(chunk);
            return Err(RecvError::protocol(format!(
                "RDMA: runt receive of {len} bytes"
            )));
        }
        let data = dev.rx.bytes(chunk, len);
        let Some(kind) = Kind::from_u8(data[0]) else {
            let k = data[0];
            self.repost(chunk);
            return Err(RecvError::protocol(format!("RDMA: unknown send kind {k}")));
        };
        let more = data[1] & link::MORE != 0;
        let granted = u32::from_le_bytes([data[4], data[5], data[6], data[7]]);
        l.flow.credits = l.flow.credits.saturating_add(granted);
        let payload = &data[HDR..];
        let mut unit = None;
        let mut lent = false;
        let mut read = None;
        let mut read_done = None;
        let mut bad = None;
        match kind {
            Kind::Credit => {}
            Kind::Banner | Kind::Frame => {
                if l.recv.reasm.len() + payload.len() > MAX_UNIT {
                    bad = Some(format!("RDMA: unit larger than {MAX_UNIT} bytes"));
                } else if more || !l.recv.reasm.is_empty() {
                    l.recv.reasm.extend_from_slice(payload);
                    if !more {
                        unit = Some(l.recv.reasm.split().freeze());
                    }
                } else if payload.len() >= LEND_MIN && l.lent < l.share / 2 {
                    // A whole unit in one chunk: lent, not copied; the chunk
                    // and its credit come back when the message is dropped.
                    // At most half a link's slots are lent: the application
                    // may hold messages until the peer sends something (an
                    // ack, say), and the peer needs credits to send it.
                    // Small units are copied: cheap, and their credit rides
                    // on the very next send (an ack) instead of trailing it.
                    unit = Some(dev.rx.lend(chunk, HDR..len, id, &self.loans.returns));
                    l.lent += 1;
                    lent = true;
                    self.counters.rx_lent_total += 1;
                } else {
                    unit = Some(l.recv.arena.copy(payload));
                }
            }
            Kind::ReadReq => match ReadDesc::decode(payload) {
                // The inline bytes are copied: the chunk is reposted below.
                Some((d, inline)) => read = Some((d, inline.to_vec())),
                None => bad = Some("RDMA: malformed read request".into()),
            },
            Kind::ReadDone => match <[u8; 4]>::try_from(payload) {
                Ok(t) => read_done = Some(u32::from_le_bytes(t)),
                Err(_) => bad = Some("RDMA: malformed read completion".into()),
            },
        }
        if lent {
            self.loans.lent += 1;
        } else {
            // The chunk is copied out: it goes back to the queue right away.
            self.repost(chunk);
        }
        if let Some(why) = bad {
            return Err(RecvError::protocol(why));
        }
        let l = self.links.get_mut(&id).expect("caller checked");
        if kind != Kind::Credit && !lent {
            l.grant_one();
        }
        if kind != Kind::Credit {
            l.flow.peer_credits = l.flow.peer_credits.saturating_sub(1);
        }
        if granted > 0 || l.should_return_credits() {
            self.backlog.dirty.push(id);
        }
        if let Some(token) = read_done {
            if let Some(lent) = l.rdv.out.remove(&token) {
                l.rdv.out_bytes -= lent.body.len();
            }
            return Ok(());
        }
        if let Some((desc, inline)) = read {
            return self.start_read(id, desc, &inline, events);
        }
        let Some(bytes) = unit else {
            return Ok(());
        };
        let inbound = match kind {
            Kind::Banner => {
                let raw: [u8; msgr_proto::banner::BANNER_LEN] =
                    bytes.as_ref().try_into().map_err(|_| {
                        RecvError::protocol(format!("RDMA: banner of {} bytes", bytes.len()))
                    })?;
                Inbound::Banner(raw)
            }
            _ => Inbound::decode_exact(bytes, &limits).map_err(RecvError::Corrupt)?,
        };
        self.deliver(id, RxItem::Ready(inbound), events);
        Ok(())
    }

    /// Hands a received unit to the worker, or holds it while reading is
    /// paused or an earlier rendezvous is still being read.
    pub(super) fn deliver(&mut self, id: LinkId, item: RxItem, events: &mut Vec<TransportEvent>) {
        let Some(l) = self.links.get_mut(&id) else {
            return;
        };
        match item {
            RxItem::Ready(u) if !l.paused && l.recv.held.is_empty() => {
                events.push(TransportEvent::Received(id, u))
            }
            item => l.recv.held.push_back(item),
        }
    }

    /// Delivers held units from the front until a read in flight (or pause).
    pub(super) fn drain_held(&mut self, id: LinkId, events: &mut Vec<TransportEvent>) -> bool {
        let Some(l) = self.links.get_mut(&id) else {
            return false;
        };
        let mut any = false;
        while !l.paused {
            match l.recv.held.front() {
                Some(RxItem::Ready(_)) => {
                    if let Some(RxItem::Ready(u)) = l.recv.held.pop_front() {
                        events.push(TransportEvent::Received(id, u));
                        any = true;
                    }
                }
                _ => break,
            }
        }
        any
    }

    /// A rendezvous announced: register a buffer and read the frame into it.
    pub(super) fn start_read(
        &mut self,
        id: LinkId,
        desc: ReadDesc,
        inline: &[u8],
        events: &mut Vec<TransportEvent>,
    ) -> Result<(), RecvError> {
        let max = self.params.limits.max_frame;
        let Some(total) = split::placed_len(desc.len, inline.len(), u64::from(desc.at), max) else {
            return Err(RecvError::protocol(format!(
                "RDMA: rendezvous of {} bytes at {} among {} inline (frame limit {max})",
                desc.len,
                desc.at,
                inline.len()
            )));
        };
        // The unit: the inline bytes with a gap at `at` that the read fills.
        let (at, total) = (desc.at as usize, total as usize);
        let mut buf = self.read_sink(total)?;
        buf[..at].copy_from_slice(&inline[..at]);
        buf[at + desc.len as usize..total].copy_from_slice(&inline[at..]);
        let slot = self.add_read_op(id, buf, (total, desc), None);
        let l = self.links.get_mut(&id).expect("caller checked");
        l.recv.held.push_back(RxItem::Reading(slot));
        self.pump_reads(id, events);
        Ok(())
    }

    /// A registered sink of at least `len` bytes: one back on the shelf,
    /// else a new one.
    pub(super) fn read_sink(&mut self, len: usize) -> Result<MemoryRegion<Vec<u8>>, RecvError> {
        match self.rdv_memory.sinks.take(len) {
            Some(sink) => {
                self.counters.read_sinks_reused += 1;
                Ok(sink)
            }
            None => self.register_sink(len),
        }
    }

    /// Files a one-sided operation of `id` (its sink `buf`, the unit's
    /// length and where it goes at the peer) under the link's next read
    /// slot, for `pump_reads` to post; the slot. A read takes the next
    /// `SimulatedFault::HungRead` the link was dealt.
    pub(super) fn add_read_op(
        &mut self,
        id: LinkId,
        buf: MemoryRegion<Vec<u8>>,
        (len, desc): (usize, ReadDesc),
        user: Option<UserOp>,
    ) -> u32 {
        let l = self.links.get_mut(&id).expect("caller checked");
        let slot = l.rdv.next_read;
        l.rdv.next_read = (l.rdv.next_read + 1) & 0x00ff_ffff;
        let hung = !user.is_some_and(|u| u.write) && l.rdv.reads_to_hang > 0;
        if hung {
            l.rdv.reads_to_hang -= 1;
            self.counters.simulated_hung_reads += 1;
        }
        l.rdv.reads.insert(
            slot,
            ReadOp {
                buf,
                len,
                desc,
                posted: 0,
                pending: 0,
                deadline: Instant::now() + self.params.pools.read_timeout,
                hung,
                user,
            },
        );
        slot
    }

    /// A new read sink of `len` bytes, registered. If registering fails
    /// (RLIMIT_MEMLOCK, say), the idle sinks are unpinned and it is tried
    /// once more.
    pub(super) fn register_sink(&self, len: usize) -> Result<MemoryRegion<Vec<u8>>, RecvError> {
        let dev = self.dev.as_ref().expect("device");
        // iWARP read sinks must be remotely writable (the read response is a
        // write into them).
        let access = Access {
            local_write: true,
            remote_write: dev.ctx.is_iwarp(),
            remote_read: false,
            remote_atomic: false,
        };
        MemoryRegion::try_register(&dev.pd, vec![0u8; len], access)
            .or_else(|(_, unit)| {
                self.rdv_memory.sinks.clear();
                MemoryRegion::register(&dev.pd, unit, access)
            })
            .map_err(|e| {
                RecvError::Fail(LinkFailure::Io {
                    kind: std::io::ErrorKind::Other,
                    detail: format!("RDMA: registering a read buffer: {e}"),
                })
            })
    }

    /// Posts read pieces of the link's rendezvous, at most [`MAX_READS`] in flight.
    pub(super) fn pump_reads(&mut self, id: LinkId, events: &mut Vec<TransportEvent>) {
        let Some(l) = self.links.get_mut(&id) else {
            return;
        };
        let Some(qp) = l.qp.as_ref() else {
            return;
        };
        let mut in_flight: u32 = l.rdv.reads.values().map(|r| r.pending).sum();
        let mut slots: Vec<u32> = l.rdv.reads.keys().copied().collect();
        slots.sort_unstable();
        let mut err = None;
        'ops: for slot in slots {
            let op = l.rdv.reads.get_mut(&slot).expect("listed");
            while op.posted < op.desc.len {
                if in_flight >= MAX_READS {
                    break 'ops;
                }
                let off = op.posted;
                let n = (op.desc.len - off).min(READ_PIECE);
                let to = u64::from(op.desc.at) + off;
                let write = op.user.is_some_and(|u| u.write);
                let res = op.buf.sge(to as usize..(to + n) as usize).and_then(|sge| {
                    let remote = RemoteAddr {
                        addr: op.desc.addr + off,
                        rkey: op.desc.rkey,
                    };
                    let what = if write {
                        SendOp::RdmaWrite(remote)
                    } else {
                        SendOp::RdmaRead(remote)
                    };
                    qp.post_send(&[SendWr::new(
                        wr::of_link(id, WrKind::Read, slot),
                        what,
                        &[sge],
                    )])
                });
                if let Err(e) = res {
                    let what = if write { "write" } else { "read" };
                    err = Some(LinkFailure::Io {
                        kind: std::io::ErrorKind::Other,
                        detail: format!("RDMA: post {what}: {e}"),
                    });
                    break 'ops;
                }
                op.posted += n;
                op.pending += 1;
                in_flight += 1;
            }
        }
        if let Some(why) = err {
            self.fail(id, why, events);
        }
    }

    pub(super) fn on_read_done(&mut self, id: LinkId, slot: u32, events: &mut Vec<TransportEvent>) {
        let limits = self.params.limits;
        let iwarp = self.dev.as_ref().is_some_and(|d| d.ctx.is_iwarp());
        let Some(l) = self.links.get_mut(&id) else {
            return;
        };
        let Some(op) = l.rdv.reads.get_mut(&slot) else {
            return;
        };
        if op.hung {
            // Simulated: the responder never answered. The op stays, with
            // its piece still counted in flight, until the deadline fails
            // the link and `release` destroys the QP before the buffer.
            return;
        }
        op.pending -= 1;
        if op.pending > 0 || op.posted < op.desc.len {
            self.pump_reads(id, events);
            return;
        }
        let op = l.rdv.reads.remove(&slot).expect("present");
        if let Some(UserOp { token, write }) = op.user {
            if write {
                self.counters.user_writes += 1;
                self.counters.user_write_bytes += op.desc.len;
                self.rdv_memory.sinks.put(op.buf);
                events.push(TransportEvent::RmaWrite {
                    link: id,
                    token,
                    result: Ok(()),
                });
            } else {
                self.counters.user_reads += 1;
                self.counters.user_read_bytes += op.desc.len;
                let bytes = self.read_sink_bytes(op.buf, op.len, iwarp);
                events.push(TransportEvent::RmaRead {
                    link: id,
                    token,
                    result: Ok(bytes),
                });
            }
            self.pump_reads(id, events);
            return;
        }
        self.counters.rendezvous_read += 1;
        self.counters.rendezvous_read_bytes += op.desc.len;
        // Tell the sender it may release its buffer (ahead of queued data:
        // it carries no unit, only frees memory).
        l.send.queue.push_front(link::Part::whole(
            Kind::ReadDone,
            false,
            Bytes::copy_from_slice(&op.desc.token.to_le_bytes()),
        ));
        self.backlog.dirty.push(id);
        let bytes = self.read_sink_bytes(op.buf, op.len, iwarp);
        let l = self.links.get_mut(&id).expect("present");
        let inbound = match Inbound::decode_exact(bytes, &limits) {
            Ok(unit) => unit,
            Err(fe) => {
                self.drop_link(id);
                events.push(TransportEvent::Corrupt(id, ProtocolError::Frame(fe)));
                return;
            }
        };
        if let Some(item) = l
            .recv
            .held
            .iter_mut()
            .find(|i| matches!(i, RxItem::Reading(s) if *s == slot))
        {
            *item = RxItem::Ready(inbound);
        }
        self.drain_held(id, events);
        self.pump_reads(id, events);
    }

    /// The first `len` bytes of a read sink whose read completed, for the
    /// application.
    pub(super) fn read_sink_bytes(
        &self,
        buf: MemoryRegion<Vec<u8>>,
        len: usize,
        iwarp: bool,
    ) -> Bytes {
        if iwarp {
            // An iWARP sink is remotely writable and the peer learned its
            // key (the read response is a write into it): deregister it
            // before the application sees its bytes.
            let mut unit = buf.into_inner();
            unit.truncate(len);
            Bytes::from(unit)
        } else {
            // Only readable locally: it stays registered and goes back to
            // the shelf when the bytes' last handle drops.
            self.rdv_memory.sinks.lend(buf, len)
        }
    }
}
