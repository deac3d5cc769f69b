//! Which IP addresses the HTTP tools may connect to, and the DNS resolver that enforces it.
//!
//! Invariants:
//! - an address that is not publicly routable (an [`AddressClass`]: loopback, private, shared
//!   (CGNAT), link-local — cloud metadata services live there —, unique-local, unspecified,
//!   multicast, broadcast, documentation, benchmarking, reserved) is refused unless the operator
//!   allowed it: the allowlist names that IP literally, or `SKEIN_HTTP_ALLOW_PRIVATE=true`;
//! - an IPv6 address that carries an IPv4 address (IPv4-mapped `::ffff:a.b.c.d`, IPv4-compatible
//!   `::a.b.c.d`, NAT64 `64:ff9b::/96`, 6to4 `2002::/16`) is judged by the IPv4 address it
//!   carries, so no spelling of a refused address gets through;
//! - [`GuardedResolver`] returns only the addresses the policy allows, and the connection is made
//!   to exactly the addresses it returns: the check and the use are one step, with no second
//!   lookup in between, so a name that resolves to a public address once and to a private one the
//!   next time (DNS rebinding) cannot slip past the check;
//! - the resolver is not consulted for hosts that are IP literals: the tools check those, in the
//!   URL and in every redirect target, with [`AddressPolicy::check`].

use std::collections::BTreeSet;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use reqwest::dns::{Addrs, Name, Resolve, Resolving};
use skein_common::config::ENV_HTTP_ALLOW;

pub use skein_common::config::ENV_HTTP_ALLOW_PRIVATE;

/// Why an address is not publicly routable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddressClass {
    /// `0.0.0.0`, `::` (connecting to it reaches the local host).
    Unspecified,
    /// `127.0.0.0/8`, `::1`.
    Loopback,
    /// RFC 1918: `10.0.0.0/8`, `172.16.0.0/12`, `192.168.0.0/16`.
    Private,
    /// Carrier-grade NAT: `100.64.0.0/10`.
    Shared,
    /// `169.254.0.0/16` (cloud metadata at `169.254.169.254`), `fe80::/10`.
    LinkLocal,
    /// `fc00::/7`.
    UniqueLocal,
    /// `fec0::/10` (deprecated, still routed inside some sites).
    SiteLocal,
    /// `224.0.0.0/4`, `ff00::/8`.
    Multicast,
    /// `255.255.255.255`.
    Broadcast,
    /// `192.0.2.0/24`, `198.51.100.0/24`, `203.0.113.0/24`, `2001:db8::/32`.
    Documentation,
    /// `198.18.0.0/15`, `2001:2::/48`.
    Benchmarking,
    /// Everything else that is not a public unicast address: `0.0.0.0/8`, `192.0.0.0/24`,
    /// `192.88.99.0/24`, `240.0.0.0/4`, `100::/64`, `64:ff9b:1::/48`, IPv4-compatible IPv6.
    Reserved,
}

impl AddressClass {
    /// The class as the model and the operator read it ("a private address (RFC 1918)").
    pub fn describe(self) -> &'static str {
        match self {
            AddressClass::Unspecified => "an unspecified address",
            AddressClass::Loopback => "a loopback address",
            AddressClass::Private => "a private address (RFC 1918)",
            AddressClass::Shared => "a shared (carrier-grade NAT) address",
            AddressClass::LinkLocal => "a link-local address",
            AddressClass::UniqueLocal => "a unique-local address",
            AddressClass::SiteLocal => "a site-local address",
            AddressClass::Multicast => "a multicast address",
            AddressClass::Broadcast => "the broadcast address",
            AddressClass::Documentation => "a documentation address",
            AddressClass::Benchmarking => "a benchmarking address",
            AddressClass::Reserved => "a reserved address",
        }
    }
}

/// The class of `ip`, or `None` for a public unicast address.
pub fn classify(ip: IpAddr) -> Option<AddressClass> {
    match ip {
        IpAddr::V4(v4) => classify_v4(v4),
        IpAddr::V6(v6) => classify_v6(v6),
    }
}

