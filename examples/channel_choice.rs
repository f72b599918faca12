//! Shows the route table to rank 1 (which channel and protocol each message size takes, as
//! the policy chose them under the current `POLYRAIL_*` variables), with the rules that may
//! change a size's route at run time (the peer's measured placement, as `polyrail info` shows
//! them), then moves one message of each size and checks it arrived.
//!
//! ```text
//! polyrail run -n 2 target/release/examples/channel_choice
//! POLYRAIL_TRANSPORTS=shm polyrail run -n 2 target/release/examples/channel_choice
//! POLYRAIL_CMA_THRESHOLD=4k polyrail run -n 2 target/release/examples/channel_choice
//! ```

use polyrail::{format_size, Context};

fn main() -> polyrail::Result<()> {
    let mut ctx = Context::init()?;
    if ctx.size() < 2 {
        eprintln!("channel_choice needs 2 ranks");
        std::process::exit(2);
    }
    let sizes = [8usize, 1024, 8 << 10, 64 << 10, 1 << 20, 4 << 20];
    if ctx.rank() == 0 {
        let report = ctx.report();
        let route = report.peers[1].route.clone().expect("rank 1 is reachable");
        println!("POLYRAIL_TRANSPORTS={}", std::env::var("POLYRAIL_TRANSPORTS").unwrap_or_else(|_| "(unset)".into()));
        for &s in &sizes {
            let e = route.lookup(s);
            let ch = report.channel_kind(e.channel).expect("a route names a started channel");
            println!("{:>6}: {:<11} over {:<4} ({})", format_size(s), e.protocol.name(), ch.name(), e.reason);
        }
        if let Some(rule) = &route.placement {
            println!("at run time: {}", rule.describe());
        }
        for &s in &sizes {
            ctx.send(1, 0, &vec![7u8; s])?;
        }
    } else if ctx.rank() == 1 {
        for &s in &sizes {
            let mut b = vec![0u8; s];
            let st = ctx.recv(0, 0, &mut b)?;
            assert!(st.len == s && b.iter().all(|&x| x == 7));
        }
    }
    ctx.finalize()
}
