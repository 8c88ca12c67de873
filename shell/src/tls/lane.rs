//! The status lane: how a `status` call on the proxy's main port is told from the
//! other connections before any handshake.
//!
//! On the main port a fresh connection takes its turn for a TLS handshake behind
//! every connection that came before it, and when hundreds of owners connect in
//! one instant that turn came hundreds of milliseconds late. The proxy cannot
//! tell who connects before the handshake: under TLS 1.3 the client's
//! certificate travels encrypted. So the client says which lane it wants in the
//! one part of the handshake the proxy can read at once, its ClientHello: a
//! `status` call offers the ALPN protocol [`STATUS_LANE_ALPN`] besides HTTP/2.
//! The proxy reads it without consuming the bytes (a peek), hands such a
//! connection to the lane, whose handshakes run on a thread of their own, and the
//! handshake then goes on as any other, HTTP/2 chosen.
//!
//! The hint is a claim, not a credential: anyone may send it. It buys a
//! connection no more than the lane serves (`status`, read under the usual
//! access rules, from a certificate the CA signed), and the lane's places are its
//! own, so a flood of hinted connections slows no other call. An observer of the
//! network learns that a connection is a status call, which its size and timing
//! already showed.

/// The ALPN protocol a client offers, besides `h2`, to ask for the status lane.
pub const STATUS_LANE_ALPN: &[u8] = b"dpca-status";

/// Bytes of a ClientHello read at most before a lane is chosen: a TLS record's
/// largest plaintext and its header. A hello spread over more records is taken
/// for one with no hint.
pub const MAX_HELLO_BYTES: usize = 16 * 1024 + 5;

/// What the first bytes of a connection say of its lane.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hello {
    /// Not a whole ClientHello yet: more bytes are needed.
    Incomplete,
    /// A ClientHello that offers [`STATUS_LANE_ALPN`].
    Status,
    /// Anything else: a ClientHello without the hint, or bytes that are no
    /// ClientHello (the handshake then refuses them as it always did).
    Other,
}

/// The lane the bytes a client sent first ask for (a ClientHello, whole or in
/// part). Reads nothing but `bytes`; never fails.
pub fn hello_lane(bytes: &[u8]) -> Hello {
    use tokio_rustls::rustls::server::Acceptor;
    let mut acceptor = Acceptor::default();
    let mut rest = bytes;
    while !rest.is_empty() {
        match acceptor.read_tls(&mut rest) {
            Ok(0) => break,
            Ok(_) => {}
            // Past what the acceptor buffers: no hello a client of ours sends.
            Err(_) => return Hello::Other,
        }
    }
    match acceptor.accept() {
        Ok(None) if bytes.len() < MAX_HELLO_BYTES => Hello::Incomplete,
        Ok(None) | Err(_) => Hello::Other,
        Ok(Some(accepted)) => {
            let hello = accepted.client_hello();
            let mut offered = hello.alpn().into_iter().flatten();
            match offered.any(|p| p == STATUS_LANE_ALPN) {
                true => Hello::Status,
                false => Hello::Other,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::client_hello;

    #[test]
    fn a_hello_offering_the_status_protocol_asks_for_the_lane() {
        let hello = client_hello(&[b"h2", STATUS_LANE_ALPN]);
        assert_eq!(hello_lane(&hello), Hello::Status);
        // In any position.
        let hello = client_hello(&[STATUS_LANE_ALPN, b"h2"]);
        assert_eq!(hello_lane(&hello), Hello::Status);
    }

    #[test]
    fn a_hello_without_the_hint_goes_the_usual_way() {
        assert_eq!(hello_lane(&client_hello(&[b"h2"])), Hello::Other);
        assert_eq!(hello_lane(&client_hello(&[])), Hello::Other);
        // A protocol that only starts like the hint is not it.
        assert_eq!(
            hello_lane(&client_hello(&[b"h2", b"dpca-status-x"])),
            Hello::Other
        );
    }

    #[test]
    fn a_partial_hello_waits_for_more_and_junk_goes_the_usual_way() {
        let hello = client_hello(&[b"h2", STATUS_LANE_ALPN]);
        for cut in [0, 1, 5, hello.len() / 2, hello.len() - 1] {
            assert_eq!(hello_lane(&hello[..cut]), Hello::Incomplete, "cut at {cut}");
        }
        assert_eq!(hello_lane(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"), Hello::Other);
        assert_eq!(hello_lane(&[0x16; MAX_HELLO_BYTES]), Hello::Other);
    }
}
