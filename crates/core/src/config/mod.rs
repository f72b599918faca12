//! Configuration, read once from `POLYRAIL_*` environment variables.
//!
//! Every field names its variable and its default. An unknown `POLYRAIL_*` variable or a value
//! that does not parse is an [`Error::Config`] naming the variable, the value and what is accepted.

mod vars;

pub use vars::{
    apply_others, did_you_mean, effective, effective_of, infos, set, AutoOffSize, Effective, Value, Var, VarInfo, VARS,
};

use crate::error::{Error, Result};
use crate::policy::topology::TopoClass;
use crate::size::{format_size, parse_size};
use crate::transport::TransportKind;

/// Which transports may be used (`POLYRAIL_TRANSPORTS`).
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub enum TransportFilter {
    /// Every transport that works here (the default; also `all`).
    #[default]
    All,
    /// Only these (`shm,cma`).
    Only(Vec<String>),
    /// All but these (`^cma`).
    Except(Vec<String>),
}

impl TransportFilter {
    /// Whether `kind` may be used. The loopback channel to oneself is always allowed.
    pub fn allows(&self, kind: TransportKind) -> bool {
        self.allows_name(kind.name())
    }

    /// Whether the channel named `name` may be used.
    pub fn allows_name(&self, name: &str) -> bool {
        match self {
            _ if name == TransportKind::SELF.name() => true,
            TransportFilter::All => true,
            TransportFilter::Only(list) => list.iter().any(|n| n == name),
            TransportFilter::Except(list) => !list.iter().any(|n| n == name),
        }
    }

    /// The channels it names.
    pub fn names(&self) -> &[String] {
        match self {
            TransportFilter::All => &[],
            TransportFilter::Only(list) | TransportFilter::Except(list) => list,
        }
    }
}

/// The filter as `POLYRAIL_TRANSPORTS` writes it: `all`, `shm,cma` or `^cma`.
impl std::fmt::Display for TransportFilter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (deny, list) = match self {
            TransportFilter::All => return f.write_str("all"),
            TransportFilter::Only(list) => ("", list),
            TransportFilter::Except(list) => ("^", list),
        };
        write!(f, "{deny}{}", list.join(","))
    }
}

/// A size that may differ by topology class (`16k` or `shared-l3:16k,socket:4k`).
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct ClassSizes {
    /// Size for every class not listed.
    pub all: Option<usize>,
    /// Sizes for named classes.
    pub per_class: Vec<(TopoClass, usize)>,
}

/// The sizes as `POLYRAIL_CMA_THRESHOLD` writes them: `16k` or `shared-l3:16k,socket:4k`.
impl std::fmt::Display for ClassSizes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut parts: Vec<String> = self.per_class.iter().map(|(c, s)| format!("{c}:{}", format_size(*s))).collect();
        parts.extend(self.all.map(format_size));
        f.write_str(&parts.join(","))
    }
}

impl ClassSizes {
    /// The configured size for `class`, if any.
    pub fn get(&self, class: TopoClass) -> Option<usize> {
        self.per_class.iter().find(|(c, _)| *c == class).map(|&(_, s)| s).or(self.all)
    }
}

/// One `POLYRAIL_ROUTE` rule: messages of `lo..=hi` bytes to peers of `class` (all classes
/// when `None`) go over `channel`, with `protocol` when given.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RouteRule {
    /// Peer class the rule applies to (`None`: every class).
    pub class: Option<TopoClass>,
    /// Smallest size of the range.
    pub lo: usize,
    /// Largest size of the range (inclusive).
    pub hi: usize,
    /// Channel name (checked against the build's channels when a job starts).
    pub channel: String,
    /// Protocol name (`eager`, `get`, `split`, `stream`), or the channel's natural one.
    pub protocol: Option<String>,
}

/// The rule as `POLYRAIL_ROUTE` writes it (`socket:1m-:cma/get`).
impl std::fmt::Display for RouteRule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let class = self.class.map_or("all", |c| c.name());
        let hi = if self.hi == usize::MAX { String::new() } else { format_size(self.hi) };
        write!(f, "{class}:{}-{hi}:{}", format_size(self.lo), self.channel)?;
        match &self.protocol {
            Some(p) => write!(f, "/{p}"),
            None => Ok(()),
        }
    }
}

/// Log verbosity (`POLYRAIL_LOG`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Default)]
pub enum LogLevel {
    /// Errors only.
    Error,
    /// Warnings, e.g. a channel that failed its probe (the default).
    #[default]
    Warn,
    /// Channel choices per peer.
    Info,
    /// Every route decision.
    Debug,
    /// Everything.
    Trace,
}

impl LogLevel {
    /// The level's name as `POLYRAIL_LOG` takes it.
    pub fn name(self) -> &'static str {
        match self {
            LogLevel::Error => "error",
            LogLevel::Warn => "warn",
            LogLevel::Info => "info",
            LogLevel::Debug => "debug",
            LogLevel::Trace => "trace",
        }
    }
}

