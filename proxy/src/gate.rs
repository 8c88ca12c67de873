//! The gate in front of the service on the main listener: who may call a method,
//! and how large a request it may send, decided from the path and the caller's
//! certificate before the request's body is read.
//!
//! tonic decodes a unary request whole before its handler runs, so without the
//! gate any certificate holder could have the proxy buffer a request of up to
//! `Limits::max_request_bytes` (about 1 MiB) on each of its streams whatever the
//! method: an owner calling `OpenStudy`, which only a user may, or sending a
//! `GetStudy` whose study id is a megabyte. The handlers still authorize each
//! call in full (names, the study's opener: `access::permit`); the gate refuses
//! by role ([`crate::access::may_call`]) and size ([`Limits::request_cap`]) only. The
//! operator listener screens its calls the same way ([`Screened`]), by method.
//!
//! Answers too: HTTP/2 holds an answer its caller grants no room for, so the
//! answers whose size other data sets (`GetStudy`, `AwaitSeal`, `Status`) each
//! take one of their party's [`MAX_UNSENT_ANSWERS`] places while they are handed
//! on, in pieces ([`ANSWER_PIECE_BYTES`]).

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use dpca_shell::tls::{peer_of, Peer};
use http_body::{Body, Frame, SizeHint};
use tonic::body::Body as TonicBody;
use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};
use tonic::Status;

use crate::access::{may_call, Method};
use crate::limits::{Limits, GRPC_FRAME_BYTES};
use crate::per_key::{Held, PerKey};
use crate::refusal::Refusal;

/// The caller of a call as its certificate names it, from the call's extensions;
/// `None` on plaintext (`tls` false), where no party is known. The certificate is
/// read once per call: the gate leaves the peer it read in the extensions, and the
/// handlers take it from there.
pub(crate) fn caller_of(extensions: &http::Extensions, tls: bool) -> Result<Option<Peer>, Refusal> {
    if !tls {
        return Ok(None);
    }
    if let Some(peer) = extensions.get::<Peer>() {
        return Ok(Some(peer.clone()));
    }
    // The handshake already required a certificate from the CA; this reads it.
    let certs = extensions
        .get::<TlsConnectInfo<TcpConnectInfo>>()
        .and_then(TlsConnectInfo::peer_certs)
        .ok_or_else(|| Refusal::Unauthenticated("no client certificate".into()))?;
    let leaf = certs
        .first()
        .ok_or_else(|| Refusal::Unauthenticated("empty client certificate chain".into()))?;
    peer_of(leaf)
        .map(Some)
        .map_err(|e| Refusal::Unauthenticated(format!("client certificate: {e}")))
}

/// A study's openings one user may have in flight at once: each may carry a spec
/// of up to `Limits::max_request_bytes` (about 1 MiB), which the proxy buffers
/// until the request ends, so a user that leaves them unfinished pins this many
/// at most, not one on each of its streams (136 MiB).
pub const MAX_OPENINGS_PER_USER: usize = 4;

/// Answers one party may have unsent at once, of the calls whose answers other
/// data sizes: `GetStudy` (a whole spec, up to `--max-spec-bytes`), `AwaitSeal`
/// (the study's owners and their signed counts) and `Status`. HTTP/2 holds an
/// answer until its caller grants room for it (hyper hands a body's chunk whole
/// to h2 once the stream has any room, and h2 queues it), so a party that left
/// its 128 streams' answers unread pinned 128 of them. Each answer now takes a
/// place when it is ready and keeps it until its last piece is handed on
/// ([`ANSWER_PIECE_BYTES`]); an honest party reads each answer at once.
pub const MAX_UNSENT_ANSWERS: usize = 4;

/// The pieces an answer holding a place is handed to HTTP/2 in, each a copy:
/// hyper hands a piece on only while the stream has room and h2's send buffer
/// (hyper's default, 400 KiB a stream, which tonic does not let a server set) is
/// not full, so an answer larger than that keeps its place until the client
/// reads it, and past the places a party pins at most that buffer and two
/// pieces on each stream (one queued in h2, one waiting in hyper), as a
/// `FetchResult` stream does.
pub const ANSWER_PIECE_BYTES: usize = 16 * 1024;

