//! How long a `drbdsetup status` or `show` may take. A read takes milliseconds when DRBD is well,
//! and a stuck one given the whole operations timeout would hold every decision; but a node with
//! thousands of resources reads for seconds, and a fixed bound below that would never give it a
//! state. So the bound starts at two status intervals (at least 2 s), doubles after each read that
//! ran out, and after each read that finished settles at four times what it took (never below the
//! start); at most the operations timeout.

use std::sync::Mutex;
use std::time::Duration;

#[derive(Debug)]
pub struct ReadBound {
    least: Duration,
    most: Duration,
    now: Mutex<Duration>,
}

/// How much longer than the last read the next may take: room for a busier moment.
const HEADROOM: u32 = 4;

impl ReadBound {
    pub fn new(status_interval: Duration, operations_timeout: Duration) -> Self {
        let least = (2 * status_interval)
            .max(Duration::from_secs(2))
            .min(operations_timeout);
        Self::between(least, operations_timeout)
    }

    pub fn between(least: Duration, most: Duration) -> Self {
        Self {
            least,
            most: most.max(least),
            now: Mutex::new(least),
        }
    }

    /// The bound of the next read.
    pub fn get(&self) -> Duration {
        *self.now.lock().expect("read bound poisoned")
    }

    /// A read finished in `took`.
    pub fn finished(&self, took: Duration) {
        self.set(took * HEADROOM);
    }

    /// A read ran out of its bound.
    pub fn ran_out(&self) {
        let doubled = self.get() * 2;
        self.set(doubled);
    }

    fn set(&self, bound: Duration) {
        *self.now.lock().expect("read bound poisoned") = bound.clamp(self.least, self.most);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bound_grows_after_reads_that_ran_out_and_settles_after_reads_that_finished() {
        let seconds = Duration::from_secs;
        let bound = ReadBound::new(seconds(5), seconds(60));
        assert_eq!(bound.get(), seconds(10), "two status intervals to start");
        bound.ran_out();
        bound.ran_out();
        assert_eq!(bound.get(), seconds(40));
        bound.ran_out();
        assert_eq!(bound.get(), seconds(60), "never past the operations timeout");
        bound.finished(seconds(12));
        assert_eq!(bound.get(), seconds(48), "four times the read that finished");
        bound.finished(Duration::from_millis(3));
        assert_eq!(bound.get(), seconds(10), "never below the start");
        assert_eq!(
            ReadBound::new(Duration::from_millis(100), seconds(60)).get(),
            seconds(2)
        );
        assert_eq!(ReadBound::new(seconds(5), seconds(3)).get(), seconds(3));
    }
}
