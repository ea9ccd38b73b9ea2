//! What arrives on the RDM transport's endpoints: a received message
//! dispatched by its kind, data pieces handed up in order (held while
//! reading is paused or they overtook earlier ones), receive slots reposted
//! with their credits, and rendezvous units read or written into a grant.

use super::*;

impl RdmTransport {
    /// Handles one received message in slot `slot` of port `pidx`.
    pub(super) fn receive(
        &mut self,
        pidx: usize,
        slot: usize,
        len: usize,
        events: &mut Vec<TransportEvent>,
    ) {
        let Some(port) = self.ports.get_mut(pidx).and_then(Option::as_mut) else {
            return;
        };
        let msg = port.ep.recv_done(slot, len);
        let Some(h) = read_header(msg) else {
            tracing::debug!(len, "RDM message shorter than its header, dropped");
            return self.repost(pidx, slot);
        };
        let body = Body::of(h.kind, msg.get(HEADER_LEN..).unwrap_or(&[]));
        if let Body::Hello(body) = body {
            self.repost(pidx, slot);
            return self.hello(pidx, &body, h.seq, events);
        }
        let id = LinkId(h.dest.link);
        let Some(link) = self.links.get_mut(&id) else {
            tracing::debug!(
                link = id.0,
                kind = h.kind,
                "RDM message for no link, dropped"
            );
            return self.repost(pidx, slot);
        };
        if link.port != pidx || link.cookie != h.dest.cookie {
            tracing::debug!(
                link = id.0,
                "RDM message for an earlier link of this id, dropped"
            );
            return self.repost(pidx, slot);
        }
        link.common.last_heard = self.shared.now;
        link.flow.credits = link
            .flow
            .credits
            .saturating_add(u32::from(h.credits))
            .min(link.flow.peer_window);
        if h.credits > 0 && link.has_output() {
            self.out.dirty.push(id);
        }
        match h.kind {
            WELCOME => {
                let remote = match body {
                    Body::Welcome(w) => w,
                    _ => None,
                };
                self.repost(pidx, slot);
                let Some(link) = self.links.get_mut(&id) else {
                    return;
                };
                match remote {
                    Some(w) if link.remote.is_none() && link.accepted.is_none() => {
                        link.remote = Some(w.remote);
                        link.common.peer_rndv = w.rndv;
                        link.common.peer_late = w.late;
                        link.flow.peer_window = w.window;
                        link.flow.credits = w.window;
                        link.peer_bell =
                            w.bell.and_then(|b| open_peer_bell(self.bells.as_ref(), b));
                        events.push(TransportEvent::Connected(id));
                        self.out.dirty.push(id);
                        // Data that overtook the WELCOME.
                        self.hand_up(id, events);
                    }
                    _ => {
                        let why = "unexpected or short WELCOME";
                        self.fail(id, LinkFailure::Protocol(why.into()), events)
                    }
                }
            }
            DATA_MORE | DATA_LAST | RNDV => {
                if h.seq < link.rx_seq
                    || h.seq - link.rx_seq >= u64::from(link.flow.window)
                    || link.held.contains(h.seq)
                {
                    let why = format!(
                        "data piece {} outside the window {}..{}",
                        h.seq,
                        link.rx_seq,
                        link.rx_seq + u64::from(link.flow.window)
                    );
                    self.repost(pidx, slot);
                    return self.fail(id, LinkFailure::Protocol(why), events);
                }
                link.held.insert(h.seq, (slot, len));
                self.hand_up(id, events);
            }
            KEEP => self.repost(pidx, slot),
            CHALLENGE => {
                self.repost(pidx, slot);
                let Some(link) = self.links.get_mut(&id) else {
                    return;
                };
                // Only a link still waiting for its WELCOME takes one: a
                // challenge to any other is the answer to someone's copy of
                // its HELLO (see `challenge`), and changes nothing.
                if link.remote.is_none() && link.accepted.is_none() && h.seq != 0 {
                    link.setup.token = h.seq;
                    link.setup.need_hello = true;
                    self.out.dirty.push(id);
                } else {
                    tracing::debug!(link = id.0, "CHALLENGE for a link not connecting, dropped");
                }
            }
            RNDV_DONE => {
                self.repost(pidx, slot);
                let id_done = body.done();
                let (Some(link), Some(port)) = (
                    self.links.get_mut(&id),
                    self.ports.get_mut(pidx).and_then(Option::as_mut),
                ) else {
                    return;
                };
                match link.common.exposures.answered(id_done, port.ep.rma()) {
                    Ok(()) => self.out.dirty.push(id),
                    Err(e) => self.fail(id, LinkFailure::Protocol(e.to_string()), events),
                }
            }
            RNDV_GRANT => {
                self.repost(pidx, slot);
                let grant = match body {
                    Body::Grant(g) => g,
                    _ => None,
                };
                self.grant_received(id, grant, events);
            }
            RNDV_WRITTEN => {
                self.repost(pidx, slot);
                let written = self
                    .links
                    .get(&id)
                    .map(|l| l.common.receiving.written(body.done()));
                match written {
                    Some(Ok(context)) => self.rendezvous_arrived(pidx, id, context, None, events),
                    Some(Err(e)) => self.fail(id, LinkFailure::Protocol(e.to_string()), events),
                    None => {}
                }
            }
            RNDV_EPILOGUE => {
                self.repost(pidx, slot);
                let Some(link) = self.links.get_mut(&id) else {
                    return;
                };
                let words = match &body {
                    Body::Epilogue(words) => words.bytes(),
                    _ => &[],
                };
                let unit = link.common.receiving.epilogue_arrived(
                    words,
                    &mut link.common.reasm,
                    &self.shared.limits,
                    &mut self.shared.rndv_counters,
                );
                match unit {
                    Ok(None) => {}
                    Ok(Some(unit)) => self.unit_arrived(id, unit, events),
                    Err(e) => self.unit_arrived(id, Err(e), events),
                }
            }
            CLOSE => {
                self.repost(pidx, slot);
                if let Some(l) = self.links.get_mut(&id) {
                    // The peer's end is gone: no CLOSE back.
                    l.remote = None;
                }
                let why = "link closed by peer (CLOSE)";
                self.fail(id, LinkFailure::ClosedByPeer(why.into()), events);
            }
            other => {
                self.repost(pidx, slot);
                let why = format!("unknown RDM message kind {other}");
                self.fail(id, LinkFailure::Protocol(why), events);
            }
        }
    }

