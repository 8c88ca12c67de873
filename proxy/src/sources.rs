//! Whose handshakes a connection counts against: the listener's caps per source
//! (`listener::capped_tls`, and scaled to its places, `door`), pure.
//!
//! An IPv4 address is a source. An IPv6 host may take any address of its link's
//! /64 (the low 64 bits are its to choose: SLAAC, privacy addresses), and a home
//! or small site is commonly given a /56, a site a /48 (RIPE-690): counted by
//! address, one IPv6 client could hold every handshake place; counted by /64
//! alone, a home's /56 held them from 32 of its 256 /64s. So an IPv6 client is
//! counted in its /64, /56 and /48 at once. Only the /64's cap always applies:
//! hosting providers and carriers give each customer a /64 of a shared /56 or
//! /48, whose customers an attacker among them would otherwise lock out. The
//! /56's and /48's apply once more than half the places are held, so one site
//! holds at most half the places (it takes them freely while half are free) and
//! each further site 32: five sites hold them all, where one IPv6 client did.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::per_key::{Held, PerKey};

/// TLS handshakes at once from one source: an IPv4 address, or an IPv6
/// address's /64 (with more, while places run short, on its /56 and /48).
pub const MAX_HANDSHAKES_PER_SOURCE: usize = 8;

/// A block of addresses whose handshakes are counted together: its first
/// address and its prefix length.
pub type Block = (IpAddr, u8);

/// How many handshakes a block may hold, and when.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cap {
    /// Whatever the other places hold.
    Always(usize),
    /// While more than half of all places are held ([`Crowding::Crowded`]).
    WhenCrowded(usize),
}

/// Whether the listener's handshake places are running short.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Crowding {
    /// At least half of them are free.
    Roomy,
    /// More than half of them are held.
    Crowded,
}

impl Crowding {
    /// With `free` of `all` places free.
    pub fn of(free: usize, all: usize) -> Self {
        if free * 2 < all {
            Crowding::Crowded
        } else {
            Crowding::Roomy
        }
    }
}

/// The IPv6 blocks a client's handshakes count against, by prefix length.
const IPV6_BLOCK_CAPS: [(u8, Cap); 3] = [
    (64, Cap::Always(MAX_HANDSHAKES_PER_SOURCE)),
    (56, Cap::WhenCrowded(2 * MAX_HANDSHAKES_PER_SOURCE)),
    (48, Cap::WhenCrowded(4 * MAX_HANDSHAKES_PER_SOURCE)),
];

/// The blocks a connection from `ip` counts against, each with its cap: an IPv4
/// address alone, or an IPv6 address's /64, /56 and /48. An IPv6 address that
/// stands for an IPv4 one counts as that address ([`embedded_ipv4`]).
fn blocks_of(ip: IpAddr) -> Vec<(Block, Cap)> {
    let v6 = match ip {
        IpAddr::V4(_) => return vec![((ip, 32), Cap::Always(MAX_HANDSHAKES_PER_SOURCE))],
        IpAddr::V6(v6) => v6,
    };
    if let Some(v4) = embedded_ipv4(v6) {
        return blocks_of(IpAddr::V4(v4));
    }
    IPV6_BLOCK_CAPS
        .iter()
        .map(|&(len, cap)| {
            let mask = !(u128::MAX >> len);
            ((IpAddr::V6((u128::from(v6) & mask).into()), len), cap)
        })
        .collect()
}

/// The IPv4 address an IPv6 one stands for: mapped (`::ffff:a.b.c.d`, how an
/// IPv4 client of a dual-stack listener arrives: counted in its /64, every IPv4
/// client would share one source), or translated under NAT64's well-known prefix
/// (`64:ff9b::/96`, RFC 6052: every IPv4 client of a proxy behind such a
/// translator). A 6to4 address (`2002:a.b.c.d::/48`) is left a site of its own:
/// whoever runs a 6to4 relay on the way back could otherwise hold an IPv4 host's
/// places without being it.
fn embedded_ipv4(v6: Ipv6Addr) -> Option<Ipv4Addr> {
    const NAT64_WELL_KNOWN: u128 = 0x0064_ff9b_0000_0000_0000_0000; // top 96 bits
    let bits = u128::from(v6);
    match v6.to_ipv4_mapped() {
        Some(v4) => Some(v4),
        None if bits >> 32 == NAT64_WELL_KNOWN => Some(Ipv4Addr::from(bits as u32)),
        None => None,
    }
}

/// Handshakes under way per block of source addresses.
#[derive(Clone)]
pub struct Sources {
    held: PerKey<Block>,
    /// What each cap is multiplied by: places held per handshake place.
    scale: usize,
}

impl Default for Sources {
    fn default() -> Self {
        Self::scaled(1)
    }
}

impl Sources {
    /// Caps `scale` times the handshakes': for places of which a source may hold
    /// that many per handshake (a door's, [`crate::door`], that holds connections
    /// queued for a handshake too), so that its share of them is its share of the
    /// handshakes.
    pub fn scaled(scale: usize) -> Self {
        Self {
            held: PerKey::default(),
            scale: scale.max(1),
        }
    }

