//! [`MappedHeap`]: a global allocator that puts large allocations in memory files, so that
//! ordinary `Vec`s get what [`crate::Context::alloc_registered`] buffers get (peers on the
//! machine map them once instead of copying through the kernel; `ib` registers them once).

use polyrail_core::{Region, SharedFile};
use polyrail_runtime::Driver;
use std::alloc::{GlobalAlloc, Layout, System};
use std::os::fd::IntoRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::Mutex;

/// Page size assumed for alignment (x86-64 and aarch64 Linux with 4 KiB pages; larger pages
/// only make mappings more aligned).
const PAGE: usize = 4096;
/// Memory-file allocations alive at once at most: each holds a file descriptor. Beyond it,
/// allocations come from the system allocator.
const BLOCKS: usize = 256;
/// Messages shorter than this are not worth a registration: they go eagerly on every channel.
const WORTH_REGISTERING: usize = 8 * 1024;

/// A global allocator that gives every allocation of at least a minimum size (64 KiB unless
/// [`MappedHeap::with_min_size`] says otherwise) its own memory file, mapped shared, and the
/// others to the system allocator. A [`crate::Context`] registers such memory with its channels
/// the first time a message uses it, and ends the registration at its next message after the
/// memory was freed, so ordinary `Vec<u8>` buffers are used in place: the `cma` channel's peers
/// map the file once and copy with `memcpy` (no page pinning per message), and `ib` registers
/// the memory once instead of copying through bounce buffers or registering per message.
/// Install it in the program:
///
/// ```no_run
/// #[global_allocator]
/// static HEAP: polyrail::MappedHeap = polyrail::MappedHeap::new();
/// ```
///
/// Costs and limits: an allocation takes five system calls (`memfd_create`, `ftruncate`, `fcntl`,
/// `fstat`, `mmap`) and holds a file descriptor until freed. At most 256 allocations (and an eighth
/// of the limit on open files, `ulimit -n`) live in memory files at once; the others come from the
/// system allocator, as do allocations aligned beyond a page and all of them while
/// [`MappedHeap::set_enabled`] has it off, where the kernel refuses memory files (it is then turned
/// off), past the file-size limit (`ulimit -f`) and where it does not overcommit memory
/// (`vm.overcommit_memory=2`: a file's pages are committed only when touched, so an allocation
/// there could succeed and fault later). Pages come from shared memory (tmpfs), without transparent
/// huge pages. A freed block stays registered with the channels (for `ib`, its pages pinned) until
/// the context's next message. Each process keeps up to 16 of its peers' files mapped (1 GiB) until
/// it sees them closed, so freed blocks may hold memory for a while. A child made by `fork` without
/// `exec` shares these allocations with its parent instead of getting copies, and may find the
/// heap's table locked for ever by a thread of the parent: do not install it in programs that fork
/// and go on running the child (spawning a command is fine). Programs that allocate a fresh large
/// buffer per message pay a registration (and the peer a mapping) per message.
#[derive(Debug)]
pub struct MappedHeap {
    min_size: usize,
}

/// One live memory-file allocation.
#[derive(Clone, Copy)]
struct Block {
    start: usize,
    len: usize,
    fd: i32,
    inode: u64,
    /// Unique over the process's life: a later block at the same address has another id.
    id: u64,
}

const NO_BLOCK: Block = Block { start: 0, len: 0, fd: -1, inode: 0, id: 0 };

/// The live blocks, `live[..count]` in no order. A mutex (futex-based, allocation-free) guards
/// it; nothing allocates while holding it.
struct Blocks {
    live: [Block; BLOCKS],
    count: usize,
    next_id: u64,
}

static LIVE: Mutex<Blocks> = Mutex::new(Blocks { live: [NO_BLOCK; BLOCKS], count: 0, next_id: 1 });
/// How many blocks exist, for a check without the lock. Release on change, Acquire on reading:
/// a block allocated by another thread and handed over with synchronization is counted.
static COUNT: AtomicUsize = AtomicUsize::new(0);
/// Blocks freed so far. Incremented (Release) after a block left `LIVE` and before its memory
/// is unmapped; a context that reads a new value (Acquire) ends the registrations of blocks no
/// longer live before it registers anything, so a later allocation at the same address is
/// never mistaken for the old one.
static FREED: AtomicU64 = AtomicU64::new(0);
/// Blocks made so far (the id of the latest). Stored (Release) after a block entered `LIVE`: a
/// context that finds it unchanged (Acquire) knows that no block appeared since it last looked.
static MADE: AtomicU64 = AtomicU64::new(0);
/// Whether new allocations may become blocks.
static ENABLED: AtomicBool = AtomicBool::new(true);

