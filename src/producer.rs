//! Background producers behind a stream: a task owns the sending side of a channel and stops as
//! soon as the consumer drops the stream.

use std::future::Future;
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
