//! Where each message goes: topology classes and per-peer route tables.
//!
//! A [`PeerRoute`] maps message sizes to a protocol and a channel. It is built once per peer
//! by [`build_route`] from the channels that reach the peer, their cost models
//! ([`crate::TransportAttr`]), the pair's topology class and the `POLYRAIL_*` overrides, and
//! every entry carries the reason it was chosen, for `polyrail info`.

pub mod topology;

use crate::config::{
    ApartSingleCopy, Config, NearEager, RouteRule, SplitShare, SplitThreshold, StreamEager, MAX_EAGER_MESSAGE,
};
use crate::observe::Placement;
use crate::size::format_size;
use crate::transport::{Caps, TransportAttr};
use topology::TopoClass;

/// A channel of this process: its index in the process's channel list (the order channels
/// started in; `JobReport::channel_kinds` names them).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ChannelId(pub u8);

impl ChannelId {
    /// The index in the channel list.
    #[inline]
    pub fn index(self) -> usize {
        usize::from(self.0)
    }
}

impl std::fmt::Display for ChannelId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "channel {}", self.0)
    }
}

/// A set of channels. Channels from 63 up share one member: adding one of them adds them all
/// (a conservative answer to "poll this channel?"; no process has that many).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ChannelSet(u64);

impl ChannelSet {
    /// No channel.
    pub const EMPTY: ChannelSet = ChannelSet(0);
    /// Every channel.
    pub const ALL: ChannelSet = ChannelSet(u64::MAX);

    /// Adds `c`.
    #[inline]
    pub fn insert(&mut self, c: ChannelId) {
        self.0 |= 1 << c.0.min(63);
    }

    /// Whether `c` is in the set.
    #[inline]
    pub fn contains(self, c: ChannelId) -> bool {
        self.0 & 1 << c.0.min(63) != 0
    }

    /// Whether the set has no channel.
    #[inline]
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The channels of `self` that are not in `other`.
    #[inline]
    pub fn without(self, other: ChannelSet) -> ChannelSet {
        ChannelSet(self.0 & !other.0)
    }
}

/// How a message of some size travels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    /// Copied through the active-message channel (inline slots or send cells), fragmented to
    /// the channel's limit; completes without the receiver.
    Eager,
    /// Rendezvous: the receiver reads the sender's buffer one-sided (single copy).
    RndvGet,
    /// Rendezvous where both processes copy: the receiver reads the front of the message, the
    /// sender writes the back into the receive buffer.
    RndvSplit,
    /// Rendezvous with the data streamed through active messages once the receiver matched.
    RndvStream,
}

impl Protocol {
    /// Short name for reports.
    pub fn name(self) -> &'static str {
        match self {
            Protocol::Eager => "eager",
            Protocol::RndvGet => "rndv-get",
            Protocol::RndvSplit => "rndv-split",
            Protocol::RndvStream => "rndv-stream",
        }
    }

    /// Whether the data moves by one-sided copy on the entry's channel.
    pub fn is_one_sided(self) -> bool {
        matches!(self, Protocol::RndvGet | Protocol::RndvSplit)
    }
}

/// One size range of a route: messages of at most `upto` bytes (and above the previous entry).
#[derive(Clone, Debug, PartialEq)]
pub struct RouteEntry {
    /// Largest message size of this range (inclusive).
    pub upto: usize,
    /// Protocol used.
    pub protocol: Protocol,
    /// Channel moving the data (the active-message channel for eager and stream).
    pub channel: ChannelId,
    /// Why, for `polyrail info`.
    pub reason: String,
}

/// The route table to one peer.
#[derive(Clone, Debug, PartialEq)]
pub struct PeerRoute {
    /// Channel carrying every active message (eager data and control) to the peer; one channel
    /// per peer keeps the per-pair order of packets.
    pub am: ChannelId,
    /// Largest payload of one active message on `am`.
    pub frag: usize,
    /// Size ranges in increasing order; the last one ends at `usize::MAX`.
    pub entries: Vec<RouteEntry>,
    /// Single-copy messages sent eagerly on `am` instead in a stream: when no message came from
    /// the peer since the last send to it (`POLYRAIL_STREAM_EAGER`).
    pub stream_eager: Option<StreamEagerRule>,
    /// How the route changes with the measured placement of the peer's core
    /// (`POLYRAIL_NEAR_EAGER`, `POLYRAIL_APART_SINGLE_COPY`).
    pub placement: Option<PlacementRule>,
    /// Messages from registered memory that the peer maps (see
    /// [`crate::TransportAttr::mapped_from`]): one-sided from a smaller size, never eager in a
    /// stream.
    pub mapped: Option<MappedRule>,
    /// A `POLYRAIL_ROUTE` rule applies to the peer: every send takes its entry as written. No
    /// rule above and no skew feedback (`POLYRAIL_SKEW`) changes its protocol; only a message
    /// larger than any eager message a receiver takes is streamed instead.
    pub as_written: bool,
}

/// How messages from registered memory with a memory file go (the sender's memory: the
/// receiver copies it through a mapping, no kernel involved).
#[derive(Clone, Debug, PartialEq)]
pub struct MappedRule {
    /// Smallest such message sent one-sided (the receiver pulls) instead of eagerly.
    pub from: usize,
    /// The channel that maps the memory.
    pub channel: ChannelId,
    /// Why, for `polyrail info`.
    pub reason: String,
}