    /// One handshake of a client at `ip`, held in every block it counts against;
    /// none, and nothing held, if one of them holds its cap already. A block whose
    /// cap applies only when `crowding` is crowded counts all the same.
    pub fn take(&self, ip: IpAddr, crowding: Crowding) -> Option<Vec<Held<Block>>> {
        blocks_of(ip)
            .into_iter()
            .map(|(block, cap)| {
                let max = match (cap, crowding) {
                    (Cap::Always(n), _) | (Cap::WhenCrowded(n), Crowding::Crowded) => {
                        n * self.scale
                    }
                    (Cap::WhenCrowded(_), Crowding::Roomy) => usize::MAX,
                };
                self.held.take(block, max)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Crowding::{Crowded, Roomy};

    /// Takes handshakes from `from`, in turn, until a cap refuses one: how many fit.
    fn fill(
        sources: &Sources,
        held: &mut Vec<Vec<Held<Block>>>,
        from: &[&str],
        crowding: Crowding,
    ) -> usize {
        let before = held.len();
        for ip in from.iter().cycle().take(1000) {
            match sources.take(ip.parse().expect("address"), crowding) {
                Some(h) => held.push(h),
                None => return held.len() - before,
            }
        }
        panic!("no cap on {from:?}")
    }

    #[test]
    fn an_ipv6_client_is_capped_by_its_64_and_when_crowded_its_56_and_48() {
        let (sources, mut held) = (Sources::default(), Vec::new());
        // Any addresses of one /64: 8.
        let a = ["2001:db8:0:100::1", "2001:db8:0:100:ffff:ffff:ffff:ffff"];
        assert_eq!(fill(&sources, &mut held, &a, Crowded), 8);
        // Another /64 of the same /56: the /56's 16 when crowded, its own 8 when
        // not (another customer of a shared block).
        assert_eq!(
            fill(&sources, &mut held, &["2001:db8:0:101::1"], Crowded),
            8
        );
        assert_eq!(
            fill(&sources, &mut held, &["2001:db8:0:102::1"], Crowded),
            0
        );
        // A refused take holds nothing: not the /64 the /56 refused.
        let block = |s: &str, len| (s.parse().expect("address"), len);
        assert_eq!(sources.held.held(&block("2001:db8:0:102::", 64)), 0);
        assert_eq!(fill(&sources, &mut held, &["2001:db8:0:102::1"], Roomy), 8);
        // Other /56s of the same /48 (which holds 24 now): its 32 when crowded.
        assert_eq!(
            fill(&sources, &mut held, &["2001:db8:0:200::1"], Crowded),
            8
        );
        assert_eq!(
            fill(&sources, &mut held, &["2001:db8:0:300::1"], Crowded),
            0
        );
        assert_eq!(sources.held.held(&block("2001:db8:0:300::", 64)), 0);
        assert_eq!(sources.held.held(&block("2001:db8:0:300::", 56)), 0);
        // Another /48 is a site of its own.
        assert_eq!(fill(&sources, &mut held, &["2001:db8:1::1"], Crowded), 8);
        // A handshake that ends gives its place back in every block.
        held.truncate(held.len() - 9);
        assert_eq!(
            fill(&sources, &mut held, &["2001:db8:0:300::1"], Crowded),
            1
        );
        drop(held);
        assert_eq!(sources.held.held(&block("2001:db8::", 48)), 0);
    }

    #[test]
    fn an_ipv4_client_is_capped_by_its_address_however_it_arrives() {
        let (sources, mut held) = (Sources::default(), Vec::new());
        // Plain, mapped (a dual-stack listener) and NAT64: one source, crowded
        // or not.
        let one = ["192.0.2.7", "::ffff:192.0.2.7", "64:ff9b::192.0.2.7"];
        assert_eq!(fill(&sources, &mut held, &one, Roomy), 8);
        // Each other address is a source of its own, however it arrives.
        for other in ["192.0.2.8", "::ffff:192.0.2.9", "64:ff9b::192.0.2.10"] {
            assert_eq!(fill(&sources, &mut held, &[other], Crowded), 8, "{other}");
        }
        // A 6to4 site is an IPv6 site, not its IPv4 host's: 8 more.
        assert_eq!(fill(&sources, &mut held, &["2002:c000:207::1"], Roomy), 8);
    }

    /// The main port's door holds five places per handshake place: a source's
    /// caps there are five times its handshakes', every level of them.
    #[test]
    fn scaled_caps_are_the_handshakes_times_the_scale() {
        let (sources, mut held) = (Sources::scaled(5), Vec::new());
        assert_eq!(fill(&sources, &mut held, &["192.0.2.7"], Crowded), 40);
        let site: Vec<String> = (0..20).map(|i| format!("2001:db8:0:{i:x}00::1")).collect();
        let site: Vec<&str> = site.iter().map(String::as_str).collect();
        // Twenty /64s of one /48, in /56s of their own: the /48's cap.
        assert_eq!(fill(&sources, &mut held, &site, Crowded), 160);
    }

    #[test]
    fn places_run_short_past_half() {
        assert_eq!(Crowding::of(256, 256), Roomy);
        assert_eq!(Crowding::of(128, 256), Roomy);
        assert_eq!(Crowding::of(127, 256), Crowded);
        assert_eq!(Crowding::of(0, 256), Crowded);
    }
}
