//! `link-calibrate`: each path of the link model (an emulation) driven with large transfers
//! through the provider that paces it — the software SCIF provider for host↔device PCIe, the
//! software RDMA provider for the adapter's reads and writes of device memory and the network —
//! and its plateau set beside the profile's figure.

use anyhow::{bail, Context as _};
use polyrail_ib::provider::{Access, Opcode, Provider, WcStatus, WorkRequest};
use polyrail_ib::{SoftLink, SoftProvider};
use polyrail_link::{Domain, LinkModel, PacingStats, Path, Profile};
use polyrail_scif::ScifPacer;
use polyrail_scif::{AcceptFlags, Fabric, FabricConfig, FenceFlags, MapFlags, Memory, Pacer, PortId, Prot, RmaFlags};
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

/// How to drive each path.
#[derive(Clone, Debug)]
pub struct Calibration {
    /// The profile to check.
    pub profile: Profile,
    /// Bytes per transfer.
    pub bytes: usize,
    /// Transfers per path, the first `window` of them a warm-up outside the timing.
    pub transfers: usize,
    /// Transfers in flight.
    pub window: usize,
}

/// One path's result.
#[derive(Clone, Debug)]
pub struct PathResult {
    /// The path that bounds the transfers driven.
    pub path: Path,
    /// Through what (provider and domains).
    pub through: &'static str,
    /// The profile's bandwidth (bytes/s).
    pub profile: f64,
    /// The plateau measured (bytes/s).
    pub measured: f64,
    /// What pacing did.
    pub pacing: PacingStats,
}

impl PathResult {
    /// measured / profile.
    pub fn ratio(&self) -> f64 {
        if self.profile > 0.0 {
            self.measured / self.profile
        } else {
            0.0
        }
    }

    /// Whether the plateau is within 5 % of the profile.
    pub fn within_5_percent(&self) -> bool {
        (self.ratio() - 1.0).abs() <= 0.05
    }
}

/// This machine's single-thread copy rate (bytes/s) over `bytes`-byte copies between two
/// buffers (as `physlim memcpy` measures it): the best of seven trials of 32 MiB each, so that a
/// trial the host preempted does not count.
pub fn copy_rate(bytes: usize) -> f64 {
    let bytes = bytes.max(1);
    let src = vec![1u8; bytes];
    // The destination half a page plus a line away from the source's page offset: buffers of
    // equal page offsets alias in the store buffer (4K aliasing) and copy at a fraction.
    const SKEW: usize = 2048 + 64;
    let mut space = vec![0u8; bytes + SKEW];
    let dst = &mut space[SKEW..];
    dst.copy_from_slice(&src);
    let rounds = (32 << 20) / bytes + 1;
    let mut best = 0f64;
    for _ in 0..7 {
        let t = Instant::now();
        for _ in 0..rounds {
            dst.copy_from_slice(std::hint::black_box(&src));
            std::hint::black_box(&mut *dst);
        }
        best = best.max((rounds * bytes) as f64 / t.elapsed().as_secs_f64());
    }
    best
}

/// Drives every path; `dir` holds the model's node files and the SCIF job directory.
pub fn run(cal: &Calibration, dir: &std::path::Path) -> anyhow::Result<Vec<PathResult>> {
    if cal.profile.is_none() {
        bail!("profile `none` has no link to calibrate: give --profile prism or prism/N");
    }
    if cal.window == 0 || cal.transfers <= cal.window || cal.bytes == 0 {
        bail!("need bytes > 0, window > 0 and more transfers than the window");
    }
    let link = |p: Path| cal.profile.link(p).map_or(0.0, |l| l.bandwidth);
    let mut out = Vec::new();
    for (path, from, to) in [(Path::HostToDevice, 0u16, 1u16), (Path::DeviceToHost, 1, 0)] {
        let (measured, pacing) = scif_path(cal, dir, from, to).with_context(|| format!("{path} through SCIF"))?;
        let through = if from == 0 { "scif writeto, host to device 1" } else { "scif writeto, device 1 to host" };
        out.push(PathResult { path, through, profile: link(path), measured, pacing });
    }
    let nets = [
        (Path::AdapterReadsDevice, Domain::Device(1), Domain::Host, "soft rdma write, device 1 to a remote host"),
        (Path::AdapterWritesDevice, Domain::Host, Domain::Device(1), "soft rdma write, host to a remote device 1"),
        (Path::NetOut, Domain::Host, Domain::Host, "soft rdma write, host to a remote host"),
    ];
    for (path, from, to, through) in nets {
        let (measured, pacing) = rdma_path(cal, dir, from, to).with_context(|| format!("{path} through soft RDMA"))?;
        // Host to host takes the network out of one node and into the other: the same figure.
        out.push(PathResult { path, through, profile: link(path), measured, pacing });
    }
    Ok(out)
}

fn job(tag: &str) -> String {
    format!("cal{}-{tag}", std::process::id())
}

