//! `polyrail-bench report`: medians, ratios and plots from a comparison run's CSV
//! (`tool,mode,metric,size,rep,value`, as written by `scripts/compare-peers.sh`).

use anyhow::{bail, Context as _};
use plotters::prelude::*;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

/// Median of every (tool, mode, metric, size).
type Medians = BTreeMap<(String, String, String, usize), f64>;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn read(path: &Path) -> anyhow::Result<Medians> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut points: BTreeMap<(String, String, String, usize), Vec<f64>> = BTreeMap::new();
    for (i, line) in text.lines().enumerate().skip(1) {
        let f: Vec<&str> = line.split(',').collect();
        if f.len() != 6 {
            bail!("{}:{}: expected 6 fields, got {line:?}", path.display(), i + 1);
        }
        let (Ok(size), Ok(value)) = (f[3].parse::<usize>(), f[5].parse::<f64>()) else {
            bail!("{}:{}: bad size or value in {line:?}", path.display(), i + 1);
        };
        points.entry((f[0].into(), f[1].into(), f[2].into(), size)).or_default().push(value);
    }
    Ok(points.into_iter().map(|(k, v)| (k, median(v))).collect())
}

/// The series shown, in order: (tool, mode, label).
const SERIES: &[(&str, &str, &str)] = &[
    ("polyrail", "auto", "polyrail"),
    ("polyrail", "shm", "polyrail shm only"),
    ("polyrail", "cma", "polyrail cma forced"),
    ("polyrail", "registered", "polyrail registered buffers"),
    ("polyrail", "heap", "polyrail heap buffers"),
    ("ompi", "default", "Open MPI (sm+cma)"),
    ("ucx", "default", "UCX"),
    ("mpich", "default", "MPICH"),
];
const PEERS: &[&str] = &["ompi", "ucx", "mpich"];

fn get(m: &Medians, tool: &str, mode: &str, metric: &str, size: usize) -> Option<f64> {
    m.get(&(tool.into(), mode.into(), metric.into(), size)).copied()
}

fn sizes(m: &Medians, metric: &str) -> Vec<usize> {
    let mut s: Vec<usize> =
        m.keys().filter(|(t, md, me, _)| t == "polyrail" && md == "auto" && me == metric).map(|k| k.3).collect();
    s.dedup();
    s
}

fn fmt(v: Option<f64>, digits: usize) -> String {
    v.map_or("-".into(), |x| format!("{x:.digits$}"))
}

/// Writes `report.md`, `latency.svg` and `bandwidth.svg` into `out`.
pub fn report(input: &Path, out: &Path) -> anyhow::Result<()> {
    let m = read(input)?;
    let mut md = String::new();
    let floor_line = get(&m, "floor", "memcpy", "GBps", 4 << 20);
    let cacheline = get(&m, "floor", "cacheline", "lat_us", 64);
    let _ = writeln!(md, "Medians of every repeat; one-way latency in µs (osu_latency), streaming bandwidth in MB/s (osu_bw, window 64).");
    let _ = writeln!(
        md,
        "Physical floor in this run: one cache line between the two processes {} µs; single-thread memcpy of 4 MiB {} GB/s.\n",
        fmt(cacheline, 3),
        fmt(floor_line, 2)
    );
    for (metric, title, digits) in [("lat_us", "Latency (µs)", 2usize), ("bw_MBps", "Bandwidth (MB/s)", 0)] {
        let _ = writeln!(md, "### {title}\n");
        let mut head = String::from("| size |");
        let mut rule = String::from("|---:|");
        for (_, _, label) in SERIES {
            head += &format!(" {label} |");
            rule += "---:|";
        }
        head += " polyrail / best peer | polyrail / floor | registered / best peer | registered / floor | heap / best peer | heap / floor |";
        rule += "---:|---:|---:|---:|---:|---:|";
        let _ = writeln!(md, "{head}\n{rule}");
        for size in sizes(&m, metric) {
            let mut row = format!("| {} |", polyrail::format_size(size));
            for (tool, mode, _) in SERIES {
                row += &format!(" {} |", fmt(get(&m, tool, mode, metric, size), digits));
            }
            let peers: Vec<f64> = PEERS.iter().filter_map(|p| get(&m, p, "default", metric, size)).collect();
            let best = if metric == "lat_us" {
                peers.iter().copied().reduce(f64::min)
            } else {
                peers.iter().copied().reduce(f64::max)
            };
            // The floor: a cache line for 8 bytes, a single-thread memcpy of the message for
            // larger sizes (latency: time of the copy; bandwidth: its rate).
            let floor = if metric == "lat_us" {
                if size <= 64 {
                    cacheline
                } else {
                    get(&m, "floor", "memcpy", "GBps", size).map(|g| size as f64 / (g * 1e3))
                }
            } else {
                get(&m, "floor", "memcpy", "GBps", size).map(|g| g * 1e3)
            };
            for mode in ["auto", "registered", "heap"] {
                let ours = get(&m, "polyrail", mode, metric, size);
                let ratio = |to: Option<f64>| fmt(ours.zip(to).map(|(a, b)| a / b), 2);
                row += &format!(" {} | {} |", ratio(best), ratio(floor));
            }
            let _ = writeln!(md, "{row}");
        }
        let _ = writeln!(md);
    }
    std::fs::create_dir_all(out)?;
    std::fs::write(out.join("report.md"), md)?;
    plot(&m, "lat_us", "one-way latency (µs)", &out.join("latency.svg"))?;
    plot(&m, "bw_MBps", "bandwidth (MB/s)", &out.join("bandwidth.svg"))?;
    Ok(())
}

fn plot(m: &Medians, metric: &str, ylabel: &str, path: &Path) -> anyhow::Result<()> {
    let xs = sizes(m, metric);
    let (Some(&xmin), Some(&xmax)) = (xs.first(), xs.last()) else { return Ok(()) };
    let ys: Vec<f64> = m.iter().filter(|(k, _)| k.2 == metric).map(|(_, v)| *v).filter(|v| *v > 0.0).collect();
    let ymin = ys.iter().copied().fold(f64::INFINITY, f64::min) * 0.8;
    let ymax = ys.iter().copied().fold(0.0, f64::max) * 1.25;
    let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(format!("{ylabel} vs message size"), ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d((xmin as f64..xmax as f64).log_scale(), (ymin.max(1e-3)..ymax).log_scale())?;
    chart
        .configure_mesh()
        .x_desc("message size (bytes)")
        .y_desc(ylabel)
        .x_label_formatter(&|x| polyrail::format_size(*x as usize))
        .draw()?;
    let colors = [RED, BLUE, GREEN, RGBColor(255, 140, 0), BLACK, MAGENTA, CYAN];
    for (i, (tool, mode, label)) in SERIES.iter().enumerate() {
        let pts: Vec<(f64, f64)> = xs
            .iter()
            .filter_map(|&s| get(m, tool, mode, metric, s).map(|v| (s as f64, v)))
            .filter(|p| p.1 > 0.0)
            .collect();
        if pts.is_empty() {
            continue;
        }
        let c = colors[i % colors.len()];
        chart
            .draw_series(LineSeries::new(pts.clone(), c.stroke_width(2)))?
            .label(*label)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], c.stroke_width(2)));
        chart.draw_series(pts.into_iter().map(|p| Circle::new(p, 3, c.filled())))?;
    }
    chart.configure_series_labels().background_style(WHITE.mix(0.8)).border_style(BLACK).draw()?;
    root.present()?;
    Ok(())
}
