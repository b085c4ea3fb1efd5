//! The `ratelimit-server` binary: read the reference's environment, parse the command line, set up
//! logging, run the command.
#![deny(unsafe_code)]

use clap::{CommandFactory, FromArgMatches};
use ratelimit_server::cli::{Cli, Command, run};
use ratelimit_server::reference_env;

mod allocator;

/// The process's allocator (why mimalloc: Cargo.toml; why our own entry to it: `allocator`).
#[global_allocator]
static ALLOCATOR: allocator::Mimalloc = allocator::Mimalloc;

fn main() {
    // envoyproxy/ratelimit's settings fill in ours that are not set (flag > our env > theirs):
    // each translated value becomes the default of the argument that reads that variable, below
    // the command line and our own variable, without changing the environment.
    let as_reference = std::env::args_os()
        .next()
        .is_some_and(|argv0| reference_env::invoked_as_reference(&argv0));
    let reference = reference_env::translate(&|name| std::env::var(name).ok(), as_reference);
    let cli = parse(&reference.set);
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
    // The workers' number always given, so tokio does not read TOKIO_WORKER_THREADS itself
    // (it panics on a value it cannot parse; `serve` has checked it, naming it, by now).
    let workers = match &cli.command {
        Some(Command::Serve(settings)) => settings.worker_threads,
        _ => None,
    }
    .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            std::process::exit(1);
        }
    };
    let code = runtime.block_on(run(cli));
    std::process::exit(code);
}

/// Parses the command line with `defaults` (variable name, value) as the defaults of the arguments
/// that read those variables. With no command, parses `serve` with no flags, as the reference's
/// binary serves from the environment alone.
fn parse(defaults: &[(&'static str, String)]) -> Cli {
    let command = with_env_defaults(Cli::command(), defaults);
    let matches = command.clone().get_matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    if cli.command.is_some() {
        return cli;
    }
    let name = command.get_name().to_owned();
    let matches = command.get_matches_from([name.as_str(), "serve"]);
    Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
}

/// `command` and its subcommands with each argument that reads one of `defaults`' variables
/// defaulting to that variable's value.
fn with_env_defaults(command: clap::Command, defaults: &[(&'static str, String)]) -> clap::Command {
    if defaults.is_empty() {
        return command;
    }
    let command = command.mut_args(|arg| {
        let value = defaults
            .iter()
            .find(|(name, _)| arg.get_env().is_some_and(|env| env == *name));
        match value {
            Some((_, value)) => {
                // Parsed once per process: the few leaked bytes live as long as the value would.
                let value: &'static str = value.clone().leak();
                arg.default_value(value)
            }
            None => arg,
        }
    });
    let names: Vec<String> = command
        .get_subcommands()
        .map(|s| s.get_name().to_owned())
        .collect();
    names.into_iter().fold(command, |command, name| {
        command.mut_subcommand(name, |sub| with_env_defaults(sub, defaults))
    })
}
