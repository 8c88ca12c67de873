//! Accepting connections with a cap: every open connection costs the proxy buffers
//! (HTTP/2 state, read and write buffers), so past [`MAX_CONNECTIONS`] further owners
//! wait in the kernel's accept queue, where they cost the proxy nothing, and are
//! taken in as earlier ones close. With the upload limit this keeps the proxy's
//! memory flat in the number of owners.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::server::{Connected, TcpConnectInfo};

/// Connections served at once.
pub const MAX_CONNECTIONS: usize = 64;

/// An accepted connection holding one of the capped slots until it closes.
pub struct Capped {
    io: TcpStream,
    _slot: OwnedSemaphorePermit,
}

impl Connected for Capped {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.io.connect_info()
    }
}

impl AsyncRead for Capped {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_read(cx, buf)
    }
}

impl AsyncWrite for Capped {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

/// The listener's connections, at most `cap` open at once.
pub fn capped(listener: TcpListener, cap: usize) -> ReceiverStream<std::io::Result<Capped>> {
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    let slots = Arc::new(Semaphore::new(cap.max(1)));
    tokio::spawn(async move {
        loop {
            let Ok(slot) = Arc::clone(&slots).acquire_owned().await else {
                return;
            };
            match listener.accept().await {
                Ok((io, _)) => {
                    // Small frames of many ciphertexts: do not wait to coalesce.
                    let _ = io.set_nodelay(true);
                    // A peer gone without a FIN is found even before TLS is up.
                    let keepalive =
                        socket2::TcpKeepalive::new().with_time(crate::KEEPALIVE_INTERVAL);
                    let _ = socket2::SockRef::from(&io).set_tcp_keepalive(&keepalive);
                    if tx.send(Ok(Capped { io, _slot: slot })).await.is_err() {
                        return;
                    }
                }
                Err(e) => {
                    // Out of descriptors and the like: transient, so keep serving.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    });
    ReceiverStream::new(rx)
}
