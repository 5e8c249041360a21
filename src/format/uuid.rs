//! Uuids (filesystem ids, subvolume uuids) as people write them.

/// `u` as 8-4-4-4-12 hex digits.
pub fn shown(u: &[u8; 16]) -> String {
    let h: String = u.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// A uuid from the way people write it (hex digits, dashes anywhere).
pub fn parse(s: &str) -> Option<[u8; 16]> {
    let hex: Vec<u8> = s.bytes().filter(|&b| b != b'-').collect();
    if hex.len() != 32 {
        return None;
    }
    let mut u = [0u8; 16];
    for (i, pair) in hex.chunks(2).enumerate() {
        u[i] = u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok()?;
    }
    Some(u)
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_shown_uuid_parses_back() {
        let u: [u8; 16] = core::array::from_fn(|i| (i * 17) as u8);
        let s = super::shown(&u);
        assert_eq!(s, "00112233-4455-6677-8899-aabbccddeeff");
        assert_eq!(super::parse(&s), Some(u));
        assert_eq!(super::parse("0011"), None);
        assert_eq!(super::parse("zz112233-4455-6677-8899-aabbccddeeff"), None);
    }
}
