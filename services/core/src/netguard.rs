//! Which addresses a tenant-supplied URL may reach. Loopback, private, link-local, metadata,
//! multicast and reserved addresses are refused unless the operator lists their range in
//! `outbound.allow_private`; callers check a URL's literal host when it is given and every
//! resolved address again at connect time (DNS rebinding).

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

/// An address range written `10.0.0.0/8`, `::1/128` or a bare address (one host).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    addr: IpAddr,
    prefix: u8,
}

impl Cidr {
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                prefix_eq(&net.octets(), &ip.octets(), self.prefix)
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                prefix_eq(&net.octets(), &ip.octets(), self.prefix)
            }
            _ => false,
        }
    }
}

fn prefix_eq(a: &[u8], b: &[u8], prefix: u8) -> bool {
    let full = usize::from(prefix / 8);
    if a[..full] != b[..full] {
        return false;
    }
    let rest = prefix % 8;
    if rest == 0 {
        return true;
    }
    let mask = 0xffu8 << (8 - rest);
    a[full] & mask == b[full] & mask
}

impl FromStr for Cidr {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        let bad = || format!("{s:?} is not an address range like 10.0.0.0/8 or ::1/128");
        let (addr, prefix) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let addr: IpAddr = addr.parse().map_err(|_| bad())?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            Some(p) => p.parse::<u8>().ok().filter(|p| *p <= max).ok_or_else(bad)?,
            None => max,
        };
        Ok(Self { addr, prefix })
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

/// Why an address or URL was refused; the texts never quote the URL (it may hold a token).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error(
        "the address is loopback, private, link-local or otherwise internal; an operator can allow its range with outbound.allow_private"
    )]
    Internal,
    #[error("the host name resolves to no address that may be reached")]
    NoAllowedAddress,
}

/// The operator's outbound policy: internal addresses are refused unless listed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OutboundPolicy {
    pub allow_private: Vec<Cidr>,
}

impl OutboundPolicy {
    pub fn new(allow_private: Vec<Cidr>) -> Self {
        Self { allow_private }
    }

    /// Allows everything internal: for tests of code that does not exercise the guard.
    pub fn allow_all() -> Self {
        Self::new(vec![
            "0.0.0.0/0".parse().expect("static range"),
            "::/0".parse().expect("static range"),
        ])
    }

    pub fn check_ip(&self, ip: IpAddr) -> Result<(), Refused> {
        let ip = canonical(ip);
        if !is_internal(ip) || self.allow_private.iter().any(|c| c.contains(ip)) {
            Ok(())
        } else {
            Err(Refused::Internal)
        }
    }

    /// Checks the host of a URL that names an address directly (any spelling the URL parser
    /// accepts: `2130706433`, `0x7f.1`, `[::ffff:127.0.0.1]`), and `localhost` names. Other
    /// names are checked when they are resolved.
    pub fn check_host(&self, host: Option<url::Host<&str>>) -> Result<(), Refused> {
        match host {
            Some(url::Host::Ipv4(ip)) => self.check_ip(IpAddr::V4(ip)),
            Some(url::Host::Ipv6(ip)) => self.check_ip(IpAddr::V6(ip)),
            Some(url::Host::Domain(d)) => {
                let d = d.trim_end_matches('.').to_ascii_lowercase();
                if d == "localhost" || d.ends_with(".localhost") {
                    self.check_ip(IpAddr::V4(Ipv4Addr::LOCALHOST))
                } else {
                    Ok(())
                }
            }
            None => Err(Refused::NoAllowedAddress),
        }
    }

    pub fn check_url(&self, url: &url::Url) -> Result<(), Refused> {
        self.check_host(url.host())
    }
}

/// An IPv4 address carried in IPv6 (mapped, NAT64, 6to4) is judged as IPv4.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => match embedded_v4(v6) {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        },
        v4 => v4,
    }
}

fn embedded_v4(ip: Ipv6Addr) -> Option<Ipv4Addr> {
    let o = ip.octets();
    let s = ip.segments();
    let tail = Ipv4Addr::new(o[12], o[13], o[14], o[15]);
    if s[..5] == [0, 0, 0, 0, 0] && s[5] == 0xffff {
        return Some(tail); // ::ffff:a.b.c.d
    }
    if s[..6] == [0, 0, 0, 0, 0, 0] && !(s[6] == 0 && s[7] <= 1) {
        return Some(tail); // ::a.b.c.d (deprecated compatible form)
    }
    if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        return Some(tail); // 64:ff9b::/96 NAT64
    }
    if s[0] == 0x2002 {
        return Some(Ipv4Addr::new(o[2], o[3], o[4], o[5])); // 6to4
    }
    None
}