    /// Hands up `id`'s held data pieces that are next in order, unless
    /// reading is paused or the link is not set up yet.
    pub(super) fn hand_up(&mut self, id: LinkId, events: &mut Vec<TransportEvent>) -> bool {
        let mut any = false;
        while let Some(link) = self.links.get_mut(&id) {
            if link.common.paused
                || link.common.frozen
                || link.remote.is_none()
                || link.common.receiving.reading.is_some()
            {
                break;
            }
            let Some((slot, len)) = link.held.take(link.rx_seq) else {
                break;
            };
            link.rx_seq += 1;
            any = true;
            self.data(id, slot, len, events);
        }
        any
    }

    pub(super) fn repost(&mut self, pidx: usize, slot: usize) {
        if let Some(port) = self.ports.get_mut(pidx).and_then(Option::as_mut) {
            if let Err(e) = port.ep.post_recv(slot, context(pidx, true, slot)) {
                tracing::warn!(error = %e, "repost of an RDM receive failed");
            }
        }
    }

    /// Reposts the receive slots of the data pieces handled since the last
    /// call and owes their credits back. Deferred from `data` to the pass's
    /// flush (and the next poll): the receive a 64 B request frees is not
    /// needed before the reply to it is posted, which then goes ~50 ns
    /// sooner. A credit is owed only for a slot posted again, so the peer
    /// never sends into one that is not.
    pub(super) fn repost_handled(&mut self) {
        if self.handled.is_empty() {
            return; // every idle pass of a spinning worker comes here
        }
        // Drained, not dropped: its memory serves the next pass.
        let mut handled = std::mem::take(&mut self.handled);
        for (pidx, slot, id) in handled.drain(..) {
            self.repost(pidx, slot);
            let Some(link) = self.links.get_mut(&id) else {
                continue;
            };
            link.flow.to_return += 1;
            if link.keep_due() {
                link.flow.need_keep = true;
                self.out.dirty.push(id);
            }
        }
        handled.append(&mut self.handled);
        self.handled = handled;
    }

