//! Posting receives: `post_recv`, the fast paths without a request (a message already here,
//! a blocking receive parked), and the receive-first hint (`Rtr`) a posted receive may send.

use super::adapting::placement_says_eager;
use super::requests::{Dir, ExposeFor, Matching, Req, ReqKind};
use super::types::{op_id, Action, OpKind, ReqId, Source, SpaceId, Status, TagMatch};
use super::{Engine, Parked, Posted, RecvPath, Unparked, UxBody, MAX_RTR_PLACE};
use crate::error::{Error, Rank, Result};
use crate::header::{Header, PacketKind};
use crate::transport::{PeerAccess, Region, RegionMut};

impl Engine {
    /// Starts receiving into `buf` a message from `src` with a tag matching `tag` in `space`;
    /// `path` says how far it may go without a request.
    ///
    /// With [`RecvPath::Arrived`] or [`RecvPath::Park`], when the first unexpected message
    /// matching is an eager one that arrived whole and fits `buf`, it is copied into `buf`:
    /// [`Posted::Received`]. With [`RecvPath::Park`], when nothing matches, the receive may wait
    /// parked: [`Posted::Parked`] (see below). Else the receive is a request,
    /// [`Posted::Request`] (also for a rendezvous or fragments still to come, a message too long
    /// for `buf`, which the request then reports, or a receive that cannot park). The skew
    /// feedback counts the receive whichever way it goes; run the actions afterwards.
    ///
    /// A parked receive (a blocking one) names one peer, no other receive waits for that peer's
    /// messages (none posted for it, no ANY_SOURCE one), and a buffer of `buf.len` bytes takes
    /// eager messages from it (so its request would send no receive-first hint). A whole eager
    /// message that fits is copied straight into `buf` on arrival; any other matching packet (a
    /// first fragment, an RTS, a message too long) first turns it into the request this call
    /// would have made, in its place. Progress until [`Engine::poll_parked`] ends it.
    ///
    /// # Safety
    /// `buf` must be valid for writes of `buf.len` bytes during the call. For a request, it must
    /// stay valid and not be accessed otherwise until the request's result was taken (or the
    /// request failed); when parked, until [`Engine::poll_parked`] (and, when that gives a
    /// request, until the request's result was taken or it failed).
    #[inline]
    pub unsafe fn post_recv(
        &mut self,
        src: Source,
        tag: TagMatch,
        space: SpaceId,
        buf: RegionMut,
        path: RecvPath,
    ) -> Result<Posted> {
        if path != RecvPath::Request {
            if let Some((from, i)) = self.find_unexpected(src, tag, space.0) {
                // SAFETY: forwarded to the caller.
                if let Some(status) = unsafe { self.take_unexpected(src, from, i, buf) } {
                    return Ok(Posted::Received(status));
                }
            } else if path == RecvPath::Park && self.park_recv(src, tag, space, buf) {
                return Ok(Posted::Parked);
            }
        }
        // SAFETY: forwarded to the caller.
        unsafe { self.post_request(src, tag, space, buf) }.map(Posted::Request)
    }

    /// [`Engine::post_recv`] of a receive that is a request.
    ///
    /// # Safety
    /// As for [`Engine::post_recv`].
    #[inline(never)]
    unsafe fn post_request(&mut self, src: Source, tag: TagMatch, space: SpaceId, buf: RegionMut) -> Result<ReqId> {
        let ctx = space.0;
        self.touched();
        let found = self.find_unexpected(src, tag, ctx);
        if let Source::Rank(r) = src {
            // A peer that finished may have left messages behind: those still match.
            if let Err(e) = self.usable_peer(r) {
                if found.is_none() {
                    return Err(e);
                }
            }
            // Nothing can come from it: the receive would wait forever.
            if let Some(why) = self.peers.get(r as usize).and_then(|p| p.unreachable.clone()) {
                return Err(Error::Unreachable { rank: r, why });
            }
        } else if found.is_none() && self.all_others_gone_in(space) {
            return Err(self.all_gone_error());
        }
        let from = match src {
            Source::Rank(r) => r,
            Source::Any => self.me,
        };
        let (id, req) = self.reqs.insert(Dir::Recv, from, tag, ctx, buf.ptr, buf.len);
        if found.is_none() {
            req.order = self.post_counter;
            self.post_counter += 1;
            req.kind = ReqKind::Recv(Matching::Posted { any_source: src == Source::Any });
        }
        self.count_receive(src);
        if let Some((from, i)) = found {
            let ux = self.peers[from as usize].unexpected.remove(i).expect("index from find_unexpected");
            self.match_unexpected(id, from, ux);
            return Ok(id);
        }
        match src {
            Source::Any => self.wild.push_back(id),
            Source::Rank(r) => {
                if r != self.me {
                    self.maybe_send_rtr(id, r, tag, ctx, buf.len);
                }
                self.peers[r as usize].posted.push_back(id);
            }
        }
        Ok(id)
    }

