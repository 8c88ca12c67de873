//! How the proxy tells an owner that its upload found every upload slot held, so
//! that the owner asks for one (`ReserveUpload`) and sends again. A refusal's
//! code alone cannot say it (`ResourceExhausted` also refuses a request past its
//! cap), and no decision is taken on a message's text: the status carries a
//! metadata entry that only this refusal has.

/// The metadata key of the refusal.
const KEY: &str = "dpca-upload-slot";

/// Its value: reserve a slot, then send again.
const RESERVE: &str = "reserve";

/// The refusal of an upload that found no slot free, saying `message`.
pub fn no_slot_free(message: String) -> tonic::Status {
    let mut status = tonic::Status::resource_exhausted(message);
    status
        .metadata_mut()
        .insert(KEY, tonic::metadata::MetadataValue::from_static(RESERVE));
    status
}

/// Whether `status` is [`no_slot_free`]'s refusal: the owner should reserve a
/// slot and send its contribution again.
pub fn asks_to_reserve(status: &tonic::Status) -> bool {
    status.code() == tonic::Code::ResourceExhausted
        && status
            .metadata()
            .get(KEY)
            .is_some_and(|v| v.as_bytes() == RESERVE.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Only the refusal built here asks for a reservation: the same code for a
    /// request past its cap, or another code with the entry, does not.
    #[test]
    fn only_the_no_slot_refusal_asks_to_reserve() {
        assert!(asks_to_reserve(&no_slot_free("busy".into())));
        assert!(!asks_to_reserve(&tonic::Status::resource_exhausted("busy")));
        let mut other = tonic::Status::unavailable("busy");
        other
            .metadata_mut()
            .insert(KEY, tonic::metadata::MetadataValue::from_static(RESERVE));
        assert!(!asks_to_reserve(&other));
    }

    /// The entry survives the trip through the HTTP/2 trailers a status is sent
    /// in.
    #[test]
    fn the_refusal_reads_back_from_its_headers() {
        let sent = no_slot_free("every upload slot is held".into());
        let mut headers = tonic::metadata::MetadataMap::new().into_headers();
        sent.add_header(&mut headers).expect("headers");
        let received = tonic::Status::from_header_map(&headers).expect("a status");
        assert!(asks_to_reserve(&received));
        assert_eq!(received.message(), "every upload slot is held");
    }
}