/// Skew feedback settings (`POLYRAIL_SKEW`), see [`Config::skew`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SkewPolicy {
    /// Unexpected messages from one sender above which the receiver counts as lagging.
    pub limit: usize,
    /// Arrivals in a row above the limit before the sender is told.
    pub window: u32,
    /// Largest message the sender then sends eagerly.
    pub eager_up_to: usize,
}

/// Where both processes start to share a single copy (`POLYRAIL_SPLIT_THRESHOLD`), see
/// [`Config::split_threshold`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum SplitThreshold {
    /// Each channel's own measured size ([`crate::TransportAttr::split_from`]).
    #[default]
    Auto,
    /// Never split.
    Off,
    /// From this size, on every channel whose copies the CPUs make.
    From(usize),
}

/// The receiver's part of a split single copy (`POLYRAIL_SPLIT_SHARE`), see
/// [`Config::split_share`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum SplitShare {
    /// Measured per peer and size class among a quarter, three eighths and a half.
    #[default]
    Auto,
    /// This many per cent of every split message (page aligned).
    Percent(u8),
}

/// Largest message any setting may send eagerly: a receiver refuses a longer eager message as a
/// protocol error (it would have to buffer it whole when unexpected).
pub const MAX_EAGER_MESSAGE: usize = 256 << 20;

/// Eager sends in a stream (`POLYRAIL_STREAM_EAGER`), see [`Config::stream_eager`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum StreamEager {
    /// Below 1.5 times the pair's single-copy threshold, at most `POLYRAIL_EAGER_LIMIT`.
    Auto,
    /// Never: the route table alone decides (the default).
    #[default]
    Off,
    /// Up to this many bytes.
    UpTo(usize),
}

/// Eager sends while the peer's core is near (`POLYRAIL_NEAR_EAGER`), see
/// [`Config::near_eager`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum NearEager {
    /// Up to 128k.
    #[default]
    Auto,
    /// Never: the route table alone decides.
    Off,
    /// Up to this many bytes.
    UpTo(usize),
}

/// Single copy while the peer's core is apart (`POLYRAIL_APART_SINGLE_COPY`), see
/// [`Config::apart_single_copy`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ApartSingleCopy {
    /// From 64k.
    #[default]
    Auto,
    /// Never: the route table alone decides.
    Off,
    /// From this many bytes.
    From(usize),
}

/// Where the verdict on a peer's placement comes from (`POLYRAIL_PLACEMENT`), see
/// [`Config::placement`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum PlacementMode {
    /// Measured at run time, per peer.
    #[default]
    Measure,
    /// Every peer's core taken as sharing a cache with ours close by.
    Near,
    /// Every peer's core taken as neither near nor apart (a cache shared across a mesh): no
    /// placement rule applies.
    Middle,
    /// Every peer's core taken as sharing no cache with ours.
    Apart,
}

impl PlacementMode {
    /// The placement every peer is taken to have; `None` when it is measured.
    pub fn given(self) -> Option<crate::observe::Placement> {
        use crate::observe::Placement;
        match self {
            PlacementMode::Measure => None,
            PlacementMode::Near => Some(Placement::Near),
            PlacementMode::Middle => Some(Placement::Middle),
            PlacementMode::Apart => Some(Placement::Apart),
        }
    }
}

/// How a process waits for arrivals (`POLYRAIL_WAIT`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum WaitMode {
    /// Poll without sleeping (yield the core after a while): lowest latency, a core per rank.
    Spin,
    /// Sleep on the shared-memory doorbell almost at once: for jobs with more ranks than cores.
    Block,
    /// Poll for about 200 µs, then sleep on the doorbell until an arrival wakes the process (the
    /// default).
    #[default]
    Adaptive,
}

/// How the progress engine shares its polls between channels (`POLYRAIL_POLL`, Chai Ch. 7).
///
/// The primary channel (the active-message channel with the lowest modelled latency: shared
/// memory) is polled on every round; the others every `ratio`-th round.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PollPolicy {
    /// Every channel on every round (`all`).
    All,
    /// A fixed ratio (`static:R`, R >= 1).
    Static(u32),
    /// Every `h` arrivals (`dynamic:H`), the ratio becomes m/n + 1, where m arrivals came from the
    /// primary channel and n from the others; with n = 0 it doubles, from h + 1 up to 64 (or
    /// h + 1 when that is larger), so the others are still polled.
    Dynamic(u32),
}

/// Which PMI wire protocol to speak to the process manager (`POLYRAIL_PMI`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum PmiVersion {
    /// PMI-1 text protocol (the default; every launcher serves it).
    #[default]
    Pmi1,
    /// PMI-2 length-prefixed protocol.
    Pmi2,
}

