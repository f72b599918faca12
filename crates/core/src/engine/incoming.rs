//! The receiving half of the engine: packets from peers, matching, unexpected messages.

use super::requests::{Dir, ExposeFor, Matching, Req, ReqKind};
use super::types::{op_id, OpKind};
use super::{
    am_of, finish_req, placement_says_eager, Action, Engine, FragTarget, Incoming, Payload, ReqId, Rtr, Source,
    TagMatch, Unexpected, UxBody, MAX_EAGER_LEN, MAX_RTR_PLACE, SEND_HISTORY,
};
use crate::adapt::Seen;
use crate::error::{Error, Rank, Result};
use crate::header::{Header, PacketKind};
use crate::policy::Protocol;
use crate::transport::{PeerAccess, Region, RemoteKey};
use std::collections::VecDeque;

impl Engine {
    /// A packet arrived from `from`. A malformed or unexpected packet is an error naming the
    /// peer; the caller then treats the peer as lost.
    #[inline]
    pub fn handle_message(&mut self, from: Rank, hdr: &Header, payload: &[u8]) -> Result<()> {
        // The common case in a small function that its callers inline: the next eager message
        // of a live peer. Through the general path, built for every packet kind, a blocking
        // receive's packet took 164 instructions; this way 90 (callgrind, 8 B).
        if hdr.kind == PacketKind::Eager {
            if let Some(p) = self.peers.get_mut(from as usize).filter(|p| p.gone.is_none() && hdr.seq == p.expected_seq)
            {
                p.expected_seq = p.expected_seq.wrapping_add(1);
                self.touched();
                if self.parked.is_some() && self.meet_parked(from, hdr, payload) {
                    return Ok(());
                }
                return self.on_eager(from, *hdr, payload);
            }
        }
        self.handle_packet(from, hdr, payload)
    }

    /// [`Engine::handle_message`] for every packet but the next eager message of a live peer.
    #[inline(never)]
    fn handle_packet(&mut self, from: Rank, hdr: &Header, payload: &[u8]) -> Result<()> {
        self.touched();
        let peer =
            self.peers.get(from as usize).ok_or_else(|| Error::protocol(from, "packet from a rank outside the job"))?;
        if peer.gone.is_some() {
            return Ok(());
        }
        let hdr = *hdr;
        match hdr.kind {
            PacketKind::Eager | PacketKind::Rts => {
                let p = &mut self.peers[from as usize];
                if hdr.seq != p.expected_seq {
                    return Err(Error::protocol(
                        from,
                        format!("message seq {} out of order (expected {})", hdr.seq, p.expected_seq),
                    ));
                }
                p.expected_seq = p.expected_seq.wrapping_add(1);
                // Checked here: `meet_parked` is out of line, and mostly nothing is parked
                // when receives are posted (a window of irecvs).
                if self.parked.is_some() && self.meet_parked(from, &hdr, payload) {
                    return Ok(());
                }
                if hdr.kind == PacketKind::Eager {
                    self.on_eager(from, hdr, payload)
                } else {
                    self.on_rts(from, hdr, payload)
                }
            }
            PacketKind::Frag => self.on_frag(from, hdr, payload),
            PacketKind::Cts => self.on_cts(from, hdr, payload),
            PacketKind::Data => self.on_data(from, hdr, payload),
            PacketKind::Fin => self.on_fin(from, hdr),
            PacketKind::Rtr => self.on_rtr(from, hdr, payload),
            PacketKind::Withdraw => self.on_withdraw(from, hdr),
            PacketKind::Withdrawn => self.on_withdrawn(from, hdr),
            PacketKind::Skew => {
                let lags = hdr.offset != 0;
                let p = &mut self.peers[from as usize];
                if p.adapt.skew.peer_lags() != lags {
                    p.adapt.observe(Seen::PeerLags(lags), p.route.as_ref());
                    tracing::debug!(
                        "rank {}: route to rank {from} changed: the receiver {}",
                        self.me,
                        if lags { "lags, medium messages go eagerly" } else { "caught up, single copy again" }
                    );
                }
                Ok(())
            }
        }
    }

