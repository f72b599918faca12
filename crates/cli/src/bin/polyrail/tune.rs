//! `polyrail tune`: measures where single copy starts to beat eager copies between two
//! processes of this machine, and writes it to a file that `POLYRAIL_TUNING` loads.

use anyhow::{bail, Context as _};
use polyrail::config::ClassSizes;
use polyrail::{format_size, Context, Source, TagMatch, TopoClass};
use polyrail_cli::launch::{launch, LaunchOptions};
use polyrail_shm::settings::format_tuning;
use std::ffi::OsString;
use std::path::Path;
use std::time::Instant;

const SIZES: &[usize] = &[2 << 10, 4 << 10, 8 << 10, 16 << 10, 32 << 10, 64 << 10, 128 << 10, 256 << 10];
const WINDOW: usize = 64;
/// The two ways a message can go: all eager through shared memory, or all by split single copy.
const MODES: &[(&str, &str)] = &[("eager", "all:0-:shm"), ("single-copy", "all:1-:cma/split")];

/// One rank's part of a measurement job: rank 0 writes `class`, then `size latency_us bw_MBps`
/// lines, to `out`.
pub fn measure(out: &Path, quick: bool) -> anyhow::Result<()> {
    let mut ctx = Context::init()?;
    if ctx.size() != 2 {
        bail!("polyrail tune measures between exactly 2 ranks");
    }
    let (lat_iters, bw_iters) = if quick { (50, 2) } else { (2000, 20) };
    let max = *SIZES.last().expect("sizes");
    let sbuf = vec![1u8; max];
    let mut rbuf = vec![0u8; max];
    let mut lines = format!("class {}\n", ctx.report().peers[1].class);
    let peer = 1 - ctx.rank();
    for &size in SIZES {
        ctx.barrier()?;
        let t = Instant::now();
        for _ in 0..lat_iters {
            if ctx.rank() == 0 {
                ctx.send(peer, 1, &sbuf[..size])?;
                ctx.recv(peer, 1, &mut rbuf[..size])?;
            } else {
                ctx.recv(peer, 1, &mut rbuf[..size])?;
                ctx.send(peer, 1, &sbuf[..size])?;
            }
        }
        let lat = t.elapsed().as_secs_f64() * 1e6 / (2 * lat_iters) as f64;
        ctx.barrier()?;
        let t = Instant::now();
        for _ in 0..bw_iters {
            let mut reqs = Vec::with_capacity(WINDOW);
            for _ in 0..WINDOW {
                // SAFETY: both buffers outlive the window (waited for below) and are not
                // otherwise touched meanwhile; the receives overwrite each other's data.
                reqs.push(unsafe {
                    if ctx.rank() == 0 {
                        ctx.isend_raw(peer, 2, sbuf.as_ptr(), size)?
                    } else {
                        ctx.irecv_raw(Source::Rank(peer), TagMatch::Tag(2), rbuf.as_mut_ptr(), size)?
                    }
                });
            }
            ctx.wait_all(reqs)?;
            if ctx.rank() == 0 {
                ctx.recv(peer, 3, &mut [])?;
            } else {
                ctx.send(peer, 3, &[])?;
            }
        }
        let bw = (size * WINDOW * bw_iters) as f64 / t.elapsed().as_secs_f64() / 1e6;
        lines += &format!("{size} {lat:.3} {bw:.1}\n");
    }
    if ctx.rank() == 0 {
        std::fs::write(out, lines).with_context(|| format!("writing {}", out.display()))?;
    }
    ctx.finalize()?;
    Ok(())
}

/// Runs the measurement jobs, compares the modes and writes the tuning file.
pub fn tune(output: &Path, quick: bool) -> anyhow::Result<i32> {
    // A bad variable is reported once, here, rather than by both ranks of a measurement job.
    polyrail::settings()?;
    let exe = std::env::current_exe().context("cannot find the polyrail executable")?;
    let repeats = if quick { 1 } else { 3 };
    // results[mode][size index] = (latencies, bandwidths)
    let mut results = vec![vec![(Vec::new(), Vec::new()); SIZES.len()]; MODES.len()];
    let mut class = None;
    let tmp = std::env::temp_dir().join(format!("polyrail-tune-{}", std::process::id()));
    for _ in 0..repeats {
        for (m, (name, route)) in MODES.iter().enumerate() {
            let mut opts = LaunchOptions::new(2, exe.clone());
            opts.args = vec!["tune".into(), "--measure".into(), "--output".into(), tmp.clone().into_os_string()];
            if quick {
                opts.args.push(OsString::from("--quick"));
            }
            opts.env = vec![("POLYRAIL_ROUTE".into(), (*route).into())];
            let code = launch(&opts)?;
            if code != 0 {
                bail!("the {name} measurement job failed with status {code}");
            }
            let text = std::fs::read_to_string(&tmp).context("reading the measurement")?;
            for line in text.lines() {
                let f: Vec<&str> = line.split_whitespace().collect();
                match f[..] {
                    ["class", c] => class = TopoClass::from_name(c).or(class),
                    [size, lat, bw] => {
                        let (Ok(size), Ok(lat), Ok(bw)) =
                            (size.parse::<usize>(), lat.parse::<f64>(), bw.parse::<f64>())
                        else {
                            bail!("bad measurement line {line:?}");
                        };
                        if let Some(i) = SIZES.iter().position(|&s| s == size) {
                            results[m][i].0.push(lat);
                            results[m][i].1.push(bw);
                        }
                    }
                    _ => bail!("bad measurement line {line:?}"),
                }
            }
        }
    }
    let _ = std::fs::remove_file(&tmp);
    // A size no run measured (a measurement job that wrote only part of its lines) is NaN:
    // single copy is not taken to win there.
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
    };
    let mut table =
        String::from("size      eager: lat us  bw MB/s   single copy: lat us  bw MB/s   single copy wins\n");
    let mut wins = Vec::new();
    for (i, &size) in SIZES.iter().enumerate() {
        let (el, eb) = (median(results[0][i].0.clone()), median(results[0][i].1.clone()));
        let (sl, sb) = (median(results[1][i].0.clone()), median(results[1][i].1.clone()));
        // Single copy wins when it is faster on the mean of both measures (time ratios).
        let win = (sl / el) * (eb / sb) < 1.0;
        wins.push(win);
        table += &format!(
            "{:<9} {el:>14.2} {eb:>8.0} {sl:>20.2} {sb:>8.0}   {}\n",
            format_size(size),
            if win { "yes" } else { "no" }
        );
    }
    // The threshold: the smallest size from which single copy wins at every larger size.
    let first = (0..SIZES.len()).rev().take_while(|&i| wins[i]).last();
    let threshold = first.map_or(2 * SIZES[SIZES.len() - 1], |i| SIZES[i]);
    let class = class.unwrap_or(TopoClass::Unknown);
    let sizes = ClassSizes { all: None, per_class: vec![(class, threshold)] };
    let header = format!(
        "written by `polyrail tune{}` on {}, {} repeat(s), medians\nbetween two processes of class {class}\n\n{table}",
        if quick { " --quick" } else { "" },
        polyrail::host_identity(),
        repeats
    );
    std::fs::write(output, format_tuning(&header, &sizes)).with_context(|| format!("writing {}", output.display()))?;
    print!("{table}");
    println!(
        "single copy from {} for class {class}; written to {} (use it with POLYRAIL_TUNING={})",
        format_size(threshold),
        output.display(),
        output.display()
    );
    Ok(0)
}
