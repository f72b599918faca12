//! Bringing a job up: bootstrap, channels, address exchange, routes.

use crate::driver::Driver;
use crate::topology::{current_binding, DeviceLocality, Topology};
use polyrail_core::adapt::Tuning;
use polyrail_core::config::{did_you_mean, VarInfo};
use polyrail_core::engine::{Engine, Setting};
use polyrail_core::observe::{says_yes, Observe};
use polyrail_core::policy::topology::TopoClass;
use polyrail_core::policy::{build_route, Candidate, ChannelId, ChannelSet, PeerRoute};
use polyrail_core::{
    Caps, ChannelFactory, ChannelStart, Config, Error, Opened, PeerInfo, Rank, Reach, Result, Transport, TransportKind,
};
use polyrail_pmi::{self as bootstrap, decode_hex, encode_hex, Bootstrap};

/// What `polyrail info` shows about one channel of this process.
#[derive(Clone, Debug)]
pub struct ChannelReport {
    /// The channel.
    pub kind: TransportKind,
    /// Whether it is in use, and if not why (disabled by `POLYRAIL_TRANSPORTS`, failed to start).
    pub status: String,
    /// The transport's own description (sizes, probe results).
    pub detail: String,
}

/// What `polyrail info` shows about one peer.
#[derive(Clone, Debug)]
pub struct PeerReport {
    /// The peer.
    pub rank: Rank,
    /// Where it sits relative to this process.
    pub class: TopoClass,
    /// Per channel: can it reach the peer, and why.
    pub reach: Vec<(TransportKind, Reach)>,
    /// The route table (with channel names resolved), if any channel reaches the peer.
    pub route: Option<PeerRoute>,
    /// Its virtual node and its memory domain there (0 the host, k device k).
    pub place: (u32, u16),
}

/// Everything the job learned while starting, for `polyrail info` and logs.
#[derive(Clone, Debug)]
pub struct JobReport {
    /// Topology summary.
    pub topology: String,
    /// This process's CPU binding.
    pub binding: Vec<usize>,
    /// RDMA devices and their PCI locality.
    pub devices: Vec<DeviceLocality>,
    /// Channels.
    pub channels: Vec<ChannelReport>,
    /// Channel kinds by channel id (for reading routes).
    pub channel_kinds: Vec<TransportKind>,
    /// Peers (including this rank itself).
    pub peers: Vec<PeerReport>,
    /// This process's virtual node and memory domain (0 the host, k device k).
    pub place: (u32, u16),
}

impl JobReport {
    /// The kind of channel `c` of this process (routes name channels by id).
    pub fn channel_kind(&self, c: ChannelId) -> Option<TransportKind> {
        self.channel_kinds.get(c.index()).copied()
    }
}

/// The most ranks a job may have (per-rank state is made for each at start).
pub const MAX_RANKS: u32 = 1 << 20;

/// A started job: bootstrap, driver and what was learned.
pub struct Job {
    /// The connection to the process manager.
    pub bootstrap: Box<dyn Bootstrap>,
    /// The engine and the channels.
    pub driver: Driver,
    /// What was learned while starting.
    pub report: JobReport,
    /// The settings the job started with.
    pub config: Config,
}

/// The ranks of `peers` (in increasing order) as `rank 3` or `3 ranks (1-2, 5)`; `None` for
/// none.
fn rank_list<T>(peers: &[(Rank, T)]) -> Option<String> {
    let (first, _) = peers.first()?;
    if peers.len() == 1 {
        return Some(format!("rank {first}"));
    }
    let mut runs: Vec<(Rank, Rank)> = Vec::new();
    for &(r, _) in peers {
        match runs.last_mut() {
            Some((_, end)) if *end + 1 == r => *end = r,
            _ => runs.push((r, r)),
        }
    }
    let runs: Vec<String> =
        runs.iter().map(|&(a, b)| if a == b { a.to_string() } else { format!("{a}-{b}") }).collect();
    Some(format!("{} ranks ({})", peers.len(), runs.join(", ")))
}

/// One warning line for all the peers of `peers` (rank and reason): the ranks, and the first
/// one's reason.
fn warn_once(rank: Rank, what: &str, peers: &[(Rank, String)]) {
    let (Some(ranks), Some((first, why))) = (rank_list(peers), peers.first()) else { return };
    if peers.len() == 1 {
        tracing::warn!("rank {rank}: {what} {ranks}: {why}");
    } else {
        tracing::warn!("rank {rank}: {what} {ranks}; to rank {first}: {why}");
    }
}