/// polyrail's settings. `Default` is what polyrail does without any variable set.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// `POLYRAIL_TRANSPORTS`: allow-list (`shm,cma`), deny-list (`^cma`) or `all` (default).
    pub transports: TransportFilter,
    /// `POLYRAIL_ROUTE`: rules that override the route table, applied in order after it was
    /// built: `CLASS:LO-HI:CHANNEL[/PROTOCOL]`, comma-separated, e.g.
    /// `shared-l3:0-64k:shm,all:1m-:cma/get` (CLASS may be `all`; LO or HI may be left out).
    pub routes: Vec<RouteRule>,
    /// `POLYRAIL_SPLIT_THRESHOLD`: smallest single-copy message that both processes copy (the
    /// receiver pulls the front, the sender pushes the back). `auto` (default): each channel's
    /// measured size ([`TransportAttr::split_from`](crate::TransportAttr::split_from): 32k for
    /// cma, 256k for ib over software RDMA, never on an adapter; measured in an earlier record, in git history); a
    /// size (for every channel whose copies the CPUs make); `off`.
    pub split_threshold: SplitThreshold,
    /// `POLYRAIL_SPLIT_SHARE`: how much of a split message the receiver copies (the front).
    /// `auto` (default): per peer and size class, the fastest of a quarter, three eighths and a
    /// half, measured on messages that ran alone and searched again after 250 messages (up to
    /// 4000 while searches find the same): halves win when the receiving core has the sender's
    /// lines cached, as with osu_latency's unchanged buffer, a quarter or three eighths when
    /// the sender just wrote the message. Or a percentage.
    pub split_share: SplitShare,
    /// `POLYRAIL_STREAM_EAGER`: messages that would go by single copy go eagerly through send
    /// cells instead when no message came from the peer since the last send to it (a stream, as
    /// in osu_bw): there both processes copy at once and no message waits for a handshake.
    /// `off` (default): on an AMD EPYC host (an earlier record, in git history) single copy streams 32 KiB
    /// faster, 1.1 times with the two cores in one core complex and 3.5 times apart; `auto`: below
    /// 1.5 times the pair's single-copy threshold, at most `POLYRAIL_EAGER_LIMIT` (on the Intel
    /// host measured before, 32 KiB streamed 15 % faster through cells); or the largest such
    /// message.
    pub stream_eager: StreamEager,
    /// `POLYRAIL_NEAR_EAGER`: messages that would go by single copy go eagerly through send
    /// cells instead while a cache line the peer wrote reaches this process quickly (the two
    /// cores share a cache close by, within 40 ns): both processes copy at once and the copies stay in that cache,
    /// where the kernel's single copy is slow. Measured at run time per peer, on one in eight sends
    /// and receives whose protocol the placement decides, or given by `POLYRAIL_PLACEMENT` (see
    /// `docs/architecture.md`). `auto` (default): up to 128k (near on an AMD EPYC host, an
    /// earlier record in git history: 32 KiB one way 1.8 against 3.8 µs, streamed 25 against 9.5
    /// GB/s; 128 KiB 5.7 against 7.1 µs; at 256 KiB single copy streams faster); `off`; or the
    /// largest such message.
    pub near_eager: NearEager,
    /// `POLYRAIL_APART_SINGLE_COPY`: while a cache line the peer wrote reaches this process
    /// slowly (beyond 100 ns: the two cores share no cache), messages from this size go by single copy and
    /// smaller ones eagerly through send cells, on either side of the single-copy threshold (the
    /// shm channel fills cells with non-temporal stores then, above 1 KiB, so that the
    /// receiver's reads do not take each line back from the sender's cache). Measured as for
    /// `POLYRAIL_NEAR_EAGER`. It applies near too while shm times its fills of send cells at
    /// under half their usual rate (the host slows line transfers between the cores at times:
    /// cells then stream at a third of their rate, single copy does not slow).
    /// `auto` (default): from 64k (on an AMD EPYC host (an earlier record, in git history), apart: 32 KiB
    /// one way 3.4-3.8 µs through cells against 5.2-6.0 by single copy, streamed 13-14.5 against
    /// 8.2 GB/s; at 128 KiB single copy streams faster); `off`; or the smallest such message.
    pub apart_single_copy: ApartSingleCopy,
    /// `POLYRAIL_PLACEMENT`: where the verdict near/apart of `POLYRAIL_NEAR_EAGER` and
    /// `POLYRAIL_APART_SINGLE_COPY` comes from, and the shm channel's (apart, it fills send
    /// cells with non-temporal stores): `measure` (default: timed per peer at run time; a line
    /// within 40 ns is near, beyond 100 ns apart, and in between, as on a mesh, neither rule
    /// applies), or `near` / `middle` / `apart` for every peer (a machine whose placement is
    /// known, tests).
    pub placement: PlacementMode,
    /// `POLYRAIL_EAGER_LIMIT`: largest message sent eagerly through send cells when single copy
    /// is not used; larger ones wait for the receiver (rendezvous) and stream through cells.
    /// Default 64k.
    pub eager_limit: usize,
    /// `POLYRAIL_LOG`: `error`, `warn` (default), `info`, `debug` or `trace`.
    pub log: LogLevel,
    /// `POLYRAIL_PMI`: `1` (default) or `2`.
    pub pmi: PmiVersion,
    /// `POLYRAIL_PMI_TIMEOUT`: seconds an answer of the process manager (or the connection to
    /// its `PMI_PORT`) may take (a fence waits for every rank) before `Context::init` or `finalize` fails, or `off` (the
    /// default: as long as the process manager keeps the connection). For launchers that let
    /// the other ranks run on when one dies before a fence (Slurm without
    /// `--kill-on-bad-exit`), which would leave them waiting until the job's time limit.
    pub pmi_timeout: Option<std::time::Duration>,
    /// `POLYRAIL_SKEW`: skew feedback (Chai §6.3.2), `LIMIT:WINDOW:SIZE` or `off`. When WINDOW
    /// messages of one sender in a row arrive to find more than LIMIT of its messages waiting
    /// unexpected (no receive posted; the first it sent after our last send to it, which may
    /// answer that send, does not count), the receiver tells the sender, which then sends messages
    /// up to SIZE eagerly instead of by single copy, until WINDOW messages in a row find their
    /// receive posted (or at most LIMIT waiting). Default `0:8:64k` (measured in an earlier record, in git history).
    pub skew: Option<SkewPolicy>,
    /// `POLYRAIL_WAIT`: `spin`, `block` or `adaptive` (default). Senders ring a peer's doorbell
    /// only when it sleeps, which costs them one memory fence per message unless the mode is
    /// `spin` or the sleeper passes the kernel's global barrier instead (`membarrier`, where
    /// the kernel has it); use the same mode in every process of a job.
    pub wait: WaitMode,
    /// `POLYRAIL_POLL`: polling priority between channels: `all`, `static:R` or `dynamic:H`
    /// (default `dynamic:8`, Chai's h = 8-10).
    pub poll: PollPolicy,
    /// `POLYRAIL_NODE`: the virtual node this process is on, set by `polyrail run --layout`.
    /// Processes on different nodes never use node-local channels. Default: unset (node 0).
    pub node: Option<u32>,
    /// `POLYRAIL_DOMAIN`: the memory domain of this process within its node, 0 the host and k
    /// device k, set by `polyrail run --layout`. Domain-local channels ([`crate::Caps::DOMAIN_LOCAL`])
    /// do not cross domains. Default 0.
    pub domain: u16,
    /// `POLYRAIL_DOMAINS`: how many memory domains this process's node has, the host and its
    /// devices, set by `polyrail run --layout`. Default 1 (the host alone).
    pub domains: u16,
    /// `POLYRAIL_*` variables no variable of this table is: the channels' own, which the channel
    /// crates that declare them parse ([`crate::ChannelFactory::check_settings`]). In the order
    /// given; a name set again replaces its value.
    pub others: Vec<(String, String)>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            transports: TransportFilter::All,
            routes: Vec::new(),
            split_threshold: SplitThreshold::Auto,
            split_share: SplitShare::Auto,
            stream_eager: StreamEager::Off,
            near_eager: NearEager::Auto,
            apart_single_copy: ApartSingleCopy::Auto,
            placement: PlacementMode::Measure,
            eager_limit: 64 << 10,
            log: LogLevel::Warn,
            pmi: PmiVersion::Pmi1,
            pmi_timeout: None,
            wait: WaitMode::Adaptive,
            skew: Some(SkewPolicy { limit: 0, window: 8, eager_up_to: 64 << 10 }),
            poll: PollPolicy::Dynamic(8),
            node: None,
            domain: 0,
            domains: 1,
            others: Vec::new(),
        }
    }
}

