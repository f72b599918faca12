//! The OSU methods (osu_latency, osu_bw) over a polyrail `Context`, and their CSV output.

use crate::Common;
use anyhow::bail;
use polyrail::{Context, Source, TagMatch};
use std::io::Write;
use std::ops::Range;
use std::time::Instant;

/// The largest message the runner measures (each rank holds a send and a receive buffer of it).
pub const MAX_SIZE: usize = 1 << 30;

/// Parses `8,4k,4m`.
pub fn parse_sizes(s: &str) -> anyhow::Result<Vec<usize>> {
    s.split(',')
        .map(|x| match polyrail::parse_size(x) {
            Some(n) if n <= MAX_SIZE => Ok(n),
            Some(_) => anyhow::bail!("--sizes: {x:?} is above the largest size measured, 1g"),
            None => anyhow::bail!("--sizes: {x:?} is not a size (use e.g. 8,4k,4m)"),
        })
        .collect()
}

/// One measured point.
#[derive(Debug, Clone)]
pub struct Row {
    pub bench: String,
    pub transport: String,
    pub size: usize,
    pub value: f64,
}

/// Reads rows of a `--csv` file (`bench,transport,size,value,unit`; the transport is followed by
/// `+registered` or `+heap` for runs with `--registered` or `--heap`).
pub fn read_csv(text: &str) -> Vec<Row> {
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            if f.len() < 4 || f[0] == "bench" {
                return None;
            }
            Some(Row {
                bench: f[0].into(),
                transport: f[1].into(),
                size: f[2].parse().ok()?,
                value: f[3].parse().ok()?,
            })
        })
        .collect()
}

pub(crate) fn append_csv(c: &Common, bench: &str, size: usize, value: f64, unit: &str) -> anyhow::Result<()> {
    let Some(path) = &c.csv else { return Ok(()) };
    let new = !path.exists();
    let mut f = std::fs::OpenOptions::new().create(true).append(true).open(path)?;
    if new {
        writeln!(f, "bench,transport,size,value,unit")?;
    }
    writeln!(f, "{bench},{}{},{size},{value},{unit}", c.transport, c.buffers())?;
    Ok(())
}

/// OSU's iteration counts: (iterations, warm-up) by size.
pub(crate) fn iterations(c: &Common, size: usize, small: (u32, u32), large: (u32, u32)) -> (u32, u32) {
    let (mut n, mut w) = if size <= 8192 { small } else { large };
    if c.quick {
        n = n.div_ceil(100).max(2);
        w = w.div_ceil(100).max(1);
    }
    // `--iters` overrides, also with `--quick` (which then shortens the warm-up only).
    if let Some(i) = c.iters {
        n = i;
    }
    (n, w)
}

pub(crate) fn header(ctx: &Context, c: &Common, what: &str, unit: &str) {
    if ctx.rank() == 0 && !c.quiet {
        println!("# polyrail-bench {what}: transport {}, {} ranks", c.transport, ctx.size());
        if c.validate {
            println!("# --validate: every message written and checked (timed too)");
        }
        println!("{:<10}{unit:>20}", "# Size");
    }
}

/// What every measurement starts with: the job, the sizes, and a send and a receive buffer as
/// large as the largest size.
pub(crate) struct Run {
    pub ctx: Context,
    pub sizes: Vec<usize>,
    pub sbuf: Buffer,
    pub rbuf: Buffer,
}

/// A message buffer: ordinary memory (from the heap's memory files with `--heap`), or
/// registered once (`--registered`).
pub(crate) enum Buffer {
    /// Ordinary memory, and the page-aligned bytes of it in use: OSU and the peers' `mpi_pp.c`
    /// align their buffers to a page, where a large `Vec` starts 16 bytes into one.
    Plain(Vec<u8>, Range<usize>),
    Registered(polyrail::RegisteredBuffer),
}

impl Buffer {
    /// `len` bytes of ordinary memory set to `byte`, starting on a page.
    fn page_aligned(len: usize, byte: u8) -> Buffer {
        const PAGE: usize = 4096;
        let v = vec![byte; len + PAGE];
        let start = v.as_ptr().align_offset(PAGE).min(PAGE);
        Buffer::Plain(v, start..start + len)
    }
}

impl std::ops::Deref for Buffer {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Buffer::Plain(v, used) => &v[used.clone()],
            Buffer::Registered(b) => b,
        }
    }
}

impl std::ops::DerefMut for Buffer {
    fn deref_mut(&mut self) -> &mut [u8] {
        match self {
            Buffer::Plain(v, used) => &mut v[used.clone()],
            Buffer::Registered(b) => b,
        }
    }
}

