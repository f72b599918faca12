//! 2-D five-point stencil (Jacobi) with halo exchange on a process grid, checked against the
//! same computation done serially on rank 0. The edges and blocks travel as `f64`s (typed
//! messages), not as bytes.
//!
//! `polyrail run -n 4 target/release/examples/halo [N] [STEPS]`

use polyrail::{Context, Request};

/// Grid of `px * py` processes, as square as possible.
fn grid(n: u32) -> (u32, u32) {
    let mut px = (n as f64).sqrt() as u32;
    while n % px != 0 {
        px -= 1;
    }
    (px, n / px)
}

fn initial(gx: usize, gy: usize) -> f64 {
    ((gx * 7 + gy * 13) % 17) as f64
}

/// One Jacobi step on a local block with a one-cell halo (`w+2` x `h+2`).
fn step(u: &[f64], w: usize, h: usize) -> Vec<f64> {
    let mut v = u.to_vec();
    for y in 1..=h {
        for x in 1..=w {
            let i = y * (w + 2) + x;
            v[i] = 0.2 * (u[i] + u[i - 1] + u[i + 1] + u[i - (w + 2)] + u[i + (w + 2)]);
        }
    }
    v
}

/// Argument `i` (after the program's name) as a whole number, or `default` when absent; a
/// value that is not one ends the program with a usage message.
fn arg(i: usize, default: usize) -> usize {
    match std::env::args().nth(i) {
        None => default,
        Some(a) => a.parse().unwrap_or_else(|_| {
            eprintln!("halo: `{a}` is not a whole number; usage: halo [N] [STEPS]");
            std::process::exit(2)
        }),
    }
}

fn main() -> polyrail::Result<()> {
    let mut ctx = Context::init()?;
    let (n, steps) = (arg(1, 64), arg(2, 20));
    let (px, py) = grid(ctx.size());
    if n < px.max(py) as usize {
        eprintln!("halo: a {n}x{n} grid cannot give each of the {px}x{py} ranks a cell; use N >= {}", px.max(py));
        std::process::exit(2);
    }
    let (me, size) = (ctx.rank(), ctx.size());
    let (cx, cy) = (me % px, me / px);
    let (w, h) = (n / px as usize, n / py as usize);
    let (gw, gh) = (w * px as usize, h * py as usize);
    let rank_at = |x: i64, y: i64| -> Option<u32> {
        (x >= 0 && y >= 0 && x < px as i64 && y < py as i64).then(|| (y * px as i64 + x) as u32)
    };
    let mut u = vec![0.0f64; (w + 2) * (h + 2)];
    for y in 0..h {
        for x in 0..w {
            u[(y + 1) * (w + 2) + x + 1] = initial(cx as usize * w + x, cy as usize * h + y);
        }
    }
    for _ in 0..steps {
        // Post receives first, then sends: left, right, up, down.
        let dirs: [(i64, i64, u32); 4] = [(-1, 0, 0), (1, 0, 1), (0, -1, 2), (0, 1, 3)];
        let mut recvs: Vec<(usize, Request<f64>)> = Vec::new();
        let mut sends: Vec<Request<f64>> = Vec::new();
        for (k, &(dx, dy, tag)) in dirs.iter().enumerate() {
            let Some(peer) = rank_at(cx as i64 + dx, cy as i64 + dy) else { continue };
            let len = if dx != 0 { h } else { w };
            recvs.push((k, ctx.irecv_typed(peer, tag ^ 1, vec![0.0f64; len])?));
            let edge: Vec<f64> = match (dx, dy) {
                (-1, 0) => (1..=h).map(|y| u[y * (w + 2) + 1]).collect(),
                (1, 0) => (1..=h).map(|y| u[y * (w + 2) + w]).collect(),
                (0, -1) => (1..=w).map(|x| u[(w + 2) + x]).collect(),
                _ => (1..=w).map(|x| u[h * (w + 2) + x]).collect(),
            };
            sends.push(ctx.isend_typed(peer, tag, edge)?);
        }
        for (k, r) in recvs {
            let halo = ctx.wait(r)?.buf;
            for (i, v) in halo.into_iter().enumerate() {
                let idx = match k {
                    0 => (i + 1) * (w + 2),
                    1 => (i + 1) * (w + 2) + w + 1,
                    2 => i + 1,
                    _ => (h + 1) * (w + 2) + i + 1,
                };
                u[idx] = v;
            }
        }
        ctx.wait_all(sends)?;
        u = step(&u, w, h);
    }
    // Gather the interior on rank 0 and compare with a serial run.
    let interior: Vec<f64> = (1..=h).flat_map(|y| u[y * (w + 2) + 1..y * (w + 2) + w + 1].to_vec()).collect();
    if me != 0 {
        ctx.send_typed(0, 99, &interior)?;
    } else {
        let mut global = vec![0.0f64; gw * gh];
        for r in 0..size {
            let block = if r == 0 {
                interior.clone()
            } else {
                let mut b = vec![0.0f64; w * h];
                ctx.recv_typed(r, 99, &mut b)?;
                b
            };
            let (bx, by) = ((r % px) as usize * w, (r / px) as usize * h);
            for y in 0..h {
                global[(by + y) * gw + bx..(by + y) * gw + bx + w].copy_from_slice(&block[y * w..(y + 1) * w]);
            }
        }
        let mut s = vec![0.0f64; (gw + 2) * (gh + 2)];
        for y in 0..gh {
            for x in 0..gw {
                s[(y + 1) * (gw + 2) + x + 1] = initial(x, y);
            }
        }
        for _ in 0..steps {
            s = step(&s, gw, gh);
        }
        let err = (0..gh)
            .flat_map(|y| (0..gw).map(move |x| (x, y)))
            .map(|(x, y)| (global[y * gw + x] - s[(y + 1) * (gw + 2) + x + 1]).abs())
            .fold(0.0, f64::max);
        println!("halo: {gw}x{gh} grid on {px}x{py} ranks, {steps} steps, max error vs serial {err:.3e}");
        assert!(err < 1e-9, "parallel result differs from serial");
    }
    ctx.finalize()
}
