//! [`ScifPacer`]: the software SCIF provider's DMA completions paced by the link model.

use crate::model::{scif_hops, LinkModel};
use polyrail_scif::{Pacer, Transfer};
use std::sync::Arc;
use std::time::Instant;

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
    /// (`POLYRAIL_NODE`); `None` for the `none` profile (use `polyrail_scif::Unpaced`).
    pub fn from_config(
        config: &polyrail_core::Config,
        job: &str,
        node: u32,
    ) -> polyrail_core::Result<Option<ScifPacer>> {
        let profile = crate::LinkSettings::from_config(config)?.profile;
        if profile.is_none() {
            return Ok(None);
        }
        Ok(Some(ScifPacer::new(Arc::new(LinkModel::new(profile, job)?), node)))
    }

    /// The model.
    pub fn model(&self) -> &Arc<LinkModel> {
        &self.model
    }
}

impl Pacer for ScifPacer {
    fn complete_at(&self, transfer: &Transfer, copied: Instant) -> Instant {
        // The hook reports only when the copy ended: the transfer is taken to start then, so a
        // lone transfer pays its copy and the model's time, a stream of them the model's rate.
        let hops = scif_hops(self.node, transfer.from, transfer.to);
        // A node file that cannot be opened leaves the transfer unpaced rather than failing it.
        self.model.complete(&hops, transfer.bytes, copied, copied).unwrap_or(copied)
    }
}