    /// A data piece for `id` in `slot`: joined and handed up; the slot is
    /// reposted and its credit owed back by `repost_handled`.
    pub(super) fn data(
        &mut self,
        id: LinkId,
        slot: usize,
        len: usize,
        events: &mut Vec<TransportEvent>,
    ) {
        let Some(link) = self.links.get_mut(&id) else {
            return;
        };
        let pidx = link.port;
        let Some(port) = self.ports.get_mut(pidx).and_then(Option::as_mut) else {
            return;
        };
        let msg = port.ep.recv_done(slot, len);
        let kind = msg.first().copied();
        let body = msg.get(HEADER_LEN..).unwrap_or(&[]);
        let outcome = if kind == Some(RNDV) {
            // The unit comes by fi_read or by the peer's write into a grant;
            // later pieces wait for it (hand_up). Out of the slot: the read
            // or grant borrows the endpoint.
            let desc = OutOfSlot::<{ rendezvous::DESC_MAX }>::new(body);
            let (ours, limits, counters) = (
                self.shared.rndv,
                &self.shared.limits,
                &mut self.shared.rndv_counters,
            );
            let offer =
                Self::take_offer(id, link, (pidx, port), desc.bytes(), ours, limits, counters);
            offer.map(|owes_grant| {
                if owes_grant {
                    self.out.dirty.push(id);
                }
                None
            })
        } else {
            link.common
                .reasm
                .push(kind == Some(DATA_LAST), body, &self.shared.limits)
        };
        self.handled.push((pidx, slot, id));
        match outcome {
            Ok(Some(unit)) => events.push(TransportEvent::Received(id, unit)),
            Ok(None) => {}
            Err(PieceError::Corrupt(e)) => {
                self.drop_link(id);
                events.push(TransportEvent::Corrupt(id, ProtocolError::Frame(e)));
            }
            Err(PieceError::Malformed(why)) => self.fail(
                id,
                LinkFailure::Protocol(format!("malformed message: {why}")),
                events,
            ),
            Err(PieceError::Failed(why)) => self.fail(id, why, events),
        }
    }

    /// Takes the unit a RNDV piece of `link` (`id`) offers (`desc`, out of
    /// its slot; `ours`: how this end moves units): read from the link's
    /// peer, or granted a buffer on the port — none once too many grants
    /// were abandoned there ([`ABANDONED_MAX`]). Returns whether a grant is
    /// owed.
    pub(super) fn take_offer(
        id: LinkId,
        link: &mut RdmLink,
        (pidx, port): (usize, &mut Port),
        desc: &[u8],
        ours: Option<RmaOp>,
        limits: &FrameLimits,
        counters: &mut Counters,
    ) -> Result<bool, PieceError> {
        let d =
            rendezvous::check_offer(desc, limits.max_frame, !link.common.reasm.is_idle(), ours)?;
        let abandoned = port.ep.rma().abandoned_bytes();
        if d.x.write && abandoned >= ABANDONED_MAX {
            return Err(PieceError::Malformed(format!(
                "rendezvous write refused: {abandoned} bytes of grants abandoned on this endpoint"
            )));
        }
        let context = read_context(pidx, port.next_read);
        port.next_read = port.next_read.wrapping_add(1);
        let Some(mut ep) = port.aimed_at(link.peer) else {
            return Err(PieceError::Malformed("rendezvous from no peer".into()));
        };
        let owes_grant = link
            .common
            .receiving
            .take_offer(&d, &mut ep, context, counters)?;
        if !owes_grant {
            port.reads.insert(context, id);
        }
        Ok(owes_grant)
    }

