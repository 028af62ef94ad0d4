# syntax=docker/dockerfile:1
# The Switchyard image: `switchyard-server` (the entrypoint), the `switchyard`
# CLI and `switchyard-agent`, on a distroless base running as a non-root user.
# Nothing publishes it: build it here and push it where your cluster pulls
# from (deploy/README.md); both Helm charts run it.
#
#   docker build -t switchyard:dev .
#   docker run --rm -p 50051:50051 switchyard:dev serve --insecure
#   docker run --rm --entrypoint switchyard-agent switchyard:dev --server http://HOST:50051
#
# The server listens on 0.0.0.0:50051, and a non-loopback listener refuses to
# start without tokens (--tokens-file, or `switchyard-server token create`);
# --insecure serves without them, for a trial only. The image has no shell,
# so the agent's `exec` tasks can run only what the image holds.
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
    cargo build --release --locked -p switchyard-server -p switchyard-agent \
    && install -D -m 0755 target/release/switchyard-server /out/switchyard-server \
    && install -D -m 0755 target/release/switchyard /out/switchyard \
    && install -D -m 0755 target/release/switchyard-agent /out/switchyard-agent

# distroless/cc: glibc, libgcc and CA certificates, no shell; the `nonroot`
# tag runs as uid/gid 65532.
FROM gcr.io/distroless/cc-debian13:nonroot AS runtime
LABEL org.opencontainers.image.title="switchyard" \
      org.opencontainers.image.description="Switchyard: a gRPC control plane that routes tasks to agents by capability" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=builder /out/switchyard-server /out/switchyard /out/switchyard-agent /usr/local/bin/
USER 65532:65532
WORKDIR /home/nonroot
# In a container the server must listen on every interface; the flag or
# SWITCHYARD_LISTEN still overrides this.
ENV SWITCHYARD_LISTEN=0.0.0.0:50051 \
    SWITCHYARD_LOG_FORMAT=json
# 50051: gRPC (agents, submitters, operators, health, reflection).
# 9090: Prometheus metrics (--metrics-listen).
# 8080: the web console, when SWITCHYARD_CONSOLE_LISTEN=0.0.0.0:8080 (the chart's console.port).
EXPOSE 50051 9090 8080
ENTRYPOINT ["/usr/local/bin/switchyard-server"]
