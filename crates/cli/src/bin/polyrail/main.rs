//! The `polyrail` command: start jobs (`run`), explain channel choices (`info`), measure this
//! machine's thresholds (`tune`).

mod tune;

use anyhow::{bail, Context as _};
use clap::{Parser, Subcommand, ValueEnum};
use polyrail::{format_size, Context, JobReport, Reach};
use polyrail_cli::launch::{launch, Bind, LaunchOptions};
use std::ffi::OsString;
use std::time::Duration;

#[derive(Parser)]
#[command(name = "polyrail", version, about = "Start polyrail jobs and explain their channel choices")]
#[command(after_help = variables_help())]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Start N processes of PROGRAM as one job (serves PMI-1 and PMI-2 to them).
    ///
    /// Output of every rank is forwarded a whole line at a time, so that lines of ranks writing
    /// at once do not mix; the exit status is the worst rank's (128+signal for a killed rank).
    /// When a rank dies, the others get a grace period to report it, then the job is killed.
    /// Processes a rank starts belong to the job: they get its signals, and those left running
    /// when the ranks have exited are killed (not those of rank 0 while it reads a terminal,
    /// which stays in the terminal's process group).
    Run {
        /// Number of processes.
        #[arg(short = 'n', long = "np", default_value_t = 1)]
        ranks: u32,
        /// CPU binding of the ranks: one core each (round-robin) or none.
        #[arg(long, value_enum, default_value_t = BindArg::Core)]
        bind: BindArg,
        /// Seconds the other ranks get to exit once one died.
        #[arg(long, default_value_t = 2.0)]
        grace: f64,
        /// Place ranks on virtual nodes and, within a node, on its host or its devices: one
        /// entry per node separated by commas, each the ranks of the host and of devices 1, 2,
        /// ... separated by `+`. `2,2`: two nodes of two host ranks; `1+2,1+2`: two nodes, each
        /// with one rank on the host and two on device 1; `1+1+1`: a host rank and one on each
        /// of two devices. Ranks of one domain talk over shm/cma, the host and a device of one
        /// node over scif (the software SCIF provider, an emulation), different nodes over ib
        /// (the software RDMA provider when there is no RDMA device). Each rank learns its
        /// place from POLYRAIL_NODE and POLYRAIL_DOMAIN (0 the host, k device k).
        #[arg(long, conflicts_with = "nodes", value_name = "H[+D1+D2...],...")]
        layout: Option<String>,
        /// Spread the ranks in blocks over this many virtual nodes (see --layout).
        #[arg(long)]
        nodes: Option<u32>,
        /// Start every line of output with the rank that wrote it, as `[3] text`.
        #[arg(long)]
        label: bool,
        /// Stop the job after this many seconds (SIGTERM, then SIGKILL after --grace); its exit
        /// status is then at least 124, as `timeout`'s.
        #[arg(long)]
        timeout: Option<f64>,
        /// Let the ranks outlive a launcher killed with SIGKILL (by default the kernel kills
        /// them with it), as under a process manager that does not kill them: their polyrail
        /// calls then fail, naming the process manager gone. For testing that.
        #[arg(long)]
        ranks_outlive_launcher: bool,
        /// The program and its arguments.
        #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
        command: Vec<OsString>,
    },
    /// Show the topology, the RDMA devices and their PCI locality, each channel with its probe
    /// result, and per peer the route table (size range -> protocol and channel) with the reason
    /// for each entry.
    ///
    /// Started alone, it starts itself as a 2-process job so that the probes between two
    /// processes are real; under a launcher, rank 0 reports.
    Info {
        /// Print the route table of every peer (always printed; the flag is accepted so that
        /// scripts can ask for it explicitly).
        #[arg(long)]
        routes: bool,
        /// Every rank prints its own view, in rank order.
        #[arg(long)]
        all: bool,
        /// Print every POLYRAIL_* variable instead: its effective value, its default, where the
        /// value comes from (environment, tuning file, default) and what it does.
        #[arg(long)]
        config: bool,
        /// Processes to start when run alone.
        #[arg(short = 'n', long = "np", default_value_t = 2)]
        ranks: u32,
    },
    /// Measure where single copy starts to beat eager copies between two processes here
    /// (latency and streaming bandwidth, medians of 3 runs) and write the threshold to a file
    /// that POLYRAIL_TUNING loads; `polyrail info` then names it as the source.
    Tune {
        /// The file to write.
        #[arg(short, long, default_value = "polyrail-tuning.txt")]
        output: std::path::PathBuf,
        /// One short run instead of three full ones (for smoke tests).
        #[arg(long)]
        quick: bool,
        /// Internal: run as one rank of a measurement job.
        #[arg(long, hide = true)]
        measure: bool,
    },
}