    fn on_eager(&mut self, from: Rank, hdr: Header, payload: &[u8]) -> Result<()> {
        if hdr.len > MAX_EAGER_LEN || payload.len() as u64 > hdr.len {
            return Err(Error::protocol(
                from,
                format!("eager message of {} bytes with a {}-byte first packet", hdr.len, payload.len()),
            ));
        }
        let len = hdr.len as usize;
        if let Some(id) = self.match_posted(from, hdr.tag, hdr.ctx) {
            let req = self.reqs.get_mut(id).expect("posted request is live");
            req.len = len;
            if len > req.cap {
                let e = Error::Truncated { from, tag: hdr.tag, len, capacity: req.cap };
                self.fail(id, e);
                return self.track_fragments(from, hdr.seq, len, payload.len(), FragTarget::Discard);
            }
            // SAFETY: payload.len() <= len <= cap; the poster guaranteed the buffer.
            unsafe { std::ptr::copy_nonoverlapping(payload.as_ptr(), req.ptr, payload.len()) };
            req.received = payload.len();
            if req.received == len {
                finish_req(req, &mut self.actions);
                return Ok(());
            }
            return self.track_fragments(from, hdr.seq, len, payload.len(), FragTarget::Req(id));
        }
        let received = payload.len();
        if received < len {
            // Before buffering: it may be refused.
            self.track_fragments(from, hdr.seq, len, received, FragTarget::Unexpected)?;
        }
        let Some(mut data) = self.spare.take(len) else {
            return Err(Error::protocol(from, format!("cannot buffer an unexpected {len}-byte message")));
        };
        // Filled as its fragments come (in order), not zeroed up front: a header alone commits
        // no memory, whatever length it claims (the reservation is address space until used).
        data.extend_from_slice(payload);
        self.push_unexpected(from, &hdr, UxBody::Eager { data, received });
        Ok(())
    }

    /// Expects the fragments of message `seq` after its first `received` bytes. Sequence ids
    /// wrap after 2^32 messages: a message whose seq is that of one still waiting for
    /// fragments is refused, so that fragments always name one message.
    fn track_fragments(&mut self, from: Rank, seq: u32, len: usize, received: usize, target: FragTarget) -> Result<()> {
        if received == len {
            return Ok(());
        }
        let incoming = &mut self.peers[from as usize].incoming;
        if incoming.iter().any(|inc| inc.seq == seq) {
            return Err(Error::protocol(
                from,
                format!("message seq {seq} began while one of that seq still waits for fragments"),
            ));
        }
        incoming.push(Incoming { seq, len, received, target });
        Ok(())
    }

    fn push_unexpected(&mut self, from: Rank, hdr: &Header, body: UxBody) {
        let order = self.arrival_counter;
        self.arrival_counter += 1;
        let ux = Unexpected { tag: hdr.tag, ctx: hdr.ctx, seq: hdr.seq, len: hdr.len as usize, order, body };
        self.peers[from as usize].unexpected.push_back(ux);
    }

    /// Skew feedback, receiver side ([`crate::adapt::SkewAdapter`]), called when a receive
    /// naming `from` is posted and `waiting` of its messages wait unexpected or unread in the
    /// channel: tells `from` when the adapter says so.
    #[inline]
    pub(super) fn watch_skew(&mut self, from: Rank, waiting: usize) {
        if let Some(lagging_now) = self.peers[from as usize].adapt.skew.note_receive(waiting) {
            self.tell_skew(from, waiting, lagging_now);
        }
    }

    /// Sends `from` the skew packet saying that we lag (or caught up).
    #[cold]
    #[inline(never)]
    fn tell_skew(&mut self, from: Rank, waiting: usize, lagging_now: bool) {
        tracing::debug!(
            "rank {}: receives keep finding {waiting} messages of rank {from} waiting: telling it that we {}",
            self.me,
            if lagging_now { "lag" } else { "caught up" }
        );
        let mut hdr = Header::new(PacketKind::Skew);
        hdr.offset = lagging_now as u64;
        let am = am_of(&self.peers, from);
        self.actions.push_back(Action::Send { channel: am, to: from, hdr, payload: Payload::Empty, op: None });
    }

