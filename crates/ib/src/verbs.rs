//! [`VerbsProvider`]: real InfiniBand / RoCE verbs through rdma-core (cargo feature `verbs`).
//!
//! One provider owns, for one device port: a device context, a protection domain, one
//! completion queue shared by every queue pair, reliable-connected queue pairs and the memory
//! registrations of its user. It gives the semantics of the [`SoftProvider`](crate::SoftProvider)
//! with the HCA doing the work: keys, bounds and access rights of RDMA writes and reads are
//! checked by the responder's device, a violation ends as a [`WcStatus::RemoteAccess`]
//! completion and puts both queue pairs in the error state, and later requests on a failed queue
//! pair complete as [`WcStatus::Flushed`].
//!
//! # Bindings
//!
//! Everything goes through the raw `ibverbs-sys` bindings (rdma-core's `verbs.h`), behind the
//! safe methods of this type. The `ibverbs` crate (0.9.2) was considered: it keeps its raw
//! `ibv_context`, `ibv_pd`, `ibv_cq` and `ibv_qp` pointers private, ties every object to its
//! context by a borrow (so they cannot live together in one owned provider without
//! self-references), queries port 1 only, and lacks RDMA write and read, inline data, access
//! flags, registration of memory the caller owns and `lkey`, all of which DirectIB needs. Since
//! none of its objects can be combined with raw calls, it is not used at all.
//!
//! The `static inline` verbs of `verbs.h` (`ibv_post_send`, `ibv_post_recv`, `ibv_poll_cq`) are not symbols of
//! `libibverbs.so`; like those inlines, this module calls the provider's functions from the
//! context's `ops` table.
//!
//! # Addressing
//!
//! [`Provider::endpoint`] is 28 bytes, little endian where not said otherwise:
//!
//! ```text
//! 0..4    magic b"PRVB"
//! 4..20   GID at the configured GID index (16 bytes, network order, as in ibv_gid.raw)
//! 20..22  LID (u16; 0 on RoCE)
//! 22      active MTU of the port (ibv_mtu: 1 = 256 B ... 5 = 4096 B)
//! 23      link layer (1 = InfiniBand, 2 = Ethernet / RoCE)
//! 24..28  packet sequence number (u32, 24 bits): the first PSN of every queue pair this
//!         provider sends on; the peer's queue pairs expect it
//! ```
//!
//! [`Provider::connect`] moves a queue pair INIT → RTR → RTS with path MTU = the smaller of both
//! ports' MTUs, the remote GID in a GRH (global route header) when the link layer is Ethernet
//! (RoCE) or the peer has no LID, ack timeout 14 (4.096 µs × 2^14 ≈ 67 ms: Soft-RoCE under
//! emulation is slow to answer), retry count 7 and RNR retry 6 (see `RNR_RETRY`). On Soft-RoCE (vendor id
//! 0xffffff) the retry count is 6: rdma_rxe treats 7 as "retry forever" (as the specification
//! does for RNR retries only), so a peer that is gone would never end in
//! [`WcStatus::RetryExceeded`]; with 6 it does after about 7 × 67 ms.
//!
//! # Limits and choices
//!
//! - Every queue pair has the same send queue depth (at most 256 work requests, fewer if the
//!   device says so) and inline size: a probe queue pair created at [`VerbsProvider::open`]
//!   finds what the device grants, so [`Provider::max_inline`] and
//!   [`Provider::max_outstanding`] hold from the start. [`Provider::post`] refuses (`Err`) a
//!   request when the queue pair has that many requests whose completions were not polled yet,
//!   and the completion queue grows (`ibv_resize_cq`) with the queue pairs' send and receive
//!   depths, so it can never overflow. Receives carry no buffer: they are for writes with
//!   immediate only.
//! - Verbs require local write access with remote write access, so a registration with
//!   [`Access::REMOTE_WRITE`] also gets `IBV_ACCESS_LOCAL_WRITE`.
//! - A request longer than the port's `max_msg_sz` ([`Provider::max_transfer`]) is refused at
//!   [`Provider::post`] rather than completing with a length error.

use crate::provider::{Access, Completion, MemoryRegion, Opcode, Provider, QpId, WcStatus, WorkRequest};
use crate::settings::IbSettings;
use crate::Unavailable;
use ibverbs_sys as ffi;
use polyrail_core::{Error, Result};
use std::collections::HashMap;
use std::ffi::CStr;
use std::io;
use std::os::raw::c_int;
use std::ptr;

