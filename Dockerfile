# syntax=docker/dockerfile:1
# Switchyard control plane image: `switchyard-server` (the entrypoint) and the
# `switchyard` CLI, on a distroless base running as a non-root user.
#
#   docker build -t switchyard:dev .
#   docker run --rm -p 50051:50051 switchyard:dev
#
# The image listens on 0.0.0.0:50051. Once token auth lands, a non-loopback
# listener needs --tokens-file (or --insecure, for a trial only).
#
# The proto crate vendors protoc (protoc-bin-vendored), so the builder needs
# nothing beyond the official Rust image. Builder and runtime are both Debian
# 13 (trixie), so the glibc the binaries link against is the one they run on.

ARG RUST_VERSION=1.95

FROM rust:${RUST_VERSION}-slim-trixie AS builder
WORKDIR /src
COPY . .
# The target directory is a cache mount, so the binaries are copied out in the
# same step.
RUN --mount=type=cache,target=/usr/local/cargo/registry,sharing=locked \
    --mount=type=cache,target=/usr/local/cargo/git,sharing=locked \
    --mount=type=cache,target=/src/target,sharing=locked \
    cargo build --release --locked -p switchyard-server \
    && install -D -m 0755 target/release/switchyard-server /out/switchyard-server \
    && install -D -m 0755 target/release/switchyard /out/switchyard

# distroless/cc: glibc, libgcc and CA certificates, no shell; the `nonroot`
# tag runs as uid/gid 65532.
FROM gcr.io/distroless/cc-debian13:nonroot AS runtime
LABEL org.opencontainers.image.title="switchyard" \
      org.opencontainers.image.description="Switchyard: a gRPC control plane that routes tasks to agents by capability" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=builder /out/switchyard-server /out/switchyard /usr/local/bin/
USER 65532:65532
WORKDIR /home/nonroot
# In a container the server must listen on every interface; the flag or
# SWITCHYARD_LISTEN still overrides this.
ENV SWITCHYARD_LISTEN=0.0.0.0:50051 \
    SWITCHYARD_LOG_FORMAT=json
# 50051: gRPC (agents, submitters, operators, health, reflection).
# 9090: Prometheus metrics (--metrics-listen).
EXPOSE 50051 9090
ENTRYPOINT ["/usr/local/bin/switchyard-server"]
