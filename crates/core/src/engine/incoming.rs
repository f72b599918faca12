//! The receiving half of the engine: packets from peers, matching, unexpected messages.

use super::requests::Req;
use super::{finish_req, Engine, FragTarget, Incoming, ReqId, Source, TagMatch, Unexpected, UxBody, MAX_EAGER_LEN};
use crate::adapt::Seen;
use crate::error::{Error, Rank, Result};
use crate::header::{Header, PacketKind};
use crate::transport::RemoteKey;
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
