//! Every `POLYRAIL_*` variable, declared once: its name, its default, what it does and how a
//! value applies to a [`Config`].

use super::{
    parse_routes, parse_transports, ApartSingleCopy, Config, LogLevel, NearEager, PlacementMode, PmiVersion,
    PollPolicy, SkewPolicy, SplitShare, SplitThreshold, StreamEager, WaitMode, MAX_EAGER_MESSAGE,
};
use crate::error::{Error, Result};
use crate::size::{format_size, parse_size};

/// What a variable is, for lists and errors: its name, its default and what it does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VarInfo {
    /// The variable's name (`POLYRAIL_...`).
    pub name: &'static str,
    /// The default, as the variable would write it (or what decides it).
    pub default: &'static str,
    /// What it does, in one line (for `--help`, `polyrail info --config` and errors).
    pub doc: &'static str,
}

/// One variable of the settings `S` (core's [`Config`], or a channel crate's own): declared
/// once, with its default, what it does and how a value applies.
pub struct Var<S: 'static = Config> {
    /// Name, default and doc.
    pub info: VarInfo,
    /// Checks a value and applies it; the error names the variable, the value and what is
    /// accepted.
    pub apply: fn(&mut S, &Value<'_>) -> Result<()>,
}

impl<S> std::fmt::Debug for Var<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.info.name)
    }
}

impl<S> Var<S> {
    /// Applies `value` to `settings`.
    pub fn apply(&self, settings: &mut S, value: &str) -> Result<()> {
        (self.apply)(settings, &Value { var: self.info.name, text: value })
    }
}

/// The name, default and doc of each of `vars`.
pub fn infos<S>(vars: &[Var<S>]) -> Vec<VarInfo> {
    vars.iter().map(|v| v.info).collect()
}

/// Applies to `settings`, in the order given, the values [`Config::others`] holds for `vars`
/// (a channel crate's own variables).
pub fn apply_others<S>(vars: &[Var<S>], config: &Config, settings: &mut S) -> Result<()> {
    for (name, value) in &config.others {
        if let Some(var) = vars.iter().find(|v| v.info.name == name) {
            var.apply(settings, value)?;
        }
    }
    Ok(())
}

/// A value given to a variable, with the checks the tables' entries share.
pub struct Value<'a> {
    /// The variable's name.
    pub var: &'static str,
    /// The value as given.
    pub text: &'a str,
}

/// A setting that is `auto`, `off` or a size ([`Value::auto_off_size`]).
pub enum AutoOffSize {
    /// `auto`.
    Auto,
    /// `off`.
    Off,
    /// A size.
    Size(usize),
}

impl Value<'_> {
    /// The error for this value: `accepted` says what would do.
    pub fn bad(&self, accepted: &str) -> Error {
        Error::config(self.var, self.text, accepted)
    }

    /// A size from `lo` to `hi`.
    pub fn size_in(&self, lo: usize, hi: usize) -> Result<usize> {
        match parse_size(self.text) {
            Some(n) if (lo..=hi).contains(&n) => Ok(n),
            _ => Err(self.bad(&format!(
                "a size from {} to {} (bytes, or with a k, m or g suffix)",
                format_size(lo),
                format_size(hi)
            ))),
        }
    }

    /// `auto`, `off`, or a size from `lo` to `hi`.
    pub fn auto_off_size(&self, lo: usize, hi: usize) -> Result<AutoOffSize> {
        match self.text {
            "auto" => Ok(AutoOffSize::Auto),
            "off" => Ok(AutoOffSize::Off),
            _ => self.size_in(lo, hi).map(AutoOffSize::Size).map_err(|_| {
                self.bad(&format!("`auto`, `off` or a size from {} to {}", format_size(lo), format_size(hi)))
            }),
        }
    }

    /// A whole number from `lo` to `hi`.
    pub fn count_in(&self, lo: usize, hi: usize) -> Result<usize> {
        match self.text.parse::<usize>() {
            Ok(n) if (lo..=hi).contains(&n) => Ok(n),
            _ => Err(self.bad(&format!("a whole number from {lo} to {hi}"))),
        }
    }

    /// One of `choices` (word, meaning); `accepted` lists them for the error.
    pub fn one_of<T: Copy>(&self, choices: &[(&str, T)], accepted: &str) -> Result<T> {
        choices.iter().find(|(w, _)| *w == self.text).map(|&(_, t)| t).ok_or_else(|| self.bad(accepted))
    }
}

/// Stores a checked value in its field.
pub fn set<T>(field: &mut T, value: Result<T>) -> Result<()> {
    *field = value?;
    Ok(())
}

