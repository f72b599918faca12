//! The rendezvous protocols: exposures of request buffers, one-sided copies and their
//! completions (`handle_op`), and the RTS/CTS/DATA/FIN exchange on the receiving side of it.

use super::requests::{Dir, ExposeFor, Matching, OwnCopy, ReqKind, SendWait};
use super::types::{op_id, split_op, Action, OpKind, OpOutcome, Payload, ReqId, TagMatch};
use super::{am_of, Engine};
use crate::error::{Error, Rank, Result};
use crate::header::{Header, PacketKind};
use crate::policy::Protocol;
use crate::transport::{MemHandle, OpId, PeerAccess, Region, RegionMut, RemoteKey};

impl Engine {
    /// What became of the channel work `op` of an [`Action`].
    #[inline]
    pub fn handle_op(&mut self, op: OpId, outcome: OpOutcome) {
        match outcome {
            OpOutcome::Sent => self.op_sent(op),
            OpOutcome::Registered(handle) => self.op_exposed(op, handle),
            OpOutcome::Ordered => self.op_ordered(op),
            OpOutcome::Done(result) => self.op_done(op, result),
        }
    }

    /// A send action with `op` left the process.
    #[inline]
    pub(super) fn op_sent(&mut self, op: OpId) {
        self.touched();
        if let Some((id, OpKind::Sent)) = split_op(op) {
            self.count_down(id);
        }
    }

    /// An `Expose` action finished. Call it before polling the next action: what follows from
    /// the key takes the exposure's place in the action order (so an RTS keeps its message's
    /// place among the sends to its peer).
    pub(super) fn op_exposed(&mut self, op: OpId, handle: Result<MemHandle>) {
        self.touched();
        let before = self.actions.len();
        self.exposed(op, handle);
        let added = self.actions.len() - before;
        self.actions.rotate_right(added);
    }

    pub(super) fn exposed(&mut self, op: OpId, handle: Result<MemHandle>) {
        let Some((id, OpKind::Exposed)) = split_op(op) else { return };
        let Some(req) = self.reqs.get_mut(id) else { return };
        if req.result.is_some() {
            // It failed while its exposure was on the way: no peer got the key; end it.
            let was_for = req.expose_for.take();
            if let Ok(handle) = handle {
                self.actions.push_back(Action::Deregister { channel: req.channel, handle, written: 0..0 });
            }
            if was_for == Some(ExposeFor::Cts) {
                // A receive that matched an RTS and was to answer with its CTS: the sender
                // waits for that or a FIN to release its buffer; a truncation FIN ends its send.
                self.release_sender(id);
            }
            return;
        }
        let handle = match handle {
            Ok(h) => h,
            Err(e) => return self.exposure_refused(id, e),
        };
        let key = *handle.key();
        req.own_key = Some(Box::new(handle));
        match req.expose_for.take() {
            Some(ExposeFor::Rts) => self.send_rts(id, 0, Payload::Key(key)),
            Some(ExposeFor::RtsAfterRtr) => self.send_rts_after_rtr(id, Some(key)),
            Some(ExposeFor::Cts) => self.send_cts(id, key),
            Some(ExposeFor::Rtr) if matches!(req.kind, ReqKind::Recv(Matching::Posted { .. })) => {
                req.rtr_sent = true;
                let mut hdr = Header::new(PacketKind::Rtr);
                hdr.flags = if req.tag == TagMatch::Any { Header::ANY_TAG } else { 0 };
                (hdr.tag, hdr.ctx, hdr.seq, hdr.len, hdr.rreq, hdr.offset) =
                    (req.tag_value(), req.ctx, req.rtr_place, req.cap as u64, id.wire(), req.rtr_seq as u64);
                let (to, am) = (req.peer, am_of(&self.peers, req.peer));
                self.actions.push_back(Action::Send { channel: am, to, hdr, payload: Payload::Key(key), op: None });
            }
            // Matched, or being withdrawn, before its RTR could go out: no peer ever gets the key.
            Some(ExposeFor::Rtr) => self.release_key(id),
            None => {}
        }
    }

