//! polyrail-conformance: one suite of cases that every channel (every [`Transport`]) must pass,
//! each case run only where the channel's `attr().caps` claim what it tests, as UCX's
//! `UCT_INSTANTIATE_TEST_CASE` with `check_caps` does.
//!
//! A channel crate instantiates the suite in one of its tests: a [`PairMaker`] builds a fresh
//! pair of connected endpoints for every case (two endpoints of one job in this process with
//! [`Pair::connect`], or one endpoint that talks to itself with [`Pair::loopback`]), and
//! [`run_suite`] runs every case, drives both endpoints' `progress` wherever something has to
//! complete, and panics naming every case that failed:
//!
//! ```ignore
//! let mine = maker("mine", || Pair::connect(Mine::new(0)?, info(0), Mine::new(1)?, info(1)));
//! let report = polyrail_conformance::run_suite(&mine);
//! assert!(report.skipped.is_none(), "{report}");
//! ```
//!
//! A maker answers `Err(why)` when the channel cannot start here (no device, no permission to
//! read another process's memory): the channel is then skipped with that reason printed, not
//! failed, unless `CONFORMANCE_REQUIRE` names it (a comma-separated list of channel
//! names, or `all`: for machines where every channel must run). A known defect is declared with
//! [`FnMaker::expect_failure`] until it is fixed: reported, not raised. A test binary that
//! installs [`CountingAllocator`] also gets the check that `try_send` and `progress` do not
//! allocate.
//!
//! The cases (see [`CASES`]) cover what [`Transport`] promises: active messages of every size
//! up to `max_eager` in order and intact with their headers, refusals where a capability is
//! absent, one-sided `get`/`put` through registrations of both lifetimes (stand-in buffers included), `flush`,
//! completions through `progress` for channels without [`Caps::RMA_INLINE_COMPLETION`],
//! bounds and keys checked, peers never added refused with an error, observations, wake-ups,
//! `check_peers` and `finalize`.
#![deny(missing_docs)]

mod cases;
mod pair;
mod reach;

pub use pair::Pair;

use polyrail_core::{Caps, Transport};
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Builds pairs of connected endpoints of one channel, a fresh pair for every case.
pub trait PairMaker {
    /// The channel's name in reports (`shm`, `ib (soft)`).
    fn name(&self) -> String;

    /// A new pair of connected endpoints; `Err` says why the channel cannot run here.
    fn make(&self) -> Result<Pair, String>;

    /// Cases the channel is known to fail, each with what is wrong: their failures are
    /// reported, not raised, and a listed case that passes fails the suite (remove it then).
    fn expected_failures(&self) -> &[(&'static str, &'static str)] {
        &[]
    }
}

/// A [`PairMaker`] made of a name and a closure; see [`maker`].
pub struct FnMaker<F> {
    name: String,
    make: F,
    expected_failures: Vec<(&'static str, &'static str)>,
}

/// A [`PairMaker`] that calls `make` for every pair.
pub fn maker<F: Fn() -> Result<Pair, String>>(name: impl Into<String>, make: F) -> FnMaker<F> {
    FnMaker { name: name.into(), make, expected_failures: Vec::new() }
}

impl<F> FnMaker<F> {
    /// Declares that the channel fails `case` for the reason `why` (a known defect, until fixed;
    /// see [`PairMaker::expected_failures`]).
    pub fn expect_failure(mut self, case: &'static str, why: &'static str) -> FnMaker<F> {
        self.expected_failures.push((case, why));
        self
    }
}

impl<F: Fn() -> Result<Pair, String>> PairMaker for FnMaker<F> {
    fn name(&self) -> String {
        self.name.clone()
    }

    fn make(&self) -> Result<Pair, String> {
        (self.make)()
    }

    fn expected_failures(&self) -> &[(&'static str, &'static str)] {
        &self.expected_failures
    }
}

/// One case of the suite: its name and what it checks.
#[derive(Clone, Copy, Debug)]
pub struct Case {
    /// Short name, as reports give it.
    pub name: &'static str,
    /// What it checks, and for which capabilities.
    pub about: &'static str,
    run: fn(&mut Pair) -> Outcome,
}

/// What a case did with a pair.
#[derive(Debug)]
enum Outcome {
    /// It ran and passed.
    Passed,
    /// It does not apply to this channel, and why (a capability absent, one endpoint only).
    NotApplicable(String),
}

/// Every case of the suite, in the order [`run_suite`] runs them.
pub const CASES: &[Case] = cases::ALL;

