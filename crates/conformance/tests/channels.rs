//! The conformance suite instantiated for every channel of this version: `shm` (two endpoints of
//! a job of three, rank 2 never added), `cma` and `self` (one endpoint talking to itself), and
//! `ib` over the software provider (two endpoints on different virtual nodes), by default and
//! with small rings and compact packets; `scif` between the host and a device of one node (two
//! endpoints over the software SCIF provider), by default and with the smallest rings.

use polyrail_conformance::{maker, run_suite, CountingAllocator, Pair};
use polyrail_core::{Config, PeerInfo, Rank};
use polyrail_ib::IbSettings;
use polyrail_ib::{DirectIb, SoftProvider};
use polyrail_scif::settings::ScifSettings;
use polyrail_scif::{Fabric, FabricConfig, ScifChannel};
use polyrail_shm::{CmaTransport, Loopback, ShmTransport};
use std::sync::atomic::{AtomicU32, Ordering};

/// Counts allocations, so that the suite checks that `try_send` and `progress` make none.
#[global_allocator]
static ALLOC: CountingAllocator = CountingAllocator;

/// The host every endpoint is told its peers run on.
const HOST: &str = "conformance-host";

/// Rank `rank` of this process, on virtual node `node`.
fn info(rank: Rank, node: u32) -> PeerInfo {
    PeerInfo { rank, pid: std::process::id(), host: HOST.into(), node, cpus: vec![], own_cpus: true, domain: 0 }
}

/// A job id unique to this process and call.
fn job() -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    format!("conf{}_{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed))
}

fn shm_pair() -> Result<Pair, String> {
    let job = job();
    let mut cfg = Config::default();
    for (var, value) in [("POLYRAIL_SHM_SLOTS", "64"), ("POLYRAIL_SHM_CELLS", "8"), ("POLYRAIL_SHM_CELL_SIZE", "20000")]
    {
        cfg.set(var, value).expect("shm settings");
    }
    let open = |rank| {
        ShmTransport::new(&cfg, &job, rank, 3).map(|t| t.with_host(HOST)).map_err(|e| format!("shm segment: {e}"))
    };
    Pair::connect(open(0)?, info(0, 0), open(1)?, info(1, 0))
}

fn ib_pair(open: impl Fn() -> SoftProvider, settings: &IbSettings) -> Result<Pair, String> {
    let start = |rank| DirectIb::new(open(), settings, rank, 3).map_err(|e| format!("ib over soft: {e}"));
    // The software provider reaches endpoints of other virtual nodes.
    Pair::connect(start(0)?, info(0, 0), start(1)?, info(1, 1))
}

#[test]
fn shm_passes_the_suite() {
    let report = run_suite(&maker("shm", shm_pair));
    assert!(report.skipped.is_some() || report.ran("am_every_size_in_order") && report.ran("wakeup"), "{report}");
}

#[test]
fn cma_passes_the_suite() {
    let report = run_suite(&maker("cma", || Pair::loopback(CmaTransport::new().with_host(HOST), info(0, 0))));
    assert!(report.skipped.is_some() || report.ran("rma_get") && report.ran("am_refused_without_caps"), "{report}");
}

#[test]
fn loopback_passes_the_suite() {
    let report = run_suite(&maker("self", || Pair::loopback(Loopback::new(2), info(2, 0))));
    assert!(report.ran("am_every_size_in_order") && report.ran("rma_put"), "{report}");
}

#[test]
fn ib_over_the_soft_provider_passes_the_suite() {
    let ib = maker("ib (soft)", || ib_pair(SoftProvider::new, &IbSettings::default()));
    let report = run_suite(&ib);
    assert!(report.skipped.is_some() || report.ran("rma_many_in_flight") && report.ran("am_both_ways"), "{report}");
}

/// Rings of 8 blocks (credits run out all the time) and whole 1 KiB packets sent compact.
#[test]
fn ib_with_small_rings_and_compact_packets_passes_the_suite() {
    let settings = IbSettings { credits: 8, block: 3 * 1024, sync_limit: 2, ..IbSettings::default() };
    let ib = maker("ib (soft, 8 credits, compact)", || ib_pair(|| SoftProvider::with_mtu(1024), &settings));
    let report = run_suite(&ib);
    assert!(report.skipped.is_some() || report.ran("am_headers_arrive_as_sent"), "{report}");
}

/// Rank 0 on the host and rank 1 on device 1 of node 0, in a job of three.
fn scif_pair(settings: &ScifSettings) -> Result<Pair, String> {
    let job = job();
    let start = |rank: Rank, node: u16| {
        let fabric = Fabric::new(FabricConfig::new(std::env::temp_dir(), &job, node, 2))
            .map_err(|e| format!("soft-scif: {e}"))?;
        ScifChannel::new(fabric, settings, rank, 3).map_err(|e| format!("scif: {e}"))
    };
    let on = |rank, domain| PeerInfo { domain, ..info(rank, 0) };
    Pair::connect(start(0, 0)?, on(0, 0), start(1, 1)?, on(1, 1))
}

#[test]
fn scif_between_host_and_device_passes_the_suite() {
    let report = run_suite(&maker("scif", || scif_pair(&ScifSettings::default())));
    assert!(report.skipped.is_some() || report.ran("rma_registered_memory") && report.ran("am_both_ways"), "{report}");
}

/// Rings of 64 KiB: the ring wraps and fills all the time.
#[test]
fn scif_with_small_rings_passes_the_suite() {
    let settings = ScifSettings { ring: 64 << 10, ..ScifSettings::default() };
    let report = run_suite(&maker("scif (64 KiB rings)", || scif_pair(&settings)));
    assert!(report.skipped.is_some() || report.ran("am_every_size_in_order"), "{report}");
}