/// Magic at the start of an endpoint: `b"PRVB"`.
const ENDPOINT_MAGIC: u32 = u32::from_le_bytes(*b"PRVB");
/// Bytes of an endpoint.
const ENDPOINT_LEN: usize = 28;
/// Send queue depth asked for each queue pair.
const SEND_DEPTH: u32 = 256;
/// Inline sizes tried, largest first, until the device accepts one.
const INLINE_WANTED: [u32; 6] = [512, 256, 128, 64, 32, 0];
/// RDMA reads in flight per queue pair, as initiator and as responder (capped by the device).
const RD_ATOMIC: u8 = 16;
/// Transport retries before `IBV_WC_RETRY_EXC_ERR`.
const RETRY_CNT: u8 = 7;
/// Transport retries on Soft-RoCE, which (unlike the specification and hardware) treats a
/// retry count of 7 as "retry forever", as for RNR retries: a peer that is gone would never be
/// noticed.
const RETRY_CNT_RXE: u8 = 6;
/// `vendor_id` of Soft-RoCE (rdma_rxe) devices.
const RXE_VENDOR_ID: u32 = 0xff_ffff;
/// `vendor_id` of soft iWARP (siw) devices.
const SIW_VENDOR_ID: u32 = 0x62_6d74;
/// Receiver-not-ready retries. DirectIB keeps a receive posted for every write with immediate
/// a peer may make, so a receiver-not-ready NAK means a broken peer: 6 fails the request after
/// a few timer periods (7 would retry without limit).
const RNR_RETRY: u8 = 6;
/// Receiver-not-ready NAK timer (12 ≈ 0.64 ms).
const MIN_RNR_TIMER: u8 = 12;
/// Hop limit of the GRH (RoCE v2 routes by it like an IP TTL).
const HOP_LIMIT: u8 = 64;
/// Completion queue entries per queue pair the first completion queue holds room for.
const CQ_INITIAL_QPS: u32 = 16;
/// Completions read per `poll_cq` call.
const POLL_BATCH: usize = 64;
/// `ibv_port_attr.link_layer` of Ethernet (RoCE).
const LINK_LAYER_ETHERNET: u8 = ffi::IBV_LINK_LAYER_ETHERNET as u8;

/// `poll_cq` of the device's context ops.
type PollCq = unsafe extern "C" fn(*mut ffi::ibv_cq, c_int, *mut ffi::ibv_wc) -> c_int;
/// `post_send` of the device's context ops.
type PostSend = unsafe extern "C" fn(*mut ffi::ibv_qp, *mut ffi::ibv_send_wr, *mut *mut ffi::ibv_send_wr) -> c_int;
/// `post_recv` of the device's context ops.
type PostRecv = unsafe extern "C" fn(*mut ffi::ibv_qp, *mut ffi::ibv_recv_wr, *mut *mut ffi::ibv_recv_wr) -> c_int;

fn transport(what: String) -> Error {
    Error::Transport { kind: "ib", what }
}

/// The error a verb returned: its return value when positive (rdma-core returns errno values),
/// else `errno`.
fn verb_error(rc: c_int) -> io::Error {
    if rc > 0 {
        io::Error::from_raw_os_error(rc)
    } else {
        io::Error::last_os_error()
    }
}

/// Bytes of an `ibv_mtu`.
fn mtu_bytes(mtu: ffi::ibv_mtu) -> usize {
    if (1..=5).contains(&mtu) {
        128 << mtu
    } else {
        0
    }
}

/// What a peer publishes. See the module documentation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Endpoint {
    gid: [u8; 16],
    lid: u16,
    mtu: ffi::ibv_mtu,
    link_layer: u8,
    psn: u32,
}

impl Endpoint {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut e = Vec::with_capacity(ENDPOINT_LEN);
        e.extend_from_slice(&ENDPOINT_MAGIC.to_le_bytes());
        e.extend_from_slice(&self.gid);
        e.extend_from_slice(&self.lid.to_le_bytes());
        e.push(self.mtu as u8);
        e.push(self.link_layer);
        e.extend_from_slice(&self.psn.to_le_bytes());
        e
    }

    pub(crate) fn parse(b: &[u8]) -> Result<Endpoint> {
        if b.len() != ENDPOINT_LEN || b[..4] != ENDPOINT_MAGIC.to_le_bytes() {
            return Err(transport(format!(
                "verbs provider: not a verbs endpoint ({} bytes); every process must use the same POLYRAIL_IB_PROVIDER",
                b.len()
            )));
        }
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&b[4..20]);
        let e = Endpoint {
            gid,
            lid: u16::from_le_bytes([b[20], b[21]]),
            mtu: b[22] as ffi::ibv_mtu,
            link_layer: b[23],
            psn: u32::from_le_bytes([b[24], b[25], b[26], b[27]]),
        };
        if mtu_bytes(e.mtu) == 0 {
            return Err(transport(format!("verbs provider: peer endpoint names MTU code {}", e.mtu)));
        }
        Ok(e)
    }
}

/// One queue pair.
#[derive(Debug)]
struct Qp {
    qp: *mut ffi::ibv_qp,
    num: u32,
    /// Ready to receive (the peer's requests land).
    connected: bool,
    /// Ready to send (moved there on first use).
    sending: bool,
    /// Posted requests whose completions were not polled yet.
    outstanding: u32,
}

/// The device list of rdma-core, freed on drop.
struct DeviceList {
    list: *mut *mut ffi::ibv_device,
    len: usize,
}

impl DeviceList {
    /// The devices, or why there are none.
    fn get() -> std::result::Result<DeviceList, String> {
        let mut n: c_int = 0;
        // SAFETY: `n` is a valid out-pointer; the result is checked for null.
        let list = unsafe { ffi::ibv_get_device_list(&mut n) };
        if list.is_null() {
            let e = io::Error::last_os_error();
            let why = if e.raw_os_error() == Some(libc::ENOSYS) {
                "the kernel has no RDMA (InfiniBand verbs) support".to_string()
            } else {
                format!("ibv_get_device_list: {e}")
            };
            return Err(format!("no RDMA device ({why})"));
        }
        let devices = DeviceList { list, len: n.max(0) as usize };
        if devices.len == 0 {
            return Err(
                "no RDMA device (rdma-core found none; for Soft-RoCE: `rdma link add rxe0 type rxe netdev IFACE`)"
                    .into(),
            );
        }
        Ok(devices)
    }

