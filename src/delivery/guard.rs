//! Which addresses a delivery may reach: a merchant chooses the URL, so without this guard
//! pagos would POST wherever it is told, from inside the operator's network — to the
//! cloud's metadata service, a database's admin port, anything on loopback.
//!
//! A URL must be `https` (plain `http` only when private addresses are allowed: local
//! receivers in development and tests), carry no user name or password, and every address
//! its host resolves to must be public. The guard runs at registration (the API answers
//! 422 with the refusal's text) and again at every delivery, which then connects only to
//! the addresses this check returned (`Destination`, pinned in the HTTP client): a DNS
//! answer that changes between the check and the connection (rebinding) cannot reach an
//! internal address.
//!
//! Which addresses are not public is a table of the IANA special-purpose registries as
//! CIDR blocks (`ipnet`, kept by the same hands as reqwest's dependency on it): std's
//! `is_global` is still unstable, and the crates that copy it are not kept up to date.
//! IPv6 is an allow-list (global unicast, 2000::/3, less its special blocks); an IPv4
//! address inside IPv6 (mapped, NAT64) is judged as the IPv4 address it carries.
//!
//! Never logs a URL: it may carry a merchant's token in its path or query.

use futures::future::BoxFuture;
use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use url::{Host, Url};

/// Whether deliveries may reach loopback, private and link-local addresses
/// (`PAGOS_WEBHOOKS_ALLOW_PRIVATE`): never in production.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AddressPolicy {
    PublicOnly,
    AllowPrivate,
}

impl AddressPolicy {
    pub fn from_allow_private(allow: bool) -> AddressPolicy {
        if allow {
            AddressPolicy::AllowPrivate
        } else {
            AddressPolicy::PublicOnly
        }
    }
}

/// A URL is no longer than this (a registration is refused beyond it).
pub const MAX_URL_LEN: usize = 2048;

/// Why a URL is refused. Its text names the host and the address, never the rest of the
/// URL; the merchant is told `for_merchant`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("the URL cannot be read: {0}")]
    NotAUrl(String),
    #[error(
        "the URL is longer than 2048 characters as stored, where a character outside ASCII counts as its percent-encoding (three characters a byte)"
    )]
    TooLong,
    #[error("the URL must start with https://")]
    NotHttps,
    #[error("the URL has no host")]
    NoHost,
    #[error(
        "the URL must not carry a user name or password: a delivery is authenticated by its signature"
    )]
    Credentials,
    #[error("{host} does not resolve ({reason})")]
    Unresolvable { host: String, reason: String },
    #[error("{}", forbidden_text(host, address, kind))]
    Forbidden {
        host: String,
        address: IpAddr,
        kind: &'static str,
    },
}

fn forbidden_text(host: &str, address: &IpAddr, kind: &str) -> String {
    let subject = if is_address(host) {
        format!("{address} is")
    } else {
        format!("{host} resolves to {address},")
    };
    format!(
        "{subject} not a public address ({kind}): webhooks are delivered only to public addresses"
    )
}

impl Refusal {
    /// The URL itself is wrong (a new name or address will not change that).
    pub fn is_about_the_url(&self) -> bool {
        !matches!(self, Refusal::Unresolvable { .. })
    }

    /// What the merchant registering the URL is told. A host name's refusal is one text
    /// whether it does not resolve or resolves to a non-public address, without the
    /// address or the resolver's words: the names and addresses of the network pagos runs
    /// in are not for any merchant to map. (The whole refusal, `Display`, is for on-call:
    /// the logs, the stored attempts.) A URL that names an address is told why it is
    /// refused: the merchant wrote it.
    pub fn for_merchant(&self) -> String {
        match self {
            Refusal::Unresolvable { host, .. } | Refusal::Forbidden { host, .. }
                if !is_address(host) =>
            {
                format!(
                    "{host} does not resolve to a public address (only public addresses are delivered to; a name not resolvable yet may be registered once it is)"
                )
            }
            other => other.to_string(),
        }
    }
}

/// Whether a URL's host is an address (an IPv6 one in brackets), not a name.
fn is_address(host: &str) -> bool {
    host.trim_start_matches('[')
        .trim_end_matches(']')
        .parse::<IpAddr>()
        .is_ok()
}

