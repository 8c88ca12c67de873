//! What the roles' tests share of the network (feature `test-support`): a proxy
//! that takes every call and never answers, against which each bound a party
//! puts on its waits is tested, and one that opens every study under one id and
//! seals and releases as a test scripts it, against which the user's checks of
//! the ids it is given and of a seal are tested.

use dpca_proto::v1;
use dpca_proto::v1::proxy_client::ProxyClient;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tonic::transport::Channel;
use tonic::{Request, Response, Status, Streaming};

/// A proxy that takes every call and never answers it, but for its result
/// stream, which it opens and never sends a chunk on if `opens_streams`, the
/// call for a study, which it answers (with an empty study) if `answers_study`,
/// and, if `scripted`, the seal, the request for the release and the result
/// stream, which it answers as scripted. An upload's stream is read to its end
/// first, so that what waits is the answer, not the transfer. If `busy`, every
/// upload is refused for want of a slot and every reservation granted, counted
/// there. If `refuses_study`, the call for a study is refused with that code and
/// text.
#[derive(Default)]
struct Silent {
    opens_streams: bool,
    answers_study: bool,
    refuses_study: Option<(tonic::Code, String)>,
    scripted: Option<Scripted>,
    busy: Option<Arc<AtomicUsize>>,
}

/// The id a scripted proxy gives every study it is asked to open.
pub const SCRIPTED_STUDY: &str = "scripted-study";

/// The seal and the release a scripted proxy answers with.
struct Scripted {
    sealed: v1::SealedStudy,
    result: v1::ResultChunk,
}

type Never<T> = Result<Response<T>, Status>;

#[tonic::async_trait]
impl v1::proxy_server::Proxy for Silent {
    async fn open_study(&self, _: Request<v1::OpenStudyRequest>) -> Never<v1::OpenStudyResponse> {
        match &self.scripted {
            Some(_) => Ok(Response::new(v1::OpenStudyResponse {
                study_id: SCRIPTED_STUDY.into(),
            })),
            None => std::future::pending().await,
        }
    }
    async fn get_study(&self, _: Request<v1::GetStudyRequest>) -> Never<v1::StudyInfo> {
        if let Some((code, text)) = &self.refuses_study {
            return Err(Status::new(*code, text.clone()));
        }
        if !self.answers_study {
            std::future::pending::<()>().await;
        }
        // A scripted proxy's study is read back with this build's layout.
        let spec = self.scripted.as_ref().map(|_| v1::StudySpec {
            layout: dpca_common::study::LAYOUT_VERSION,
            ..Default::default()
        });
        Ok(Response::new(v1::StudyInfo {
            spec,
            ..Default::default()
        }))
    }
    async fn contribute(
        &self,
        req: Request<Streaming<v1::ContributionChunk>>,
    ) -> Never<v1::ContributeResponse> {
        let mut stream = req.into_inner();
        while let Ok(Some(_)) = stream.message().await {}
        if self.busy.is_some() {
            return Err(dpca_proto::upload_slot::no_slot_free(
                "every upload slot is taken".into(),
            ));
        }
        std::future::pending().await
    }
    async fn reserve_upload(
        &self,
        _: Request<v1::ReserveUploadRequest>,
    ) -> Never<v1::ReserveUploadResponse> {
        let Some(reserved) = &self.busy else {
            return std::future::pending().await;
        };
        reserved.fetch_add(1, Ordering::Relaxed);
        Ok(Response::new(v1::ReserveUploadResponse {
            lease_seconds: 60,
        }))
    }
    async fn await_seal(&self, _: Request<v1::AwaitSealRequest>) -> Never<v1::SealedStudy> {
        match &self.scripted {
            Some(s) => Ok(Response::new(s.sealed.clone())),
            None => std::future::pending().await,
        }
    }
    async fn release(&self, _: Request<v1::ReleaseRequest>) -> Never<v1::ReleaseResponse> {
        match &self.scripted {
            Some(_) => Ok(Response::new(v1::ReleaseResponse::default())),
            None => std::future::pending().await,
        }
    }
    type FetchResultStream =
        Pin<Box<dyn tokio_stream::Stream<Item = Result<v1::ResultChunk, Status>> + Send>>;
    async fn fetch_result(
        &self,
        _: Request<v1::FetchResultRequest>,
    ) -> Never<Self::FetchResultStream> {
        if let Some(s) = &self.scripted {
            return Ok(Response::new(Box::pin(tokio_stream::once(Ok(s
                .result
                .clone())))));
        }
        if !self.opens_streams {
            std::future::pending::<()>().await;
        }
        Ok(Response::new(Box::pin(tokio_stream::pending())))
    }
    async fn status(&self, _: Request<v1::StatusRequest>) -> Never<v1::ProxyStatus> {
        std::future::pending().await
    }
    async fn hold_masks(&self, _: Request<v1::HoldMasksRequest>) -> Never<v1::HoldMasksResponse> {
        std::future::pending().await
    }
    async fn deposit_seed(
        &self,
        _: Request<v1::DepositSeedRequest>,
    ) -> Never<v1::DepositSeedResponse> {
        std::future::pending().await
    }
    type FetchMaskSumStream =
        Pin<Box<dyn tokio_stream::Stream<Item = Result<v1::MaskSumChunk, Status>> + Send>>;
    async fn fetch_mask_sum(
        &self,
        _: Request<v1::FetchMaskSumRequest>,
    ) -> Never<Self::FetchMaskSumStream> {
        std::future::pending().await
    }
}

