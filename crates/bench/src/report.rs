//! `polyrail-bench report`: medians, ratios and plots from a comparison run's CSV
//! (`tool,mode,metric,size,rep,value`, as written by `scripts/compare-peers.sh`).

use anyhow::{bail, Context as _};
use plotters::prelude::*;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

/// (tool, mode, metric, size).
type Key = (String, String, String, usize);
/// Median of every key.
type Medians = BTreeMap<Key, f64>;

/// One CSV row.
struct Row {
    key: Key,
    rep: u32,
    value: f64,
}

fn median(mut v: Vec<f64>) -> Option<f64> {
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(v[n / 2]),
        _ => Some((v[n / 2 - 1] + v[n / 2]) / 2.0),
    }
}

/// The first line of a comparison CSV.
const HEADER: &str = "tool,mode,metric,size,rep,value";

fn read(path: &Path) -> anyhow::Result<Vec<Row>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut lines = text.lines();
    if lines.next() != Some(HEADER) {
        bail!(
            "{}: the first line is not {HEADER:?}: not a CSV of scripts/compare-peers.sh (`compare --csv` writes another format)",
            path.display()
        );
    }
    let mut rows = Vec::new();
    for (i, line) in lines.enumerate().map(|(i, l)| (i + 1, l)) {
        let f: Vec<&str> = line.split(',').collect();
        if f.len() != 6 {
            bail!("{}:{}: expected 6 fields, got {line:?}", path.display(), i + 1);
        }
        let (Ok(size), Ok(rep), Ok(value)) = (f[3].parse::<usize>(), f[4].parse::<u32>(), f[5].parse::<f64>()) else {
            bail!("{}:{}: bad size, repeat or value in {line:?}", path.display(), i + 1);
        };
        // `inf` and `NaN` parse; a measurement is a finite number (an infinite one also
        // stops the plots' log axes from ever ending their ticks).
        if !value.is_finite() {
            bail!("{}:{}: the value {:?} is not a finite number in {line:?}", path.display(), i + 1, f[5]);
        }
        rows.push(Row { key: (f[0].into(), f[1].into(), f[2].into(), size), rep, value });
    }
    if rows.is_empty() {
        bail!("{}: no measurements after the header", path.display());
    }
    Ok(rows)
}

/// Medians of the main loop's rows (not the paired block's or the placement rows) that `keep`
/// accepts.
fn medians(rows: &[Row], keep: impl Fn(&Row) -> bool) -> Medians {
    let mut points: BTreeMap<&Key, Vec<f64>> = BTreeMap::new();
    for r in rows.iter().filter(|r| r.key.0 != PAIRED && r.key.0 != PLACE && keep(r)) {
        points.entry(&r.key).or_default().push(r.value);
    }
    points.into_iter().filter_map(|(k, v)| Some((k.clone(), median(v)?))).collect()
}

/// Tool name of the rows that bracket a measurement with the cache-line floor: mode
/// `TOOL:MODE:METRIC` (METRIC `all` for a program that measures both), metric
/// `floor_before|floor_after`.
const PLACE: &str = "place";

/// Where the two vCPUs were during each measurement of the main loop, from its bracketing
/// floors: (tool, mode, metric or `all`, repeat) -> near (`true`) or apart; measurements whose
/// floors disagree, or that have none, are in neither.
fn placements(rows: &[Row]) -> BTreeMap<(String, u32), bool> {
    let mut floors: BTreeMap<(String, u32), Vec<f64>> = BTreeMap::new();
    for r in rows.iter().filter(|r| r.key.0 == PLACE) {
        floors.entry((r.key.1.clone(), r.rep)).or_default().push(r.value);
    }
    floors
        .into_iter()
        .filter(|(_, v)| v.len() == 2)
        .filter_map(|(k, v)| {
            let near = is_near(v[0]);
            (is_near(v[1]) == near).then_some((k, near))
        })
        .collect()
}

/// Whether a main-loop row was measured near (`near`) or apart as asked; rows of measurements
/// whose placement is unknown or changed count as neither, the physical floor's rows (which
/// the placement tables share) as both.
fn placement_of(place: &BTreeMap<(String, u32), bool>, r: &Row, near: bool) -> bool {
    let (tool, mode, metric, _) = &r.key;
    if tool == "floor" {
        return true;
    }
    [metric.as_str(), "all"].iter().any(|m| place.get(&(format!("{tool}:{mode}:{m}"), r.rep)) == Some(&near))
}

