//! The balance items of the root tree (see `crate::balance`): what a
//! recorded balance empties, and whether it is paused.

use super::superblock::Profile;
use serde::{Deserialize, Serialize};

/// Which groups of one kind a balance empties.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Filter {
    /// None (the kind was not asked for).
    #[default]
    Skip,
    /// Every group of the kind (`-d`, `-m`).
    All,
    /// Groups used below this percentage (`-dusage=N`).
    UsageBelow(u8),
}

impl Filter {
    /// This filter, or `other` when this one skips.
    pub fn or(self, other: Filter) -> Filter {
        match self {
            Filter::Skip => other,
            f => f,
        }
    }

    fn encode(self) -> (u8, u8) {
        match self {
            Filter::Skip => (0, NO_USAGE),
            Filter::All => (1, NO_USAGE),
            Filter::UsageBelow(u) => (1, u),
        }
    }

    fn decode(on: u8, usage: u8) -> std::result::Result<Filter, String> {
        match (on, usage) {
            (0, _) => Ok(Filter::Skip),
            (1, NO_USAGE) => Ok(Filter::All),
            (1, u @ 0..=100) => Ok(Filter::UsageBelow(u)),
            _ => Err(format!("balance filter {on}/{usage} is not valid")),
        }
    }
}

/// Which groups a balance empties: data groups, metadata and system
/// groups (mixed groups by whichever filter is given, data's first).
/// With a conversion (`-dconvert=`, `-mconvert=`), new groups of the kind
/// get that profile from the start, and the balance empties the groups of
/// the kind that have another (those the filter chooses, or all of them
/// when no filter is given): what is moved lands in groups of the new
/// profile.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BalanceArgs {
    pub data: Filter,
    pub metadata: Filter,
    #[serde(default)]
    pub data_convert: Option<Profile>,
    #[serde(default)]
    pub metadata_convert: Option<Profile>,
    /// Only groups with a copy on this device (`-ddevid=N`; what `canopy
    /// device remove` moves off the device it empties).
    #[serde(default)]
    pub devid: Option<u64>,
}

/// The item: data filter (2 bytes), metadata filter (2), paused (1), and
/// since conversions, the data and metadata targets (1 each: 0 none, 1
/// single, 2 dup, 3 raid1, 4 raid1c3); and with a device filter, its
/// devid (u64, 15 bytes in all). Items of 5 bytes convert nothing.
const ITEM_SIZE: usize = 7;
const DEVID_ITEM_SIZE: usize = 15;
const OLD_ITEM_SIZE: usize = 5;
const NO_USAGE: u8 = 255;

fn encode_convert(p: Option<Profile>) -> u8 {
    match p {
        None => 0,
        Some(Profile::Single) => 1,
        Some(Profile::Dup) => 2,
        Some(Profile::Raid1) => 3,
        Some(Profile::Raid1c3) => 4,
        Some(Profile::Raid10) => 5,
    }
}

fn decode_convert(b: u8) -> std::result::Result<Option<Profile>, String> {
    match b {
        0 => Ok(None),
        1 => Ok(Some(Profile::Single)),
        2 => Ok(Some(Profile::Dup)),
        3 => Ok(Some(Profile::Raid1)),
        4 => Ok(Some(Profile::Raid1c3)),
        5 => Ok(Some(Profile::Raid10)),
        _ => Err(format!("balance conversion target {b} is not valid")),
    }
}

impl BalanceArgs {
    /// Everything (what `canopy balance start MNT` with no filter means).
    pub fn all() -> BalanceArgs {
        BalanceArgs {
            data: Filter::All,
            metadata: Filter::All,
            data_convert: None,
            metadata_convert: None,
            devid: None,
        }
    }

    /// The payload of the balance item.
    pub fn encode(&self, paused: bool) -> Vec<u8> {
        let (d, du) = self.data.encode();
        let (m, mu) = self.metadata.encode();
        let (dc, mc) = (
            encode_convert(self.data_convert),
            encode_convert(self.metadata_convert),
        );
        let mut b = vec![d, du, m, mu, u8::from(paused), dc, mc];
        if let Some(devid) = self.devid {
            b.extend_from_slice(&devid.to_le_bytes());
        }
        b
    }

    /// The arguments and the paused flag of a balance item.
    pub fn decode(b: &[u8]) -> std::result::Result<(BalanceArgs, bool), String> {
        let (b, devid) = match b.len() {
            DEVID_ITEM_SIZE => {
                let (head, id) = b.split_at(ITEM_SIZE);
                let id = u64::from_le_bytes(id.try_into().map_err(|_| "balance devid")?);
                if id == 0 {
                    return Err("balance device filter names devid 0".into());
                }
                (head, Some(id))
            }
            _ => (b, None),
        };
        let (fixed, converts) = match b.len() {
            ITEM_SIZE => b.split_at(OLD_ITEM_SIZE),
            OLD_ITEM_SIZE => (b, &[0u8, 0][..]),
            n => return Err(format!("balance item of {n} bytes")),
        };
        let [d, du, m, mu, paused] = <[u8; OLD_ITEM_SIZE]>::try_from(fixed)
            .map_err(|_| format!("balance item of {} bytes", b.len()))?;
        if paused > 1 {
            return Err("balance paused flag is not 0 or 1".into());
        }
        Ok((
            BalanceArgs {
                data: Filter::decode(d, du)?,
                metadata: Filter::decode(m, mu)?,
                data_convert: decode_convert(converts[0])?,
                metadata_convert: decode_convert(converts[1])?,
                devid,
            },
            paused == 1,
        ))
    }
}
