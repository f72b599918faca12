//! Writes the seed corpora under `fuzz/corpus/<target>/`: addresses and keys published by live
//! channels (shm, cma, ib over the software provider), headers, ring records, blocks, split
//! entries, scif ring frames and PMI messages from the crates' own encoders, and scripts that
//! drive the engine, the rings and the PMI server through an ordinary exchange. Run from `fuzz/`:
//! `cargo +nightly run --example seeds`.

use std::fs;
use std::path::Path;

use polyrail_core::config::ClassSizes;
use polyrail_shm::settings::format_tuning;
use polyrail_core::policy::topology::TopoClass;
use polyrail_core::{Config, Header, Lifetime, OneSided, PacketKind, PeerAccess, Region, Transport};
use polyrail_pmi::wire::Msg;

fn write(target: &str, name: &str, bytes: &[u8]) {
    let dir = Path::new("corpus").join(target);
    fs::create_dir_all(&dir).expect("corpus directory");
    fs::write(dir.join(name), bytes).expect("seed written");
}

fn wire(h: &Header) -> Vec<u8> {
    let mut w = [0u8; Header::WIRE_LEN];
    h.encode(&mut w);
    w.to_vec()
}

/// A header of every kind, with the fields the engine fills for it.
fn headers() -> Vec<Header> {
    let base = Header { ctx: 0, tag: 1, seq: 0, len: 8, ..Header::new(PacketKind::Eager) };
    vec![
        base,
        Header { len: 300, ..base },
        Header { kind: PacketKind::Frag, len: 300, offset: 100, ..base },
        Header { kind: PacketKind::Rts, len: 4000, sreq: 1, ..base },
        Header { kind: PacketKind::Rts, flags: Header::STREAM, len: 9000, sreq: 2, ..base },
        Header { kind: PacketKind::Cts, len: 4000, sreq: 1, rreq: 1, offset: 4000, ..base },
        Header { kind: PacketKind::Data, flags: Header::STREAM, len: 9000, rreq: 1, offset: 100, ..base },
        Header { kind: PacketKind::Fin, len: 4000, sreq: 1, rreq: 1, ..base },
        Header { kind: PacketKind::Fin, flags: Header::TRUNCATED, sreq: 1, rreq: 1, ..base },
        Header { kind: PacketKind::Rtr, flags: Header::ANY_TAG, len: 8192, rreq: 1, ..base },
        Header { kind: PacketKind::Skew, offset: 1, ..base },
        Header { kind: PacketKind::Withdraw, rreq: 1, ..base },
        Header { kind: PacketKind::Withdrawn, flags: Header::ANSWER, rreq: 1, offset: 1, ..base },
    ]
}

