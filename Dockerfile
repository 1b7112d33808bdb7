# syntax=docker/dockerfile:1
# Two images from one build:
#   docker build --target controller -t shared-volume-controller:dev .
#   docker build --target agent      -t shared-volume-agent:dev .

FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
# The manifest declares the benchmarks: cargo refuses to build without their sources.
COPY benches ./benches
RUN cargo build --release --locked \
    && install -m 0755 target/release/shared-volume-controller /shared-volume-controller

# The agent runs drbdsetup against the host's DRBD, so its image carries drbd-utils and runs as
# root (the DaemonSet grants only what drbdsetup needs).
FROM debian:bookworm-slim AS agent
RUN apt-get update \
    && apt-get install -y --no-install-recommends drbd-utils=9.22.0-1 \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /shared-volume-controller /usr/local/bin/shared-volume-controller
ENTRYPOINT ["/usr/local/bin/shared-volume-controller"]
CMD ["agent"]

# The controller only talks to the API server: a distroless image, non-root.
FROM gcr.io/distroless/cc-debian12:nonroot AS controller
COPY --from=build /shared-volume-controller /usr/local/bin/shared-volume-controller
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/shared-volume-controller"]
CMD ["controller"]
