//! Criterion benches of every channel between two real processes.
//!
//! The bench process is rank 0 of a 2-rank job per channel (`polyrail_cli::launch::spawn_peers`
//! starts this same executable as rank 1, which then serves commands); each measurement is an
//! `iter_custom` that tells the peer what to do for `iters` iterations and times rank 0's side:
//! - `latency/<channel>/<size>`: half a ping-pong round trip;
//! - `bandwidth/<channel>/<size>`: a window of 64 sends and one acknowledgement (throughput in
//!   bytes);
//! - `message_rate/<channel>/8`: the same window with 8-byte messages (throughput in messages).
//!
//! `cargo bench -p polyrail-bench` writes HTML reports under `target/criterion`;
//! `-- --save-baseline main` / `-- --baseline main` compare with a saved run; `-- --test`
//! runs every bench once.

use criterion::{BenchmarkId, Criterion, Throughput};
use polyrail::Context;
use polyrail_bench::osu::{window, WINDOW};
use polyrail_bench::{channel_config, channel_layout, check_forced, transport_env};
use polyrail_cli::launch::{spawn_peers, LaunchOptions};
use std::time::{Duration, Instant};

const CMD_TAG: u32 = 9000;
const DATA_TAG: u32 = 1;
const ACK_TAG: u32 = 2;
const SIZES: &[usize] = &[8, 512, 4 << 10, 32 << 10, 256 << 10, 1 << 20, 4 << 20];

#[derive(Clone, Copy)]
#[repr(u8)]
enum Mode {
    Quit = 0,
    Pong = 1,
    Sink = 2,
}

fn command(ctx: &mut Context, mode: Mode, size: usize, iters: u64) {
    let mut cmd = [0u8; 17];
    cmd[0] = mode as u8;
    cmd[1..9].copy_from_slice(&(size as u64).to_le_bytes());
    cmd[9..17].copy_from_slice(&iters.to_le_bytes());
    ctx.send(1, CMD_TAG, &cmd).expect("command to the peer");
}

/// Rank 1: serve commands until told to quit.
fn peer_main() {
    let mut ctx = Context::init().expect("peer init");
    let mut cmd = [0u8; 17];
    loop {
        ctx.recv(0, CMD_TAG, &mut cmd).expect("command");
        let size = u64::from_le_bytes(cmd[1..9].try_into().expect("8 bytes")) as usize;
        let iters = u64::from_le_bytes(cmd[9..17].try_into().expect("8 bytes"));
        match cmd[0] {
            1 => {
                let mut buf = vec![0u8; size];
                for _ in 0..iters {
                    ctx.recv(0, DATA_TAG, &mut buf).expect("ping");
                    ctx.send(0, DATA_TAG, &buf).expect("pong");
                }
            }
            2 => {
                let mut buf = vec![0u8; size];
                for _ in 0..iters {
                    window(&mut ctx, 0, None, Some(&mut buf), size).expect("window");
                    ctx.send(0, ACK_TAG, &[1]).expect("ack");
                }
            }
            _ => break,
        }
    }
    ctx.finalize().expect("finalize");
}

fn bench_channel(c: &mut Criterion, channel: &str) {
    let exe = std::env::current_exe().expect("bench executable");
    let mut opts = LaunchOptions::new(2, exe);
    opts.env = transport_env(channel).expect("channel");
    let layout = channel_layout(channel, 2);
    (opts.nodes, opts.domains) = (layout.nodes, layout.domains);
    let mut job = spawn_peers(&opts).expect("start the peer process");
    let boot = job.take_bootstrap().expect("bootstrap");
    let mut ctx = Context::init_with_bootstrap(channel_config(channel).expect("config"), boot).expect("init");
    if let Err(e) = check_forced(ctx.report(), ctx.rank(), channel) {
        panic!("{e:#}");
    }

    let mut g = c.benchmark_group("latency");
    for &size in SIZES {
        let mut buf = vec![7u8; size];
        g.bench_with_input(BenchmarkId::new(channel, size), &size, |b, _| {
            b.iter_custom(|iters| {
                command(&mut ctx, Mode::Pong, size, iters);
                let t = Instant::now();
                for _ in 0..iters {
                    ctx.send(1, DATA_TAG, &buf).expect("ping");
                    ctx.recv(1, DATA_TAG, &mut buf).expect("pong");
                }
                t.elapsed() / 2
            })
        });
    }
    g.finish();

    let mut stream = |g: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>, size: usize| {
        let buf = vec![7u8; size];
        g.bench_with_input(BenchmarkId::new(channel, size), &size, |b, _| {
            b.iter_custom(|iters| {
                command(&mut ctx, Mode::Sink, size, iters);
                let mut ack = [0u8; 1];
                let t = Instant::now();
                for _ in 0..iters {
                    window(&mut ctx, 1, Some(&buf), None, size).expect("window");
                    ctx.recv(1, ACK_TAG, &mut ack).expect("ack");
                }
                t.elapsed()
            })
        });
    };
    let mut g = c.benchmark_group("bandwidth");
    for &size in SIZES.iter().filter(|&&s| s >= 4096) {
        g.throughput(Throughput::Bytes((size * WINDOW) as u64));
        stream(&mut g, size);
    }
    g.finish();
    let mut g = c.benchmark_group("message_rate");
    g.throughput(Throughput::Elements(WINDOW as u64));
    stream(&mut g, 8);
    g.finish();

    command(&mut ctx, Mode::Quit, 0, 0);
    ctx.finalize().expect("finalize");
    let code = job.wait().expect("peer exit");
    assert_eq!(code, 0, "the peer process failed");
}

fn main() {
    if std::env::var_os("PMI_FD").is_some() {
        peer_main();
        return;
    }
    let mut c = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(20)
        .configure_from_args();
    for channel in ["shm", "cma", "auto", "ib", "scif"] {
        bench_channel(&mut c, channel);
    }
    c.final_summary();
}
