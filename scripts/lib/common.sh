# Shared helpers of margay's scripts. Source it; it changes nothing by itself.

# The repository root.
MARGAY_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)

log() { printf '==> %s\n' "$*" >&2; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

need_root() {
  [ "$(id -u)" = 0 ] || die "run this as root: it creates network namespaces, sockets under /run and installs packages"
}

# Installs the Debian packages given that are not installed yet; runs apt-get update only
# when something is missing, so repeated runs cost nothing.
apt_install() {
  local missing=()
  for pkg in "$@"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || missing+=("$pkg")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  log "installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# BIRD 2 conflicts with BIRD 1.6 (the package `bird`), so it is unpacked, not installed: the
# interop tests run /var/cache/margay/bird2/usr/sbin/bird.
fetch_bird2() {
  local dir=/var/cache/margay/bird2
  [ -x "$dir/usr/sbin/bird" ] && return 0
  log "unpacking bird2 into $dir"
  local tmp; tmp=$(mktemp -d)
  apt-get update -qq
  (cd "$tmp" && apt-get download -qq bird2 >/dev/null)
  mkdir -p "$dir"
  dpkg -x "$tmp"/bird2_*.deb "$dir"
  rm -rf "$tmp"
}

# Where cargo puts the binaries of a profile (debug, release).
target_dir() { printf '%s/target/%s' "$MARGAY_ROOT" "$1"; }

# cargo with the project's build settings: two jobs, the committed lock file.
cargo_build() { cargo build -j2 --locked "$@"; }