    /// A `Put` answered [`Issued::Ordered`](crate::Issued::Ordered): when the request's notice
    /// to the peer goes over the same channel it cannot overtake the data, so the put counts as
    /// done now (its completion, when it comes, is then ignored).
    pub(super) fn op_ordered(&mut self, op: OpId) {
        let Some((id, OpKind::Copy)) = split_op(op) else { return };
        let Some(req) = self.reqs.get(id) else { return };
        if am_of(&self.peers, req.peer) == req.channel {
            self.op_done(op, Ok(()));
        }
    }

    /// A `Get` or `Put` finished.
    pub(super) fn op_done(&mut self, op: OpId, result: Result<()>) {
        self.touched();
        let Some((id, OpKind::Copy)) = split_op(op) else { return };
        let Some(req) = self.reqs.get_mut(id) else { return };
        if req.copy == OwnCopy::Done {
            return;
        }
        req.copy = OwnCopy::Idle;
        if req.result.is_some() {
            // A receive that ended (failed, or was discarded) while its read ran: the sender
            // still waits for our FIN to release its buffer, which we no longer read.
            let (dir, peer) = (req.dir(), req.peer);
            if dir == Dir::Recv && self.peer_alive(peer) {
                self.reqs.get_mut(id).expect("live request").copy = OwnCopy::Done;
                self.send_fin(id, 0);
            }
            return;
        }
        req.copy = OwnCopy::Done;
        // Tell the peer our part is done, also when it failed (the peer would otherwise wait
        // for ever): the receiver's FIN releases the sender's buffer (we no longer read it);
        // the sender's completes the receiver's buffer, or, flagged TRUNCATED after a failed
        // write, fails the receive (its buffer lacks our part).
        let failed_write = req.dir() == Dir::Send && result.is_err();
        self.send_fin(id, if failed_write { Header::TRUNCATED } else { 0 });
        let req = self.reqs.get_mut(id).expect("live request");
        if let Err(e) = result {
            // While the peer still works on the buffer through our key, the request ends with
            // the error only at the peer's FIN (or its loss): a receive whose sender still
            // writes its part (split), so that nothing writes the buffer once the receive has
            // ended; a send whose receiver still reads its part, so that the exposure stays
            // until then (and the receiver's FIN still finds the send).
            let peer_busy = match req.dir() {
                Dir::Recv => req.peer_writing() && req.pending > 1,
                Dir::Send => req.fin_due(),
            };
            if !peer_busy {
                return self.fail(id, e);
            }
            req.deferred = Some(Box::new(e));
        }
        self.count_down(id);
    }

    /// Request `id`'s exposure failed (e.g. memory its channel could not register): it goes on
    /// by a protocol that needs no key of ours, rather than fail and leave its peer waiting for
    /// its RTS, CTS or FIN (or, for a send, break the pair's sequence of messages).
    pub(super) fn exposure_refused(&mut self, id: ReqId, e: Error) {
        let req = self.reqs.get_mut(id).expect("live request");
        let (peer, was_for) = (req.peer, req.expose_for.take());
        if let Some(probe) = self.split_probe.as_mut().filter(|p| p.id == id) {
            probe.disturbed = true;
        }
        tracing::debug!("rank {}: exposure for rank {peer} refused ({e}); going on without it", self.me);
        match was_for {
            // Sender first: the data goes through active messages.
            Some(ExposeFor::Rts) => self.send_stream_rts(id),
            // Receiver first, split: we write all of it through the receiver's key.
            Some(ExposeFor::RtsAfterRtr) => {
                (req.split, req.pending) = (0, 1);
                req.set_send_wait(SendWait::Nothing);
                self.send_rts_after_rtr(id, None);
            }
            // Sender first, split: we read all of it through the sender's key.
            Some(ExposeFor::Cts) => {
                (req.split, req.peer_writes, req.pending) = (req.len, 0..0, 1);
                self.start_own_copy(id);
            }
            // The receive waits for its message without offering its buffer.
            Some(ExposeFor::Rtr) => {}
            None => self.fail(id, e),
        }
    }

    /// Ends the send of a receive that matched its RTS and will read nothing (it failed, or
    /// was discarded, before its read or CTS): a truncation FIN, unless the sender is gone.
    pub(super) fn release_sender(&mut self, id: ReqId) {
        if self.reqs.get(id).is_some_and(|r| self.peer_alive(r.peer)) {
            self.send_fin(id, Header::TRUNCATED);
        }
    }

