//! Ping-pong between ranks 0 and 1, checking every byte, over growing sizes.
//!
//! `polyrail run -n 2 target/release/examples/pingpong`

use polyrail::{Context, Source, TagMatch};

fn main() -> polyrail::Result<()> {
    let mut ctx = Context::init()?;
    if ctx.size() < 2 {
        eprintln!("pingpong needs 2 ranks: polyrail run -n 2 {}", std::env::args().next().unwrap_or_default());
        std::process::exit(2);
    }
    let mut size = 1usize;
    while size <= 4 << 20 {
        let msg: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
        let mut back = vec![0u8; size];
        match ctx.rank() {
            0 => {
                let t = std::time::Instant::now();
                ctx.send(1, 0, &msg)?;
                let st = ctx.recv(Source::Rank(1), TagMatch::Tag(0), &mut back)?;
                assert_eq!(st.len, size);
                assert!(back == msg, "corrupted echo at {size} bytes");
                println!("{size:>8} bytes: round trip {:>9.2} us", t.elapsed().as_secs_f64() * 1e6);
            }
            1 => {
                let st = ctx.recv(0, 0, &mut back)?;
                ctx.send(0, 0, &back[..st.len])?;
            }
            _ => {}
        }
        size *= 4;
    }
    ctx.finalize()
}
