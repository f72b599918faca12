//! `polyrail-bench`: OSU-style measurements between the processes of a polyrail job.
//!
//! Started alone, it launches its own ranks (`polyrail_cli::launch`, 2 by default, bound to one
//! core each); under a launcher (`polyrail run`, `mpiexec.hydra`) it runs as one of the ranks.
//! One rank prints the results: rank 0 the OSU tables (`# Size  Latency (us)` /
//! `# Size  Bandwidth (MB/s)`). `compare` and `report` run alone, never under a launcher.

use anyhow::{bail, Context as _};
use clap::{Parser, Subcommand};
use polyrail_bench::{channel_layout, experiments, osu, transport_env, Common};
use polyrail_cli::launch::{launch, LaunchOptions};
use std::ffi::OsString;
use std::path::PathBuf;

// `--heap` runs send from its memory files; every other run turns it off at start.
#[global_allocator]
static HEAP: polyrail::MappedHeap = polyrail::MappedHeap::new();

#[derive(Parser)]
#[command(name = "polyrail-bench", version, about = "OSU-style benchmarks of polyrail's channels")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// One-way latency by ping-pong (osu_latency): half the round trip, averaged.
    Latency {
        #[command(flatten)]
        common: Common,
        /// Before every send the sender writes the whole message anew, as an application
        /// sends new data each round (osu_latency sends one unchanged buffer, whose lines a
        /// single copy finds in the receiving core's cache from the round before).
        #[arg(long)]
        fresh: bool,
    },
    /// Streaming bandwidth (osu_bw): windows of 64 non-blocking sends, one acknowledgement.
    Bw(Common),
    /// Bidirectional bandwidth (osu_bibw): both ranks stream windows of 64 at once.
    Bibw(Common),
    /// Multi-pair bandwidth and message rate (osu_mbw_mr, Chai §6.2): rank r streams to r + n/2.
    MbwMr(Common),
    /// Producer/consumer with compute per message (Chai §6.2.4): how single copy and eager cope
    /// when the receiver lags.
    ///
    /// --messages and --repeats set its length; --quick and --iters are refused.
    Skew {
        #[command(flatten)]
        common: Common,
        /// Messages per size (at least 1).
        #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u32).range(1..))]
        messages: u32,
        /// Producer's compute before each send (µs).
        #[arg(long, default_value_t = 10)]
        c1: u64,
        /// Consumer's compute after each receive (µs).
        #[arg(long, default_value_t = 40)]
        c2: u64,
        /// Runs per size (the median is reported).
        #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..))]
        repeats: u32,
    },
    /// Overlap of a large transfer with computation that tests the request periodically
    /// (Chai §7.3.2).
    ///
    /// 20 transfers per size, 2 with --quick; --iters is refused.
    Overlap {
        #[command(flatten)]
        common: Common,
        /// Computation time (µs).
        #[arg(long, default_value_t = 2000)]
        compute: u64,
        /// Test the request every this many µs.
        #[arg(long, default_value_t = 100)]
        period: u64,
    },
    /// Message discovery time under static and dynamic polling priority (Chai §7.3.1): a
    /// shared-memory peer and a network peer (another virtual node, over ib) send bursts to one
    /// root; one job per POLYRAIL_POLL policy.
    ///
    /// 8-byte messages among 3 + --quiet-peers ranks: --transport, -n and --sizes are refused,
    /// --iters too unless --pattern ping-pong.
    Discovery {
        #[command(flatten)]
        common: Common,
        /// `burst`: both senders send at once, a burst per round; `ping-pong`: the root
        /// ping-pongs with one sender at a time while the other waits blocked.
        #[arg(long, value_enum, default_value = "burst")]
        pattern: experiments::DiscoveryPattern,
        /// Messages per sender and round (burst; at least 1).
        #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..))]
        burst: u32,
        /// Polling policies to compare (POLYRAIL_POLL values).
        #[arg(long, value_delimiter = ',', default_value = "all,static:50,static:1000,dynamic:8")]
        policies: Vec<String>,
        /// Extra ranks on the network peer's node that send nothing: each is one more ring
        /// the root's ib channel polls (at most 1021, a job of 1024 ranks on this machine).
        #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u32).range(..=1021))]
        quiet_peers: u32,
    },
    /// The link model's paths (an emulation) driven with large transfers through the providers
    /// that pace them (SCIF for PCIe, soft RDMA for the adapter and the network): each plateau
    /// beside the profile's figure, and whether pacing delayed anything. Runs alone, in one
    /// process.
    LinkCalibrate {
        /// The profile (`prism`, `prism/N`: every bandwidth divided by N).
        #[arg(long, default_value = "prism")]
        profile: String,
        /// Bytes per transfer (with k/m suffixes).
        #[arg(long, default_value = "4m")]
        bytes: String,
        /// Transfers per path, the first --window of them a warm-up outside the timing.
        #[arg(long, default_value_t = 40)]
        transfers: usize,
        /// Transfers in flight.
        #[arg(long, default_value_t = 8)]
        window: usize,
    },
    /// The channels of nodes with devices (emulated: the software SCIF and RDMA providers and
    /// the link model): `scif` between the host and a device without a model, from ordinary and
    /// from registered buffers, beside a single-thread memcpy of this machine; then, with the model's --profile, `scif`, DirectIB
    /// between devices of two nodes (`ib-device`) and between hosts (`ib`), each beside the
    /// profile's ceiling for its path.
    ///
    /// Ten jobs of 2 ranks (latency and bw each), each stopped after 15 minutes.
    Devices {
        /// Sizes to measure (comma-separated, with k/m suffixes).
        #[arg(long, default_value = "8,4k,64k,1m,4m")]
        sizes: String,
        /// The link model's profile for the paced runs (`prism/N`: every bandwidth divided by N,
        /// so that no path asks for more than this machine copies).
        #[arg(long, default_value = "prism/4")]
        profile: String,
        /// Fewer iterations (for smoke tests).
        #[arg(long)]
        quick: bool,
        /// Also write every point to this CSV file.
        #[arg(long)]
        csv: Option<PathBuf>,
    },
    /// Medians, ratios and SVG plots from a comparison CSV (scripts/compare-peers.sh).
    Report {
        /// The CSV (`tool,mode,metric,size,rep,value`).
        #[arg(long)]
        input: PathBuf,
        /// Folder for report.md, latency.svg and bandwidth.svg.
        #[arg(long)]
        out: PathBuf,
    },
    /// Latency and bandwidth of every channel (auto, shm, cma, and auto from registered
    /// buffers and from heap blocks) in one table, and the automatic route's latency with
    /// fresh data (`latency --fresh`).
    ///
    /// Eleven jobs of 2 ranks, each stopped after 15 minutes. A job that fails leaves its
    /// cells `-` and the exit status its own; a Ctrl-C stops the series there.
    Compare {
        /// Sizes to measure (comma-separated, with k/m suffixes).
        #[arg(long, default_value = "8,64,512,4k,32k,256k,1m,4m")]
        sizes: String,
        /// Fewer iterations (for smoke tests).
        #[arg(long)]
        quick: bool,
        /// Also write every point to this CSV file.
        #[arg(long)]
        csv: Option<PathBuf>,
    },
}

