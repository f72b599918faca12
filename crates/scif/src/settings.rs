//! The SCIF provider's and the `scif` channel's settings: their `POLYRAIL_SCIF_*` variables,
//! declared once.

use polyrail_core::config::{apply_others, set, Config, Var, VarInfo};
use polyrail_core::Result;
use std::path::PathBuf;

/// Settings of the software SCIF provider and the `scif` channel (`POLYRAIL_SCIF_*`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScifSettings {
    /// `POLYRAIL_SCIF_NODE`: this process's SCIF node (0 the host, k device k). Default: the
    /// process's domain (`POLYRAIL_DOMAIN`).
    pub node: Option<u16>,
    /// `POLYRAIL_SCIF_NODES`: SCIF nodes of the physical node, host included. Default: the
    /// node's domains (`POLYRAIL_DOMAINS`), at least one more than this process's node.
    pub nodes: Option<u16>,
    /// `POLYRAIL_SCIF_DIR`: where the job's endpoint directory is made. Default:
    /// `$XDG_RUNTIME_DIR`, else `/tmp`.
    pub dir: Option<PathBuf>,
    /// `POLYRAIL_SCIF_RING`: bytes of each receive ring of the `scif` channel. Default 256k.
    pub ring: usize,
}

impl Default for ScifSettings {
    fn default() -> Self {
        ScifSettings { node: None, nodes: None, dir: None, ring: 256 << 10 }
    }
}

impl ScifSettings {
    /// The settings `config` gives: the defaults, with each `POLYRAIL_SCIF_*` variable among
    /// [`Config::others`] applied in order.
    pub fn from_config(config: &Config) -> Result<ScifSettings> {
        let mut s = ScifSettings::default();
        apply_others(VARS, config, &mut s)?;
        if let (Some(node), Some(nodes)) = (s.node, s.nodes) {
            if node >= nodes {
                return Err(polyrail_core::Error::config(
                    "POLYRAIL_SCIF_NODE",
                    node.to_string(),
                    format!("a node below POLYRAIL_SCIF_NODES={nodes}"),
                ));
            }
        }
        Ok(s)
    }
}

fn node(v: &polyrail_core::config::Value<'_>, lo: u16) -> Result<Option<u16>> {
    match v.text {
        "" | "domain" | "auto" => Ok(None),
        t => t
            .parse::<u16>()
            .ok()
            .filter(|&n| n >= lo)
            .map(Some)
            .ok_or_else(|| v.bad(&format!("a number from {lo} to 65535"))),
    }
}

/// Every variable of the SCIF provider and the `scif` channel.
pub static VARS: &[Var<ScifSettings>] = &[
    Var {
        info: VarInfo {
            name: "POLYRAIL_SCIF_NODE",
            default: "domain",
            doc: "SCIF node of this process: 0 the host, k device k (default: POLYRAIL_DOMAIN)",
        },
        apply: |c, v| set(&mut c.node, node(v, 0)),
    },
    Var {
        info: VarInfo {
            name: "POLYRAIL_SCIF_NODES",
            default: "auto",
            doc: "SCIF nodes of this physical node, host included (default: POLYRAIL_DOMAINS)",
        },
        apply: |c, v| set(&mut c.nodes, node(v, 1)),
    },
    Var {
        info: VarInfo {
            name: "POLYRAIL_SCIF_DIR",
            default: "$XDG_RUNTIME_DIR or /tmp",
            doc: "directory of the software SCIF provider's endpoint sockets",
        },
        apply: |c, v| {
            let dir = match v.text {
                "" | "$XDG_RUNTIME_DIR or /tmp" => None,
                t if t.starts_with('/') => Some(PathBuf::from(t)),
                _ => return Err(v.bad("an absolute directory path")),
            };
            set(&mut c.dir, Ok(dir))
        },
    },
    Var {
        info: VarInfo {
            name: "POLYRAIL_SCIF_RING",
            default: "256k",
            doc: "bytes of each receive ring of the scif channel",
        },
        apply: |c, v| {
            let n = v.size_in(64 << 10, 64 << 20)?;
            if n % crate::page_size() != 0 {
                return Err(v.bad("whole pages from 64k to 64m"));
            }
            set(&mut c.ring, Ok(n))
        },
    },
];

#[cfg(test)]
mod tests {
    use super::*;

    fn scif(vars: &[(&str, &str)]) -> Result<ScifSettings> {
        ScifSettings::from_config(&Config::from_vars(vars.iter().copied())?)
    }

    #[test]
    fn variables_apply_and_bad_values_are_named() {
        let s =
            scif(&[("POLYRAIL_SCIF_NODE", "2"), ("POLYRAIL_SCIF_NODES", "3"), ("POLYRAIL_SCIF_RING", "1m")]).unwrap();
        assert_eq!((s.node, s.nodes, s.ring), (Some(2), Some(3), 1 << 20));
        for (var, bad) in [
            ("POLYRAIL_SCIF_NODE", "-1"),
            ("POLYRAIL_SCIF_NODES", "0"),
            ("POLYRAIL_SCIF_DIR", "relative"),
            ("POLYRAIL_SCIF_RING", "1k"),
        ] {
            let e = scif(&[(var, bad)]).unwrap_err().to_string();
            assert!(e.contains(var) && e.contains(bad), "{var}={bad}: {e}");
        }
        let e = scif(&[("POLYRAIL_SCIF_NODE", "3"), ("POLYRAIL_SCIF_NODES", "3")]).unwrap_err().to_string();
        assert!(e.contains("POLYRAIL_SCIF_NODES=3"), "{e}");
        for v in VARS {
            let mut s = ScifSettings::default();
            v.apply(&mut s, v.info.default).unwrap();
            assert_eq!(s, ScifSettings::default(), "{}", v.info.name);
        }
    }
}
