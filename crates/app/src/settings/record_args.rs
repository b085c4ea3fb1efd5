//! `serve --record` settings (docs/record.md), each a flag and an environment variable, checked
//! as they are parsed; `--record-hash-values` without a good `RECORD_HASH_KEY` stops the start
//! naming the setting.

use std::path::PathBuf;

use clap::{ArgAction, Args};

use super::byte_size;
use super::{SettingError, at_least_one};
use crate::record::{FileSpec, HashKey, RecordConfig};

fn parse_sample(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(p) if p > 0.0 && p <= 1.0 => Ok(p),
        _ => Err(format!(
            "'{text}' is not a share of decisions: 0 < p ≤ 1 (0.01 records one in a hundred)"
        )),
    }
}

fn parse_max_files(text: &str) -> Result<u32, String> {
    match text.trim().parse::<u32>() {
        Ok(n) if (1..=1000).contains(&n) => Ok(n),
        _ => Err(format!("'{text}' must be a whole number from 1 to 1000")),
    }
}

fn parse_max_bytes(text: &str) -> Result<usize, String> {
    let n = byte_size(text)?;
    if n < 1024 {
        return Err(format!("'{text}' is below the smallest record file, 1KiB"));
    }
    Ok(n)
}

/// Recording each decision to a file.
#[derive(Debug, Clone, Args)]
pub struct RecordArgs {
    /// Append each ShouldRateLimit decision (gRPC and POST /json) to this file as a JSON line
    /// (docs/record.md), for `ratelimit-server replay`. Off unless set.
    #[arg(long = "record", env = "RECORD_FILE")]
    pub record_file: Option<PathBuf>,
    /// Rotate the record file (FILE → FILE.1 → … ) before it grows past this size (256MiB, 10MiB).
    #[arg(long, env = "RECORD_MAX_BYTES", default_value = "256MiB", value_parser = parse_max_bytes)]
    pub record_max_bytes: usize,
    /// Rotated record files kept (FILE.1 newest … FILE.N oldest); the oldest is deleted.
    #[arg(long, env = "RECORD_MAX_FILES", default_value_t = 5, value_parser = parse_max_files)]
    pub record_max_files: u32,
    /// Share of decisions recorded, 0 < p ≤ 1; deterministic (0.5 records every second one).
    #[arg(long, env = "RECORD_SAMPLE", default_value_t = 1.0, value_parser = parse_sample)]
    pub record_sample: f64,
    /// Write descriptor values as keyed hashes (`h:` + 32 hex digits, SipHash-2-4-128 under
    /// RECORD_HASH_KEY), except values the live rules name.
    #[arg(long, env = "RECORD_HASH_VALUES", action = ArgAction::Set, default_value_t = false, num_args = 0..=1, default_missing_value = "true")]
    pub record_hash_values: bool,
    /// The key of --record-hash-values: 32 hex digits (`openssl rand -hex 16`). Prefer the
    /// environment variable: a flag shows in the process list. Checked in `config`, not by
    /// clap, whose errors repeat the value.
    #[arg(long, env = "RECORD_HASH_KEY", hide_env_values = true)]
    pub record_hash_key: Option<String>,
    /// Decisions pending for the writer; past it (the disk is slow), decisions are still
    /// answered and dropped from the record, counted.
    #[arg(long, env = "RECORD_QUEUE", default_value = "65536", value_parser = at_least_one)]
    pub record_queue: usize,
    /// The pending decisions' bound in bytes (requests at their wire size, plus 20 bytes each):
    /// past it, decisions are dropped and counted as when the count bound is reached, so a burst
    /// of large requests cannot grow memory beyond it.
    #[arg(long, env = "RECORD_QUEUE_BYTES", default_value = "64MiB", value_parser = parse_max_bytes)]
    pub record_queue_bytes: usize,
}

impl RecordArgs {
    /// What to record with, when `--record` is set.
    pub fn config(&self) -> Result<Option<RecordConfig>, SettingError> {
        let Some(path) = &self.record_file else {
            return Ok(None);
        };
        if path.as_os_str().is_empty() {
            return Err(SettingError {
                setting: "RECORD_FILE",
                message: "is empty".into(),
            });
        }
        let hash_key = match (self.record_hash_values, &self.record_hash_key) {
            (false, _) => None,
            (true, Some(key)) => Some(HashKey::parse(key).map_err(|message| SettingError {
                setting: "RECORD_HASH_KEY",
                message,
            })?),
            (true, None) => {
                return Err(SettingError {
                    setting: "RECORD_HASH_KEY",
                    message: "--record-hash-values needs RECORD_HASH_KEY set to 32 hex digits \
                              (e.g. `export RECORD_HASH_KEY=$(openssl rand -hex 16)`)"
                        .into(),
                });
            }
        };
        Ok(Some(RecordConfig {
            file: FileSpec {
                path: path.clone(),
                max_bytes: self.record_max_bytes as u64,
                max_files: self.record_max_files,
            },
            sample: self.record_sample,
            hash_key,
            queue: self.record_queue,
            queue_bytes: self.record_queue_bytes,
        }))
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Wrapper {
        #[command(flatten)]
        record: RecordArgs,
    }

    fn parse(args: &[&str]) -> Result<RecordArgs, String> {
        let mut all = vec!["test"];
        all.extend_from_slice(args);
        Wrapper::try_parse_from(all)
            .map(|w| w.record)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn off_by_default_and_defaults_when_on() {
        assert!(parse(&[]).unwrap().config().unwrap().is_none());
        let c = parse(&["--record", "/tmp/r.jsonl"])
            .unwrap()
            .config()
            .unwrap()
            .unwrap();
        assert_eq!(c.file.max_bytes, 256 << 20);
        assert_eq!(c.file.max_files, 5);
        assert_eq!(c.sample, 1.0);
        assert_eq!(c.queue, 65536);
        assert!(c.hash_key.is_none());
    }

    #[test]
    fn bad_values_name_the_setting() {
        for (args, flag) in [
            (&["--record-sample", "0"][..], "--record-sample"),
            (&["--record-sample", "1.5"], "--record-sample"),
            (&["--record-max-bytes", "100"], "--record-max-bytes"),
            (&["--record-max-files", "0"], "--record-max-files"),
            (&["--record-queue", "0"], "--record-queue"),
        ] {
            let error = parse(args).unwrap_err();
            assert!(error.contains(flag), "{args:?}: {error}");
        }
        let no_key = parse(&["--record", "r", "--record-hash-values"]).unwrap();
        let error = no_key.config().unwrap_err();
        assert_eq!(error.setting, "RECORD_HASH_KEY");
        let short = parse(&[
            "--record",
            "r",
            "--record-hash-values",
            "--record-hash-key",
            "abcd",
        ])
        .unwrap()
        .config()
        .unwrap_err();
        assert_eq!(short.setting, "RECORD_HASH_KEY");
        assert!(short.message.contains("32 hex digits"), "{short}");
        assert!(
            !short.to_string().contains("abcd"),
            "the key is repeated: {short}"
        );
        let good = parse(&[
            "--record",
            "r",
            "--record-hash-values",
            "--record-hash-key",
            &"ab".repeat(16),
        ])
        .unwrap();
        assert!(good.config().unwrap().unwrap().hash_key.is_some());
    }
}
