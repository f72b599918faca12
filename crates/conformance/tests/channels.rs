//! The conformance suite instantiated for every channel of this version: `shm` (two endpoints of
//! a job of three, rank 2 never added), `cma` and `self` (one endpoint talking to itself), and
//! `ib` over the software provider (two endpoints on different virtual nodes), by default and
//! with small rings and compact packets.

use polyrail_conformance::{maker, run_suite, CountingAllocator, Pair};
use polyrail_core::{Config, PeerInfo, Rank};
use polyrail_ib::IbSettings;
use polyrail_ib::{DirectIb, SoftProvider};
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