fn classify_v4(ip: Ipv4Addr) -> Option<AddressClass> {
    use AddressClass::*;
    let [a, b, c, _] = ip.octets();
    let class = match (a, b, c) {
        _ if ip.is_unspecified() => Unspecified,
        _ if ip.is_broadcast() => Broadcast,
        (0, _, _) => Reserved,
        (10, _, _) => Private,
        (100, 64..=127, _) => Shared,
        (127, _, _) => Loopback,
        (169, 254, _) => LinkLocal,
        (172, 16..=31, _) => Private,
        (192, 0, 0) => Reserved,
        (192, 0, 2) | (198, 51, 100) | (203, 0, 113) => Documentation,
        (192, 88, 99) => Reserved,
        (192, 168, _) => Private,
        (198, 18..=19, _) => Benchmarking,
        (224..=239, _, _) => Multicast,
        (240..=255, _, _) => Reserved,
        _ => return None,
    };
    Some(class)
}

fn classify_v6(ip: Ipv6Addr) -> Option<AddressClass> {
    use AddressClass::*;
    if ip.is_unspecified() {
        return Some(Unspecified);
    }
    if ip.is_loopback() {
        return Some(Loopback);
    }
    if let Some((v4, form)) = carried_ipv4(ip) {
        return match classify_v4(v4) {
            Some(class) => Some(class),
            // `::a.b.c.d` is deprecated and routed nowhere; the others reach the IPv4 address.
            None if form == Carrier::Compatible => Some(Reserved),
            None => None,
        };
    }
    let s = ip.segments();
    let class = match s {
        [0x0100, 0, 0, 0, ..] => Reserved,
        [0x0064, 0xff9b, 0x0001, ..] => Reserved,
        [0x2001, 0x0db8, ..] => Documentation,
        [0x2001, 0x0002, 0, ..] => Benchmarking,
        [first, ..] if first & 0xfe00 == 0xfc00 => UniqueLocal,
        [first, ..] if first & 0xffc0 == 0xfe80 => LinkLocal,
        [first, ..] if first & 0xffc0 == 0xfec0 => SiteLocal,
        [first, ..] if first & 0xff00 == 0xff00 => Multicast,
        _ => return None,
    };
    Some(class)
}

/// How an IPv6 address carries an IPv4 one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Carrier {
    /// `::ffff:a.b.c.d`.
    Mapped,
    /// `::a.b.c.d` (not `::` or `::1`, classified before).
    Compatible,
    /// `64:ff9b::a.b.c.d`, the well-known NAT64 prefix.
    Nat64,
    /// `2002:aabb:ccdd::/48`.
    SixToFour,
}

/// The IPv4 address `ip` carries, and how.
fn carried_ipv4(ip: Ipv6Addr) -> Option<(Ipv4Addr, Carrier)> {
    let s = ip.segments();
    let join = |hi: u16, lo: u16| Ipv4Addr::from((u32::from(hi) << 16) | u32::from(lo));
    let tail = || join(s[6], s[7]);
    match s {
        [0, 0, 0, 0, 0, 0xffff, ..] => Some((tail(), Carrier::Mapped)),
        [0, 0, 0, 0, 0, 0, ..] => Some((tail(), Carrier::Compatible)),
        [0x0064, 0xff9b, 0, 0, 0, 0, ..] => Some((tail(), Carrier::Nat64)),
        [0x2002, hi, lo, ..] => Some((join(hi, lo), Carrier::SixToFour)),
        _ => None,
    }
}

/// Which addresses the HTTP tools may connect to: public ones, those the allowlist names
/// literally, and every one when private addresses are allowed. Cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct AddressPolicy {
    inner: Arc<PolicyInner>,
}

#[derive(Debug, Default)]
struct PolicyInner {
    allow_private: bool,
    /// IP literals of the allowlist, IPv4-mapped forms folded to IPv4.
    named: BTreeSet<IpAddr>,
}

impl AddressPolicy {
    /// `allow` is the host allowlist (its IP literals are allowed whatever their class);
    /// `allow_private` allows every address.
    pub fn new(allow: &[String], allow_private: bool) -> Self {
        let named = allow
            .iter()
            .filter_map(|pattern| {
                let pattern = pattern.trim();
                let bare = pattern
                    .strip_prefix('[')
                    .and_then(|p| p.strip_suffix(']'))
                    .unwrap_or(pattern);
                bare.parse::<IpAddr>().ok().map(|ip| ip.to_canonical())
            })
            .collect();
        Self {
            inner: Arc::new(PolicyInner {
                allow_private,
                named,
            }),
        }
    }

