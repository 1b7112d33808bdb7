//! The DRBD HA loop (`agent` subcommand), one agent per node. Its pure core: the vocabulary of
//! what it observes ([`view`]) and does ([`action`]), the rules between them ([`decide`]), the
//! DRBD model and parser ([`drbd`]) and the indexes over cached objects ([`observe`]). Its shell:
//! the loop ([`run`]), the Kubernetes caches ([`cache`]), the `drbdsetup` process ([`source`]),
//! the execution of actions ([`act`]), endpoints that follow the primary ([`follow`]) and the
//! heartbeat Lease ([`heartbeat`]).

pub mod act;
pub mod action;
pub(crate) mod api_health;
pub mod cache;
pub mod decide;
pub mod drbd;
mod drbd_book;
mod error;
mod events2;
pub mod follow;
mod freshness;
pub mod guard;
mod hand_over;
pub mod heartbeat;
pub mod locality;
mod mass_move;
mod nfs_probe;
pub mod observe;
mod peers;
pub mod promoter;
mod quiet;
pub mod read_bound;
mod renewal_watch;
mod renewals;
pub mod report;
mod reporter;
pub mod rpc_null;
pub mod run;
pub mod server_clock;
mod server_probes;
pub mod source;
pub mod view;

pub use run::run;
