//! polyrail-pmi: rank, size and a small key-value exchange with the process manager.
//!
//! A process started by `polyrail run`, MPICH's Hydra (`mpiexec.hydra`) or Slurm talks PMI-1 or
//! PMI-2 over the socket named by `PMI_FD` (or `PMI_PORT`); a process started alone is a job of
//! size 1 ([`Singleton`]). The server side used by `polyrail run` lives in [`server`].

#![deny(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]
use polyrail_core::config::{Config, PmiVersion};
use polyrail_core::{Error, Rank, Result};
use std::sync::atomic::{AtomicBool, Ordering};

#[cfg(feature = "fuzzing")]
pub mod fuzzing;
mod pmi1;
mod pmi2;
pub mod server;
pub mod wire;

pub use pmi1::Pmi1Client;
pub use pmi2::Pmi2Client;

/// What every process manager offers: who am I, how many are we, and a fenced key-value space.
///
/// Values are printable ASCII without spaces, `=`, `;` or `\` (use [`encode_hex`] for bytes), at
/// most [`Bootstrap::max_value_len`] bytes.
pub trait Bootstrap: Send {
    /// This process's rank.
    fn rank(&self) -> Rank;
    /// Number of processes in the job.
    fn size(&self) -> u32;
    /// A name unique to this job on this machine (the PMI KVS name).
    fn job_id(&self) -> &str;
    /// Longest value `put` accepts.
    fn max_value_len(&self) -> usize;
    /// Publishes `key = value`; visible to others after the next [`Bootstrap::fence`].
    fn put(&mut self, key: &str, value: &str) -> Result<()>;
    /// Waits until every process has called `fence`; makes earlier puts visible.
    fn fence(&mut self) -> Result<()>;
    /// Reads a key published before the last fence.
    fn get(&mut self, key: &str) -> Result<String>;
    /// Tells the process manager that this process ends normally.
    fn finalize(&mut self) -> Result<()>;
    /// Asks the process manager to abort the whole job.
    fn abort(&mut self, code: i32, msg: &str);
    /// A descriptor that polls hung up once the process manager has gone (a duplicate of the
    /// connection to it), for waits to notice that the job can no longer finish; `None` where
    /// there is no such connection (a job of one process).
    fn hangup_watch(&self) -> Option<std::os::fd::OwnedFd> {
        None
    }
}

/// A job of one process: no process manager.
#[derive(Debug, Default)]
pub struct Singleton {
    kvs: std::collections::HashMap<String, String>,
    job: String,
}

impl Singleton {
    /// A job of size 1, named after this process.
    pub fn new() -> Self {
        Singleton { kvs: Default::default(), job: format!("single{}", std::process::id()) }
    }
}

impl Bootstrap for Singleton {
    fn rank(&self) -> Rank {
        0
    }
    fn size(&self) -> u32 {
        1
    }
    fn job_id(&self) -> &str {
        &self.job
    }
    fn max_value_len(&self) -> usize {
        usize::MAX
    }
    fn put(&mut self, key: &str, value: &str) -> Result<()> {
        self.kvs.insert(key.to_owned(), value.to_owned());
        Ok(())
    }
    fn fence(&mut self) -> Result<()> {
        Ok(())
    }
    fn get(&mut self, key: &str) -> Result<String> {
        self.kvs.get(key).cloned().ok_or_else(|| Error::Bootstrap(format!("key {key:?} was never put")))
    }
    fn finalize(&mut self) -> Result<()> {
        Ok(())
    }
    fn abort(&mut self, code: i32, msg: &str) {
        eprintln!("polyrail: abort({code}): {msg}");
        std::process::exit(abort_status(code));
    }
}

/// The exit status that carries abort code `code`: its low byte (what the system keeps), except
/// that a nonzero code whose low byte is zero (256, -256...) becomes 1, so that an abort with a
/// failure code never exits as a success. Code 0 stays 0: the job was stopped on purpose (as
/// `MPI_Abort(comm, 0)` under Hydra).
pub fn abort_status(code: i32) -> i32 {
    match code.rem_euclid(256) {
        0 if code != 0 => 1,
        status => status,
    }
}