/// A checked URL and the addresses a delivery to it connects to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Destination {
    url: Url,
    /// The host name whose resolution is pinned (None: the URL names an address).
    name: Option<String>,
    addrs: Vec<SocketAddr>,
}

impl Destination {
    pub fn url(&self) -> &Url {
        &self.url
    }

    /// The name to pin to `addrs()`, when the URL's host is a name.
    pub fn name(&self) -> Option<&str> {
        self.name.as_deref()
    }

    /// The checked addresses, sorted, without duplicates.
    pub fn addrs(&self) -> &[SocketAddr] {
        &self.addrs
    }
}

/// Name resolution, swappable in tests (a name that answers differently each time).
pub trait Resolve: Send + Sync {
    fn resolve<'a>(
        &'a self,
        host: &'a str,
        port: u16,
    ) -> BoxFuture<'a, std::io::Result<Vec<SocketAddr>>>;
}

/// The operating system's resolver (`getaddrinfo`, on tokio's blocking pool).
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemResolver;

impl Resolve for SystemResolver {
    fn resolve<'a>(
        &'a self,
        host: &'a str,
        port: u16,
    ) -> BoxFuture<'a, std::io::Result<Vec<SocketAddr>>> {
        Box::pin(async move { Ok(tokio::net::lookup_host((host, port)).await?.collect()) })
    }
}

/// Parses and checks the parts of a URL that need no resolution. Its length is checked
/// as sent and as normalised (what is stored): percent-encoding a character outside ASCII
/// triples its bytes, and an international host name grows into its `xn--` form.
pub fn parse(text: &str, policy: AddressPolicy) -> Result<Url, Refusal> {
    if text.len() > MAX_URL_LEN {
        return Err(Refusal::TooLong);
    }
    let url = Url::parse(text).map_err(|e| Refusal::NotAUrl(e.to_string()))?;
    if url.as_str().len() > MAX_URL_LEN {
        return Err(Refusal::TooLong);
    }
    check_form(&url, policy)?;
    Ok(url)
}

fn check_form(url: &Url, policy: AddressPolicy) -> Result<(), Refusal> {
    match (url.scheme(), policy) {
        ("https", _) | ("http", AddressPolicy::AllowPrivate) => {}
        _ => return Err(Refusal::NotHttps),
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(Refusal::Credentials);
    }
    if url.host().is_none() {
        return Err(Refusal::NoHost);
    }
    Ok(())
}

/// Checks `url` completely: its form, then every address its host resolves to. The
/// addresses returned are the only ones a delivery may connect to.
pub async fn check(
    url: &Url,
    policy: AddressPolicy,
    resolver: &dyn Resolve,
) -> Result<Destination, Refusal> {
    check_form(url, policy)?;
    let port = url.port_or_known_default().ok_or(Refusal::NoHost)?;
    let (name, mut addrs) = match url.host() {
        Some(Host::Ipv4(ip)) => (None, vec![SocketAddr::new(ip.into(), port)]),
        Some(Host::Ipv6(ip)) => (None, vec![SocketAddr::new(ip.into(), port)]),
        Some(Host::Domain(name)) => {
            let unresolvable = |reason: String| Refusal::Unresolvable {
                host: name.to_owned(),
                reason,
            };
            let addrs = resolver
                .resolve(name, port)
                .await
                .map_err(|e| unresolvable(e.to_string()))?;
            if addrs.is_empty() {
                return Err(unresolvable("no address".into()));
            }
            (Some(name.to_owned()), addrs)
        }
        None => return Err(Refusal::NoHost),
    };
    addrs.sort_unstable();
    addrs.dedup();
    if policy == AddressPolicy::PublicOnly {
        // One internal address among public ones is enough to refuse: the connection
        // could go to any of them.
        for addr in &addrs {
            if let Some(kind) = non_public(addr.ip()) {
                return Err(Refusal::Forbidden {
                    host: url.host_str().unwrap_or_default().to_owned(),
                    address: addr.ip(),
                    kind,
                });
            }
        }
    }
    Ok(Destination {
        url: url.clone(),
        name,
        addrs,
    })
}

