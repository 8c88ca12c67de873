//! Every way the proxy refuses a call, and the one place each becomes a gRPC
//! status. Clients decide on the code alone whether to try again
//! (`dpca_shell::client::transient`: only `Unavailable` is worth a retry), so the
//! code of a refusal is part of the protocol; it is chosen here and nowhere else.

use dpca_common::owner_budget::BudgetError;
use tonic::Status;

use crate::study::StudyError;

/// Why a call was refused. The message is what the caller is told.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    /// The caller presented no certificate the proxy can read.
    #[error("{0}")]
    Unauthenticated(String),
    /// The caller's role or name does not allow the call.
    #[error("{0}")]
    Denied(String),
    /// The request is malformed or asks for what the protocol does not allow.
    #[error("{0}")]
    Invalid(String),
    /// The study is not in the phase the call needs (aborted, say).
    #[error("{0}")]
    WrongPhase(String),
    /// No study has this id.
    #[error("unknown study `{0}`")]
    UnknownStudy(String),
    /// The request asks for more than the proxy's limits allow.
    #[error("{0}")]
    OverLimit(String),
    /// The proxy cannot serve the call now; the same call may succeed later.
    #[error("{0}")]
    Unavailable(String),
    /// Every upload slot is held: the owner reserves one and sends again
    /// (`dpca_proto::upload_slot`).
    #[error("{0}")]
    NoUploadSlot(String),
    /// An upload went idle, or slower than its allowance.
    #[error("{0}")]
    TooSlow(String),
    /// A fault of the proxy itself.
    #[error("{0}")]
    Internal(String),
    /// The caller's stream failed (its status is passed on as it came).
    #[error("{}", .0.message())]
    Stream(Status),
    /// A transition the study's state machine refused.
    #[error(transparent)]
    Study(#[from] StudyError),
    /// An owner's privacy budget refused the contribution.
    #[error(transparent)]
    Budget(#[from] BudgetError),
}

impl From<Refusal> for Status {
    fn from(e: Refusal) -> Self {
        let msg = e.to_string();
        match e {
            Refusal::Unauthenticated(_) => Status::unauthenticated(msg),
            Refusal::Denied(_) => Status::permission_denied(msg),
            Refusal::Invalid(_) => Status::invalid_argument(msg),
            Refusal::WrongPhase(_) => Status::failed_precondition(msg),
            Refusal::UnknownStudy(_) => Status::not_found(msg),
            Refusal::OverLimit(_) => Status::resource_exhausted(msg),
            Refusal::Unavailable(_) => Status::unavailable(msg),
            Refusal::NoUploadSlot(_) => dpca_proto::upload_slot::no_slot_free(msg),
            Refusal::TooSlow(_) => Status::deadline_exceeded(msg),
            Refusal::Internal(_) => Status::internal(msg),
            Refusal::Stream(status) => status,
            Refusal::Study(e) => study_status(e, msg),
            Refusal::Budget(BudgetError::InvalidCap { .. }) => Status::invalid_argument(msg),
            Refusal::Budget(BudgetError::Exhausted { .. }) => Status::failed_precondition(msg),
        }
    }
}

fn study_status(e: StudyError, msg: String) -> Status {
    match e {
        StudyError::Closed { .. } | StudyError::WrongPhase { .. } => {
            Status::failed_precondition(msg)
        }
        StudyError::DuplicateOwner { .. } => Status::already_exists(msg),
        StudyError::NotInvited { .. } | StudyError::BadOpening { .. } => {
            Status::permission_denied(msg)
        }
        StudyError::WrongCount { .. }
        | StudyError::ImplausibleCount { .. }
        | StudyError::CountNeeded { .. }
        | StudyError::CountNotNeeded { .. } => Status::invalid_argument(msg),
        StudyError::Release { .. } => Status::internal(msg),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::Code;

    /// Only a refusal that may pass is retried by clients: nothing the caller did
    /// wrong, and no refusal by the state machine, is `Unavailable`.
    #[test]
    fn only_passing_conditions_are_unavailable() {
        let cases = [
            (Refusal::Unavailable("busy".into()), Code::Unavailable),
            (Refusal::Invalid("bad".into()), Code::InvalidArgument),
            (Refusal::Denied("no".into()), Code::PermissionDenied),
            (Refusal::UnknownStudy("s".into()), Code::NotFound),
            (Refusal::OverLimit("big".into()), Code::ResourceExhausted),
            (
                Refusal::NoUploadSlot("held".into()),
                Code::ResourceExhausted,
            ),
            (Refusal::TooSlow("slow".into()), Code::DeadlineExceeded),
            (
                Refusal::Study(StudyError::DuplicateOwner {
                    study: "s".into(),
                    owner: "o".into(),
                }),
                Code::AlreadyExists,
            ),
        ];
        for (refusal, code) in cases {
            let text = refusal.to_string();
            let status = Status::from(refusal);
            assert_eq!(status.code(), code, "{text}");
            assert_eq!(status.message(), text);
        }
        let reserve = |r: Refusal| dpca_proto::upload_slot::asks_to_reserve(&Status::from(r));
        assert!(reserve(Refusal::NoUploadSlot("held".into())));
        assert!(!reserve(Refusal::OverLimit("big".into())));
        let unknown = Status::from(Refusal::UnknownStudy("s1".into()));
        assert_eq!(unknown.message(), "unknown study `s1`");
    }
}