    fn on_frag(&mut self, from: Rank, hdr: Header, payload: &[u8]) -> Result<()> {
        let p = &mut self.peers[from as usize];
        let i = p
            .incoming
            .iter()
            .position(|inc| inc.seq == hdr.seq)
            .ok_or_else(|| Error::protocol(from, format!("fragment of unknown message seq {}", hdr.seq)))?;
        let inc = &mut p.incoming[i];
        if hdr.offset != inc.received as u64 || inc.received + payload.len() > inc.len {
            return Err(Error::protocol(
                from,
                format!(
                    "fragment at {} (+{}) of a {}-byte message, expected offset {}",
                    hdr.offset,
                    payload.len(),
                    inc.len,
                    inc.received
                ),
            ));
        }
        let off = inc.received;
        inc.received += payload.len();
        let (target, done) = (inc.target, inc.received == inc.len);
        if done {
            p.incoming.swap_remove(i);
        }
        match target {
            FragTarget::Req(id) => {
                // Live: a receive that ends early redirects its fragments (`Engine::fail`).
                let req = self.reqs.get_mut(id).ok_or_else(|| {
                    Error::protocol(from, format!("fragment of message seq {} for an ended receive", hdr.seq))
                })?;
                // SAFETY: off + payload.len() <= len <= cap (checked at match time).
                unsafe { std::ptr::copy_nonoverlapping(payload.as_ptr(), req.ptr.add(off), payload.len()) };
                req.received += payload.len();
                if done {
                    self.finish(id);
                }
            }
            FragTarget::Unexpected => {
                // The one unexpected message of this seq still short of its length (an older,
                // whole one may share the seq after 2^32 messages; `track_fragments` keeps
                // the incomplete ones unique).
                let ux = p
                    .unexpected
                    .iter_mut()
                    .find(|u| u.seq == hdr.seq && matches!(u.body, UxBody::Eager { received, .. } if received < u.len));
                let Some(UxBody::Eager { data, received }) = ux.map(|u| &mut u.body) else {
                    return Err(Error::protocol(from, format!("fragment of message seq {} lost its message", hdr.seq)));
                };
                // Fragments come in order (offset checked above): each extends the data.
                debug_assert_eq!(data.len(), off);
                data.extend_from_slice(payload);
                *received += payload.len();
            }
            FragTarget::Discard => {}
        }
        Ok(())
    }

    fn on_rts(&mut self, from: Rank, hdr: Header, payload: &[u8]) -> Result<()> {
        let key = if payload.is_empty() {
            None
        } else {
            Some(
                RemoteKey::new(payload)
                    .ok_or_else(|| Error::protocol(from, format!("{}-byte remote key", payload.len())))?,
            )
        };
        let matched = self.match_posted(from, hdr.tag, hdr.ctx);
        if let Some(id) = matched {
            self.learn_from_rtr(id, from, hdr.rreq != 0);
        }
        if hdr.rreq != 0 {
            // Receiver first: the sender used our RTR; that receive must be the one matching.
            let named = ReqId::from_wire(hdr.rreq);
            let sent_rtr = matched.and_then(|id| self.reqs.get(id)).is_some_and(|r| r.rtr_sent && r.own_key.is_some());
            if matched.is_none() || matched != named || !sent_rtr {
                return Err(Error::protocol(from, "RTS answers a ready-to-receive that is not the matching receive"));
            }
        }
        match matched {
            Some(id) => self.deliver_rts(id, from, hdr, key),
            None => {
                self.push_unexpected(from, &hdr, UxBody::Rts { hdr, key });
                Ok(())
            }
        }
    }

    /// A rendezvous message from `from` met receive `id`: if that receive had sent an RTR,
    /// whether the sender `used` it says whether hints for receives behind others would pay.
    fn learn_from_rtr(&mut self, id: ReqId, from: Rank, used: bool) {
        let Some(req) = self.reqs.get(id).filter(|r| r.rtr_sent) else { return };
        let (first, me) = (req.rtr_place == 0, self.me);
        let p = &mut self.peers[from as usize];
        let window_rtrs = match (used, first) {
            (true, true) => true,
            (false, false) => false,
            _ => return,
        };
        if p.window_rtrs != window_rtrs {
            p.window_rtrs = window_rtrs;
            tracing::debug!(
                "rank {me}: route from rank {from} changed: receives behind others {} receive-first hints",
                if window_rtrs { "send" } else { "no longer send" }
            );
        }
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
            req.peer_writing = split < len;
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
        req.peer_writing = true;
        let mut cts = Header::new(PacketKind::Cts);
        (cts.sreq, cts.rreq, cts.offset, cts.len) = (req.peer_req, id.wire(), req.split as u64, req.len as u64);
        let (to, am) = (req.peer, am_of(&self.peers, req.peer));
        self.actions.push_back(Action::Send { channel: am, to, hdr: cts, payload: Payload::Key(key), op: None });
        self.start_own_copy(id);
    }

