//! PMI-2 client: the length-prefixed protocol of Hydra and Slurm (`srun --mpi=pmi2`).
//!
//! As MPICH's PMI-2 client does, the session opens with a PMI-1 line
//! (`cmd=init pmi_version=2 pmi_subversion=0`); everything after uses PMI-2 framing:
//!
//! | request                                                | answer                                   |
//! |--------------------------------------------------------|------------------------------------------|
//! | `cmd=fullinit;[pmijobid=;]pmirank=;threaded=FALSE;`    | `cmd=fullinit-response;rank=;size=;appnum=;...;rc=0;` |
//! | `cmd=job-getid;`                                       | `cmd=job-getid-response;jobid=;rc=0;`    |
//! | `cmd=kvs-put;key=;value=;`                             | `cmd=kvs-put-response;rc=0;`             |
//! | `cmd=kvs-fence;`                                       | `cmd=kvs-fence-response;rc=0;`           |
//! | `cmd=kvs-get;srcid=-1;key=;`                           | `cmd=kvs-get-response;found=TRUE;value=;rc=0;` |
//! | `cmd=finalize;`                                        | `cmd=finalize-response;rc=0;`            |
//! | `cmd=abort;isworld=TRUE;exitcode=;message=;`           | (none: the job is killed)                |
//!
//! The rank comes from `PMI_ID` (or `PMI_RANK`); the size from the `fullinit` answer. No job
//! attribute is asked for (`info-getjobattr`): nothing here needs one.

use std::os::unix::net::UnixStream;

use crate::pmi1::{abort_and_exit, init};
use crate::wire::{self, check_token, env_u32, Conn, Msg, Wire};
use crate::Bootstrap;
use polyrail_core::{Error, Rank, Result};

/// PMI-2's key buffer size (`PMI2_MAX_KEYLEN`), the terminating NUL of MPICH's buffers
/// counted: keys hold one byte less.
pub const PMI2_MAX_KEYLEN: usize = 64;
/// PMI-2's value buffer size (`PMI2_MAX_VALLEN`), the terminating NUL counted: values hold one
/// byte less (Hydra's server keeps 1023 characters of a longer one and still answers success).
pub const PMI2_MAX_VALLEN: usize = 1024;
/// Longest key this client sends (see [`PMI2_MAX_KEYLEN`]).
const KEY_LIMIT: usize = PMI2_MAX_KEYLEN - 1;

/// A PMI-2 session with the process manager.
pub struct Pmi2Client {
    conn: Conn,
    rank: Rank,
    size: u32,
    jobid: String,
    finalized: bool,
}

impl std::fmt::Debug for Pmi2Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pmi2Client")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .field("jobid", &self.jobid)
            .finish()
    }
}

impl Pmi2Client {
    /// Connects through `PMI_FD` or `PMI_PORT`, with the rank from `PMI_ID` (or `PMI_RANK`) and
    /// the job from `PMI_JOBID` if set, and opens the PMI-2 session. Call once per process.
    pub fn from_env() -> Result<Self> {
        Self::from_env_with_timeout(None)
    }

    /// [`Pmi2Client::from_env`] whose every wait for an answer fails after `timeout`
    /// (`POLYRAIL_PMI_TIMEOUT`).
    pub fn from_env_with_timeout(timeout: Option<std::time::Duration>) -> Result<Self> {
        // PMI_ID first, as MPICH's client: on a shared port it names this process, and a
        // PMI_RANK may be an outer launcher's.
        let rank = match env_u32("PMI_ID")? {
            Some(r) => r,
            None => env_u32("PMI_RANK")?.ok_or_else(|| {
                Error::Bootstrap(
                    "neither PMI_RANK nor PMI_ID is set, and a PMI-2 client needs one from the launcher; \
                     start the job with `polyrail run`, `mpiexec.hydra` or `srun --mpi=pmi2`"
                        .into(),
                )
            })?,
        };
        let jobid = std::env::var("PMI_JOBID").ok();
        let mut conn = Conn::from_env(timeout)?;
        conn.set_timeout(timeout)?;
        Self::open(conn, rank, jobid.as_deref())
    }

