//! Remote keys of the node-local channels: a process id and an address range.

use polyrail_core::RemoteKey;

/// Bytes of an encoded key: pid u32, address u64, length u64, little endian.
pub(crate) const KEY_LEN: usize = 20;

/// Exposed memory of a process: `len` bytes at `addr` in process `pid`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PidKey {
    /// The process whose memory it is.
    pub pid: u32,
    /// Start address in that process.
    pub addr: u64,
    /// Length in bytes.
    pub len: u64,
}

impl PidKey {
    /// The key's 20 bytes.
    pub(crate) fn encode(&self) -> RemoteKey {
        let mut b = [0u8; KEY_LEN];
        b[..4].copy_from_slice(&self.pid.to_le_bytes());
        b[4..12].copy_from_slice(&self.addr.to_le_bytes());
        b[12..20].copy_from_slice(&self.len.to_le_bytes());
        // KEY_LEN <= RemoteKey::MAX, so `new` always succeeds.
        RemoteKey::new(&b).unwrap_or_else(|| unreachable!("20-byte key fits RemoteKey::MAX"))
    }

    /// Reads a key; `Err` says why it is not one.
    pub(crate) fn decode(key: &RemoteKey) -> Result<PidKey, String> {
        let b = key.as_bytes();
        if b.len() != KEY_LEN {
            return Err(format!("remote key of {} bytes, expected {KEY_LEN} (pid + address + length)", b.len()));
        }
        let mut a = [0u8; 8];
        let mut l = [0u8; 8];
        a.copy_from_slice(&b[4..12]);
        l.copy_from_slice(&b[12..20]);
        Ok(PidKey {
            pid: u32::from_le_bytes([b[0], b[1], b[2], b[3]]),
            addr: u64::from_le_bytes(a),
            len: u64::from_le_bytes(l),
        })
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
        let k = PidKey { pid: 77, addr: 0x1000, len: 100 };
        assert_eq!(PidKey::decode(&k.encode()).unwrap(), k);
        assert_eq!(k.range(0, 100).unwrap(), 0x1000);
        assert_eq!(k.range(99, 1).unwrap(), 0x1000 + 99);
        assert_eq!(k.range(100, 0).unwrap(), 0x1000 + 100);
        assert!(k.range(100, 1).is_err());
        assert!(k.range(usize::MAX, 2).is_err());
        let top = PidKey { pid: 1, addr: u64::MAX - 10, len: 100 };
        assert!(top.range(20, 1).is_err());
        assert!(PidKey::decode(&RemoteKey::new(&[1, 2, 3]).unwrap()).is_err());
    }
}
