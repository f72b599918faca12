//! polyrail-bench: the measurement code shared by the `polyrail-bench` runner and the criterion
//! benches (`cargo bench -p polyrail-bench`).

pub mod experiments;
pub mod osu;
pub mod report;

use clap::Args;
use std::ffi::OsString;
use std::path::PathBuf;

/// Options shared by the measurements.
#[derive(Args, Clone, Debug)]
pub struct Common {
    /// Channel to force: `auto` (the policy decides), `shm` (rings and send cells only; large
    /// messages pipelined through cells) or `cma` (single copy for every non-empty message).
    #[arg(long, default_value = "auto")]
    pub transport: String,
    /// Sizes to measure (comma-separated, with k/m suffixes).
    #[arg(long, default_value = "0,1,8,64,512,4k,16k,32k,64k,256k,1m,4m")]
    pub sizes: String,
    /// Ranks to start when run alone.
    #[arg(short = 'n', long = "np", default_value_t = 2)]
    pub ranks: u32,
    /// Iteration count override (default: OSU's, by size).
    #[arg(long)]
    pub iters: Option<u32>,
    /// Fewer iterations (for smoke tests).
    #[arg(long)]
    pub quick: bool,
    /// Append every point to this CSV file (`bench,transport,size,value,unit`).
    #[arg(long)]
    pub csv: Option<PathBuf>,
    /// Print nothing (with --csv: for runs driven by `compare`).
    #[arg(long, hide = true)]
    pub quiet: bool,
}

/// The `POLYRAIL_*` settings that force a channel: `auto` (none), `shm` (rings and send cells
/// only), `cma` (single copy for every non-empty message).
pub fn channel_settings(transport: &str) -> anyhow::Result<&'static [(&'static str, &'static str)]> {
    Ok(match transport {
        "auto" => &[],
        "shm" => &[("POLYRAIL_TRANSPORTS", "shm")],
        "cma" => &[("POLYRAIL_CMA_THRESHOLD", "1")],
        other => anyhow::bail!("--transport {other} is not accepted: use auto, shm or cma"),
    })
}

/// [`channel_settings`] as environment variables for a launched job.
pub fn transport_env(transport: &str) -> anyhow::Result<Vec<(OsString, OsString)>> {
    Ok(channel_settings(transport)?.iter().map(|(k, v)| (k.into(), v.into())).collect())
}

/// [`channel_settings`] applied to the configuration from the environment.
pub fn channel_config(transport: &str) -> anyhow::Result<polyrail::Config> {
    let mut cfg = polyrail::Config::from_env()?;
    for (k, v) in channel_settings(transport)? {
        cfg.set(k, v)?;
    }
    Ok(cfg)
}
