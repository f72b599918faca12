//! Remote keys of the node-local channels: a process id and an address range, and for memory
//! registered with a memory file (`Lifetime::Lasting` with a file) the file that peers may map.

use polyrail_core::RemoteKey;

/// Bytes of an encoded key: pid u32, address u64, length u64, little endian.
pub(crate) const KEY_LEN: usize = 20;
/// Bytes of a key with a [`FileRef`]: the 20 above, then fd u32, inode u64, file offset u64.
pub(crate) const FILE_KEY_LEN: usize = 40;

/// Exposed memory of a process: `len` bytes at `addr` in process `pid`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PidKey {
    /// The process whose memory it is.
    pub pid: u32,
    /// Start address in that process.
    pub addr: u64,
    /// Length in bytes.
    pub len: u64,
    /// The memory file that holds the range, when the owner registered one.
    pub file: Option<FileRef>,
}

/// Where a key's range lies in a memory file of its owner (`/proc/<pid>/fd/<fd>`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct FileRef {
    /// The owner's descriptor of the file.
    pub fd: u32,
    /// The file's inode number, checked after opening it (the descriptor may have been reused).
    pub inode: u64,
    /// Offset in the file of the key's `addr`.
    pub offset: u64,
}

impl PidKey {
    /// The key's 20 bytes, or 40 with a file.
    pub(crate) fn encode(&self) -> RemoteKey {
        let mut b = [0u8; FILE_KEY_LEN];
        b[..4].copy_from_slice(&self.pid.to_le_bytes());
        b[4..12].copy_from_slice(&self.addr.to_le_bytes());
        b[12..20].copy_from_slice(&self.len.to_le_bytes());
        let n = match self.file {
            None => KEY_LEN,
            Some(f) => {
                b[20..24].copy_from_slice(&f.fd.to_le_bytes());
                b[24..32].copy_from_slice(&f.inode.to_le_bytes());
                b[32..40].copy_from_slice(&f.offset.to_le_bytes());
                FILE_KEY_LEN
            }
        };
        // FILE_KEY_LEN <= RemoteKey::MAX, so `new` always succeeds.
        RemoteKey::new(&b[..n]).unwrap_or_else(|| unreachable!("a 40-byte key fits RemoteKey::MAX"))
    }

    /// Reads a key; `Err` says why it is not one.
    pub(crate) fn decode(key: &RemoteKey) -> Result<PidKey, String> {
        let b = key.as_bytes();
        if b.len() != KEY_LEN && b.len() != FILE_KEY_LEN {
            return Err(format!(
                "remote key of {} bytes, expected {KEY_LEN} (pid + address + length) or {FILE_KEY_LEN} (and a file)",
                b.len()
            ));
        }
        let u64_at = |i: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&b[i..i + 8]);
            u64::from_le_bytes(a)
        };
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let file = (b.len() == FILE_KEY_LEN).then(|| FileRef { fd: u32_at(20), inode: u64_at(24), offset: u64_at(32) });
        Ok(PidKey { pid: u32_at(0), addr: u64_at(4), len: u64_at(12), file })
    }

    /// The address of `[offset, offset + len)` inside the key's range, after checking that it is
    /// inside and that nothing overflows.
    pub(crate) fn range(&self, offset: usize, len: usize) -> Result<u64, String> {
        let end = (offset as u64).checked_add(len as u64).ok_or("offset + length overflows")?;
        if end > self.len {
            return Err(format!("bytes {offset}..{end} are outside the {}-byte exposed region", self.len));
        }
        self.addr.checked_add(end).ok_or("address + offset overflows")?;
        Ok(self.addr + offset as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_ranges() {
        let k = PidKey { pid: 77, addr: 0x1000, len: 100, file: None };
        assert_eq!(PidKey::decode(&k.encode()).unwrap(), k);
        let f = PidKey { file: Some(FileRef { fd: 9, inode: 1 << 40, offset: 4096 }), ..k };
        assert_eq!(f.encode().as_bytes().len(), FILE_KEY_LEN);
        assert_eq!(PidKey::decode(&f.encode()).unwrap(), f);
        assert_eq!(k.range(0, 100).unwrap(), 0x1000);
        assert_eq!(k.range(99, 1).unwrap(), 0x1000 + 99);
        assert_eq!(k.range(100, 0).unwrap(), 0x1000 + 100);
        assert!(k.range(100, 1).is_err());
        assert!(k.range(usize::MAX, 2).is_err());
        let top = PidKey { pid: 1, addr: u64::MAX - 10, len: 100, file: None };
        assert!(top.range(20, 1).is_err());
        assert!(PidKey::decode(&RemoteKey::new(&[1, 2, 3]).unwrap()).is_err());
    }
}