/// A listener's screening of each call before the routes: the call passed on (its
/// body possibly wrapped), or a refusal to answer it with, decided before anything
/// of its body is read.
pub trait Screening {
    /// The call to pass on, or why it is refused.
    fn screen(&self, req: http::Request<TonicBody>) -> Result<Passed, Status>;
}

/// A call the screening passes on, and the place its answer is to take.
pub struct Passed {
    /// The call, its body possibly wrapped.
    pub request: http::Request<TonicBody>,
    /// Where the method's answers are capped: the places its answer takes one of.
    pub answer: Option<AnswerPlace>,
}

impl From<http::Request<TonicBody>> for Passed {
    fn from(request: http::Request<TonicBody>) -> Self {
        Passed {
            request,
            answer: None,
        }
    }
}

/// One party's places for unsent answers ([`MAX_UNSENT_ANSWERS`]), of which an
/// answer takes one when it is ready.
pub struct AnswerPlace {
    places: PerKey<Peer>,
    party: Peer,
}

impl AnswerPlace {
    /// A place, or the refusal of an answer past them. The same call succeeds
    /// once an answer is read, so it is refused as unavailable, which clients
    /// retry (several runs under one certificate may meet the cap).
    fn take(self) -> Result<Held<Peer>, Refusal> {
        let name = self.party.name.clone();
        self.places
            .take(self.party, MAX_UNSENT_ANSWERS)
            .ok_or_else(|| {
                Refusal::Unavailable(format!(
                    "`{name}` has {MAX_UNSENT_ANSWERS} answers not yet read, the most one \
                     party may: ask again once one is read"
                ))
            })
    }
}

/// The routes behind a [`Screening`], as a tower service.
#[derive(Clone, Debug)]
pub struct Screened<S, G> {
    inner: S,
    screening: G,
}

impl<S, G> Screened<S, G> {
    /// `inner` behind `screening`.
    pub fn new(inner: S, screening: G) -> Self {
        Screened { inner, screening }
    }
}

impl<S, G> tower::Service<http::Request<TonicBody>> for Screened<S, G>
where
    S: tower::Service<
        http::Request<TonicBody>,
        Response = http::Response<TonicBody>,
        Error = Infallible,
    >,
    S::Future: Send + 'static,
    G: Screening,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    // The routes inside are always ready, so readying them for a call the
    // screening then refuses holds nothing back.
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<TonicBody>) -> Self::Future {
        match self.screening.screen(req) {
            Ok(Passed {
                request,
                answer: None,
            }) => Box::pin(self.inner.call(request)),
            Ok(Passed {
                request,
                answer: Some(place),
            }) => {
                let answer = self.inner.call(request);
                Box::pin(async move {
                    let response = answer.await?;
                    // A refusal (its status in the headers, no body) takes no
                    // place, and is not turned into "unavailable" by the cap.
                    if response.headers().contains_key("grpc-status") {
                        return Ok(response);
                    }
                    Ok(match place.take() {
                        Ok(held) => response.map(|body| TonicBody::new(Holding::new(body, held))),
                        Err(refusal) => Status::from(refusal).into_http(),
                    })
                })
            }
            Err(refusal) => Box::pin(std::future::ready(Ok(refusal.into_http()))),
        }
    }
}

/// An answer's body, handed on in copied pieces of at most
/// [`ANSWER_PIECE_BYTES`] and holding its place until it is dropped: its last
/// piece handed on, or its stream or connection ended. What h2 still queues
/// then is pieces, not the answer.
struct Holding {
    body: TonicBody,
    /// What is left of the chunk a piece was cut from.
    rest: Bytes,
    _held: Held<Peer>,
}

impl Holding {
    fn new(body: TonicBody, held: Held<Peer>) -> Self {
        Holding {
            body,
            rest: Bytes::new(),
            _held: held,
        }
    }
}

