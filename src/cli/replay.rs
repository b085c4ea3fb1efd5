//! `ratelimit-server replay`: loads the rules sets as `check` does, opens the inputs, runs
//! `replay::replay` and prints the report (text or JSON) and, with `--plot`, draws it.

use std::path::{Path, PathBuf};

use clap::{Args, ValueEnum};

use crate::engine::EngineSettings;
use crate::policy::Policy;
use crate::rules_dir::load_rules_dir_saying;
use crate::settings::{DefaultsArgs, RulesFilesArgs};
use ratelimit_replay::{
    Decode, DiffTally, EnvoyLogMapping, Merged, Problems, RecordLines, Side, build_report,
    draw_plot, replay, report_text,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    Text,
    Json,
}

/// `--max-keys` unless set: ten million keys, about 0.7 GB per rules set (measured ~70 bytes a
/// key), where the earlier fifty million let a hostile or very wide input take ~3.5 GB each.
pub(super) const DEFAULT_MAX_KEYS: usize = 10_000_000;

#[derive(Debug, Args)]
pub struct ReplayArgs {
    /// The rules directory to replay the requests through.
    #[arg(long)]
    pub config: PathBuf,
    /// A second rules directory: replay the same requests through it too and show the
    /// differences per rule.
    #[arg(long)]
    pub against: Option<PathBuf>,
    /// Report as an aligned text table or as JSON (docs/record.md describes the fields).
    #[arg(long, value_enum, default_value_t = Format::Text)]
    pub format: Format,
    /// How many keys to list per rule (most denied, newly limited, freed).
    #[arg(long, default_value_t = 10)]
    pub top: usize,
    /// Draw allowed and denied requests over time per rule into this SVG file.
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// The inputs are Envoy access-log JSON lines (see docs/record.md), turned into requests by
    /// the `--map` file.
    #[arg(long, requires = "map")]
    pub from_envoy_log: bool,
    /// With --from-envoy-log: the mapping from log fields to descriptors (the route's
    /// `rate_limits` actions).
    #[arg(long, requires = "from_envoy_log")]
    pub map: Option<PathBuf>,
    /// Most keys each replay store holds (about 70 bytes each: 10 million take about 0.7 GB per
    /// rules set). A full store evicts, which changes answers; the run says so.
    #[arg(long, default_value_t = DEFAULT_MAX_KEYS)]
    pub max_keys: usize,
    /// How many skipped lines to print on stderr (the rest are counted).
    #[arg(long, default_value_t = 20)]
    pub print_skipped: u64,
    #[command(flatten)]
    pub rules_files: RulesFilesArgs,
    #[command(flatten)]
    pub defaults: DefaultsArgs,
    /// Record files (`serve --record`), or Envoy access logs with --from-envoy-log; several are
    /// merged by time; `-` is standard input.
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
}

/// Loads a rules directory; prints its errors and returns None if it has any.
fn load(dir: &Path, args: &RulesFilesArgs) -> Option<Policy> {
    let warn = |w: &str| eprintln!("warning: {w}");
    match load_rules_dir_saying(dir, args.caps(), args.merge_domain_config, warn) {
        Ok(configs) => Some(Policy::new(&configs)),
        Err(errors) => {
            for e in &errors.0 {
                eprintln!("{e}");
            }
            eprintln!("{}: {} error(s)", dir.display(), errors.0.len());
            None
        }
    }
}

pub(super) async fn run(args: ReplayArgs) -> i32 {
    match replay_and_report(&args).await {
        Ok(()) => 0,
        Err(Stop::Printed) => 1,
        Err(Stop::Error(e)) => {
            eprintln!("error: {e}");
            1
        }
    }
}

/// Why a replay stopped: its errors already printed (a rules directory's), or one to print.
enum Stop {
    Printed,
    Error(String),
}

impl Stop {
    fn error(e: impl std::fmt::Display) -> Stop {
        Stop::Error(e.to_string())
    }
}

/// Loads the rules, replays the input through them, and prints the report (and draws the plot).
async fn replay_and_report(args: &ReplayArgs) -> Result<(), Stop> {
    let (mut before, mut after) = sides(args)?;
    let decoder = decoder(args)?;
    let mut input = Merged::open(&args.files, &*decoder, Problems::new(args.print_skipped))
        .map_err(Stop::error)?;
    let mut diff = DiffTally::default();
    let run = replay(
        &mut input,
        &mut before,
        after.as_mut().map(|a| (a, &mut diff)),
    )
    .await
    .map_err(Stop::error)?;
    if run.evictions > 0 {
        eprintln!(
            "warning: {} keys were evicted because a store held --max-keys ({}) keys: answers \
             after the first eviction may differ from the server's; raise --max-keys (about 70 \
             bytes a key) if memory allows",
            run.evictions, args.max_keys
        );
    }
    let report = build_report(
        &run,
        before.report_input(),
        after.as_ref().map(|a| (a.report_input(), &diff)),
        args.top,
    );
    if let Some(path) = &args.plot {
        let sides: Vec<&Side> = std::iter::once(&before).chain(after.as_ref()).collect();
        draw_plot(path, &sides)
            .map_err(|e| Stop::Error(format!("cannot draw {}: {e}", path.display())))?;
    }
    match args.format {
        Format::Text => print!("{}", report_text(&report)),
        Format::Json => println!(
            "{}",
            serde_json::to_string_pretty(&report).map_err(Stop::error)?
        ),
    }
    Ok(())
}

/// The rules replayed (`--config`) and, with `--against`, the proposed ones, each on its own
/// engine.
fn sides(args: &ReplayArgs) -> Result<(Side, Option<Side>), Stop> {
    let settings = EngineSettings {
        defaults: args.defaults.limit_defaults(),
        ..EngineSettings::default()
    };
    let policy = load(&args.config, &args.rules_files).ok_or(Stop::Printed)?;
    let before = Side::new(
        args.config.display().to_string(),
        policy,
        settings.clone(),
        args.max_keys,
    );
    let after = match &args.against {
        None => None,
        Some(dir) => {
            let policy = load(dir, &args.rules_files).ok_or(Stop::Printed)?;
            Some(Side::new(
                dir.display().to_string(),
                policy,
                settings,
                args.max_keys,
            ))
        }
    };
    Ok((before, after))
}

/// How input lines are read: record lines, or Envoy access-log lines through `--map`.
fn decoder(args: &ReplayArgs) -> Result<Box<dyn Decode>, Stop> {
    Ok(match &args.map {
        Some(map) if args.from_envoy_log => {
            Box::new(EnvoyLogMapping::load(map).map_err(Stop::error)?)
        }
        _ => Box::new(RecordLines),
    })
}