    pub fn allows_private(&self) -> bool {
        self.inner.allow_private
    }

    /// Whether the tools may connect to `ip`; the refusal names its class.
    pub fn check(&self, ip: IpAddr) -> Result<(), AddressRefused> {
        if self.inner.allow_private || self.inner.named.contains(&ip.to_canonical()) {
            return Ok(());
        }
        match classify(ip) {
            None => Ok(()),
            Some(class) => Err(AddressRefused {
                ip,
                class,
                name: None,
            }),
        }
    }
}

/// A connection refused because of where it would go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddressRefused {
    pub ip: IpAddr,
    pub class: AddressClass,
    /// The host name that resolved to `ip`, when it was not a literal.
    pub name: Option<String>,
}

impl fmt::Display for AddressRefused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ip = self.ip;
        let class = self.class.describe();
        match &self.name {
            Some(name) => write!(f, "refused: {name} resolves to {ip}, which is {class}")?,
            None => write!(f, "refused: {ip} is {class}")?,
        }
        if let IpAddr::V6(v6) = ip {
            if let Some((v4, _)) = carried_ipv4(v6) {
                write!(f, " (it carries {v4})")?;
            }
        }
        write!(
            f,
            "; allow it by naming {ip} in {ENV_HTTP_ALLOW}, or allow every such address with \
             {ENV_HTTP_ALLOW_PRIVATE}=true"
        )
    }
}

impl std::error::Error for AddressRefused {}

/// A DNS resolver that resolves, then drops the addresses `policy` refuses; when none is left the
/// lookup fails with [`AddressRefused`]. The HTTP pool connects only to what it returns.
pub struct GuardedResolver {
    policy: AddressPolicy,
    lookup: Lookup,
}

enum Lookup {
    /// The system resolver (`getaddrinfo`, on a blocking thread).
    System,
    /// Another resolver (tests map names to chosen addresses with it).
    Other(Arc<dyn Resolve>),
}

impl GuardedResolver {
    /// Resolves through the system resolver.
    pub fn new(policy: AddressPolicy) -> Self {
        Self {
            policy,
            lookup: Lookup::System,
        }
    }

    /// Resolves through `inner`, then filters the same way.
    pub fn wrapping(policy: AddressPolicy, inner: Arc<dyn Resolve>) -> Self {
        Self {
            policy,
            lookup: Lookup::Other(inner),
        }
    }
}

impl fmt::Debug for GuardedResolver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GuardedResolver")
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

impl Resolve for GuardedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let host = name.as_str().to_owned();
        let policy = self.policy.clone();
        let lookup: Resolving = match &self.lookup {
            Lookup::System => {
                let host = host.clone();
                Box::pin(async move {
                    let addrs = tokio::net::lookup_host((host, 0)).await?;
                    Ok(Box::new(addrs) as Addrs)
                })
            }
            Lookup::Other(inner) => inner.resolve(name),
        };
        Box::pin(async move {
            let addrs: Vec<SocketAddr> = lookup.await?.collect();
            let mut refused = None;
            let allowed: Vec<SocketAddr> = addrs
                .into_iter()
                .filter(|addr| match policy.check(addr.ip()) {
                    Ok(()) => true,
                    Err(refusal) => {
                        refused.get_or_insert(refusal);
                        false
                    }
                })
                .collect();
            match (allowed.is_empty(), refused) {
                (true, Some(refusal)) => Err(Box::new(AddressRefused {
                    name: Some(host),
                    ..refusal
                }) as _),
                (true, None) => Err(format!("{host} resolved to no address").into()),
                (false, refused) => {
                    if let Some(refusal) = refused {
                        tracing::debug!(%host, ip = %refusal.ip, "dropped a refused address of a name");
                    }
                    Ok(Box::new(allowed.into_iter()) as Addrs)
                }
            }
        })
    }
}

