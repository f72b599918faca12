//! Cancellation: withdrawing receives (`cancel_recv`, at `finalize`), the `Withdraw`/`Withdrawn`
//! exchange with the sender holding a receive's key, and discarding requests.

use super::requests::{ExposeFor, Matching, ReqKind};
use super::types::{Action, Payload, ReqId};
use super::{am_of, CancelRecv, Engine, Finalize, Finalized};
use crate::error::{Error, Rank, Result};
use crate::header::{Header, PacketKind};

impl Engine {
    /// A step of finalize ([`Finalize`]): what it did ([`Finalized`]).
    pub fn finalize(&mut self, step: Finalize) -> Finalized {
        match step {
            Finalize::Withdraw => Finalized { receives: self.withdraw_unmatched(), peer_may_write: Vec::new() },
            Finalize::Abandon => self.abandon_lent(),
        }
    }

    /// [`Finalize::Withdraw`]; how many receives.
    fn withdraw_unmatched(&mut self) -> usize {
        self.touched();
        let ids: Vec<ReqId> = self
            .reqs
            .ids()
            .filter(|&id| self.reqs.get(id).is_some_and(|r| r.unmatched() && r.result.is_none()))
            .collect();
        for &id in &ids {
            if !self.ask_withdrawal(id) {
                self.fail(
                    id,
                    Error::InvalidArgument(
                        "receive cancelled: the process finished before a message matched it".into(),
                    ),
                );
            }
        }
        ids.len()
    }

    /// [`Finalize::Abandon`].
    fn abandon_lent(&mut self) -> Finalized {
        let ids: Vec<(ReqId, bool)> = self
            .reqs
            .ids()
            .filter_map(|id| {
                let r = self.reqs.get(id).filter(|r| r.result.is_none())?;
                let asked = r.withdrawal_asked();
                (asked || self.lent_to_live_peer(r)).then_some((id, asked))
            })
            .collect();
        for &(id, asked) in &ids {
            let why = if asked {
                "receive cancelled: its sender did not answer the withdrawal"
            } else {
                "receive abandoned while its sender still held its buffer's key"
            };
            self.fail(id, Error::InvalidArgument(why.into()));
        }
        Finalized { receives: ids.len(), peer_may_write: std::mem::take(&mut self.peer_may_write) }
    }

    /// Withdraws a receive that no message has matched (`MPI_Cancel`). [`CancelRecv::Cancelled`]:
    /// withdrawn and forgotten (a message for it later goes to the next matching receive).
    /// [`CancelRecv::NotCancelled`], changing nothing: a send, a finished or matched receive.
    /// [`CancelRecv::Asked`]: its RTR gave the sender its key, which that peer may be writing
    /// through, or a later receive's RTR counts it (see `ask_withdrawal`); a `Withdraw` went
    /// to the sender, the receive still matches messages meanwhile, and
    /// [`Engine::phase`] tells how it ends ([`ReqPhase::Withdrawn`](super::ReqPhase::Withdrawn) when the answer comes
    /// before a message; else it finishes with that message, or fails with the peer).
    pub fn cancel_recv(&mut self, req: ReqId) -> CancelRecv {
        let Some(r) = self.reqs.get(req) else { return CancelRecv::NotCancelled };
        if !r.unmatched() || r.result.is_some() {
            return CancelRecv::NotCancelled;
        }
        if r.withdrawal_asked() || self.ask_withdrawal(req) {
            return CancelRecv::Asked;
        }
        // No peer holds its key (else the withdrawal would need its word), nor does its own read
        // run (nothing matched it): nothing may write its buffer.
        let peer_may_write = self.discard(req);
        debug_assert!(!peer_may_write, "a receive withdrawn at once lends its buffer to no one");
        CancelRecv::Cancelled
    }

