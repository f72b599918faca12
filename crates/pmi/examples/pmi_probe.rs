//! Exercises the PMI bootstrap under a launcher: every rank puts `k<rank>=v<rank>`, fences,
//! reads every other rank's key, fences again, finalizes and prints
//! `pmi_probe rank R of N ok`.
//!
//! ```text
//! polyrail run -n 4 target/debug/examples/pmi_probe
//! POLYRAIL_PMI=2 mpiexec.hydra -n 4 target/debug/examples/pmi_probe
//! ```
//!
//! Optional argument: `die` makes rank 1 exit with code 3 without finalizing, `kill` makes rank
//! 1 kill itself with SIGKILL, `abort` makes rank 1 abort the job with code 4, `stall` makes
//! rank 1 sleep 5 s before going on (all right after opening its PMI session, so that the
//! others wait in the first fence). On any failure a rank prints the error and exits with
//! code 1.

use polyrail_core::Config;
use polyrail_pmi::wire::eprint_line;
use polyrail_pmi::{self as bootstrap, Bootstrap};

fn main() {
    let mode = std::env::args().nth(1).unwrap_or_default();
    if !matches!(mode.as_str(), "" | "die" | "kill" | "abort" | "stall") {
        eprint_line(&format!(
            "pmi_probe: unknown argument {mode:?} (expected nothing, `die`, `kill`, `abort` or `stall`)"
        ));
        std::process::exit(2);
    }
    let mut pmi = match Config::from_env().and_then(|cfg| bootstrap::from_env(&cfg)) {
        Ok(b) => b,
        Err(e) => {
            eprint_line(&format!("pmi_probe: cannot open the PMI session: {e}"));
            std::process::exit(1);
        }
    };
    let (rank, size) = (pmi.rank(), pmi.size());
    if rank == 1 {
        misbehave(&mode, pmi.as_mut());
    }
    if let Err(e) = probe(pmi.as_mut()) {
        eprint_line(&format!("pmi_probe rank {rank} of {size}: {e}"));
        std::process::exit(1);
    }
    println!("pmi_probe rank {rank} of {size} ok");
}

fn misbehave(mode: &str, pmi: &mut dyn Bootstrap) {
    match mode {
        "abort" => pmi.abort(4, "pmi_probe was asked to abort"),
        "die" => std::process::exit(3),
        "stall" => std::thread::sleep(std::time::Duration::from_secs(5)),
        "kill" => {
            // SAFETY: kill has no memory-safety preconditions; this process signals itself.
            unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
        }
        _ => {}
    }
}

fn probe(pmi: &mut dyn Bootstrap) -> polyrail_core::Result<()> {
    let (rank, size) = (pmi.rank(), pmi.size());
    pmi.put(&format!("k{rank}"), &format!("v{rank}"))?;
    pmi.fence()?;
    for other in (0..size).filter(|&o| o != rank) {
        let got = pmi.get(&format!("k{other}"))?;
        if got != format!("v{other}") {
            return Err(polyrail_core::Error::Bootstrap(format!("key k{other} holds {got:?}, expected \"v{other}\"")));
        }
    }
    pmi.fence()?;
    pmi.finalize()
}
