//! The rotated record files beside `FILE`: `FILE.<n>`, `n` counting up (the highest is the
//! newest), so a rotation renames `FILE` alone and deletes only the oldest: its cost does not grow
//! with `--record-max-files`. The numbers already there are read from the directory once, at the
//! first rotation; later rotations only count on. Runs on the writer thread only.

use std::collections::VecDeque;
use std::io;
use std::path::{Path, PathBuf};

/// `FILE.<n>`.
pub(super) fn numbered(path: &Path, n: u64) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(format!(".{n}"));
    PathBuf::from(name)
}

/// The rotated files of one `FILE`, oldest first, and the number the next one gets.
#[derive(Debug)]
pub(super) struct Rotated {
    path: PathBuf,
    kept: VecDeque<u64>,
    next: u64,
}

impl Rotated {
    /// The `FILE.<n>` beside `path` now, oldest (lowest number) first.
    pub(super) fn scan(path: &Path) -> io::Result<Rotated> {
        let dir = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        let stem = path
            .file_name()
            .and_then(|n| n.to_str())
            .map(|n| format!("{n}."));
        let mut kept: Vec<u64> = Vec::new();
        if let Some(stem) = stem {
            for entry in std::fs::read_dir(dir)? {
                let name = entry?.file_name();
                let number = name
                    .to_str()
                    .and_then(|n| n.strip_prefix(&stem))
                    .filter(|digits| {
                        !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())
                    })
                    .and_then(|digits| digits.parse::<u64>().ok());
                kept.extend(number);
            }
        }
        kept.sort_unstable();
        let next = kept.last().map_or(1, |n| n.saturating_add(1));
        Ok(Rotated {
            path: path.to_owned(),
            kept: kept.into(),
            next,
        })
    }

    /// Renames `FILE` to the next number, then deletes the oldest files until `keep` are left.
    /// `Err` when the rename failed (nothing changed); `Ok(Some(e))` when `FILE` was rotated but
    /// an old file could not be deleted (it is tried again at the next rotation).
    pub(super) fn rotate(&mut self, keep: u32) -> io::Result<Option<io::Error>> {
        let to = numbered(&self.path, self.next);
        std::fs::rename(&self.path, &to)?;
        self.kept.push_back(self.next);
        self.next = self.next.saturating_add(1);
        while self.kept.len() > keep as usize {
            let Some(&oldest) = self.kept.front() else {
                break;
            };
            match std::fs::remove_file(numbered(&self.path, oldest)) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Ok(Some(e)),
            }
            self.kept.pop_front();
        }
        Ok(None)
    }

    /// The numbers kept, oldest first.
    #[cfg(test)]
    pub(super) fn kept(&self) -> impl Iterator<Item = u64> + '_ {
        self.kept.iter().copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_count_on_from_what_is_there_and_the_oldest_go() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rec.jsonl");
        for name in [
            "rec.jsonl.3",
            "rec.jsonl.10",
            "rec.jsonl.x",
            "rec.jsonl.",
            "other.1",
        ] {
            std::fs::write(dir.path().join(name), name).unwrap();
        }
        let mut rotated = Rotated::scan(&path).unwrap();
        assert_eq!(rotated.kept().collect::<Vec<_>>(), [3, 10]);
        std::fs::write(&path, "current").unwrap();
        assert!(rotated.rotate(2).unwrap().is_none());
        assert_eq!(rotated.kept().collect::<Vec<_>>(), [10, 11]);
        assert_eq!(
            std::fs::read_to_string(numbered(&path, 11)).unwrap(),
            "current"
        );
        assert!(!numbered(&path, 3).exists());
        assert!(!path.exists());
        // Files that are not rotated ones are left alone.
        for name in ["rec.jsonl.x", "rec.jsonl.", "other.1"] {
            assert!(dir.path().join(name).exists(), "{name}");
        }
        // No FILE to rename: an error, and nothing changes.
        assert!(rotated.rotate(2).is_err());
        assert_eq!(rotated.kept().collect::<Vec<_>>(), [10, 11]);
    }
}
