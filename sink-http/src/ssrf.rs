//! The SSRF guard: which addresses an endpoint may reach, checked on the address the
//! connection really goes to.
//!
//! A webhook gateway sends requests to URLs that its customers typed in. Without a guard,
//! `http://169.254.169.254/latest/meta-data/` or `http://localhost:6379/` turns the relay
//! into a proxy into your own network. The guard is on by default and works in three
//! places:
//!
//! 1. **At build time**, an endpoint whose URL names an IP address (in any spelling the
//!    URL parser accepts: `2130706433`, `0177.0.0.1`, `0x7f000001`, `127.1`,
//!    `[::ffff:127.0.0.1]`, …; the `url` crate normalises all of them to the canonical
//!    address) is checked, and a blocked one is a configuration error.
//! 2. **Before resolving**, the names `localhost` and `*.localhost` are refused.
//! 3. **When connecting**, a name is resolved once by the sink's own resolver, *every*
//!    address in the answer is checked, and the connection can only go to the addresses
//!    that were checked. A name with any blocked address is refused as a whole, so a DNS
//!    answer that mixes a public and a private address (a common rebinding trick) is
//!    refused too. Each new connection resolves and checks again.
//!
//! A refusal at publish time is a permanent failure of class
//! [`Config`](outbox_engine::FailureClass::Config) whose reason says what was refused and
//! why. The sink never uses an HTTP proxy (a proxy would resolve names itself, out of
//! reach of the guard) and never follows redirects.
//!
//! Blocked: unspecified and "this network" (`0.0.0.0/8`, `::`), loopback (`127.0.0.0/8`,
//! `::1`), private (`10/8`, `172.16/12`, `192.168/16`), shared address space / CGNAT
//! (`100.64/10`), link-local (`169.254/16`, `fe80::/10`, cloud metadata services live
//! here), unique-local (`fc00::/7`), multicast, broadcast and the reserved `240/4`,
//! IETF protocol assignments, documentation and benchmarking ranges, deprecated
//! site-local and IPv4-compatible IPv6, and every IPv6 address outside global unicast
//! `2000::/3`. IPv6 forms that carry an IPv4 address (IPv4-mapped `::ffff:a.b.c.d`,
//! NAT64 `64:ff9b::a.b.c.d`, 6to4 `2002:aabb:ccdd::`) are judged by the IPv4 address
//! they carry.
//!
//! An [`SsrfPolicy`] can allow addresses (CIDR blocks) and host names for tests and
//! internal deployments, for all endpoints or for one endpoint only.
//!
//! ```
//! use std::net::IpAddr;
//! use outbox_sink_http::ssrf::{SsrfPolicy, blocked_reason};
//!
//! assert_eq!(blocked_reason("169.254.169.254".parse::<IpAddr>()?), Some("cloud metadata service"));
//! assert_eq!(blocked_reason("::ffff:127.0.0.1".parse::<IpAddr>()?), Some("loopback"));
//! assert_eq!(blocked_reason("93.184.215.14".parse::<IpAddr>()?), None);
//!
//! let policy = SsrfPolicy::default().allow("127.0.0.1/32")?;
//! assert!(policy.check_addr("test-server", "127.0.0.1".parse()?).is_ok());
//! assert!(policy.check_addr("test-server", "127.0.0.2".parse()?).is_err());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::fmt;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::str::FromStr;
use std::sync::Arc;

use outbox_engine::BoxFuture;
use serde::Deserialize;

/// Why an address or name was refused by the guard.
///
/// ```
/// use outbox_sink_http::ssrf::SsrfPolicy;
///
/// let err = SsrfPolicy::default().check_addr("evil.example", "10.1.2.3".parse()?).unwrap_err();
/// assert_eq!(err.reason(), "private network");
/// assert!(err.to_string().contains("evil.example"));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SsrfError {
    host: String,
    addr: Option<IpAddr>,
    reason: &'static str,
}

impl SsrfError {
    /// The host name (or address literal) that was refused.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The address that was refused, when the refusal was about an address.
    pub fn addr(&self) -> Option<IpAddr> {
        self.addr
    }

    /// A short name for the refused range, e.g. `loopback`.
    pub fn reason(&self) -> &'static str {
        self.reason
    }
}

