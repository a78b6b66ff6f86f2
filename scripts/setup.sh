#!/usr/bin/env bash
# setup.sh: install what cairn needs on a Debian 12 machine, idempotently.
#
#   - runc, iptables, iproute2, build tools, zstd and curl (the metrics test
#     scrapes as docs/cluster.md shows) from Debian 12;
#   - Open MPI 4.1 and MPICH 4.0 from Debian 12 (cairn run --mpi, the MPI tests);
#   - Chromium and ChromeDriver from Debian 12 (the dashboard's browser test);
#   - CRIU 4.2 or newer, built from Debian unstable's source (Debian 12's own
#     criu 3.17 fails `criu check` on kernels >= 6.13, and 4.1 cannot dump
#     TCP sockets on kernels >= 6.16), installed as $CAIRN_PREFIX/bin/criu;
#   - libcairn (C, with Fortran interfaces) and the Python module of the rank
#     API (docs/rank-api.md), installed under $CAIRN_PREFIX;
#   - SeaweedFS's weed, the S3 server of the durable tier's tests, built from
#     its Go module into $CAIRN_PREFIX/bin;
#   - Go module dependencies.
#
# A second run only checks and takes seconds. Nothing in the system's own apt
# sources is changed: unstable is reached through a private apt configuration.
set -euo pipefail

PREFIX=${CAIRN_PREFIX:-/opt/cairn}
CACHE=${CAIRN_CACHE:-/var/cache/cairn}
here=$(cd "$(dirname "$0")/.." && pwd)

log() { printf '\033[1msetup:\033[0m %s\n' "$*" >&2; }
die() { printf 'setup: error: %s\n' "$*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "run as root (cairn needs namespaces, runc and CRIU)"
export DEBIAN_FRONTEND=noninteractive

# --- Debian 12 packages ------------------------------------------------------
pkgs=(runc iptables iproute2 kmod procps psmisc zstd curl ca-certificates xz-utils
      build-essential pkg-config protobuf-c-compiler libprotobuf-c-dev
      protobuf-compiler libprotobuf-dev python3-protobuf libnl-3-dev libnet1-dev libcap-dev
      libbsd-dev libnftables-dev libgnutls28-dev uuid-dev libaio-dev dpkg-dev
      openmpi-bin libopenmpi-dev mpich libmpich-dev python3-mpi4py gfortran
      chromium chromium-driver fonts-liberation
      slurm-wlm munge
      systemd python3-pip python3-setuptools python3-wheel libcap2-bin)
missing=()
for p in "${pkgs[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
	log "installing ${missing[*]}"
	apt-get update -qq
	# munge and slurm-wlm bring daemons the tests start with their own
	# configuration when they need them: none is started on install.
	norc=
	if [ ! -e /usr/sbin/policy-rc.d ]; then
		printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod 755 /usr/sbin/policy-rc.d && norc=1
		trap 'rm -f /usr/sbin/policy-rc.d' EXIT
	fi
	apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
	if [ -n "$norc" ]; then rm -f /usr/sbin/policy-rc.d; trap - EXIT; fi
fi

# --- CRIU >= 4.2 (scripts/install-criu.sh, also shipped in the package) -------
CAIRN_PREFIX=$PREFIX CAIRN_CACHE=$CACHE "$here/scripts/install-criu.sh"

# --- The MPICH finalize fix (deploy/mpich, docs/mpi.md) -----------------------
fix_src="$here/deploy/mpich/cairn-mpich-finalize.c"
fix_lib="$PREFIX/lib/libcairn-mpich-finalize.so"
if [ -f "$fix_src" ] && { [ ! -f "$fix_lib" ] || [ "$fix_src" -nt "$fix_lib" ]; }; then
	log "building $fix_lib"
	mkdir -p "$PREFIX/lib"
	cc -O2 -Wall -shared -fPIC -o "$fix_lib.tmp" "$fix_src" -ldl
	mv "$fix_lib.tmp" "$fix_lib"
fi

# --- The rank API's clients (deploy/libcairn, deploy/python, docs/rank-api.md) ---
# stale TARGET SRC...: TARGET is missing or older than one of SRC.
stale() {
	local target=$1; shift
	[ -f "$target" ] || return 0
	for src; do [ "$src" -nt "$target" ] && return 0; done
	return 1
}
lib_src="$here/deploy/libcairn"
lib_files=("$lib_src/cairn.c" "$lib_src/cairn.h" "$lib_src/cairn.f90" "$lib_src/cairn.pc.in" "$lib_src/Makefile")
if [ -f "$lib_src/cairn.c" ] && { stale "$PREFIX/lib/libcairn.so" "${lib_files[@]}" || stale "$PREFIX/lib/libcairn.a" "${lib_files[@]}" ||
	stale "$PREFIX/include/cairn.h" "${lib_files[@]}" || stale "$PREFIX/include/cairn.f90" "${lib_files[@]}" ||
	stale "$PREFIX/lib/pkgconfig/cairn.pc" "${lib_files[@]}"; }; then
	log "building libcairn into $PREFIX/lib and $PREFIX/include"
	make -s -C "$lib_src" BUILD="$CACHE/libcairn" PREFIX="$PREFIX" install
fi
py_src="$here/deploy/python/cairn.py"
if [ -f "$py_src" ] && stale "$PREFIX/python/cairn.py" "$py_src"; then
	log "installing $PREFIX/python/cairn.py"
	install -D -m 0644 "$py_src" "$PREFIX/python/cairn.py"
fi

# --- Go ----------------------------------------------------------------------------
# go.mod names the Go release; a go command of 1.21 or newer fetches it from
# the module proxy by itself (GOTOOLCHAIN=auto).
command -v go >/dev/null || die "no Go toolchain on PATH: install Go 1.21 or newer (go.mod's release is then fetched automatically)"
if [ -f "$here/go.mod" ]; then
	(cd "$here" && go mod download)
fi
# SeaweedFS's weed: the real S3-compatible server the durable tier's tests
# start (internal/testutil.NewS3Server), built from its Go module (a module
# with replace directives cannot be go-installed by version: it is built in
# the module cache's copy). Nothing starts it but the tests that need it.
weed_version=v0.0.0-20261109003541-7506e5f91cd6
weed_bin="$PREFIX/bin/weed"
if [ "$(cat "$weed_bin.version" 2>/dev/null)" != "$weed_version" ] || [ ! -x "$weed_bin" ]; then
	log "building SeaweedFS $weed_version (the S3 server of the tests) into $weed_bin; a few minutes, once"
	weed_dir=$(go mod download -json "github.com/seaweedfs/seaweedfs@$weed_version" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
	[ -d "$weed_dir/weed" ] || die "could not download github.com/seaweedfs/seaweedfs@$weed_version"
	mkdir -p "$PREFIX/bin"
	(cd "$weed_dir/weed" && GOFLAGS=-mod=mod go build -o "$weed_bin.tmp" .)
	mv "$weed_bin.tmp" "$weed_bin"
	echo "$weed_version" > "$weed_bin.version"
fi
# The rules and dashboard check is a module of its own (Prometheus's parsers).
if [ -f "$here/deploy/prometheus/check/go.mod" ]; then
	(cd "$here/deploy/prometheus/check" && go mod download)
fi
log "ready"
