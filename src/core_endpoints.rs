//! Whether the loops write a volume's core/v1 Endpoints beside its EndpointSlice. Kubernetes
//! deprecated core/v1 Endpoints in 1.33 (every write returns a warning) and kube-proxy has read
//! only EndpointSlices for years, so by default a cluster at 1.33 or later gets only the slice;
//! an older one, where some tools may still read Endpoints, gets both. `--write-endpoints`
//! decides it for the cluster instead.

use clap::ValueEnum;

/// `--write-endpoints`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum WriteEndpoints {
    /// Both below Kubernetes 1.33, only the EndpointSlice from 1.33 on.
    Auto,
    /// Endpoints and EndpointSlice, whatever the version (for consumers that still read
    /// Endpoints).
    Always,
    /// Only the EndpointSlice; Endpoints this controller wrote before are deleted.
    Never,
}

/// The first Kubernetes minor version that deprecates core/v1 Endpoints.
const DEPRECATED_SINCE_MINOR: u32 = 33;

impl WriteEndpoints {
    /// Whether to write Endpoints on an API server of version `major.minor` (`None`: unknown,
    /// where `auto` keeps writing them: never less than before).
    pub fn resolve(self, version: Option<(u32, u32)>) -> bool {
        match self {
            Self::Always => true,
            Self::Never => false,
            Self::Auto => version.is_none_or(|(major, minor)| major == 1 && minor < DEPRECATED_SINCE_MINOR),
        }
    }

    /// `Always` or `Never`, as `writes` says: the mode once resolved.
    pub fn settled(writes: bool) -> Self {
        if writes { Self::Always } else { Self::Never }
    }

    /// [`Self::resolve`] against the API server `client` talks to; its answer is logged.
    pub async fn resolve_for(self, client: &kube::Client) -> bool {
        let version = match self {
            Self::Auto => match client.apiserver_version().await {
                Ok(info) => parse_version(&info.major, &info.minor),
                Err(err) => {
                    tracing::warn!(error = %err, "cannot read the API server's version; writing Endpoints as before 1.33");
                    None
                }
            },
            _ => None,
        };
        let writes = self.resolve(version);
        tracing::info!(mode = ?self, ?version, writes_endpoints = writes, "core/v1 Endpoints");
        writes
    }
}

/// `major` and `minor` as the version endpoint gives them (`"1"`, `"33+"` on some distributions).
fn parse_version(major: &str, minor: &str) -> Option<(u32, u32)> {
    let number = |text: &str| text.trim_end_matches('+').parse().ok();
    Some((number(major)?, number(minor)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_stops_at_the_deprecation_and_keeps_writing_when_unsure() {
        let auto = WriteEndpoints::Auto;
        assert!(auto.resolve(Some((1, 32))));
        assert!(!auto.resolve(Some((1, 33))));
        assert!(!auto.resolve(Some((1, 36))));
        assert!(auto.resolve(None));
        assert!(WriteEndpoints::Always.resolve(Some((1, 36))));
        assert!(!WriteEndpoints::Never.resolve(Some((1, 30))));
    }

    #[test]
    fn versions_parse_as_distributions_give_them() {
        assert_eq!(parse_version("1", "33+"), Some((1, 33)));
        assert_eq!(parse_version("1", "36"), Some((1, 36)));
        assert_eq!(parse_version("", "x"), None);
    }
}