/// Up to which size a stream of sends goes eagerly, and why.
#[derive(Clone, Debug, PartialEq)]
pub struct StreamEagerRule {
    /// Largest message sent this way.
    pub upto: usize,
    /// Where the size came from, for `polyrail info`.
    pub reason: String,
}

/// How the route changes with the placement of the peer's core, measured at run time: near
/// (sharing a cache), single-copy sizes up to `near_upto` go eagerly through the active-message
/// channel; apart, eager sizes from `apart_from` go by single copy. Near while the channel
/// measures its copies to the peer slow ([`crate::observe::Observation::CopiesSlow`]: the host slows the
/// transfer of lines between the cores at times), sizes from `apart_from` go by single copy too.
#[derive(Clone, Debug, PartialEq)]
pub struct PlacementRule {
    /// Largest single-copy message sent eagerly while the peer is near (`POLYRAIL_NEAR_EAGER`).
    pub near_upto: Option<usize>,
    /// While the peer is apart, messages below this size go eagerly and larger ones by single
    /// copy, whatever the route table's threshold (`POLYRAIL_APART_SINGLE_COPY`).
    pub apart_from: Option<usize>,
    /// The single-copy channel.
    pub rma: ChannelId,
    /// The verdict when it is given (`POLYRAIL_PLACEMENT`); `None`: measured
    /// ([`Placement::of_line`]).
    pub given: Option<Placement>,
    /// Where the sizes came from, for `polyrail info`.
    pub reason: String,
}

impl PlacementRule {
    /// What the rule does, for `polyrail info` and the log.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if let Some(upto) = self.near_upto {
            parts.push(format!(
                "while the peer's core is measured near (shares a cache), single copy up to {} goes eager",
                format_size(upto)
            ));
        }
        if let Some(from) = self.apart_from {
            parts.push(format!(
                "while it is measured apart (or near with copies between the cores measured slow), messages below {0} go eagerly and from {0} by single copy",
                format_size(from)
            ));
        }
        let given = match self.given {
            Some(Placement::Near) => "; every peer taken as near, POLYRAIL_PLACEMENT=near",
            Some(Placement::Middle) => "; every peer taken as neither, POLYRAIL_PLACEMENT=middle",
            Some(Placement::Apart) => "; every peer taken as apart, POLYRAIL_PLACEMENT=apart",
            None => "",
        };
        format!("{} ({}{given})", parts.join("; "), self.reason)
    }

    /// One message in this many that the rule covers times a line (a sample costs about
    /// 100 ns: three clock reads and a load from the other core; sampling every message cost
    /// osu_bw 32 KiB near 8 %).
    pub const SAMPLE_EVERY: u8 = 8;
}

impl PeerRoute {
    /// The entry for a message of `size` bytes.
    #[inline]
    pub fn lookup(&self, size: usize) -> &RouteEntry {
        // The last entry ends at usize::MAX, so the search always finds one.
        let i = self.entries.iter().position(|e| size <= e.upto).unwrap_or(self.entries.len() - 1);
        &self.entries[i]
    }

    /// Smallest size sent by rendezvous, if any.
    pub fn rndv_threshold(&self) -> Option<usize> {
        let mut lo = 0;
        for e in &self.entries {
            if e.protocol != Protocol::Eager {
                return Some(lo);
            }
            lo = e.upto.saturating_add(1);
        }
        None
    }
}

/// A channel that can reach the peer, as the route builder sees it.
#[derive(Clone, Debug)]
pub struct Candidate<'a> {
    /// Its index in the process's channel list.
    pub id: ChannelId,
    /// Its attributes and cost model.
    pub attr: &'a TransportAttr,
}

/// Default shared-memory/single-copy switch point per class (Chai, Fig. 6.2: 32 KB in a
/// shared cache, 2 KB on one socket, 1 KB across sockets): in a shared cache the two copies
/// through shared memory stay cheap longer. Checked here (2 cores sharing an L3, Xeon @2.5 GHz,
/// osu_latency / osu_bw, an earlier record in git history): below 32 KiB send cells win (16 KiB: 7.6-9.1
/// GB/s eager against 3.5-7.5 by single copy); from 32 KiB single copy split between both
/// processes wins (32 KiB latency 3.5-4.6 µs against 6.0 eager; 64-128 KiB 10-24 GB/s against
/// 6-8), so the shared-cache default stays 32 KiB, with the split from there (see
/// `Config::split_threshold`).
fn class_default_threshold(class: TopoClass) -> usize {
    match class {
        TopoClass::SameCore | TopoClass::SharedL2 | TopoClass::SharedL3 => 32 << 10,
        TopoClass::Socket => 2 << 10,
        TopoClass::CrossSocket => 1 << 10,
        TopoClass::SameProcess | TopoClass::Unknown | TopoClass::RemoteNode => 8 << 10,
    }
}

/// Smallest size at which `rma` (one copy, plus two control messages on `am`) is modelled
/// faster than two copies through `am`.
fn model_crossover(am: &TransportAttr, rma: &TransportAttr) -> Option<usize> {
    let eager = |s: usize| am.am_cost.time_ns(s) + s as f64 * 1e9 / am.am_cost.bandwidth;
    let rndv = |s: usize| 2.0 * am.am_cost.time_ns(0) + rma.rma_cost.time_ns(s);
    (6..=30).map(|p| 1usize << p).find(|&s| rndv(s) < eager(s))
}

