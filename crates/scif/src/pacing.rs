//! [`ScifPacer`]: the software SCIF provider's DMA completions paced by the link model
//! (`polyrail-link`, an emulation).

use crate::dma::{Pacer, Transfer};
use polyrail_link::{scif_hops, LinkModel};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How far ahead a link may be booked when CPU stores (ring frames) join it: PCIe posted writes
/// interleave with DMA rather than wait for a whole transfer, up to a queue's worth.
pub const STORE_QUEUE: Duration = Duration::from_micros(64);

/// A [`Pacer`] for the SCIF provider of physical node `node`: host↔device transfers take the
/// model's PCIe paths (which way from the transfer's SCIF nodes), `RMA_USECPU` copies too (they
/// cross the same link). A transfer within one SCIF node is not paced.
#[derive(Debug)]
pub struct ScifPacer {
    model: Arc<LinkModel>,
    node: u32,
}

impl ScifPacer {
    /// Paces the transfers of physical node `node` with `model`.
    pub fn new(model: Arc<LinkModel>, node: u32) -> ScifPacer {
        ScifPacer { model, node }
    }

    /// The pacer `POLYRAIL_LINK_PROFILE` asks for in job `job` on physical node `node`
    /// (`POLYRAIL_NODE`); `None` for the `none` profile (use [`crate::Unpaced`]).
    pub fn from_config(
        config: &polyrail_core::Config,
        job: &str,
        node: u32,
    ) -> polyrail_core::Result<Option<ScifPacer>> {
        let profile = polyrail_link::LinkSettings::from_config(config)?.profile;
        if profile.is_none() {
            return Ok(None);
        }
        Ok(Some(ScifPacer::new(Arc::new(LinkModel::new(profile, job)?), node)))
    }

    /// The model.
    pub fn model(&self) -> &Arc<LinkModel> {
        &self.model
    }

    /// Whether `bytes` a CPU stores from SCIF node `from` into a mapping of node `to`'s memory
    /// may cross now: `false` while a link on the way is booked more than [`STORE_QUEUE`] ahead
    /// (a full write queue); when `true` they take it from `now`. Throttles stores, which no
    /// completion reports, to the link's rate, while they still pass between long DMA transfers
    /// booked ahead of them.
    pub fn admit(&self, from: u16, to: u16, bytes: usize, now: Instant) -> bool {
        let hops = scif_hops(self.node, from, to);
        let full = now + STORE_QUEUE;
        let busy =
            |h: &polyrail_link::Hop| self.model.busy_until(h.node, h.path).ok().flatten().is_some_and(|t| t > full);
        if hops.iter().any(busy) {
            return false;
        }
        // A node file that cannot be opened leaves the stores unpaced rather than failing them.
        let _ = self.model.reserve(&hops, bytes, now);
        true
    }
}

impl Pacer for ScifPacer {
    fn complete_at(&self, transfer: &Transfer, posted: Instant, copied: Instant) -> Instant {
        // The transfer takes the link from its post: a lone one completes at the later of its
        // copy's end and the model's time, a stream of them at the model's rate.
        let hops = scif_hops(self.node, transfer.from, transfer.to);
        // A node file that cannot be opened leaves the transfer unpaced rather than failing it.
        self.model.complete(&hops, transfer.bytes, posted, copied).unwrap_or(copied)
    }
}