impl fmt::Display for SsrfError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let fix = |f: &mut fmt::Formatter<'_>, addr: &str| {
            write!(
                f,
                "; if this endpoint is meant to be internal, allow it for this route: `allow = [\"{addr}\"]` in the route's settings (`HttpSinkConfig::allow` in code)"
            )
        };
        match self.addr {
            Some(addr) if self.host == addr.to_string() => {
                write!(f, "SSRF guard refused {addr} ({})", self.reason)?;
                fix(f, &addr.to_string())
            }
            Some(addr) => {
                write!(
                    f,
                    "SSRF guard refused `{}`: it resolves to {addr} ({})",
                    self.host, self.reason
                )?;
                fix(f, &addr.to_string())
            }
            None => {
                write!(f, "SSRF guard refused `{}` ({})", self.host, self.reason)?;
                fix(f, &self.host)
            }
        }
    }
}

impl std::error::Error for SsrfError {}

/// A CIDR block (`10.0.0.0/8`, `fd00::/8`): the `ipnet` crate's, re-exported.
pub use ipnet::IpNet;

/// Parses a CIDR block for an allow-list, more strictly than `IpNet`'s own parser: a
/// bare address is a block of one, and host bits must be zero, so a typo like
/// `10.0.0.1/8` is an error rather than a silently wider allow-list.
///
/// ```
/// use outbox_sink_http::ssrf::parse_net;
///
/// let net = parse_net("10.0.0.0/8")?;
/// assert!(net.contains(&"10.200.0.1".parse::<std::net::IpAddr>()?));
/// assert!(parse_net("10.0.0.1/8").is_err());
/// assert_eq!(parse_net("::1")?.to_string(), "::1/128");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Errors
///
/// A message naming the text when it is not an address or block, its prefix is longer
/// than the address, or host bits are set.
pub fn parse_net(s: &str) -> Result<IpNet, String> {
    let (addr, prefix) = match s.split_once('/') {
        Some((addr, prefix)) => (addr, Some(prefix)),
        None => (s, None),
    };
    let addr: IpAddr = addr
        .parse()
        .map_err(|_| format!("`{s}` is not an IP address or CIDR block"))?;
    let max = if addr.is_ipv4() { 32 } else { 128 };
    let prefix = match prefix {
        Some(p) => p
            .parse::<u8>()
            .map_err(|_| format!("`{s}` has an invalid prefix length"))?,
        None => max,
    };
    let net = IpNet::new(addr, prefix)
        .map_err(|_| format!("prefix /{prefix} is longer than {max} bits"))?;
    if net.network() != addr {
        return Err(format!(
            "host bits are set in {addr}/{prefix}; the block starts at {}",
            net.trunc()
        ));
    }
    Ok(net)
}

/// A block of the tables below.
const fn v4(a: u8, b: u8, c: u8, d: u8, prefix: u8) -> IpNet {
    IpNet::new_assert(IpAddr::V4(Ipv4Addr::new(a, b, c, d)), prefix)
}

/// A block of the tables below.
const fn v6(segments: [u16; 8], prefix: u8) -> IpNet {
    let [a, b, c, d, e, f, g, h] = segments;
    IpNet::new_assert(IpAddr::V6(Ipv6Addr::new(a, b, c, d, e, f, g, h)), prefix)
}

/// One allow-list entry: a CIDR block, an exact host name, or `*.suffix` for every
/// subdomain of `suffix`.
///
/// An allowed host name skips the address checks for that name (it is still resolved
/// by the sink's resolver). An allowed block lets addresses in it through wherever they
/// come from, a URL literal or a DNS answer.
///
/// ```
/// use outbox_sink_http::ssrf::AllowRule;
///
/// assert!(matches!("127.0.0.1/32".parse::<AllowRule>()?, AllowRule::Net(_)));
/// assert!(matches!("hooks.internal".parse::<AllowRule>()?, AllowRule::Host(_)));
/// assert!(matches!("*.svc.cluster.local".parse::<AllowRule>()?, AllowRule::Host(_)));
/// assert!("bad host!".parse::<AllowRule>().is_err());
/// # Ok::<(), String>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum AllowRule {
    /// Addresses in this block.
    Net(IpNet),
    /// This host name (lowercase, no trailing dot); `*.` prefix for subdomains.
    Host(String),
}