/// Where single copy starts while the peer's core shares no cache with ours
/// (`POLYRAIL_APART_SINGLE_COPY=auto`). On an AMD EPYC host (an earlier record, in git history), apart, with
/// send cells filled by non-temporal stores: osu_bw 32 KiB 13-14.5 GB/s through cells against 8.2
/// by single copy, 64 KiB 12.7-12.9 by single copy against 14.1-14.4, 128 KiB 17.0-17.8 against
/// 13.9-14.8; one way 32 KiB 3.4-3.8 µs against 5.2-6.0, 64 KiB 6.2-6.3 against 5.7-6.9.
const APART_SINGLE_COPY_AUTO: usize = 64 << 10;

/// The placement rule of a pair whose single-copy threshold is `threshold` (on channel `rma`):
/// `None` when neither part changes anything (`near_upto` below the threshold, `apart_from` at
/// it, or both off).
fn placement_rule(cfg: &Config, threshold: usize, rma: ChannelId) -> Option<PlacementRule> {
    let near = match cfg.near_eager {
        NearEager::Off => None,
        NearEager::Auto => Some((128 << 10, "POLYRAIL_NEAR_EAGER=auto")),
        NearEager::UpTo(upto) => Some((upto, "POLYRAIL_NEAR_EAGER")),
    }
    .filter(|&(upto, _)| upto >= threshold);
    let apart = match cfg.apart_single_copy {
        ApartSingleCopy::Off => None,
        ApartSingleCopy::Auto => Some((APART_SINGLE_COPY_AUTO, "POLYRAIL_APART_SINGLE_COPY=auto")),
        ApartSingleCopy::From(from) => Some((from, "POLYRAIL_APART_SINGLE_COPY")),
    }
    .filter(|&(from, _)| from != threshold);
    if near.is_none() && apart.is_none() {
        return None;
    }
    let why: Vec<&str> = [near.map(|n| n.1), apart.map(|a| a.1)].into_iter().flatten().collect();
    Some(PlacementRule {
        near_upto: near.map(|n| n.0),
        apart_from: apart.map(|a| a.0),
        rma,
        given: cfg.placement.given(),
        reason: format!(
            "{}; near when a line the peer wrote arrives within {} ns of a local load, apart beyond {} ns, \
             and in between (a cache shared across a mesh) the route table decides",
            why.join(", "),
            crate::observe::NEAR_NS,
            crate::observe::APART_NS,
        ),
    })
}

