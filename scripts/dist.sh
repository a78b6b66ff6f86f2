#!/usr/bin/env bash
# dist.sh: make a release of cairn in $DIST (default dist/):
#
#   cairn-VERSION-linux-ARCH.tar.gz  a static bin/cairn, libcairn (lib/,
#                                    include/, lib/pkgconfig/cairn.pc for
#                                    /usr/local), the Python client
#                                    (python/, pip-installable), the systemd
#                                    units and their environment files,
#                                    the Prometheus rules, the Grafana
#                                    dashboard, install-criu and the docs;
#   cairn_DEBVERSION_ARCH.deb        the same laid out for Debian 12: units
#                                    in /lib/systemd/system, configuration
#                                    in /etc/cairn (conffiles), the client
#                                    for Debian's python3, libcairn in the
#                                    multiarch directory, docs and man pages
#                                    in /usr/share;
#   SHA256SUMS                       both, as sha256sum -c reads them.
#
# VERSION is the newest tag (git describe), as `make build` stamps it. CRIU
# is not in the package: Debian 12's is too old and CRIU is GPL-2.0; the
# package ships /usr/share/cairn/install-criu, which builds it as
# `make setup` does, and `cairn check` says so when CRIU is missing.
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
DIST=${DIST:-$here/dist}
GO=${GO:-go}
VERSION=${VERSION:-$(git describe --tags --match 'v[0-9]*' --dirty 2>/dev/null || echo v0.0.0-dev)}
REV=${REV:-$(git rev-parse --short=12 HEAD 2>/dev/null || true)}
MOD=$($GO list -m)
ARCH=$(dpkg --print-architecture)
MULTIARCH=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || echo x86_64-linux-gnu)
GOARCH=$($GO env GOARCH)

log() { printf '\033[1mdist:\033[0m %s\n' "$*" >&2; }
die() { printf 'dist: error: %s\n' "$*" >&2; exit 1; }

