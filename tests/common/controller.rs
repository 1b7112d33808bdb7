//! The controller's command line as the tests run it: always confined to the test's namespace,
//! alone (leader election off), leading through a Lease in that namespace as the chart runs it,
//! or as one of several replicas with short lease timings.

/// The arguments of `shared-volume-controller controller …` for one test.
pub struct ControllerArgs(Vec<String>);

impl ControllerArgs {
    /// One controller, leader election off.
    pub fn alone(ns: &str) -> Self {
        Self::watching(ns).with(&["--leader-elect", "false"])
    }

    /// One controller, leader-elected through the chart's default Lease in `ns`.
    pub fn leading(ns: &str) -> Self {
        Self::watching(ns).with(&["--lease-namespace", ns])
    }

    /// Replica `identity` of several, taking turns on Lease `lease` in `ns`; a leader's lease
    /// lasts `duration_s` seconds and is renewed `grace_s` seconds before its end.
    pub fn replica(ns: &str, identity: &str, lease: &str, duration_s: u64, grace_s: u64) -> Self {
        let (duration, grace) = (duration_s.to_string(), grace_s.to_string());
        Self::watching(ns).with(&[
            "--identity",
            identity,
            "--lease-namespace",
            ns,
            "--lease-name",
            lease,
            "--lease-duration-seconds",
            &duration,
            "--lease-grace-seconds",
            &grace,
        ])
    }

    fn watching(ns: &str) -> Self {
        Self(vec!["controller".into(), "--watch-namespace".into(), ns.into()])
    }

    /// These arguments and `extra` after them.
    pub fn with(mut self, extra: &[&str]) -> Self {
        self.0.extend(extra.iter().map(|arg| arg.to_string()));
        self
    }

    pub fn as_strs(&self) -> Vec<&str> {
        self.0.iter().map(String::as_str).collect()
    }
}
