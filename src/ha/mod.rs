//! The DRBD HA loop (`agent` subcommand): reads local DRBD state, decides (pure code in
//! [`decide`]) and acts on Kubernetes ([`act`]), one agent per node.

pub mod act;
pub mod agent;
pub mod cache;
pub mod decide;
pub mod drbd;
pub mod follow;
pub mod heartbeat;
pub mod observe;
pub mod source;

pub use agent::run;
