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
    /// OpenStudy, or HoldMasks (a study held here for another proxy).
    OpenStudy,
    /// GetStudy: the public spec.
    ReadSpec,
    /// Contribute, ReserveUpload or DepositSeed for a contribution, claiming
    /// this owner id.
    Contribute {
        /// The owner id in the contribution's header.
        owner_id: &'a str,
    },
    /// Status: every study and budget for the operator, own studies for a user.
    Status,
    /// AwaitSeal, Release, FetchResult or FetchMaskSum of a study opened by
    /// `opened_by`.
    UseStudy {
        /// The name of the user who opened the study (`None`: opened on plaintext).
        opened_by: Option<&'a str>,
    },
}

/// The proxy's methods, as `dpca.proto` declares them: the one list the gate
/// (`gate`), the metrics' labels and the operator listener read a call's path
/// against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    /// OpenStudy.
    OpenStudy,
    /// GetStudy.
    GetStudy,
    /// Contribute.
    Contribute,
    /// ReserveUpload.
    ReserveUpload,
    /// AwaitSeal.
    AwaitSeal,
    /// Release.
    Release,
    /// FetchResult.
    FetchResult,
    /// Status.
    Status,
    /// HoldMasks.
    HoldMasks,
    /// DepositSeed.
    DepositSeed,
    /// FetchMaskSum.
    FetchMaskSum,
}

impl Method {
    /// Every method.
    pub const ALL: [Method; 11] = [
        Method::OpenStudy,
        Method::GetStudy,
        Method::Contribute,
        Method::ReserveUpload,
        Method::AwaitSeal,
        Method::Release,
        Method::FetchResult,
        Method::Status,
        Method::HoldMasks,
        Method::DepositSeed,
        Method::FetchMaskSum,
    ];

    /// Its name in `dpca.proto`.
    pub fn name(self) -> &'static str {
        match self {
            Method::OpenStudy => "OpenStudy",
            Method::GetStudy => "GetStudy",
            Method::Contribute => "Contribute",
            Method::ReserveUpload => "ReserveUpload",
            Method::AwaitSeal => "AwaitSeal",
            Method::Release => "Release",
            Method::FetchResult => "FetchResult",
            Method::Status => "Status",
            Method::HoldMasks => "HoldMasks",
            Method::DepositSeed => "DepositSeed",
            Method::FetchMaskSum => "FetchMaskSum",
        }
    }

    /// The method a gRPC path calls (`/dpca.v1.Proxy/Contribute`), `None` for a
    /// path that is none of the proxy's.
    pub fn from_path(path: &str) -> Option<Method> {
        let service = dpca_proto::v1::proxy_server::SERVICE_NAME;
        let method = path
            .strip_prefix('/')?
            .strip_prefix(service)?
            .strip_prefix('/')?;
        Method::ALL.into_iter().find(|m| m.name() == method)
    }
}

/// Whether `peer`'s role may call `method` at all: what [`permit`] decides from
/// the certificate alone, before the request names a study or an owner. Each
/// method is asked as the action most open to the caller (its own name as the
/// owner or the study's opener), so a call refused here is refused by `permit`
/// whatever the request holds.
pub fn may_call(peer: &Peer, method: Method) -> Result<(), String> {
    let own = peer.name.as_str();
    let action = match method {
        Method::OpenStudy | Method::HoldMasks => Action::OpenStudy,
        Method::GetStudy => Action::ReadSpec,
        Method::Contribute | Method::ReserveUpload | Method::DepositSeed => {
            Action::Contribute { owner_id: own }
        }
        Method::Status => Action::Status,
        Method::AwaitSeal | Method::Release | Method::FetchResult | Method::FetchMaskSum => {
            Action::UseStudy {
                opened_by: Some(own),
            }
        }
    };
    permit(Some(peer), action)
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

    /// The gate lets each role call exactly the methods some request of theirs
    /// could be allowed.
    #[test]
    fn each_role_may_call_its_methods_only() {
        use Method::*;
        let allowed = |role| match role {
            Role::User => vec![
                OpenStudy,
                GetStudy,
                AwaitSeal,
                Release,
                FetchResult,
                Status,
                HoldMasks,
                FetchMaskSum,
            ],
            Role::Owner => vec![GetStudy, Contribute, ReserveUpload, DepositSeed],
            Role::Proxy => vec![Status],
        };
        for role in [Role::User, Role::Owner, Role::Proxy] {
            let caller = peer(role, "x");
            for method in Method::ALL {
                assert_eq!(
                    may_call(&caller, method).is_ok(),
                    allowed(role).contains(&method),
                    "{role:?} calling {method:?}"
                );
            }
        }
    }

    #[test]
    fn a_path_names_a_method_of_the_proxy_or_none() {
        for m in Method::ALL {
            let path = format!(
                "/{}/{}",
                dpca_proto::v1::proxy_server::SERVICE_NAME,
                m.name()
            );
            assert_eq!(Method::from_path(&path), Some(m));
        }
        for made_up in [
            "x",
            "/dpca.v1.Proxy/Xyz123",
            "/other.Service/Status",
            "/",
            "",
        ] {
            assert_eq!(Method::from_path(made_up), None, "{made_up}");
        }
    }
}
