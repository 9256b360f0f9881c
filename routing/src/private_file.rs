//! Files the gateway reads and writes beside folders that another account controls.
//!
//! When the gateway is root, each local tenant's Postgres runs as an unprivileged account, and
//! a tenant's superuser can run programs as that account (`COPY … TO PROGRAM`). Whatever that
//! account can rename or link must never steer a write of the gateway's: a symbolic or hard
//! link planted where the gateway writes would otherwise make root overwrite a file of its
//! choice. So the gateway keeps its own state in folders only it can write (checked with
//! [`check_private_dir`]), creates files only under fresh names that no link can stand in for,
//! and opens the account's files without following links and only when they are what they
//! seem to be.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt, fchown};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use nix::fcntl::OFlag;

/// Why a folder cannot hold the gateway's own files.
#[derive(Debug, thiserror::Error)]
pub enum PrivateDirError {
    /// The folder could not be examined.
    #[error("cannot examine {}: {source}", .path.display())]
    Io {
        /// The folder.
        path: PathBuf,
        /// What failed.
        source: io::Error,
    },
    /// The folder or one above it lets another account replace what is inside.
    #[error(
        "{} is {why}: another account could replace the gateway's files in {} with links; \
         use a folder that only the gateway's user can write",
        .path.display(), .dir.display()
    )]
    Unsafe {
        /// The folder the gateway would write in.
        dir: PathBuf,
        /// The folder (it or one above it) at fault.
        path: PathBuf,
        /// What is wrong with it.
        why: String,
    },
}

/// Checks that only this process's user (and root) can change what `dir` holds: `dir` is a
/// real folder owned by this user and writable by nobody else, and every folder above it is
/// owned by root or this user and, where others may write it, has the sticky bit (as `/tmp`),
/// so nobody else can rename its entries.
pub fn check_private_dir(dir: &Path) -> Result<(), PrivateDirError> {
    let me = nix::unistd::geteuid().as_raw();
    let dir = std::path::absolute(dir).map_err(|source| PrivateDirError::Io {
        path: dir.to_path_buf(),
        source,
    })?;
    let unsafe_at = |path: &Path, why: String| PrivateDirError::Unsafe {
        dir: dir.clone(),
        path: path.to_path_buf(),
        why,
    };
    let meta = fs::symlink_metadata(&dir).map_err(|source| PrivateDirError::Io {
        path: dir.clone(),
        source,
    })?;
    if !meta.file_type().is_dir() {
        return Err(unsafe_at(&dir, "not a folder".into()));
    }
    if meta.uid() != me {
        return Err(unsafe_at(&dir, format!("owned by uid {}", meta.uid())));
    }
    if meta.mode() & 0o022 != 0 {
        return Err(unsafe_at(
            &dir,
            format!("writable by others (mode {:o})", meta.mode() & 0o7777),
        ));
    }
    for above in dir.ancestors().skip(1) {
        // Links above are followed as the kernel follows them; what counts is the folder
        // reached, and a link that only root or this user can change is as safe as a folder.
        let meta = fs::metadata(above).map_err(|source| PrivateDirError::Io {
            path: above.to_path_buf(),
            source,
        })?;
        if meta.uid() != 0 && meta.uid() != me {
            return Err(unsafe_at(above, format!("owned by uid {}", meta.uid())));
        }
        if meta.mode() & 0o022 != 0 && meta.mode() & 0o1000 == 0 {
            return Err(unsafe_at(
                above,
                format!(
                    "writable by others without the sticky bit (mode {:o})",
                    meta.mode() & 0o7777
                ),
            ));
        }
    }
    Ok(())
}

/// Replaces `path` with `bytes` through a temporary file of a fresh name beside it, created
/// without following links and readable by this user alone, so a crash never leaves half a
/// file and nothing planted at any name can receive the bytes.
pub fn replace(path: &Path, bytes: &[u8]) -> io::Result<()> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no file name"))?;
    let mut temporary = std::ffi::OsString::from(".");
    temporary.push(name);
    temporary.push(format!(
        ".{}.{}.tmp",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    let temporary = path.with_file_name(temporary);
    let written = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(OFlag::O_NOFOLLOW.bits())
        .open(&temporary)
        .and_then(|mut file| {
            file.write_all(bytes)?;
            file.sync_all()
        });
    if let Err(e) = written {
        // Only a file this call created is removed: create_new failed on any other.
        if e.kind() != io::ErrorKind::AlreadyExists {
            let _ = fs::remove_file(&temporary);
        }
        return Err(e);
    }
    fs::rename(&temporary, path).inspect_err(|_| {
        let _ = fs::remove_file(&temporary);
    })
}

/// Reads `path` without following a link, refusing anything but a regular file of at most
/// `max_bytes`; `Ok(None)` when there is no such file.
pub fn read_at_most(path: &Path, max_bytes: u64) -> io::Result<Option<Vec<u8>>> {
    let mut file = match open_no_follow(path, OpenOptions::new().read(true)) {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let meta = file.metadata()?;
    if !meta.file_type().is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "not a regular file",
        ));
    }
    if meta.len() > max_bytes {
        return Err(io::Error::new(
            io::ErrorKind::FileTooLarge,
            format!("{} bytes, more than the limit of {max_bytes}", meta.len()),
        ));
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    Read::by_ref(&mut file)
        .take(max_bytes + 1)
        .read_to_end(&mut bytes)?;
    if bytes.len() as u64 > max_bytes {
        return Err(io::Error::new(
            io::ErrorKind::FileTooLarge,
            format!("more than the limit of {max_bytes} bytes"),
        ));
    }
    Ok(Some(bytes))
}

