//! The link model's settings: its `POLYRAIL_LINK_*` variables, declared once.

use crate::model::Domain;
use crate::profile::Profile;
use polyrail_core::config::{apply_others, Config, Var, VarInfo};
use polyrail_core::Result;

/// Settings of the link model (`POLYRAIL_LINK_*`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LinkSettings {
    /// `POLYRAIL_LINK_PROFILE`: `none` (default), `prism`, either as `name/factor` to divide
    /// every bandwidth by `factor`.
    pub profile: Profile,
}

impl LinkSettings {
    /// The settings `config` gives: the defaults, with each `POLYRAIL_LINK_*` variable among
    /// [`Config::others`] applied in order.
    pub fn from_config(config: &Config) -> Result<LinkSettings> {
        let mut s = LinkSettings::default();
        apply_others(VARS, config, &mut s)?;
        Ok(s)
    }
}

/// Every variable of the link model, for the factories of the channels that pace with it to
/// list ([`variables`]).
pub static VARS: &[Var<LinkSettings>] = &[Var {
    info: VarInfo {
        name: "POLYRAIL_LINK_PROFILE",
        default: "none",
        doc: "link model (emulation): none, prism, or either /N to divide every bandwidth by N (prism/4)",
    },
    apply: |s, v| {
        s.profile = Profile::parse(v.text).ok_or_else(|| {
            v.bad("`none`, `prism`, or either followed by /N with N from 1e-6 to 1e6 (prism/4, prism/2.5)")
        })?;
        Ok(())
    },
}];

/// The name, default and doc of each variable, for `ChannelFactory::variables`.
pub fn variables() -> Vec<VarInfo> {
    polyrail_core::config::infos(VARS)
}

/// This process's memory domain as the job's layout gives it: `POLYRAIL_DOMAIN` (core's; 0 the
/// host, k device k), or the SCIF layer's `POLYRAIL_SCIF_NODE` where that overrides it (among
/// [`Config::others`]; a value that is not a number is the SCIF layer's to refuse).
pub fn domain(config: &Config) -> Domain {
    config
        .others
        .iter()
        .rev()
        .find(|(k, _)| k == "POLYRAIL_SCIF_NODE")
        .and_then(|(_, v)| v.trim().parse::<u16>().ok())
        .map_or(Domain::from_scif_node(config.domain), Domain::from_scif_node)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link(vars: &[(&str, &str)]) -> Result<LinkSettings> {
        LinkSettings::from_config(&Config::from_vars(vars.iter().copied())?)
    }

    #[test]
    fn variables_apply_and_bad_values_are_named() {
        assert!(link(&[]).unwrap().profile.is_none());
        assert_eq!(link(&[("POLYRAIL_LINK_PROFILE", "prism/4")]).unwrap().profile.name, "prism/4");
        for bad in ["fast", "prism/0", "prism/"] {
            let e = link(&[("POLYRAIL_LINK_PROFILE", bad)]).unwrap_err().to_string();
            assert!(e.contains("POLYRAIL_LINK_PROFILE") && e.contains(bad), "{bad}: {e}");
        }
        for v in VARS {
            let mut s = LinkSettings::default();
            v.apply(&mut s, v.info.default).unwrap();
            assert_eq!(s, LinkSettings::default(), "{}", v.info.name);
        }
    }

    #[test]
    fn domain_from_the_layout() {
        let c = |v: &[(&str, &str)]| Config::from_vars(v.iter().copied()).unwrap();
        assert_eq!(domain(&c(&[])), Domain::Host);
        assert_eq!(domain(&c(&[("POLYRAIL_SCIF_NODE", "0")])), Domain::Host);
        assert_eq!(domain(&c(&[("POLYRAIL_SCIF_NODE", "2")])), Domain::Device(2));
        assert_eq!(domain(&c(&[("POLYRAIL_SCIF_NODE", "x")])), Domain::Host);
        assert_eq!(domain(&c(&[("POLYRAIL_DOMAIN", "1")])), Domain::Device(1), "the layout's domain");
        assert_eq!(domain(&c(&[("POLYRAIL_DOMAIN", "1"), ("POLYRAIL_SCIF_NODE", "0")])), Domain::Host);
    }
}