    /// [`Engine::post_recv`] once a message matched: unexpected message `i` of `from`, taken
    /// when it is an eager one that arrived whole and fits. Out of line: a receive mostly finds
    /// none.
    ///
    /// # Safety
    /// As for [`Engine::post_recv`].
    #[inline(never)]
    pub(super) unsafe fn take_unexpected(
        &mut self,
        src: Source,
        from: Rank,
        i: usize,
        buf: RegionMut,
    ) -> Option<Status> {
        let u = &self.peers[from as usize].unexpected[i];
        match &u.body {
            UxBody::Eager { received, .. } if *received == u.len && u.len <= buf.len => {}
            _ => return None,
        }
        self.touched();
        self.count_receive(src);
        let ux = self.peers[from as usize].unexpected.remove(i)?;
        let UxBody::Eager { data, .. } = ux.body else { return None };
        // SAFETY: ux.len <= buf.len (checked above) and data holds ux.len bytes; the caller
        // guarantees the buffer.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), buf.ptr, ux.len) };
        self.spare.give_back(data);
        Some(Status { source: from, tag: ux.tag, len: ux.len })
    }

    /// [`Engine::post_recv`] of a blocking receive that nothing unexpected matches: parks it
    /// when it may (see there); whether it did. The caller keeps `buf` as `post_recv` says.
    pub(super) fn park_recv(&mut self, src: Source, tag: TagMatch, space: SpaceId, buf: RegionMut) -> bool {
        let ctx = space.0;
        let Source::Rank(from) = src else { return false };
        if self.parked.is_some() || !self.wild.is_empty() {
            return false;
        }
        let Some(p) = self.peers.get(from as usize) else { return false };
        // What the peer sends eagerly, as its placement rule says (anything else still meets
        // the parked receive, which then becomes a request).
        let eager = placement_says_eager(p, buf.len)
            .or_else(|| p.route.as_ref().map(|r| !r.lookup(buf.len).protocol.is_one_sided()))
            .unwrap_or(false);
        if !eager || p.gone.is_some() || !p.posted.is_empty() {
            return false;
        }
        self.touched();
        self.count_receive(src);
        self.parked = Some(Parked { from, tag, ctx, buf, end: None });
        true
    }

    /// Ends the parked receive once it settled (it took its message, failed, or became a
    /// request) and says what became of it; `None` while it still waits. `give_up` ends it
    /// whatever it does ([`Unparked::Withdrawn`] if nothing happened yet). Once it ended, the
    /// engine no longer uses its buffer, unless it became a request. With nothing parked:
    /// [`Unparked::Withdrawn`].
    pub fn poll_parked(&mut self, give_up: bool) -> Option<Unparked> {
        if !give_up && self.parked_waiting() {
            return None;
        }
        Some(self.end_parked())
    }

    /// Whether the parked receive still waits ([`Engine::poll_parked`] would say `None`): a
    /// blocking receive's wait asks on every poll, and moving how it ended out each time would
    /// cost more than the answer.
    #[inline]
    pub fn parked_waiting(&self) -> bool {
        self.parked.as_ref().is_some_and(|p| p.end.is_none())
    }

    /// [`Engine::poll_parked`] once the parked receive ends.
    fn end_parked(&mut self) -> Unparked {
        self.touched();
        self.parked.take().and_then(|p| p.end).unwrap_or(Unparked::Withdrawn)
    }

    /// A packet `hdr` from `from` that starts a message, in order. When it matches the parked
    /// receive: copies a whole eager message that fits into it (`true`: done), or else turns
    /// the receive into a posted request, which the packet then meets as usual.
    #[inline]
    pub(super) fn meet_parked(&mut self, from: Rank, hdr: &Header, payload: &[u8]) -> bool {
        let Some(p) = self.parked.as_mut() else { return false };
        if p.from != from || p.ctx != hdr.ctx || !p.tag.matches(hdr.tag) || p.end.is_some() {
            return false;
        }
        if hdr.kind == PacketKind::Eager && payload.len() as u64 == hdr.len && payload.len() <= p.buf.len {
            // SAFETY: payload.len() <= buf.len; post_recv's caller keeps the buffer valid and
            // unaliased while it is parked.
            unsafe { std::ptr::copy_nonoverlapping(payload.as_ptr(), p.buf.ptr, payload.len()) };
            p.end = Some(Unparked::Done(Ok(Status { source: from, tag: hdr.tag, len: payload.len() })));
            return true;
        }
        let (tag, ctx, buf) = (p.tag, p.ctx, p.buf);
        let (id, req) = self.reqs.insert(Dir::Recv, from, tag, ctx, buf.ptr, buf.len);
        req.order = self.post_counter;
        self.post_counter += 1;
        self.peers[from as usize].posted.push_back(id);
        self.parked.as_mut().expect("checked above").end = Some(Unparked::Promoted(id));
        false
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
}
