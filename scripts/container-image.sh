#!/usr/bin/env bash
# The image, built and run with podman where no image registry is reachable (docs/release.md
# "The image in CI"):
#   bases  makes the two base images from Debian's packages (debootstrap) and this machine's Rust
#          toolchain: localhost/ratelimit-builder-base (trixie, gcc, the toolchain, cargo-auditable)
#          and localhost/ratelimit-runtime-base (distroless-like: the loader, libc6, libgcc-s1, CA
#          certificates, user 65532). Cached as tarballs in target/container-bases/ (made once per
#          suite + toolchain + this script's base recipe; re-imported when the image is gone).
#   build  builds the Dockerfile users build, with those bases as RUST_IMAGE / RUNTIME_IMAGE, and
#          tags localhost/ratelimit-server:dev. Cargo's registry and target directory are BuildKit
#          cache mounts, kept on the host in target/container-cache/ (so a second build, or a CI
#          machine whose target/ is kept, compiles only what changed) and seeded from the host's
#          CARGO_HOME registry (nothing downloaded twice). PROFILE (env) passes another cargo
#          profile than `release` to the Dockerfile.
#   smoke  runs the image as Kubernetes would and gets decisions from it (scripts/container-smoke.sh).
#   all    bases, build, smoke.
# Needs root, podman, runc, debootstrap and /etc/containers/containers.conf (.ci/run sets them up).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD

SUITE=${SUITE:-trixie}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
# The Dockerfile's Rust (rust:1.95-trixie); else the machine's active toolchain, said loudly.
TOOLCHAIN=${TOOLCHAIN:-1.95.0}
if ! rustup run "$TOOLCHAIN" rustc -V >/dev/null 2>&1; then
  echo "[container-image] no toolchain $TOOLCHAIN here: the builder base gets the active one" >&2
  TOOLCHAIN=$(rustup show active-toolchain | cut -d' ' -f1)
fi
AUDITABLE_VERSION=0.7.7
BUILDER=localhost/ratelimit-builder-base
RUNTIME=localhost/ratelimit-runtime-base
IMAGE=${IMAGE:-localhost/ratelimit-server:dev}
bases_dir=${BASES_DIR:-$repo/target/container-bases}
cache_dir=${CACHE_DIR:-$repo/target/container-cache}

log() { echo "[container-image $(date -u +%H:%M:%S)] $*"; }

# The base recipe's identity: a change to the suite, the toolchain or this file makes new bases.
bases_key() {
  local rustc
  rustc=$(rustup run "$TOOLCHAIN" rustc -V)
  printf '%s\n' "$SUITE" "$rustc" "$AUDITABLE_VERSION" "$(sed -n '/^make_bases()/,/^}/p' "$0")" |
    sha256sum | cut -c1-16
}

make_bases() { # KEY
  local key=$1 work root rt toolchain
  mkdir -p "$bases_dir" && work=$(mktemp -d "$bases_dir/make.XXXXXX")
  root=$work/builder rt=$work/runtime
  log "debootstrap $SUITE (minbase + gcc, libc6-dev, ca-certificates) from $MIRROR"
  debootstrap --variant=minbase --include=gcc,libc6-dev,ca-certificates \
    "$SUITE" "$root" "$MIRROR" >"$work/debootstrap.log" 2>&1 ||
    { tail -20 "$work/debootstrap.log" >&2; return 1; }
  # The runtime: only the files of libc6 and libgcc-s1 (no docs, locales, gconv), the CA bundle,
  # the merged-/usr links, and distroless' users (root, nonroot 65532).
  log "runtime root from the builder's libc6, libgcc-s1 and CA bundle"
  mkdir -p "$rt"/{etc/ssl/certs,tmp,home/nonroot,usr}
  chmod 1777 "$rt/tmp"
  for l in bin lib lib64 sbin; do [ -L "$root/$l" ] && cp -a "$root/$l" "$rt/"; done
  chroot "$root" dpkg -L libc6 libgcc-s1 | grep -vE '^/usr/share|/gconv(/|$)|^/etc|^/\.$' |
    while read -r p; do
      # Resolve the directory inside the root (lib -> usr/lib), keep the file or link itself.
      local dir real
      dir=$(readlink -f "$root$(dirname "$p")") real="$dir/$(basename "$p")"
      [ -f "$real" ] || [ -L "$real" ] || continue
      mkdir -p "$rt${dir#"$root"}"
      cp -a "$real" "$rt${dir#"$root"}/"
    done
  cp "$root/etc/ssl/certs/ca-certificates.crt" "$rt/etc/ssl/certs/"
  printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >"$rt/etc/passwd"
  printf 'root:x:0:\nnonroot:x:65532:\n' >"$rt/etc/group"
  echo 'hosts: files dns' >"$rt/etc/nsswitch.conf"
  cp "$root/etc/os-release" "$rt/etc/os-release" 2>/dev/null || cp "$root/usr/lib/os-release" "$rt/etc/os-release"
  chown -R 65532:65532 "$rt/home/nonroot"
  # The builder: the toolchain (no docs) where the official rust image has it, cargo-auditable
  # installed the way the Dockerfile would (so its `cargo install` finds it and does nothing).
  toolchain=$(rustup run "$TOOLCHAIN" rustc --print sysroot)
  log "builder: toolchain $toolchain, cargo-auditable $AUDITABLE_VERSION"
  mkdir -p "$root/usr/local/rust" "$root/usr/local/cargo/bin"
  tar -C "$toolchain" --exclude=./share/doc -cf - . | tar -C "$root/usr/local/rust" -xf -
  cargo install --quiet --locked --root "$work/auditable" --version "$AUDITABLE_VERSION" cargo-auditable
  cp "$work/auditable/bin/cargo-auditable" "$root/usr/local/cargo/bin/"
  cp "$work/auditable/.crates.toml" "$work/auditable/.crates2.json" "$root/usr/local/cargo/"
  # This machine's trust store (it may hold a proxy's CA that crates.io is reached through).
  cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/ca-certificates.crt"
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
  log "tarballs"
  tar -C "$root" -cf "$work/builder.tar" .
  tar -C "$rt" --numeric-owner -cf "$work/runtime.tar" .
  mkdir -p "$bases_dir"
  mv "$work/builder.tar" "$bases_dir/builder-$key.tar"
  mv "$work/runtime.tar" "$bases_dir/runtime-$key.tar"
  rm -rf "$work"
}

