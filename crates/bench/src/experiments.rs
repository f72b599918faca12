//! Experiments beyond the OSU pair: bidirectional and multi-pair bandwidth, skew, overlap.

use crate::osu::{append_csv, iterations, start, window, Movers, Run, WINDOW};
use crate::Common;
use anyhow::bail;
use std::time::{Duration, Instant};

/// Busy computation for `d` (a spin on the clock, like the papers' compute loops).
fn compute(d: Duration) {
    let t = Instant::now();
    while t.elapsed() < d {
        std::hint::spin_loop();
    }
}

/// osu_bibw: both ranks of the pair send windows to each other at once.
pub fn bibw(c: &Common) -> anyhow::Result<()> {
    let Run { mut ctx, sizes, sbuf, mut rbuf } = start(c, "bibw", Movers::Pair)?;
    crate::osu::header(&ctx, c, "bibw", "Bandwidth (MB/s)");
    for &size in &sizes {
        let (iters, warmup) = iterations(c, size, (100, 10), (20, 2));
        ctx.barrier()?;
        let mut t0 = Instant::now();
        if ctx.rank() < 2 {
            let peer = 1 - ctx.rank();
            for i in 0..iters + warmup {
                if i == warmup {
                    t0 = Instant::now();
                }
                window(&mut ctx, peer, Some(&sbuf), Some(&mut rbuf), size)?;
            }
        }
        if ctx.rank() == 0 {
            let mbs = 2.0 * size as f64 * WINDOW as f64 * f64::from(iters) / t0.elapsed().as_secs_f64() / 1e6;
            if !c.quiet {
                println!("{size:<10}{mbs:>20.2}");
            }
            append_csv(c, "bibw", size, mbs, "MB/s")?;
        }
    }
    ctx.barrier()?;
    ctx.finalize()?;
    Ok(())
}

/// osu_mbw_mr (Chai §6.2): ranks 0..n/2 each stream windows to their partner r + n/2; reports
/// the aggregate bandwidth and message rate.
pub fn mbw_mr(c: &Common) -> anyhow::Result<()> {
    let Run { mut ctx, sizes, sbuf, mut rbuf } = start(c, "mbw_mr", Movers::All)?;
    let n = ctx.size();
    if n < 2 || n % 2 != 0 {
        bail!("mbw_mr needs an even number of ranks (-n 2, 4, ...)");
    }
    let pairs = n / 2;
    if ctx.rank() == 0 && !c.quiet {
        println!("# polyrail-bench mbw_mr: transport {}, {pairs} pairs", c.transport);
        println!("# Size {:>24} {:>16}", "MB/s", "Messages/s");
    }
    let me = ctx.rank();
    let sender = me < pairs;
    let partner = if sender { me + pairs } else { me - pairs };
    for &size in &sizes {
        let (iters, warmup) = iterations(c, size, (100, 10), (20, 2));
        let mut ack = [0u8; 4];
        ctx.barrier()?;
        let mut t0 = Instant::now();
        for i in 0..iters + warmup {
            if i == warmup {
                ctx.barrier()?;
                t0 = Instant::now();
            }
            if sender {
                window(&mut ctx, partner, Some(&sbuf), None, size)?;
            } else {
                window(&mut ctx, partner, None, Some(&mut rbuf), size)?;
            }
            if sender {
                ctx.recv(partner, 101, &mut ack)?;
            } else {
                ctx.send(partner, 101, &ack)?;
            }
        }
        ctx.barrier()?;
        if me == 0 {
            let secs = t0.elapsed().as_secs_f64();
            let msgs = f64::from(pairs) * WINDOW as f64 * f64::from(iters);
            let mbs = msgs * size as f64 / secs / 1e6;
            if !c.quiet {
                println!("{size:<10}{mbs:>20.2}{:>17.0}", msgs / secs);
            }
            append_csv(c, "mbw", size, mbs, "MB/s")?;
            append_csv(c, "msg_rate", size, msgs / secs, "msg/s")?;
        }
    }
    ctx.finalize()?;
    Ok(())
}

