//! polyrail-bench: the measurement code shared by the `polyrail-bench` runner and the criterion
//! benches (`cargo bench -p polyrail-bench`).

pub mod calibrate;
pub mod experiments;
pub mod osu;
pub mod report;

use clap::Args;
use std::ffi::OsString;
use std::path::PathBuf;

/// `--sizes` when not given.
pub const DEFAULT_SIZES: &str = "0,1,8,64,512,4k,16k,32k,64k,256k,1m,4m";

/// Options shared by the measurements.
#[derive(Args, Clone, Debug)]
pub struct Common {
    /// Channel to force: `auto` (the policy decides), `shm` (rings and send cells only; large
    /// messages pipelined through cells), `cma` (single copy for every non-empty message), `ib`
    /// (each rank on its own virtual node: DirectIB over real verbs when there is an RDMA
    /// device, else over the software provider), `scif` (even ranks on the host, odd ones on
    /// device 1 of one node: the software SCIF provider, an emulation) or `ib-device` (each rank
    /// on device 1 of its own node: DirectIB between devices, paying the link model's adapter
    /// read of device memory with `POLYRAIL_LINK_PROFILE`).
    #[arg(long, default_value = "auto")]
    pub transport: String,
    /// Sizes to measure (comma-separated, with k/m suffixes).
    #[arg(long, default_value = DEFAULT_SIZES)]
    pub sizes: String,
    /// Ranks to start when run alone (at least 2).
    #[arg(short = 'n', long = "np", default_value_t = 2, value_parser = clap::value_parser!(u32).range(2..))]
    pub ranks: u32,
    /// Iteration count override (default: OSU's, by size; 1 to 100000000).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=100_000_000))]
    pub iters: Option<u32>,
    /// Fewer iterations (for smoke tests).
    #[arg(long)]
    pub quick: bool,
    /// Append every point to this CSV file (`bench,transport,size,value,unit`).
    #[arg(long)]
    pub csv: Option<PathBuf>,
    /// Send from and receive into buffers registered once (`Context::alloc_registered`)
    /// instead of ordinary memory registered per message (matters for `ib`).
    #[arg(long, conflicts_with = "heap")]
    pub registered: bool,
    /// Send from and receive into ordinary `Vec`s in memory files of polyrail's `MappedHeap`
    /// (this program's global allocator, otherwise turned off), which polyrail registers at
    /// first use.
    #[arg(long)]
    pub heap: bool,
    /// Write a pattern of its round into every message and check what arrives (as osu_latency
    /// -c does; `latency` and `bw` only: every message, and for `bw` the receive buffer after
    /// each window). The writing and checking are timed too, so no `--csv` with it.
    #[arg(long, conflicts_with = "csv")]
    pub validate: bool,
    /// Print nothing (with --csv: for runs driven by `compare`).
    #[arg(long, hide = true)]
    pub quiet: bool,
}

/// An option of [`Common`] that some measurements do not use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CommonOption {
    /// `--transport`
    Transport,
    /// `-n` / `--np`
    Ranks,
    /// `--sizes`
    Sizes,
    /// `--iters`
    Iters,
    /// `--quick`
    Quick,
    /// `--validate`
    Validate,
}

impl CommonOption {
    /// Whether the command line gave it (a value other than the default).
    pub fn given(self, c: &Common) -> bool {
        match self {
            CommonOption::Transport => c.transport != "auto",
            CommonOption::Ranks => c.ranks != 2,
            CommonOption::Sizes => c.sizes != DEFAULT_SIZES,
            CommonOption::Iters => c.iters.is_some(),
            CommonOption::Quick => c.quick,
            CommonOption::Validate => c.validate,
        }
    }

    /// As the command line spells it.
    pub fn name(self) -> &'static str {
        match self {
            CommonOption::Transport => "--transport",
            CommonOption::Ranks => "-n/--np",
            CommonOption::Sizes => "--sizes",
            CommonOption::Iters => "--iters",
            CommonOption::Quick => "--quick",
            CommonOption::Validate => "--validate",
        }
    }
}

