# syntax=docker/dockerfile:1
# The ratelimit-server image: a Rust build stage on Debian 13 (trixie), then distroless `cc`
# debian13 (glibc, CA certificates, no shell, no package manager) running as the nonroot user 65532.
#
#   docker build -t ratelimit-server:0.1.0 \
#     --build-arg REVISION="$(git rev-parse HEAD)" \
#     --build-arg SOURCE=https://github.com/OWNER/ratelimit-server .
#   docker run --rm -p 8081:8081 -p 8080:8080 ratelimit-server:0.1.0
#
# Multi-arch (scripts/release.sh): `docker buildx build --platform linux/amd64,linux/arm64 …`
# compiles both on the build machine's own platform (--platform=$BUILDPLATFORM below, a cross
# linker from Debian for the other architecture); only the final `--version` check runs the
# target's binary (under binfmt emulation when it is not the build machine's).
#
# The binary is /usr/local/bin/ratelimit-server and /bin/ratelimit (the command of
# envoyproxy/ratelimit's image and of Envoy Gateway's Deployment). With no arguments it serves
# from the environment alone, like the reference's /bin/ratelimit; the shipped rules are the
# default rules directory (`config`, relative to the working directory /srv/ratelimit-server).
# Nothing is written at run time, so a read-only root filesystem works. The binary carries its
# dependency list (cargo-auditable): `cargo audit bin`, syft or trivy read it from the image.
# docs/release.md: the tags, what a tag promises, how a release is cut, how to bump the digests.

# Both on Debian 13 (trixie): the builder's glibc is the runtime's. Pinned by digest (a tag can
# move); docs/release.md "Base images" says how to bump them. CI builds this same file with bases
# it makes itself (scripts/container-image.sh), passed as these two build arguments.
ARG RUST_IMAGE=rust:1.95-trixie@sha256:f49565f188ee00bc2a18dd418183f2c5f23ef7d6e691890517ed341a598f67c3
ARG RUNTIME_IMAGE=gcr.io/distroless/cc-debian13:nonroot@sha256:c31ff9abcb1910f3ab25c7957bdaf0bfe12a01eb546e8df2282f1c8f682b606c

FROM --platform=$BUILDPLATFORM ${RUST_IMAGE} AS builder
# Set by BuildKit (and podman) from --platform: amd64 or arm64.
ARG TARGETARCH
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# Embeds the dependency list (what was compiled, from Cargo.lock) in the binary.
RUN cargo install --locked --version 0.7.7 cargo-auditable
# The Rust target of TARGETARCH, and for an architecture other than the builder's, its standard
# library (rustup) and a C cross toolchain (Debian's; ring compiles C).
RUN case "${TARGETARCH:-amd64}" in \
      amd64) triple=x86_64-unknown-linux-gnu gcc=gcc-x86-64-linux-gnu libc=libc6-dev-amd64-cross cc=x86_64-linux-gnu-gcc ;; \
      arm64) triple=aarch64-unknown-linux-gnu gcc=gcc-aarch64-linux-gnu libc=libc6-dev-arm64-cross cc=aarch64-linux-gnu-gcc ;; \
      *) echo "unsupported TARGETARCH ${TARGETARCH}" >&2; exit 1 ;; \
    esac \
    && echo "$triple" >/rust-target \
    && if [ "$triple" != "$(rustc -vV | sed -n 's/^host: //p')" ]; then \
         apt-get update && apt-get install -y --no-install-recommends "$gcc" "$libc" \
         && rm -rf /var/lib/apt/lists/* \
         && rustup target add "$triple" \
         && upper=$(echo "$triple" | tr 'a-z-' 'A-Z_') \
         && printf 'export CARGO_TARGET_%s_LINKER=%s CC_%s=%s\n' "$upper" "$cc" "${triple//-/_}" "$cc" >/cross-env; \
       else : >/cross-env; fi
WORKDIR /build
COPY . .
# A cargo profile: `release`, or one of your own in Cargo.toml (e.g. a cheaper one for a smoke).
ARG PROFILE=release
# The commit the image is built from: in `--version` and the ratelimit_build_info gauge.
ARG REVISION=""
# Cargo's registry and target directory are cache mounts: a rebuild compiles only what changed,
# and nothing of them ends up in a layer.
RUN --mount=type=cache,id=ratelimit-server-registry,target=/usr/local/cargo/registry,sharing=locked \
    --mount=type=cache,id=ratelimit-server-target,target=/build/target,sharing=locked \
    . /cross-env \
    && triple=$(cat /rust-target) \
    && RATELIMIT_SERVER_COMMIT="${REVISION}" cargo auditable build --locked \
         --profile "${PROFILE}" --target "$triple" --bin ratelimit-server \
    && install -D -m 0755 "target/$triple/${PROFILE}/ratelimit-server" /out/usr/local/bin/ratelimit-server \
    && mkdir -p /out/bin \
    && ln -s /usr/local/bin/ratelimit-server /out/bin/ratelimit

FROM ${RUNTIME_IMAGE}
# The version of Cargo.toml (tests/it/kubernetes.rs holds them equal); REVISION and SOURCE as above.
ARG VERSION=0.1.0
ARG REVISION=""
ARG SOURCE=""
LABEL org.opencontainers.image.title="ratelimit-server" \
      org.opencontainers.image.description="An Envoy-compatible external rate-limit service (envoy.service.ratelimit.v3)" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.source="${SOURCE}" \
      org.opencontainers.image.licenses="Apache-2.0"
# /usr/local/bin/ratelimit-server, and the symlink /bin/ratelimit -> /usr/local/bin/ratelimit-server.
COPY --from=builder /out/ /
COPY config/ /srv/ratelimit-server/config/
WORKDIR /srv/ratelimit-server
# 65532 is distroless' nonroot user; numeric, so runAsNonRoot can check it.
USER 65532:65532
# Run by the runtime's own loader and glibc, as 65532: a builder whose glibc is newer than the
# runtime's fails the build here, not at the first start; and the shipped rules load.
RUN ["/usr/local/bin/ratelimit-server", "--version"]
RUN ["/usr/local/bin/ratelimit-server", "check", "config"]
# gRPC (RateLimitService, grpc.health.v1), HTTP admin (/metrics, /healthcheck, /readyz, …),
# and the debug listener when DEBUG_ADDR or DEBUG_PORT is set (the reference's 6070).
EXPOSE 8081 8080 6070
ENTRYPOINT ["/usr/local/bin/ratelimit-server"]