# v0.9.0 -> 0.9.0; v0.9.0-3-gabcdef012345-dirty -> 0.9.0+3.gabcdef012345.dirty
# (a build after a tag sorts after it, as dpkg compares versions).
debver=${VERSION#v}
case $debver in
*-*) debver="${debver%%-*}+$(echo "${debver#*-}" | tr - .)" ;;
esac
pyver=${debver%%+*}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$DIST"

log "building cairn $VERSION ($REV), static"
CGO_ENABLED=0 GOOS=linux GOARCH=$GOARCH $GO build -trimpath \
	-ldflags "-s -w -X $MOD/internal/version.Version=$VERSION -X $MOD/internal/version.Revision=$REV" \
	-o "$work/cairn" ./cmd/cairn
if ldd "$work/cairn" >/dev/null 2>&1; then die "bin/cairn is dynamically linked"; fi
"$work/cairn" version | grep -qF "cairn $VERSION" || die "the binary does not say it is $VERSION: $("$work/cairn" version)"

log "building libcairn"
make -s -C deploy/libcairn BUILD="$work/libcairn" all >/dev/null

# common ROOT: what both layouts hold, in ROOT's subdirectories named by
# the remaining arguments: BIN LIB INCLUDE PYTHON SHARE DOC MAN, and the
# prefix cairn.pc names.
common() {
	local root=$1 bin=$2 lib=$3 include=$4 python=$5 share=$6 doc=$7 man=$8 prefix=$9 libdir=${10} includedir=${11}
	install -D -m 0755 "$work/cairn" "$root/$bin/cairn"
	make -s -C deploy/libcairn BUILD="$work/libcairn" DESTDIR="$root" PREFIX="$prefix" LIBDIR="$libdir" \
		INCLUDEDIR="$includedir" VERSION="$pyver" install >/dev/null
	install -d "$root/$python"
	sed "s/^__version__ = .*/__version__ = \"$pyver\"/" deploy/python/cairn.py >"$root/$python/cairn.py"
	chmod 0644 "$root/$python/cairn.py"
	install -D -m 0755 scripts/install-criu.sh "$root/$share/install-criu"
	install -D -m 0644 deploy/prometheus/cairn-rules.yml "$root/$share/prometheus/cairn-rules.yml"
	install -D -m 0644 deploy/grafana/cairn.json "$root/$share/grafana/cairn.json"
	install -D -m 0644 deploy/slurm/cairn.sbatch "$root/$share/slurm/cairn.sbatch"
	install -d "$root/$doc"
	install -m 0644 README.md CHANGELOG.md docs/*.md "$root/$doc/"
	install -d "$root/$man"
	"$work/cairn" man-pages "$root/$man"
	install -d "$root/$share/completions"
	"$work/cairn" completion bash >"$root/$share/completions/cairn.bash"
}

# --- the tarball ------------------------------------------------------------------
name=cairn-$VERSION-linux-$ARCH
t=$work/$name
common "$t" bin lib include python share/cairn share/doc/cairn share/man/man1 /usr/local /usr/local/lib /usr/local/include
install -m 0644 deploy/python/pyproject.toml deploy/python/README.md "$t/python/"
install -D -m 0644 deploy/systemd/*.service deploy/systemd/*.env -t "$t/systemd/"
install -m 0644 LICENSE README.md "$t/"
tar -C "$work" --owner=0 --group=0 --numeric-owner --sort=name --mtime="@$(git log -1 --format=%ct 2>/dev/null || date +%s)" \
	-czf "$DIST/$name.tar.gz" "$name"
log "$DIST/$name.tar.gz"

# --- the .deb ---------------------------------------------------------------------
d=$work/deb
common "$d" usr/bin "usr/lib/$MULTIARCH" usr/include usr/lib/python3/dist-packages usr/share/cairn usr/share/doc/cairn \
	usr/share/man/man1 /usr "/usr/lib/$MULTIARCH" /usr/include
gzip -9n "$d"/usr/share/man/man1/*.1
mv "$d/usr/share/cairn/completions/cairn.bash" "$d/usr/share/cairn/completions/cairn"
install -d "$d/usr/share/bash-completion/completions"
mv "$d/usr/share/cairn/completions/cairn" "$d/usr/share/bash-completion/completions/cairn"
rmdir "$d/usr/share/cairn/completions"
install -D -m 0644 deploy/systemd/*.service -t "$d/lib/systemd/system/"
install -D -m 0644 deploy/systemd/agent.env "$d/etc/cairn/agent.env"
install -D -m 0644 deploy/systemd/coordinator.env "$d/etc/cairn/coordinator.env"
{
	echo "Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/"
	echo "Upstream-Name: cairn"
	echo "Source: https://$MOD"
	echo
	echo "Files: *"
	echo "License: Apache-2.0"
	echo " On Debian systems the full text of the Apache License 2.0 is in"
	echo " /usr/share/common-licenses/Apache-2.0."
} >"$d/usr/share/doc/cairn/copyright"
install -d "$d/DEBIAN"
cat >"$d/DEBIAN/control" <<EOF
Package: cairn
Version: $debver
Architecture: $ARCH
Maintainer: cairn developers <cairn@localhost>
Installed-Size: $(du -sk "$d" | cut -f1)
Depends: runc, iproute2, iptables, adduser
Recommends: openmpi-bin | mpich
Suggests: prometheus, slurm-wlm
Section: admin
Priority: optional
Homepage: https://$MOD
Description: fault tolerance for long-running distributed jobs
 cairn runs every rank of a job (MPI simulations, multi-process services,
 training runs) in a lightweight Linux container and makes the whole job
 survive node failures: consistent global checkpoints (CRIU) kept on the
 nodes with peer redundancy, restart anywhere, live migration.
 .
 CRIU 4.2 or newer is needed and not packaged: run
 /usr/share/cairn/install-criu once (it builds CRIU into /opt/cairn/bin),
 then "cairn check". See /usr/share/doc/cairn/operations.md.
EOF
printf '/etc/cairn/agent.env\n/etc/cairn/coordinator.env\n' >"$d/DEBIAN/conffiles"
echo "activate-noawait ldconfig" >"$d/DEBIAN/triggers"
cat >"$d/DEBIAN/postinst" <<'EOF'
#!/bin/sh
# The coordinator runs as the system user cairn (cairn-coordinator.service);
# the agent runs as root. Neither unit is enabled or started: each needs its
# /etc/cairn/*.env and credentials first (docs/operations.md).
set -e
if [ "$1" = configure ]; then
	if ! getent passwd cairn >/dev/null; then
		adduser --system --group --no-create-home --home /var/lib/cairn/coordinator cairn >/dev/null
	fi
	if [ -d /run/systemd/system ]; then
		systemctl daemon-reload >/dev/null || true
	fi
fi
EOF
cat >"$d/DEBIAN/postrm" <<'EOF'
#!/bin/sh
set -e
if [ -d /run/systemd/system ]; then
	systemctl daemon-reload >/dev/null || true
fi
EOF
chmod 0755 "$d/DEBIAN/postinst" "$d/DEBIAN/postrm"
deb=cairn_${debver}_$ARCH.deb
dpkg-deb --root-owner-group -Zxz --build "$d" "$DIST/$deb" >/dev/null
log "$DIST/$deb"

(cd "$DIST" && sha256sum "$name.tar.gz" "$deb" >SHA256SUMS)
log "$DIST/SHA256SUMS"
