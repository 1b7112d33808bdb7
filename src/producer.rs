//! Background producers behind a stream: a task owns the sending side of a channel and stops as
//! soon as the consumer drops the stream.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use futures::stream::BoxStream;
use tokio::sync::mpsc::{self, Sender};

/// Spawns `produce` with the sending side of a channel of `capacity`, and returns the other side.
pub fn spawn<T, F, Fut>(capacity: usize, produce: F) -> BoxStream<'static, T>
where
    T: Send + 'static,
    F: FnOnce(Sender<T>) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let (sender, mut receiver) = mpsc::channel(capacity);
    tokio::spawn(produce(sender));
    futures::stream::poll_fn(move |cx| receiver.poll_recv(cx)).boxed()
}

/// Waits `pause`; false when the consumer went away meanwhile, so the producer should stop.
pub async fn pause<T>(sender: &Sender<T>, pause: Duration) -> bool {
    tokio::select! {
        _ = sender.closed() => false,
        _ = tokio::time::sleep(pause) => true,
    }
}

/// The sending side of a stream that never makes its producer wait: what the consumer has not
/// taken yet is merged with what comes next, so that a producer which stamps what it reads stamps
/// it when read, however busy the consumer is.
pub struct Latest<T> {
    slot: Arc<Mutex<Option<T>>>,
    bell: Sender<()>,
    merge: fn(T, T) -> T,
}

impl<T> Latest<T> {
    /// Hands `value` over, merged with what is still waiting; false once the consumer is gone.
    pub fn send(&self, value: T) -> bool {
        if self.bell.is_closed() {
            return false;
        }
        {
            let mut slot = self.slot.lock().expect("slot poisoned");
            let merged = match slot.take() {
                Some(waiting) => (self.merge)(waiting, value),
                None => value,
            };
            *slot = Some(merged);
        }
        // Full: the consumer has a ring waiting already.
        let _ = self.bell.try_send(());
        true
    }

    /// Waits `pause`; false when the consumer went away meanwhile.
    pub async fn pause(&self, pause: Duration) -> bool {
        self::pause(&self.bell, pause).await
    }
}

/// A [`Latest`] and the stream it feeds; the stream ends once the [`Latest`] is dropped and
/// everything it sent is taken.
pub fn latest<T: Send + 'static>(merge: fn(T, T) -> T) -> (Latest<T>, BoxStream<'static, T>) {
    let (bell, rung) = mpsc::channel(1);
    let slot = Arc::new(Mutex::new(None));
    let stream = futures::stream::unfold((rung, slot.clone()), |(mut rung, slot)| async move {
        loop {
            let waiting = slot.lock().expect("slot poisoned").take();
            if let Some(value) = waiting {
                return Some((value, (rung, slot)));
            }
            rung.recv().await?;
        }
    });
    (Latest { slot, bell, merge }, stream.boxed())
}

/// Spawns `produce` with a [`Latest`], and returns the stream it feeds.
pub fn spawn_latest<T, F, Fut>(merge: fn(T, T) -> T, produce: F) -> BoxStream<'static, T>
where
    T: Send + 'static,
    F: FnOnce(Latest<T>) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let (latest, stream) = latest(merge);
    tokio::spawn(produce(latest));
    stream
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn what_waits_is_merged_with_what_comes_next_and_the_stream_ends_with_its_producer() {
        let (latest, mut stream) = latest(|waiting: Vec<u32>, next: Vec<u32>| [waiting, next].concat());
        assert!(latest.send(vec![1]));
        assert!(latest.send(vec![2]));
        assert_eq!(stream.next().await, Some(vec![1, 2]));
        assert!(latest.send(vec![3]));
        drop(latest);
        assert_eq!(stream.next().await, Some(vec![3]), "what was sent before the end");
        assert_eq!(stream.next().await, None);

        let (latest, stream) = super::latest(|_: u32, next: u32| next);
        drop(stream);
        assert!(!latest.send(1), "the consumer is gone");
    }
}
