//! The machine's topology from hwloc (which CPUs share a core, a cache, a package), the CPUs
//! this process is bound to, and where the RDMA devices sit (their PCI locality).

use polyrail_core::policy::topology::TopoClass;
use std::path::Path;

/// The machine's topology as far as pair classification needs it: for every logical CPU, the
/// ids of its core, L2, L3, package and NUMA node (`None` where hwloc reports no such object).
#[derive(Clone, Debug, Default)]
pub struct Topology {
    /// Indexed by the CPU's OS index; CPUs hwloc does not list (not allowed to this process)
    /// have no place.
    cpus: Vec<CpuPlace>,
    /// How many CPUs hwloc lists.
    pus: usize,
    /// One line per level, for `polyrail info`.
    pub summary: String,
    /// RDMA devices and the CPUs next to them.
    pub devices: Vec<DeviceLocality>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct CpuPlace {
    core: Option<usize>,
    l2: Option<usize>,
    l3: Option<usize>,
    package: Option<usize>,
    numa: Option<usize>,
}

impl Topology {
    /// Reads the topology with hwloc. Never fails: without hwloc data every pair is `unbound`.
    pub fn detect() -> Topology {
        #[cfg(feature = "hwloc")]
        // The binding is young (a pre-release): a panic in it must not end the job either.
        let detected = std::panic::catch_unwind(detect_hwloc)
            .unwrap_or_else(|_| Err("hwloc gave no topology: its binding panicked".into()))
            .or_else(|hwloc| {
                detect_sysfs(Path::new(SYSFS_CPU), Path::new(SYSFS_NODE)).map_err(|s| format!("{hwloc}; {s}"))
            });
        #[cfg(not(feature = "hwloc"))]
        let detected = detect_sysfs(Path::new(SYSFS_CPU), Path::new(SYSFS_NODE));
        let mut t = detected.unwrap_or_else(|summary| Topology { summary, ..Topology::default() });
        t.devices = rdma_devices(Path::new(RDMA_CLASS_DIR));
        t
    }

    /// A synthetic topology for tests: `places[cpu] = (core, l2, l3, package)`.
    pub fn synthetic(places: &[(usize, usize, usize, usize)]) -> Topology {
        let cpus = places
            .iter()
            .map(|&(core, l2, l3, package)| CpuPlace {
                core: Some(core),
                l2: Some(l2),
                l3: Some(l3),
                package: Some(package),
                numa: Some(package),
            })
            .collect();
        Topology { cpus, pus: places.len(), summary: format!("synthetic, {} cpus", places.len()), devices: Vec::new() }
    }

    /// Number of logical CPUs known.
    pub fn num_cpus(&self) -> usize {
        self.pus
    }

    /// The closest shared level between two processes bound to `a` and `b` (CPU lists).
    /// Two processes not bound to a single place each are classed by the farthest pair of
    /// their CPUs; an empty list means "not bound" and gives [`TopoClass::Unknown`].
    pub fn classify(&self, a: &[usize], b: &[usize]) -> TopoClass {
        if a.is_empty() || b.is_empty() {
            return TopoClass::Unknown;
        }
        let mut worst = TopoClass::SameCore;
        for &x in a {
            for &y in b {
                let c = self.classify_cpus(x, y);
                if c > worst {
                    worst = c;
                }
            }
        }
        worst
    }