    fn device(&self, i: usize) -> *mut ffi::ibv_device {
        assert!(i < self.len);
        // SAFETY: `list` holds `len` device pointers (ibv_get_device_list's contract).
        unsafe { *self.list.add(i) }
    }

    fn name(&self, i: usize) -> String {
        // SAFETY: a device of the list; the name is a NUL-terminated string owned by the device
        // (or null, checked).
        unsafe {
            let p = ffi::ibv_get_device_name(self.device(i));
            if p.is_null() {
                format!("device{i}")
            } else {
                CStr::from_ptr(p).to_string_lossy().into_owned()
            }
        }
    }
}

impl Drop for DeviceList {
    fn drop(&mut self) {
        // SAFETY: the list from ibv_get_device_list, freed once; contexts opened from it stay
        // valid (rdma-core's contract).
        unsafe { ffi::ibv_free_device_list(self.list) };
    }
}

/// The real-verbs provider (`POLYRAIL_IB_PROVIDER=verbs`). See the module documentation.
pub struct VerbsProvider {
    ctx: *mut ffi::ibv_context,
    pd: *mut ffi::ibv_pd,
    cq: *mut ffi::ibv_cq,
    poll_cq: Option<PollCq>,
    post_send: Option<PostSend>,
    post_recv: Option<PostRecv>,
    /// Completion queue entries the queue pairs made so far can fill (send and receive depths).
    cq_need: u64,
    device: String,
    port: u8,
    gid_index: u8,
    local: Endpoint,
    /// The port's `max_msg_sz`.
    max_msg: usize,
    /// Send queue depth and inline size every queue pair has.
    depth: u32,
    inline: u32,
    rd_atomic: u8,
    /// Local ack timeout exponent (`POLYRAIL_IB_ACK_TIMEOUT`).
    ack_timeout: u8,
    retry_cnt: u8,
    /// A software device (Soft-RoCE, siw): the host CPUs make the RDMA copies.
    software: bool,
    max_cqe: c_int,
    qps: Vec<Qp>,
    by_num: HashMap<u32, QpId>,
    /// Registrations by handle; null when free.
    mrs: Vec<*mut ffi::ibv_mr>,
    free_mrs: Vec<usize>,
    wc: Vec<ffi::ibv_wc>,
}

// SAFETY: the provider owns every verbs object it points to and hands none out; libibverbs
// objects may be used from any thread (the library and its providers lock internally), and the
// provider is used by one thread at a time (`&mut self`).
unsafe impl Send for VerbsProvider {}

impl std::fmt::Debug for VerbsProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerbsProvider")
            .field("device", &self.device)
            .field("port", &self.port)
            .field("gid_index", &self.gid_index)
            .field("qps", &self.qps.len())
            .finish()
    }
}

impl VerbsProvider {
    /// Opens the device and port `settings.device` names (default: the first device, port 1)
    /// with GID index `settings.gid_index`. `Ok(Err(_))` when this machine has no RDMA device;
    /// `Err` when the named device does not exist, its port is not ACTIVE, the GID index is
    /// empty, or setting up the protection domain, completion queue or a queue pair fails.
    pub fn open(settings: &IbSettings) -> Result<std::result::Result<VerbsProvider, Unavailable>> {
        let devices = match DeviceList::get() {
            Ok(d) => d,
            Err(why) => return Ok(Err(Unavailable(why))),
        };
        let names: Vec<String> = (0..devices.len).map(|i| devices.name(i)).collect();
        let (index, port) = match &settings.device {
            None => (0, 1),
            Some((name, port)) => match names.iter().position(|n| n == name) {
                Some(i) => (i, *port),
                None => {
                    return Err(transport(format!(
                        "RDMA device {name} (POLYRAIL_IB_DEVICE) does not exist; devices here: {}",
                        names.join(", ")
                    )))
                }
            },
        };
        let device = names[index].clone();
        // SAFETY: a device of the live list; the result is checked for null.
        let ctx = unsafe { ffi::ibv_open_device(devices.device(index)) };
        if ctx.is_null() {
            return Err(transport(format!("ibv_open_device({device}): {}", io::Error::last_os_error())));
        }
        drop(devices);
        let mut p = VerbsProvider {
            ctx,
            pd: ptr::null_mut(),
            cq: ptr::null_mut(),
            poll_cq: None,
            post_send: None,
            post_recv: None,
            cq_need: 0,
            device,
            port,
            gid_index: settings.gid_index,
            local: Endpoint { gid: [0; 16], lid: 0, mtu: 0, link_layer: 0, psn: 0 },
            max_msg: 0,
            depth: 0,
            inline: 0,
            rd_atomic: 0,
            ack_timeout: settings.ack_timeout,
            retry_cnt: RETRY_CNT,
            software: false,
            max_cqe: 0,
            qps: Vec::new(),
            by_num: HashMap::new(),
            mrs: Vec::new(),
            free_mrs: Vec::new(),
            wc: vec![ffi::ibv_wc::default(); POLL_BATCH],
        };
        // From here on, Drop releases whatever was set up when a step fails.
        p.setup()?;
        Ok(Ok(p))
    }