impl AllowRule {
    fn allows_host(&self, host: &str) -> bool {
        match self {
            Self::Host(pattern) => match pattern.strip_prefix("*.") {
                Some(suffix) => host
                    .strip_suffix(suffix)
                    .is_some_and(|head| head.len() > 1 && head.ends_with('.')),
                None => pattern == host,
            },
            Self::Net(_) => false,
        }
    }

    fn allows_addr(&self, ip: IpAddr) -> bool {
        match self {
            Self::Net(net) => {
                net.contains(&ip)
                    || embedded_ipv4(ip).is_some_and(|v4| net.contains(&IpAddr::V4(v4)))
            }
            Self::Host(_) => false,
        }
    }
}

impl FromStr for AllowRule {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        if s.contains('/') || s.parse::<IpAddr>().is_ok() {
            return parse_net(s).map(Self::Net);
        }
        let host = normalize_host(s);
        let body = host.strip_prefix("*.").unwrap_or(&host);
        let valid_label = |l: &str| {
            !l.is_empty()
                && l.len() <= 63
                && l.chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        };
        if body.is_empty() || body.len() > 253 || !body.split('.').all(valid_label) {
            return Err(format!(
                "`{s}` is not a CIDR block, a host name or `*.` followed by a host name"
            ));
        }
        Ok(Self::Host(host))
    }
}

impl fmt::Display for AllowRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Net(net) => net.fmt(f),
            Self::Host(host) => f.write_str(host),
        }
    }
}

impl<'de> Deserialize<'de> for AllowRule {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let s = String::deserialize(deserializer)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// Which destinations the sink may connect to. On by default with an empty allow-list.
///
/// In a config file:
///
/// ```toml
/// [ssrf]
/// enabled = true                            # the default
/// allow = ["10.20.0.0/16", "*.svc.cluster.local"]
/// ```
///
/// ```
/// use outbox_sink_http::ssrf::SsrfPolicy;
///
/// let policy = SsrfPolicy::default().allow("10.20.0.0/16")?.allow("*.svc.cluster.local")?;
/// assert!(policy.check_addr("billing.svc.cluster.local", "10.99.0.1".parse()?).is_ok());
/// assert!(policy.check_addr("other.example", "10.20.3.4".parse()?).is_ok());
/// assert!(policy.check_addr("other.example", "10.99.0.1".parse()?).is_err());
/// assert!(SsrfPolicy::disabled().check_addr("x", "127.0.0.1".parse()?).is_ok());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct SsrfPolicy {
    /// `false` turns the guard off entirely (only for fully trusted endpoint lists).
    pub enabled: bool,
    /// Blocks and host names let through even though they are blocked by default.
    pub allow: Vec<AllowRule>,
}

impl Default for SsrfPolicy {
    fn default() -> Self {
        Self {
            enabled: true,
            allow: Vec::new(),
        }
    }
}

impl SsrfPolicy {
    /// The guard switched off: every address is allowed. Prefer an allow-list.
    pub fn disabled() -> Self {
        Self {
            enabled: false,
            allow: Vec::new(),
        }
    }

    /// Adds an allow-list entry (see [`AllowRule`]).
    ///
    /// # Errors
    ///
    /// A message when `rule` is neither a CIDR block nor a host name pattern.
    pub fn allow(mut self, rule: &str) -> Result<Self, String> {
        self.allow.push(rule.parse()?);
        Ok(self)
    }

    /// This policy plus `extra` allow-list entries (an endpoint's own).
    pub(crate) fn with_extra(&self, extra: &[AllowRule]) -> Self {
        let mut merged = self.clone();
        merged.allow.extend_from_slice(extra);
        merged
    }

    fn host_allowed(&self, host: &str) -> bool {
        !self.enabled || self.allow.iter().any(|r| r.allows_host(host))
    }

    /// Checks a host name before it is resolved: refuses `localhost` and `*.localhost`
    /// unless allowed.
    ///
    /// # Errors
    ///
    /// [`SsrfError`] when the name is refused.
    pub fn check_name(&self, host: &str) -> Result<(), SsrfError> {
        let host = normalize_host(host);
        if self.host_allowed(&host) {
            return Ok(());
        }
        if host == "localhost" || host.ends_with(".localhost") {
            return Err(SsrfError {
                host,
                addr: None,
                reason: "loopback name",
            });
        }
        Ok(())
    }