    /// Sends a `Withdraw` for receive `id` when withdrawing it needs its sender's word; whether
    /// it did. It does when the receive's RTR gave a live peer its key, and also when a receive
    /// posted after it for the same peer and messages (an overlapping tag) sent an RTR: that
    /// RTR's place counts this receive, and were it withdrawn unseen, the send the RTR points
    /// at would write into a receive that took an earlier message.
    pub(super) fn ask_withdrawal(&mut self, id: ReqId) -> bool {
        let Some(r) = self.reqs.get(id) else { return false };
        let (peer, tag, ctx) = (r.peer, r.tag, r.ctx);
        if r.any_source() || !self.peer_alive(peer) {
            return false;
        }
        if !r.withdrawal_asked() {
            let posted = &self.peers[peer as usize].posted;
            let later_rtr = || {
                let mut later = posted.iter().skip_while(|&&q| q != id).skip(1).filter_map(|q| self.reqs.get(*q));
                later.any(|q| {
                    (q.rtr_sent || q.expose_for == Some(ExposeFor::Rtr)) && q.ctx == ctx && q.tag.overlaps(tag)
                })
            };
            if !r.lends_key() && !later_rtr() {
                return false;
            }
            // Only an unmatched receive is withdrawn (the callers check).
            self.reqs.get_mut(id).expect("checked above").kind = ReqKind::Recv(Matching::Withdrawing);
            self.peers[peer as usize].withdrawals += 1;
            let mut hdr = Header::new(PacketKind::Withdraw);
            hdr.rreq = id.wire();
            let am = am_of(&self.peers, peer);
            self.actions.push_back(Action::Send { channel: am, to: peer, hdr, payload: Payload::Empty, op: None });
        }
        true
    }

    /// Forgets a request whose result will never be taken (e.g. its handle was dropped after
    /// an error). A running receive is withdrawn from matching; when that needs its sender's
    /// word ([`Engine::cancel_recv`]'s `Asked`), it stays posted until the answer: a message
    /// that matches it meanwhile is dropped as truncated, or, when the receive's RTR gave the
    /// sender its key, taken into its buffer. Returns whether a peer, or the request's own read
    /// still in flight, may still write into its buffer, which must then never be reused (as
    /// [`Finished::peer_may_write`](super::Finished::peer_may_write) says of a finished one);
    /// this is the only time it is said.
    pub fn discard(&mut self, req: ReqId) -> bool {
        self.forget(req);
        self.take_may_write(req)
    }

    /// [`Engine::discard`], but for the answer.
    fn forget(&mut self, req: ReqId) {
        self.touched();
        self.zombies.retain(|&z| match self.reqs.get(z) {
            Some(r) if r.result.is_none() || r.channel_busy() => true,
            _ => {
                self.reqs.free(z);
                false
            }
        });
        let unmatched = self.reqs.get(req).is_some_and(|r| r.unmatched() && r.result.is_none());
        if unmatched && self.ask_withdrawal(req) {
            let r = self.reqs.get_mut(req).expect("checked above");
            if r.lends_key() {
                // The sender may be writing already (its RTS and FIN follow): the receive ends
                // as usual, in a buffer `discard` names (kept out of use, or the caller's: the
                // process stops).
                self.peer_may_write.push(req);
            } else {
                (r.ptr, r.cap) = (std::ptr::NonNull::dangling().as_ptr(), 0);
            }
            self.zombies.push(req);
            return;
        }
        if self.reqs.get(req).is_some_and(|r| r.result.is_none()) {
            self.fail(req, Error::InvalidArgument("request discarded".into()));
        }
        if let Some(r) = self.reqs.get(req).filter(|r| r.channel_busy()) {
            // Its exposure is on its way (kept until it lands and is ended, `exposed`), or its
            // read is (kept until it completes, so that `copies_in_flight` sees it; the read may
            // still write the buffer, whose owner must not get it back for reuse).
            if r.reading() && !self.peer_may_write.contains(&req) {
                self.peer_may_write.push(req);
            }
            self.zombies.push(req);
            return;
        }
        self.reqs.free(req);
    }

    /// The receiver cancels receive `hdr.rreq`. Every RTR of this receiver we hold is dropped,
    /// not only that one: the others' places may count the withdrawn receive, and once it is
    /// gone a send would take another receive than the one its RTR names. Each dropped RTR,
    /// and the withdrawn receive's whether we held its RTR or not, is answered with a
    /// `Withdrawn` behind every message sent so far; a send that took the receive's RTR
    /// already finishes instead, and the receive with it.
    pub(super) fn on_withdraw(&mut self, from: Rank, hdr: Header) -> Result<()> {
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
    pub(super) fn on_withdrawn(&mut self, from: Rank, hdr: Header) -> Result<()> {
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
}