/// Every variable polyrail reads, in the order `polyrail info --config` lists them.
pub static VARS: &[Var] = &[
    Var {
        info: VarInfo {
            name: "POLYRAIL_TRANSPORTS",
            default: "all",
            doc: "channels to use: `all`, a list such as `shm,cma`, or `^cma` to deny",
        },
        apply: |c, v| set(&mut c.transports, parse_transports(v.var, v.text)),
    },
    Var {
        info: VarInfo {
            name: "POLYRAIL_ROUTE",
            default: "none",
            doc: "route overrides CLASS:LO-HI:CHANNEL[/PROTOCOL],... e.g. all:0-64k:shm,socket:1m-:cma/get",
        },
        apply: |c, v| set(&mut c.routes, parse_routes(v.var, v.text)),
    },
    Var {
        info: VarInfo {
            name: "POLYRAIL_SPLIT_THRESHOLD",
            default: "auto",
            doc: "smallest single-copy message both processes copy: auto, off or a size",
        },
        apply: |c, v| {
            c.split_threshold = match v.auto_off_size(4096, 1 << 40)? {
                AutoOffSize::Auto => SplitThreshold::Auto,
                AutoOffSize::Off => SplitThreshold::Off,
                AutoOffSize::Size(n) => SplitThreshold::From(n),
            };
            Ok(())
        },
    },
    Var {
        info: VarInfo {
            name: "POLYRAIL_SPLIT_SHARE",
            default: "auto",
            doc: "receiver's part of a split single copy: auto (measured per peer and size) or a percentage",
        },
        apply: |c, v| {
            c.split_share = match v.text {
                "auto" => SplitShare::Auto,
                _ => SplitShare::Percent(
                    v.count_in(1, 99).map_err(|_| v.bad("`auto` or a percentage from 1 to 99"))? as u8
                ),
            };
            Ok(())
        },
    },
    Var {
        info: VarInfo {
            name: "POLYRAIL_STREAM_EAGER",
            default: "off",
            doc: "largest single-copy message sent eagerly in a stream of sends to a peer: off, auto or a size",
        },
        apply: |c, v| {
            c.stream_eager = match v.auto_off_size(0, MAX_EAGER_MESSAGE)? {
                AutoOffSize::Auto => StreamEager::Auto,
                AutoOffSize::Off => StreamEager::Off,
                AutoOffSize::Size(n) => StreamEager::UpTo(n),
            };
            Ok(())
        },
    },
    Var {
        info: VarInfo {
            name: "POLYRAIL_NEAR_EAGER",
            default: "auto",
            doc: "largest single-copy message sent eagerly while the peer's core shares a cache: auto (128k), off or \
                  a size",
        },
        apply: |c, v| {
            c.near_eager = match v.auto_off_size(0, MAX_EAGER_MESSAGE)? {
                AutoOffSize::Auto => NearEager::Auto,
                AutoOffSize::Off => NearEager::Off,
                AutoOffSize::Size(n) => NearEager::UpTo(n),
            };
            Ok(())
        },
    },
    Var {
        info: VarInfo {
            name: "POLYRAIL_APART_SINGLE_COPY",
            default: "auto",
            doc: "while the peer's core shares no cache (or copies to it run slowly), messages from this size by \
              single copy and smaller ones eagerly: auto (64k), off or a size",
        },
        apply: |c, v| {
            c.apart_single_copy = match v.auto_off_size(1, 1 << 40)? {
                AutoOffSize::Auto => ApartSingleCopy::Auto,
                AutoOffSize::Off => ApartSingleCopy::Off,
                AutoOffSize::Size(n) => ApartSingleCopy::From(n),
            };
            Ok(())
        },
    },
    Var {
        info: VarInfo {
            name: "POLYRAIL_PLACEMENT",
            default: "measure",
            doc: "placement of the peers' cores for those two and shm's cell filling: measure, near, middle or apart",
        },
        apply: |c, v| {
            let choices = [
                ("measure", PlacementMode::Measure),
                ("near", PlacementMode::Near),
                ("middle", PlacementMode::Middle),
                ("apart", PlacementMode::Apart),
            ];
            set(&mut c.placement, v.one_of(&choices, "`measure`, `near`, `middle` or `apart`"))
        },
    },
    Var {
        info: VarInfo { name: "POLYRAIL_EAGER_LIMIT", default: "64k", doc: "largest eager message through send cells" },
        apply: |c, v| set(&mut c.eager_limit, v.size_in(0, MAX_EAGER_MESSAGE)),
    },
    Var {
        info: VarInfo { name: "POLYRAIL_LOG", default: "warn", doc: "log level: error, warn, info, debug, trace" },
        apply: |c, v| {
            let choices = [
                ("error", LogLevel::Error),
                ("warn", LogLevel::Warn),
                ("info", LogLevel::Info),
                ("debug", LogLevel::Debug),
                ("trace", LogLevel::Trace),
            ];
            let lower = v.text.to_ascii_lowercase();
            let level = choices.iter().find(|(w, _)| *w == lower).map(|&(_, l)| l);
            set(&mut c.log, level.ok_or_else(|| v.bad("error, warn, info, debug or trace")))
        },
    },
    Var {
        info: VarInfo { name: "POLYRAIL_PMI", default: "1", doc: "PMI protocol spoken to the launcher: 1 or 2" },
        apply: |c, v| {
            let choices = [
                ("1", PmiVersion::Pmi1),
                ("pmi1", PmiVersion::Pmi1),
                ("2", PmiVersion::Pmi2),
                ("pmi2", PmiVersion::Pmi2),
            ];
            set(&mut c.pmi, v.one_of(&choices, "1 or 2"))
        },
    },
    Var {
        info: VarInfo {
            name: "POLYRAIL_PMI_TIMEOUT",
            default: "off",
            doc: "seconds an answer of the launcher (or the connection to PMI_PORT) may take (a fence waits for \
              every rank), or off",
        },
        apply: |c, v| {
            let accepted = "`off` or a number of seconds from 0.001 to a year, such as 600 or 2.5";
            c.pmi_timeout = if v.text == "off" {
                None
            } else {
                let secs = v.text.parse::<f64>().ok().filter(|s| (0.001..=365.0 * 86400.0).contains(s));
                Some(std::time::Duration::from_secs_f64(secs.ok_or_else(|| v.bad(accepted))?))
            };
            Ok(())
        },
    },
    Var {
        info: VarInfo {
            name: "POLYRAIL_WAIT",
            default: "adaptive",
            doc: "how to wait for arrivals: spin, block or adaptive",
        },
        apply: |c, v| {
            let choices = [("spin", WaitMode::Spin), ("block", WaitMode::Block), ("adaptive", WaitMode::Adaptive)];
            set(&mut c.wait, v.one_of(&choices, "spin, block or adaptive"))
        },
    },
    Var {
        info: VarInfo { name: "POLYRAIL_SKEW", default: "0:8:64k", doc: "skew feedback LIMIT:WINDOW:SIZE or off" },
        apply: |c, v| {
            let accepted = "`off` or LIMIT:WINDOW:SIZE such as 0:8:64k (WINDOW >= 1)";
            if v.text == "off" {
                c.skew = None;
                return Ok(());
            }
            let f: Vec<&str> = v.text.split(':').collect();
            let (Some(limit), Some(window), Some(eager_up_to)) = (
                f.first().and_then(|x| x.parse::<usize>().ok()),
                f.get(1).and_then(|x| x.parse().ok()).filter(|&n: &u32| n >= 1),
                f.get(2).and_then(|x| parse_size(x)),
            ) else {
                return Err(v.bad(accepted));
            };
            if f.len() != 3 {
                return Err(v.bad(accepted));
            }
            set(&mut c.skew, Ok(Some(SkewPolicy { limit, window, eager_up_to })))
        },
    },
    Var {
        info: VarInfo {
            name: "POLYRAIL_POLL",
            default: "dynamic:8",
            doc: "polling priority between channels: all, static:R or dynamic:H",
        },
        apply: |c, v| {
            let accepted = "all, static:R or dynamic:H with R, H from 1 to 100000";
            let n = |x: &str| x.parse::<u32>().ok().filter(|n| (1..=100_000).contains(n));
            c.poll = match v.text.split_once(':') {
                None if v.text == "all" => PollPolicy::All,
                Some(("static", r)) => PollPolicy::Static(n(r).ok_or_else(|| v.bad(accepted))?),
                Some(("dynamic", h)) => PollPolicy::Dynamic(n(h).ok_or_else(|| v.bad(accepted))?),
                _ => return Err(v.bad(accepted)),
            };
            Ok(())
        },
    },
    Var {
        info: VarInfo {
            name: "POLYRAIL_NODE",
            default: "unset",
            doc: "virtual node of this process (set by `polyrail run --layout`)",
        },
        apply: |c, v| set(&mut c.node, v.text.parse().map(Some).map_err(|_| v.bad("a node number from 0"))),
    },
    Var {
        info: VarInfo {
            name: "POLYRAIL_DOMAIN",
            default: "0",
            doc:
                "memory domain of this process within its node: 0 the host, k device k (set by `polyrail run --layout`)",
        },
        apply: |c, v| {
            set(&mut c.domain, v.text.parse().map_err(|_| v.bad("a domain number from 0 (the host) to 65535")))
        },
    },
    Var {
        info: VarInfo {
            name: "POLYRAIL_DOMAINS",
            default: "1",
            doc: "memory domains of this process's node, the host and its devices (set by `polyrail run --layout`)",
        },
        apply: |c, v| {
            let n = v.text.parse().ok().filter(|&n: &u16| n >= 1);
            set(&mut c.domains, n.ok_or_else(|| v.bad("a count of domains from 1 (the host alone) to 65535")))
        },
    },
];