    fn classify_cpus(&self, x: usize, y: usize) -> TopoClass {
        let (Some(p), Some(q)) = (self.cpus.get(x), self.cpus.get(y)) else {
            return TopoClass::Unknown;
        };
        let same = |a: Option<usize>, b: Option<usize>| a.is_some() && a == b;
        if same(p.core, q.core) {
            TopoClass::SameCore
        } else if same(p.l2, q.l2) {
            TopoClass::SharedL2
        } else if same(p.l3, q.l3) {
            TopoClass::SharedL3
        } else if same(p.package, q.package) || same(p.numa, q.numa) {
            TopoClass::Socket
        } else if p.package.is_some() && q.package.is_some() {
            TopoClass::CrossSocket
        } else {
            TopoClass::Unknown
        }
    }
}

/// Where Linux lists CPUs and NUMA nodes.
const SYSFS_CPU: &str = "/sys/devices/system/cpu";
const SYSFS_NODE: &str = "/sys/devices/system/node";

/// The topology from Linux's sysfs (what hwloc's Linux backend reads), or why there is none:
/// per online CPU its core (`topology/core_id` within `topology/physical_package_id`), its L2
/// and L3 (`cache/index*/level` and `shared_cpu_list`), its package and its NUMA node
/// (`node*/cpulist`). Used without the `hwloc` feature, and where hwloc gives nothing.
fn detect_sysfs(cpu_dir: &Path, node_dir: &Path) -> Result<Topology, String> {
    let read = |p: &Path| std::fs::read_to_string(p).ok().map(|s| s.trim().to_owned());
    let online = read(&cpu_dir.join("online"))
        .and_then(|s| parse_cpu_list(&s))
        .ok_or_else(|| format!("{} lists no online CPUs", cpu_dir.display()))?;
    let Some(&max) = online.iter().max() else { return Err("no online CPUs".into()) };
    let mut cpus = vec![CpuPlace::default(); max + 1];
    // Distinct keys per level, numbered in the order first seen.
    let mut ids: [Vec<String>; 4] = Default::default();
    let mut id_of = |level: usize, key: String| -> usize {
        let list = &mut ids[level];
        list.iter().position(|k| *k == key).unwrap_or_else(|| {
            list.push(key);
            list.len() - 1
        })
    };
    for &cpu in &online {
        let dir = cpu_dir.join(format!("cpu{cpu}"));
        let package = read(&dir.join("topology/physical_package_id"));
        let core = read(&dir.join("topology/core_id"));
        let place = &mut cpus[cpu];
        if let Some(p) = &package {
            place.package = Some(id_of(3, p.clone()));
            if let Some(c) = &core {
                place.core = Some(id_of(0, format!("{p}/{c}")));
            }
        }
        for index in 0..8 {
            let cache = dir.join(format!("cache/index{index}"));
            let (Some(level), Some(shared)) = (read(&cache.join("level")), read(&cache.join("shared_cpu_list"))) else {
                continue;
            };
            match level.as_str() {
                "2" => place.l2 = Some(id_of(1, shared)),
                "3" => place.l3 = Some(id_of(2, shared)),
                _ => {}
            }
        }
    }
    let mut numa = 0;
    if let Ok(entries) = std::fs::read_dir(node_dir) {
        let mut nodes: Vec<(usize, Vec<usize>)> = entries
            .flatten()
            .filter_map(|e| {
                let n = e.file_name().to_str()?.strip_prefix("node")?.parse().ok()?;
                Some((n, parse_cpu_list(&read(&e.path().join("cpulist"))?)?))
            })
            .collect();
        nodes.sort();
        numa = nodes.len();
        for (i, (_, list)) in nodes.iter().enumerate() {
            for &cpu in list {
                if let Some(place) = cpus.get_mut(cpu) {
                    place.numa.get_or_insert(i);
                }
            }
        }
    }
    let count = |n: usize, one: &str, several: &str| format!("{n} {}", if n == 1 { one } else { several });
    let mut summary = Vec::new();
    for (n, one, several) in [
        (ids[0].len(), "core", "cores"),
        (ids[1].len(), "L2", "L2"),
        (ids[2].len(), "L3", "L3"),
        (ids[3].len(), "package", "packages"),
        (numa, "NUMA node", "NUMA nodes"),
    ] {
        if n > 0 {
            summary.push(count(n, one, several));
        }
    }
    let n = online.len();
    Ok(Topology {
        cpus,
        pus: n,
        summary: format!("{}: {} (from sysfs)", count(n, "cpu", "cpus"), summary.join(", ")),
        devices: Vec::new(),
    })
}

/// The topology from hwloc, or why there is none. hwloc lists only the PUs this process is
/// allowed to use (a cgroup cpuset may leave gaps), so places are indexed by OS index.
#[cfg(feature = "hwloc")]
fn detect_hwloc() -> Result<Topology, String> {
    use hwlocality::object::types::ObjectType;
    let topo = hwlocality::Topology::new().map_err(|e| format!("hwloc gave no topology: {e}"))?;
    let pus: Vec<usize> = topo.objects_with_type(ObjectType::PU).filter_map(|pu| pu.os_index()).collect();
    let Some(&max) = pus.iter().max() else { return Err("hwloc lists no CPUs".into()) };
    let mut cpus = vec![CpuPlace::default(); max + 1];
    let mut summary = Vec::new();
    type Field = fn(&mut CpuPlace) -> &mut Option<usize>;
    // (type, its name for one, for several, where a CPU's index at that level goes). NUMA nodes
    // are memory children in hwloc 2, listed with their cpusets like the levels above; a CPU
    // near several (DRAM and HBM of one package) takes the first.
    let levels: [(ObjectType, &str, &str, Field); 5] = [
        (ObjectType::Core, "core", "cores", |p| &mut p.core),
        (ObjectType::L2Cache, "L2", "L2", |p| &mut p.l2),
        (ObjectType::L3Cache, "L3", "L3", |p| &mut p.l3),
        (ObjectType::Package, "package", "packages", |p| &mut p.package),
        (ObjectType::NUMANode, "NUMA node", "NUMA nodes", |p| &mut p.numa),
    ];
    for (ty, one, several, field) in levels {
        let objs = topo.objects_with_type(ty);
        if objs.len() == 0 {
            continue;
        }
        summary.push(format!("{} {}", objs.len(), if objs.len() == 1 { one } else { several }));
        for obj in objs {
            let Some(set) = obj.cpuset() else { continue };
            for cpu in set.iter_set() {
                if let Some(slot) = cpus.get_mut(usize::from(cpu)).map(field) {
                    slot.get_or_insert(obj.logical_index());
                }
            }
        }
    }
    let n = pus.len();
    Ok(Topology {
        cpus,
        pus: n,
        summary: format!("{n} {}: {}", if n == 1 { "cpu" } else { "cpus" }, summary.join(", ")),
        devices: Vec::new(),
    })
}

/// Where the kernel lists RDMA devices.
pub const RDMA_CLASS_DIR: &str = "/sys/class/infiniband";

/// Where an RDMA device's PCI slot attaches: the CPUs and NUMA node next to it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceLocality {
    /// Device name (`mlx5_0`, `rxe0`).
    pub name: String,
    /// CPUs local to the device's PCI bus; empty when the device has no PCI parent (a software
    /// device such as Soft-RoCE) or the kernel does not say.
    pub cpus: Vec<usize>,
    /// Its NUMA node, when the kernel knows one.
    pub numa: Option<u32>,
}

