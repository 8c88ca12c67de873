//! The mask holder's decisions (pure): a proxy holds the mask seeds of a study
//! that another proxy aggregates ([`dpca_common::secagg`]), and gives that
//! study's user, once, the sum of the masks of the owners it names.
//!
//! What each check defends (docs/PRIVACY.md, "Masked contributions"):
//! - The study is opened here by a user, with the spec the owners were invited
//!   to: an owner deposits only with the digest of the spec it verified
//!   ([`MaskStudy::deposit`]), so a holder study of a smaller `min_owners` than
//!   the invitation's takes no seed.
//! - One seed per owner, bound to its contribution id: a second one would let
//!   the user subtract two mask sums that differ by one owner.
//! - One sum per study, of `min_owners..=quorum` distinct owners that each
//!   deposited ([`MaskStudy::release`]): the aggregating proxy holds every
//!   contribution, so a sum of one owner's masks, or two sums of sets that
//!   differ by one owner, would unmask that owner for the proxy and the user
//!   together. Asked again for the same set, the holder answers the same.

use std::collections::BTreeMap;
use std::time::Duration;

use dpca_common::study::StudySpec;
use dpca_proto::convert::{spec_to_wire, stored_spec_from_wire};
use dpca_proto::v1;
use prost::Message;

/// How long past its deadline a held study counts as open (against the user's
/// limits, and kept): a day.
pub const HELD_GRACE: Duration = Duration::from_secs(24 * 3600);

/// Names a refusal lists before it counts the rest.
const NAMES_LISTED: usize = 16;

/// `names`, the first [`NAMES_LISTED`] of them and a count of the rest.
fn listed(names: &[String]) -> String {
    let shown = names.iter().take(NAMES_LISTED).cloned().collect::<Vec<_>>();
    match names.len().saturating_sub(NAMES_LISTED) {
        0 => shown.join(", "),
        more => format!("{} and {more} more", shown.join(", ")),
    }
}

/// A seed as its owner deposited it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Deposit {
    /// The contribution it masks (`ContributionChunk.contribution_id`).
    pub contribution_id: String,
    /// The seed ([`dpca_common::secagg::held_masks`]).
    pub seed: [u8; 32],
}

/// One study whose masks this proxy holds.
#[derive(Clone, Debug)]
pub struct MaskStudy {
    /// The study's id at the aggregating proxy.
    pub id: String,
    /// The spec the user opened it with here.
    pub spec: StudySpec,
    /// SHA-256 of the spec's wire encoding (`dpca_shell::invitation::spec_digest`).
    pub digest: String,
    /// The user who opened it (`None` on the insecure plaintext transport).
    pub opened_by: Option<String>,
    /// Owner id -> its seed.
    pub seeds: BTreeMap<String, Deposit>,
    /// The owners whose masks were summed for the user, sorted, once asked.
    pub released: Option<Vec<String>>,
}

/// Why the holder refuses a call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HolderRefusal {
    /// The study was opened here with another spec or by another user.
    #[error("study {0} is held here with another spec or for another user")]
    OpenedOtherwise(String),
    /// A spec that names no mask holder has no masks to hold.
    #[error("the spec names no mask holder: its owners send no masks")]
    NoMasks,
    /// An owner's spec is not the one the user opened here.
    #[error(
        "owner {owner} verified a spec of digest {got}, and study {study} is held here with \
         the spec of digest {held}: the seed is refused"
    )]
    OtherSpec {
        /// The study.
        study: String,
        /// The owner.
        owner: String,
        /// The owner's digest.
        got: String,
        /// The held spec's digest.
        held: String,
    },
    /// An owner the spec does not invite.
    #[error("owner {0} is not invited to this study")]
    NotInvited(String),
    /// A second seed from one owner.
    #[error("owner {owner} deposited a seed for contribution {held} already, not for {got}")]
    SecondSeed {
        /// The owner.
        owner: String,
        /// The contribution its seed is held for.
        held: String,
        /// The contribution of this deposit.
        got: String,
    },
    /// A deposit after the masks were summed.
    #[error("study {0}'s masks were summed already: no seed is taken after that")]
    Summed(String),
    /// A set of owners the sum cannot be given for.
    #[error("no mask sum for these owners: {0}")]
    BadSet(String),
    /// A second sum of another set.
    #[error(
        "study {study}'s masks were summed once, for {} ({}); a sum of another set ({}) \
         would unmask the owners the two differ by",
        held.len(), listed(held), listed(got)
    )]
    OtherSet {
        /// The study.
        study: String,
        /// The set summed.
        held: Vec<String>,
        /// The set asked for.
        got: Vec<String>,
    },
    /// The held record says no sum was given, and the journal says one was:
    /// the study was held anew under a summed study's id, or the state file was
    /// put back from an older copy.
    #[error(
        "study {0}'s masks were summed before (the release journal says so), and this \
         proxy's record of it does not say for whom: no sum is given again"
    )]
    Journaled(String),
}

