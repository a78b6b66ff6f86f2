#!/usr/bin/env bash
# install-criu: build CRIU 4.2 or newer from Debian unstable's source and
# install it as $CAIRN_PREFIX/bin/criu (default /opt/cairn/bin/criu, where
# cairn looks first), on a Debian 12 machine; idempotent. Debian 12's own
# criu 3.17 fails `criu check` on kernels >= 6.13, and 4.1 cannot dump TCP
# sockets on kernels >= 6.16.
#
# `make setup` runs it from cairn's source; the cairn package ships it as
# /usr/share/cairn/install-criu (docs/operations.md). Nothing in the
# system's own apt sources is changed: unstable is reached through a private
# apt configuration, and only its source package of CRIU is read.
set -euo pipefail

PREFIX=${CAIRN_PREFIX:-/opt/cairn}
CACHE=${CAIRN_CACHE:-/var/cache/cairn}
MIN_CRIU=40200   # 4.2.0

log() { printf '\033[1minstall-criu:\033[0m %s\n' "$*" >&2; }
die() { printf 'install-criu: error: %s\n' "$*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "run as root"
export DEBIAN_FRONTEND=noninteractive

# CRIU's build dependencies, from Debian 12.
deps=(build-essential pkg-config protobuf-c-compiler libprotobuf-c-dev protobuf-compiler
      libprotobuf-dev python3-protobuf libnl-3-dev libnet1-dev libcap-dev libbsd-dev
      libnftables-dev libgnutls28-dev uuid-dev libaio-dev dpkg-dev xz-utils debian-archive-keyring)

criu_version() { # prints e.g. 40201 for "Version: 4.2.1"
	"$1" --version 2>/dev/null | awk '/^Version:/ { split($2, v, "."); printf "%d%02d%02d\n", v[1], v[2], v[3] }'
}
criu_ok() {
	[ -x "$PREFIX/bin/criu" ] || return 1
	local v; v=$(criu_version "$PREFIX/bin/criu"); [ -n "$v" ] && [ "$v" -ge $MIN_CRIU ] || return 1
	"$PREFIX/bin/criu" check >/dev/null 2>&1
}

if criu_ok; then
	log "CRIU $("$PREFIX/bin/criu" --version | awk '/^Version:/{print $2}') at $PREFIX/bin/criu: ok"
else
	missing=()
	for p in "${deps[@]}"; do
		dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
	done
	if [ ${#missing[@]} -gt 0 ]; then
		log "installing CRIU's build dependencies: ${missing[*]}"
		apt-get update -qq
		apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
	fi
	log "building CRIU >= 4.2 from Debian unstable's source (about 2 minutes)"
	apt_dir=$CACHE/apt
	mkdir -p "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial" "$CACHE/src"
	# The mirror is whatever this machine already uses for Debian 12.
	mirror=$(awk '/^URIs:/ { print $2; exit }' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
	[ -n "$mirror" ] || mirror=$(awk '$1 == "deb" && $0 !~ /security/ { print $2; exit }' /etc/apt/sources.list 2>/dev/null || true)
	[ -n "$mirror" ] || die "cannot find the Debian mirror in /etc/apt/sources.list{,.d/debian.sources}"
	keyring=/usr/share/keyrings/debian-archive-keyring.gpg
	cat >"$apt_dir/sources.list" <<SRC
deb [signed-by=$keyring] $mirror unstable main
deb-src [signed-by=$keyring] $mirror unstable main
SRC
	aptopts=(-o "Dir::Etc::SourceList=$apt_dir/sources.list" -o Dir::Etc::SourceParts=/dev/null
	         -o "Dir::State::Lists=$apt_dir/lists" -o "Dir::Cache=$apt_dir/cache"
	         -o APT::Sandbox::User=root)
	apt-get "${aptopts[@]}" update -qq
	cd "$CACHE/src"
	rm -f criu_*.orig.tar.* criu_*.dsc
	# The .debian.tar.xz may not be served, so apt-get exits non-zero even when
	# the orig tarball came: check for the tarball instead of the exit code.
	apt-get "${aptopts[@]}" source --download-only criu >/dev/null 2>&1 || true
	tarball=$(ls -1 criu_*.orig.tar.* 2>/dev/null | sort -V | tail -n1 || true)
	[ -n "$tarball" ] || die "could not download CRIU's source from Debian unstable"
	ver=${tarball#criu_}; ver=${ver%%.orig.tar.*}
	# apt-get source checks the tarball against the signed .dsc; check again.
	dsc=$(ls -1 criu_*.dsc 2>/dev/null | tail -n1 || true)
	if [ -n "$dsc" ]; then
		want=$(awk -v f="$tarball" '/^Checksums-Sha256:/ {s=1; next} s && $3 == f { print $1; exit }' "$dsc")
		got=$(sha256sum "$tarball" | awk '{print $1}')
		[ -z "$want" ] || [ "$want" = "$got" ] || die "checksum mismatch for $tarball"
	fi
	rm -rf "criu-$ver"
	tar xf "$tarball"
	log "compiling CRIU $ver"
	make -C "criu-$ver" -j"$(nproc)" criu >"$CACHE/src/criu-build.log" 2>&1 || die "CRIU build failed; see $CACHE/src/criu-build.log"
	install -D -m 0755 "criu-$ver/criu/criu" "$PREFIX/bin/criu"
	rm -rf "criu-$ver"
	criu_ok || die "CRIU $ver built but '$PREFIX/bin/criu check' fails"
	log "CRIU $ver installed at $PREFIX/bin/criu"
fi