impl DeviceLocality {
    /// Whether a process bound to `binding` runs next to the device (every CPU of the binding
    /// is local to it); `None` when the process is not bound or the device's locality unknown.
    pub fn is_near(&self, binding: &[usize]) -> Option<bool> {
        if binding.is_empty() || self.cpus.is_empty() {
            return None;
        }
        Some(binding.iter().all(|c| self.cpus.contains(c)))
    }

    /// One line for `polyrail info`: the locality and where a process bound to `binding` is.
    pub fn describe(&self, binding: &[usize]) -> String {
        if self.cpus.is_empty() {
            return format!("{}: no PCI locality (a software device, or the kernel does not say)", self.name);
        }
        let numa = self.numa.map_or(String::new(), |n| format!(", NUMA node {n}"));
        let here = match self.is_near(binding) {
            Some(true) => "this process runs next to it",
            Some(false) => "this process runs away from it (traffic crosses the inter-socket link)",
            None => "this process is not bound",
        };
        format!("{}: PCI slot local to cpus {}{numa}; {here}", self.name, cpu_ranges(&self.cpus))
    }
}

/// The RDMA devices listed in `class_dir` (normally [`RDMA_CLASS_DIR`]) with their PCI
/// locality, read from the files hwloc's Linux backend reads (`device/local_cpulist`,
/// `device/numa_node`): this spares [`Topology::detect`] hwloc's PCI enumeration (its I/O
/// objects are filtered out by default) and can be tested on a directory of such files.
pub fn rdma_devices(class_dir: &Path) -> Vec<DeviceLocality> {
    let Ok(entries) = std::fs::read_dir(class_dir) else { return Vec::new() };
    let mut devices: Vec<DeviceLocality> = entries
        .flatten()
        .map(|e| {
            let dev = e.path().join("device");
            let read = |f: &str| std::fs::read_to_string(dev.join(f)).ok();
            DeviceLocality {
                name: e.file_name().to_string_lossy().into_owned(),
                cpus: read("local_cpulist").and_then(|s| parse_cpu_list(s.trim())).unwrap_or_default(),
                numa: read("numa_node").and_then(|s| s.trim().parse().ok()),
            }
        })
        .collect();
    devices.sort_by(|a, b| a.name.cmp(&b.name));
    devices
}

