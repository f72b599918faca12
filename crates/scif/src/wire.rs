//! The provider's records between the two processes of a connection: 40 bytes each, with file
//! descriptors attached where a record passes a file. Every field is peer-controlled: the
//! receiver decodes with [`Record::decode`] and checks the values where it uses them.

use rustix::io::Errno;
use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags, SendAncillaryBuffer, SendAncillaryMessage,
    SendFlags,
};
use std::io::{IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{BorrowedFd, OwnedFd};

/// Bytes in a record.
pub(crate) const RECORD: usize = 40;
/// The most descriptors a record carries; more are closed and the record refused.
const MAX_FDS: usize = 2;
const MAGIC: u32 = 0x5c1f_0000;

/// What a record says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Connector → listener, on the new stream, with the control socket and the status page.
    Hello = 1,
    /// Acceptor → connector, on the control socket, with the acceptor's status page.
    Welcome = 2,
    /// A window: `a` offset, `b` length, `c` protection, `d` offset in the attached file.
    Register = 3,
    /// Windows gone: `a` offset, `b` length.
    Unregister = 4,
    /// The endpoint closes in order.
    Close = 5,
    /// A window of the sender's ordinary memory, registered in place: `a` offset, `b` length,
    /// `c` protection, `d` its address in the sender.
    RegisterInPlace = 6,
}

/// One record: a kind and four numbers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Record {
    pub kind: Kind,
    pub a: u64,
    pub b: u64,
    pub c: u64,
    pub d: u64,
}

impl Record {
    pub(crate) fn new(kind: Kind, a: u64, b: u64, c: u64, d: u64) -> Record {
        Record { kind, a, b, c, d }
    }

    pub(crate) fn encode(&self) -> [u8; RECORD] {
        let mut out = [0u8; RECORD];
        out[..4].copy_from_slice(&(MAGIC | self.kind as u32).to_le_bytes());
        for (i, v) in [self.a, self.b, self.c, self.d].into_iter().enumerate() {
            out[8 + 8 * i..16 + 8 * i].copy_from_slice(&v.to_le_bytes());
        }
        out
    }

    /// The record in `bytes`, or why it is not one.
    pub(crate) fn decode(bytes: &[u8]) -> Result<Record, String> {
        if bytes.len() != RECORD {
            return Err(format!("a {}-byte record (records are {RECORD} bytes)", bytes.len()));
        }
        let word = |i: usize| u64::from_le_bytes(bytes[8 + 8 * i..16 + 8 * i].try_into().unwrap());
        let tag = u32::from_le_bytes(bytes[..4].try_into().unwrap());
        let kind = match tag ^ MAGIC {
            1 => Kind::Hello,
            2 => Kind::Welcome,
            3 => Kind::Register,
            4 => Kind::Unregister,
            5 => Kind::Close,
            6 => Kind::RegisterInPlace,
            _ => return Err(format!("an unknown record tag {tag:#x}")),
        };
        Ok(Record { kind, a: word(0), b: word(1), c: word(2), d: word(3) })
    }
}

/// Sends `rec` with `fds` attached (never raising `SIGPIPE`).
pub(crate) fn send(sock: BorrowedFd<'_>, rec: &Record, fds: &[BorrowedFd<'_>]) -> rustix::io::Result<()> {
    let bytes = rec.encode();
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() && !control.push(SendAncillaryMessage::ScmRights(fds)) {
        return Err(Errno::INVAL);
    }
    let sent = rustix::net::sendmsg(sock, &[IoSlice::new(&bytes)], &mut control, SendFlags::NOSIGNAL)?;
    if sent == RECORD {
        Ok(())
    } else {
        Err(Errno::MSGSIZE)
    }
}

/// What one receive gave.
pub(crate) enum Received {
    /// A record and the descriptors attached to it.
    Record(Record, Vec<OwnedFd>),
    /// Bytes that are not a record, and why (the descriptors that came with them are closed).
    Malformed(String),
    /// The peer's end is closed.
    Eof,
    /// Nothing now (non-blocking only).
    Empty,
}

/// Receives one record: without waiting when `wait` is false. On a stream socket it reads
/// exactly one record's bytes.
pub(crate) fn recv(sock: BorrowedFd<'_>, wait: bool) -> rustix::io::Result<Received> {
    let mut bytes = [0u8; RECORD + 8];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS + 2))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let mut flags = RecvFlags::CMSG_CLOEXEC;
    if !wait {
        flags |= RecvFlags::DONTWAIT;
    }
    let got = loop {
        match rustix::net::recvmsg(sock, &mut [IoSliceMut::new(&mut bytes[..RECORD])], &mut control, flags) {
            Err(Errno::INTR) => continue,
            Err(Errno::AGAIN) if !wait => return Ok(Received::Empty),
            Err(e) => return Err(e),
            Ok(got) => break got,
        }
    };
    let mut fds = Vec::new();
    for msg in control.drain() {
        if let RecvAncillaryMessage::ScmRights(rights) = msg {
            fds.extend(rights);
        }
    }
    if got.bytes == 0 {
        return Ok(Received::Eof);
    }
    if got.flags.intersects(ReturnFlags::TRUNC | ReturnFlags::CTRUNC) || fds.len() > MAX_FDS {
        return Ok(Received::Malformed(format!("a record with more than {RECORD} bytes or {MAX_FDS} files")));
    }
    Ok(match Record::decode(&bytes[..got.bytes]) {
        Ok(rec) => Received::Record(rec, fds),
        Err(why) => Received::Malformed(why),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_garbage_is_refused() {
        let r = Record::new(Kind::Register, 1 << 40, 4096, 3, 8192);
        assert_eq!(Record::decode(&r.encode()), Ok(r));
        assert!(Record::decode(&[0u8; RECORD]).is_err());
        assert!(Record::decode(&r.encode()[..20]).is_err());
    }
}
