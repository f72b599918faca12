//! The send path: the inline fast path, `post_send` choosing the protocol, eager packets, the
//! RTS of each rendezvous, and the sender's side of receive-first hints (`Rtr`).

use super::adapting::placement_says_eager;
use super::requests::{Dir, ExposeFor, SendWait};
use super::types::{op_id, Action, OpKind, Payload, ReqId, SpaceId, TagMatch};
use super::{am_of, Engine, Outgoing, Peer, Rtr, MAX_EAGER_LEN, MAX_RTR_PLACE, SEND_HISTORY};
use crate::adapt::SendFacts;
use crate::error::{Error, Rank, Result};
use crate::header::{Envelope, Header, PacketKind};
use crate::policy::{ChannelId, Protocol};
use crate::transport::{PeerAccess, Region, RemoteKey};
use std::collections::VecDeque;
use std::ops::Range;

/// Whether `buf` lies inside one of `ranges`, which are sorted by start and disjoint (distinct
/// live mappings): only the last range starting at or before `buf` can hold it.
pub(super) fn in_ranges(ranges: &[Range<usize>], buf: Region) -> bool {
    let start = buf.ptr as usize;
    let i = ranges.partition_point(|r| r.start <= start);
    i > 0 && start.saturating_add(buf.len) <= ranges[i - 1].end
}

impl Engine {
    /// The fast path of a small send: when the message `buf` to `to` goes eager in one packet,
    /// assigns its sequence id and returns the channel and envelope to send it with now, without
    /// a request (its header is `envelope.header(buf.len)`). If that send does not happen (the
    /// channel would block), hand the message to [`Engine::post_send`] as
    /// [`Outgoing::Prepared`]; it has its place in the pair's order already.
    #[inline(always)]
    pub fn inline_send(&mut self, to: Rank, tag: u32, space: SpaceId, buf: Region) -> Option<(ChannelId, Envelope)> {
        let ctx = space.0;
        let len = buf.len;
        let placement_from = self.placement_from;
        let peer = self.peers.get_mut(to as usize)?;
        let route = peer.route.as_ref()?;
        if peer.gone.is_some() || len > route.frag || route.entries[0].upto < len {
            return None;
        }
        if len >= placement_from && placement_says_eager(peer, len) == Some(false) {
            return None; // single copy while the peer is apart (post_send)
        }
        if route.mapped.as_ref().is_some_and(|m| len >= m.from) && in_ranges(&self.mapped, buf) {
            return None; // single copy from mapped memory (post_send)
        }
        let am = route.am;
        let seq = peer.next_send_seq;
        peer.next_send_seq = seq.wrapping_add(1);
        peer.history[seq as usize % SEND_HISTORY] = (tag, ctx);
        if !peer.rtrs.is_empty() {
            Self::take_rtr(peer, tag, ctx);
        }
        Some((am, Envelope::new(ctx, tag, seq)))
    }

    /// Starts sending `buf` to `to`: a new message ([`Outgoing::Message`]), or one
    /// [`Engine::inline_send`] prepared that could not leave at once ([`Outgoing::Prepared`],
    /// which is only queued and cannot fail).
    ///
    /// # Safety
    /// `buf` must stay valid and unmodified until the request's result was taken (or the
    /// request failed).
    #[inline]
    pub unsafe fn post_send(&mut self, to: Rank, msg: Outgoing, buf: Region) -> Result<ReqId> {
        match msg {
            // SAFETY: forwarded to the caller.
            Outgoing::Message { tag, space } => unsafe { self.post_message(to, tag, space, buf) },
            // SAFETY: forwarded to the caller.
            Outgoing::Prepared { channel, hdr } => Ok(unsafe { self.post_prepared(to, channel, hdr, buf) }),
        }
    }

    /// [`Outgoing::Prepared`]: queues the message as its request's one send action.
    ///
    /// # Safety
    /// As for [`Engine::post_send`].
    #[inline(never)]
    unsafe fn post_prepared(&mut self, to: Rank, channel: ChannelId, hdr: Header, buf: Region) -> ReqId {
        self.touched();
        let (id, req) = self.reqs.insert(Dir::Send, to, TagMatch::Tag(hdr.tag), hdr.ctx, buf.ptr as *mut u8, buf.len);
        (req.seq, req.len, req.pending) = (hdr.seq, buf.len, 1);
        let op = Some(op_id(id, OpKind::Sent));
        self.actions.push_back(Action::Send { channel, to, hdr, payload: Payload::User(buf), op });
        id
    }