impl Config {
    /// Reads the process environment.
    pub fn from_env() -> Result<Config> {
        let mut vars = Vec::new();
        for (k, v) in std::env::vars_os() {
            let k = match k.into_string() {
                Ok(k) => k,
                // Not a name polyrail reads, but one meant for it: an error, as a misspelling.
                Err(k) if k.as_encoded_bytes().starts_with(b"POLYRAIL_") => {
                    return Err(Error::config(k.to_string_lossy(), "", "a variable name in UTF-8 text"))
                }
                Err(_) => continue,
            };
            match v.into_string() {
                Ok(v) => vars.push((k, v)),
                // A value that is not text cannot be what any variable accepts: an error,
                // rather than the default as if it were not set.
                Err(v) if k.starts_with("POLYRAIL_") => {
                    return Err(Error::config(k, v.to_string_lossy(), "a value in UTF-8 text"))
                }
                Err(_) => {}
            }
        }
        Self::from_vars(vars)
    }

    /// Reads `(name, value)` pairs; names not starting with `POLYRAIL_` are ignored.
    pub fn from_vars<I, K, V>(vars: I) -> Result<Config>
    where
        I: IntoIterator<Item = (K, V)>,
        K: AsRef<str>,
        V: AsRef<str>,
    {
        let mut c = Config::default();
        let mut route_value = String::new();
        for (k, v) in vars {
            let (k, v) = (k.as_ref(), v.as_ref());
            if !k.starts_with("POLYRAIL_") {
                continue;
            }
            c.set(k, v)?;
            if k == "POLYRAIL_ROUTE" {
                route_value = v.to_string();
            }
        }
        // A rule through a channel that is turned off would be dropped for every peer.
        if let Some(rule) = c.routes.iter().find(|r| !c.transports.allows_name(&r.channel)) {
            return Err(Error::config(
                "POLYRAIL_ROUTE",
                route_value,
                format!(
                    "rules through channels POLYRAIL_TRANSPORTS={} allows (`{}` is turned off)",
                    c.transports, rule.channel
                ),
            ));
        }
        Ok(c)
    }