/// A kernel CPU list (`0-3,8,10-11`); `None` when malformed.
fn parse_cpu_list(s: &str) -> Option<Vec<usize>> {
    let mut cpus = Vec::new();
    for part in s.split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (usize, usize) = (a.parse().ok()?, b.parse().ok()?);
                if b < a || b - a > 1 << 16 {
                    return None;
                }
                cpus.extend(a..=b);
            }
            None => cpus.push(part.parse().ok()?),
        }
    }
    Some(cpus)
}

/// `[0, 1, 2, 5]` as `0-2,5`.
fn cpu_ranges(cpus: &[usize]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < cpus.len() {
        let mut j = i;
        while j + 1 < cpus.len() && cpus[j + 1] == cpus[j] + 1 {
            j += 1;
        }
        out.push(if i == j { cpus[i].to_string() } else { format!("{}-{}", cpus[i], cpus[j]) });
        i = j + 1;
    }
    out.join(",")
}

/// The logical CPUs this process may run on (its binding); empty when the kernel does not say
/// (or the machine has more CPUs than a `cpu_set_t` holds, 1024).
pub fn current_binding() -> Vec<usize> {
    match rustix::thread::sched_getaffinity(None) {
        Ok(set) => (0..rustix::thread::CpuSet::MAX_CPU).filter(|&c| set.is_set(c)).collect(),
        Err(_) => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes() {
        // 2 packages x 2 L3 each? No: package p has one L3; cores 0-3 in package 0 with L2 per
        // pair of cpus (SMT siblings share a core and L2).
        let t = Topology::synthetic(&[(0, 0, 0, 0), (0, 0, 0, 0), (1, 1, 0, 0), (2, 2, 1, 1)]);
        assert_eq!(t.classify(&[0], &[1]), TopoClass::SameCore);
        assert_eq!(t.classify(&[0], &[2]), TopoClass::SharedL3);
        assert_eq!(t.classify(&[0], &[3]), TopoClass::CrossSocket);
        assert_eq!(t.classify(&[0, 2], &[1]), TopoClass::SharedL3);
        assert_eq!(t.classify(&[], &[1]), TopoClass::Unknown);
        assert_eq!(t.classify(&[9], &[1]), TopoClass::Unknown);
    }

    #[test]
    fn rdma_device_locality_from_sysfs() {
        let dir = tempfile::Builder::new().prefix("polyrail-sysfs-").tempdir().unwrap();
        let root = dir.path();
        let hca = root.join("mlx5_0/device");
        std::fs::create_dir_all(&hca).unwrap();
        std::fs::write(hca.join("local_cpulist"), "0-3,8-11\n").unwrap();
        std::fs::write(hca.join("numa_node"), "1\n").unwrap();
        std::fs::create_dir_all(root.join("rxe0")).unwrap();
        let bad = root.join("zz_bad/device");
        std::fs::create_dir_all(&bad).unwrap();
        std::fs::write(bad.join("local_cpulist"), "3-1").unwrap();
        std::fs::write(bad.join("numa_node"), "-1").unwrap();
        let devs = rdma_devices(root);
        dir.close().unwrap();
        assert_eq!(devs.len(), 3);
        let (hca, rxe, bad) = (&devs[0], &devs[1], &devs[2]);
        assert_eq!(hca.cpus, [0, 1, 2, 3, 8, 9, 10, 11]);
        assert_eq!(hca.numa, Some(1));
        assert_eq!(hca.is_near(&[2]), Some(true));
        assert_eq!(hca.is_near(&[3, 4]), Some(false));
        assert_eq!(hca.is_near(&[]), None);
        assert!(hca.describe(&[9]).contains("cpus 0-3,8-11, NUMA node 1; this process runs next to it"));
        assert!(hca.describe(&[5]).contains("away from it"));
        assert_eq!((rxe.name.as_str(), rxe.cpus.is_empty(), rxe.numa), ("rxe0", true, None));
        assert!(rxe.describe(&[0]).contains("no PCI locality"));
        assert_eq!((bad.cpus.is_empty(), bad.numa), (true, None), "malformed files give no locality");
        assert!(rdma_devices(Path::new("/nonexistent/polyrail")).is_empty());
    }

    /// sysfs as Linux writes it: two packages, each of one L3 and two cores of two threads
    /// sharing an L2, each package its NUMA node; CPU 7 offline.
    #[test]
    fn reads_the_topology_from_sysfs() {
        let dir = tempfile::tempdir().unwrap();
        let (cpu, node) = (dir.path().join("cpu"), dir.path().join("node"));
        let write = |p: std::path::PathBuf, text: &str| {
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        };
        write(cpu.join("online"), "0-6\n");
        for c in 0..8 {
            let (package, core) = (c / 4, c / 2 % 2);
            let d = cpu.join(format!("cpu{c}"));
            write(d.join("topology/physical_package_id"), &format!("{package}\n"));
            write(d.join("topology/core_id"), &format!("{core}\n"));
            write(d.join("cache/index0/level"), "1\n");
            write(d.join("cache/index0/shared_cpu_list"), &format!("{}-{}\n", c / 2 * 2, c / 2 * 2 + 1));
            write(d.join("cache/index2/level"), "2\n");
            write(d.join("cache/index2/shared_cpu_list"), &format!("{}-{}\n", c / 2 * 2, c / 2 * 2 + 1));
            write(d.join("cache/index3/level"), "3\n");
            write(d.join("cache/index3/shared_cpu_list"), &format!("{}-{}\n", package * 4, package * 4 + 3));
        }
        write(node.join("node0/cpulist"), "0-3\n");
        write(node.join("node1/cpulist"), "4-7\n");
        let t = detect_sysfs(&cpu, &node).unwrap();
        assert_eq!(t.summary, "7 cpus: 4 cores, 4 L2, 2 L3, 2 packages, 2 NUMA nodes (from sysfs)");
        assert_eq!(t.classify(&[0], &[1]), TopoClass::SameCore);
        assert_eq!(t.classify(&[0], &[2]), TopoClass::SharedL3);
        assert_eq!(t.classify(&[0], &[4]), TopoClass::CrossSocket);
        assert_eq!(t.classify(&[0], &[7]), TopoClass::Unknown, "offline");
        assert_eq!(t.cpus[5].numa, Some(1));
        assert!(detect_sysfs(&dir.path().join("none"), &node).is_err());
    }

    /// hwloc's NUMA nodes are read for real: under a synthetic hwloc topology of 2 packages of
    /// 2 NUMA nodes (one per L3) each, every CPU gets its node.
    #[test]
    #[cfg(feature = "hwloc")]
    fn reads_numa_nodes_from_hwloc() {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "topology::tests::helper_synthetic_numa", "--ignored"])
            .env("HWLOC_SYNTHETIC", "pack:2 numa:2 l3:1 l2:2 core:1 pu:2")
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        assert!(String::from_utf8_lossy(&out.stdout).contains("1 passed"), "{out:?}");
    }

    #[test]
    #[cfg(feature = "hwloc")]
    #[ignore = "run by reads_numa_nodes_from_hwloc under HWLOC_SYNTHETIC"]
    fn helper_synthetic_numa() {
        let t = Topology::detect();
        assert_eq!(t.summary, "16 cpus: 8 cores, 8 L2, 4 L3, 2 packages, 4 NUMA nodes");
        let numa: Vec<_> = t.cpus.iter().map(|p| p.numa.unwrap()).collect();
        assert_eq!(numa, [0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3]);
        assert_eq!(t.classify(&[0], &[1]), TopoClass::SameCore);
        assert_eq!(t.classify(&[0], &[2]), TopoClass::SharedL3);
        assert_eq!(t.classify(&[0], &[4]), TopoClass::Socket);
        assert_eq!(t.classify(&[0], &[8]), TopoClass::CrossSocket);
    }

    #[test]
    fn detects_this_machine() {
        let t = Topology::detect();
        assert!(t.num_cpus() >= 1, "{}", t.summary);
        // hwloc 2 and Linux give every machine a NUMA node at least, and every CPU one near it.
        assert!(t.summary.contains("NUMA node"), "{}", t.summary);
        let binding = current_binding();
        assert!(!binding.is_empty());
        for cpu in binding {
            let place = t.cpus.get(cpu).copied().unwrap_or_default();
            assert!(place.numa.is_some(), "cpu {cpu}: {place:?} in {}", t.summary);
        }
    }
}