    /// [`Outgoing::Message`]: a new message with `tag` in `space`, by the protocol its route and
    /// the adaptations choose.
    ///
    /// # Safety
    /// As for [`Engine::post_send`].
    #[inline(never)]
    unsafe fn post_message(&mut self, to: Rank, tag: u32, space: SpaceId, buf: Region) -> Result<ReqId> {
        let ctx = space.0;
        self.touched();
        let from_mapped = in_ranges(&self.mapped, buf);
        let peer = self.usable_peer(to)?;
        // A stream: no message came from the peer since our last send to it.
        let streaming = peer.last_send_at.replace(peer.expected_seq) == Some(peer.expected_seq);
        let Some(route) = peer.route.as_ref() else {
            let why = peer.unreachable.clone().unwrap_or_else(|| "no route was set for it".into());
            return Err(Error::Unreachable { rank: to, why });
        };
        let entry = route.lookup(buf.len);
        let (mut protocol, mut data_ch, am, frag) = (entry.protocol, entry.channel, route.am, route.frag);
        // From memory the peer maps, the receiver's single copy costs what one memcpy does:
        // cheaper than two copies through send cells from a smaller size, and in a stream too.
        let mapped = route.mapped.as_ref().filter(|m| from_mapped && buf.len >= m.from);
        if let Some(m) = mapped.filter(|_| protocol == Protocol::Eager) {
            (protocol, data_ch) = (Protocol::RndvGet, m.channel);
        }
        // The run-time adaptations move it between eager and single copy where the route's
        // rules allow it (placement of the peer's core, skew feedback, streams: crate::adapt).
        let facts = SendFacts { len: buf.len, route, protocol, mapped: mapped.is_some(), streaming };
        (protocol, data_ch) = peer.adapt.advise(&facts).apply(protocol, data_ch, am);
        // No setting sends more eagerly than a receiver takes (POLYRAIL_ROUTE, POLYRAIL_SKEW,
        // a CMA threshold or an apart size beyond it): such a message is streamed instead.
        if protocol == Protocol::Eager && buf.len as u64 > MAX_EAGER_LEN {
            (protocol, data_ch) = (Protocol::RndvStream, am);
        }
        let seq = peer.next_send_seq;
        peer.next_send_seq = seq.wrapping_add(1);
        peer.history[seq as usize % SEND_HISTORY] = (tag, ctx);
        let rtr = Self::take_rtr(peer, tag, ctx);
        let (id, req) = self.reqs.insert(Dir::Send, to, TagMatch::Tag(tag), ctx, buf.ptr as *mut u8, buf.len);
        req.seq = seq;
        req.len = buf.len;
        req.protocol = protocol;
        req.channel = data_ch;
        match protocol {
            Protocol::Eager => {
                let mut hdr = Header::new(PacketKind::Eager);
                (hdr.tag, hdr.ctx, hdr.seq, hdr.len) = (tag, ctx, seq, buf.len as u64);
                req.pending = Self::push_chunks(&mut self.actions, am, to, hdr, buf, frag, id);
                if req.pending == 0 {
                    req.finish_ok();
                }
            }
            Protocol::RndvStream => self.send_stream_rts(id),
            Protocol::RndvGet | Protocol::RndvSplit => match rtr {
                Some(rtr) if rtr.cap >= buf.len => {
                    // Receiver first: we write (all, or the back part when splitting).
                    let split = if protocol == Protocol::RndvSplit { self.split_point(id, to, buf.len) } else { 0 };
                    let req = self.reqs.get_mut(id).expect("request made above");
                    req.split = split;
                    req.peer_key = Some(Box::new(rtr.key));
                    req.peer_req = rtr.rreq;
                    req.pending = 1 + (split > 0) as u32; // own put, then the receiver's FIN
                    req.set_send_wait(if split > 0 { SendWait::Fin } else { SendWait::Nothing });
                    if split > 0 {
                        req.expose_for = Some(ExposeFor::RtsAfterRtr);
                        self.actions.push_back(Action::Register {
                            channel: data_ch,
                            region: buf,
                            access: PeerAccess::Read,
                            op: op_id(id, OpKind::Exposed),
                        });
                    } else {
                        self.send_rts_after_rtr(id, None);
                    }
                }
                _ => {
                    // Sender first: expose, then RTS; the receiver's FIN ends it.
                    req.pending = 1;
                    req.set_send_wait(SendWait::Answer);
                    req.expose_for = Some(ExposeFor::Rts);
                    self.actions.push_back(Action::Register {
                        channel: data_ch,
                        region: buf,
                        access: PeerAccess::Read,
                        op: op_id(id, OpKind::Exposed),
                    });
                }
            },
        }
        Ok(id)
    }