impl MaskStudy {
    /// A study opened here by `opened_by` with `spec`, whose wire encoding has
    /// `digest`; refused if the spec names no mask holder.
    pub fn open(
        id: String,
        spec: StudySpec,
        digest: String,
        opened_by: Option<String>,
    ) -> Result<Self, HolderRefusal> {
        if spec.mask_holder.is_none() {
            return Err(HolderRefusal::NoMasks);
        }
        Ok(Self {
            id,
            spec,
            digest,
            opened_by,
            seeds: BTreeMap::new(),
            released: None,
        })
    }

    /// Whether an opening of the same id is this one again (a retry): the same
    /// spec by the same user. Anything else is refused.
    pub fn reopened(&self, digest: &str, opened_by: Option<&str>) -> Result<(), HolderRefusal> {
        if self.digest == digest && self.opened_by.as_deref() == opened_by {
            Ok(())
        } else {
            Err(HolderRefusal::OpenedOtherwise(self.id.clone()))
        }
    }

    /// Takes `owner`'s seed for its contribution, which it made from the spec
    /// of `digest`; `Ok(false)` for the same deposit again.
    pub fn deposit(
        &mut self,
        owner: &str,
        digest: &str,
        deposit: Deposit,
    ) -> Result<bool, HolderRefusal> {
        let new = self.check_deposit(owner, digest, &deposit)?;
        if new {
            self.seeds.insert(owner.to_owned(), deposit);
        }
        Ok(new)
    }

    /// What [`MaskStudy::deposit`] would answer, changing nothing.
    pub fn check_deposit(
        &self,
        owner: &str,
        digest: &str,
        deposit: &Deposit,
    ) -> Result<bool, HolderRefusal> {
        if digest != self.digest {
            return Err(HolderRefusal::OtherSpec {
                study: self.id.clone(),
                owner: owner.to_owned(),
                got: digest.to_owned(),
                held: self.digest.clone(),
            });
        }
        let invited = &self.spec.expected_owners;
        if !invited.is_empty() && !invited.iter().any(|o| o == owner) {
            return Err(HolderRefusal::NotInvited(owner.to_owned()));
        }
        if let Some(held) = self.seeds.get(owner) {
            return match held == deposit {
                true => Ok(false),
                false => Err(HolderRefusal::SecondSeed {
                    owner: owner.to_owned(),
                    held: held.contribution_id.clone(),
                    got: deposit.contribution_id.clone(),
                }),
            };
        }
        if self.released.is_some() {
            return Err(HolderRefusal::Summed(self.id.clone()));
        }
        Ok(true)
    }

    /// The seeds whose masks to sum for `owners`, recording the set on the
    /// first call: `min_owners..=quorum` distinct owners, each with a seed
    /// here; later, the same set only.
    pub fn release(&mut self, owners: &[String]) -> Result<Vec<(String, [u8; 32])>, HolderRefusal> {
        let mut set = owners.to_vec();
        set.sort();
        if let Some(held) = &self.released {
            if *held != set {
                return Err(HolderRefusal::OtherSet {
                    study: self.id.clone(),
                    held: held.clone(),
                    got: set,
                });
            }
        }
        self.check_set(&set)?;
        // The seeds of owners left out are of no further use: not kept.
        self.seeds.retain(|o, _| set.binary_search(o).is_ok());
        let seeds = set
            .iter()
            .filter_map(|o| self.seeds.get(o).map(|d| (o.clone(), d.seed)))
            .collect();
        self.released = Some(set);
        Ok(seeds)
    }

    /// A sorted `set` of `min_owners..=quorum` distinct owners with seeds.
    fn check_set(&self, set: &[String]) -> Result<(), HolderRefusal> {
        let (min, quorum) = (self.spec.min_owners as usize, self.spec.quorum as usize);
        if set.len() < min || set.len() > quorum {
            return Err(HolderRefusal::BadSet(format!(
                "{} named, and the study seals with {min} to {quorum}",
                set.len()
            )));
        }
        if let Some(w) = set.windows(2).find(|w| w[0] == w[1]) {
            return Err(HolderRefusal::BadSet(format!(
                "{} is named twice",
                listed(&w[..1])
            )));
        }
        if let Some(o) = set.iter().find(|o| !self.seeds.contains_key(*o)) {
            return Err(HolderRefusal::BadSet(format!(
                "{} deposited no seed",
                listed(std::slice::from_ref(o))
            )));
        }
        Ok(())
    }
}

