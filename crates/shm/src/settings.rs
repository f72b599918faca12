//! The `shm` channel's settings: its `POLYRAIL_SHM_*` variables, declared once.

use polyrail_core::config::{apply_others, set, Config, Var, VarInfo};
use polyrail_core::Result;

/// Settings of the `shm` channel (`POLYRAIL_SHM_*`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShmSettings {
    /// `POLYRAIL_SHM_SLOTS`: records (one per message) and 64-byte body slots in each
    /// shared-memory ring (power of two, 16..=65536). Default 64: a small ring's lines stay in
    /// both caches (8 B ping-pong about 10 ns faster than with 256, 1 KiB 40-150 ns), at about
    /// 10 % of the streaming rate of 64-512 B messages.
    pub slots: usize,
    /// `POLYRAIL_SHM_CELL_SIZE`: bytes per send cell (4k..=1m). Default 16k.
    pub cell_size: usize,
    /// `POLYRAIL_SHM_CELLS`: send cells per process (4..=65536). Default 128.
    pub cells: usize,
}

impl Default for ShmSettings {
    fn default() -> Self {
        ShmSettings { slots: 64, cell_size: 16 << 10, cells: 128 }
    }
}

impl ShmSettings {
    /// The settings `config` gives: the defaults, with each `POLYRAIL_SHM_*` variable among
    /// [`Config::others`] applied in order.
    pub fn from_config(config: &Config) -> Result<ShmSettings> {
        let mut s = ShmSettings::default();
        apply_others(VARS, config, &mut s)?;
        Ok(s)
    }
}

/// Every variable of the `shm` channel.
pub static VARS: &[Var<ShmSettings>] = &[
    Var {
        info: VarInfo {
            name: "POLYRAIL_SHM_SLOTS",
            default: "64",
            doc: "records and 64-byte body slots per shared-memory ring (power of two)",
        },
        apply: |c, v| {
            let n = v.count_in(16, 65536)?;
            if !n.is_power_of_two() {
                return Err(v.bad("a power of two from 16 to 65536"));
            }
            set(&mut c.slots, Ok(n))
        },
    },
    Var {
        info: VarInfo { name: "POLYRAIL_SHM_CELL_SIZE", default: "16k", doc: "bytes per send cell" },
        apply: |c, v| set(&mut c.cell_size, v.size_in(4096, 1 << 20)),
    },
    Var {
        info: VarInfo { name: "POLYRAIL_SHM_CELLS", default: "128", doc: "send cells per process" },
        apply: |c, v| set(&mut c.cells, v.count_in(4, 65536)),
    },
];

#[cfg(test)]
mod tests {
    use super::*;

    fn shm(vars: &[(&str, &str)]) -> Result<ShmSettings> {
        ShmSettings::from_config(&Config::from_vars(vars.iter().copied())?)
    }

    #[test]
    fn variables_apply_and_bad_values_are_named() {
        let s = shm(&[("POLYRAIL_SHM_SLOTS", "256"), ("POLYRAIL_SHM_CELLS", "8"), ("POLYRAIL_SHM_CELL_SIZE", "32k")]);
        assert_eq!(s.unwrap(), ShmSettings { slots: 256, cells: 8, cell_size: 32 << 10 });
        for (var, bad) in [
            ("POLYRAIL_SHM_SLOTS", "100"),
            ("POLYRAIL_SHM_SLOTS", "8"),
            ("POLYRAIL_SHM_CELLS", "2"),
            ("POLYRAIL_SHM_CELL_SIZE", "2m"),
        ] {
            let e = shm(&[(var, bad)]).unwrap_err().to_string();
            assert!(e.contains(var) && e.contains(bad), "{var}={bad}: {e}");
        }
        for v in VARS {
            let mut s = ShmSettings::default();
            v.apply(&mut s, v.info.default).unwrap();
            assert_eq!(s, ShmSettings::default(), "{}", v.info.name);
        }
    }
}
