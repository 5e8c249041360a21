//! The balance items of the root tree (see `crate::balance`): what a
//! recorded balance empties, and whether it is paused.

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
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BalanceArgs {
    pub data: Filter,
    pub metadata: Filter,
}

const ITEM_SIZE: usize = 5;
const NO_USAGE: u8 = 255;

impl BalanceArgs {
    /// Everything (what `canopy balance start MNT` with no filter means).
    pub fn all() -> BalanceArgs {
        BalanceArgs {
            data: Filter::All,
            metadata: Filter::All,
        }
    }

    /// The payload of the balance item.
    pub fn encode(&self, paused: bool) -> Vec<u8> {
        let (d, du) = self.data.encode();
        let (m, mu) = self.metadata.encode();
        vec![d, du, m, mu, u8::from(paused)]
    }

    /// The arguments and the paused flag of a balance item.
    pub fn decode(b: &[u8]) -> std::result::Result<(BalanceArgs, bool), String> {
        let [d, du, m, mu, paused] = <[u8; ITEM_SIZE]>::try_from(b)
            .map_err(|_| format!("balance item of {} bytes", b.len()))?;
        if paused > 1 {
            return Err("balance paused flag is not 0 or 1".into());
        }
        Ok((
            BalanceArgs {
                data: Filter::decode(d, du)?,
                metadata: Filter::decode(m, mu)?,
            },
            paused == 1,
        ))
    }
}
