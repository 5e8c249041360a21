//! What `canopy check --repair` asks of the engine beyond ordinary
//! transactions: free space and block group usage rewritten from what an
//! open counted (`OpenOptions::space`).

use super::Engine;
use crate::error::Result;

impl Engine {
    /// Rewrites the free-space trees and every block group item from the
    /// allocator's state, in the running transaction (the caller
    /// commits); returns how many free ranges the trees now hold. Meant
    /// for an open whose usage and free space were counted from the
    /// extent tree (`OpenOptions::space`): the image's own records then
    /// stop disagreeing with its extents.
    pub fn rewrite_free_space(&self) -> Result<u64> {
        self.write(super::persist::rewrite_free_trees)
    }
}