/// Writes from SCIF node `from` to `to` of one physical node, `window` in flight: bytes/s after
/// the warm-up.
fn scif_path(cal: &Calibration, dir: &std::path::Path, from: u16, to: u16) -> anyhow::Result<(f64, PacingStats)> {
    let job = job(&format!("scif{from}{to}"));
    let model = Arc::new(LinkModel::in_dir(cal.profile.clone(), dir, &job)?);
    let pacer: Arc<dyn Pacer> = Arc::new(ScifPacer::new(model.clone(), 0));
    let fabric = |node| Fabric::new(FabricConfig::new(dir, &job, node, 2).pacer(pacer.clone()));
    let (fa, fb) = (fabric(from)?, fabric(to)?);
    let mut l = fb.open()?;
    let port = l.bind(0)?;
    l.listen(1)?;
    let fa2 = fa.clone();
    let t = std::thread::spawn(move || -> polyrail_scif::Result<_> {
        let mut e = fa2.open()?;
        e.connect(PortId::new(to, port))?;
        Ok(e)
    });
    let (_, b) = l.accept(AcceptFlags::SYNC)?;
    let a = t.join().map_err(|_| anyhow::anyhow!("the connecting thread panicked"))??;
    let page = polyrail_scif::page_size();
    let len = cal.bytes.div_ceil(page) * page;
    let (ma, mb) = (Memory::new(len)?, Memory::new(len)?);
    let rw = Prot::READ | Prot::WRITE;
    let la = a.register(&ma, 0, len, 0, rw, MapFlags::NONE)?;
    let rb = b.register(&mb, 0, len, 0, rw, MapFlags::NONE)?;
    let mut marks = VecDeque::new();
    let mut timed_from = None;
    for i in 0..cal.transfers {
        if i == cal.window {
            // Warm-up done: wait for it, then time the rest from a busy link.
            while let Some(m) = marks.pop_front() {
                a.fence_wait(m)?;
            }
            timed_from = Some(Instant::now());
        }
        a.writeto(la, len, rb, RmaFlags::NONE)?;
        marks.push_back(a.fence_mark(FenceFlags::INIT_SELF)?);
        if marks.len() >= cal.window {
            if let Some(m) = marks.pop_front() {
                a.fence_wait(m)?;
            }
        }
    }
    while let Some(m) = marks.pop_front() {
        a.fence_wait(m)?;
    }
    let t0 = timed_from.context("no timed transfer")?;
    let rate = ((cal.transfers - cal.window) * len) as f64 / t0.elapsed().as_secs_f64();
    let stats = model.stats();
    drop((a, b, l, fa, fb));
    model.remove_files();
    Ok((rate, stats))
}

/// RDMA writes between two soft providers of this process on virtual nodes 0 and 1, their memory
/// in `from` and `to`, `window` in flight: bytes/s after the warm-up.
fn rdma_path(cal: &Calibration, dir: &std::path::Path, from: Domain, to: Domain) -> anyhow::Result<(f64, PacingStats)> {
    let job = job(&format!("rdma{}{}", from.scif_node(), to.scif_node()));
    let model = Arc::new(LinkModel::in_dir(cal.profile.clone(), dir, &job)?);
    let link = |node, domain| SoftLink { model: model.clone(), node, domain };
    let mut target = SoftProvider::new().with_link(link(1, to));
    let mut initiator = SoftProvider::new().with_link(link(0, from));
    let len = cal.bytes;
    let mut dst = vec![0u8; len];
    let mut src = vec![5u8; len];
    // SAFETY: both buffers outlive the providers' use of them: every transfer completes before
    // they are dropped at the end of this function, after the providers.
    let (mr, src_mr) = unsafe {
        (target.register(dst.as_mut_ptr(), len, Access::ALL)?, initiator.register(src.as_mut_ptr(), len, Access::ALL)?)
    };
    let (tq, tnum) = target.create_qp(0)?;
    let (iq, inum) = initiator.create_qp(0)?;
    target.connect(tq, &initiator.endpoint(), inum)?;
    initiator.connect(iq, &target.endpoint(), tnum)?;
    initiator.ready_to_send(iq)?;
    let wr = WorkRequest {
        wr_id: 0,
        opcode: Opcode::Write,
        local_addr: src.as_ptr() as u64,
        len,
        lkey: src_mr.lkey,
        remote_addr: mr.addr,
        rkey: mr.rkey,
        inline: false,
        imm: None,
    };
    let window = cal.window.min(initiator.max_outstanding());
    let (mut posted, mut done, mut out) = (0usize, 0usize, Vec::new());
    let mut timed_from = None;
    while done < cal.transfers {
        if done == window && timed_from.is_none() {
            timed_from = Some(Instant::now());
        }
        // Hold the warm-up apart: nothing after it is posted before it completed.
        let limit = if done < window { window } else { cal.transfers };
        while posted < limit && posted - done < window {
            initiator.post(iq, &WorkRequest { wr_id: posted as u64, ..wr })?;
            posted += 1;
        }
        out.clear();
        initiator.poll(&mut out, window);
        for c in &out {
            if c.status != WcStatus::Success {
                bail!("transfer {} failed: {:?}", c.wr_id, c.status);
            }
        }
        done += out.len();
        if out.is_empty() {
            std::hint::spin_loop();
        }
    }
    let t0 = timed_from.context("no timed transfer")?;
    let rate = ((cal.transfers - window) * len) as f64 / t0.elapsed().as_secs_f64();
    let stats = model.stats();
    drop((initiator, target));
    drop((src, dst));
    model.remove_files();
    Ok((rate, stats))
}

