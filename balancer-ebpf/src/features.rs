//! The features this load of the object carries
//! (`balancer_common::features`): a word in the object's read-only data
//! that the daemon sets before loading. The verifier knows a frozen
//! read-only value, so a feature that is off costs neither a branch at run
//! time nor a walk of its code at load.

use aya_ebpf::Global;

/// The features word; the object's own value is every feature.
#[unsafe(no_mangle)]
pub static BALANCER_FEATURES: Global<u64> = Global::new(balancer_common::features::ALL);

/// `true` when feature `f` (a `balancer_common::features` bit) is loaded.
#[inline(always)]
pub fn on(f: u64) -> bool {
    BALANCER_FEATURES.load() & f != 0
}
