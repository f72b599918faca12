//! The flags of libscif's calls, with libscif's bit values, and [`PortId`].

use std::fmt;
use std::ops::BitOr;

macro_rules! flag_set {
    ($(#[$m:meta])* $name:ident { $($(#[$fm:meta])* $flag:ident = $v:expr;)* }) => {
        $(#[$m])*
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
        pub struct $name(u32);

        impl $name {
            /// No flag.
            pub const NONE: $name = $name(0);
            $($(#[$fm])* pub const $flag: $name = $name($v);)*
            const ALL: u32 = 0 $(| $v)*;

            /// libscif's bits.
            pub const fn bits(self) -> u32 {
                self.0
            }

            /// The flags of libscif's `bits`; `None` when a bit is not one of them.
            pub const fn from_bits(bits: u32) -> Option<$name> {
                if bits & !Self::ALL == 0 { Some($name(bits)) } else { None }
            }

            /// Whether every flag of `other` is set.
            pub const fn contains(self, other: $name) -> bool {
                self.0 & other.0 == other.0
            }

            /// Whether any flag of `other` is set.
            pub const fn intersects(self, other: $name) -> bool {
                self.0 & other.0 != 0
            }
        }

        impl BitOr for $name {
            type Output = $name;
            fn bitor(self, other: $name) -> $name {
                $name(self.0 | other.0)
            }
        }
    };
}

flag_set! {
    /// How an RMA runs (`SCIF_RMA_*`).
    RmaFlags {
        /// `SCIF_RMA_USECPU`: the caller copies with the CPU instead of the DMA engine.
        USECPU = 1;
        /// `SCIF_RMA_USECACHE`: may cache the registration of a `v*` buffer (accepted, no effect here).
        USECACHE = 2;
        /// `SCIF_RMA_SYNC`: return once the transfer completed.
        SYNC = 4;
        /// `SCIF_RMA_ORDERED`: the last cache line lands last; here also after every earlier RMA.
        ORDERED = 8;
    }
}

flag_set! {
    /// Whose RMAs a fence covers and where a signal is written (`SCIF_FENCE_*`, `SCIF_SIGNAL_*`).
    FenceFlags {
        /// `SCIF_FENCE_INIT_SELF`: the RMAs this endpoint initiated.
        INIT_SELF = 1;
        /// `SCIF_FENCE_INIT_PEER`: the RMAs the peer initiated.
        INIT_PEER = 2;
        /// `SCIF_SIGNAL_LOCAL`: `fence_signal` writes its local value in a local window.
        SIGNAL_LOCAL = 4;
        /// `SCIF_SIGNAL_REMOTE`: `fence_signal` writes its remote value in a peer's window.
        SIGNAL_REMOTE = 8;
    }
}

flag_set! {
    /// What a window or a mapping allows (`SCIF_PROT_*`).
    Prot {
        /// `SCIF_PROT_READ`.
        READ = 1;
        /// `SCIF_PROT_WRITE`.
        WRITE = 2;
    }
}

flag_set! {
    /// How `register` places a window (`SCIF_MAP_*`).
    MapFlags {
        /// `SCIF_MAP_FIXED`: at exactly the offset given, else the provider chooses.
        FIXED = 0x10;
    }
}

flag_set! {
    /// Whether `send`/`recv` wait (`SCIF_SEND_BLOCK`, `SCIF_RECV_BLOCK`).
    MsgFlags {
        /// Wait until every byte is sent or received.
        BLOCK = 1;
    }
}

flag_set! {
    /// Whether `accept` waits (`SCIF_ACCEPT_SYNC`).
    AcceptFlags {
        /// Wait for a connection instead of failing with `EAGAIN`.
        SYNC = 1;
    }
}

flag_set! {
    /// Readiness asked of and reported by [`crate::poll`] (`POLLIN`, ...).
    PollEvents {
        /// Data to receive, or a connection to accept.
        IN = 0x1;
        /// Room to send.
        OUT = 0x4;
        /// An error on the endpoint.
        ERR = 0x8;
        /// The peer closed or died, or the endpoint is not connected.
        HUP = 0x10;
    }
}

impl Prot {
    /// "READ", "WRITE", "READ|WRITE" or "none", for messages.
    pub fn name(self) -> &'static str {
        match self.0 & 3 {
            1 => "READ",
            2 => "WRITE",
            3 => "READ|WRITE",
            _ => "none",
        }
    }
}

/// A SCIF port address: a node (0 the host, k device k of the physical node) and a port.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PortId {
    /// The SCIF node: 0 the host, 1.. its devices.
    pub node: u16,
    /// The port on that node.
    pub port: u16,
}

impl PortId {
    /// The port `port` of node `node`.
    pub const fn new(node: u16, port: u16) -> PortId {
        PortId { node, port }
    }

    pub(crate) fn to_bits(self) -> u64 {
        (u64::from(self.node) << 16) | u64::from(self.port)
    }

    pub(crate) fn from_bits(b: u64) -> Option<PortId> {
        (b >> 32 == 0).then_some(PortId { node: (b >> 16) as u16, port: b as u16 })
    }
}

impl fmt::Display for PortId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.node, self.port)
    }
}