/// The address refusal somewhere in `error`'s chain of sources, if any.
pub fn refusal_in<'a>(error: &'a (dyn std::error::Error + 'static)) -> Option<&'a AddressRefused> {
    let mut current = Some(error);
    while let Some(e) = current {
        if let Some(refused) = e.downcast_ref::<AddressRefused>() {
            return Some(refused);
        }
        current = e.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use AddressClass::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().expect("test address parses")
    }

    #[test]
    fn addresses_are_classified() {
        let cases: &[(&str, Option<AddressClass>)] = &[
            // IPv4
            ("0.0.0.0", Some(Unspecified)),
            ("0.1.2.3", Some(Reserved)),
            ("10.0.0.5", Some(Private)),
            ("10.255.255.255", Some(Private)),
            ("172.15.255.255", None),
            ("172.16.0.1", Some(Private)),
            ("172.31.255.254", Some(Private)),
            ("172.32.0.1", None),
            ("192.168.1.1", Some(Private)),
            ("100.63.255.255", None),
            ("100.64.0.1", Some(Shared)),
            ("100.127.255.255", Some(Shared)),
            ("100.128.0.0", None),
            ("127.0.0.1", Some(Loopback)),
            ("127.255.0.9", Some(Loopback)),
            ("169.254.169.254", Some(LinkLocal)),
            ("169.254.0.1", Some(LinkLocal)),
            ("192.0.0.8", Some(Reserved)),
            ("192.0.2.10", Some(Documentation)),
            ("198.51.100.1", Some(Documentation)),
            ("203.0.113.7", Some(Documentation)),
            ("198.18.0.1", Some(Benchmarking)),
            ("198.19.255.1", Some(Benchmarking)),
            ("198.20.0.1", None),
            ("192.88.99.1", Some(Reserved)),
            ("224.0.0.1", Some(Multicast)),
            ("239.255.255.250", Some(Multicast)),
            ("240.0.0.1", Some(Reserved)),
            ("255.255.255.255", Some(Broadcast)),
            ("8.8.8.8", None),
            ("93.184.216.34", None),
            ("1.1.1.1", None),
            // IPv6
            ("::", Some(Unspecified)),
            ("::1", Some(Loopback)),
            ("fc00::1", Some(UniqueLocal)),
            ("fd12:3456::1", Some(UniqueLocal)),
            ("fe80::1", Some(LinkLocal)),
            ("febf::1", Some(LinkLocal)),
            ("fec0::1", Some(SiteLocal)),
            ("ff02::1", Some(Multicast)),
            ("2001:db8::1", Some(Documentation)),
            ("2001:2::1", Some(Benchmarking)),
            ("100::1", Some(Reserved)),
            ("64:ff9b:1::1", Some(Reserved)),
            ("2606:4700:4700::1111", None),
            ("2001:4860:4860::8888", None),
            // IPv6 carrying IPv4
            ("::ffff:127.0.0.1", Some(Loopback)),
            ("::ffff:10.0.0.5", Some(Private)),
            ("::ffff:169.254.169.254", Some(LinkLocal)),
            ("::ffff:100.64.1.1", Some(Shared)),
            ("::ffff:0.0.0.0", Some(Unspecified)),
            ("::ffff:8.8.8.8", None),
            ("::127.0.0.1", Some(Loopback)),
            ("::8.8.8.8", Some(Reserved)),
            ("64:ff9b::10.0.0.1", Some(Private)),
            ("64:ff9b::a9fe:a9fe", Some(LinkLocal)),
            ("64:ff9b::8.8.8.8", None),
            ("2002:7f00:1::1", Some(Loopback)),
            ("2002:c0a8:101::1", Some(Private)),
            ("2002:808:808::1", None),
        ];
        for (text, expected) in cases {
            assert_eq!(classify(ip(text)), *expected, "{text}");
        }
    }

    #[test]
    fn the_policy_allows_public_named_and_everything_when_private_is_allowed() {
        let none = AddressPolicy::new(&[], false);
        assert!(none.check(ip("8.8.8.8")).is_ok());
        let refused = none.check(ip("10.0.0.5")).expect_err("private");
        assert_eq!(refused.class, Private);
        let message = refused.to_string();
        assert!(
            message.starts_with("refused: 10.0.0.5 is a private address")
                && message.contains(ENV_HTTP_ALLOW)
                && message.contains(ENV_HTTP_ALLOW_PRIVATE),
            "{message}"
        );

        let named = AddressPolicy::new(
            &[
                "api.example.com".into(),
                " 10.0.0.5 ".into(),
                "[fd00::7]".into(),
                "*".into(),
            ],
            false,
        );
        assert!(named.check(ip("10.0.0.5")).is_ok());
        assert!(
            named.check(ip("::ffff:10.0.0.5")).is_ok(),
            "mapped form of a named address"
        );
        assert!(named.check(ip("fd00::7")).is_ok());
        assert!(named.check(ip("10.0.0.6")).is_err());
        assert!(named.check(ip("fd00::8")).is_err());
        assert!(
            named.check(ip("169.254.169.254")).is_err(),
            "`*` names no address"
        );

        let open = AddressPolicy::new(&[], true);
        for text in ["127.0.0.1", "169.254.169.254", "::1", "fd00::1", "10.1.2.3"] {
            assert!(open.check(ip(text)).is_ok(), "{text}");
        }
    }

    #[test]
    fn refusals_name_the_carried_address_and_the_name() {
        let policy = AddressPolicy::new(&[], false);
        let mapped = policy
            .check(ip("::ffff:169.254.169.254"))
            .expect_err("link-local");
        assert!(
            mapped
                .to_string()
                .starts_with("refused: ::ffff:169.254.169.254 is a link-local address (it carries 169.254.169.254)"),
            "{mapped}"
        );
        let resolved = AddressRefused {
            name: Some("internal.test".into()),
            ..policy.check(ip("127.0.0.1")).expect_err("loopback")
        };
        assert!(
            resolved.to_string().starts_with(
                "refused: internal.test resolves to 127.0.0.1, which is a loopback address;"
            ),
            "{resolved}"
        );
    }

    /// Maps every name to fixed addresses.
    struct Fixed(Vec<SocketAddr>);

    impl Resolve for Fixed {
        fn resolve(&self, _name: Name) -> Resolving {
            let addrs = self.0.clone();
            Box::pin(async move { Ok(Box::new(addrs.into_iter()) as Addrs) })
        }
    }

    async fn resolve(policy: AddressPolicy, addrs: &[&str]) -> Result<Vec<IpAddr>, String> {
        let fixed = Fixed(addrs.iter().map(|a| SocketAddr::new(ip(a), 0)).collect());
        let resolver = GuardedResolver::wrapping(policy, Arc::new(fixed));
        let name: Name = "service.test".parse().expect("valid name");
        match resolver.resolve(name).await {
            Ok(addrs) => Ok(addrs.map(|a| a.ip()).collect()),
            Err(e) => match refusal_in(&*e) {
                Some(refused) => Err(refused.to_string()),
                None => Err(format!("other: {e}")),
            },
        }
    }

    #[tokio::test]
    async fn the_resolver_drops_refused_addresses_and_fails_when_none_is_left() {
        let strict = AddressPolicy::new(&[], false);
        assert_eq!(
            resolve(strict.clone(), &["10.0.0.5", "93.184.216.34"]).await,
            Ok(vec![ip("93.184.216.34")])
        );
        let refused = resolve(strict.clone(), &["127.0.0.1", "::1"])
            .await
            .expect_err("all refused");
        assert!(
            refused.starts_with("refused: service.test resolves to 127.0.0.1, which is a loopback"),
            "{refused}"
        );
        let empty = resolve(strict, &[]).await.expect_err("no address");
        assert!(empty.contains("no address"), "{empty}");
        assert_eq!(
            resolve(AddressPolicy::new(&[], true), &["127.0.0.1"]).await,
            Ok(vec![ip("127.0.0.1")])
        );
    }

    #[tokio::test]
    async fn the_system_resolver_path_refuses_localhost() {
        let resolver = GuardedResolver::new(AddressPolicy::new(&[], false));
        let name: Name = "localhost".parse().expect("valid name");
        let error = match resolver.resolve(name).await {
            Ok(addrs) => panic!("resolved to {:?}", addrs.collect::<Vec<_>>()),
            Err(e) => e,
        };
        let refused = refusal_in(&*error).expect("an address refusal");
        assert_eq!(refused.class, Loopback, "{refused}");
    }
}