/// A process's description as published: pid, node, domain, host, CPUs and the channels it
/// started (whose addresses it published).
fn info_value(info: &PeerInfo, channels: &[&str]) -> String {
    let cpus: Vec<String> = info.cpus.iter().map(|c| c.to_string()).collect();
    let (pid, node, domain, host) = (info.pid, info.node, info.domain, encode_hex(info.host.as_bytes()));
    format!("{pid}.{node}.{domain}.{host}.{}.{}", cpus.join("_"), channels.join("+"))
}

/// A memory domain as reports name it: "the host" or "device k".
pub fn domain_name(domain: u16) -> String {
    if domain == 0 {
        "the host".into()
    } else {
        format!("device {domain}")
    }
}

/// Reads [`info_value`]'s description of rank `rank`, and the names of the channels it started.
fn parse_info(rank: Rank, v: &str) -> Result<(PeerInfo, Vec<String>)> {
    let bad = || Error::Bootstrap(format!("rank {rank} published a malformed process description {v:?}"));
    let mut it = v.splitn(6, '.');
    let pid = it.next().and_then(|s| s.parse().ok()).ok_or_else(bad)?;
    let node = it.next().and_then(|s| s.parse().ok()).ok_or_else(bad)?;
    let domain = it.next().and_then(|s| s.parse().ok()).ok_or_else(bad)?;
    let host = it.next().and_then(decode_hex).and_then(|b| String::from_utf8(b).ok()).ok_or_else(bad)?;
    let cpus = match it.next() {
        Some("") | None => Vec::new(),
        Some(s) => s.split('_').map(|c| c.parse().map_err(|_| bad())).collect::<Result<_>>()?,
    };
    let channels = it.next().ok_or_else(bad)?.split('+').filter(|c| !c.is_empty()).map(str::to_owned).collect();
    Ok((PeerInfo { rank, pid, host, node, cpus, own_cpus: true, domain }, channels))
}

/// Puts a value of any length: one longer than the process manager takes (the ib address grows
/// with the job) as `chunks:N` under `key` and the pieces under `key.I`.
fn put_long(boot: &mut dyn Bootstrap, key: &str, value: &str) -> Result<()> {
    let max = boot.max_value_len().max(16);
    if value.len() <= max {
        return boot.put(key, value);
    }
    // Values are ASCII (hex), so byte offsets are character boundaries.
    let chunks: Vec<&str> = value.as_bytes().chunks(max).map(|c| std::str::from_utf8(c).unwrap_or("")).collect();
    boot.put(key, &format!("chunks:{}", chunks.len()))?;
    for (i, c) in chunks.iter().enumerate() {
        boot.put(&format!("{key}.{i}"), c)?;
    }
    Ok(())
}

/// Most pieces a [`put_long`] value may have: 64 MiB of pieces of at least 16 bytes.
const MAX_CHUNKS: usize = (64 << 20) / 16;

/// Reads a value written by [`put_long`].
fn get_long(boot: &mut dyn Bootstrap, key: &str) -> Result<String> {
    let v = boot.get(key)?;
    let Some(n) = v.strip_prefix("chunks:") else { return Ok(v) };
    // At most what a value of the largest address could need (a count from a faulty process
    // manager must not make billions of requests).
    let n: usize = n
        .parse()
        .ok()
        .filter(|&n| n <= MAX_CHUNKS)
        .ok_or_else(|| Error::Bootstrap(format!("malformed chunk count under {key}: {v:?}")))?;
    let mut out = String::new();
    for i in 0..n {
        out.push_str(&boot.get(&format!("{key}.{i}"))?);
    }
    Ok(out)
}