fn main() {
    polyrail::MappedHeap::set_enabled(false);
    let code = match run(Cli::parse()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("polyrail-bench: {}", polyrail::error_chain(e.as_ref()));
            1
        }
    };
    std::process::exit(code);
}

fn under_launcher() -> bool {
    std::env::var_os("PMI_FD").is_some() || std::env::var_os("PMI_PORT").is_some()
}

/// Starts `args` of this executable as a job of `ranks` with the channel forced, stopped after
/// `timeout` if given.
fn relaunch(
    ranks: u32,
    transport: &str,
    args: Vec<OsString>,
    timeout: Option<std::time::Duration>,
) -> anyhow::Result<i32> {
    relaunch_with(ranks, transport, args, timeout, Vec::new())
}

/// [`relaunch`] with more variables in the job's environment.
fn relaunch_with(
    ranks: u32,
    transport: &str,
    args: Vec<OsString>,
    timeout: Option<std::time::Duration>,
    env: Vec<(OsString, OsString)>,
) -> anyhow::Result<i32> {
    let exe = std::env::current_exe().context("cannot find the polyrail-bench executable")?;
    let mut opts = LaunchOptions::new(ranks, exe);
    opts.args = args;
    opts.env = transport_env(transport)?;
    opts.env.extend(env);
    let layout = channel_layout(transport, ranks);
    (opts.nodes, opts.domains) = (layout.nodes, layout.domains);
    opts.timeout = timeout;
    Ok(launch(&opts)?)
}

