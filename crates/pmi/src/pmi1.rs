//! PMI-1 client: the newline-terminated text protocol served by every launcher.
//!
//! The exchange, as MPICH's simple PMI client and Hydra do it:
//!
//! | request                                   | answer                                       |
//! |-------------------------------------------|----------------------------------------------|
//! | `cmd=init pmi_version=1 pmi_subversion=1` | `cmd=response_to_init ... rc=0`              |
//! | `cmd=get_maxes`                           | `cmd=maxes kvsname_max= keylen_max= vallen_max=` |
//! | `cmd=get_my_kvsname`                      | `cmd=my_kvsname kvsname=`                    |
//! | `cmd=put kvsname= key= value=`            | `cmd=put_result rc=0`                        |
//! | `cmd=barrier_in`                          | `cmd=barrier_out`                            |
//! | `cmd=get kvsname= key=`                   | `cmd=get_result rc=0 value=` (rc≠0: missing) |
//! | `cmd=finalize`                            | `cmd=finalize_ack`                           |
//! | `cmd=abort exitcode= message=`            | (none: the job is killed)                    |
//!
//! Rank and size are not asked for: the launcher sets `PMI_RANK` and `PMI_SIZE`, or, on a
//! shared port (`PMI_PORT` with `PMI_ID`), the `initack` handshake gives them.

use std::os::unix::net::UnixStream;

use crate::wire::{self, check_token, env_u32, Conn, Msg, Wire};
use crate::Bootstrap;
use polyrail_core::{Error, Rank, Result};

/// How long `abort` waits for the process manager to close the connection before exiting.
pub(super) const ABORT_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// A PMI-1 session with the process manager.
pub struct Pmi1Client {
    conn: Conn,
    rank: Rank,
    size: u32,
    kvsname: String,
    keylen_max: usize,
    vallen_max: usize,
    finalized: bool,
}

impl std::fmt::Debug for Pmi1Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pmi1Client")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .field("kvsname", &self.kvsname)
            .finish()
    }
}

impl Pmi1Client {
    /// Connects through `PMI_FD` or `PMI_PORT`, with rank and size from `PMI_RANK` and
    /// `PMI_SIZE` or, when only `PMI_ID` is set (Hydra's `-pmi-port` mode), from the `initack`
    /// handshake; then opens the PMI-1 session. Call once per process.
    pub fn from_env() -> Result<Self> {
        Self::from_env_with_timeout(None)
    }

    /// [`Pmi1Client::from_env`] whose every wait for an answer fails after `timeout`
    /// (`POLYRAIL_PMI_TIMEOUT`).
    pub fn from_env_with_timeout(timeout: Option<std::time::Duration>) -> Result<Self> {
        let (rank, size, id) = (env_u32("PMI_RANK")?, env_u32("PMI_SIZE")?, env_u32("PMI_ID")?);
        let mut conn = Conn::from_env(timeout)?;
        conn.set_timeout(timeout)?;
        let port = conn.via_port();
        let (rank, size) = match (rank.zip(size), id) {
            // Hydra's -pmi-port mode: PMI_ID names this process on the shared port, and the
            // handshake tells the server which connection it is (a PMI_RANK or PMI_SIZE here
            // was left by an outer launcher), as MPICH's client does.
            (_, Some(id)) if port => initack(&mut conn, id)?,
            (Some(rank_size), _) => rank_size,
            (None, Some(id)) => initack(&mut conn, id)?,
            (None, None) => {
                let var = if rank.is_none() { "PMI_RANK" } else { "PMI_SIZE" };
                return Err(Error::Bootstrap(format!(
                    "{var} is not set (nor PMI_ID), and a PMI-1 client needs it from the launcher; start the \
                     job with `polyrail run`, `mpiexec.hydra`, or try POLYRAIL_PMI=2"
                )));
            }
        };
        Self::open(conn, rank, size)
    }

    /// Opens a PMI-1 session over an already connected socket, as rank `rank` of `size`
    /// (what `PMI_RANK` and `PMI_SIZE` would say). Used by tests and embedded launchers.
    pub fn from_stream(stream: UnixStream, rank: Rank, size: u32) -> Result<Self> {
        Self::open(Conn::from_unix(stream), rank, size)
    }

    fn open(mut conn: Conn, rank: Rank, size: u32) -> Result<Self> {
        if size == 0 || rank >= size {
            return Err(Error::Bootstrap(format!(
                "PMI rank {rank} is out of range for a job of size {size} (PMI_RANK, PMI_SIZE or the initack answer)"
            )));
        }
        init(&mut conn, 1, 1)?;
        let maxes = conn.call(Wire::V1, &Msg::new("get_maxes"), "maxes", "PMI-1 get_maxes")?;
        let keylen_max = maxes.require_int::<usize>("keylen_max")?;
        let vallen_max = maxes.require_int::<usize>("vallen_max")?;
        let name = conn.call(Wire::V1, &Msg::new("get_my_kvsname"), "my_kvsname", "PMI-1 get_my_kvsname")?;
        let kvsname = name.require("kvsname")?.to_owned();
        Ok(Pmi1Client { conn, rank, size, kvsname, keylen_max, vallen_max, finalized: false })
    }