import_bases() { # KEY
  local key=$1
  podman import --quiet \
    --change 'ENV PATH=/usr/local/cargo/bin:/usr/local/rust/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV CARGO_HOME=/usr/local/cargo' \
    --change 'CMD ["/bin/bash"]' \
    "$bases_dir/builder-$key.tar" "$BUILDER:$key" >/dev/null
  podman import --quiet --change 'USER 65532:65532' --change 'WORKDIR /home/nonroot' \
    "$bases_dir/runtime-$key.tar" "$RUNTIME:$key" >/dev/null
}

bases() {
  local key
  key=$(bases_key)
  if podman image exists "$BUILDER:$key" && podman image exists "$RUNTIME:$key"; then
    log "bases $key: present"
  else
    if [ -f "$bases_dir/builder-$key.tar" ] && [ -f "$bases_dir/runtime-$key.tar" ]; then
      log "bases $key: cached tarballs"
    else
      log "bases $key: making them"
      make_bases "$key"
    fi
    import_bases "$key"
  fi
  mkdir -p "$bases_dir"
  echo "$key" >"$bases_dir/current"
}

# Where buildah keeps a cache mount with an id: $TMPDIR/buildah-cache (root) or -UID.
cache_parent() {
  local base=${TMPDIR:-/var/tmp}/buildah-cache
  [ "$(id -u)" = 0 ] && echo "$base" || echo "$base-$(id -u)"
}

link_cache() { # ID DIR
  local link
  link=$(cache_parent)/ratelimit-server-$1
  if [ "$(readlink "$link" 2>/dev/null)" != "$2" ]; then
    # A cache buildah made itself (a build before this script pointed it) moves to DIR when DIR
    # is empty, so its compiled crates are kept; never over a non-empty DIR (the host registry).
    if [ -d "$link" ] && [ ! -L "$link" ] && [ -z "$(ls -A "$2" 2>/dev/null)" ]; then
      rm -rf "$2" && mv "$link" "$2"
    fi
    rm -rf "$link" && ln -s "$2" "$link"
  fi
}

build() {
  local key profile=${PROFILE:-release}
  key=$(cat "$bases_dir/current" 2>/dev/null) || { bases; key=$(cat "$bases_dir/current"); }
  podman image exists "$BUILDER:$key" || { bases; key=$(cat "$bases_dir/current"); }
  # The build context must hold what Cargo needs: checked first (scripts/issue32-probes).
  bash scripts/issue32-probes/build-context.sh
  # The Dockerfile's cache mounts (buildah keeps a cache mount with an id in
  # /var/tmp/buildah-cache/<id>) pointed at the host: the registry cache is the host's own
  # CARGO_HOME registry (crates the host has are not downloaded again, and the other way round),
  # the target directory is target/container-cache/target (kept with target/).
  local host_registry=${CARGO_HOME:-$HOME/.cargo}/registry
  mkdir -p "$cache_dir/target" "$host_registry" "$(cache_parent)"
  link_cache registry "$host_registry"
  link_cache target "$cache_dir/target"
  log "podman build $IMAGE (bases $key, profile $profile)"
  # Docker's image format (BuildKit's): OCI's has no SHELL.
  podman build --network host --layers --format docker \
    --build-arg RUST_IMAGE="$BUILDER:$key" --build-arg RUNTIME_IMAGE="$RUNTIME:$key" \
    --build-arg PROFILE="$profile" \
    --build-arg REVISION="$(git rev-parse HEAD 2>/dev/null || true)" \
    --build-arg SOURCE=https://github.com/OWNER/ratelimit-server \
    -t "$IMAGE" .
  podman image inspect "$IMAGE" --format \
    'image {{.RepoTags}}: {{.Size}} bytes, user {{.Config.User}}, entrypoint {{.Config.Entrypoint}}, labels {{.Config.Labels}}'
}

case "${1:-}" in
  bases) bases ;;
  build) build ;;
  smoke) IMAGE=$IMAGE bash scripts/container-smoke.sh ;;
  all) bases && build && IMAGE=$IMAGE bash scripts/container-smoke.sh ;;
  *) echo "usage: $0 bases|build|smoke|all" >&2; exit 2 ;;
esac