/// The table `link-calibrate` prints.
pub fn table(cal: &Calibration, results: &[PathResult], copy: f64) -> String {
    let mb = |b: f64| b / 1e6;
    let mut s = format!(
        "# polyrail-bench link-calibrate: profile {} (emulation), {} B per transfer, {} in flight, {} transfers per path\n",
        cal.profile.name, cal.bytes, cal.window, cal.transfers
    );
    s += &format!(
        "# this machine copies {:.0} MB/s with memcpy on one thread; the profile's fastest path asks {:.0} MB/s\n",
        mb(copy),
        mb(cal.profile.max_bandwidth())
    );
    s += &format!(
        "{:<24}{:>14}{:>14}{:>8}  {:<8}{}\n",
        "# path", "profile MB/s", "plateau MB/s", "ratio", "5 %", "through; pacing"
    );
    for r in results {
        s += &format!(
            "{:<24}{:>14.0}{:>14.0}{:>8.3}  {:<8}{}; {}\n",
            r.path.name(),
            mb(r.profile),
            mb(r.measured),
            r.ratio(),
            if r.within_5_percent() { "within" } else { "OUTSIDE" },
            r.through,
            r.pacing.summary(&cal.profile.name)
        );
    }
    if let Some(n) = scale_needed(results) {
        let have = cal.profile.name.split_once('/').and_then(|(_, f)| f.parse::<f64>().ok()).unwrap_or(1.0);
        s += &format!(
            "# pacing did not hold every path (its copies ran slower than the model asked): try --profile {}/{}\n",
            base(&cal.profile),
            (have * n as f64).ceil()
        );
    }
    s
}

/// The further division of the profile that would let pacing hold every path: `None` when no
/// plateau falls more than 5 % short of the profile. A path short of its figure ran its copies
/// slower than the model asked (transfers never delayed, or, through SCIF, whose hook starts the
/// model at the copy's end, a link left idle between copies).
pub fn scale_needed(results: &[PathResult]) -> Option<u64> {
    let worst = results
        .iter()
        .filter(|r| r.measured > 0.0 && r.measured < r.profile * 0.95)
        .map(|r| r.profile / r.measured)
        .fold(0.0, f64::max);
    // A quarter more than the shortfall, so the copies stay clearly below the model.
    (worst > 0.0).then(|| (worst * 1.25).ceil().max(2.0) as u64)
}

/// The profile's base name (`prism` of `prism/4`).
fn base(p: &Profile) -> &str {
    p.name.split('/').next().unwrap_or(&p.name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scale_asked_for_follows_the_shortfall() {
        let r = |measured, delayed| PathResult {
            path: Path::NetOut,
            through: "",
            profile: 6e9,
            measured,
            pacing: PacingStats { paced: 10, delayed, delay: std::time::Duration::ZERO },
        };
        assert_eq!(scale_needed(&[r(5.9e9, 10)]), None);
        // Above the profile is not a copy-rate limit.
        assert_eq!(scale_needed(&[r(6.5e9, 10)]), None);
        // 2x short: 2.5 -> 3.
        assert_eq!(scale_needed(&[r(3e9, 4), r(5.9e9, 10)]), Some(3));
    }

    /// Runs every path briefly; checks the shape of the result, never a time.
    #[test]
    fn every_path_is_driven_and_reported() {
        let dir = tempfile::tempdir().unwrap();
        let cal =
            Calibration { profile: Profile::parse("prism/100").unwrap(), bytes: 64 << 10, transfers: 6, window: 2 };
        let r = run(&cal, dir.path()).unwrap();
        let paths: Vec<Path> = r.iter().map(|r| r.path).collect();
        assert_eq!(
            paths,
            [Path::HostToDevice, Path::DeviceToHost, Path::AdapterReadsDevice, Path::AdapterWritesDevice, Path::NetOut]
        );
        for x in &r {
            assert_eq!(x.pacing.paced, 6, "{x:?}");
            assert!(x.measured > 0.0);
        }
        let t = table(&cal, &r, 1e9);
        assert!(t.contains("profile prism/100 (emulation)") && t.contains("adapter reads device"), "{t}");
        let none = Calibration { profile: Profile::none(), ..cal };
        assert!(run(&none, dir.path()).is_err());
    }
}
