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
//! access rules, from a certificate the CA signed). The lane's handshake places
//! and slots are its own, so a flood of hinted connections takes none of the
//! owners'; while the lane's handshake places are held a hinted call takes its
//! turn with every other connection, as it did before there was a lane. An
//! observer of the network learns that a connection is a status call, which its
//! size and timing already showed.

/// The ALPN protocol a client offers, besides `h2`, to ask for the status lane.
pub const STATUS_LANE_ALPN: &[u8] = b"dpca-status";

/// A TLS record's header: its content type, version and length.
const RECORD_HEADER_BYTES: usize = 5;
/// The content type of a handshake record.
const HANDSHAKE_RECORD: u8 = 0x16;
/// The largest plaintext a TLS record may carry.
const MAX_RECORD_BYTES: usize = 16 * 1024;

/// Bytes of a connection read at most before a lane is chosen: one record,
/// whole. Only a ClientHello that fits in its first record can ask for the lane
/// (ours, rustls's and OpenSSL's all do): a hello spread over more records is
/// taken for one with no hint, so the reader never parses a hello again as more
/// of it comes.
pub const MAX_HELLO_BYTES: usize = RECORD_HEADER_BYTES + MAX_RECORD_BYTES;

/// What the first bytes of a connection say of its lane.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hello {
    /// Not a whole first record yet: more bytes are needed. Told from its header
    /// alone, without parsing.
    Incomplete,
    /// A ClientHello, whole in the first record, that offers [`STATUS_LANE_ALPN`].
    Status,
    /// Anything else: a ClientHello without the hint or not whole in its first
    /// record, or bytes that are no ClientHello (the handshake then refuses them
    /// as it always did).
    Other,
}

/// The lane the bytes a client sent first ask for. Parses them only once their
/// first record is whole (so at most once for a connection, whatever it sends
/// and however slowly); reads nothing but `bytes`; never fails.
pub fn hello_lane(bytes: &[u8]) -> Hello {
    let Some(header) = bytes.get(..RECORD_HEADER_BYTES) else {
        return Hello::Incomplete;
    };
    let length = usize::from(u16::from_be_bytes([header[3], header[4]]));
    if header[0] != HANDSHAKE_RECORD || length > MAX_RECORD_BYTES {
        return Hello::Other;
    }
    match bytes.get(..RECORD_HEADER_BYTES + length) {
        None => Hello::Incomplete,
        Some(record) => record_lane(record),
    }
}

/// The lane one whole handshake record asks for.
fn record_lane(mut record: &[u8]) -> Hello {
    use tokio_rustls::rustls::server::Acceptor;
    let mut acceptor = Acceptor::default();
    while !record.is_empty() {
        match acceptor.read_tls(&mut record) {
            Ok(0) => break,
            Ok(_) => {}
            Err(_) => return Hello::Other,
        }
    }
    // None: the hello goes on in a further record.
    let Ok(Some(accepted)) = acceptor.accept() else {
        return Hello::Other;
    };
    let hello = accepted.client_hello();
    let mut offered = hello.alpn().into_iter().flatten();
    match offered.any(|p| p == STATUS_LANE_ALPN) {
        true => Hello::Status,
        false => Hello::Other,
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
        assert_eq!(
            hello_lane(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"),
            Hello::Other
        );
        assert_eq!(hello_lane(&[0x16; MAX_HELLO_BYTES]), Hello::Other);
        // A record longer than TLS allows is no hello, however much follows.
        assert_eq!(hello_lane(&[0x16, 3, 1, 0x40, 1]), Hello::Other);
    }

    /// A hello whose first record holds only part of it asks for nothing: the
    /// lane is told from one record, parsed once.
    #[test]
    fn a_hello_split_over_records_goes_the_usual_way() {
        let hello = client_hello(&[b"h2", STATUS_LANE_ALPN]);
        let body = &hello[RECORD_HEADER_BYTES..];
        let (first, second) = body.split_at(body.len() / 2);
        let record = |part: &[u8]| {
            let mut r = vec![HANDSHAKE_RECORD, hello[1], hello[2]];
            r.extend((part.len() as u16).to_be_bytes());
            r.extend(part);
            r
        };
        let split = [record(first), record(second)].concat();
        assert_eq!(hello_lane(&split), Hello::Other);
        // The same bytes in one record are read as asking.
        assert_eq!(hello_lane(&record(body)), Hello::Status);
    }
}