/// Median of the bracketing floors (µs) on one side of [`NEAR_US`].
fn placement_floor(rows: &[Row], near: bool) -> Option<f64> {
    median(rows.iter().filter(|r| r.key.0 == PLACE && is_near(r.value) == near).map(|r| r.value).collect())
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

/// Decimals of a latency in µs: three below a microsecond (10 ns steps hide the differences
/// that matter there), else two.
fn lat_digits(v: Option<f64>) -> usize {
    if v.is_some_and(|x| x < 1.0) {
        3
    } else {
        2
    }
}

/// Writes `report.md`, `latency.svg` and `bandwidth.svg` into `out`.
pub fn report(input: &Path, out: &Path) -> anyhow::Result<()> {
    let rows = read(input)?;
    let m = medians(&rows, |_| true);
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
    tables(&mut md, &m, cacheline, "###");
    fresh(&mut md, &m);
    let place = placements(&rows);
    for (near, name) in [(true, "near"), (false, "apart")] {
        let pm = medians(&rows, |r| placement_of(&place, r, near));
        if !pm.keys().any(|k| k.0 != "floor") {
            continue;
        }
        let floor = placement_floor(&rows, near);
        let count = place.values().filter(|&&n| n == near).count();
        let _ = writeln!(
            md,
            "### Measured {name} only\n\n{count} measurements (one latency or bandwidth run of a tool) ran wholly with \
             the two vCPUs {} (their bracketing floors both {} {:.0} ns); medians of those. Cache-line floor of \
             this placement: {} µs.\n",
            if near { "in one core complex" } else { "apart" },
            if near { "below" } else { "at or above" },
            NEAR_US * 1e3,
            fmt(floor, 3)
        );
        tables(&mut md, &pm, floor, "####");
    }
    paired(&rows, &mut md);
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let md_path = out.join("report.md");
    std::fs::write(&md_path, md).with_context(|| format!("writing {}", md_path.display()))?;
    plot(&m, "lat_us", "one-way latency (µs)", &out.join("latency.svg"))?;
    plot(&m, "bw_MBps", "bandwidth (MB/s)", &out.join("bandwidth.svg"))?;
    Ok(())
}

/// The latency and bandwidth tables of medians `m`, with ratios to the best peer and to the
/// floor (`cacheline`: the cache-line time for 8 and 64 bytes), under headings of `level`.
fn tables(md: &mut String, m: &Medians, cacheline: Option<f64>, level: &str) {
    for (metric, title, digits) in [("lat_us", "Latency (µs)", 2usize), ("bw_MBps", "Bandwidth (MB/s)", 0)] {
        let _ = writeln!(md, "{level} {title}\n");
        let mut head = String::from("| size |");
        let mut rule = String::from("|---:|");
        for (_, _, label) in SERIES {
            head += &format!(" {label} |");
            rule += "---:|";
        }
        head += " polyrail / best peer | polyrail / floor | registered / best peer | registered / floor | heap / best peer | heap / floor |";
        rule += "---:|---:|---:|---:|---:|---:|";
        let _ = writeln!(md, "{head}\n{rule}");
        let mut partial = false;
        for size in sizes(m, metric) {
            let mut row = format!("| {} |", polyrail::format_size(size));
            for (tool, mode, _) in SERIES {
                let v = get(m, tool, mode, metric, size);
                let digits = if metric == "lat_us" { lat_digits(v) } else { digits };
                row += &format!(" {} |", fmt(v, digits));
            }
            let peers: Vec<f64> = PEERS.iter().filter_map(|p| get(m, p, "default", metric, size)).collect();
            let best = if metric == "lat_us" {
                peers.iter().copied().reduce(f64::min)
            } else {
                peers.iter().copied().reduce(f64::max)
            };
            // The floor: a cache line up to 64 bytes, a single-thread memcpy of the message for
            // larger sizes (latency: time of the copy; bandwidth: its rate).
            let floor = if metric == "lat_us" {
                if size <= 64 {
                    cacheline
                } else {
                    get(m, "floor", "memcpy", "GBps", size).map(|g| size as f64 / (g * 1e3))
                }
            } else {
                get(m, "floor", "memcpy", "GBps", size).map(|g| g * 1e3)
            };
            let some_missing = peers.len() < PEERS.len();
            for mode in ["auto", "registered", "heap"] {
                let ours = get(m, "polyrail", mode, metric, size);
                let to_floor = fmt(ours.zip(floor.filter(|&b| b > 0.0)).map(|(a, b)| a / b), 2);
                row += &format!(" {} | {to_floor} |", ratio_to_best(ours, best, some_missing, &mut partial));
            }
            let _ = writeln!(md, "{row}");
        }
        let _ = writeln!(md);
        partial_note(md, partial);
    }
}

/// `ours / best` with two decimals, marked with [`PARTIAL_MARK`] (and `partial` set) when
/// `some_missing`: a peer had no result, so `best` is the best of the others only.
fn ratio_to_best(ours: Option<f64>, best: Option<f64>, some_missing: bool, partial: &mut bool) -> String {
    let ratio = fmt(ours.zip(best.filter(|&b| b > 0.0)).map(|(a, b)| a / b), 2);
    if ratio == "-" || !some_missing {
        return ratio;
    }
    *partial = true;
    ratio + PARTIAL_MARK
}

/// The note on [`PARTIAL_MARK`] under a table, if a ratio in it has the mark.
fn partial_note(md: &mut String, partial: bool) {
    if partial {
        let _ = writeln!(md, "{PARTIAL_NOTE}\n");
    }
}

/// Marks a ratio to the best of only some of the peers.
const PARTIAL_MARK: &str = "*";
/// What [`PARTIAL_MARK`] means, under a table that has it.
const PARTIAL_NOTE: &str =
    "\\* Best of the peers measured at that size only: a `-` in a peer's column is a size it has no result for.";

/// Mode of the rows of the latency with fresh data (`polyrail-bench latency --fresh`, and
/// `mpi_pp.c` writing its message before each send).
const FRESH: &str = "fresh";
/// The fresh-data table's series after polyrail: (tool, label). ucx_perftest cannot write its
/// messages.
const FRESH_PEERS: &[(&str, &str)] = &[("ompi", "Open MPI"), ("mpich", "MPICH")];

/// Appends the section "Latency with fresh data" to `md`; nothing if the run has none.
fn fresh(md: &mut String, m: &Medians) {
    let sizes: Vec<usize> =
        m.keys().filter(|(t, mode, me, _)| t == "polyrail" && mode == FRESH && me == "lat_us").map(|k| k.3).collect();
    if sizes.is_empty() {
        return;
    }
    let _ = writeln!(
        md,
        "### Latency with fresh data (µs)\n\nThe ping-pong of the latency table, but before every send the \
         sender writes the whole message anew (osu_latency sends one unchanged buffer, whose lines a \
         single copy finds in the receiving core's cache from the round before). \"same buffer\": \
         polyrail's automatic route in the latency table.\n"
    );
    let mut head = String::from("| size | polyrail |");
    for (_, label) in FRESH_PEERS {
        head += &format!(" {label} |");
    }
    let _ = writeln!(md, "{head} polyrail / best peer | polyrail same buffer |\n|---:|---:|---:|---:|---:|---:|");
    let mut partial = false;
    for size in sizes {
        let ours = get(m, "polyrail", FRESH, "lat_us", size);
        let peers: Vec<Option<f64>> = FRESH_PEERS.iter().map(|(t, _)| get(m, t, FRESH, "lat_us", size)).collect();
        let best = peers.iter().flatten().copied().reduce(f64::min);
        let to_best = ratio_to_best(ours, best, peers.iter().any(Option::is_none), &mut partial);
        let mut row = format!("| {} | {} |", polyrail::format_size(size), fmt(ours, lat_digits(ours)));
        for v in peers {
            row += &format!(" {} |", fmt(v, lat_digits(v)));
        }
        let same = get(m, "polyrail", "auto", "lat_us", size);
        let _ = writeln!(md, "{row} {to_best} | {} |", fmt(same, lat_digits(same)));
    }
    let _ = writeln!(md);
    partial_note(md, partial);
}

/// Tool name of the paired block's rows (`scripts/compare-peers.sh`: floor, each tool's 8 B
/// latency and floor again, in one tight block per repeat).
const PAIRED: &str = "paired";
/// The paired block's tools after polyrail: (mode, label).
const PAIRED_PEERS: &[(&str, &str)] = &[("ompi", "Open MPI"), ("mpich", "MPICH"), ("ucx", "UCX")];
/// A floor below this (µs) means the two vCPUs share a core complex ("near").
const NEAR_US: f64 = 0.1;

/// Whether a cache-line floor (µs) says the two vCPUs share a core complex.
fn is_near(floor_us: f64) -> bool {
    floor_us < NEAR_US
}
/// A repeat is stable when its larger floor is at most this times the smaller.
const STABLE_RATIO: f64 = 1.25;

/// One repeat of the paired block.
struct Repeat {
    rep: u32,
    before: Option<f64>,
    after: Option<f64>,
    /// polyrail, then PAIRED_PEERS.
    lat: Vec<Option<f64>>,
    stable: bool,
    near: Option<bool>,
    /// polyrail / floor, / Open MPI, / UCX.
    ratios: [Option<f64>; 3],
}

/// Appends the section "Paired 8 B latency" to `md`; nothing if the CSV has no paired rows.
fn paired(rows: &[Row], md: &mut String) {
    let mut by_rep: BTreeMap<u32, BTreeMap<&str, f64>> = BTreeMap::new();
    for r in rows.iter().filter(|r| r.key.0 == PAIRED && r.key.2 == "lat_us" && r.key.3 == 8) {
        by_rep.entry(r.rep).or_default().insert(&r.key.1, r.value);
    }
    if by_rep.is_empty() {
        return;
    }
    let reps: Vec<Repeat> = by_rep
        .into_iter()
        .map(|(rep, v)| {
            let get = |mode: &str| v.get(mode).copied();
            let (before, after) = (get("floor_before"), get("floor_after"));
            let floor = match (before, after) {
                (Some(a), Some(b)) => Some((a + b) / 2.0),
                (a, b) => a.or(b),
            };
            let ours = get("polyrail");
            let ratio = |to: Option<f64>| ours.zip(to.filter(|&b| b > 0.0)).map(|(a, b)| a / b);
            Repeat {
                rep,
                before,
                after,
                lat: std::iter::once("polyrail").chain(PAIRED_PEERS.iter().map(|p| p.0)).map(get).collect(),
                stable: before.zip(after).is_some_and(|(a, b)| a.max(b) <= STABLE_RATIO * a.min(b)),
                near: floor.map(is_near),
                ratios: [ratio(floor), ratio(get("ompi")), ratio(get("ucx"))],
            }
        })
        .collect();
    let ratio_heads = "polyrail / floor | polyrail / Open MPI | polyrail / UCX |";
    let _ = writeln!(md, "### Paired 8 B latency (placement-checked)\n");
    let _ = writeln!(
        md,
        "Each repeat starts with one tight block: the floor (one cache line between the two processes), \
         the 8 B one-way latency of every tool, the floor again. The host moves the two vCPUs between \
         sharing a core complex (near: floor below {:.0} ns) and sitting apart, and every tool's latency \
         follows; a repeat is stable when its floors before and after are within {:.0} % of each other. \
         Latencies in µs; floor = mean of before and after.\n",
        NEAR_US * 1e3,
        (STABLE_RATIO - 1.0) * 100.0
    );
    let mut head = String::from("| rep | floor before | floor after | placement | stable | polyrail |");
    for (_, label) in PAIRED_PEERS {
        head += &format!(" {label} |");
    }
    let _ = writeln!(md, "{head} {ratio_heads}\n|---:|---:|---:|---|---|{}", "---:|".repeat(PAIRED_PEERS.len() + 4));
    for r in &reps {
        let placement = match r.near {
            Some(n) if r.stable => {
                if n {
                    "near"
                } else {
                    "apart"
                }
            }
            _ => "changed",
        };
        let mut row = format!(
            "| {} | {} | {} | {placement} | {} |",
            r.rep,
            fmt(r.before, 3),
            fmt(r.after, 3),
            if r.stable { "yes" } else { "no" }
        );
        for v in &r.lat {
            row += &format!(" {} |", fmt(*v, 3));
        }
        for v in r.ratios {
            row += &format!(" {} |", fmt(v, 2));
        }
        let _ = writeln!(md, "{row}");
    }
    let stable: Vec<&Repeat> = reps.iter().filter(|r| r.stable).collect();
    let _ = writeln!(md, "\nMedians of the ratios over stable repeats ({} of {} stable):\n", stable.len(), reps.len());
    let _ = writeln!(md, "| repeats | count | {ratio_heads}\n|---|---:|---:|---:|---:|");
    let (near, apart): (Vec<&Repeat>, Vec<&Repeat>) = stable.iter().partition(|r| r.near == Some(true));
    let mut groups = vec![("stable", &stable)];
    if !near.is_empty() && !apart.is_empty() {
        groups.extend([("stable, near", &near), ("stable, apart", &apart)]);
    }
    for (name, group) in groups {
        let mut row = format!("| {name} | {} |", group.len());
        for i in 0..3 {
            row += &format!(" {} |", fmt(median(group.iter().filter_map(|r| r.ratios[i]).collect()), 2));
        }
        let _ = writeln!(md, "{row}");
    }
    let _ = writeln!(md);
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A CSV that is not compare-peers.sh's, holds no measurement, or holds `inf`/`NaN` (whose
    /// plot would never end its log axis) is refused with the file, the line and the value.
    #[test]
    fn bad_comparison_files_are_refused() {
        let file = tempfile::Builder::new().prefix("polyrail-report-test-").suffix(".csv").tempfile().unwrap();
        let path = file.path();
        let refused = |text: &str| {
            std::fs::write(path, text).unwrap();
            match read(path) {
                Ok(rows) => panic!("{text:?} was read as {} rows", rows.len()),
                Err(e) => format!("{e:#}"),
            }
        };
        let good = format!("{HEADER}\npolyrail,auto,lat_us,8,1,0.19\n");
        std::fs::write(path, &good).unwrap();
        assert_eq!(read(path).unwrap().len(), 1);
        assert!(refused("bench,transport,size,value,unit\nlatency,auto,8,0.19,us\n").contains("first line"));
        assert!(refused(&format!("{HEADER}\n")).contains("no measurements"));
        for bad in ["inf", "NaN", "-inf"] {
            let e = refused(&format!("{HEADER}\npolyrail,auto,lat_us,8,1,0.19\nucx,default,lat_us,8,1,{bad}\n"));
            assert!(e.contains(":3:") && e.contains(bad) && e.contains("finite"), "{e}");
        }
    }

    /// The fresh-data table puts polyrail beside the better of the two MPIs and its own
    /// same-buffer latency; a run without fresh rows gets no section.
    #[test]
    fn the_fresh_table_compares_with_the_better_mpi() {
        let key = |tool: &str, mode: &str| (tool.to_string(), mode.to_string(), "lat_us".to_string(), 16384);
        let m: Medians = [
            (key("polyrail", FRESH), 2.0),
            (key("ompi", FRESH), 5.0),
            (key("mpich", FRESH), 4.0),
            (key("polyrail", "auto"), 3.0),
        ]
        .into_iter()
        .collect();
        let mut md = String::new();
        fresh(&mut md, &m);
        assert!(md.contains("| 16k | 2.00 | 5.00 | 4.00 | 0.50 | 3.00 |"), "{md}");
        assert!(!md.contains(PARTIAL_NOTE), "{md}");
        let mut none = String::new();
        fresh(&mut none, &m.clone().into_iter().filter(|(k, _)| k.1 != FRESH).collect());
        assert!(none.is_empty(), "{none}");
        // Without MPICH's result the ratio is to Open MPI alone, and says so.
        let mut partial = String::new();
        fresh(&mut partial, &m.into_iter().filter(|(k, _)| k.0 != "mpich").collect());
        assert!(partial.contains("| 16k | 2.00 | 5.00 | - | 0.40* | 3.00 |"), "{partial}");
        assert!(partial.contains(PARTIAL_NOTE), "{partial}");
    }

    /// A size some peer has no result for marks the ratio to the best peer, with a note under
    /// the table; with every peer there, neither.
    #[test]
    fn a_missing_peer_is_flagged() {
        let key = |tool: &str, mode: &str, size| (tool.to_string(), mode.to_string(), "lat_us".to_string(), size);
        let m: Medians = [
            (key("polyrail", "auto", 8), 0.2),
            (key("ompi", "default", 8), 0.4),
            (key("ucx", "default", 8), 0.5),
            (key("mpich", "default", 8), 0.8),
            (key("polyrail", "auto", 64), 0.3),
            (key("ucx", "default", 64), 0.6),
        ]
        .into_iter()
        .collect();
        let mut md = String::new();
        tables(&mut md, &m, None, "###");
        let row =
            |size: &str| md.lines().find(|l| l.starts_with(&format!("| {size} |"))).unwrap_or_default().to_owned();
        assert!(row("8").contains("| 0.50 |"), "{md}");
        assert!(row("64").contains("| 0.50* |"), "{md}");
        assert_eq!(md.matches(PARTIAL_NOTE).count(), 1, "{md}");
    }
}