fn run(cli: Cli) -> anyhow::Result<i32> {
    if !under_launcher() && !matches!(cli.cmd, Cmd::Report { .. }) {
        // A bad variable is reported once, here, rather than by every rank of every job.
        polyrail::settings()?;
    }
    use polyrail_bench::CommonOption::{Iters, Quick, Ranks, Sizes, Transport, Validate};
    // Only latency and bw check the data they move.
    let unchecked = match &cli.cmd {
        Cmd::Bibw(c) => Some(("bibw", c)),
        Cmd::MbwMr(c) => Some(("mbw-mr", c)),
        Cmd::Skew { common, .. } => Some(("skew", common)),
        Cmd::Overlap { common, .. } => Some(("overlap", common)),
        Cmd::Discovery { common, .. } => Some(("discovery", common)),
        _ => None,
    };
    if let Some((command, common)) = unchecked {
        common.refuse(command, &[Validate], "it checks no data (latency and bw do, with --validate)")?;
    }
    if under_launcher()
        && matches!(cli.cmd, Cmd::Compare { .. } | Cmd::Devices { .. } | Cmd::Report { .. } | Cmd::LinkCalibrate { .. })
    {
        bail!(
            "compare, devices, link-calibrate and report run alone (compare and devices start their own jobs; \
             every rank would run all of them): start polyrail-bench without polyrail run or mpiexec"
        );
    }
    match &cli.cmd {
        Cmd::Skew { common, .. } => {
            common.refuse("skew", &[Iters, Quick], "it sends --messages per size, --repeats times")?
        }
        Cmd::Overlap { common, .. } => {
            common.refuse("overlap", &[Iters], "it times 20 transfers per size (2 with --quick)")?
        }
        Cmd::MbwMr(common) if common.ranks % 2 != 0 && !under_launcher() => {
            bail!("mbw-mr pairs rank r with r + n/2: -n {} is odd; give an even number of ranks", common.ranks)
        }
        Cmd::Discovery { common, pattern, policies, .. } => {
            // Checked before the first job, not by every rank of the job that meets it.
            for policy in policies {
                polyrail::Config::default()
                    .set("POLYRAIL_POLL", policy)
                    .with_context(|| format!("--policies: {policy:?} is not a POLYRAIL_POLL value"))?;
            }
            let mut unused = vec![Transport, Ranks, Sizes];
            if *pattern == experiments::DiscoveryPattern::Burst {
                unused.push(Iters);
            }
            common.refuse(
                "discovery",
                &unused,
                "it sends 8-byte messages among 3 + --quiet-peers ranks on two virtual nodes \
                 (--iters counts the round trips of --pattern ping-pong)",
            )?
        }
        _ => {}
    }
    match cli.cmd {
        Cmd::Latency { common: ref c, .. }
        | Cmd::Bw(ref c)
        | Cmd::Bibw(ref c)
        | Cmd::MbwMr(ref c)
        | Cmd::Skew { common: ref c, .. }
        | Cmd::Overlap { common: ref c, .. }
            if !under_launcher() =>
        {
            transport_env(&c.transport)?;
            osu::parse_sizes(&c.sizes)?;
            let args: Vec<OsString> = std::env::args_os().skip(1).collect();
            relaunch(c.ranks, &c.transport, args, None)
        }
        Cmd::Latency { common, fresh } => osu::latency(&common, fresh).map(|_| 0),
        Cmd::LinkCalibrate { profile, bytes, transfers, window } => {
            use polyrail_bench::calibrate;
            let profile = polyrail_link::Profile::parse(&profile)
                .with_context(|| format!("--profile {profile:?}: give none, prism, or prism/N with N > 0"))?;
            let bytes = polyrail::parse_size(&bytes)
                .filter(|&b| (1..=1 << 30).contains(&b))
                .with_context(|| format!("--bytes {bytes:?}: a size from 1 to 1g"))?;
            let cal = calibrate::Calibration { profile, bytes, transfers, window };
            let dir = tempfile::tempdir().context("cannot make a directory for the model's files")?;
            let results = calibrate::run(&cal, dir.path())?;
            print!("{}", calibrate::table(&cal, &results, calibrate::copy_rate(bytes)));
            Ok(0)
        }
        Cmd::Bw(c) => osu::bandwidth(&c).map(|_| 0),
        Cmd::Bibw(c) => experiments::bibw(&c).map(|_| 0),
        Cmd::MbwMr(c) => experiments::mbw_mr(&c).map(|_| 0),
        Cmd::Skew { common, messages, c1, c2, repeats } => {
            experiments::skew(&common, messages, c1, c2, repeats).map(|_| 0)
        }
        Cmd::Overlap { common, compute, period } => experiments::overlap(&common, compute, period).map(|_| 0),
        Cmd::Discovery { common, pattern, burst, policies, quiet_peers } => {
            if under_launcher() {
                return experiments::discovery(&common, pattern, burst as usize).map(|_| 0);
            }
            match pattern {
                experiments::DiscoveryPattern::Burst => {
                    println!(
                        "# polyrail-bench discovery: burst of {burst} 8-byte messages from a shm peer and an ib peer per round; {quiet_peers} quiet ib peers"
                    );
                    println!("# mean time until the root received each message (us)");
                }
                experiments::DiscoveryPattern::PingPong => {
                    println!(
                        "# polyrail-bench discovery: 8-byte ping-pong with a shm peer, then with an ib peer, the other one waiting; {quiet_peers} quiet ib peers"
                    );
                    println!("# one-way latency (us)");
                }
            }
            println!("{:<22}{:>16}{:>16}", "# POLYRAIL_POLL", "shm peer", "network peer");
            let exe = std::env::current_exe().context("cannot find the polyrail-bench executable")?;
            let args: Vec<OsString> = std::env::args_os().skip(1).collect();
            for policy in &policies {
                let mut opts = LaunchOptions::new(3 + quiet_peers, exe.clone());
                opts.args = args.clone();
                opts.nodes = Some((0..3 + quiet_peers).map(|r| (r >= 2) as u32).collect());
                opts.env = vec![("POLYRAIL_POLL".into(), policy.into())];
                if pattern == experiments::DiscoveryPattern::PingPong {
                    // Two busy ranks at a time, never the same two: bound round-robin, the root
                    // would share its core with the network peer; the scheduler spreads them.
                    opts.bind = polyrail_cli::launch::Bind::None;
                }
                let code = launch(&opts)?;
                if code != 0 {
                    bail!("discovery with POLYRAIL_POLL={policy} failed with status {code}");
                }
            }
            Ok(0)
        }
        Cmd::Compare { sizes, quick, csv } => compare(&sizes, quick, csv),
        Cmd::Devices { sizes, profile, quick, csv } => devices(&sizes, &profile, quick, csv),
        Cmd::Report { input, out } => polyrail_bench::report::report(&input, &out).map(|_| 0),
    }
}

