//! Paths of a node and the profiles that give each a latency and a bandwidth (emulation).

use std::fmt;
use std::time::Duration;

/// A path of a node whose transfers the model paces. Host memory to host memory has no path: it
/// is never paced.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Path {
    /// Host memory to device memory over PCIe (SCIF DMA, host to device).
    HostToDevice,
    /// Device memory to host memory over PCIe (SCIF DMA, device to host).
    DeviceToHost,
    /// The network adapter reading device memory (PCIe peer-to-peer read): DirectIB sending from
    /// a device.
    AdapterReadsDevice,
    /// The network adapter writing device memory (PCIe peer-to-peer write): DirectIB receiving
    /// on a device.
    AdapterWritesDevice,
    /// The network, out of this node.
    NetOut,
    /// The network, into this node.
    NetIn,
}

impl Path {
    /// Every path, in the order of a node's shared link words.
    pub const ALL: [Path; 6] = [
        Path::HostToDevice,
        Path::DeviceToHost,
        Path::AdapterReadsDevice,
        Path::AdapterWritesDevice,
        Path::NetOut,
        Path::NetIn,
    ];

    /// The path's index among [`Path::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }

    /// A short name, for reports.
    pub fn name(self) -> &'static str {
        match self {
            Path::HostToDevice => "host->device (pcie)",
            Path::DeviceToHost => "device->host (pcie)",
            Path::AdapterReadsDevice => "adapter reads device",
            Path::AdapterWritesDevice => "adapter writes device",
            Path::NetOut => "network out",
            Path::NetIn => "network in",
        }
    }
}

impl fmt::Display for Path {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Latency and bandwidth of one path.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Link {
    /// Time from the start of a transfer to its first byte's arrival.
    pub latency: Duration,
    /// Bytes per second once streaming.
    pub bandwidth: f64,
}

impl Link {
    /// How long `bytes` occupy the link (without the latency), in nanoseconds, rounded up.
    pub fn occupancy_ns(&self, bytes: usize) -> u64 {
        if self.bandwidth <= 0.0 || !self.bandwidth.is_finite() {
            return 0;
        }
        let ns = (bytes as f64 * 1e9 / self.bandwidth).ceil();
        if ns >= u64::MAX as f64 {
            u64::MAX
        } else {
            ns as u64
        }
    }
}

/// The latency of a PCIe crossing (one way): half the 0.44 µs round trip of an 8-byte store
/// and reply over `scif_mmap` on KNC (ANCHORS, "SCIF, staging and proxies"). The PRISM paper
/// gives no latency for any path.
const PCIE_ONE_WAY: Duration = Duration::from_nanos(220);

/// Which figures the model uses: `none` (no model), `prism`, either divided by a factor.
#[derive(Clone, Debug, PartialEq)]
pub struct Profile {
    /// The profile's name as given (`prism`, `prism/4`).
    pub name: String,
    /// Each path's link, by [`Path::index`]; `None` for the `none` profile.
    pub links: Option<[Link; 6]>,
}

impl Default for Profile {
    fn default() -> Self {
        Profile::none()
    }
}

impl Profile {
    /// No link model: nothing is paced (the default).
    pub fn none() -> Profile {
        Profile { name: "none".into(), links: None }
    }

    /// Sandy Bridge host, KNC co-processor (Xeon Phi SE10P) on PCIe gen 2 x16, Mellanox FDR
    /// adapter: the PRISM paper's Stampede node (seed 004, §4). Figures per path:
    ///
    /// - host→device: 6,900 MB/s, 0.22 µs. The paper gives device→host only; the same PCIe
    ///   gen 2 x16 link and ANCHORS' "host↔device DMA plateaus near 6.5–7 GB/s" give the same
    ///   figure each way.
    /// - device→host: 6,900 MB/s (§3.3: "data movement from MIC to its host … SCIF … peak
    ///   bandwidth of 6.9 GB/sec"), 0.22 µs.
    /// - adapter reads device: 962 MB/s (§1, Figure 2: HCA and MIC on one socket), 0.44 µs: a
    ///   read is a PCIe round trip (non-posted).
    /// - adapter writes device: 5,280 MB/s (§1, Figure 2), 0.22 µs: posted writes, one crossing.
    /// - network out / in: 6,000 MB/s, 1.0 µs. The paper prints no host-to-host FDR figure
    ///   (Figure 3 has it as a bar only); 6,000 MB/s is what ANCHORS' bottleneck ceilings imply
    ///   (two-hop capped at ≈ 6.2 × DirectIB's 962 MB/s ≈ 5.96 GB/s), below FDR 4x's 6.8 GB/s
    ///   of data after 64b/66b coding. 1.0 µs is ConnectX-3's advertised MPI ping latency.
    ///
    /// Latencies: the paper gives none; a PCIe crossing is half the 0.44 µs 8-byte round trip
    /// over `scif_mmap` on KNC (ANCHORS, "SCIF, staging and proxies").
    pub fn prism() -> Profile {
        let mb = |n: f64| n * 1e6;
        let l = |lat: Duration, bw: f64| Link { latency: lat, bandwidth: bw };
        Profile {
            name: "prism".into(),
            links: Some([
                l(PCIE_ONE_WAY, mb(6_900.0)),
                l(PCIE_ONE_WAY, mb(6_900.0)),
                l(PCIE_ONE_WAY * 2, mb(962.0)),
                l(PCIE_ONE_WAY, mb(5_280.0)),
                l(Duration::from_micros(1), mb(6_000.0)),
                l(Duration::from_micros(1), mb(6_000.0)),
            ]),
        }
    }

