#!/usr/bin/env bash
# Unpacks packages of another Debian release beside this Debian 12 (bookworm) system, for the
# servers the tests need in versions bookworm does not ship (scripts/install-valkey.sh,
# scripts/install-redis6.sh). The release's package lists are added beside bookworm's, pinned low
# so that nothing installed is ever upgraded or downgraded from them (only `apt-get download`
# reads them, naming the release of each package); the packages are unpacked under PREFIX with
# `dpkg -x`: nothing of the system is installed or changed.
#
# usage: scripts/unpack-debian-packages.sh SUITE PREFIX PACKAGE… (as root)
set -euo pipefail
suite=$1 prefix=$2
shift 2
cat > "/etc/apt/sources.list.d/$suite-unpacked.sources" <<EOF
Types: deb
URIs: http://deb.debian.org/debian
Suites: $suite
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
cat > "/etc/apt/preferences.d/$suite-unpacked" <<EOF
Package: *
Pin: release n=$suite
Pin-Priority: 1
EOF
apt-get update -qq
work=$(mktemp -d); chmod a+rwx "$work"  # apt downloads as _apt
(cd "$work" && apt-get download -qq "${@/%//$suite}")
rm -rf "$prefix"; mkdir -p "$prefix"
for deb in "$work"/*.deb; do dpkg -x "$deb" "$prefix"; done
rm -rf "$work"
