//! Keys: `(objectid u64, type u8, offset u64)`, ordered field by field.

use std::fmt;

/// Encoded size of a key.
pub const KEY_SIZE: usize = 17;

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Key {
    pub objectid: u64,
    pub ty: u8,
    pub offset: u64,
}

impl Key {
    pub const MIN: Key = Key {
        objectid: 0,
        ty: 0,
        offset: 0,
    };
    pub const MAX: Key = Key {
        objectid: u64::MAX,
        ty: u8::MAX,
        offset: u64::MAX,
    };

    pub const fn new(objectid: u64, ty: u8, offset: u64) -> Key {
        Key {
            objectid,
            ty,
            offset,
        }
    }

    pub fn encode(&self, out: &mut [u8]) {
        super::put_u64(out, 0, self.objectid);
        out[8] = self.ty;
        super::put_u64(out, 9, self.offset);
    }

    pub fn decode(b: &[u8]) -> Key {
        Key {
            objectid: super::le_u64(b, 0),
            ty: b[8],
            offset: super::le_u64(b, 9),
        }
    }

    /// The smallest key strictly greater than this one, if any.
    pub fn successor(&self) -> Option<Key> {
        if let Some(o) = self.offset.checked_add(1) {
            return Some(Key::new(self.objectid, self.ty, o));
        }
        if let Some(t) = self.ty.checked_add(1) {
            return Some(Key::new(self.objectid, t, 0));
        }
        self.objectid.checked_add(1).map(|id| Key::new(id, 0, 0))
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "({} {} {})", self.objectid, self.ty, self.offset)
    }
}

impl Key {
    /// The error for an item under this key that the checker (or a
    /// decoder) refuses.
    pub fn bad(&self, reason: impl Into<String>) -> crate::error::Error {
        crate::error::Error::BadItem {
            key: self.to_string(),
            reason: reason.into(),
        }
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}