#[derive(Clone, Copy, ValueEnum)]
enum BindArg {
    Core,
    None,
}

fn variables_help() -> String {
    let mut s = String::from("Environment variables:\n");
    for v in polyrail::config::infos(polyrail::config::VARS).into_iter().chain(polyrail::channel_variables()) {
        s.push_str(&format!("  {:<26} {} (default {})\n", v.name, v.doc, v.default));
    }
    s
}

fn main() {
    let cli = Cli::parse();
    let code = match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("polyrail: {}", polyrail::error_chain(e.as_ref()));
            1
        }
    };
    std::process::exit(code);
}

fn run(cli: Cli) -> anyhow::Result<i32> {
    match cli.cmd {
        Cmd::Run { ranks, bind, grace, layout, nodes, label, timeout, ranks_outlive_launcher, command } => {
            let (program, args) = command.split_first().context("no program to run")?;
            if !(0.0..=3600.0).contains(&grace) {
                bail!("--grace {grace} is not accepted: give seconds from 0 to 3600");
            }
            if let Some(t) = timeout.filter(|t| !(t.is_finite() && *t > 0.0 && *t <= 1e9)) {
                bail!("--timeout {t} is not accepted: give seconds above 0 (at most 1e9)");
            }
            let mut opts = LaunchOptions::new(ranks, program.clone());
            opts.args = args.to_vec();
            opts.bind = match bind {
                BindArg::Core => Bind::Core,
                BindArg::None => Bind::None,
            };
            opts.grace = Duration::from_secs_f64(grace);
            opts.label = label;
            opts.ranks_outlive_launcher = ranks_outlive_launcher;
            opts.timeout = timeout.map(Duration::from_secs_f64);
            opts.nodes = match (&layout, nodes) {
                (Some(spec), _) => {
                    let layout = polyrail_cli::launch::Layout::parse(ranks, spec)?;
                    if layout.has_devices() {
                        opts.domains = Some(layout.domains);
                    }
                    Some(layout.nodes)
                }
                (None, Some(k)) => Some(polyrail_cli::launch::nodes_in_blocks(ranks, k)?),
                (None, None) => None,
            };
            Ok(launch(&opts)?)
        }
        Cmd::Tune { output, quick, measure } => {
            if measure {
                tune::measure(&output, quick)?;
                Ok(0)
            } else {
                tune::tune(&output, quick)
            }
        }
        Cmd::Info { config: true, .. } => {
            let cfg = polyrail::settings()?;
            print!("{}", format_config(&cfg));
            Ok(0)
        }
        Cmd::Info { routes: _, all, ranks, config: false } => {
            let under_launcher = std::env::var_os("PMI_FD").is_some() || std::env::var_os("PMI_PORT").is_some();
            if !under_launcher && ranks > 1 {
                // A bad variable is reported once, here, rather than by every rank.
                polyrail::settings()?;
                let exe = std::env::current_exe().context("cannot find the polyrail executable")?;
                let mut opts = LaunchOptions::new(ranks, exe);
                opts.args = vec!["info".into(), "-n".into(), "1".into()];
                if all {
                    opts.args.push("--all".into());
                }
                return Ok(launch(&opts)?);
            }
            let mut ctx = Context::init()?;
            for r in 0..ctx.size() {
                if r == ctx.rank() && (all || r == 0) {
                    print!("{}", format_report(&ctx));
                }
                if all {
                    ctx.barrier()?;
                }
            }
            ctx.finalize()?;
            Ok(0)
        }
    }
}

