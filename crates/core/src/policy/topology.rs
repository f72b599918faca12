//! Where two ranks sit relative to each other: the closest level of the machine they share.

use std::fmt;

/// The closest level of the machine two ranks share.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TopoClass {
    /// The same process.
    SameProcess,
    /// Hardware threads of one core.
    SameCore,
    /// Different cores sharing an L2 cache.
    SharedL2,
    /// Different cores sharing an L3 cache.
    SharedL3,
    /// The same package or NUMA node, no shared cache.
    Socket,
    /// Different packages of one machine.
    CrossSocket,
    /// Not bound, or the topology could not tell.
    Unknown,
    /// Another node.
    RemoteNode,
}

impl TopoClass {
    /// Classes a user can name in `POLYRAIL_*_THRESHOLD` lists.
    pub const NAMED: [TopoClass; 6] =
        [Self::SameCore, Self::SharedL2, Self::SharedL3, Self::Socket, Self::CrossSocket, Self::Unknown];

    /// The class's name in configuration and reports.
    pub fn name(self) -> &'static str {
        match self {
            Self::SameProcess => "self",
            Self::SameCore => "smt",
            Self::SharedL2 => "shared-l2",
            Self::SharedL3 => "shared-l3",
            Self::Socket => "socket",
            Self::CrossSocket => "cross-socket",
            Self::Unknown => "unbound",
            Self::RemoteNode => "remote",
        }
    }

    /// The class named `name`.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::NAMED.into_iter().find(|c| c.name() == name)
    }

    /// Whether the two ranks share a cache (where a copy through shared memory stays in cache).
    pub fn shares_cache(self) -> bool {
        matches!(self, Self::SameCore | Self::SharedL2 | Self::SharedL3)
    }
}

impl fmt::Display for TopoClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
