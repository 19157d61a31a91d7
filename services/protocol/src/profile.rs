//! The structured Profile catalog (protocol §11): which target types a Profile allows and
//! which packets it owns in which direction. Channels load the intersection negotiated in
//! hello and consult only this table.

/// Packet direction relative to the Connector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// xAgent -> Connector.
    In,
    /// Connector -> xAgent.
    Out,
    Both,
}

#[derive(Debug, Clone, Copy)]
pub struct ProfileSpec {
    pub id: &'static str,
    pub target_types: &'static [&'static str],
    pub packets: &'static [(&'static str, Direction)],
}

pub const IM_V1: &str = "xagent.im.v1";
pub const IM_V2: &str = "xagent.im.v2";
pub const DEVICE_V1: &str = "xagent.device.v1";

pub const CATALOG: &[ProfileSpec] = &[
    ProfileSpec {
        id: IM_V1,
        target_types: &["im"],
        packets: &[("message.push", Direction::Out)],
    },
    ProfileSpec {
        id: IM_V2,
        target_types: &["im"],
        packets: &[
            ("chat.message", Direction::Both),
            ("chat.message.delta", Direction::In),
            ("chat.message.ack", Direction::Both),
            ("chat.activity", Direction::In),
        ],
    },
    ProfileSpec {
        id: DEVICE_V1,
        target_types: &["device"],
        packets: &[],
    },
];

pub fn spec(id: &str) -> Option<&'static ProfileSpec> {
    CATALOG.iter().find(|p| p.id == id)
}

/// Profiles enabled for a channel: hello's `supported_profiles` ∩ Card profiles, restricted
/// to Profiles that allow the channel's target type. Order follows the Card.
pub fn negotiate(card_profiles: &[String], supported: &[String], target_type: &str) -> Vec<String> {
    card_profiles
        .iter()
        .filter(|p| supported.iter().any(|s| s == *p))
        .filter(|p| spec(p).is_some_and(|s| s.target_types.contains(&target_type)))
        .cloned()
        .collect()
}

/// True when the packet type belongs to one of the enabled Profiles in that direction.
pub fn allows(enabled: &[String], packet: &str, dir: Direction) -> bool {
    enabled.iter().filter_map(|p| spec(p)).any(|s| {
        s.packets
            .iter()
            .any(|(t, d)| *t == packet && (*d == dir || *d == Direction::Both))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn negotiation_intersects_and_filters_target() {
        let card = vec![IM_V2.to_owned(), IM_V1.to_owned()];
        let hello = vec![IM_V1.to_owned(), IM_V2.to_owned(), DEVICE_V1.to_owned()];
        assert_eq!(negotiate(&card, &hello, "im"), vec![IM_V2, IM_V1]);
        assert!(negotiate(&card, &hello, "device").is_empty());
        assert_eq!(negotiate(&card, &[IM_V1.to_owned()], "im"), vec![IM_V1]);
    }

    #[test]
    fn catalog_lookup() {
        let v2 = vec![IM_V2.to_owned()];
        assert!(allows(&v2, "chat.message.delta", Direction::In));
        assert!(!allows(&v2, "chat.message.delta", Direction::Out));
        assert!(!allows(&v2, "message.push", Direction::Out));
    }
}