/// Checks `config` against the variables the channels of `factories` declare: each channel's
/// own values, and that every `POLYRAIL_*` name is one some table declares (else an error that
/// suggests the nearest).
pub fn check_settings(factories: &[&dyn ChannelFactory], config: &Config) -> Result<()> {
    // Channels that share a model (scif and ib the link model's) declare its variables each.
    let mut seen = std::collections::HashSet::new();
    let declared: Vec<VarInfo> = factories.iter().flat_map(|f| f.variables()).filter(|v| seen.insert(v.name)).collect();
    config.check_names(&declared)?;
    // Channel names: which channels exist is known here, from the registered factories.
    let built: Vec<&str> = factories.iter().map(|f| f.kind().name()).collect();
    let unknown = |name: &str| {
        let hint = did_you_mean(name, &built).map(|n| format!("did you mean {n}? ")).unwrap_or_default();
        format!("{hint}`{name}` is no channel of this build, whose channels are {}", built.join(", "))
    };
    if let Some(name) = config.transports.names().iter().find(|n| !built.contains(&n.as_str())) {
        return Err(Error::config("POLYRAIL_TRANSPORTS", config.transports.to_string(), unknown(name)));
    }
    if let Some(rule) = config.routes.iter().find(|r| !built.contains(&r.channel.as_str())) {
        return Err(Error::config("POLYRAIL_ROUTE", rule.to_string(), unknown(&rule.channel)));
    }
    factories.iter().try_for_each(|f| f.check_settings(config))
}

/// Starts the channels of `factories` that `config` allows; reports the others.
fn start_channels(
    factories: &[&dyn ChannelFactory],
    config: &Config,
    job_id: &str,
    rank: Rank,
    size: u32,
) -> (Vec<Box<dyn Transport>>, Vec<ChannelReport>) {
    let mut channels: Vec<Box<dyn Transport>> = Vec::new();
    let mut reports = Vec::new();
    let start = ChannelStart { config, job_id, rank, size };
    for factory in factories {
        let kind = factory.kind();
        if !config.transports.allows(kind) {
            reports.push(ChannelReport {
                kind,
                status: "disabled by POLYRAIL_TRANSPORTS".into(),
                detail: String::new(),
            });
            continue;
        }
        match factory.open(&start) {
            Ok(Opened::Channel(t)) => {
                reports.push(ChannelReport { kind, status: "enabled".into(), detail: t.describe() });
                channels.push(t);
            }
            Ok(Opened::Absent(why)) => {
                tracing::debug!("{kind} channel not started: {why}");
                reports.push(ChannelReport { kind, status: why, detail: String::new() });
            }
            Err(e) => {
                tracing::warn!("{kind} channel unavailable: {e}");
                reports.push(ChannelReport { kind, status: format!("failed to start: {e}"), detail: String::new() });
            }
        }
    }
    (channels, reports)
}