fn table() -> std::sync::MutexGuard<'static, Blocks> {
    // Nothing panics while holding the lock; a poisoned lock still holds consistent data.
    LIVE.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl MappedHeap {
    /// The heap with the default minimum size, 64 KiB.
    pub const fn new() -> MappedHeap {
        MappedHeap::with_min_size(64 * 1024)
    }

    /// The heap putting allocations of at least `bytes` (at least one page) in memory files.
    pub const fn with_min_size(bytes: usize) -> MappedHeap {
        MappedHeap { min_size: if bytes < PAGE { PAGE } else { bytes } }
    }

    /// Turns memory files for new allocations on or off (on at start); blocks already made
    /// stay what they are until freed, and an allocation another thread is making as this is
    /// called may still become one.
    pub fn set_enabled(on: bool) {
        ENABLED.store(on, Ordering::Relaxed);
    }

    /// How many allocations live in memory files now.
    pub fn blocks() -> usize {
        COUNT.load(Ordering::Acquire)
    }

    fn wants(&self, layout: Layout) -> bool {
        layout.size() >= self.min_size && layout.align() <= PAGE && ENABLED.load(Ordering::Relaxed)
    }
}

impl Default for MappedHeap {
    fn default() -> Self {
        MappedHeap::new()
    }
}

/// Maps a new block of at least `size` bytes; `None` when the table is full or a system call
/// fails (the caller then uses the system allocator). The caller's `errno` survives: an
/// allocation must not change what a C call before it reported.
fn map_block(size: usize) -> Option<*mut u8> {
    // SAFETY: this thread's errno, read and put back.
    let errno = unsafe { *libc::__errno_location() };
    let block = try_map_block(size);
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = errno };
    block
}

/// [`map_block`] without keeping `errno`.
fn try_map_block(size: usize) -> Option<*mut u8> {
    if COUNT.load(Ordering::Relaxed) >= block_limit() || strict_overcommit() {
        return None;
    }
    let len = size.div_ceil(PAGE) * PAGE;
    let (fd, inode) = match polyrail_core::memory_file(len) {
        Ok(file) => file,
        Err((_, e)) => {
            // Refused for good (no memfd_create, a seccomp profile, or a policy such as
            // vm.memfd_noexec=2 that the file's flags do not meet): stop asking.
            if matches!(e.raw_os_error(), Some(libc::ENOSYS | libc::EPERM | libc::EACCES)) {
                ENABLED.store(false, Ordering::Relaxed);
            }
            return None;
        }
    };
    let fd = fd.into_raw_fd();
    // SAFETY: a fresh shared mapping of our own descriptor, `len` bytes long (sized and sealed
    // by memory_file); the result is checked.
    let ptr =
        unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd, 0) };
    if ptr == libc::MAP_FAILED {
        // SAFETY: our descriptor, closed once.
        unsafe { libc::close(fd) };
        return None;
    }
    let mut b = table();
    if b.count >= block_limit() {
        drop(b);
        // SAFETY: the mapping and descriptor made above, given back once; nobody saw them.
        unsafe { unmap(ptr.cast(), len, fd) };
        return None;
    }
    let (i, id) = (b.count, b.next_id);
    b.live[i] = Block { start: ptr as usize, len, fd, inode, id };
    b.count += 1;
    b.next_id += 1;
    COUNT.store(b.count, Ordering::Release);
    MADE.store(id, Ordering::Release);
    Some(ptr.cast())
}

/// The most blocks alive at once: [`BLOCKS`], and at most an eighth of the process's limit
/// on open files (read once), since each holds a descriptor the program's own files would
/// otherwise lack (128 under the common soft limit of 1024).
fn block_limit() -> usize {
    // 0: not read yet.
    static LIMIT: AtomicUsize = AtomicUsize::new(0);
    match LIMIT.load(Ordering::Relaxed) {
        0 => {
            let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
            // SAFETY: `lim` is valid for writes. No allocation (this runs inside the allocator).
            let read = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0;
            let files = if read { usize::try_from(lim.rlim_cur).unwrap_or(usize::MAX) } else { 1024 };
            // At least 1, so that 0 keeps meaning "not read". Relaxed: every thread computes
            // the same value.
            let limit = BLOCKS.min(files / 8).max(1);
            LIMIT.store(limit, Ordering::Relaxed);
            limit
        }
        n => n,
    }
}