impl Body for Holding {
    type Data = Bytes;
    type Error = <TonicBody as Body>::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        if this.rest.is_empty() {
            match Pin::new(&mut this.body).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(data) => this.rest = data,
                    Err(frame) => return Poll::Ready(Some(Ok(frame))),
                },
                other => return other,
            }
        }
        // A copy: a slice would keep the whole answer's buffer alive in h2's queue
        // after the place went back (a client granting all but a byte of room).
        let piece = this.rest.split_to(this.rest.len().min(ANSWER_PIECE_BYTES));
        Poll::Ready(Some(Ok(Frame::data(Bytes::copy_from_slice(&piece)))))
    }

    fn is_end_stream(&self) -> bool {
        self.rest.is_empty() && self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        let inner = self.body.size_hint();
        let rest = self.rest.len() as u64;
        let mut hint = SizeHint::new();
        hint.set_lower(inner.lower().saturating_add(rest));
        if let Some(upper) = inner.upper() {
            hint.set_upper(upper.saturating_add(rest));
        }
        hint
    }
}

/// The main listener's screening: by the caller's role, by the size of its
/// request as the body arrives, and by the openings its user has in flight. One
/// gate serves every connection (its clones share the count of openings).
#[derive(Clone)]
pub struct Gate {
    limits: Limits,
    tls: bool,
    openings: PerKey<String>,
    answers: PerKey<Peer>,
}

/// What the gate knows of a call it admits: its caller, the cap on its request
/// (with the opening held while it is read), and the places its answer takes
/// one of.
#[derive(Default)]
struct Admission {
    peer: Option<Peer>,
    admitted: Option<Admitted>,
    answer: Option<AnswerPlace>,
}

/// Whether `method`'s answer is sized by data other than the caller's request
/// (a spec, a study's owners, the studies held), and so takes a place while
/// unsent ([`MAX_UNSENT_ANSWERS`]). `FetchResult` streams a shared release in
/// chunks encoded as they are read.
fn answer_sized_by_data(method: Method) -> bool {
    match method {
        Method::GetStudy | Method::AwaitSeal | Method::Status => true,
        Method::OpenStudy
        | Method::Release
        | Method::FetchResult
        | Method::Contribute
        | Method::ReserveUpload
        | Method::HoldMasks
        | Method::DepositSeed
        | Method::FetchMaskSum => false,
    }
}

/// What the gate admits a call with: the cap on its request, and the opening it
/// holds while that request is read.
struct Admitted {
    method: Method,
    cap: usize,
    opening: Option<Held<String>>,
}

impl Gate {
    /// The gate of a proxy with `limits`; on TLS (`tls`) every call must carry
    /// a client certificate, on plaintext (tests only) no party is known.
    pub fn new(limits: Limits, tls: bool) -> Self {
        Gate {
            limits,
            tls,
            openings: PerKey::default(),
            answers: PerKey::default(),
        }
    }

    /// The caller of the method called and the cap on its request (`None`: no cap
    /// here), or why the call is refused before its body is read. A path that
    /// names no method of the proxy is passed on unscreened: the routes answer it
    /// "unimplemented" with nothing read.
    fn admit<B>(&self, req: &http::Request<B>) -> Result<Admission, Refusal> {
        let Some(method) = Method::from_path(req.uri().path()) else {
            return Ok(Admission::default());
        };
        let peer = caller_of(req.extensions(), self.tls)?;
        let (mut opening, mut answer) = (None, None);
        if let Some(peer) = &peer {
            may_call(peer, method).map_err(Refusal::Denied)?;
            if matches!(method, Method::OpenStudy | Method::HoldMasks) {
                opening = Some(self.take_opening(&peer.name)?);
            }
            if answer_sized_by_data(method) {
                answer = Some(AnswerPlace {
                    places: self.answers.clone(),
                    party: peer.clone(),
                });
            }
        }
        let admitted = self.limits.request_cap(method).map(|cap| Admitted {
            method,
            cap,
            opening,
        });
        Ok(Admission {
            peer,
            admitted,
            answer,
        })
    }

    /// One of `user`'s openings in flight, or the refusal of one past its cap.
    fn take_opening(&self, user: &str) -> Result<Held<String>, Refusal> {
        self.openings
            .take(user.to_string(), MAX_OPENINGS_PER_USER)
            .ok_or_else(|| {
                Refusal::OverLimit(format!(
                    "user `{user}` has {MAX_OPENINGS_PER_USER} studies being opened at once, \
                     the most one user may: open this one when one of them is answered"
                ))
            })
    }
}