    /// Queries device and port, allocates the protection domain and completion queue, and
    /// probes the queue pair capabilities.
    fn setup(&mut self) -> Result<()> {
        let (device, port) = (self.device.clone(), self.port);
        let mut dev = ffi::ibv_device_attr::default();
        // SAFETY: `ctx` is an open context; `dev` is a valid out-structure.
        let rc = unsafe { ffi::ibv_query_device(self.ctx, &mut dev) };
        if rc != 0 {
            return Err(transport(format!("ibv_query_device({device}): {}", verb_error(rc))));
        }
        if port == 0 || port > dev.phys_port_cnt {
            return Err(transport(format!(
                "RDMA device {device} has {} port(s), POLYRAIL_IB_DEVICE names port {port}",
                dev.phys_port_cnt
            )));
        }
        let mut pa = ffi::ibv_port_attr::default();
        // SAFETY: the exported ibv_query_port fills the provider's port attributes, at most
        // sizeof(struct ibv_port_attr) bytes, into our zeroed structure of that type.
        let rc = unsafe { ffi::ibv_query_port(self.ctx, port, (&mut pa as *mut ffi::ibv_port_attr).cast()) };
        if rc != 0 {
            return Err(transport(format!("ibv_query_port({device}, {port}): {}", verb_error(rc))));
        }
        if pa.state != ffi::ibv_port_state::IBV_PORT_ACTIVE {
            // SAFETY: ibv_port_state_str returns a static string for any value.
            let state = unsafe { CStr::from_ptr(ffi::ibv_port_state_str(pa.state)) }.to_string_lossy();
            return Err(transport(format!(
                "port {port} of RDMA device {device} is not ACTIVE (state {state}): is the link up?"
            )));
        }
        if c_int::from(self.gid_index) >= pa.gid_tbl_len {
            return Err(transport(format!(
                "POLYRAIL_IB_GID_INDEX {} is outside the GID table of {device} port {port} ({} entries)",
                self.gid_index, pa.gid_tbl_len
            )));
        }
        let mut gid = ffi::ibv_gid::default();
        // SAFETY: open context, port and index checked above; `gid` is a valid out-union.
        let rc = unsafe { ffi::ibv_query_gid(self.ctx, port, c_int::from(self.gid_index), &mut gid) };
        if rc != 0 {
            return Err(transport(format!("ibv_query_gid({device}, {port}, {}): {}", self.gid_index, verb_error(rc))));
        }
        // SAFETY: every bit pattern of the union is a valid byte array.
        let gid = unsafe { gid.raw };
        if gid == [0; 16] {
            return Err(transport(format!(
                "GID index {} of {device} port {port} is empty (RoCE v2 on Soft-RoCE: POLYRAIL_IB_GID_INDEX=1)",
                self.gid_index
            )));
        }
        let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u32);
        let psn = (t ^ std::process::id().rotate_left(12)).wrapping_mul(2_654_435_761) & 0xff_ffff;
        self.local = Endpoint { gid, lid: pa.lid, mtu: pa.active_mtu, link_layer: pa.link_layer, psn };
        self.max_msg = if pa.max_msg_sz == 0 { 1 << 31 } else { pa.max_msg_sz as usize };
        self.depth = SEND_DEPTH.min(dev.max_qp_wr.max(1) as u32);
        self.rd_atomic =
            RD_ATOMIC.min(dev.max_qp_rd_atom.clamp(1, 255) as u8).min(dev.max_qp_init_rd_atom.clamp(1, 255) as u8);
        self.max_cqe = dev.max_cqe;
        self.retry_cnt = if dev.vendor_id == RXE_VENDOR_ID { RETRY_CNT_RXE } else { RETRY_CNT };
        self.software = matches!(dev.vendor_id, RXE_VENDOR_ID | SIW_VENDOR_ID);

        // SAFETY: open context; the result is checked for null.
        self.pd = unsafe { ffi::ibv_alloc_pd(self.ctx) };
        if self.pd.is_null() {
            return Err(transport(format!("ibv_alloc_pd({device}): {}", io::Error::last_os_error())));
        }
        let cqe = (self.depth * CQ_INITIAL_QPS).min(self.max_cqe.max(1) as u32) as c_int;
        // SAFETY: open context; no completion channel; the result is checked for null.
        self.cq = unsafe { ffi::ibv_create_cq(self.ctx, cqe, ptr::null_mut(), ptr::null_mut(), 0) };
        if self.cq.is_null() {
            return Err(transport(format!("ibv_create_cq({device}, {cqe} entries): {}", io::Error::last_os_error())));
        }
        // SAFETY: `ctx` is an open context: its ops table was filled by the provider.
        let ops = unsafe { &(*self.ctx).ops };
        self.poll_cq = ops.poll_cq;
        self.post_send = ops.post_send;
        self.post_recv = ops.post_recv;
        if self.poll_cq.is_none() || self.post_send.is_none() || self.post_recv.is_none() {
            return Err(transport(format!(
                "the rdma-core provider of {device} has no poll_cq, post_send or post_recv"
            )));
        }

