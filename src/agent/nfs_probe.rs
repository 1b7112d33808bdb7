//! Whether a volume's NFS server answers: an RPC NULL call to it over TCP, bounded in time.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::rpc_null::{MAX_REPLY, answers, null_call, record_length};

/// `Ok` when the server at `address` answers the NFS NULL procedure within `timeout`; `Err` says
/// what happened instead (refused, no answer, an answer that is not one).
pub async fn probe(address: SocketAddr, timeout: Duration) -> Result<(), String> {
    let xid = next_xid();
    let call = async {
        let mut stream = TcpStream::connect(address).await.map_err(|err| err.to_string())?;
        stream.write_all(&null_call(xid)).await.map_err(|err| err.to_string())?;
        let mut mark = [0; 4];
        stream.read_exact(&mut mark).await.map_err(|err| err.to_string())?;
        let mut record = vec![0; record_length(mark).min(MAX_REPLY)];
        stream.read_exact(&mut record).await.map_err(|err| err.to_string())?;
        answers(xid, &record)
    };
    tokio::time::timeout(timeout, call)
        .await
        .unwrap_or_else(|_| Err(format!("no answer within {timeout:?}")))
}

/// Transaction ids that differ between calls, and between runs of the agent.
fn next_xid() -> u32 {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let seed = std::process::id().wrapping_mul(0x9E37_79B9);
    seed.wrapping_add(NEXT.fetch_add(1, Ordering::Relaxed))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpListener;

    /// A server that answers each call as `reply` says (the call's xid in its first word).
    async fn server(reply: fn(u32) -> Vec<u8>) -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let mut call = [0; 44];
                if stream.read_exact(&mut call).await.is_ok() {
                    let xid = u32::from_be_bytes(call[4..8].try_into().unwrap());
                    let _ = stream.write_all(&reply(xid)).await;
                }
                // A server that says nothing keeps the connection open, as a hung one does.
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_secs(5)).await;
                    drop(stream);
                });
            }
        });
        address
    }

    fn record(words: &[u32]) -> Vec<u8> {
        let body: Vec<u8> = words.iter().flat_map(|w| w.to_be_bytes()).collect();
        let mut bytes = (0x8000_0000 | body.len() as u32).to_be_bytes().to_vec();
        bytes.extend(body);
        bytes
    }

    #[tokio::test]
    async fn a_server_that_answers_is_told_from_one_that_does_not() {
        let good = server(|xid| record(&[xid, 1, 0, 0, 0, 0])).await;
        assert_eq!(probe(good, Duration::from_secs(2)).await, Ok(()));
        let no_v4 = server(|xid| record(&[xid, 1, 0, 0, 0, 2, 3, 3])).await;
        assert!(
            probe(no_v4, Duration::from_secs(2))
                .await
                .unwrap_err()
                .contains("version 4")
        );
        let silent = server(|_| Vec::new()).await;
        let said = probe(silent, Duration::from_millis(200)).await.unwrap_err();
        assert!(said.contains("no answer within"), "{said}");
        let closed = {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            listener.local_addr().unwrap()
        };
        assert!(probe(closed, Duration::from_secs(2)).await.is_err(), "refused");
    }
}