/// What [`run_suite`] did for one channel.
#[derive(Clone, Debug, Default)]
pub struct Report {
    /// The channel's name.
    pub channel: String,
    /// Why the whole channel was skipped (its maker could not make a pair), if it was.
    pub skipped: Option<String>,
    /// The cases that ran and passed.
    pub passed: Vec<&'static str>,
    /// The cases that do not apply to the channel, and why.
    pub not_applicable: Vec<(&'static str, String)>,
    /// What passing cases noted: the channel's answers, paths a case could not take here.
    pub notes: Vec<(&'static str, String)>,
    /// Cases that failed as the maker expected: the known defect, and the failure.
    pub expected_failures: Vec<(&'static str, String)>,
}

impl Report {
    /// Whether case `name` ran (and passed).
    pub fn ran(&self, name: &str) -> bool {
        self.passed.contains(&name)
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(why) = &self.skipped {
            return write!(f, "conformance: {} SKIPPED: {why}", self.channel);
        }
        write!(
            f,
            "conformance: {}: {} cases passed, {} not applicable\n  passed: {}",
            self.channel,
            self.passed.len(),
            self.not_applicable.len(),
            self.passed.join(", ")
        )?;
        for (case, why) in &self.not_applicable {
            write!(f, "\n  not applicable: {case} ({why})")?;
        }
        for (case, what) in &self.notes {
            write!(f, "\n  note: {case}: {what}")?;
        }
        for (case, what) in &self.expected_failures {
            write!(f, "\n  EXPECTED FAILURE: {case}: {what}")?;
        }
        Ok(())
    }
}

/// Whether `CONFORMANCE_REQUIRE` says channel `name` must not be skipped.
fn required(name: &str) -> bool {
    std::env::var("CONFORMANCE_REQUIRE").is_ok_and(|v| v.split(',').map(str::trim).any(|n| n == "all" || n == name))
}

/// The text of a panic's payload.
fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else {
        "a panic without a message".to_string()
    }
}

/// Runs every case of [`CASES`] that applies to the channel `maker` builds, each on a fresh
/// pair, and prints the [`Report`]. Panics, once every case ran, naming each case that failed
/// (but those the maker expects to fail) and each expected failure that passed;
/// when the maker cannot make a pair at all, prints why and returns a report of a skipped
/// channel (or panics if `CONFORMANCE_REQUIRE` names the channel).
pub fn run_suite<M: PairMaker + ?Sized>(maker: &M) -> Report {
    let channel = maker.name();
    let mut report = Report { channel: channel.clone(), ..Report::default() };
    let mut failed: Vec<(&'static str, String)> = Vec::new();
    let expected = maker.expected_failures();
    for (case, _) in expected.iter().filter(|(c, _)| !CASES.iter().any(|k| k.name == *c)) {
        failed.push((case, "listed as an expected failure, but there is no such case".into()));
    }
    let known = |case: &str| expected.iter().find(|(c, _)| *c == case).map(|(_, why)| *why);
    for (i, case) in CASES.iter().enumerate() {
        let mut pair = match maker.make() {
            Ok(p) => p,
            Err(why) if i == 0 => {
                assert!(!required(&channel), "conformance: {channel} cannot run here, but it is required: {why}");
                report.skipped = Some(why);
                println!("{report}");
                return report;
            }
            Err(why) => {
                failed.push((case.name, format!("no pair made: {why}")));
                continue;
            }
        };
        pair.name = format!("{channel}: {}", case.name);
        let outcome = catch_unwind(AssertUnwindSafe(move || {
            let outcome = (case.run)(&mut pair);
            pair.assert_no_unexpected_loss();
            (outcome, std::mem::take(&mut pair.notes))
        }));
        match (outcome, known(case.name)) {
            (Ok((Outcome::NotApplicable(na), _)), Some(_)) => {
                failed.push((case.name, format!("listed as an expected failure, but it does not apply here ({na})")))
            }
            (Ok(_), Some(why)) => failed
                .push((case.name, format!("passes now, but was expected to fail ({why}): remove the expectation"))),
            (Ok((Outcome::Passed, notes)), None) => {
                report.passed.push(case.name);
                report.notes.extend(notes.into_iter().map(|n| (case.name, n)));
            }
            (Ok((Outcome::NotApplicable(why), _)), None) => report.not_applicable.push((case.name, why)),
            (Err(payload), Some(why)) => {
                report.expected_failures.push((case.name, format!("{why} (failed: {})", panic_text(payload.as_ref()))))
            }
            (Err(payload), None) => failed.push((case.name, panic_text(payload.as_ref()))),
        }
    }
    println!("{report}");
    if !failed.is_empty() {
        let list: Vec<String> = failed.iter().map(|(case, why)| format!("  {case}: {why}")).collect();
        panic!("conformance: {channel}: {} of {} cases failed:\n{}", failed.len(), CASES.len(), list.join("\n"));
    }
    report
}

/// Whether channel `t` claims every capability of `want`.
fn has(t: &mut dyn Transport, want: Caps) -> bool {
    t.attr().caps.contains(want)
}

thread_local! {
    /// Allocations of this thread counted by [`CountingAllocator`].
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

/// The system allocator, counting each thread's allocations, so that the suite can check that
/// `try_send` and `progress` do not allocate once warm (the case is not applicable without it).
/// A test binary installs it with
/// `#[global_allocator] static ALLOC: CountingAllocator = CountingAllocator;`.
#[derive(Clone, Copy, Debug, Default)]
pub struct CountingAllocator;

impl CountingAllocator {
    fn count() {
        // `try_with`: nothing is counted while the thread's locals are torn down.
        let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
    }
}

// SAFETY: every call goes to the system allocator with the arguments it was given; counting
// touches only a constant-initialized thread-local counter, which does not allocate.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        Self::count();
        // SAFETY: forwarded as received.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        Self::count();
        // SAFETY: forwarded as received.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        Self::count();
        // SAFETY: forwarded as received.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded as received.
        unsafe { System.dealloc(ptr, layout) }
    }
}

/// Allocations the calling thread made so far, as [`CountingAllocator`] counts them.
fn allocations() -> u64 {
    ALLOCATIONS.with(Cell::get)
}

/// Whether [`CountingAllocator`] is the global allocator (an allocation is counted).
fn counting() -> bool {
    let before = allocations();
    drop(std::hint::black_box(Box::new(0u64)));
    allocations() > before
}
