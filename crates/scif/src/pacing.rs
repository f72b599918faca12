//! [`ScifPacer`]: the software SCIF provider's DMA completions paced by the link model
//! (`polyrail-link`, an emulation).

use crate::dma::{Pacer, Transfer};
use polyrail_link::{scif_hops, LinkModel};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How far ahead of now this process's CPU stores (ring frames) may be queued on a link: a
/// posted-write queue of some kilobytes; beyond it a store waits.
pub const STORE_QUEUE: Duration = Duration::from_micros(8);

/// A [`Pacer`] for the SCIF provider of physical node `node`: host↔device transfers take the
/// model's PCIe paths (which way from the transfer's SCIF nodes), `RMA_USECPU` copies too (they
/// cross the same link). A transfer within one SCIF node is not paced.
#[derive(Debug)]
pub struct ScifPacer {
    model: Arc<LinkModel>,
    node: u32,
    /// Until when this process's stores keep each way busy, by (from, to) SCIF node.
    stores: Mutex<Vec<((u16, u16), Instant)>>,
}

impl ScifPacer {
    /// Paces the transfers of physical node `node` with `model`.
    pub fn new(model: Arc<LinkModel>, node: u32) -> ScifPacer {
        ScifPacer { model, node, stores: Mutex::new(Vec::new()) }
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
    /// may cross now: `false` while this process's stores that way are queued more than
    /// [`STORE_QUEUE`] ahead; when `true` they are queued at the slowest hop's rate and take the
    /// node's links too (so DMA transfers meet them). Throttles stores, which no completion
    /// reports, to the link's rate; they pass between DMA transfers rather than wait for them,
    /// as posted writes interleave with DMA on PCIe.
    pub fn admit(&self, from: u16, to: u16, bytes: usize, now: Instant) -> bool {
        let hops = scif_hops(self.node, from, to);
        let links = hops.iter().filter_map(|h| self.model.profile().link(h.path));
        let rate = links.map(|l| l.bandwidth).fold(f64::INFINITY, f64::min);
        if !rate.is_finite() || rate <= 0.0 {
            return true;
        }
        let mut stores = self.stores.lock().unwrap_or_else(|e| e.into_inner());
        let i = stores.iter().position(|(way, _)| *way == (from, to)).unwrap_or_else(|| {
            stores.push(((from, to), now));
            stores.len() - 1
        });
        let busy = &mut stores[i].1;
        if *busy > now + STORE_QUEUE {
            return false;
        }
        *busy = (*busy).max(now) + Duration::from_secs_f64(bytes as f64 / rate);
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
