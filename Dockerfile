# syntax=docker/dockerfile:1
#
# Switchyard container image: the server binary, with every backend compiled in
# (Postgres, NATS, Redis, S3), on distroless, running as the non-root user 65532. It also
# ships the host agent, /usr/local/bin/switchyard-host (Connector API v1), for operators to
# copy out (`docker create IMAGE`, then `docker cp ID:/usr/local/bin/switchyard-host .`;
# it needs a Linux with glibc >= Debian 12's) or to run with `--entrypoint switchyard-host`.
#
#   docker build --build-arg SWITCHYARD_GIT_REVISION=$(git rev-parse --short=12 HEAD) -t switchyard:0.1.0 .
#   docker build --build-arg SWITCHYARD_GIT_REVISION=$(git rev-parse --short=12 HEAD) \
#       --build-arg SWITCHYARD_BUILD_TIME=$(date -u +%y%m%d%H%M) -t switchyard:0.1.0 .
#
# The Helm chart (helm/switchyard) runs the clustered mode. `docker run -p 8080:8080 IMAGE`
# runs the embedded mode (SQLite and files under /home/nonroot/data; mount a volume there to
# keep them).

# Bases pinned by digest, so a rebuild fetches the bytes that were reviewed (a moving tag
# would silently change what ships). The tag stays in front for readers; the digest decides.
# Refresh both with scripts/pin-images.sh (needs registry access), review, commit.
ARG RUST_IMAGE=rust:1.95-slim-bookworm@sha256:d7482085ff5b415f84dba5647ae71606650bdef00db7aeb69f4b3d170c3e4082
ARG RUNTIME_IMAGE=gcr.io/distroless/cc-debian12:nonroot@sha256:9dac0a79194e45a7da0158a9c6da57b217585af0786db3845d1f0ec1a0dd182f

FROM ${RUST_IMAGE} AS builder
WORKDIR /src
# Optional YYMMDDHHMM stamp for the Card's `build` and /health (see services/edge/build.rs);
# unset = the time of the build.
ARG SWITCHYARD_BUILD_TIME=""
# The git revision for the Card, /health and switchyard_build_info{git_rev}: .git is not in
# the build context, so pass it (unset = "unknown"; the tag falls back to v<crate version>).
ARG SWITCHYARD_GIT_REVISION=""
COPY . .
# The registry, git and target caches persist across builds; the binaries are copied out of
# the target cache, which is not part of the image. One cargo invocation builds both, so the
# dependencies they share are compiled once.
RUN --mount=type=cache,target=/usr/local/cargo/registry,sharing=locked \
    --mount=type=cache,target=/usr/local/cargo/git,sharing=locked \
    --mount=type=cache,target=/src/target,sharing=locked \
    set -eu; \
    if [ -z "${SWITCHYARD_BUILD_TIME}" ]; then unset SWITCHYARD_BUILD_TIME; fi; \
    export SWITCHYARD_GIT_REVISION; \
    cargo build --release --locked -p switchyard -p switchyard-host-agent --all-features; \
    mkdir -p /out; \
    cp target/release/switchyard target/release/switchyard-host /out/

FROM ${RUNTIME_IMAGE}
LABEL org.opencontainers.image.title="switchyard" \
      org.opencontainers.image.description="Multi-tenant xAgent connector server" \
      org.opencontainers.image.version="0.1.0" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=builder /out/switchyard /out/switchyard-host /usr/local/bin/
# The chart's preStop hook runs `sleep N` so the pod leaves the load balancers before it
# drains; distroless has no shell or coreutils, so ship just that binary (it needs only the
# glibc that cc-debian12 already has).
COPY --from=builder /usr/bin/sleep /usr/local/bin/sleep
# In a container the listeners must not bind loopback (the binary's default), or the
# published ports lead nowhere. The chart sets the same values (8443: host agents' mTLS).
ENV SWITCHYARD_LISTEN=0.0.0.0:8080 \
    SWITCHYARD_METRICS_LISTEN=0.0.0.0:9090 \
    SWITCHYARD_HOSTS_TLS_LISTEN=0.0.0.0:8443
USER 65532:65532
WORKDIR /home/nonroot
EXPOSE 8080 9090 8443
ENTRYPOINT ["switchyard"]
CMD ["serve"]