    /// Looks up the live request a peer's packet names, checking direction and owner.
    fn named_request(&self, from: Rank, wire: u32, dir: Dir, what: &str) -> Result<ReqId> {
        let id = ReqId::from_wire(wire).ok_or_else(|| Error::protocol(from, format!("{what} names no request")))?;
        match self.reqs.get(id) {
            Some(r) if r.dir() == dir && r.peer == from && r.result.is_none() => Ok(id),
            _ => Err(Error::protocol(from, format!("{what} names request {wire:#x}, which is not waiting for it"))),
        }
    }

    fn on_cts(&mut self, from: Rank, hdr: Header, payload: &[u8]) -> Result<()> {
        let id = self.named_request(from, hdr.sreq, Dir::Send, "CTS")?;
        let frag = self.frag(from);
        let am = am_of(&self.peers, from);
        let req = self.reqs.get_mut(id).expect("checked live");
        if req.protocol == Protocol::Eager || req.peer_req != 0 {
            return Err(Error::protocol(from, "CTS for a send that does not wait for one"));
        }
        // `peer_req != 0` is what marks a send that took its CTS (above, and for a truncation
        // FIN): a CTS naming no receive would leave it unmarked, and a second CTS or a FIN could
        // then end or restart the send while its data still leaves from the buffer.
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
            req.fin_due = false;
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
        req.fin_due = split > 0;
        if split < req.len {
            self.start_own_copy(id);
        } else if req.pending == 0 {
            self.finish(id);
        }
        Ok(())
    }

