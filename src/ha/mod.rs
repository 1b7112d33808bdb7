//! The DRBD HA loop (`agent` subcommand): reads local DRBD state, decides (pure code in
//! [`decide`]) and acts on Kubernetes. The running loop is built on these pieces.

pub mod decide;
pub mod drbd;
pub mod source;