/// Chai §6.2.4 (Fig. 6.5): rank 0 produces messages, computing `c1` before each send; rank 1
/// consumes them, computing `c2` after each receive. When the consumer lags (c2 > c1), a
/// single-copy send cannot finish before the consumer matches it, so the producer is held to
/// the consumer's pace; an eager send is buffered and the producer runs at its own pace.
/// Prints the producer's and the consumer's time per message, medians of `repeats` runs (the
/// host steals this machine's CPUs in bursts; a median resists them).
pub fn skew(c: &Common, messages: u32, c1_us: u64, c2_us: u64, repeats: u32) -> anyhow::Result<()> {
    let Run { mut ctx, sizes, sbuf: mut buf, .. } = start(c, "skew", Movers::Pair)?;
    let (c1, c2) = (Duration::from_micros(c1_us), Duration::from_micros(c2_us));
    if ctx.rank() == 0 && !c.quiet {
        println!("# polyrail-bench skew: transport {}, {messages} messages, c1 {c1_us} us, c2 {c2_us} us", c.transport);
        println!(
            "# Size {:>24} {:>24} {:>16} {:>16}",
            "producer (us/msg)", "consumer (us/msg)", "eager (lagging)", "eager (caught up)"
        );
    }
    for &size in &sizes {
        let mut runs = Vec::new();
        for _ in 0..repeats.max(1) {
            ctx.barrier()?;
            let t = Instant::now();
            match ctx.rank() {
                0 => {
                    for _ in 0..messages {
                        compute(c1);
                        ctx.send(1, 7, &buf[..size])?;
                    }
                }
                1 => {
                    for _ in 0..messages {
                        ctx.recv(0, 7, &mut buf[..size])?;
                        compute(c2);
                    }
                }
                _ => {}
            }
            runs.push(t.elapsed().as_secs_f64() * 1e6 / messages as f64);
        }
        runs.sort_by(f64::total_cmp);
        let mine = runs[runs.len() / 2];
        // Whether skew feedback has the producer sending eagerly now, and again after the
        // consumer kept up for a while (receives posted before the messages arrive).
        let lagging_eager = ctx.rank() == 0 && ctx.sends_eagerly_to(1);
        ctx.barrier()?;
        for _ in 0..32 {
            match ctx.rank() {
                0 => {
                    compute(c1);
                    ctx.send(1, 7, &buf[..size])?;
                }
                1 => {
                    ctx.recv(0, 7, &mut buf[..size])?;
                }
                _ => {}
            }
        }
        // The barrier reads what rank 1 sent meanwhile (its feedback comes before it, in order).
        ctx.barrier()?;
        let caught_up_eager = ctx.rank() == 0 && ctx.sends_eagerly_to(1);
        let mut theirs = [0u8; 8];
        match ctx.rank() {
            0 => {
                ctx.recv(1, 8, &mut theirs)?;
                let consumer = f64::from_le_bytes(theirs);
                let yn = |b: bool| if b { "yes" } else { "no" };
                if !c.quiet {
                    println!(
                        "{size:<10}{mine:>24.2}{consumer:>25.2}{:>17}{:>17}",
                        yn(lagging_eager),
                        yn(caught_up_eager)
                    );
                }
                append_csv(c, "skew_producer", size, mine, "us/msg")?;
                append_csv(c, "skew_consumer", size, consumer, "us/msg")?;
            }
            1 => ctx.send(0, 8, &mine.to_le_bytes())?,
            _ => {}
        }
    }
    ctx.barrier()?;
    ctx.finalize()?;
    Ok(())
}

