# syntax=docker/dockerfile:1
# Two images from one build (`make images` builds both for amd64 and arm64 and pushes them):
#   docker build --target controller -t shared-volume-controller:dev .
#   docker build --target agent      -t shared-volume-agent:dev .
# Each platform builds natively (buildx with QEMU or a native builder per platform), so the same
# stages serve linux/amd64 and linux/arm64. `make images` also sets the OCI labels (title, version,
# revision, source) and passes REVISION for the build_info metric.

FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock build.rs ./
COPY src ./src
# The manifest declares the benchmarks: cargo refuses to build without their sources. The tests'
# helpers (tests/common) are a member of the workspace, which cargo loads whole, as Cargo.lock
# was made with it: the tests folder is copied as it stands, like the others, not a folder inside.
COPY benches ./benches
COPY tests ./tests
# Downloaded crates and build artifacts stay in BuildKit caches between builds (per platform), so
# a change to the sources rebuilds only this crate.
ARG TARGETPLATFORM
# The revision for the build_info metric (the context has no .git).
ARG REVISION=unknown
RUN --mount=type=cache,id=cargo-registry-${TARGETPLATFORM},target=/usr/local/cargo/registry \
    --mount=type=cache,id=cargo-target-${TARGETPLATFORM},target=/src/target \
    SVC_REVISION="${REVISION}" cargo build --release --locked \
    && install -m 0755 target/release/shared-volume-controller /shared-volume-controller

# The agent runs drbdsetup against the host's DRBD, so its image carries drbd-utils and runs as
# root (the DaemonSet grants only what drbdsetup needs). drbd-utils is held to its 9.22 series,
# whatever Debian point release ships. The conntrack repair runs from this image too (it talks to
# the kernel over netlink); conntrack-tools stays for looking at the table by hand.
FROM debian:bookworm-slim AS agent
RUN apt-get update \
    && apt-get install -y --no-install-recommends "drbd-utils=9.22.*" "conntrack=1:1.4.*" \
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