/// The last `max_bytes` of an account's file (a server log), or nothing when it is missing or
/// not a plain file of its own.
pub fn read_tail(path: &Path, max_bytes: u64) -> Vec<u8> {
    let Ok(mut file) = open_no_follow(path, OpenOptions::new().read(true)) else {
        return Vec::new();
    };
    if !file.metadata().is_ok_and(|m| plain_file(&m)) {
        return Vec::new();
    }
    let end = file.seek(SeekFrom::End(0)).unwrap_or(0);
    let mut bytes = Vec::new();
    let _ = file
        .seek(SeekFrom::Start(end.saturating_sub(max_bytes)))
        .and_then(|_| file.take(max_bytes).read_to_end(&mut bytes));
    bytes
}

/// Opens a file in a folder that `account` (uid, gid) owns, for appending, creating it for the
/// account when missing. An existing file is used only when it is a regular file with one name,
/// owned by the account or by this user; anything else at that name (a link the account
/// planted) is removed first, so the write reaches no other file.
pub fn append_for(path: &Path, account: Option<(u32, u32)>) -> io::Result<File> {
    let me = nix::unistd::geteuid().as_raw();
    let owners = [account.map_or(me, |(uid, _)| uid), me];
    for _ in 0..3 {
        let created = OpenOptions::new()
            .append(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(OFlag::O_NOFOLLOW.bits())
            .open(path);
        match created {
            Ok(file) => {
                if let Some((uid, gid)) = account {
                    fchown(&file, Some(uid), Some(gid))?;
                }
                return Ok(file);
            }
            Err(e) if e.kind() != io::ErrorKind::AlreadyExists => return Err(e),
            Err(_) => {}
        }
        if let Ok(file) = open_no_follow(path, OpenOptions::new().append(true))
            && file
                .metadata()
                .is_ok_and(|m| plain_file(&m) && owners.contains(&m.uid()))
        {
            return Ok(file);
        }
        tracing::warn!(path = %path.display(), "replacing a link or foreign file where the gateway writes");
        match fs::remove_file(path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    Err(io::Error::new(
        io::ErrorKind::AlreadyExists,
        "something keeps replacing the file",
    ))
}

/// Opens an existing file of `account`'s for appending, only when it is a regular file with one
/// name owned by the account (or by this user when there is no account).
pub fn append_existing(path: &Path, account: Option<(u32, u32)>) -> io::Result<File> {
    let owner = account.map_or_else(|| nix::unistd::geteuid().as_raw(), |(uid, _)| uid);
    let file = open_no_follow(path, OpenOptions::new().append(true))?;
    let meta = file.metadata()?;
    if !plain_file(&meta) || meta.uid() != owner {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            "not a regular file of the server account",
        ));
    }
    Ok(file)
}

/// Creates a file that must not exist yet (no link followed), readable by `account` alone.
pub fn create_for(path: &Path, account: Option<(u32, u32)>, bytes: &[u8]) -> io::Result<()> {
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(OFlag::O_NOFOLLOW.bits())
        .open(path)?;
    if let Some((uid, gid)) = account {
        fchown(&file, Some(uid), Some(gid))?;
    }
    file.write_all(bytes)
}

/// Gives the folder at `path` (never a link) to `account` with `mode`, acting on the folder
/// opened rather than on its name.
pub fn give_dir(path: &Path, account: Option<(u32, u32)>, mode: u32) -> io::Result<()> {
    let dir = OpenOptions::new()
        .read(true)
        .custom_flags((OFlag::O_NOFOLLOW | OFlag::O_DIRECTORY).bits())
        .open(path)?;
    if let Some((uid, gid)) = account {
        fchown(&dir, Some(uid), Some(gid))?;
    }
    dir.set_permissions(fs::Permissions::from_mode(mode))
}

/// Opens `path` with `options`, failing on a link at its last component.
fn open_no_follow(path: &Path, options: &mut OpenOptions) -> io::Result<File> {
    options.custom_flags(OFlag::O_NOFOLLOW.bits()).open(path)
}

/// A regular file with a single name: a hard link to someone else's file has two.
fn plain_file(meta: &fs::Metadata) -> bool {
    meta.file_type().is_file() && meta.nlink() == 1
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::symlink;

    use super::*;

    /// A folder of this test's own, removed when dropped.
    struct Folder(PathBuf);

    impl Folder {
        fn new(name: &str) -> Folder {
            let path =
                std::env::temp_dir().join(format!("pgwake-private-{name}-{}", std::process::id()));
            let _ = fs::remove_dir_all(&path);
            fs::create_dir(&path).unwrap();
            fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
            Folder(path)
        }
    }

    impl Drop for Folder {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn a_replaced_file_never_reaches_a_link_planted_at_any_name_beside_it() {
        let dir = Folder::new("replace");
        let victim = dir.0.join("victim");
        fs::write(&victim, "precious").unwrap();
        let path = dir.0.join("runs.json");
        // Every name a writer could be expected to use.
        symlink(&victim, dir.0.join("runs.json.tmp")).unwrap();
        symlink(&victim, &path).unwrap();
        replace(&path, b"{}").unwrap();
        assert_eq!(fs::read_to_string(&victim).unwrap(), "precious");
        assert_eq!(fs::read_to_string(&path).unwrap(), "{}");
        assert!(
            !fs::symlink_metadata(&path)
                .unwrap()
                .file_type()
                .is_symlink()
        );
        let mode = fs::metadata(&path).unwrap().mode() & 0o777;
        assert_eq!(mode, 0o600);
        // No temporary file is left behind.
        let left: Vec<_> = fs::read_dir(&dir.0)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n.ends_with(".tmp") && n.starts_with('.'))
            .collect();
        assert!(left.is_empty(), "{left:?}");
    }

    #[test]
    fn reads_refuse_links_and_files_over_the_limit() {
        let dir = Folder::new("read");
        let victim = dir.0.join("victim");
        fs::write(&victim, "secret").unwrap();
        let link = dir.0.join("link");
        symlink(&victim, &link).unwrap();
        assert!(read_at_most(&link, 100).is_err());
        assert!(read_tail(&link, 100).is_empty());
        assert_eq!(read_at_most(&victim, 100).unwrap().unwrap(), b"secret");
        assert!(read_at_most(&victim, 3).is_err());
        assert!(read_at_most(&dir.0.join("none"), 3).unwrap().is_none());
        assert_eq!(read_tail(&victim, 3), b"ret");
        // A second name for a file (a hard link) is not a plain file of one's own either.
        fs::hard_link(&victim, dir.0.join("second")).unwrap();
        assert!(read_tail(&victim, 100).is_empty());
    }

    #[test]
    fn appending_replaces_a_planted_link_instead_of_following_it() {
        let dir = Folder::new("append");
        let victim = dir.0.join("victim");
        fs::write(&victim, "precious").unwrap();
        let log = dir.0.join("postgres.log");
        symlink(&victim, &log).unwrap();
        let mut file = append_for(&log, None).unwrap();
        file.write_all(b"line\n").unwrap();
        assert_eq!(fs::read_to_string(&victim).unwrap(), "precious");
        assert_eq!(fs::read_to_string(&log).unwrap(), "line\n");
        // The file now there is used as it is.
        append_for(&log, None)
            .unwrap()
            .write_all(b"more\n")
            .unwrap();
        assert_eq!(fs::read_to_string(&log).unwrap(), "line\nmore\n");
        let conf = dir.0.join("postgresql.conf");
        symlink(&victim, &conf).unwrap();
        assert!(append_existing(&conf, None).is_err());
        assert!(create_for(&conf, None, b"x").is_err());
        assert_eq!(fs::read_to_string(&victim).unwrap(), "precious");
    }

    #[test]
    fn a_folder_others_can_write_is_not_private() {
        let dir = Folder::new("check");
        check_private_dir(&dir.0).unwrap();
        let open = dir.0.join("open");
        fs::create_dir(&open).unwrap();
        fs::set_permissions(&open, fs::Permissions::from_mode(0o777)).unwrap();
        let inner = open.join("inner");
        fs::create_dir(&inner).unwrap();
        fs::set_permissions(&inner, fs::Permissions::from_mode(0o755)).unwrap();
        assert!(check_private_dir(&open).is_err());
        // A folder inside one that others may rename things in is not private either…
        assert!(check_private_dir(&inner).is_err());
        // …unless the sticky bit keeps others from renaming what is not theirs (as /tmp).
        fs::set_permissions(&open, fs::Permissions::from_mode(0o1777)).unwrap();
        check_private_dir(&inner).unwrap();
        let link = dir.0.join("link");
        symlink(&inner, &link).unwrap();
        assert!(check_private_dir(&link).is_err());
    }
}