impl Job {
    /// Starts this process's part of the job with the channels of `factories`, and `boot` or
    /// the process manager named by the environment. The caller runs a barrier over the
    /// channels, then [`Job::connected`].
    pub fn start(factories: &[&dyn ChannelFactory], config: Config, boot: Option<Box<dyn Bootstrap>>) -> Result<Job> {
        check_settings(factories, &config)?;
        let mut boot = match boot {
            Some(b) => b,
            None => bootstrap::from_env(&config)?,
        };
        let (rank, size) = (boot.rank(), boot.size());
        if size > MAX_RANKS {
            // Per-rank state is made for every rank: a broken process manager's size would
            // exhaust memory before anything else could fail.
            return Err(Error::Bootstrap(format!(
                "the process manager gives the job {size} ranks; polyrail runs jobs of at most {MAX_RANKS}"
            )));
        }
        let job_id = boot.job_id().to_owned();
        let topology = Topology::detect();
        let binding = current_binding();
        let node = config.node.unwrap_or(0);
        let me = PeerInfo {
            rank,
            pid: std::process::id(),
            host: polyrail_core::host_identity(),
            node,
            cpus: binding.clone(),
            own_cpus: true,
            domain: config.domain,
        };
        let (mut channels, channel_reports) = start_channels(factories, &config, &job_id, rank, size);

        // Publish who we are and every channel's address; one fence makes them visible.
        // Also the description may be long: the CPU list of an unbound rank on a large node.
        let started: Vec<&str> = channels.iter().map(|c| c.attr().kind.name()).collect();
        put_long(boot.as_mut(), &format!("pi{rank}"), &info_value(&me, &started))?;
        for ch in &channels {
            put_long(boot.as_mut(), &format!("pa{rank}.{}", ch.attr().kind), &encode_hex(&ch.address()))?;
        }
        boot.fence()?;

        let mut peers = Vec::with_capacity(size as usize);
        // Channels that reach another rank: only these can deliver, so only these are polled.
        let mut reaching = ChannelSet::EMPTY;
        let mut infos = Vec::with_capacity(size as usize);
        for r in 0..size {
            infos.push(if r == rank {
                (me.clone(), started.iter().map(|&c| c.to_owned()).collect())
            } else {
                parse_info(r, &get_long(boot.as_mut(), &format!("pi{r}"))?)?
            });
        }
        // More ranks on this machine than CPUs (virtual nodes of one host share them too): line
        // samples and copy rates mean what sharing a core does (see adapt::PlacementAdapter).
        let same_host = infos.iter().filter(|(i, _)| i.host == me.host).count();
        let own_cpus = same_host <= topology.num_cpus();
        if !own_cpus {
            tracing::debug!(
                "rank {rank}: {same_host} ranks on this machine's {} CPUs: local line samples count, cell fill rates do not",
                topology.num_cpus()
            );
        }
        let mut engine = Engine::new(rank, size, Tuning::from_config(&config, own_cpus));
        // Peers no channel carries messages to, and peers of this node a single-copy channel
        // cannot reach, each with the first reason: one warning each after the loop.
        let (mut unreachable, mut no_copies) = (Vec::new(), Vec::new());
        for (r, (mut info, theirs)) in (0..size).zip(infos) {
            info.own_cpus = own_cpus;
            let class = if r == rank {
                TopoClass::SameProcess
            } else if info.host != me.host || info.node != me.node {
                TopoClass::RemoteNode
            } else {
                topology.classify(&me.cpus, &info.cpus)
            };
            let mut reach = Vec::new();
            for ch in channels.iter_mut() {
                let kind = ch.attr().kind;
                if r != rank && info.node != me.node && ch.attr().caps.contains(Caps::NODE_LOCAL) {
                    reach.push((
                        kind,
                        Reach::No(format!("rank {r} is on virtual node {}, this rank on {}", info.node, me.node)),
                    ));
                    continue;
                }
                if r != rank && info.domain != me.domain && ch.attr().caps.contains(Caps::DOMAIN_LOCAL) {
                    let (theirs, mine) = (domain_name(info.domain), domain_name(me.domain));
                    reach.push((kind, Reach::No(format!("rank {r} is on {theirs} of its node, this rank on {mine}"))));
                    continue;
                }
                if !theirs.iter().any(|c| c == kind.name()) {
                    // Its POLYRAIL_TRANSPORTS denies the channel, or it failed to start there.
                    reach.push((kind, Reach::No(format!("rank {r} did not start {kind} (see its log or settings)"))));
                    continue;
                }
                let addr = if r == rank {
                    ch.address()
                } else {
                    let v = get_long(boot.as_mut(), &format!("pa{r}.{kind}"))?;
                    decode_hex(&v)
                        .ok_or_else(|| Error::Bootstrap(format!("rank {r} published a malformed {kind} address")))?
                };
                reach.push((kind, ch.add_peer(&info, &addr)));
            }
            if r != rank {
                for (i, (_, how)) in reach.iter().enumerate() {
                    if matches!(how, Reach::Yes(_)) {
                        reaching.insert(ChannelId(i as u8));
                    }
                }
            }
            let candidates: Vec<Candidate<'_>> = channels
                .iter()
                .enumerate()
                .filter(|(i, _)| matches!(reach[*i].1, Reach::Yes(_)))
                .map(|(i, ch)| Candidate { id: ChannelId(i as u8), attr: ch.attr() })
                .collect();
            let mut route = build_route(class, &candidates, &config);
            if let Some(rt) = route.as_mut() {
                // Sends from registered memory go by single copy early only where it is mapped.
                let mapper = rt.mapped.as_ref().map(|m| m.channel.index());
                if mapper.is_some_and(|c| !says_yes(channels[c].observe(r, Observe::MapsRegistered))) {
                    rt.mapped = None;
                }
            }
            if r != rank {
                for (i, (kind, why)) in reach.iter().enumerate() {
                    if let Reach::No(why) = why {
                        // A single-copy channel of this node that cannot reach a peer on it
                        // leaves large messages to the active-message channel: worth a warning.
                        let caps = channels[i].attr().caps;
                        if caps.contains(Caps::GET | Caps::NODE_LOCAL)
                            && !caps.contains(Caps::AM)
                            && info.node == me.node
                            && info.domain == me.domain
                        {
                            // One line for all such peers, after the loop: a channel that
                            // fails in every rank would otherwise warn N² times.
                            tracing::debug!("rank {rank}: {kind} cannot reach rank {r}: {why}");
                            no_copies.push((r, format!("{kind} cannot reach it ({why})")));
                        } else {
                            tracing::debug!("rank {rank}: {kind} cannot reach rank {r}: {why}");
                        }
                    }
                }
            }
            match &route {
                Some(rt) => {
                    if r != rank {
                        for e in &rt.entries {
                            let ch = channels.get(e.channel.index()).map_or("?", |c| c.attr().kind.name());
                            tracing::debug!(
                                "rank {rank}: route to rank {r} ({class}) up to {}: {} over {ch}: {}",
                                if e.upto == usize::MAX {
                                    "max".to_string()
                                } else {
                                    polyrail_core::format_size(e.upto)
                                },
                                e.protocol.name(),
                                e.reason
                            );
                        }
                    }
                    if let Some(st) = rt.stream_eager.as_ref().filter(|_| r != rank) {
                        tracing::debug!(
                            "rank {rank}: route to rank {r}: in a stream of sends, single copy up to {} goes eager: {}",
                            polyrail_core::format_size(st.upto),
                            st.reason
                        );
                    }
                    if let Some(n) = rt.placement.as_ref().filter(|_| r != rank) {
                        tracing::debug!("rank {rank}: route to rank {r}: {}", n.describe());
                    }
                    if let Some(m) = rt.mapped.as_ref().filter(|_| r != rank) {
                        tracing::debug!(
                            "rank {rank}: route to rank {r}: from registered memory, single copy from {}: {}",
                            polyrail_core::format_size(m.from),
                            m.reason
                        );
                    }
                    engine.set(Setting::Route(r, Ok(rt.clone())))
                }
                None => {
                    // Channels that reach it carry no messages (cma, say, only copies): say so
                    // first, then why the others do not reach it.
                    let copies_only: Vec<String> = reach
                        .iter()
                        .filter(|(_, reach)| matches!(reach, Reach::Yes(_)))
                        .map(|(kind, _)| kind.to_string())
                        .collect();
                    let mut why: Vec<String> = Vec::new();
                    if !copies_only.is_empty() {
                        why.push(format!(
                            "{} reach{} it but carr{} no messages, only one-sided copies (allow shm or ib too)",
                            copies_only.join(", "),
                            if copies_only.len() == 1 { "es" } else { "" },
                            if copies_only.len() == 1 { "ies" } else { "y" },
                        ));
                    }
                    why.extend(reach.iter().filter_map(|(kind, reach)| match reach {
                        Reach::No(why) => Some(format!("{kind}: {why}")),
                        Reach::Yes(_) => None,
                    }));
                    let why = format!("{} (POLYRAIL_TRANSPORTS={})", why.join("; "), config.transports);
                    tracing::debug!("rank {rank}: no channel carries messages to rank {r}: {why}");
                    unreachable.push((r, why.clone()));
                    engine.set(Setting::Route(r, Err(why)));
                }
            }
            peers.push(PeerReport { rank: r, class, reach, route, place: (info.node, info.domain) });
        }
        warn_once(rank, "no channel carries messages to", &unreachable);
        warn_once(rank, "large messages go through pipelined send cells to", &no_copies);
        // Connected queue pairs (ib) drop what arrives before they are ready to receive, which
        // they are once add_peer ran: every process has added its peers before anyone sends.
        // Every process fences here, whatever channels it started, so the count always matches
        // (a fence is a barrier under PMI-1; where a PMI-2 fence is not, the queue pairs'
        // retries cover the gap).
        boot.fence()?;
        let channel_kinds = channels.iter().map(|c| c.attr().kind).collect();
        let report = JobReport {
            topology: topology.summary,
            binding,
            devices: topology.devices,
            channels: channel_reports,
            channel_kinds,
            peers,
            place: (me.node, me.domain),
        };
        let mut driver = Driver::new(engine, rank, size, channels, reaching, config.wait, config.poll);
        driver.watch_manager(boot.hangup_watch());
        Ok(Job { bootstrap: boot, driver, report, config })
    }