const fn v4(a: u8, b: u8, c: u8, d: u8, len: u8) -> IpNet {
    IpNet::V4(Ipv4Net::new_assert(Ipv4Addr::new(a, b, c, d), len))
}

const fn v6(segments: [u16; 8], len: u8) -> IpNet {
    let [a, b, c, d, e, f, g, h] = segments;
    IpNet::V6(Ipv6Net::new_assert(
        Ipv6Addr::new(a, b, c, d, e, f, g, h),
        len,
    ))
}

/// The IPv4 special-purpose blocks (IANA registry, RFC 6890 and later) no delivery goes
/// to, most specific first (the first match names the kind).
const IPV4_BLOCKS: &[(IpNet, &str)] = &[
    (v4(169, 254, 169, 254, 32), "link-local, cloud metadata"),
    (v4(255, 255, 255, 255, 32), "broadcast"),
    (v4(0, 0, 0, 0, 8), "unspecified"),
    (v4(10, 0, 0, 0, 8), "private"),
    (v4(100, 64, 0, 0, 10), "shared, carrier-grade NAT"),
    (v4(127, 0, 0, 0, 8), "loopback"),
    (v4(169, 254, 0, 0, 16), "link-local"),
    (v4(172, 16, 0, 0, 12), "private"),
    (v4(192, 0, 0, 0, 24), "IETF protocol assignment"),
    (v4(192, 0, 2, 0, 24), "documentation"),
    (v4(192, 88, 99, 0, 24), "6to4 relay"),
    (v4(192, 168, 0, 0, 16), "private"),
    (v4(198, 18, 0, 0, 15), "benchmarking"),
    (v4(198, 51, 100, 0, 24), "documentation"),
    (v4(203, 0, 113, 0, 24), "documentation"),
    (v4(224, 0, 0, 0, 4), "multicast"),
    (v4(240, 0, 0, 0, 4), "reserved"),
];

/// The IPv6 blocks inside global unicast (2000::/3) that are not public.
const IPV6_BLOCKS: &[(IpNet, &str)] = &[
    (v6([0x2001, 0xdb8, 0, 0, 0, 0, 0, 0], 32), "documentation"),
    (
        v6([0x2001, 0, 0, 0, 0, 0, 0, 0], 23),
        "IETF protocol assignment, Teredo or ORCHID",
    ),
    (v6([0x2002, 0, 0, 0, 0, 0, 0, 0], 16), "6to4"),
    (v6([0x3fff, 0, 0, 0, 0, 0, 0, 0], 20), "documentation"),
];

const IPV6_GLOBAL_UNICAST: IpNet = v6([0x2000, 0, 0, 0, 0, 0, 0, 0], 3);
const NAT64: IpNet = v6([0x64, 0xff9b, 0, 0, 0, 0, 0, 0], 96);

/// Why `ip` is not a public address (None: it is).
pub fn non_public(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => non_public_v4(v4),
        IpAddr::V6(v6) => non_public_v6(v6),
    }
}

fn non_public_v4(ip: Ipv4Addr) -> Option<&'static str> {
    IPV4_BLOCKS
        .iter()
        .find(|(block, _)| block.contains(&IpAddr::V4(ip)))
        .map(|(_, kind)| *kind)
}