/// Chai §7.3.2: rank 1 posts a receive for a large message, then computes for `compute_us`,
/// testing the request every `period_us`; reports how long the receive still took after the
/// computation (0 = fully overlapped) and the total, against the transfer alone.
pub fn overlap(c: &Common, compute_us: u64, period_us: u64) -> anyhow::Result<()> {
    let Run { mut ctx, sizes, sbuf, mut rbuf } = start(c, "overlap", Movers::Pair)?;
    if ctx.rank() == 1 && !c.quiet {
        println!(
            "# polyrail-bench overlap: transport {}, compute {compute_us} us, test every {period_us} us",
            c.transport
        );
        println!("# Size {:>20} {:>20} {:>20}", "transfer alone (us)", "after compute (us)", "total (us)");
    }
    for &size in &sizes {
        let reps = if c.quick { 2 } else { 20 };
        let (mut alone, mut after, mut total) = (0.0, 0.0, 0.0);
        for _ in 0..reps {
            // The transfer alone.
            ctx.barrier()?;
            let t = Instant::now();
            if ctx.rank() == 0 {
                ctx.send(1, 9, &sbuf[..size])?;
            } else if ctx.rank() == 1 {
                ctx.recv(0, 9, &mut rbuf[..size])?;
            }
            alone += t.elapsed().as_secs_f64() * 1e6;
            // The transfer under computation with periodic tests.
            ctx.barrier()?;
            if ctx.rank() == 0 {
                ctx.send(1, 9, &sbuf[..size])?;
            } else if ctx.rank() == 1 {
                let t = Instant::now();
                // SAFETY: `rbuf` outlives the request (waited for below) and is not touched.
                let req = unsafe { ctx.irecv_raw(0, 9, rbuf.as_mut_ptr(), size)? };
                let end = Duration::from_micros(compute_us);
                let mut next = Duration::ZERO;
                while t.elapsed() < end {
                    compute(Duration::from_micros(period_us.min(compute_us)).min(end.saturating_sub(t.elapsed())));
                    if t.elapsed() >= next {
                        ctx.test(&req)?;
                        next = t.elapsed() + Duration::from_micros(period_us);
                    }
                }
                let t2 = Instant::now();
                ctx.wait(req)?;
                after += t2.elapsed().as_secs_f64() * 1e6;
                total += t.elapsed().as_secs_f64() * 1e6;
            }
        }
        if ctx.rank() == 1 {
            let r = reps as f64;
            if !c.quiet {
                println!("{size:<10}{:>20.2}{:>21.2}{:>21.2}", alone / r, after / r, total / r);
            }
            append_csv(c, "overlap_after", size, after / r, "us")?;
        }
    }
    ctx.barrier()?;
    ctx.finalize()?;
    Ok(())
}

/// How the senders of [`discovery`] send.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum DiscoveryPattern {
    /// Both senders send a burst per round at once (three busy processes).
    Burst,
    /// The root ping-pongs with one sender at a time while the other waits blocked (two busy
    /// processes): what an idle channel's polls cost the busy one.
    PingPong,
}