impl Screening for Gate {
    fn screen(&self, mut req: http::Request<TonicBody>) -> Result<Passed, Status> {
        let Admission {
            peer,
            admitted,
            answer,
        } = self.admit(&req)?;
        // The handlers read the caller from here, an upload's included.
        if let Some(peer) = peer {
            req.extensions_mut().insert(peer);
        }
        let request = match admitted {
            Some(admitted) => req.map(|body| TonicBody::new(CappedBody::new(body, admitted))),
            None => req,
        };
        Ok(Passed { request, answer })
    }
}

/// A request body that ends in an error, naming the method and its cap, once it
/// has carried more than the cap's bytes (gRPC framing included), or as soon as
/// its message announces a length past the cap: tonic reserves room for the
/// length a message announces before it reads it. It holds its user's opening
/// until tonic has read it and lets it go.
struct CappedBody {
    inner: TonicBody,
    method: Method,
    cap: usize,
    left: usize,
    /// The first bytes of the body: the message's flag and announced length.
    prefix: Vec<u8>,
    _opening: Option<Held<String>>,
}

impl CappedBody {
    fn new(inner: TonicBody, admitted: Admitted) -> Self {
        CappedBody {
            inner,
            method: admitted.method,
            cap: admitted.cap,
            left: admitted.cap,
            prefix: Vec::with_capacity(GRPC_FRAME_BYTES),
            _opening: admitted.opening,
        }
    }

    /// Takes the prefix's bytes from `data`; whether the length the message
    /// announces, once known, fits the cap.
    fn announced_fits(&mut self, data: &[u8]) -> bool {
        if self.prefix.len() == GRPC_FRAME_BYTES {
            return true;
        }
        let wanted = GRPC_FRAME_BYTES - self.prefix.len();
        self.prefix.extend(data.iter().take(wanted));
        let Some(len) = self.prefix.get(1..GRPC_FRAME_BYTES) else {
            return true;
        };
        let announced = u32::from_be_bytes([len[0], len[1], len[2], len[3]]);
        usize::try_from(announced)
            .map(|n| n.saturating_add(GRPC_FRAME_BYTES) <= self.cap)
            .unwrap_or(false)
    }

    fn too_large(&self) -> Status {
        Refusal::OverLimit(format!(
            "a {} request is at most {} bytes here, and this one is longer{}",
            self.method.name(),
            self.cap,
            set_by(self.method)
        ))
        .into()
    }
}

/// What sets `method`'s cap, for its refusal: a flag of the proxy where one does.
fn set_by(method: Method) -> &'static str {
    match method {
        Method::OpenStudy | Method::HoldMasks | Method::FetchMaskSum => {
            " (the proxy's --max-spec-bytes and --max-key-bits set it: a study this large \
             is refused by its operator's limits)"
        }
        Method::Release => " (the proxy's --max-key-bits sets it)",
        Method::GetStudy
        | Method::AwaitSeal
        | Method::FetchResult
        | Method::Status
        | Method::Contribute
        | Method::ReserveUpload
        | Method::DepositSeed => "",
    }
}