    /// Sets one variable ([`VARS`] says which there are and what each accepts); a name no
    /// variable of the table has is kept in [`Config::others`] for the channels, which
    /// [`Config::check_names`] checks.
    pub fn set(&mut self, var: &str, value: &str) -> Result<()> {
        match vars::var(var) {
            Some(v) => v.apply(self, value),
            None => {
                self.others.retain(|(k, _)| k != var);
                self.others.push((var.to_owned(), value.to_owned()));
                Ok(())
            }
        }
    }

    /// Checks that every variable in [`Config::others`] is one of `declared` (the channels'
    /// own): an unknown name is an error that lists the variables, suggesting the one it most
    /// likely misspells.
    pub fn check_names(&self, declared: &[VarInfo]) -> Result<()> {
        let Some((var, value)) = self.others.iter().find(|(k, _)| !declared.iter().any(|d| d.name == k)) else {
            return Ok(());
        };
        let known: Vec<&str> = VARS.iter().map(|v| v.info.name).chain(declared.iter().map(|d| d.name)).collect();
        let hint = did_you_mean(var, &known).map(|n| format!("did you mean {n}? ")).unwrap_or_default();
        Err(Error::config(var, value, format!("{hint}no such variable; polyrail reads {}", known.join(", "))))
    }
}

/// `name` if it can name a channel (lowercase letters, digits, dashes); which channels this
/// build has is checked when a job starts, against the registered factories.
fn channel_named(name: &str) -> std::result::Result<String, String> {
    let ok = !name.is_empty() && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if ok {
        Ok(name.to_owned())
    } else {
        Err(format!("`{name}` is not a channel name"))
    }
}

pub(crate) fn parse_transports(var: &str, value: &str) -> Result<TransportFilter> {
    let accepted = || "`all`, or a comma-separated list of channels (prefix `^` to deny them)".to_owned();
    let v = value.trim();
    if v == "all" {
        return Ok(TransportFilter::All);
    }
    let (deny, list) = match v.strip_prefix('^') {
        Some(rest) => (true, rest),
        None => (false, v),
    };
    let mut kinds = Vec::new();
    for name in list.split(',') {
        let name = name.trim();
        match channel_named(name) {
            Ok(k) => kinds.push(k),
            Err(_) if name.starts_with('^') => {
                return Err(Error::config(
                    var,
                    value,
                    format!("{} (`^` goes once, before the whole list: `^shm,cma` denies both)", accepted()),
                ))
            }
            Err(why) => return Err(Error::config(var, value, format!("{} ({why})", accepted()))),
        }
    }
    if deny && kinds.iter().any(|k| k == TransportKind::SELF.name()) {
        return Err(Error::config(
            var,
            value,
            format!("{} (`self` is always on: it carries messages to this process)", accepted()),
        ));
    }
    Ok(if deny { TransportFilter::Except(kinds) } else { TransportFilter::Only(kinds) })
}

/// The text of the regular file at `path`, of at most 64 KiB (a tuning file has a few lines;
/// a device or a pipe could be endless or never end).
pub fn read_small_file(path: &str) -> std::io::Result<String> {
    use std::io::Read;
    const LIMIT: u64 = 64 << 10;
    use std::os::unix::fs::OpenOptionsExt;
    let not_regular = || std::io::Error::other("not a regular file");
    // Checked before opening: opening a FIFO waits for a writer. Opened without blocking too, in
    // case the name was replaced by one in between, and checked again on what was opened.
    if !std::fs::metadata(path)?.is_file() {
        return Err(not_regular());
    }
    let file = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(path)?;
    if !file.metadata()?.is_file() {
        return Err(not_regular());
    }
    let mut text = String::new();
    file.take(LIMIT + 1).read_to_string(&mut text)?;
    if text.len() as u64 > LIMIT {
        return Err(std::io::Error::other("larger than 64 KiB"));
    }
    Ok(text)
}

pub(crate) fn parse_routes(var: &str, value: &str) -> Result<Vec<RouteRule>> {
    let classes: Vec<&str> = TopoClass::NAMED.iter().map(|c| c.name()).collect();
    let accepted = |why: String| {
        Error::config(
            var,
            value,
            format!(
                "comma-separated CLASS:LO-HI:CHANNEL[/PROTOCOL] such as all:0-64k:shm,socket:1m-:cma/get, \
                 with CLASS `all` or one of {}, CHANNEL a channel's name, PROTOCOL eager, get, split or stream ({why})",
                classes.join(", "),
            ),
        )
    };
    let mut rules = Vec::new();
    for item in value.split(',').map(str::trim) {
        let f: Vec<&str> = item.split(':').collect();
        let [class, range, target] = f[..] else { return Err(accepted(format!("`{item}` does not have three parts"))) };
        let class = match class {
            "all" => None,
            c => Some(TopoClass::from_name(c).ok_or_else(|| accepted(format!("`{c}` is not a class")))?),
        };
        let (lo, hi) = range.split_once('-').ok_or_else(|| accepted(format!("`{range}` is not LO-HI")))?;
        let size = |x: &str, default: usize| {
            if x.is_empty() {
                Ok(default)
            } else {
                parse_size(x).ok_or_else(|| accepted(format!("`{x}` is not a size")))
            }
        };
        let (lo, hi) = (size(lo, 0)?, size(hi, usize::MAX)?);
        if lo > hi {
            return Err(accepted(format!("the range {range} is empty")));
        }
        let (channel, protocol) = match target.split_once('/') {
            Some((c, p)) => (c, Some(p)),
            None => (target, None),
        };
        let channel = channel_named(channel).map_err(accepted)?;
        if let Some(p) = protocol {
            if !["eager", "get", "split", "stream"].contains(&p) {
                return Err(accepted(format!("`{p}` is not a protocol")));
            }
        }
        rules.push(RouteRule { class, lo, hi, channel, protocol: protocol.map(str::to_owned) });
    }
    Ok(rules)
}

