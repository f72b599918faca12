//! The suite itself: a channel that breaks one promise fails the case that checks it, and a
//! channel that cannot start is skipped. The broken channels are `self` with one fault each.

use polyrail_conformance::{maker, run_suite, CountingAllocator, FnMaker, Pair, Report};
use polyrail_core::{
    Address, Caps, Error, Header, Issued, Lifetime, MemHandle, OneSided, OpId, PeerAccess, PeerInfo, Rank, Reach,
    Region, RegionMut, RemoteKey, Result, Sink, Transport, TransportAttr, Wakeup,
};
use polyrail_shm::Loopback;
use std::ops::Range;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Duration;

/// One broken promise.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    /// None: the channel as it is.
    None,
    /// Flips a byte of payloads over 1000 bytes.
    CorruptsLargePayloads,
    /// Clears header flags.
    DropsFlags,
    /// Says Done to messages for ranks it never added (and drops them).
    AcceptsStrangers,
    /// Answers one-sided operations Pending, and never completes them.
    NeverCompletes,
    /// Answers one-sided operations Pending, and completes them twice.
    CompletesTwice,
    /// Writes one byte more than a put asks.
    PutOverruns,
    /// Delivers everything, whatever the budget.
    IgnoresBudget,
    /// Describes itself with nothing.
    SilentDescribe,
    /// Reaches whatever `add_peer` names.
    ReachesAnyone,
    /// Claims WAKEUP and arms with a message waiting.
    ArmsOverArrivals,
    /// Allocates in every `try_send`.
    AllocatesOnSend,
}

#[global_allocator]
static ALLOC: CountingAllocator = CountingAllocator;

/// `self` with a fault.
struct Faulty {
    inner: Loopback,
    fault: Fault,
    attr: TransportAttr,
    /// Completions owed (op ids), delivered by the next `progress`.
    owed: Vec<OpId>,
}

const RANK: Rank = 2;

impl Faulty {
    fn new(fault: Fault) -> Faulty {
        let inner = Loopback::new(RANK);
        let mut attr = inner.attr().clone();
        if matches!(fault, Fault::NeverCompletes | Fault::CompletesTwice) {
            attr.caps = Caps::AM | Caps::GET | Caps::PUT | Caps::SELF_ONLY;
        }
        if fault == Fault::ArmsOverArrivals {
            attr.caps = attr.caps | Caps::WAKEUP;
        }
        Faulty { inner, fault, attr, owed: Vec::new() }
    }

    /// The inner answer to a one-sided operation, made Pending by the faults that do so.
    fn rma(&mut self, op: OpId, issued: Result<Issued>) -> Result<Issued> {
        match (self.fault, issued) {
            (Fault::NeverCompletes, Ok(Issued::Done)) => Ok(Issued::Pending),
            (Fault::CompletesTwice, Ok(Issued::Done)) => {
                self.owed.extend([op, op]);
                Ok(Issued::Pending)
            }
            (_, answer) => answer,
        }
    }
}

/// A sink that applies the payload and header faults on the way up.
struct Tamper<'a> {
    sink: &'a mut dyn Sink,
    fault: Fault,
}

impl Sink for Tamper<'_> {
    fn message(&mut self, from: Rank, hdr: &Header, payload: &[u8]) {
        if !matches!(self.fault, Fault::DropsFlags | Fault::CorruptsLargePayloads) {
            return self.sink.message(from, hdr, payload);
        }
        let (mut hdr, mut payload) = (*hdr, payload.to_vec());
        if self.fault == Fault::DropsFlags {
            hdr.flags = 0;
        }
        if self.fault == Fault::CorruptsLargePayloads && payload.len() > 1000 {
            payload[500] ^= 1;
        }
        self.sink.message(from, &hdr, &payload);
    }

    fn completed(&mut self, op: OpId, result: Result<()>) {
        self.sink.completed(op, result);
    }

    fn peer_lost(&mut self, peer: Rank, why: Error) {
        self.sink.peer_lost(peer, why);
    }
}

impl Transport for Faulty {
    fn attr(&self) -> &TransportAttr {
        &self.attr
    }

    fn address(&self) -> Address {
        self.inner.address()
    }

    fn add_peer(&mut self, peer: &PeerInfo, address: &[u8]) -> Reach {
        match self.fault {
            Fault::ReachesAnyone => Reach::Yes("anyone".into()),
            _ => self.inner.add_peer(peer, address),
        }
    }

    fn try_send(&mut self, peer: Rank, hdr: &Header, payload: &[u8]) -> Result<Issued> {
        if self.fault == Fault::AcceptsStrangers && peer != RANK {
            return Ok(Issued::Done);
        }
        if self.fault == Fault::AllocatesOnSend {
            drop(std::hint::black_box(vec![0u8; 16]));
        }
        self.inner.try_send(peer, hdr, payload)
    }

    fn progress(&mut self, budget: usize, sink: &mut dyn Sink) -> Result<usize> {
        let owed = std::mem::take(&mut self.owed);
        for &op in &owed {
            sink.completed(op, Ok(()));
        }
        let budget = if self.fault == Fault::IgnoresBudget { usize::MAX } else { budget };
        Ok(owed.len() + self.inner.progress(budget, &mut Tamper { sink, fault: self.fault })?)
    }

    fn memory(&mut self) -> Option<&mut dyn OneSided> {
        Some(self)
    }

    fn wakeup(&mut self) -> Option<&mut dyn Wakeup> {
        self.attr.caps.contains(Caps::WAKEUP).then_some(self as &mut dyn Wakeup)
    }