fn main() {
    for (i, h) in headers().iter().enumerate() {
        write("header", &format!("{i:02}-{:?}", h.kind), &wire(h));
    }

    // Engine scripts (see fuzz_targets/engine.rs): op 0 posts a receive (source, tag, ctx,
    // length), op 1 a send (peer, tag, ctx, length), op 2 a packet (mode: sender in the low
    // bits, 0 = header built from the next bytes with the next sequence id), op 4 plays the
    // actions, op 6 takes the results.
    let recv = |src: u8, len: u16| [&[0u8, src, 0, 0][..], &len.to_le_bytes()].concat();
    let send = |to: u8, len: u16| [&[1u8, to, 0, 0][..], &len.to_le_bytes()].concat();
    // A structured header: kind index, flags, ctx/tag byte, seq byte, length selector and
    // length, sreq, rreq, offset selector and offset; then the payload length.
    let packet = |from: u8, kind: u8, flags: u8, len: u16, sreq: u8, rreq: u8, offset: u16, plen: u8| {
        let mut p = vec![2u8, from, kind, flags, 0, 0, 255];
        p.extend_from_slice(&len.to_le_bytes());
        p.extend_from_slice(&[sreq, rreq, 1]);
        p.extend_from_slice(&offset.to_le_bytes());
        p.push(plen);
        p.extend(std::iter::repeat_n(0x5a, plen as usize));
        p
    };
    let scripts: Vec<(&str, Vec<u8>)> = vec![
        ("eager", [recv(1, 64), packet(1, 0, 0, 8, 0, 0, 0, 8), vec![4, 6]].concat()),
        ("unexpected-eager", [packet(2, 0, 0, 8, 0, 0, 0, 8), recv(2, 64), vec![4, 6]].concat()),
        (
            "fragments",
            [recv(1, 300), packet(1, 0, 0, 300, 0, 0, 0, 100), packet(1, 1, 0, 300, 0, 0, 100, 100), vec![4, 6]]
                .concat(),
        ),
        ("rts-get", [recv(1, 4000), packet(1, 2, 0, 4000, 1, 0, 0, 8), vec![4, 4, 6]].concat()),
        (
            "rts-stream",
            [
                recv(2, 9000),
                packet(2, 2, 2, 9000, 1, 0, 0, 0),
                vec![4],
                packet(2, 4, 2, 9000, 1, 1, 0, 100),
                vec![4, 6],
            ]
            .concat(),
        ),
        (
            "send-cts-fin",
            [
                send(1, 4000),
                vec![4],
                packet(1, 3, 0, 4000, 1, 1, 4000, 8),
                packet(1, 5, 0, 4000, 1, 1, 0, 0),
                vec![4, 6],
            ]
            .concat(),
        ),
        ("rtr", [packet(1, 6, 1, 8192, 0, 1, 0, 8), send(1, 2000), vec![4, 6]].concat()),
        ("withdraw", [recv(1, 64), vec![4, 5, 0], packet(1, 9, 8, 0, 0, 1, 0, 0), vec![4, 6]].concat()),
    ];
    for (name, s) in &scripts {
        write("engine", name, s);
    }

    let sizes = ClassSizes {
        all: None,
        per_class: vec![(TopoClass::SharedL3, 16 << 10), (TopoClass::Socket, 4096), (TopoClass::CrossSocket, 1000)],
    };
    for (name, bytes) in polyrail_scif::fuzzing::sample_records() {
        write("scif_record", name, &bytes);
    }
    write("tuning", "three-classes", format_tuning("measured by polyrail tune", &sizes).as_bytes());
    write("tuning", "one-class", b"# tuned\ncma_threshold shared-l2 64k\n\n");

    // Ring scripts (see fuzz_targets/shm_ring.rs): op 0 pushes a message (header bytes as the
    // engine script's, payload length, payload), op 1 a compact one, op 2 one in a cell, op 3
    // takes, op 5 idles or loads the read position, op 6 scribbles.
    let hdr_bytes = |kind: u8, len: u16| {
        let mut b = vec![kind, 0, 0, 0, 255];
        b.extend_from_slice(&len.to_le_bytes());
        b.extend_from_slice(&[0, 0, 1, 0, 0]);
        b
    };
    let push = |kind: u8, len: u16, plen: u16| {
        [vec![0u8], hdr_bytes(kind, len), plen.to_le_bytes().to_vec(), vec![0x33; plen as usize]].concat()
    };
    let compact = |plen: u8| [vec![1u8, 0, 0, 7, 0, 0, 0, 1, 0, 0, 0, plen], vec![0x44; plen as usize]].concat();
    let ring_scripts: Vec<(&str, Vec<u8>)> = vec![
        ("inline", [compact(8), vec![3], compact(100), vec![3, 5, 0]].concat()),
        ("body", [push(0, 200, 200), vec![3], push(3, 9000, 64), vec![3, 5, 1]].concat()),
        ("cell", [vec![2u8], hdr_bytes(2, 9000), 9000u32.to_le_bytes().to_vec(), vec![3, 0, 0, 0, 1, 3]].concat()),
        (
            "full-then-scribble",
            [
                (0..20).flat_map(|_| [compact(16), vec![3]].concat()).collect(),
                vec![5, 1, 6, 0x80, 0, 8],
                vec![0xff; 8],
                vec![3],
            ]
            .concat(),
        ),
    ];
    for (name, s) in &ring_scripts {
        write("shm_ring", name, s);
    }

    // scif ring scripts (see fuzz_targets/scif_ring.rs): the capacity (u16: 63 is 512 bytes,
    // 31 256), the starting position (u64), then op 0 writes a frame (header bytes as the
    // engine script's, payload length u16, payload), op 2 reads (budget u8, 255 for all), op 4
    // writes bytes into the ring (offset u16, length u16, bytes), op 5 sets the reader's tail
    // (mode 1: a u16 distance after its head), op 6 the writer's head (mode 2: a u16 distance
    // after its tail).
    let ring_start = |cap_raw: u16, start: u64| [cap_raw.to_le_bytes().to_vec(), start.to_le_bytes().to_vec()].concat();
    let ring_send =
        |len: u16| [vec![0u8], hdr_bytes(0, len), len.to_le_bytes().to_vec(), vec![0x5c; len as usize]].concat();
    let ring_read = |budget: u8| vec![2u8, budget];
    let scif_scripts: Vec<(&str, Vec<u8>)> = vec![
        ("small", [ring_start(63, 0), ring_send(0), ring_send(3), ring_send(40), ring_read(255)].concat()),
        (
            "wrap",
            [ring_start(31, 0), (0..6).flat_map(|_| [ring_send(100), ring_read(255)].concat()).collect()].concat(),
        ),
        (
            "full",
            [
                ring_start(63, 0),
                (0..5).flat_map(|_| ring_send(80)).collect(),
                ring_read(2),
                ring_send(80),
                ring_read(255),
            ]
            .concat(),
        ),
        ("forged-head", [ring_start(63, 0), ring_send(8), vec![6, 2, 64, 0], ring_send(8)].concat()),
    ];
    for (name, s) in &scif_scripts {
        write("scif_ring", name, s);
    }
    // Rings the channel's writer filled, loaded whole (op 4) and read with the tail it left.
    for (name, bytes, head, tail) in polyrail_scif::fuzzing::sample_rings() {
        let load = [vec![4u8, 0, 0], (bytes.len() as u16).to_le_bytes().to_vec(), bytes].concat();
        let tail = [vec![5u8, 1], ((tail - head) as u16).to_le_bytes().to_vec()].concat();
        write("scif_ring", &format!("ring-{name}"), &[ring_start(63, head), load, tail, ring_read(255)].concat());
    }

    // Addresses and keys published by live channels.
    let buf = vec![0u8; 4096];
    let region = Region { ptr: buf.as_ptr(), len: buf.len() };
    match polyrail_shm::ShmTransport::new(&Config::default(), "seeds", 0, 2) {
        Ok(shm) => write("seg_address", "live", &shm.address()),
        Err(e) => eprintln!("no shm segment here ({e}): seg_address keeps its other seeds"),
    }
    let mut cma = polyrail_shm::CmaTransport::new();
    write("cma_address", "live", &cma.address());
    match cma.register(region, PeerAccess::Read, Lifetime::Transfer) {
        Ok(handle) => {
            let key = handle.key();
            write("pid_key", "cma-read", &[&[0u8; 16][..], &[key.as_bytes().len() as u8], key.as_bytes()].concat())
        }
        Err(e) => eprintln!("cma exposes nothing here ({e})"),
    }
    let mut ib = polyrail_ib::DirectIb::new(polyrail_ib::SoftProvider::new(), &Default::default(), 0, 2)
        .expect("a DirectIb over the software provider");
    write("ib_address", "soft", &ib.address());
    let handle = ib.register(region, PeerAccess::Write, Lifetime::Transfer).expect("an ib registration");
    write("ib_key", "soft", handle.key().as_bytes());
    ib.deregister(&handle, 0..0);

    for (i, h) in headers().iter().enumerate().take(4) {
        let payload = vec![0x77u8; (h.len as usize).min(100)];
        write("ib_block", &format!("data-{i}"), &polyrail_ib::fuzzing::encode_data_block(i as u64, 3, h, &payload));
    }
    let sync = polyrail_ib::fuzzing::word0(2, 0, 5).expect("sync");
    write("ib_block", "sync", &[sync.to_le_bytes(), 9u64.to_le_bytes()].concat());
    for (len, credits) in [(1024usize, 63usize), (4032, 1), (8128, 4095)] {
        let imm = polyrail_ib::fuzzing::compact_imm(len, credits);
        write("ib_compact", &format!("{len}-{credits}"), &[imm.to_le_bytes(), 8128u32.to_le_bytes()].concat());
    }

    for (name, (color, key, next)) in [("no-color", (None, 3, 65535)), ("color", (Some(1), 0, 65534))] {
        write("split_entry", name, &polyrail::fuzzing::encode_split_entry(color, key, next));
    }

    // PMI: what the clients and the server say in an ordinary job.
    let v1 = [
        Msg::new("init").with("pmi_version", 1).with("pmi_subversion", 1),
        Msg::new("response_to_init").with("pmi_version", 1).with("pmi_subversion", 1).with("rc", 0),
        Msg::new("get_maxes"),
        Msg::new("put").with("kvsname", "kvs_1").with("key", "polyrail-ib-0").with("value", "0a1b2c"),
        Msg::new("barrier_in"),
        Msg::new("get_result").with("rc", -1).with("msg", "key polyrail-ib-1 not found"),
        Msg::new("abort").with("exitcode", 3).with("message", "a rank gave up"),
    ];
    for (i, m) in v1.iter().enumerate() {
        write("pmi1_wire", &format!("{i:02}-{}", m.cmd), &m.encode_v1());
    }
    write("pmi1_wire", "hydra-free-text", b"cmd=put_result rc=1 msg=Keys with PMI_ prefix are reserved\n");
    let v2 = [
        Msg::new("fullinit").with("pmirank", 0).with("pmijobid", "job").with("threaded", "FALSE"),
        Msg::new("kvs-put").with("key", "k0").with("value", "a;b"),
        Msg::new("kvs-fence").with("thrid", "0x1"),
        Msg::new("kvs-get").with("jobid", "job").with("srcid", -1).with("key", "k0"),
        Msg::new("info-getjobattr").with("key", "PMI_process_mapping"),
    ];
    for (i, m) in v2.iter().enumerate() {
        write("pmi2_wire", &format!("{i:02}-{}", m.cmd), &m.encode_v2().expect("small"));
    }
    let both: Vec<u8> = v2.iter().flat_map(|m| m.encode_v2().expect("small")).collect();
    write("pmi2_wire", "stream", &both);

    // The server: [rank, length, bytes] chunks; a PMI-1 job of three through a fence, and a
    // PMI-2 one.
    let chunk = |rank: u8, m: &[u8]| [&[rank, m.len() as u8][..], m].concat();
    let mut job1 = Vec::new();
    for r in 0..3u8 {
        job1.extend(chunk(r, &v1[0].encode_v1()));
        let put = Msg::new("put").with("kvsname", "fuzzjob").with("key", format!("k{r}")).with("value", r);
        job1.extend(chunk(r, &put.encode_v1()));
    }
    for r in 0..3u8 {
        job1.extend(chunk(r, &v1[4].encode_v1()));
    }
    job1.extend(chunk(1, &Msg::new("get").with("kvsname", "fuzzjob").with("key", "k2").encode_v1()));
    job1.extend(chunk(2, &Msg::new("finalize").encode_v1()));
    write("pmi_server", "pmi1-job", &job1);
    let mut job2 = Vec::new();
    for r in 0..3u8 {
        job2.extend(chunk(r, &Msg::new("fullinit").with("pmirank", r).encode_v2().expect("small")));
        job2.extend(chunk(r, &v2[1].encode_v2().expect("small")));
        job2.extend(chunk(r, &v2[2].encode_v2().expect("small")));
    }
    job2.extend(chunk(0, &v2[3].encode_v2().expect("small")));
    write("pmi_server", "pmi2-job", &job2);
}
