//! The settings of the `shm` channel (its `POLYRAIL_SHM_*` variables) and of the `cma` channel
//! (`POLYRAIL_CMA_THRESHOLD`, `POLYRAIL_TUNING` and the tuning file), each declared once.

use polyrail_core::config::{
    apply_others, parse_class_sizes, read_small_file, set, ClassSizes, Config, Effective, Var, VarInfo,
};
use polyrail_core::policy::topology::TopoClass;
use polyrail_core::{format_size, parse_size, Result, RndvFrom};

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

/// Settings of the `cma` channel: where single copy starts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CmaSettings {
    /// `POLYRAIL_CMA_THRESHOLD`: smallest message sent by single copy, overall or per topology
    /// class. Default: from the channels' cost models and the class (see `polyrail info`).
    pub threshold: ClassSizes,
    /// `POLYRAIL_TUNING`: a file written by `polyrail tune` with single-copy thresholds
    /// measured on this machine, per class; used where `POLYRAIL_CMA_THRESHOLD` sets none. The
    /// path and the thresholds it gave.
    pub tuning: Option<(String, ClassSizes)>,
}

impl CmaSettings {
    /// The settings `config` gives: the defaults, with each of [`CMA_VARS`] among
    /// [`Config::others`] applied in order.
    pub fn from_config(config: &Config) -> Result<CmaSettings> {
        let mut s = CmaSettings::default();
        apply_others(CMA_VARS, config, &mut s)?;
        Ok(s)
    }

    /// Where `cma` starts one-sided copies by class: `POLYRAIL_CMA_THRESHOLD`, else the tuning
    /// file's measurements ([`polyrail_core::TransportAttr::rndv_from`]).
    pub fn rndv_from(&self) -> Vec<RndvFrom> {
        let mut out = Vec::new();
        let mut add = |sizes: &ClassSizes, reason: &str| {
            let entries = sizes.per_class.iter().map(|&(c, s)| (Some(c), s)).chain(sizes.all.map(|s| (None, s)));
            out.extend(entries.map(|(class, from)| RndvFrom { class, from, reason: reason.to_owned() }));
        };
        add(&self.threshold, "POLYRAIL_CMA_THRESHOLD");
        if let Some((path, sizes)) = &self.tuning {
            add(sizes, &format!("measured by `polyrail tune`, POLYRAIL_TUNING={path}"));
        }
        out
    }

    /// Each variable's effective value; `POLYRAIL_CMA_THRESHOLD` comes from the tuning file
    /// where the environment sets none.
    pub fn effective(&self, given: &dyn Fn(&str) -> Option<String>) -> Vec<Effective> {
        let mut all = polyrail_core::config::effective_of(&polyrail_core::config::infos(CMA_VARS), given);
        if let (Some(e), Some((path, sizes))) = (all.first_mut(), &self.tuning) {
            if given(e.var.name).is_none() {
                (e.value, e.source) = (sizes.to_string(), format!("tuning file {path}"));
            }
        }
        all
    }
}

/// Every variable of the `cma` channel (the threshold first).
pub static CMA_VARS: &[Var<CmaSettings>] = &[
    Var {
        info: VarInfo {
            name: "POLYRAIL_CMA_THRESHOLD",
            default: "by topology class",
            doc: "smallest single-copy message: `32k` or `shared-l3:16k,socket:4k`",
        },
        apply: |c, v| set(&mut c.threshold, parse_class_sizes(v.var, v.text)),
    },
    Var {
        info: VarInfo {
            name: "POLYRAIL_TUNING",
            default: "none",
            doc: "file of measured thresholds written by `polyrail tune`",
        },
        apply: |c, v| {
            let text = read_small_file(v.text)
                .map_err(|e| v.bad(&format!("a readable file written by `polyrail tune` ({e})")))?;
            let sizes =
                parse_tuning(&text).map_err(|why| v.bad(&format!("a file written by `polyrail tune` ({why})")))?;
            c.tuning = Some((v.text.to_owned(), sizes));
            Ok(())
        },
    },
];