    fn describe(&self) -> String {
        match self.fault {
            Fault::SilentDescribe => String::new(),
            _ => self.inner.describe(),
        }
    }
}

impl OneSided for Faulty {
    fn register(&mut self, region: Region, access: PeerAccess, lifetime: Lifetime) -> Result<MemHandle> {
        OneSided::register(&mut self.inner, region, access, lifetime)
    }

    fn deregister(&mut self, handle: &MemHandle, written: Range<usize>) {
        OneSided::deregister(&mut self.inner, handle, written)
    }

    fn get(&mut self, peer: Rank, key: &RemoteKey, offset: usize, into: RegionMut, op: OpId) -> Result<Issued> {
        let issued = OneSided::get(&mut self.inner, peer, key, offset, into, op);
        self.rma(op, issued)
    }

    fn put(&mut self, peer: Rank, from: Region, key: &RemoteKey, offset: usize, op: OpId) -> Result<Issued> {
        // The suite's sources have guard bytes after them: reading one more is in bounds.
        let from = if self.fault == Fault::PutOverruns { Region { len: from.len + 1, ..from } } else { from };
        let issued = OneSided::put(&mut self.inner, peer, from, key, offset, op);
        self.rma(op, issued)
    }
}

/// Only with [`Fault::ArmsOverArrivals`], which claims `WAKEUP` and arms over arrivals.
impl Wakeup for Faulty {
    fn arm(&mut self) -> bool {
        self.fault == Fault::ArmsOverArrivals
    }

    fn sleep(&mut self, timeout: Duration) {
        std::thread::sleep(timeout.min(Duration::from_millis(1)));
    }

    fn disarm(&mut self) {}
}

fn faulty(fault: Fault) -> FnMaker<impl Fn() -> Result<Pair, String>> {
    let info = PeerInfo {
        rank: RANK,
        pid: std::process::id(),
        host: "h".into(),
        node: 0,
        cpus: vec![],
        own_cpus: true,
        domain: 0,
    };
    let make =
        move || Pair::loopback(Faulty::new(fault), info.clone()).map(|p| p.with_patience(Duration::from_millis(300)));
    maker(format!("self with fault {fault:?}"), make)
}

fn suite(fault: Fault) -> Report {
    run_suite(&faulty(fault))
}

/// The text of the suite's failure.
fn failure_of(run: impl FnOnce() -> Report) -> String {
    let failure = catch_unwind(AssertUnwindSafe(run)).expect_err("the suite passed");
    failure.downcast_ref::<String>().cloned().unwrap_or_default()
}

#[test]
fn a_faithful_wrapper_passes() {
    let report = suite(Fault::None);
    assert_eq!(report.passed.len() + report.not_applicable.len(), polyrail_conformance::CASES.len(), "{report}");
}

#[test]
fn every_broken_promise_fails_its_case() {
    let faults = [
        (Fault::CorruptsLargePayloads, "am_every_size_in_order"),
        (Fault::DropsFlags, "am_headers_arrive_as_sent"),
        (Fault::AcceptsStrangers, "unknown_peers_refused"),
        (Fault::NeverCompletes, "rma_get"),
        (Fault::CompletesTwice, "rma_many_in_flight"),
        (Fault::PutOverruns, "rma_put"),
        (Fault::IgnoresBudget, "am_progress_respects_budget"),
        (Fault::SilentDescribe, "describe_is_one_line"),
        (Fault::ReachesAnyone, "bad_addresses_refused"),
        (Fault::ArmsOverArrivals, "wakeup"),
        (Fault::AllocatesOnSend, "no_allocation_in_steady_state"),
    ];
    for (fault, case) in faults {
        let text = failure_of(|| suite(fault));
        assert!(text.contains(&format!("  {case}: ")), "{fault:?} did not fail {case}: {text}");
    }
}

/// A known defect is reported, not raised, until it is fixed; then the suite says so.
#[test]
fn expected_failures_are_reported_until_fixed() {
    let case = "am_progress_respects_budget";
    let report = run_suite(&faulty(Fault::IgnoresBudget).expect_failure(case, "a known defect"));
    assert!(
        matches!(&report.expected_failures[..], [(c, why)] if *c == case && why.starts_with("a known defect")),
        "{report}"
    );
    assert!(!report.ran(case) && report.to_string().contains("EXPECTED FAILURE"), "{report}");
    let text = failure_of(|| run_suite(&faulty(Fault::None).expect_failure(case, "a known defect")));
    assert!(text.contains(&format!("  {case}: passes now")), "{text}");
    let text = failure_of(|| run_suite(&faulty(Fault::None).expect_failure("no_such_case", "a typo")));
    assert!(text.contains("  no_such_case: listed as an expected failure, but there is no such case"), "{text}");
}

/// Skipped, or failed where `CONFORMANCE_REQUIRE` requires every channel.
#[test]
fn a_channel_that_cannot_start_is_skipped() {
    let nothing = maker("nothing", || Err("no such device here".to_string()));
    let required = std::env::var("CONFORMANCE_REQUIRE").is_ok_and(|v| v.split(',').any(|n| n.trim() == "all"));
    if required {
        assert!(catch_unwind(|| run_suite(&nothing)).is_err(), "a required channel was skipped");
        return;
    }
    let report = run_suite(&nothing);
    assert_eq!(report.skipped.as_deref(), Some("no such device here"));
    assert!(report.passed.is_empty() && report.to_string().contains("SKIPPED"), "{report}");
}