/// The sizes `value` of variable `var` gives, overall or per topology class (`32k` or
/// `shared-l3:16k,socket:4k`); an error names the variable, the value and what is accepted.
pub fn parse_class_sizes(var: &str, value: &str) -> Result<ClassSizes> {
    let classes: Vec<&str> = TopoClass::NAMED.iter().map(|c| c.name()).collect();
    let accepted = || {
        format!(
            "a size (`32k`) or a list of CLASS:SIZE (`shared-l3:16k,socket:4k`) with CLASS one of {}",
            classes.join(", ")
        )
    };
    let mut out = ClassSizes::default();
    for item in value.split(',') {
        let item = item.trim();
        let twice = |what: &str| Error::config(var, value, format!("{} ({what} given twice)", accepted()));
        match item.split_once(':') {
            None if out.all.is_some() => return Err(twice("a size for every class")),
            None => out.all = Some(parse_size(item).ok_or_else(|| Error::config(var, value, accepted()))?),
            Some((class, size)) => {
                let class = TopoClass::from_name(class.trim())
                    .ok_or_else(|| Error::config(var, value, format!("{} (`{class}` is not a class)", accepted())))?;
                if out.per_class.iter().any(|&(c, _)| c == class) {
                    return Err(twice(&format!("`{}`", class.name())));
                }
                let size = parse_size(size).ok_or_else(|| Error::config(var, value, accepted()))?;
                out.per_class.push((class, size));
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(pairs: &[(&str, &str)]) -> Result<Config> {
        Config::from_vars(pairs.iter().copied())
    }

    #[test]
    fn defaults_without_variables() {
        assert_eq!(cfg(&[("PATH", "/bin")]).unwrap(), Config::default());
    }

    #[test]
    fn pmi_timeout() {
        assert_eq!(cfg(&[]).unwrap().pmi_timeout, None);
        let t = |v: &str| cfg(&[("POLYRAIL_PMI_TIMEOUT", v)]).map(|c| c.pmi_timeout);
        assert_eq!(t("600").unwrap(), Some(std::time::Duration::from_secs(600)));
        assert_eq!(t("2.5").unwrap(), Some(std::time::Duration::from_millis(2500)));
        assert_eq!(t("off").unwrap(), None);
        for bad in ["0", "-3", "1e-10", "soon", "NaN", "inf", "1e30"] {
            let e = t(bad).unwrap_err().to_string();
            assert!(e.contains("POLYRAIL_PMI_TIMEOUT") && e.contains("seconds"), "{bad}: {e}");
        }
    }

    #[test]
    fn transports() {
        let c = cfg(&[("POLYRAIL_TRANSPORTS", "shm")]).unwrap();
        assert!(c.transports.allows(TransportKind::new("shm")));
        assert!(!c.transports.allows(TransportKind::new("cma")));
        assert!(c.transports.allows(TransportKind::SELF));
        let c = cfg(&[("POLYRAIL_TRANSPORTS", "^cma")]).unwrap();
        assert!(c.transports.allows(TransportKind::new("shm")) && !c.transports.allows(TransportKind::new("cma")));
        // Names are checked against the build's channels when a job starts (polyrail-runtime);
        // here, only that they can be names.
        let c = cfg(&[("POLYRAIL_TRANSPORTS", "shm,scif")]).unwrap();
        assert!(c.transports.allows(TransportKind::new("scif")) && !c.transports.allows(TransportKind::new("cma")));
        let e = cfg(&[("POLYRAIL_TRANSPORTS", "shm,TCP!")]).unwrap_err().to_string();
        assert!(e.contains("POLYRAIL_TRANSPORTS") && e.contains("`TCP!` is not a channel name"), "{e}");
        let e = cfg(&[("POLYRAIL_TRANSPORTS", "^shm,^cma")]).unwrap_err().to_string();
        assert!(e.contains("`^` goes once"), "{e}");
        let e = cfg(&[("POLYRAIL_TRANSPORTS", "^self")]).unwrap_err().to_string();
        assert!(e.contains("always on"), "{e}");
        // A route rule through a channel that is turned off would be dropped for every peer.
        let e = cfg(&[("POLYRAIL_TRANSPORTS", "^cma"), ("POLYRAIL_ROUTE", "all:1m-:cma/get")]).unwrap_err();
        let e = e.to_string();
        assert!(e.contains("POLYRAIL_ROUTE") && e.contains("POLYRAIL_TRANSPORTS=^cma") && e.contains("`cma`"), "{e}");
        assert!(cfg(&[("POLYRAIL_TRANSPORTS", "shm,cma"), ("POLYRAIL_ROUTE", "all:1m-:cma/get")]).is_ok());
        // Displayed as written (as the errors that quote it do).
        for v in ["all", "shm,cma", "^cma,ib"] {
            assert_eq!(cfg(&[("POLYRAIL_TRANSPORTS", v)]).unwrap().transports.to_string(), v);
        }
    }

    #[test]
    fn thresholds() {
        assert_eq!(cfg(&[("POLYRAIL_SPLIT_THRESHOLD", "off")]).unwrap().split_threshold, SplitThreshold::Off);
        assert_eq!(cfg(&[("POLYRAIL_SPLIT_SHARE", "30")]).unwrap().split_share, SplitShare::Percent(30));
        assert_eq!(cfg(&[("POLYRAIL_SPLIT_SHARE", "auto")]).unwrap().split_share, SplitShare::Auto);
        for v in ["0", "100", "half", "30%"] {
            let e = cfg(&[("POLYRAIL_SPLIT_SHARE", v)]).unwrap_err().to_string();
            assert!(
                e.contains("POLYRAIL_SPLIT_SHARE") && e.contains(v) && e.contains("percentage from 1 to 99"),
                "{e}"
            );
        }
        assert_eq!(cfg(&[("POLYRAIL_SPLIT_THRESHOLD", "1m")]).unwrap().split_threshold, SplitThreshold::From(1 << 20));
        let e = cfg(&[("POLYRAIL_SPLIT_THRESHOLD", "1k")]).unwrap_err().to_string();
        assert!(e.contains("POLYRAIL_SPLIT_THRESHOLD") && e.contains("`auto`"), "{e}");
        assert_eq!(cfg(&[("POLYRAIL_STREAM_EAGER", "48k")]).unwrap().stream_eager, StreamEager::UpTo(48 << 10));
        assert_eq!(cfg(&[("POLYRAIL_STREAM_EAGER", "off")]).unwrap().stream_eager, StreamEager::Off);
        assert_eq!(cfg(&[]).unwrap().near_eager, NearEager::Auto);
        assert_eq!(cfg(&[("POLYRAIL_NEAR_EAGER", "96k")]).unwrap().near_eager, NearEager::UpTo(96 << 10));
        assert_eq!(cfg(&[("POLYRAIL_NEAR_EAGER", "off")]).unwrap().near_eager, NearEager::Off);
        for var in ["POLYRAIL_NEAR_EAGER", "POLYRAIL_STREAM_EAGER", "POLYRAIL_EAGER_LIMIT"] {
            let e = cfg(&[(var, "512m")]).unwrap_err().to_string();
            assert!(e.contains(var) && e.contains("256m"), "{e}");
        }
        assert_eq!(cfg(&[]).unwrap().apart_single_copy, ApartSingleCopy::Auto);
        assert_eq!(
            cfg(&[("POLYRAIL_APART_SINGLE_COPY", "8k")]).unwrap().apart_single_copy,
            ApartSingleCopy::From(8192)
        );
        assert_eq!(cfg(&[("POLYRAIL_APART_SINGLE_COPY", "off")]).unwrap().apart_single_copy, ApartSingleCopy::Off);
        let e = cfg(&[("POLYRAIL_APART_SINGLE_COPY", "0")]).unwrap_err().to_string();
        assert!(e.contains("POLYRAIL_APART_SINGLE_COPY") && e.contains("`off`"), "{e}");
        assert_eq!(cfg(&[("POLYRAIL_PLACEMENT", "apart")]).unwrap().placement, PlacementMode::Apart);
        let e = cfg(&[("POLYRAIL_PLACEMENT", "far")]).unwrap_err().to_string();
        assert!(e.contains("POLYRAIL_PLACEMENT") && e.contains("far") && e.contains("`measure`"), "{e}");
        let e = cfg(&[("POLYRAIL_NEAR_EAGER", "near")]).unwrap_err().to_string();
        assert!(e.contains("POLYRAIL_NEAR_EAGER") && e.contains("near") && e.contains("`off`"), "{e}");
        let e = cfg(&[("POLYRAIL_STREAM_EAGER", "always")]).unwrap_err().to_string();
        assert!(e.contains("POLYRAIL_STREAM_EAGER") && e.contains("always") && e.contains("`auto`"), "{e}");
    }

    #[test]
    fn route_rules() {
        let c = cfg(&[("POLYRAIL_ROUTE", "all:0-64k:shm, socket:1m-:cma/get")]).unwrap();
        assert_eq!(
            c.routes,
            vec![
                RouteRule { class: None, lo: 0, hi: 65536, channel: "shm".into(), protocol: None },
                RouteRule {
                    class: Some(TopoClass::Socket),
                    lo: 1 << 20,
                    hi: usize::MAX,
                    channel: "cma".into(),
                    protocol: Some("get".into())
                },
            ]
        );
        for (bad, what) in [
            ("all:0-64k", "three parts"),
            ("l9:0-1k:shm", "`l9` is not a class"),
            ("all:64k:shm", "not LO-HI"),
            ("all:2k-1k:shm", "empty"),
            ("all:0-1q:shm", "`1q` is not a size"),
            ("all:0-:Tcp", "`Tcp` is not a channel name"),
            ("all:0-:cma/fast", "`fast` is not a protocol"),
        ] {
            let e = cfg(&[("POLYRAIL_ROUTE", bad)]).unwrap_err().to_string();
            assert!(e.contains("POLYRAIL_ROUTE") && e.contains(what), "{bad}: {e}");
        }
    }

    #[test]
    fn bad_values_name_variable_value_and_choices() {
        assert_eq!(cfg(&[("POLYRAIL_SKEW", "off")]).unwrap().skew, None);
        assert_eq!(
            cfg(&[("POLYRAIL_SKEW", "4:8:128k")]).unwrap().skew,
            Some(SkewPolicy { limit: 4, window: 8, eager_up_to: 128 << 10 })
        );
        for bad in ["4:8", "0:0:64k", "4:x:64k", "4:8:64k:1"] {
            let e = cfg(&[("POLYRAIL_SKEW", bad)]).unwrap_err().to_string();
            assert!(e.contains("POLYRAIL_SKEW") && e.contains("LIMIT:WINDOW:SIZE"), "{e}");
        }
        let e = cfg(&[("POLYRAIL_WAIT", "nap")]).unwrap_err().to_string();
        assert!(e.contains("POLYRAIL_WAIT") && e.contains("adaptive"), "{e}");
        assert_eq!(cfg(&[("POLYRAIL_WAIT", "block")]).unwrap().wait, WaitMode::Block);
        let e = cfg(&[("POLYRAIL_LOG", "loud")]).unwrap_err().to_string();
        assert!(e.contains("loud") && e.contains("debug"), "{e}");
        assert_eq!(cfg(&[("POLYRAIL_POLL", "static:50")]).unwrap().poll, PollPolicy::Static(50));
        assert_eq!(cfg(&[("POLYRAIL_POLL", "all")]).unwrap().poll, PollPolicy::All);
        for bad in ["static", "static:0", "dynamic:x", "sometimes:3"] {
            let e = cfg(&[("POLYRAIL_POLL", bad)]).unwrap_err().to_string();
            assert!(e.contains("POLYRAIL_POLL") && e.contains("dynamic:H"), "{bad}: {e}");
        }
        assert_eq!(cfg(&[("POLYRAIL_NODE", "3")]).unwrap().node, Some(3));
        let e = cfg(&[("POLYRAIL_EAGER_LIMIT", "2g")]).unwrap_err().to_string();
        assert!(e.contains("a size from 0 to 256m (bytes, or with a k, m or g suffix)"), "{e}");
        let e = cfg(&[("POLYRAIL_NODE", "-1")]).unwrap_err().to_string();
        assert!(e.contains("POLYRAIL_NODE") && e.contains("-1"), "{e}");
        // Names no table declares: kept for the channels, refused by the check of names.
        let named = |vars: &[(&str, &str)]| cfg(vars).and_then(|c| c.check_names(&[]));
        let ib = [VarInfo { name: "POLYRAIL_IB_CREDITS", default: "64", doc: "blocks" }];
        let c = cfg(&[("POLYRAIL_IB_CREDITS", "8"), ("POLYRAIL_IB_CREDITS", "16")]).unwrap();
        assert_eq!(c.others, [("POLYRAIL_IB_CREDITS".to_string(), "16".to_string())], "the last value");
        c.check_names(&ib).unwrap();
        let e = named(&[("POLYRAIL_FROBNICATE", "1")]).unwrap_err().to_string();
        assert!(e.contains("POLYRAIL_FROBNICATE") && e.contains("POLYRAIL_TRANSPORTS"), "{e}");
        assert!(!e.contains("did you mean"), "{e}");
        let e = named(&[("POLYRAIL_TRANSPORT", "shm")]).unwrap_err().to_string();
        assert!(e.contains("did you mean POLYRAIL_TRANSPORTS?"), "{e}");
        let e = cfg(&[("POLYRAIL_IB_CREDIT", "8")]).unwrap().check_names(&ib).unwrap_err().to_string();
        assert!(e.contains("did you mean POLYRAIL_IB_CREDITS?"), "{e}");
    }

    proptest::proptest! {
        /// Any value of any variable is a configuration or an error that names the variable
        /// and the value; parsing never panics.
        #[test]
        fn every_value_is_accepted_or_named(
            var in 0..VARS.len(),
            value in "[-0-9a-z:,/^.+ kKmMgG_]{0,24}|\\PC{0,12}",
        ) {
            let name = VARS[var].info.name;
            if let Err(e) = cfg(&[(name, value.as_str())]) {
                let (text, shown) = (e.to_string(), format!("{value:?}"));
                proptest::prop_assert!(text.contains(name) && text.contains(&shown), "{}", text);
            }
        }
    }
}