    /// Checks one address that `host` resolved to (or that `host` spells).
    ///
    /// # Errors
    ///
    /// [`SsrfError`] when the address is in a blocked range and neither the address nor
    /// the host is allowed.
    pub fn check_addr(&self, host: &str, addr: IpAddr) -> Result<(), SsrfError> {
        let host = normalize_host(host);
        if self.host_allowed(&host) || self.allow.iter().any(|r| r.allows_addr(addr)) {
            return Ok(());
        }
        match blocked_reason(addr) {
            None => Ok(()),
            Some(reason) => Err(SsrfError {
                host,
                addr: Some(addr),
                reason,
            }),
        }
    }

    /// Checks a URL's host as written: names with [`check_name`](Self::check_name),
    /// address literals (already normalised by the URL parser) with
    /// [`check_addr`](Self::check_addr). Names still have to pass the resolver's check
    /// when a connection is made.
    ///
    /// ```
    /// use outbox_sink_http::ssrf::SsrfPolicy;
    ///
    /// let policy = SsrfPolicy::default();
    /// for url in ["http://2130706433/", "http://0x7f000001/", "http://127.1/", "http://[::ffff:127.0.0.1]/"] {
    ///     let url = url::Url::parse(url)?;
    ///     assert!(policy.check_url(&url).is_err(), "{url}");
    /// }
    /// assert!(policy.check_url(&url::Url::parse("https://hooks.example.com/x")?).is_ok());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`SsrfError`] when the host is refused.
    pub fn check_url(&self, url: &url::Url) -> Result<(), SsrfError> {
        match url.host() {
            Some(url::Host::Ipv4(ip)) => self.check_addr(&ip.to_string(), IpAddr::V4(ip)),
            Some(url::Host::Ipv6(ip)) => self.check_addr(&ip.to_string(), IpAddr::V6(ip)),
            Some(url::Host::Domain(name)) => self.check_name(name),
            None => Err(SsrfError {
                host: String::new(),
                addr: None,
                reason: "URL has no host",
            }),
        }
    }
}

fn normalize_host(host: &str) -> String {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host.strip_suffix('.').unwrap_or(host).to_ascii_lowercase()
}

const V4_RANGES: &[(IpNet, &str)] = &[
    (v4(169, 254, 169, 254, 32), "cloud metadata service"),
    (v4(169, 254, 170, 2, 32), "cloud metadata service"),
    (v4(100, 100, 100, 200, 32), "cloud metadata service"),
    (v4(255, 255, 255, 255, 32), "broadcast"),
    (v4(0, 0, 0, 0, 8), "unspecified / this network"),
    (v4(10, 0, 0, 0, 8), "private network"),
    (v4(100, 64, 0, 0, 10), "shared address space (CGNAT)"),
    (v4(127, 0, 0, 0, 8), "loopback"),
    (v4(169, 254, 0, 0, 16), "link-local"),
    (v4(172, 16, 0, 0, 12), "private network"),
    (v4(192, 0, 0, 0, 24), "IETF protocol assignments"),
    (v4(192, 0, 2, 0, 24), "documentation (TEST-NET-1)"),
    (v4(192, 88, 99, 0, 24), "6to4 relay anycast (deprecated)"),
    (v4(192, 168, 0, 0, 16), "private network"),
    (v4(198, 18, 0, 0, 15), "benchmarking"),
    (v4(198, 51, 100, 0, 24), "documentation (TEST-NET-2)"),
    (v4(203, 0, 113, 0, 24), "documentation (TEST-NET-3)"),
    (v4(224, 0, 0, 0, 4), "multicast"),
    (v4(240, 0, 0, 0, 4), "reserved"),
];

