//! Test bed and tests for the balancer: network namespaces with real TCP
//! clients and servers around the real daemon and XDP program.
#![deny(missing_docs)]

pub mod abuse;
pub mod bench;
pub mod chain;
pub mod chance;
pub mod cluster;
pub mod collisions;
pub mod faults;
pub mod fixtures;
pub mod flood;
pub mod frames;
pub mod fuzz;
pub mod harness;
pub mod health;
pub mod hostile;
pub mod jumbo;
pub mod locality;
pub mod mistakes;
pub mod modes;
pub mod natpair;
pub mod netns;
pub mod operator;
pub mod orphans;
pub mod quic;
pub mod realclients;
pub mod refusals;
pub mod refusing;
pub mod restart;
pub mod retries;
pub mod rig;
pub mod scenario;
pub mod scraped_rules;
pub mod signals;
pub mod specialise;
pub mod sync;
pub mod testbed;
pub mod traffic;
pub mod truth;
pub mod udp;
