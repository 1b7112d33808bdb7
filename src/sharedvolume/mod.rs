//! What both loops share about a shared volume: the claim and PV facts ([`claim`]), whether a
//! claim is managed and what from ([`classify`], pure), the desired Service, Endpoints and
//! EndpointSlice ([`desired`], pure), and the one function that writes the endpoints
//! ([`endpoints`]), and the stamp an agent's move carries ([`stamp`]). Neither loop reaches into
//! the other; both stand on this module.

pub mod claim;
pub mod classify;
pub mod desired;
pub mod endpoints;
pub mod stamp;