const V6_RANGES: &[(IpNet, &str)] = &[
    (v6([0, 0, 0, 0, 0, 0, 0, 0], 128), "unspecified"),
    (v6([0, 0, 0, 0, 0, 0, 0, 1], 128), "loopback"),
    (
        v6([0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254], 128),
        "cloud metadata service",
    ),
    (v6([0, 0, 0, 0, 0xffff, 0, 0, 0], 96), "IPv4-translated"),
    (
        v6([0, 0, 0, 0, 0, 0, 0, 0], 96),
        "IPv4-compatible (deprecated)",
    ),
    (v6([0x64, 0xff9b, 1, 0, 0, 0, 0, 0], 48), "local-use NAT64"),
    (v6([0x100, 0, 0, 0, 0, 0, 0, 0], 64), "discard-only"),
    (v6([0x2001, 0xdb8, 0, 0, 0, 0, 0, 0], 32), "documentation"),
    (
        v6([0x2001, 0, 0, 0, 0, 0, 0, 0], 23),
        "IETF protocol assignments",
    ),
    (v6([0x3fff, 0, 0, 0, 0, 0, 0, 0], 20), "documentation"),
    (
        v6([0x5f00, 0, 0, 0, 0, 0, 0, 0], 16),
        "segment routing (SRv6)",
    ),
    (v6([0xfc00, 0, 0, 0, 0, 0, 0, 0], 7), "unique-local"),
    (v6([0xfe80, 0, 0, 0, 0, 0, 0, 0], 10), "link-local"),
    (
        v6([0xfec0, 0, 0, 0, 0, 0, 0, 0], 10),
        "site-local (deprecated)",
    ),
    (v6([0xff00, 0, 0, 0, 0, 0, 0, 0], 8), "multicast"),
];

const GLOBAL_UNICAST: IpNet = v6([0x2000, 0, 0, 0, 0, 0, 0, 0], 3);

/// The IPv4 address an IPv6 address stands for, if it is IPv4-mapped
/// (`::ffff:a.b.c.d`), NAT64 (`64:ff9b::a.b.c.d`) or 6to4 (`2002:aabb:ccdd::/48`).
fn embedded_ipv4(ip: IpAddr) -> Option<Ipv4Addr> {
    let IpAddr::V6(v6) = ip else { return None };
    let bits = v6.to_bits();
    let s = v6.segments();
    let low32 = Ipv4Addr::from_bits(bits as u32);
    let mapped = s[..5] == [0, 0, 0, 0, 0] && s[5] == 0xffff;
    let nat64 = s[..6] == [0x64, 0xff9b, 0, 0, 0, 0];
    if mapped || nat64 {
        Some(low32)
    } else if s[0] == 0x2002 {
        Some(Ipv4Addr::from_bits((bits >> 80) as u32))
    } else {
        None
    }
}

/// Why the guard blocks `ip` by default, or `None` for a public address.
///
/// IPv6 addresses that carry an IPv4 address (mapped, NAT64, 6to4) are judged by the
/// IPv4 address; any other IPv6 address outside `2000::/3` is blocked.
///
/// ```
/// use outbox_sink_http::ssrf::blocked_reason;
///
/// assert_eq!(blocked_reason("100.64.1.1".parse()?), Some("shared address space (CGNAT)"));
/// assert_eq!(blocked_reason("64:ff9b::a9fe:a9fe".parse()?), Some("cloud metadata service"));
/// assert_eq!(blocked_reason("2606:4700::1111".parse()?), None);
/// # Ok::<(), std::net::AddrParseError>(())
/// ```
pub fn blocked_reason(ip: IpAddr) -> Option<&'static str> {
    if let Some(v4) = embedded_ipv4(ip) {
        return blocked_reason(IpAddr::V4(v4));
    }
    let ranges = if ip.is_ipv4() { V4_RANGES } else { V6_RANGES };
    if let Some((_, reason)) = ranges.iter().find(|(net, _)| net.contains(&ip)) {
        return Some(reason);
    }
    if ip.is_ipv6() && !GLOBAL_UNICAST.contains(&ip) {
        return Some("not global unicast");
    }
    None
}

/// Resolves host names to addresses: the system resolver by default, or your own (a
/// service-discovery client, a test double).
///
/// Whatever a `Lookup` returns still goes through the guard.
///
/// ```
/// use std::net::IpAddr;
/// use outbox_engine::BoxFuture;
/// use outbox_sink_http::ssrf::Lookup;
///
/// /// Answers every name with one fixed address.
/// struct Fixed(IpAddr);
///
/// impl Lookup for Fixed {
///     fn lookup<'a>(&'a self, _host: &'a str) -> BoxFuture<'a, std::io::Result<Vec<IpAddr>>> {
///         Box::pin(async move { Ok(vec![self.0]) })
///     }
/// }
/// ```
pub trait Lookup: Send + Sync + 'static {
    /// All addresses of `host`.
    fn lookup<'a>(&'a self, host: &'a str) -> BoxFuture<'a, io::Result<Vec<IpAddr>>>;
}