impl MaskStudy {
    /// The study as the limits on what a user holds see it at `now_ms`. Not yet
    /// summed, it is open until [`HELD_GRACE`] past its deadline, which leaves
    /// the user time to fetch the sum after a seal at the deadline. Summed, it
    /// has ended where the release `journaled` the sum (held anew, it would be
    /// refused any other); without a journal it stays open as long, so that it
    /// is never dropped, and held anew for a second sum, while its spec could
    /// still be held (past its deadline no `HoldMasks` takes it).
    pub fn as_held(&self, now_ms: u64, journaled: bool) -> crate::limits::HeldStudy {
        let until = self
            .spec
            .deadline_unix_ms
            .saturating_add(HELD_GRACE.as_millis() as u64);
        let ended = now_ms >= until || (journaled && self.released.is_some());
        crate::limits::HeldStudy {
            id: self.id.clone(),
            opened_by: self.opened_by.clone(),
            open: !ended,
            deadline_unix_ms: self.spec.deadline_unix_ms,
        }
    }

    /// Its durable record.
    pub fn to_record(&self) -> v1::StoredHeldStudy {
        v1::StoredHeldStudy {
            spec: Some(spec_to_wire(&self.spec)),
            opened_by: self.opened_by.clone().unwrap_or_default(),
            opened_on_tls: self.opened_by.is_some(),
            seeds: self
                .seeds
                .iter()
                .map(|(owner, d)| v1::StoredSeed {
                    owner_id: owner.clone(),
                    contribution_id: d.contribution_id.clone(),
                    seed: d.seed.to_vec(),
                })
                .collect(),
            released: self.released.is_some(),
            released_to: self.released.clone().unwrap_or_default(),
        }
    }

