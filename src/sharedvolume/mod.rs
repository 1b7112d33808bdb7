//! What both loops share about a shared volume, all of it pure: the claim and PV facts
//! ([`claim`]), whether a claim is managed and what from ([`classify`]), the desired Service,
//! Endpoints and EndpointSlice ([`desired`]), and the stamp an agent's move carries ([`stamp`]).
//! Neither loop reaches into the other; both stand on this module. The writes are each loop's own
//! (`controller::endpoints`, `agent::follow`).

pub mod claim;
pub mod classify;
pub mod desired;
pub mod filters;
pub mod stamp;
