//! `balancer-testbed`: builds the namespace test bed in network and mount
//! namespaces of its own and runs a scenario on it.
//!
//! * `balancer-testbed demo [--connections N] [--held N] [--backends N]`
//! * `balancer-testbed e2e`

use std::process::ExitCode;

use balancer_tests::{netns, scenario};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(about = "Namespace test bed for the balancer")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Balance real TCP connections across backends and print the tables.
    Demo {
        /// Connections to open.
        #[arg(long, default_value_t = 1000)]
        connections: u64,
        /// Of which this many stay open while the table is printed.
        #[arg(long, default_value_t = 100)]
        held: u64,
        /// Backend hosts (1..=200).
        #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..=200))]
        backends: u16,
    },
    /// The end-to-end test (2,000+ connections, drain, counts).
    E2e,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match netns::isolate() {
        Ok(Some(code)) => return ExitCode::from(code as u8),
        Ok(None) => {}
        Err(e) => {
            eprintln!("error: {e:#}");
            return ExitCode::FAILURE;
        }
    }
    let r = match cli.cmd {
        Cmd::Demo {
            connections,
            held,
            backends,
        } => scenario::demo(connections, held.min(connections), backends as usize),
        Cmd::E2e => scenario::e2e(),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
