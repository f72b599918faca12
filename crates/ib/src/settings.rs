//! The `ib` channel's settings: its `POLYRAIL_IB_*` variables, declared once.

use polyrail_core::config::{apply_others, set, Config, Var, VarInfo, MAX_EAGER_MESSAGE};
use polyrail_core::{format_size, Error, Result, RndvFrom};

/// Which RDMA provider the `ib` channel uses (`POLYRAIL_IB_PROVIDER`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum IbProvider {
    /// Real verbs when an RDMA device is present; otherwise the software provider when the
    /// process was placed on a virtual node (`polyrail run --layout`), else no `ib` channel
    /// (the default).
    #[default]
    Auto,
    /// Real verbs through rdma-core (`verbs`).
    Verbs,
    /// The software RDMA provider between processes of one machine (`soft`).
    Soft,
}

/// Settings of the `ib` channel (`POLYRAIL_IB_*`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IbSettings {
    /// `POLYRAIL_IB_PROVIDER`: `auto` (default), `verbs` or `soft`.
    pub provider: IbProvider,
    /// `POLYRAIL_IB_DEVICE`: `NAME[:PORT]`, e.g. `rxe0:1`. Default: the first device, port 1.
    pub device: Option<(String, u8)>,
    /// `POLYRAIL_IB_GID_INDEX`: GID table index used for RoCE addressing. Default 0.
    pub gid_index: u8,
    /// `POLYRAIL_IB_CREDITS`: blocks in each peer's eager ring (DCFA's MaxCredit). Default 64.
    pub credits: usize,
    /// `POLYRAIL_IB_BLOCK`: payload bytes per eager ring block (each block has 64 bytes of
    /// header and tail on top). Default 8k, DCFA-MPI's block.
    pub block: usize,
    /// `POLYRAIL_IB_EAGER_LIMIT`: largest message sent to a peer eagerly through the ring
    /// (larger ones go by rendezvous). Default 8k (DCFA-MPI's EagerUpperLimit): with the
    /// default block, one packet.
    pub eager_limit: usize,
    /// `POLYRAIL_IB_SYNC_LIMIT`: a receiver sends a credit-only SYNC packet when the sender's
    /// view of free blocks would fall under this (DCFA's CreditSyncLimit). Default 2.
    pub sync_limit: usize,
    /// `POLYRAIL_IB_BOUNCE`: largest rendezvous message copied through pre-registered bounce
    /// buffers instead of registering the user's memory; 0 never bounces. Default 64k.
    pub bounce: usize,
    /// `POLYRAIL_IB_ACK_TIMEOUT`: the local ack timeout of the verbs provider's queue pairs,
    /// 4.096 µs × 2^N for N from 1 to 31 (the verbs unit; Open MPI's `btl_openib_ib_timeout`).
    /// Default 14 (67 ms): a peer that is gone fails a write after the retries, about half a
    /// second. The software provider has no timeout (a gone peer fails its next operation).
    pub ack_timeout: u8,
    /// `POLYRAIL_IB_COMPACT` (`on` / `off`): whether eager packets of whole path-MTU packets
    /// may leave their header out (RDMA write with immediate) in streams of like messages.
    /// Default on; off for comparisons (a process with it off also takes none: its address says so).
    pub compact: bool,
}

impl IbSettings {
    /// Where `ib` starts one-sided copies: above its largest eager message.
    pub fn rndv_from(&self) -> Vec<RndvFrom> {
        vec![RndvFrom {
            class: None,
            from: self.eager_limit.saturating_add(1),
            reason: format!(
                "POLYRAIL_IB_EAGER_LIMIT={}, the largest eager message; DCFA-MPI's 8k by default",
                format_size(self.eager_limit)
            ),
        }]
    }
}

impl Default for IbSettings {
    fn default() -> Self {
        IbSettings {
            provider: IbProvider::Auto,
            device: None,
            gid_index: 0,
            credits: 64,
            block: 8 << 10,
            eager_limit: 8 << 10,
            sync_limit: 2,
            bounce: 64 << 10,
            ack_timeout: 14,
            compact: true,
        }
    }
}

