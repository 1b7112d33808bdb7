//! The moves of a volume's primary a run of fail-overs is made of.

/// One move of the volume's primary between nodes (indexes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Move {
    pub from: usize,
    pub to: usize,
    pub how: How,
}

/// What moves the primary.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum How {
    /// Node `from` is lost silently and the agents fail it over.
    Loss,
    /// The old primary's NFS server stops as systemd stops it, DRBD demotes it and promotes `to`.
    Planned,
    /// Planned by a drain: node `from` is cordoned, and the move waits for its agent to ask
    /// drbd-reactor for it (the request the host's path unit turns into `drbd-reactorctl evict`).
    Drain,
    /// Node `from`'s NFS server crashes, is started again in place, and crashes until its unit
    /// gives up; drbd-reactor then demotes the resource and a peer promotes it.
    Crash,
}

impl Move {
    pub const fn planned(from: usize, to: usize) -> Self {
        Self {
            from,
            to,
            how: How::Planned,
        }
    }

    /// A planned move that a drain of node `from` starts.
    pub const fn drain(from: usize, to: usize) -> Self {
        Self {
            from,
            to,
            how: How::Drain,
        }
    }

    pub const fn loss(from: usize, to: usize) -> Self {
        Self {
            from,
            to,
            how: How::Loss,
        }
    }

    /// A move that node `from`'s NFS server forces by dying for good.
    pub const fn crash(from: usize, to: usize) -> Self {
        Self {
            from,
            to,
            how: How::Crash,
        }
    }
}

impl std::fmt::Display for Move {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let how = match self.how {
            How::Drain => "drain",
            How::Planned => "planned move",
            How::Loss => "node lost",
            How::Crash => "server crashed",
        };
        write!(f, "{how} {} → {}", self.from, self.to)
    }
}