/// Builds the route to one peer of class `class` from the channels that reach it.
///
/// `am` must have [`Caps::AM`]. Returns `None` when no channel can carry active messages.
pub fn build_route(class: TopoClass, candidates: &[Candidate<'_>], cfg: &Config) -> Option<PeerRoute> {
    let am = candidates.iter().find(|c| c.attr.caps.contains(Caps::AM))?;
    let frag = am.attr.max_eager.max(1);
    // One-sided copies go on the active-message channel when it has them (loopback), else on
    // the first channel that has them (cma beside shm).
    let rma = Some(am)
        .filter(|c| c.attr.caps.contains(Caps::GET))
        .or_else(|| candidates.iter().find(|c| c.attr.caps.contains(Caps::GET)));
    let mut entries = Vec::new();
    let mut stream_eager = None;
    let mut placement = None;
    let mut mapped = None;
    let kind = |c: &Candidate<'_>| c.attr.kind;
    match rma {
        Some(rma) => {
            let own = rma.attr.rndv_from.iter().find(|r| r.class.is_none_or(|c| c == class));
            let (threshold, why) = match own {
                Some(r) => (r.from, r.reason.clone()),
                None => {
                    let class_t = class_default_threshold(class);
                    match model_crossover(am.attr, rma.attr) {
                        Some(m) if m > class_t => (
                            m,
                            format!(
                                "cost-model crossover of {} and {} (above the {class} default)",
                                kind(am),
                                kind(rma)
                            ),
                        ),
                        _ => (class_t, format!("default for class {class} (Chai Fig. 6.2, checked by osu_bw here)")),
                    }
                }
            };
            let threshold = threshold.max(1);
            entries.push(RouteEntry {
                upto: threshold - 1,
                protocol: Protocol::Eager,
                channel: am.id,
                reason: format!("below the single-copy threshold {} ({why})", format_size(threshold)),
            });
            if rma.id != am.id && rma.attr.caps.contains(Caps::CPU_COPY) {
                stream_eager = match cfg.stream_eager {
                    StreamEager::Off => None,
                    StreamEager::Auto => Some(StreamEagerRule {
                        upto: threshold.saturating_add(threshold / 2).saturating_sub(1).min(cfg.eager_limit),
                        reason: format!(
                            "below 1.5 times the single-copy threshold, at most POLYRAIL_EAGER_LIMIT={} (POLYRAIL_STREAM_EAGER=auto)",
                            format_size(cfg.eager_limit)
                        ),
                    }),
                    StreamEager::UpTo(upto) => {
                        Some(StreamEagerRule { upto, reason: "POLYRAIL_STREAM_EAGER".to_string() })
                    }
                }
                .filter(|r| r.upto >= threshold);
                // The channel that carries the eager copies measures the placement.
                if am.attr.caps.contains(Caps::PLACEMENT) {
                    placement = placement_rule(cfg, threshold, rma.id);
                }
            }
            if let Some(from) = rma.attr.mapped_from {
                mapped = Some(MappedRule {
                    from: from.min(threshold),
                    channel: rma.id,
                    reason: format!("the receiver copies from its mapping; the size measured for {}", kind(rma)),
                });
            }
            let can_split = rma.attr.caps.contains(Caps::PUT | Caps::CPU_COPY);
            let split = match cfg.split_threshold {
                SplitThreshold::Auto if can_split => {
                    rma.attr.split_from.map(|s| (s, format!("the split size measured for {}", kind(rma))))
                }
                SplitThreshold::From(s) if can_split => Some((s, "POLYRAIL_SPLIT_THRESHOLD".to_string())),
                _ => None,
            };
            let share = match cfg.split_share {
                SplitShare::Auto => "the receiver's part searched per size".to_string(),
                SplitShare::Percent(p) => format!("the receiver copies {p} %, POLYRAIL_SPLIT_SHARE"),
            };
            match split {
                Some((s, split_why)) if s > threshold => {
                    entries.push(RouteEntry {
                        upto: s - 1,
                        protocol: Protocol::RndvGet,
                        channel: rma.id,
                        reason: format!("receiver pulls with {} from {} ({why})", kind(rma), format_size(threshold)),
                    });
                    entries.push(RouteEntry {
                        upto: usize::MAX,
                        protocol: Protocol::RndvSplit,
                        channel: rma.id,
                        reason: format!(
                            "both processes copy with {} from {} ({split_why}; {share})",
                            kind(rma),
                            format_size(s)
                        ),
                    });
                }
                Some((_, split_why)) => entries.push(RouteEntry {
                    upto: usize::MAX,
                    protocol: Protocol::RndvSplit,
                    channel: rma.id,
                    reason: format!(
                        "both processes copy with {} from {} ({why}; {split_why} is not above it; {share})",
                        kind(rma),
                        format_size(threshold)
                    ),
                }),
                None => entries.push(RouteEntry {
                    upto: usize::MAX,
                    protocol: Protocol::RndvGet,
                    channel: rma.id,
                    reason: format!("receiver pulls with {} from {} ({why})", kind(rma), format_size(threshold)),
                }),
            }
        }
        None => {
            let limit = cfg.eager_limit;
            entries.push(RouteEntry {
                upto: limit,
                protocol: Protocol::Eager,
                channel: am.id,
                reason: format!("no single-copy channel; eager up to POLYRAIL_EAGER_LIMIT={}", format_size(limit)),
            });
            entries.push(RouteEntry {
                upto: usize::MAX,
                protocol: Protocol::RndvStream,
                channel: am.id,
                reason: format!("no single-copy channel; pipelined through {} after the receiver matched", kind(am)),
            });
        }
    }
    // Drop empty ranges (a threshold of 0 or 1).
    let mut lo = 0usize;
    entries.retain(|e| {
        let keep = e.upto >= lo;
        if keep {
            lo = e.upto.saturating_add(1);
        }
        keep
    });
    let mut route = PeerRoute { am: am.id, frag, entries, stream_eager, placement, mapped, as_written: false };
    for rule in cfg.routes.iter().filter(|r| r.class.is_none_or(|c| c == class)) {
        match apply_rule(&mut route, rule, candidates, cfg.split_threshold != SplitThreshold::Off) {
            // A route the user wrote is taken as written: no rule of the engine changes it.
            Ok(()) => {
                (route.stream_eager, route.placement, route.mapped) = (None, None, None);
                route.as_written = true;
            }
            Err(why) if class != TopoClass::SameProcess => {
                tracing::warn!("POLYRAIL_ROUTE rule for {}: {why}; rule ignored for this peer", rule.channel);
            }
            Err(_) => {}
        }
    }
    cap_eager(&mut route);
    Some(route)
}

/// Eager messages stop at [`MAX_EAGER_MESSAGE`], the most a receiver buffers unasked: the part
/// of an eager entry beyond it is streamed, as the engine does (a threshold or rule may ask for
/// more).
fn cap_eager(route: &mut PeerRoute) {
    if !route.entries.iter().any(|e| e.protocol == Protocol::Eager && e.upto > MAX_EAGER_MESSAGE) {
        return;
    }
    let mut out = Vec::with_capacity(route.entries.len() + 1);
    let mut lo = 0usize;
    for e in route.entries.drain(..) {
        let next = e.upto.saturating_add(1);
        if e.protocol == Protocol::Eager && e.upto > MAX_EAGER_MESSAGE {
            if lo <= MAX_EAGER_MESSAGE {
                out.push(RouteEntry { upto: MAX_EAGER_MESSAGE, ..e.clone() });
            }
            let reason = format!(
                "eager messages stop at {} (the most a receiver buffers unasked): streamed after the receiver matched",
                format_size(MAX_EAGER_MESSAGE)
            );
            out.push(RouteEntry { upto: e.upto, protocol: Protocol::RndvStream, channel: route.am, reason });
        } else {
            out.push(e);
        }
        lo = next;
    }
    route.entries = out;
}

/// Applies one `POLYRAIL_ROUTE` rule: its size range gets its channel and protocol. Without a
/// protocol: eager on the active-message channel, else split where both processes copy with
/// the CPU (and `split` is allowed: `POLYRAIL_SPLIT_THRESHOLD` is not `off`), else get.
fn apply_rule(
    route: &mut PeerRoute,
    rule: &RouteRule,
    candidates: &[Candidate<'_>],
    split_allowed: bool,
) -> Result<(), String> {
    let c = candidates
        .iter()
        .find(|c| c.attr.kind.name() == rule.channel)
        .ok_or_else(|| format!("{} does not reach this peer", rule.channel))?;
    let (caps, is_am) = (c.attr.caps, c.id == route.am);
    let splits = split_allowed && caps.contains(Caps::GET | Caps::PUT | Caps::CPU_COPY);
    let protocol = match rule.protocol.as_deref() {
        None if is_am => Protocol::Eager,
        None if splits => Protocol::RndvSplit,
        Some("split") if caps.contains(Caps::GET | Caps::PUT) => Protocol::RndvSplit,
        None | Some("get") if caps.contains(Caps::GET) => Protocol::RndvGet,
        Some("eager") if is_am => Protocol::Eager,
        Some("stream") if is_am => Protocol::RndvStream,
        other => return Err(format!("{} cannot carry {}", rule.channel, other.unwrap_or("messages"))),
    };
    // A rendezvous of 0 bytes has nothing to copy: empty messages stay eager.
    let lo = if protocol == Protocol::Eager { rule.lo } else { rule.lo.max(1) };
    if lo > rule.hi {
        // Nothing to route: not a rule that makes the peer's route one taken as written.
        return Err("its range holds only empty messages, which a rendezvous does not carry".into());
    }
    let range = |e: usize| if e == usize::MAX { "max".to_string() } else { format_size(e) };
    let entry = RouteEntry {
        upto: rule.hi,
        protocol,
        channel: c.id,
        reason: format!("POLYRAIL_ROUTE rule {}..{} -> {}", range(lo), range(rule.hi), rule.channel),
    };
    // The entries cover every size in order; the rule's range replaces what it overlaps.
    let mut out = Vec::with_capacity(route.entries.len() + 2);
    let mut start = 0usize;
    let mut placed = false;
    for e in route.entries.drain(..) {
        let (a, b) = (start, e.upto);
        start = b.saturating_add(1);
        if b < lo {
            out.push(e);
            continue;
        }
        if a < lo {
            out.push(RouteEntry { upto: lo - 1, ..e.clone() });
        }
        if !placed {
            out.push(entry.clone());
            placed = true;
        }
        if b > rule.hi {
            out.push(e);
        }
    }
    route.entries = out;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::{Cost, TransportKind};

    const SHM: TransportKind = TransportKind::new("shm");
    const CMA: TransportKind = TransportKind::new("cma");
    const IB: TransportKind = TransportKind::new("ib");

    /// [`super::build_route`] with the channels' attributes taking their settings from `cfg`,
    /// as the channels do when they start.
    fn build_route(class: TopoClass, candidates: &[Candidate<'_>], cfg: &Config) -> Option<PeerRoute> {
        let attrs: Vec<TransportAttr> = candidates
            .iter()
            .map(|c| {
                let mut a = c.attr.clone();
                a.rndv_from = match a.kind {
                    CMA => cma_rndv_from(cfg),
                    IB => ib_rndv_from(cfg),
                    _ => Vec::new(),
                };
                a
            })
            .collect();
        let with: Vec<Candidate<'_>> =
            candidates.iter().zip(&attrs).map(|(c, attr)| Candidate { id: c.id, attr }).collect();
        super::build_route(class, &with, cfg)
    }

    /// What the cma channel reports for `POLYRAIL_CMA_THRESHOLD` (a setting of its own crate,
    /// kept among the configuration's others here).
    fn cma_rndv_from(cfg: &Config) -> Vec<crate::RndvFrom> {
        let Some((var, value)) = cfg.others.iter().find(|(k, _)| k == "POLYRAIL_CMA_THRESHOLD") else {
            return Vec::new();
        };
        let sizes = crate::config::parse_class_sizes(var, value).expect("a valid threshold in the test");
        let entries = sizes.per_class.iter().map(|&(c, s)| (Some(c), s)).chain(sizes.all.map(|s| (None, s)));
        entries.map(|(class, from)| crate::RndvFrom { class, from, reason: var.clone() }).collect()
    }

    /// What the ib channel reports for `POLYRAIL_IB_EAGER_LIMIT` (a setting of its own crate,
    /// kept among the configuration's others here).
    fn ib_rndv_from(cfg: &Config) -> Vec<crate::RndvFrom> {
        let given = cfg.others.iter().find(|(k, _)| k == "POLYRAIL_IB_EAGER_LIMIT");
        let limit = given.and_then(|(_, v)| crate::parse_size(v)).unwrap_or(8 << 10);
        let reason = format!("POLYRAIL_IB_EAGER_LIMIT={}, the largest eager message", format_size(limit));
        vec![crate::RndvFrom { class: None, from: limit + 1, reason }]
    }

    fn attr(kind: TransportKind, caps: Caps, max_eager: usize) -> TransportAttr {
        let caps = if kind == SHM { caps | Caps::PLACEMENT } else { caps };
        let cost = Cost { latency_ns: 200.0, overhead_ns: 50.0, bandwidth: 5e9 };
        let rma_cost = Cost { latency_ns: 1200.0, overhead_ns: 0.0, bandwidth: 10e9 };
        let split_from = caps.contains(Caps::CPU_COPY).then_some(32 << 10);
        TransportAttr {
            kind,
            max_inline: 16,
            max_eager,
            max_rma: usize::MAX,
            caps,
            am_cost: cost,
            rma_cost,
            split_from,
            mapped_from: (kind == CMA).then_some(8 << 10),
            rndv_from: Vec::new(),
        }
    }

    #[test]
    fn shm_and_cma_use_class_thresholds_and_overrides() {
        let shm = attr(SHM, Caps::AM, 16384);
        let cma = attr(CMA, Caps::GET | Caps::PUT | Caps::CPU_COPY, 0);
        let c = [Candidate { id: ChannelId(1), attr: &shm }, Candidate { id: ChannelId(2), attr: &cma }];
        let r = build_route(TopoClass::SharedL3, &c, &Config::default()).unwrap();
        assert_eq!(r.am, ChannelId(1));
        assert_eq!(r.lookup(100).protocol, Protocol::Eager);
        assert_eq!(r.rndv_threshold(), Some(32 << 10));
        assert_eq!(r.lookup((32 << 10) - 1).protocol, Protocol::Eager);
        assert_eq!(r.lookup(32 << 10).protocol, Protocol::RndvSplit);
        assert_eq!(r.lookup(32 << 10).channel, ChannelId(2));
        assert_eq!(r.lookup(4 << 20).protocol, Protocol::RndvSplit);
        let m = r.mapped.as_ref().unwrap();
        assert_eq!((m.from, m.channel), (8 << 10, ChannelId(2)), "registered memory goes one-sided from cma's 8k");
        let r = build_route(TopoClass::CrossSocket, &c, &Config::default()).unwrap();
        assert!(r.mapped.as_ref().unwrap().from <= r.rndv_threshold().unwrap(), "never above the threshold");
        // The model crossover is above the 1k class default here.
        assert!(r.rndv_threshold().unwrap() >= 1024);
        let mut cfg = Config::default();
        cfg.set("POLYRAIL_CMA_THRESHOLD", "shared-l3:4k").unwrap();
        let r = build_route(TopoClass::SharedL3, &c, &cfg).unwrap();
        assert_eq!(r.rndv_threshold(), Some(4096));
        assert!(r.lookup(4096).reason.contains("POLYRAIL_CMA_THRESHOLD"));
        cfg.set("POLYRAIL_SPLIT_THRESHOLD", "64k").unwrap();
        let r = build_route(TopoClass::SharedL3, &c, &cfg).unwrap();
        assert_eq!(r.lookup(4096).protocol, Protocol::RndvGet);
        assert_eq!(r.lookup(64 << 10).protocol, Protocol::RndvSplit);
        cfg.set("POLYRAIL_SPLIT_THRESHOLD", "off").unwrap();
        let r = build_route(TopoClass::SharedL3, &c, &cfg).unwrap();
        assert_eq!(r.lookup(usize::MAX).protocol, Protocol::RndvGet);
    }

    #[test]
    fn placement_rule_covers_sizes_on_both_sides_of_the_threshold() {
        let shm = attr(SHM, Caps::AM, 16384);
        let cma = attr(CMA, Caps::GET | Caps::PUT | Caps::CPU_COPY, 0);
        let c = [Candidate { id: ChannelId(1), attr: &shm }, Candidate { id: ChannelId(2), attr: &cma }];
        let rule = |cfg: &Config| build_route(TopoClass::SharedL3, &c, cfg).unwrap().placement;
        let auto = rule(&Config::default()).expect("on by default beside shm");
        assert_eq!((auto.near_upto, auto.apart_from, auto.rma), (Some(128 << 10), Some(64 << 10), ChannelId(2)));
        assert!(auto.describe().contains("up to 128k") && auto.describe().contains("from 64k"), "{}", auto.describe());
        let mut cfg = Config::default();
        cfg.set("POLYRAIL_NEAR_EAGER", "8k").unwrap();
        assert_eq!(rule(&cfg).unwrap().near_upto, None, "below the 32k single-copy threshold: nothing to change");
        cfg.set("POLYRAIL_NEAR_EAGER", "64k").unwrap();
        cfg.set("POLYRAIL_APART_SINGLE_COPY", "32k").unwrap();
        let r = rule(&cfg).unwrap();
        assert_eq!((r.near_upto, r.apart_from), (Some(64 << 10), None), "single copy from 32k anyway");
        cfg.set("POLYRAIL_APART_SINGLE_COPY", "16k").unwrap();
        assert_eq!(rule(&cfg).unwrap().apart_from, Some(16 << 10), "below the threshold");
        cfg.set("POLYRAIL_APART_SINGLE_COPY", "32k").unwrap();
        cfg.set("POLYRAIL_NEAR_EAGER", "off").unwrap();
        assert_eq!(rule(&cfg), None, "both parts off");
        // A POLYRAIL_ROUTE rule for the peer's class: the route is taken as written, by every
        // rule (stream-eager and mapped memory too).
        let mut cfg = Config::default();
        cfg.set("POLYRAIL_STREAM_EAGER", "auto").unwrap();
        cfg.set("POLYRAIL_ROUTE", "shared-l3:1k-64k:cma/get").unwrap();
        assert_eq!(rule(&cfg), None);
        let mut mapped_cma = cma.clone();
        mapped_cma.mapped_from = Some(4096);
        let c2 = [Candidate { id: ChannelId(1), attr: &shm }, Candidate { id: ChannelId(2), attr: &mapped_cma }];
        let r = build_route(TopoClass::SharedL3, &c2, &cfg).unwrap();
        assert!(r.as_written && r.stream_eager.is_none() && r.mapped.is_none(), "{r:?}");
        cfg.set("POLYRAIL_ROUTE", "socket:1k-64k:cma/get").unwrap();
        assert!(rule(&cfg).is_some(), "a rule for another class changes nothing here");
        let r = build_route(TopoClass::SharedL3, &c2, &cfg).unwrap();
        assert!(!r.as_written && r.stream_eager.is_some() && r.mapped.is_some(), "{r:?}");
        // Only the shared-memory channel can time a line from the peer.
        let ib = attr(IB, Caps::AM | Caps::GET | Caps::PUT, 8192);
        let c = [Candidate { id: ChannelId(1), attr: &ib }, Candidate { id: ChannelId(2), attr: &cma }];
        assert_eq!(build_route(TopoClass::SharedL3, &c, &Config::default()).unwrap().placement, None);
    }

    #[test]
    fn streams_go_eager_up_to_one_and_a_half_thresholds() {
        let shm = attr(SHM, Caps::AM, 16384);
        let cma = attr(CMA, Caps::GET | Caps::PUT | Caps::CPU_COPY, 0);
        let c = [Candidate { id: ChannelId(1), attr: &shm }, Candidate { id: ChannelId(2), attr: &cma }];
        let upto = |cfg: &Config| build_route(TopoClass::SharedL3, &c, cfg).unwrap().stream_eager.map(|r| r.upto);
        let mut cfg = Config::default();
        assert_eq!(upto(&cfg), None, "off by default");
        cfg.set("POLYRAIL_STREAM_EAGER", "auto").unwrap();
        assert_eq!(upto(&cfg), Some((48 << 10) - 1));
        cfg.set("POLYRAIL_EAGER_LIMIT", "40k").unwrap();
        assert_eq!(upto(&cfg), Some(40 << 10), "at most the eager limit");
        cfg.set("POLYRAIL_STREAM_EAGER", "100k").unwrap();
        assert_eq!(upto(&cfg), Some(100 << 10));
        cfg.set("POLYRAIL_STREAM_EAGER", "16k").unwrap();
        assert_eq!(upto(&cfg), None, "below the single-copy threshold it changes nothing");
        cfg.set("POLYRAIL_STREAM_EAGER", "off").unwrap();
        assert_eq!(upto(&cfg), None);
        // A NIC copies: no stream rule.
        let ib = attr(IB, Caps::AM | Caps::GET | Caps::PUT, 8192);
        let r = build_route(TopoClass::RemoteNode, &[Candidate { id: ChannelId(3), attr: &ib }], &Config::default())
            .unwrap();
        assert!(r.stream_eager.is_none());
    }

    #[test]
    fn shm_only_streams_above_eager_limit() {
        let shm = attr(SHM, Caps::AM, 16384);
        let r = build_route(TopoClass::SharedL3, &[Candidate { id: ChannelId(0), attr: &shm }], &Config::default())
            .unwrap();
        assert_eq!(r.lookup(64 << 10).protocol, Protocol::Eager);
        assert_eq!(r.lookup((64 << 10) + 1).protocol, Protocol::RndvStream);
    }

    #[test]
    fn route_rules_override_ranges() {
        let shm = attr(SHM, Caps::AM, 16384);
        let cma = attr(CMA, Caps::GET | Caps::PUT | Caps::CPU_COPY, 0);
        let c = [Candidate { id: ChannelId(1), attr: &shm }, Candidate { id: ChannelId(2), attr: &cma }];
        let mut cfg = Config::default();
        cfg.set("POLYRAIL_ROUTE", "shared-l3:0-128k:shm,all:1m-:cma/get,socket:0-:shm/stream").unwrap();
        let r = build_route(TopoClass::SharedL3, &c, &cfg).unwrap();
        assert_eq!(r.lookup(100 << 10).protocol, Protocol::Eager);
        assert!(r.lookup(128 << 10).reason.contains("POLYRAIL_ROUTE"));
        assert_eq!(r.lookup((128 << 10) + 1).protocol, Protocol::RndvSplit);
        assert_eq!(r.lookup(1 << 20).protocol, Protocol::RndvGet);
        assert_eq!(r.lookup(usize::MAX).protocol, Protocol::RndvGet);
        // Ranges stay ordered and cover every size.
        let mut lo = 0;
        for e in &r.entries {
            assert!(e.upto >= lo, "{:?}", r.entries);
            lo = e.upto.saturating_add(1);
        }
        assert_eq!(r.entries.last().unwrap().upto, usize::MAX);
        // A class rule applies to its class only; empty messages stay eager.
        let r = build_route(TopoClass::Socket, &c, &cfg).unwrap();
        assert_eq!(r.lookup(0).protocol, Protocol::Eager);
        assert_eq!(r.lookup(1).protocol, Protocol::RndvStream);
        assert_eq!(r.lookup(2 << 20).protocol, Protocol::RndvStream);
        // A rule naming a channel that does not reach the peer, or cannot carry the protocol,
        // leaves the route alone.
        cfg.set("POLYRAIL_ROUTE", "all:0-:cma/eager,all:0-:ib").unwrap();
        let before = build_route(TopoClass::SharedL3, &c, &Config::default()).unwrap();
        assert_eq!(build_route(TopoClass::SharedL3, &c, &cfg).unwrap(), before);
        // Without a protocol: split where both copy with the CPU, get once splitting is off or
        // on an adapter (no CPU copies).
        let mut cfg = Config::default();
        cfg.set("POLYRAIL_ROUTE", "all:1m-:cma").unwrap();
        assert_eq!(build_route(TopoClass::SharedL3, &c, &cfg).unwrap().lookup(1 << 20).protocol, Protocol::RndvSplit);
        cfg.set("POLYRAIL_SPLIT_THRESHOLD", "off").unwrap();
        assert_eq!(build_route(TopoClass::SharedL3, &c, &cfg).unwrap().lookup(1 << 20).protocol, Protocol::RndvGet);
        let hca = attr(IB, Caps::AM | Caps::GET | Caps::PUT, 8192);
        let remote = [Candidate { id: ChannelId(3), attr: &hca }];
        let mut cfg = Config::default();
        cfg.set("POLYRAIL_ROUTE", "all:1m-:ib/get").unwrap();
        assert_eq!(
            build_route(TopoClass::RemoteNode, &remote, &cfg).unwrap().lookup(1 << 20).protocol,
            Protocol::RndvGet
        );
    }

    /// Eager entries stop at the most a receiver buffers unasked: beyond it the route says
    /// stream, as the engine does, whatever threshold asked for more.
    #[test]
    fn eager_entries_stop_at_the_eager_maximum() {
        let shm = attr(SHM, Caps::AM, 16384);
        let cma = attr(CMA, Caps::GET | Caps::PUT | Caps::CPU_COPY, 0);
        let c = [Candidate { id: ChannelId(1), attr: &shm }, Candidate { id: ChannelId(2), attr: &cma }];
        let mut cfg = Config::default();
        cfg.set("POLYRAIL_CMA_THRESHOLD", "1g").unwrap();
        let r = build_route(TopoClass::SharedL3, &c, &cfg).unwrap();
        assert_eq!(r.lookup(MAX_EAGER_MESSAGE).protocol, Protocol::Eager);
        let above = r.lookup(MAX_EAGER_MESSAGE + 1);
        assert_eq!((above.protocol, above.channel), (Protocol::RndvStream, ChannelId(1)));
        assert_eq!(r.lookup(1 << 30).protocol, Protocol::RndvSplit);
        cfg.set("POLYRAIL_ROUTE", "all:0-:shm").unwrap();
        let r = build_route(TopoClass::SharedL3, &c, &cfg).unwrap();
        assert_eq!(r.lookup(usize::MAX).protocol, Protocol::RndvStream);
        assert_eq!(r.entries.last().unwrap().upto, usize::MAX);
    }

    #[test]
    fn remote_peers_use_ib_with_its_eager_limit_and_no_split() {
        let ib = attr(IB, Caps::AM | Caps::GET | Caps::PUT, 8128);
        let c = [Candidate { id: ChannelId(3), attr: &ib }];
        let r = build_route(TopoClass::RemoteNode, &c, &Config::default()).unwrap();
        assert_eq!((r.am, r.frag), (ChannelId(3), 8128));
        assert_eq!(r.lookup(8192).protocol, Protocol::Eager);
        assert_eq!(r.lookup(8193).protocol, Protocol::RndvGet);
        assert!(r.lookup(8193).reason.contains("POLYRAIL_IB_EAGER_LIMIT=8k"));
        // A NIC copies: no split rendezvous, whatever POLYRAIL_SPLIT_THRESHOLD says.
        assert_eq!(r.lookup(64 << 20).protocol, Protocol::RndvGet);
        let mut cfg = Config::default();
        cfg.set("POLYRAIL_SPLIT_THRESHOLD", "64k").unwrap();
        assert_eq!(build_route(TopoClass::RemoteNode, &c, &cfg).unwrap().lookup(64 << 20).protocol, Protocol::RndvGet);
        cfg.set("POLYRAIL_IB_EAGER_LIMIT", "32k").unwrap();
        assert_eq!(build_route(TopoClass::RemoteNode, &c, &cfg).unwrap().rndv_threshold(), Some((32 << 10) + 1));
    }

    #[test]
    fn software_rdma_splits_from_its_own_size() {
        // Soft-RoCE or the soft provider: the CPUs of both sides copy.
        let mut ib = attr(IB, Caps::AM | Caps::GET | Caps::PUT | Caps::CPU_COPY, 8128);
        ib.split_from = Some(256 << 10);
        let c = [Candidate { id: ChannelId(3), attr: &ib }];
        let r = build_route(TopoClass::RemoteNode, &c, &Config::default()).unwrap();
        assert_eq!(r.lookup((256 << 10) - 1).protocol, Protocol::RndvGet);
        assert_eq!(r.lookup(256 << 10).protocol, Protocol::RndvSplit);
        assert!(r.lookup(256 << 10).reason.contains("measured for ib"), "{}", r.lookup(256 << 10).reason);
        let mut cfg = Config::default();
        cfg.set("POLYRAIL_SPLIT_THRESHOLD", "1m").unwrap();
        let r = build_route(TopoClass::RemoteNode, &c, &cfg).unwrap();
        assert_eq!(r.lookup((1 << 20) - 1).protocol, Protocol::RndvGet);
        assert_eq!(r.lookup(1 << 20).protocol, Protocol::RndvSplit);
        cfg.set("POLYRAIL_SPLIT_THRESHOLD", "off").unwrap();
        assert_eq!(build_route(TopoClass::RemoteNode, &c, &cfg).unwrap().lookup(64 << 20).protocol, Protocol::RndvGet);
    }

    #[test]
    fn no_am_channel_no_route() {
        let cma = attr(CMA, Caps::GET | Caps::PUT | Caps::CPU_COPY, 0);
        assert!(build_route(TopoClass::SharedL3, &[Candidate { id: ChannelId(0), attr: &cma }], &Config::default())
            .is_none());
    }
}