/// Which ranks of the job move messages.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Movers {
    /// Ranks 0 and 1; the others wait at the barrier with empty buffers (a 1 GiB run of 8
    /// ranks would otherwise hold 16 GiB).
    Pair,
    /// Every rank.
    All,
}

/// Joins the job (at least two ranks, or `what` says why not) and allocates the buffers of
/// the ranks that move messages.
pub(crate) fn start(c: &Common, what: &str, movers: Movers) -> anyhow::Result<Run> {
    let sizes = parse_sizes(&c.sizes)?;
    let mut ctx = Context::init_with(crate::rank_config(&c.transport)?)?;
    if ctx.size() < 2 {
        bail!("{what} needs at least 2 ranks");
    }
    crate::check_forced(ctx.report(), ctx.rank(), &c.transport)?;
    let moves = movers == Movers::All || ctx.rank() < 2;
    let max = if moves { sizes.iter().copied().max().unwrap_or(0) } else { 0 };
    let (sbuf, rbuf) = if c.registered {
        let mut s = ctx.alloc_registered(max)?;
        s.fill(b'a');
        (Buffer::Registered(s), Buffer::Registered(ctx.alloc_registered(max)?))
    } else {
        // With --heap the two buffers are the heap's blocks; nothing else is.
        polyrail::MappedHeap::set_enabled(c.heap);
        let bufs = (Buffer::page_aligned(max, b'a'), Buffer::page_aligned(max, 0));
        polyrail::MappedHeap::set_enabled(false);
        bufs
    };
    Ok(Run { ctx, sizes, sbuf, rbuf })
}

/// Byte `j` of a message of round `round` with `--validate`: every byte differs from the
/// same byte of the rounds before and after, so a message not (or only partly) written is seen.
fn round_byte(round: u32, j: usize) -> u8 {
    (j as u32).wrapping_mul(31).wrapping_add(round.wrapping_mul(7)) as u8
}

/// Writes round `round`'s pattern into `buf` (`--validate`).
fn write_round(buf: &mut [u8], round: u32) {
    for (j, b) in buf.iter_mut().enumerate() {
        *b = round_byte(round, j);
    }
}

/// Checks that `buf` holds round `round`'s pattern (`--validate`).
fn check_round(buf: &[u8], round: u32) -> anyhow::Result<()> {
    match buf.iter().enumerate().find(|&(j, &b)| b != round_byte(round, j)) {
        Some((j, &b)) => bail!(
            "--validate: message {round} of {} bytes differs at byte {j}: {b:#04x}, expected {:#04x}",
            buf.len(),
            round_byte(round, j)
        ),
        None => Ok(()),
    }
}

/// osu_latency between ranks 0 and 1 (other ranks wait at the barrier); with `fresh`, each
/// side writes every byte of its message before each send (the round's number), and the CSV
/// rows say `latency_fresh`.
pub fn latency(c: &Common, fresh: bool) -> anyhow::Result<()> {
    let bench = if fresh { "latency_fresh" } else { "latency" };
    let Run { mut ctx, sizes, mut sbuf, mut rbuf } = start(c, bench, Movers::Pair)?;
    header(&ctx, c, bench, "Latency (us)");
    for &size in &sizes {
        let (iters, warmup) = iterations(c, size, (10000, 100), (1000, 10));
        ctx.barrier()?;
        let mut t0 = Instant::now();
        match ctx.rank() {
            0 => {
                for i in 0..iters + warmup {
                    if i == warmup {
                        t0 = Instant::now();
                    }
                    if c.validate {
                        write_round(&mut sbuf[..size], 2 * i);
                    } else if fresh {
                        sbuf[..size].fill(i as u8);
                    }
                    ctx.send(1, 1, &sbuf[..size])?;
                    ctx.recv(1, 1, &mut rbuf[..size])?;
                    if c.validate {
                        check_round(&rbuf[..size], 2 * i + 1)?;
                    }
                }
                let us = t0.elapsed().as_secs_f64() * 1e6 / (2.0 * iters as f64);
                if !c.quiet {
                    println!("{size:<10}{us:>20.2}");
                }
                append_csv(c, bench, size, us, "us")?;
            }
            1 => {
                for i in 0..iters + warmup {
                    ctx.recv(0, 1, &mut rbuf[..size])?;
                    if c.validate {
                        check_round(&rbuf[..size], 2 * i)?;
                        write_round(&mut sbuf[..size], 2 * i + 1);
                    } else if fresh {
                        sbuf[..size].fill(i as u8);
                    }
                    ctx.send(0, 1, &sbuf[..size])?;
                }
            }
            _ => {}
        }
        // The next size's first byte differs (a 0-byte run has none).
        if let Some(b) = sbuf.first_mut() {
            *b = b.wrapping_add(1);
        }
    }
    ctx.barrier()?;
    ctx.finalize()?;
    Ok(())
}