/// The operating system's resolver (`getaddrinfo`, on tokio's blocking pool).
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// use outbox_sink_http::ssrf::{Lookup, SystemLookup};
///
/// let addrs = SystemLookup.lookup("localhost").await?;
/// assert!(addrs.iter().all(|a| a.is_loopback()));
/// # Ok::<(), std::io::Error>(())
/// # }).unwrap();
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemLookup;

impl Lookup for SystemLookup {
    fn lookup<'a>(&'a self, host: &'a str) -> BoxFuture<'a, io::Result<Vec<IpAddr>>> {
        Box::pin(async move {
            let addrs = tokio::net::lookup_host((host, 0)).await?;
            Ok(addrs.map(|a| a.ip()).collect())
        })
    }
}

/// The resolver handed to reqwest: resolves once, checks every address, and returns
/// only checked addresses, so the connection goes where the check looked.
pub(crate) struct GuardedResolver {
    policy: Arc<SsrfPolicy>,
    lookup: Arc<dyn Lookup>,
}

impl GuardedResolver {
    pub(crate) fn new(policy: SsrfPolicy, lookup: Arc<dyn Lookup>) -> Self {
        Self {
            policy: Arc::new(policy),
            lookup,
        }
    }
}

impl reqwest::dns::Resolve for GuardedResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let policy = Arc::clone(&self.policy);
        let lookup = Arc::clone(&self.lookup);
        let host = name.as_str().to_owned();
        Box::pin(async move {
            policy.check_name(&host)?;
            let addrs = lookup.lookup(&host).await?;
            if addrs.is_empty() {
                return Err(io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("`{host}` has no addresses"),
                )
                .into());
            }
            for addr in &addrs {
                policy.check_addr(&host, *addr)?;
            }
            let checked: reqwest::dns::Addrs =
                Box::new(addrs.into_iter().map(|ip| SocketAddr::new(ip, 0)));
            Ok(checked)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reason(s: &str) -> Option<&'static str> {
        blocked_reason(s.parse().unwrap())
    }

    #[test]
    fn ranges_are_well_formed() {
        for (net, _) in V4_RANGES.iter().chain(V6_RANGES) {
            assert_eq!(net.trunc(), *net, "{net}: host bits set");
        }
    }

    #[test]
    fn blocks_special_ipv4() {
        for (ip, want) in [
            ("0.0.0.0", "unspecified / this network"),
            ("0.1.2.3", "unspecified / this network"),
            ("10.255.255.255", "private network"),
            ("100.64.0.1", "shared address space (CGNAT)"),
            ("100.127.255.255", "shared address space (CGNAT)"),
            ("127.0.0.1", "loopback"),
            ("127.255.0.9", "loopback"),
            ("169.254.169.254", "cloud metadata service"),
            ("169.254.1.1", "link-local"),
            ("172.16.0.1", "private network"),
            ("172.31.255.255", "private network"),
            ("192.0.0.8", "IETF protocol assignments"),
            ("192.0.2.1", "documentation (TEST-NET-1)"),
            ("192.168.1.1", "private network"),
            ("198.18.0.1", "benchmarking"),
            ("198.19.255.1", "benchmarking"),
            ("198.51.100.7", "documentation (TEST-NET-2)"),
            ("203.0.113.9", "documentation (TEST-NET-3)"),
            ("224.0.0.1", "multicast"),
            ("239.255.255.250", "multicast"),
            ("240.0.0.1", "reserved"),
            ("255.255.255.255", "broadcast"),
        ] {
            assert_eq!(reason(ip), Some(want), "{ip}");
        }
        for ip in [
            "1.1.1.1",
            "8.8.8.8",
            "100.63.255.255",
            "100.128.0.0",
            "172.32.0.1",
            "198.20.0.1",
            "223.255.255.255",
        ] {
            assert_eq!(reason(ip), None, "{ip}");
        }
    }

    #[test]
    fn blocks_special_ipv6_and_judges_embedded_ipv4() {
        for (ip, want) in [
            ("::", "unspecified"),
            ("::1", "loopback"),
            ("::ffff:127.0.0.1", "loopback"),
            ("::ffff:10.0.0.1", "private network"),
            ("::ffff:0:127.0.0.1", "IPv4-translated"),
            ("::127.0.0.1", "IPv4-compatible (deprecated)"),
            ("64:ff9b::127.0.0.1", "loopback"),
            ("64:ff9b:1::1", "local-use NAT64"),
            ("2002:7f00:1::", "loopback"),
            ("2002:a9fe:a9fe::1", "cloud metadata service"),
            ("100::1", "discard-only"),
            ("2001::1", "IETF protocol assignments"),
            ("2001:db8::1", "documentation"),
            ("3fff::1", "documentation"),
            ("fc00::1", "unique-local"),
            ("fd00:ec2::254", "cloud metadata service"),
            ("fe80::1", "link-local"),
            ("fec0::1", "site-local (deprecated)"),
            ("ff02::1", "multicast"),
            ("4000::1", "not global unicast"),
            ("1::1", "not global unicast"),
        ] {
            assert_eq!(reason(ip), Some(want), "{ip}");
        }
        for ip in [
            "2606:4700:4700::1111",
            "2a00:1450:4001:80b::200e",
            "::ffff:8.8.8.8",
            "64:ff9b::808:808",
            "2002:808:808::1",
        ] {
            assert_eq!(reason(ip), None, "{ip}");
        }
    }

    #[test]
    fn allow_rules() {
        let policy = SsrfPolicy::default()
            .allow("127.0.0.1")
            .unwrap()
            .allow("*.internal.example")
            .unwrap()
            .allow("Exact.Example.")
            .unwrap();
        assert!(policy.check_addr("x", "127.0.0.1".parse().unwrap()).is_ok());
        assert!(
            policy
                .check_addr("x", "::ffff:127.0.0.1".parse().unwrap())
                .is_ok()
        );
        assert!(
            policy
                .check_addr("x", "127.0.0.2".parse().unwrap())
                .is_err()
        );
        assert!(
            policy
                .check_addr("a.internal.example", "10.0.0.1".parse().unwrap())
                .is_ok()
        );
        assert!(
            policy
                .check_addr("A.B.Internal.Example.", "10.0.0.1".parse().unwrap())
                .is_ok()
        );
        assert!(
            policy
                .check_addr("internal.example", "10.0.0.1".parse().unwrap())
                .is_err()
        );
        assert!(
            policy
                .check_addr("xinternal.example", "10.0.0.1".parse().unwrap())
                .is_err()
        );
        assert!(
            policy
                .check_addr("exact.example", "10.0.0.1".parse().unwrap())
                .is_ok()
        );
        assert!(policy.check_name("localhost").is_err());
        assert!(policy.check_name("LocalHost.").is_err());
        assert!(policy.check_name("a.localhost").is_err());
        assert!(policy.check_name("hooks.example.com").is_ok());
        let localhost = SsrfPolicy::default().allow("localhost").unwrap();
        assert!(localhost.check_name("localhost").is_ok());
        assert!(
            localhost
                .check_addr("localhost", "127.0.0.1".parse().unwrap())
                .is_ok()
        );
    }

    #[test]
    fn cidr_parsing() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert!(
            parse_net("10.0.0.0/33")
                .unwrap_err()
                .contains("longer than 32")
        );
        assert!(parse_net("10.0.0.1/8").unwrap_err().contains("10.0.0.0/8"));
        assert!(parse_net("::/0").unwrap().contains(&ip("2001:db8::1")));
        assert!(parse_net("0.0.0.0/0").unwrap().contains(&ip("1.2.3.4")));
        assert!(
            !parse_net("10.0.0.0/8")
                .unwrap()
                .contains(&ip("::ffff:10.0.0.1"))
        );
        assert_eq!(parse_net("127.0.0.1").unwrap().to_string(), "127.0.0.1/32");
        assert!(
            parse_net("010.0.0.0/8").is_err(),
            "leading zeros are ambiguous"
        );
        assert!(parse_net("nonsense").is_err());
        assert!(parse_net("10.0.0.0/x").is_err());
    }
}