/// Whether the kernel refuses to overcommit memory (`vm.overcommit_memory=2`, read once): a
/// memory file's pages are committed only when touched, so there an allocation the system
/// allocator would have refused would succeed as a block, and the process would get SIGBUS
/// at a page the kernel cannot give. Blocks are then not made.
fn strict_overcommit() -> bool {
    // 0: not read yet, 1: no, 2: yes.
    static STRICT: AtomicU8 = AtomicU8::new(0);
    match STRICT.load(Ordering::Relaxed) {
        0 => {
            let mut mode = [0u8; 1];
            // SAFETY: a NUL-terminated path; `mode` is writable for its length; the descriptor
            // is closed once. No allocation (this runs inside the allocator).
            let read = unsafe {
                let fd = libc::open(c"/proc/sys/vm/overcommit_memory".as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC);
                let n = if fd >= 0 { libc::read(fd, mode.as_mut_ptr().cast(), 1) } else { -1 };
                if fd >= 0 {
                    libc::close(fd);
                }
                n == 1
            };
            let strict = read && mode[0] == b'2';
            STRICT.store(if strict { 2 } else { 1 }, Ordering::Relaxed);
            strict
        }
        v => v == 2,
    }
}

/// Frees the block at `ptr` if there is one; false when `ptr` is not a block's start.
fn free_block(ptr: *mut u8) -> bool {
    let mut b = table();
    let n = b.count;
    let Some(i) = b.live[..n].iter().position(|x| x.start == ptr as usize) else { return false };
    let block = b.live[i];
    b.live.swap(i, n - 1);
    b.count -= 1;
    COUNT.store(b.count, Ordering::Release);
    FREED.fetch_add(1, Ordering::Release);
    drop(b);
    // SAFETY: the block's own mapping and descriptor, just removed from the table, so given
    // back once; the caller (the allocator's user) no longer uses the memory.
    unsafe { unmap(block.start as *mut u8, block.len, block.fd) };
    true
}

/// # Safety
/// `ptr..ptr + len` is a mapping and `fd` a descriptor that nothing uses any more.
unsafe fn unmap(ptr: *mut u8, len: usize, fd: i32) {
    // SAFETY: forwarded to the caller.
    unsafe {
        libc::munmap(ptr.cast(), len);
        libc::close(fd);
    }
}

/// The length of the block starting at `ptr`, if there is one.
fn block_len(ptr: *mut u8) -> Option<usize> {
    let b = table();
    b.live[..b.count].iter().find(|x| x.start == ptr as usize).map(|x| x.len)
}

// SAFETY: every pointer handed out is either the system allocator's (for the same layout) or a
// fresh mapping of at least `layout.size()` bytes, page aligned (so aligned for every layout
// accepted, `align <= PAGE`), zero-filled, and exclusively the caller's until given back; each
// is given back to whoever made it (blocks are recognised by their start in the table).
unsafe impl GlobalAlloc for MappedHeap {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if self.wants(layout) {
            if let Some(p) = map_block(layout.size()) {
                return p;
            }
        }
        // SAFETY: the caller's layout, forwarded.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if self.wants(layout) {
            // A new memory file reads as zeros.
            if let Some(p) = map_block(layout.size()) {
                return p;
            }
        }
        // SAFETY: as in alloc.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // Blocks are never smaller than the minimum size.
        if layout.size() >= self.min_size && free_block(ptr) {
            return;
        }
        // SAFETY: not a block, so the system allocator's, with this layout (the caller's promise).
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let block = if layout.size() >= self.min_size { block_len(ptr) } else { None };
        // A block keeps its place while the new size fits its pages, uses more than half of
        // them (a block cannot shrink: shrinking far moves, to give memory back) and is still
        // a block's size (`dealloc` looks blocks up only from the minimum size).
        if block.is_some_and(|len| new_size <= len && new_size > len / 2 && new_size >= self.min_size) {
            return ptr;
        }
        // SAFETY: the caller promises a valid non-zero size with this alignment.
        let new_layout = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
        if block.is_none() && !self.wants(new_layout) {
            // SAFETY: the system allocator's memory with this layout, forwarded.
            return unsafe { System.realloc(ptr, layout, new_size) };
        }
        // Into or out of a block: a new allocation, a copy, the old one freed.
        // SAFETY: a valid layout (above).
        let new = unsafe { self.alloc(new_layout) };
        if !new.is_null() {
            // SAFETY: both allocations hold at least the smaller size and are distinct.
            unsafe { std::ptr::copy_nonoverlapping(ptr, new, layout.size().min(new_size)) };
            // SAFETY: the caller's allocation with its layout, no longer used.
            unsafe { self.dealloc(ptr, layout) };
        }
        new
    }
}