    /// Queues the FIN of request `id` to its peer (a receive's names the send, a send's the
    /// receive), with `flags`.
    pub(super) fn send_fin(&mut self, id: ReqId, flags: u8) {
        let Some(req) = self.reqs.get(id) else { return };
        let mut hdr = Header::new(PacketKind::Fin);
        hdr.flags = flags;
        match req.dir() {
            Dir::Send => hdr.rreq = req.peer_req,
            Dir::Recv => hdr.sreq = req.peer_req,
        }
        let (to, am) = (req.peer, am_of(&self.peers, req.peer));
        self.actions.push_back(Action::Send { channel: am, to, hdr, payload: Payload::Empty, op: None });
    }

    /// Issues this request's one-sided copy: the receiver gets `[0, split)`, the sender puts
    /// `[split, len)`. An empty part counts as done at once.
    pub(super) fn start_own_copy(&mut self, id: ReqId) {
        let req = self.reqs.get(id).expect("live request");
        let (range, key) = match req.dir() {
            Dir::Recv => (0..req.split, req.peer_key.as_deref().copied()),
            Dir::Send => (req.split..req.len, req.peer_key.as_deref().copied()),
        };
        let op = op_id(id, OpKind::Copy);
        if range.is_empty() {
            // Nothing to copy on our side. A receiver that pulls everything (an empty message
            // by rendezvous) still owes the sender its FIN; a sender with nothing to push owes
            // nothing (the receiver does not wait for it).
            return match req.dir() {
                Dir::Recv => self.op_done(op, Ok(())),
                Dir::Send => self.count_down(id),
            };
        }
        let Some(key) = key else { return self.fail(id, Error::protocol(req.peer, "rendezvous without a key")) };
        // SAFETY: range lies within the request's buffer, valid while the request lives.
        let ptr = unsafe { req.ptr.add(range.start) };
        let len = range.len();
        let (channel, peer, offset, dir) = (req.channel, req.peer, range.start, req.dir());
        if dir == Dir::Recv {
            self.reqs.get_mut(id).expect("live request").copy = OwnCopy::Reading;
        }
        self.actions.push_back(match dir {
            Dir::Recv => Action::Get { channel, peer, key, offset, into: RegionMut { ptr, len }, op },
            Dir::Send => Action::Put { channel, peer, from: Region { ptr, len }, key, offset, op },
        });
    }

