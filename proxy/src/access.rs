//! Who may do what, decided from the certificate of the caller (pure).
//!
//! On mutual TLS every call carries the peer's role and name from its certificate
//! ([`dpca_shell::tls::peer_of`]). Only a user opens a study, and only that same user
//! waits for its seal, reveals N and fetches its release; only an owner contributes,
//! and only under the owner id its certificate names; owners and users may read a
//! study's public spec; the operator (a `dpca-proxy` client certificate) reads the
//! status of every study and budget, a user the status of its own studies. On the explicitly insecure plaintext transport there is no
//! peer and nothing can be checked.

use dpca_shell::tls::{Peer, Role};

/// A call to authorize.
#[derive(Clone, Copy, Debug)]
pub enum Action<'a> {
    /// OpenStudy.
    OpenStudy,
    /// GetStudy: the public spec.
    ReadSpec,
    /// Contribute, claiming this owner id.
    Contribute {
        /// The owner id in the contribution's header.
        owner_id: &'a str,
    },
    /// Status: every study and budget for the operator, own studies for a user.
    Status,
    /// AwaitSeal, Release, FetchResult of a study opened by `opened_by`.
    UseStudy {
        /// The name of the user who opened the study (`None`: opened on plaintext).
        opened_by: Option<&'a str>,
    },
}

/// Allows or refuses `action` by `peer` (`None` on plaintext: allowed), saying why.
pub fn permit(peer: Option<&Peer>, action: Action<'_>) -> Result<(), String> {
    let Some(peer) = peer else { return Ok(()) };
    match action {
        Action::OpenStudy if peer.role == Role::User => Ok(()),
        Action::OpenStudy => Err(format!(
            "only a user opens a study; the caller is the {peer}"
        )),
        Action::ReadSpec if peer.role != Role::Proxy => Ok(()),
        Action::ReadSpec => Err(format!("the {peer} takes no part in studies")),
        Action::Contribute { owner_id } if peer.role == Role::Owner && peer.name == owner_id => {
            Ok(())
        }
        Action::Contribute { owner_id } if peer.role == Role::Owner => Err(format!(
            "the contribution claims owner id `{owner_id}`, but the caller's certificate \
             names `{}`",
            peer.name
        )),
        Action::Contribute { .. } => Err(format!(
            "only an owner contributes; the caller is the {peer}"
        )),
        Action::Status if peer.role != Role::Owner => Ok(()),
        Action::Status => Err(format!("the {peer} has no status to read")),
        Action::UseStudy { opened_by } => match opened_by {
            Some(u) if peer.role == Role::User && peer.name == u => Ok(()),
            Some(u) => Err(format!(
                "only the user who opened this study (`{u}`) may use its result; the \
                 caller is the {peer}"
            )),
            None => Err("this study was opened without TLS; it cannot be used over TLS".into()),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(role: Role, name: &str) -> Peer {
        Peer {
            role,
            name: name.into(),
        }
    }

    #[test]
    fn each_action_is_allowed_to_its_role_and_name_only() {
        let alice = peer(Role::User, "alice");
        let bob = peer(Role::User, "bob");
        let h1 = peer(Role::Owner, "h1");
        let proxy = peer(Role::Proxy, "proxy");
        assert!(permit(Some(&alice), Action::OpenStudy).is_ok());
        assert!(permit(Some(&h1), Action::OpenStudy).is_err());
        assert!(permit(Some(&h1), Action::ReadSpec).is_ok());
        assert!(permit(Some(&alice), Action::ReadSpec).is_ok());
        assert!(permit(Some(&proxy), Action::ReadSpec).is_err());
        assert!(permit(Some(&h1), Action::Contribute { owner_id: "h1" }).is_ok());
        let err = permit(Some(&h1), Action::Contribute { owner_id: "h2" }).expect_err("h2");
        assert!(err.contains("`h2`") && err.contains("`h1`"), "{err}");
        assert!(permit(Some(&alice), Action::Contribute { owner_id: "alice" }).is_err());
        let mine = Action::UseStudy {
            opened_by: Some("alice"),
        };
        assert!(permit(Some(&alice), mine).is_ok());
        assert!(permit(Some(&bob), mine).is_err());
        assert!(permit(Some(&peer(Role::Owner, "alice")), mine).is_err());
        assert!(permit(Some(&alice), Action::UseStudy { opened_by: None }).is_err());
        assert!(permit(Some(&proxy), Action::Status).is_ok());
        assert!(permit(Some(&alice), Action::Status).is_ok());
        assert!(permit(Some(&h1), Action::Status).is_err());
        // Plaintext: nothing to check.
        assert!(permit(None, Action::Contribute { owner_id: "x" }).is_ok());
    }
}
