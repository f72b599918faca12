//! polyrail facade (being written).
pub mod launch;
