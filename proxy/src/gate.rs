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
//! by role ([`access::may_call`]) and size ([`Limits::request_cap`]) only. The
//! operator listener screens its calls the same way ([`Screened`]), by method.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use http_body::{Body, Frame, SizeHint};
use tonic::body::Body as TonicBody;
use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};
use tonic::Status;

use crate::access::{may_call, Method};
use crate::limits::Limits;
use crate::per_key::{Held, PerKey};

/// A study's openings one user may have in flight at once: each may carry a spec
/// of up to `Limits::max_request_bytes` (about 1 MiB), which the proxy buffers
/// until the request ends, so a user that leaves them unfinished pins this many
/// at most, not one on each of its streams (136 MiB).
pub const MAX_OPENINGS_PER_USER: usize = 4;

/// A listener's screening of each call before the routes: the call passed on (its
/// body possibly wrapped), or a refusal to answer it with, decided before anything
/// of its body is read.
pub trait Screening {
    /// The call to pass on, or why it is refused.
    fn screen(&self, req: http::Request<TonicBody>) -> Result<http::Request<TonicBody>, Status>;
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
            Ok(req) => Box::pin(self.inner.call(req)),
            Err(refusal) => Box::pin(std::future::ready(Ok(refusal.into_http()))),
        }
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
        }
    }

    /// The method called and the cap on its request (`None`: no cap here, or a
    /// path that names no method of the proxy, which the routes answer
    /// "unimplemented" with nothing read), or why the call is refused before its
    /// body is read.
    fn admit<B>(&self, req: &http::Request<B>) -> Result<Option<Admitted>, Status> {
        let Some(method) = Method::from_path(req.uri().path()) else {
            return Ok(None);
        };
        let mut opening = None;
        if self.tls {
            let certs = req
                .extensions()
                .get::<TlsConnectInfo<TcpConnectInfo>>()
                .and_then(TlsConnectInfo::peer_certs)
                .ok_or_else(|| Status::unauthenticated("no client certificate"))?;
            let leaf = certs
                .first()
                .ok_or_else(|| Status::unauthenticated("empty client certificate chain"))?;
            let peer = dpca_shell::tls::peer_of(leaf)
                .map_err(|e| Status::unauthenticated(format!("client certificate: {e}")))?;
            may_call(&peer, method).map_err(Status::permission_denied)?;
            if method == Method::OpenStudy {
                opening = Some(self.take_opening(&peer.name)?);
            }
        }
        Ok(self.limits.request_cap(method).map(|cap| Admitted {
            method,
            cap,
            opening,
        }))
    }

    /// One of `user`'s openings in flight, or the refusal of one past its cap.
    fn take_opening(&self, user: &str) -> Result<Held<String>, Status> {
        self.openings
            .take(user.to_string(), MAX_OPENINGS_PER_USER)
            .ok_or_else(|| {
                Status::resource_exhausted(format!(
                    "user `{user}` has {MAX_OPENINGS_PER_USER} studies being opened at once, \
                     the most one user may: open this one when one of them is answered"
                ))
            })
    }
}

impl Screening for Gate {
    fn screen(&self, req: http::Request<TonicBody>) -> Result<http::Request<TonicBody>, Status> {
        Ok(match self.admit(&req)? {
            Some(admitted) => req.map(|body| TonicBody::new(CappedBody::new(body, admitted))),
            None => req,
        })
    }
}

/// A request body that ends in an error, naming the method and its cap, once it
/// has carried more than the cap's bytes (gRPC framing included). It holds its
/// user's opening until tonic has read it and lets it go.
struct CappedBody {
    inner: TonicBody,
    method: Method,
    cap: usize,
    left: usize,
    _opening: Option<Held<String>>,
}

impl CappedBody {
    fn new(inner: TonicBody, admitted: Admitted) -> Self {
        CappedBody {
            inner,
            method: admitted.method,
            cap: admitted.cap,
            left: admitted.cap,
            _opening: admitted.opening,
        }
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
        let bytes = frame.data_ref().map_or(0, |d| d.len());
        match this.left.checked_sub(bytes) {
            Some(left) => {
                this.left = left;
                Poll::Ready(Some(Ok(frame)))
            }
            None => Poll::Ready(Some(Err(Status::resource_exhausted(format!(
                "a {} request is at most {} bytes here, and this one sent more",
                this.method.name(),
                this.cap
            ))))),
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

    fn body_of(parts: &[usize]) -> TonicBody {
        let frames: Vec<Result<Frame<bytes::Bytes>, Status>> = parts
            .iter()
            .map(|&n| Ok(Frame::data(bytes::Bytes::from(vec![7u8; n]))))
            .collect();
        TonicBody::new(http_body_util::StreamBody::new(tokio_stream::iter(frames)))
    }

    fn admitted(cap: usize, opening: Option<Held<String>>) -> Admitted {
        Admitted {
            method: Method::GetStudy,
            cap,
            opening,
        }
    }

    #[tokio::test]
    async fn a_body_within_its_cap_passes_whole_and_one_past_it_is_cut_short() {
        let within = CappedBody::new(body_of(&[400, 600]), admitted(1000, None));
        let got = within.collect().await.expect("within the cap").to_bytes();
        assert_eq!(got.len(), 1000);
        let past = CappedBody::new(body_of(&[400, 601, 50_000]), admitted(1000, None));
        let err = past.collect().await.expect_err("past the cap");
        assert_eq!(err.code(), tonic::Code::ResourceExhausted);
        assert!(
            err.message().contains("GetStudy") && err.message().contains("1000"),
            "{}",
            err.message()
        );
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
        let Err(err) = gate.take_opening("alice") else {
            panic!("one past the cap");
        };
        assert_eq!(err.code(), tonic::Code::ResourceExhausted);
        assert!(err.message().contains("`alice`"), "{}", err.message());
        gate.take_opening("bob").expect("another user has its own");
        let mut held = held.into_iter();
        let body = CappedBody::new(body_of(&[10]), admitted(1000, held.next()));
        assert!(
            gate.take_opening("alice").is_err(),
            "held by the unread body"
        );
        drop(body);
        gate.take_opening("alice")
            .expect("given back with the body");
    }
}
