# Loopback port helpers for the bench scripts (sourced, not run).

# True when nothing accepts connections on 127.0.0.1:$1.
port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# A port nothing listens on now, between 20000 and 39999.
pick_port() {
  local p
  while :; do p=$((20000 + RANDOM % 20000)); port_free "$p" && { echo "$p"; return; }; done
}

# Waits up to ${2:-10} seconds for something to listen on port $1; exits the script otherwise.
wait_port() {
  local tries=$(( ${2:-10} * 10 ))
  for _ in $(seq "$tries"); do port_free "$1" || return 0; sleep 0.1; done
  echo "nothing listens on $1" >&2; exit 1
}