/// A client of a new proxy that never answers (but opens its result stream if
/// `opens_streams`), on a loopback port, served on the calling runtime
/// (plaintext).
///
/// # Panics
/// If the port cannot be bound or connected to: a test's setup.
pub async fn silent_proxy(opens_streams: bool) -> ProxyClient<Channel> {
    serve(Silent {
        opens_streams,
        ..Silent::default()
    })
    .await
}

/// A client of a new proxy that answers the call for a study, and nothing else:
/// one that is there but never gets on.
///
/// # Panics
/// As [`silent_proxy`].
pub async fn stalled_proxy() -> ProxyClient<Channel> {
    serve(Silent {
        answers_study: true,
        ..Silent::default()
    })
    .await
}

/// A client of a new proxy that refuses every upload for want of a slot and
/// grants every reservation at once (and answers nothing else), with the count
/// of reservations it granted: one that keeps an owner going round.
///
/// # Panics
/// As [`silent_proxy`].
pub async fn busy_proxy() -> (ProxyClient<Channel>, Arc<AtomicUsize>) {
    let reserved = Arc::new(AtomicUsize::new(0));
    let client = serve(Silent {
        busy: Some(Arc::clone(&reserved)),
        ..Silent::default()
    })
    .await;
    (client, reserved)
}

/// A client of a new proxy that opens every study under one id
/// ([`SCRIPTED_STUDY`]), seals every study with `sealed`, takes every request
/// for the release, and serves `result` as the release's one chunk: whatever a
/// test has a deviating proxy send.
///
/// # Panics
/// As [`silent_proxy`].
pub async fn scripted_proxy(
    sealed: v1::SealedStudy,
    result: v1::ResultChunk,
) -> ProxyClient<Channel> {
    serve(Silent {
        opens_streams: true,
        answers_study: true,
        scripted: Some(Scripted { sealed, result }),
        ..Silent::default()
    })
    .await
}

/// The plaintext address of a new proxy that refuses every call for a study with
/// `code` and `text` and answers nothing else, served on the calling runtime: a
/// proxy that writes what it likes onto the terminal of a program run against it
/// (an outage's code has it retried, and logged at each retry).
///
/// # Panics
/// As [`silent_proxy`].
pub async fn refusing_proxy(code: tonic::Code, text: &str) -> std::net::SocketAddr {
    listen(Silent {
        refuses_study: Some((code, text.into())),
        ..Silent::default()
    })
    .await
}

async fn serve(proxy: Silent) -> ProxyClient<Channel> {
    let at = listen(proxy).await;
    ProxyClient::connect(format!("http://{at}"))
        .await
        .expect("connect to the fake proxy")
}

async fn listen(proxy: Silent) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind a loopback port");
    let at = listener.local_addr().expect("its address");
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(v1::proxy_server::ProxyServer::new(proxy))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    at
}

/// The error `call` ends with against a proxy that never answers, which must come
/// well within 10 s (a party's own bound in such a test is a fraction of a
/// second).
///
/// # Panics
/// If the call succeeds, or is still waiting after 10 s: the bound under test
/// does not hold.
pub async fn gives_up<T, E>(call: impl Future<Output = Result<T, E>>) -> E {
    match tokio::time::timeout(Duration::from_secs(10), call).await {
        Ok(Ok(_)) => panic!("a proxy that never answers answered"),
        Ok(Err(e)) => e,
        Err(_) => panic!("still waiting on a proxy that never answers"),
    }
}

/// The first flight of a TLS client offering `alpn` (its ClientHello), as a
/// client that then says nothing more sends it: such a client holds a handshake
/// place until the handshake times out.
pub fn client_hello(alpn: &[&[u8]]) -> Vec<u8> {
    use tokio_rustls::rustls::pki_types::ServerName;
    use tokio_rustls::rustls::{ClientConfig, ClientConnection, RootCertStore};
    let mut config = ClientConfig::builder()
        .with_root_certificates(RootCertStore::empty())
        .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    let name = ServerName::try_from("proxy.example").expect("a valid name");
    let mut conn = ClientConnection::new(Arc::new(config), name).expect("a client");
    let mut out = Vec::new();
    conn.write_tls(&mut out).expect("a hello into memory");
    out
}
