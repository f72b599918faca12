//! A token goes around the ring of all ranks a few times; each rank adds its rank to it.
//!
//! `polyrail run -n 4 target/release/examples/ring`

use polyrail::{Context, ANY_SOURCE};

fn main() -> polyrail::Result<()> {
    let mut ctx = Context::init()?;
    let (me, n) = (ctx.rank(), ctx.size());
    let laps = 3u64;
    let next = (me + 1) % n;
    let mut token = [0u8; 8];
    for lap in 0..laps {
        if me == 0 {
            if n > 1 {
                ctx.send(next, 0, &token)?;
                let st = ctx.recv(ANY_SOURCE, 0, &mut token)?;
                assert_eq!(st.source, n - 1);
            }
            let v = u64::from_le_bytes(token);
            let expect = (lap + 1) * (n as u64 * (n as u64 - 1) / 2);
            assert_eq!(v, expect, "token after lap {lap}");
            println!("lap {lap}: token {v}");
        } else {
            ctx.recv(me - 1, 0, &mut token)?;
            token = (u64::from_le_bytes(token) + me as u64).to_le_bytes();
            ctx.send(next, 0, &token)?;
        }
    }
    ctx.finalize()
}