/// The heap blocks a context registered with its channels.
#[derive(Debug, Default)]
pub(crate) struct HeapRegistrations {
    /// `FREED` when the registrations were last checked.
    frees_seen: u64,
    /// Registered blocks (`true`) and blocks whose registration failed (`false`, not retried).
    blocks: Vec<(u64, Region, bool)>,
    /// The last buffer found in no block, and `MADE` then: while no block was made since, the
    /// same buffer is in none still (blocks freed meanwhile cannot hold it either).
    not_in_block: (usize, usize, u64),
}

impl HeapRegistrations {
    /// Before a message buffer `ptr..ptr + len` goes to the engine: ends the registrations of
    /// blocks freed since the last call, then registers the block that holds the buffer, if
    /// any and not yet. Inline, it costs a load and two compares for a small message when no
    /// block was freed since the last call; the rest is out of line.
    #[inline]
    pub(crate) fn before_post(&mut self, driver: &mut Driver, ptr: *const u8, len: usize) {
        // Relaxed: only a hint; `check_and_register` loads it again with Acquire (see `FREED`).
        if FREED.load(Ordering::Relaxed) != self.frees_seen || len >= WORTH_REGISTERING {
            self.check_and_register(driver, ptr, len);
        }
    }

    /// The part of [`HeapRegistrations::before_post`] that has something to check.
    #[inline(never)]
    fn check_and_register(&mut self, driver: &mut Driver, ptr: *const u8, len: usize) {
        let freed = FREED.load(Ordering::Acquire);
        if freed != self.frees_seen {
            self.frees_seen = freed;
            self.end_freed(driver);
        }
        if len < WORTH_REGISTERING || COUNT.load(Ordering::Acquire) == 0 {
            return;
        }
        let (start, end) = (ptr as usize, ptr as usize + len);
        let inside = |r: &Region| start >= r.ptr as usize && end <= r.ptr as usize + r.len;
        if self.blocks.iter().any(|(_, r, _)| inside(r)) {
            return;
        }
        // Acquire: pairs with the Release in map_block; a block made before this load is in
        // the table the lookup below reads.
        let made = MADE.load(Ordering::Acquire);
        if self.not_in_block == (start, end, made) {
            return;
        }
        let found = {
            let b = table();
            b.live[..b.count].iter().find(|x| start >= x.start && end <= x.start + x.len).copied()
        };
        let Some(block) = found else {
            self.not_in_block = (start, end, made);
            return;
        };
        let region = Region { ptr: block.start as *const u8, len: block.len };
        let file = SharedFile { fd: block.fd, inode: block.inode };
        let ok = match driver.register_memory(region, Some(file)) {
            Ok(()) => true,
            Err(e) => {
                tracing::debug!(
                    "heap block of {} bytes not registered ({e}): messages in it go as ordinary memory",
                    block.len
                );
                false
            }
        };
        self.blocks.push((block.id, region, ok));
    }

    /// Ends the registrations of blocks no longer live.
    fn end_freed(&mut self, driver: &mut Driver) {
        // Copied out so that nothing allocates under the lock.
        let mut live = [(0u64, 0usize); BLOCKS];
        let n = {
            let b = table();
            for (l, x) in live.iter_mut().zip(&b.live[..b.count]) {
                *l = (x.id, x.start);
            }
            b.count
        };
        let live = &live[..n];
        self.blocks.retain(|&(id, region, ok)| {
            let alive = live.contains(&(id, region.ptr as usize));
            if !alive && ok {
                driver.unregister_memory(region);
            }
            alive
        });
    }
}
