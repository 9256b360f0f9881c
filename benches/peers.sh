#!/usr/bin/env bash
# Builds the peer poolers the harness stands pgwake beside, pgcat and PgDog, from their public
# source at pinned commits, in release mode, outside this repository. Built binaries are cached:
# a second run with the same pins does nothing.
#
#   bash benches/peers.sh [pgcat|pgdog|all]     (default all)
#
# Sources: the script never downloads a repository itself. PGWAKE_PEERS_GIT names a folder that
# holds git repositories (bare or cloned) of postgresml/pgcat, pgdogdev/pgdog and pgdogdev/scram,
# each found as OWNER+NAME/repo (the layout of a `fetch` snapshot), NAME or NAME.git. The
# pinned commits below must be in them. Crates come from crates.io through cargo as usual.
#
# Output: $PGWAKE_PEERS_DIR (default ~/.cache/pgwake/peers) holds src/ (exported trees), target/
# (their cargo build folders) and bin/pgcat, bin/pgdog, each with a .pin file saying what it
# was built from. The harness looks for the binaries there (or PGWAKE_BENCH_PGCAT,
# PGWAKE_BENCH_PGDOG).
#
# PgDog pins two git dependencies. scram is taken from the local repository through a [patch]
# in a cargo config written into the exported tree (never into this repository). pg_raw_parse,
# its SQL parser, carries libpg_query as a git submodule; the crates.io package pg_raw_parse
# 0.1.0 is the same source with the submodule included, so the [patch] points there. PgDog's own
# toolchain pin, linker choice (clang + mold) and file are replaced by the machine's stable
# toolchain and default linker; its `tokio_unstable` flag and release profile (fat LTO, one
# codegen unit) are kept, so the binary is built as PgDog ships it.
#
# PgDog at the pinned commit does not build with these stand-ins (checked 2026-11-27): it calls
# `pg_raw_parse::postgres_version` and `MemoryToken::parse`, which pg_raw_parse 0.1.0 lacks, and
# `scram::PasswordInfo::from_stored_keys`, which scram's master lacks; the pinned commits of both
# (scram 053e108, pg_raw_parse 6870860 with its libpg_query) were not available. The script then
# fails with cargo's errors and the harness skips PgDog, saying its binary is missing.
#
# Heavy: a cold build of both takes tens of minutes on two cores; it runs under `nice -n 10`.
# Needs git, a C compiler and libclang (bindgen): `apt-get install -y libclang-dev`.
set -euo pipefail

which_peers="${1:-all}"
case "$which_peers" in pgcat | pgdog | all) ;; *)
  echo "usage: $0 [pgcat|pgdog|all]" >&2
  exit 2
  ;;
esac

# Pins: the newest commits available when the harness was last checked against them.
pgcat_commit=5b038813eb14f181434ab7b5509e74d9b1fe123b # pgcat 1.3.0
pgdog_commit=b4601264e6bd8caee64c984d3c69648d8e542a7a # PgDog 0.1.54
# PgDog pins scram 053e108; the newest scram commit at hand is its master of 2026-04-10.
scram_commit=90c511f703d2856dddd029ea062239c3132f902d
pg_raw_parse_version=0.1.0

peers_dir="${PGWAKE_PEERS_DIR:-$HOME/.cache/pgwake/peers}"
git_root="${PGWAKE_PEERS_GIT:-}"
mkdir -p "$peers_dir/src" "$peers_dir/target" "$peers_dir/bin"

log() { echo "peers.sh: $*" >&2; }

# The git directory of OWNER/NAME under PGWAKE_PEERS_GIT.
git_dir() {
  local owner="${1%/*}" name="${1#*/}" candidate
  if [ -z "$git_root" ]; then
    log "PGWAKE_PEERS_GIT is not set: it must name a folder holding git repositories of $1 and the others"
    return 1
  fi
  for candidate in "$git_root/$owner+$name/repo" "$git_root/$name" "$git_root/$name.git"; do
    if git --git-dir="$candidate" rev-parse --git-dir >/dev/null 2>&1 ||
      git -C "$candidate" rev-parse --git-dir >/dev/null 2>&1; then
      echo "$candidate"
      return 0
    fi
  done
  log "no git repository of $1 under $git_root (looked for $owner+$name/repo, $name, $name.git)"
  return 1
}