impl IbSettings {
    /// The settings `config` gives: the defaults, with each `POLYRAIL_IB_*` variable among
    /// [`Config::others`] applied in order.
    pub fn from_config(config: &Config) -> Result<IbSettings> {
        let mut s = IbSettings::default();
        apply_others(VARS, config, &mut s)?;
        // The software provider opens no device: a device named for it would be ignored.
        if let (IbProvider::Soft, Some((name, port))) = (s.provider, &s.device) {
            return Err(Error::config(
                "POLYRAIL_IB_DEVICE",
                format!("{name}:{port}"),
                "no device with POLYRAIL_IB_PROVIDER=soft (the software provider uses none)",
            ));
        }
        // At or above the credits, the one block a SYNC takes would make its receiver SYNC
        // back at once: two idle processes would trade SYNCs for ever.
        if s.sync_limit >= s.credits {
            return Err(Error::config(
                "POLYRAIL_IB_SYNC_LIMIT",
                s.sync_limit.to_string(),
                format!("below POLYRAIL_IB_CREDITS ({})", s.credits),
            ));
        }
        Ok(s)
    }
}

/// Every variable of the `ib` channel.
pub static VARS: &[Var<IbSettings>] = &[
    Var {
        info: VarInfo {
            name: "POLYRAIL_IB_PROVIDER",
            default: "auto",
            doc: "RDMA provider of the ib channel: auto, verbs or soft",
        },
        apply: |c, v| {
            let choices = [("auto", IbProvider::Auto), ("verbs", IbProvider::Verbs), ("soft", IbProvider::Soft)];
            set(&mut c.provider, v.one_of(&choices, "auto, verbs or soft"))
        },
    },
    Var {
        info: VarInfo {
            name: "POLYRAIL_IB_DEVICE",
            default: "the first device",
            doc: "RDMA device and port NAME[:PORT], e.g. rxe0:1",
        },
        apply: |c, v| {
            let (name, port) = match v.text.split_once(':') {
                Some((n, p)) => (n, p.parse::<u8>().ok().filter(|&p| p >= 1)),
                None => (v.text, Some(1)),
            };
            match port {
                Some(port) if !name.is_empty() => set(&mut c.device, Ok(Some((name.to_owned(), port)))),
                _ => Err(v.bad("NAME or NAME:PORT with PORT from 1, e.g. rxe0:1")),
            }
        },
    },
    Var {
        info: VarInfo { name: "POLYRAIL_IB_GID_INDEX", default: "0", doc: "GID index for RoCE addressing" },
        apply: |c, v| set(&mut c.gid_index, v.text.parse().map_err(|_| v.bad("an index from 0 to 255"))),
    },
    Var {
        info: VarInfo { name: "POLYRAIL_IB_CREDITS", default: "64", doc: "blocks per peer in the ib eager ring" },
        apply: |c, v| set(&mut c.credits, v.count_in(4, 4096)),
    },
    Var {
        info: VarInfo { name: "POLYRAIL_IB_BLOCK", default: "8k", doc: "payload bytes per ib eager ring block" },
        apply: |c, v| {
            let n = v.size_in(256, 1 << 20)?;
            if n % 64 != 0 {
                return Err(v.bad("a multiple of 64 bytes from 256 to 1m"));
            }
            set(&mut c.block, Ok(n))
        },
    },
    Var {
        info: VarInfo { name: "POLYRAIL_IB_EAGER_LIMIT", default: "8k", doc: "largest message sent eagerly over ib" },
        apply: |c, v| set(&mut c.eager_limit, v.size_in(0, MAX_EAGER_MESSAGE)),
    },
    Var {
        info: VarInfo {
            name: "POLYRAIL_IB_SYNC_LIMIT",
            default: "2",
            doc: "free blocks under which a receiver returns credits at once",
        },
        apply: |c, v| set(&mut c.sync_limit, v.count_in(2, 4096)),
    },
    Var {
        info: VarInfo {
            name: "POLYRAIL_IB_BOUNCE",
            default: "64k",
            doc: "largest ib rendezvous copied through pre-registered buffers, 0 = never",
        },
        apply: |c, v| set(&mut c.bounce, v.size_in(0, 16 << 20)),
    },
    Var {
        info: VarInfo {
            name: "POLYRAIL_IB_ACK_TIMEOUT",
            default: "14",
            doc: "verbs queue pairs' ack timeout, 4.096 us x 2^N (14: 67 ms)",
        },
        // 0 would be an infinite timeout: a peer that is gone would never be noticed.
        apply: |c, v| set(&mut c.ack_timeout, v.count_in(1, 31).map(|n| n as u8)),
    },
    Var {
        info: VarInfo {
            name: "POLYRAIL_IB_COMPACT",
            default: "on",
            doc: "on or off: MTU-sized ib packets without header in streams of like messages",
        },
        apply: |c, v| set(&mut c.compact, v.one_of(&[("on", true), ("off", false)], "on or off")),
    },
];

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(vars: &[(&str, &str)]) -> Result<IbSettings> {
        IbSettings::from_config(&Config::from_vars(vars.iter().copied())?)
    }

    #[test]
    fn variables_apply_and_bad_values_are_named() {
        let ib = cfg(&[("POLYRAIL_IB_DEVICE", "rxe0:2"), ("POLYRAIL_IB_CREDITS", "16")]).unwrap();
        assert_eq!((ib.device, ib.credits), (Some(("rxe0".into(), 2)), 16));
        assert_eq!(cfg(&[("POLYRAIL_IB_BOUNCE", "0")]).unwrap().bounce, 0);
        assert!(!cfg(&[("POLYRAIL_IB_COMPACT", "off")]).unwrap().compact);
        let e = cfg(&[("POLYRAIL_IB_COMPACT", "yes")]).unwrap_err().to_string();
        assert!(e.contains("POLYRAIL_IB_COMPACT") && e.contains("on or off"), "{e}");
        assert_eq!(cfg(&[("POLYRAIL_IB_ACK_TIMEOUT", "20")]).unwrap().ack_timeout, 20);
        let e = cfg(&[("POLYRAIL_IB_SYNC_LIMIT", "1")]).unwrap_err().to_string();
        assert!(e.contains("a whole number from 2 to 4096"), "{e}");
        let e = cfg(&[("POLYRAIL_IB_EAGER_LIMIT", "512m")]).unwrap_err().to_string();
        assert!(e.contains("POLYRAIL_IB_EAGER_LIMIT") && e.contains("256m"), "{e}");
        for (var, bad) in [
            ("POLYRAIL_IB_PROVIDER", "hca"),
            ("POLYRAIL_IB_DEVICE", "rxe0:0"),
            ("POLYRAIL_IB_DEVICE", ":1"),
            ("POLYRAIL_IB_BLOCK", "1000"),
            ("POLYRAIL_IB_CREDITS", "2"),
            ("POLYRAIL_IB_SYNC_LIMIT", "1"),
            ("POLYRAIL_IB_BOUNCE", "32m"),
            ("POLYRAIL_IB_ACK_TIMEOUT", "0"),
            ("POLYRAIL_IB_ACK_TIMEOUT", "32"),
            ("POLYRAIL_IB_BOUNCE", "some"),
        ] {
            let e = cfg(&[(var, bad)]).unwrap_err().to_string();
            assert!(e.contains(var) && e.contains(bad), "{var}={bad}: {e}");
        }
        let e = cfg(&[("POLYRAIL_IB_CREDITS", "8"), ("POLYRAIL_IB_SYNC_LIMIT", "9")]).unwrap_err().to_string();
        assert!(e.contains("POLYRAIL_IB_SYNC_LIMIT") && e.contains("below POLYRAIL_IB_CREDITS"), "{e}");
        // Equal: a SYNC's own block would make its receiver SYNC back, for ever.
        let e = cfg(&[("POLYRAIL_IB_CREDITS", "8"), ("POLYRAIL_IB_SYNC_LIMIT", "8")]).unwrap_err().to_string();
        assert!(e.contains("below POLYRAIL_IB_CREDITS (8)"), "{e}");
        let e = cfg(&[("POLYRAIL_IB_PROVIDER", "soft"), ("POLYRAIL_IB_DEVICE", "mlx5_0")]).unwrap_err().to_string();
        assert!(e.contains("POLYRAIL_IB_DEVICE") && e.contains("software provider"), "{e}");
    }

    #[test]
    fn defaults_written_as_values_give_the_defaults() {
        for v in VARS.iter().filter(|v| v.info.default != "the first device") {
            let mut s = IbSettings::default();
            v.apply(&mut s, v.info.default).unwrap();
            assert_eq!(s, IbSettings::default(), "{}={}", v.info.name, v.info.default);
        }
    }

    #[test]
    fn rendezvous_starts_above_the_eager_limit() {
        let r = cfg(&[("POLYRAIL_IB_EAGER_LIMIT", "32k")]).unwrap().rndv_from();
        assert_eq!(r[0].from, (32 << 10) + 1);
        assert!(r[0].reason.contains("POLYRAIL_IB_EAGER_LIMIT=32k"), "{}", r[0].reason);
    }
}