fn non_public_v6(ip: Ipv6Addr) -> Option<&'static str> {
    // An IPv4 address carried in IPv6 reaches that IPv4 address: judge it as one.
    if let Some(mapped) = ip.to_ipv4_mapped() {
        return non_public_v4(mapped);
    }
    let addr = IpAddr::V6(ip);
    if NAT64.contains(&addr) {
        let [.., a, b, c, d] = ip.octets();
        return non_public_v4(Ipv4Addr::new(a, b, c, d));
    }
    if ip.is_unspecified() {
        return Some("unspecified");
    }
    if ip.is_loopback() {
        return Some("loopback");
    }
    if ip.is_unique_local() {
        return Some("unique-local, private");
    }
    if ip.is_unicast_link_local() {
        return Some("link-local");
    }
    if ip.is_multicast() {
        return Some("multicast");
    }
    if !IPV6_GLOBAL_UNICAST.contains(&addr) {
        return Some("reserved, not global unicast");
    }
    IPV6_BLOCKS
        .iter()
        .find(|(block, _)| block.contains(&addr))
        .map(|(_, kind)| *kind)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().expect("an address")
    }

    #[test]
    fn every_internal_kind_of_ipv4_address_is_refused() {
        for (address, kind) in [
            ("127.0.0.1", "loopback"),
            ("127.255.255.254", "loopback"),
            ("10.1.2.3", "private"),
            ("172.16.0.1", "private"),
            ("172.31.255.255", "private"),
            ("192.168.1.1", "private"),
            ("169.254.0.1", "link-local"),
            ("169.254.169.254", "link-local, cloud metadata"),
            ("100.64.0.1", "shared, carrier-grade NAT"),
            ("100.100.100.200", "shared, carrier-grade NAT"),
            ("0.0.0.0", "unspecified"),
            ("255.255.255.255", "broadcast"),
            ("192.0.2.10", "documentation"),
            ("198.51.100.7", "documentation"),
            ("203.0.113.9", "documentation"),
            ("198.18.0.1", "benchmarking"),
            ("198.19.255.255", "benchmarking"),
            ("224.0.0.1", "multicast"),
            ("240.0.0.1", "reserved"),
            ("192.0.0.8", "IETF protocol assignment"),
        ] {
            assert_eq!(non_public(ip(address)), Some(kind), "{address}");
        }
    }

    #[test]
    fn public_ipv4_addresses_next_to_the_blocks_are_allowed() {
        for address in [
            "1.1.1.1",
            "8.8.8.8",
            "172.15.255.255",
            "172.32.0.0",
            "100.63.255.255",
            "100.128.0.0",
            "169.253.255.255",
            "192.169.0.1",
            "198.17.255.255",
            "198.20.0.0",
            "223.255.255.255",
            "11.0.0.1",
        ] {
            assert_eq!(non_public(ip(address)), None, "{address}");
        }
    }

    #[test]
    fn every_internal_kind_of_ipv6_address_is_refused_including_ipv4_inside_ipv6() {
        for (address, kind) in [
            ("::1", "loopback"),
            ("::", "unspecified"),
            ("fc00::1", "unique-local, private"),
            ("fd00:ec2::254", "unique-local, private"),
            ("fe80::1", "link-local"),
            ("ff02::1", "multicast"),
            ("::ffff:127.0.0.1", "loopback"),
            ("::ffff:169.254.169.254", "link-local, cloud metadata"),
            ("::ffff:10.0.0.1", "private"),
            ("64:ff9b::a00:1", "private"),
            ("::127.0.0.1", "reserved, not global unicast"),
            ("fec0::1", "reserved, not global unicast"),
            ("100::1", "reserved, not global unicast"),
            ("2001:db8::1", "documentation"),
            ("3fff::1", "documentation"),
            ("2001::1", "IETF protocol assignment, Teredo or ORCHID"),
            ("2002:7f00:1::1", "6to4"),
        ] {
            assert_eq!(non_public(ip(address)), Some(kind), "{address}");
        }
        for address in [
            "2606:4700:4700::1111",
            "2a00:1450:4001:80b::200e",
            "::ffff:8.8.8.8",
            "64:ff9b::808:808",
        ] {
            assert_eq!(non_public(ip(address)), None, "{address}");
        }
    }

    #[test]
    fn only_https_is_accepted_unless_private_addresses_are_allowed() {
        use AddressPolicy::*;
        assert!(parse("https://hooks.example.com/pagos", PublicOnly).is_ok());
        assert_eq!(
            parse("http://hooks.example.com/pagos", PublicOnly),
            Err(Refusal::NotHttps)
        );
        assert!(parse("http://127.0.0.1:9/pagos", AllowPrivate).is_ok());
        for other in ["ftp://example.com/", "file:///etc/passwd", "gopher://x/"] {
            assert_eq!(
                parse(other, AllowPrivate),
                Err(Refusal::NotHttps),
                "{other}"
            );
        }
        assert_eq!(
            parse("https://user:pw@hooks.example.com/", PublicOnly),
            Err(Refusal::Credentials)
        );
        assert!(matches!(
            parse("not a url", PublicOnly),
            Err(Refusal::NotAUrl(_))
        ));
        let long = format!("https://example.com/{}", "a".repeat(MAX_URL_LEN));
        assert_eq!(parse(&long, PublicOnly), Err(Refusal::TooLong));
        // Under the limit as sent, three times over it once percent-encoded (as stored).
        let grows = format!("https://example.com/{}", "\u{e9}".repeat(1000));
        assert!(grows.len() <= MAX_URL_LEN);
        assert_eq!(parse(&grows, PublicOnly), Err(Refusal::TooLong));
    }

    struct Fixed(Vec<SocketAddr>);

    impl Resolve for Fixed {
        fn resolve<'a>(
            &'a self,
            _host: &'a str,
            port: u16,
        ) -> BoxFuture<'a, std::io::Result<Vec<SocketAddr>>> {
            let addrs = self
                .0
                .iter()
                .map(|a| SocketAddr::new(a.ip(), port))
                .collect();
            Box::pin(async move { Ok(addrs) })
        }
    }

    fn addr(text: &str) -> SocketAddr {
        SocketAddr::new(ip(text), 0)
    }

    #[tokio::test]
    async fn address_literals_in_every_spelling_are_judged_as_the_address_they_name() {
        let nobody = Fixed(vec![]);
        for (url, address) in [
            ("https://127.0.0.1/", "127.0.0.1"),
            ("https://2130706433/", "127.0.0.1"),
            ("https://0x7f.1/", "127.0.0.1"),
            ("https://0177.0.0.1/", "127.0.0.1"),
            ("https://[::1]/", "::1"),
            ("https://[::ffff:127.0.0.1]/", "::ffff:127.0.0.1"),
            (
                "https://169.254.169.254/latest/meta-data/",
                "169.254.169.254",
            ),
            ("https://[fe80::1]/", "fe80::1"),
            ("https://10.0.0.1:8443/", "10.0.0.1"),
            ("https://[fd12:3456::1]/", "fd12:3456::1"),
            ("https://0.0.0.0/", "0.0.0.0"),
        ] {
            let url = Url::parse(url).expect("a URL");
            match check(&url, AddressPolicy::PublicOnly, &nobody).await {
                Err(Refusal::Forbidden { address: a, .. }) => assert_eq!(a, ip(address), "{url}"),
                other => panic!("{url}: {other:?}"),
            }
            let allowed = check(&url, AddressPolicy::AllowPrivate, &nobody)
                .await
                .expect("allowed");
            assert_eq!(allowed.name(), None, "an address is not resolved");
            assert_eq!(allowed.addrs()[0].ip(), ip(address));
        }
    }

    #[tokio::test]
    async fn a_name_is_refused_when_any_of_its_addresses_is_internal() {
        let url = Url::parse("https://hooks.example.com/in").expect("a URL");
        let mixed = Fixed(vec![addr("93.184.215.14"), addr("10.0.0.7")]);
        let refusal = check(&url, AddressPolicy::PublicOnly, &mixed)
            .await
            .expect_err("refused");
        assert_eq!(
            refusal.to_string(),
            "hooks.example.com resolves to 10.0.0.7, not a public address (private): webhooks are delivered only to public addresses"
        );
        assert!(refusal.is_about_the_url());

        let public = Fixed(vec![addr("93.184.215.14"), addr("93.184.215.14")]);
        let destination = check(&url, AddressPolicy::PublicOnly, &public)
            .await
            .expect("allowed");
        assert_eq!(destination.name(), Some("hooks.example.com"));
        assert_eq!(
            destination.addrs(),
            &["93.184.215.14:443".parse::<SocketAddr>().expect("addr")]
        );
    }

    #[tokio::test]
    async fn a_name_that_does_not_resolve_is_refused_naming_it() {
        let url = Url::parse("https://nowhere.example.com/").expect("a URL");
        let refusal = check(&url, AddressPolicy::PublicOnly, &Fixed(vec![]))
            .await
            .expect_err("refused");
        assert!(
            matches!(refusal, Refusal::Unresolvable { .. }),
            "{refusal:?}"
        );
        assert!(refusal.to_string().contains("nowhere.example.com"));
        assert!(!refusal.is_about_the_url());
    }
}