/// A variable's effective value in one process, for `polyrail info --config` (as `ucx_info -c`).
#[derive(Clone, Debug)]
pub struct Effective {
    /// The variable.
    pub var: VarInfo,
    /// Its value as it applies.
    pub value: String,
    /// Where the value comes from: `environment`, `tuning file PATH` or `default`.
    pub source: String,
}

/// The effective value of every variable of core's table ([`VARS`]), with `given` telling which
/// the environment set; the channels report theirs ([`crate::ChannelFactory::effective`]).
pub fn effective(given: &dyn Fn(&str) -> Option<String>) -> Vec<Effective> {
    let infos: Vec<VarInfo> = VARS.iter().map(|v| v.info).collect();
    effective_of(&infos, given)
}

/// The effective value of each of `vars`: the environment's (`given`), else the default.
pub fn effective_of(vars: &[VarInfo], given: &dyn Fn(&str) -> Option<String>) -> Vec<Effective> {
    vars.iter()
        .map(|&var| {
            let (value, source) = match given(var.name) {
                Some(v) => (v, "environment".to_string()),
                None => (var.default.to_string(), "default".to_string()),
            };
            Effective { var, value, source }
        })
        .collect()
}

/// The variable named `name`.
pub fn var(name: &str) -> Option<&'static Var> {
    VARS.iter().find(|v| v.info.name == name)
}

