//! The `ratelimit-server` binary: read the reference's environment, parse the command line, set up
//! logging, run the command.

use clap::Parser;
use ratelimit_server::cli::{Cli, Command, run};
use ratelimit_server::reference_env;

fn main() {
    // envoyproxy/ratelimit's settings fill in ours that are not set (flag > our env > theirs).
    // Still one thread here, so changing the environment is sound.
    let reference = reference_env::translate(&|name| std::env::var(name).ok());
    for (name, value) in &reference.set {
        // SAFETY: no other thread exists yet (the runtime is built below).
        unsafe { std::env::set_var(name, value) };
    }
    let cli = Cli::parse();
    ratelimit_server::logging::init();
    if matches!(cli.command, None | Some(Command::Serve(_))) {
        for (name, value) in &reference.set {
            tracing::info!("{name}={value} (from envoyproxy/ratelimit's settings)");
        }
        for note in &reference.notes {
            tracing::info!("{note}");
        }
        for warning in &reference.warnings {
            tracing::warn!("{warning}");
        }
    }
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