    /// Opens a PMI-2 session over an already connected socket, as rank `rank` (what `PMI_RANK`
    /// would say); the size comes from the process manager. Used by tests and embedded launchers.
    pub fn from_stream(stream: UnixStream, rank: Rank) -> Result<Self> {
        Self::open(Conn::from_unix(stream), rank, None)
    }

    fn open(mut conn: Conn, rank: Rank, jobid: Option<&str>) -> Result<Self> {
        init(&mut conn, 2, 0)?;
        let mut req = Msg::new("fullinit");
        if let Some(j) = jobid {
            req = req.with("pmijobid", j);
        }
        let req = req.with("pmirank", rank).with("threaded", "FALSE");
        let reply = conn.call(Wire::V2, &req, "fullinit-response", "PMI-2 fullinit")?;
        let given: Rank = reply.require_int("rank")?;
        let size: u32 = reply.require_int("size")?;
        if given != rank || size == 0 || rank >= size {
            return Err(Error::Bootstrap(format!(
                "PMI-2 fullinit: asked for rank {rank}, the process manager answered rank {given} of {size}"
            )));
        }
        let id = conn.call(Wire::V2, &Msg::new("job-getid"), "job-getid-response", "PMI-2 job-getid")?;
        let jobid = id.require("jobid")?.to_owned();
        Ok(Pmi2Client { conn, rank, size, jobid, finalized: false })
    }

    fn live(&self, op: &str) -> Result<()> {
        if self.finalized {
            return Err(Error::Bootstrap(format!("PMI {op} after finalize: the PMI session is closed")));
        }
        Ok(())
    }
}

impl Bootstrap for Pmi2Client {
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
        &self.jobid
    }
    fn max_value_len(&self) -> usize {
        PMI2_MAX_VALLEN - 1
    }
    fn put(&mut self, key: &str, value: &str) -> Result<()> {
        self.live("put")?;
        check_token(&format!("PMI key {key:?}"), key, KEY_LIMIT)?;
        check_token(&format!("the value of PMI key {key:?}"), value, self.max_value_len())?;
        let msg = Msg::new("kvs-put").with("key", key).with("value", value);
        self.conn.call(Wire::V2, &msg, "kvs-put-response", &format!("PMI-2 kvs-put of key {key:?}"))?;
        Ok(())
    }
    fn fence(&mut self) -> Result<()> {
        self.live("fence")?;
        self.conn.call(Wire::V2, &Msg::new("kvs-fence"), "kvs-fence-response", "PMI-2 kvs-fence")?;
        Ok(())
    }
    fn get(&mut self, key: &str) -> Result<String> {
        self.live("get")?;
        check_token(&format!("PMI key {key:?}"), key, KEY_LIMIT)?;
        let msg = Msg::new("kvs-get").with("srcid", -1).with("key", key);
        let reply = self.conn.call(Wire::V2, &msg, "kvs-get-response", &format!("PMI-2 kvs-get of key {key:?}"))?;
        match reply.require("found")? {
            "TRUE" => Ok(reply.require("value")?.to_owned()),
            "FALSE" => Err(Error::Bootstrap(format!(
                "PMI-2 kvs-get: key {key:?} was not found in job {} (was it put before the last fence?)",
                self.jobid
            ))),
            other => Err(Error::Bootstrap(format!(
                "PMI-2 kvs-get of key {key:?}: `found={other}` is neither TRUE nor FALSE"
            ))),
        }
    }
    fn finalize(&mut self) -> Result<()> {
        self.live("finalize")?;
        self.conn.call(Wire::V2, &Msg::new("finalize"), "finalize-response", "PMI-2 finalize")?;
        self.finalized = true;
        Ok(())
    }
    fn abort(&mut self, code: i32, msg: &str) {
        let m =
            Msg::new("abort").with("isworld", "TRUE").with("exitcode", code).with("message", wire::sanitize_text(msg));
        abort_and_exit(&mut self.conn, Wire::V2, &m, self.rank, code)
    }
}