/// The columns of `compare`: channels as `--transport` names them, with `+registered` for
/// buffers from `Context::alloc_registered` and `+heap` for `Vec`s from the `MappedHeap`.
const COMPARED: [&str; 5] = ["auto", "shm", "cma", "auto+registered", "auto+heap"];
/// The latency table's last column: the automatic route with `latency --fresh`.
const FRESH: &str = "auto+fresh";

/// Runs latency and bandwidth for every channel (and the automatic route from registered
/// buffers and heap blocks, and its latency with fresh data) and prints one table.
fn compare(sizes: &str, quick: bool, csv: Option<PathBuf>) -> anyhow::Result<i32> {
    let list = osu::parse_sizes(sizes)?;
    // The jobs append their rows to a file of a fresh private directory (removed on return).
    let dir =
        tempfile::Builder::new().prefix("polyrail-compare-").tempdir().context("creating a temporary directory")?;
    let tmp = &dir.path().join("measurements.csv");
    let mut failed = None;
    let runs = ["latency", "bw"].into_iter().flat_map(|b| COMPARED.map(|c| (b, c))).chain([("latency", FRESH)]);
    for (bench, column) in runs {
        let (transport, option) = column.split_once('+').unwrap_or((column, ""));
        let mut args: Vec<OsString> = vec![bench.into(), "--transport".into(), transport.into()];
        if !option.is_empty() {
            args.push(format!("--{option}").into());
        }
        args.extend(["--sizes".into(), sizes.into(), "--csv".into(), tmp.clone().into_os_string(), "--quiet".into()]);
        if quick {
            args.push("--quick".into());
        }
        let code = relaunch(2, transport, args, Some(COMPARE_TIMEOUT))?;
        if code != 0 {
            eprintln!("polyrail-bench compare: {bench} over {column} failed with status {code}; its cells show -");
            failed.get_or_insert(code);
            if STOPPED_BY_SIGNAL.contains(&(code - 128)) {
                break;
            }
        }
    }
    let text = match std::fs::read_to_string(tmp) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && failed.is_some() => String::new(),
        Err(e) => return Err(e).context("reading the measurements"),
    };
    let rows = osu::read_csv(&text);
    println!("# polyrail-bench compare: 2 ranks, one core each");
    for (bench, unit) in [("latency", "one-way latency (us)"), ("bw", "bandwidth (MB/s)")] {
        let columns = COMPARED.iter().chain((bench == "latency").then_some(&FRESH));
        print!("\n# {unit}\n{:>8}", "size");
        for column in columns.clone() {
            print!(" {:>20}", column);
        }
        for &size in &list {
            print!("\n{:>8}", polyrail::format_size(size));
            for &column in columns.clone() {
                // `latency --fresh` writes its rows as bench `latency_fresh`, transport `auto`.
                let (bench, column) = if column == FRESH { ("latency_fresh", "auto") } else { (bench, column) };
                let cell = rows
                    .iter()
                    .find(|r| r.bench == bench && r.transport == column && r.size == size)
                    .map_or("-".to_string(), |r| format!("{:.2}", r.value));
                print!(" {cell:>20}");
            }
        }
        println!();
    }
    if let Some(path) = csv {
        std::fs::write(&path, &text).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(failed.unwrap_or(0))
}