/// Connects to the process manager named by the environment (`PMI_FD`, `PMI_PORT`), speaking
/// the protocol chosen by `cfg.pmi`; without one, a [`Singleton`]. Once per process: the
/// process manager's connection serves one rank's session (a second session's end closed the
/// first's descriptor), so a second call is an [`Error::Bootstrap`].
pub fn from_env(cfg: &Config) -> Result<Box<dyn Bootstrap>> {
    static JOINED: AtomicBool = AtomicBool::new(false);
    if std::env::var_os("PMI_FD").is_none() && std::env::var_os("PMI_PORT").is_none() {
        if let Some(found) = foreign_launcher(|name| std::env::var(name).ok()) {
            return Err(Error::Bootstrap(format!(
                "this process was started by a launcher polyrail cannot join ({found}): run alone it would be a \
                 job of one, as would every other rank. Start polyrail jobs with `polyrail run -n N`, \
                 `mpiexec.hydra -n N` (MPICH's Hydra, PMI-1) or `srun --mpi=pmi2 -n N` with POLYRAIL_PMI=2; \
                 to run this process alone, unset the variable"
            )));
        }
        return Ok(Box::new(Singleton::new()));
    }
    // Relaxed: only the flag itself is at stake; a race of two first calls has one winner.
    if JOINED.swap(true, Ordering::Relaxed) {
        return Err(Error::Bootstrap(
            "this process has joined its job already, or tried to (a failed attempt used up the process manager's \
             connection): one Context per process, as MPI_Init is called once"
                .into(),
        ));
    }
    Ok(match cfg.pmi {
        PmiVersion::Pmi1 => Box::new(Pmi1Client::from_env_with_timeout(cfg.pmi_timeout)?),
        PmiVersion::Pmi2 => Box::new(Pmi2Client::from_env_with_timeout(cfg.pmi_timeout)?),
    })
}

/// The traces of a launcher that started this process as one of several without a PMI
/// connection polyrail speaks (PMIx launchers: Open MPI's `mpirun`, PRRTE, `srun --mpi=pmix`;
/// `srun` without `--mpi=pmi2`; a PMI-1 size without its connection), read through `var`; `None`
/// for a process started by hand. Names the variables found.
pub fn foreign_launcher(var: impl Fn(&str) -> Option<String>) -> Option<String> {
    let above_one = |name: &str| var(name).filter(|v| v.trim().parse::<u64>().is_ok_and(|n| n > 1));
    let mut found = Vec::new();
    for name in ["PMIX_RANK", "PMIX_NAMESPACE"] {
        if let Some(v) = var(name) {
            found.push(format!("{name}={v}, a PMIx launcher"));
        }
    }
    for (name, who) in [
        ("OMPI_COMM_WORLD_SIZE", "Open MPI's mpirun"),
        ("SLURM_STEP_NUM_TASKS", "srun without --mpi=pmi2"),
        ("SLURM_NTASKS", "Slurm"),
        ("MV2_COMM_WORLD_SIZE", "MVAPICH's launcher"),
        ("PMI_SIZE", "a PMI launcher, but neither PMI_FD nor PMI_PORT"),
    ] {
        if let Some(v) = above_one(name) {
            found.push(format!("{name}={v}, {who}"));
        }
    }
    (!found.is_empty()).then(|| found.join("; "))
}

/// Encodes bytes as lowercase hex, a form every PMI value accepts.
pub fn encode_hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(DIGITS[(b >> 4) as usize] as char);
        s.push(DIGITS[(b & 15) as usize] as char);
    }
    s
}

/// Decodes [`encode_hex`]'s output; `None` on anything else.
pub fn decode_hex(s: &str) -> Option<Vec<u8>> {
    if s.len() % 2 != 0 {
        return None;
    }
    let digit = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    s.as_bytes().chunks(2).map(|p| Some(digit(p[0])? << 4 | digit(p[1])?)).collect()
}

#[cfg(test)]
mod tests {
    use super::{abort_status, foreign_launcher};

    #[test]
    fn launchers_polyrail_cannot_join_are_named() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| pairs.iter().find(|(k, _)| *k == name).map(|(_, v)| v.to_string())
        };
        assert_eq!(foreign_launcher(env(&[])), None, "started by hand");
        assert_eq!(foreign_launcher(env(&[("SLURM_NTASKS", "1"), ("PMI_SIZE", "1")])), None, "a job of one");
        let found = foreign_launcher(env(&[("PMIX_RANK", "0"), ("OMPI_COMM_WORLD_SIZE", "2")])).unwrap();
        assert!(found.contains("PMIX_RANK=0") && found.contains("OMPI_COMM_WORLD_SIZE=2"), "{found}");
        assert!(foreign_launcher(env(&[("SLURM_STEP_NUM_TASKS", "64")])).unwrap().contains("--mpi=pmi2"));
        assert!(foreign_launcher(env(&[("PMI_SIZE", "4")])).unwrap().contains("neither PMI_FD nor PMI_PORT"));
        assert_eq!(foreign_launcher(env(&[("SLURM_NTASKS", "many")])), None, "not a count");
    }

    #[test]
    fn an_abort_code_never_becomes_a_success() {
        for (code, status) in [(0, 0), (1, 1), (255, 255), (256, 1), (257, 1), (-1, 255), (-256, 1), (512, 1)] {
            assert_eq!(abort_status(code), status, "code {code}");
        }
    }
}