    /// Queues `hdr` + `buf` split into packets of at most `frag` bytes: the first with
    /// `hdr`, the others as `Frag`/`Data` with their offset. Returns the number of packets.
    pub(super) fn push_chunks(
        actions: &mut VecDeque<Action>,
        channel: ChannelId,
        to: Rank,
        hdr: Header,
        buf: Region,
        frag: usize,
        id: ReqId,
    ) -> u32 {
        let op = Some(op_id(id, OpKind::Sent));
        let mut off = 0;
        let mut n = 0;
        loop {
            let chunk = (buf.len - off).min(frag);
            let mut h = hdr;
            if n > 0 && hdr.kind == PacketKind::Eager {
                h = Header::new(PacketKind::Frag);
                h.seq = hdr.seq;
            }
            h.offset = off as u64;
            // SAFETY: off + chunk <= buf.len; the caller promised buf is valid.
            let region = Region { ptr: unsafe { buf.ptr.add(off) }, len: chunk };
            actions.push_back(Action::Send { channel, to, hdr: h, payload: Payload::User(region), op });
            n += 1;
            off += chunk;
            if off >= buf.len {
                return n;
            }
        }
    }

    /// Counts a send of `(tag, ctx)` against the receive-first hints: returns the one for the
    /// receive this send will match, whatever protocol it uses; the send moves the others for
    /// the same messages one place closer.
    pub(super) fn take_rtr(peer: &mut Peer, tag: u32, ctx: u16) -> Option<Rtr> {
        if peer.rtrs.is_empty() {
            return None;
        }
        let mut taken = None;
        peer.rtrs.retain_mut(|r| {
            if r.ctx != ctx || !r.tag.matches(tag) {
                return true;
            }
            if r.ahead > 0 {
                r.ahead -= 1;
                return true;
            }
            // This send takes that receive. A second hint for the same place (only a confused
            // peer sends one) names a receive no send can reach now: drop it too.
            if taken.is_none() {
                taken = Some(*r);
            }
            false
        });
        taken
    }

    /// Sends the RTS of send `id` whose data goes through active messages once the receiver's
    /// CTS asks for it.
    pub(super) fn send_stream_rts(&mut self, id: ReqId) {
        let req = self.reqs.get_mut(id).expect("live request");
        let am = am_of(&self.peers, req.peer);
        (req.protocol, req.channel) = (Protocol::RndvStream, am);
        req.pending = 1; // the receiver's CTS
        req.set_send_wait(SendWait::Answer); // its CTS, or its truncation FIN
        self.send_rts(id, Header::STREAM, Payload::Empty);
    }

    /// Sends the RTS of sender-first send `id`, with `flags` and `payload` (our key, or none
    /// for a stream).
    pub(super) fn send_rts(&mut self, id: ReqId, flags: u8, payload: Payload) {
        let req = self.reqs.get(id).expect("live request");
        let mut hdr = Header::new(PacketKind::Rts);
        (hdr.flags, hdr.tag, hdr.ctx, hdr.seq, hdr.len, hdr.sreq) =
            (flags, req.tag_value(), req.ctx, req.seq, req.len as u64, id.wire());
        let (to, am) = (req.peer, am_of(&self.peers, req.peer));
        self.actions.push_back(Action::Send { channel: am, to, hdr, payload, op: None });
    }

    /// Receiver-first send: RTS naming the receiver's request (and our key when it pulls the
    /// front), then our put of the back.
    pub(super) fn send_rts_after_rtr(&mut self, id: ReqId, key: Option<RemoteKey>) {
        let req = self.reqs.get(id).expect("live request");
        let mut hdr = Header::new(PacketKind::Rts);
        (hdr.tag, hdr.ctx, hdr.seq, hdr.len, hdr.sreq, hdr.rreq, hdr.offset) =
            (req.tag_value(), req.ctx, req.seq, req.len as u64, id.wire(), req.peer_req, req.split as u64);
        let (to, am) = (req.peer, am_of(&self.peers, req.peer));
        let payload = key.map_or(Payload::Empty, Payload::Key);
        self.actions.push_back(Action::Send { channel: am, to, hdr, payload, op: None });
        self.start_own_copy(id);
    }

    pub(super) fn on_rtr(&mut self, from: Rank, hdr: Header, payload: &[u8]) -> Result<()> {
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
}