/// Every variable with its effective value, default, source and doc, as `ucx_info -c` prints.
fn format_config(cfg: &polyrail::Config) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    for e in polyrail::effective_settings(cfg) {
        let _ = writeln!(s, "# {}", e.var.doc);
        let _ = writeln!(s, "# default: {}; from: {}", e.var.default, e.source);
        let _ = writeln!(s, "{}={}\n", e.var.name, e.value);
    }
    s
}

fn format_report(ctx: &Context) -> String {
    use std::fmt::Write;
    let r: &JobReport = ctx.report();
    let mut s = String::new();
    let _ = writeln!(
        s,
        "polyrail {} - rank {} of {} (pid {})",
        env!("CARGO_PKG_VERSION"),
        ctx.rank(),
        ctx.size(),
        std::process::id()
    );
    let _ = writeln!(s, "topology: {}", r.topology);
    let _ = writeln!(s, "binding:  cpus {:?}", r.binding);
    let place = |(node, domain): (u32, u16)| format!("node {node}, {}", polyrail::domain_name(domain));
    let _ = writeln!(s, "place:    {} (POLYRAIL_NODE, POLYRAIL_DOMAIN)", place(r.place));
    if r.devices.is_empty() {
        let _ = writeln!(s, "devices:  no RDMA device");
    }
    for d in &r.devices {
        let _ = writeln!(s, "device:   {}", d.describe(&r.binding));
    }
    let _ = writeln!(s, "channels:");
    for c in &r.channels {
        let _ = writeln!(s, "  {:<6} {:<10} {}", c.kind.name(), c.status, c.detail);
    }
    for p in &r.peers {
        let _ = writeln!(s, "peer {} ({}; {}):", p.rank, p.class, place(p.place));
        for (kind, reach) in &p.reach {
            match reach {
                Reach::Yes(why) => {
                    let _ = writeln!(s, "  {:<6} reaches: {why}", kind.name());
                }
                Reach::No(why) => {
                    let _ = writeln!(s, "  {:<6} does not reach: {why}", kind.name());
                }
            }
        }
        match &p.route {
            None => {
                let _ = writeln!(s, "  no route: no channel carries messages to this peer");
            }
            Some(route) => {
                let channel_name = |id| r.channel_kind(id).map_or("?", |k| k.name());
                let mut lo = 0usize;
                for e in &route.entries {
                    let hi = if e.upto == usize::MAX { "max".to_string() } else { format_size(e.upto) };
                    let ch = channel_name(e.channel);
                    let _ = writeln!(
                        s,
                        "  {:>7} .. {:<7} {:<11} {:<5} {}",
                        format_size(lo),
                        hi,
                        e.protocol.name(),
                        ch,
                        e.reason
                    );
                    lo = e.upto.saturating_add(1);
                }
                if let Some(st) = &route.stream_eager {
                    let ch = channel_name(route.am);
                    let _ = writeln!(
                        s,
                        "  in a stream of sends (no message back since the last): single copy up to {} goes eager over {ch} ({})",
                        format_size(st.upto),
                        st.reason
                    );
                }
                if let Some(n) = &route.placement {
                    let _ = writeln!(s, "  {}", n.describe());
                }
                if route.as_written {
                    let _ = writeln!(
                        s,
                        "  as written by POLYRAIL_ROUTE: no placement, stream, registered-memory or skew rule changes it"
                    );
                }
                if let Some(m) = &route.mapped {
                    let ch = channel_name(m.channel);
                    let _ = writeln!(
                        s,
                        "  from registered memory (alloc_registered, MappedHeap blocks): single copy over {ch} from {}, also in a stream ({})",
                        format_size(m.from),
                        m.reason
                    );
                }
            }
        }
    }
    s
}