    fn on_data(&mut self, from: Rank, hdr: Header, payload: &[u8]) -> Result<()> {
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

    fn on_fin(&mut self, from: Rank, hdr: Header) -> Result<()> {
        let unexpected = || Error::protocol(from, "FIN for a request that does not wait for one");
        if hdr.sreq != 0 {
            let id = self.named_request(from, hdr.sreq, Dir::Send, "FIN")?;
            let req = self.reqs.get_mut(id).expect("checked live");
            let truncated = hdr.flags & Header::TRUNCATED != 0;
            // A truncation answers our RTS, before any CTS (or RTR) named the receive.
            if !req.fin_due || truncated && req.peer_req != 0 {
                return Err(unexpected());
            }
            req.fin_due = false;
            if truncated {
                self.finish(id);
            } else {
                self.count_down(id);
            }
        } else {
            let id = self.named_request(from, hdr.rreq, Dir::Recv, "FIN")?;
            let req = self.reqs.get_mut(id).expect("checked live");
            if !req.peer_writing {
                return Err(unexpected());
            }
            req.peer_writing = false; // the sender is done with our key
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

    fn on_rtr(&mut self, from: Rank, hdr: Header, payload: &[u8]) -> Result<()> {
        let key = RemoteKey::new(payload).ok_or_else(|| Error::protocol(from, "RTR without a valid key"))?;
        if ReqId::from_wire(hdr.rreq).is_none() {
            return Err(Error::protocol(from, "RTR names no request"));
        }
        let tag = if hdr.flags & Header::ANY_TAG != 0 { TagMatch::Any } else { TagMatch::Tag(hdr.tag) };
        let p = &mut self.peers[from as usize];
        let seen = hdr.offset as u32;
        let in_flight = p.next_send_seq.wrapping_sub(seen);
        if hdr.offset > u32::MAX as u64 || in_flight > i32::MAX as u32 {
            return Err(Error::protocol(
                from,
                format!("RTR claims {seen} messages seen, only {} were sent", p.next_send_seq),
            ));
        }
        // The receive takes the `place`-th matching send the receiver had not seen (earlier
        // receives for the same messages take the ones before). Stale when that send happened
        // already: it took the receive (RTS wins; an eager one is a misprediction the receiver
        // copies as usual).
        let place = hdr.seq;
        let sent = if in_flight as usize > SEND_HISTORY {
            None
        } else {
            Some(
                (0..in_flight)
                    .filter(|&k| {
                        let (t, c) = p.history[seen.wrapping_add(k) as usize % SEND_HISTORY];
                        c == hdr.ctx && tag.matches(t)
                    })
                    .count() as u32,
            )
        };
        if let Some(ahead) = sent.and_then(|n| place.checked_sub(n)) {
            if p.rtrs.len() < MAX_RTR_PLACE as usize {
                let cap = usize::try_from(hdr.len).unwrap_or(usize::MAX);
                p.rtrs.push_back(Rtr { ahead, tag, ctx: hdr.ctx, rreq: hdr.rreq, cap, key });
            }
        }
        Ok(())
    }

    /// The receiver cancels receive `hdr.rreq`. Every RTR of this receiver we hold is dropped,
    /// not only that one: the others' places may count the withdrawn receive, and once it is
    /// gone a send would take another receive than the one its RTR names. Each dropped RTR,
    /// and the withdrawn receive's whether we held its RTR or not, is answered with a
    /// `Withdrawn` behind every message sent so far; a send that took the receive's RTR
    /// already finishes instead, and the receive with it.
    fn on_withdraw(&mut self, from: Rank, hdr: Header) -> Result<()> {
        if ReqId::from_wire(hdr.rreq).is_none() {
            return Err(Error::protocol(from, "withdrawal names no request"));
        }
        let am = am_of(&self.peers, from);
        let p = &mut self.peers[from as usize];
        let sent = u64::from(p.next_send_seq);
        let answer = |rreq: u32, flags: u8| {
            let mut h = Header::new(PacketKind::Withdrawn);
            (h.rreq, h.flags, h.offset) = (rreq, flags, sent);
            Action::Send { channel: am, to: from, hdr: h, payload: Payload::Empty, op: None }
        };
        for r in p.rtrs.drain(..).filter(|r| r.rreq != hdr.rreq) {
            self.actions.push_back(answer(r.rreq, 0));
        }
        self.actions.push_back(answer(hdr.rreq, Header::ANSWER));
        Ok(())
    }

    /// The sender no longer holds the key of receive `hdr.rreq` (if it ever did), nor any RTR
    /// sent before. Every message it sent before arrived already (its count in `offset` says
    /// so), so a receive no message matched has none coming for it: it is withdrawn if we asked
    /// for that, else it just takes back its buffer's exposure (its message will come
    /// sender-first).
    fn on_withdrawn(&mut self, from: Rank, hdr: Header) -> Result<()> {
        let p = &mut self.peers[from as usize];
        let sent = hdr.offset as u32;
        if hdr.offset > u64::from(u32::MAX) || (p.expected_seq.wrapping_sub(sent) as i32) < 0 {
            return Err(Error::protocol(
                from,
                format!("withdrawal answered after {} messages, {} arrived", hdr.offset, p.expected_seq),
            ));
        }
        if hdr.flags & Header::ANSWER != 0 {
            p.withdrawals = p.withdrawals.checked_sub(1).ok_or_else(|| Error::protocol(from, "unasked withdrawal"))?;
        }
        let Some(id) = ReqId::from_wire(hdr.rreq) else {
            return Err(Error::protocol(from, "withdrawal answer names no request"));
        };
        let Some(req) =
            self.reqs.get_mut(id).filter(|r| r.unmatched() && !r.any_source() && r.peer == from && r.result.is_none())
        else {
            return Ok(()); // it matched a message meanwhile (or ended)
        };
        req.rtr_sent = false;
        if req.kind == ReqKind::Recv(Matching::Withdrawing) {
            req.kind = ReqKind::Recv(Matching::Withdrawn);
            self.fail(id, Error::InvalidArgument("receive cancelled".into()));
        } else {
            self.release_key(id);
        }
        Ok(())
    }

    // ---- matching -------------------------------------------------------------------------

    /// Removes and returns the receive a message `(from, tag, ctx)` matches: the earliest
    /// posted among those naming `from` and the ANY_SOURCE ones.
    #[inline]
    fn match_posted(&mut self, from: Rank, tag: u32, ctx: u16) -> Option<ReqId> {
        if self.wild.is_empty() {
            // Common case: no wildcard receive; the first posted receive from `from` usually
            // matches, and is checked before any search.
            let posted = &mut self.peers[from as usize].posted;
            let first = *posted.front()?;
            if let Some(req) = self.reqs.get_mut(first).filter(|r| r.accepts(tag, ctx)) {
                // The first posted receive takes it: one lookup, no search.
                mark(req, from, tag);
                posted.pop_front();
                return Some(first);
            }
            let reqs = &self.reqs;
            let i = posted.iter().position(|id| reqs.get(*id).is_some_and(|r| r.accepts(tag, ctx)))?;
            let id = posted.remove(i)?;
            return Some(self.mark_matched(id, from, tag));
        }
        let reqs = &self.reqs;
        let fits = |id: &ReqId| reqs.get(*id).is_some_and(|r| r.accepts(tag, ctx));
        let p = &self.peers[from as usize];
        let specific = p.posted.iter().position(fits);
        let wild = if self.wild.is_empty() { None } else { self.wild.iter().position(fits) };
        let order = |q: Option<usize>, list: &std::collections::VecDeque<ReqId>| {
            q.map(|i| reqs.get(list[i]).map_or(u64::MAX, |r| r.order))
        };
        let use_wild = match (order(specific, &p.posted), order(wild, &self.wild)) {
            (Some(a), Some(b)) => b < a,
            (None, Some(_)) => true,
            _ => false,
        };
        let id =
            if use_wild { self.wild.remove(wild?)? } else { self.peers[from as usize].posted.remove(specific?)? };
        Some(self.mark_matched(id, from, tag))
    }

    #[inline]
    fn mark_matched(&mut self, id: ReqId, from: Rank, tag: u32) -> ReqId {
        mark(self.reqs.get_mut(id).expect("posted request is live"), from, tag);
        id
    }

    /// The first unexpected message matching `(src, tag, ctx)`: its sender and index.
    /// Inlined: a receive naming a peer whose queue is empty costs a few instructions.
    #[inline(always)]
    pub(super) fn find_unexpected(&self, src: Source, tag: TagMatch, ctx: u16) -> Option<(Rank, usize)> {
        match src {
            Source::Rank(r) => self.first_unexpected(r, tag, ctx),
            Source::Any => self.first_unexpected_of_any(tag, ctx),
        }
    }

    /// The earliest arrived unexpected message matching `(tag, ctx)` from any peer.
    #[inline(never)]
    fn first_unexpected_of_any(&self, tag: TagMatch, ctx: u16) -> Option<(Rank, usize)> {
        (0..self.peers.len() as Rank)
            .filter_map(|r| self.first_unexpected(r, tag, ctx))
            .min_by_key(|&(r, i)| self.peers[r as usize].unexpected[i].order)
    }

    /// The first unexpected message of `r` matching `(tag, ctx)` (none for a rank outside the
    /// job: the caller's own checks name that error).
    #[inline(always)]
    fn first_unexpected(&self, r: Rank, tag: TagMatch, ctx: u16) -> Option<(Rank, usize)> {
        let unexpected = &self.peers.get(r as usize)?.unexpected;
        if unexpected.is_empty() {
            return None; // the common case, checked before building the iterator
        }
        unexpected_position(unexpected, tag, ctx).map(|i| (r, i))
    }

    /// Which of `r`'s messages matching `(tag, ctx)` a receive posted now will take, counted
    /// from the first one not seen yet: the number of earlier receives waiting for the same
    /// messages. `None` when an earlier receive overlaps it without taking exactly the same
    /// messages (another tag pattern, or ANY_SOURCE), or more than `max` wait: then the place
    /// depends on what arrives, and no receive-first hint can name it.
    pub(super) fn place_among_posted(&self, r: Rank, tag: TagMatch, ctx: u16, max: u32) -> Option<u32> {
        let overlaps = |q: &Req| q.ctx == ctx && q.tag.overlaps(tag);
        if self.wild.iter().any(|id| self.reqs.get(*id).is_some_and(overlaps)) {
            return None;
        }
        let mut place = 0u32;
        for q in self.peers[r as usize].posted.iter().filter_map(|id| self.reqs.get(*id)) {
            if overlaps(q) {
                if q.tag != tag || place >= max {
                    return None;
                }
                place += 1;
            }
        }
        Some(place)
    }

    /// Receive `id` met an unexpected message.
    pub(super) fn match_unexpected(&mut self, id: ReqId, from: Rank, ux: Unexpected) {
        // A sender that is gone finishes no message it left half-way (the rest of an eager
        // one, a rendezvous): the receive that takes such a message ends with the sender's
        // loss at once, instead of waiting for ever.
        let gone = self.peer_error(from);
        let req = self.reqs.get_mut(id).expect("live request");
        req.mark_matched(from, ux.tag);
        req.len = ux.len;
        match ux.body {
            UxBody::Eager { data, received } => {
                let target = if ux.len > req.cap {
                    let e = Error::Truncated { from, tag: ux.tag, len: ux.len, capacity: req.cap };
                    self.fail(id, e);
                    FragTarget::Discard
                } else if let Some(e) = gone.filter(|_| received < ux.len) {
                    self.fail(id, e);
                    FragTarget::Discard
                } else {
                    // SAFETY: received <= len <= cap.
                    unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), req.ptr, received) };
                    req.received = received;
                    if received == ux.len {
                        self.finish(id);
                    }
                    FragTarget::Req(id)
                };
                if received < ux.len {
                    if let Some(inc) = self.peers[from as usize].incoming.iter_mut().find(|i| i.seq == ux.seq) {
                        inc.target = target;
                    }
                }
                self.spare.give_back(data);
            }
            UxBody::Rts { hdr, key } => match gone {
                Some(e) => self.fail(id, e),
                None => {
                    if let Err(e) = self.deliver_rts(id, from, hdr, key) {
                        self.handle_peer_lost(from, e);
                    }
                }
            },
        }
    }

