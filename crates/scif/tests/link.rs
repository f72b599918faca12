//! The SCIF provider's DMA paced by the link model: a write from the host completes at the
//! model's host→device time and takes that link only.

use polyrail_link::{LinkModel, Path, Profile};
use polyrail_scif::*;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[test]
fn scif_writes_complete_at_the_models_time() {
    let dir = tempfile::tempdir().unwrap();
    // 6.9 MB/s over PCIe: 1 MiB takes about 152 ms of model time.
    let model = Arc::new(LinkModel::in_dir(Profile::parse("prism/1000").unwrap(), dir.path(), "s1").unwrap());
    let pacer: Arc<dyn Pacer> = Arc::new(ScifPacer::new(model.clone(), 0));
    let fa = Fabric::new(FabricConfig::new(dir.path(), "s1", 0, 2).pacer(pacer.clone())).unwrap();
    let fb = Fabric::new(FabricConfig::new(dir.path(), "s1", 1, 2).pacer(pacer)).unwrap();
    let mut l = fa.open().unwrap();
    let port = l.bind(0).unwrap();
    l.listen(4).unwrap();
    let fb2 = fb.clone();
    let t = std::thread::spawn(move || {
        let mut e = fb2.open().unwrap();
        e.connect(PortId::new(0, port)).unwrap();
        e
    });
    let (_, a) = l.accept(AcceptFlags::SYNC).unwrap();
    let b = t.join().unwrap();
    let len = 1 << 20;
    let (ma, mb) = (Memory::new(len).unwrap(), Memory::new(len).unwrap());
    let rw = Prot::READ | Prot::WRITE;
    let la = a.register(&ma, 0, len, 0, rw, MapFlags::NONE).unwrap();
    let rb = b.register(&mb, 0, len, 0, rw, MapFlags::NONE).unwrap();
    let t0 = Instant::now();
    a.writeto(la, len, rb, RmaFlags::NONE).unwrap();
    let mark = a.fence_mark(FenceFlags::INIT_SELF).unwrap();
    a.fence_wait(mark).unwrap();
    let model_time = Duration::from_nanos((len as f64 / 6.9e6 * 1e9) as u64);
    assert!(t0.elapsed() >= model_time, "{:?} < {model_time:?}", t0.elapsed());
    assert!(model.busy_until(0, Path::HostToDevice).unwrap().unwrap() >= t0 + model_time);
    assert!(model.busy_until(0, Path::DeviceToHost).unwrap().unwrap() < t0);
    let s = model.stats();
    assert_eq!((s.paced, s.delayed), (1, 1));
    model.remove_files();
}