/// Chai §7.3.1, message discovery: rank 1 (a shared-memory peer of the root) and rank 2 (on
/// another virtual node, so its messages come over `ib`) send to rank 0, which receives them
/// (8 bytes each) with ANY_SOURCE. Ranks from 3 up are quiet network peers: they send nothing,
/// but the root's ib channel has their rings too. With [`DiscoveryPattern::Burst`] both send a
/// burst of `burst` messages per round; reported per source is the mean time from the start of
/// the round until the root received each message. With [`DiscoveryPattern::PingPong`] the root
/// ping-pongs with rank 1 while rank 2 waits, then the other way round; reported is the one-way
/// latency with each. Rank 0 prints one table row, labelled with the job's `POLYRAIL_POLL`.
pub fn discovery(c: &Common, pattern: DiscoveryPattern, burst: usize) -> anyhow::Result<()> {
    const GO: u32 = 4;
    const DATA: u32 = 3;
    let Run { mut ctx, sbuf, mut rbuf, .. } = start(c, "discovery", Movers::All)?;
    if ctx.size() < 3 {
        anyhow::bail!("discovery needs 3 ranks (root, a shared-memory peer, a network peer)");
    }
    let size = 8.min(sbuf.len());
    let rounds = if c.quick { 20 } else { 300 };
    let (mut sum, mut count) = ([0.0f64; 3], [0usize; 3]);
    match (ctx.rank(), pattern) {
        (0, DiscoveryPattern::Burst) => {
            for _ in 0..rounds {
                // Start the round: the senders wait for this, the root's clock starts.
                for r in 1..3 {
                    ctx.send(r, GO, &[])?;
                }
                let t0 = Instant::now();
                for _ in 0..2 * burst {
                    let st = ctx.recv(polyrail::ANY_SOURCE, DATA, &mut rbuf[..size])?;
                    let src = st.source as usize;
                    if src < 3 {
                        sum[src] += t0.elapsed().as_secs_f64() * 1e6;
                        count[src] += 1;
                    }
                }
            }
        }
        (0, DiscoveryPattern::PingPong) => {
            for peer in 1..3 {
                // About a second per phase: a round trip took 0.6-1 us with the shm peer, 8-11 us
                // with the network peer (an earlier record, in git history).
                let full = if peer == 1 { 1_000_000 } else { 100_000 };
                let (iters, warmup) =
                    c.iters.map_or(if c.quick { (100, 10) } else { (full, full / 10) }, |n| (n, n / 10));
                // The peer that is not in this phase waits blocked until the next GO.
                ctx.send(peer, GO, &[])?;
                let mut t0 = Instant::now();
                for i in 0..iters + warmup {
                    if i == warmup {
                        t0 = Instant::now();
                    }
                    ctx.send(peer, DATA, &sbuf[..size])?;
                    ctx.recv(polyrail::ANY_SOURCE, DATA, &mut rbuf[..size])?;
                }
                sum[peer as usize] = t0.elapsed().as_secs_f64() * 1e6 / 2.0;
                count[peer as usize] = iters as usize;
                // Tell the peer its phase is over.
                ctx.send(peer, GO, &[])?;
            }
        }
        (1 | 2, DiscoveryPattern::Burst) => {
            for _ in 0..rounds {
                ctx.recv(0, GO, &mut [])?;
                for _ in 0..burst {
                    ctx.send(0, DATA, &sbuf[..size])?;
                }
            }
        }
        (1 | 2, DiscoveryPattern::PingPong) => {
            ctx.recv(0, GO, &mut [])?;
            // Until the root's closing GO: answer every DATA.
            loop {
                let st = ctx.recv(0, polyrail::ANY_TAG, &mut rbuf[..size])?;
                if st.tag == GO {
                    break;
                }
                ctx.send(0, DATA, &sbuf[..size])?;
            }
        }
        _ => {
            // Quiet: look for the end now and then, without taking a core from the others.
            while ctx.iprobe(0, GO)?.is_none() {
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            ctx.recv(0, GO, &mut [])?;
        }
    }
    if ctx.rank() == 0 {
        for r in 3..ctx.size() {
            ctx.send(r, GO, &[])?;
        }
    }
    let mean = |i: usize| if count[i] == 0 { f64::NAN } else { sum[i] / count[i] as f64 };
    if ctx.rank() == 0 {
        let label = std::env::var("POLYRAIL_POLL").unwrap_or_else(|_| "dynamic:8 (default)".into());
        println!("{label:<22}{:>16.2}{:>16.2}", mean(1), mean(2));
        let what = match pattern {
            DiscoveryPattern::Burst => "discovery",
            DiscoveryPattern::PingPong => "discovery_pingpong",
        };
        append_csv(c, &format!("{what}_shm[{label}]"), size, mean(1), "us")?;
        append_csv(c, &format!("{what}_net[{label}]"), size, mean(2), "us")?;
    }
    ctx.barrier()?;
    ctx.finalize()?;
    Ok(())
}