        // Probe: the largest inline size the device grants, and the actual depth.
        let mut last = io::Error::other("no attempt");
        for want in INLINE_WANTED {
            match self.new_qp(want, 1) {
                Ok((qp, cap)) => {
                    // SAFETY: the probe queue pair was just created and is used by nothing.
                    unsafe { ffi::ibv_destroy_qp(qp) };
                    self.inline = cap.max_inline_data;
                    self.depth = self.depth.min(cap.max_send_wr.max(1));
                    return Ok(());
                }
                Err(e) => last = e,
            }
        }
        Err(transport(format!("ibv_create_qp({device}, RC, {} requests): {last}", self.depth)))
    }

    /// Creates an RC queue pair on the shared completion queue with room for `recv_depth`
    /// receives; returns it and its granted capabilities.
    fn new_qp(&self, inline: u32, recv_depth: u32) -> io::Result<(*mut ffi::ibv_qp, ffi::ibv_qp_cap)> {
        let mut init = ffi::ibv_qp_init_attr {
            qp_context: ptr::null_mut(),
            send_cq: self.cq,
            recv_cq: self.cq,
            srq: ptr::null_mut(),
            cap: ffi::ibv_qp_cap {
                max_send_wr: self.depth,
                max_recv_wr: recv_depth.max(1),
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: inline,
            },
            qp_type: ffi::ibv_qp_type::IBV_QPT_RC,
            sq_sig_all: 0,
        };
        // SAFETY: `pd` and `cq` belong to this provider's context; `init` is a valid in/out
        // structure (the device writes the granted capabilities back); the result is checked.
        let qp = unsafe { ffi::ibv_create_qp(self.pd, &mut init) };
        if qp.is_null() {
            return Err(io::Error::last_os_error());
        }
        Ok((qp, init.cap))
    }

    /// `ibv_modify_qp` with a description of the step for errors.
    fn modify(&self, qp: QpId, attr: &mut ffi::ibv_qp_attr, mask: ffi::ibv_qp_attr_mask, step: &str) -> Result<()> {
        // SAFETY: `qps[qp].qp` is a live queue pair of this provider; `attr` is valid for the
        // fields `mask` names.
        let rc = unsafe { ffi::ibv_modify_qp(self.qps[qp].qp, attr, mask.0 as c_int) };
        if rc != 0 {
            return Err(transport(format!(
                "verbs provider: moving queue pair {qp} (number {}) to {step}: {}",
                self.qps[qp].num,
                verb_error(rc)
            )));
        }
        Ok(())
    }

    /// Makes room in the completion queue for `more` completions.
    fn grow_cq(&mut self, more: u64) -> Result<()> {
        let need = self.cq_need + more;
        // SAFETY: `cq` is this provider's live completion queue; `cqe` is its current size.
        let have = unsafe { (*self.cq).cqe } as u64;
        if need <= have {
            self.cq_need = need;
            return Ok(());
        }
        let max = self.max_cqe.max(0) as u64;
        if need > max {
            return Err(transport(format!(
                "verbs provider: {} queue pairs need {need} completion queue entries, {} allows {max}",
                self.qps.len() + 1,
                self.device
            )));
        }
        let size = (need * 2).min(max) as c_int;
        // SAFETY: as above; the device keeps completions already queued.
        let rc = unsafe { ffi::ibv_resize_cq(self.cq, size) };
        if rc != 0 {
            return Err(transport(format!("ibv_resize_cq({}, {size}): {}", self.device, verb_error(rc))));
        }
        self.cq_need = need;
        Ok(())
    }
}

/// Logs a failed release: the caller has nothing else to do about it.
fn warn_failed(what: &str, rc: c_int) {
    if rc != 0 {
        tracing::warn!("{what}: {}", verb_error(rc));
    }
}

impl Drop for VerbsProvider {
    fn drop(&mut self) {
        // Queue pairs, then the completion queue they use, then registrations, then the
        // protection domain they belong to, then the context.
        for q in self.qps.drain(..) {
            // SAFETY: a live queue pair of this provider, destroyed once.
            warn_failed("ibv_destroy_qp", unsafe { ffi::ibv_destroy_qp(q.qp) });
        }
        if !self.cq.is_null() {
            // SAFETY: the completion queue, no longer used by any queue pair, destroyed once.
            warn_failed("ibv_destroy_cq", unsafe { ffi::ibv_destroy_cq(self.cq) });
        }
        for mr in self.mrs.drain(..).filter(|m| !m.is_null()) {
            // SAFETY: a registration of this provider not deregistered yet.
            warn_failed("ibv_dereg_mr", unsafe { ffi::ibv_dereg_mr(mr) });
        }
        if !self.pd.is_null() {
            // SAFETY: the protection domain, with nothing left in it, deallocated once.
            warn_failed("ibv_dealloc_pd", unsafe { ffi::ibv_dealloc_pd(self.pd) });
        }
        // SAFETY: the context opened in `open`, with every object in it destroyed, closed once.
        warn_failed("ibv_close_device", unsafe { ffi::ibv_close_device(self.ctx) });
    }
}

