# syntax=docker/dockerfile:1
# The ratelimit-server image: a Rust build stage, then distroless `cc` (glibc, CA certificates, no
# shell, no package manager) running as the nonroot user 65532.
#
#   docker build -t ratelimit-server:0.1.0 \
#     --build-arg REVISION="$(git rev-parse HEAD)" \
#     --build-arg SOURCE=https://github.com/OWNER/ratelimit-server .
#   docker run --rm -p 8081:8081 -p 8080:8080 ratelimit-server:0.1.0
#
# The binary is /usr/local/bin/ratelimit-server and /bin/ratelimit (the command of
# envoyproxy/ratelimit's image and of Envoy Gateway's Deployment). With no arguments it serves
# from the environment alone, like the reference's /bin/ratelimit; the shipped rules are the
# default rules directory (`config`, relative to the working directory /srv/ratelimit-server).
# Nothing is written at run time, so a read-only root filesystem works.
# docs/release.md: the tags, what a tag promises, and how a release is cut.

# The builder's Debian (bookworm) must be the runtime's (distroless debian12): same glibc.
ARG RUST_IMAGE=rust:1.95-bookworm
ARG RUNTIME_IMAGE=gcr.io/distroless/cc-debian12:nonroot

# cargo-chef turns the manifests into a recipe, so the dependencies build in a layer of their own
# that only a change to Cargo.toml or Cargo.lock invalidates.
FROM ${RUST_IMAGE} AS chef
RUN cargo install --locked --version 0.1.78 cargo-chef
WORKDIR /build

FROM chef AS planner
COPY . .
RUN cargo chef prepare --recipe-path recipe.json

FROM chef AS builder
COPY --from=planner /build/recipe.json recipe.json
# The dependencies, at the versions of Cargo.lock (--locked fails on a stale lock file).
RUN cargo chef cook --release --locked --recipe-path recipe.json
COPY . .
# The commit the image is built from: in `--version` and the ratelimit_build_info gauge.
ARG REVISION=""
RUN RATELIMIT_SERVER_COMMIT="${REVISION}" cargo build --release --locked --bin ratelimit-server \
    && install -D -m 0755 target/release/ratelimit-server /usr/local/bin/ratelimit-server \
    && mkdir -p /out/bin \
    && ln -s /usr/local/bin/ratelimit-server /out/bin/ratelimit \
    && /usr/local/bin/ratelimit-server --version \
    && /usr/local/bin/ratelimit-server check config

FROM ${RUNTIME_IMAGE}
# The version of Cargo.toml (tests/kubernetes.rs holds them equal); REVISION and SOURCE as above.
ARG VERSION=0.1.0
ARG REVISION=""
ARG SOURCE=""
LABEL org.opencontainers.image.title="ratelimit-server" \
      org.opencontainers.image.description="An Envoy-compatible external rate-limit service (envoy.service.ratelimit.v3)" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.source="${SOURCE}" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=builder /usr/local/bin/ratelimit-server /usr/local/bin/ratelimit-server
# A directory copy keeps the symlink: /bin/ratelimit -> /usr/local/bin/ratelimit-server.
COPY --from=builder /out/bin/ /bin/
COPY config/ /srv/ratelimit-server/config/
WORKDIR /srv/ratelimit-server
# 65532 is distroless' nonroot user; numeric, so runAsNonRoot can check it.
USER 65532:65532
# gRPC (RateLimitService, grpc.health.v1), HTTP admin (/metrics, /healthcheck, /readyz, …),
# and the debug listener when DEBUG_ADDR or DEBUG_PORT is set (the reference's 6070).
EXPOSE 8081 8080 6070
ENTRYPOINT ["/usr/local/bin/ratelimit-server"]
