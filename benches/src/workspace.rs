//! The workspace the harness belongs to: where it is, the cargo that built the harness, and the
//! target directory its builds go to.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, anyhow, bail};

/// Where this workspace is: the bench crate's parent folder.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("benches/ has a parent")
        .to_path_buf()
}

pub(crate) fn cargo() -> Command {
    // `cargo run` sets CARGO to the cargo that built us; use the same one.
    let mut cmd = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    cmd.current_dir(workspace_root());
    // `cargo run` also describes this package in CARGO_PKG_*, CARGO_MANIFEST_* and the like.
    // Build scripts watch some of them (ring's does), so a nested build that inherits them
    // rebuilds ring and everything above it, and the next `cargo run` rebuilds them back.
    for (key, _) in std::env::vars_os() {
        let key_text = key.to_string_lossy();
        if key_text.starts_with("CARGO_PKG_")
            || key_text.starts_with("CARGO_MANIFEST_")
            || [
                "CARGO_CRATE_NAME",
                "CARGO_BIN_NAME",
                "CARGO_PRIMARY_PACKAGE",
            ]
            .contains(&key_text.as_ref())
        {
            cmd.env_remove(key);
        }
    }
    cmd
}

/// The cargo target directory: `CARGO_TARGET_DIR`, else what `cargo metadata` says.
pub(crate) fn target_dir() -> Result<PathBuf> {
    if let Some(dir) = std::env::var_os("CARGO_TARGET_DIR") {
        // Cargo reads a relative CARGO_TARGET_DIR against the directory it was started in.
        return std::path::absolute(dir).context("resolve CARGO_TARGET_DIR");
    }
    let out = cargo()
        .args(["metadata", "--format-version", "1", "--no-deps"])
        .output()
        .context("run cargo metadata")?;
    if !out.status.success() {
        bail!(
            "cargo metadata failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let meta: serde_json::Value =
        serde_json::from_slice(&out.stdout).context("parse cargo metadata")?;
    meta["target_directory"]
        .as_str()
        .map(PathBuf::from)
        .ok_or_else(|| anyhow!("cargo metadata has no target_directory"))
}