impl Provider for VerbsProvider {
    fn name(&self) -> &'static str {
        "verbs"
    }

    fn describe(&self) -> String {
        let gid = std::net::Ipv6Addr::from(self.local.gid);
        let link = if self.local.link_layer == LINK_LAYER_ETHERNET { "Ethernet (RoCE)" } else { "InfiniBand" };
        format!(
            "rdma-core verbs: device {} port {} ({link}, LID {}), GID index {} = {gid}, MTU {} B, RC queue pairs of {} requests, inline up to {} B, messages up to {} B, ack timeout {} (4.096 us x 2^N), retry count {}",
            self.device,
            self.port,
            self.local.lid,
            self.gid_index,
            mtu_bytes(self.local.mtu),
            self.depth,
            self.inline,
            self.max_msg,
            self.ack_timeout,
            self.retry_cnt
        )
    }

    fn max_inline(&self) -> usize {
        self.inline as usize
    }

    fn max_transfer(&self) -> usize {
        self.max_msg
    }

    /// The port's active MTU (a queue pair's path MTU is the smaller of both ends').
    fn mtu(&self) -> usize {
        mtu_bytes(self.local.mtu).max(256)
    }

    fn cpu_copies(&self) -> bool {
        self.software
    }

    fn max_outstanding(&self) -> usize {
        self.depth as usize
    }

    /// See the module documentation: magic, GID, LID, MTU, link layer, PSN (28 bytes).
    fn endpoint(&self) -> Vec<u8> {
        self.local.encode()
    }

    unsafe fn register(&mut self, addr: *mut u8, len: usize, access: Access) -> Result<MemoryRegion> {
        let mut flags = 0u32;
        if access.contains(Access::LOCAL_WRITE) || access.contains(Access::REMOTE_WRITE) {
            flags |= ffi::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0;
        }
        if access.contains(Access::REMOTE_WRITE) {
            flags |= ffi::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0;
        }
        if access.contains(Access::REMOTE_READ) {
            flags |= ffi::ibv_access_flags::IBV_ACCESS_REMOTE_READ.0;
        }
        // SAFETY: `pd` is this provider's protection domain; the caller keeps `addr..addr+len`
        // valid until `deregister` (this method's contract); the kernel pins and checks the
        // range; the result is checked for null.
        let mr = unsafe { ffi::ibv_reg_mr(self.pd, addr.cast(), len, flags as c_int) };
        if mr.is_null() {
            let e = io::Error::last_os_error();
            let hint = match e.raw_os_error() {
                Some(libc::ENOMEM) | Some(libc::EAGAIN) => " (locked-memory limit: raise `ulimit -l`)",
                Some(libc::EFAULT) => " (not mapped, or read-only memory registered for writing)",
                _ => "",
            };
            return Err(transport(format!("ibv_reg_mr({len} bytes at {addr:p}): {e}{hint}")));
        }
        // SAFETY: `mr` was just returned by ibv_reg_mr and is not shared.
        let (lkey, rkey) = unsafe { ((*mr).lkey, (*mr).rkey) };
        let handle = match self.free_mrs.pop() {
            Some(h) => {
                self.mrs[h] = mr;
                h
            }
            None => {
                self.mrs.push(mr);
                self.mrs.len() - 1
            }
        };
        Ok(MemoryRegion { addr: addr as u64, len, lkey, rkey, handle })
    }

    fn deregister(&mut self, mr: &MemoryRegion) {
        let Some(&raw) = self.mrs.get(mr.handle) else { return };
        if raw.is_null() {
            return;
        }
        // SAFETY: a live registration of this provider.
        let (rkey, addr) = unsafe { ((*raw).rkey, (*raw).addr as u64) };
        if rkey != mr.rkey || addr != mr.addr {
            return;
        }
        // SAFETY: as above; deregistered once (the slot is cleared below).
        warn_failed("ibv_dereg_mr", unsafe { ffi::ibv_dereg_mr(raw) });
        self.mrs[mr.handle] = ptr::null_mut();
        self.free_mrs.push(mr.handle);
    }

    fn create_qp(&mut self, recv_depth: usize) -> Result<(QpId, u32)> {
        let recv_depth = u32::try_from(recv_depth)
            .map_err(|_| Error::InvalidArgument(format!("receive depth {recv_depth} of a queue pair")))?;
        self.grow_cq(self.depth as u64 + recv_depth as u64)?;
        let (qp, cap) = self.new_qp(self.inline, recv_depth).map_err(|e| {
            transport(format!(
                "ibv_create_qp({}, RC, {} requests, {recv_depth} receives): {e}",
                self.device, self.depth
            ))
        })?;
        // SAFETY: a live queue pair just created.
        let num = unsafe { (*qp).qp_num };
        let id = self.qps.len();
        self.qps.push(Qp { qp, num, connected: false, sending: false, outstanding: 0 });
        self.by_num.insert(num, id);
        if cap.max_send_wr < self.depth || cap.max_inline_data < self.inline || cap.max_recv_wr < recv_depth {
            return Err(transport(format!(
                "ibv_create_qp({}) granted {} requests, {} receives and {} B inline, asked for {}, {recv_depth} and {} B",
                self.device, cap.max_send_wr, cap.max_recv_wr, cap.max_inline_data, self.depth, self.inline
            )));
        }
        let mut a = ffi::ibv_qp_attr {
            qp_state: ffi::ibv_qp_state::IBV_QPS_INIT,
            pkey_index: 0,
            port_num: self.port,
            qp_access_flags: (ffi::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE
                | ffi::ibv_access_flags::IBV_ACCESS_REMOTE_READ)
                .0,
            ..Default::default()
        };
        use ffi::ibv_qp_attr_mask as M;
        self.modify(
            id,
            &mut a,
            M::IBV_QP_STATE | M::IBV_QP_PKEY_INDEX | M::IBV_QP_PORT | M::IBV_QP_ACCESS_FLAGS,
            "INIT",
        )?;
        Ok((id, num))
    }

    fn connect(&mut self, qp: QpId, remote_endpoint: &[u8], remote_qpn: u32) -> Result<()> {
        let r = Endpoint::parse(remote_endpoint)?;
        let q = self.qps.get(qp).ok_or_else(|| transport(format!("verbs provider: no queue pair {qp}")))?;
        if q.connected {
            return Err(transport(format!("verbs provider: queue pair {qp} is already connected")));
        }
        if r.link_layer != self.local.link_layer {
            return Err(transport(format!(
                "verbs provider: link layer {} here, {} at the peer",
                self.local.link_layer, r.link_layer
            )));
        }
        use ffi::ibv_qp_attr_mask as M;
        let mut a = ffi::ibv_qp_attr {
            qp_state: ffi::ibv_qp_state::IBV_QPS_RTR,
            path_mtu: self.local.mtu.min(r.mtu),
            dest_qp_num: remote_qpn,
            rq_psn: r.psn,
            max_dest_rd_atomic: self.rd_atomic,
            min_rnr_timer: MIN_RNR_TIMER,
            ..Default::default()
        };
        a.ah_attr.dlid = r.lid;
        a.ah_attr.sl = 0;
        a.ah_attr.src_path_bits = 0;
        a.ah_attr.port_num = self.port;
        if self.local.link_layer == LINK_LAYER_ETHERNET || r.lid == 0 {
            a.ah_attr.is_global = 1;
            a.ah_attr.grh.dgid = ffi::ibv_gid { raw: r.gid };
            a.ah_attr.grh.sgid_index = self.gid_index;
            a.ah_attr.grh.hop_limit = HOP_LIMIT;
            a.ah_attr.grh.flow_label = 0;
            a.ah_attr.grh.traffic_class = 0;
        }
        let mask = M::IBV_QP_STATE
            | M::IBV_QP_AV
            | M::IBV_QP_PATH_MTU
            | M::IBV_QP_DEST_QPN
            | M::IBV_QP_RQ_PSN
            | M::IBV_QP_MAX_DEST_RD_ATOMIC
            | M::IBV_QP_MIN_RNR_TIMER;
        self.modify(qp, &mut a, mask, "RTR (ready to receive)")?;
        self.qps[qp].connected = true;
        Ok(())
    }

    fn ready_to_send(&mut self, qp: QpId) -> Result<()> {
        let q = self.qps.get(qp).ok_or_else(|| transport(format!("verbs provider: no queue pair {qp}")))?;
        if !q.connected {
            return Err(transport(format!("verbs provider: queue pair {qp} is not connected")));
        }
        if q.sending {
            return Ok(());
        }
        use ffi::ibv_qp_attr_mask as M;
        let mut a = ffi::ibv_qp_attr {
            qp_state: ffi::ibv_qp_state::IBV_QPS_RTS,
            timeout: self.ack_timeout,
            retry_cnt: self.retry_cnt,
            rnr_retry: RNR_RETRY,
            sq_psn: self.local.psn,
            max_rd_atomic: self.rd_atomic,
            ..Default::default()
        };
        let mask = M::IBV_QP_STATE
            | M::IBV_QP_TIMEOUT
            | M::IBV_QP_RETRY_CNT
            | M::IBV_QP_RNR_RETRY
            | M::IBV_QP_SQ_PSN
            | M::IBV_QP_MAX_QP_RD_ATOMIC;
        self.modify(qp, &mut a, mask, "RTS (ready to send)")?;
        self.qps[qp].sending = true;
        Ok(())
    }

    fn disconnect(&mut self, qp: QpId) {
        if qp >= self.qps.len() {
            return;
        }
        let mut a = ffi::ibv_qp_attr { qp_state: ffi::ibv_qp_state::IBV_QPS_ERR, ..Default::default() };
        if let Err(e) = self.modify(qp, &mut a, ffi::ibv_qp_attr_mask::IBV_QP_STATE, "ERR (disconnected)") {
            tracing::warn!("{e}");
        }
    }

    fn post(&mut self, qp: QpId, wr: &WorkRequest) -> Result<()> {
        let (depth, inline_max, max_msg) = (self.depth, self.inline as usize, self.max_msg);
        let q = self.qps.get_mut(qp).ok_or_else(|| transport(format!("verbs provider: no queue pair {qp}")))?;
        if !q.sending {
            return Err(transport(format!("queue pair {qp} is not ready to send")));
        }
        if q.outstanding >= depth {
            return Err(transport(format!("send queue of queue pair {qp} is full ({depth} requests not completed)")));
        }
        if wr.len > max_msg {
            return Err(Error::InvalidArgument(format!(
                "RDMA request of {} bytes exceeds the port's largest message ({max_msg} bytes)",
                wr.len
            )));
        }
        if wr.imm.is_some() && wr.opcode != Opcode::Write {
            return Err(Error::InvalidArgument("immediate data on an RDMA read".into()));
        }
        let mut sge = ffi::ibv_sge { addr: wr.local_addr, length: wr.len as u32, lkey: wr.lkey };
        let mut flags = ffi::ibv_send_flags::IBV_SEND_SIGNALED;
        if wr.inline && wr.opcode == Opcode::Write && wr.len <= inline_max {
            flags |= ffi::ibv_send_flags::IBV_SEND_INLINE;
        }
        let mut swr = ffi::ibv_send_wr {
            wr_id: wr.wr_id,
            next: ptr::null_mut(),
            sg_list: &mut sge,
            num_sge: if wr.len == 0 { 0 } else { 1 },
            opcode: match (wr.opcode, wr.imm) {
                (Opcode::Write, None) => ffi::ibv_wr_opcode::IBV_WR_RDMA_WRITE,
                (Opcode::Write, Some(_)) => ffi::ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM,
                (Opcode::Read, _) => ffi::ibv_wr_opcode::IBV_WR_RDMA_READ,
            },
            send_flags: flags.0,
            ..Default::default()
        };
        // Network byte order on the wire, as verbs wants it.
        swr.__bindgen_anon_1.imm_data = wr.imm.unwrap_or(0).to_be();
        swr.wr.rdma = ffi::ibv_send_wr__bindgen_ty_2__bindgen_ty_1 { remote_addr: wr.remote_addr, rkey: wr.rkey };
        let mut bad: *mut ffi::ibv_send_wr = ptr::null_mut();
        let post_send = self.post_send.ok_or_else(|| transport("verbs provider: no post_send".into()))?;
        // SAFETY: `q.qp` is a live queue pair of this provider's context, whose ops table
        // `post_send` comes from (what the inline ibv_post_send calls); `swr` and `sge` outlive
        // the call, which copies them (and inline data) into the send queue. The memory the
        // request names is checked by the device against its keys.
        let rc = unsafe { post_send(q.qp, &mut swr, &mut bad) };
        if rc != 0 {
            return Err(transport(format!("ibv_post_send on queue pair {qp}: {}", verb_error(rc))));
        }
        q.outstanding += 1;
        Ok(())
    }

    fn post_recv(&mut self, qp: QpId, wr_id: u64) -> Result<()> {
        let q = self.qps.get(qp).ok_or_else(|| transport(format!("verbs provider: no queue pair {qp}")))?;
        let post_recv = self.post_recv.ok_or_else(|| transport("verbs provider: no post_recv".into()))?;
        let mut rwr = ffi::ibv_recv_wr { wr_id, next: ptr::null_mut(), sg_list: ptr::null_mut(), num_sge: 0 };
        let mut bad: *mut ffi::ibv_recv_wr = ptr::null_mut();
        // SAFETY: `q.qp` is a live queue pair of this provider's context, whose ops table
        // `post_recv` comes from (what the inline ibv_post_recv calls); `rwr` names no memory
        // and outlives the call, which copies it into the receive queue.
        let rc = unsafe { post_recv(q.qp, &mut rwr, &mut bad) };
        if rc != 0 {
            return Err(transport(format!("ibv_post_recv on queue pair {qp}: {}", verb_error(rc))));
        }
        Ok(())
    }

    fn poll(&mut self, out: &mut Vec<Completion>, max: usize) -> usize {
        let Some(poll_cq) = self.poll_cq else { return 0 };
        let mut total = 0;
        while total < max {
            let want = (max - total).min(self.wc.len());
            // SAFETY: `cq` is this provider's live completion queue and `poll_cq` its context's
            // (what the inline ibv_poll_cq calls); `wc` has room for `want` completions.
            let n = unsafe { poll_cq(self.cq, want as c_int, self.wc.as_mut_ptr()) };
            if n < 0 {
                tracing::error!("ibv_poll_cq on {}: {}", self.device, verb_error(n));
                break;
            }
            let n = n as usize;
            for wc in &self.wc[..n] {
                let Some(&qp) = self.by_num.get(&wc.qp_num) else {
                    tracing::warn!("completion for unknown queue pair number {}", wc.qp_num);
                    continue;
                };
                // Receives are not counted in `outstanding` (a failed one has no valid opcode, but
                // then the queue pair is in error and its count no longer matters).
                let received = wc.is_valid() && wc.opcode() & ffi::ibv_wc_opcode::IBV_WC_RECV != 0;
                if !received {
                    let q = &mut self.qps[qp];
                    q.outstanding = q.outstanding.saturating_sub(1);
                }
                let status = match wc.error() {
                    None => WcStatus::Success,
                    Some((s, vendor)) => {
                        tracing::debug!("verbs completion error {s} (vendor {vendor:#x}) on queue pair {qp}");
                        match s {
                            ffi::ibv_wc_status::IBV_WC_LOC_PROT_ERR => WcStatus::LocalProtection,
                            ffi::ibv_wc_status::IBV_WC_REM_ACCESS_ERR => WcStatus::RemoteAccess,
                            ffi::ibv_wc_status::IBV_WC_RETRY_EXC_ERR => WcStatus::RetryExceeded,
                            ffi::ibv_wc_status::IBV_WC_RNR_RETRY_EXC_ERR => WcStatus::ReceiverNotReady,
                            ffi::ibv_wc_status::IBV_WC_WR_FLUSH_ERR => WcStatus::Flushed,
                            other => WcStatus::Other(other),
                        }
                    }
                };
                let imm = if received { wc.imm_data().map(u32::from_be) } else { None };
                out.push(Completion { wr_id: wc.wr_id(), status, qp, imm });
                total += 1;
            }
            if n < want {
                break;
            }
        }
        total
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_round_trips() {
        let e = Endpoint { gid: [7; 16], lid: 0x1234, mtu: ffi::IBV_MTU_1024, link_layer: 2, psn: 0xabcdef };
        let b = e.encode();
        assert_eq!(b.len(), ENDPOINT_LEN);
        assert_eq!(Endpoint::parse(&b).unwrap(), e);
        assert!(Endpoint::parse(&b[..27]).is_err());
        let mut bad = b.clone();
        bad[0] ^= 1;
        assert!(Endpoint::parse(&bad).is_err());
        bad = b;
        bad[22] = 9;
        assert!(Endpoint::parse(&bad).is_err());
        assert_eq!(mtu_bytes(ffi::IBV_MTU_4096), 4096);
    }

    #[test]
    fn no_device_is_unavailable_or_opens() {
        match VerbsProvider::open(&IbSettings::default()) {
            Ok(Err(Unavailable(why))) => assert!(why.contains("no RDMA device"), "{why}"),
            Ok(Ok(p)) => assert!(p.describe().contains("device")),
            Err(e) => panic!("{e}"),
        }
    }
}