/// The runs of `devices`: a column name, the channel, whether the link model paces it, whether
/// the buffers are registered once (`--registered`), and the path whose bandwidth bounds it
/// under the model.
type DeviceRun = (&'static str, &'static str, bool, bool, Option<polyrail_link::Path>);
const DEVICE_RUNS: [DeviceRun; 5] = [
    ("scif", "scif", false, false, None),
    ("scif registered", "scif", false, true, None),
    ("scif paced", "scif", true, false, Some(polyrail_link::Path::HostToDevice)),
    ("ib-device paced", "ib-device", true, false, Some(polyrail_link::Path::AdapterReadsDevice)),
    ("ib paced", "ib", true, false, Some(polyrail_link::Path::NetOut)),
];
/// How many of [`DEVICE_RUNS`] run without a model (shown beside memcpy).
const UNPACED_RUNS: usize = 2;

/// Runs latency and bandwidth over the channels of nodes with devices ([`DEVICE_RUNS`]) and
/// prints them beside this machine's memcpy and the profile's ceilings.
fn devices(sizes: &str, profile: &str, quick: bool, csv: Option<PathBuf>) -> anyhow::Result<i32> {
    let list = osu::parse_sizes(sizes)?;
    let model = polyrail_link::Profile::parse(profile)
        .filter(|p| !p.is_none())
        .with_context(|| format!("--profile {profile:?}: give prism, or prism/N with N > 0"))?;
    let dir =
        tempfile::Builder::new().prefix("polyrail-devices-").tempdir().context("creating a temporary directory")?;
    // One CSV per run, its rows then named by the run's column.
    let file = |column: &str| dir.path().join(format!("{}.csv", column.replace(' ', "-")));
    let mut failed = None;
    'runs: for bench in ["latency", "bw"] {
        for (column, transport, paced, registered, _) in DEVICE_RUNS {
            let mut args: Vec<OsString> = vec![bench.into(), "--transport".into(), transport.into()];
            args.extend(["--sizes".into(), sizes.into(), "--csv".into(), file(column).into(), "--quiet".into()]);
            if registered {
                args.push("--registered".into());
            }
            if quick {
                args.push("--quick".into());
            }
            let link = if paced { profile } else { "none" };
            let env = vec![("POLYRAIL_LINK_PROFILE".into(), link.into())];
            let code = relaunch_with(2, transport, args, Some(COMPARE_TIMEOUT), env)?;
            if code != 0 {
                eprintln!("polyrail-bench devices: {bench} over {column} failed with status {code}; its cells show -");
                failed.get_or_insert(code);
                if STOPPED_BY_SIGNAL.contains(&(code - 128)) {
                    break 'runs;
                }
            }
        }
    }
    let mut rows = Vec::new();
    let mut text = String::from("bench,transport,size,value,unit\n");
    for (column, ..) in DEVICE_RUNS {
        for mut row in osu::read_csv(&std::fs::read_to_string(file(column)).unwrap_or_default()) {
            row.transport = column.to_string();
            let unit = if row.bench == "bw" { "MB/s" } else { "us" };
            text += &format!("{},{},{},{},{unit}\n", row.bench, row.transport, row.size, row.value);
            rows.push(row);
        }
    }
    let cell = |bench: &str, column: &str, size: usize| {
        rows.iter().find(|r| r.bench == bench && r.transport == column && r.size == size).map(|r| r.value)
    };
    let fmt = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.2}"));
    let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => format!("{:.2}", a / b),
        _ => "-".into(),
    };
    println!(
        "# polyrail-bench devices: 2 ranks; the software SCIF and RDMA providers and the link model are emulations"
    );
    println!("# paced runs: POLYRAIL_LINK_PROFILE={profile}; ceilings are the profile's bandwidth of the path that bounds each");
    println!(
        "\n# one-way latency (us)\n{:>8} {:>16} {:>16} {:>16} {:>16} {:>16}",
        "size", "scif", "scif registered", "scif paced", "ib-device paced", "ib paced"
    );
    for &size in &list {
        print!("{:>8}", polyrail::format_size(size));
        for (column, ..) in DEVICE_RUNS {
            print!(" {:>16}", fmt(cell("latency", column, size)));
        }
        println!();
    }
    println!(
        "\n# bandwidth (MB/s); memcpy: one thread of this machine copying the size\n{:>8} {:>10} {:>10} {:>8} {:>16} {:>8} {:>12} {:>8} {:>8} {:>16} {:>8} {:>8} {:>10} {:>8} {:>8}",
        "size", "memcpy", "scif", "/memcpy", "scif registered", "/memcpy", "scif paced", "ceiling", "/ceil", "ib-device paced", "ceiling", "/ceil", "ib paced", "ceiling", "/ceil"
    );
    for &size in &list {
        // Below a page a copy's rate says more about the loop than about the memory.
        let memcpy = (size >= 4096).then(|| calibrate_copy_rate(size));
        let shown = memcpy.map_or("-".into(), |m| format!("{m:.0}"));
        print!("{:>8} {:>10}", polyrail::format_size(size), shown);
        for (column, ..) in &DEVICE_RUNS[..UNPACED_RUNS] {
            let got = cell("bw", column, size);
            print!(" {:>width$} {:>8}", fmt(got), ratio(got, memcpy), width = column.len().max(10));
        }
        for (column, _, _, _, path) in &DEVICE_RUNS[UNPACED_RUNS..] {
            let ceiling = path.and_then(|p| model.link(p)).map(|l| l.bandwidth / 1e6);
            let got = cell("bw", column, size);
            let width = column.len().max(10);
            print!(" {:>width$} {:>8} {:>8}", fmt(got), fmt(ceiling), ratio(got, ceiling));
        }
        println!();
    }
    if let Some(path) = csv {
        std::fs::write(&path, &text).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(failed.unwrap_or(0))
}

/// This machine's single-thread memcpy rate over `size`-byte copies, in MB/s.
fn calibrate_copy_rate(size: usize) -> f64 {
    polyrail_bench::calibrate::copy_rate(size.max(1)) / 1e6
}

/// How long one job of `compare` may run: its longest at the default sizes takes seconds, and
/// 1 GiB messages a few minutes.
const COMPARE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(15 * 60);
/// Signals that stop `compare`'s series when they stopped a job (the user's Ctrl-C and the like).
const STOPPED_BY_SIGNAL: [i32; 4] = [libc::SIGINT, libc::SIGQUIT, libc::SIGTERM, libc::SIGHUP];
