//! Launcher (being written).
