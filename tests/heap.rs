//! The [`MappedHeap`] allocator on its own: which allocations become memory files, and that
//! growing, shrinking and freeing them keeps contents and gives everything back. (Messages from
//! its memory are the `heap` scenario of crates/cli/tests/job.rs.) One test function: the block count is
//! process-wide, so the checks must not run in parallel threads.

use polyrail::MappedHeap;
use std::alloc::{GlobalAlloc, Layout};

#[global_allocator]
static HEAP: MappedHeap = MappedHeap::with_min_size(64 * 1024);

fn open_memory_files() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|p| p.to_string_lossy().starts_with("/memfd:polyrail-memory"))
        .count()
}

#[test]
fn large_allocations_are_memory_files_and_keep_their_contents() {
    let files = open_memory_files();
    let small = vec![1u8; 1000];
    assert_eq!(MappedHeap::blocks(), 0, "small allocations stay with the system allocator");

    // Zeroed and written like any memory; a file per block, closed when it is freed.
    let mut big = vec![0u8; 100_000];
    assert_eq!(MappedHeap::blocks(), 1);
    assert_eq!(open_memory_files(), files + 1);
    assert!(big.iter().all(|&b| b == 0));
    for (i, b) in big.iter_mut().enumerate() {
        *b = i as u8;
    }

    // Within its pages (100_000 bytes take 25, 102_400 bytes) and above half of them a block
    // is resized in place; beyond them it moves to a new block with the same contents; below
    // the minimum size, to the system allocator.
    let at = big.as_ptr();
    big.truncate(80_000);
    big.shrink_to_fit();
    assert_eq!((big.as_ptr(), big.capacity()), (at, 80_000));
    big.reserve_exact(102_400 - big.len());
    assert_eq!((big.as_ptr(), MappedHeap::blocks()), (at, 1));
    big.resize(300_000, 7);
    assert_ne!(big.as_ptr(), at);
    assert_eq!(MappedHeap::blocks(), 1);
    assert!(big[..80_000].iter().enumerate().all(|(i, &b)| b == i as u8) && big[80_000..].iter().all(|&b| b == 7));
    let at = big.as_ptr();
    big.truncate(100_000);
    big.shrink_to_fit();
    assert_ne!(big.as_ptr(), at, "a block shrunk below half its pages moves, to give memory back");
    assert_eq!(MappedHeap::blocks(), 1);
    assert!(big[..80_000].iter().enumerate().all(|(i, &b)| b == i as u8) && big[80_000..].iter().all(|&b| b == 7));
    big.truncate(1000);
    big.shrink_to_fit();
    assert_eq!(MappedHeap::blocks(), 0);
    assert!(big.iter().enumerate().all(|(i, &b)| b == i as u8));

    // A small allocation that grows past the minimum becomes a block.
    let mut grown = small.clone();
    grown.resize(70_000, 3);
    assert_eq!(MappedHeap::blocks(), 1);
    assert!(grown[..1000].iter().all(|&b| b == 1) && grown[1000..].iter().all(|&b| b == 3));
    drop(grown);
    assert_eq!((MappedHeap::blocks(), open_memory_files()), (0, files));

    // Alignment beyond a page, and everything while turned off, comes from the system.
    let layout = Layout::from_size_align(1 << 20, 1 << 16).unwrap();
    // SAFETY: a valid layout; the memory is freed with it below.
    let p = unsafe { HEAP.alloc(layout) };
    assert!(!p.is_null() && p as usize % (1 << 16) == 0);
    assert_eq!(MappedHeap::blocks(), 0);
    // SAFETY: allocated above with this layout.
    unsafe { HEAP.dealloc(p, layout) };
    MappedHeap::set_enabled(false);
    let off = vec![0u8; 1 << 20];
    assert_eq!(MappedHeap::blocks(), 0);
    MappedHeap::set_enabled(true);
    let on = vec![0u8; 1 << 20];
    assert_eq!(MappedHeap::blocks(), 1);
    drop((off, on));
    assert_eq!(MappedHeap::blocks(), 0);

    // More live blocks than the table holds: the rest come from the system allocator.
    let many: Vec<Vec<u8>> = (0..300).map(|i| vec![i as u8; 65536]).collect();
    assert_eq!(MappedHeap::blocks(), 256);
    assert!(many.iter().enumerate().all(|(i, v)| v.iter().all(|&b| b == i as u8)));
    drop(many);
    assert_eq!((MappedHeap::blocks(), open_memory_files()), (0, files));

    // An allocation whose memory file cannot be made (no descriptor left) comes from the system
    // allocator and leaves errno as the caller's last C call set it.
    // SAFETY: open and close of our own descriptor; getrlimit/setrlimit with valid structs;
    // errno is this thread's. Nothing else in this process opens files meanwhile (one test).
    unsafe {
        let lowest_free = libc::open(c"/dev/null".as_ptr(), libc::O_RDONLY);
        assert!(lowest_free >= 0);
        libc::close(lowest_free);
        let mut files = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut files), 0);
        let tight = libc::rlimit { rlim_cur: lowest_free as libc::rlim_t, rlim_max: files.rlim_max };
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &tight), 0);
        *libc::__errno_location() = libc::EINTR;
        let fallback = vec![5u8; 1 << 20];
        let errno = *libc::__errno_location();
        libc::setrlimit(libc::RLIMIT_NOFILE, &files);
        assert_eq!((MappedHeap::blocks(), errno), (0, libc::EINTR));
        assert!(fallback.iter().all(|&b| b == 5));
    }
}