impl Body for CappedBody {
    type Data = <TonicBody as Body>::Data;
    type Error = Status;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.get_mut();
        let frame = match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => frame,
            other => return other,
        };
        let Some(data) = frame.data_ref() else {
            return Poll::Ready(Some(Ok(frame)));
        };
        let fits = this.announced_fits(data);
        match this.left.checked_sub(data.len()) {
            Some(left) if fits => {
                this.left = left;
                Poll::Ready(Some(Ok(frame)))
            }
            _ => Poll::Ready(Some(Err(this.too_large()))),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;
    use hyper_util::rt::{TokioExecutor, TokioIo};

    /// A body of `parts`, each sent as one frame.
    fn body_of(parts: Vec<Vec<u8>>) -> TonicBody {
        let frames: Vec<Result<Frame<bytes::Bytes>, Status>> = parts
            .into_iter()
            .map(|p| Ok(Frame::data(bytes::Bytes::from(p))))
            .collect();
        TonicBody::new(http_body_util::StreamBody::new(tokio_stream::iter(frames)))
    }

    /// The party a certificate names, as the gate reads it.
    fn party(role: dpca_shell::tls::Role, name: &str) -> Peer {
        Peer {
            role,
            name: name.into(),
        }
    }

    fn admitted(cap: usize, opening: Option<Held<String>>) -> Admitted {
        Admitted {
            method: Method::GetStudy,
            cap,
            opening,
        }
    }

    /// A message of 1000 bytes in all, its prefix included, cut into frames of
    /// `sizes`.
    fn message_of_1000(sizes: &[usize]) -> Vec<Vec<u8>> {
        let message = framed(995, 995);
        let mut at = 0;
        sizes
            .iter()
            .map(|&n| {
                at += n;
                message[at - n..at].to_vec()
            })
            .collect()
    }

    #[tokio::test]
    async fn a_body_within_its_cap_passes_whole_and_one_past_it_is_cut_short() {
        let within = CappedBody::new(body_of(message_of_1000(&[400, 600])), admitted(1000, None));
        let got = within.collect().await.expect("within the cap").to_bytes();
        assert_eq!(got.len(), 1000);
        // What it announced fits, and then it sends more.
        let mut parts = message_of_1000(&[400, 600]);
        parts.push(vec![7u8; 50_000]);
        let past = CappedBody::new(body_of(parts), admitted(1000, None));
        let err = past.collect().await.expect_err("past the cap");
        assert_eq!(err.code(), tonic::Code::ResourceExhausted);
        assert!(
            err.message().contains("GetStudy") && err.message().contains("1000"),
            "{}",
            err.message()
        );
    }

    /// A gRPC frame of `payload` bytes announcing a message of `announced`.
    fn framed(announced: u32, payload: usize) -> Vec<u8> {
        let mut bytes = vec![0u8];
        bytes.extend_from_slice(&announced.to_be_bytes());
        bytes.extend(vec![7u8; payload]);
        bytes
    }

    /// A message announcing more than the cap is refused on its first bytes,
    /// before tonic would reserve room for it, even with its prefix split
    /// across frames; one announcing what fits passes.
    #[tokio::test]
    async fn a_message_announcing_more_than_the_cap_is_refused_at_once() {
        let big = framed(1_000_000, 10);
        let mut body = CappedBody::new(body_of(vec![big.clone()]), admitted(1000, None));
        let first = body.frame().await.expect("a frame");
        assert_eq!(
            first.expect_err("refused").code(),
            tonic::Code::ResourceExhausted
        );
        let split = vec![big[..2].to_vec(), big[2..].to_vec()];
        let err = CappedBody::new(body_of(split), admitted(1000, None))
            .collect()
            .await
            .expect_err("refused with its prefix split");
        assert_eq!(err.code(), tonic::Code::ResourceExhausted);
        // A spec past the opening's cap is told which flags set it.
        let spec = Admitted {
            method: Method::OpenStudy,
            cap: 1000,
            opening: None,
        };
        let err = CappedBody::new(body_of(vec![framed(2_000_000, 10)]), spec)
            .collect()
            .await
            .expect_err("a spec past the cap");
        assert!(
            err.message().contains("--max-spec-bytes"),
            "{}",
            err.message()
        );
        let fits = CappedBody::new(body_of(message_of_1000(&[1000])), admitted(1000, None));
        assert_eq!(fits.collect().await.expect("fits").to_bytes().len(), 1000);
    }

    /// Routes that answer every call with a body of this many bytes, but
    /// `AwaitSeal`, which they refuse.
    #[derive(Clone)]
    struct Answering(usize);

    impl tower::Service<http::Request<TonicBody>> for Answering {
        type Response = http::Response<TonicBody>;
        type Error = Infallible;
        type Future = std::future::Ready<Result<Self::Response, Infallible>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, req: http::Request<TonicBody>) -> Self::Future {
            let answer = if req.uri().path().ends_with("/AwaitSeal") {
                Status::not_found("no such study").into_http()
            } else {
                http::Response::new(body_of(vec![vec![0u8; self.0]]))
            };
            std::future::ready(Ok(answer))
        }
    }

    /// Routes behind the gate served over HTTP/2 by hyper on one end of an
    /// in-memory pipe, each call's party named by a header of the test's (as the
    /// TLS layer names it from the certificate); an h2 client on the other end,
    /// granting each stream a byte of room and its connection a gigabyte.
    async fn served_to_a_client_granting_no_room(
        routes: Screened<Answering, Gate>,
    ) -> h2::client::SendRequest<Bytes> {
        let (client_io, server_io) = tokio::io::duplex(1 << 16);
        let service = hyper::service::service_fn(move |req: http::Request<_>| {
            let mut routes = routes.clone();
            let mut req = req.map(TonicBody::new);
            let name = req.headers()["x-test-party"].to_str().expect("a name");
            let peer = party(dpca_shell::tls::Role::Owner, name);
            req.extensions_mut().insert(peer);
            tower::Service::call(&mut routes, req)
        });
        let server = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
            .serve_connection(TokioIo::new(server_io), service);
        tokio::spawn(server);
        let (client, connection) = h2::client::Builder::new()
            .initial_window_size(1)
            .initial_connection_window_size(1 << 30)
            .handshake(client_io)
            .await
            .expect("handshake");
        tokio::spawn(connection);
        client
    }

    /// A call to `GetStudy` by `party`: its answer's headers, its body unread.
    async fn get_study(
        client: &mut h2::client::SendRequest<Bytes>,
        party: &str,
    ) -> http::Response<h2::RecvStream> {
        let request = http::Request::post("http://proxy/dpca.v1.Proxy/GetStudy")
            .header("x-test-party", party)
            .body(())
            .expect("a request");
        let (answer, _) = client.send_request(request, true).expect("sent");
        answer.await.expect("answered")
    }

    /// A party's answers left unread hold places: past them the next answer is
    /// refused, another party's is not, and an answer whose stream ends gives its
    /// place back. Over HTTP/2 as hyper serves it: before the answers were cut
    /// into pieces, hyper handed each 1 MiB answer to h2 whole once a byte of room
    /// was granted, and the place went back with it, so the cap held nothing.
    #[tokio::test]
    async fn a_party_has_at_most_its_answers_unsent() {
        let routes = Screened::new(Answering(1 << 20), Gate::new(Limits::default(), true));
        let mut client = served_to_a_client_granting_no_room(routes).await;
        let refusal = |r: &http::Response<h2::RecvStream>| Status::from_header_map(r.headers());
        let mut unread = Vec::new();
        for _ in 0..MAX_UNSENT_ANSWERS {
            let answer = get_study(&mut client, "o1").await;
            assert!(refusal(&answer).is_none(), "within the cap");
            unread.push(answer);
        }
        let past = get_study(&mut client, "o1").await;
        let status = refusal(&past).expect("refused past the cap");
        assert_eq!(
            status.code(),
            tonic::Code::Unavailable,
            "which clients retry"
        );
        assert!(status.message().contains("`o1`"), "{}", status.message());
        let other = get_study(&mut client, "o2").await;
        assert!(refusal(&other).is_none(), "another party has its own");
        // Its stream reset, an unread answer's place comes back.
        drop(unread.pop());
        let mut served = false;
        for _ in 0..100 {
            if refusal(&get_study(&mut client, "o1").await).is_none() {
                served = true;
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        assert!(
            served,
            "the place of an answer whose stream ended stayed held"
        );
    }

    /// An answer is handed on in pieces of at most [`ANSWER_PIECE_BYTES`], whole
    /// and in order, and holds its place until dropped.
    #[tokio::test]
    async fn an_answer_goes_in_pieces_and_holds_its_place_until_dropped() {
        let places = PerKey::default();
        let user = party(dpca_shell::tls::Role::User, "u");
        let held = places.take(user.clone(), 1).expect("a place");
        let answer: Vec<u8> = (0..40_000u32).map(|i| i as u8).collect();
        let mut body = Holding::new(body_of(vec![answer.clone(), vec![9u8; 10]]), held);
        let mut got = Vec::new();
        while let Some(frame) = body.frame().await {
            let data = frame.expect("a frame").into_data().expect("data");
            assert!(data.len() <= ANSWER_PIECE_BYTES, "{}", data.len());
            got.extend_from_slice(&data);
        }
        assert_eq!(got[..40_000], answer[..]);
        assert_eq!(got.len(), 40_010);
        assert!(places.take(user.clone(), 1).is_none(), "held until dropped");
        drop(body);
        assert!(places.take(user, 1).is_some(), "given back when dropped");
    }

    /// A refusal takes no place, and a party at its cap is told the refusal, not
    /// "unavailable": a study that is not there is not retried as if busy.
    #[tokio::test]
    async fn a_refusal_takes_no_place_and_keeps_its_status() {
        use tower::Service;
        let mut routes = Screened::new(Answering(1 << 10), Gate::new(Limits::default(), true));
        let call = |method: &str| {
            let mut req = http::Request::builder()
                .uri(format!("/dpca.v1.Proxy/{method}"))
                .body(body_of(Vec::new()))
                .expect("a request");
            req.extensions_mut()
                .insert(party(dpca_shell::tls::Role::User, "u"));
            req
        };
        let mut unread = Vec::new();
        for _ in 0..MAX_UNSENT_ANSWERS {
            unread.push(routes.call(call("GetStudy")).await.expect("answered"));
        }
        let refused = routes.call(call("AwaitSeal")).await.expect("answered");
        let status = Status::from_header_map(refused.headers()).expect("a refusal");
        assert_eq!(status.code(), tonic::Code::NotFound, "{}", status.message());
        let past = routes.call(call("GetStudy")).await.expect("answered");
        let status = Status::from_header_map(past.headers()).expect("past the cap");
        assert_eq!(status.code(), tonic::Code::Unavailable);
    }

    /// A piece handed on is a copy: once the answer's body is dropped (its place
    /// given back), the answer's buffer is freed, whatever pieces h2 still
    /// queues. Before, each piece was a slice of it: a client granting all but a
    /// byte of room kept the whole answer alive with no place held.
    #[tokio::test]
    async fn a_piece_handed_on_keeps_nothing_of_the_answer_alive() {
        use std::sync::atomic::{AtomicBool, Ordering};
        use std::sync::Arc;
        struct Answer(Vec<u8>, Arc<AtomicBool>);
        impl AsRef<[u8]> for Answer {
            fn as_ref(&self) -> &[u8] {
                &self.0
            }
        }
        impl Drop for Answer {
            fn drop(&mut self) {
                self.1.store(true, Ordering::SeqCst);
            }
        }
        let freed = Arc::new(AtomicBool::new(false));
        let answer = Bytes::from_owner(Answer(vec![7u8; 100_000], Arc::clone(&freed)));
        let places = PerKey::default();
        let held = places
            .take(party(dpca_shell::tls::Role::Owner, "o"), 1)
            .expect("a place");
        let body = TonicBody::new(http_body_util::Full::new(answer));
        let mut holding = Holding::new(body, held);
        let mut pieces = Vec::new();
        while let Some(frame) = holding.frame().await {
            pieces.push(frame.expect("a frame").into_data().expect("data"));
        }
        drop(holding);
        assert!(
            freed.load(Ordering::SeqCst),
            "a piece kept the answer alive"
        );
        assert_eq!(pieces.iter().map(Bytes::len).sum::<usize>(), 100_000);
    }

    /// A user's openings are held while their requests are read, and no more
    /// than the cap of them: the one past it is refused, a body read and let go
    /// gives its opening back.
    #[test]
    fn a_user_has_at_most_its_openings_in_flight() {
        let gate = Gate::new(Limits::default(), true);
        let held: Vec<Held<String>> = (0..MAX_OPENINGS_PER_USER)
            .map(|_| gate.take_opening("alice").expect("within the cap"))
            .collect();
        let Err(refusal) = gate.take_opening("alice") else {
            panic!("one past the cap");
        };
        let err = Status::from(refusal);
        assert_eq!(err.code(), tonic::Code::ResourceExhausted);
        assert!(err.message().contains("`alice`"), "{}", err.message());
        gate.take_opening("bob").expect("another user has its own");
        let mut held = held.into_iter();
        let body = CappedBody::new(body_of(message_of_1000(&[10])), admitted(1000, held.next()));
        assert!(
            gate.take_opening("alice").is_err(),
            "held by the unread body"
        );
        drop(body);
        gate.take_opening("alice")
            .expect("given back with the body");
    }
}