    /// The study of record `bytes` stored under `id`, with the digest of its
    /// spec; what is wrong with it otherwise.
    pub fn from_record(id: &str, bytes: &[u8]) -> Result<Self, String> {
        let r = v1::StoredHeldStudy::decode(bytes).map_err(|e| e.to_string())?;
        let wire = r.spec.ok_or("no spec")?;
        // As stored: a check added to specs since must not stop the proxy.
        let spec = stored_spec_from_wire(&wire).map_err(|e| e.to_string())?;
        let digest = dpca_shell::invitation::spec_digest(&spec);
        let mut seeds = BTreeMap::new();
        for s in r.seeds {
            let seed = <[u8; 32]>::try_from(s.seed.as_slice())
                .map_err(|_| format!("the seed of {} is not 32 bytes", s.owner_id))?;
            let deposit = Deposit {
                contribution_id: s.contribution_id,
                seed,
            };
            seeds.insert(s.owner_id, deposit);
        }
        Ok(Self {
            id: id.to_owned(),
            spec,
            digest,
            opened_by: r.opened_on_tls.then_some(r.opened_by),
            seeds,
            released: r.released.then_some(r.released_to),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dpca_common::study::SpecDraft;

    fn held(min: u32, quorum: u32, invited: &[&str]) -> MaskStudy {
        let pk = dpca_common::testing::test_key().public().clone();
        let spec = SpecDraft {
            min_owners: min,
            quorum,
            expected_owners: invited.iter().map(|s| s.to_string()).collect(),
            mask_holder: Some("https://holder:50052".into()),
            deadline_unix_ms: 1_800_000_000_000,
            ..dpca_common::testing::test_draft(&pk, 2)
        }
        .validate()
        .expect("spec");
        MaskStudy::open("s".into(), spec, "d".into(), Some("alice".into())).expect("opens")
    }

    fn seed(cid: &str, byte: u8) -> Deposit {
        Deposit {
            contribution_id: cid.into(),
            seed: [byte; 32],
        }
    }

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_seed_is_taken_once_per_owner_from_the_invited_under_the_held_spec() {
        let mut h = held(2, 3, &["a", "b", "c"]);
        assert_eq!(h.deposit("a", "d", seed("1", 1)), Ok(true));
        assert_eq!(h.deposit("a", "d", seed("1", 1)), Ok(false), "a retry");
        assert!(matches!(
            h.deposit("a", "d", seed("2", 1)),
            Err(HolderRefusal::SecondSeed { .. })
        ));
        assert!(matches!(
            h.deposit("a", "d", seed("1", 2)),
            Err(HolderRefusal::SecondSeed { .. })
        ));
        assert!(matches!(
            h.deposit("b", "other", seed("1", 1)),
            Err(HolderRefusal::OtherSpec { .. })
        ));
        assert_eq!(
            h.deposit("mallory", "d", seed("1", 1)),
            Err(HolderRefusal::NotInvited("mallory".into()))
        );
        assert_eq!(h.seeds.len(), 1);
    }

    /// One sum per study, of a set the study could seal with: a sum of fewer
    /// owners, of a set naming one twice or one without a seed, is refused;
    /// once summed, only the same set (in any order) is answered.
    #[test]
    fn the_masks_are_summed_once_for_one_set_the_study_could_seal_with() {
        let mut h = held(2, 3, &[]);
        for (o, b) in [("a", 1), ("b", 2), ("c", 3)] {
            h.deposit(o, "d", seed("1", b)).expect("deposit");
        }
        assert!(matches!(
            h.release(&names(&["a"])),
            Err(HolderRefusal::BadSet(_))
        ));
        assert!(matches!(
            h.release(&names(&["a", "a"])),
            Err(HolderRefusal::BadSet(_))
        ));
        assert!(matches!(
            h.release(&names(&["a", "b", "c", "a"])),
            Err(HolderRefusal::BadSet(_))
        ));
        assert!(h.released.is_none(), "a refused set records nothing");
        let sum = h.release(&names(&["b", "a"])).expect("two owners");
        assert_eq!(sum, vec![("a".into(), [1; 32]), ("b".into(), [2; 32])]);
        assert_eq!(h.release(&names(&["a", "b"])), Ok(sum));
        assert!(matches!(
            h.release(&names(&["a", "b", "c"])),
            Err(HolderRefusal::OtherSet { .. })
        ));
        assert!(matches!(
            h.release(&names(&["a", "c"])),
            Err(HolderRefusal::OtherSet { .. })
        ));
        assert_eq!(
            h.deposit("d", "d", seed("1", 4)),
            Err(HolderRefusal::Summed("s".into()))
        );
    }

    /// A study whose masks were summed, on a proxy without a release journal,
    /// stays held, counted open, until a day past its deadline: dropped sooner,
    /// it could be held anew under the same spec and summed for a second set.
    /// With a journal, which refuses that, it has ended.
    #[test]
    fn a_summed_study_stays_held_until_a_day_past_its_deadline() {
        let mut h = held(2, 3, &[]);
        for (o, b) in [("a", 1), ("b", 2)] {
            h.deposit(o, "d", seed("1", b)).expect("deposit");
        }
        h.release(&names(&["a", "b"])).expect("sum");
        let deadline = h.spec.deadline_unix_ms;
        assert!(!h.as_held(deadline - 1, true).open, "summed and journaled");
        assert!(
            h.as_held(deadline - 1, false).open,
            "summed, before its deadline"
        );
        assert!(
            h.as_held(deadline + 1, false).open,
            "summed, just past its deadline"
        );
        let grace = HELD_GRACE.as_millis() as u64;
        assert!(!h.as_held(deadline + grace, false).open);
    }

    /// Seeds of owners left out of the sum are not kept.
    #[test]
    fn the_seeds_of_owners_left_out_are_dropped_at_the_sum() {
        let mut h = held(2, 3, &[]);
        for (o, b) in [("a", 1), ("b", 2), ("c", 3)] {
            h.deposit(o, "d", seed("1", b)).expect("deposit");
        }
        h.release(&names(&["a", "b"])).expect("sum");
        assert_eq!(h.seeds.keys().collect::<Vec<_>>(), ["a", "b"]);
        assert_eq!(
            h.deposit("c", "d", seed("1", 3)),
            Err(HolderRefusal::Summed("s".into()))
        );
    }

    #[test]
    fn an_owner_without_a_seed_is_named() {
        let mut h = held(2, 3, &[]);
        h.deposit("a", "d", seed("1", 1)).expect("deposit");
        let err = h.release(&names(&["a", "b"])).expect_err("b has none");
        assert!(err.to_string().contains("b deposited no seed"), "{err}");
    }

    #[test]
    fn a_record_reads_back_as_the_study_it_was_written_from() {
        let mut h = held(2, 3, &[]);
        h.deposit("a", "d", seed("1", 1)).expect("deposit");
        h.deposit("b", "d", seed("2", 2)).expect("deposit");
        h.release(&names(&["a", "b"])).expect("sum");
        let back = MaskStudy::from_record("s", &h.to_record().encode_to_vec()).expect("reads");
        assert_eq!(back.seeds, h.seeds);
        assert_eq!(back.released, h.released);
        assert_eq!(back.opened_by, h.opened_by);
        assert_eq!(back.digest, dpca_shell::invitation::spec_digest(&h.spec));
        let short = v1::StoredHeldStudy {
            seeds: vec![v1::StoredSeed {
                seed: vec![1; 31],
                ..Default::default()
            }],
            ..h.to_record()
        };
        assert!(MaskStudy::from_record("s", &short.encode_to_vec()).is_err());
    }

    #[test]
    fn a_reopening_is_the_same_spec_by_the_same_user_or_refused() {
        let h = held(2, 3, &[]);
        assert_eq!(h.reopened("d", Some("alice")), Ok(()));
        assert!(h.reopened("d", Some("bob")).is_err());
        assert!(h.reopened("e", Some("alice")).is_err());
    }
}
