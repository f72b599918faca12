//! Helpers of the tests: fabrics in a temporary directory, connected pairs.
#![allow(dead_code)]

use polyrail_scif::*;
use std::path::Path;
use std::sync::Arc;

/// Node 0 (host) and node 1 (a device) of one job under `dir`.
pub fn fabrics(dir: &Path, mode: DmaMode) -> (Fabric, Fabric) {
    let a = Fabric::new(FabricConfig::new(dir, "t1", 0, 2).dma(mode)).unwrap();
    let b = Fabric::new(FabricConfig::new(dir, "t1", 1, 2).dma(mode)).unwrap();
    (a, b)
}

/// The same with a pacer on both.
pub fn paced(dir: &Path, pacer: Arc<dyn Pacer>) -> (Fabric, Fabric) {
    let a = Fabric::new(FabricConfig::new(dir, "t1", 0, 2).pacer(pacer.clone())).unwrap();
    let b = Fabric::new(FabricConfig::new(dir, "t1", 1, 2).pacer(pacer)).unwrap();
    (a, b)
}

/// A connected pair: the first accepted on node of `a`, the second connected from node of `b`.
pub fn pair(a: &Fabric, b: &Fabric) -> (Endpoint, Endpoint) {
    let mut l = a.open().unwrap();
    let port = l.bind(0).unwrap();
    l.listen(4).unwrap();
    let b = b.clone();
    let node = a.node();
    let t = std::thread::spawn(move || {
        let mut e = b.open().unwrap();
        e.connect(PortId::new(node, port)).unwrap();
        e
    });
    let (_, acc) = l.accept(AcceptFlags::SYNC).unwrap();
    (acc, t.join().unwrap())
}

/// Memory of `pages` pages, each byte `seed + index`.
pub fn patterned(pages: usize, seed: u8) -> Memory {
    let len = pages * page_size();
    let m = Memory::new(len).unwrap();
    let bytes: Vec<u8> = (0..len).map(|i| seed.wrapping_add(i as u8)).collect();
    m.write(0, &bytes);
    m
}

/// The bytes of `m` in `[off, off + len)`.
pub fn bytes(m: &Memory, off: usize, len: usize) -> Vec<u8> {
    let mut v = vec![0; len];
    m.read(off, &mut v);
    v
}

/// Whether `dir` holds no entry (or is gone).
pub fn empty_or_gone(dir: &Path) -> bool {
    std::fs::read_dir(dir).map_or(true, |mut d| d.next().is_none())
}