    /// An fi_read completed: the rendezvous unit is handed up, the sender
    /// told (RNDV_DONE), and the pieces that waited for it follow.
    pub(super) fn read_complete(
        &mut self,
        pidx: usize,
        c: &Completion,
        events: &mut Vec<TransportEvent>,
    ) {
        let Some(port) = self.ports.get_mut(pidx).and_then(Option::as_mut) else {
            return;
        };
        match port.reads.get(&c.context) {
            Some(&id) => self.rendezvous_arrived(pidx, id, c.context, c.error, events),
            None => drop(port.ep.rma().read_done(c.context, false)),
        }
    }

    /// Link `id`'s rendezvous unit is whole (read or written, its epilogue
    /// in place): handed up, its answer sent, and the pieces that waited
    /// for it follow; or the link fails.
    pub(super) fn unit_arrived(
        &mut self,
        id: LinkId,
        unit: Result<Inbound, PieceError>,
        events: &mut Vec<TransportEvent>,
    ) {
        if !reassembly::report_unit(id, unit, events) {
            self.drop_link(id);
            return;
        }
        self.out.dirty.push(id);
        self.hand_up(id, events);
    }

    /// The unit of link `id`'s rendezvous under `context` on port `pidx`
    /// arrived (its read completed, with `error` if it failed, or the peer
    /// said it wrote it into our grant): it is handed up, the sender told
    /// (RNDV_DONE), and the pieces that waited for it follow.
    pub(super) fn rendezvous_arrived(
        &mut self,
        pidx: usize,
        id: LinkId,
        context: u64,
        error: Option<(i32, &'static str)>,
        events: &mut Vec<TransportEvent>,
    ) {
        let Some(port) = self.ports.get_mut(pidx).and_then(Option::as_mut) else {
            return;
        };
        // The link may have gone while its read was in flight: the
        // endpoint, which outlives it, frees the buffer all the same.
        let link = self.links.get_mut(&id).map(|l| &mut l.common);
        let landed = self.shared.landed(link, port.ep.rma(), context, error);
        if landed.over {
            port.reads.remove(&context);
        }
        if let Some(unit) = landed.unit {
            self.unit_arrived(id, unit, events);
        }
    }

    /// The peer granted a buffer for our unit (`grant`, from a RNDV_GRANT):
    /// the unit is written into it, and the peer told so right behind the
    /// write (RNDV_WRITTEN).
    pub(super) fn grant_received(
        &mut self,
        id: LinkId,
        grant: Option<(u32, Landing)>,
        events: &mut Vec<TransportEvent>,
    ) {
        let Some(link) = self.links.get_mut(&id) else {
            return;
        };
        let pidx = link.port;
        let Some(port) = self.ports.get_mut(pidx).and_then(Option::as_mut) else {
            return;
        };
        let context = write_context(pidx, port.next_read);
        port.next_read = port.next_read.wrapping_add(1);
        let Some(mut to) = port.aimed_at(link.peer) else {
            let why = "rendezvous grant from no peer";
            return self.fail(id, LinkFailure::Protocol(why.into()), events);
        };
        let counters = &mut self.shared.rndv_counters;
        match link
            .common
            .exposures
            .write_granted(grant, &mut to, |_| context, counters)
        {
            Ok(()) => {
                port.reads.insert(context, id);
                self.out.dirty.push(id);
            }
            Err(why) => self.fail(id, why, events),
        }
    }

    /// One of our writes completed: its unit may go once the peer answers
    /// (RNDV_DONE), or now if its link went; a failed write fails the link.
    pub(super) fn write_complete(
        &mut self,
        pidx: usize,
        c: &Completion,
        events: &mut Vec<TransportEvent>,
    ) {
        let Some(port) = self.ports.get_mut(pidx).and_then(Option::as_mut) else {
            return;
        };
        port.ep.rma().write_done(c.context);
        let id = port.reads.remove(&c.context);
        if let (Some(id), Some(error)) = (id, c.error) {
            self.fail(id, completion_failure("fi_write", error), events);
        }
    }
}