impl Common {
    /// An error naming the first of `unused` that the command line gave: `command` does not
    /// use it (`why` says what it does instead), and a silently ignored option would make its
    /// numbers look like something they are not.
    pub fn refuse(&self, command: &str, unused: &[CommonOption], why: &str) -> anyhow::Result<()> {
        match unused.iter().find(|o| o.given(self)) {
            Some(o) => anyhow::bail!("`polyrail-bench {command}` does not use {}: {why}", o.name()),
            None => Ok(()),
        }
    }

    /// The buffers' suffix in CSV rows and `compare`'s columns: `+registered`, `+heap` or none.
    pub fn buffers(&self) -> &'static str {
        match (self.registered, self.heap) {
            (true, _) => "+registered",
            (_, true) => "+heap",
            _ => "",
        }
    }
}

/// The `POLYRAIL_*` settings that force a channel: `auto` (none), `shm` (rings and send cells
/// only), `cma` (single copy for every non-empty message: no placement, skew or stream rule
/// sends one eagerly), `ib`, `scif` and `ib-device` (none: the ranks are placed instead, see
/// [`channel_layout`]).
pub fn channel_settings(transport: &str) -> anyhow::Result<&'static [(&'static str, &'static str)]> {
    Ok(match transport {
        "auto" | "ib" | "scif" | "ib-device" => &[],
        "shm" => &[("POLYRAIL_TRANSPORTS", "shm")],
        // Not eager by the placement rule either: single copy whatever the placement.
        "cma" => &[
            ("POLYRAIL_CMA_THRESHOLD", "1"),
            ("POLYRAIL_NEAR_EAGER", "off"),
            ("POLYRAIL_APART_SINGLE_COPY", "off"),
            ("POLYRAIL_SKEW", "off"),
            ("POLYRAIL_STREAM_EAGER", "off"),
        ],
        other => anyhow::bail!("--transport {other} is not accepted: use auto, shm, cma, ib, scif or ib-device"),
    })
}

/// Where the ranks of a job run: each rank's virtual node (`None`: all on one node) and its
/// memory domain with its node's number of domains (`None`: all on the host).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ChannelLayout {
    /// `POLYRAIL_NODE` of each rank.
    pub nodes: Option<Vec<u32>>,
    /// `POLYRAIL_DOMAIN` and `POLYRAIL_DOMAINS` of each rank.
    pub domains: Option<Vec<(u16, u16)>>,
}

/// Where each of `ranks` ranks runs so that they talk over `transport`: each on its own node
/// for `ib` (real verbs when there is an RDMA device, else the software provider), and on
/// device 1 of its own node for `ib-device`; host and device 1 of one node in turn for `scif`;
/// one node, on the host, for the node-local channels.
pub fn channel_layout(transport: &str, ranks: u32) -> ChannelLayout {
    let own_nodes = || Some((0..ranks).collect());
    match transport {
        "ib" => ChannelLayout { nodes: own_nodes(), domains: None },
        "ib-device" => ChannelLayout { nodes: own_nodes(), domains: Some(vec![(1, 2); ranks as usize]) },
        "scif" => ChannelLayout { nodes: None, domains: Some((0..ranks).map(|r| ((r % 2) as u16, 2)).collect()) },
        _ => ChannelLayout::default(),
    }
}

/// The channel `--transport` names, as the job report names it.
fn channel_name(transport: &str) -> &str {
    if transport == "ib-device" {
        "ib"
    } else {
        transport
    }
}

/// [`channel_settings`] as environment variables for a launched job.
pub fn transport_env(transport: &str) -> anyhow::Result<Vec<(OsString, OsString)>> {
    Ok(channel_settings(transport)?.iter().map(|(k, v)| (k.into(), v.into())).collect())
}

/// The configuration from the environment with [`channel_settings`] of `transport` applied.
fn env_config_with(transport: &str) -> anyhow::Result<polyrail::Config> {
    let mut cfg = polyrail::settings()?;
    for (k, v) in channel_settings(transport)? {
        cfg.set(k, v)?;
    }
    Ok(cfg)
}

