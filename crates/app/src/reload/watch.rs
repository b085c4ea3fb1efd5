//! The rules directory watcher: which file events can change the rules (never the reload's own
//! opens and reads), debouncing bursts, and following the directory when it is swapped by symlink.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use notify::event::{AccessKind, AccessMode, MetadataKind, ModifyKind};
use notify::{EventKind, RecommendedWatcher, RecursiveMode, Watcher};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use super::Reloader;

/// Quiet time after the last file event before reloading.
const DEBOUNCE: Duration = Duration::from_millis(100);

/// Whether an event can change what a reload reads: creations, writes, renames, removals,
/// permission and ownership changes (a file may become readable), and closing a file written to.
/// Opens, reads, closes after reading and access-time updates cannot: reacting to them made each
/// reload's own reads start the next reload, forever.
pub(crate) fn changes_content(kind: &EventKind) -> bool {
    match kind {
        EventKind::Access(AccessKind::Close(AccessMode::Write)) => true,
        EventKind::Access(_) => false,
        EventKind::Modify(ModifyKind::Metadata(m)) => {
            !matches!(m, MetadataKind::AccessTime | MetadataKind::WriteTime)
        }
        EventKind::Any
        | EventKind::Create(_)
        | EventKind::Modify(_)
        | EventKind::Remove(_)
        | EventKind::Other => true,
    }
}

/// Whether `event` is the rules directory itself made or removed at its path (`rm -rf rules &&
/// cp -r new rules`, seen by the parent's watch): an inotify watch holds a directory, not a path,
/// so the one made again must be watched anew, or edits in it go unseen.
fn replaces_dir(event: &notify::Event, dir: &Path) -> bool {
    matches!(event.kind, EventKind::Create(_) | EventKind::Remove(_))
        && event.paths.iter().any(|p| p == dir)
}

/// Watches the directory recursively (through its symlink, if it is one).
fn watch_dir(watcher: &mut RecommendedWatcher, dir: &Path) {
    if let Err(e) = watcher.watch(dir, RecursiveMode::Recursive) {
        tracing::warn!(dir = %dir.display(), error = %e, "cannot watch the rules directory");
    }
}

/// Watches the rules directory until `stop` turns true, reloading after each burst of changes.
/// The directory is watched as an absolute path (events carry absolute paths, whatever `--config`
/// said), and its parent too, to see the directory itself replaced by a symlink swap.
pub(crate) fn spawn_watcher(
    reloader: Arc<Reloader>,
    mut stop: watch::Receiver<bool>,
) -> Result<JoinHandle<()>, notify::Error> {
    let (tx, mut rx) = mpsc::unbounded_channel();
    let dir: PathBuf = std::path::absolute(reloader.dir())?;
    let filter_dir = dir.clone();
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        // The parent's watch also reports its other entries: keep only events on the directory.
        if let Ok(e) = event
            && changes_content(&e.kind)
            && e.paths.iter().any(|p| p.starts_with(&filter_dir))
        {
            let _ = tx.send(replaces_dir(&e, &filter_dir));
        }
    })?;
    watch_dir(&mut watcher, &dir);
    // The parent sees the directory itself replaced (`ln -s new tmp && mv -T tmp dir`).
    let parent = dir.parent().unwrap_or(Path::new("/"));
    watcher.watch(parent, RecursiveMode::NonRecursive)?;
    let mut watched = std::fs::canonicalize(&dir).ok();
    Ok(tokio::spawn(async move {
        loop {
            let mut replaced = tokio::select! {
                event = rx.recv() => match event {
                    Some(replaced) => replaced,
                    None => break,
                },
                _ = stop.wait_for(|s| *s) => break,
            };
            while let Ok(Some(more)) = tokio::time::timeout(DEBOUNCE, rx.recv()).await {
                replaced |= more;
            }
            let r = reloader.clone();
            let _ = tokio::task::spawn_blocking(move || r.reload()).await;
            // The directory itself may now be another one (a symlink swap, or deleted and made
            // again at the same path): watch the new one.
            let now = std::fs::canonicalize(&dir).ok();
            if replaced || now != watched {
                if let Some(old) = &watched {
                    let _ = watcher.unwatch(old);
                }
                let _ = watcher.unwatch(&dir);
                watch_dir(&mut watcher, &dir);
                watched = now;
            }
        }
    }))
}

#[cfg(test)]
mod tests {
    use notify::event::{CreateKind, DataChange, RemoveKind, RenameMode};

    use super::*;

    #[test]
    fn only_the_directory_itself_made_or_removed_replaces_it() {
        let dir = Path::new("/srv/rules");
        let event = |kind, path: &str| notify::Event::new(kind).add_path(PathBuf::from(path));
        let made = EventKind::Create(CreateKind::Folder);
        let removed = EventKind::Remove(RemoveKind::Folder);
        assert!(replaces_dir(&event(made, "/srv/rules"), dir));
        assert!(replaces_dir(&event(removed, "/srv/rules"), dir));
        // A file made in it, or the directory written to: the watch holds.
        assert!(!replaces_dir(&event(made, "/srv/rules/a.yaml"), dir));
        let written = EventKind::Modify(ModifyKind::Data(DataChange::Content));
        assert!(!replaces_dir(&event(written, "/srv/rules"), dir));
    }

    #[test]
    fn reads_never_reload_and_writes_always_do() {
        for quiet in [
            EventKind::Access(AccessKind::Read),
            EventKind::Access(AccessKind::Open(AccessMode::Any)),
            EventKind::Access(AccessKind::Close(AccessMode::Read)),
            EventKind::Access(AccessKind::Any),
            EventKind::Modify(ModifyKind::Metadata(MetadataKind::AccessTime)),
        ] {
            assert!(!changes_content(&quiet), "{quiet:?}");
        }
        for change in [
            EventKind::Create(CreateKind::File),
            EventKind::Modify(ModifyKind::Data(DataChange::Any)),
            EventKind::Modify(ModifyKind::Name(RenameMode::To)),
            EventKind::Modify(ModifyKind::Metadata(MetadataKind::Permissions)),
            EventKind::Modify(ModifyKind::Metadata(MetadataKind::Any)),
            EventKind::Modify(ModifyKind::Any),
            EventKind::Remove(RemoveKind::File),
            EventKind::Access(AccessKind::Close(AccessMode::Write)),
        ] {
            assert!(changes_content(&change), "{change:?}");
        }
    }
}