    /// A rendezvous message met its receive `id`.
    pub(super) fn deliver_rts(&mut self, id: ReqId, from: Rank, hdr: Header, key: Option<RemoteKey>) -> Result<()> {
        let len = usize::try_from(hdr.len).map_err(|_| Error::protocol(from, "message length overflows"))?;
        let route_entry = self.route(from).map(|r| {
            let e = r.lookup(len);
            match &r.mapped {
                // A key for a size we send eagerly: the sender sent from memory we map.
                Some(m) if !e.protocol.is_one_sided() && key.is_some() && len >= m.from => {
                    (Protocol::RndvGet, m.channel)
                }
                _ => (e.protocol, e.channel),
            }
        });
        let req = self.reqs.get_mut(id).expect("matched request is live");
        req.len = len;
        req.peer_req = hdr.sreq;
        let am = am_of(&self.peers, from);
        if len > req.cap {
            let e = Error::Truncated { from, tag: hdr.tag, len, capacity: req.cap };
            self.fail(id, e);
            self.release_sender(id);
            return Ok(());
        }
        let one_sided = route_entry.filter(|(p, _)| p.is_one_sided());
        if hdr.flags & Header::STREAM != 0 || (hdr.rreq == 0 && one_sided.is_none()) || key.is_none() && hdr.rreq == 0 {
            // Stream through active messages: ask the sender for the data.
            req.protocol = Protocol::RndvStream;
            req.received = 0;
            let mut cts = Header::new(PacketKind::Cts);
            (cts.flags, cts.sreq, cts.rreq) = (Header::STREAM, hdr.sreq, id.wire());
            self.actions.push_back(Action::Send { channel: am, to: from, hdr: cts, payload: Payload::Empty, op: None });
            return Ok(());
        }
        if hdr.rreq != 0 {
            // Receiver first: the sender writes [split, len) and tells us with FIN; we read
            // [0, split) with its key.
            let split = hdr.offset;
            if split > hdr.len || split > 0 && key.is_none() {
                return Err(Error::protocol(from, format!("split point {split} of a {len}-byte message")));
            }
            let split = split as usize;
            req.split = split;
            req.peer_key = key.map(Box::new);
            req.peer_writes = split..len;
            req.set_peer_writing(split < len);
            req.pending = (split > 0) as u32 + (split < len) as u32;
            if split > 0 {
                self.start_own_copy(id);
            } else if req.pending == 0 {
                // An empty message: nothing to copy on either side.
                self.finish(id);
            }
            return Ok(());
        }
        let (protocol, channel) = one_sided.expect("checked above");
        let split = if protocol == Protocol::RndvSplit { self.split_point(id, from, len) } else { len };
        let pull_all = split == len || split == 0;
        if pull_all {
            // Sender first with our RTR on its way (RTS wins): the sender drops the RTR unused,
            // so its exposure ends now, before the pull, which may need what it holds (a
            // bounce slot: a window of crossed receives would need two each).
            self.release_key(id);
        }
        let req = self.reqs.get_mut(id).expect("matched request is live");
        req.channel = channel;
        req.peer_key = key.map(Box::new);
        req.protocol = protocol;
        if pull_all {
            req.split = len;
            req.pending = 1;
            self.start_own_copy(id);
            return Ok(());
        }
        req.split = split;
        req.peer_writes = split..len;
        req.pending = 2; // our get and the sender's FIN after its put
        match req.own_key.as_deref().map(|h| *h.key()) {
            Some(k) => self.send_cts(id, k),
            // The exposure for our RTR is still on its way (it covers the same buffer for the
            // same access): its key goes out with the CTS instead.
            None if req.expose_for == Some(ExposeFor::Rtr) => req.expose_for = Some(ExposeFor::Cts),
            None => {
                req.expose_for = Some(ExposeFor::Cts);
                let region = Region { ptr: req.ptr, len: req.cap };
                let access = PeerAccess::Write;
                self.actions.push_back(Action::Register { channel, region, access, op: op_id(id, OpKind::Exposed) });
            }
        }
        Ok(())
    }

    /// Split rendezvous, receiver side: tell the sender where to write, then read the front.
    pub(super) fn send_cts(&mut self, id: ReqId, key: RemoteKey) {
        let req = self.reqs.get_mut(id).expect("live request");
        req.set_peer_writing(true);
        let mut cts = Header::new(PacketKind::Cts);
        (cts.sreq, cts.rreq, cts.offset, cts.len) = (req.peer_req, id.wire(), req.split as u64, req.len as u64);
        let (to, am) = (req.peer, am_of(&self.peers, req.peer));
        self.actions.push_back(Action::Send { channel: am, to, hdr: cts, payload: Payload::Key(key), op: None });
        self.start_own_copy(id);
    }

    /// Looks up the live request a peer's packet names, checking direction and owner.
    pub(super) fn named_request(&self, from: Rank, wire: u32, dir: Dir, what: &str) -> Result<ReqId> {
        let id = ReqId::from_wire(wire).ok_or_else(|| Error::protocol(from, format!("{what} names no request")))?;
        match self.reqs.get(id) {
            Some(r) if r.dir() == dir && r.peer == from && r.result.is_none() => Ok(id),
            _ => Err(Error::protocol(from, format!("{what} names request {wire:#x}, which is not waiting for it"))),
        }
    }