/// The configuration of a rank started by a launcher (`polyrail run`, Hydra, or this runner
/// itself): the environment's, with [`channel_settings`] applied, so that `--transport` holds
/// under any launcher. `ib` needs the ranks on different nodes already (`POLYRAIL_NODE`).
pub fn rank_config(transport: &str) -> anyhow::Result<polyrail::Config> {
    let cfg = env_config_with(transport)?;
    if channel_name(transport) == "ib" && cfg.node.is_none() {
        anyhow::bail!(
            "--transport {transport} under a launcher needs the ranks on different virtual nodes \
             (polyrail run --nodes N or --layout), or start polyrail-bench alone"
        );
    }
    if transport == "scif" && std::env::var_os("POLYRAIL_DOMAIN").is_none() {
        anyhow::bail!(
            "--transport scif under a launcher needs ranks on the host and a device (polyrail run --layout 1+1), \
             or start polyrail-bench alone"
        );
    }
    Ok(cfg)
}

/// An error unless the channel `--transport` forces (shm, cma, ib, scif) carries messages to
/// every peer in `report`, this process's job report: a channel refused at start (cma under a
/// ptrace rule, one denied by `POLYRAIL_TRANSPORTS`) would leave its numbers those of another.
pub fn check_forced(report: &polyrail::JobReport, me: polyrail::Rank, transport: &str) -> anyhow::Result<()> {
    if !["shm", "cma", "ib", "scif", "ib-device"].contains(&transport) {
        return Ok(());
    }
    let transport = channel_name(transport);
    let is_wanted = |c| report.channel_kind(c).is_some_and(|k| k.name() == transport);
    for p in report.peers.iter().filter(|p| p.rank != me) {
        let carries =
            p.route.as_ref().is_some_and(|r| is_wanted(r.am) || r.entries.iter().any(|e| is_wanted(e.channel)));
        if !carries {
            let why = report
                .channels
                .iter()
                .find(|c| c.kind.name() == transport)
                .map_or("not started", |c| c.status.as_str());
            anyhow::bail!(
                "--transport {transport}: no message to rank {} would go over {transport} ({why}); see `polyrail info`",
                p.rank
            );
        }
    }
    Ok(())
}

/// [`channel_settings`] applied to the configuration from the environment, for rank 0 of a job
/// started with [`polyrail_cli::launch::spawn_peers`] (its place too, see [`channel_layout`]).
pub fn channel_config(transport: &str) -> anyhow::Result<polyrail::Config> {
    let mut cfg = env_config_with(transport)?;
    let layout = channel_layout(transport, 1);
    if let Some(nodes) = layout.nodes {
        cfg.node = nodes.first().copied();
    }
    if let Some(&(domain, domains)) = layout.domains.as_ref().and_then(|d| d.first()) {
        cfg.set("POLYRAIL_DOMAIN", &domain.to_string())?;
        cfg.set("POLYRAIL_DOMAINS", &domains.to_string())?;
    }
    Ok(cfg)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn defaults() -> Common {
        Common {
            transport: "auto".into(),
            sizes: DEFAULT_SIZES.into(),
            ranks: 2,
            iters: None,
            quick: false,
            csv: None,
            registered: false,
            heap: false,
            validate: false,
            quiet: false,
        }
    }

    #[test]
    fn options_a_command_does_not_use_are_refused_by_name() {
        let unused = [CommonOption::Sizes, CommonOption::Iters];
        assert!(defaults().refuse("x", &unused, "why").is_ok());
        let quick = Common { quick: true, ..defaults() };
        assert!(quick.refuse("x", &unused, "why").is_ok(), "--quick is not among the unused");
        let iters = Common { iters: Some(5), ..defaults() };
        let err = iters.refuse("discovery", &unused, "it sends 8 bytes").unwrap_err().to_string();
        assert_eq!(err, "`polyrail-bench discovery` does not use --iters: it sends 8 bytes");
        let sizes = Common { sizes: "8".into(), ..defaults() };
        assert!(sizes.refuse("x", &unused, "why").unwrap_err().to_string().contains("--sizes"));
    }
}
