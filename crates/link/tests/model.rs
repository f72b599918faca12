//! The model's arithmetic, contention on a link and sharing between processes. Times are model
//! times (returned instants), never measured.

use polyrail_link::{rdma_hops, scif_hops, Domain, Hop, LinkModel, Path, Profile};
use std::time::{Duration, Instant};

fn model(dir: &tempfile::TempDir, profile: Profile) -> LinkModel {
    LinkModel::in_dir(profile, dir.path(), "t1").unwrap()
}

fn hop(path: Path) -> Hop {
    Hop { node: 0, path }
}

#[test]
fn one_transfer_is_latency_plus_bytes_over_bandwidth() {
    let dir = tempfile::tempdir().unwrap();
    let m = model(&dir, Profile::prism());
    let now = Instant::now();
    // 962 MB/s: 962,000 bytes take 1 ms, plus the 0.44 µs read latency.
    let at = m.reserve(&[hop(Path::AdapterReadsDevice)], 962_000, now).unwrap();
    let d = at - now;
    assert!((d.as_nanos() as i128 - 1_000_440).abs() <= 1, "{d:?}");
    // Later than the link's busy time: starts at `now`.
    let later = now + Duration::from_secs(1);
    let at = m.reserve(&[hop(Path::AdapterReadsDevice)], 0, later).unwrap();
    assert!(((at - later).as_nanos() as i128 - 440).abs() <= 1);
}

#[test]
fn two_concurrent_transfers_on_one_link_take_twice_as_long() {
    let dir = tempfile::tempdir().unwrap();
    let m = model(&dir, Profile::prism());
    let now = Instant::now();
    let bytes = 6_900_000; // 1 ms on PCIe
    let a = m.reserve(&[hop(Path::HostToDevice)], bytes, now).unwrap() - now;
    let b = m.reserve(&[hop(Path::HostToDevice)], bytes, now).unwrap() - now;
    let lat = Duration::from_nanos(220);
    let close = |x: Duration, y: Duration| (x.as_nanos() as i128 - y.as_nanos() as i128).abs() <= 2;
    assert!(close(a, Duration::from_millis(1) + lat), "{a:?}");
    assert!(close(b, Duration::from_millis(2) + lat), "{b:?}");
    // The other direction is another link: not delayed.
    let c = m.reserve(&[hop(Path::DeviceToHost)], bytes, now).unwrap() - now;
    assert!(close(c, a), "{c:?}");
}

#[test]
fn hops_take_the_slowest_link_and_every_latency() {
    let dir = tempfile::tempdir().unwrap();
    let m = model(&dir, Profile::prism());
    let now = Instant::now();
    let hops = rdma_hops(0, Domain::Device(1), 1, Domain::Host);
    assert_eq!(hops.iter().map(|h| h.path).collect::<Vec<_>>(), [Path::AdapterReadsDevice, Path::NetOut, Path::NetIn]);
    let d = m.reserve(&hops, 962_000, now).unwrap() - now;
    // 1 ms at 962 MB/s; latencies 0.44 + 1 + 1 µs.
    assert!((d.as_nanos() as i128 - 1_002_440).abs() <= 2, "{d:?}");
    assert_eq!(scif_hops(3, 0, 1), [Hop { node: 3, path: Path::HostToDevice }]);
    assert_eq!(scif_hops(3, 2, 0), [Hop { node: 3, path: Path::DeviceToHost }]);
    assert!(scif_hops(3, 1, 1).is_empty());
}

#[test]
fn scaled_profile_divides_the_rate() {
    let dir = tempfile::tempdir().unwrap();
    let m = model(&dir, Profile::parse("prism/4").unwrap());
    let now = Instant::now();
    let d = m.reserve(&[hop(Path::AdapterWritesDevice)], 5_280_000, now).unwrap() - now;
    assert!((d.as_nanos() as i128 - 4_000_220).abs() <= 2, "{d:?}");
}

