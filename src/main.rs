//! The `ratelimit-server` binary: parse the command line, set up logging, run the command.

use clap::Parser;
use ratelimit_server::cli::{Cli, run};

fn main() {
    let cli = Cli::parse();
    ratelimit_server::logging::init();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            std::process::exit(1);
        }
    };
    let code = runtime.block_on(run(cli));
    std::process::exit(code);
}