    /// Receive-first hint for receive `id` of `(r, tag, ctx)`, about to be posted: when its size
    /// goes by one-sided copy and its place among the receives waiting for the same messages is
    /// known (and is the first, unless window hints pay; see `Peer::window_rtrs`), expose the
    /// buffer and send an RTR.
    pub(super) fn maybe_send_rtr(&mut self, id: ReqId, r: Rank, tag: TagMatch, ctx: u16, cap: usize) {
        let Some((protocol, channel)) = self.route(r).map(|rt| {
            let e = rt.lookup(cap);
            (e.protocol, e.channel)
        }) else {
            return;
        };
        // The peer sends it eagerly: no buffer to offer.
        if !protocol.is_one_sided() || placement_says_eager(&self.peers[r as usize], cap) == Some(true) {
            return;
        }
        if self.peers[r as usize].withdrawals > 0 {
            return; // its place could count a receive being withdrawn
        }
        let max = if self.peers[r as usize].window_rtrs { MAX_RTR_PLACE } else { 0 };
        let Some(place) = self.place_among_posted(r, tag, ctx, max) else { return };
        let seen = self.peers[r as usize].expected_seq;
        let req = self.reqs.get_mut(id).expect("live request");
        req.channel = channel;
        (req.rtr_seq, req.rtr_place) = (seen, place);
        req.expose_for = Some(ExposeFor::Rtr);
        let region = Region { ptr: req.ptr, len: cap };
        let access = PeerAccess::Write;
        self.actions.push_back(Action::Register { channel, region, access, op: op_id(id, OpKind::Exposed) });
    }
}

/// A posted receive met a message `(from, tag)`.
#[inline]
fn mark(req: &mut Req, from: Rank, tag: u32) {
    req.mark_matched(from, tag);
}

/// Where in `unexpected` the first message matching `(tag, ctx)` is (out of line: the
/// receive path mostly finds the queue empty).
#[inline(never)]
fn unexpected_position(unexpected: &VecDeque<Unexpected>, tag: TagMatch, ctx: u16) -> Option<usize> {
    unexpected.iter().position(|u| u.ctx == ctx && tag.matches(u.tag))
}