    fn live(&self, op: &str) -> Result<()> {
        if self.finalized {
            return Err(Error::Bootstrap(format!("PMI {op} after finalize: the PMI session is closed")));
        }
        Ok(())
    }
}

/// The handshake of a client that only knows its `PMI_ID`: `cmd=initack pmiid=ID`, answered by
/// `cmd=initack` and three `cmd=set` lines (size, rank, debug). Returns (rank, size).
fn initack(conn: &mut Conn, id: u32) -> Result<(Rank, u32)> {
    let what = format!("PMI-1 initack of PMI_ID={id}");
    conn.call(Wire::V1, &Msg::new("initack").with("pmiid", id), "initack", &what)?;
    let (mut rank, mut size) = (None, None);
    for _ in 0..3 {
        let set = conn.recv(Wire::V1).map_err(|e| Error::Bootstrap(format!("{what}: {e}")))?;
        set.expect_cmd("set", &what)?;
        if set.get("rank").is_some() {
            rank = Some(set.require_int("rank")?);
        }
        if set.get("size").is_some() {
            size = Some(set.require_int("size")?);
        }
    }
    rank.zip(size)
        .ok_or_else(|| Error::Bootstrap(format!("{what}: the process manager did not send both rank and size")))
}

/// Sends the PMI-1 `init` line announcing `version.subversion`; checks the answer.
///
/// The PMI-2 client opens its session the same way (with version 2.0).
pub(super) fn init(conn: &mut Conn, version: u32, subversion: u32) -> Result<()> {
    let what = format!("PMI init (version {version}.{subversion})");
    let msg = Msg::new("init").with("pmi_version", version).with("pmi_subversion", subversion);
    conn.send(Wire::V1, &msg).map_err(|e| Error::Bootstrap(format!("{what}: {e}")))?;
    let reply = conn.recv(Wire::V1).map_err(|e| Error::Bootstrap(format!("{what}: {e}")))?;
    reply.expect_cmd("response_to_init", &what)?;
    reply.check_rc(&format!(
        "{what} (the process manager speaks PMI {}.{}; try the other POLYRAIL_PMI)",
        reply.get("pmi_version").unwrap_or("?"),
        reply.get("pmi_subversion").unwrap_or("?")
    ))
}

/// Sends an abort request, tells the user, waits for the process manager to end the job, exits.
pub(super) fn abort_and_exit(conn: &mut Conn, wire: Wire, msg: &Msg, rank: Rank, code: i32) -> ! {
    wire::eprint_line(&format!(
        "polyrail: rank {rank} aborts the job (code {code}): {}",
        msg.get("message").unwrap_or("")
    ));
    // Also after a timed-out call: an abort waits for no answer a late one could be taken for.
    if conn.send_anyway(wire, msg).is_ok() {
        conn.wait_closed(ABORT_WAIT);
    }
    std::process::exit(super::abort_status(code))
}

impl Bootstrap for Pmi1Client {
    fn hangup_watch(&self) -> Option<std::os::fd::OwnedFd> {
        self.conn.hangup_watch()
    }
    fn rank(&self) -> Rank {
        self.rank
    }
    fn size(&self) -> u32 {
        self.size
    }
    fn job_id(&self) -> &str {
        &self.kvsname
    }
    fn max_value_len(&self) -> usize {
        // vallen_max counts the terminating NUL of MPICH's buffers.
        self.vallen_max.saturating_sub(1)
    }
    fn put(&mut self, key: &str, value: &str) -> Result<()> {
        self.live("put")?;
        check_token(&format!("PMI key {key:?}"), key, self.keylen_max.saturating_sub(1))?;
        check_token(&format!("the value of PMI key {key:?}"), value, self.max_value_len())?;
        let msg = Msg::new("put").with("kvsname", &self.kvsname).with("key", key).with("value", value);
        self.conn.call(Wire::V1, &msg, "put_result", &format!("PMI-1 put of key {key:?}"))?;
        Ok(())
    }
    fn fence(&mut self) -> Result<()> {
        self.live("fence")?;
        self.conn.call(Wire::V1, &Msg::new("barrier_in"), "barrier_out", "PMI-1 barrier")?;
        Ok(())
    }
    fn get(&mut self, key: &str) -> Result<String> {
        self.live("get")?;
        check_token(&format!("PMI key {key:?}"), key, self.keylen_max.saturating_sub(1))?;
        let msg = Msg::new("get").with("kvsname", &self.kvsname).with("key", key);
        let what = format!("PMI-1 get of key {key:?} (was it put before the last fence?)");
        let reply = self.conn.call(Wire::V1, &msg, "get_result", &what)?;
        Ok(reply.require("value")?.to_owned())
    }
    fn finalize(&mut self) -> Result<()> {
        self.live("finalize")?;
        self.conn.call(Wire::V1, &Msg::new("finalize"), "finalize_ack", "PMI-1 finalize")?;
        self.finalized = true;
        Ok(())
    }
    fn abort(&mut self, code: i32, msg: &str) {
        let m = Msg::new("abort").with("exitcode", code).with("message", wire::sanitize_text(msg));
        abort_and_exit(&mut self.conn, Wire::V1, &m, self.rank, code)
    }
}