# Exports COMMIT of OWNER/NAME into src/NAME-COMMIT (once) and prints that folder.
export_tree() {
  local repo="$1" commit="$2" dir gd
  dir="$peers_dir/src/${repo#*/}-${commit:0:12}"
  if [ ! -f "$dir/.exported" ]; then
    gd="$(git_dir "$repo")" || return 1
    rm -rf "$dir"
    mkdir -p "$dir"
    if ! git --git-dir="$gd" cat-file -e "$commit^{commit}" 2>/dev/null &&
      ! git -C "$gd" cat-file -e "$commit^{commit}" 2>/dev/null; then
      log "$repo has no commit $commit in $gd"
      return 1
    fi
    { git --git-dir="$gd" archive "$commit" 2>/dev/null || git -C "$gd" archive "$commit"; } |
      tar -x -C "$dir"
    touch "$dir/.exported"
  fi
  echo "$dir"
}

# True when bin/NAME exists and was built from exactly PIN.
cached() {
  [ -x "$peers_dir/bin/$1" ] && [ -f "$peers_dir/bin/$1.pin" ] &&
    [ "$(cat "$peers_dir/bin/$1.pin")" = "$2" ]
}

build_pgcat() {
  local pin="pgcat $pgcat_commit"
  if cached pgcat "$pin"; then
    log "pgcat is built ($pin)"
    return 0
  fi
  local src
  src="$(export_tree postgresml/pgcat "$pgcat_commit")" || return 1
  log "building pgcat in $src"
  # Checked explicitly: `set -e` does not apply inside a function called as `f || …`.
  if ! (cd "$src" && CARGO_TARGET_DIR="$peers_dir/target/pgcat" nice -n 10 \
    cargo build --release --locked --bin pgcat); then
    return 1
  fi
  cp "$peers_dir/target/pgcat/release/pgcat" "$peers_dir/bin/pgcat.new" || return 1
  mv "$peers_dir/bin/pgcat.new" "$peers_dir/bin/pgcat"
  echo "$pin" >"$peers_dir/bin/pgcat.pin"
  log "pgcat: $peers_dir/bin/pgcat"
}

build_pgdog() {
  local pin="pgdog $pgdog_commit scram $scram_commit pg_raw_parse $pg_raw_parse_version"
  if cached pgdog "$pin"; then
    log "pgdog is built ($pin)"
    return 0
  fi
  if ! ldconfig -p 2>/dev/null | grep -q 'libclang[-.0-9]*\.so' &&
    ! ls /usr/lib/llvm-*/lib/libclang.so* >/dev/null 2>&1; then
    log "PgDog's build runs bindgen, which needs libclang: apt-get install -y libclang-dev"
    return 1
  fi
  local src scram
  src="$(export_tree pgdogdev/pgdog "$pgdog_commit")" || return 1
  scram="$(export_tree pgdogdev/scram "$scram_commit")" || return 1
  # Our cargo config replaces theirs (which names clang and mold as the linker).
  rm -f "$src/rust-toolchain.toml"
  mkdir -p "$src/.cargo"
  cat >"$src/.cargo/config.toml" <<EOF
# Written by pgwake's benches/peers.sh: PgDog's flags without its linker choice, and its two
# git dependencies pointed at local copies.
[target.'cfg(all())']
rustflags = ["--cfg", "tokio_unstable"]

[patch."https://github.com/pgdogdev/scram.git"]
scram = { path = "$scram" }

[patch."https://github.com/pgdogdev/pg_raw_parse.git"]
pg_raw_parse = { version = "=$pg_raw_parse_version" }
EOF
  log "building pgdog in $src"
  if ! (cd "$src" && RUSTUP_TOOLCHAIN="${PGWAKE_PEERS_TOOLCHAIN:-stable}" \
    CARGO_TARGET_DIR="$peers_dir/target/pgdog" nice -n 10 \
    cargo build --release -p pgdog --bin pgdog); then
    return 1
  fi
  cp "$peers_dir/target/pgdog/release/pgdog" "$peers_dir/bin/pgdog.new" || return 1
  mv "$peers_dir/bin/pgdog.new" "$peers_dir/bin/pgdog"
  echo "$pin" >"$peers_dir/bin/pgdog.pin"
  log "pgdog: $peers_dir/bin/pgdog"
}

status=0
if [ "$which_peers" != pgdog ]; then build_pgcat || { log "pgcat did not build"; status=1; }; fi
if [ "$which_peers" != pgcat ]; then build_pgdog || { log "pgdog did not build"; status=1; }; fi
exit "$status"