/// Parses a tuning file: `#` comments, and lines `cma_threshold CLASS SIZE`.
pub fn parse_tuning(text: &str) -> std::result::Result<ClassSizes, String> {
    let mut out = ClassSizes::default();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let f: Vec<&str> = line.split_whitespace().collect();
        match f[..] {
            ["cma_threshold", class, size] => {
                let class =
                    TopoClass::from_name(class).ok_or_else(|| format!("line {}: `{class}` is not a class", i + 1))?;
                if out.per_class.iter().any(|&(c, _)| c == class) {
                    return Err(format!("line {}: a second cma_threshold for `{}`", i + 1, class.name()));
                }
                let size = parse_size(size).ok_or_else(|| format!("line {}: `{size}` is not a size", i + 1))?;
                out.per_class.push((class, size));
            }
            _ => return Err(format!("line {}: expected `cma_threshold CLASS SIZE`, got `{line}`", i + 1)),
        }
    }
    Ok(out)
}

/// Writes a tuning file that [`parse_tuning`] reads.
pub fn format_tuning(header: &str, sizes: &ClassSizes) -> String {
    let mut s = String::new();
    for line in header.lines() {
        s.push_str("# ");
        s.push_str(line);
        s.push('\n');
    }
    for (class, size) in &sizes.per_class {
        s.push_str(&format!("cma_threshold {} {}\n", class.name(), format_size(*size)));
    }
    s
}

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

    fn cma(vars: &[(&str, &str)]) -> Result<CmaSettings> {
        CmaSettings::from_config(&Config::from_vars(vars.iter().copied())?)
    }

    #[test]
    fn cma_thresholds() {
        let c = cma(&[("POLYRAIL_CMA_THRESHOLD", "8k,shared-l3:16k,socket:4k")]).unwrap();
        assert_eq!(c.threshold.get(TopoClass::SharedL3), Some(16384));
        assert_eq!(c.threshold.get(TopoClass::Socket), Some(4096));
        assert_eq!(c.threshold.get(TopoClass::CrossSocket), Some(8192));
        let e = cma(&[("POLYRAIL_CMA_THRESHOLD", "l9:4k")]).unwrap_err().to_string();
        assert!(e.contains("l9") && e.contains("shared-l3"), "{e}");
        assert!(cma(&[("POLYRAIL_CMA_THRESHOLD", "socket:lots")]).is_err());
        // A size given twice is refused (which one would win is nowhere said).
        for v in ["8k,16k", "socket:4k,socket:8k"] {
            let e = cma(&[("POLYRAIL_CMA_THRESHOLD", v)]).unwrap_err().to_string();
            assert!(e.contains("given twice"), "{e}");
        }
        assert!(parse_tuning("cma_threshold socket 4k\ncma_threshold socket 8k").unwrap_err().contains("second"));
    }

    #[test]
    fn tuning_files() {
        let t = ClassSizes { all: None, per_class: vec![(TopoClass::SharedL3, 48 << 10), (TopoClass::Socket, 4096)] };
        let text = format_tuning("measured by a test\non this machine", &t);
        assert_eq!(parse_tuning(&text).unwrap(), t);
        assert!(parse_tuning("cma_threshold l9 4k").unwrap_err().contains("`l9` is not a class"));
        assert!(parse_tuning("threshold 4k").unwrap_err().contains("line 1"));
        let path = std::env::temp_dir().join(format!("polyrail-tuning-test-{}", std::process::id()));
        std::fs::write(&path, &text).unwrap();
        let c = cma(&[("POLYRAIL_TUNING", path.to_str().unwrap())]).unwrap();
        assert_eq!(c.tuning.as_ref().unwrap().1, t);
        std::fs::remove_file(&path).unwrap();
        let e = cma(&[("POLYRAIL_TUNING", "/nonexistent/tuning")]).unwrap_err().to_string();
        assert!(e.contains("POLYRAIL_TUNING") && e.contains("/nonexistent/tuning"), "{e}");
    }

    /// A FIFO is refused at once: opening it would wait for a writer for ever.
    #[test]
    fn a_tuning_file_that_is_a_fifo_is_refused_without_waiting() {
        let path = std::env::temp_dir().join(format!("polyrail-tuning-fifo-{}", std::process::id()));
        let c_path = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path; mkfifo only creates a file.
        assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);
        let e = cma(&[("POLYRAIL_TUNING", path.to_str().unwrap())]).unwrap_err().to_string();
        std::fs::remove_file(&path).unwrap();
        assert!(e.contains("POLYRAIL_TUNING") && e.contains("not a regular file"), "{e}");
    }
}