    pub(super) fn on_cts(&mut self, from: Rank, hdr: Header, payload: &[u8]) -> Result<()> {
        let id = self.named_request(from, hdr.sreq, Dir::Send, "CTS")?;
        let frag = self.frag(from);
        let am = am_of(&self.peers, from);
        let req = self.reqs.get_mut(id).expect("checked live");
        if req.protocol == Protocol::Eager || req.kind != ReqKind::Send(SendWait::Answer) {
            return Err(Error::protocol(from, "CTS for a send that does not wait for one"));
        }
        // A send that took its CTS waits for no other answer (a second CTS or a truncation FIN
        // could end or restart it while its data still leaves from the buffer); the CTS must
        // name the receive its FIN will name.
        if ReqId::from_wire(hdr.rreq).is_none() {
            return Err(Error::protocol(from, "CTS names no receive"));
        }
        req.peer_req = hdr.rreq;
        if hdr.flags & Header::STREAM != 0 {
            let mut data = Header::new(PacketKind::Data);
            data.rreq = hdr.rreq;
            let buf = Region { ptr: req.ptr, len: req.len };
            let n = Self::push_chunks(&mut self.actions, am, from, data, buf, frag, id);
            // The FIN or CTS we waited for is this CTS; now wait for the packets to leave.
            req.pending = n;
            req.set_send_wait(SendWait::Nothing);
            return Ok(());
        }
        let key = RemoteKey::new(payload).ok_or_else(|| Error::protocol(from, "CTS without a valid key"))?;
        if hdr.offset > req.len as u64 {
            return Err(Error::protocol(
                from,
                format!("CTS split point {} beyond the {}-byte message", hdr.offset, req.len),
            ));
        }
        let split = hdr.offset as usize;
        req.split = split;
        req.peer_key = Some(Box::new(key));
        req.pending = (split > 0) as u32 + (split < req.len) as u32;
        req.set_send_wait(if split > 0 { SendWait::Fin } else { SendWait::Nothing });
        if split < req.len {
            self.start_own_copy(id);
        } else if req.pending == 0 {
            self.finish(id);
        }
        Ok(())
    }

    pub(super) fn on_data(&mut self, from: Rank, hdr: Header, payload: &[u8]) -> Result<()> {
        let id = self.named_request(from, hdr.rreq, Dir::Recv, "DATA")?;
        let req = self.reqs.get_mut(id).expect("checked live");
        if req.protocol != Protocol::RndvStream
            || hdr.offset != req.received as u64
            || req.received + payload.len() > req.len
        {
            return Err(Error::protocol(
                from,
                format!(
                    "data at {} (+{}) for a {}-byte message at {}",
                    hdr.offset,
                    payload.len(),
                    req.len,
                    req.received
                ),
            ));
        }
        // SAFETY: received + payload.len() <= len <= cap.
        unsafe { std::ptr::copy_nonoverlapping(payload.as_ptr(), req.ptr.add(req.received), payload.len()) };
        req.received += payload.len();
        if req.received == req.len {
            self.finish(id);
        }
        Ok(())
    }

    pub(super) fn on_fin(&mut self, from: Rank, hdr: Header) -> Result<()> {
        let unexpected = || Error::protocol(from, "FIN for a request that does not wait for one");
        if hdr.sreq != 0 {
            let id = self.named_request(from, hdr.sreq, Dir::Send, "FIN")?;
            let req = self.reqs.get_mut(id).expect("checked live");
            let truncated = hdr.flags & Header::TRUNCATED != 0;
            // A truncation answers our RTS, before any CTS (or RTR) named the receive.
            if !req.fin_due() || truncated && req.kind != ReqKind::Send(SendWait::Answer) {
                return Err(unexpected());
            }
            req.set_send_wait(SendWait::Nothing);
            if truncated {
                self.finish(id);
            } else {
                self.count_down(id);
            }
        } else {
            let id = self.named_request(from, hdr.rreq, Dir::Recv, "FIN")?;
            let req = self.reqs.get_mut(id).expect("checked live");
            if !req.peer_writing() {
                return Err(unexpected());
            }
            req.set_peer_writing(false); // the sender is done with our key
            if hdr.flags & Header::TRUNCATED != 0 && req.deferred.is_none() {
                // Its write of its part failed: the receive fails once our own part is done.
                let (start, end) = (req.split, req.len);
                req.deferred = Some(Box::new(Error::Transport {
                    kind: "peer",
                    what: format!("rank {from} could not write bytes {start}..{end} of its message into this receive"),
                }));
            }
            self.count_down(id);
        }
        Ok(())
    }
}
