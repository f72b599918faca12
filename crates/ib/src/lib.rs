//! polyrail-ib: the DirectIB channel (`ib`), InfiniBand verbs issued by the process itself, as
//! DCFA-MPI and MVAPICH-PRISM's DirectIB do.
//!
//! - [`DirectIb`] carries every packet by RDMA write into a per-peer eager ring with credits
//!   (DCFA-MPI's EAGER / SYNC packets, tail magic polled by the receiver), and moves rendezvous
//!   data by RDMA read or write between registered user buffers.
//! - It is generic over a [`Provider`]: real verbs through rdma-core (cargo feature `verbs`),
//!   or the [`SoftProvider`], which implements the same semantics (RC queue pairs, completions,
//!   registered regions with keys, RDMA read and write) with `process_vm_readv/writev` between
//!   processes of one machine, for development and CI.
//!
//! [`open`] picks the provider from `POLYRAIL_IB_PROVIDER`.
#![deny(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]

mod bounce;
mod direct;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
mod packet;
pub mod provider;
pub mod settings;
mod soft;
#[cfg(feature = "verbs")]
pub mod verbs;

pub use direct::DirectIb;
pub use provider::Provider;
pub use settings::{IbProvider, IbSettings};
pub use soft::{SoftLink, SoftProvider};

use polyrail_core::{ChannelFactory, ChannelStart, Config, Opened, Rank, Result, Transport, TransportKind};

/// The InfiniBand channel's name.
pub const IB: TransportKind = TransportKind::new("ib");

/// Starts `ib` in a process that has peers, as [`open`] does.
pub struct IbFactory;

impl ChannelFactory for IbFactory {
    fn kind(&self) -> TransportKind {
        IB
    }
    fn variables(&self) -> Vec<polyrail_core::config::VarInfo> {
        let mut v = polyrail_core::config::infos(settings::VARS);
        v.extend(polyrail_link::settings::variables());
        v
    }

    fn check_settings(&self, config: &Config) -> Result<()> {
        IbSettings::from_config(config)?;
        polyrail_link::LinkSettings::from_config(config).map(drop)
    }

    fn open(&self, start: &ChannelStart<'_>) -> Result<Opened> {
        if let Some(absent) = start.without_peers() {
            return Ok(absent);
        }
        let link = soft_link(start.config, start.job_id)?;
        Ok(match open_with(start.config, link, start.rank, start.size)? {
            Ok(t) => Opened::Channel(t),
            Err(Unavailable(why)) => Opened::Absent(why),
        })
    }
}

/// Why the `ib` channel does not run in this process (not an error: the policy simply has no
/// `ib` channel).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unavailable(pub String);

/// Opens the `ib` channel as `POLYRAIL_IB_PROVIDER` says: `Ok(Err(_))` when there is nothing to
/// open (no RDMA device, and no reason to use the software provider); `Err` when opening failed.
/// The software provider paces nothing here (the link model needs the job's id: see
/// [`IbFactory`]).
pub fn open(config: &Config, rank: Rank, size: u32) -> Result<std::result::Result<Box<dyn Transport>, Unavailable>> {
    open_with(config, None, rank, size)
}

/// The link model `POLYRAIL_LINK_PROFILE` asks for in job `job` (an emulation), with this
/// process's node (`POLYRAIL_NODE`) and domain (`POLYRAIL_DOMAIN`); `None` for `none`.
fn soft_link(config: &Config, job: &str) -> Result<Option<SoftLink>> {
    let profile = polyrail_link::LinkSettings::from_config(config)?.profile;
    if profile.is_none() {
        return Ok(None);
    }
    let model = std::sync::Arc::new(polyrail_link::LinkModel::new(profile, job)?);
    Ok(Some(SoftLink { model, node: config.node.unwrap_or(0), domain: polyrail_link::settings::domain(config) }))
}

/// [`open`], the software provider pacing with `link` if given.
fn open_with(
    config: &Config,
    link: Option<SoftLink>,
    rank: Rank,
    size: u32,
) -> Result<std::result::Result<Box<dyn Transport>, Unavailable>> {
    let settings = IbSettings::from_config(config)?;
    let soft = || -> Result<Box<dyn Transport>> {
        let p = match link.clone() {
            Some(l) => SoftProvider::new().with_link(l),
            None => SoftProvider::new(),
        };
        Ok(Box::new(DirectIb::new(p, &settings, rank, size)?))
    };
    match settings.provider {
        IbProvider::Soft => soft().map(Ok),
        IbProvider::Verbs => match open_verbs(&settings)? {
            Ok(p) => Ok(Ok(Box::new(DirectIb::new(p, &settings, rank, size)?))),
            Err(Unavailable(why)) => Err(polyrail_core::Error::Transport { kind: "ib", what: why }),
        },
        IbProvider::Auto => match open_verbs(&settings)? {
            Ok(p) => Ok(Ok(Box::new(DirectIb::new(p, &settings, rank, size)?))),
            // A device named and not found is an error, not a reason to use no device.
            Err(Unavailable(why)) if settings.device.is_some() => {
                let (name, port) = settings.device.as_ref().map_or(("", 0), |(n, p)| (n.as_str(), *p));
                Err(polyrail_core::Error::Transport {
                    kind: "ib",
                    what: format!("POLYRAIL_IB_DEVICE={name}:{port}: {why}"),
                })
            }
            Err(_) if config.node.is_some() => soft().map(Ok),
            Err(why) => Ok(Err(why)),
        },
    }
}

#[cfg(feature = "verbs")]
fn open_verbs(settings: &IbSettings) -> Result<std::result::Result<verbs::VerbsProvider, Unavailable>> {
    verbs::VerbsProvider::open(settings)
}

#[cfg(not(feature = "verbs"))]
fn open_verbs(_settings: &IbSettings) -> Result<std::result::Result<SoftProvider, Unavailable>> {
    Ok(Err(Unavailable("no RDMA device (this build has no verbs provider: build with the `verbs` feature)".into())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_factory_lists_and_checks_the_link_models_variable() {
        assert!(IbFactory.variables().iter().any(|v| v.name == "POLYRAIL_LINK_PROFILE"));
        let c = |v: &str| Config::from_vars([("POLYRAIL_LINK_PROFILE", v)]).unwrap();
        assert!(IbFactory.check_settings(&c("prism/4")).is_ok());
        let e = IbFactory.check_settings(&c("prism/0")).unwrap_err().to_string();
        assert!(e.contains("POLYRAIL_LINK_PROFILE") && e.contains("prism/0"), "{e}");
    }
}