/// The name of `known` that `name` most likely misspells: the nearest within three edits, or
/// one that holds it or that it holds (`POLYRAIL_CMA` for `POLYRAIL_CMA_THRESHOLD`).
pub fn did_you_mean<'a>(name: &str, known: &[&'a str]) -> Option<&'a str> {
    let upper = name.to_ascii_uppercase();
    let nearest = known.iter().map(|&k| (edit_distance(&upper, &k.to_ascii_uppercase()), k)).min_by_key(|&(d, _)| d);
    match nearest {
        // Three edits for a variable's name; fewer for a short one (`shn` is `shm`, `tcp` nothing).
        Some((d, k)) if d <= (k.len() / 3).min(3) => Some(k),
        _ => {
            known.iter().copied().find(|k| k.len() > 9 && upper.len() > 9 && (k.contains(&upper) || upper.contains(k)))
        }
    }
}

/// Levenshtein distance between two ASCII-ish strings (by chars).
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diag = row[0];
        row[0] = i + 1;
        for (j, &cb) in b.iter().enumerate() {
            let next = (diag + usize::from(ca != cb)).min(row[j] + 1).min(row[j + 1] + 1);
            diag = row[j + 1];
            row[j + 1] = next;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_defaults_apply() {
        for (i, v) in VARS.iter().map(|v| v.info).enumerate() {
            assert!(v.name.starts_with("POLYRAIL_"), "{}", v.name);
            assert!(VARS[..i].iter().all(|w| w.info.name != v.name), "{} twice", v.name);
            assert!(!v.doc.is_empty());
        }
        // A default written as a value gives the default configuration.
        for v in VARS.iter().filter(|v| !matches!(v.info.default, "none" | "unset" | "by topology class")) {
            let (name, default) = (v.info.name, v.info.default);
            let mut c = Config::default();
            v.apply(&mut c, default).unwrap_or_else(|e| panic!("{name}={default}: {e}"));
            assert_eq!(format!("{c:?}"), format!("{:?}", Config::default()), "{name}={default}");
        }
    }

    #[test]
    fn misspellings_find_their_variable() {
        let mut known: Vec<&str> = VARS.iter().map(|v| v.info.name).collect();
        known.push("POLYRAIL_IB_EAGER_LIMIT");
        let guess = |name: &str| did_you_mean(name, &known);
        assert_eq!(guess("POLYRAIL_TRANSPORT"), Some("POLYRAIL_TRANSPORTS"));
        assert_eq!(guess("POLYRAIL_SPLIT_THRESHOLDS"), Some("POLYRAIL_SPLIT_THRESHOLD"));
        assert_eq!(guess("polyrail_wait"), Some("POLYRAIL_WAIT"));
        assert_eq!(guess("POLYRAIL_IB_EAGER"), Some("POLYRAIL_IB_EAGER_LIMIT"));
        assert_eq!(guess("POLYRAIL_FROBNICATE"), None);
        assert_eq!(did_you_mean("shn", &["self", "shm", "cma", "ib"]), Some("shm"));
        assert_eq!(did_you_mean("tcp", &["self", "shm", "cma", "ib"]), None);
    }
}