const INTERNAL_V4: &[(u8, u8, u8, u8, u8)] = &[
    (0, 0, 0, 0, 8),       // "this network", 0.0.0.0
    (10, 0, 0, 0, 8),      // private
    (100, 64, 0, 0, 10),   // carrier-grade NAT
    (127, 0, 0, 0, 8),     // loopback
    (169, 254, 0, 0, 16),  // link-local, cloud metadata
    (172, 16, 0, 0, 12),   // private
    (192, 0, 0, 0, 24),    // IETF protocol assignments
    (192, 0, 2, 0, 24),    // documentation
    (192, 88, 99, 0, 24),  // 6to4 relay
    (192, 168, 0, 0, 16),  // private
    (198, 18, 0, 0, 15),   // benchmarking
    (198, 51, 100, 0, 24), // documentation
    (203, 0, 113, 0, 24),  // documentation
    (224, 0, 0, 0, 4),     // multicast
    (240, 0, 0, 0, 4),     // reserved, broadcast
];

fn is_internal(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => INTERNAL_V4.iter().any(|&(a, b, c, d, p)| {
            Cidr {
                addr: IpAddr::V4(Ipv4Addr::new(a, b, c, d)),
                prefix: p,
            }
            .contains(IpAddr::V4(v4))
        }),
        IpAddr::V6(v6) => {
            let s0 = v6.segments()[0];
            v6.is_unspecified()
                || v6.is_loopback()
                || s0 & 0xfe00 == 0xfc00 // unique local
                || s0 & 0xffc0 == 0xfe80 // link-local
                || s0 & 0xffc0 == 0xfec0 // site-local (deprecated)
                || s0 & 0xff00 == 0xff00 // multicast
                || (s0 == 0x2001 && v6.segments()[1] == 0x0db8) // documentation
                || v6.segments()[..6] == [0, 0, 0, 0, 0, 0] // ::/96 left over
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(p: &OutboundPolicy, url: &str) -> bool {
        p.check_url(&url::Url::parse(url).unwrap()).is_err()
    }

    #[test]
    fn internal_addresses_are_refused_in_every_spelling() {
        let p = OutboundPolicy::default();
        for url in [
            "http://127.0.0.1/x",
            "http://127.1/x",
            "http://0.0.0.0/x",
            "http://0/x",
            "http://2130706433/x",
            "http://0x7f000001/x",
            "http://017700000001/x",
            "http://[::1]/x",
            "http://[::]/x",
            "http://[::ffff:127.0.0.1]/x",
            "http://[::ffff:169.254.169.254]/x",
            "http://[64:ff9b::a9fe:a9fe]/x",
            "http://[2002:a9fe:a9fe::1]/x",
            "http://169.254.169.254/latest/meta-data/",
            "http://10.1.2.3/",
            "http://172.31.255.255/",
            "http://192.168.1.1/",
            "http://100.64.0.1/",
            "http://[fd00::1]/",
            "http://[fe80::1]/",
            "http://localhost:8080/",
            "http://LOCALHOST./",
            "http://api.localhost/",
            "http://224.0.0.1/",
            "http://255.255.255.255/",
        ] {
            assert!(refused(&p, url), "{url} was allowed");
        }
        for url in [
            "https://chat.example.com/hook",
            "http://93.184.216.34/",
            "http://[2606:2800:220:1:248:1893:25c8:1946]/",
            "http://172.32.0.1/",
            "http://11.0.0.1/",
        ] {
            assert!(!refused(&p, url), "{url} was refused");
        }
    }

    #[test]
    fn listed_ranges_are_allowed() {
        let p = OutboundPolicy::new(vec![
            "127.0.0.0/8".parse().unwrap(),
            "::1/128".parse().unwrap(),
            "10.20.0.0/16".parse().unwrap(),
        ]);
        assert!(!refused(&p, "http://127.0.0.1:9/x"));
        assert!(!refused(&p, "http://[::1]:9/x"));
        assert!(!refused(&p, "http://[::ffff:127.0.0.1]/x"));
        assert!(!refused(&p, "http://localhost/x"));
        assert!(!refused(&p, "http://10.20.3.4/x"));
        assert!(refused(&p, "http://10.21.3.4/x"));
        assert!(refused(&p, "http://169.254.169.254/x"));
    }

    #[test]
    fn ranges_parse() {
        assert_eq!(
            "10.0.0.0/8".parse::<Cidr>().unwrap().to_string(),
            "10.0.0.0/8"
        );
        assert_eq!("::1".parse::<Cidr>().unwrap().to_string(), "::1/128");
        assert_eq!("1.2.3.4".parse::<Cidr>().unwrap().to_string(), "1.2.3.4/32");
        for bad in ["", "10.0.0.0/33", "::/129", "nope/8", "10.0.0.0/x"] {
            assert!(bad.parse::<Cidr>().is_err(), "{bad}");
        }
        let c: Cidr = "172.16.0.0/12".parse().unwrap();
        assert!(c.contains("172.31.1.1".parse().unwrap()));
        assert!(!c.contains("172.32.1.1".parse().unwrap()));
        assert!(!c.contains("::1".parse().unwrap()));
    }
}