/// Messages per window of the bandwidth tests (OSU's).
pub const WINDOW: usize = 64;

/// One window of the bandwidth tests, as OSU does them: `WINDOW` receives into `recv[..size]`
/// from `peer` and/or `WINDOW` sends of `send[..size]` to it, all outstanding at once, then waits
/// for all of them. Every send reads one buffer and every receive writes one buffer (their data
/// overwrite each other, which nobody reads).
pub fn window(
    ctx: &mut Context,
    peer: u32,
    send: Option<&[u8]>,
    recv: Option<&mut [u8]>,
    size: usize,
) -> anyhow::Result<()> {
    let mut reqs = Vec::with_capacity(2 * WINDOW);
    if let Some(rbuf) = recv {
        anyhow::ensure!(rbuf.len() >= size, "receive buffer shorter than {size} bytes");
        for _ in 0..WINDOW {
            // SAFETY: `rbuf` is borrowed until this function returns, after wait_all.
            reqs.push(unsafe { ctx.irecv_raw(Source::Rank(peer), TagMatch::Tag(100), rbuf.as_mut_ptr(), size)? });
        }
    }
    if let Some(sbuf) = send {
        anyhow::ensure!(sbuf.len() >= size, "send buffer shorter than {size} bytes");
        for _ in 0..WINDOW {
            // SAFETY: `sbuf` is borrowed (unmodified) until this function returns, after wait_all.
            reqs.push(unsafe { ctx.isend_raw(peer, 100, sbuf.as_ptr(), size)? });
        }
    }
    ctx.wait_all(reqs)?;
    Ok(())
}

/// osu_bw between ranks 0 and 1: windows of 64 sends, one 4-byte acknowledgement. As in OSU,
/// every send of a window reads the same buffer and every receive writes the same buffer.
pub fn bandwidth(c: &Common) -> anyhow::Result<()> {
    let Run { mut ctx, sizes, mut sbuf, mut rbuf } = start(c, "bw", Movers::Pair)?;
    header(&ctx, c, "bw", "Bandwidth (MB/s)");
    for &size in &sizes {
        let (iters, warmup) = iterations(c, size, (100, 10), (20, 2));
        let mut ack = [0u8; 4];
        ctx.barrier()?;
        let mut t0 = Instant::now();
        for i in 0..iters + warmup {
            if i == warmup {
                t0 = Instant::now();
            }
            match ctx.rank() {
                0 => {
                    if c.validate {
                        write_round(&mut sbuf[..size], i);
                    }
                    window(&mut ctx, 1, Some(&sbuf), None, size)?;
                    ctx.recv(1, 101, &mut ack)?;
                }
                1 => {
                    window(&mut ctx, 0, None, Some(&mut rbuf), size)?;
                    if c.validate {
                        // Every receive of the window wrote the whole buffer with this round.
                        check_round(&rbuf[..size], i)?;
                    }
                    ctx.send(0, 101, &ack)?;
                }
                _ => {}
            }
        }
        if ctx.rank() == 0 {
            let mbs = size as f64 * WINDOW as f64 * f64::from(iters) / t0.elapsed().as_secs_f64() / 1e6;
            if !c.quiet {
                println!("{size:<10}{mbs:>20.2}");
            }
            append_csv(c, "bw", size, mbs, "MB/s")?;
        }
    }
    ctx.barrier()?;
    ctx.finalize()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `--validate` sees a message of the round before or after, at every byte, and one
    /// written only in part.
    #[test]
    fn validation_sees_stale_and_partly_written_messages() {
        let mut b = vec![0u8; 4096];
        write_round(&mut b, 41);
        assert!(check_round(&b, 41).is_ok());
        assert!((0..4096).all(|j| round_byte(40, j) != b[j] && round_byte(42, j) != b[j]));
        let mut half = b.clone();
        write_round(&mut half[..2048], 42);
        let e = check_round(&half, 42).unwrap_err().to_string();
        assert!(e.contains("message 42 of 4096 bytes differs at byte 2048"), "{e}");
        b[4095] ^= 1;
        assert!(check_round(&b, 41).unwrap_err().to_string().contains("byte 4095"));
    }
}