#[test]
fn none_paces_nothing_and_counters_say_so() {
    let dir = tempfile::tempdir().unwrap();
    let m = model(&dir, Profile::none());
    let now = Instant::now();
    assert_eq!(m.complete(&[hop(Path::NetOut)], 1 << 20, now, now).unwrap(), now);
    assert_eq!(m.stats().paced, 0);

    let m = model(&dir, Profile::prism());
    // A copy that ended long after the model's time: paced, never delayed.
    let copied = now + Duration::from_secs(1);
    assert_eq!(m.complete(&[hop(Path::NetIn)], 1000, now, copied).unwrap(), copied);
    let s = m.stats();
    assert_eq!((s.paced, s.delayed, s.undelayed()), (1, 0, 1));
    assert!(m.summary().contains("pacing never delayed anything"), "{}", m.summary());
    // A copy faster than the model: delayed to the model's time.
    let t = now + Duration::from_secs(2);
    let at = m.complete(&[hop(Path::NetIn)], 6_000_000, t, t).unwrap();
    assert!(at > t + Duration::from_micros(999));
    let s = m.stats();
    assert_eq!((s.paced, s.delayed), (2, 1));
    assert_eq!(s.delay, at - t);
    assert!(m.summary().contains("1 delayed"), "{}", m.summary());
}

#[test]
fn bad_job_ids_and_foreign_files_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    assert!(LinkModel::in_dir(Profile::prism(), dir.path(), "a/b").is_err());
    assert!(LinkModel::in_dir(Profile::prism(), dir.path(), "").is_err());
    let m = LinkModel::in_dir(Profile::prism(), dir.path(), "j").unwrap();
    let uid = rustix_uid();
    std::fs::write(dir.path().join(format!("polyrail-{uid}-j-link0")), b"not a link file").unwrap();
    assert!(m.reserve(&[hop(Path::NetOut)], 1, Instant::now()).is_err());
    let path = dir.path().join(format!("polyrail-{uid}-j-link1"));
    std::fs::write(&path, [7u8; 64]).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    assert!(m.reserve(&[Hop { node: 1, path: Path::NetOut }], 1, Instant::now()).is_err());
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    assert!(m.reserve(&[Hop { node: 1, path: Path::NetOut }], 1, Instant::now()).is_err());
}

fn rustix_uid() -> u32 {
    rustix::process::geteuid().as_raw()
}

/// The child half of `links_are_shared_between_processes`: reserves 1 ms on node 0's network
/// out link at the instant the parent passed (as CLOCK_MONOTONIC nanoseconds).
#[test]
fn child_reserves() {
    let (Ok(dir), Ok(_)) = (std::env::var("LINK_TEST_DIR"), std::env::var("LINK_TEST_CHILD")) else { return };
    let m = LinkModel::in_dir(Profile::prism(), dir, "shared").unwrap();
    m.reserve(&[hop(Path::NetOut)], 6_000_000, Instant::now()).unwrap();
}

#[test]
fn links_are_shared_between_processes() {
    let dir = tempfile::tempdir().unwrap();
    let m = LinkModel::in_dir(Profile::prism(), dir.path(), "shared").unwrap();
    // Use the node's links first, as the processes of a job do before any of them finishes:
    // the last process to let go of a node's file removes it.
    m.reserve(&[hop(Path::NetOut)], 0, Instant::now()).unwrap();
    let now = Instant::now();
    // The child takes the link for 1 ms from its own now (after ours).
    let status = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_reserves", "--nocapture", "--test-threads=1"])
        .env("LINK_TEST_DIR", dir.path())
        .env("LINK_TEST_CHILD", "1")
        .status()
        .unwrap();
    assert!(status.success());
    // Our transfer from `now` (before the child's) queues behind the child's: at least 2 ms of
    // occupancy in all, as one process alone would give 1 ms.
    let d = m.reserve(&[hop(Path::NetOut)], 6_000_000, now).unwrap() - now;
    assert!(d >= Duration::from_millis(2), "{d:?}");
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1, "the parent still uses the file");
    drop(m);
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "the last user removed it");
}