    /// The same profile with every bandwidth divided by `factor` (latencies kept), so that no
    /// path asks for more than this machine can copy; `None` unless `factor` is from 1e-6 to
    /// 1e6 (beyond, times leave what the model's clock represents usefully).
    pub fn scaled(&self, factor: f64) -> Option<Profile> {
        if !(1e-6..=1e6).contains(&factor) {
            return None;
        }
        let links = self.links.map(|ls| ls.map(|l| Link { latency: l.latency, bandwidth: l.bandwidth / factor }));
        Some(Profile { name: format!("{}/{}", self.name, factor), links })
    }

    /// Parses `none`, `prism`, or either followed by `/factor` (a positive number dividing every
    /// bandwidth: `prism/4`, `prism/2.5`).
    pub fn parse(text: &str) -> Option<Profile> {
        let (base, factor) = match text.split_once('/') {
            Some((b, f)) => (b.trim(), Some(f.trim().parse::<f64>().ok()?)),
            None => (text.trim(), None),
        };
        let p = match base {
            "none" => Profile::none(),
            "prism" => Profile::prism(),
            _ => return None,
        };
        match factor {
            None => Some(p),
            Some(f) => {
                let mut s = p.scaled(f)?;
                s.name = text.trim().to_string();
                Some(s)
            }
        }
    }

    /// The link of `path`, `None` without a model.
    pub fn link(&self, path: Path) -> Option<Link> {
        self.links.map(|ls| ls[path.index()])
    }

    /// Whether the profile paces anything.
    pub fn is_none(&self) -> bool {
        self.links.is_none()
    }

    /// The highest bandwidth of any path (0 without a model): what this machine must copy at for
    /// the profile's plateaus to show.
    pub fn max_bandwidth(&self) -> f64 {
        self.links.map_or(0.0, |ls| ls.iter().map(|l| l.bandwidth).fold(0.0, f64::max))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_scale() {
        assert!(Profile::parse("none").unwrap().is_none());
        let p = Profile::parse("prism").unwrap();
        assert_eq!(p.link(Path::AdapterReadsDevice).unwrap().bandwidth, 962e6);
        assert_eq!(p.link(Path::AdapterWritesDevice).unwrap().bandwidth, 5_280e6);
        let q = Profile::parse("prism/4").unwrap();
        assert_eq!(q.name, "prism/4");
        for path in Path::ALL {
            let (a, b) = (p.link(path).unwrap(), q.link(path).unwrap());
            assert_eq!(a.bandwidth / 4.0, b.bandwidth);
            assert_eq!(a.latency, b.latency);
        }
        assert_eq!(q.max_bandwidth(), 6_900e6 / 4.0);
        for bad in ["", "prism/0", "prism/-1", "prism/x", "prism/inf", "prism/NaN", "prism/1e7", "fast", "prism/4/2"] {
            assert!(Profile::parse(bad).is_none(), "{bad}");
        }
    }

    #[test]
    fn occupancy() {
        let l = Link { latency: Duration::ZERO, bandwidth: 1e9 };
        assert_eq!(l.occupancy_ns(1000), 1000);
        assert_eq!(l.occupancy_ns(0), 0);
        assert_eq!(Link { latency: Duration::ZERO, bandwidth: 3e9 }.occupancy_ns(1), 1);
        assert_eq!(Link { latency: Duration::ZERO, bandwidth: 1e-300 }.occupancy_ns(usize::MAX), u64::MAX);
    }
}
