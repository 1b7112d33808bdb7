//! What both loops share about a shared volume, all of it pure: the claim and PV facts
//! ([`claim`]), whether a claim is managed and what from ([`classify`]), the desired Service,
//! Endpoints and EndpointSlice ([`desired`]), the stamp an agent's move carries ([`stamp`]), a published server that does not answer
//! ([`silence`]) and
//! what LINSTOR CSI says of the volumes it serves itself ([`linstor`]).
//! Neither loop reaches into the other; both stand on this module. The writes are each loop's own
//! (`controller::endpoints`, `agent::follow`).

pub mod claim;
pub mod classify;
pub mod desired;
pub mod filters;
pub mod linstor;
pub mod silence;
pub mod stamp;