    /// Every process is attached to every peer (the caller passed a barrier): channels release
    /// what only had to live until then (the shm channel unlinks its segment's name).
    ///
    /// The barrier runs over the channels rather than the bootstrap's fence because a PMI-2
    /// fence is not a barrier under every process manager (Hydra's is not).
    pub fn connected(driver: &mut Driver, report: &mut JobReport) -> Result<()> {
        for ch in &mut driver.channels {
            ch.connected()?;
        }
        for c in &mut report.channels {
            if let Some(ch) = driver.channels.iter().find(|ch| ch.attr().kind == c.kind) {
                c.detail = ch.describe();
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use polyrail_pmi::Singleton;

    #[test]
    fn rank_lists_are_short() {
        let of = |ranks: &[Rank]| rank_list(&ranks.iter().map(|&r| (r, ())).collect::<Vec<_>>());
        assert_eq!(of(&[]), None);
        assert_eq!(of(&[3]).unwrap(), "rank 3");
        assert_eq!(of(&[1, 2, 3, 5, 7, 8]).unwrap(), "6 ranks (1-3, 5, 7-8)");
    }

    /// A channel registered under `name` that never starts.
    struct Named(&'static str);

    impl ChannelFactory for Named {
        fn kind(&self) -> TransportKind {
            TransportKind::new(self.0)
        }
        fn open(&self, _start: &ChannelStart<'_>) -> Result<Opened> {
            Ok(Opened::Absent("a test factory".into()))
        }
    }

    #[test]
    fn channel_names_are_checked_against_the_registered_channels() {
        let factories: [&dyn ChannelFactory; 2] = [&Named("self"), &Named("shm")];
        let check =
            |vars: &[(&str, &str)]| check_settings(&factories, &Config::from_vars(vars.iter().copied()).unwrap());
        assert!(check(&[("POLYRAIL_TRANSPORTS", "shm")]).is_ok());
        let e = check(&[("POLYRAIL_TRANSPORTS", "shm,shn2")]).unwrap_err().to_string();
        assert!(e.contains("POLYRAIL_TRANSPORTS") && e.contains("`shn2` is no channel of this build"), "{e}");
        assert!(e.contains("self, shm"), "{e}");
        let e = check(&[("POLYRAIL_ROUTE", "all:1m-:cma/get")]).unwrap_err().to_string();
        assert!(e.contains("POLYRAIL_ROUTE=\"all:1m-:cma/get\""), "{e}");
        assert!(e.contains("`cma` is no channel of this build"), "{e}");
    }

    /// A bootstrap whose values hold at most 16 bytes.
    struct Small(Singleton);

    impl Bootstrap for Small {
        fn rank(&self) -> Rank {
            0
        }
        fn size(&self) -> u32 {
            1
        }
        fn job_id(&self) -> &str {
            self.0.job_id()
        }
        fn max_value_len(&self) -> usize {
            16
        }
        fn put(&mut self, key: &str, value: &str) -> Result<()> {
            assert!(value.len() <= 16, "{key}={value} is too long");
            self.0.put(key, value)
        }
        fn fence(&mut self) -> Result<()> {
            Ok(())
        }
        fn get(&mut self, key: &str) -> Result<String> {
            self.0.get(key)
        }
        fn finalize(&mut self) -> Result<()> {
            Ok(())
        }
        fn abort(&mut self, code: i32, msg: &str) {
            self.0.abort(code, msg)
        }
    }

    #[test]
    fn long_values_are_split_over_keys() {
        let mut b = Small(Singleton::new());
        let long = encode_hex(&(0..100u8).collect::<Vec<_>>());
        put_long(&mut b, "pa0.ib", &long).unwrap();
        put_long(&mut b, "pa0.shm", "abcd").unwrap();
        assert_eq!(get_long(&mut b, "pa0.ib").unwrap(), long);
        assert_eq!(get_long(&mut b, "pa0.shm").unwrap(), "abcd");
        // A process description too: an unbound rank's CPU list on a large node.
        let me = PeerInfo {
            rank: 0,
            pid: 42,
            host: "node-17".into(),
            node: 0,
            cpus: (0..256).collect(),
            own_cpus: true,
            domain: 3,
        };
        put_long(&mut b, "pi0", &info_value(&me, &["self", "shm"])).unwrap();
        let (info, channels) = parse_info(0, &get_long(&mut b, "pi0").unwrap()).unwrap();
        assert_eq!((info.cpus, channels), (me.cpus, vec!["self".to_string(), "shm".to_string()]));
        assert!(parse_info(1, "1.0.61.0").is_err(), "no channel list");
        // A chunk count beyond any value is refused, not asked for piece by piece.
        b.put("pa1.ib", "chunks:99999999").unwrap();
        assert!(get_long(&mut b, "pa1.ib").unwrap_err().to_string().contains("malformed chunk count"));
    }
}
